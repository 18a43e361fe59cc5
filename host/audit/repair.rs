//! What the writer does with a trail it finds damaged: it never hides the damage, never
//! numbers a record below one that existed, and never cuts more than a torn record.
//!
//! # Background
//! A writer reads the log back when it opens the trail and whenever another process appended
//! since its own last record. What it can find, and what it does:
//! - a torn last line (a writer killed mid-`write`): removed, when at most
//!   [`limits::MAX_TORN_BYTES`], and recorded (`torn-tail`); a longer one is refused, so a
//!   writer is never the tool that cuts a log;
//! - a log that ends before the head, or before a record this writer has written or read
//!   (`log-behind-head`): a repair record numbered after the highest known `seq`, chained to
//!   the real last record, with the missing `seq`s as its `gap`;
//! - a head naming another record than the log holds at its `seq` (`head-mismatch`), no head
//!   beside a log (`head-missing`), a head file that is not a head (`head-invalid`), a log that
//!   does not start at the head's floor (`floor-mismatch`): a repair record saying what was
//!   found, then the chain continues.
//!
//! Every repair but `torn-tail` is a `break` for `audit verify` (exit 1): the note is the
//! evidence, and the agent keeps working.

use super::chain::{Gap, file_names};
use super::dir::FileMode;
use super::entry::{Event, ZERO_HASH};
use super::files::{self, seq_at_start, seq_of};
use super::head::{Head, HeadError};
use super::lines::{Lines, last_line};
use super::trail::{AuditTrail, Tail, TrailError, guard, io_at};
use super::{chain, limits};
use std::fs::File;

fn repair(kind: &str, detail: String, gap: Option<Gap>) -> Event {
    Event::Repair {
        repair: kind.into(),
        detail,
        gap,
    }
}

/// Appends a repair record `kind` saying `detail` (under the log lock).
fn note(trail: &AuditTrail, kind: &str, detail: String) -> Result<(), TrailError> {
    tracing::warn!(target: "nodeward::audit", "audit log {}: {kind}: {detail}", trail.dir.path().display());
    trail
        .append_locked(&trail.run_id, repair(kind, detail, None))
        .map(drop)
}

/// Reads back the active file's last record (`file`, inode `ino`, `len` bytes), repairing on
/// the way (see the module doc); the record the next one chains to.
pub(super) fn read_tail(
    trail: &AuditTrail,
    file: &File,
    ino: u64,
    len: u64,
) -> Result<Option<Tail>, TrailError> {
    let path = trail.active();
    let (last, torn) = last_line(file, len, &path)?;
    let len = len - torn.unwrap_or(0);
    if let Some(torn) = torn {
        file.set_len(len).map_err(io_at(&path))?;
        file.sync_data().map_err(io_at(&path))?;
        tracing::warn!(
            target: "nodeward::audit",
            "{}: removed a torn last record ({torn} bytes): a writer was cut off mid-write",
            path.display()
        );
    }
    let line = match last {
        Some(l) => Some(l),
        None => newest_rotated_line(trail)?,
    };
    let tail = line
        .map(|l| AuditTrail::tail_of(&l, &path, ino, len))
        .transpose()?;
    let (high, floor) = {
        let mut state = guard(&trail.state);
        state.tail = tail.clone();
        (state.high, state.floor)
    };
    let real = tail.as_ref().map_or(0, |t| t.seq);
    if real < high {
        let gap = Gap {
            first: if tail.is_some() {
                real + 1
            } else {
                floor.max(1)
            },
            last: high,
        };
        let detail = format!(
            "the log ends at seq {real}, but seq {high} was written (the head or this writer \
             names it): seq {}..{high} were removed; continuing after seq {high}, chained to \
             the last record there is",
            gap.first
        );
        tracing::warn!(target: "nodeward::audit", "audit log {}: {detail}", trail.dir.path().display());
        let prev = tail.as_ref().map_or(ZERO_HASH, |t| t.hash.as_str());
        trail.append_to(
            file,
            Some((high, prev)),
            &trail.run_id,
            repair("log-behind-head", detail, Some(gap)),
        )?;
        guard(&trail.state).gap = Some(gap);
    } else {
        guard(&trail.state).high = real;
    }
    if let Some(torn) = torn {
        let after = guard(&trail.state).tail.clone();
        trail.append_to(
            file,
            after.as_ref().map(|t| (t.seq, t.hash.as_str())),
            &trail.run_id,
            repair(
                chain::TORN_TAIL,
                format!(
                    "removed {torn} bytes of a record cut off mid-write at the end of {}",
                    path.display()
                ),
                None,
            ),
        )?;
    }
    Ok(guard(&trail.state).tail.clone())
}

