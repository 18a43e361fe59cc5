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
//! - In every directory systemd reads units from ([`UNIT_DIRS`] and the run's `--unit-dir`),
//!   the agent's unit is reserved with everything systemd reads for it ([`unit_entry`]): the
//!   unit file, its drop-in directories (`nodeward.service.d`, `service.d`), its dependency
//!   directories (`nodeward.service.requires`) and any link to it in a dependency directory
//!   (`multi-user.target.wants/nodeward.service`, which starts it at boot); likewise the unit
//!   files and drop-ins of the other [`RESERVED_UNITS`].
//! - Paths are compared without regard to ASCII case, and [`HostPath`] admits one spelling of
//!   a path only (no `//`, `.`, `..` or trailing `/`); links are resolved before the check, so
//!   a link in a granted directory that leads to a reserved path is refused too.
//! - Calls that act on a whole tree refuse a tree that holds a reserved path: `fs.remove-all`
//!   of `var/lib`, a mount on or of `etc` (a mount over a reserved path hides it from the
//!   agent; a bind of one exposes it), and anything acting on a dependency directory of a unit
//!   directory as a whole (`fs.remove-all etc/systemd/system/multi-user.target.wants`).
//! - A grant entry inside a reserved path refuses the bundle at `phases install`
//!   ([`crate::grants::Grants::reserved_entries`]), so the author learns it at once rather
//!   than by a denial on a node; a bundle loaded otherwise is warned about, and every call
//!   there is denied.
//! - [`RESERVED_UNITS`] cannot be written, enabled, started, stopped or masked by a phase
//!   (their status stays readable), under their own name or an alias: `caps::systemd` refuses
//!   a unit whose file in a unit directory is a link to a reserved unit, and enabling or
//!   disabling a unit whose `[Install]` section names one (`Alias=nodeward.service`,
//!   `Also=nodeward.service`).
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
    "usr/local/lib/systemd/system.conf.d",
    "usr/lib/systemd/system.conf.d",
];

/// The directories systemd reads units and drop-ins from (systemd.unit(5), system manager;
/// what `systemd-analyze unit-paths` lists, and `lib/systemd/system` for split-usr hosts,
/// where `lib` is no link to `usr/lib`): in each, the agent's unit, its drop-in directory and the drop-ins for every service
/// (`service.d`) are reserved.
pub const UNIT_DIRS: &[&str] = &[
    "etc/systemd/system.control",
    "run/systemd/system.control",
    "run/systemd/transient",
    "run/systemd/generator.early",
    "etc/systemd/system",
    "etc/systemd/system.attached",
    "run/systemd/system",
    "run/systemd/system.attached",
    "run/systemd/generator",
    "usr/local/lib/systemd/system",
    "usr/lib/systemd/system",
    "lib/systemd/system",
    "run/systemd/generator.late",
];

