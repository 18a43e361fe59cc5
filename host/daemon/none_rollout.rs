//! The none-mode bundle roll-out ([`crate::daemon::rollout`]'s steps as child runs).

use crate::bundle::Bundle;
use crate::bundle::store::{CURRENT, Store};
use crate::daemon::child::{cap, failure};
use crate::daemon::none_mode::NoneOperator;
use crate::daemon::reconcile::OperatorError;
use crate::daemon::rollout::{
    self, EXIT_GRANTS_WIDEN, EXIT_REJECTED, EXIT_USAGE, FailureKind, RecordFile, RolloutRecord,
    STORE_TIMEOUT, Stage, install_source,
};
use nodeward_api::machine::PhaseBundleRef;
use std::ffi::OsString;

impl NoneOperator {
    /// Rolls out the bundle `spec` names (see [`crate::daemon::rollout`]); a summary for the
    /// status, or why it failed (the record says how).
    pub async fn roll_out(&self, spec: &PhaseBundleRef) -> Result<String, OperatorError> {
        let file = RecordFile::new(&self.state_dir);
        let store = Store::new(&self.state_dir);
        let last = file.read().ok().flatten();
        let prior = last.as_ref().filter(|r| r.is_for(spec));
        // The bundle known good before: the one a roll-out that has not succeeded recorded
        // (the failed bundle may still be current, whatever the spec says now), else the
        // current one.
        let unfinished = last.as_ref().filter(|r| r.stage != Stage::Active);
        let previous = match unfinished {
            Some(r) => r.previous.clone(),
            None => current(&store)?,
        };
        let cut_short =
            prior.is_some_and(|r| matches!(r.stage, Stage::Installing | Stage::Checking));
        let attempts = prior.map_or(0, |r| r.attempts) + u32::from(cut_short);
        let mut record = RolloutRecord {
            sha256: spec.sha256.clone(),
            accept_grants_digest: spec.accept_grants_digest.clone(),
            stage: Stage::Installing,
            failure: None,
            message: String::new(),
            digest: None,
            previous: previous.clone(),
            attempts,
            failed_at: 0,
        };
        if cut_short && attempts >= rollout::MAX_ATTEMPTS {
            // Cut short as often as the budget allows (a bundle that takes the host or the
            // daemon down): restore, do not try again.
            let restored = self
                .restore(previous.as_deref(), &rollout::all_rerunnable())
                .await;
            let e = OperatorError(format!(
                "the roll-out was cut short {attempts} times; rolled back to {}",
                name(previous.as_deref())
            ));
            return Err(self.fail(&file, record, FailureKind::RolledBack, joined(e, restored)));
        }
        self.record(&file, &record)?;

        let before = current(&store)?;
        let installed = self.install(spec).await;
        // An install that failed after it switched the store (its audit record, a kill) still
        // made the bundle current: whether `current` moved decides, not the exit code.
        let now_current = current(&store)?;
        if let Err((kind, e)) = installed
            && now_current == before
        {
            return Err(self.fail(&file, record, kind, e));
        }
        // The spec's bundle is current now. Only when it also was before the roll-out did it
        // pass the gate already; one a failed restore left current goes through it again.
        record.digest = now_current.clone();
        if now_current == previous {
            record.stage = Stage::Active;
            self.record(&file, &record)?;
            return Ok(format!(
                "bundle archive {} is current already",
                short(&spec.sha256)
            ));
        }
        let (rerun, restart) = match (
            load(&store, previous.as_deref()),
            load(&store, now_current.as_deref()),
        ) {
            (Ok(old), Ok(new)) => rollout::changed_phases(&old, &new),
            (Err(e), _) | (_, Err(e)) => {
                let e = OperatorError(format!("cannot compare the bundles: {e}"));
                let restored = self
                    .restore(previous.as_deref(), &rollout::all_rerunnable())
                    .await;
                return Err(self.fail(&file, record, FailureKind::Rejected, joined(e, restored)));
            }
        };
        record.stage = Stage::Checking;
        self.record(&file, &record)?;
        if restart && let Err(e) = self.restart_with(&rerun).await {
            let restored = self.restore(previous.as_deref(), &rerun).await;
            record.attempts += 1;
            let e = OperatorError(format!(
                "the node did not pass the roll-out with it (a changed phase or the health gate failed: {e}); rolled back to {}",
                name(previous.as_deref())
            ));
            return Err(self.fail(&file, record, FailureKind::RolledBack, joined(e, restored)));
        }
        record.stage = Stage::Active;
        self.record(&file, &record)?;
        let digest = name(now_current.as_deref());
        Ok(if restart {
            format!(
                "bundle {digest} current; ran {} and restarted the node: healthy",
                if rerun.is_empty() {
                    "no phase again".into()
                } else {
                    rerun.join(", ")
                }
            )
        } else {
            format!("bundle {digest} current; no phase the running node uses changed")
        })
    }

