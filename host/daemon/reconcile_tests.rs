//! Unit tests of one reconcile pass over in-memory fakes of the API server and the mode: the
//! decisions and the conflict retries. The real API server is exercised by the cluster tests.

use super::*;
use crate::daemon::ledger::LedgerError;
use crate::daemon::operation::Ignore;
use crate::daemon::status::{Bootstrap, Bundle, Update};
use futures_lite::future::block_on;
use nodeward_api::machine::ActiveBundle;
use nodeward_api::operation::{MachineOperationSpec, MachineRef, OperationKind, OperationPhase};
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;

fn at(rfc3339: &str) -> Time {
    serde_json::from_value(serde_json::Value::String(rfc3339.into())).expect("a time")
}

const NOW: &str = "2026-12-01T10:00:00Z";

/// An API server in memory: objects by name, a resourceVersion per write, and a number of
/// writes to refuse with 409 (as a concurrent writer would cause).
#[derive(Default)]
struct FakeApi {
    machines: RefCell<BTreeMap<String, Machine>>,
    operations: RefCell<BTreeMap<String, MachineOperation>>,
    conflicts_to_inject: Cell<u32>,
    writes: Cell<u32>,
    unreachable: Cell<bool>,
}

/// The next resourceVersion, as the API server moves an object on at each write.
fn bump(resource_version: &mut Option<String>) {
    let v: u64 = resource_version
        .as_deref()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    *resource_version = Some((v + 1).to_string());
}

impl FakeApi {
    fn check(&self) -> Result<(), ApiError> {
        if self.unreachable.get() {
            return Err(ApiError::Unreachable("connection refused".into()));
        }
        Ok(())
    }

    /// Refuses the write with 409 while conflicts are to be injected (and moves the stored
    /// object on, as the concurrent writer did).
    fn conflict(&self) -> bool {
        let n = self.conflicts_to_inject.get();
        if n > 0 {
            self.conflicts_to_inject.set(n - 1);
            return true;
        }
        false
    }
}

impl MachineApi for FakeApi {
    async fn machine(&self, name: &str) -> Result<Option<Machine>, ApiError> {
        self.check()?;
        Ok(self.machines.borrow().get(name).cloned())
    }
    async fn replace_machine_status(&self, machine: &Machine) -> Result<Machine, ApiError> {
        self.check()?;
        let mut all = self.machines.borrow_mut();
        let name = machine.metadata.name.clone().expect("named");
        let stored = all.get_mut(&name).ok_or(ApiError::Refused("404".into()))?;
        if self.conflict() {
            bump(&mut stored.metadata.resource_version);
        }
        if stored.metadata.resource_version != machine.metadata.resource_version {
            return Err(ApiError::Conflict);
        }
        stored.status = machine.status.clone();
        bump(&mut stored.metadata.resource_version);
        self.writes.set(self.writes.get() + 1);
        Ok(stored.clone())
    }
    async fn operation(&self, name: &str) -> Result<Option<MachineOperation>, ApiError> {
        self.check()?;
        Ok(self.operations.borrow().get(name).cloned())
    }
    async fn replace_operation_status(
        &self,
        op: &MachineOperation,
    ) -> Result<MachineOperation, ApiError> {
        self.check()?;
        let mut all = self.operations.borrow_mut();
        let name = op.metadata.name.clone().expect("named");
        let stored = all.get_mut(&name).ok_or(ApiError::Refused("404".into()))?;
        if self.conflict() {
            bump(&mut stored.metadata.resource_version);
        }
        if stored.metadata.resource_version != op.metadata.resource_version {
            return Err(ApiError::Conflict);
        }
        stored.status = op.status.clone();
        bump(&mut stored.metadata.resource_version);
        self.writes.set(self.writes.get() + 1);
        Ok(stored.clone())
    }
    async fn delete_operation(&self, name: &str) -> Result<(), ApiError> {
        self.check()?;
        self.operations.borrow_mut().remove(name);
        Ok(())
    }
}

