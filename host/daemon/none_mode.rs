//! [`NoneOperator`]: the daemon's [`ModeOperator`] for none mode (the node runs on the host).
//!
//! # Background
//! Measuring the node is reading its state files (install record, upgrade journal, applied
//! config) and the bundle store, which the daemon does itself. Changing the node is a
//! `nodeward` run: the daemon runs its own binary (`nodeward upgrade`, `restart`, `reset`) with
//! the flags it was given, as a child process. So every change the daemon makes is one
//! audited run with its own run id, under the node lock, with the same crash recovery as a run
//! by hand; a phase that exhausts its memory budget or a bug in a pipeline ends that child,
//! never the daemon; and the daemon itself never instantiates a component, which keeps its
//! idle memory small.
//!
//! # Guarantees
//! - Every change is a child run ([`crate::daemon::child`]): bounded by [`OPERATION_TIMEOUT`],
//!   the watchdog fed meanwhile, its error the child's last stderr line, capped.
//! - A repave is `nodeward upgrade` (the journaled upgrade, rolled back on failure) to the
//!   config the spec resolves to ([`resolve`]), written for it owner-only in the agent state
//!   directory and removed when it ends; a failed repave is not retried for the same
//!   generation of the spec.
//!
//! # Caveats
//! The memory of a failed repave is the daemon's: after a restart, the daemon tries that
//! generation once more.
//!
//! A bundle roll-out (`spec.phaseBundle`) is [`crate::daemon::rollout`]'s.

use crate::audit::head::HEADS_DIR;
use crate::bundle::select;
use crate::bundle::store::Store;
use crate::daemon::child::Children;
use crate::daemon::reconcile::{ModeOperator, OperatorError};
use crate::daemon::resolve::{self, Unresolved};
use crate::daemon::rollout;
use crate::daemon::status::{Bootstrap, Bundle, Outcome, Update};
use crate::node::state::{Checkpoint, NodeLock, NodeState};
use crate::node::version;
use nodeward_api::Machine;
use nodeward_api::machine::{ActiveBundle, AuditHead};
use nodeward_node_config::NodeConfig;
use std::cell::RefCell;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The longest a `restart` or `reset` child may run (its health waits included).
pub const OPERATION_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// The none-mode operator; see the module docs.
#[derive(Debug)]
pub struct NoneOperator {
    /// How the daemon runs its own binary (and feeds the watchdog meanwhile).
    pub children: Children,
    /// The host root.
    pub root: PathBuf,
    /// The agent state directory (the bundle store, the audit trail's head).
    pub state_dir: PathBuf,
    /// The audit trail's directory (`--audit-dir`, else beneath the root).
    pub audit_dir: PathBuf,
    /// The flags every node command takes, as the daemon was given them (`--root`,
    /// `--unit-dir`, `--state-dir`, `--audit-dir`).
    pub flags: Vec<OsString>,
    /// The flags of the bundle store's commands (`phases install|rollback`): the same without
    /// `--unit-dir`.
    pub store_flags: Vec<OsString>,
    /// The daemon's `--config`: the base of a Machine without `spec.config` (else the node's
    /// applied config), and the `--config` of a `reset`.
    pub config: Option<PathBuf>,
    /// The last repave that failed: the Machine generation it was for, and why. Reported as
    /// `UpdateFailed` (and not retried) until the spec's generation moves.
    pub failed_repave: RefCell<Option<(Option<i64>, String)>>,
    /// How long a bundle roll-out's health gate waits (`restart --wait-timeout`).
    pub health_timeout: Duration,
}

impl NoneOperator {
    /// Runs `nodeward <command> <flags> [--config FILE] [extra]` (`config`, else the daemon's
    /// own) for at most [`OPERATION_TIMEOUT`]; its error line when it fails.
    pub(crate) async fn run(
        &self,
        command: &str,
        config: Option<&Path>,
        extra: &[OsString],
    ) -> Result<String, OperatorError> {
        let config = config.or(self.config.as_deref());
        let mut args: Vec<OsString> = vec![command.into()];
        args.extend(self.flags.iter().cloned());
        if let Some(c) = config {
            args.push("--config".into());
            args.push(c.into());
        }
        args.extend(extra.iter().cloned());
        self.children.succeed(&args, OPERATION_TIMEOUT).await?;
        Ok(format!("nodeward {command} succeeded"))
    }

    /// The config `machine`'s spec resolves to (see [`resolve`]).
    fn wanted(&self, machine: &Machine, applied: &NodeConfig) -> Result<NodeConfig, Unresolved> {
        let fallback = match &self.config {
            Some(path) => crate::config::load(Some(path))
                .map_err(|e| Unresolved::Unreadable(e.to_string()))?,
            None => applied.clone(),
        };
        resolve::resolve(machine, resolve::base(machine, &fallback)?)
    }

