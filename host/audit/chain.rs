//! The hash chain: what makes the trail tamper-evident, and [`verify`], which checks it.
//!
//! # Background
//! Every record carries `seq` (its position, from 1, without gaps) and `prev`, the sha256 of
//! the previous record's line (its exact bytes without the newline; 64 zeros before the first
//! record ever). Editing a record changes its hash, so the next record's `prev` no longer
//! matches; removing, inserting or reordering records breaks the `seq` sequence or a `prev`.
//! The chain runs across rotation: the first record of `audit.jsonl` names the last of
//! `audit.jsonl.1`.
//!
//! The end of the chain cannot vouch for itself: a log cut after record N is a valid chain. So
//! the writer records the chain's head (`seq` and the hash of that record's line) in the
//! agent's state beneath the host root, durably, whenever it makes the log durable (at each
//! phase end, run start and end, and bundle-store record): [`Head`]. A log that ends before the
//! head was truncated.
//!
//! # Caveats
//! - Retention drops the oldest rotated file, so the first surviving record's `prev` names a
//!   record that is gone: [`verify`] accepts that and reports `retainedFrom`. Records removed
//!   from the start of the oldest surviving file look the same.
//! - Records written after the last head update (the calls of a phase that has not ended yet)
//!   are covered by the chain but not by the head: removing them from the tail is detected
//!   only once a later record or head names them.
//! - Whoever can write both the log and the head (root on the host) can rewrite a consistent
//!   history. The journal copy (under systemd) and shipping the log off the host are the
//!   defence against that; the chain makes any *partial* edit evident.

use super::entry::ZERO_HASH;
use crate::durable;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::io;
use std::path::{Path, PathBuf};

/// The active file's name; rotated ones are `audit.jsonl.1` (newest) … `.N` (oldest).
pub const ACTIVE: &str = "audit.jsonl";

/// sha256 (hex) of one line's bytes (without its newline).
pub fn line_hash(line: &[u8]) -> String {
    hex::encode(Sha256::digest(line))
}

/// The chain's head as the writer last made it durable.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Head {
    /// The last durable record's `seq`.
    pub seq: u64,
    /// sha256 of that record's line.
    pub hash: String,
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

impl Head {
    /// The head recorded at `path`; `None` when there is none yet.
    pub fn read(path: &Path) -> Result<Option<Head>, HeadError> {
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(source) => {
                return Err(HeadError::Io {
                    path: path.to_path_buf(),
                    source,
                });
            }
        };
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|source| HeadError::Invalid {
                path: path.to_path_buf(),
                source,
            })
    }

    /// Replaces the head at `path` durably (temp file, fsync, rename, directory fsync),
    /// creating its directory when missing.
    pub fn write(&self, path: &Path) -> Result<(), HeadError> {
        let io_err = |source| HeadError::Io {
            path: path.to_path_buf(),
            source,
        };
        let (dir, name) = match (path.parent(), path.file_name().and_then(|n| n.to_str())) {
            (Some(d), Some(n)) => (d, n),
            _ => return Err(io_err(io::Error::other("not a file path"))),
        };
        std::fs::create_dir_all(dir).map_err(io_err)?;
        let dir = durable::open_dir(dir).map_err(io_err)?;
        let mut text = serde_json::to_vec(self).map_err(|e| io_err(io::Error::other(e)))?;
        text.push(b'\n');
        durable::write_file(&dir, name, &text, 0o640, "audit").map_err(io_err)
    }
}

/// The trail's files in `dir`, oldest first (`audit.jsonl.N` … `.1`, then `audit.jsonl`); only
/// those that exist.
pub fn files(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let mut rotated: Vec<(u64, PathBuf)> = Vec::new();
    let mut active = None;
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if name == ACTIVE {
            active = Some(entry.path());
        } else if let Some(n) = name
            .strip_prefix(ACTIVE)
            .and_then(|r| r.strip_prefix('.'))
            .and_then(|n| n.parse::<u64>().ok())
        {
            rotated.push((n, entry.path()));
        }
    }
    rotated.sort_by_key(|r| std::cmp::Reverse(r.0));
    let mut out: Vec<PathBuf> = rotated.into_iter().map(|(_, p)| p).collect();
    out.extend(active);
    Ok(out)
}

