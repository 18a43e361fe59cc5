//! Paths and units reserved to the agent: no phase reads, writes, links into, mounts on or over,
//! or drives them, whatever its grants say.
//!
//! # Background
//! The agent keeps its trust root (`etc/nodeward/trusted-keys`), its state (installed bundles,
//! the compiled cache, the node's install record and journal, the artifact cache, the audit
//! heads), its audit trail and its own unit and binary beneath the same host root the phases
//! work in. A grant is a path prefix, so a broad one (`fs.write = ["var/lib"]`, a mount target
//! of `etc`) would otherwise cover them: a phase could then rewrite the record of what it did,
//! replace the keys the next bundle is checked against, or edit the daemon's unit. A signed,
//! accepted bundle must still not be able to do that: the trail is what the auditor trusts.
//!
//! # Guarantees
//! - [`RESERVED_PATHS`] (and the run's own state, audit and key directories when they lie
//!   beneath the root: [`Reserved::with_dir`]) are refused to every file capability, whatever
//!   the grant: the path a call names, every path its resolution passes through (a link into a
//!   reserved path is refused) and a link's destination.
//! - Calls that act on a whole tree refuse a tree that holds a reserved path: `fs.remove-all`
//!   of `var/lib`, a mount on or of `etc` (a mount over a reserved path hides it from the
//!   agent; a bind of one exposes it).
//! - A grant entry inside a reserved path refuses the bundle when it is loaded
//!   ([`crate::grants::Grants::validate`]), so the author learns it at once rather than by a
//!   denial on a node.
//! - [`RESERVED_UNITS`] cannot be written, enabled, started, stopped or masked by a phase
//!   (their status stays readable).
//!
//! # Caveats
//! Some grants are root-equivalent by nature: writing a unit that systemd runs as root, or a
//! binary the kubelet runs, lets a phase act later outside any capability. Reserved paths keep
//! the agent's own files out of every capability; they do not make such a grant narrow.
//! `docs/bundle-format.md` lists those grants for auditors.

use crate::hostpath::HostPath;
use std::path::Path;

/// Host paths (relative to the host root) no phase may touch: the trusted keys and the
/// agent's configuration, its state directory, its log directory (the audit trail), its locks
/// and its binary. The agent's unit is reserved in every unit directory ([`UNIT_DIRS`]).
pub const RESERVED_PATHS: &[&str] = &[
    "etc/nodeward",
    "var/lib/nodeward",
    "var/log/nodeward",
    "run/nodeward",
    "usr/local/bin/nodeward",
    // The manager's own configuration: `DefaultEnvironment=` would reach the agent.
    "etc/systemd/system.conf",
    "etc/systemd/system.conf.d",
    "run/systemd/system.conf.d",
];

/// The directories systemd reads units and drop-ins from (systemd.unit(5), system manager):
/// in each, the agent's unit, its drop-in directory and the drop-ins for every service
/// (`service.d`) are reserved.
pub const UNIT_DIRS: &[&str] = &[
    "etc/systemd/system.control",
    "run/systemd/system.control",
    "run/systemd/transient",
    "run/systemd/generator.early",
    "etc/systemd/system",
    "run/systemd/system",
    "run/systemd/generator",
    "usr/local/lib/systemd/system",
    "usr/lib/systemd/system",
    "lib/systemd/system",
    "run/systemd/generator.late",
];

/// Units no phase may write, enable, start, stop or mask: the agent's own, the slices it runs
/// in, and the targets that stop or isolate the whole system.
pub const RESERVED_UNITS: &[&str] = &[
    "nodeward.service",
    "-.slice",
    "system.slice",
    "default.target",
    "multi-user.target",
    "poweroff.target",
    "reboot.target",
    "halt.target",
    "kexec.target",
    "soft-reboot.target",
    "shutdown.target",
    "final.target",
    "exit.target",
    "rescue.target",
    "emergency.target",
    "ctrl-alt-del.target",
];

