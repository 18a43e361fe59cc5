//! Descriptor-level helpers of the file layer: no-follow `chmod` of a directory, mount IDs and
//! the no-follow tree removal behind `fs.remove-all` (the directory fsync is
//! [`crate::durable::fsync_dir`]).

use crate::wit::Error;
use cap_std::fs::Dir;
use std::io;

/// Sets the permission bits of the directory `name` in `dir` without following a symlink:
/// it is opened with `O_DIRECTORY | O_NOFOLLOW` (a symlink or anything but a directory fails)
/// and changed through its descriptor. Directories only: a directory cannot be a hard link,
/// while a file swapped in under `name` could be one to a file anywhere (files are given a
/// new mode by replacing them, see `super::write`).
pub fn chmod_dir_nofollow(dir: &Dir, name: &str, mode: u32) -> io::Result<()> {
    use rustix::fs::{Mode, OFlags, fchmod, openat};
    let fd = openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    fchmod(&fd, Mode::from_raw_mode(mode))?;
    Ok(())
}

/// The mount a directory handle is on: `statx`'s mount ID (Linux 5.8+), else its device, which
/// still tells another filesystem apart (not a bind mount of the same one).
pub(super) fn mount_id(dir: &Dir) -> io::Result<u64> {
    use rustix::fs::{AtFlags, StatxFlags, statx};
    let st = statx(
        dir,
        "",
        AtFlags::EMPTY_PATH | AtFlags::SYMLINK_NOFOLLOW,
        StatxFlags::MNT_ID,
    )?;
    if st.stx_mask & StatxFlags::MNT_ID.bits() != 0 {
        Ok(st.stx_mnt_id)
    } else {
        Ok((u64::from(st.stx_dev_major) << 32) | u64::from(st.stx_dev_minor))
    }
}

/// How deep `fs.remove-all` walks (documented in `wit/fs.wit`): the walk holds one open
/// directory per level, so this also bounds its descriptors (below the usual 1024 soft limit).
pub const MAX_REMOVE_DEPTH: usize = 512;

/// One open directory of [`remove_tree`]'s walk and what is left to remove in it.
struct Frame {
    dir: Dir,
    name: std::ffi::OsString,
    at: String,
    mount: u64,
    children: Vec<(std::ffi::OsString, bool)>,
}

/// Opens directory `name` in `parent` with `O_NOFOLLOW`, refuses it when it is on another
/// mount than `parent_mount`, and lists it.
fn open_frame(
    parent: &Dir,
    name: &std::ffi::OsStr,
    parent_mount: u64,
    at: String,
) -> Result<Frame, Error> {
    use rustix::fs::{Mode, OFlags, openat};
    let fail = |e: io::Error| {
        if e.kind() == io::ErrorKind::NotFound {
            Error::NotFound(format!("{at}: vanished while it was removed"))
        } else {
            Error::Io(format!("{at}: {e}"))
        }
    };
    let fd = openat(
        parent,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| fail(e.into()))?;
    let dir = Dir::from_std_file(std::fs::File::from(fd));
    let mount = mount_id(&dir).map_err(fail)?;
    if mount != parent_mount {
        return Err(Error::Io(format!(
            "{at}: is a mount point; unmount it before removing it"
        )));
    }
    let mut children = Vec::new();
    for entry in dir.entries().map_err(fail)? {
        let entry = entry.map_err(fail)?;
        let is_dir = entry.file_type().map_err(fail)?.is_dir();
        children.push((entry.file_name(), is_dir));
    }
    Ok(Frame {
        dir,
        name: name.to_os_string(),
        at,
        mount,
        children,
    })
}

/// Removes directory `name` in `parent` and everything beneath it, depth first with an explicit
/// stack (a planted tree of any depth cannot exhaust the agent's stack). Each directory is
/// opened with `O_NOFOLLOW` relative to its parent's handle, so a symlink swapped in is never
/// followed; entries that are not directories (symlinks included) are unlinked. A directory on
/// another mount than its parent stops the walk, as do a tree deeper than
/// [`MAX_REMOVE_DEPTH`] (`io`) and the phase deadline (`timeout`); what was removed before
/// stays removed. `at` is the directory's host path, for errors; names are used as bytes, so a
/// name that is not UTF-8 is removed like any other.
pub(super) fn remove_tree(
    parent: &Dir,
    name: &std::ffi::OsStr,
    parent_mount: u64,
    at: &str,
    deadline: std::time::Instant,
) -> Result<(), Error> {
    let mut stack = vec![open_frame(parent, name, parent_mount, at.to_string())?];
    while let Some(top) = stack.len().checked_sub(1) {
        if std::time::Instant::now() >= deadline {
            return Err(Error::Timeout(format!(
                "{at}: removing it reached the phase deadline at {}",
                stack[top].at
            )));
        }
        match stack[top].children.pop() {
            Some((child, true)) => {
                let child_at = format!("{}/{}", stack[top].at, child.to_string_lossy());
                if stack.len() >= MAX_REMOVE_DEPTH {
                    return Err(Error::Io(format!(
                        "{child_at}: the tree is deeper than {MAX_REMOVE_DEPTH} levels"
                    )));
                }
                let frame = open_frame(&stack[top].dir, &child, stack[top].mount, child_at)?;
                stack.push(frame);
            }
            Some((child, false)) => {
                stack[top].dir.remove_file(&child).map_err(|e| {
                    Error::Io(format!(
                        "{}/{}: {e}",
                        stack[top].at,
                        child.to_string_lossy()
                    ))
                })?;
            }
            None => {
                let done = stack
                    .pop()
                    .ok_or_else(|| Error::Io(format!("{at}: walk")))?;
                let holder = stack.last().map_or(parent, |f| &f.dir);
                holder
                    .remove_dir(&done.name)
                    .map_err(|e| Error::Io(format!("{}: {e}", done.at)))?;
            }
        }
    }
    Ok(())
}
