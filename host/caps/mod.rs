//! Capabilities: one module per WIT interface.
//!
//! # Background
//! Each module implements the generated `Host` trait of one interface for [`PhaseCtx`], the
//! per-phase-run state. Every method has the same shape: validate the arguments (the lexical
//! check), check the grant (refusing with `denied` before anything is touched), then act
//! through the [`crate::rootfs`] layer or the host subsystem, honouring the run mode. Every call,
//! allowed or not, goes through [`PhaseCtx::audited`], which writes the audit record.
//!
//! # Guarantees
//! - Grant check first: no host state is read or written for a call the grant does not cover.
//! - Plan mode: mutating calls record a [`crate::plan::Change`] and update the overlay only.
//! - Errors reaching the guest are typed ([`Error`]) and name the path, unit or key at fault.
//! - What a phase makes the host keep or write is bounded: each audit record (see
//!   [`crate::audit::limits`]), the records emitted and persisted per phase run
//!   ([`crate::audit::limits::MAX_EMITTED_PER_PHASE`]) and per run
//!   ([`crate::audit::limits::MAX_CALL_BYTES_PER_RUN`]), then one summary line and one
//!   `call-overflow` record when the phase ends, and its log lines ([`log::limits`]). The
//!   per-phase counters live in [`PhaseBudget`].
//! - Every host change of an apply has its own audit record: past the record budget, an apply
//!   refuses (`denied`, naming the limit) every call but the [`READ_ONLY_CALLS`], which are
//!   counted. A call made of parts (`download.fetch-all`: one record for the call, then one
//!   per request that ran) is refused unless the phase's budget and the run's record bytes
//!   have room for all its records ([`PhaseCtx::audited_with_parts`],
//!   [`crate::audit::AuditTrail::call_room_for`]).
//! - An apply whose audit trail cannot be written refuses every further call
//!   ([`RunContext::audit_refusal`]): it fails closed.

pub mod cgroup_sys;
pub mod cgroups;
mod context;
pub mod download;
pub mod fs;
pub mod kernel;
pub mod log;
pub mod mount_sys;
pub mod mounts;
pub mod netlink;
pub mod network;
pub mod systemd;

use crate::audit::entry::CallCount;
use crate::audit::{
    AuditRecord,
    limits::{MAX_CALL_BYTES_PER_RUN, MAX_EMITTED_PER_PHASE},
};
use crate::grants::Grants;
pub use crate::wit::{Error, Outcome, denied, host_path, reserved_denied};
pub use context::RunContext;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

/// The calls that read the host and change nothing on it (`interface.function`). Past the audit
/// record budget they are counted; every other call is refused in apply mode then, so that
/// every host change has its record. A call is added here only when no outcome of it changes
/// the host (a test checks each name is a real call).
pub const READ_ONLY_CALLS: &[&str] = &[
    "fs.read-file",
    "fs.list-dir",
    "fs.stat",
    "kernel.get-sysctl",
    "mounts.is-mounted",
    "systemd.status",
];

/// The state one phase run's capability calls see.
pub struct PhaseCtx {
    /// The phase's name from the manifest.
    pub phase: String,
    /// sha256 of the bundle manifest.
    pub bundle_digest: String,
    /// What the phase may do.
    pub grants: Arc<Grants>,
    /// The run this phase belongs to (files beneath the host root, systemd, downloads,
    /// changes, audit, secrets).
    pub run: Arc<RunContext>,
    /// When the phase's deadline passes; host calls that wait stop waiting then.
    pub deadline: Instant,
    /// The artifacts the host resolved from the node config for this run, with their pinned
    /// sha256: what a `download.pinned-artifacts` grant admits.
    pub pinned_artifacts: Arc<Vec<download::PinnedArtifact>>,
    /// The bridge the host took from the node's applied config for this run (the phase
    /// input's `bridge`): what a `network.node-bridge` grant admits. `None` otherwise.
    pub node_bridge: Option<String>,
    /// What this phase run has emitted so far (audit records, log lines); a fresh run starts
    /// from `PhaseBudget::default()`.
    pub budget: PhaseBudget,
}

/// One phase run's counters against the per-phase emission limits. When the run ends (the
/// [`PhaseCtx`] is dropped), what was counted and not emitted is summarised in one line each
/// for the audit and the log.
#[derive(Debug, Default)]
pub struct PhaseBudget {
    audit_emitted: usize,
    audit_suppressed: BTreeMap<(&'static str, bool), u64>,
    pub(crate) log: log::LogBudget,
}

impl PhaseBudget {
    /// Whether this phase run may emit `records` more audit records one by one.
    fn has_room(&self, records: usize) -> bool {
        self.audit_emitted.saturating_add(records) <= MAX_EMITTED_PER_PHASE
    }

