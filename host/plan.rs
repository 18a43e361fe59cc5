//! The typed change list, and plan mode's overlay.
//!
//! # Background
//! `nodeward plan` and `nodeward apply` run the same phases. Every mutating capability produces
//! a [`Change`] in both modes; in apply mode it also performs it, in plan mode it records the
//! new state in the [`Overlay`] instead, so later reads in the same run (by the same phase or
//! a later one) see the planned state. A phase cannot tell the modes apart.
//!
//! # Guarantees
//! - Plan mode never changes the host: capabilities consult [`RunMode`] before every mutation
//!   and the overlay lives only in memory.
//! - A change's diff is a unified diff for text files. It is withheld for files not readable by
//!   group or others (secrets are written 0600) and for files that contain a known secret,
//!   and every diff is redacted on top of that. A file change whose new contents hold a
//!   secret (or a part of one, [`crate::secrets`]) carries no sha256 either: a digest of a
//!   secret-bearing file could be checked against guesses offline. Binary, large or
//!   slow-to-diff files get a one-line summary instead ([`diff_limits`]), so a plan's diffs
//!   are bounded in size and time.
//!
//! # Caveats
//! The overlay models files, directories and symlinks. Unit, mount, download, link and cgroup
//! changes are recorded as changes only; capabilities that read such state in plan mode see
//! the host.

use crate::hostpath::HostPath;
use serde::Serialize;

mod diff;
mod log;
pub use diff::{diff_limits, file_diff};
pub use log::{ChangeLog, MAX_CHANGES, MAX_DIFF_BYTES, MAX_PLANNED_BYTES, PlannedTooLarge};
use std::collections::BTreeMap;

/// Whether capabilities change the host or only record what they would change.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RunMode {
    /// Record changes; touch nothing.
    Plan,
    /// Make the changes.
    Apply,
}

impl std::fmt::Display for RunMode {
    /// `plan` or `apply`, as in JSON and on the command line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RunMode::Plan => "plan",
            RunMode::Apply => "apply",
        })
    }
}

/// One change a phase made (apply) or would make (plan).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Change {
    /// The phase that made it.
    pub phase: String,
    /// What changed.
    #[serde(flatten)]
    pub kind: ChangeKind,
}

/// File modes print as octal strings (`"0644"`).
pub fn octal(mode: u32) -> String {
    format!("{mode:04o}")
}

