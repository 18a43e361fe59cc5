//! Phase bundle roll-out: the bundle a Machine's `spec.phaseBundle` names, installed and put to
//! work on the node behind a health gate, rolled back when the node fails it.
//!
//! # Background
//! Platform teams publish signed bundles; a node picks one up when its Machine names it (URL
//! or OCI reference, archive sha256, and the consent to wider grants by the bundle's digest).
//! The daemon:
//! 1. records the roll-out ([`RolloutRecord`], `daemon-bundle.json` in the agent state
//!    directory) before it acts, so a daemon killed at any step resumes it;
//! 2. installs it with `nodeward phases install SOURCE --sha256 … [--accept-grants-digest …]`,
//!    SOURCE the URL or `oci://` and the reference ([`install_source`]; the CLI's download or
//!    pull, signature check against the trusted keys, escalation gate and store; its exit
//!    code tells a fetch failure, a refusal and a widening apart);
//! 3. runs the phases whose component, world or grants changed with
//!    `nodeward restart --phase …` (the node's provisioning phases with its applied config,
//!    then containerd and the kubelet restarted, then the health waits: the health gate);
//! 4. on failure, `nodeward phases rollback` and the same restart under the previous bundle,
//!    counting an attempt; after [`MAX_ATTEMPTS`] attempts the bundle stays rolled back
//!    (`BundleRolledBack`) until the spec names another archive or consent.
//!
//! # Guarantees
//! - A roll-out starts only on a bootstrapped node with no update or repave running
//!   ([`crate::daemon::reconcile`]).
//! - A refusal (signature, format, downgrade) or a widening without consent is never retried
//!   for the same (sha256, consent); a fetch failure is retried after [`RETRY_AFTER`], at a
//!   later pass.
//! - Whatever the daemon's fate, the record says where the roll-out stood: one found
//!   `Installing` or `Checking` at a pass is run again from the start (installing is
//!   idempotent; the health gate decides again), counting an attempt; once cut short
//!   [`MAX_ATTEMPTS`] times it is restored instead. What is current after an install decides
//!   whether it switched the store, not its exit code.
//! - A restore lands on the bundle recorded as current before the roll-out, or fails
//!   (`phases rollback --expect`), and is checked afterwards; until a roll-out succeeds, that
//!   recorded bundle stays the one to return to, whatever the spec names next.

use crate::bundle::oci::OciReference;
use crate::bundle::{Bundle, PhaseEntry};
use crate::daemon::status::Bundle as Report;
use nodeward_api::machine::{BundleLocation, PhaseBundleRef};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The roll-out record's file in the agent state directory.
pub const RECORD_FILE: &str = "daemon-bundle.json";
/// How many times one bundle (sha256 and consent) may fail the health gate before it stays
/// rolled back.
pub const MAX_ATTEMPTS: u32 = 2;
/// How long after a fetch failure or a roll-back the next attempt waits (it starts at the
/// first pass after that).
pub const RETRY_AFTER: Duration = Duration::from_secs(300);

/// The longest `phases install` or `phases rollback` may run (download, verification,
/// precompilation).
pub const STORE_TIMEOUT: Duration = Duration::from_secs(10 * 60);
/// The longest a roll-out may take: two store changes and two restarts, each bounded.
pub const MAX_ROLL_OUT: Duration = Duration::from_secs(
    2 * STORE_TIMEOUT.as_secs() + 2 * crate::daemon::none_mode::OPERATION_TIMEOUT.as_secs(),
);

/// `phases install`'s exit code when the bundle could not be fetched.
pub const EXIT_FETCH_FAILED: i32 = 3;
/// `phases install`'s exit code when the bundle was refused.
pub const EXIT_REJECTED: i32 = 4;
/// `phases install`'s exit code when the bundle widens grants without consent.
pub const EXIT_GRANTS_WIDEN: i32 = 5;
/// `phases install`'s exit code for a usage error (a URL or sha256 it cannot use).
pub const EXIT_USAGE: i32 = 2;

/// Where a roll-out stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Stage {
    /// `phases install` is (or was, when a crash cut it short) running.
    Installing,
    /// The changed phases and the health gate are (or were) running.
    Checking,
    /// The bundle is current and the node passed the health gate with it.
    Active,
    /// The roll-out failed ([`RolloutRecord::failure`] says how).
    Failed,
}

