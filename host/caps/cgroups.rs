//! `nodeward:host/cgroups`: removes the empty cgroups the node's kubelet left.
//!
//! # Background
//! The kubelet makes `kubepods` cgroups (`kubepods.slice/...` with the systemd driver) in every
//! hierarchy, also in the cgroup v1 hierarchies systemd does not manage (`cpuset`, `freezer`,
//! `perf_event`, ...): stopping `kubepods.slice` takes away only systemd's own. The cgroup
//! mounts are found at `sys/fs/cgroup` beneath the host root ([`CGROUP_MOUNT`]): with `--root /`
//! the machine's `/sys/fs/cgroup`, with any other root that root's, so a test root touches no
//! cgroup of the machine unless one is bound there (as `kernel` writes `<root>/proc/sys`).
//! [`super::cgroup_sys`] does the file-system work.
//!
//! # Guarantees
//! - Grant check first: the path's shape ([`CgroupPath`]), then `cgroups.remove`.
//! - In each hierarchy, the tree at the path is read completely first (bounded by
//!   [`CgroupContext::max_cgroups`] and [`CgroupContext::max_depth`]); a symlink or a mount in
//!   it refuses the call before anything is removed.
//! - A cgroup with processes stays, and so do its ancestors; both are reported in `kept`,
//!   not as an error. One whose `rmdir` is `EBUSY` without processes (a task still exiting)
//!   is tried again for up to [`BUSY_RETRY`], within the phase deadline.
//! - Every removal has its own audit record (`cgroups.remove`; past the record budget it is
//!   refused) and a [`ChangeKind::CgroupRemove`]; plan mode walks the same trees and records
//!   the changes a removal would make, removing nothing.

use super::cgroup_sys::{self, Hierarchy, Node, WalkError};
use super::netlink::describe_errno;
use super::{AuditSummary, Error, Outcome, PhaseCtx, denied};
use crate::grants::CgroupPath;
use crate::plan::{ChangeKind, RunMode};
use crate::wit::cgroups::{self, Removal};
use rustix::fd::{AsFd, OwnedFd};
use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;
use serde_json::json;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Where the cgroup file systems are mounted, beneath the host root.
pub const CGROUP_MOUNT: &str = "sys/fs/cgroup";

/// How long a cgroup that is busy without processes is tried again.
pub const BUSY_RETRY: Duration = Duration::from_secs(1);
/// Most cgroups listed in `kept`.
const MAX_KEPT_LISTED: usize = 32;

/// Where the cgroup file systems are and what one call may read.
#[derive(Clone, Debug)]
pub struct CgroupContext {
    /// The cgroup mount point, when not `sys/fs/cgroup` beneath the host root (tests).
    pub mount: Option<PathBuf>,
    /// Most cgroups one call reads, in all hierarchies together.
    pub max_cgroups: usize,
    /// Most levels below the granted path.
    pub max_depth: usize,
}

impl Default for CgroupContext {
    /// `sys/fs/cgroup` beneath the host root, 4096 cgroups, 32 levels (`wit/cgroups.wit`).
    fn default() -> Self {
        CgroupContext {
            mount: None,
            max_cgroups: 4096,
            max_depth: 32,
        }
    }
}

impl AuditSummary for Removal {
    fn summary(&self) -> String {
        format!("{} removed, {} kept", self.removed, self.kept.len())
    }
}

/// `<hierarchy>/<path>`, or the path alone on a cgroup2 mount point.
fn label(h: &Hierarchy, path: &str) -> String {
    if h.name.is_empty() {
        path.to_string()
    } else {
        format!("{}/{path}", h.name)
    }
}

