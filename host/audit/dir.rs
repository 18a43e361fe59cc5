//! [`TrailDir`]: a directory of the trail (the log directory, its `runs/`, the heads'
//! directory), opened without following links, and every file in it opened beneath it.
//!
//! # Background
//! The agent runs as root and writes the trail beneath a host root other programs can write
//! to. Opening `<root>/var/log/nodeward/audit/audit.jsonl` by path would follow a link someone
//! planted there (to `/etc/shadow`, to a FIFO that blocks the `open` forever), and a directory
//! another user may write could have its files swapped under the writer. So a trail directory
//! is opened once, with `O_NOFOLLOW`, checked, and named by its descriptor from then on:
//! every file is opened with `openat(dir, name, O_NOFOLLOW | O_NONBLOCK)` and must be a regular
//! file; renames and removals are `renameat`/`unlinkat` beneath it.
//!
//! # Guarantees
//! - A symlink where the directory or one of its files belongs is refused, naming it.
//! - A writer's directory ([`Access::Write`]) is owned by the agent's effective uid and is not
//!   group- or world-writable; when missing it is made with mode 0750 (and its parent fsynced,
//!   so the new entry survives a power cut).
//! - A FIFO, socket or device where a file belongs is refused (opened non-blocking, so the
//!   `open` itself never waits for a peer).
//!
//! # Caveats
//! Only the directory itself is opened without following links; the components above it (the
//! host root, `var/log/nodeward`) are the operator's.

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};

/// What a directory is opened for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Access {
    /// Reading (`audit verify|show|summary`): it must exist to be read; its owner is not
    /// checked (an auditor may read a copy).
    Read,
    /// Writing: made when missing, and owned by the agent and not group- or world-writable.
    Write,
}

/// How a file in a [`TrailDir`] is opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FileMode {
    /// Reading only; it must exist.
    Read,
    /// Reading and appending; made (mode 0640) when missing.
    Append,
    /// Reading and writing (a lock file); made (mode 0640) when missing.
    Lock,
    /// A new file (mode 0640) that must not exist yet.
    CreateNew,
}

/// A directory of the trail, held by its descriptor (see the module doc).
#[derive(Debug)]
pub(crate) struct TrailDir {
    fd: OwnedFd,
    path: PathBuf,
}

/// `path` in an error: `<path>: <what>`.
pub(crate) fn at(path: &Path, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

/// Why `path` could not be opened without following a link: a clearer error when a link is
/// what is there.
fn refused(path: &Path, e: io::Error) -> io::Error {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{} is a symbolic link: refused (the audit trail never follows links)",
                path.display()
            ),
        ),
        _ => at(path, e),
    }
}

impl TrailDir {
    /// Opens the directory at `path` (see the module doc); `None` when it does not exist and
    /// `access` is [`Access::Read`].
    pub(crate) fn open(path: &Path, access: Access) -> io::Result<Option<TrailDir>> {
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = match rustix::fs::openat(rustix::fs::CWD, path, flags, Mode::empty()) {
            Ok(fd) => fd,
            Err(e) if e == rustix::io::Errno::NOENT && access == Access::Read => return Ok(None),
            Err(e) if e == rustix::io::Errno::NOENT => {
                make_dir(path)?;
                rustix::fs::openat(rustix::fs::CWD, path, flags, Mode::empty())
                    .map_err(|e| refused(path, e.into()))?
            }
            Err(e) => return Err(refused(path, e.into())),
        };
        let dir = TrailDir {
            fd,
            path: path.to_path_buf(),
        };
        if access == Access::Write {
            dir.check_owner()?;
        }
        Ok(Some(dir))
    }

    /// Opens (making it when missing) the directory `name` beneath this one, for writing.
    pub(crate) fn subdir(&self, name: &str) -> io::Result<TrailDir> {
        let path = self.path.join(name);
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = match rustix::fs::openat(&self.fd, name, flags, Mode::empty()) {
            Err(e) if e == rustix::io::Errno::NOENT => {
                match rustix::fs::mkdirat(&self.fd, name, Mode::from_raw_mode(0o750)) {
                    Err(e) if e != rustix::io::Errno::EXIST => return Err(at(&path, e.into())),
                    _ => {}
                }
                self.fsync().map_err(|e| at(&self.path, e))?;
                rustix::fs::openat(&self.fd, name, flags, Mode::empty())
            }
            other => other,
        }
        .map_err(|e| refused(&path, e.into()))?;
        let dir = TrailDir { fd, path };
        dir.check_owner()?;
        Ok(dir)
    }