/// Mount targets refused besides the reserved paths: the kernel's file systems, which the
/// agent itself relies on (`/proc/self/fd` names its open files).
pub const RESERVED_MOUNT_TARGETS: &[&str] = &["proc", "sys", "dev"];

/// The reserved paths of one run: [`RESERVED_PATHS`] and the directories the run was given
/// (`--state-dir`, `--audit-dir`, `--trusted-keys-dir`, `--unit-dir`) where they lie beneath the
/// host root.
#[derive(Clone, Debug)]
pub struct Reserved {
    paths: Vec<HostPath>,
}

impl Default for Reserved {
    fn default() -> Self {
        let units = UNIT_DIRS.iter().flat_map(|d| {
            ["nodeward.service", "nodeward.service.d", "service.d"].map(|n| format!("{d}/{n}"))
        });
        Reserved {
            paths: RESERVED_PATHS
                .iter()
                .map(|p| p.to_string())
                .chain(units)
                .filter_map(|p| HostPath::parse(&p).ok())
                .collect(),
        }
    }
}

impl Reserved {
    /// Adds `dir` (an agent directory given on the command line) when it lies beneath `root`;
    /// one outside the root is out of every phase's reach already. Compared as given and, when
    /// both exist, as resolved, so a root reached through a link is still recognised.
    pub fn with_dir(mut self, root: &Path, dir: &Path) -> Self {
        let resolved = |p: &Path| std::fs::canonicalize(p).ok();
        let candidates = [
            dir.strip_prefix(root).ok().map(Path::to_path_buf),
            resolved(root)
                .zip(resolved(dir))
                .and_then(|(r, d)| d.strip_prefix(r).ok().map(Path::to_path_buf)),
        ];
        for rel in candidates.into_iter().flatten() {
            if let Some(p) = rel.to_str().and_then(|s| HostPath::parse(s).ok())
                && !self.paths.contains(&p)
            {
                self.paths.push(p);
            }
        }
        self
    }

    /// Adds the agent's unit file and drop-in directory in `unit_dir` (the run's `--unit-dir`).
    pub fn with_unit_dir(mut self, unit_dir: &HostPath) -> Self {
        for unit in RESERVED_UNITS {
            for name in [unit.to_string(), format!("{unit}.d")] {
                if let Ok(p) = unit_dir.join(&name)
                    && !self.paths.contains(&p)
                {
                    self.paths.push(p);
                }
            }
        }
        self
    }

    /// Adds where each reserved path really is beneath `root`, when a link on its way leads
    /// elsewhere (`usr/local -> ../var/usrlocal`): the longest existing part of it resolved,
    /// the rest appended. A location outside the root is out of every phase's reach already.
    pub fn resolved_in(mut self, root: &Path) -> Self {
        let Ok(real_root) = std::fs::canonicalize(root) else {
            return self;
        };
        let mut found = Vec::new();
        for p in &self.paths {
            let parts: Vec<&str> = p.as_str().split('/').collect();
            for i in (1..=parts.len()).rev() {
                let prefix = root.join(parts[..i].join("/"));
                if std::fs::symlink_metadata(&prefix).is_err() {
                    continue;
                }
                let real = std::fs::canonicalize(&prefix)
                    .ok()
                    .and_then(|r| r.strip_prefix(&real_root).ok().map(Path::to_path_buf))
                    .and_then(|r| r.to_str().map(str::to_string))
                    .filter(|r| !r.is_empty());
                if let Some(real) = real {
                    let full = std::iter::once(real.as_str())
                        .chain(parts[i..].iter().copied())
                        .collect::<Vec<_>>()
                        .join("/");
                    if let Ok(q) = HostPath::parse(&full)
                        && q != *p
                    {
                        found.push(q);
                    }
                }
                break;
            }
        }
        for q in found {
            if !self.paths.contains(&q) {
                self.paths.push(q);
            }
        }
        self
    }

