//! `nodeward:host/log`: messages from a phase to the operator. Needs no grant.
//!
//! Messages go to `tracing` on target `nodeward::phase`, tagged with the phase, after the
//! session's redactor has removed every secret it knows.

use super::PhaseCtx;
use super::bindings::log::{self, Level};

impl log::Host for PhaseCtx {
    fn log(&mut self, level: Level, message: String) {
        let message = self.session.redactor.redact(&message);
        let phase = self.phase.as_str();
        match level {
            Level::Debug => tracing::debug!(target: "nodeward::phase", phase, "{message}"),
            Level::Info => tracing::info!(target: "nodeward::phase", phase, "{message}"),
            Level::Warn => tracing::warn!(target: "nodeward::phase", phase, "{message}"),
            Level::Error => tracing::error!(target: "nodeward::phase", phase, "{message}"),
        }
    }
}
