//! File operations beneath the host root that honour the run mode.
//!
//! # Background
//! The `fs` capability, unit files (`systemd`) and the root-relative kernel files (`kernel`)
//! all read and write files beneath the host root. This module is the one place that does it:
//! through the root's `cap_std::fs::Dir` (so nothing resolves outside the root), reading
//! through plan mode's overlay, and in apply mode writing atomically. Grant checks happen in
//! the capability modules before they call in here.
//!
//! # Guarantees
//! - Apply-mode file writes go to a 0600 temp file in the same directory, which is written,
//!   given its mode, fsynced and renamed over the target; then the directory is fsynced.
//! - Plan mode never touches the host: every mutation below branches on the run mode first.
//! - Every mutation records its [`ChangeKind`] in both modes, so apply reports exactly what
//!   plan predicted.

use super::bindings::{Error, Outcome};
use crate::hostpath::{HostPath, is_escape, is_link_refused};
use crate::plan::{ChangeKind, OverlayView, Planned, RunMode, file_diff, octal};
use crate::session::Session;
use cap_std::fs::{Dir, MetadataExt, PermissionsExt};
use sha2::{Digest, Sha256};
use std::io::{self, Write};

/// What is at a host path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeKind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symlink (not followed).
    Symlink,
    /// A device, socket or fifo.
    Other,
}

/// `lstat` of a host path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeStat {
    /// What it is.
    pub kind: NodeKind,
    /// Permission bits (0o7777).
    pub mode: u32,
    /// Size in bytes.
    pub size: u64,
}

/// Maps an I/O error on `path` to the WIT error, naming the path.
pub fn io_error(path: &HostPath, e: io::Error) -> Error {
    if is_escape(&e) {
        Error::Escape(format!("{path}: resolving it led outside the host root"))
    } else if is_link_refused(&e) {
        Error::Escape(format!(
            "{path}: a symlink on the way was not followed (it appeared after the path was \
             resolved and checked against the grant)"
        ))
    } else if e.kind() == io::ErrorKind::NotFound {
        Error::NotFound(format!("{path}: no such file or directory"))
    } else {
        Error::Io(format!("{path}: {e}"))
    }
}

/// Whether an lstat error only means "nothing there" (a missing component, or a file where a
/// directory component was expected).
fn is_absent(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::NotFound
        || e.raw_os_error() == Some(rustix::io::Errno::NOTDIR.raw_os_error())
}

impl Session {
    fn plan_mode(&self) -> bool {
        self.mode == RunMode::Plan
    }