    /// Counts a record of `call`: emitted one by one when `emitted`, else summarised.
    fn count_audit(&mut self, call: &'static str, denied: bool, emitted: bool) {
        if emitted {
            self.audit_emitted += 1;
        } else {
            *self.audit_suppressed.entry((call, denied)).or_default() += 1;
        }
    }

    /// Audit records counted and not emitted one by one: `(call, denied, count)`.
    pub fn audit_suppressed(&self) -> Vec<(&'static str, bool, u64)> {
        self.audit_suppressed
            .iter()
            .map(|((call, denied), n)| (*call, *denied, *n))
            .collect()
    }

    /// Log lines (and their bytes) dropped over the per-phase limits.
    pub fn log_dropped(&self) -> (u64, u64) {
        (self.log.dropped_lines, self.log.dropped_bytes)
    }
}

impl Drop for PhaseCtx {
    /// Emits the per-phase summaries of what was counted and not emitted.
    fn drop(&mut self) {
        if !self.budget.audit_suppressed.is_empty() {
            let counts: Vec<String> = self
                .budget
                .audit_suppressed()
                .into_iter()
                .map(|(call, denied, n)| {
                    format!("{call}{}: {n}", if denied { " (denied)" } else { "" })
                })
                .collect();
            let total: u64 = self.budget.audit_suppressed.values().sum();
            if let Some(trail) = self.run.trail() {
                let calls = self
                    .budget
                    .audit_suppressed()
                    .into_iter()
                    .map(|(call, denied, count)| CallCount {
                        call: call.to_string(),
                        denied,
                        count,
                    })
                    .collect();
                trail.overflow(&self.phase, calls);
            }
            tracing::warn!(
                target: "nodeward::audit",
                phase = %self.phase, bundle = %self.bundle_digest, suppressed = total,
                "{total} further capability calls of this phase were counted, not logged one by \
                 one (limits: {MAX_EMITTED_PER_PHASE} records per phase run, {} MiB of records \
                 per run; in apply mode those that could change the host were refused): {}",
                MAX_CALL_BYTES_PER_RUN >> 20,
                counts.join(", ")
            );
        }
        self.log_summary();
    }
}

/// How a successful call's result is summarised in the audit log.
pub trait AuditSummary {
    /// A short description, never file contents.
    fn summary(&self) -> String;

    /// Whether the call's record is flagged `denied` although the call returned `ok`: a call
    /// made of parts (`download.fetch-all`) one of which the grant refused, so that
    /// `audit show --denied` finds the call too.
    fn denied(&self) -> bool {
        false
    }
}

impl AuditSummary for Outcome {
    fn summary(&self) -> String {
        match self {
            Outcome::Created => "created",
            Outcome::Changed => "changed",
            Outcome::Unchanged => "unchanged",
            Outcome::Removed => "removed",
        }
        .into()
    }
}

impl AuditSummary for () {
    fn summary(&self) -> String {
        "done".into()
    }
}

impl AuditSummary for bool {
    fn summary(&self) -> String {
        self.to_string()
    }
}

impl AuditSummary for Vec<u8> {
    fn summary(&self) -> String {
        format!("{} bytes", self.len())
    }
}

impl AuditSummary for Option<String> {
    fn summary(&self) -> String {
        match self {
            Some(_) => "present".into(),
            None => "absent".into(),
        }
    }
}

impl AuditSummary for Vec<crate::wit::fs::DirEntry> {
    fn summary(&self) -> String {
        format!("{} entries", self.len())
    }
}

impl AuditSummary for Option<crate::wit::fs::FileStat> {
    fn summary(&self) -> String {
        match self {
            Some(s) => format!("{:?} {:04o} {} bytes", s.kind, s.mode, s.size),
            None => "absent".into(),
        }
    }
}

impl AuditSummary for crate::wit::systemd::UnitStatus {
    fn summary(&self) -> String {
        format!("{}/{}", self.active_state, self.sub_state)
    }
}

/// The refusal of `call` past the audit record budget (`trail_room`: the run's bytes are not
/// what ran out, the phase's record count is).
fn over_budget(call: &str, trail_room: bool) -> Error {
    let limit = if trail_room {
        format!("{MAX_EMITTED_PER_PHASE} audit records per phase run")
    } else {
        format!(
            "{} MiB of audit records per run",
            MAX_CALL_BYTES_PER_RUN >> 20
        )
    };
    Error::Denied(format!(
        "{call}: past the audit record limit ({limit}); a host change past it would have no \
         record of its own, so apply refuses it (read-only calls are still answered)"
    ))
}

/// `kind: message` for an error, as the audit log shows it.
pub fn describe_error(e: &Error) -> String {
    match e {
        Error::Denied(m) => format!("denied: {m}"),
        Error::InvalidArgument(m) => format!("invalid-argument: {m}"),
        Error::NotFound(m) => format!("not-found: {m}"),
        Error::Escape(m) => format!("escape: {m}"),
        Error::Io(m) => format!("io: {m}"),
        Error::Failed(m) => format!("failed: {m}"),
        Error::Timeout(m) => format!("timeout: {m}"),
        Error::Unavailable(m) => format!("unavailable: {m}"),
    }
}

impl PhaseCtx {
    /// Runs one capability call and writes its audit record (redacted, then bounded; emitted
    /// and persisted while the phase and the run are within their record budgets, kept while
    /// the run is within its in-memory limit, counted always). Past the record budget, an
    /// apply refuses the call unless it is read-only ([`READ_ONLY_CALLS`]).
    pub fn audited<T: AuditSummary>(
        &mut self,
        call: &'static str,
        args: serde_json::Value,
        f: impl FnOnce(&mut Self) -> Result<T, Error>,
    ) -> Result<T, Error> {
        self.audited_with_parts(call, args, 0, f)
    }

