//! Reading the trail: `nodeward audit show` ([`Filter`]) and `nodeward audit summary`
//! ([`summarize`]).
//!
//! # Background
//! An auditor's questions are "what did this run do", "what did bundle X change on this
//! host", "what was refused since Monday". Each is a filter over the records (oldest first,
//! across rotated files) or a fold of them per run. Queries read; they never repair (the
//! next writer does) and never need the chain to be whole (`audit verify` says whether it is).

use super::chain::file_names;
use super::dir::{Access, FileMode, TrailDir};
use super::entry::{Entry, Event, KindCount, kind_counts};
use super::limits;
use super::lines::Lines;
use serde::Serialize;
use std::borrow::Cow;
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
    /// A line is longer than any record: it is not read.
    #[error(
        "{path}:{line}: not an audit record: {len} bytes, longer than any record ({max} at \
         most); see `nodeward audit verify`"
    )]
    TooLong {
        /// The file.
        path: PathBuf,
        /// The line, from 1.
        line: usize,
        /// Its length.
        len: u64,
        /// The cap.
        max: usize,
    },
}

/// Calls `each` with every complete record of the trail in `dir`, oldest first, reading one
/// line at a time with a cap ([`limits::MAX_LINE_BYTES`]); a torn last line is skipped (it is
/// no record yet).
pub fn for_each(dir: &Path, mut each: impl FnMut(Entry)) -> Result<(), QueryError> {
    let read_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| QueryError::Read { path, source }
    };
    let Some(trail) = TrailDir::open(dir, Access::Read).map_err(read_err(dir))? else {
        return Ok(());
    };
    for name in file_names(&trail).map_err(read_err(dir))? {
        let path = trail.join(&name);
        let file = trail.file(&name, FileMode::Read).map_err(read_err(&path))?;
        for line in Lines::new(&file, limits::MAX_LINE_BYTES) {
            let line = line.map_err(read_err(&path))?;
            if !line.complete {
                continue;
            }
            let Some(bytes) = line.bytes else {
                return Err(QueryError::TooLong {
                    path,
                    line: line.number,
                    len: line.len,
                    max: limits::MAX_LINE_BYTES,
                });
            };
            let entry = serde_json::from_slice(&bytes).map_err(|source| QueryError::Parse {
                path: path.clone(),
                line: line.number,
                source,
            })?;
            each(entry);
        }
    }
    Ok(())
}

/// Every complete record of the trail in `dir`, oldest first ([`for_each`]).
pub fn read(dir: &Path) -> Result<Vec<Entry>, QueryError> {
    let mut out = Vec::new();
    for_each(dir, |e| out.push(e))?;
    Ok(out)
}

/// `text` safe to print to a terminal: control characters (an ANSI escape starts with one),
/// and the marks that reorder text on screen, as `\u{…}` escapes. Records hold what phases
/// passed; an auditor's terminal must show it, not obey it.
pub fn printable(text: &str) -> Cow<'_, str> {
    let hostile = |c: char| {
        c.is_control()
            || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    };
    if !text.chars().any(hostile) {
        return Cow::Borrowed(text);
    }
    Cow::Owned(
        text.chars()
            .map(|c| {
                if hostile(c) {
                    format!("\\u{{{:x}}}", u32::from(c))
                } else {
                    c.to_string()
                }
            })
            .collect(),
    )
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

/// The runs of a trail, folded one record at a time ([`Summaries::add`]), in the order they
/// started.
#[derive(Debug, Default)]
pub struct Summaries {
    order: Vec<String>,
    runs: BTreeMap<String, RunSummary>,
}

/// The runs of `entries`, in the order they started.
pub fn summarize(entries: &[Entry]) -> Vec<RunSummary> {
    let mut s = Summaries::default();
    entries.iter().for_each(|e| s.add(e));
    s.finish()
}

impl Summaries {
    /// Folds in the next record.
    pub fn add(&mut self, entry: &Entry) {
        let order = &mut self.order;
        let run = self.runs.entry(entry.run_id.clone()).or_insert_with(|| {
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

    /// The runs, in the order they started.
    pub fn finish(mut self) -> Vec<RunSummary> {
        self.order
            .into_iter()
            .filter_map(|id| self.runs.remove(&id))
            .collect()
    }
}

/// One run for people, on one line (control characters escaped: [`printable`]). A plan says
/// so first (`plan of `nodeward plan --phase configure``) and counts planned changes.
pub fn describe_run(r: &RunSummary) -> String {
    let plan = r.mode.as_deref() == Some("plan");
    let changes: Vec<String> = r
        .changes
        .iter()
        .map(|c| format!("{} {}", c.kind, c.count))
        .collect();
    let line = format!(
        "{} {}: {}`nodeward {}`, {} .. {}: phases [{}], {} call(s), {} denied, {}changes [{}]{}{}",
        r.run_id,
        r.outcome,
        match r.mode.as_deref() {
            Some("plan") => "plan of ",
            Some(_) => "",
            None => "(no run-start record) ",
        },
        r.command.as_deref().unwrap_or("?"),
        r.start.as_deref().unwrap_or("?"),
        r.end.as_deref().unwrap_or("-"),
        r.phases.join(", "),
        r.calls,
        r.denials,
        if plan { "planned " } else { "" },
        changes.join(", "),
        if r.bundle_events.is_empty() {
            String::new()
        } else {
            format!(", bundle: {}", r.bundle_events.join("; "))
        },
        r.error
            .as_ref()
            .map(|e| format!(", error: {e}"))
            .unwrap_or_default()
    );
    printable(&line).into_owned()
}

/// One record for people, on one line: time, run, kind and what it says (control characters
/// escaped: [`printable`]).
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
        Event::Repair {
            repair,
            detail,
            gap,
        } => format!(
            "{repair}: {detail}{}",
            gap.map(|g| format!(" (gap: seq {}..{})", g.first, g.last))
                .unwrap_or_default()
        ),
    };
    let line = format!(
        "{:>6} {} {} {:<13} {what}",
        entry.seq,
        entry.time,
        entry.run_id,
        entry.event.kind()
    );
    printable(&line).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_and_reordering_marks_are_escaped() {
        assert_eq!(printable("etc/hosts ünïcode"), "etc/hosts ünïcode");
        assert_eq!(
            printable("a\u{1b}[2J\u{1b}]0;pwned\u{7}b\nc\u{202e}d\u{9b}e"),
            "a\\u{1b}[2J\\u{1b}]0;pwned\\u{7}b\\u{a}c\\u{202e}d\\u{9b}e"
        );
    }
}