/// A mode that reports a ready node and records the acts asked of it.
#[derive(Default)]
struct FakeMode {
    acts: RefCell<Vec<&'static str>>,
    fail: Cell<bool>,
    /// The spec differs from the node (a repave is asked for).
    drift: Cell<bool>,
    /// The last repave failed with this (reported until the test clears it).
    repave_failed: RefCell<Option<String>>,
    /// The spec names a bundle not rolled out yet.
    bundle_due: Cell<bool>,
    /// The last roll-out was rolled back with this.
    rolled_back: RefCell<Option<String>>,
}

impl ModeOperator for FakeMode {
    async fn outcome(&self, machine: &Machine) -> Outcome {
        Outcome {
            generation: machine.metadata.generation,
            bootstrap: Bootstrap::Done,
            update: match &*self.repave_failed.borrow() {
                Some(e) => Update::Failed(e.clone()),
                None => Update::UpToDate,
            },
            bundle: match (&*self.rolled_back.borrow(), self.bundle_due.get()) {
                (Some(e), _) => Bundle::RolledBack(e.clone()),
                (None, true) => Bundle::Installing("queued".into()),
                (None, false) => Bundle::Active(ActiveBundle {
                    name: "default".into(),
                    version: 1,
                    digest: "c".repeat(64),
                }),
            },
            repave: self.drift.get().then(|| "kubernetesVersion 1.35.0".into()),
            roll_out: (self.bundle_due.get() && self.rolled_back.borrow().is_none())
                .then(|| "the spec names bundle archive sha256 ee…".into()),
            repaving: false,
            active_bundle: None,
            audit_head: None,
        }
    }
    async fn roll_out(&self, _machine: &Machine) -> Result<String, OperatorError> {
        self.acts.borrow_mut().push("roll-out");
        if self.fail.get() {
            *self.rolled_back.borrow_mut() = Some("kubelet not healthy; rolled back".into());
            return Err(OperatorError("kubelet not healthy; rolled back".into()));
        }
        self.bundle_due.set(false);
        Ok("bundle current; node healthy".into())
    }
    async fn repave(&self, _machine: &Machine) -> Result<String, OperatorError> {
        self.acts.borrow_mut().push("repave");
        if self.fail.get() {
            *self.repave_failed.borrow_mut() = Some("the upgrade was rolled back".into());
            return Err(OperatorError("the upgrade was rolled back".into()));
        }
        self.drift.set(false);
        Ok("upgraded".into())
    }
    async fn recover(&self) -> Result<String, OperatorError> {
        self.acts.borrow_mut().push("recover");
        Ok("nothing to recover".into())
    }
    async fn restart_node(&self) -> Result<String, OperatorError> {
        self.acts.borrow_mut().push("restart");
        if self.fail.get() {
            return Err(OperatorError("containerd did not start".into()));
        }
        Ok("containerd and kubelet restarted; Node Ready".into())
    }
    async fn reset_node(&self) -> Result<String, OperatorError> {
        self.acts.borrow_mut().push("reset");
        Ok("node removed".into())
    }
}

fn with_machine(name: &str) -> FakeApi {
    let api = FakeApi::default();
    let mut m = crate::daemon::test_machine(name, "1.34.1");
    m.metadata.generation = Some(4);
    m.metadata.resource_version = Some("1".into());
    api.machines.borrow_mut().insert(name.into(), m);
    api
}

/// The ledger in memory.
#[derive(Default)]
struct MemLedger(RefCell<BTreeMap<String, Mark>>);

impl Ledger for MemLedger {
    fn mark_of(&self, uid: &str) -> Result<Option<Mark>, LedgerError> {
        Ok(self.0.borrow().get(uid).copied())
    }
    fn record(&self, uid: &str, _name: &str, mark: Mark) -> Result<(), LedgerError> {
        self.0.borrow_mut().insert(uid.into(), mark);
        Ok(())
    }
}

fn add_op(api: &FakeApi, name: &str, machine: &str, kind: OperationKind) {
    let mut op = MachineOperation::new(
        name,
        MachineOperationSpec {
            machine_ref: MachineRef {
                name: machine.into(),
            },
            kind,
            ttl_seconds_after_finished: Some(0),
        },
    );
    op.metadata.resource_version = Some("1".into());
    op.metadata.uid = Some(format!("uid-{name}"));
    api.operations.borrow_mut().insert(name.into(), op);
}