/// What a change is. Serialized with a `kind` tag whose values are kebab-case (`file-create`,
/// `unit-start`, ...: values, like Kubernetes' `type` strings) and camelCase fields
/// (`previousMode`, `destDir`), like every key of the command line's JSON.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(
    tag = "kind",
    rename_all = "kebab-case",
    rename_all_fields = "camelCase"
)]
pub enum ChangeKind {
    /// A new regular file.
    FileCreate {
        /// Host path.
        path: String,
        /// Octal permission bits.
        mode: String,
        /// sha256 of the contents; absent when they hold a secret (see the module doc).
        #[serde(skip_serializing_if = "Option::is_none")]
        sha256: Option<String>,
        /// Size in bytes.
        size: u64,
        /// Unified diff from nothing, when shown.
        #[serde(skip_serializing_if = "Option::is_none")]
        diff: Option<String>,
    },
    /// An existing file's contents replaced (its mode may change too).
    FileReplace {
        /// Host path.
        path: String,
        /// Octal permission bits after the change.
        mode: String,
        /// Octal permission bits before.
        previous_mode: String,
        /// sha256 of the new contents; absent when they hold a secret (see the module doc).
        #[serde(skip_serializing_if = "Option::is_none")]
        sha256: Option<String>,
        /// Size in bytes.
        size: u64,
        /// Unified diff, when shown.
        #[serde(skip_serializing_if = "Option::is_none")]
        diff: Option<String>,
    },
    /// Only the permission bits change.
    ModeChange {
        /// Host path.
        path: String,
        /// Before.
        from: String,
        /// After.
        to: String,
    },
    /// A file, symlink or empty directory removed.
    Remove {
        /// Host path.
        path: String,
    },
    /// A new directory.
    DirCreate {
        /// Host path.
        path: String,
        /// Octal permission bits.
        mode: String,
    },
    /// A symlink created or re-pointed.
    Symlink {
        /// Host path of the link.
        path: String,
        /// What it points to.
        target: String,
        /// What it pointed to before, if it existed.
        #[serde(skip_serializing_if = "Option::is_none")]
        previous: Option<String>,
    },
    /// A unit file written.
    UnitWrite {
        /// Unit name.
        unit: String,
        /// Host path of the file.
        path: String,
    },
    /// A unit file and its drop-ins removed.
    UnitRemove {
        /// Unit name.
        unit: String,
    },
    /// systemd told to reload unit files.
    DaemonReload,
    /// A unit enabled.
    UnitEnable {
        /// Unit name.
        unit: String,
    },
    /// A unit disabled.
    UnitDisable {
        /// Unit name.
        unit: String,
    },
    /// A unit started.
    UnitStart {
        /// Unit name.
        unit: String,
    },
    /// A unit stopped.
    UnitStop {
        /// Unit name.
        unit: String,
    },
    /// A unit restarted.
    UnitRestart {
        /// Unit name.
        unit: String,
    },
    /// A unit's failed state cleared.
    UnitResetFailed {
        /// Unit name.
        unit: String,
    },
    /// A unit masked.
    UnitMask {
        /// Unit name.
        unit: String,
    },
    /// A unit unmasked.
    UnitUnmask {
        /// Unit name.
        unit: String,
    },
    /// A bind mount.
    MountBind {
        /// Host path mounted.
        source: String,
        /// Host path mounted on.
        target: String,
        /// Read-only.
        read_only: bool,
    },
    /// A tmpfs mount.
    MountTmpfs {
        /// Host path mounted on.
        target: String,
        /// Size cap in bytes.
        size_bytes: u64,
    },
    /// An overlay mount.
    MountOverlay {
        /// Lower directories, topmost first.
        lower: Vec<String>,
        /// Upper directory.
        upper: String,
        /// Work directory.
        work: String,
        /// Host path mounted on.
        target: String,
    },
    /// An unmount.
    Unmount {
        /// Host path unmounted.
        target: String,
        /// Detached lazily.
        lazy: bool,
    },
    /// A verified download.
    Download {
        /// Source URL.
        url: String,
        /// Expected sha256.
        sha256: String,
        /// Host path written.
        dest: String,
    },
    /// A verified download extracted into a directory.
    DownloadExtract {
        /// Source URL.
        url: String,
        /// Expected sha256.
        sha256: String,
        /// Host path of the directory.
        dest_dir: String,
        /// Leading components dropped.
        strip_components: u32,
    },
    /// A kernel module loaded.
    ModuleLoad {
        /// Module name.
        name: String,
    },
    /// A sysctl set.
    Sysctl {
        /// Dotted key.
        key: String,
        /// Value before, if the key existed.
        #[serde(skip_serializing_if = "Option::is_none")]
        from: Option<String>,
        /// Value after.
        to: String,
    },
    /// Swap turned off.
    SwapOff {
        /// The swap areas turned off.
        areas: Vec<String>,
    },
    /// A network link deleted (`network.delete-bridge`: the bridge and each of its veths).
    LinkDelete {
        /// The link's name.
        link: String,
        /// Its kind (`bridge`, `veth`).
        link_kind: String,
        /// What else went or changed with it: a veth's peer in this namespace, the bridge it
        /// was a port of.
        #[serde(skip_serializing_if = "Option::is_none")]
        note: Option<String>,
    },
    /// An empty cgroup removed (`cgroups.remove-empty`).
    CgroupRemove {
        /// `<hierarchy>/<cgroup path>`, e.g. `cpuset/kubepods.slice`.
        path: String,
    },
    /// The host runtime's own record of the node changed (install record, checkpoint, upgrade
    /// journal, applied config). Made by the host, not a phase; listed so the audit and the
    /// crash tests see every durable step.
    NodeState {
        /// Host path of the state file.
        path: String,
        /// What changed, e.g. `checkpoint configure`, `journal written`, `removed`.
        action: String,
    },
    /// A file the host renders itself with a secret in it (the bootstrap kubeconfig, see
    /// `crate::bootstrap_kubeconfig`) created or replaced. Nothing derived from its contents
    /// is listed (no digest, size or diff): the rest of such a file is known from the node
    /// config, so a digest would let anyone holding the plan test guesses of the secret.
    SecretFile {
        /// Host path.
        path: String,
        /// Octal permission bits after the change.
        mode: String,
        /// Whether the file is new or replaces one.
        action: FileAction,
    },
}

