//! The checks' reads of the host: beneath the root, never following a symlink.
//!
//! Everything goes through the run's [`RootFs`](crate::rootfs::RootFs), whose reads open each
//! component with `O_NOFOLLOW` beneath the root's descriptor: a link anywhere on the path (a
//! `proc` or state path swapped for a link out of the root) is refused, and the check that
//! wanted the file says so, naming it. The one link read through is procfs's own
//! `proc/net -> self/net`, which this module reads as `proc/<this process>/net` (what `self`
//! means), itself without following links.

use crate::caps::RunContext;
use crate::hostpath::HostPath;
use crate::rootfs::{EntryKind, RootFs};
use crate::wit::Error;

/// What is at a path (its last component not followed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Entry {
    /// Nothing.
    Missing,
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symlink, and where it points (not followed).
    Link(String),
    /// A socket, device or fifo.
    Other,
}

/// The host beneath the run's root, read-only.
pub(super) struct Host<'a> {
    files: &'a RootFs,
}

/// The message of a read that was refused or failed, naming `path`.
fn refused(path: &str, e: Error) -> String {
    match e {
        Error::Escape(_) => format!(
            "{path}: a symlink is on the way (or it is one); preflight follows no link beneath the root"
        ),
        Error::NotFound(m)
        | Error::Io(m)
        | Error::Denied(m)
        | Error::InvalidArgument(m)
        | Error::Failed(m)
        | Error::Timeout(m)
        | Error::Unavailable(m) => {
            if m.starts_with(path) {
                m
            } else {
                format!("{path}: {m}")
            }
        }
    }
}

fn host_path(path: &str) -> Result<HostPath, String> {
    HostPath::parse(path).map_err(|e| e.to_string())
}

impl<'a> Host<'a> {
    pub(super) fn new(session: &'a RunContext) -> Self {
        Host {
            files: &session.files,
        }
    }

    /// Whether the root is the machine's `/`: then `proc` and `sys` are the running kernel's.
    pub(super) fn is_system_root(&self) -> bool {
        self.files.root.is_system_root()
    }

    /// The file's text; `None` when it (or a parent) does not exist. Read for the host's own
    /// checks ([`crate::rootfs::RootFs::read_for_host`]): a file with more than one name is
    /// read too (on OSTree hosts every file in `usr` is one), as no phase gets its bytes.
    pub(super) fn read(&self, path: &str) -> Result<Option<String>, String> {
        match self.files.read_for_host(&host_path(path)?) {
            Ok(bytes) => Ok(Some(String::from_utf8_lossy(&bytes).into_owned())),
            Err(Error::NotFound(_)) => Ok(None),
            Err(e) => Err(refused(path, e)),
        }
    }

    /// What is at `path`, its last component not followed.
    pub(super) fn entry(&self, path: &str) -> Result<Entry, String> {
        let p = host_path(path)?;
        let stat = self.files.lstat(&p).map_err(|e| refused(path, e))?;
        Ok(match stat.map(|s| s.kind) {
            None => Entry::Missing,
            Some(EntryKind::File) => Entry::File,
            Some(EntryKind::Dir) => Entry::Dir,
            Some(EntryKind::Other) => Entry::Other,
            Some(EntryKind::Symlink) => {
                Entry::Link(self.files.read_link(&p).map_err(|e| refused(path, e))?)
            }
        })
    }

    /// The names in the directory `path`; `None` when it does not exist.
    pub(super) fn list(&self, path: &str) -> Result<Option<Vec<String>>, String> {
        match self.entry(path)? {
            Entry::Missing => Ok(None),
            Entry::Dir => self
                .files
                .list(&host_path(path)?)
                .map(|entries| Some(entries.into_iter().map(|(n, _)| n).collect()))
                .map_err(|e| refused(path, e)),
            Entry::Link(to) => Err(format!(
                "{path} is a symlink to {to}; preflight follows no link beneath the root"
            )),
            Entry::File | Entry::Other => Err(format!("{path} is not a directory")),
        }
    }

    /// `proc/net/<file>`: read through procfs's `proc/net -> self/net` link as
    /// `proc/<pid>/net/<file>` (this process), and refused through any other link. Returns
    /// the path read and its text (`None`: not there).
    pub(super) fn proc_net(&self, file: &str) -> Result<(String, Option<String>), String> {
        let path = match self.entry("proc/net")? {
            Entry::Link(to) if to == "self/net" => {
                format!("proc/{}/net/{file}", std::process::id())
            }
            Entry::Link(to) => {
                return Err(format!(
                    "proc/net is a symlink to {to}; preflight follows none but procfs's own self/net"
                ));
            }
            _ => format!("proc/net/{file}"),
        };
        let text = self.read(&path)?;
        Ok((path, text))
    }

    /// Bytes available to unprivileged users on the filesystem holding `path`, or on that of
    /// its nearest existing parent (a fresh host has no version directory yet); with the
    /// directory measured. Each directory is opened without following links.
    pub(super) fn available_bytes(&self, path: &str) -> Result<(String, u64), String> {
        let mut at = Some(host_path(path)?);
        loop {
            let shown = at
                .as_ref()
                .map_or_else(|| ".".to_string(), |p| p.to_string());
            if let Some(p) = &at {
                match self.entry(p.as_str())? {
                    Entry::Missing => {
                        at = p.parent();
                        continue;
                    }
                    Entry::Dir => {}
                    Entry::Link(to) => {
                        return Err(format!(
                            "{p} is a symlink to {to}; preflight follows no link beneath the root"
                        ));
                    }
                    Entry::File | Entry::Other => return Err(format!("{p} is not a directory")),
                }
            }
            let dir = self
                .files
                .root
                .open_dir_nofollow(at.as_ref())
                .map_err(|e| format!("{shown}: {e}"))?;
            let st = rustix::fs::fstatvfs(&dir).map_err(|e| format!("statvfs {shown}: {e}"))?;
            return Ok((shown, st.f_bavail.saturating_mul(st.f_frsize)));
        }
    }
}