/// Units no phase may write, enable, start, stop or mask: the agent's own, the units a stop
/// of which stops it too, and the targets that stop or isolate the whole system.
///
/// A service with default dependencies (systemd.service(5)) has `Requires=` on its slice
/// (`system.slice`, in `-.slice`) and on `sysinit.target`, so stopping either stops the
/// agent; its `After=basic.target` and the unit's `Wants=network-online.target` only order or
/// pull, and a stop of those does not reach it (systemd.unit(5)), so they are not reserved.
pub const RESERVED_UNITS: &[&str] = &[
    AGENT_UNIT,
    "-.slice",
    "system.slice",
    "sysinit.target",
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

/// The agent's own unit.
pub const AGENT_UNIT: &str = "nodeward.service";

/// The suffixes of the directories systemd reads a unit's dependency links from
/// (systemd.unit(5)): a link to the agent's unit in any `<unit>.wants/` (what `systemctl
/// enable` makes in `multi-user.target.wants/`), `.requires/` or `.upholds/` is what starts it
/// at boot, and the agent's own `nodeward.service.requires/` would make it need another unit.
pub const DEPENDENCY_DIRS: &[&str] = &["wants", "requires", "upholds"];

/// Mount targets refused besides the reserved paths: the kernel's file systems, which the
/// agent itself relies on (`/proc/self/fd` names its open files).
pub const RESERVED_MOUNT_TARGETS: &[&str] = &["proc", "sys", "dev"];

/// The reserved paths of one run: [`RESERVED_PATHS`] and the directories the run was given
/// (`--state-dir`, `--audit-dir`, `--trusted-keys-dir`, `--unit-dir`) where they lie beneath the
/// host root; and in every unit directory ([`UNIT_DIRS`], the run's `--unit-dir`) the entries
/// of [`unit_entry`].
///
/// Compared without regard to ASCII case: a case-insensitive directory (ext4 or tmpfs
/// `casefold`) would otherwise open `etc/systemd/system/NodeWard.service` as the agent's unit,
/// and no phase needs a name that differs from a reserved one only in case.
#[derive(Clone, Debug)]
pub struct Reserved {
    /// Reserved with everything beneath them.
    paths: Vec<HostPath>,
    /// Directories systemd reads units from, in each of which [`unit_entry`] is reserved.
    unit_dirs: Vec<HostPath>,
}

impl Default for Reserved {
    fn default() -> Self {
        let parse = |p: &&str| HostPath::parse(p).ok();
        Reserved {
            paths: RESERVED_PATHS.iter().filter_map(parse).collect(),
            unit_dirs: UNIT_DIRS.iter().filter_map(parse).collect(),
        }
    }
}

/// Whether `p` is `prefix` or lies beneath it, whole components, ASCII case ignored.
fn beneath(p: &str, prefix: &str) -> bool {
    p.len() >= prefix.len()
        && p.as_bytes()[..prefix.len()].eq_ignore_ascii_case(prefix.as_bytes())
        && (p.len() == prefix.len() || p.as_bytes()[prefix.len()] == b'/')
}

/// `p` cut after its first `n` components (`p` itself when it has no more).
fn first_components(p: &HostPath, n: usize) -> HostPath {
    p.prefixes()
        .nth(n.saturating_sub(1))
        .unwrap_or_else(|| p.clone())
}

/// The drop-in directories systemd reads for `unit` (systemd.unit(5)): `<unit>.d`, one per
/// dash-prefix of its name (`multi-.target.d` for `multi-user.target`) and the one for its
/// whole type (`service.d`).
fn drop_in_dirs(unit: &str) -> Vec<String> {
    let Some((name, kind)) = unit.rsplit_once('.') else {
        return vec![format!("{unit}.d")];
    };
    let dashes = name.match_indices('-').map(|(i, _)| i);
    std::iter::once(format!("{unit}.d"))
        .chain(dashes.map(|i| format!("{}.{kind}.d", &name[..=i])))
        .chain(std::iter::once(format!("{kind}.d")))
        .collect()
}

/// Whether `name`, an entry of a unit directory, is reserved (ASCII case ignored): a
/// [`RESERVED_UNITS`] unit, a drop-in directory any of them reads (so `service.d`, which every
/// service reads, and `slice.d`, which `system.slice` reads), or one of the agent's
/// dependency directories (`nodeward.service.requires`).
pub fn unit_entry(name: &str) -> bool {
    let agent_deps = DEPENDENCY_DIRS.iter().map(|d| format!("{AGENT_UNIT}.{d}"));
    RESERVED_UNITS
        .iter()
        .flat_map(|u| std::iter::once(u.to_string()).chain(drop_in_dirs(u)))
        .chain(agent_deps)
        .any(|e| e.eq_ignore_ascii_case(name))
}

/// Whether `name`, an entry of a unit directory, is a dependency directory (`*.wants`,
/// `*.requires`, `*.upholds`), which may hold a link to the agent's unit.
fn dependency_dir(name: &str) -> bool {
    DEPENDENCY_DIRS.iter().any(|d| {
        name.len() > d.len() + 1
            && name.as_bytes()[name.len() - d.len() - 1] == b'.'
            && name[name.len() - d.len()..].eq_ignore_ascii_case(d)
    })
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
            if let Some(p) = rel.to_str().and_then(|s| HostPath::parse(s).ok()) {
                add(&mut self.paths, p);
            }
        }
        self
    }

    /// Adds the run's unit directory (`--unit-dir`): the agent's unit and the other entries
    /// of [`unit_entry`] are reserved in it as in every [`UNIT_DIRS`] directory.
    pub fn with_unit_dir(mut self, unit_dir: &HostPath) -> Self {
        add(&mut self.unit_dirs, unit_dir.clone());
        self
    }

    /// Adds where each reserved path and unit directory really is beneath `root`, when a link
    /// on its way leads elsewhere (`usr/local -> ../var/usrlocal`, `lib -> usr/lib`): the
    /// longest existing part of it resolved, the rest appended. A location outside the root
    /// is out of every phase's reach already.
    pub fn resolved_in(mut self, root: &Path) -> Self {
        let Ok(real_root) = std::fs::canonicalize(root) else {
            return self;
        };
        for list in [&mut self.paths, &mut self.unit_dirs] {
            let found: Vec<HostPath> = list
                .iter()
                .filter_map(|p| real_location(root, &real_root, p))
                .collect();
            for q in found {
                add(list, q);
            }
        }
        self
    }

    /// The unit directories of this run: where systemd looks for a unit (every [`UNIT_DIRS`]
    /// directory and the run's `--unit-dir`, each also at its real location).
    pub fn unit_dirs(&self) -> &[HostPath] {
        &self.unit_dirs
    }

    /// The reserved path `p` is, or lies beneath.
    pub fn holding(&self, p: &HostPath) -> Option<HostPath> {
        if let Some(r) = self.paths.iter().find(|r| beneath(p.as_str(), r.as_str())) {
            return Some(r.clone());
        }
        self.unit_dirs.iter().find_map(|d| {
            if !beneath(p.as_str(), d.as_str()) {
                return None;
            }
            let depth = d.prefixes().count();
            let mut rest = p.as_str().get(d.as_str().len() + 1..)?.split('/');
            let entry = rest.next()?;
            if unit_entry(entry) {
                return Some(first_components(p, depth + 1));
            }
            // A link to the agent's unit in a dependency directory: what starts it.
            let link = rest.next()?;
            (dependency_dir(entry) && link.eq_ignore_ascii_case(AGENT_UNIT))
                .then(|| first_components(p, depth + 2))
        })
    }

    /// The reserved path `p` is, lies beneath, or holds: what a call on the whole tree at `p`
    /// (a recursive removal, a mount, a replacement) would reach. A unit directory's
    /// dependency directories (`multi-user.target.wants`) count as holding the agent's link.
    pub fn touching(&self, p: &HostPath) -> Option<HostPath> {
        if let Some(r) = self.holding(p) {
            return Some(r);
        }
        if let Some(r) = self.paths.iter().find(|r| beneath(r.as_str(), p.as_str())) {
            return Some(r.clone());
        }
        self.unit_dirs.iter().find_map(|d| {
            if beneath(d.as_str(), p.as_str()) {
                return d.join(AGENT_UNIT).ok();
            }
            let parent = p.parent()?;
            let entry =
                (parent.as_str().eq_ignore_ascii_case(d.as_str())).then(|| p.file_name())?;
            dependency_dir(entry)
                .then(|| p.join(AGENT_UNIT).ok())
                .flatten()
        })
    }
}

