//! What the daemon does with one `MachineOperation`, and the status it writes for it.
//!
//! # Background
//! An operation is an act, carried out once (`docs/daemon.md`). The daemon sees every
//! operation of the cluster through its watch's field selector only when it names its own
//! Machine, but a watch can still deliver one it must leave alone (finished, or naming another
//! Machine after an edit). [`decide`] says what to do with one, as a pure function of the object
//! and the time, so each case is tested without a cluster; [`start`] and [`finish`] are the
//! only ways the daemon changes an operation's status.
//!
//! # Guarantees
//! - A finished operation (Complete or Failed) is never acted on again; once its
//!   `ttlSecondsAfterFinished` has passed it is deleted ([`Action::Delete`]).
//! - `AgentUpgrade` is refused with `Failed`, reason [`REASON_UPGRADE_UNSUPPORTED`], and a
//!   message saying nothing changed, until agent self-upgrade exists.
//! - `NodeReboot` restarts the node's units in place (containerd and the kubelet) and never
//!   the host; `AgentReset` resets the node, and the daemon then exits 69.
//! - An operation found `InProgress` is run again as far as its status goes (both acts are
//!   idempotent); the node's ledger decides whether it really runs (`super::ledger`: never
//!   twice, and an act that started is failed, not repeated).
//! - Every message is capped ([`MachineOperationStatus::set_message`]).
//!
//! # Caveats
//! The spec is not meant to change once written, but without CEL the v1.20 API server cannot
//! enforce that. This slice acts on the spec it reads when it starts the operation.

use nodeward_api::operation::{OperationKind, OperationPhase};
use nodeward_api::{MachineOperation, MachineOperationStatus, Time};

/// The reason of an `AgentUpgrade` refused by this agent.
pub const REASON_UPGRADE_UNSUPPORTED: &str = "AgentUpgradeUnsupported";
/// The reason of a started operation.
pub const REASON_STARTED: &str = "Started";
/// The reason of a `NodeReboot` done.
pub const REASON_NODE_RESTARTED: &str = "NodeRestarted";
/// The reason of an `AgentReset` done.
pub const REASON_AGENT_RESET: &str = "AgentReset";
/// The reason of an act that failed.
pub const REASON_FAILED: &str = "OperationFailed";

/// What the daemon runs for an operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Act {
    /// Restart the node's units in place (`NodeReboot`).
    RestartNode,
    /// Reset the node, then stop the daemon with exit 69 (`AgentReset`).
    ResetAgent,
}

/// Why the daemon leaves an operation alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ignore {
    /// It names another Machine.
    NotOurs,
    /// It finished; its TTL (if any) has not passed.
    Finished,
}

/// How an operation ended: the final status the daemon writes for it. The ledger records it
/// before it is written (`super::ledger`), so a daemon killed in between writes it at its
/// next pass.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Ending {
    /// `Complete`; else `Failed`.
    pub complete: bool,
    /// The status's reason.
    pub reason: String,
    /// The status's message (capped when written).
    pub message: String,
    /// When it ended: the status's `completionTime`.
    pub at: Time,
}

impl Ending {
    /// A `Failed` end with `reason` and `message` at `at`.
    pub fn failed(reason: &str, message: impl Into<String>, at: &Time) -> Self {
        Ending {
            complete: false,
            reason: reason.to_string(),
            message: message.into(),
            at: at.clone(),
        }
    }

    /// Lays this end over `status` ([`finish`]).
    pub fn finish(&self, status: &mut MachineOperationStatus) {
        finish(status, self.complete, &self.reason, &self.message, &self.at);
    }
}

/// What to do with one operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Leave it.
    Ignore(Ignore),
    /// Delete it: finished and past its TTL.
    Delete,
    /// Mark it Failed with this reason and message, changing nothing on the node.
    Refuse {
        /// The status's reason.
        reason: &'static str,
        /// The status's message.
        message: String,
    },
    /// Start it (InProgress), run the act, then mark it Complete or Failed.
    Run(Act),
    /// Write this end, which the node's ledger holds for it while its status is not final
    /// (the daemon stopped before writing it, or after its act started, or another writer
    /// changed the status); the act is never run again. [`decide`] never says this: the
    /// ledger does (`super::reconcile::handle_operation`).
    Report(Ending),
}