    /// The directory's path, for messages.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// `name`'s path, for messages.
    pub(crate) fn join(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// Refuses a directory another user owns or may write.
    fn check_owner(&self) -> io::Result<()> {
        let st = rustix::fs::fstat(&self.fd).map_err(|e| at(&self.path, e.into()))?;
        let uid = rustix::process::geteuid().as_raw();
        if st.st_uid != uid {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "{} is owned by uid {}, not by the agent (uid {uid}): refused",
                    self.path.display(),
                    st.st_uid
                ),
            ));
        }
        if st.st_mode & 0o022 != 0 {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "{} is group- or world-writable (mode {:04o}): refused",
                    self.path.display(),
                    st.st_mode & 0o7777
                ),
            ));
        }
        Ok(())
    }

    /// Opens the regular file `name` beneath this directory without following a link.
    pub(crate) fn file(&self, name: &str, mode: FileMode) -> io::Result<File> {
        let path = self.join(name);
        let base = OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK;
        let flags = match mode {
            FileMode::Read => base | OFlags::RDONLY,
            FileMode::Append => base | OFlags::RDWR | OFlags::APPEND | OFlags::CREATE,
            FileMode::Lock => base | OFlags::RDWR | OFlags::CREATE,
            FileMode::CreateNew => base | OFlags::RDWR | OFlags::CREATE | OFlags::EXCL,
        };
        let fd = rustix::fs::openat(&self.fd, name, flags, Mode::from_raw_mode(0o640))
            .map_err(|e| refused(&path, e.into()))?;
        let links = regular(&fd, &path)?;
        // Appending to (or truncating) a file with another name would change that file too,
        // wherever the name is: a hard link planted here is refused, not written through.
        if links > 1 && !matches!(mode, FileMode::Read) {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "{} has {links} names (hard links); refused: writing it would change the others",
                    path.display()
                ),
            ));
        }
        Ok(File::from(fd))
    }

    /// The names in this directory (`.` and `..` left out; names that are not UTF-8 too).
    pub(crate) fn names(&self) -> io::Result<Vec<String>> {
        let mut out = Vec::new();
        let dir = rustix::fs::Dir::read_from(&self.fd).map_err(|e| at(&self.path, e.into()))?;
        for entry in dir {
            let entry = entry.map_err(|e| at(&self.path, e.into()))?;
            let name = OsStr::from_bytes(entry.file_name().to_bytes());
            if let Some(name) = name.to_str()
                && name != "."
                && name != ".."
            {
                out.push(name.to_string());
            }
        }
        Ok(out)
    }

    /// Renames `from` to `to`, both beneath this directory.
    pub(crate) fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        rustix::fs::renameat(&self.fd, from, &self.fd, to)
            .map_err(|e| at(&self.join(from), e.into()))
    }

    /// Removes the file `name`; `Ok(false)` when there was none.
    pub(crate) fn remove(&self, name: &str) -> io::Result<bool> {
        match rustix::fs::unlinkat(&self.fd, name, AtFlags::empty()) {
            Ok(()) => Ok(true),
            Err(e) if e == rustix::io::Errno::NOENT => Ok(false),
            Err(e) => Err(at(&self.join(name), e.into())),
        }
    }

    /// Makes the directory's entries durable.
    pub(crate) fn fsync(&self) -> io::Result<()> {
        rustix::fs::fsync(&self.fd).map_err(|e| at(&self.path, e.into()))
    }

    /// The directory as a `cap_std` handle (for [`crate::durable`]'s writes beneath it).
    pub(crate) fn cap_dir(&self) -> io::Result<cap_std::fs::Dir> {
        let fd = self.fd.try_clone().map_err(|e| at(&self.path, e))?;
        Ok(cap_std::fs::Dir::from(fd))
    }
}

/// Refuses anything but a regular file (a FIFO, a socket, a device, a directory); the number
/// of names (hard links) the file has.
fn regular(fd: impl AsFd, path: &Path) -> io::Result<u64> {
    let st = rustix::fs::fstat(fd).map_err(|e| at(path, e.into()))?;
    match FileType::from_raw_mode(st.st_mode) {
        FileType::RegularFile => Ok(st.st_nlink),
        other => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{} is not a regular file ({other:?}): refused",
                path.display()
            ),
        )),
    }
}

/// Makes the directory at `path` (mode 0750, its missing parents too) and fsyncs its parent.
fn make_dir(path: &Path) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt as _;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o750)
        .create(path)
        .map_err(|e| at(path, e))?;
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        File::open(parent)
            .and_then(|d| d.sync_all())
            .map_err(|e| at(parent, e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{PermissionsExt as _, symlink};

    #[test]
    fn links_fifos_and_writable_dirs_are_refused() {
        let tmp = tempfile::tempdir().expect("tmp");
        let real = tmp.path().join("real");
        let d = TrailDir::open(&real, Access::Write)
            .expect("made")
            .expect("some");
        assert_eq!(
            std::fs::metadata(&real).expect("meta").permissions().mode() & 0o777,
            0o750
        );
        let link = tmp.path().join("link");
        symlink(&real, &link).expect("link");
        let e = TrailDir::open(&link, Access::Write).expect_err("a linked dir");
        assert!(e.to_string().contains("symbolic link"), "{e}");
        let e = TrailDir::open(&link, Access::Read).expect_err("read too");
        assert!(e.to_string().contains("symbolic link"), "{e}");

        symlink("/etc/hostname", real.join("audit.jsonl")).expect("file link");
        let e = d
            .file("audit.jsonl", FileMode::Append)
            .expect_err("a linked file");
        assert!(e.to_string().contains("symbolic link"), "{e}");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            real.join("fifo"),
            FileType::Fifo,
            Mode::from_raw_mode(0o600),
            0,
        )
        .expect("fifo");
        let e = d.file("fifo", FileMode::Lock).expect_err("a fifo");
        assert!(e.to_string().contains("not a regular file"), "{e}");
        let precious = tmp.path().join("precious");
        std::fs::write(&precious, "keep\n").expect("precious");
        std::fs::hard_link(&precious, real.join("hard.jsonl")).expect("hard link");
        for mode in [FileMode::Append, FileMode::Lock] {
            let e = d.file("hard.jsonl", mode).expect_err("a hard-linked file");
            assert!(e.to_string().contains("hard links"), "{e}");
        }
        assert!(d.file("hard.jsonl", FileMode::Read).is_ok(), "read only");
        assert_eq!(std::fs::read_to_string(&precious).expect("read"), "keep\n");

        std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o770)).expect("chmod");
        let e = TrailDir::open(&real, Access::Write).expect_err("group-writable");
        assert!(e.to_string().contains("group- or world-writable"), "{e}");
        assert!(TrailDir::open(&real, Access::Read).is_ok());
        assert!(
            TrailDir::open(&tmp.path().join("none"), Access::Read)
                .expect("absent")
                .is_none()
        );
    }
}
