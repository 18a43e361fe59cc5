//! The hash chain: what makes the trail tamper-evident, the trail's files, and [`Checker`],
//! which walks the chain record by record ([`super::verify`] runs it over the files).
//!
//! # Background
//! Every record carries `seq` (its position, from 1, without gaps) and `prev`, the sha256 of
//! the previous record's line (its exact bytes without the newline; 64 zeros before the first
//! record ever). Editing a record changes its hash, so the next record's `prev` no longer
//! matches; removing, inserting or reordering records breaks the `seq` sequence or a `prev`.
//! The chain runs across rotation: the first record of `audit.jsonl` names the last of
//! `audit.jsonl.1`.
//!
//! The ends of the chain cannot vouch for themselves; the head does ([`super::head`]).
//!
//! One gap is part of the chain: when the writer finds the log ending before the head (records
//! were removed from its end), it never numbers new records below the head: it writes a
//! `repair` record (`log-behind-head`) whose `gap` names the missing `seq`s, numbered after
//! the head and chained to the real last record. The checker accepts exactly that gap, and
//! reports the record (and every other `repair` but a `torn-tail`) as a `break`: the writer
//! found the trail damaged there.
//!
//! # Caveats
//! - Records written after the last head update (the calls of a phase that has not ended yet)
//!   are covered by the chain but not by the head: removing them from the tail is detected
//!   only once a later record or head names them.
//! - Whoever can write both the log and the head (root on the host) can rewrite a consistent
//!   history. The journal copy (under systemd) and shipping the log off the host are the
//!   defence against that; the chain makes any *partial* edit evident.

use super::dir::TrailDir;
use super::entry::ZERO_HASH;
use serde::Serialize;
use sha2::{Digest, Sha256};
use std::io;
use std::path::{Path, PathBuf};

/// The active file's name; rotated ones are `audit.jsonl.1` (newest) … `.N` (oldest).
pub const ACTIVE: &str = "audit.jsonl";

/// The `repair` kind a crash explains (a line cut off mid-write): no break.
pub const TORN_TAIL: &str = "torn-tail";

/// sha256 (hex) of one line's bytes (without its newline).
pub fn line_hash(line: &[u8]) -> String {
    hex::encode(Sha256::digest(line))
}

/// The trail's file names in `dir`, oldest first (`audit.jsonl.N` … `.1`, then
/// `audit.jsonl`); only those that exist.
pub(crate) fn file_names(dir: &TrailDir) -> io::Result<Vec<String>> {
    let mut rotated: Vec<(u64, String)> = Vec::new();
    let mut active = None;
    for name in dir.names()? {
        if name == ACTIVE {
            active = Some(name);
        } else if let Some(n) = name
            .strip_prefix(ACTIVE)
            .and_then(|r| r.strip_prefix('.'))
            .filter(|n| !n.starts_with('0') && n.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|n| n.parse::<u64>().ok())
        {
            rotated.push((n, name));
        }
    }
    rotated.sort_by_key(|r| std::cmp::Reverse(r.0));
    let mut out: Vec<String> = rotated.into_iter().map(|(_, p)| p).collect();
    out.extend(active);
    Ok(out)
}

/// The trail's files in `dir`, oldest first; none when the directory does not exist.
pub fn files(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let Some(d) = TrailDir::open(dir, super::dir::Access::Read)? else {
        return Ok(Vec::new());
    };
    Ok(file_names(&d)?.iter().map(|n| d.join(n)).collect())
}

/// The `seq`s a `log-behind-head` repair record says are missing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Gap {
    /// The first missing `seq`.
    pub first: u64,
    /// The last missing `seq`.
    pub last: u64,
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
    /// For a `repair` record: its kind (`torn-tail` …) and detail.
    pub repair: Option<(String, String)>,
    /// For a `log-behind-head` repair record: the gap it names.
    pub gap: Option<Gap>,
}

impl Link {
    /// The link of `bytes`, line `line` of `file`.
    pub fn parse(file: &Path, line: usize, bytes: &[u8]) -> Link {
        let value: Option<serde_json::Value> = serde_json::from_slice(bytes).ok();
        let field = |k: &str| value.as_ref().and_then(|v| v.get(k));
        let text = |k: &str| field(k).and_then(|v| Some(v.as_str()?.to_string()));
        let repair = (field("kind").and_then(|k| k.as_str()) == Some("repair"))
            .then(|| Some((text("repair")?, text("detail")?)))
            .flatten();
        Link {
            file: file.to_path_buf(),
            line,
            seq: field("seq").and_then(|v| v.as_u64()),
            prev: text("prev"),
            hash: line_hash(bytes),
            gap: field("gap").and_then(|g| serde_json::from_value(g.clone()).ok()),
            repair,
        }
    }