fn op_status(api: &FakeApi, name: &str) -> MachineOperationStatus {
    api.operations.borrow()[name]
        .status
        .clone()
        .expect("a status")
}

#[test]
fn a_pass_writes_the_status_once_then_nothing() {
    let api = with_machine("w1");
    let mode = FakeMode::default();
    let w = block_on(reconcile_machine(&api, &mode, "w1", || at(NOW))).expect("pass");
    assert_eq!(
        w,
        Written {
            written: true,
            conflicts: 0
        }
    );
    let st = api.machines.borrow()["w1"].status.clone().expect("status");
    assert_eq!(st.observed_generation, Some(4));
    assert_eq!(st.conditions.len(), 4);
    let again = block_on(reconcile_machine(&api, &mode, "w1", || {
        at("2026-12-01T11:00:00Z")
    }));
    assert_eq!(
        again.expect("pass"),
        Written {
            written: false,
            conflicts: 0
        }
    );
    assert_eq!(api.writes.get(), 1);
}

#[test]
fn conflicts_are_retried_up_to_the_bound() {
    let api = with_machine("w1");
    let mode = FakeMode::default();
    api.conflicts_to_inject.set(MAX_CONFLICTS);
    let w = block_on(reconcile_machine(&api, &mode, "w1", || at(NOW))).expect("pass");
    assert_eq!(
        w,
        Written {
            written: true,
            conflicts: MAX_CONFLICTS
        }
    );

    let api = with_machine("w1");
    api.conflicts_to_inject.set(MAX_CONFLICTS + 1);
    let e = block_on(reconcile_machine(&api, &mode, "w1", || at(NOW)));
    assert_eq!(e, Err(ApiError::Conflict));
    assert_eq!(api.writes.get(), 0);
}

#[test]
fn an_unreachable_server_is_an_error_the_caller_backs_off_on() {
    let api = with_machine("w1");
    api.unreachable.set(true);
    let e = block_on(reconcile_machine(&api, &FakeMode::default(), "w1", || {
        at(NOW)
    }));
    assert!(matches!(e, Err(ApiError::Unreachable(_))), "{e:?}");
}

#[test]
fn no_machine_no_write() {
    let api = FakeApi::default();
    let w = block_on(reconcile_machine(&api, &FakeMode::default(), "w1", || {
        at(NOW)
    }));
    assert_eq!(
        w.expect("pass"),
        Written {
            written: false,
            conflicts: 0
        }
    );
}

#[test]
fn agent_upgrade_is_failed_with_its_reason_and_no_act() {
    let api = with_machine("w1");
    let mode = FakeMode::default();
    let ledger = MemLedger::default();
    add_op(&api, "up", "w1", OperationKind::AgentUpgrade);
    let done = block_on(handle_operation(&api, &mode, &ledger, "w1", "up", || {
        at(NOW)
    }))
    .expect("op");
    assert!(!done.exit);
    let st = op_status(&api, "up");
    assert_eq!(st.phase, Some(OperationPhase::Failed));
    assert_eq!(
        st.reason.as_deref(),
        Some(operation::REASON_UPGRADE_UNSUPPORTED)
    );
    assert!(st.start_time.is_some() && st.completion_time.is_some());
    assert!(mode.acts.borrow().is_empty());
}

#[test]
fn node_reboot_restarts_in_place_and_completes_through_conflicts() {
    let api = with_machine("w1");
    let mode = FakeMode::default();
    let ledger = MemLedger::default();
    add_op(&api, "rb", "w1", OperationKind::NodeReboot);
    api.conflicts_to_inject.set(2);
    let done = block_on(handle_operation(&api, &mode, &ledger, "w1", "rb", || {
        at(NOW)
    }))
    .expect("op");
    assert_eq!(done.action, Action::Run(Act::RestartNode));
    assert_eq!(done.conflicts, 2);
    assert!(!done.exit);
    assert_eq!(*mode.acts.borrow(), ["restart"]);
    let st = op_status(&api, "rb");
    assert_eq!(st.phase, Some(OperationPhase::Complete));
    assert_eq!(st.reason.as_deref(), Some(operation::REASON_NODE_RESTARTED));
    // Finished: never run again; past its TTL (0 s): deleted.
    let again = block_on(handle_operation(&api, &mode, &ledger, "w1", "rb", || {
        at(NOW)
    }))
    .expect("op");
    assert_eq!(again.action, Action::Delete);
    assert!(!api.operations.borrow().contains_key("rb"));
    assert_eq!(*mode.acts.borrow(), ["restart"]);
}