    /// The reserved path `p` is, or lies beneath.
    pub fn holding(&self, p: &HostPath) -> Option<&HostPath> {
        self.paths.iter().find(|r| p.starts_with(r))
    }

    /// The reserved path `p` is, lies beneath, or holds: what a call on the whole tree at `p`
    /// (a recursive removal, a mount) would reach.
    pub fn touching(&self, p: &HostPath) -> Option<&HostPath> {
        self.holding(p)
            .or_else(|| self.paths.iter().find(|r| r.starts_with(p)))
    }
}

/// Whether `target` is (or lies beneath) a file system the agent relies on
/// ([`RESERVED_MOUNT_TARGETS`]).
pub fn is_reserved_mount_target(target: &HostPath) -> bool {
    RESERVED_MOUNT_TARGETS
        .iter()
        .any(|r| HostPath::parse(r).is_ok_and(|r| target.starts_with(&r)))
}

/// Whether `unit` is one no phase may drive ([`RESERVED_UNITS`]).
pub fn is_reserved_unit(unit: &str) -> bool {
    RESERVED_UNITS.contains(&unit)
}

/// The reserved path (of [`RESERVED_PATHS`]) a grant entry lies in, if any: such an entry can
/// never be used, so the bundle is refused when loaded.
pub fn grant_entry_reserved(entry: &HostPath) -> Option<&'static str> {
    RESERVED_PATHS
        .iter()
        .copied()
        .find(|r| HostPath::parse(r).is_ok_and(|r| entry.starts_with(&r)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hp(s: &str) -> HostPath {
        HostPath::parse(s).expect("host path")
    }

    #[test]
    fn holding_is_whole_components_and_touching_includes_ancestors() {
        let r = Reserved::default();
        assert_eq!(
            r.holding(&hp("var/lib/nodeward")),
            Some(&hp("var/lib/nodeward"))
        );
        assert!(
            r.holding(&hp("var/lib/nodeward/node/install-record.json"))
                .is_some()
        );
        assert!(r.holding(&hp("var/lib/nodeward-other")).is_none());
        assert!(r.holding(&hp("var/lib")).is_none());
        assert_eq!(r.touching(&hp("var/lib")), Some(&hp("var/lib/nodeward")));
        assert_eq!(r.touching(&hp("etc")), Some(&hp("etc/nodeward")));
        assert!(r.touching(&hp("opt/nodeward")).is_none());
        assert!(
            r.touching(&hp("etc/systemd/system/nodeward-kubelet.service"))
                .is_none()
        );
        assert!(
            r.holding(&hp("etc/systemd/system/nodeward.service.d/x.conf"))
                .is_some()
        );
    }

    #[test]
    fn configured_dirs_beneath_the_root_are_reserved_and_others_ignored() {
        let root = Path::new("/srv/root");
        let r = Reserved::default()
            .with_dir(root, Path::new("/srv/root/data/agent"))
            .with_dir(root, Path::new("/elsewhere/audit"))
            .with_dir(root, Path::new("/srv/root"))
            .with_unit_dir(&hp("run/systemd/system"));
        assert!(r.holding(&hp("data/agent/bundles")).is_some());
        assert!(r.touching(&hp("data")).is_some());
        assert!(r.holding(&hp("elsewhere/audit")).is_none());
        assert!(
            r.holding(&hp("run/systemd/system/nodeward.service"))
                .is_some()
        );
        assert!(
            r.holding(&hp("run/systemd/system/nodeward-kubelet.service"))
                .is_none()
        );
    }

    #[test]
    fn grant_entries_inside_reserved_paths_are_named() {
        assert_eq!(
            grant_entry_reserved(&hp("var/lib/nodeward/node")),
            Some("var/lib/nodeward")
        );
        assert_eq!(grant_entry_reserved(&hp("var/lib")), None);
        assert!(is_reserved_unit("nodeward.service"));
        assert!(!is_reserved_unit("nodeward-kubelet.service"));
    }
}
