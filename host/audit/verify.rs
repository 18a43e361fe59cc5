//! `nodeward audit verify`: [`verify`] walks the trail's files oldest first, line by line, with
//! the chain's rules ([`super::chain::Checker`]), and holds the ends of the chain against the
//! head ([`super::head::Head`]).
//!
//! # What fails
//! In this order, the first found is the verdict's problem (exit 1):
//! 1. `head-missing`: a log, and no head where the writer keeps it (the head was removed, or the
//!    log was put here: a writer makes the head before the first record, so no crash leaves
//!    this);
//! 2. a break of the chain itself: `unparseable`, `too-long`, `missing`, `out-of-order`,
//!    `edited`, `bad-start`;
//! 3. `head-before-log`: the head names a record before the log's first (the log was cut at
//!    its start past the head, or replaced);
//! 4. `floor-mismatch`: the log starts after the head's floor (records removed from its start
//!    that rotation did not drop) or before it (the log was replaced);
//! 5. `truncated` (the log ends before the head) and `head-mismatch` (the record there is
//!    another); a head that names no record yet (`seq` 0, written before the first record)
//!    is reached by any log that starts at its floor;
//! 6. `break`: a `repair` record in which the writer noted damage it found (every one is also
//!    a warning).
//!
//! A torn last line of at most [`limits::MAX_TORN_BYTES`] is a warning (a writer cut off; the
//! next one removes it); a longer one is `too-long`.

use super::chain::{ACTIVE, Checker, Link, Problem, file_names};
use super::dir::{Access, FileMode, TrailDir};
use super::entry::ZERO_HASH;
use super::head::{Head, HeadError};
use super::limits;
use super::lines::Lines;
use serde::Serialize;
use std::io;
use std::path::{Path, PathBuf};

/// What [`verify`] found.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Verdict {
    /// Whether the chain is whole, starts where the head's floor says and reaches the head.
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
    /// What an auditor should know besides: a torn last line, every `break`.
    pub warnings: Vec<String>,
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

/// Checks the trail in `dir` against the head at `head_path` (see the module doc).
pub fn verify(dir: &Path, head_path: &Path) -> Result<Verdict, VerifyError> {
    let read_err = |source| VerifyError::Read {
        dir: dir.to_path_buf(),
        source,
    };
    let head = Head::read(head_path)?;
    let trail = TrailDir::open(dir, Access::Read).map_err(read_err)?;
    let names = match &trail {
        Some(t) => file_names(t).map_err(read_err)?,
        None => Vec::new(),
    };
    let mut checker = Checker::new(head.as_ref().map(|h| h.seq));
    let mut warnings = Vec::new();
    let mut records = 0;
    if let Some(trail) = &trail {
        for (i, name) in names.iter().enumerate() {
            let path = trail.join(name);
            let file = trail.file(name, FileMode::Read).map_err(read_err)?;
            for line in Lines::new(&file, limits::MAX_LINE_BYTES) {
                let line = line.map_err(|e| read_err(super::dir::at(&path, e)))?;
                let at = |reason, detail| Problem {
                    file: path.display().to_string(),
                    line: line.number,
                    seq: None,
                    reason,
                    detail,
                };
                if !line.complete
                    && i + 1 == names.len()
                    && line.len <= limits::MAX_TORN_BYTES as u64
                {
                    warnings.push(format!(
                        "{} ends in a torn record ({} bytes without a newline): a run was cut \
                         off mid-write; the next run removes it and says so in a repair record",
                        path.display(),
                        line.len
                    ));
                } else if !line.complete {
                    checker.bad(at(
                        "too-long",
                        format!(
                            "{} bytes without a newline: not a record cut off mid-write",
                            line.len
                        ),
                    ));
                } else if let Some(bytes) = &line.bytes {
                    records += 1;
                    checker.push(Link::parse(&path, line.number, bytes));
                } else {
                    records += 1;
                    checker.bad(at(
                        "too-long",
                        format!(
                            "a line of {} bytes, longer than any record ({} at most): not read",
                            line.len,
                            limits::MAX_LINE_BYTES
                        ),
                    ));
                }
            }
        }
    }
    warnings.extend(checker.breaks.iter().map(|b| {
        format!(
            "{}:{} (seq {}): {}",
            b.file,
            b.line,
            b.seq.unwrap_or(0),
            b.detail
        )
    }));
    let first_seq = checker.first.as_ref().and_then(|l| l.seq);
    let active = dir.join(ACTIVE);
    let problem = match &head {
        None if checker.first.is_some() => Some(Problem {
            file: head_path.display().to_string(),
            line: 0,
            seq: None,
            reason: "head-missing",
            detail: format!(
                "the log holds records, but there is no head at {}: it was removed, or the \
                 log was put here; its end and start cannot be vouched for",
                head_path.display()
            ),
        }),
        _ => None,
    }
    .or_else(|| checker.problem.clone())
    .or_else(|| head.as_ref().and_then(|h| start_problem(&checker, h)))
    .or_else(|| {
        head.as_ref()
            .and_then(|h| end_problem(&checker, h, &active, head_path))
    })
    .or_else(|| checker.breaks.first().cloned());
    Ok(Verdict {
        ok: problem.is_none(),
        records,
        files: names
            .iter()
            .map(|n| dir.join(n).display().to_string())
            .collect(),
        retained_from: first_seq.filter(|s| *s != 1),
        last_seq: checker.last.as_ref().and_then(|l| l.seq),
        head,
        problem,
        warnings,
    })
}