/// What to do with `op` for the Machine `machine` at `now`.
pub fn decide(op: &MachineOperation, machine: &str, now: &Time) -> Action {
    if op.spec.machine_ref.name != machine {
        return Action::Ignore(Ignore::NotOurs);
    }
    let phase = op.status.as_ref().and_then(|s| s.phase);
    if phase.is_some_and(OperationPhase::is_finished) {
        return if op.is_expired(now) {
            Action::Delete
        } else {
            Action::Ignore(Ignore::Finished)
        };
    }
    match op.spec.kind {
        OperationKind::AgentUpgrade => Action::Refuse {
            reason: REASON_UPGRADE_UNSUPPORTED,
            message: "this agent cannot upgrade itself yet (agent self-upgrade is not \
                      implemented); nothing on the node was changed"
                .to_string(),
        },
        OperationKind::NodeReboot => Action::Run(Act::RestartNode),
        OperationKind::AgentReset => Action::Run(Act::ResetAgent),
    }
}

/// Marks `status` started at `now` (a start time already there, from a run cut short, is
/// kept). Returns whether it changed.
pub fn start(status: &mut MachineOperationStatus, message: &str, now: &Time) -> bool {
    let before = status.clone();
    status.phase = Some(OperationPhase::InProgress);
    status.reason = Some(REASON_STARTED.to_string());
    status.set_message(message);
    if status.start_time.is_none() {
        status.start_time = Some(now.clone());
    }
    *status != before
}

