//! [`sweep`]: removing the temp entries a killed run left, and never a live writer's.
//!
//! # Liveness
//! A [`super::TempFile`] holds an exclusive `flock` on itself from the moment it exists until
//! it is closed, and the kernel drops that lock with the last descriptor, so with the process
//! that was killed. The sweep removes a scheme-named regular file only while it holds that
//! lock itself ([`held_by_a_writer`] tells): a live writer's temp file is never removed, under
//! any lock or none. That makes the directories whose writers share no lock with the sweeper
//! safe to sweep ([`sweep_state_dir`]): the daemon's records beside a `reset`, the audit heads
//! of two trails, the compiled components of a `plan` beside an `apply`.
//!
//! Links (made by [`super::place`]) and the bundle store's staging directories hold no lock:
//! those are swept only under the lock of the directory's writers (see the module doc of
//! [`super`]), or where no writer makes them.

use super::{fsync_dir, is_temp_name, open_dir};
use cap_std::fs::Dir;
use rustix::fs::{FlockOperation, Mode, OFlags, flock, openat};
use rustix::io::Errno;
use std::io;
use std::os::fd::OwnedFd;
use std::path::Path;

/// What the sweep does with a directory whose name is of the temp scheme.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TempDirs {
    /// Leave it. For directories a phase can write (beneath the host root): the agent makes
    /// no temp directories there, and removing a tree a phase built would be a walk as deep
    /// as the phase chose.
    Leave,
    /// Remove it with everything beneath it, without following links. For the agent's own
    /// directories (the bundle store stages bundles in temp directories).
    Remove,
}

/// Removes every entry of the temp-name scheme directly in `dir` that no live writer holds,
/// and returns their names: a regular file only while the sweep holds its `flock` (see the
/// module doc), a link or another non-directory as it is (never followed); a directory is left
/// or removed with everything beneath it, as `dirs` says. Nothing else in `dir` and nothing in
/// its subdirectories is touched. The directory is fsynced when something was removed.
///
/// Call it under the lock that guards `dir`'s writers when they make links or scheme-named
/// directories (see the module doc): those hold no lock of their own.
pub fn sweep(dir: &Dir, dirs: TempDirs) -> io::Result<Vec<String>> {
    let mut removed = Vec::new();
    for entry in dir.entries()? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(name) = name.to_str().filter(|n| is_temp_name(n)) else {
            continue;
        };
        // The entry's own type (`d_type`, else `lstat`): a symlink is a symlink here.
        let kind = entry.file_type()?;
        let result = if kind.is_dir() {
            if dirs == TempDirs::Leave {
                continue;
            }
            dir.remove_dir_all(name)
        } else if kind.is_file() {
            match unheld(dir, name)? {
                // Removed while the sweep holds its lock; the descriptor is closed after.
                Some(_lock) => dir.remove_file(name),
                None => continue,
            }
        } else {
            dir.remove_file(name)
        };
        match result {
            Ok(()) => removed.push(name.to_string()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    if !removed.is_empty() {
        fsync_dir(dir)?;
    }
    removed.sort();
    Ok(removed)
}

/// Whether a live writer holds the regular file `name` in `dir` (its `flock`: see the module
/// doc). A file that is gone is held by nobody.
pub fn held_by_a_writer(dir: &Dir, name: &str) -> io::Result<bool> {
    Ok(unheld(dir, name)?.is_none())
}

/// The file `name` in `dir` opened without following a link or waiting, with its `flock`
/// taken: `None` when a writer holds it. A name that is gone (a writer renamed it meanwhile)
/// is held: there is nothing to remove.
fn unheld(dir: &Dir, name: &str) -> io::Result<Option<OwnedFd>> {
    let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
    let fd = match openat(dir, name, flags | OFlags::NOCTTY, Mode::empty()) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    match flock(&fd, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(Some(fd)),
        Err(Errno::WOULDBLOCK) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// [`sweep`] of the directory at `path` (one of the agent's own directories, see
/// [`super::open_dir`]); nothing when it does not exist.
pub fn sweep_path(path: &Path, dirs: TempDirs) -> io::Result<Vec<String>> {
    match open_dir(path) {
        Ok(dir) => sweep(&dir, dirs),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

/// The directories of the agent state directory whose writers write only files, each through
/// a [`super::TempFile`], and share no lock with every sweeper: the directory itself (the
/// daemon's ledger, roll-out record and repave config), the audit heads (one per trail), the
/// compiled components (a `plan` writes them without a lock) and the bundle downloads.
pub const STATE_DIRS_OF_FILES: &[&str] = &["", "audit-heads", "compiled", "downloads"];

/// Sweeps [`STATE_DIRS_OF_FILES`] of the agent state directory `state_dir`, without any lock
/// (a live writer's temp file is recognised by its own: see the module doc); returns what it
/// removed, each as a path. A directory that does not exist is passed over; a link where one
/// belongs is not followed.
pub fn sweep_state_dir(state_dir: &Path) -> io::Result<Vec<String>> {
    let mut removed = Vec::new();
    for sub in STATE_DIRS_OF_FILES {
        let path = state_dir.join(sub);
        let at = |e: io::Error| io::Error::new(e.kind(), format!("{}: {e}", path.display()));
        let dir = match open_nofollow(&path) {
            Ok(d) => d,
            Err(e) if passed_over(&e) => continue,
            Err(e) => return Err(at(e)),
        };
        for name in sweep(&dir, TempDirs::Leave).map_err(at)? {
            removed.push(path.join(name).display().to_string());
        }
    }
    Ok(removed)
}

/// A directory the state sweep passes over: missing, a link, or not a directory.
fn passed_over(e: &io::Error) -> bool {
    [Errno::NOENT, Errno::LOOP, Errno::NOTDIR]
        .iter()
        .any(|n| e.raw_os_error() == Some(n.raw_os_error()))
}

/// The directory at `path`, its last component not followed when it is a link (`ELOOP`).
fn open_nofollow(path: &Path) -> io::Result<Dir> {
    let fd = rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    Ok(Dir::from_std_file(std::fs::File::from(fd)))
}