/// Adds `p` to `list` unless it is there.
fn add(list: &mut Vec<HostPath>, p: HostPath) {
    if !list.contains(&p) {
        list.push(p);
    }
}

/// Where `p` really is beneath `root` (canonical `real_root`), when that differs from `p`: the
/// longest existing part of it resolved, the rest appended. `None` when it is where it says,
/// or outside the root.
fn real_location(root: &Path, real_root: &Path, p: &HostPath) -> Option<HostPath> {
    let parts: Vec<&str> = p.as_str().split('/').collect();
    let i = (1..=parts.len())
        .rev()
        .find(|i| std::fs::symlink_metadata(root.join(parts[..*i].join("/"))).is_ok())?;
    let real = std::fs::canonicalize(root.join(parts[..i].join("/")))
        .ok()?
        .strip_prefix(real_root)
        .ok()?
        .to_str()?
        .to_string();
    if real.is_empty() {
        return None;
    }
    let full = std::iter::once(real.as_str())
        .chain(parts[i..].iter().copied())
        .collect::<Vec<_>>()
        .join("/");
    HostPath::parse(&full).ok().filter(|q| q != p)
}

/// Whether `target` is (or lies beneath) a file system the agent relies on
/// ([`RESERVED_MOUNT_TARGETS`]).
pub fn is_reserved_mount_target(target: &HostPath) -> bool {
    RESERVED_MOUNT_TARGETS
        .iter()
        .any(|r| beneath(target.as_str(), r))
}

