//! Closing the runs that ended without their `run-end`: a process that was killed, or crashed,
//! or whose command returned before ending its run. [`close_interrupted_runs`] is the entry
//! point for any command (and the daemon when it starts); every [`AuditTrail::open`] does the
//! same.
//!
//! # Background
//! A run holds `runs/<run-id>.lock` (`flock`) while it lives, from before its `run-start` until
//! after its `run-end` is durable, when it removes the file. A lock file nobody holds is a run
//! that died somewhere in between. Under the log lock, the closer:
//! 1. reads what the dead run recorded (its records, oldest first, across the rotated files);
//! 2. when it recorded anything (its `run-start`, or only the repairs a run notes before it)
//!    and no `run-end`, writes an `interrupted` run end for it:
//!    its calls, denials and changes counted from its records, and in `error` what it had done
//!    (its last record, the phases it ended, its bundle-store changes) and which run found it;
//! 3. removes the lock file.
//!
//! # Guarantees
//! - A run is closed at most once and never contradicted: one whose `run-end` is already in
//!   the log (killed after writing it, before removing its lock file) gets no second one, and
//!   one that wrote no record (killed before its `run-start`) gets none.
//! - Nothing is written when no run is dangling: [`close_interrupted_runs`] opens a run of its
//!   own only when there is one to close.
//!
//! # Caveats
//! A dead run whose records rotation already dropped is not closed in the trail (a summary
//! no longer shows it); its lock file is removed.

use super::chain::file_names;
use super::dir::{Access, FileMode, TrailDir};
use super::entry::{Entry, Event, Outcome};
use super::limits;
use super::lines::Lines;
use super::lock::{dangling, run_id_of};
use super::query::{RunSummary, Summaries};
use super::trail::{AuditTrail, RunInfo, TrailConfig, TrailError, io_at};
use rustix::fs::{FlockOperation, flock};
use std::collections::BTreeMap;

/// One dead run's records, folded as they are read.
#[derive(Default)]
struct Fold {
    records: Summaries,
    last: Option<(u64, &'static str)>,
}

/// A dead run as its records show it.
#[derive(Debug)]
struct DeadRun {
    summary: Option<RunSummary>,
    /// Its last record's `seq` and kind.
    last: Option<(u64, &'static str)>,
}

/// Closes the runs whose processes died (see the module doc) in the trail `config` names, and
/// returns their IDs. When there is one, a run described by `run` is opened to close them and
/// ended at once (`ok`); when there is none, nothing is written. Call it from a command that
/// would otherwise return without opening the trail (`phases install` finding its bundle
/// already current) and when the daemon starts, so a dead run never stays "running".
pub fn close_interrupted_runs(
    config: TrailConfig,
    run: RunInfo,
) -> Result<Vec<String>, TrailError> {
    if !any_dangling(&config)? {
        return Ok(Vec::new());
    }
    let trail = AuditTrail::open(config, run)?;
    let closed = trail.closed_runs();
    trail.end(None, 0, 0, 0)?;
    Ok(closed)
}

/// Whether a run lock file of the trail is held by nobody (read-only: nothing is taken).
fn any_dangling(config: &TrailConfig) -> Result<bool, TrailError> {
    let Some(dir) = TrailDir::open(&config.dir, Access::Read).map_err(io_at(&config.dir))? else {
        return Ok(false);
    };
    let runs_path = dir.join("runs");
    let Some(runs) = TrailDir::open(&runs_path, Access::Read).map_err(io_at(&runs_path))? else {
        return Ok(false);
    };
    for name in runs.names().map_err(io_at(runs.path()))? {
        if run_id_of(&name).is_none() {
            continue;
        }
        // Opened and dropped: the lock taken here, if any, goes with the descriptor.
        if let Ok(file) = runs.file(&name, FileMode::Read)
            && flock(&file, FlockOperation::NonBlockingLockShared).is_ok()
        {
            return Ok(true);
        }
    }
    Ok(false)
}

impl AuditTrail {
    /// Writes an `interrupted` run end for every run whose lock file nobody holds and that
    /// started and did not end in the log, and removes their lock files (under the log lock;
    /// see the module doc). Their IDs are kept ([`AuditTrail::closed_runs`]).
    pub(super) fn close_dangling(&self) -> Result<(), TrailError> {
        let dead = dangling(&self.runs, &self.run_id)?;
        if dead.is_empty() {
            return Ok(());
        }
        let ids: Vec<&str> = dead.iter().map(|(id, _)| id.as_str()).collect();
        let found = self.read_runs(&ids)?;
        for (id, _held) in &dead {
            let run = found.get(id.as_str());
            match run.and_then(|r| r.summary.as_ref()) {
                // Records and no end (a run-start, or only the repairs a run notes before it).
                Some(s) if s.outcome == "running" => {
                    tracing::warn!(
                        target: "nodeward::audit",
                        "run {id} ended without its run-end record (the agent died): recording \
                         it as interrupted"
                    );
                    let event = self.interrupted(s, run.and_then(|r| r.last));
                    self.append_locked(id, event)?;
                    super::trail::guard(&self.closed).push(id.clone());
                }
                Some(s) => {
                    tracing::info!(
                        target: "nodeward::audit",
                        "run {id} ended ({}) but did not remove its lock file: removing it",
                        s.outcome
                    );
                }
                None => tracing::warn!(
                    target: "nodeward::audit",
                    "run {id} left its lock file but no record in the log (it died before \
                     writing one, or rotation dropped them): removing the lock file"
                ),
            }
            let name = format!("{id}.lock");
            self.runs
                .remove(&name)
                .map_err(io_at(&self.runs.join(&name)))?;
        }
        Ok(())
    }