    /// [`Self::audited`] for a call that writes `parts` more records after its own (one per
    /// request of a `download.fetch-all`, [`Self::record_part`]): in apply mode it is refused
    /// unless the phase's budget has room for all of them, so every host change of its parts
    /// has its record too.
    pub(crate) fn audited_with_parts<T: AuditSummary>(
        &mut self,
        call: &'static str,
        args: serde_json::Value,
        parts: usize,
        f: impl FnOnce(&mut Self) -> Result<T, Error>,
    ) -> Result<T, Error> {
        let start = Instant::now();
        let trail_room = self.run.trail().is_none_or(|t| t.call_room_for(1 + parts));
        let room = self.budget.has_room(1 + parts) && trail_room;
        let refusal = self.run.audit_refusal().or_else(|| {
            (!room
                && self.run.mode() == crate::plan::RunMode::Apply
                && !READ_ONLY_CALLS.contains(&call))
            .then(|| over_budget(call, trail_room))
        });
        let result = match refusal {
            Some(refused) => Err(refused),
            None => f(self),
        };
        let (outcome, denied) = match &result {
            Ok(v) => (format!("ok:{}", v.summary()), v.denied()),
            Err(e) => (describe_error(e), matches!(e, Error::Denied(_))),
        };
        self.write_record(call, args, &outcome, denied, start.elapsed());
        result
    }

    /// Writes the record of one part of a call [`Self::audited_with_parts`] ran and recorded:
    /// `call` names the part (`download.fetch-all[3]`), `result` is its own.
    pub(crate) fn record_part<T: AuditSummary>(
        &mut self,
        call: &'static str,
        args: serde_json::Value,
        result: &Result<T, Error>,
        elapsed: std::time::Duration,
    ) {
        let (outcome, denied) = match result {
            Ok(v) => (format!("ok:{}", v.summary()), v.denied()),
            Err(e) => (describe_error(e), matches!(e, Error::Denied(_))),
        };
        self.write_record(call, args, &outcome, denied, elapsed);
    }

    /// Writes one record: emitted and persisted while the phase and the run have room, kept
    /// while the run is within its in-memory limit, counted always.
    fn write_record(
        &mut self,
        call: &'static str,
        args: serde_json::Value,
        outcome: &str,
        denied: bool,
        elapsed: std::time::Duration,
    ) {
        let recorded =
            self.budget.has_room(1) && self.run.trail().is_none_or(|t| t.call_budget_left());
        let record = AuditRecord::new(
            &self.run.redactor,
            &self.phase,
            &self.bundle_digest,
            call,
            args,
            outcome,
            denied,
            elapsed,
        );
        self.budget.count_audit(call, denied, recorded);
        if recorded && let Some(trail) = self.run.trail() {
            trail.call(&record);
        }
        self.run.audit.record(record, recorded);
    }

    /// Adds a change this phase made (or would make) to the run's change log.
    pub fn changed(&self, kind: crate::plan::ChangeKind) {
        self.run.changes.add(&self.phase, kind);
    }
}

impl crate::wit::types::Host for PhaseCtx {}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each read-only call is a real call: its name is audited by a capability module.
    #[test]
    fn every_read_only_call_is_a_call() {
        let sources = [
            include_str!("fs.rs"),
            include_str!("kernel.rs"),
            include_str!("mounts.rs"),
            include_str!("systemd/mod.rs"),
            include_str!("download/mod.rs"),
        ]
        .concat();
        for call in READ_ONLY_CALLS {
            assert!(sources.contains(&format!("\"{call}\"")), "{call}");
        }
        for mutating in [
            "fs.write-file",
            "download.fetch",
            "mounts.bind",
            "systemd.start",
        ] {
            assert!(!READ_ONLY_CALLS.contains(&mutating));
        }
    }
}
