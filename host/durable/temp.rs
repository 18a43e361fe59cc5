//! [`TempFile`]: the one temp-file type of the agent's writers, whole writes and streaming ones
//! (a download hashed while it arrives) alike.

use super::{abort_point, create_named, fsync_dir, place};
use cap_std::fs::{Dir, File, OpenOptions, OpenOptionsExt};
use std::io;

/// A file being written in the directory of the file it will replace, removed when dropped
/// unless it was renamed into place.
///
/// It is anonymous (`O_TMPFILE`) while it is written where the filesystem supports that, so a
/// process killed mid-write leaves nothing; otherwise, and from the moment it is complete and
/// about to be renamed, it has a temp name of the module's scheme (`.nodeward-tmp.<purpose>.…`),
/// which the sweep recognises. Created `0600`: contents nobody else should read until the
/// file has its final mode.
///
/// It holds an exclusive `flock` on itself from the moment it exists (an anonymous one before
/// it has any name) until it is closed: that is how a sweep tells a live writer's temp file
/// from a dead one's ([`super::sweep`]).
pub struct TempFile<'d> {
    dir: &'d Dir,
    purpose: &'static str,
    /// The open file: write (or stream) the contents through it. A public field so streaming
    /// writers can lend it out as `&mut File`; it must stay this file (the temp name, once
    /// given, is a link to it).
    pub file: File,
    /// Its name in `dir`: from the start when it is not anonymous, from [`TempFile::rename`]'s
    /// naming step on when it is; `None` while anonymous and once renamed into place.
    name: Option<String>,
}

impl<'d> TempFile<'d> {
    /// A new empty temp file in `dir`, for the writer named `purpose` (see the module doc).
    pub fn new(dir: &'d Dir, purpose: &'static str) -> io::Result<Self> {
        match anonymous(dir)? {
            Some(file) => {
                hold(&file)?;
                Ok(TempFile {
                    dir,
                    purpose,
                    file,
                    name: None,
                })
            }
            None => Self::new_named(dir, purpose),
        }
    }

    /// A temp file that has its scheme name from the start: what [`TempFile::new`] makes where
    /// `O_TMPFILE` is not supported.
    pub(crate) fn new_named(dir: &'d Dir, purpose: &'static str) -> io::Result<Self> {
        let mut opts = OpenOptions::new();
        // `create_new` is `O_EXCL`: a name that exists, symlink included, is never opened.
        opts.read(true).write(true).create_new(true).mode(0o600);
        let (file, name) = create_named(purpose, |n| dir.open_with(n, &opts))?;
        // Dropped on an error: the name is removed.
        let tmp = TempFile {
            dir,
            purpose,
            file,
            name: Some(name),
        };
        // Between the create and the lock, a sweep that does not share the directory's lock
        // could take the file for a dead writer's: see the caveat in the module doc.
        hold(&tmp.file)?;
        Ok(tmp)
    }

    /// Sets the file's permission bits and makes its contents durable; call it once the
    /// contents are complete, before [`TempFile::persist`].
    pub fn finish(&self, mode: u32) -> io::Result<()> {
        rustix::fs::fchmod(&self.file, rustix::fs::Mode::from_raw_mode(mode))?;
        self.file.sync_all()
    }

    /// Gives the file a second name, `name` in `dir` (on the same filesystem; `EXDEV`
    /// otherwise), replacing whatever non-directory is there atomically ([`super::place`]).
    /// The artifact cache keeps a verified download this way without a second copy. Does not
    /// fsync `dir`.
    pub fn link_into(&self, dir: &Dir, name: &str, purpose: &'static str) -> io::Result<()> {
        place(dir, name, purpose, |tmp| match &self.name {
            Some(own) => self.dir.hard_link(own, dir, tmp),
            None => link_fd(&self.file, dir, tmp),
        })
    }

    /// Renames the file over `to` in its directory, without fsyncing the directory: for
    /// writers that place many files and fsync each directory once. An anonymous file first
    /// gets its temp name (a hard link), since only a name can be renamed.
    pub fn rename(mut self, to: &str) -> io::Result<()> {
        let name = match &self.name {
            Some(n) => n.clone(),
            None => {
                let ((), n) = create_named(self.purpose, |n| link_fd(&self.file, self.dir, n))?;
                self.name = Some(n.clone());
                n
            }
        };
        abort_point(self.purpose);
        // On an error the name stays set, so dropping `self` removes the temp file.
        self.dir.rename(&name, self.dir, to)?;
        self.name = None;
        Ok(())
    }

    /// Renames the file over `to` ([`TempFile::rename`]) and fsyncs the directory, so the
    /// replacement survives a power cut.
    pub fn persist(self, to: &str) -> io::Result<()> {
        let dir = self.dir;
        self.rename(to)?;
        fsync_dir(dir)
    }
}

impl Drop for TempFile<'_> {
    fn drop(&mut self) {
        if let Some(name) = self.name.take() {
            let _ = self.dir.remove_file(name);
        }
    }
}

/// Takes an exclusive `flock` on the new `file`, held while it is open: the mark of a live
/// writer that every sweep respects (`super::sweep`). The file is new, so no one else holds it.
fn hold(file: &File) -> io::Result<()> {
    rustix::fs::flock(file, rustix::fs::FlockOperation::NonBlockingLockExclusive)?;
    Ok(())
}

/// An unnamed `0600` file in `dir` (`O_TMPFILE`), or `None` where the filesystem (or kernel)
/// does not support one, as `cap-tempfile` decides it.
pub(super) fn anonymous(dir: &Dir) -> io::Result<Option<File>> {
    use rustix::fs::{Mode, OFlags, openat};
    use rustix::io::Errno;
    match openat(
        dir,
        ".",
        OFlags::TMPFILE | OFlags::RDWR | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    ) {
        Ok(fd) => Ok(Some(File::from_std(std::fs::File::from(fd)))),
        Err(Errno::OPNOTSUPP | Errno::ISDIR | Errno::NOENT) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Links the open `file` as `name` in `dir`: through `/proc/self/fd` (any user), else with
/// `AT_EMPTY_PATH` (needs `CAP_DAC_READ_SEARCH`, which the agent as root has). A taken name
/// is `AlreadyExists`, so the caller tries another.
fn link_fd(file: &File, dir: &Dir, name: &str) -> io::Result<()> {
    use rustix::fs::{AtFlags, CWD, linkat};
    use rustix::io::Errno;
    use std::os::fd::AsRawFd;
    let proc_fd = format!("/proc/self/fd/{}", file.as_raw_fd());
    match linkat(CWD, proc_fd.as_str(), dir, name, AtFlags::SYMLINK_FOLLOW) {
        Ok(()) => Ok(()),
        Err(e @ (Errno::EXIST | Errno::XDEV)) => Err(e.into()),
        Err(first) => linkat(file, "", dir, name, AtFlags::EMPTY_PATH).map_err(|_| first.into()),
    }
}
