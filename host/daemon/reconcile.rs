//! One reconcile pass: the node measured against its Machine, the status written with 409
//! conflicts retried, and one MachineOperation carried out; over two narrow traits, the API
//! server ([`MachineApi`]) and the node's mode ([`ModeOperator`]).
//!
//! # Background
//! The daemon is the only writer of its Machine's status, but not the only client: an operator
//! may edit the spec between the daemon's read and its write, and on the v1.20 CI cluster any
//! node may write any Machine's status. A write carries the `resourceVersion` it read, so the
//! API server refuses a stale one with 409 Conflict; [`write_status`] then reads the object
//! again and lays the same outcome over the newer status, up to [`MAX_CONFLICTS`] times.
//!
//! Every isolation mode implements [`ModeOperator`] itself (seed 002's ModeOperator): a mode
//! never falls back to another mode's behaviour, so a method added here is a compile error in
//! every mode that lacks it.
//!
//! # Guarantees
//! - A status that would not change is not written.
//! - An operation's status is `InProgress` on the API server before its act starts, and
//!   `Complete` or `Failed` after it ends; [`OperationDone::exit`] says when the daemon must
//!   stop with exit 69 (after an `AgentReset` is marked Complete).
//! - Errors keep what failed: [`ApiError`] says whether the server was unreachable (the caller
//!   backs off) or refused.

use crate::daemon::config_map;
use crate::daemon::ledger::{Ledger, Mark};
use crate::daemon::operation::{self, Act, Action};
use crate::daemon::status::{self, Bootstrap, Bundle, Outcome, Update};
use k8s_openapi::api::core::v1::ConfigMap;
use nodeward_api::{Machine, MachineOperation, MachineOperationStatus, Time};

/// How many 409 Conflicts one status write retries before it gives up for this pass.
pub const MAX_CONFLICTS: u32 = 5;

/// What the API server answered, when it was not what was asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApiError {
    /// 409: the object changed since it was read.
    #[error("conflict: the object changed since it was read")]
    Conflict,
    /// The server could not be reached (connection refused, timeout): back off and retry.
    #[error("API server unreachable: {0}")]
    Unreachable(String),
    /// The server refused the request (403, 422, …).
    #[error("API server refused: {0}")]
    Refused(String),
    /// 401: the credentials are no longer accepted (the kubelet rotated its certificate and
    /// the one this daemon loaded expired): the daemon exits so systemd starts it again with
    /// the current ones.
    #[error("API server: unauthorized: {0}")]
    Unauthorized(String),
}

/// The requests the daemon makes; implemented over kube's client, and in memory by tests.
#[allow(async_fn_in_trait)]
pub trait MachineApi {
    /// The Machine `name`; `None` when there is none.
    async fn machine(&self, name: &str) -> Result<Option<Machine>, ApiError>;
    /// Replaces `machine`'s status, at its `resourceVersion`; the stored object.
    async fn replace_machine_status(&self, machine: &Machine) -> Result<Machine, ApiError>;
    /// The MachineOperation `name`; `None` when there is none.
    async fn operation(&self, name: &str) -> Result<Option<MachineOperation>, ApiError>;
    /// Replaces `op`'s status, at its `resourceVersion`; the stored object.
    async fn replace_operation_status(
        &self,
        op: &MachineOperation,
    ) -> Result<MachineOperation, ApiError>;
    /// Deletes the MachineOperation `name` (absent is not an error).
    async fn delete_operation(&self, name: &str) -> Result<(), ApiError>;
    /// The ConfigMap `namespace/name` (`spec.config.configMapRef`); `None` when there is none.
    async fn config_map(&self, namespace: &str, name: &str) -> Result<Option<ConfigMap>, ApiError>;
}

/// What a node operation failed with: a message for the status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct OperatorError(pub String);

