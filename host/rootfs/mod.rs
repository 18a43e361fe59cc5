//! The plan-aware root filesystem: the host root as one run sees it.
//!
//! # Background
//! The `fs` capability, unit files (`systemd`), the root-relative kernel files (`kernel`),
//! mount points (`mounts`) and downloads all read and write files beneath the host root.
//! [`RootFs`] is the one place that does it: beneath the root, on paths [`RootFs::resolve`]
//! already resolved (so they hold no symlink),
//! opening every component with `O_NOFOLLOW` (a link swapped in later is refused, never
//! followed), reading through plan mode's overlay, and in apply mode writing atomically. Grant
//! checks happen in the capability modules before they call in here. Reads are here, the
//! mutations in `write`, descriptor-level helpers in `sys`.
//!
//! # Guarantees
//! - Apply-mode file writes go to a 0600 temp file in the same directory, which is written,
//!   given its mode, fsynced and renamed over the target; then the directory is fsynced
//!   ([`crate::durable`], whose temp names a later run's sweep recognises).
//! - No regular file is changed in place: a new mode is given by replacing the file too, so a
//!   name that is a hard link planted by someone else (to `etc/shadow`, or to a file outside
//!   the root on the same file system) is replaced by a new inode and the file it shared an
//!   inode with keeps its bytes and mode. Only directories (which cannot be hard links) are
//!   chmodded, through a descriptor opened `O_DIRECTORY | O_NOFOLLOW`, and kernel-interface
//!   files written in place ([`RootFs::write_kernel_file`], refused when they have more than
//!   one name).
//! - A regular file with more than one name (hard link) is not read ([`RootFs::read`] is
//!   `denied`) and its contents never decide an outcome: another of its names may lie
//!   outside every grant, and no path check can tell. Its metadata (`lstat`) stays visible,
//!   as a directory listing's is.
//! - Resolution refuses the agent's own process wherever a procfs is mounted beneath the root
//!   (`procfs`).
//! - Plan mode never touches the host: every mutation below branches on the run mode first.
//! - Every mutation records its `ChangeKind` in both modes, so apply reports exactly what
//!   plan predicted.

use crate::audit::Redactor;
use crate::hostpath::{HostPath, HostRoot, is_escape, is_link_refused};
use crate::plan::{ChangeKind, ChangeLog, Overlay, OverlayView, Planned, RunMode};
use crate::wit::Error;
use cap_std::fs::{Dir, MetadataExt, PermissionsExt};
use sha2::{Digest, Sha256};
use std::io;

mod procfs;
mod resolve;
mod secret;
mod sys;
mod write;
pub use resolve::{Check, Final, MAX_LINKS, MAX_STEPS, link_destination};
pub use sys::chmod_dir_nofollow;

/// What is at a host path: a file, a directory, a symlink or anything else (the kind of a
/// directory entry; "node" is kept for the Kubernetes node).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryKind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symlink (not followed).
    Symlink,
    /// A device, socket or fifo.
    Other,
}

impl EntryKind {
    /// The kind of a file type as `lstat` (or a directory entry) reports it.
    fn of(ft: cap_std::fs::FileType) -> EntryKind {
        if ft.is_symlink() {
            EntryKind::Symlink
        } else if ft.is_dir() {
            EntryKind::Dir
        } else if ft.is_file() {
            EntryKind::File
        } else {
            EntryKind::Other
        }
    }
}

/// `lstat` of a host path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntryStat {
    /// What it is.
    pub kind: EntryKind,
    /// Permission bits (0o7777).
    pub mode: u32,
    /// Size in bytes.
    pub size: u64,
    /// How many names (hard links) the object has; 1 for anything planned in this run.
    pub links: u64,
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

/// The host root as one plan or apply run sees it: the root handle, the run mode, plan
/// mode's overlay, and the run's change log that every mutation records into.
#[derive(Debug)]
pub struct RootFs {
    /// The host root every path resolves beneath.
    pub root: HostRoot,
    /// Plan or apply.
    pub mode: RunMode,
    /// Knows the run's secrets, so that a diff of a file holding one is withheld.
    redactor: Redactor,
    /// Plan mode's planned state of files, directories and links.
    overlay: std::sync::Mutex<Overlay>,
    /// The run's changes (shared with the other capabilities of the run).
    changes: std::sync::Arc<ChangeLog>,
}

impl RootFs {
    /// The root filesystem of a run over `root` in `mode`, recording into `changes`.
    pub fn new(
        root: HostRoot,
        mode: RunMode,
        redactor: Redactor,
        changes: std::sync::Arc<ChangeLog>,
    ) -> Self {
        RootFs {
            root,
            mode,
            redactor,
            overlay: std::sync::Mutex::new(Overlay::default()),
            changes,
        }
    }

    /// Adds a change `phase` made (or would make) to the host to the run's change log.
    fn changed(&self, phase: &str, kind: ChangeKind) {
        self.changes.add(phase, kind);
    }