/// What a write does to the file at its path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FileAction {
    /// There was none.
    Create,
    /// A file with other contents or another mode was there.
    Replace,
}

impl ChangeKind {
    /// A one-line description for text output.
    pub fn describe(&self) -> String {
        use ChangeKind::*;
        match self {
            NodeState { path, action } => format!("node state {path}: {action}"),
            FileCreate {
                path, mode, size, ..
            } => format!("create file {path} ({mode}, {size} bytes)"),
            FileReplace {
                path,
                mode,
                previous_mode,
                size,
                ..
            } if mode != previous_mode => {
                format!("replace file {path} ({previous_mode} -> {mode}, {size} bytes)")
            }
            FileReplace {
                path, mode, size, ..
            } => format!("replace file {path} ({mode}, {size} bytes)"),
            ModeChange { path, from, to } => format!("chmod {path} {from} -> {to}"),
            Remove { path } => format!("remove {path}"),
            DirCreate { path, mode } => format!("create dir {path} ({mode})"),
            Symlink {
                path,
                target,
                previous: Some(p),
            } => format!("re-point {path} -> {target} (was {p})"),
            Symlink { path, target, .. } => format!("symlink {path} -> {target}"),
            UnitWrite { unit, path } => format!("write unit {unit} ({path})"),
            UnitRemove { unit } => format!("remove unit {unit}"),
            DaemonReload => "systemd daemon-reload".into(),
            UnitEnable { unit } => format!("enable {unit}"),
            UnitDisable { unit } => format!("disable {unit}"),
            UnitStart { unit } => format!("start {unit}"),
            UnitStop { unit } => format!("stop {unit}"),
            UnitRestart { unit } => format!("restart {unit}"),
            UnitResetFailed { unit } => format!("reset-failed {unit}"),
            UnitMask { unit } => format!("mask {unit}"),
            UnitUnmask { unit } => format!("unmask {unit}"),
            MountBind {
                source,
                target,
                read_only,
            } => {
                format!(
                    "bind-mount {source} on {target}{}",
                    if *read_only { " (ro)" } else { "" }
                )
            }
            MountTmpfs { target, size_bytes } => {
                format!("mount tmpfs ({size_bytes} bytes) on {target}")
            }
            MountOverlay { target, .. } => format!("mount overlay on {target}"),
            Unmount { target, lazy } => {
                format!("unmount {target}{}", if *lazy { " (lazy)" } else { "" })
            }
            Download { url, dest, .. } => format!("download {url} to {dest}"),
            DownloadExtract { url, dest_dir, .. } => {
                format!("download {url} and extract into {dest_dir}")
            }
            ModuleLoad { name } => format!("load kernel module {name}"),
            Sysctl {
                key,
                from: Some(f),
                to,
            } => format!("sysctl {key} {f} -> {to}"),
            Sysctl { key, to, .. } => format!("sysctl {key} = {to}"),
            SwapOff { areas } => format!("swap off ({})", areas.join(", ")),
            LinkDelete {
                link,
                link_kind,
                note: Some(n),
            } => format!("delete {link_kind} link {link} ({n})"),
            LinkDelete {
                link, link_kind, ..
            } => format!("delete {link_kind} link {link}"),
            CgroupRemove { path } => format!("remove empty cgroup {path}"),
            SecretFile { path, mode, action } => {
                let verb = match action {
                    FileAction::Create => "create",
                    FileAction::Replace => "replace",
                };
                format!(
                    "{verb} file {path} ({mode}; the agent's, holds a secret: contents withheld)"
                )
            }
        }
    }