#[test]
fn a_failed_restart_fails_the_operation_with_the_reason() {
    let api = with_machine("w1");
    let mode = FakeMode::default();
    let ledger = MemLedger::default();
    mode.fail.set(true);
    add_op(&api, "rb", "w1", OperationKind::NodeReboot);
    block_on(handle_operation(&api, &mode, &ledger, "w1", "rb", || {
        at(NOW)
    }))
    .expect("op");
    let st = op_status(&api, "rb");
    assert_eq!(st.phase, Some(OperationPhase::Failed));
    assert_eq!(st.reason.as_deref(), Some(operation::REASON_FAILED));
    assert_eq!(st.message.as_deref(), Some("containerd did not start"));
}

#[test]
fn agent_reset_completes_then_asks_for_exit() {
    let api = with_machine("w1");
    let mode = FakeMode::default();
    let ledger = MemLedger::default();
    add_op(&api, "rs", "w1", OperationKind::AgentReset);
    let done = block_on(handle_operation(&api, &mode, &ledger, "w1", "rs", || {
        at(NOW)
    }))
    .expect("op");
    assert!(done.exit);
    assert_eq!(*mode.acts.borrow(), ["reset"]);
    assert_eq!(op_status(&api, "rs").phase, Some(OperationPhase::Complete));
}

#[test]
fn another_machines_operation_is_untouched() {
    let api = with_machine("w1");
    let mode = FakeMode::default();
    let ledger = MemLedger::default();
    add_op(&api, "rb", "w2", OperationKind::NodeReboot);
    let done = block_on(handle_operation(&api, &mode, &ledger, "w1", "rb", || {
        at(NOW)
    }))
    .expect("op");
    assert_eq!(done.action, Action::Ignore(operation::Ignore::NotOurs));
    assert!(api.operations.borrow()["rb"].status.is_none());
    assert!(mode.acts.borrow().is_empty());
}

#[test]
fn drift_is_repaved_once_with_repaving_reported_first() {
    let api = with_machine("w1");
    let mode = FakeMode::default();
    mode.drift.set(true);
    let w = block_on(reconcile_machine(&api, &mode, "w1", || at(NOW))).expect("pass");
    assert!(w.written);
    assert_eq!(*mode.acts.borrow(), ["repave"]);
    // Two writes: Repaving, then the node as the repave left it.
    assert_eq!(api.writes.get(), 2);
    let st = api.machines.borrow()["w1"].status.clone().expect("status");
    assert_eq!(st.phase, Some(nodeward_api::MachinePhase::Ready));
    // Nothing left to do: the next pass neither repaves nor writes.
    block_on(reconcile_machine(&api, &mode, "w1", || at(NOW))).expect("pass");
    assert_eq!(*mode.acts.borrow(), ["repave"]);
    assert_eq!(api.writes.get(), 2);
}

#[test]
fn a_failed_repave_is_reported_and_not_retried() {
    let api = with_machine("w1");
    let mode = FakeMode::default();
    mode.drift.set(true);
    mode.fail.set(true);
    block_on(reconcile_machine(&api, &mode, "w1", || at(NOW))).expect("pass");
    let st = api.machines.borrow()["w1"].status.clone().expect("status");
    assert_eq!(st.phase, Some(nodeward_api::MachinePhase::Failed));
    for _ in 0..3 {
        block_on(reconcile_machine(&api, &mode, "w1", || at(NOW))).expect("pass");
    }
    assert_eq!(*mode.acts.borrow(), ["repave"], "retried");
}