    /// `nodeward phases install SOURCE --sha256 … [--accept-grants-digest …]` (SOURCE: the URL,
    /// or `oci://` and the reference): how it failed, by its exit code.
    async fn install(&self, spec: &PhaseBundleRef) -> Result<(), (FailureKind, OperatorError)> {
        // `judge` refused a spec without a usable source before a roll-out was due.
        let source = install_source(spec).map_err(|e| (FailureKind::Rejected, OperatorError(e)))?;
        let mut args: Vec<OsString> = vec![
            "phases".into(),
            "install".into(),
            "--sha256".into(),
            spec.sha256.clone().into(),
        ];
        if let Some(d) = &spec.accept_grants_digest {
            args.push("--accept-grants-digest".into());
            args.push(d.into());
        }
        args.extend(self.store_flags.iter().cloned());
        // Whatever the spec's URL or reference looks like, it is the source, never a flag.
        args.push("--".into());
        args.push(source.into());
        let finished = self
            .children
            .run(&args, STORE_TIMEOUT)
            .await
            .map_err(|e| (FailureKind::FetchFailed, e))?;
        if finished.success() {
            return Ok(());
        }
        let kind = match finished.code {
            // Refused, or a spec the CLI cannot use (exit 2): final until the spec changes.
            Some(EXIT_REJECTED | EXIT_USAGE) => FailureKind::Rejected,
            Some(EXIT_GRANTS_WIDEN) => FailureKind::GrantsWiden,
            // Not fetched (EXIT_FETCH_FAILED), and anything else (a busy store, a full disk, a
            // signal): retried later.
            _ => FailureKind::FetchFailed,
        };
        Err((kind, failure(&args, &finished)))
    }

    /// `nodeward restart --phase … --wait-timeout …`: the changed phases, the restart and the
    /// health gate.
    async fn restart_with(&self, rerun: &[String]) -> Result<String, OperatorError> {
        let mut extra: Vec<OsString> = Vec::new();
        for p in rerun {
            extra.push("--phase".into());
            extra.push(p.into());
        }
        extra.push("--wait-timeout".into());
        extra.push(self.health_timeout.as_secs().max(1).to_string().into());
        self.run("restart", None, &extra).await
    }

    /// Makes `previous` (`None`: the embedded bundle) current again when it is not, with a
    /// rollback that must land exactly there, then runs `rerun` under it and restarts the node;
    /// why that failed, if it did.
    async fn restore(&self, previous: Option<&str>, rerun: &[String]) -> Result<(), OperatorError> {
        let store = Store::new(&self.state_dir);
        if current(&store)?.as_deref() != previous {
            let mut args: Vec<OsString> = vec![
                "phases".into(),
                "rollback".into(),
                "--expect".into(),
                previous.unwrap_or("embedded").into(),
            ];
            args.extend(self.store_flags.iter().cloned());
            self.children.succeed(&args, STORE_TIMEOUT).await?;
            if current(&store)?.as_deref() != previous {
                return Err(OperatorError(format!(
                    "after the rollback {} is still not current",
                    name(previous)
                )));
            }
        }
        self.restart_with(rerun).await?;
        Ok(())
    }

    /// Records the roll-out failed with `kind` and `e`; `e`.
    fn fail(
        &self,
        file: &RecordFile,
        mut record: RolloutRecord,
        kind: FailureKind,
        e: OperatorError,
    ) -> OperatorError {
        record.stage = Stage::Failed;
        record.failure = Some(kind);
        record.message = cap(&e.0);
        record.failed_at = rollout::unix_now();
        if let Err(w) = self.record(file, &record) {
            tracing::warn!(error = %w, "cannot record the failed roll-out");
        }
        e
    }

    fn record(&self, file: &RecordFile, record: &RolloutRecord) -> Result<(), OperatorError> {
        file.write(record).map_err(OperatorError)
    }
}

/// The digest the store's `current` names (`None`: the embedded bundle).
fn current(store: &Store) -> Result<Option<String>, OperatorError> {
    store
        .link(CURRENT)
        .map_err(|e| OperatorError(e.to_string()))
}

/// A bundle's name in messages: its digest's first 16 hex digits, or "the embedded bundle".
fn name(digest: Option<&str>) -> String {
    digest.map_or("the embedded bundle".into(), short)
}

/// The installed bundle `digest`, or the embedded one for `None`.
fn load(store: &Store, digest: Option<&str>) -> Result<Bundle, String> {
    match digest {
        Some(d) => store.load(d).map_err(|e| e.to_string()),
        None => Bundle::embedded().map_err(|e| e.to_string()),
    }
}

/// `e`, and what restoring the previous bundle failed with.
fn joined(e: OperatorError, restored: Result<(), OperatorError>) -> OperatorError {
    match restored {
        Ok(()) => e,
        Err(r) => OperatorError(format!(
            "{e}; restoring the previous bundle failed too: {r}"
        )),
    }
}

/// The first 16 hex digits of a digest.
fn short(digest: &str) -> String {
    digest.chars().take(16).collect()
}