fn walk_error(h: &Hierarchy, e: WalkError) -> Error {
    match e {
        WalkError::Sys { at, errno } => Error::Io(format!(
            "cgroup {}: {}",
            label(h, &at),
            describe_errno(errno)
        )),
        WalkError::Link(at) => Error::Denied(format!(
            "cgroup {}: a symlink; cgroup trees are never followed through links",
            label(h, &at)
        )),
        WalkError::Mount(at) => Error::Denied(format!(
            "cgroup {}: another file system is mounted there; nothing removed",
            label(h, &at)
        )),
        WalkError::Limit(what) => Error::Failed(format!(
            "cgroups in {}: {what}; nothing removed",
            if h.name.is_empty() {
                "the cgroup2 hierarchy"
            } else {
                &h.name
            }
        )),
    }
}

/// One hierarchy's tree at the granted path, read before anything is removed.
struct Found {
    hierarchy: Hierarchy,
    parent: OwnedFd,
    tree: Node,
}

/// What the removal passes have done so far.
#[derive(Default)]
struct Tally {
    removed: u32,
    kept: Vec<String>,
    busy: bool,
}

impl PhaseCtx {
    /// Removes (apply) or plans the removal of `node` (at `at`, in `parent`) and what is
    /// beneath it, deepest first, adding what stays to `tally.kept`. `Ok(true)` when it is
    /// gone (or would be).
    fn remove_tree(
        &mut self,
        h: &Hierarchy,
        parent: &impl AsFd,
        node: &Node,
        at: &str,
        tally: &mut Tally,
    ) -> Result<bool, Error> {
        let io = |errno| {
            Error::Io(format!(
                "cgroup {}: {}",
                label(h, at),
                describe_errno(errno)
            ))
        };
        let apply = self.run.mode() == RunMode::Apply;
        let dir = if apply {
            match cgroup_sys::reopen(h, parent, &node.name) {
                Ok(Some(fd)) => Some(fd),
                Ok(None) => return Ok(true),
                Err(Errno::XDEV) => {
                    return Err(walk_error(h, WalkError::Mount(at.to_string())));
                }
                Err(e) => return Err(io(e)),
            }
        } else {
            None
        };
        let mut all_gone = true;
        for child in &node.children {
            let child_at = format!("{at}/{}", child.name);
            let gone = match &dir {
                Some(d) => self.remove_tree(h, d, child, &child_at, tally)?,
                None => self.remove_tree(h, parent, child, &child_at, tally)?,
            };
            all_gone &= gone;
        }
        let procs = match &dir {
            Some(d) => cgroup_sys::has_procs(d).map_err(io)?,
            None => node.has_procs,
        };
        drop(dir);
        if procs || !all_gone {
            let why = if procs {
                "has processes"
            } else {
                "holds a cgroup that stays"
            };
            tally.kept.push(format!("{}: {why}", label(h, at)));
            return Ok(false);
        }
        let name = label(h, at);
        let result = self.audited("cgroups.remove", json!({ "cgroup": name }), |ctx| {
            if ctx.run.mode() == RunMode::Apply {
                cgroup_sys::remove(parent, &node.name).map_err(|e| match e {
                    Errno::BUSY => Error::Failed(format!("cgroup {name}: EBUSY, kept")),
                    Errno::NOENT => Error::NotFound(format!("cgroup {name}: gone")),
                    e => Error::Io(format!("cgroup {name}: {}", describe_errno(e))),
                })?;
            }
            ctx.changed(ChangeKind::CgroupRemove { path: name.clone() });
            Ok(Outcome::Removed)
        });
        match result {
            Ok(_) => {
                tally.removed += 1;
                Ok(true)
            }
            Err(Error::NotFound(_)) => Ok(true),
            Err(Error::Failed(m)) if m.ends_with("EBUSY, kept") => {
                tally.busy = true;
                tally.kept.push(format!("{}: busy", label(h, at)));
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// The cgroup mount point, opened: `sys/fs/cgroup` beneath the host root (through its
    /// `Dir`, so a link there cannot lead out of the root), or the context's override.
    fn cgroup_mount(&self, cg: &CgroupContext) -> Result<(String, OwnedFd), Error> {
        let missing = |what: String| Error::Unavailable(format!("{what} does not exist"));
        match &cg.mount {
            Some(p) => {
                let what = p.display().to_string();
                let fd = rustix::fs::open(
                    p,
                    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                    Mode::empty(),
                )
                .map_err(|e| match e {
                    Errno::NOENT | Errno::NOTDIR => missing(what.clone()),
                    e => Error::Io(format!("{what}: {}", describe_errno(e))),
                })?;
                Ok((what, fd))
            }
            None => {
                let root = &self.run.files.root;
                let what = root.path().join(CGROUP_MOUNT).display().to_string();
                let dir = root.dir().open_dir(CGROUP_MOUNT).map_err(|e| {
                    if e.kind() == std::io::ErrorKind::NotFound
                        || e.raw_os_error() == Some(Errno::NOTDIR.raw_os_error())
                    {
                        missing(what.clone())
                    } else {
                        Error::Io(format!("{what}: {e}"))
                    }
                })?;
                // cap-std's descriptor may be `O_PATH`, which cannot be listed: open the
                // directory itself through it.
                let fd = rustix::fs::openat(
                    &dir,
                    ".",
                    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                    Mode::empty(),
                )
                .map_err(|e| Error::Io(format!("{what}: {}", describe_errno(e))))?;
                Ok((what, fd))
            }
        }
    }

    fn remove_empty_at(&mut self, path: &CgroupPath) -> Result<Removal, Error> {
        let cg = self.run.cgroups.clone();
        let (mount, top) = self.cgroup_mount(&cg)?;
        let hierarchies = match cgroup_sys::hierarchies(top) {
            Ok(h) if !h.is_empty() => h,
            Ok(_) => {
                return Err(Error::Unavailable(format!(
                    "no cgroup file system is mounted at {mount}"
                )));
            }
            Err(e) => return Err(Error::Io(format!("{mount}: {}", describe_errno(e)))),
        };
        // Read every tree first: limits, links and mounts refuse before anything is removed.
        let mut found = Vec::new();
        let mut seen = 0usize;
        let top = path.to_string();
        let leaf = path.components().last().cloned().unwrap_or_default();
        for h in hierarchies {
            let Some((parent, dir)) =
                cgroup_sys::open_beneath(&h, path.components()).map_err(|e| walk_error(&h, e))?
            else {
                continue;
            };
            let limits = (cg.max_cgroups, cg.max_depth);
            let tree = cgroup_sys::walk(&h, &dir, &leaf, &top, 0, limits, &mut seen)
                .map_err(|e| walk_error(&h, e))?;
            found.push(Found {
                hierarchy: h,
                parent,
                tree,
            });
        }
        let retry_until = (Instant::now() + BUSY_RETRY).min(self.deadline);
        let mut tally = Tally::default();
        // Passes until nothing is busy or the retry time is over; the last pass's `kept` is
        // the answer (cgroups removed by an earlier pass are gone and counted).
        loop {
            tally.busy = false;
            tally.kept.clear();
            for f in &found {
                self.remove_tree(&f.hierarchy, &f.parent, &f.tree, &top, &mut tally)?;
            }
            if !tally.busy || Instant::now() >= retry_until {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        if tally.kept.len() > MAX_KEPT_LISTED {
            let more = tally.kept.len() - MAX_KEPT_LISTED;
            tally.kept.truncate(MAX_KEPT_LISTED);
            tally.kept.push(format!("… {more} more"));
        }
        Ok(Removal {
            removed: tally.removed,
            kept: tally.kept,
        })
    }
}

impl cgroups::Host for PhaseCtx {
    fn remove_empty(&mut self, path: String) -> Result<Removal, Error> {
        self.audited("cgroups.remove-empty", json!({ "path": path }), |ctx| {
            let p = CgroupPath::parse(&path)
                .map_err(|why| Error::InvalidArgument(format!("cgroup path {path:?}: {why}")))?;
            if !ctx.grants.cgroups.may_remove(&p) {
                return Err(denied(format!("remove cgroups at {p}"), "cgroups.remove"));
            }
            ctx.remove_empty_at(&p)
        })
    }
}
