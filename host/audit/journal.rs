//! The trail's records in the journal, as structured fields, when the agent runs under
//! systemd.
//!
//! # Background
//! An auditor on a systemd host asks the journal: `journalctl NODEWARD_PHASE=configure`,
//! `journalctl NODEWARD_RUN=<id> NODEWARD_DENIED=true`. Every record the trail writes is also
//! emitted as one `tracing` event on [`JOURNAL_TARGET`] whose fields are the record's
//! (`run`, `seq`, `kind`, `phase`, `call` …); the command line sends that target only to
//! `tracing-journald` with the field prefix `NODEWARD` (so `phase` becomes `NODEWARD_PHASE`),
//! and never to stderr, which shows a summary per phase instead.
//!
//! # Guarantees
//! The journal gets exactly the persisted records (the same redaction and bounds, the same
//! per-phase limit); `NODEWARD_ARGS` is the arguments' JSON text and `NODEWARD_LINE` the
//! record's whole line, so a journal entry can be matched to the trail by `NODEWARD_SEQ`.

use super::entry::{Entry, Event};
use std::path::Path;

/// The target of the journal's events: only the journald layer listens to it.
pub const JOURNAL_TARGET: &str = "nodeward::audit::journal";

/// The prefix of the journal fields (`NODEWARD_PHASE` …).
pub const FIELD_PREFIX: &str = "NODEWARD";

/// The journal's native socket.
pub const JOURNAL_SOCKET: &str = "/run/systemd/journal/socket";

/// Whether the agent runs under systemd with a journal to write to: `JOURNAL_STREAM` or
/// `INVOCATION_ID` is set (systemd sets them for a service) and the journal's socket exists.
pub fn under_systemd() -> bool {
    let env = |k: &str| std::env::var_os(k).is_some_and(|v| !v.is_empty());
    (env("JOURNAL_STREAM") || env("INVOCATION_ID")) && Path::new(JOURNAL_SOCKET).exists()
}

/// Emits `entry` as one event on [`JOURNAL_TARGET`] (see the module doc).
pub fn emit(entry: &Entry, line: &[u8]) {
    if !tracing::enabled!(target: JOURNAL_TARGET, tracing::Level::INFO) {
        return;
    }
    let line = String::from_utf8_lossy(line);
    let (mode, call, args, outcome, denied) = match &entry.event {
        Event::Call {
            mode,
            call,
            args,
            outcome,
            denied,
            ..
        } => (
            Some(mode.as_str()),
            Some(call.as_str()),
            Some(args.to_string()),
            Some(outcome.as_str()),
            Some(*denied),
        ),
        _ => (None, None, None, None, None),
    };
    tracing::info!(
        target: JOURNAL_TARGET,
        run = %entry.run_id,
        seq = entry.seq,
        kind = entry.event.kind(),
        phase = entry.event.phase(),
        bundle = entry.event.bundle_digest(),
        mode,
        call,
        args,
        outcome,
        denied,
        line = %line,
        "audit {} {}{}",
        entry.event.kind(),
        entry.event.phase().unwrap_or(""),
        call.map(|c| format!(" {c}")).unwrap_or_default()
    );
}
