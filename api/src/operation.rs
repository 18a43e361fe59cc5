//! The `MachineOperation` resource: a one-off action on one node.
//!
//! # Background
//! Rebooting a node, upgrading or resetting its agent are acts, not desired states: asking
//! twice is two acts, and "done" is the end of one. They are modelled like a Job: an object
//! per act, naming its `Machine`, that the node's daemon carries out once and reports on. A
//! finished operation may be deleted after `ttlSecondsAfterFinished` ([`MachineOperation::is_expired`]).
//!
//! # Assumptions
//! The spec is not meant to change once written. The v1.20 CI cluster has no CEL to make it
//! immutable, so the daemon (part 2) acts on the spec it first saw and fails an operation whose
//! `metadata.generation` moved after it started.

use crate::message::cap_message;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::SignedDuration;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A one-off action on the node a Machine keeps.
// Each `printcolumn(...)` repeats `type_ = ...`, which clippy takes for a duplicated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "nodeward.io",
    version = "v1alpha1",
    kind = "MachineOperation",
    status = "MachineOperationStatus",
    shortname = "nwop",
    derive = "PartialEq",
    doc = "A one-off action (restart the node's units, agent upgrade, agent reset) on the node of one Machine, carried out once by that node's daemon.",
    printcolumn(
        name = "Machine",
        type_ = "string",
        json_path = ".spec.machineRef.name",
        description = "The Machine whose node acts"
    ),
    printcolumn(
        name = "Kind",
        type_ = "string",
        json_path = ".spec.kind",
        description = "What the node does"
    ),
    printcolumn(
        name = "Phase",
        type_ = "string",
        json_path = ".status.phase",
        description = "Where the operation is"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct MachineOperationSpec {
    /// The Machine whose node carries the operation out.
    pub machine_ref: MachineRef,
    /// What the node does.
    pub kind: OperationKind,
    /// Seconds after the operation finished (Complete or Failed) when it may be deleted.
    /// Absent: it is kept until someone deletes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub ttl_seconds_after_finished: Option<i32>,
}

/// A reference to a Machine (cluster-scoped, so by name only).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineRef {
    /// The Machine's name (the node's name).
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// What a MachineOperation asks the node to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum OperationKind {
    /// Restart the node's units in place (containerd, then the kubelet) with its applied
    /// config and wait until the node is healthy again; the host is not rebooted. The node is
    /// not drained: its containers restart, so cordon and drain it first if its pods matter.
    NodeReboot,
    /// Replace the agent binary with the one `spec.agent` of the Machine pins (blue/green,
    /// with a rollback if the new one does not come up).
    AgentUpgrade,
    /// Remove the node (the reset pipeline: units, configs, versions, node state; the agent
    /// stays), mark the operation Complete, and stop the daemon (exit 69: nothing to keep).
    AgentReset,
}

/// Where a MachineOperation is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum OperationPhase {
    /// The daemon has not started it.
    Pending,
    /// The daemon has started it.
    InProgress,
    /// It finished as asked.
    Complete,
    /// It did not finish; `reason` and `message` say why.
    Failed,
}

impl OperationPhase {
    /// Whether the operation has finished (Complete or Failed): the daemon will not act on
    /// it again, and its TTL runs.
    pub fn is_finished(self) -> bool {
        matches!(self, OperationPhase::Complete | OperationPhase::Failed)
    }
}

/// What the daemon reports about a MachineOperation.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineOperationStatus {
    /// Where the operation is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<OperationPhase>,
    /// Why it is where it is, CamelCase (e.g. `NodeRestarted`, `AgentUpgradeUnsupported`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(max = 1024),
        pattern(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
    )]
    pub reason: Option<String>,
    /// What happened, for a human; at most 1 KiB, cut with an ellipsis (the daemon sets it
    /// through `set_message`, which caps it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub message: Option<String>,
    /// When the daemon started it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    /// When it finished (Complete or Failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,
}

impl MachineOperationStatus {
    /// Sets the message, capped to [`crate::message::MAX_MESSAGE_BYTES`].
    pub fn set_message(&mut self, message: &str) {
        self.message = Some(cap_message(message));
    }
}