/// The last line of `audit.jsonl.1` (the active file is empty after a rotation).
fn newest_rotated_line(trail: &AuditTrail) -> Result<Option<Vec<u8>>, TrailError> {
    let name = format!("{}.1", chain::ACTIVE);
    let path = trail.dir.join(&name);
    match trail.dir.file(&name, FileMode::Read) {
        Ok(f) => {
            let n = f.metadata().map_err(io_at(&path))?.len();
            match last_line(&f, n, &path)? {
                (line, None) => Ok(line),
                (_, Some(torn)) => Err(TrailError::Tail {
                    path,
                    detail: format!("a rotated file ends in {torn} bytes without a line end"),
                }),
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_at(&path)(e)),
    }
}

/// The checks of [`AuditTrail::open`] (under the log lock; see the module doc). Whatever they
/// found is noted in the log; the next head takes its floor from where the log now starts.
pub(super) fn check_open(trail: &AuditTrail) -> Result<(), TrailError> {
    let (head, invalid) = match read_head(trail)? {
        HeadState::Present(h) => (Some(h), None),
        HeadState::Missing => (None, None),
        HeadState::Invalid(why) => (None, Some(why)),
    };
    if let Some(h) = &head {
        let mut state = guard(&trail.state);
        state.high = h.seq;
        state.floor = h.floor;
    }
    let file = trail.open_active()?;
    let tail = trail.tail_locked(&file)?;
    let first = files::first_seq(&trail.dir)?;
    let Some(h) = head else {
        let Some(t) = &tail else {
            // No record anywhere: a new trail. Its head comes first, durably, so that a log
            // beside no head is only ever a head removed (see `docs/audit.md`).
            if let Some(why) = invalid {
                tracing::warn!(
                    target: "nodeward::audit",
                    "audit head {}: not a head ({why}), beside a log that holds no record: \
                     replacing it",
                    trail.config.head.display()
                );
            }
            Head::genesis().write(&trail.config.head)?;
            crate::test_hooks::abort_at("audit:after-genesis");
            return Ok(());
        };
        let path = trail.config.head.display();
        let (kind, what) = match invalid {
            Some(why) => (
                "head-invalid",
                format!("the head at {path} is not a head ({why})"),
            ),
            None => ("head-missing", format!("no head at {path}")),
        };
        note(
            trail,
            kind,
            format!(
                "{what} while the log holds seq {}..{}: the head was removed or damaged, or \
                 the log was put here (a writer makes the head before the first record); \
                 continuing after the last record",
                first.unwrap_or(t.seq),
                t.seq
            ),
        )?;
        return Ok(());
    };
    if h.names_no_record() && h.hash != ZERO_HASH {
        note(
            trail,
            "head-mismatch",
            "the head names seq 0 (no record yet) with a hash that is not the zero hash: it is \
             no head a writer wrote"
                .into(),
        )?;
    }
    let gap = guard(&trail.state).gap;
    if !h.names_no_record() && gap.is_none_or(|g| g.last < h.seq) {
        let found = record_hash(trail, tail.as_ref(), h.seq)?;
        if found.as_deref() != Some(h.hash.as_str()) {
            let what = if found.is_some() {
                "holds another record there (its sha256 differs): it was edited, or the log \
                 replaced"
            } else {
                "holds no record with that seq: it was removed, or the log replaced"
            };
            note(
                trail,
                "head-mismatch",
                format!("the head names seq {}, but the log {what}", h.seq),
            )?;
        }
    }
    let Some(first) = first else { return Ok(()) };
    let break_starts_log = gap.is_some_and(|g| g.last.checked_add(1) == Some(first));
    if !h.allows_first(first) && !break_starts_log {
        note(
            trail,
            "floor-mismatch",
            format!(
                "the log starts at seq {first}, but the head's floor is seq {}: records were \
                 removed from its start, or the log was replaced",
                h.floor
            ),
        )?;
    }
    Ok(())
}

/// The head file as the writer finds it.
pub(super) enum HeadState {
    /// A head.
    Present(Head),
    /// No head file.
    Missing,
    /// A file that is not a head (why): damage, noted like a missing head, never fatal.
    Invalid(String),
}

/// The head at the trail's head path; an error only when it cannot be read at all (a link,
/// a FIFO, an I/O error).
pub(super) fn read_head(trail: &AuditTrail) -> Result<HeadState, TrailError> {
    match Head::read(&trail.config.head) {
        Ok(Some(h)) => Ok(HeadState::Present(h)),
        Ok(None) => Ok(HeadState::Missing),
        Err(HeadError::Invalid { source, .. }) => Ok(HeadState::Invalid(source.to_string())),
        Err(e) => Err(e.into()),
    }
}

/// A head gone (or damaged) while this run writes: noted before the next head is written.
pub(super) fn note_head_gone(trail: &AuditTrail, state: &HeadState) -> Result<(), TrailError> {
    let (kind, what) = match state {
        HeadState::Present(_) => return Ok(()),
        HeadState::Missing => ("head-missing", "was removed".to_string()),
        HeadState::Invalid(why) => ("head-invalid", format!("was damaged ({why})")),
    };
    note(
        trail,
        kind,
        format!(
            "the head at {} {what} while run {} was writing; continuing",
            trail.config.head.display(),
            trail.run_id
        ),
    )
}

/// The hash of the record numbered `seq`, from `tail` or the newest file that can hold it.
fn record_hash(
    trail: &AuditTrail,
    tail: Option<&Tail>,
    seq: u64,
) -> Result<Option<String>, TrailError> {
    if let Some(t) = tail.filter(|t| t.seq == seq) {
        return Ok(Some(t.hash.clone()));
    }
    let names = file_names(&trail.dir).map_err(io_at(trail.dir.path()))?;
    for name in names.iter().rev() {
        if seq_at_start(&trail.dir, name)?.is_none_or(|start| start > seq) {
            continue;
        }
        let path = trail.dir.join(name);
        let file = trail.dir.file(name, FileMode::Read).map_err(io_at(&path))?;
        for line in Lines::new(&file, limits::MAX_LINE_BYTES) {
            let line = line.map_err(io_at(&path))?;
            if let Some(bytes) = line.bytes.filter(|_| line.complete)
                && seq_of(&bytes) == Some(seq)
            {
                return Ok(Some(chain::line_hash(&bytes)));
            }
        }
        return Ok(None);
    }
    Ok(None)
}