/// Marks `status` finished at `now`: Complete when `complete`, else Failed, with `reason` and
/// the capped `message`. An operation that never started gets `now` as its start time too.
pub fn finish(
    status: &mut MachineOperationStatus,
    complete: bool,
    reason: &str,
    message: &str,
    now: &Time,
) {
    status.phase = Some(if complete {
        OperationPhase::Complete
    } else {
        OperationPhase::Failed
    });
    status.reason = Some(reason.to_string());
    status.set_message(message);
    if status.start_time.is_none() {
        status.start_time = Some(now.clone());
    }
    status.completion_time = Some(now.clone());
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodeward_api::message::MAX_MESSAGE_BYTES;
    use nodeward_api::operation::{MachineOperationSpec, MachineRef};

    fn at(rfc3339: &str) -> Time {
        serde_json::from_value(serde_json::Value::String(rfc3339.into())).expect("a time")
    }

    fn op(kind: OperationKind, machine: &str) -> MachineOperation {
        MachineOperation::new(
            "op-1",
            MachineOperationSpec {
                machine_ref: MachineRef {
                    name: machine.into(),
                },
                kind,
                ttl_seconds_after_finished: Some(60),
            },
        )
    }

    fn finished(mut o: MachineOperation, phase: OperationPhase, at_: &str) -> MachineOperation {
        o.status = Some(MachineOperationStatus {
            phase: Some(phase),
            completion_time: Some(at(at_)),
            ..MachineOperationStatus::default()
        });
        o
    }

    const NOW: &str = "2026-12-01T10:00:00Z";

    #[test]
    fn each_kind_for_our_machine() {
        let now = at(NOW);
        assert_eq!(
            decide(&op(OperationKind::NodeReboot, "w1"), "w1", &now),
            Action::Run(Act::RestartNode)
        );
        assert_eq!(
            decide(&op(OperationKind::AgentReset, "w1"), "w1", &now),
            Action::Run(Act::ResetAgent)
        );
        match decide(&op(OperationKind::AgentUpgrade, "w1"), "w1", &now) {
            Action::Refuse { reason, message } => {
                assert_eq!(reason, REASON_UPGRADE_UNSUPPORTED);
                assert!(
                    message.contains("nothing on the node was changed"),
                    "{message}"
                );
            }
            other => panic!("AgentUpgrade: {other:?}"),
        }
    }

    #[test]
    fn another_machines_operation_is_left_alone() {
        for kind in [
            OperationKind::NodeReboot,
            OperationKind::AgentReset,
            OperationKind::AgentUpgrade,
        ] {
            assert_eq!(
                decide(&op(kind, "w2"), "w1", &at(NOW)),
                Action::Ignore(Ignore::NotOurs)
            );
        }
    }

    #[test]
    fn finished_operations_are_never_run_again_and_deleted_after_their_ttl() {
        for phase in [OperationPhase::Complete, OperationPhase::Failed] {
            let o = finished(
                op(OperationKind::AgentReset, "w1"),
                phase,
                "2026-12-01T09:59:30Z",
            );
            assert_eq!(
                decide(&o, "w1", &at(NOW)),
                Action::Ignore(Ignore::Finished),
                "{phase:?} within its TTL"
            );
            assert_eq!(
                decide(&o, "w1", &at("2026-12-01T10:00:30Z")),
                Action::Delete,
                "{phase:?} past its TTL"
            );
        }
    }

    #[test]
    fn an_operation_cut_short_is_run_again() {
        let mut o = op(OperationKind::NodeReboot, "w1");
        o.status = Some(MachineOperationStatus {
            phase: Some(OperationPhase::InProgress),
            start_time: Some(at("2026-12-01T09:00:00Z")),
            ..MachineOperationStatus::default()
        });
        assert_eq!(decide(&o, "w1", &at(NOW)), Action::Run(Act::RestartNode));
    }

    #[test]
    fn start_then_finish_stamps_the_times() {
        let mut s = MachineOperationStatus::default();
        let t1 = at("2026-12-01T10:00:00Z");
        assert!(start(&mut s, "restarting containerd and kubelet", &t1));
        assert_eq!(s.phase, Some(OperationPhase::InProgress));
        assert_eq!(s.reason.as_deref(), Some(REASON_STARTED));
        assert_eq!(s.start_time, Some(t1.clone()));
        // Starting again (after a restart of the daemon) keeps the first start time.
        assert!(!start(
            &mut s,
            "restarting containerd and kubelet",
            &at("2026-12-01T10:05:00Z")
        ));
        assert_eq!(s.start_time, Some(t1.clone()));
        let t2 = at("2026-12-01T10:01:00Z");
        finish(&mut s, true, REASON_NODE_RESTARTED, "node Ready again", &t2);
        assert_eq!(s.phase, Some(OperationPhase::Complete));
        assert_eq!(s.reason.as_deref(), Some(REASON_NODE_RESTARTED));
        assert_eq!(s.start_time, Some(t1));
        assert_eq!(s.completion_time, Some(t2));
    }

    #[test]
    fn a_refusal_finishes_an_unstarted_operation_with_both_times() {
        let mut s = MachineOperationStatus::default();
        let t = at(NOW);
        finish(&mut s, false, REASON_UPGRADE_UNSUPPORTED, "not yet", &t);
        assert_eq!(s.phase, Some(OperationPhase::Failed));
        assert_eq!(s.start_time, Some(t.clone()));
        assert_eq!(s.completion_time, Some(t));
    }

    #[test]
    fn failure_messages_are_capped() {
        let mut s = MachineOperationStatus::default();
        finish(&mut s, false, REASON_FAILED, &"e".repeat(50_000), &at(NOW));
        assert!(
            s.message
                .as_deref()
                .is_some_and(|m| m.len() <= MAX_MESSAGE_BYTES)
        );
    }

    #[test]
    fn reasons_follow_the_schema_pattern() {
        for r in [
            REASON_UPGRADE_UNSUPPORTED,
            REASON_STARTED,
            REASON_NODE_RESTARTED,
            REASON_AGENT_RESET,
            REASON_FAILED,
        ] {
            assert!(r.starts_with(|c: char| c.is_ascii_alphabetic()), "{r}");
            assert!(r.chars().all(|c| c.is_ascii_alphanumeric()), "{r}");
        }
    }
}
