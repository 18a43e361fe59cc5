//! The mount(2) layer under `mounts`: every syscall acts on directories the caller already
//! opened beneath the host root, never on a path string built from guest input.
//!
//! # Background
//! A mount call names its target by path, and the kernel resolves that path again when it
//! mounts. Checking a path and then mounting by the same path leaves a window in which a
//! symlink swapped into it redirects the mount anywhere on the machine. So `mounts` opens each
//! directory beneath the root through cap-std (which refuses symlinks leaving the root), and
//! this module names the opened directory to the kernel as `/proc/self/fd/<fd>`: that magic
//! link resolves to exactly the directory behind the descriptor, whatever happens to the path
//! meanwhile. Mount sources (bind source, overlay lower, upper and work directories) are passed
//! the same way.
//!
//! # Guarantees
//! - bind is `open_tree(OPEN_TREE_CLONE)` of the source plus `move_mount` onto the target, both
//!   on descriptors. Read-only is a second `MS_BIND | MS_REMOUNT | MS_RDONLY` remount of the new
//!   mount, named by the descriptor `open_tree` returned (the kernel only remounts a mount's
//!   root, and the target's own descriptor still names the directory underneath); the source
//!   mount's nosuid/nodev/noexec flags are kept. If the remount fails the fresh mount is
//!   detached again, so a bind meant to be read-only is never left writable.
//! - tmpfs and overlay are `mount(2)` onto `/proc/self/fd/<target>`; overlay's directories are
//!   `/proc/self/fd/<fd>` paths in its options, so no guest text reaches the option string.
//! - unmount goes through the parent's descriptor plus the last component with
//!   `UMOUNT_NOFOLLOW`, after checking that this component still is the directory the caller
//!   resolved (device and inode): a descriptor open on the mount itself would keep it busy.
//!
//! # Caveats
//! - Needs `/proc` mounted in the agent's mount namespace, and Linux ≥ 5.2 for
//!   `open_tree`/`move_mount`.
//! - Between `move_mount` and the read-only remount a bind is briefly writable.
//! - Overlay's options in `/proc/self/mountinfo` show the `/proc/self/fd/<n>` paths it was
//!   given, not the directories' names.

use rustix::fd::{AsFd, AsRawFd, BorrowedFd};
use rustix::fs::{AtFlags, StatVfsMountFlags, StatxAttributes, StatxFlags};
use rustix::io::Errno;
use rustix::mount::{MountFlags, MoveMountFlags, OpenTreeFlags, UnmountFlags};
use std::path::{Path, PathBuf};

/// `/proc/self/fd/<fd>`: names exactly the file behind `fd`.
fn fd_path(fd: BorrowedFd<'_>) -> String {
    format!("/proc/self/fd/{}", fd.as_raw_fd())
}

/// Where the directory behind `fd` is, as an absolute path in this mount namespace.
pub fn fd_location(fd: impl AsFd) -> std::io::Result<PathBuf> {
    std::fs::read_link(fd_path(fd.as_fd()))
}

/// `(device, inode)` of the file behind `fd`: identifies a directory across two lookups.
pub fn identity(fd: impl AsFd) -> Result<(u64, u64), Errno> {
    let st = rustix::fs::fstat(fd)?;
    Ok((st.st_dev, st.st_ino))
}

/// Whether the directory behind `fd` is the root of a mount (something is mounted on it).
/// Asks statx for `STATX_ATTR_MOUNT_ROOT`; on kernels before 5.8, which do not report it,
/// looks the directory's location up in `/proc/self/mountinfo`.
pub fn is_mount_root(fd: impl AsFd) -> std::io::Result<bool> {
    let fd = fd.as_fd();
    match rustix::fs::statx(fd, "", AtFlags::EMPTY_PATH, StatxFlags::empty()) {
        Ok(st) if st.stx_attributes_mask.contains(StatxAttributes::MOUNT_ROOT) => {
            return Ok(st.stx_attributes.contains(StatxAttributes::MOUNT_ROOT));
        }
        Ok(_) | Err(Errno::NOSYS) => {}
        Err(e) => return Err(e.into()),
    }
    let location = fd_location(fd)?;
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")?;
    Ok(mountinfo_has(&mountinfo, &location))
}

