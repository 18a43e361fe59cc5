//! [`AuditFeed`]: the phase durations and capability calls of the daemon's child runs, for its
//! metrics, read from the audit trail those runs wrote.
//!
//! # Background
//! The daemon never runs a phase itself: its node operations are child runs of its own binary
//! ([`crate::daemon::child`]), each of which writes every capability call and every phase's end
//! to the node's audit trail. So the trail is where the daemon learns what they did: it notes
//! the trail's head before a child starts and, when the child has ended, reads the records
//! after it. The trail is the one record auditors trust, so the metrics cannot tell another
//! story than it does.
//!
//! # Guarantees
//! - Best effort: a trail that cannot be read costs the metrics of that run (a warning), never
//!   the operation.
//! - Only records after the head noted before the child are counted, so a record is counted
//!   once; records another run wrote meanwhile (a `nodeward` run by hand) are counted too.

use crate::audit::entry::Event;
use crate::audit::head::{Head, head_path};
use crate::daemon::metrics::Metrics;
use std::path::PathBuf;
use std::time::Duration;

/// Where the child runs' records are, and the metrics they feed.
#[derive(Clone)]
pub struct AuditFeed {
    /// The audit trail's directory.
    pub audit_dir: PathBuf,
    /// The directory of the trail heads (in the agent state directory).
    pub heads_dir: PathBuf,
    /// The daemon's metrics.
    pub metrics: Metrics,
}

impl std::fmt::Debug for AuditFeed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuditFeed")
            .field("audit_dir", &self.audit_dir)
            .finish_non_exhaustive()
    }
}

impl AuditFeed {
    /// The trail's last durable record now (0 without a trail).
    pub fn head(&self) -> u64 {
        match Head::read(&head_path(&self.heads_dir, &self.audit_dir)) {
            Ok(head) => head.map_or(0, |h| h.seq),
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the audit trail's head");
                0
            }
        }
    }

    /// Counts the phase ends and capability calls recorded after `seq`.
    pub fn observe_since(&self, seq: u64) {
        let result = crate::audit::query::for_each(&self.audit_dir, |entry| {
            if entry.seq <= seq {
                return;
            }
            match entry.event {
                Event::Call { call, denied, .. } => self.metrics.capability_calls(&call, denied, 1),
                Event::CallOverflow { calls, .. } => {
                    for c in calls {
                        self.metrics.capability_calls(&c.call, c.denied, c.count);
                    }
                }
                Event::PhaseEnd {
                    phase,
                    outcome,
                    duration_ms,
                    ..
                } => {
                    let outcome = serde_json::to_value(outcome)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_string))
                        .unwrap_or_else(|| "unknown".into());
                    self.metrics
                        .phase_ran(&phase, &outcome, Duration::from_millis(duration_ms));
                }
                _ => {}
            }
        });
        if let Err(e) = result {
            tracing::warn!(error = %e, "cannot read the audit trail for the metrics");
        }
    }
}