#[test]
fn an_operation_is_run_at_most_once_whatever_its_status_says() {
    let api = with_machine("w1");
    add_op(&api, "rs", "w1", OperationKind::AgentReset);
    let mode = FakeMode::default();
    let ledger = MemLedger::default();
    block_on(handle_operation(&api, &mode, &ledger, "w1", "rs", || {
        at(NOW)
    }))
    .expect("op");
    assert_eq!(*mode.acts.borrow(), ["reset"]);
    // Another node (no admission policy) sets its status back to Pending: not run again.
    api.operations
        .borrow_mut()
        .get_mut("rs")
        .expect("op")
        .status = None;
    let done = block_on(handle_operation(&api, &mode, &ledger, "w1", "rs", || {
        at(NOW)
    }))
    .expect("op");
    assert_eq!(done.action, Action::Ignore(Ignore::Finished));
    assert!(!done.exit);
    assert_eq!(*mode.acts.borrow(), ["reset"]);
}

#[test]
fn an_operation_cut_short_by_the_daemon_stopping_is_failed_not_repeated() {
    let api = with_machine("w1");
    add_op(&api, "rb", "w1", OperationKind::NodeReboot);
    let mode = FakeMode::default();
    let ledger = MemLedger::default();
    ledger
        .record("uid-rb", "rb", Mark::Started)
        .expect("record");
    block_on(handle_operation(&api, &mode, &ledger, "w1", "rb", || {
        at(NOW)
    }))
    .expect("op");
    assert!(mode.acts.borrow().is_empty());
    let st = op_status(&api, "rb");
    assert_eq!(st.phase, Some(OperationPhase::Failed));
    assert!(st.message.unwrap_or_default().contains("stopped while"));
}

fn bundle_condition(api: &FakeApi) -> (String, String) {
    let st = api.machines.borrow()["w1"].status.clone().expect("status");
    let c = nodeward_api::condition::find_condition(
        &st.conditions,
        nodeward_api::ConditionType::BundleApplied,
    )
    .expect("BundleApplied")
    .clone();
    (c.status, c.reason)
}

#[test]
fn a_bundle_is_rolled_out_once_with_installing_reported_first() {
    let api = with_machine("w1");
    let mode = FakeMode::default();
    mode.bundle_due.set(true);
    block_on(reconcile_machine(&api, &mode, "w1", || at(NOW))).expect("pass");
    assert_eq!(*mode.acts.borrow(), ["roll-out"]);
    // Two writes: BundleInstalling, then the bundle as the roll-out left it.
    assert_eq!(api.writes.get(), 2);
    assert_eq!(
        bundle_condition(&api),
        ("True".into(), "BundleActive".into())
    );
    block_on(reconcile_machine(&api, &mode, "w1", || at(NOW))).expect("pass");
    assert_eq!(*mode.acts.borrow(), ["roll-out"]);
    assert_eq!(api.writes.get(), 2);
}

#[test]
fn a_repave_goes_before_a_roll_out() {
    let api = with_machine("w1");
    let mode = FakeMode::default();
    mode.bundle_due.set(true);
    mode.drift.set(true);
    block_on(reconcile_machine(&api, &mode, "w1", || at(NOW))).expect("pass");
    block_on(reconcile_machine(&api, &mode, "w1", || at(NOW))).expect("pass");
    assert_eq!(*mode.acts.borrow(), ["repave", "roll-out"]);
}

#[test]
fn a_rolled_back_bundle_is_reported_and_not_retried_by_the_next_pass() {
    let api = with_machine("w1");
    let mode = FakeMode::default();
    mode.bundle_due.set(true);
    mode.fail.set(true);
    block_on(reconcile_machine(&api, &mode, "w1", || at(NOW))).expect("pass");
    assert_eq!(
        bundle_condition(&api),
        ("False".into(), "BundleRolledBack".into())
    );
    let st = api.machines.borrow()["w1"].status.clone().expect("status");
    assert_eq!(st.phase, Some(nodeward_api::MachinePhase::Failed));
    block_on(reconcile_machine(&api, &mode, "w1", || at(NOW))).expect("pass");
    assert_eq!(*mode.acts.borrow(), ["roll-out"], "retried");
}