/// Whether the log starts where the head says (see the module doc).
fn start_problem(checker: &Checker, head: &Head) -> Option<Problem> {
    let first = checker.first.as_ref()?;
    let seq = first.seq?;
    // A head that names no record yet (written before the first one) vouches only for where
    // the log starts: its floor.
    if head.seq < seq && !head.names_no_record() {
        return Some(Problem::at(
            first,
            "head-before-log",
            format!(
                "the head names seq {}, but the log starts at seq {seq}: the log was cut at its \
                 start or replaced",
                head.seq
            ),
        ));
    }
    if head.allows_first(seq) {
        return None;
    }
    let detail = if seq > head.floor {
        format!(
            "the log starts at seq {seq}, but rotation dropped only the records before seq {}: \
             records were removed from its start",
            head.floor
        )
    } else {
        format!(
            "the log starts at seq {seq}, before the head's floor (seq {}), which rotation had \
             already dropped: the log was replaced",
            head.floor
        )
    };
    Some(Problem::at(first, "floor-mismatch", detail))
}

/// Whether the log reaches the head and the record there is the one the head names.
fn end_problem(checker: &Checker, head: &Head, active: &Path, head_path: &Path) -> Option<Problem> {
    if head.names_no_record() {
        // Every record of the log came after it (a crash before the first head update leaves
        // that); its hash can only be the one before the first record.
        return (head.hash != ZERO_HASH).then(|| Problem {
            file: head_path.display().to_string(),
            line: 0,
            seq: Some(0),
            reason: "head-mismatch",
            detail: "the head names seq 0 (no record yet) with a hash that is not the zero \
                     hash: it is no head a writer wrote"
                .into(),
        });
    }
    match &checker.found {
        Some(l) if l.hash == head.hash => None,
        Some(l) => Some(Problem::at(
            l,
            "head-mismatch",
            format!(
                "the head names seq {} with another sha256: this record was edited",
                head.seq
            ),
        )),
        None => {
            let last = checker.last.as_ref();
            Some(Problem {
                file: last.map_or_else(
                    || active.display().to_string(),
                    |l| l.file.display().to_string(),
                ),
                line: last.map_or(0, |l| l.line),
                seq: Some(head.seq),
                reason: "truncated",
                detail: match last.and_then(|l| l.seq) {
                    Some(s) if s > head.seq => format!(
                        "the log holds no record with the head's seq {}: it was removed",
                        head.seq
                    ),
                    s => format!(
                        "the log ends at seq {} before the head's seq {}: records were \
                         removed from its end",
                        s.map_or("none".into(), |s| s.to_string()),
                        head.seq
                    ),
                },
            })
        }
    }
}