    fn overlay_view<R>(&self, path: &HostPath, f: impl FnOnce(OverlayView<'_>) -> R) -> R {
        let overlay = self.overlay.lock().unwrap_or_else(|p| p.into_inner());
        f(overlay.view(path))
    }

    fn set_planned(&self, path: &HostPath, state: Planned) {
        let mut overlay = self.overlay.lock().unwrap_or_else(|p| p.into_inner());
        overlay.set(path.clone(), state);
    }

    fn disk_lstat(&self, path: &HostPath) -> Result<Option<NodeStat>, Error> {
        let (dir, name) = match self.root.open_parent_nofollow(path) {
            Ok(d) => d,
            Err(e) if is_absent(&e) => return Ok(None),
            Err(e) => return Err(io_error(path, e)),
        };
        match dir.symlink_metadata(name) {
            Ok(m) => {
                let ft = m.file_type();
                let kind = if ft.is_symlink() {
                    NodeKind::Symlink
                } else if ft.is_dir() {
                    NodeKind::Dir
                } else if ft.is_file() {
                    NodeKind::File
                } else {
                    NodeKind::Other
                };
                Ok(Some(NodeStat {
                    kind,
                    mode: m.permissions().mode() & 0o7777,
                    size: m.size(),
                }))
            }
            Err(e) if is_absent(&e) && !is_escape(&e) => Ok(None),
            Err(e) => Err(io_error(path, e)),
        }
    }

    /// Describes `path` without following a final symlink, as the run sees it.
    pub fn lstat(&self, path: &HostPath) -> Result<Option<NodeStat>, Error> {
        if self.plan_mode() {
            let planned = self.overlay_view(path, |v| match v {
                OverlayView::Planned(Planned::File { contents, mode }) => Some(Some(NodeStat {
                    kind: NodeKind::File,
                    mode: *mode,
                    size: contents.len() as u64,
                })),
                OverlayView::Planned(Planned::Dir { mode }) => Some(Some(NodeStat {
                    kind: NodeKind::Dir,
                    mode: *mode,
                    size: 0,
                })),
                OverlayView::Planned(Planned::Symlink { target }) => Some(Some(NodeStat {
                    kind: NodeKind::Symlink,
                    mode: 0o777,
                    size: target.len() as u64,
                })),
                OverlayView::Planned(Planned::Removed) | OverlayView::Gone => Some(None),
                OverlayView::Host => None,
            });
            if let Some(p) = planned {
                return Ok(p);
            }
        }
        self.disk_lstat(path)
    }

    /// Whether `path` is a directory (a symlink is not: callers resolve links first, see
    /// [`Session::resolve`]).
    pub fn is_dir(&self, path: &HostPath) -> Result<bool, Error> {
        Ok(matches!(
            self.lstat(path)?,
            Some(NodeStat {
                kind: NodeKind::Dir,
                ..
            })
        ))
    }

    /// Reads the file at `path` as the run sees it.
    pub fn read(&self, path: &HostPath) -> Result<Vec<u8>, Error> {
        if self.plan_mode() {
            let planned = self.overlay_view(path, |v| match v {
                OverlayView::Planned(Planned::File { contents, .. }) => Some(Ok(contents.clone())),
                OverlayView::Planned(Planned::Dir { .. }) => {
                    Some(Err(Error::Io(format!("{path}: is a directory"))))
                }
                OverlayView::Planned(Planned::Symlink { .. }) => Some(Err(Error::Io(format!(
                    "{path}: is a symlink planned in this run"
                )))),
                OverlayView::Planned(Planned::Removed) | OverlayView::Gone => Some(Err(
                    Error::NotFound(format!("{path}: no such file or directory")),
                )),
                OverlayView::Host => None,
            });
            if let Some(r) = planned {
                return r;
            }
        }
        let file = self.open_nofollow(path)?;
        let size = file.metadata().map_err(|e| io_error(path, e))?.len();
        if size > MAX_FILE_BYTES {
            return Err(too_large(path, size));
        }
        let mut contents = Vec::new();
        // One byte more than the cap, so a file that grew after the size check is caught.
        io::Read::read_to_end(
            &mut io::Read::take(&file, MAX_FILE_BYTES + 1),
            &mut contents,
        )
        .map_err(|e| io_error(path, e))?;
        if contents.len() as u64 > MAX_FILE_BYTES {
            return Err(too_large(path, contents.len() as u64));
        }
        Ok(contents)
    }

    /// Opens the regular file at `path` for reading without following any symlink.
    fn open_nofollow(&self, path: &HostPath) -> Result<std::fs::File, Error> {
        use rustix::fs::{Mode, OFlags, openat};
        let (dir, name) = self
            .root
            .open_parent_nofollow(path)
            .map_err(|e| io_error(path, e))?;
        let fd = openat(
            &dir,
            name,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK,
            Mode::empty(),
        )
        .map_err(|e| io_error(path, e.into()))?;
        let file = std::fs::File::from(fd);
        let meta = file.metadata().map_err(|e| io_error(path, e))?;
        if !meta.is_file() {
            return Err(Error::Io(format!("{path}: not a regular file")));
        }
        Ok(file)
    }

    fn parent_dir(&self, path: &HostPath) -> Result<Dir, Error> {
        self.root
            .open_parent_nofollow(path)
            .map(|(dir, _)| dir)
            .map_err(|e| io_error(path, e))
    }

    /// Sets `path`'s permission bits without following a symlink.
    pub fn set_mode(&self, path: &HostPath, mode: u32) -> Result<(), Error> {
        let (dir, name) = self
            .root
            .open_parent_nofollow(path)
            .map_err(|e| io_error(path, e))?;
        chmod_nofollow(&dir, name, mode).map_err(|e| io_error(path, e))
    }

    /// `not-found` unless `path`'s parent is a directory, as the run sees it.
    pub fn require_parent_dir(&self, path: &HostPath) -> Result<(), Error> {
        if let Some(parent) = path.parent() {
            match self.lstat(&parent)? {
                None => {
                    return Err(Error::NotFound(format!(
                        "{path}: parent directory {parent} does not exist"
                    )));
                }
                Some(_) if !self.is_dir(&parent)? => {
                    return Err(Error::Io(format!("{path}: {parent} is not a directory")));
                }
                Some(_) => {}
            }
        }
        Ok(())
    }

    /// The sha256 of the regular file at `path` as the run sees it; `None` when there is no
    /// regular file there. Streams from disk, so large artifacts are not read into memory.
    pub fn file_sha256(&self, path: &HostPath) -> Result<Option<String>, Error> {
        if self.plan_mode() {
            let planned = self.overlay_view(path, |v| match v {
                OverlayView::Planned(Planned::File { contents, .. }) => {
                    Some(Some(crate::bundle::sha256_hex(contents)))
                }
                OverlayView::Planned(_) | OverlayView::Gone => Some(None),
                OverlayView::Host => None,
            });
            if let Some(p) = planned {
                return Ok(p);
            }
        }
        match self.disk_lstat(path)? {
            Some(NodeStat {
                kind: NodeKind::File,
                ..
            }) => {}
            _ => return Ok(None),
        }
        let mut f = self.open_nofollow(path)?;
        let mut hasher = Sha256::new();
        io::copy(&mut f, &mut hasher).map_err(|e| io_error(path, e))?;
        Ok(Some(hex::encode(hasher.finalize())))
    }

    /// Replaces the file at `path` with `contents` and `mode` (see `fs.write-file`).
    pub fn write_file(
        &self,
        phase: &str,
        path: &HostPath,
        contents: &[u8],
        mode: u32,
        deadline: std::time::Instant,
    ) -> Result<Outcome, Error> {
        if mode > 0o7777 {
            return Err(Error::InvalidArgument(format!(
                "{path}: mode {mode:o} is above 0o7777"
            )));
        }
        if contents.len() as u64 > MAX_FILE_BYTES {
            return Err(Error::InvalidArgument(format!(
                "{path}: {} bytes; write-file takes at most {MAX_FILE_BYTES} bytes",
                contents.len()
            )));
        }
        self.require_parent_dir(path)?;
        let secret = self.redactor.contains_secret(contents);
        let (kind, outcome, mode_only) = match self.lstat(path)? {
            None => (
                ChangeKind::FileCreate {
                    path: path.to_string(),
                    mode: octal(mode),
                    sha256: crate::bundle::sha256_hex(contents),
                    size: contents.len() as u64,
                    diff: file_diff(path, None, contents, mode, secret, deadline),
                },
                Outcome::Created,
                false,
            ),
            Some(NodeStat {
                kind: NodeKind::File,
                mode: old_mode,
                size: old_size,
            }) => {
                // Files of another size differ without reading them; a previous file too large
                // to read is replaced without a line diff.
                let old = if old_size == contents.len() as u64 || old_size <= MAX_FILE_BYTES {
                    Some(self.read(path)?)
                } else {
                    None
                };
                if old.as_deref() == Some(contents) {
                    if old_mode == mode {
                        return Ok(Outcome::Unchanged);
                    }
                    (
                        ChangeKind::ModeChange {
                            path: path.to_string(),
                            from: octal(old_mode),
                            to: octal(mode),
                        },
                        Outcome::Changed,
                        true,
                    )
                } else {
                    let secret = secret
                        || old
                            .as_deref()
                            .is_some_and(|o| self.redactor.contains_secret(o))
                        || old_mode & 0o077 == 0;
                    let diff = match &old {
                        Some(old) => file_diff(path, Some(old), contents, mode, secret, deadline),
                        None => Some(format!(
                            "(not diffed: the previous file is {old_size} bytes)\n"
                        )),
                    };
                    (
                        ChangeKind::FileReplace {
                            path: path.to_string(),
                            mode: octal(mode),
                            previous_mode: octal(old_mode),
                            sha256: crate::bundle::sha256_hex(contents),
                            size: contents.len() as u64,
                            diff,
                        },
                        Outcome::Changed,
                        false,
                    )
                }
            }
            Some(st) => {
                return Err(Error::Io(format!(
                    "{path}: a {:?} is in the way; remove it first",
                    st.kind
                )));
            }
        };
        if self.plan_mode() {
            self.set_planned(
                path,
                Planned::File {
                    contents: contents.to_vec(),
                    mode,
                },
            );
        } else if mode_only {
            self.set_mode(path, mode)?;
        } else {
            self.atomic_write(path, contents, mode)?;
        }
        self.record(phase, kind);
        Ok(outcome)
    }

    fn atomic_write(&self, path: &HostPath, contents: &[u8], mode: u32) -> Result<(), Error> {
        let dir = self.parent_dir(path)?;
        let fail = |e: io::Error| io_error(path, e);
        let mut tmp = cap_tempfile::TempFile::new(&dir).map_err(fail)?;
        tmp.as_file_mut().write_all(contents).map_err(fail)?;
        rustix::fs::fchmod(tmp.as_file(), rustix::fs::Mode::from_raw_mode(mode))
            .map_err(|e| fail(e.into()))?;
        tmp.as_file().sync_all().map_err(fail)?;
        tmp.replace(path.file_name()).map_err(fail)?;
        fsync_dir(&dir).map_err(fail)?;
        Ok(())
    }

    /// Creates `path` and its missing parents with `mode` (see `fs.create-dir`).
    pub fn create_dir(&self, phase: &str, path: &HostPath, mode: u32) -> Result<Outcome, Error> {
        if mode > 0o7777 {
            return Err(Error::InvalidArgument(format!(
                "{path}: mode {mode:o} is above 0o7777"
            )));
        }
        let mut outcome = Outcome::Unchanged;
        for prefix in path.prefixes() {
            match self.lstat(&prefix)? {
                Some(_) if self.is_dir(&prefix)? => continue,
                Some(st) => {
                    return Err(Error::Io(format!(
                        "{prefix}: exists and is a {:?}, not a directory",
                        st.kind
                    )));
                }
                None => {}
            }
            if self.plan_mode() {
                self.set_planned(&prefix, Planned::Dir { mode });
            } else {
                let fail = |e: io::Error| io_error(&prefix, e);
                let (parent, name) = self.root.open_parent_nofollow(&prefix).map_err(fail)?;
                parent.create_dir(name).map_err(fail)?;
                chmod_nofollow(&parent, name, mode).map_err(fail)?;
                fsync_dir(&parent).map_err(fail)?;
            }
            self.record(
                phase,
                ChangeKind::DirCreate {
                    path: prefix.to_string(),
                    mode: octal(mode),
                },
            );
            outcome = Outcome::Created;
        }
        Ok(outcome)
    }

    /// Removes the file, symlink or empty directory at `path` (see `fs.remove`).
    pub fn remove(&self, phase: &str, path: &HostPath) -> Result<Outcome, Error> {
        let Some(st) = self.lstat(path)? else {
            return Ok(Outcome::Unchanged);
        };
        if st.kind == NodeKind::Dir && !self.list(path)?.is_empty() {
            return Err(Error::Io(format!("{path}: directory is not empty")));
        }
        if self.plan_mode() {
            self.set_planned(path, Planned::Removed);
        } else {
            let (dir, name) = self
                .root
                .open_parent_nofollow(path)
                .map_err(|e| io_error(path, e))?;
            let r = if st.kind == NodeKind::Dir {
                dir.remove_dir(name)
            } else {
                dir.remove_file(name)
            };
            r.map_err(|e| io_error(path, e))?;
        }
        self.record(
            phase,
            ChangeKind::Remove {
                path: path.to_string(),
            },
        );
        Ok(Outcome::Removed)
    }

    /// Removes `path` and everything beneath it without following symlinks or crossing into
    /// another mount (see `fs.remove-all`).
    pub fn remove_all(&self, phase: &str, path: &HostPath) -> Result<Outcome, Error> {
        let Some(st) = self.lstat(path)? else {
            return Ok(Outcome::Unchanged);
        };
        if self.plan_mode() {
            let mut overlay = self.overlay.lock().unwrap_or_else(|p| p.into_inner());
            overlay.remove_beneath(path);
            overlay.set(path.clone(), Planned::Removed);
        } else {
            let parent = self.parent_dir(path)?;
            let name = path.file_name();
            if st.kind == NodeKind::Dir {
                let parent_mount = mount_id(&parent).map_err(|e| io_error(path, e))?;
                remove_tree(&parent, name.as_ref(), parent_mount, path.as_str())?;
            } else {
                parent.remove_file(name).map_err(|e| io_error(path, e))?;
            }
            fsync_dir(&parent).map_err(|e| io_error(path, e))?;
        }
        self.record(
            phase,
            ChangeKind::Remove {
                path: path.to_string(),
            },
        );
        Ok(Outcome::Removed)
    }

    /// Lists the directory at `path`, sorted by name, as the run sees it.
    pub fn list(&self, path: &HostPath) -> Result<Vec<(String, NodeKind)>, Error> {
        if !self.is_dir(path)? {
            return match self.lstat(path)? {
                None => Err(Error::NotFound(format!("{path}: no such directory"))),
                Some(_) => Err(Error::Io(format!("{path}: not a directory"))),
            };
        }
        let mut entries = std::collections::BTreeMap::new();
        let gone = self.plan_mode() && self.overlay_view(path, |v| v == OverlayView::Gone);
        if !gone {
            match self
                .root
                .open_dir_nofollow(Some(path))
                .and_then(|d| d.entries())
            {
                Ok(iter) => {
                    for entry in iter {
                        let entry = entry.map_err(|e| io_error(path, e))?;
                        let name = entry.file_name().to_string_lossy().into_owned();
                        let ft = entry.file_type().map_err(|e| io_error(path, e))?;
                        let kind = if ft.is_symlink() {
                            NodeKind::Symlink
                        } else if ft.is_dir() {
                            NodeKind::Dir
                        } else if ft.is_file() {
                            NodeKind::File
                        } else {
                            NodeKind::Other
                        };
                        entries.insert(name, kind);
                    }
                }
                Err(e) if is_absent(&e) && !is_escape(&e) && self.plan_mode() => {}
                Err(e) => return Err(io_error(path, e)),
            }
        }
        if self.plan_mode() {
            let overlay = self.overlay.lock().unwrap_or_else(|p| p.into_inner());
            for (name, state) in overlay.children(Some(path)) {
                match state {
                    Planned::Removed => {
                        entries.remove(&name);
                    }
                    Planned::File { .. } => {
                        entries.insert(name, NodeKind::File);
                    }
                    Planned::Dir { .. } => {
                        entries.insert(name, NodeKind::Dir);
                    }
                    Planned::Symlink { .. } => {
                        entries.insert(name, NodeKind::Symlink);
                    }
                }
            }
        }
        Ok(entries.into_iter().collect())
    }

    /// The target of the symlink at `path` as the run sees it.
    pub fn read_link(&self, path: &HostPath) -> Result<String, Error> {
        if self.plan_mode()
            && let Some(t) = self.overlay_view(path, |v| match v {
                OverlayView::Planned(Planned::Symlink { target }) => Some(target.clone()),
                _ => None,
            })
        {
            return Ok(t);
        }
        let (dir, name) = self
            .root
            .open_parent_nofollow(path)
            .map_err(|e| io_error(path, e))?;
        dir.read_link_contents(name)
            .map(|t| t.to_string_lossy().into_owned())
            .map_err(|e| io_error(path, e))
    }

    /// Makes `path` a symlink to `target` (see `fs.symlink`).
    pub fn symlink(&self, phase: &str, target: &str, path: &HostPath) -> Result<Outcome, Error> {
        check_link_target(path, target)?;
        self.require_parent_dir(path)?;
        let previous = match self.lstat(path)? {
            None => None,
            Some(NodeStat {
                kind: NodeKind::Symlink,
                ..
            }) => {
                let current = self.read_link(path)?;
                if current == target {
                    return Ok(Outcome::Unchanged);
                }
                Some(current)
            }
            Some(st) => {
                return Err(Error::Io(format!(
                    "{path}: a {:?} is in the way of the symlink",
                    st.kind
                )));
            }
        };
        if self.plan_mode() {
            self.set_planned(
                path,
                Planned::Symlink {
                    target: target.to_string(),
                },
            );
        } else {
            let dir = self.parent_dir(path)?;
            let fail = |e: io::Error| io_error(path, e);
            let tmp = format!(".{}.nodeward-tmp", path.file_name());
            let _ = dir.remove_file(&tmp);
            dir.symlink(target, &tmp).map_err(fail)?;
            dir.rename(&tmp, &dir, path.file_name()).map_err(fail)?;
            fsync_dir(&dir).map_err(fail)?;
        }
        let outcome = if previous.is_some() {
            Outcome::Changed
        } else {
            Outcome::Created
        };
        self.record(
            phase,
            ChangeKind::Symlink {
                path: path.to_string(),
                target: target.to_string(),
                previous,
            },
        );
        Ok(outcome)
    }

    /// Writes a kernel-interface file (`proc/sys/...`, `proc/modules`) without a rename:
    /// procfs files cannot be replaced, only written. Beneath a root that is not `/`, missing
    /// parents are created so the root's equivalent exists. Records no change: the kernel
    /// capability records its own.
    pub fn write_kernel_file(&self, path: &HostPath, contents: &[u8]) -> Result<(), Error> {
        if self.plan_mode() {
            self.set_planned(
                path,
                Planned::File {
                    contents: contents.to_vec(),
                    mode: 0o644,
                },
            );
            return Ok(());
        }
        use rustix::fs::{Mode, OFlags, openat};
        let system = self.root.is_system_root();
        if !system && let Some(parent) = path.parent() {
            for prefix in parent.prefixes() {
                let (dir, name) = self
                    .root
                    .open_parent_nofollow(&prefix)
                    .map_err(|e| io_error(&prefix, e))?;
                match dir.create_dir(name) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(io_error(&prefix, e)),
                }
            }
        }
        let (dir, name) = self
            .root
            .open_parent_nofollow(path)
            .map_err(|e| io_error(path, e))?;
        // procfs files cannot be created, only written; beneath another root they are files.
        let create = if system {
            OFlags::empty()
        } else {
            OFlags::CREATE
        };
        let fd = openat(
            &dir,
            name,
            OFlags::WRONLY | OFlags::TRUNC | OFlags::NOFOLLOW | OFlags::CLOEXEC | create,
            Mode::from_raw_mode(0o644),
        )
        .map_err(|e| io_error(path, e.into()))?;
        std::fs::File::from(fd)
            .write_all(contents)
            .map_err(|e| io_error(path, e))
    }
}

