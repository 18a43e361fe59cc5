//! Printing: the text and JSON shapes of the command line's output (documented in the README
//! and docs/bundle-format.md; tests hold them byte for byte).

use crate::audit::Redactor;
use crate::bundle::Bundle;
use crate::caps::RunContext;
use crate::node::pipeline::Step;
use crate::plan::Change;
use std::io::Write as _;

/// A bundle's name, version, digest, source and signing key, as JSON.
pub(super) fn bundle_json(bundle: &Bundle) -> serde_json::Value {
    let mut v = bundle.id_json();
    v["signed-by"] = serde_json::json!(bundle.signed_by);
    v
}

/// Prints `v` as pretty JSON on stdout. A `serde_json::Value` always encodes.
pub(super) fn print_json(v: &serde_json::Value) {
    println!("{v:#}");
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
pub(super) fn print_redacted_json(mut report: serde_json::Value, redactor: &Redactor) {
    redactor.redact_json(&mut report);
    print_json(&report);
}

/// Prints a none-mode step and the changes made since the last one printed.
pub(super) fn print_step(step: &Step, session: &RunContext, printed: &mut usize) {
    let kind = if step.phase { "phase" } else { "step" };
    println!(
        "{kind} {}: {} ({} ms)",
        step.name,
        session.redactor.redact(&step.summary),
        step.duration_ms
    );
    let changes = session.changes();
    for change in &changes[(*printed).min(changes.len())..] {
        print_change(change, &session.redactor);
    }
    *printed = changes.len();
}

/// Asks on the terminal whether to accept wider grants.
pub(super) fn confirm_on_terminal() -> bool {
    eprint!("Accept the wider authority? [y/N] ");
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    std::io::stdin().read_line(&mut answer).is_ok() && matches!(answer.trim(), "y" | "Y" | "yes")
}