/// How a roll-out failed: the `BundleApplied=False` reason it reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum FailureKind {
    /// Download, HTTP status, sha256 or size: retried after [`RETRY_AFTER`].
    FetchFailed,
    /// Signature, format, downgrade, missing phases: not retried.
    Rejected,
    /// Wider grants without the spec's consent: not retried.
    GrantsWiden,
    /// The node failed the health gate and the previous bundle is current again: retried
    /// after [`RETRY_AFTER`] until [`MAX_ATTEMPTS`].
    RolledBack,
}

/// The daemon's record of its last roll-out (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RolloutRecord {
    /// The archive sha256 the spec named.
    pub sha256: String,
    /// The consent the spec gave with it.
    pub accept_grants_digest: Option<String>,
    /// Where it stands.
    pub stage: Stage,
    /// How it failed, when it did.
    pub failure: Option<FailureKind>,
    /// Why, for the status (capped like every message).
    pub message: String,
    /// The manifest digest the install made current.
    pub digest: Option<String>,
    /// The digest that was current before it (`None`: the embedded bundle).
    pub previous: Option<String>,
    /// Attempts that failed the health gate (or were cut short) so far.
    pub attempts: u32,
    /// When it last failed, in Unix seconds.
    pub failed_at: u64,
}

impl RolloutRecord {
    /// Whether this record is about what `spec` names (archive and consent).
    pub fn is_for(&self, spec: &PhaseBundleRef) -> bool {
        self.sha256 == spec.sha256 && self.accept_grants_digest == spec.accept_grants_digest
    }
}

/// What a pass reports about the spec's bundle, and whether a roll-out is due.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Judgement {
    /// The `BundleApplied` report (`None`: the current bundle is the right one; report it).
    pub report: Option<Report>,
    /// Why a roll-out should run now, when it should.
    pub due: Option<String>,
}

/// Judges `spec` against the last roll-out `record`, the bundle store's `current` digest
/// (`None`: the embedded bundle) at `now` (Unix seconds). Pure: see the module docs.
pub fn judge(
    spec: Option<&PhaseBundleRef>,
    record: Option<&RolloutRecord>,
    current: Option<&str>,
    now: u64,
) -> Judgement {
    let quiet = |report: Report| Judgement {
        report: Some(report),
        due: None,
    };
    let Some(spec) = spec else {
        return Judgement {
            report: None,
            due: None,
        };
    };
    if let Err(e) = install_source(spec) {
        return quiet(Report::Rejected(e));
    }
    if !nodeward_node_config::is_sha256(&spec.sha256) {
        return quiet(Report::Rejected(
            "spec.phaseBundle.sha256: 64 lowercase hex digits".into(),
        ));
    }
    let due = |why: String| Judgement {
        report: Some(Report::Installing(why.clone())),
        due: Some(why),
    };
    let Some(record) = record.filter(|r| r.is_for(spec)) else {
        return due(format!(
            "the spec names bundle archive sha256 {}",
            spec.sha256
        ));
    };
    let waited = now.saturating_sub(record.failed_at) >= RETRY_AFTER.as_secs();
    match (record.stage, record.failure) {
        (Stage::Active, _) if record.digest.as_deref() == current => Judgement {
            report: None,
            due: None,
        },
        (Stage::Active, _) => due(format!(
            "the current bundle is no longer the one archive sha256 {} installed",
            spec.sha256
        )),
        (Stage::Installing | Stage::Checking, _) => {
            due("a roll-out was cut short; running it again".into())
        }
        (Stage::Failed, Some(FailureKind::Rejected)) => {
            quiet(Report::Rejected(record.message.clone()))
        }
        (Stage::Failed, Some(FailureKind::GrantsWiden)) => {
            quiet(Report::GrantsWiden(record.message.clone()))
        }
        (Stage::Failed, Some(FailureKind::FetchFailed)) if waited => {
            due(format!("retrying the download: {}", record.message))
        }
        (Stage::Failed, Some(FailureKind::FetchFailed)) => {
            quiet(Report::FetchFailed(record.message.clone()))
        }
        (Stage::Failed, Some(FailureKind::RolledBack) | None)
            if record.attempts < MAX_ATTEMPTS && waited =>
        {
            due(format!(
                "attempt {} of {MAX_ATTEMPTS} after a roll-back: {}",
                record.attempts + 1,
                record.message
            ))
        }
        (Stage::Failed, Some(FailureKind::RolledBack) | None) => {
            quiet(Report::RolledBack(format!(
                "{} (attempt {} of {MAX_ATTEMPTS})",
                record.message, record.attempts
            )))
        }
    }
}

