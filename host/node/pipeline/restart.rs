//! Restarting a bootstrapped node's units in place: the `start-node` phase asked to restart
//! containerd and the kubelet, then the health waits. What `nodeward restart` and the daemon's
//! `NodeReboot` operation do; the host itself is never rebooted.
//!
//! With phases to run again ([`RERUNNABLE`]), they run first, in pipeline order, with the
//! applied config and the active version: what puts a new bundle's changed phases to work
//! (`nodeward restart --phase configure`, the daemon's bundle roll-out). The health waits after
//! the restart are the roll-out's health gate.

use super::*;

/// The restart groups that make `start-node` restart both units (the kubelet restarts after
/// containerd anyway; naming its config too keeps that explicit).
const RESTART_GROUPS: [&str; 2] = ["containerd-config", "kubelet-config"];

/// The phases a restart may run again before restarting, in the order it runs them: the
/// provisioning phases of the upgrade pipeline, each idempotent against a running node.
/// (`start-node` always runs; `preflight`, `stop-node` and `teardown` belong to bootstrap,
/// upgrade and reset.)
pub const RERUNNABLE: [&str; 4] = ["setup-host", "download-artifacts", "install", "configure"];

impl Node<'_> {
    /// Restarts the node's units with its applied config and waits until it is healthy again.
    /// Refused on a host without a finished bootstrap (nothing to restart).
    /// `rerun` names phases of [`RERUNNABLE`] to run again first; another name is refused
    /// before anything runs.
    pub fn restart(&mut self, rerun: &[String]) -> Result<Report, NodeError> {
        if let Some(other) = rerun.iter().find(|p| !RERUNNABLE.contains(&p.as_str())) {
            return Err(NodeError::NotRerunnable(other.clone()));
        }
        let _lock = self.lock()?;
        let recovered = self.recover_locked()?;
        let state = self.state();
        let config = state.applied()?.ok_or(Refusal::NoAppliedConfig)?;
        let record = state.record()?;
        let record = decide::upgradable(record.as_ref(), &config.machine_name)?.clone();
        let version = self.current_version().unwrap_or(record.version);
        let input = self.input(&config, &version);
        for phase in RERUNNABLE.iter().filter(|p| rerun.iter().any(|r| r == *p)) {
            self.phase(phase, &input)?;
        }
        let input = PhaseInput {
            restart: RESTART_GROUPS.iter().map(|g| g.to_string()).collect(),
            ..input
        };
        // Statuses posted from now on are the restarted kubelet's.
        let restarted = std::time::SystemTime::now();
        self.phase("start-node", &input)?;
        let ready = self.wait_healthy(&config, Some(restarted))?;
        let mut report = self.report("restart", Some(version));
        report.kubelet_version = Some(ready.kubelet_version);
        report.recovered = recovered;
        report.mutations = self.session.changes().len();
        Ok(report)
    }
}