    /// Whether this record says the writer found the trail damaged (a repair that a crash does
    /// not explain).
    pub fn is_break(&self) -> bool {
        self.repair.as_ref().is_some_and(|(r, _)| r != TORN_TAIL)
    }
}

/// Where the chain breaks, and how.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Problem {
    /// The file of the first bad record (the head file when it is missing; the active file for
    /// a truncated tail).
    pub file: String,
    /// Its line, from 1 (0: the file is empty or gone, or the problem is the head's).
    pub line: usize,
    /// Its `seq` (for a truncated tail: the head's).
    pub seq: Option<u64>,
    /// `unparseable`, `too-long`, `missing`, `out-of-order`, `edited`, `bad-start`,
    /// `truncated`, `head-mismatch`, `head-missing`, `head-before-log`, `floor-mismatch` or
    /// `break`.
    pub reason: &'static str,
    /// What was found, for people.
    pub detail: String,
}

impl Problem {
    /// A problem at `link`.
    pub fn at(link: &Link, reason: &'static str, detail: String) -> Problem {
        Problem {
            file: link.file.display().to_string(),
            line: link.line,
            seq: link.seq,
            reason,
            detail,
        }
    }
}

/// The chain's rules, checked one record at a time (so a trail of any length is checked in
/// constant memory): the first break, the first record, the breaks the writer recorded, and
/// what the head needs.
#[derive(Debug, Default)]
pub struct Checker {
    before: Option<Link>,
    /// The first record.
    pub first: Option<Link>,
    /// The last record.
    pub last: Option<Link>,
    /// The first break of the chain itself.
    pub problem: Option<Problem>,
    /// A `missing` problem is `out-of-order` when the `seq` it missed comes later.
    missing: Option<u64>,
    /// The records that say the writer found the trail damaged, in order.
    pub breaks: Vec<Problem>,
    /// The record at `wanted` (the head's `seq`), if seen.
    pub found: Option<Link>,
    wanted: Option<u64>,
}

impl Checker {
    /// A checker that also looks out for the record numbered `wanted` (the head's).
    pub fn new(wanted: Option<u64>) -> Self {
        Checker {
            wanted,
            ..Checker::default()
        }
    }

    /// A line that is not a record at all (too long to read, or cut off inside the trail):
    /// the first problem, unless there is one.
    pub fn bad(&mut self, problem: Problem) {
        self.problem.get_or_insert(problem);
    }

    /// Checks the next record.
    pub fn push(&mut self, link: Link) {
        if link.seq.is_some() && link.seq == self.missing {
            if let Some(p) = &mut self.problem {
                p.reason = "out-of-order";
                p.detail = format!(
                    "seq {} where {} belongs: records inserted or reordered",
                    p.seq.unwrap_or(0),
                    link.seq.unwrap_or(0)
                );
            }
            self.missing = None;
        }
        if link.seq.is_some() && link.seq == self.wanted {
            self.found = Some(link.clone());
        }
        if link.is_break() {
            let (repair, detail) = link.repair.clone().unwrap_or_default();
            self.breaks.push(Problem::at(
                &link,
                "break",
                format!("the writer found the trail damaged here ({repair}): {detail}"),
            ));
        }
        if self.problem.is_none() {
            self.problem = self.check(&link);
        }
        if self.first.is_none() {
            self.first = Some(link.clone());
        }
        self.last = Some(link.clone());
        self.before = Some(link);
    }

    fn check(&mut self, link: &Link) -> Option<Problem> {
        let (Some(seq), Some(prev)) = (link.seq, &link.prev) else {
            return Some(Problem::at(
                link,
                "unparseable",
                "not a record (no seq or prev): edited or inserted".into(),
            ));
        };
        let Some(before) = &self.before else {
            return (seq == 1 && prev != ZERO_HASH).then(|| {
                Problem::at(
                    link,
                    "bad-start",
                    "the first record's prev is not zeros".into(),
                )
            });
        };
        let Some(expected) = before.seq.and_then(|s| s.checked_add(1)) else {
            return Some(Problem::at(
                link,
                "out-of-order",
                "seq past the last one".into(),
            ));
        };
        let named_gap = link.gap.filter(|g| {
            link.is_break() && g.first == expected && g.last.checked_add(1) == Some(seq)
        });
        if seq != expected && named_gap.is_none() {
            if seq < expected {
                return Some(Problem::at(
                    link,
                    "out-of-order",
                    format!("seq {seq} where {expected} belongs: records inserted or reordered"),
                ));
            }
            self.missing = Some(expected);
            return Some(Problem::at(
                link,
                "missing",
                format!("seq {seq} follows {}: record(s) removed", expected - 1),
            ));
        }
        (*prev != before.hash).then(|| {
            Problem::at(
                before,
                "edited",
                format!(
                    "its sha256 does not match the prev of the record after it (seq {seq}): \
                     it was edited, or that one was inserted"
                ),
            )
        })
    }
}
