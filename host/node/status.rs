//! `nodeward status`: what a none node looks like right now, read without changing anything
//! and without the lock (a status during a bootstrap shows its checkpoint).
//!
//! # Guarantees
//! - Values and errors are separate fields: a unit's state is a systemd state or `null`, and
//!   why it could not be read is in its `error`; the kubelet's health is `ok`, `failing` or
//!   `unknown`, with the reason beside it; unreadable state files are listed in `errors`.
//! - A half-made node is shown as such: [`NodePresence::Partial`] or
//!   [`NodePresence::Bootstrapping`], with every [trace](crate::node::traces) listed.
//!
//! The JSON shape is `docs/schemas/status.schema.json`.

use crate::caps::RunContext;
use crate::caps::systemd::UnitName;
use crate::node::health;
use crate::node::state::{Checkpoint, NodeState, StateError};
use crate::node::traces::{self, Trace};
use crate::wit::Error;
use nodeward_node_config::layout::{CONTAINERD_UNIT, KUBELET_UNIT, Layout, NODE_DIR};
use serde::Serialize;
use std::path::Path;

/// The node's status.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    /// Always `none` for now.
    pub mode: String,
    /// Whether there is a node here, a finished one or part of one.
    pub presence: NodePresence,
    /// Whether a bootstrap finished (the install record's checkpoint is `complete`).
    pub installed: bool,
    /// The version the `current` link selects.
    pub active_version: Option<String>,
    /// Every installed version directory.
    pub versions: Vec<String>,
    /// The applied config's sha256 (from its sidecar) and whether the file matches it.
    pub applied_config: Option<AppliedStatus>,
    /// The install record's checkpoint (`complete` once bootstrapped).
    pub checkpoint: Option<String>,
    /// The machine name the install record is for.
    pub machine_name: Option<String>,
    /// An upgrade in progress (a journal).
    pub upgrade_in_progress: Option<UpgradeInProgress>,
    /// The node's units.
    pub units: Vec<UnitStatus>,
    /// The kubelet's health endpoint.
    pub kubelet_health: Health,
    /// Why the health is not `ok`.
    pub kubelet_health_error: Option<String>,
    /// Everything of a node found beneath the root.
    pub traces: Vec<Trace>,
    /// State files that exist but could not be read.
    pub errors: Vec<String>,
}

/// Whether a node is here.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum NodePresence {
    /// No trace of a node.
    Absent,
    /// Traces of a node but no install record: phases applied by hand, or a reset cut short.
    Partial,
    /// An install record whose checkpoint is not `complete`: a bootstrap stopped (or runs).
    Bootstrapping,
    /// A finished bootstrap.
    Installed,
}

/// The kubelet's health.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Health {
    /// The health endpoint answered ok.
    Ok,
    /// It did not (the error says how).
    Failing,
    /// There is no applied config to find the endpoint in.
    Unknown,
}

/// An upgrade in progress.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UpgradeInProgress {
    /// The version it started from (and rolls back to).
    pub from: String,
    /// The version it goes to.
    pub to: String,
}

/// The applied config.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AppliedStatus {
    /// The sidecar's sha256.
    pub sha256: String,
    /// Whether the file still matches it.
    pub verified: bool,
    /// Its Kubernetes version.
    pub kubernetes_version: Option<String>,
}

/// One unit.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UnitStatus {
    /// The unit.
    pub unit: String,
    /// `active`, `inactive`, `failed`, ...; `null` when it could not be read.
    pub active_state: Option<String>,
    /// `running`, `dead`, ...; `null` when it could not be read.
    pub sub_state: Option<String>,
    /// Why the state could not be read (e.g. systemd is not reachable).
    pub error: Option<String>,
}

/// Reads the status of the node `layout` describes, asking systemd through the run context's
/// manager.
pub fn read(layout: &Layout, session: &RunContext) -> Status {
    let root = Path::new(&layout.root);
    let state = NodeState::new(root);
    let mut errors = Vec::new();
    let record = readable(state.record(), &mut errors);
    let journal = readable(state.journal(), &mut errors);
    let applied = readable(state.applied(), &mut errors);
    let applied_config = state.applied_digest().map(|sha256| AppliedStatus {
        sha256,
        verified: applied.is_some(),
        kubernetes_version: applied
            .as_ref()
            .map(|c| c.cluster.kubernetes_version.clone()),
    });
    let active_version = state.active_version();
    let mut versions: Vec<String> = std::fs::read_dir(root.join(NODE_DIR))
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    versions.sort();
    let units = [CONTAINERD_UNIT, KUBELET_UNIT]
        .iter()
        .map(|u| unit_status(u, session))
        .collect();
    let (kubelet_health, kubelet_health_error) = match &applied {
        Some(c) => match health::kubelet_healthy(c) {
            Ok(()) => (Health::Ok, None),
            Err(e) => (
                Health::Failing,
                Some(format!("{}: {e}", health::healthz_url(c))),
            ),
        },
        None => (Health::Unknown, Some("no applied config".to_string())),
    };
    let traces = traces::find(layout);
    let presence = match &record {
        Some(r) if r.checkpoint == Checkpoint::Complete => NodePresence::Installed,
        Some(_) => NodePresence::Bootstrapping,
        None if traces.is_empty() => NodePresence::Absent,
        None => NodePresence::Partial,
    };
    Status {
        mode: "none".into(),
        presence,
        installed: presence == NodePresence::Installed,
        active_version,
        versions,
        applied_config,
        checkpoint: record.as_ref().map(|r| r.checkpoint.name().to_string()),
        machine_name: record.map(|r| r.machine_name),
        upgrade_in_progress: journal.map(|j| UpgradeInProgress {
            from: j.from_version,
            to: j.to_version,
        }),
        units,
        kubelet_health,
        kubelet_health_error,
        traces,
        errors,
    }
}

/// A state file's contents; `None` when it is absent or unreadable (why, into `errors`).
fn readable<T>(r: Result<Option<T>, StateError>, errors: &mut Vec<String>) -> Option<T> {
    r.unwrap_or_else(|e| {
        errors.push(e.to_string());
        None
    })
}

/// `unit`'s state, or why it could not be read.
fn unit_status(unit: &str, session: &RunContext) -> UnitStatus {
    let state = session
        .systemd
        .manager()
        .and_then(|systemd| systemd.status(&UnitName::try_from(unit)?));
    match state {
        Ok(s) => UnitStatus {
            unit: unit.to_string(),
            active_state: Some(s.active_state),
            sub_state: Some(s.sub_state),
            error: None,
        },
        Err(e) => UnitStatus {
            unit: unit.to_string(),
            active_state: None,
            sub_state: None,
            error: Some(describe(&e)),
        },
    }
}

/// A capability error as people read it: its kind, then its message (the generated
/// `Display` is Rust debug text).
fn describe(e: &Error) -> String {
    let (kind, message) = match e {
        Error::Denied(m) => ("denied", m),
        Error::InvalidArgument(m) => ("invalid argument", m),
        Error::NotFound(m) => ("not found", m),
        Error::Escape(m) => ("escape", m),
        Error::Io(m) => ("i/o error", m),
        Error::Failed(m) => ("failed", m),
        Error::Timeout(m) => ("timed out", m),
        Error::Unavailable(m) => ("unavailable", m),
    };
    format!("{kind}: {message}")
}
