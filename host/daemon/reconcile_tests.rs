//! Unit tests of one reconcile pass over in-memory fakes of the API server and the mode: the
//! decisions and the conflict retries. The real API server is exercised by the cluster tests.

use super::fakes::*;
use super::*;
use futures_lite::future::block_on;
use nodeward_api::operation::{OperationKind, OperationPhase};

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
    let written = op_status(&api, "rs");
    // Another node (no admission policy) sets its status back to Pending: not run again, and
    // its recorded end is written again.
    api.operations
        .borrow_mut()
        .get_mut("rs")
        .expect("op")
        .status = None;
    let done = block_on(handle_operation(&api, &mode, &ledger, "w1", "rs", || {
        at("2026-12-01T11:00:00Z")
    }))
    .expect("op");
    assert!(
        matches!(&done.action, Action::Report(e) if e.complete),
        "{:?}",
        done.action
    );
    assert!(!done.exit);
    assert_eq!(*mode.acts.borrow(), ["reset"]);
    let again = op_status(&api, "rs");
    assert_eq!(again.phase, Some(OperationPhase::Complete));
    assert_eq!(again.completion_time, written.completion_time);
    assert_eq!(again.message, written.message);
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