/// The node operations one isolation mode implements (see the module docs).
#[allow(async_fn_in_trait)]
pub trait ModeOperator {
    /// The node measured against `machine`'s spec: what its status should say.
    async fn outcome(&self, machine: &Machine) -> Outcome;
    /// Repaves the node to `machine`'s spec (none mode: the journaled upgrade to the config
    /// the spec resolves to); a summary for the status. Called only when [`Self::outcome`]
    /// asked for a repave with the node otherwise up to date; a mode that failed a repave of
    /// this generation reports `Update::Failed` until the spec changes, so it is not retried.
    async fn repave(&self, machine: &Machine) -> Result<String, OperatorError>;
    /// Rolls out the phase bundle `machine`'s spec names (install, changed phases, health
    /// gate, roll-back on failure); a summary for the status. Called only when
    /// [`Self::outcome`] asked for it with the node otherwise up to date; the mode records
    /// each attempt, so its next outcome reports how it ended.
    async fn roll_out(&self, machine: &Machine) -> Result<String, OperatorError>;
    /// Finishes or rolls back an upgrade a crash cut short (the daemon's start); a summary.
    async fn recover(&self) -> Result<String, OperatorError>;
    /// Restarts the node's units in place (never the host); a summary for the status.
    async fn restart_node(&self) -> Result<String, OperatorError>;
    /// Removes the node (the reset pipeline); a summary for the status.
    async fn reset_node(&self) -> Result<String, OperatorError>;
}

/// What [`write_status`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Written {
    /// A write was made (false: nothing would change, or there is no Machine).
    pub written: bool,
    /// 409 Conflicts met and retried.
    pub conflicts: u32,
}

/// Lays `outcome` over the Machine `name`'s status at `now` and writes it, re-reading and
/// retrying on each 409 up to [`MAX_CONFLICTS`] times.
pub async fn write_status(
    api: &impl MachineApi,
    name: &str,
    outcome: &Outcome,
    now: &Time,
) -> Result<Written, ApiError> {
    let machine = api.machine(name).await?;
    write_status_over(api, name, machine, outcome, now).await
}

/// [`write_status`] starting from `machine`, the Machine as last read (so a pass that has just
/// read it does not read it again); re-read only after a 409.
async fn write_status_over(
    api: &impl MachineApi,
    name: &str,
    mut machine: Option<Machine>,
    outcome: &Outcome,
    now: &Time,
) -> Result<Written, ApiError> {
    let mut conflicts = 0;
    loop {
        let Some(mut current) = machine.take() else {
            return Ok(Written {
                written: false,
                conflicts,
            });
        };
        // A Machine whose status was never written starts from an empty one.
        let st = current.status.get_or_insert_default();
        if !status::apply(st, outcome, now) {
            return Ok(Written {
                written: false,
                conflicts,
            });
        }
        match api.replace_machine_status(&current).await {
            Ok(_) => {
                return Ok(Written {
                    written: true,
                    conflicts,
                });
            }
            Err(ApiError::Conflict) if conflicts < MAX_CONFLICTS => {
                conflicts += 1;
                machine = api.machine(name).await?;
            }
            Err(e) => return Err(e),
        }
    }
}

