//! Removing what a killed run left, before the next run writes anything.
//!
//! # Background
//! Every file the agent writes goes through [`crate::durable`], whose temp entries are named
//! `.nodeward-tmp.<purpose>.<random>`: a run killed between writing a temp file and renaming it
//! leaves one (a partial download where the filesystem has no unnamed temp files, a complete
//! 0755 binary in `libexec/cni/`, a copy of a node state file that may hold the bootstrap
//! token). Nothing else removes them: a re-run writes new temp files, and `reset` removes only
//! what it knows by name. So every run that may write beneath a host root —
//! `bootstrap`, `upgrade`, `reset` (and the recovery they start with) and `apply` — starts
//! with [`lock`]: the node lock, then [`sweep`], before its first write.
//!
//! # What is swept
//! The host knows the none-mode layout, so the sweep looks where the agent and the phases
//! write, directly in each directory (never below, never through a link; a directory that is
//! missing, or is a link, is skipped):
//! - the node state directory (`var/lib/nodeward/node`);
//! - the version directories: `opt/nodeward/node`, each `<version>/`, its `bin/`, `libexec/`
//!   and `libexec/cni/`;
//! - the directories of the layout's other files (`etc/containerd`, `etc/kubernetes`,
//!   `etc/kubernetes/pki`, `etc/cni/net.d`, `var/lib/kubelet`, `etc/modules-load.d`,
//!   `etc/sysctl.d`, `opt/cni`) and the unit directory;
//! - the artifact cache (`<cache>` and `<cache>/sha256`);
//! - the compiled-component cache (`<state-dir>/compiled`, outside the root).
//!
//! # Assumptions
//! Only runs holding the node lock write these directories. `plan` takes no lock and writes
//! only compiled components; see the caveat in [`crate::durable`].

use crate::caps::RunContext;
use crate::durable;
use crate::hostpath::{HostPath, HostRoot, is_link_refused};
use crate::node::state::{NodeLock, StateError};
use crate::runtime::Runtime;
use nodeward_node_config::layout::{
    BOOTSTRAP_KUBECONFIG, CA_CERT, CNI_BIN_DIR, CNI_CONFLIST, CONTAINERD_CONFIG, KUBELET_CONFIG,
    MODULES_LOAD, NODE_DIR, STATE_DIR, SYSCTL_CONF,
};
use std::collections::BTreeSet;
use std::io;

/// A directory could not be swept.
#[derive(Debug, thiserror::Error)]
#[error("{dir}: cannot remove the temp files a killed run left there: {source}")]
pub struct SweepError {
    /// The directory (root-relative beneath the host root, else absolute).
    pub dir: String,
    /// The failure.
    #[source]
    pub source: io::Error,
}

