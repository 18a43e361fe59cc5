//! `nodeward:host/log`: messages from a phase to the operator. Needs no grant.
//!
//! Messages go to `tracing` on target `nodeward::phase`, tagged with the phase, after the
//! run's redactor has removed every secret it knows. The guest's stdout and stderr lines
//! (captured by the runtime) take the same path through [`PhaseCtx::guest_line`].
//!
//! # Guarantees
//! A phase decides how much it logs, so the host bounds what it writes on its behalf (see
//! [`limits`], documented in `wit/log.wit`):
//! - a line longer than [`limits::MAX_LINE_BYTES`] keeps its prefix, then its length and
//!   sha256 (redacted first, so no secret survives as a prefix);
//! - a phase run emits at most [`limits::MAX_LINES_PER_PHASE`] lines and
//!   [`limits::MAX_BYTES_PER_PHASE`] bytes; further lines are counted, not written, and one
//!   warning line says how many when the phase run ends.
//!
//! # Caveats
//! The message crosses the component boundary whole before the host sees it: its size is
//! bounded by the guest's memory limit, not by these limits, which bound what the host keeps
//! and writes.

use super::PhaseCtx;
use crate::audit::bound_text;
use crate::wit::log::{self, Level};

/// The bounds of what the host logs for one phase run.
pub mod limits {
    /// Longest line written, in bytes (then `… (<len> bytes, sha256 <hex>)`).
    pub const MAX_LINE_BYTES: usize = 4096;
    /// Most lines written per phase run (log calls and stdio lines together).
    pub const MAX_LINES_PER_PHASE: u64 = 2_000;
    /// Most bytes written per phase run, counted after each line was bounded.
    pub const MAX_BYTES_PER_PHASE: u64 = 1 << 20;
}

/// One phase run's log volume so far.
#[derive(Debug, Default)]
pub(crate) struct LogBudget {
    lines: u64,
    bytes: u64,
    pub(crate) dropped_lines: u64,
    pub(crate) dropped_bytes: u64,
}

impl LogBudget {
    /// Whether a line of `len` bytes (already bounded) fits; counts it either way.
    fn admit(&mut self, len: usize, original: usize) -> bool {
        let len = len as u64;
        if self.lines < limits::MAX_LINES_PER_PHASE
            && self.bytes.saturating_add(len) <= limits::MAX_BYTES_PER_PHASE
        {
            self.lines += 1;
            self.bytes += len;
            true
        } else {
            self.dropped_lines += 1;
            self.dropped_bytes = self.dropped_bytes.saturating_add(original as u64);
            false
        }
    }
}

impl PhaseCtx {
    /// Writes one line from the guest (a `log` call, or a stdio line when `stream` names it)
    /// redacted, bounded, and within the phase run's budget.
    pub fn guest_line(&mut self, level: Level, stream: Option<&'static str>, text: &str) {
        let redacted = self.run.redactor.redact_cow(text);
        let line = bound_text(&redacted, limits::MAX_LINE_BYTES);
        if !self.budget.log.admit(line.len(), text.len()) {
            return;
        }
        let phase = self.phase.as_str();
        match (level, stream) {
            (Level::Debug, None) => tracing::debug!(target: "nodeward::phase", phase, "{line}"),
            (Level::Info, None) => tracing::info!(target: "nodeward::phase", phase, "{line}"),
            (Level::Warn, None) => tracing::warn!(target: "nodeward::phase", phase, "{line}"),
            (Level::Error, None) => tracing::error!(target: "nodeward::phase", phase, "{line}"),
            (Level::Debug, Some(stream)) => {
                tracing::debug!(target: "nodeward::phase", phase, stream, "{line}")
            }
            (Level::Info, Some(stream)) => {
                tracing::info!(target: "nodeward::phase", phase, stream, "{line}")
            }
            (Level::Warn, Some(stream)) => {
                tracing::warn!(target: "nodeward::phase", phase, stream, "{line}")
            }
            (Level::Error, Some(stream)) => {
                tracing::error!(target: "nodeward::phase", phase, stream, "{line}")
            }
        }
    }

    /// The one line saying how much of this phase run's log was dropped, if any.
    pub(super) fn log_summary(&self) {
        let (lines, bytes) = self.budget.log_dropped();
        if lines > 0 {
            tracing::warn!(
                target: "nodeward::phase",
                phase = %self.phase, dropped_lines = lines, dropped_bytes = bytes,
                "{lines} log lines ({bytes} bytes) of this phase run were dropped over its limit \
                 of {} lines and {} bytes",
                limits::MAX_LINES_PER_PHASE,
                limits::MAX_BYTES_PER_PHASE
            );
        }
    }
}

impl log::Host for PhaseCtx {
    fn log(&mut self, level: Level, message: String) {
        self.guest_line(level, None, &message);
    }
}
