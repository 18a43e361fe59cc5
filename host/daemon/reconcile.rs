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
//! - A finished operation reaches its final status whatever point a kill cuts the pass at:
//!   the ledger holds the end before the status is written, and the next pass writes it
//!   ([`handle_operation`]; the crash points are `daemon:after-*` and
//!   `ledger-*:after-temp-write`, `crate::test_hooks`).
//! - Errors keep what failed: [`ApiError`] says whether the server was unreachable (the caller
//!   backs off) or refused.

use crate::daemon::config_map;
use crate::daemon::ledger::{Ledger, Mark};
use crate::daemon::operation::{self, Act, Action, Ending};
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
    /// The server could not be reached (connection refused, no answer within the request's
    /// bound) or asked for time (429, 503, 504): back off and retry.
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
    uid: Option<&str>,
    conflicts: &mut u32,
    change: impl Fn(&mut MachineOperationStatus),
) -> Result<(), ApiError> {
    loop {
        let Some(mut op) = api.operation(name).await? else {
            return Ok(());
        };
        if op.metadata.uid.as_deref() != uid {
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

/// The message of an operation whose act started and never recorded its end.
const CUT_SHORT: &str = "the daemon stopped while this operation ran; it is not run twice: create a new operation to run it again";
/// The message of an operation an earlier agent carried out without recording how it ended.
const UNRECORDED: &str = "carried out by this node, but the daemon stopped before it recorded how it ended; see the node's audit trail";

/// The end the ledger holds for an operation its status says to run (`mark`, found at
/// `now`), and whether the ledger already has it as [`Mark::Done`].
fn owed(mark: Mark, name: &str, now: &Time) -> (Ending, bool) {
    match mark {
        Mark::Done(ending) => (ending, true),
        Mark::Started => (
            Ending::failed(operation::REASON_FAILED, CUT_SHORT, now),
            false,
        ),
        Mark::Final(Some(ending)) => {
            tracing::warn!(
                operation = name,
                "already carried out by this node; its status says otherwise: its recorded end is written again"
            );
            (ending, false)
        }
        Mark::Final(None) => (
            Ending::failed(operation::REASON_FAILED, UNRECORDED, now),
            false,
        ),
    }
}

/// Brings a finished operation's status and the ledger together: the status is final, so a
/// [`Mark::Done`] (the daemon stopped after writing it) becomes [`Mark::Final`]. Best effort:
/// the next pass that sees the operation tries again.
fn settle(ledger: &impl Ledger, uid: &str, name: &str) {
    match ledger.mark_of(uid) {
        Ok(Some(Mark::Done(ending))) => {
            if let Err(e) = ledger.record(uid, name, &Mark::Final(Some(ending))) {
                tracing::warn!(operation = name, error = %e, "cannot record the operation as final");
            }
        }
        Ok(_) => {}
        Err(e) => tracing::warn!(operation = name, error = %e, "cannot read the operation ledger"),
    }
}

/// Writes `ending` as the final status of the operation `name` (`uid`), with the ledger
/// ahead of the status at every moment: [`Mark::Done`] first (unless `recorded`), then the
/// status, then [`Mark::Final`]. A kill anywhere leaves a ledger the next pass finishes from.
async fn conclude(
    api: &impl MachineApi,
    ledger: &impl Ledger,
    name: &str,
    uid: &str,
    ending: &Ending,
    recorded: bool,
    conflicts: &mut u32,
) -> Result<(), ApiError> {
    let mut ending = ending.clone();
    if !recorded && let Err(e) = ledger.record(uid, name, &Mark::Done(ending.clone())) {
        tracing::warn!(operation = name, error = %e, "cannot record the operation's end");
        ending.message = format!("{} (and: {e})", ending.message);
    }
    crate::test_hooks::abort_at("daemon:after-ledger-done");
    write_operation(api, name, Some(uid), conflicts, |st| ending.finish(st)).await?;
    crate::test_hooks::abort_at("daemon:after-status-final");
    if let Err(e) = ledger.record(uid, name, &Mark::Final(Some(ending))) {
        tracing::warn!(operation = name, error = %e, "cannot record the operation as final");
    }
    crate::test_hooks::abort_at("daemon:after-ledger-final");
    Ok(())
}

/// Carries out the MachineOperation `name` for the Machine `machine` (see
/// [`operation::decide`]), at most once per uid, and always to a final status ([`Ledger`]);
/// `clock` dates the start and, read again after the act, the end.
///
/// # Expected flow
/// 1. `InProgress` written (a kill here: the next pass runs it, as nothing ran yet);
/// 2. [`Mark::Started`] recorded, then the act (a kill from here on: failed as cut short);
/// 3. its end recorded [`Mark::Done`] with the status to write, the status written, then
///    [`Mark::Final`] (a kill between: the next pass writes the recorded end, then marks it
///    final; a status already final only gets the mark).
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
    let uid = op.metadata.uid.as_deref();
    let mut action = operation::decide(&op, machine, now);
    let mut conflicts = 0;
    let mut exit = false;
    let refuse = |message: String| Action::Refuse {
        reason: operation::REASON_FAILED,
        message,
    };
    // What the ledger says overrides the status: a finished act is never run again, a
    // started one (the daemon stopped while it ran) is failed, not repeated, and an end it
    // holds is written until the status shows it.
    let mut recorded = false;
    match (&action, uid) {
        (Action::Run(_), None) => {
            action = refuse("the operation has no metadata.uid; not run".into());
        }
        (Action::Run(_), Some(u)) => match ledger.mark_of(u) {
            Ok(None) => {}
            Ok(Some(mark)) => {
                let (ending, done) = owed(mark, name, now);
                recorded = done;
                action = Action::Report(ending);
            }
            Err(e) => action = refuse(format!("{e}; not run")),
        },
        (Action::Ignore(operation::Ignore::Finished) | Action::Delete, Some(u)) => {
            settle(ledger, u, name);
        }
        _ => {}
    }
    match (&action, uid) {
        (Action::Ignore(_), _) => {}
        (Action::Delete, _) => api.delete_operation(name).await?,
        (Action::Refuse { reason, message }, _) => {
            let ending = Ending::failed(reason, message.clone(), now);
            write_operation(api, name, uid, &mut conflicts, |st| ending.finish(st)).await?;
            if let Some(u) = uid
                && let Err(e) = ledger.record(u, name, &Mark::Final(Some(ending)))
            {
                // Best effort: a refused operation changed nothing on the node.
                tracing::warn!(operation = name, error = %e, "cannot record the operation");
            }
        }
        (Action::Report(ending), Some(u)) => {
            conclude(api, ledger, name, u, ending, recorded, &mut conflicts).await?;
        }
        (Action::Run(act), Some(u)) => {
            let what = match act {
                Act::RestartNode => "restarting the node's units in place",
                Act::ResetAgent => "resetting the node",
            };
            // Nothing has run yet: a kill (or a failed write) before the mark below leaves an
            // operation the next pass starts again.
            write_operation(api, name, uid, &mut conflicts, |st| {
                operation::start(st, what, now);
            })
            .await?;
            crate::test_hooks::abort_at("daemon:after-status-in-progress");
            if let Err(e) = ledger.record(u, name, &Mark::Started) {
                let ending = Ending::failed(operation::REASON_FAILED, format!("{e}; not run"), now);
                write_operation(api, name, uid, &mut conflicts, |st| ending.finish(st)).await?;
                return Ok(OperationDone {
                    action: action.clone(),
                    conflicts,
                    exit,
                });
            }
            crate::test_hooks::abort_at("daemon:after-ledger-started");
            let (result, done_reason) = match act {
                Act::RestartNode => (mode.restart_node().await, operation::REASON_NODE_RESTARTED),
                Act::ResetAgent => (mode.reset_node().await, operation::REASON_AGENT_RESET),
            };
            crate::test_hooks::abort_at("daemon:after-act");
            let ending = match result {
                Ok(summary) => Ending {
                    complete: true,
                    reason: done_reason.to_string(),
                    message: summary,
                    at: clock(),
                },
                Err(e) => Ending::failed(operation::REASON_FAILED, e.0, &clock()),
            };
            conclude(api, ledger, name, u, &ending, false, &mut conflicts).await?;
            exit = ending.complete && *act == Act::ResetAgent;
        }
        // Without a uid, a Run or a Report became a refusal above.
        (Action::Run(_) | Action::Report(_), None) => {}
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
#[path = "reconcile_ledger_tests.rs"]
mod ledger_tests;
#[cfg(test)]
#[path = "reconcile_tests.rs"]
mod tests;