/// One line of the trail as the chain sees it.
#[derive(Clone, Debug)]
pub struct Link {
    /// The file it is in.
    pub file: PathBuf,
    /// Its line number in that file, from 1.
    pub line: usize,
    /// Its `seq`, when it has one.
    pub seq: Option<u64>,
    /// Its `prev`, when it has one.
    pub prev: Option<String>,
    /// sha256 of its bytes.
    pub hash: String,
}

/// A torn last line: the file, and how many bytes follow its last newline.
pub type Torn = (PathBuf, usize);

/// Every complete line of the trail in `dir`, oldest first, and the bytes of a torn last line
/// (one without its newline) if the active file ends in one.
pub fn links(dir: &Path) -> io::Result<(Vec<Link>, Option<Torn>)> {
    let mut out = Vec::new();
    let mut torn = None;
    let files = files(dir)?;
    let last = files.len().saturating_sub(1);
    for (i, file) in files.iter().enumerate() {
        let bytes = std::fs::read(file)?;
        let mut lines: Vec<&[u8]> = bytes.split(|b| *b == b'\n').collect();
        // `split` yields an empty piece after a final newline; any other last piece is torn.
        if let Some(tail) = lines.pop()
            && !tail.is_empty()
            && i == last
        {
            torn = Some((file.clone(), tail.len()));
        }
        for (n, line) in lines.into_iter().enumerate() {
            let value: Option<serde_json::Value> = serde_json::from_slice(line).ok();
            out.push(Link {
                file: file.clone(),
                line: n + 1,
                seq: value.as_ref().and_then(|v| v.get("seq")?.as_u64()),
                prev: value
                    .as_ref()
                    .and_then(|v| Some(v.get("prev")?.as_str()?.to_string())),
                hash: line_hash(line),
            });
        }
    }
    Ok((out, torn))
}

/// Where the chain breaks, and how.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Problem {
    /// The file of the first bad record (the active file for a truncated tail).
    pub file: String,
    /// Its line, from 1 (0: the file is empty or gone).
    pub line: usize,
    /// Its `seq` (for a truncated tail: the head's).
    pub seq: Option<u64>,
    /// `unparseable`, `missing`, `out-of-order`, `edited`, `bad-start`, `truncated` or
    /// `head-mismatch`.
    pub reason: &'static str,
    /// What was found, for people.
    pub detail: String,
}

/// What [`verify`] found.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Verdict {
    /// Whether the chain is whole and reaches the head.
    pub ok: bool,
    /// Complete records read.
    pub records: usize,
    /// The trail's files, oldest first.
    pub files: Vec<String>,
    /// The first record's `seq` when it is not 1: older records were dropped by rotation.
    pub retained_from: Option<u64>,
    /// The last record's `seq`.
    pub last_seq: Option<u64>,
    /// The head the writer recorded, if any.
    pub head: Option<Head>,
    /// The first bad record, when `ok` is false.
    pub problem: Option<Problem>,
    /// What is not a break but an auditor should know (no head yet, a torn last line).
    pub warnings: Vec<String>,
}

/// Checks the chain of the trail in `dir` against the head at `head_path` (see the module
/// doc): every `seq` one more than the one before, every `prev` the previous line's hash, the
/// first record ever `prev` zeros (or a later one: retention), and the log reaching the head.
pub fn verify(dir: &Path, head_path: &Path) -> Result<Verdict, VerifyError> {
    let (links, torn) = links(dir).map_err(|source| VerifyError::Read {
        dir: dir.to_path_buf(),
        source,
    })?;
    let head = Head::read(head_path)?;
    let files = files(dir)
        .map_err(|source| VerifyError::Read {
            dir: dir.to_path_buf(),
            source,
        })?
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    let mut verdict = Verdict {
        ok: true,
        records: links.len(),
        files,
        retained_from: None,
        last_seq: links.last().and_then(|l| l.seq),
        head: head.clone(),
        problem: None,
        warnings: Vec::new(),
    };
    if let Some((file, bytes)) = &torn {
        verdict.warnings.push(format!(
            "{} ends in a torn record ({bytes} bytes without a newline): a run was cut off \
             mid-write; the next run removes it and says so in a repair record",
            file.display()
        ));
    }
    if head.is_none() && !links.is_empty() {
        verdict.warnings.push(format!(
            "no head recorded at {}: a truncated tail cannot be detected",
            head_path.display()
        ));
    }
    verdict.problem = chain_problem(&links, &mut verdict.retained_from)
        .or_else(|| head.as_ref().and_then(|h| head_problem(dir, &links, h)));
    verdict.ok = verdict.problem.is_none();
    Ok(verdict)
}

