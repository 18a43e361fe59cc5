//! Snapshots of a host root's tree, to compare two runs (an interrupted bootstrap re-run against
//! an uninterrupted one) or a root before and after `reset`.
//!
//! [`snapshot`] maps each root-relative path to an [`Entry`] (mode, contents' sha256, link
//! target); [`TREE_EXCLUDES`] and [`KUBELET_DIR_KEPT`] name the runtime state that legitimately
//! differs between two runs, and [`stays_after_reset`] what a reset legitimately leaves.

use super::sha256_file;
use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// Root-relative paths [`NodeRoot::tree`] leaves out: runtime state that legitimately differs
/// between two runs of the same bootstrap. A path is left out when it equals an entry or lies
/// below it.
pub const TREE_EXCLUDES: &[&str] = &[
    // containerd's sockets and the runtime state below the root (`run/containerd`).
    "run",
    // containerd's images, snapshots and metadata.
    "var/lib/containerd",
    // CNI IPAM leases.
    "var/lib/cni",
    // Logs (pods', containers', anything else).
    "var/log",
    // The machine's cgroup tree, which the fixture binds there for a real kubelet's node.
    "sys",
];
/// Inside `var/lib/kubelet` only these (written by nodeward) are kept: everything else there is
/// the kubelet's own (pods, plugins, checkpoints, certificates, the kubeconfig of its TLS
/// bootstrap, cpu/memory manager state).
pub const KUBELET_DIR_KEPT: &[&str] = &["config.yaml", "nodeward-flags.env"];

/// What a reset legitimately leaves beneath a root that started empty, besides the artifact
/// cache (`var/lib/nodeward/artifacts`, kept so a re-bootstrap downloads nothing): standard
/// host directories setup-host made because the temporary root lacked them (a reset never
/// removes a directory other software may share) and the agent's own `opt/nodeward`. Also
/// below `proc/` (see [`stays_after_reset`]): beneath a root other than `/` the kernel
/// capability writes sysctls and module loads into `<root>/proc/...` files, and a reset keeps
/// runtime kernel settings (it removes only their boot-time files).
pub const STAYS_AFTER_RESET: &[&str] = &[
    "etc/sysctl.d",
    "etc/modules-load.d",
    "etc/cni",
    "opt",
    "opt/nodeward",
    "var",
    "var/lib",
    "var/lib/nodeward",
];

/// Whether `path` (root-relative) may remain after a reset of a root that started empty.
pub fn stays_after_reset(path: &str) -> bool {
    path.starts_with("var/lib/nodeward/artifacts")
        || path == "proc"
        || path.starts_with("proc/")
        || STAYS_AFTER_RESET.contains(&path)
}

/// One entry of [`NodeRoot::tree`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Entry {
    File {
        mode: u32,
        sha256: String,
    },
    Dir {
        mode: u32,
    },
    Symlink {
        target: String,
    },
    /// Sockets, fifos, devices.
    Other {
        mode: u32,
    },
}

/// A snapshot of the tree at `root`, without what `skip` (given root-relative paths) rejects.
pub fn snapshot(root: &Path, skip: impl Fn(&str) -> bool) -> BTreeMap<String, Entry> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            let rel = p
                .strip_prefix(root)
                .expect("below root")
                .to_string_lossy()
                .into_owned();
            if skip(&rel) {
                continue;
            }
            let Ok(m) = std::fs::symlink_metadata(&p) else {
                continue;
            };
            let mode = m.permissions().mode() & 0o7777;
            let ft = m.file_type();
            let entry = if ft.is_symlink() {
                Entry::Symlink {
                    target: std::fs::read_link(&p)
                        .map(|t| t.to_string_lossy().into_owned())
                        .unwrap_or_default(),
                }
            } else if ft.is_dir() {
                stack.push(p);
                Entry::Dir { mode }
            } else if ft.is_file() {
                Entry::File {
                    mode,
                    sha256: sha256_file(&p),
                }
            } else {
                Entry::Other { mode }
            };
            out.insert(rel, entry);
        }
    }
    out
}
