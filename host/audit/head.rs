//! [`Head`]: what the trail's writer last made durable, kept apart from the log, and the one
//! name it is kept under ([`head_path`]).
//!
//! # Background
//! The end of a hash chain cannot vouch for itself (a log cut after record N is a valid
//! chain), nor can its start (a log whose first records were removed looks like one whose
//! oldest file rotation dropped). So the writer records, in the agent's state directory,
//! durably, whenever it makes the log durable:
//! - `seq` and `hash`: the last durable record, so a log that ends before it, or holds another
//!   record there, was cut or edited;
//! - `floor`: the first `seq` the log still holds, moved only by the writer's own rotation, so
//!   a log that starts later lost records retention did not drop, and one that starts earlier
//!   was replaced;
//! - `pendingFloor`: while a rotation that drops the oldest file is under way, the floor it
//!   moves to; a crash mid-rotation leaves a log that starts at either.
//!
//! A trail's head exists before its first record: the writer of a trail that holds no record
//! writes the [`Head::genesis`] first (`seq` 0, the zero hash the first record's `prev` names),
//! durably, and only then appends. So a log beside no head is never what a crash leaves: it
//! is a head removed, or a log put there (`docs/audit.md` walks every kill point).
//!
//! # Guarantees
//! - One trail has one head file: `<heads>/<16 hex digits>.json`, the digits from the sha256
//!   of the log directory's real path (links and `..` resolved), so every spelling of the same
//!   directory finds the same head, and two roots sharing a state directory never share one.
//! - The head is replaced durably (temp file, fsync, rename, directory fsync); a heads
//!   directory made for it is fsynced into the state directory.
//! - A head file that is a link, a FIFO, larger than [`MAX_HEAD_BYTES`] or not a head is an
//!   error naming it, never followed or waited on.

use super::dir::{Access, FileMode, TrailDir};
use super::entry::ZERO_HASH;
use crate::durable;
use serde::{Deserialize, Serialize};
use std::io::{self, Read as _};
use std::path::{Component, Path, PathBuf};

/// Largest head file read (a head is about 150 bytes).
pub const MAX_HEAD_BYTES: u64 = 4096;

/// The chain's head as the writer last made it durable (see the module doc).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Head {
    /// The last durable record's `seq`.
    pub seq: u64,
    /// sha256 of that record's line.
    pub hash: String,
    /// The first `seq` the log holds: 1 until rotation dropped a file, then the first record
    /// of the oldest file kept.
    pub floor: u64,
    /// While a rotation that drops the oldest file is under way: the floor it moves to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_floor: Option<u64>,
}

/// Why the head could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum HeadError {
    /// Reading or writing the file failed.
    #[error("audit head {path}: {source}")]
    Io {
        /// The head file.
        path: PathBuf,
        /// The failure.
        #[source]
        source: io::Error,
    },
    /// The file is not a head.
    #[error("audit head {path}: not a valid head: {source}")]
    Invalid {
        /// The head file.
        path: PathBuf,
        /// What serde said.
        #[source]
        source: serde_json::Error,
    },
}

/// The directory and file name of `path`.
fn split(path: &Path) -> io::Result<(&Path, &str)> {
    match (path.parent(), path.file_name().and_then(|n| n.to_str())) {
        (Some(d), Some(n)) => Ok((
            if d.as_os_str().is_empty() {
                Path::new(".")
            } else {
                d
            },
            n,
        )),
        _ => Err(io::Error::other("not a file path")),
    }
}

impl Head {
    /// The head of a trail that holds no record yet: it names seq 0, whose hash is the `prev`
    /// of the first record ([`ZERO_HASH`]), and the log will start at seq 1.
    pub fn genesis() -> Head {
        Head {
            seq: 0,
            hash: ZERO_HASH.to_string(),
            floor: 1,
            pending_floor: None,
        }
    }

    /// Whether this head names no record (a [`Head::genesis`], or one that claims to be): the
    /// log it vouches for may hold records after it, like after any head, but none before.
    pub fn names_no_record(&self) -> bool {
        self.seq == 0
    }

    /// Whether `first` (the log's first `seq`) is where this head says the log starts.
    pub fn allows_first(&self, first: u64) -> bool {
        first == self.floor || self.pending_floor == Some(first)
    }

