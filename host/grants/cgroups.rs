//! `cgroups` grants: beneath which cgroup paths a phase may remove empty cgroups
//! (`wit/cgroups.wit`).
//!
//! # Guarantees
//! - An entry is a [`CgroupPath`]: relative to each hierarchy's root, without `.`, `..`,
//!   empty components or NUL, at most [`MAX_COMPONENTS`] components of at most 255 bytes. So
//!   no entry is empty, absolute or climbs out of the hierarchy.
//! - No entry lies beneath systemd's own top-level cgroups ([`SYSTEMD_OWNED`]): the agent,
//!   the machine's services and its users live there.
//! - Entries match whole components: `kubepods` covers `kubepods/burstable`, not `kubepods2`.

use serde::{Deserialize, Serialize};

/// Most components of a cgroup path.
pub const MAX_COMPONENTS: usize = 16;

/// systemd's top-level cgroups: no grant reaches into them.
pub const SYSTEMD_OWNED: &[&str] = &[
    "init.scope",
    "system.slice",
    "user.slice",
    "machine.slice",
    "-.slice",
];

/// Cgroup paths beneath which the phase may remove empty cgroups.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CgroupsGrant {
    /// Cgroup paths, relative to each hierarchy's root.
    pub remove: Vec<String>,
}

/// A validated cgroup path: its components.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CgroupPath(Vec<String>);

impl CgroupPath {
    /// Parses `s` or says why it is not a cgroup path.
    pub fn parse(s: &str) -> Result<CgroupPath, String> {
        if s.is_empty() {
            return Err("empty".into());
        }
        if s.starts_with('/') {
            return Err("absolute; cgroup paths are relative to each hierarchy".into());
        }
        let parts: Vec<&str> = s.split('/').collect();
        if parts.len() > MAX_COMPONENTS {
            return Err(format!("more than {MAX_COMPONENTS} components"));
        }
        for p in &parts {
            match *p {
                "" => return Err("an empty component".into()),
                "." | ".." => return Err(format!("a {p:?} component")),
                p if p.contains('\0') => return Err("a NUL byte".into()),
                p if p.len() > 255 => return Err("a component longer than 255 bytes".into()),
                _ => {}
            }
        }
        Ok(CgroupPath(parts.into_iter().map(str::to_string).collect()))
    }

    /// The components, first to last.
    pub fn components(&self) -> &[String] {
        &self.0
    }

    /// Whether `prefix` is this path or one of its ancestors (whole components).
    pub fn starts_with(&self, prefix: &CgroupPath) -> bool {
        self.0.len() >= prefix.0.len() && self.0[..prefix.0.len()] == prefix.0[..]
    }
}

impl std::fmt::Display for CgroupPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0.join("/"))
    }
}

/// Why a `cgroups.remove` entry is refused, or `None` when it is well formed.
pub fn invalid_cgroup_entry(entry: &str) -> Option<String> {
    let path = match CgroupPath::parse(entry) {
        Ok(p) => p,
        Err(why) => return Some(format!("not a cgroup path: {why}")),
    };
    let top = path.components().first().map(String::as_str).unwrap_or("");
    SYSTEMD_OWNED
        .contains(&top)
        .then(|| format!("lies in {top}, which systemd owns"))
}

impl CgroupsGrant {
    /// Whether empty cgroups at and beneath `path` may be removed.
    pub fn may_remove(&self, path: &CgroupPath) -> bool {
        self.remove
            .iter()
            .filter(|g| invalid_cgroup_entry(g).is_none())
            .filter_map(|g| CgroupPath::parse(g).ok())
            .any(|g| path.starts_with(&g))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_relative_cgroup_paths_outside_systemds_own() {
        for ok in ["kubepods", "kubepods.slice", "kubepods/burstable", "a b"] {
            assert_eq!(invalid_cgroup_entry(ok), None, "{ok}");
        }
        let long = "x/".repeat(MAX_COMPONENTS) + "x";
        for bad in [
            "",
            "/kubepods",
            "..",
            "kubepods/..",
            "./kubepods",
            "kubepods//x",
            "kubepods/",
            "a\0b",
            "system.slice",
            "user.slice/user-0.slice",
            "init.scope",
            long.as_str(),
        ] {
            assert!(
                invalid_cgroup_entry(bad).is_some(),
                "{bad:?} must be refused"
            );
        }
    }

    #[test]
    fn covers_whole_components() {
        let g = CgroupsGrant {
            remove: vec!["kubepods".into(), "system.slice".into()],
        };
        let p = |s| CgroupPath::parse(s).expect("path");
        assert!(g.may_remove(&p("kubepods")));
        assert!(g.may_remove(&p("kubepods/besteffort/pod1")));
        assert!(!g.may_remove(&p("kubepods2")));
        assert!(
            !g.may_remove(&p("system.slice")),
            "an invalid entry covers nothing"
        );
        assert!(!CgroupsGrant::default().may_remove(&p("kubepods")));
    }
}
