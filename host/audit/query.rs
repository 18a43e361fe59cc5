//! Reading the trail: `nodeward audit show` ([`Filter`]) and `nodeward audit summary`
//! ([`summarize`]).
//!
//! # Background
//! An auditor's questions are "what did this run do", "what did bundle X change on this
//! host", "what was refused since Monday". Each is a filter over the records (oldest first,
//! across rotated files) or a fold of them per run. Queries read; they never repair (the
//! next writer does) and never need the chain to be whole (`audit verify` says whether it is).

use super::chain::files;
use super::entry::{Entry, Event, KindCount, kind_counts};
use serde::Serialize;
use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// Why the trail could not be read.
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    /// A file could not be read.
    #[error("reading the audit trail {path}: {source}")]
    Read {
        /// The file or directory.
        path: PathBuf,
        /// The failure.
        #[source]
        source: io::Error,
    },
    /// A complete line is not a record.
    #[error("{path}:{line}: not an audit record: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The line, from 1.
        line: usize,
        /// What serde said.
        #[source]
        source: serde_json::Error,
    },
}

/// Every complete record of the trail in `dir`, oldest first (a torn last line is skipped:
/// it is no record yet).
pub fn read(dir: &Path) -> Result<Vec<Entry>, QueryError> {
    let mut out = Vec::new();
    let paths = files(dir).map_err(|source| QueryError::Read {
        path: dir.to_path_buf(),
        source,
    })?;
    for path in paths {
        let bytes = std::fs::read(&path).map_err(|source| QueryError::Read {
            path: path.clone(),
            source,
        })?;
        let mut lines: Vec<&[u8]> = bytes.split(|b| *b == b'\n').collect();
        lines.pop(); // empty after the final newline, or a torn line
        for (i, line) in lines.into_iter().enumerate() {
            let entry = serde_json::from_slice(line).map_err(|source| QueryError::Parse {
                path: path.clone(),
                line: i + 1,
                source,
            })?;
            out.push(entry);
        }
    }
    Ok(out)
}

/// What `audit show` keeps: every given condition holds.
#[derive(Clone, Debug, Default)]
pub struct Filter {
    /// The run ID.
    pub run: Option<String>,
    /// The phase (records about a phase only).
    pub phase: Option<String>,
    /// A bundle digest or a prefix of one (records about a bundle only).
    pub bundle: Option<String>,
    /// Records written at or after this time.
    pub since: Option<SystemTime>,
    /// Refused calls only.
    pub denied: bool,
}

impl Filter {
    /// Whether `entry` passes. A record whose time does not parse fails a `since` filter.
    pub fn matches(&self, entry: &Entry) -> bool {
        let e = &entry.event;
        self.run.as_ref().is_none_or(|r| entry.run_id == *r)
            && self.phase.as_deref().is_none_or(|p| e.phase() == Some(p))
            && self
                .bundle
                .as_deref()
                .is_none_or(|b| e.bundle_digest().is_some_and(|d| d.starts_with(b)))
            && self
                .since
                .is_none_or(|since| humantime::parse_rfc3339(&entry.time).is_ok_and(|t| t >= since))
            && (!self.denied || matches!(e, Event::Call { denied: true, .. }))
    }
}

/// Parses `--since`: an RFC 3339 time (`2026-12-01T17:00:00Z`) or an age (`2h`, `3days`)
/// before `now`.
pub fn parse_since(text: &str, now: SystemTime) -> Result<SystemTime, String> {
    if let Ok(t) = humantime::parse_rfc3339_weak(text) {
        return Ok(t);
    }
    match humantime::parse_duration(text) {
        Ok(age) => now
            .checked_sub(age)
            .ok_or_else(|| format!("--since {text:?}: before the epoch")),
        Err(e) => Err(format!(
            "--since {text:?}: neither an RFC 3339 time (2026-12-01T17:00:00Z) nor an age (2h, 3days): {e}"
        )),
    }
}

