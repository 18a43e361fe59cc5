//! Restarting a bootstrapped node's units in place: the `start-node` phase asked to restart
//! containerd and the kubelet, then the health waits. What `nodeward restart` and the daemon's
//! `NodeReboot` operation do; the host itself is never rebooted.

use super::*;

/// The restart groups that make `start-node` restart both units (the kubelet restarts after
/// containerd anyway; naming its config too keeps that explicit).
const RESTART_GROUPS: [&str; 2] = ["containerd-config", "kubelet-config"];

impl Node<'_> {
    /// Restarts the node's units with its applied config and waits until it is healthy again.
    /// Refused on a host without a finished bootstrap (nothing to restart).
    pub fn restart(&mut self) -> Result<Report, NodeError> {
        let _lock = self.lock()?;
        let recovered = self.recover_locked()?;
        let state = self.state();
        let config = state.applied()?.ok_or(Refusal::NoAppliedConfig)?;
        let record = state.record()?;
        let record = decide::upgradable(record.as_ref(), &config.machine_name)?.clone();
        let version = self.current_version().unwrap_or(record.version);
        let input = PhaseInput {
            restart: RESTART_GROUPS.iter().map(|g| g.to_string()).collect(),
            ..self.input(&config, &version)
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