    /// The head recorded at `path`; `None` when there is none yet.
    pub fn read(path: &Path) -> Result<Option<Head>, HeadError> {
        let io_err = |source| HeadError::Io {
            path: path.to_path_buf(),
            source,
        };
        let (dir, name) = split(path).map_err(io_err)?;
        let Some(dir) = TrailDir::open(dir, Access::Read).map_err(io_err)? else {
            return Ok(None);
        };
        let file = match dir.file(name, FileMode::Read) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_err(e)),
        };
        let mut bytes = Vec::new();
        file.take(MAX_HEAD_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(io_err)?;
        if bytes.len() as u64 > MAX_HEAD_BYTES {
            return Err(io_err(io::Error::other(format!(
                "longer than {MAX_HEAD_BYTES} bytes: not a head"
            ))));
        }
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|source| HeadError::Invalid {
                path: path.to_path_buf(),
                source,
            })
    }

    /// Replaces the head at `path` durably (see the module doc), making its directory when
    /// missing.
    pub fn write(&self, path: &Path) -> Result<(), HeadError> {
        let io_err = |source| HeadError::Io {
            path: path.to_path_buf(),
            source,
        };
        let (dir, name) = split(path).map_err(io_err)?;
        let dir = TrailDir::open(dir, Access::Write)
            .map_err(io_err)?
            .ok_or_else(|| io_err(io::Error::other("no directory")))?;
        let dir = dir.cap_dir().map_err(io_err)?;
        let mut text = serde_json::to_vec(self).map_err(|e| io_err(io::Error::other(e)))?;
        text.push(b'\n');
        durable::write_file(&dir, name, &text, 0o640, "audit").map_err(io_err)
    }
}

/// The directory of the heads in the agent state directory.
pub const HEADS_DIR: &str = "audit-heads";

/// The head file of the trail in `log_dir`, in the heads directory `heads` (see the module
/// doc: one name per directory, however it is spelled).
pub fn head_path(heads: &Path, log_dir: &Path) -> PathBuf {
    let key = super::chain::line_hash(real_path(log_dir).as_os_str().as_encoded_bytes());
    heads.join(format!("{}.json", &key[..16]))
}

/// `path` absolute, with links, `.` and `..` resolved: the real path of its longest existing
/// prefix, then the rest resolved lexically (a trail directory not made yet).
pub fn real_path(path: &Path) -> PathBuf {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let parts: Vec<Component<'_>> = absolute.components().collect();
    for i in (1..=parts.len()).rev() {
        let prefix: PathBuf = parts[..i].iter().collect();
        if let Ok(mut out) = std::fs::canonicalize(&prefix) {
            for c in &parts[i..] {
                match c {
                    Component::ParentDir => {
                        out.pop();
                    }
                    Component::Normal(n) => out.push(n),
                    _ => {}
                }
            }
            return out;
        }
    }
    absolute
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_spelling_of_a_directory_names_one_head() {
        let tmp = tempfile::tempdir().expect("tmp");
        let real = tmp.path().join("root/var/log");
        std::fs::create_dir_all(&real).expect("dirs");
        std::os::unix::fs::symlink(tmp.path().join("root"), tmp.path().join("alias"))
            .expect("alias");
        let heads = Path::new("/state/audit-heads");
        let one = head_path(heads, &real.join("audit"));
        for other in [
            tmp.path().join("root/var/log/./audit"),
            tmp.path().join("root/var/../var/log/audit"),
            tmp.path().join("alias/var/log/audit"),
            tmp.path().join("root/var/log/audit/x/.."),
        ] {
            assert_eq!(head_path(heads, &other), one, "{}", other.display());
        }
        assert_ne!(head_path(heads, &tmp.path().join("root/var/audit")), one);
    }

    #[test]
    fn a_head_round_trips_and_a_bad_one_is_named() {
        let tmp = tempfile::tempdir().expect("tmp");
        let path = tmp.path().join("state/audit-heads/x.json");
        assert_eq!(Head::read(&path).expect("none yet"), None);
        let h = Head {
            seq: 9,
            hash: "ab".repeat(32),
            floor: 3,
            pending_floor: None,
        };
        h.write(&path).expect("write");
        assert_eq!(Head::read(&path).expect("read"), Some(h));
        std::fs::write(&path, "x".repeat(5000)).expect("big");
        let e = Head::read(&path).expect_err("too big");
        assert!(e.to_string().contains(&path.display().to_string()), "{e}");
        std::fs::write(&path, r#"{"seq":1,"hash":"00"}"#).expect("no floor");
        assert!(matches!(Head::read(&path), Err(HeadError::Invalid { .. })));
    }
}