    /// Counts planned contents against the run's bound.
    fn reserve_planned(&self, path: &HostPath, bytes: usize) -> Result<(), Error> {
        self.changes
            .reserve_planned(path, bytes)
            .map_err(|e| Error::Failed(e.to_string()))
    }

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

    /// Plan mode's write of a file: `contents` and `mode` into the overlay, counted against the
    /// run's bound on planned contents.
    fn plan_file(&self, path: &HostPath, contents: &[u8], mode: u32) -> Result<(), Error> {
        self.reserve_planned(path, contents.len())?;
        self.set_planned(
            path,
            Planned::File {
                contents: contents.to_vec(),
                mode,
            },
        );
        Ok(())
    }

    fn disk_lstat(&self, path: &HostPath) -> Result<Option<EntryStat>, Error> {
        let (dir, name) = match self.root.open_parent_nofollow(path) {
            Ok(d) => d,
            Err(e) if is_absent(&e) => return Ok(None),
            Err(e) => return Err(io_error(path, e)),
        };
        match dir.symlink_metadata(name) {
            Ok(m) => Ok(Some(EntryStat {
                kind: EntryKind::of(m.file_type()),
                mode: m.permissions().mode() & 0o7777,
                size: m.size(),
                links: m.nlink(),
            })),
            Err(e) if is_absent(&e) && !is_escape(&e) => Ok(None),
            Err(e) => Err(io_error(path, e)),
        }
    }

