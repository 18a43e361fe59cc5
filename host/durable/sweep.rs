//! [`sweep`]: removing the temp entries a killed run left.

use super::{fsync_dir, is_temp_name, open_dir};
use cap_std::fs::Dir;
use std::io;
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

/// Removes every entry of the temp-name scheme directly in `dir` and returns their names:
/// files and symlinks are unlinked (a link is never followed); a directory is left or removed
/// with everything beneath it, as `dirs` says. Nothing else in `dir` and nothing in its
/// subdirectories is touched. The directory is fsynced when something was removed.
///
/// Call it only under the lock that guards `dir`'s writers (see the module doc): a writer
/// running at the same time would lose its temp file.
pub fn sweep(dir: &Dir, dirs: TempDirs) -> io::Result<Vec<String>> {
    let mut removed = Vec::new();
    for entry in dir.entries()? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(name) = name.to_str().filter(|n| is_temp_name(n)) else {
            continue;
        };
        // The entry's own type (`d_type`, else `lstat`): a symlink is a symlink here.
        let result = if entry.file_type()?.is_dir() {
            if dirs == TempDirs::Leave {
                continue;
            }
            dir.remove_dir_all(name)
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

/// [`sweep`] of the directory at `path` (one of the agent's own directories, see
/// [`super::open_dir`]); nothing when it does not exist.
pub fn sweep_path(path: &Path, dirs: TempDirs) -> io::Result<Vec<String>> {
    match open_dir(path) {
        Ok(dir) => sweep(&dir, dirs),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}