/// The first break in `links`, if any; notes a retention boundary in `retained_from`.
fn chain_problem(links: &[Link], retained_from: &mut Option<u64>) -> Option<Problem> {
    let at = |l: &Link, reason, detail: String| Problem {
        file: l.file.display().to_string(),
        line: l.line,
        seq: l.seq,
        reason,
        detail,
    };
    for (i, link) in links.iter().enumerate() {
        let (Some(seq), Some(prev)) = (link.seq, &link.prev) else {
            return Some(at(
                link,
                "unparseable",
                "not a record (no seq or prev): edited or inserted".into(),
            ));
        };
        let Some(before) = i.checked_sub(1).map(|j| &links[j]) else {
            if seq == 1 && prev != ZERO_HASH {
                return Some(at(
                    link,
                    "bad-start",
                    "the first record's prev is not zeros".into(),
                ));
            }
            if seq != 1 {
                *retained_from = Some(seq);
            }
            continue;
        };
        let expected = before.seq.unwrap_or(0) + 1;
        if seq != expected {
            let later = links[i..].iter().any(|l| l.seq == Some(expected));
            let (reason, detail) = if seq < expected || later {
                (
                    "out-of-order",
                    format!("seq {seq} where {expected} belongs: records inserted or reordered"),
                )
            } else {
                (
                    "missing",
                    format!("seq {seq} follows {}: record(s) removed", expected - 1),
                )
            };
            return Some(at(link, reason, detail));
        }
        if *prev != before.hash {
            return Some(at(
                before,
                "edited",
                format!(
                    "its sha256 does not match the prev of the record after it (seq {seq}): \
                     it was edited, or that one was inserted"
                ),
            ));
        }
    }
    None
}

/// Whether the log reaches `head` and the record there is the one the head names.
fn head_problem(dir: &Path, links: &[Link], head: &Head) -> Option<Problem> {
    if links
        .first()
        .and_then(|l| l.seq)
        .is_some_and(|first| head.seq < first)
    {
        // The head names a record retention dropped since: nothing to compare.
        return None;
    }
    match links.iter().find(|l| l.seq == Some(head.seq)) {
        Some(l) if l.hash == head.hash => None,
        Some(l) => Some(Problem {
            file: l.file.display().to_string(),
            line: l.line,
            seq: l.seq,
            reason: "head-mismatch",
            detail: format!(
                "the head names seq {} with another sha256: this record was edited",
                head.seq
            ),
        }),
        None => {
            let last = links.last();
            Some(Problem {
                file: last.map_or_else(
                    || dir.join(ACTIVE).display().to_string(),
                    |l| l.file.display().to_string(),
                ),
                line: last.map_or(0, |l| l.line),
                seq: Some(head.seq),
                reason: "truncated",
                detail: format!(
                    "the log ends at seq {} before the head's seq {}: records were removed \
                     from its end",
                    last.and_then(|l| l.seq)
                        .map_or("none".into(), |s| s.to_string()),
                    head.seq
                ),
            })
        }
    }
}

/// Why the trail could not be verified at all.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    /// A file of the trail could not be read.
    #[error("reading the audit trail in {dir}: {source}")]
    Read {
        /// The trail's directory.
        dir: PathBuf,
        /// The failure.
        #[source]
        source: io::Error,
    },
    /// The head could not be read.
    #[error(transparent)]
    Head(#[from] HeadError),
}
