//! Descriptor-level helpers of the file layer: no-follow `chmod`, directory fsync, mount IDs
//! and the no-follow tree removal behind `fs.remove-all`.

use crate::caps::bindings::Error;
use cap_std::fs::Dir;
use std::io;

/// Sets the permission bits of `name` in `dir` without following a symlink: the object is
/// opened with `O_NOFOLLOW` (a symlink fails with `ELOOP`) and changed through its descriptor.
pub(super) fn chmod_nofollow(dir: &Dir, name: &str, mode: u32) -> io::Result<()> {
    use rustix::fs::{Mode, OFlags, fchmod, openat};
    let fd = openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK,
        Mode::empty(),
    )?;
    fchmod(&fd, Mode::from_raw_mode(mode))?;
    Ok(())
}

/// Makes a directory's entries durable. The root handle may be an `O_PATH` descriptor, which
/// cannot be fsynced, so the directory is opened again for reading.
pub(super) fn fsync_dir(dir: &Dir) -> io::Result<()> {
    dir.open_with(".", cap_std::fs::OpenOptions::new().read(true))?
        .sync_all()
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

/// Removes directory `name` in `parent` and everything beneath it. Each directory is opened
/// with `O_NOFOLLOW` relative to its parent's handle, so a symlink swapped in is never followed;
/// entries that are not directories (symlinks included) are unlinked. A directory on another
/// mount than its parent stops the walk. `at` is the directory's host path, for errors; names
/// are used as bytes, so a name that is not UTF-8 is removed like any other.
pub(super) fn remove_tree(
    parent: &Dir,
    name: &std::ffi::OsStr,
    parent_mount: u64,
    at: &str,
) -> Result<(), Error> {
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
    for (child, is_dir) in children {
        let child_at = format!("{at}/{}", child.to_string_lossy());
        if is_dir {
            remove_tree(&dir, &child, mount, &child_at)?;
        } else {
            dir.remove_file(&child)
                .map_err(|e| Error::Io(format!("{child_at}: {e}")))?;
        }
    }
    parent.remove_dir(name).map_err(fail)
}