    /// Describes `path` without following a final symlink, as the run sees it.
    pub fn lstat(&self, path: &HostPath) -> Result<Option<EntryStat>, Error> {
        if self.plan_mode() {
            let planned = self.overlay_view(path, |v| match v {
                OverlayView::Planned(Planned::File { contents, mode }) => Some(Some(EntryStat {
                    kind: EntryKind::File,
                    mode: *mode,
                    size: contents.len() as u64,
                    links: 1,
                })),
                OverlayView::Planned(Planned::Dir { mode }) => Some(Some(EntryStat {
                    kind: EntryKind::Dir,
                    mode: *mode,
                    size: 0,
                    links: 1,
                })),
                OverlayView::Planned(Planned::Symlink { target }) => Some(Some(EntryStat {
                    kind: EntryKind::Symlink,
                    mode: 0o777,
                    size: target.len() as u64,
                    links: 1,
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
    /// [`RootFs::resolve`]).
    pub fn is_dir(&self, path: &HostPath) -> Result<bool, Error> {
        Ok(matches!(
            self.lstat(path)?,
            Some(EntryStat {
                kind: EntryKind::Dir,
                ..
            })
        ))
    }

    /// Reads the file at `path` as the run sees it. A file on disk with more than one name
    /// (hard link) is `denied`: another of its names may lie outside every grant (a link to
    /// `etc/shadow` planted in a granted directory), and its contents are that file's.
    pub fn read(&self, path: &HostPath) -> Result<Vec<u8>, Error> {
        self.read_checked(path, true)
    }

    /// Reads the file at `path` as the run sees it, for the host's own parsing only (the
    /// `[Install]` guard reading a unit file, preflight reading `modules.dep`): its bytes
    /// never reach a phase, so a file with more than one name is read. On an OSTree host
    /// (Fedora CoreOS, RHCOS) every file in `usr` is a hard link into `ostree/repo`, and the
    /// host must still parse them. Like [`RootFs::read`] it stays beneath the root and follows
    /// no link. Never use it for bytes a phase gets, or whose contents a phase's call returns.
    pub fn read_for_host(&self, path: &HostPath) -> Result<Vec<u8>, Error> {
        self.read_checked(path, false)
    }

    /// [`RootFs::read`]; a file with more than one name is refused when `sole` is set.
    fn read_checked(&self, path: &HostPath, sole: bool) -> Result<Vec<u8>, Error> {
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
        let file = if sole {
            self.open_sole(path, None)?
                .ok_or_else(|| shared_inode(path))?
        } else {
            self.open_nofollow(path)?
        };
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

    /// [`RootFs::open_nofollow`], but `None` when the file opened has a name besides `path`
    /// and `also` (the artifact cache's entry for a downloaded file, which shares its inode):
    /// judged on the open descriptor, so a link swapped in after a check cannot slip past.
    fn open_sole(
        &self,
        path: &HostPath,
        also: Option<&HostPath>,
    ) -> Result<Option<std::fs::File>, Error> {
        use std::os::unix::fs::MetadataExt as _;
        let file = self.open_nofollow(path)?;
        let meta = file.metadata().map_err(|e| io_error(path, e))?;
        let sole = match (meta.nlink(), also) {
            (1, _) => true,
            (2, Some(other)) => self.disk_identity(other) == Some((meta.dev(), meta.ino())),
            _ => false,
        };
        Ok(sole.then_some(file))
    }

    /// The device and inode of the object at `path` on disk, reached without following any
    /// link; `None` when nothing is there or it cannot be reached so (then it is no second
    /// name [`RootFs::open_sole`] accepts: the safe side, the file is treated as another's).
    fn disk_identity(&self, path: &HostPath) -> Option<(u64, u64)> {
        let (dir, name) = self.root.open_parent_nofollow(path).ok()?;
        let m = dir.symlink_metadata(name).ok()?;
        Some((m.dev(), m.ino()))
    }

    fn parent_dir(&self, path: &HostPath) -> Result<Dir, Error> {
        self.root
            .open_parent_nofollow(path)
            .map(|(dir, _)| dir)
            .map_err(|e| io_error(path, e))
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

    /// The sha256 of the regular file at `path` as the run sees it, for comparing with a
    /// digest a phase gave; `None` when there is no regular file there, when it has a name
    /// besides `path` and `also` (see [`RootFs::open_sole`]: its contents are another file's,
    /// and hashing them would tell a phase whether that file holds the bytes it guessed), or
    /// when it holds a secret (or a part of one): a phase could otherwise confirm a guessed
    /// file by its digest ([`crate::secrets`]). Streams from disk, so large artifacts are not
    /// read into memory, and stops at `deadline` (`timeout`): a phase may point it at any file
    /// its grant covers.
    pub fn file_sha256(
        &self,
        path: &HostPath,
        also: Option<&HostPath>,
        deadline: std::time::Instant,
    ) -> Result<Option<String>, Error> {
        if self.plan_mode() {
            let planned = self.overlay_view(path, |v| match v {
                OverlayView::Planned(Planned::File { contents, .. }) => Some(
                    (!self.redactor.contains_secret(contents))
                        .then(|| crate::digest::sha256_hex(contents)),
                ),
                OverlayView::Planned(_) | OverlayView::Gone => Some(None),
                OverlayView::Host => None,
            });
            if let Some(p) = planned {
                return Ok(p);
            }
        }
        match self.disk_lstat(path)? {
            Some(EntryStat {
                kind: EntryKind::File,
                ..
            }) => {}
            _ => return Ok(None),
        }
        let Some(mut f) = self.open_sole(path, also)? else {
            return Ok(None);
        };
        let mut scan = ScanWriter(self.redactor.scan());
        let sha = hash_stream(path, &mut f, Some(&mut scan), deadline)?;
        Ok((!scan.0.found()).then_some(sha))
    }

    /// Lists the directory at `path`, sorted by name, as the run sees it.
    pub fn list(&self, path: &HostPath) -> Result<Vec<(String, EntryKind)>, Error> {
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
                        entries.insert(name, EntryKind::of(ft));
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
                        entries.insert(name, EntryKind::File);
                    }
                    Planned::Dir { .. } => {
                        entries.insert(name, EntryKind::Dir);
                    }
                    Planned::Symlink { .. } => {
                        entries.insert(name, EntryKind::Symlink);
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
}

/// The most bytes `fs.read-file` returns and `fs.write-file` takes (documented in `wit/fs.wit`):
/// both pass through host memory whole, so the agent's memory stays bounded.
pub const MAX_FILE_BYTES: u64 = 16 << 20;

/// The refusal to read a file with more than one name (see [`RootFs::read`]).
fn shared_inode(path: &HostPath) -> Error {
    Error::Denied(format!(
        "read {path}: the file has more than one name (a hard link); another of them may lie \
         outside every grant, so it is not read"
    ))
}

/// The sha256 of everything `from` yields, copied to `copy` when given; `timeout` at
/// `deadline`, since a large file takes seconds. `path` names the file in errors.
fn hash_stream(
    path: &HostPath,
    from: &mut impl io::Read,
    mut copy: Option<&mut dyn io::Write>,
    deadline: std::time::Instant,
) -> Result<String, Error> {
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        if std::time::Instant::now() >= deadline {
            return Err(Error::Timeout(format!(
                "{path}: hashing it reached the phase deadline"
            )));
        }
        let n = match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(io_error(path, e)),
        };
        hasher.update(&buf[..n]);
        if let Some(w) = copy.as_deref_mut() {
            w.write_all(&buf[..n]).map_err(|e| io_error(path, e))?;
        }
    }
    Ok(hex::encode(hasher.finalize()))
}

/// Feeds what [`hash_stream`] copies to a secret scan (so a file is read once to be hashed
/// and scanned).
struct ScanWriter<'r>(crate::audit::SecretScan<'r>);

impl io::Write for ScanWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.feed(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The error of a file write that finds something other than a regular file at `path`.
fn in_the_way(path: &HostPath, kind: EntryKind) -> Error {
    Error::Io(format!("{path}: a {kind:?} is in the way; remove it first"))
}

fn too_large(path: &HostPath, size: u64) -> Error {
    Error::Failed(format!(
        "{path}: {size} bytes; read-file returns at most {MAX_FILE_BYTES} bytes"
    ))
}
