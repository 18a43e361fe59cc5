//! systemd unit names (`UnitName::try_from`, checked before any grant, file or bus access)
//! and unit grant patterns (`Grants::validate` / `Grants::may_unit`, glob patterns).
//!
//! Input: `NAME` or `NAME\nPATTERN\nPATTERN...`.
//!
//! Invariants: a name is accepted exactly by the documented rules (1 to 255 bytes of
//! `[A-Za-z0-9:_.-@\]`, a non-empty prefix not starting with `@`, a known type, at most one
//! `@`), and an accepted name is one plain component of a path beneath the unit directory; a
//! refusal is `invalid-argument`. Patterns: validated ones hold no `/`; a pattern without glob
//! characters matches only itself; a verb with no patterns matches nothing.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nodeward::caps::Error;
use nodeward::caps::systemd::UnitName;
use nodeward::grants::{Grants, SystemdGrant, UnitVerb};
use nodeward::hostpath::HostPath;

const TYPES: &[&str] = &[
    "service",
    "socket",
    "device",
    "mount",
    "automount",
    "swap",
    "target",
    "path",
    "timer",
    "slice",
    "scope",
];

fuzz_target!(|data: &[u8]| {
    let Some(s) = nodeward_fuzz::text(data) else {
        return;
    };
    let (name, patterns) = nodeward_fuzz::lines2(s);
    let lawful = (1..=255).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b":_.-@\\".contains(&b))
        && name.rsplit_once('.').is_some_and(|(prefix, ty)| {
            !prefix.is_empty() && !prefix.starts_with('@') && TYPES.contains(&ty)
        })
        && name.matches('@').count() <= 1;
    match UnitName::try_from(name) {
        Ok(u) => {
            assert!(lawful, "accepted {name:?}");
            assert_eq!(u.as_str(), name);
            let file = HostPath::parse(&format!("etc/systemd/system/{name}"))
                .expect("a unit name is a plain path component");
            assert_eq!(file.file_name(), name);
        }
        Err(Error::InvalidArgument(m)) => {
            assert!(!lawful, "refused {name:?}: {m}");
        }
        Err(e) => panic!("refusal of {name:?} is not invalid-argument: {e:?}"),
    }

    let patterns: Vec<String> = patterns.lines().map(String::from).collect();
    let g = Grants {
        systemd: SystemdGrant {
            start: patterns.clone(),
            ..Default::default()
        },
        ..Default::default()
    };
    let may = g.may_unit(UnitVerb::Start, name);
    assert!(!g.may_unit(UnitVerb::Enable, name), "no enable patterns");
    if g.validate().is_ok() {
        assert!(patterns.iter().all(|p| !p.contains('/') && !p.is_empty()));
        if patterns.iter().all(|p| !p.contains(['*', '?', '['])) {
            assert_eq!(
                may,
                patterns.iter().any(|p| p == name),
                "{name:?} {patterns:?}"
            );
        }
    }
});
