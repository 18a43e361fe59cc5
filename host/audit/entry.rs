//! [`Entry`]: one line of the persistent audit trail, and what it records ([`Event`]).
//!
//! # Background
//! A line is one JSON object: an envelope (`seq`, `time`, `prev`, `runId`, `agent`, `kind`)
//! and the fields of its kind, every key camelCase (`docs/schemas/audit-record.schema.json`).
//! The envelope is what the chain needs ([`super::chain`]): `seq` counts every record ever
//! written beneath this root from 1, and `prev` is the sha256 of the previous line's exact
//! bytes (64 zeros before the first record).
//!
//! Records are written by this agent and read back by `nodeward audit …`; an unknown kind is
//! an error naming the line, so a query never silently skips a record it does not understand.

use super::AuditRecord;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// `prev` of the first record ever written.
pub const ZERO_HASH: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// The agent version every record names.
pub const AGENT_VERSION: &str = env!("CARGO_PKG_VERSION");

/// One record of the trail.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Entry {
    /// Position in the trail, from 1, without gaps.
    pub seq: u64,
    /// When it was written, RFC 3339 UTC with microseconds.
    pub time: String,
    /// sha256 (hex) of the previous record's line; [`ZERO_HASH`] for the first.
    pub prev: String,
    /// The run the record is about (for an `interrupted` run end: the dangling run).
    pub run_id: String,
    /// The agent version that wrote it.
    pub agent: String,
    /// What happened.
    #[serde(flatten)]
    pub event: Event,
}

/// Plan or apply, as records name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Nothing was changed; changes were recorded.
    Plan,
    /// Changes were made.
    Apply,
}

impl Mode {
    /// `plan` or `apply`.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Plan => "plan",
            Mode::Apply => "apply",
        }
    }
}

impl Outcome {
    /// `ok`, `failed` or `interrupted`.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Failed => "failed",
            Outcome::Interrupted => "interrupted",
        }
    }
}

impl BundleAction {
    /// `install`, `rollback`, `rollforward` or `uninstall`.
    pub fn as_str(self) -> &'static str {
        match self {
            BundleAction::Install => "install",
            BundleAction::Rollback => "rollback",
            BundleAction::Rollforward => "rollforward",
            BundleAction::Uninstall => "uninstall",
        }
    }
}

/// The bundle a record is about.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BundleRef {
    /// The manifest's bundle name.
    pub name: String,
    /// The manifest's bundle version.
    pub version: u64,
    /// sha256 of the manifest.
    pub digest: String,
}

/// How a phase or a run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// It finished.
    Ok,
    /// It stopped with an error.
    Failed,
    /// The agent died before it ended (written by the next run that found it dangling).
    Interrupted,
}

/// A bundle-store change.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BundleAction {
    /// `phases install`.
    Install,
    /// `phases rollback`.
    Rollback,
    /// `phases rollforward`.
    Rollforward,
    /// `phases uninstall`.
    Uninstall,
}

/// Calls of one kind counted and not written one by one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CallCount {
    /// `interface.function`.
    pub call: String,
    /// Whether the grant refused them.
    pub denied: bool,
    /// How many.
    pub count: u64,
}

/// Changes of one kind (`file-create` …).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KindCount {
    /// The change kind, as the run report names it; `unlisted` for changes beyond the run's
    /// change list.
    pub kind: String,
    /// How many.
    pub count: u64,
}

/// `counts` as a list, in kind order.
pub fn kind_counts(counts: &BTreeMap<String, u64>) -> Vec<KindCount> {
    counts
        .iter()
        .map(|(kind, count)| KindCount {
            kind: kind.clone(),
            count: *count,
        })
        .collect()
}