/// Whether `mountinfo` (the text of `/proc/<pid>/mountinfo`) lists a mount on `location`.
pub fn mountinfo_has(mountinfo: &str, location: &Path) -> bool {
    mountinfo
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .any(|mount_point| Path::new(&unescape_mountinfo(mount_point)) == location)
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
pub fn unescape_mountinfo(s: &str) -> String {
    s.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

/// Bind-mounts the directory behind `source` on the directory behind `target`, then makes it
/// read-only when asked (see the module docs).
pub fn bind(source: impl AsFd, target: impl AsFd, read_only: bool) -> Result<(), Errno> {
    let tree = rustix::mount::open_tree(
        source,
        "",
        OpenTreeFlags::OPEN_TREE_CLONE
            | OpenTreeFlags::OPEN_TREE_CLOEXEC
            | OpenTreeFlags::AT_EMPTY_PATH,
    )?;
    rustix::mount::move_mount(
        &tree,
        "",
        target,
        "",
        MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH | MoveMountFlags::MOVE_MOUNT_T_EMPTY_PATH,
    )?;
    if !read_only {
        return Ok(());
    }
    let remount = || -> Result<(), Errno> {
        // A bind remount sets the per-mount flags to exactly those given: carry over the ones
        // the source had so read-only does not quietly drop nosuid, nodev or noexec.
        let current = rustix::fs::fstatvfs(&tree)?.f_flag;
        let mut flags = MountFlags::BIND | MountFlags::RDONLY;
        for (st, ms) in [
            (StatVfsMountFlags::NOSUID, MountFlags::NOSUID),
            (StatVfsMountFlags::NODEV, MountFlags::NODEV),
            (StatVfsMountFlags::NOEXEC, MountFlags::NOEXEC),
        ] {
            if current.contains(st) {
                flags |= ms;
            }
        }
        rustix::mount::mount_remount(fd_path(tree.as_fd()), flags, "")
    };
    remount().inspect_err(|_| {
        // Never leave a bind that was meant to be read-only writable. `tree` still holds the
        // mount open, so only a lazy detach can take it away.
        let _ = rustix::mount::unmount(fd_path(tree.as_fd()), UnmountFlags::DETACH);
    })
}

/// Mounts a tmpfs of at most `size_bytes` bytes, mode 0755, nosuid and nodev, on the directory
/// behind `target`.
pub fn tmpfs(target: impl AsFd, size_bytes: u64) -> Result<(), Errno> {
    let data =
        std::ffi::CString::new(format!("size={size_bytes},mode=0755")).map_err(|_| Errno::INVAL)?;
    rustix::mount::mount(
        "tmpfs",
        fd_path(target.as_fd()),
        "tmpfs",
        MountFlags::NOSUID | MountFlags::NODEV,
        data.as_c_str(),
    )
}

/// Mounts an overlay of `lower` (topmost first) with `upper` and `work` on the directory
/// behind `target`.
pub fn overlay(
    lower: &[impl AsFd],
    upper: impl AsFd,
    work: impl AsFd,
    target: impl AsFd,
) -> Result<(), Errno> {
    let lowerdir = lower
        .iter()
        .map(|l| fd_path(l.as_fd()))
        .collect::<Vec<_>>()
        .join(":");
    let data = std::ffi::CString::new(format!(
        "lowerdir={lowerdir},upperdir={},workdir={}",
        fd_path(upper.as_fd()),
        fd_path(work.as_fd())
    ))
    .map_err(|_| Errno::INVAL)?;
    rustix::mount::mount(
        "overlay",
        fd_path(target.as_fd()),
        "overlay",
        MountFlags::empty(),
        data.as_c_str(),
    )
}

/// Unmounts the mount on `name` inside the directory behind `parent`, provided `name` still is
/// the directory with identity `expected` (see [`identity`]); `lazy` detaches it (MNT_DETACH).
/// `name` is a single path component.
pub fn unmount(
    parent: impl AsFd,
    name: &str,
    expected: (u64, u64),
    lazy: bool,
) -> Result<(), Errno> {
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        return Err(Errno::INVAL);
    }
    let parent = parent.as_fd();
    let st = rustix::fs::statat(parent, name, AtFlags::SYMLINK_NOFOLLOW)?;
    if (st.st_dev, st.st_ino) != expected {
        // Renamed or replaced since it was resolved.
        return Err(Errno::STALE);
    }
    let mut flags = UnmountFlags::NOFOLLOW;
    if lazy {
        flags |= UnmountFlags::DETACH;
    }
    rustix::mount::unmount(format!("{}/{name}", fd_path(parent)), flags)
}

#[cfg(test)]
mod tests {
    #[test]
    fn unescapes_mountinfo_paths() {
        assert_eq!(super::unescape_mountinfo("/a\\040b\\134c"), "/a b\\c");
        assert_eq!(super::unescape_mountinfo("/plain"), "/plain");
    }

    #[test]
    fn finds_mount_points_in_mountinfo() {
        let info = "36 35 98:0 / /mnt/a\\040b rw - tmpfs tmpfs rw\n";
        assert!(super::mountinfo_has(info, std::path::Path::new("/mnt/a b")));
        assert!(!super::mountinfo_has(info, std::path::Path::new("/mnt/a")));
    }
}