impl MachineOperation {
    /// Whether the operation finished and its `ttlSecondsAfterFinished` has passed at `now`,
    /// so it may be deleted. An operation without a TTL, unfinished, or without a
    /// completion time never expires.
    pub fn is_expired(&self, now: &Time) -> bool {
        let Some(ttl) = self.spec.ttl_seconds_after_finished else {
            return false;
        };
        let Some(status) = &self.status else {
            return false;
        };
        let (Some(phase), Some(completed)) = (status.phase, &status.completion_time) else {
            return false;
        };
        if !phase.is_finished() {
            return false;
        }
        // A negative TTL is refused by the schema; an object from before the CRD counts it
        // as zero rather than as "expired before it finished".
        let ttl = SignedDuration::from_secs(i64::from(ttl.max(0)));
        match completed.0.checked_add(ttl) {
            Ok(deadline) => now.0 >= deadline,
            // Past the last representable instant: never.
            Err(_) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{MAX_MESSAGE_BYTES, TRUNCATION_MARKER};
    use k8s_openapi::jiff::Timestamp;

    fn at(seconds: i64) -> Time {
        Time(Timestamp::from_second(seconds).expect("in range"))
    }

    fn operation(
        ttl: Option<i32>,
        phase: Option<OperationPhase>,
        completed: Option<i64>,
    ) -> MachineOperation {
        let mut op = MachineOperation::new(
            "reboot-worker-01",
            MachineOperationSpec {
                machine_ref: MachineRef {
                    name: "worker-01".into(),
                },
                kind: OperationKind::NodeReboot,
                ttl_seconds_after_finished: ttl,
            },
        );
        op.status = Some(MachineOperationStatus {
            phase,
            completion_time: completed.map(at),
            ..MachineOperationStatus::default()
        });
        op
    }

    #[test]
    fn finished_operation_expires_after_its_ttl() {
        for phase in [OperationPhase::Complete, OperationPhase::Failed] {
            let op = operation(Some(60), Some(phase), Some(1000));
            assert!(!op.is_expired(&at(1059)), "{phase:?}");
            assert!(op.is_expired(&at(1060)), "{phase:?}");
            assert!(op.is_expired(&at(5000)), "{phase:?}");
        }
    }

    #[test]
    fn zero_ttl_expires_at_completion() {
        let op = operation(Some(0), Some(OperationPhase::Complete), Some(1000));
        assert!(op.is_expired(&at(1000)));
        assert!(!op.is_expired(&at(999)));
    }

    #[test]
    fn unfinished_or_untimed_operation_never_expires() {
        let far = at(1_000_000_000);
        assert!(!operation(None, Some(OperationPhase::Complete), Some(0)).is_expired(&far));
        assert!(!operation(Some(1), Some(OperationPhase::InProgress), Some(0)).is_expired(&far));
        assert!(!operation(Some(1), Some(OperationPhase::Pending), None).is_expired(&far));
        assert!(!operation(Some(1), None, Some(0)).is_expired(&far));
        assert!(!operation(Some(1), Some(OperationPhase::Complete), None).is_expired(&far));
        let mut no_status = operation(Some(1), None, None);
        no_status.status = None;
        assert!(!no_status.is_expired(&far));
    }

    #[test]
    fn negative_ttl_counts_as_zero() {
        let op = operation(Some(-5), Some(OperationPhase::Failed), Some(1000));
        assert!(!op.is_expired(&at(999)));
        assert!(op.is_expired(&at(1000)));
    }

    #[test]
    fn deadline_past_the_end_of_time_never_expires() {
        let last = Time(Timestamp::MAX);
        let op = MachineOperation {
            status: Some(MachineOperationStatus {
                phase: Some(OperationPhase::Complete),
                completion_time: Some(last.clone()),
                ..MachineOperationStatus::default()
            }),
            ..operation(Some(i32::MAX), None, None)
        };
        assert!(!op.is_expired(&last));
    }

    #[test]
    fn status_message_is_capped() {
        let mut status = MachineOperationStatus::default();
        status.set_message(&"m".repeat(3 * MAX_MESSAGE_BYTES));
        let message = status.message.expect("set");
        assert!(message.len() <= MAX_MESSAGE_BYTES);
        assert!(message.ends_with(TRUNCATION_MARKER));
    }
}
