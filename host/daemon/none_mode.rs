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
//! - A child runs at most [`OPERATION_TIMEOUT`]; past it, it is killed and the operation
//!   failed with that reason.
//! - While a child runs, `WATCHDOG=1` is sent at the watchdog interval: the loop is alive and
//!   waiting on a bounded child, which is what the watchdog asks.
//! - A failed child's error is its last stderr line (the CLI's `error:` line), capped.
//! - The child does not inherit `NOTIFY_SOCKET` (it must not speak for the unit).
//!
//! - A repave is `nodeward upgrade` (the journaled upgrade, rolled back on failure) to the
//!   config the spec resolves to ([`resolve`]), written for it owner-only in the agent state
//!   directory and removed when it ends; a failed repave is not retried for the same
//!   generation of the spec.
//!
//! # Caveats
//! The memory of a failed repave is the daemon's: after a restart, the daemon tries that
//! generation once more.

use crate::audit::head::HEADS_DIR;
use crate::bundle::select;
use crate::bundle::store::Store;
use crate::daemon::notify::Notifier;
use crate::daemon::reconcile::{ModeOperator, OperatorError};
use crate::daemon::resolve::{self, Unresolved};
use crate::daemon::status::{Bootstrap, Bundle, Outcome, Update};
use crate::node::state::{Checkpoint, NodeLock, NodeState};
use crate::node::version;
use nodeward_api::Machine;
use nodeward_api::machine::{ActiveBundle, AuditHead};
use nodeward_node_config::NodeConfig;
use std::cell::RefCell;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::io::AsyncReadExt as _;

/// The longest a `restart` or `reset` child may run (its health waits included).
pub const OPERATION_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// The longest error message kept from a failed child.
const MAX_ERROR_BYTES: usize = 1024;
/// The most of a child's stderr the daemon reads (the rest is drained and dropped).
const MAX_STDERR_BYTES: usize = 64 * 1024;

/// The none-mode operator; see the module docs.
#[derive(Debug)]
pub struct NoneOperator {
    /// The agent binary the operations run (the daemon's own).
    pub exe: PathBuf,
    /// The host root.
    pub root: PathBuf,
    /// The agent state directory (the bundle store, the audit trail's head).
    pub state_dir: PathBuf,
    /// The audit trail's directory (`--audit-dir`, else beneath the root).
    pub audit_dir: PathBuf,
    /// The flags every child takes, as the daemon was given them (`--root`, `--unit-dir`,
    /// `--state-dir`, `--audit-dir`).
    pub flags: Vec<OsString>,
    /// The daemon's `--config`: the base of a Machine without `spec.config` (else the node's
    /// applied config), and the `--config` of a `reset`.
    pub config: Option<PathBuf>,
    /// Where `WATCHDOG=1` goes while a child runs.
    pub notifier: Notifier,
    /// The last repave that failed: the Machine generation it was for, and why. Reported as
    /// `UpdateFailed` (and not retried) until the spec's generation moves.
    pub failed_repave: RefCell<Option<(Option<i64>, String)>>,
}

impl NoneOperator {
    /// Runs `nodeward <command> <flags> [--config FILE]` (`config`, else the daemon's own);
    /// its error line when it fails.
    async fn run(&self, command: &str, config: Option<&Path>) -> Result<String, OperatorError> {
        let config = config.or(self.config.as_deref());
        let mut child = tokio::process::Command::new(&self.exe)
            .arg(command)
            .args(&self.flags)
            .args(
                config
                    .map(|c| [OsString::from("--config"), c.into()])
                    .into_iter()
                    .flatten(),
            )
            .env_remove("NOTIFY_SOCKET")
            .env_remove("WATCHDOG_USEC")
            .env_remove("WATCHDOG_PID")
            .envs_clear_nodeward()
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| {
                OperatorError(format!("cannot run {} {command}: {e}", self.exe.display()))
            })?;
        let stderr = child.stderr.take();
        let read_stderr = async move {
            let mut kept = Vec::new();
            if let Some(mut s) = stderr {
                let mut buf = [0u8; 8192];
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    let room = MAX_STDERR_BYTES.saturating_sub(kept.len());
                    kept.extend_from_slice(&buf[..n.min(room)]);
                }
            }
            kept
        };
        let watchdog = async {
            let Some(every) = self.notifier.watchdog_interval() else {
                return std::future::pending().await;
            };
            loop {
                tokio::time::sleep(every).await;
                if let Err(e) = self.notifier.watchdog() {
                    tracing::warn!(error = %e, "cannot notify the watchdog");
                }
            }
        };
        let waited = async {
            let (status, stderr) = tokio::join!(child.wait(), read_stderr);
            (status, stderr)
        };
        let (status, stderr) = tokio::select! {
            r = tokio::time::timeout(OPERATION_TIMEOUT, waited) => match r {
                Ok(done) => done,
                Err(_) => return Err(OperatorError(format!(
                    "nodeward {command} did not finish within {} s and was killed",
                    OPERATION_TIMEOUT.as_secs()
                ))),
            },
            never = watchdog => never,
        };
        let status =
            status.map_err(|e| OperatorError(format!("waiting for nodeward {command}: {e}")))?;
        if status.success() {
            return Ok(format!("nodeward {command} succeeded"));
        }
        let text = String::from_utf8_lossy(&stderr);
        let last = text
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("(no error output)");
        Err(OperatorError(cap(&format!(
            "nodeward {command} failed ({status}): {last}"
        ))))
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

/// Clears the `NODEWARD_*` variables (but the log settings) for a child: its host, state,
/// audit trail and config are the flags the daemon passes, never a bundle, keys or config
/// the daemon's own environment happens to name.
trait ClearNodeward {
    fn envs_clear_nodeward(&mut self) -> &mut Self;
}

impl ClearNodeward for tokio::process::Command {
    fn envs_clear_nodeward(&mut self) -> &mut Self {
        for (key, _) in std::env::vars_os() {
            let k = key.to_string_lossy();
            if k.starts_with("NODEWARD_") && !k.starts_with("NODEWARD_LOG") {
                self.env_remove(&key);
            }
        }
        self
    }
}

/// `text` cut to [`MAX_ERROR_BYTES`] on a character boundary.
fn cap(text: &str) -> String {
    if text.len() <= MAX_ERROR_BYTES {
        return text.to_string();
    }
    let mut end = MAX_ERROR_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
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
        repaving: false,
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
        let bundle = match (&machine.spec.phase_bundle, &machine.spec.agent) {
            (Some(_), _) => Bundle::Rejected(
                "spec.phaseBundle: installing a phase bundle from the Machine is not implemented by this agent yet; `nodeward phases install` on the node".into(),
            ),
            (_, Some(_)) => Bundle::Rejected(
                "spec.agent: agent self-upgrade is not implemented by this agent yet".into(),
            ),
            (None, None) => self.active_bundle(),
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
            ..outcome
        }
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
                let r = self.run("upgrade", Some(&path)).await;
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
        self.run("recover", None).await
    }

    async fn restart_node(&self) -> Result<String, OperatorError> {
        self.run("restart", None).await
    }

    async fn reset_node(&self) -> Result<String, OperatorError> {
        self.run("reset", None).await
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