/// One pass over the Machine `name`: measure the node, write the status, and, when the
/// outcome asks for a repave of an otherwise up-to-date node, repave it: `Repaving` written
/// first, the node measured and written again after (at `clock()` each time: a repave takes
/// minutes).
pub async fn reconcile_machine(
    api: &impl MachineApi,
    mode: &impl ModeOperator,
    name: &str,
    clock: impl Fn() -> Time,
) -> Result<Written, ApiError> {
    let machine = api.machine(name).await?;
    let Some(read) = machine.clone() else {
        return Ok(Written {
            written: false,
            conflicts: 0,
        });
    };
    // The mode sees the ConfigMap the spec names as if inline; `unread` says why it is not.
    let (read, unread) = config_map::read(api, read).await?;
    let outcome = config_map::explain(mode.outcome(&read).await, unread.as_ref());
    if let Some(why) = outcome.roll_out.clone().filter(|_| roll_out_due(&outcome)) {
        let installing = Outcome {
            bundle: Bundle::Installing(format!("rolling out: {why}")),
            roll_out: None,
            ..outcome
        };
        let first = write_status_over(api, name, machine, &installing, &clock()).await?;
        if let Err(e) = mode.roll_out(&read).await {
            tracing::warn!(machine = name, error = %e, "bundle roll-out failed");
        }
        let after = config_map::explain(mode.outcome(&read).await, unread.as_ref());
        let after = Outcome {
            roll_out: None,
            ..after
        };
        let second = write_status(api, name, &after, &clock()).await?;
        return Ok(Written {
            written: first.written || second.written,
            conflicts: first.conflicts + second.conflicts,
        });
    }
    let Some(why) = outcome.repave.clone().filter(|_| repave_due(&outcome)) else {
        return write_status_over(api, name, machine, &outcome, &clock()).await;
    };
    let repaving = Outcome {
        update: Update::Updating(format!("repaving: {why}")),
        repave: None,
        repaving: true,
        ..outcome
    };
    let first = write_status_over(api, name, machine, &repaving, &clock()).await?;
    let result = mode.repave(&read).await;
    if let Err(e) = &result {
        tracing::warn!(machine = name, error = %e, "repave failed");
    }
    let after = config_map::explain(mode.outcome(&read).await, unread.as_ref());
    let second = write_status(api, name, &after, &clock()).await?;
    Ok(Written {
        written: first.written || second.written,
        conflicts: first.conflicts + second.conflicts,
    })
}

/// Whether `outcome`'s repave may start now: the node is bootstrapped, no update runs or
/// failed (a failed repave is not retried until the spec changes), and no repave runs.
fn repave_due(outcome: &Outcome) -> bool {
    outcome.bootstrap == Bootstrap::Done && outcome.update == Update::UpToDate && !outcome.repaving
}

/// Whether `outcome`'s bundle roll-out may start now: as a repave, and no repave is asked for
/// (the repave runs first, with the bundle the node has).
fn roll_out_due(outcome: &Outcome) -> bool {
    repave_due(outcome) && outcome.repave.is_none()
}

/// What [`handle_operation`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperationDone {
    /// What was decided.
    pub action: Action,
    /// 409 Conflicts met and retried.
    pub conflicts: u32,
    /// The daemon must now exit 69 (an `AgentReset` completed).
    pub exit: bool,
}

/// Writes the status `change` makes of the operation `name` (while it is still the object
/// `uid`: one deleted and made again under the same name is another operation), retrying 409s.
async fn write_operation(
    api: &impl MachineApi,
    name: &str,
    uid: &Option<String>,
    conflicts: &mut u32,
    change: impl Fn(&mut MachineOperationStatus),
) -> Result<(), ApiError> {
    loop {
        let Some(mut op) = api.operation(name).await? else {
            return Ok(());
        };
        if op.metadata.uid != *uid {
            return Ok(());
        }
        // An operation nobody reported on yet starts from an empty status.
        change(op.status.get_or_insert_default());
        match api.replace_operation_status(&op).await {
            Ok(_) => return Ok(()),
            Err(ApiError::Conflict) if *conflicts < MAX_CONFLICTS => *conflicts += 1,
            Err(e) => return Err(e),
        }
    }
}

