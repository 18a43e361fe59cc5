//! The none-mode bundle roll-out ([`crate::daemon::rollout`]'s steps as child runs).

use crate::bundle::Bundle;
use crate::bundle::store::{CURRENT, Store};
use crate::daemon::child::{cap, failure};
use crate::daemon::none_mode::NoneOperator;
use crate::daemon::reconcile::OperatorError;
use crate::daemon::rollout::{
    self, EXIT_GRANTS_WIDEN, EXIT_REJECTED, FailureKind, RecordFile, RolloutRecord, Stage,
};
use nodeward_api::machine::PhaseBundleRef;
use std::ffi::OsString;
use std::time::Duration;

/// The longest `phases install` (download, verification, precompilation) or `phases rollback`
/// may run.
const STORE_TIMEOUT: Duration = Duration::from_secs(10 * 60);

impl NoneOperator {
    /// Rolls out the bundle `spec` names (see [`crate::daemon::rollout`]); a summary for the
    /// status, or why it failed (the record says how).
    pub async fn roll_out(&self, spec: &PhaseBundleRef) -> Result<String, OperatorError> {
        let file = RecordFile::new(&self.state_dir);
        let store = Store::new(&self.state_dir);
        let prior = file.read().ok().flatten().filter(|r| r.is_for(spec));
        let resumed = prior
            .as_ref()
            .filter(|r| matches!(r.stage, Stage::Installing | Stage::Checking));
        // A cut-short attempt counts; the bundle current before it is the one it recorded.
        let attempts = prior.as_ref().map_or(0, |r| r.attempts) + u32::from(resumed.is_some());
        let previous = match resumed {
            Some(r) => r.previous.clone(),
            None => store
                .link(CURRENT)
                .map_err(|e| OperatorError(e.to_string()))?,
        };
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
        self.record(&file, &record)?;

        if let Err((kind, e)) = self.install(spec).await {
            return Err(self.fail(&file, record, kind, e));
        }
        let current = store
            .link(CURRENT)
            .map_err(|e| OperatorError(e.to_string()))?;
        record.digest = current.clone();
        if current == previous {
            record.stage = Stage::Active;
            self.record(&file, &record)?;
            return Ok(format!(
                "bundle archive {} is current already",
                short(&spec.sha256)
            ));
        }
        let (rerun, restart) = match (
            load(&store, previous.as_deref()),
            load(&store, current.as_deref()),
        ) {
            (Ok(old), Ok(new)) => rollout::changed_phases(&old, &new),
            (Err(e), _) | (_, Err(e)) => {
                let e = OperatorError(format!("cannot compare the bundles: {e}"));
                let restored = self.restore(&[], false).await;
                return Err(self.fail(&file, record, FailureKind::Rejected, joined(e, restored)));
            }
        };
        record.stage = Stage::Checking;
        self.record(&file, &record)?;
        if restart && let Err(e) = self.restart_with(&rerun).await {
            let restored = self.restore(&rerun, true).await;
            record.attempts += 1;
            let e = OperatorError(format!(
                "the node failed the health gate with it ({e}); rolled back to {}",
                previous
                    .as_deref()
                    .map_or("the embedded bundle".into(), short)
            ));
            return Err(self.fail(&file, record, FailureKind::RolledBack, joined(e, restored)));
        }
        record.stage = Stage::Active;
        self.record(&file, &record)?;
        Ok(if restart {
            format!(
                "bundle {} current; ran {} and restarted the node: healthy",
                current.as_deref().map_or(String::new(), short),
                if rerun.is_empty() {
                    "no phase again".into()
                } else {
                    rerun.join(", ")
                }
            )
        } else {
            format!(
                "bundle {} current; no phase the running node uses changed",
                current.as_deref().map_or(String::new(), short)
            )
        })
    }

    /// `nodeward phases install URL --sha256 … [--accept-grants-digest …]`: how it failed, by
    /// its exit code.
    async fn install(&self, spec: &PhaseBundleRef) -> Result<(), (FailureKind, OperatorError)> {
        let url = spec.url.clone().unwrap_or_default();
        let mut args: Vec<OsString> = vec![
            "phases".into(),
            "install".into(),
            url.into(),
            "--sha256".into(),
            spec.sha256.clone().into(),
        ];
        if let Some(d) = &spec.accept_grants_digest {
            args.push("--accept-grants-digest".into());
            args.push(d.into());
        }
        args.extend(self.store_flags.iter().cloned());
        let finished = self
            .children
            .run(&args, STORE_TIMEOUT)
            .await
            .map_err(|e| (FailureKind::FetchFailed, e))?;
        if finished.success() {
            return Ok(());
        }
        let kind = match finished.code {
            Some(EXIT_REJECTED) => FailureKind::Rejected,
            Some(EXIT_GRANTS_WIDEN) => FailureKind::GrantsWiden,
            // A fetch failure (EXIT_FETCH_FAILED), and anything else (a busy store, a full
            // disk): retried later.
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

    /// Makes the previous bundle current again and, when `restart`, runs the same phases under
    /// it and restarts the node; why that failed, if it did.
    async fn restore(&self, rerun: &[String], restart: bool) -> Result<(), OperatorError> {
        let mut args: Vec<OsString> = vec!["phases".into(), "rollback".into()];
        args.extend(self.store_flags.iter().cloned());
        self.children.succeed(&args, STORE_TIMEOUT).await?;
        if restart {
            self.restart_with(rerun).await?;
        }
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
