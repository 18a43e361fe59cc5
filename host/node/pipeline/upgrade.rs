//! The journaled upgrade and its recovery: provision beside the running stack, journal, switch,
//! wait, persist, prune; a failure (or, on the next run, a crash) rolls back to the journal's
//! version. See the parent module's docs for the whole flow.

use super::*;
use crate::node::decide::{Recovery, Upgrade};

impl Node<'_> {
    /// Upgrades a bootstrapped node to `config`; see the module docs.
    pub fn upgrade(
        &mut self,
        config: &NodeConfig,
        config_source: &str,
    ) -> Result<Report, NodeError> {
        let arch = version::arch();
        let artifacts = version::artifacts(config, arch);
        version::require_pinned(&artifacts, config_source).map_err(Refusal::from)?;
        let _lock = self.lock()?;
        let recovered = self.recover_locked()?;
        let state = self.state();
        let record = state.record()?;
        let mut record = decide::upgradable(record.as_ref(), &config.machine_name)?.clone();
        let previous = state.applied()?;
        let previous_fingerprint = previous.as_ref().map(version::fingerprint).transpose()?;
        let fingerprint = version::fingerprint(config)?;
        let to = version::version_name(config, arch, &artifacts);
        let current = self.current_version();
        let from = match decide::upgrade(
            previous_fingerprint.as_deref(),
            &fingerprint,
            current.as_deref(),
            &record.version,
            &to,
        )? {
            Upgrade::Switch { from } => from,
            Upgrade::Unchanged => {
                let mut report = self.report("upgrade", Some(to));
                report.recovered = recovered;
                return Ok(report);
            }
        };
        // `decide::upgrade` refused already when there is none.
        let previous = previous.ok_or(Refusal::NoAppliedConfig)?;

        self.preflight_checks(config)?;
        let input = self.input(config, &to);
        // Provision beside the running stack.
        self.phase("setup-host", &input)?;
        self.phase("download-artifacts", &input)?;
        let journal = Journal {
            schema: SCHEMA,
            from_version: from.clone(),
            to_version: to.clone(),
            to_fingerprint: fingerprint.clone(),
            previous_config: previous,
        };
        state.write_journal(&self.session, &journal)?;
        let ready = match self.switch(config, &input) {
            Ok(r) => r,
            Err(cause) => {
                self.rollback(&journal)?;
                return Err(NodeError::RolledBack {
                    to,
                    from,
                    cause: Box::new(cause),
                });
            }
        };
        self.persist(config)?;
        record.config_fingerprint = fingerprint;
        record.version = to.clone();
        state.write_record(&self.session, &record)?;
        self.commit(&input, &journal)?;
        self.evict_cache(config)?;
        let mut report = self.report("upgrade", Some(to));
        report.kubelet_version = Some(ready.kubelet_version);
        report.recovered = recovered;
        report.mutations = self.session.changes().len();
        Ok(report)
    }

    /// Stops the stack, switches to `input.version` and starts it with `config`.
    fn switch(&mut self, config: &NodeConfig, input: &PhaseInput) -> Result<NodeReady, NodeError> {
        self.phase("stop-node", input)?;
        self.phase("install", input)?;
        self.phase("configure", input)?;
        let start = PhaseInput {
            restart: vec![
                "binaries".into(),
                "containerd-config".into(),
                "kubelet-config".into(),
            ],
            ..input.clone()
        };
        // The old kubelet is stopped: a Node status posted from now on is the new kubelet's.
        let restarted = std::time::SystemTime::now();
        self.phase("start-node", &start)?;
        self.wait_healthy(config, Some(restarted))
    }

    /// Records the version the node ran before (its artifacts stay in the cache:
    /// [`crate::node::cache`]), prunes every other version, then drops the journal: a crash
    /// between any two is finished by [`Node::recover`], which does all three again.
    fn commit(&mut self, input: &PhaseInput, journal: &Journal) -> Result<(), NodeError> {
        crate::node::cache::write_previous(&self.state(), &self.session, journal)?;
        let prune = PhaseInput {
            prune: true,
            ..input.clone()
        };
        self.phase("install", &prune)?;
        self.state().drop_journal(&self.session)?;
        Ok(())
    }

    /// Returns to the journal's version and configuration, then drops the journal.
    fn rollback(&mut self, j: &Journal) -> Result<(), NodeError> {
        tracing::warn!(from = %j.to_version, to = %j.from_version, "rolling back an upgrade");
        let config = &j.previous_config;
        let input = self.input(config, &j.from_version);
        self.switch(config, &input)?;
        self.persist(config)?;
        self.point_record_at(config, &j.from_version)?;
        self.state().drop_journal(&self.session)?;
        Ok(())
    }

    /// Makes the install record (if any) name `config` on `version`, writing only if it
    /// does not already.
    fn point_record_at(&self, config: &NodeConfig, version: &str) -> Result<(), NodeError> {
        let state = self.state();
        if let Some(mut r) = state.record()? {
            let fp = version::fingerprint(config)?;
            if r.config_fingerprint != fp || r.version != version {
                r.config_fingerprint = fp;
                r.version = version.to_string();
                state.write_record(&self.session, &r)?;
            }
        }
        Ok(())
    }

    /// Finishes or rolls back an upgrade a crash interrupted (takes the lock).
    pub fn recover(&mut self) -> Result<Report, NodeError> {
        let _lock = self.lock()?;
        let recovered = self.recover_locked()?;
        let mut report = self.report("recover", self.current_version());
        report.recovered = recovered;
        Ok(report)
    }

    /// The recovery itself (see [`decide::recovery`]): finish an upgrade that got as far as
    /// its commit, roll back any other.
    pub(super) fn recover_locked(&mut self) -> Result<Option<String>, NodeError> {
        let state = self.state();
        let journal = state.journal()?;
        // Read only when there is a journal; unreadable counts as missing (a rollback).
        let applied = match journal {
            Some(_) => state.applied().ok().flatten(),
            None => None,
        };
        let applied_fingerprint = applied.as_ref().map(version::fingerprint).transpose()?;
        let current = self.current_version();
        let decision = decide::recovery(
            journal.as_ref(),
            applied_fingerprint.as_deref(),
            current.as_deref(),
        );
        match (decision, journal, applied) {
            (Recovery::Nothing, ..) | (_, None, _) => Ok(None),
            (Recovery::Finish, Some(j), Some(config)) => {
                let input = self.input(&config, &j.to_version);
                self.point_record_at(&config, &j.to_version)?;
                // The agent may have stopped right after it stopped the stack: start it.
                self.phase("start-node", &input)?;
                self.commit(&input, &j)?;
                Ok(Some(format!(
                    "finished the interrupted upgrade {} -> {}",
                    j.from_version, j.to_version
                )))
            }
            (_, Some(j), _) => {
                self.rollback(&j)?;
                Ok(Some(format!(
                    "rolled back the interrupted upgrade {} -> {}",
                    j.from_version, j.to_version
                )))
            }
        }
    }
}