/// Whether `unit` is one no phase may drive ([`RESERVED_UNITS`]), ASCII case ignored.
pub fn is_reserved_unit(unit: &str) -> bool {
    RESERVED_UNITS.iter().any(|r| r.eq_ignore_ascii_case(unit))
}

/// The reserved path a grant entry lies in, if any (a [`RESERVED_PATHS`] path, or an entry of
/// [`unit_entry`] in a [`UNIT_DIRS`] directory, a link to the agent's unit in a dependency
/// directory included): such an entry can never be used, so `phases install` refuses it.
pub fn grant_entry_reserved(entry: &HostPath) -> Option<HostPath> {
    Reserved::default().holding(entry)
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
            Some(hp("var/lib/nodeward"))
        );
        assert!(
            r.holding(&hp("var/lib/nodeward/node/install-record.json"))
                .is_some()
        );
        assert!(r.holding(&hp("var/lib/nodeward-other")).is_none());
        assert!(r.holding(&hp("var/lib")).is_none());
        assert_eq!(r.touching(&hp("var/lib")), Some(hp("var/lib/nodeward")));
        assert_eq!(r.touching(&hp("etc")), Some(hp("etc/nodeward")));
        assert!(r.touching(&hp("opt/nodeward")).is_none());
        assert!(
            r.touching(&hp("etc/systemd/system/nodeward-kubelet.service"))
                .is_none()
        );
        assert_eq!(
            r.holding(&hp("etc/systemd/system/nodeward.service.d/x.conf")),
            Some(hp("etc/systemd/system/nodeward.service.d"))
        );
    }

    #[test]
    fn the_agents_unit_is_reserved_in_every_unit_directory_in_every_form() {
        let r = Reserved::default();
        for (p, reserved) in [
            (
                "etc/systemd/system/nodeward.service",
                "etc/systemd/system/nodeward.service",
            ),
            (
                "run/systemd/system/nodeward.service",
                "run/systemd/system/nodeward.service",
            ),
            (
                "usr/lib/systemd/system/nodeward.service",
                "usr/lib/systemd/system/nodeward.service",
            ),
            (
                "lib/systemd/system/nodeward.service",
                "lib/systemd/system/nodeward.service",
            ),
            (
                "etc/systemd/system/NodeWard.Service",
                "etc/systemd/system/NodeWard.Service",
            ),
            (
                "etc/systemd/system/nodeward.service.d/10.conf",
                "etc/systemd/system/nodeward.service.d",
            ),
            (
                "usr/lib/systemd/system/service.d/x.conf",
                "usr/lib/systemd/system/service.d",
            ),
            (
                "etc/systemd/system/slice.d/x.conf",
                "etc/systemd/system/slice.d",
            ),
            (
                "etc/systemd/system/system.slice.d/x.conf",
                "etc/systemd/system/system.slice.d",
            ),
            (
                "etc/systemd/system/multi-.target.d/x.conf",
                "etc/systemd/system/multi-.target.d",
            ),
            (
                "etc/systemd/system/nodeward.service.requires/x.service",
                "etc/systemd/system/nodeward.service.requires",
            ),
            (
                "etc/systemd/system/multi-user.target.wants/nodeward.service",
                "etc/systemd/system/multi-user.target.wants/nodeward.service",
            ),
            (
                "lib/systemd/system/other.target.requires/nodeward.service",
                "lib/systemd/system/other.target.requires/nodeward.service",
            ),
            (
                "run/systemd/system/x.target.upholds/nodeward.service",
                "run/systemd/system/x.target.upholds/nodeward.service",
            ),
        ] {
            assert_eq!(r.holding(&hp(p)), Some(hp(reserved)), "{p}");
        }
        for free in [
            "etc/systemd/system/multi-user.target.wants/kubelet.service",
            "etc/systemd/system/kubelet.service.d/10.conf",
            "etc/systemd/system/nodeward-kubelet.service",
            "etc/systemd/system/x.wants.d/nodeward.service",
            "etc/systemd/network/nodeward.service",
        ] {
            assert_eq!(r.holding(&hp(free)), None, "{free}");
            assert_eq!(r.touching(&hp(free)), None, "{free}");
        }
        // A dependency directory as a whole may hold the agent's link.
        assert_eq!(
            r.touching(&hp("etc/systemd/system/multi-user.target.wants")),
            Some(hp(
                "etc/systemd/system/multi-user.target.wants/nodeward.service"
            ))
        );
        assert!(r.touching(&hp("usr/lib/systemd")).is_some());
    }

    #[test]
    fn configured_dirs_beneath_the_root_are_reserved_and_others_ignored() {
        let root = Path::new("/srv/root");
        let r = Reserved::default()
            .with_dir(root, Path::new("/srv/root/data/agent"))
            .with_dir(root, Path::new("/elsewhere/audit"))
            .with_dir(root, Path::new("/srv/root"))
            .with_unit_dir(&hp("opt/units"));
        assert!(r.holding(&hp("data/agent/bundles")).is_some());
        assert!(r.touching(&hp("data")).is_some());
        assert!(r.holding(&hp("elsewhere/audit")).is_none());
        assert!(r.holding(&hp("opt/units/nodeward.service")).is_some());
        assert!(r.holding(&hp("opt/units/default.target")).is_some());
        assert!(
            r.holding(&hp("opt/units/nodeward-kubelet.service"))
                .is_none()
        );
    }

    #[test]
    fn grant_entries_inside_reserved_paths_are_named() {
        assert_eq!(
            grant_entry_reserved(&hp("var/lib/nodeward/node")),
            Some(hp("var/lib/nodeward"))
        );
        assert_eq!(grant_entry_reserved(&hp("var/lib")), None);
        assert_eq!(
            grant_entry_reserved(&hp(
                "etc/systemd/system/multi-user.target.wants/nodeward.service"
            )),
            Some(hp(
                "etc/systemd/system/multi-user.target.wants/nodeward.service"
            ))
        );
        assert_eq!(
            grant_entry_reserved(&hp("etc/systemd/system/multi-user.target.wants")),
            None
        );
        assert!(is_reserved_unit("nodeward.service"));
        assert!(is_reserved_unit("NODEWARD.service"));
        assert!(!is_reserved_unit("nodeward-kubelet.service"));
    }

    #[test]
    fn drop_in_directories_follow_systemd_unit_5() {
        assert_eq!(
            drop_in_dirs("nodeward.service"),
            ["nodeward.service.d", "service.d"]
        );
        assert_eq!(
            drop_in_dirs("ctrl-alt-del.target"),
            [
                "ctrl-alt-del.target.d",
                "ctrl-.target.d",
                "ctrl-alt-.target.d",
                "target.d"
            ]
        );
    }
}