/// The most bytes `fs.read-file` returns and `fs.write-file` takes (documented in `wit/fs.wit`):
/// both pass through host memory whole, so the agent's memory stays bounded.
pub const MAX_FILE_BYTES: u64 = 16 << 20;

fn too_large(path: &HostPath, size: u64) -> Error {
    Error::Failed(format!(
        "{path}: {size} bytes; read-file returns at most {MAX_FILE_BYTES} bytes"
    ))
}

/// Sets the permission bits of `name` in `dir` without following a symlink: the object is
/// opened with `O_NOFOLLOW` (a symlink fails with `ELOOP`) and changed through its descriptor.
fn chmod_nofollow(dir: &Dir, name: &str, mode: u32) -> io::Result<()> {
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
fn fsync_dir(dir: &Dir) -> io::Result<()> {
    dir.open_with(".", cap_std::fs::OpenOptions::new().read(true))?
        .sync_all()
}

/// The mount a directory handle is on: `statx`'s mount ID (Linux 5.8+), else its device, which
/// still tells another filesystem apart (not a bind mount of the same one).
fn mount_id(dir: &Dir) -> io::Result<u64> {
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
fn remove_tree(
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

/// Refuses absolute link targets and targets that climb above the root from the link's
/// directory (checked lexically; resolution is confined again whenever the link is used).
fn check_link_target(path: &HostPath, target: &str) -> Result<(), Error> {
    let bad = |why: &str| {
        Err(Error::InvalidArgument(format!(
            "symlink {path} -> {target:?}: {why}"
        )))
    };
    if target.is_empty() || target.contains('\0') {
        return bad("empty target or NUL byte");
    }
    if target.starts_with('/') {
        return bad("absolute targets are refused; use a path relative to the link");
    }
    let mut depth = path.parent().map_or(0, |p| p.prefixes().count());
    for component in target.split('/') {
        match component {
            "" | "." => {}
            ".." => {
                if depth == 0 {
                    return bad("leads above the host root");
                }
                depth -= 1;
            }
            _ => depth += 1,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_targets_stay_beneath_the_root() {
        let p = HostPath::parse("opt/nodeward/node/current").expect("path");
        assert!(check_link_target(&p, "v1.34.1").is_ok());
        assert!(check_link_target(&p, "../../../etc").is_ok());
        assert!(check_link_target(&p, "../../../../etc").is_err());
        assert!(check_link_target(&p, "/etc").is_err());
        assert!(check_link_target(&p, "").is_err());
    }
}
