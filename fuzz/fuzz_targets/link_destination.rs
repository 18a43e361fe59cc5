//! Symlink targets: where a link at `LINK` with target `TARGET` leads (`link_destination`,
//! the lexical step of resolving links against grants, `host/caps/resolve.rs` on main).
//!
//! NOTE: `host/caps/resolve.rs` is not on this branch yet. Until it is, this target fuzzes a
//! verbatim copy of main's `link_destination` (and of `HostPath::from_parts`, which it uses),
//! below; once it lands, replace the copy with `use nodeward::caps::resolve::link_destination`
//! and map its `Error::Escape` to `Escape`.
//!
//! Input: `LINK\nTARGET`.
//!
//! Contract: the result is the root (`None`), a valid host path, or an escape; never a path
//! above the root. Invariants checked against an independent walk of the components: escape
//! exactly when a `..` climbs above the root; otherwise the walked components, as a valid host
//! path that re-parses to itself; a target without `..` stays beneath the link's directory.
//! `None` also stands for a destination that is not a valid host path (over 4096 bytes, or a
//! NUL in the target): safe, as every caller treats `None` as "not covered by any grant", but
//! see docs/fuzzing.md (findings).
#![no_main]

use libfuzzer_sys::fuzz_target;
use nodeward::hostpath::HostPath;

#[derive(Debug, PartialEq)]
struct Escape;

fuzz_target!(|data: &[u8]| {
    let Some(s) = nodeward_fuzz::text(data) else {
        return;
    };
    let (link, target) = nodeward_fuzz::lines2(s);
    let Ok(link) = HostPath::parse(link) else {
        return;
    };
    let result = link_destination(&link, target);

    // The independent walk: the link's directory, then each target component.
    let parent = link.parent();
    let mut walked: Vec<&str> = match &parent {
        Some(p) if !target.starts_with('/') => p.as_str().split('/').collect(),
        _ => Vec::new(),
    };
    let mut escaped = false;
    for c in target.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                if walked.pop().is_none() {
                    escaped = true;
                    break;
                }
            }
            c => walked.push(c),
        }
    }
    match result {
        Err(Escape) => assert!(escaped, "{link} -> {target:?}: escape without climbing out"),
        Ok(None) => {
            assert!(
                !escaped,
                "{link} -> {target:?}: climbed out, yet not an escape"
            );
            let joined = walked.join("/");
            assert!(
                walked.is_empty() || HostPath::parse(&joined).is_err(),
                "{link} -> {target:?}: None, but it leads to {joined:?}"
            );
        }
        Ok(Some(p)) => {
            assert!(!escaped, "{link} -> {target:?}: climbed out, yet {p}");
            assert_eq!(p.as_str(), walked.join("/"));
            assert_eq!(HostPath::parse(p.as_str()).as_ref(), Ok(&p));
            if !target.starts_with('/')
                && !target.split('/').any(|c| c == "..")
                && let Some(dir) = link.parent()
            {
                assert!(p.starts_with(&dir), "{link} -> {target:?} left {dir}: {p}");
            }
        }
    }
});

// ---- A verbatim copy of main's host/caps/resolve.rs `link_destination` (see above). ----

fn from_parts(parts: &[String]) -> Option<HostPath> {
    if parts.is_empty() {
        return None;
    }
    HostPath::parse(&parts.join("/")).ok()
}

fn link_destination(link: &HostPath, target: &str) -> Result<Option<HostPath>, Escape> {
    let mut parts: Vec<String> = if target.starts_with('/') {
        Vec::new()
    } else {
        link.parent()
            .map(|p| p.as_str().split('/').map(String::from).collect())
            .unwrap_or_default()
    };
    push_components(&mut parts, target.split('/').map(String::from))?;
    Ok(from_parts(&parts))
}

fn push_components(
    parts: &mut Vec<String>,
    components: impl IntoIterator<Item = String>,
) -> Result<(), Escape> {
    for c in components {
        match c.as_str() {
            "" | "." => {}
            ".." => {
                if parts.pop().is_none() {
                    return Err(Escape);
                }
            }
            _ => parts.push(c),
        }
    }
    Ok(())
}
