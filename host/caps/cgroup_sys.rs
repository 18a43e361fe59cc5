//! The file-system layer under `cgroups`: finds the mounted hierarchies, walks a cgroup tree
//! and removes cgroups, always through directory descriptors and never following a link.
//!
//! # Background
//! A cgroup is a directory on a cgroup (v1) or cgroup2 file system; removing an empty one is
//! `rmdir`. The path a phase names is relative to each hierarchy, so each component is opened
//! with `O_NOFOLLOW | O_DIRECTORY` relative to its parent's descriptor, and every directory
//! must be on its hierarchy's own mount (same device, not a mount root): a symlink or a mount
//! placed inside the tree (by anyone, a bind of another cgroup of the same hierarchy
//! included) is refused, never followed. Removal is `unlinkat(parent, name, AT_REMOVEDIR)` on the
//! parent's descriptor, so what is removed is the entry the walk saw in that directory.
//!
//! # Guarantees
//! - Hierarchies are the cgroup and cgroup2 mounts at the cgroup mount point itself (a pure v2
//!   host) or in the directories directly beneath it (v1 and hybrid); symlinks there
//!   (`cpu -> cpu,cpuacct`) are skipped.
//! - [`walk`] reads at most `max_nodes` cgroups and `max_depth` levels (an error past either,
//!   before anything is removed) and holds at most one descriptor per level.
//! - Errnos keep their names ([`super::netlink::describe_errno`]).

use rustix::fd::{AsFd, OwnedFd};
use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

/// `CGROUP_SUPER_MAGIC` (v1).
const CGROUP_SUPER_MAGIC: u64 = 0x0027_e0eb;
/// `CGROUP2_SUPER_MAGIC`.
const CGROUP2_SUPER_MAGIC: u64 = 0x6367_7270;

/// One mounted hierarchy.
pub struct Hierarchy {
    /// Its directory's name beneath the mount point; empty for a cgroup2 file system mounted
    /// on the mount point itself.
    pub name: String,
    /// Its root directory.
    pub fd: OwnedFd,
    /// Its device: every cgroup of it is on this one.
    pub dev: u64,
}

fn is_cgroup_fs(fd: impl AsFd) -> Result<bool, Errno> {
    let st = rustix::fs::fstatfs(fd)?;
    Ok(matches!(
        st.f_type as u64,
        CGROUP_SUPER_MAGIC | CGROUP2_SUPER_MAGIC
    ))
}

fn open_dir_nofollow(parent: impl AsFd, name: &str) -> Result<OwnedFd, Errno> {
    rustix::fs::openat(
        parent,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
}

/// The hierarchies mounted at the directory behind `top` (`/sys/fs/cgroup`): `Ok(empty)`
/// when there are none.
pub fn hierarchies(top: OwnedFd) -> Result<Vec<Hierarchy>, Errno> {
    let dev_of = |fd: &OwnedFd| rustix::fs::fstat(fd).map(|st| st.st_dev);
    if is_cgroup_fs(&top)? {
        let dev = dev_of(&top)?;
        return Ok(vec![Hierarchy {
            name: String::new(),
            fd: top,
            dev,
        }]);
    }
    let mut out = Vec::new();
    let mut names = Vec::new();
    for entry in rustix::fs::Dir::read_from(&top)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name != "." && name != ".." && entry.file_type() != FileType::Symlink {
            names.push(name);
        }
    }
    names.sort();
    for name in names {
        let fd = match open_dir_nofollow(&top, &name) {
            Ok(fd) => fd,
            // A symlink (ELOOP) or a file (ENOTDIR): not a hierarchy.
            Err(Errno::LOOP | Errno::NOTDIR | Errno::NOENT) => continue,
            Err(e) => return Err(e),
        };
        if is_cgroup_fs(&fd)? {
            let dev = dev_of(&fd)?;
            out.push(Hierarchy { name, fd, dev });
        }
    }
    Ok(out)
}

/// Why a directory of the tree is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WalkError {
    /// A syscall failed at `at` (a path relative to the hierarchy).
    Sys {
        /// Where.
        at: String,
        /// The errno.
        errno: Errno,
    },
    /// `at` is a symlink.
    Link(String),
    /// `at` is on another file system than its hierarchy (a mount).
    Mount(String),
    /// More than the limit of cgroups or levels.
    Limit(String),
}

/// Whether the directory behind `fd` may be walked as a cgroup of `h`: on its device and not
/// the root of a mount (a bind of another cgroup of the same hierarchy has the same device).
fn same_mount(h: &Hierarchy, fd: &OwnedFd) -> Result<bool, Errno> {
    if rustix::fs::fstat(fd)?.st_dev != h.dev {
        return Ok(false);
    }
    super::mount_sys::is_mount_root(fd)
        .map(|root| !root)
        .map_err(|e| Errno::from_io_error(&e).unwrap_or(Errno::IO))
}