/// One run as `audit summary` shows it.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunSummary {
    /// The run ID.
    pub run_id: String,
    /// The command.
    pub command: Option<String>,
    /// `plan` or `apply`.
    pub mode: Option<String>,
    /// The host root.
    pub root: Option<String>,
    /// When it started (its `run-start` record).
    pub start: Option<String>,
    /// When it ended (its `run-end` record).
    pub end: Option<String>,
    /// `ok`, `failed`, `interrupted` (the agent died; a later run noted it) or `running` (no
    /// end yet).
    pub outcome: String,
    /// Why it failed.
    pub error: Option<String>,
    /// The phases that ended, in order.
    pub phases: Vec<String>,
    /// Capability calls recorded (one by one or counted).
    pub calls: u64,
    /// Of which refused.
    pub denials: u64,
    /// Changes made or planned per change kind, from its phase ends.
    pub changes: Vec<KindCount>,
    /// Bundle-store changes: `install <digest>`, `rollback` …
    pub bundle_events: Vec<String>,
}

/// The runs of `entries`, in the order they started.
pub fn summarize(entries: &[Entry]) -> Vec<RunSummary> {
    let mut order: Vec<String> = Vec::new();
    let mut runs: BTreeMap<String, RunSummary> = BTreeMap::new();
    for entry in entries {
        let run = runs.entry(entry.run_id.clone()).or_insert_with(|| {
            order.push(entry.run_id.clone());
            RunSummary {
                run_id: entry.run_id.clone(),
                outcome: "running".into(),
                ..RunSummary::default()
            }
        });
        match &entry.event {
            Event::RunStart {
                command,
                mode,
                root,
                ..
            } => {
                run.command = Some(command.clone());
                run.mode = Some(mode.as_str().to_string());
                run.root = Some(root.clone());
                run.start = Some(entry.time.clone());
            }
            Event::Call { denied, .. } => {
                run.calls += 1;
                run.denials += u64::from(*denied);
            }
            Event::CallOverflow { calls, .. } => {
                for c in calls {
                    run.calls += c.count;
                    if c.denied {
                        run.denials += c.count;
                    }
                }
            }
            Event::PhaseEnd { phase, changes, .. } => {
                run.phases.push(phase.clone());
                let mut all: BTreeMap<String, u64> = run
                    .changes
                    .iter()
                    .map(|c| (c.kind.clone(), c.count))
                    .collect();
                for c in changes {
                    *all.entry(c.kind.clone()).or_default() += c.count;
                }
                run.changes = kind_counts(&all);
            }
            Event::RunEnd { outcome, error, .. } => {
                run.end = Some(entry.time.clone());
                run.error = error.clone();
                run.outcome = outcome.as_str().into();
            }
            Event::Bundle {
                action,
                current,
                from,
            } => {
                let action = action.as_str();
                let to = current.as_ref().map_or("embedded", |b| b.digest.as_str());
                let from = from.as_deref().unwrap_or("embedded");
                run.bundle_events.push(format!("{action} {from} -> {to}"));
            }
            Event::Repair { .. } => {}
        }
    }
    order
        .into_iter()
        .filter_map(|id| runs.remove(&id))
        .collect()
}

/// One record for people: time, run, kind and what it says.
pub fn describe(entry: &Entry) -> String {
    let what = match &entry.event {
        Event::RunStart {
            command,
            mode,
            root,
            ..
        } => format!("{command} ({}) against {root}", mode.as_str()),
        Event::Call {
            phase,
            call,
            args,
            outcome,
            denied,
            ..
        } => format!(
            "{phase}: {call} {args} -> {outcome}{}",
            if *denied { " DENIED" } else { "" }
        ),
        Event::CallOverflow { phase, calls } => format!(
            "{phase}: {} further calls counted",
            calls.iter().map(|c| c.count).sum::<u64>()
        ),
        Event::PhaseEnd {
            phase,
            outcome,
            calls,
            denied,
            changes,
            ..
        } => format!(
            "{phase}: {} ({calls} calls, {denied} denied, {} changes)",
            outcome.as_str(),
            changes.iter().map(|c| c.count).sum::<u64>()
        ),
        Event::RunEnd { outcome, error, .. } => format!(
            "{}{}",
            outcome.as_str(),
            error.as_ref().map(|e| format!(": {e}")).unwrap_or_default()
        ),
        Event::Bundle { current, from, .. } => format!(
            "{} -> {}",
            from.as_deref().unwrap_or("embedded"),
            current.as_ref().map_or("embedded".to_string(), |b| format!(
                "{} v{} {}",
                b.name, b.version, b.digest
            ))
        ),
        Event::Repair { repair, detail } => format!("{repair}: {detail}"),
    };
    format!(
        "{:>6} {} {} {:<13} {what}",
        entry.seq,
        entry.time,
        entry.run_id,
        entry.event.kind()
    )
}