    /// The head of the node's audit trail, as its last run left it (`None` without one, or
    /// when it cannot be read: `nodeward audit verify` says why).
    fn audit_head(&self) -> Option<AuditHead> {
        let path = crate::audit::head::head_path(&self.state_dir.join(HEADS_DIR), &self.audit_dir);
        match crate::audit::head::Head::read(&path) {
            Ok(Some(head)) => Some(AuditHead {
                seq: i64::try_from(head.seq).ok()?,
                sha256: head.hash,
            }),
            Ok(None) => None,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the audit trail's head");
                None
            }
        }
    }

    /// The bundle the node's phases run: the installed current one, else the embedded one.
    fn active_bundle(&self) -> Bundle {
        match select::effective(&Store::new(&self.state_dir)) {
            Ok(b) => Bundle::Active(ActiveBundle {
                name: b.manifest.bundle.name.clone(),
                version: i64::try_from(b.manifest.bundle.version).unwrap_or(i64::MAX),
                digest: b.digest.clone(),
            }),
            Err(e) => Bundle::Rejected(e.to_string()),
        }
    }
}

/// What the node's state files say, against `machine`'s spec resolved to `wanted` (see
/// [`NoneOperator::wanted`]); `failed` is the last failed repave.
pub fn measure(
    state: &NodeState,
    machine: &Machine,
    bundle: Bundle,
    wanted: impl FnOnce(&NodeConfig) -> Result<NodeConfig, Unresolved>,
    failed: Option<&(Option<i64>, String)>,
    lock_held: bool,
) -> Outcome {
    let bootstrap = match state.record() {
        Ok(Some(r)) if r.checkpoint == Checkpoint::Complete => Bootstrap::Done,
        Ok(Some(r)) => Bootstrap::Running {
            checkpoint: r.checkpoint.name().to_string(),
        },
        Ok(None) => Bootstrap::Failed(
            "no install record: this host was never bootstrapped, or was reset".into(),
        ),
        Err(e) => Bootstrap::Failed(e.to_string()),
    };
    let generation = machine.metadata.generation;
    let mut repave = None;
    let update = match (state.journal(), state.applied()) {
        // A journal under the node lock is an upgrade running; without it, one a crash cut
        // short, which the daemon's start (or `nodeward recover`) finishes or rolls back.
        (Ok(Some(j)), _) if lock_held => Update::Updating(format!(
            "an upgrade from {} to {} is in progress",
            j.from_version, j.to_version
        )),
        (Ok(Some(j)), _) => Update::Failed(format!(
            "an upgrade from {} to {} was cut short; `nodeward recover` (or the daemon's next start) finishes or rolls it back",
            j.from_version, j.to_version
        )),
        (Err(e), _) | (_, Err(e)) => Update::Failed(e.to_string()),
        // No applied config (no node, or a bootstrap not finished): nothing to compare with;
        // `AgentBootstrapped` says why.
        (Ok(None), Ok(None)) => Update::UpToDate,
        (Ok(None), Ok(Some(applied))) => match wanted(&applied) {
            Err(Unresolved::Unreadable(m)) => Update::ConfigUnreadable(m),
            Err(Unresolved::Invalid(m)) => Update::ConfigInvalid(m),
            Ok(config) => {
                repave = drift(&applied, &config);
                match failed {
                    Some((g, why)) if *g == generation && repave.is_some() => {
                        Update::Failed(why.clone())
                    }
                    _ => Update::UpToDate,
                }
            }
        },
    };
    Outcome {
        generation,
        bootstrap,
        update,
        bundle,
        repave,
        roll_out: None,
        repaving: false,
        active_bundle: None,
        audit_head: None,
    }
}

/// What differs between the node's `applied` config and the `wanted` one, if anything.
fn drift(applied: &NodeConfig, wanted: &NodeConfig) -> Option<String> {
    let fingerprints = (version::fingerprint(applied), version::fingerprint(wanted));
    if let (Ok(a), Ok(w)) = &fingerprints
        && a == w
    {
        return None;
    }
    let (from, to) = (
        &applied.cluster.kubernetes_version,
        &wanted.cluster.kubernetes_version,
    );
    Some(if from != to {
        format!("the spec asks for Kubernetes {to}; the node runs {from} (its applied config)")
    } else {
        "the node config the spec resolves to differs from the node's applied config".into()
    })
}