/// Carries out the MachineOperation `name` for the Machine `machine` (see
/// [`operation::decide`]), at most once per uid ([`Ledger`]); `clock` dates the start and,
/// read again after the act, the end.
pub async fn handle_operation(
    api: &impl MachineApi,
    mode: &impl ModeOperator,
    ledger: &impl Ledger,
    machine: &str,
    name: &str,
    clock: impl Fn() -> Time,
) -> Result<OperationDone, ApiError> {
    let now = &clock();
    let Some(op) = api.operation(name).await? else {
        return Ok(OperationDone {
            action: Action::Ignore(operation::Ignore::Finished),
            conflicts: 0,
            exit: false,
        });
    };
    let uid = op.metadata.uid.clone();
    let mut action = operation::decide(&op, machine, now);
    let mut conflicts = 0;
    let mut exit = false;
    // What the ledger says overrides the status: a finished act is never run again, a
    // started one (the daemon stopped while it ran) is failed, not repeated.
    if let Action::Run(_) = action {
        let fail = |message: String| Action::Refuse {
            reason: operation::REASON_FAILED,
            message,
        };
        action = match uid.as_deref().map(|u| ledger.mark_of(u)) {
            None => fail("the operation has no metadata.uid; not run".into()),
            Some(Err(e)) => fail(format!("{e}; not run")),
            Some(Ok(Some(Mark::Finished))) => {
                tracing::warn!(operation = name, "already carried out by this node; its status says otherwise and is left as it is");
                Action::Ignore(operation::Ignore::Finished)
            }
            Some(Ok(Some(Mark::Started))) => fail(
                "the daemon stopped while this operation ran; it is not run twice: create a new operation to run it again".into(),
            ),
            Some(Ok(None)) => action,
        };
    }
    match &action {
        Action::Ignore(_) => {}
        Action::Delete => api.delete_operation(name).await?,
        Action::Refuse { reason, message } => {
            write_operation(api, name, &uid, &mut conflicts, |st| {
                operation::finish(st, false, reason, message, now)
            })
            .await?;
            if let Some(u) = &uid {
                // Best effort: a refused operation changed nothing on the node.
                if let Err(e) = ledger.record(u, name, Mark::Finished) {
                    tracing::warn!(operation = name, error = %e, "cannot record the operation");
                }
            }
        }
        Action::Run(act) => {
            let what = match act {
                Act::RestartNode => "restarting the node's units in place",
                Act::ResetAgent => "resetting the node",
            };
            // A uid was checked above (an operation without one is refused, never run).
            let recorded = match uid.as_deref() {
                Some(u) => ledger.record(u, name, Mark::Started).map(|()| u),
                None => Err(crate::daemon::ledger::LedgerError {
                    path: Default::default(),
                    message: "the operation has no metadata.uid".into(),
                }),
            };
            let u = match recorded {
                Ok(u) => u,
                Err(e) => {
                    let message = format!("{e}; not run");
                    write_operation(api, name, &uid, &mut conflicts, |st| {
                        operation::finish(st, false, operation::REASON_FAILED, &message, now)
                    })
                    .await?;
                    return Ok(OperationDone {
                        action,
                        conflicts,
                        exit,
                    });
                }
            };
            write_operation(api, name, &uid, &mut conflicts, |st| {
                operation::start(st, what, now);
            })
            .await?;
            let (result, done_reason) = match act {
                Act::RestartNode => (mode.restart_node().await, operation::REASON_NODE_RESTARTED),
                Act::ResetAgent => (mode.reset_node().await, operation::REASON_AGENT_RESET),
            };
            let (ok, reason, mut message) = match &result {
                Ok(summary) => (true, done_reason, summary.clone()),
                Err(e) => (false, operation::REASON_FAILED, e.0.clone()),
            };
            if let Err(e) = ledger.record(u, name, Mark::Finished) {
                tracing::warn!(operation = name, error = %e, "cannot record the operation's end");
                message = format!("{message} (and: {e})");
            }
            let end = clock();
            write_operation(api, name, &uid, &mut conflicts, |st| {
                operation::finish(st, ok, reason, &message, &end)
            })
            .await?;
            exit = ok && *act == Act::ResetAgent;
        }
    }
    Ok(OperationDone {
        action,
        conflicts,
        exit,
    })
}

#[cfg(test)]
#[path = "config_map_tests.rs"]
mod config_map_tests;
#[cfg(test)]
#[path = "reconcile_fakes.rs"]
mod fakes;
#[cfg(test)]
#[path = "reconcile_tests.rs"]
mod tests;