/// What a record records; its `kind` tag is kebab-case.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(
    tag = "kind",
    rename_all = "kebab-case",
    rename_all_fields = "camelCase"
)]
pub enum Event {
    /// A command that runs phases or changes the bundle store started.
    RunStart {
        /// The command (`bootstrap`, `apply --phase`, `phases install` …).
        command: String,
        /// Plan or apply.
        mode: Mode,
        /// The host root.
        root: String,
        /// The agent's process ID.
        pid: u32,
    },
    /// One capability call (redacted, then bounded, like [`AuditRecord`]).
    Call {
        /// Plan or apply.
        mode: Mode,
        /// The phase that made it.
        phase: String,
        /// The bundle the phase came from.
        bundle: Option<BundleRef>,
        /// sha256 of the phase's component.
        component: Option<String>,
        /// `interface.function`.
        call: String,
        /// The arguments, redacted, then bounded, contents summarised.
        args: serde_json::Value,
        /// `ok:<outcome>` or `<error-kind>: <message>`, redacted, then bounded.
        outcome: String,
        /// Whether the grant refused it.
        denied: bool,
        /// How long it took, microseconds.
        duration_us: u64,
    },
    /// The calls of a phase run beyond its per-phase limit, counted.
    CallOverflow {
        /// The phase.
        phase: String,
        /// Counts per call and denial.
        calls: Vec<CallCount>,
    },
    /// A phase run ended.
    PhaseEnd {
        /// Plan or apply.
        mode: Mode,
        /// The phase.
        phase: String,
        /// The bundle it came from.
        bundle: Option<BundleRef>,
        /// `ok` or `failed`.
        outcome: Outcome,
        /// Why it failed (redacted).
        error: Option<String>,
        /// Capability calls it made.
        calls: u64,
        /// Of which the grant refused.
        denied: u64,
        /// Changes it made (apply) or planned (plan), per change kind (`file-create` …).
        changes: Vec<KindCount>,
        /// Wall time, milliseconds.
        duration_ms: u64,
    },
    /// A run ended.
    RunEnd {
        /// `ok`, `failed`, or `interrupted` (then written by a later run: `detectedBy`).
        outcome: Outcome,
        /// Why it failed (redacted).
        error: Option<String>,
        /// Capability calls it made (`null` when interrupted: unknown).
        calls: Option<u64>,
        /// Of which the grant refused.
        denied: Option<u64>,
        /// Changes made or planned.
        changes: Option<u64>,
        /// The run that found this one dangling.
        detected_by: Option<String>,
    },
    /// The bundle store changed.
    Bundle {
        /// What changed it.
        action: BundleAction,
        /// The bundle current afterwards; `null`: the embedded one.
        current: Option<BundleRef>,
        /// The digest of the bundle current before; `null`: the embedded one.
        from: Option<String>,
    },
    /// The writer repaired or noted something about the trail itself: `torn-tail` (a line
    /// cut off mid-write, removed), or damage it found and continued past (`audit verify`
    /// reports these as a `break`): `log-behind-head`, `head-mismatch`, `head-missing`,
    /// `head-invalid`, `floor-mismatch`.
    Repair {
        /// What it found.
        repair: String,
        /// What it found and did.
        detail: String,
        /// For `log-behind-head`: the `seq`s missing before this record, which is numbered
        /// after them (the writer never numbers below the head).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        gap: Option<super::chain::Gap>,
    },
}

impl Event {
    /// The record of a capability call.
    pub fn call(
        record: &AuditRecord,
        mode: Mode,
        bundle: Option<BundleRef>,
        component: Option<String>,
    ) -> Event {
        Event::Call {
            mode,
            phase: record.phase.clone(),
            bundle,
            component,
            call: record.call.clone(),
            args: record.args.clone(),
            outcome: record.outcome.clone(),
            denied: record.denied,
            duration_us: record.duration_us,
        }
    }

    /// The `kind` tag.
    pub fn kind(&self) -> &'static str {
        match self {
            Event::RunStart { .. } => "run-start",
            Event::Call { .. } => "call",
            Event::CallOverflow { .. } => "call-overflow",
            Event::PhaseEnd { .. } => "phase-end",
            Event::RunEnd { .. } => "run-end",
            Event::Bundle { .. } => "bundle",
            Event::Repair { .. } => "repair",
        }
    }

    /// The phase the record is about, if any.
    pub fn phase(&self) -> Option<&str> {
        match self {
            Event::Call { phase, .. }
            | Event::CallOverflow { phase, .. }
            | Event::PhaseEnd { phase, .. } => Some(phase),
            _ => None,
        }
    }

    /// The digest of the bundle the record is about, if any.
    pub fn bundle_digest(&self) -> Option<&str> {
        match self {
            Event::Call { bundle, .. } | Event::PhaseEnd { bundle, .. } => {
                bundle.as_ref().map(|b| b.digest.as_str())
            }
            Event::Bundle { current, .. } => current.as_ref().map(|b| b.digest.as_str()),
            _ => None,
        }
    }
}

/// Now, RFC 3339 UTC with microseconds (`2026-12-01T17:41:38.123456Z`).
pub fn now() -> String {
    humantime::format_rfc3339_micros(std::time::SystemTime::now()).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_round_trips_with_camel_case_keys_and_a_kebab_case_kind() {
        let e = Entry {
            seq: 7,
            time: now(),
            prev: ZERO_HASH.into(),
            run_id: "0123456789abcdef".into(),
            agent: AGENT_VERSION.into(),
            event: Event::PhaseEnd {
                mode: Mode::Apply,
                phase: "configure".into(),
                bundle: None,
                outcome: Outcome::Ok,
                error: None,
                calls: 3,
                denied: 1,
                changes: kind_counts(&BTreeMap::from([("file-create".into(), 2)])),
                duration_ms: 5,
            },
        };
        let line = serde_json::to_string(&e).expect("encode");
        assert!(line.contains("\"kind\":\"phase-end\""), "{line}");
        assert!(
            line.contains("\"runId\":") && line.contains("\"durationMs\":5"),
            "{line}"
        );
        let back: Entry = serde_json::from_str(&line).expect("decode");
        assert_eq!(back, e);
        let unknown = line.replace("\"phase-end\"", "\"bogus\"");
        assert!(serde_json::from_str::<Entry>(&unknown).is_err());
    }
}