impl ModeOperator for NoneOperator {
    async fn outcome(&self, machine: &Machine) -> Outcome {
        let active = self.active_bundle();
        let record = rollout::RecordFile::new(&self.state_dir).read();
        let current = Store::new(&self.state_dir)
            .link(crate::bundle::store::CURRENT)
            .map_err(|e| e.to_string());
        let judgement = match (record, current) {
            (Ok(record), Ok(current)) => rollout::judge(
                machine.spec.phase_bundle.as_ref(),
                record.as_ref(),
                current.as_deref(),
                rollout::unix_now(),
            ),
            (Err(e), _) | (_, Err(e)) => rollout::Judgement {
                report: Some(Bundle::Rejected(e)),
                due: None,
            },
        };
        let active_bundle = match &active {
            Bundle::Active(b) => Some(b.clone()),
            _ => None,
        };
        let bundle = match (judgement.report, &machine.spec.agent) {
            (Some(report), _) => report,
            (None, Some(_)) => Bundle::Rejected(
                "spec.agent: agent self-upgrade is not implemented by this agent yet".into(),
            ),
            (None, None) => active,
        };
        let outcome = measure(
            &NodeState::new(&self.root),
            machine,
            bundle,
            |applied| self.wanted(machine, applied),
            self.failed_repave.borrow().as_ref(),
            NodeLock::held(&self.root).unwrap_or(true),
        );
        Outcome {
            audit_head: self.audit_head(),
            roll_out: judgement.due,
            active_bundle,
            ..outcome
        }
    }

    async fn roll_out(&self, machine: &Machine) -> Result<String, OperatorError> {
        let spec = machine
            .spec
            .phase_bundle
            .as_ref()
            .ok_or_else(|| OperatorError("the Machine names no phase bundle".into()))?;
        NoneOperator::roll_out(self, spec).await
    }

    async fn repave(&self, machine: &Machine) -> Result<String, OperatorError> {
        let applied = NodeState::new(&self.root)
            .applied()
            .map_err(|e| OperatorError(e.to_string()))?
            .ok_or_else(|| OperatorError("no applied config: nothing to repave".into()))?;
        let config = self
            .wanted(machine, &applied)
            .map_err(|e| OperatorError(e.to_string()))?;
        let result = match write_private(&self.state_dir, &config) {
            Ok(path) => {
                let r = self.run("upgrade", Some(&path), &[]).await;
                // It holds the bootstrap token: gone as soon as the upgrade has read it.
                let _ = std::fs::remove_file(&path);
                r
            }
            Err(e) => Err(e),
        };
        *self.failed_repave.borrow_mut() = match &result {
            Ok(_) => None,
            Err(e) => Some((machine.metadata.generation, e.0.clone())),
        };
        result
    }

    async fn recover(&self) -> Result<String, OperatorError> {
        self.run("recover", None, &[]).await
    }

    async fn restart_node(&self) -> Result<String, OperatorError> {
        self.run("restart", None, &[]).await
    }

    async fn reset_node(&self) -> Result<String, OperatorError> {
        self.run("reset", None, &[]).await
    }
}

/// The config a repave's `nodeward upgrade` reads, in the agent state directory.
const REPAVE_CONFIG: &str = "daemon-repave-config.json";

/// Removes a repave's config that a killed daemon left in `state_dir` (it holds the bootstrap
/// token); the daemon's start calls it.
pub fn remove_repave_config(state_dir: &Path) {
    let path = state_dir.join(REPAVE_CONFIG);
    match std::fs::remove_file(&path) {
        Ok(()) => tracing::info!(path = %path.display(), "removed a repave config left behind"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "cannot remove a repave config left behind")
        }
    }
}

/// Writes `config` as [`REPAVE_CONFIG`] in `state_dir`, readable by the owner only (it holds
/// the bootstrap token): a temp file made `O_EXCL` with mode 0600, renamed over a leftover
/// (never following it if it is a link). Its path.
fn write_private(state_dir: &Path, config: &NodeConfig) -> Result<PathBuf, OperatorError> {
    let path = state_dir.join(REPAVE_CONFIG);
    let fail = |e: &dyn std::fmt::Display| OperatorError(format!("{}: {e}", path.display()));
    let bytes = serde_json::to_vec(config).map_err(|e| fail(&e))?;
    std::fs::create_dir_all(state_dir).map_err(|e| fail(&e))?;
    let dir = crate::durable::open_dir(state_dir).map_err(|e| fail(&e))?;
    crate::durable::write_file(&dir, REPAVE_CONFIG, &bytes, 0o600, "repave")
        .map_err(|e| fail(&e))?;
    Ok(path)
}

#[cfg(test)]
#[path = "none_mode_tests.rs"]
mod tests;