/// Opens `components` beneath the hierarchy, one by one without following links and staying
/// on its mount: `(parent, cgroup)`, or `None` when the cgroup does not exist.
pub fn open_beneath(
    h: &Hierarchy,
    components: &[String],
) -> Result<Option<(OwnedFd, OwnedFd)>, WalkError> {
    let mut parent = rustix::io::dup(&h.fd).map_err(|errno| WalkError::Sys {
        at: String::new(),
        errno,
    })?;
    let mut at = String::new();
    for (i, c) in components.iter().enumerate() {
        if !at.is_empty() {
            at.push('/');
        }
        at.push_str(c);
        let fd = match open_dir_nofollow(&parent, c) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => return Ok(None),
            Err(Errno::LOOP) => return Err(WalkError::Link(at)),
            Err(Errno::NOTDIR) => return Ok(None),
            Err(errno) => return Err(WalkError::Sys { at, errno }),
        };
        let same = same_mount(h, &fd).map_err(|errno| WalkError::Sys {
            at: at.clone(),
            errno,
        })?;
        if !same {
            return Err(WalkError::Mount(at));
        }
        if i + 1 == components.len() {
            return Ok(Some((parent, fd)));
        }
        parent = fd;
    }
    Ok(None)
}

/// A cgroup and the cgroups beneath it, as the walk found them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// Its directory's name.
    pub name: String,
    /// Whether its `cgroup.procs` listed a process.
    pub has_procs: bool,
    /// The cgroups beneath it.
    pub children: Vec<Node>,
}

impl Node {
    /// How many cgroups this tree holds.
    pub fn count(&self) -> usize {
        1 + self.children.iter().map(Node::count).sum::<usize>()
    }
}

/// Whether the cgroup behind `dir` has a process (its `cgroup.procs` is not empty).
pub fn has_procs(dir: impl AsFd) -> Result<bool, Errno> {
    let f = match rustix::fs::openat(
        dir,
        "cgroup.procs",
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(f) => f,
        // A cgroup without the file (a v1 hierarchy's named root): count it as in use.
        Err(Errno::NOENT) => return Ok(true),
        Err(e) => return Err(e),
    };
    let mut buf = [0u8; 64];
    let n = rustix::io::read(&f, &mut buf)?;
    Ok(buf[..n].iter().any(|b| b.is_ascii_digit()))
}

/// Reads the tree beneath `dir` (the cgroup at `at`), `depth` levels below the granted path;
/// `seen` counts cgroups across the whole call.
pub fn walk(
    h: &Hierarchy,
    dir: &OwnedFd,
    name: &str,
    at: &str,
    depth: usize,
    limits: (usize, usize),
    seen: &mut usize,
) -> Result<Node, WalkError> {
    let (max_nodes, max_depth) = limits;
    *seen += 1;
    if *seen > max_nodes {
        return Err(WalkError::Limit(format!(
            "more than {max_nodes} cgroups (at {at})"
        )));
    }
    if depth > max_depth {
        return Err(WalkError::Limit(format!(
            "more than {max_depth} levels (at {at})"
        )));
    }
    let sys = |errno| WalkError::Sys {
        at: at.to_string(),
        errno,
    };
    let procs = has_procs(dir).map_err(sys)?;
    let mut names = Vec::new();
    for entry in rustix::fs::Dir::read_from(dir).map_err(sys)? {
        let entry = entry.map_err(sys)?;
        let n = entry.file_name().to_string_lossy().into_owned();
        if n == "." || n == ".." {
            continue;
        }
        match entry.file_type() {
            FileType::Directory => names.push(n),
            FileType::Symlink => return Err(WalkError::Link(format!("{at}/{n}"))),
            FileType::Unknown => {
                let st =
                    rustix::fs::statat(dir, n.as_str(), AtFlags::SYMLINK_NOFOLLOW).map_err(sys)?;
                match FileType::from_raw_mode(st.st_mode) {
                    FileType::Directory => names.push(n),
                    FileType::Symlink => return Err(WalkError::Link(format!("{at}/{n}"))),
                    _ => {}
                }
            }
            _ => {}
        }
    }
    names.sort();
    let mut children = Vec::new();
    for n in names {
        let child_at = format!("{at}/{n}");
        let fd = match open_dir_nofollow(dir, &n) {
            Ok(fd) => fd,
            // Removed since it was listed.
            Err(Errno::NOENT) => continue,
            Err(Errno::LOOP) => return Err(WalkError::Link(child_at)),
            Err(errno) => {
                return Err(WalkError::Sys {
                    at: child_at,
                    errno,
                });
            }
        };
        let same = same_mount(h, &fd).map_err(|errno| WalkError::Sys {
            at: child_at.clone(),
            errno,
        })?;
        if !same {
            return Err(WalkError::Mount(child_at));
        }
        children.push(walk(h, &fd, &n, &child_at, depth + 1, limits, seen)?);
    }
    Ok(Node {
        name: name.to_string(),
        has_procs: procs,
        children,
    })
}

/// Removes the empty cgroup `name` in the directory behind `parent`.
pub fn remove(parent: impl AsFd, name: &str) -> Result<(), Errno> {
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        return Err(Errno::INVAL);
    }
    rustix::fs::unlinkat(parent, name, AtFlags::REMOVEDIR)
}

/// Opens the cgroup `name` in `parent` again for removal: without following a link, on the
/// hierarchy's device; `None` when it is gone.
pub fn reopen(h: &Hierarchy, parent: impl AsFd, name: &str) -> Result<Option<OwnedFd>, Errno> {
    let fd = match open_dir_nofollow(parent, name) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return Ok(None),
        Err(e) => return Err(e),
    };
    if !same_mount(h, &fd)? {
        return Err(Errno::XDEV);
    }
    Ok(Some(fd))
}