    /// The `interrupted` run end of the dead run `s` (its last record `last`).
    fn interrupted(&self, s: &RunSummary, last: Option<(u64, &'static str)>) -> Event {
        let mut done = match last {
            Some((seq, kind)) => format!(
                "the agent died before the run ended (found by run {}); its last record: seq \
                 {seq} ({kind})",
                self.run_id
            ),
            None => format!(
                "the agent died before the run ended (found by run {})",
                self.run_id
            ),
        };
        if !s.phases.is_empty() {
            done.push_str(&format!("; phases ended: {}", s.phases.join(", ")));
        }
        if !s.bundle_events.is_empty() {
            done.push_str(&format!(
                "; bundle-store changes: {}",
                s.bundle_events.join("; ")
            ));
        }
        Event::RunEnd {
            outcome: Outcome::Interrupted,
            error: Some(super::bound_text(&done, limits::MAX_OUTCOME_BYTES).into_owned()),
            calls: Some(s.calls),
            denied: Some(s.denials),
            changes: Some(s.changes.iter().map(|c| c.count).sum()),
            detected_by: Some(self.run_id.clone()),
        }
    }

    /// What the runs `ids` recorded: every file, oldest first, one line at a time; a line that
    /// is not a record is passed over (`audit verify` reports it; the writer must go on).
    fn read_runs(&self, ids: &[&str]) -> Result<BTreeMap<String, DeadRun>, TrailError> {
        let needles: Vec<(String, &str)> = ids
            .iter()
            .map(|id| (format!("\"runId\":\"{id}\""), *id))
            .collect();
        let mut folds: BTreeMap<String, Fold> = BTreeMap::new();
        for name in file_names(&self.dir).map_err(io_at(self.dir.path()))? {
            let path = self.dir.join(&name);
            let file = self.dir.file(&name, FileMode::Read).map_err(io_at(&path))?;
            for line in Lines::new(&file, limits::MAX_LINE_BYTES) {
                let line = line.map_err(io_at(&path))?;
                let Some(bytes) = line.bytes.filter(|_| line.complete) else {
                    continue;
                };
                let Some((_, id)) = needles.iter().find(|(n, _)| contains(&bytes, n.as_bytes()))
                else {
                    continue;
                };
                let Ok(entry) = serde_json::from_slice::<Entry>(&bytes) else {
                    continue;
                };
                if entry.run_id != *id {
                    continue;
                }
                let fold = folds.entry(entry.run_id.clone()).or_default();
                fold.records.add(&entry);
                fold.last = Some((entry.seq, entry.event.kind()));
            }
        }
        Ok(folds
            .into_iter()
            .map(|(id, fold)| {
                let summary = fold.records.finish().into_iter().next();
                let last = fold.last;
                (id, DeadRun { summary, last })
            })
            .collect())
    }
}

/// Whether `needle` occurs in `haystack`.
fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}
