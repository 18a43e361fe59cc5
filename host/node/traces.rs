//! What a none node leaves on a host, found by looking: the paths `docs/none-mode.md` lists
//! (units, configuration, version directories, the `current` and `opt/cni/bin` links, the
//! kubelet's and containerd's trees, the agent's node state files).
//!
//! # Background
//! A node can be half made: `apply --phase setup-host --phase configure` writes configuration
//! without an install record, a bootstrap can stop early, a reset can be cut short. `status`
//! lists every trace so an operator sees what is there and what `reset` would remove, instead
//! of only "not installed".
//!
//! # Guarantees
//! - Read-only: every check is an `lstat` beneath the root; links are not followed.
//! - The list mirrors what the `teardown` phase removes (`guest-phases/teardown`), plus the
//!   host's node state files (removed by `reset` after teardown). What `reset` keeps on purpose
//!   (the agent's bundles, compiled components and artifact cache, the lock file, directories
//!   other software shares) is not a trace.

use nodeward_node_config::layout::{
    BOOTSTRAP_KUBECONFIG, CA_CERT, CNI_BIN_DIR, CNI_CONFLIST, CNI_STATE_DIR, CONTAINERD_CONFIG,
    CONTAINERD_OPT, CONTAINERD_ROOT, CONTAINERD_STATE, CONTAINERD_UNIT, CURRENT_LINK,
    KUBELET_CONFIG, KUBELET_DIR, KUBELET_FLAGS, KUBELET_KUBECONFIG, KUBELET_UNIT, Layout,
    MODULES_LOAD, NODE_DIR, STATE_DIR, SYSCTL_CONF,
};
use serde::Serialize;
use std::path::Path;

/// What kind of trace a path is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TraceKind {
    /// A node unit file (`start-node`).
    UnitFile,
    /// A configuration or boot-time file a phase wrote (`setup-host`, `configure`).
    Config,
    /// An installed version directory (`download-artifacts`).
    Version,
    /// The `current` or `opt/cni/bin` link (`install`).
    Link,
    /// A tree the node's daemons own (the kubelet's and containerd's state).
    Directory,
    /// One of the host's own node state files (install record, journal, applied config).
    StateFile,
}

/// One trace of a node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Trace {
    /// The path, relative to the host root.
    pub path: String,
    /// What it is.
    pub kind: TraceKind,
}

/// Configuration and boot-time files the phases write (and the bootstrap kubeconfig, which
/// the host renders for `configure`).
const CONFIG_FILES: &[&str] = &[
    SYSCTL_CONF,
    MODULES_LOAD,
    CONTAINERD_CONFIG,
    KUBELET_CONFIG,
    KUBELET_FLAGS,
    KUBELET_KUBECONFIG,
    CA_CERT,
    BOOTSTRAP_KUBECONFIG,
    CNI_CONFLIST,
];

/// Trees that belong to the node's daemons.
const TREES: &[&str] = &[
    KUBELET_DIR,
    CONTAINERD_ROOT,
    CONTAINERD_OPT,
    CONTAINERD_STATE,
    CNI_STATE_DIR,
];

/// Every trace of a node beneath `layout`'s root, in a fixed order: state files, versions,
/// links, unit files, configuration, trees.
pub fn find(layout: &Layout) -> Vec<Trace> {
    let root = Path::new(&layout.root);
    let exists = |rel: &str| root.join(rel).symlink_metadata().is_ok();
    let mut out = Vec::new();
    let mut push = |path: String, kind| out.push(Trace { path, kind });
    for name in sorted_entries(&root.join(STATE_DIR), |_| true) {
        push(format!("{STATE_DIR}/{name}"), TraceKind::StateFile);
    }
    let is_version_dir = |e: &std::fs::DirEntry| e.file_type().is_ok_and(|t| t.is_dir());
    for name in sorted_entries(&root.join(NODE_DIR), is_version_dir) {
        push(format!("{NODE_DIR}/{name}"), TraceKind::Version);
    }
    if exists(CURRENT_LINK) {
        push(CURRENT_LINK.to_string(), TraceKind::Link);
    }
    // `opt/cni/bin` is a trace only as nodeward's link: a directory there is the host's own.
    if root
        .join(CNI_BIN_DIR)
        .symlink_metadata()
        .is_ok_and(|m| m.file_type().is_symlink())
    {
        push(CNI_BIN_DIR.to_string(), TraceKind::Link);
    }
    for unit in [CONTAINERD_UNIT, KUBELET_UNIT] {
        let path = format!("{}/{unit}", layout.unit_dir.trim_matches('/'));
        if exists(&path) {
            push(path, TraceKind::UnitFile);
        }
    }
    for file in CONFIG_FILES {
        if exists(file) {
            push(file.to_string(), TraceKind::Config);
        }
    }
    for tree in TREES {
        if exists(tree) {
            push(tree.to_string(), TraceKind::Directory);
        }
    }
    out
}

/// The names of `dir`'s entries that pass `keep`, sorted; none when `dir` cannot be read.
fn sorted_entries(dir: &Path, keep: impl Fn(&std::fs::DirEntry) -> bool) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut names: Vec<String> = entries
        .flatten()
        .filter(|e| keep(e))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}
