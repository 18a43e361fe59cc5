//! Unit tests of how an operation's end gets from the ledger to its status, whatever a kill
//! or an unreachable server cut short (`super::handle_operation`, `super::super::ledger`), over
//! the in-memory fakes of `reconcile_fakes.rs`. The daemon killed for real at each of these
//! points: `tests/daemon_crash.rs`.

use super::fakes::*;
use super::*;
use crate::daemon::operation::Ignore;
use futures_lite::future::block_on;
use nodeward_api::operation::{OperationKind, OperationPhase};
use std::cell::RefMut;

/// One pass over the operation `name` of Machine `w1`, at [`NOW`].
fn handle(
    api: &FakeApi,
    mode: &impl ModeOperator,
    ledger: &MemLedger,
    name: &str,
) -> OperationDone {
    block_on(handle_operation(api, mode, ledger, "w1", name, || at(NOW))).expect("op")
}

/// The stored operation `name`, to change as a concurrent writer would.
fn stored<'a>(api: &'a FakeApi, name: &str) -> RefMut<'a, MachineOperation> {
    RefMut::map(api.operations.borrow_mut(), |all| {
        all.get_mut(name).expect("the operation")
    })
}

/// A NodeReboot `rb` for `w1`, a mode and a ledger with `mark` for it.
fn reboot_with(mark: Option<Mark>) -> (FakeApi, FakeMode, MemLedger) {
    let api = with_machine("w1");
    add_op(&api, "rb", "w1", OperationKind::NodeReboot);
    let ledger = MemLedger::default();
    if let Some(m) = mark {
        ledger.record("uid-rb", "rb", &m).expect("record");
    }
    (api, FakeMode::default(), ledger)
}

/// The end a daemon killed after recording it left in the ledger, unwritten.
fn recorded_end(message: &str) -> Ending {
    Ending {
        complete: true,
        reason: operation::REASON_NODE_RESTARTED.into(),
        message: message.into(),
        at: at("2026-12-01T09:30:00Z"),
    }
}

#[test]
fn an_operation_cut_short_by_the_daemon_stopping_is_failed_not_repeated() {
    let (api, mode, ledger) = reboot_with(Some(Mark::Started));
    handle(&api, &mode, &ledger, "rb");
    assert!(mode.acts.borrow().is_empty());
    let st = op_status(&api, "rb");
    assert_eq!(st.phase, Some(OperationPhase::Failed));
    assert!(st.message.unwrap_or_default().contains("stopped while"));
    assert!(st.completion_time.is_some());
    let mark = ledger.mark_of("uid-rb").expect("read");
    assert!(matches!(mark, Some(Mark::Final(Some(e))) if !e.complete));
}

#[test]
fn an_end_the_daemon_recorded_but_did_not_write_is_written_then_marked_final() {
    let end = recorded_end("containerd and kubelet restarted; Node Ready");
    let (api, mode, ledger) = reboot_with(Some(Mark::Done(end.clone())));
    // Killed after `InProgress`, the act and the done mark: the status says InProgress.
    stored(&api, "rb").status = Some(MachineOperationStatus {
        phase: Some(OperationPhase::InProgress),
        start_time: Some(at("2026-12-01T09:00:00Z")),
        ..Default::default()
    });
    let done = handle(&api, &mode, &ledger, "rb");
    assert_eq!(done.action, Action::Report(end.clone()));
    assert!(mode.acts.borrow().is_empty(), "never run again");
    let st = op_status(&api, "rb");
    assert_eq!(st.phase, Some(OperationPhase::Complete));
    assert_eq!(st.reason.as_deref(), Some(operation::REASON_NODE_RESTARTED));
    assert_eq!(st.message.as_deref(), Some(end.message.as_str()));
    assert_eq!(st.start_time, Some(at("2026-12-01T09:00:00Z")));
    assert_eq!(st.completion_time, Some(end.at.clone()));
    let mark = ledger.mark_of("uid-rb").expect("read");
    assert_eq!(mark, Some(Mark::Final(Some(end))));
}

#[test]
fn a_status_written_before_the_final_mark_only_gets_the_mark() {
    let end = recorded_end("restarted");
    let (api, mode, ledger) = reboot_with(Some(Mark::Done(end.clone())));
    {
        let mut op = stored(&api, "rb");
        end.finish(op.status.get_or_insert_default());
        op.spec.ttl_seconds_after_finished = None;
    }
    let writes = api.writes.get();
    let done = handle(&api, &mode, &ledger, "rb");
    assert_eq!(done.action, Action::Ignore(Ignore::Finished));
    assert_eq!(api.writes.get(), writes, "the status is final already");
    let mark = ledger.mark_of("uid-rb").expect("read");
    assert_eq!(mark, Some(Mark::Final(Some(end))));
}

#[test]
fn an_end_an_earlier_agent_did_not_record_is_failed_saying_so() {
    let (api, mode, ledger) = reboot_with(Some(Mark::Final(None)));
    handle(&api, &mode, &ledger, "rb");
    assert!(mode.acts.borrow().is_empty());
    let st = op_status(&api, "rb");
    assert_eq!(st.phase, Some(OperationPhase::Failed));
    let message = st.message.unwrap_or_default();
    assert!(
        message.contains("before it recorded how it ended"),
        "{message}"
    );
    let mark = ledger.mark_of("uid-rb").expect("read");
    assert!(matches!(&mark, Some(Mark::Final(Some(_)))), "{mark:?}");
}

/// [`FakeMode`], with the API server gone while the restart runs.
struct GoneDuringAct<'a>(&'a FakeMode, &'a FakeApi);

impl ModeOperator for GoneDuringAct<'_> {
    async fn outcome(&self, m: &Machine) -> Outcome {
        self.0.outcome(m).await
    }
    async fn repave(&self, m: &Machine) -> Result<String, OperatorError> {
        self.0.repave(m).await
    }
    async fn roll_out(&self, m: &Machine) -> Result<String, OperatorError> {
        self.0.roll_out(m).await
    }
    async fn recover(&self) -> Result<String, OperatorError> {
        self.0.recover().await
    }
    async fn restart_node(&self) -> Result<String, OperatorError> {
        self.1.unreachable.set(true);
        self.0.restart_node().await
    }
    async fn reset_node(&self) -> Result<String, OperatorError> {
        self.0.reset_node().await
    }
}

#[test]
fn an_unreachable_server_after_the_act_leaves_the_end_owed_and_the_next_pass_writes_it() {
    let (api, mode, ledger) = reboot_with(None);
    let gone = GoneDuringAct(&mode, &api);
    let e = block_on(handle_operation(&api, &gone, &ledger, "w1", "rb", || {
        at(NOW)
    }));
    assert!(matches!(e, Err(ApiError::Unreachable(_))), "{e:?}");
    assert_eq!(
        op_status(&api, "rb").phase,
        Some(OperationPhase::InProgress)
    );
    assert!(matches!(ledger.mark_of("uid-rb"), Ok(Some(Mark::Done(_)))));
    api.unreachable.set(false);
    handle(&api, &mode, &ledger, "rb");
    assert_eq!(*mode.acts.borrow(), ["restart"], "run once");
    assert_eq!(op_status(&api, "rb").phase, Some(OperationPhase::Complete));
    let mark = ledger.mark_of("uid-rb").expect("read");
    assert!(
        matches!(&mark, Some(Mark::Final(Some(e))) if e.complete),
        "{mark:?}"
    );
}