    /// The unified diff this change carries, if any.
    pub fn diff(&self) -> Option<&str> {
        match self {
            ChangeKind::FileCreate { diff, .. } | ChangeKind::FileReplace { diff, .. } => {
                diff.as_deref()
            }
            _ => None,
        }
    }
}

/// A planned state of one host path.
#[derive(Clone, Debug, PartialEq)]
pub enum Planned {
    /// A regular file with these contents and mode.
    File {
        /// Contents.
        contents: Vec<u8>,
        /// Permission bits.
        mode: u32,
    },
    /// A directory with this mode.
    Dir {
        /// Permission bits.
        mode: u32,
    },
    /// A symlink to this target.
    Symlink {
        /// Target.
        target: String,
    },
    /// Nothing (removed).
    Removed,
}

/// Plan mode's view of the host: the planned state of every path a phase changed.
#[derive(Debug, Default)]
pub struct Overlay {
    entries: BTreeMap<HostPath, Planned>,
}

/// What the overlay knows about a path.
#[derive(Debug, PartialEq)]
pub enum OverlayView<'a> {
    /// The path itself was planned.
    Planned(&'a Planned),
    /// An ancestor was removed or replaced by a non-directory, so nothing is there.
    Gone,
    /// The overlay says nothing; look at the host.
    Host,
}

impl Overlay {
    /// What the overlay says about `path`.
    pub fn view(&self, path: &HostPath) -> OverlayView<'_> {
        if let Some(p) = self.entries.get(path) {
            return OverlayView::Planned(p);
        }
        let mut ancestor = path.parent();
        while let Some(a) = ancestor {
            match self.entries.get(&a) {
                Some(Planned::Dir { .. }) | None => {}
                Some(_) => return OverlayView::Gone,
            }
            ancestor = a.parent();
        }
        OverlayView::Host
    }

    /// Records the planned state of `path`.
    pub fn set(&mut self, path: HostPath, state: Planned) {
        self.entries.insert(path, state);
    }

    /// Forgets every planned state strictly beneath `path` (a tree removed as a whole).
    pub fn remove_beneath(&mut self, path: &HostPath) {
        self.entries
            .retain(|p, _| p == path || !p.starts_with(path));
    }

    /// Planned direct children of `dir` (`None` for the root) with their state.
    pub fn children(&self, dir: Option<&HostPath>) -> Vec<(String, &Planned)> {
        self.entries
            .iter()
            .filter(|(p, _)| p.parent().as_ref() == dir)
            .map(|(p, s)| (p.file_name().to_string(), s))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> HostPath {
        HostPath::parse(s).expect("path")
    }

    #[test]
    fn overlay_shadows_the_host() {
        let mut o = Overlay::default();
        assert_eq!(o.view(&p("etc/x")), OverlayView::Host);
        o.set(p("etc"), Planned::Dir { mode: 0o755 });
        o.set(
            p("etc/x"),
            Planned::File {
                contents: b"a".to_vec(),
                mode: 0o644,
            },
        );
        assert!(matches!(
            o.view(&p("etc/x")),
            OverlayView::Planned(Planned::File { .. })
        ));
        assert_eq!(o.view(&p("etc/y")), OverlayView::Host);
        o.set(p("var"), Planned::Removed);
        assert_eq!(o.view(&p("var/lib/x")), OverlayView::Gone);
        let names: Vec<String> = o
            .children(Some(&p("etc")))
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        assert_eq!(names, ["x"]);
    }

    #[test]
    fn changes_serialize_with_kind_tag() {
        let c = Change {
            phase: "setup-host".into(),
            kind: ChangeKind::ModuleLoad {
                name: "overlay".into(),
            },
        };
        let v = serde_json::to_value(&c).expect("json");
        assert_eq!(v["kind"], "module-load");
        assert_eq!(v["phase"], "setup-host");
        assert_eq!(v["name"], "overlay");
    }
}
