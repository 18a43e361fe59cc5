//! Capabilities: one module per WIT interface.
//!
//! # Background
//! Each module implements the generated `Host` trait of one interface for [`PhaseCtx`], the
//! per-phase-run state. Every method has the same shape: validate the arguments (the lexical
//! check), check the grant (refusing with `denied` before anything is touched), then act
//! through the [`hostfs`] layer or the host subsystem, honouring the run mode. Every call,
//! allowed or not, goes through [`PhaseCtx::audited`], which writes the audit record.
//!
//! # Guarantees
//! - Grant check first: no host state is read or written for a call the grant does not cover.
//! - Plan mode: mutating calls record a [`crate::plan::Change`] and update the overlay only.
//! - Errors reaching the guest are typed ([`Error`]) and name the path, unit or key at fault.

pub mod bindings;
pub mod download;
pub mod fs;
pub mod hostfs;
pub mod kernel;
pub mod log;
pub mod mount_sys;
pub mod mounts;
pub mod systemd;
pub mod systemd_dbus;

use crate::audit::{AuditRecord, micros};
use crate::grants::Grants;
use crate::session::Session;
pub use bindings::{Error, Outcome};
use std::sync::Arc;
use std::time::Instant;

/// The state one phase run's capability calls see.
pub struct PhaseCtx {
    /// The phase's name from the manifest.
    pub phase: String,
    /// sha256 of the bundle manifest.
    pub bundle_digest: String,
    /// What the phase may do.
    pub grants: Arc<Grants>,
    /// The run this phase belongs to (host root, mode, overlay, changes, audit).
    pub session: Arc<Session>,
    /// When the phase's deadline passes; host calls that wait stop waiting then.
    pub deadline: Instant,
    /// The artifacts the host resolved from the node config for this run, with their pinned
    /// sha256: what a `download.pinned-artifacts` grant admits.
    pub pinned_artifacts: Arc<Vec<download::PinnedArtifact>>,
}

/// How a successful call's result is summarised in the audit log.
pub trait AuditSummary {
    /// A short description, never file contents.
    fn summary(&self) -> String;
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

impl AuditSummary for Vec<bindings::fs::DirEntry> {
    fn summary(&self) -> String {
        format!("{} entries", self.len())
    }
}

impl AuditSummary for Option<bindings::fs::FileStat> {
    fn summary(&self) -> String {
        match self {
            Some(s) => format!("{:?} {:04o} {} bytes", s.kind, s.mode, s.size),
            None => "absent".into(),
        }
    }
}

impl AuditSummary for bindings::systemd::UnitStatus {
    fn summary(&self) -> String {
        format!("{}/{}", self.active_state, self.sub_state)
    }
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
    /// Runs one capability call and writes its audit record.
    pub fn audited<T: AuditSummary>(
        &mut self,
        call: &'static str,
        args: serde_json::Value,
        f: impl FnOnce(&mut Self) -> Result<T, Error>,
    ) -> Result<T, Error> {
        let start = Instant::now();
        let result = f(self);
        let elapsed = start.elapsed();
        let redactor = &self.session.redactor;
        let (outcome, denied) = match &result {
            Ok(v) => (format!("ok:{}", v.summary()), false),
            Err(e) => (describe_error(e), matches!(e, Error::Denied(_))),
        };
        let mut args = args;
        redactor.redact_json(&mut args);
        self.session.audit.record(AuditRecord {
            phase: self.phase.clone(),
            bundle: self.bundle_digest.clone(),
            call: call.to_string(),
            args,
            outcome: redactor.redact(&outcome),
            denied,
            duration_us: micros(elapsed),
        });
        result
    }

    /// Records a change this phase made (or would make).
    pub fn record(&self, kind: crate::plan::ChangeKind) {
        self.session.record(&self.phase, kind);
    }
}

/// `denied` naming what was asked and which grant is missing.
pub fn denied(what: impl std::fmt::Display, grant: &str) -> Error {
    Error::Denied(format!("{what}: not covered by the phase's {grant} grant"))
}

/// A validated host path or `invalid-argument`.
pub fn host_path(s: &str) -> Result<crate::hostpath::HostPath, Error> {
    crate::hostpath::HostPath::parse(s).map_err(|e| Error::InvalidArgument(e.to_string()))
}

impl bindings::types::Host for PhaseCtx {}
