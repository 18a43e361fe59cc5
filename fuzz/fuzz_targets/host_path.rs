//! Host paths (`HostPath::parse`, the lexical check every capability path goes through) and
//! the operations grant checks rely on: `starts_with`, `prefixes`, `parent`, `join`.
//!
//! Input: `A` or `A\nB`; the whole input, `A` and `B` are each parsed, and `B` is used as a
//! prefix of `A` and as a child joined to `A`.
//!
//! Invariants: parse accepts exactly the documented language (non-empty, at most 4096 bytes,
//! relative, no NUL, no empty, `.` or `..` component); an accepted path is the input itself
//! and re-parses to itself; its prefixes, parent and file name are valid and consistent;
//! `starts_with` is component-wise; `join` never leaves the base; a refusal quotes at most
//! 200 characters of the input.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nodeward::hostpath::HostPath;
use std::path::Component;

fuzz_target!(|data: &[u8]| {
    let Some(s) = nodeward_fuzz::text(data) else {
        return;
    };
    let (a, b) = nodeward_fuzz::lines2(s);
    check(s);
    let pa = check(a);
    let pb = check(b);
    if let Some(pa) = &pa {
        if let Ok(j) = pa.join(b) {
            assert!(j.starts_with(pa) && j != *pa, "{j} from {pa} + {b:?}");
            assert_eq!(j.as_str(), format!("{a}/{b}"));
        }
        if let Some(pb) = &pb {
            let ca: Vec<&str> = a.split('/').collect();
            let cb: Vec<&str> = b.split('/').collect();
            assert_eq!(
                pa.starts_with(pb),
                ca.starts_with(&cb),
                "{a:?} starts with {b:?}"
            );
            if pa.starts_with(pb) && pb.starts_with(pa) {
                assert_eq!(pa, pb);
            }
            // Both valid: joining fails only on length.
            assert_eq!(pa.join(b).is_ok(), a.len() + 1 + b.len() <= 4096);
        }
    }
});

/// Parses `s`, checks the outcome against the documented rules, and returns the path.
fn check(s: &str) -> Option<HostPath> {
    let lawful = !s.is_empty()
        && s.len() <= 4096
        && !s.contains('\0')
        && !s.starts_with('/')
        && s.split('/').all(|c| !matches!(c, "" | "." | ".."));
    match HostPath::parse(s) {
        Err(e) => {
            assert!(!lawful, "refused {s:?}: {e}");
            assert!(e.path.chars().count() <= 200);
            None
        }
        Ok(p) => {
            assert!(lawful, "accepted {s:?}");
            assert_eq!(p.as_str(), s);
            assert_eq!(p.to_string(), s);
            assert_eq!(HostPath::parse(p.as_str()).as_ref(), Ok(&p));
            assert!(
                p.as_path()
                    .components()
                    .all(|c| matches!(c, Component::Normal(_))),
                "{s:?} has a non-normal component"
            );
            let components = s.split('/').count();
            let prefixes: Vec<HostPath> = p.prefixes().collect();
            assert_eq!(prefixes.len(), components);
            assert_eq!(prefixes.last(), Some(&p));
            for w in prefixes.windows(2) {
                assert!(w[1].starts_with(&w[0]) && !w[0].starts_with(&w[1]));
            }
            assert!(!p.file_name().contains('/') && !p.file_name().is_empty());
            match p.parent() {
                None => assert_eq!(components, 1),
                Some(parent) => {
                    assert!(p.starts_with(&parent) && !parent.starts_with(&p));
                    assert_eq!(parent.join(p.file_name()).as_ref(), Ok(&p));
                    assert_eq!(prefixes.get(components - 2), Some(&parent));
                }
            }
            Some(p)
        }
    }
}
