//! The objects the requests carry: Machines and MachineOperations as the API server stores
//! them (the examples in deploy/examples/ under another name), and the statuses the daemon and
//! the bootstrap write, made with the API crate's own `set_condition`, the function
//! `host/daemon/status.rs` and `host/bootstrap_report.rs` write conditions with.

use crate::cluster::documents;
use k8s_openapi::jiff::Timestamp;
use nodeward_api::machine::{ActiveBundle, AuditHead, LastOperation};
use nodeward_api::operation::{OperationKind, OperationPhase};
use nodeward_api::{
    ConditionUpdate, Machine, MachineOperation, MachineOperationStatus, MachinePhase,
    MachineStatus, Reason, Time,
};
use serde_json::{Value as Json, json};
use std::sync::LazyLock;

/// The instant `seconds` after the epoch.
pub fn at(seconds: i64) -> Time {
    Time(Timestamp::from_second(seconds).expect("in range"))
}

/// The stored metadata of an object named `name`: what the API server adds on create.
fn stored_metadata(name: &str) -> Json {
    json!({
        "name": name,
        "uid": "0b1c2d3e-4f50-4617-8293-a4b5c6d7e8f9",
        "resourceVersion": "4711",
        "generation": 3,
        "creationTimestamp": "2025-06-01T00:00:00Z",
    })
}

/// The first document of a file in deploy/examples/, read once.
fn example(file: &'static str) -> Json {
    static EXAMPLES: LazyLock<[Json; 2]> = LazyLock::new(|| {
        ["examples/machine.yaml", "examples/operation-reboot.yaml"].map(|f| documents(f).remove(0))
    });
    match file {
        "machine" => EXAMPLES[0].clone(),
        "operation" => EXAMPLES[1].clone(),
        other => panic!("no example {other}"),
    }
}

/// The Machine `name` as stored: the example's spec, and `status` if any.
pub fn machine(name: &str, status: Option<&MachineStatus>) -> Json {
    let mut object = example("machine");
    object["metadata"] = stored_metadata(name);
    if let Some(status) = status {
        object["status"] = serde_json::to_value(status).expect("a status serialises");
    }
    serde_json::from_value::<Machine>(object.clone()).expect("a valid Machine");
    object
}

/// The MachineOperation `name` naming the Machine `machine`, as stored, finished.
pub fn operation(name: &str, machine: &str) -> Json {
    let mut object = example("operation");
    object["metadata"] = stored_metadata(name);
    object["spec"]["machineRef"]["name"] = json!(machine);
    object["status"] = operation_status(OperationPhase::Complete);
    serde_json::from_value::<MachineOperation>(object.clone()).expect("a valid MachineOperation");
    object
}

/// A MachineOperation's status as the daemon writes it.
pub fn operation_status(phase: OperationPhase) -> Json {
    let status = MachineOperationStatus {
        phase: Some(phase),
        reason: Some("NodeRestarted".to_string()),
        message: Some("containerd and the kubelet restarted".to_string()),
        start_time: Some(at(1_750_000_000)),
        completion_time: phase.is_finished().then(|| at(1_750_000_060)),
    };
    serde_json::to_value(status).expect("a status serialises")
}

/// A status the daemon writes for a ready node that acted on `generation` at `now`: every
/// field of the status set (the four conditions, each with `observedGeneration`).
pub fn daemon_status(generation: i64, now: i64, flavour: u8) -> MachineStatus {
    let mut status = MachineStatus::default();
    let hex = |c: char| std::iter::repeat_n(c, 64).collect::<String>();
    for reason in [
        Reason::Bootstrapped,
        Reason::UpToDate,
        Reason::BundleActive,
        Reason::NoRepaveNeeded,
    ] {
        status.set_condition(
            &ConditionUpdate::new(reason, "", Some(generation)),
            &at(now),
        );
    }
    status.phase = Some(if flavour == 0 {
        MachinePhase::Ready
    } else {
        MachinePhase::Updating
    });
    status.observed_generation = Some(generation);
    status.applied_config_digest = Some(hex(char::from(b'a' + flavour)));
    status.active_bundle = Some(ActiveBundle {
        name: "platform".to_string(),
        version: 7 + i64::from(flavour),
        digest: hex(char::from(b'0' + flavour)),
    });
    status.agent_version = Some(format!("0.{flavour}.0"));
    status.last_operation = Some(LastOperation {
        name: format!("reboot-{flavour}"),
        kind: OperationKind::NodeReboot,
        phase: OperationPhase::Complete,
    });
    status.audit_head = Some(AuditHead {
        seq: 40 + i64::from(flavour),
        sha256: hex(char::from(b'b' + flavour)),
    });
    status
}

/// What `nodeward bootstrap` writes over `stored` (the Machine's status as read, if any):
/// `host/bootstrap_report.rs` sets one AgentBootstrapped condition, without
/// observedGeneration, at `now`, and writes the status back.
pub fn bootstrap_report(stored: Option<&MachineStatus>, reason: Reason, now: i64) -> MachineStatus {
    let mut status = stored.cloned().unwrap_or_default();
    let message = match reason {
        Reason::Bootstrapping => "running: kubelet",
        Reason::BootstrapFailed => "phase containerd failed",
        _ => "",
    };
    assert!(
        status.set_condition(&ConditionUpdate::new(reason, message, None), &at(now)),
        "the report changes the status"
    );
    status
}

/// `status` as JSON, for a request's body.
pub fn json_of(status: &MachineStatus) -> Json {
    serde_json::to_value(status).expect("a status serialises")
}
