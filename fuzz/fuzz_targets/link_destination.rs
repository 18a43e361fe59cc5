//! Symlink targets: where a link at `LINK` with target `TARGET` leads (`link_destination`,
//! the lexical step of resolving links against grants, `host/caps/resolve.rs`).
//!
//! Input: `LINK\nTARGET`.
//!
//! Contract: the result is the root (`None`), a valid host path, an escape, or
//! `invalid-argument` for a destination that is no valid host path; never a path above the
//! root. Invariants checked against an independent walk of the components: escape
//! exactly when a `..` climbs above the root; otherwise the walked components, as a valid host
//! path that re-parses to itself; a target without `..` stays beneath the link's directory.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nodeward::hostpath::HostPath;

#[derive(Debug, PartialEq)]
struct Escape;

/// The real function, its errors folded into what this target tells apart: `Escape`, or
/// `Ok(None)` for "not a valid host path" (checked below like the root: nothing to walk to).
fn link_destination(link: &HostPath, target: &str) -> Result<Option<HostPath>, Escape> {
    match nodeward::rootfs::link_destination(link, target) {
        Ok(p) => Ok(p),
        Err(nodeward::caps::Error::Escape(_)) => Err(Escape),
        Err(nodeward::caps::Error::InvalidArgument(_)) => Ok(None),
        Err(e) => panic!("{link} -> {target:?}: unexpected {e:?}"),
    }
}

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
