//! The engine's durable writes: a named temp file renamed into place only once complete, and
//! the directory fsync that makes a rename durable.

use cap_std::fs::{Dir, File, OpenOptions, OpenOptionsExt};
use std::io;

/// A named temp file that is removed when dropped unless it was renamed into place.
///
/// A name (rather than an unnamed `O_TMPFILE`) is needed so the verified file can be hard
/// linked into the cache before it is renamed over its destination.
pub(super) struct TempFile<'d> {
    dir: &'d Dir,
    pub(super) name: String,
    pub(super) file: File,
    live: bool,
}

impl<'d> TempFile<'d> {
    /// Creates `<parent>/.<base>.nodeward-<random>` (mode 0600) in `dir`, where `parent` is a
    /// path relative to `dir` (empty for `dir` itself).
    pub(super) fn create(dir: &'d Dir, parent: &str, base: &str) -> io::Result<Self> {
        let mut last = io::Error::other("no temp name tried");
        for _ in 0..16 {
            let leaf = format!(".{base}.nodeward-{:016x}", fastrand::u64(..));
            let name = join(parent, &leaf);
            let mut opts = OpenOptions::new();
            opts.read(true).write(true).create_new(true).mode(0o600);
            match dir.open_with(&name, &opts) {
                Ok(file) => {
                    return Ok(TempFile {
                        dir,
                        name,
                        file,
                        live: true,
                    });
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = e,
                Err(e) => return Err(e),
            }
        }
        Err(last)
    }

    /// Sets the mode and makes the contents durable.
    pub(super) fn finish(&self, mode: u32) -> io::Result<()> {
        rustix::fs::fchmod(&self.file, rustix::fs::Mode::from_raw_mode(mode))?;
        self.file.sync_all()
    }

    /// Renames the temp file over `to` (relative to the same directory handle).
    pub(super) fn persist(mut self, to: &str) -> io::Result<()> {
        self.dir.rename(&self.name, self.dir, to)?;
        self.live = false;
        Ok(())
    }
}

impl Drop for TempFile<'_> {
    fn drop(&mut self) {
        if self.live {
            let _ = self.dir.remove_file(&self.name);
        }
    }
}

/// `parent/leaf`, or `leaf` when `parent` is empty.
pub(super) fn join(parent: &str, leaf: &str) -> String {
    if parent.is_empty() {
        leaf.to_string()
    } else {
        format!("{parent}/{leaf}")
    }
}

/// Makes a directory's entries durable (the handle may be `O_PATH`, so it is reopened).
pub(super) fn fsync_dir(dir: &Dir, path: &str) -> io::Result<()> {
    let path = if path.is_empty() { "." } else { path };
    dir.open_with(path, OpenOptions::new().read(true))?
        .sync_all()
}