/// The SOURCE `phases install` is given for `spec`: its URL, or `oci://` and its OCI
/// reference; else why the CLI could not use it (the `BundleRejected` message), decided here so
/// that such a spec never reaches a child.
pub fn install_source(spec: &PhaseBundleRef) -> Result<String, String> {
    match spec.location().map_err(|e| e.to_string())? {
        // The CRD's schema says as much; an object written before it was installed may not.
        BundleLocation::Url(url) if url.starts_with("https://") || url.starts_with("http://") => {
            Ok(url.to_string())
        }
        BundleLocation::Url(_) => Err("spec.phaseBundle.url: an http:// or https:// URL".into()),
        BundleLocation::OciReference(text) => OciReference::parse(text)
            .map(|r| r.to_string())
            .map_err(|e| format!("spec.phaseBundle.ociReference: {e}")),
    }
}

/// Every phase a restart can run again: what a restore runs when it cannot tell what changed.
pub fn all_rerunnable() -> Vec<String> {
    crate::node::pipeline::restart::RERUNNABLE
        .iter()
        .map(|p| p.to_string())
        .collect()
}

/// The phases of `new` a restart must run again against a node that ran `old`: those the
/// restart reruns ([`crate::node::pipeline::restart::RERUNNABLE`]) whose component, world or
/// grants differ; and whether anything the running node uses changed at all (those, or
/// `start-node`), so that the node must be restarted and checked.
pub fn changed_phases(old: &Bundle, new: &Bundle) -> (Vec<String>, bool) {
    let entry = |b: &Bundle, name: &str| -> Option<PhaseEntry> {
        b.manifest.phases.iter().find(|p| p.name == name).cloned()
    };
    let differs = |name: &str| match (entry(old, name), entry(new, name)) {
        (Some(a), Some(b)) => a.sha256 != b.sha256 || a.world != b.world || a.grants != b.grants,
        (None, None) => false,
        _ => true,
    };
    let rerun: Vec<String> = crate::node::pipeline::restart::RERUNNABLE
        .iter()
        .filter(|p| differs(p))
        .map(|p| p.to_string())
        .collect();
    let restart = !rerun.is_empty() || differs("start-node");
    (rerun, restart)
}

/// The roll-out record in the agent state directory.
#[derive(Debug, Clone)]
pub struct RecordFile {
    path: PathBuf,
}

impl RecordFile {
    /// The record of the agent state directory `state_dir`.
    pub fn new(state_dir: &Path) -> Self {
        RecordFile {
            path: state_dir.join(RECORD_FILE),
        }
    }

    /// The record; `None` when there is none. An unreadable one is an error naming the file.
    pub fn read(&self) -> Result<Option<RolloutRecord>, String> {
        let bytes = match std::fs::read(&self.path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("{}: {e}", self.path.display())),
        };
        serde_json::from_slice(&bytes).map(Some).map_err(|e| {
            format!(
                "{}: unreadable ({e}); remove it to roll the bundle out again",
                self.path.display()
            )
        })
    }

    /// Writes `record` durably (a temp file renamed over the record, fsynced).
    pub fn write(&self, record: &RolloutRecord) -> Result<(), String> {
        let fail = |e: &dyn std::fmt::Display| format!("{}: {e}", self.path.display());
        let bytes = serde_json::to_vec_pretty(record).map_err(|e| fail(&e))?;
        let dir = self.path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).map_err(|e| fail(&e))?;
        let dir = crate::durable::open_dir(dir).map_err(|e| fail(&e))?;
        // Owner-only: its messages may carry what the bundle's server answered.
        crate::durable::write_file(&dir, RECORD_FILE, &bytes, 0o600, "rollout")
            .map_err(|e| fail(&e))
    }
}

/// The current time in Unix seconds (0 before 1970).
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
#[path = "rollout_tests.rs"]
mod tests;
