//! Printing: the text and JSON shapes of the command line's output (the JSON ones are typed in
//! [`json`](super::json) and documented under `docs/schemas/`; tests hold them).

use super::{Failure, failed};
use crate::audit::Redactor;
use crate::caps::RunContext;
use crate::plan::Change;
use crate::session::Step;
use serde::Serialize;
use std::io::Write as _;

/// `v` as a JSON value. Our output types hold only strings, numbers, lists and string-keyed
/// maps, so this fails only on a host bug; it is still an error, not a panic.
fn to_value(v: &impl Serialize) -> Result<serde_json::Value, Failure> {
    serde_json::to_value(v).map_err(|e| failed(format!("encoding the JSON output: {e}")))
}

/// Prints `v` as pretty JSON on stdout.
pub(super) fn print_json(v: &impl Serialize) -> Result<(), Failure> {
    println!("{:#}", to_value(v)?);
    Ok(())
}

/// Prints one change, every line through the redactor (a path, URL or diff could hold a
/// secret however it got there).
pub(super) fn print_change(change: &Change, redactor: &Redactor) {
    println!("  {}", redactor.redact(&change.kind.describe()));
    if let Some(diff) = change.kind.diff() {
        for line in diff.lines() {
            println!("      {}", redactor.redact(line));
        }
    }
}

/// Prints a JSON report with every string in it through the redactor.
pub(super) fn print_redacted_json(
    report: &impl Serialize,
    redactor: &Redactor,
) -> Result<(), Failure> {
    let mut report = to_value(report)?;
    redactor.redact_json(&mut report);
    println!("{report:#}");
    Ok(())
}

/// Prints the changes of the run's change log not printed yet, and notes how many there are
/// now in `printed`.
/// The last line of a run's text output: how many changes it made (or planned), those beyond
/// the change log's bound included.
pub(super) fn print_change_total(session: &RunContext) {
    let what = match session.mode() {
        crate::plan::RunMode::Plan => "planned",
        crate::plan::RunMode::Apply => "made",
    };
    let total = session.changes().len() + session.changes_dropped();
    println!("{total} change(s) {what}.");
}

pub(super) fn print_new_changes(session: &RunContext, printed: &mut usize) {
    let changes = session.changes();
    for change in &changes[(*printed).min(changes.len())..] {
        print_change(change, &session.redactor);
    }
    *printed = changes.len();
}

/// Prints a step (`timed`: with its wall time, as the none-mode operations do) and the
/// changes made since the last one printed. A failed step prints `failed`; its error follows
/// as the command's own.
pub(super) fn print_step(step: &Step, session: &RunContext, timed: bool, printed: &mut usize) {
    let kind = if step.phase { "phase" } else { "step" };
    let summary = session.redactor.redact(&step.summary);
    if timed {
        println!("{kind} {}: {summary} ({} ms)", step.name, step.duration_ms);
    } else {
        println!("{kind} {}: {summary}", step.name);
    }
    print_new_changes(session, printed);
}

/// Asks on the terminal whether to accept wider grants.
pub(super) fn confirm_on_terminal() -> bool {
    eprint!("Accept the wider authority? [y/N] ");
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    std::io::stdin().read_line(&mut answer).is_ok() && matches!(answer.trim(), "y" | "Y" | "yes")
}