/// Why a run could not start writing: the lock is held (or its file unusable), or the sweep
/// failed.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The node lock.
    #[error(transparent)]
    Lock(#[from] StateError),
    /// The sweep.
    #[error(transparent)]
    Sweep(#[from] SweepError),
}

/// How every run that writes beneath a host root starts: takes the [`NodeLock`] of `run`'s
/// root, then [`sweep`]s. Hold the lock until the run is done.
pub fn lock(run: &RunContext, runtime: &Runtime) -> Result<NodeLock, StartError> {
    let lock = NodeLock::acquire(run.root().path())?;
    sweep(run, runtime)?;
    Ok(lock)
}

/// Files of the layout whose directories phases write into.
const LAYOUT_FILES: &[&str] = &[
    CONTAINERD_CONFIG,
    KUBELET_CONFIG,
    BOOTSTRAP_KUBECONFIG,
    CA_CERT,
    CNI_CONFLIST,
    MODULES_LOAD,
    SYSCTL_CONF,
    CNI_BIN_DIR,
];

/// Removes the temp entries a killed run left (see the module doc) beneath `run`'s host root
/// and in `runtime`'s compiled-component cache; returns what it removed (each as its directory
/// and name). Call it holding the node lock, before the first write.
pub fn sweep(run: &RunContext, runtime: &Runtime) -> Result<Vec<String>, SweepError> {
    let root = run.root();
    let mut removed = Vec::new();
    for dir in directories(root, &run.systemd.unit_dir, &run.downloads.cache_dir)? {
        let handle = match root.open_dir_nofollow(Some(&dir)) {
            Ok(h) => h,
            Err(e) if skipped(&e) => continue,
            Err(source) => return Err(error(&dir, source)),
        };
        let names = durable::sweep(&handle, durable::TempDirs::Leave)
            .map_err(|source| error(&dir, source))?;
        removed.extend(names.into_iter().map(|n| format!("{dir}/{n}")));
    }
    let compiled = runtime.cache_dir();
    let names =
        durable::sweep_path(compiled, durable::TempDirs::Remove).map_err(|source| SweepError {
            dir: compiled.display().to_string(),
            source,
        })?;
    removed.extend(
        names
            .into_iter()
            .map(|n| compiled.join(n).display().to_string()),
    );
    if !removed.is_empty() {
        tracing::warn!(?removed, "removed the temp files a killed run left");
    }
    Ok(removed)
}

/// The directories [`sweep`] looks in, beneath the root (see the module doc).
fn directories(
    root: &HostRoot,
    unit_dir: &HostPath,
    artifact_cache: &HostPath,
) -> Result<BTreeSet<HostPath>, SweepError> {
    let path = |s: &str| {
        HostPath::parse(s).map_err(|e| SweepError {
            dir: s.to_string(),
            source: io::Error::other(e),
        })
    };
    let mut dirs = BTreeSet::new();
    for file in LAYOUT_FILES {
        if let Some(parent) = path(file)?.parent() {
            dirs.insert(parent);
        }
    }
    dirs.insert(unit_dir.clone());
    dirs.insert(path(STATE_DIR)?);
    dirs.insert(artifact_cache.clone());
    dirs.insert(path(&format!("{artifact_cache}/sha256"))?);
    let node_dir = path(NODE_DIR)?;
    dirs.insert(node_dir.clone());
    for version in subdirectories(root, &node_dir)? {
        for sub in ["", "/bin", "/libexec", "/libexec/cni"] {
            dirs.insert(path(&format!("{node_dir}/{version}{sub}"))?);
        }
    }
    Ok(dirs)
}

/// The names of the directories (not links to them) in `dir`; none when it is missing.
fn subdirectories(root: &HostRoot, dir: &HostPath) -> Result<Vec<String>, SweepError> {
    let handle = match root.open_dir_nofollow(Some(dir)) {
        Ok(h) => h,
        Err(e) if skipped(&e) => return Ok(Vec::new()),
        Err(source) => return Err(error(dir, source)),
    };
    let mut names = Vec::new();
    for entry in handle.entries().map_err(|source| error(dir, source))? {
        let entry = entry.map_err(|source| error(dir, source))?;
        let is_dir = entry
            .file_type()
            .map_err(|source| error(dir, source))?
            .is_dir();
        // A name that is not UTF-8 is no version directory nodeward made.
        if let (true, Some(name)) = (is_dir, entry.file_name().to_str()) {
            names.push(name.to_string());
        }
    }
    Ok(names)
}

/// Directories the sweep passes over: missing ones, and links (never followed).
fn skipped(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::NotFound
        || e.raw_os_error() == Some(rustix::io::Errno::NOTDIR.raw_os_error())
        || is_link_refused(e)
}

fn error(dir: &HostPath, source: io::Error) -> SweepError {
    SweepError {
        dir: dir.to_string(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::Redactor;
    use crate::plan::RunMode;
    use std::path::Path;

    fn touch(root: &Path, rel: &str) {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(p, "leftover").expect("write");
    }

    #[test]
    fn sweeps_the_layouts_directories_and_nothing_else() {
        let tmp = tempfile::tempdir().expect("tmp");
        let root = tmp.path().join("root");
        let compiled = tmp.path().join("compiled");
        std::fs::create_dir_all(&root).expect("root");
        let run = RunContext::new(
            HostRoot::open(&root).expect("root"),
            RunMode::Apply,
            Redactor::default(),
        );
        let runtime = Runtime::new(&compiled).expect("runtime");
        let leftovers = [
            "var/lib/nodeward/node/.nodeward-tmp.state.0000000000000001",
            "opt/nodeward/node/.nodeward-tmp.link.0000000000000002",
            "opt/nodeward/node/1.34.1-abc/.nodeward-tmp.write.0000000000000003",
            "opt/nodeward/node/1.34.1-abc/bin/.nodeward-tmp.download.0000000000000004",
            "opt/nodeward/node/1.34.1-abc/libexec/cni/.nodeward-tmp.extract.0000000000000005",
            "var/lib/nodeward/artifacts/sha256/.nodeward-tmp.download.0000000000000006",
            "etc/kubernetes/.nodeward-tmp.write.0000000000000007",
            "etc/systemd/system/.nodeward-tmp.write.0000000000000008",
            "opt/cni/.nodeward-tmp.link.0000000000000009",
        ];
        let kept = [
            // Not the scheme.
            "var/lib/nodeward/node/install-record.json",
            "opt/nodeward/node/1.34.1-abc/bin/.kubelet.nodeward-0123",
            // Not a directory the agent writes, or below one.
            "home/user/.nodeward-tmp.write.000000000000000a",
            "opt/nodeward/node/1.34.1-abc/bin/sub/.nodeward-tmp.write.000000000000000b",
        ];
        for rel in leftovers.iter().chain(&kept) {
            touch(&root, rel);
        }
        touch(&compiled, ".nodeward-tmp.compiled.000000000000000c");
        // A version directory reached through a link is not swept through it.
        let outside = tmp.path().join("outside");
        touch(&outside, "bin/.nodeward-tmp.download.000000000000000d");
        std::os::unix::fs::symlink(&outside, root.join("opt/nodeward/node/linked")).expect("link");

        let mut removed = sweep(&run, &runtime).expect("sweep");
        removed.sort();
        let mut want: Vec<String> = leftovers.iter().map(|s| s.to_string()).collect();
        want.push(
            compiled
                .join(".nodeward-tmp.compiled.000000000000000c")
                .display()
                .to_string(),
        );
        want.sort();
        assert_eq!(removed, want);
        for rel in leftovers {
            assert!(!root.join(rel).exists(), "{rel}");
        }
        for rel in kept {
            assert!(root.join(rel).exists(), "{rel}");
        }
        assert!(
            outside
                .join("bin/.nodeward-tmp.download.000000000000000d")
                .exists()
        );
        assert!(sweep(&run, &runtime).expect("again").is_empty());
    }
}
