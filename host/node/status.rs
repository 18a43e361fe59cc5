//! `nodeward status`: what a none node looks like right now, read without changing anything
//! and without the lock (a status during a bootstrap shows its checkpoint).

use crate::caps::RunContext;
use crate::caps::systemd::UnitName;
use crate::node::health;
use crate::node::state::NodeState;
use nodeward_node_config::layout::{CONTAINERD_UNIT, KUBELET_UNIT, NODE_DIR};
use serde::Serialize;
use std::path::Path;

/// The node's status.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    /// Always `none` for now.
    pub mode: String,
    /// Whether any trace of a node is there (state files, versions, units).
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
    /// An upgrade in progress (a journal): `from -> to`.
    pub upgrade_in_progress: Option<String>,
    /// Unit name → `active-state/sub-state`, or why it could not be read.
    pub units: Vec<UnitStatus>,
    /// `ok`, or why the kubelet's health endpoint did not answer ok.
    pub kubelet_health: String,
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
    /// `active`, `inactive`, `failed`, ...; or `unknown: <why>`.
    pub active_state: String,
    /// `running`, `dead`, ...
    pub sub_state: String,
}

/// Reads the status beneath `root`, asking systemd through the run context's manager.
pub fn read(root: &Path, session: &RunContext) -> Status {
    let state = NodeState::new(root);
    let record = state.record().ok().flatten();
    let journal = state.journal().ok().flatten();
    let applied = state.applied();
    let applied_config = state.applied_digest().map(|sha256| AppliedStatus {
        sha256,
        verified: matches!(applied, Ok(Some(_))),
        kubernetes_version: applied
            .as_ref()
            .ok()
            .and_then(|c| c.as_ref())
            .map(|c| c.cluster.kubernetes_version.clone()),
    });
    let active_version = state.active_version();
    let mut versions: Vec<String> = std::fs::read_dir(root.join(NODE_DIR))
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false))
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    versions.sort();
    let units: Vec<UnitStatus> = [CONTAINERD_UNIT, KUBELET_UNIT]
        .iter()
        .map(|u| {
            match session
                .systemd
                .manager()
                .and_then(|systemd| systemd.status(&UnitName::try_from(*u)?))
            {
                Ok(s) => UnitStatus {
                    unit: u.to_string(),
                    active_state: s.active_state,
                    sub_state: s.sub_state,
                },
                Err(e) => UnitStatus {
                    unit: u.to_string(),
                    active_state: format!("unknown: {e}"),
                    sub_state: String::new(),
                },
            }
        })
        .collect();
    let kubelet_health = match applied.as_ref().ok().and_then(|c| c.as_ref()) {
        Some(c) => match health::kubelet_healthy(c) {
            Ok(()) => "ok".to_string(),
            Err(e) => format!("{}: {e}", health::healthz_url(c)),
        },
        None => "unknown: no applied config".to_string(),
    };
    let installed = state.any() || active_version.is_some() || !versions.is_empty();
    Status {
        mode: "none".into(),
        installed,
        active_version,
        versions,
        applied_config,
        checkpoint: record.as_ref().map(|r| r.checkpoint.name().to_string()),
        machine_name: record.map(|r| r.machine_name),
        upgrade_in_progress: journal.map(|j| format!("{} -> {}", j.from_version, j.to_version)),
        units,
        kubelet_health,
    }
}
