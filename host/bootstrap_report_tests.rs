//! Unit tests of the bootstrap status reporter: the condition each progress is, the checkpoint
//! a bootstrap starts from, the one-condition write with its conflict retries over an
//! in-memory API server, and a reporter against a server that refuses or never answers.

use super::*;
use crate::node::state::{Checkpoint, SCHEMA};
use futures_lite::future::block_on;
use nodeward_api::message::{MAX_MESSAGE_BYTES, TRUNCATION_MARKER};
use nodeward_api::{Condition, ConditionType, Machine, MachineOperation, MachinePhase};
use std::cell::{Cell, RefCell};

fn at(rfc3339: &str) -> Time {
    serde_json::from_value(serde_json::Value::String(rfc3339.into())).expect("a time")
}

const EARLIER: &str = "2026-11-30T09:00:00Z";
const NOW: &str = "2026-12-01T10:00:00Z";
const LATER: &str = "2026-12-01T10:05:00Z";

fn config() -> NodeConfig {
    crate::config::parse(crate::config::EMBEDDED, "test").expect("the embedded config")
}

fn condition(type_: &str, status: &str, reason: &str) -> Condition {
    Condition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message: format!("{reason} said by someone else"),
        observed_generation: Some(3),
        last_transition_time: at(EARLIER),
    }
}

/// A Machine `name` whose status the daemon (and a newer daemon) already wrote.
fn written_machine(name: &str) -> Machine {
    let mut m = crate::daemon::test_machine(name, "1.34.1");
    m.metadata.resource_version = Some("7".into());
    m.metadata.generation = Some(3);
    m.status = Some(MachineStatus {
        phase: Some(MachinePhase::Ready),
        conditions: vec![
            condition("AgentBootstrapped", "True", "Bootstrapped"),
            condition("NodeUpdated", "True", "UpToDate"),
            condition("SomethingNewer", "False", "NewerReason"),
        ],
        observed_generation: Some(3),
        agent_version: Some("0.1.0".into()),
        ..MachineStatus::default()
    });
    m
}

/// An API server in memory: one Machine or none, a resourceVersion per write, writes to
/// refuse with 409 (a concurrent writer moving the object on), or an error for every request.
#[derive(Default)]
struct FakeApi {
    machine: RefCell<Option<Machine>>,
    conflicts_to_inject: Cell<u32>,
    writes: Cell<u32>,
    reads: Cell<u32>,
    fail: RefCell<Option<ApiError>>,
}

impl FakeApi {
    fn with(machine: Machine) -> FakeApi {
        FakeApi {
            machine: RefCell::new(Some(machine)),
            ..FakeApi::default()
        }
    }

    fn stored(&self) -> Machine {
        self.machine.borrow().clone().expect("a Machine")
    }

    fn check(&self) -> Result<(), ApiError> {
        match self.fail.borrow().clone() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

fn bump(resource_version: &mut Option<String>) {
    let v: u64 = resource_version
        .as_deref()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    *resource_version = Some((v + 1).to_string());
}

impl MachineApi for FakeApi {
    async fn machine(&self, name: &str) -> Result<Option<Machine>, ApiError> {
        self.check()?;
        self.reads.set(self.reads.get() + 1);
        Ok(self
            .machine
            .borrow()
            .clone()
            .filter(|m| m.metadata.name.as_deref() == Some(name)))
    }
    async fn replace_machine_status(&self, machine: &Machine) -> Result<Machine, ApiError> {
        self.check()?;
        let mut slot = self.machine.borrow_mut();
        let stored = slot.as_mut().ok_or(ApiError::Refused("404".into()))?;
        let n = self.conflicts_to_inject.get();
        if n > 0 {
            self.conflicts_to_inject.set(n - 1);
            // The concurrent writer: a daemon pass that set another condition.
            bump(&mut stored.metadata.resource_version);
            let st = stored.status.get_or_insert_default();
            st.conditions
                .push(condition(&format!("Concurrent{n}"), "True", "Written"));
        }
        if stored.metadata.resource_version != machine.metadata.resource_version {
            return Err(ApiError::Conflict);
        }
        stored.status = machine.status.clone();
        bump(&mut stored.metadata.resource_version);
        self.writes.set(self.writes.get() + 1);
        Ok(stored.clone())
    }
    async fn operation(&self, _: &str) -> Result<Option<MachineOperation>, ApiError> {
        Err(ApiError::Refused("the reporter reads no operation".into()))
    }
    async fn replace_operation_status(
        &self,
        _: &MachineOperation,
    ) -> Result<MachineOperation, ApiError> {
        Err(ApiError::Refused("the reporter writes no operation".into()))
    }
    async fn delete_operation(&self, _: &str) -> Result<(), ApiError> {
        Err(ApiError::Refused("the reporter deletes nothing".into()))
    }
    async fn config_map(
        &self,
        _: &str,
        _: &str,
    ) -> Result<Option<k8s_openapi::api::core::v1::ConfigMap>, ApiError> {
        Err(ApiError::Refused("the reporter reads no ConfigMap".into()))
    }
}

fn agent_bootstrapped(m: &Machine) -> Condition {
    let st = m.status.as_ref().expect("a status");
    nodeward_api::condition::find_condition(&st.conditions, ConditionType::AgentBootstrapped)
        .cloned()
        .expect("AgentBootstrapped")
}

#[test]
fn each_progress_is_its_agent_bootstrapped_condition_without_a_generation() {
    let cases = [
        (
            Progress::Running {
                checkpoint: "download-artifacts",
            },
            Reason::Bootstrapping,
            "Unknown",
            "running: download-artifacts",
        ),
        (
            Progress::Done,
            Reason::Bootstrapped,
            "True",
            "the bootstrap finished and the node joined",
        ),
        (
            Progress::Failed("step download-artifacts: sha256 mismatch".into()),
            Reason::BootstrapFailed,
            "False",
            "step download-artifacts: sha256 mismatch",
        ),
    ];
    for (progress, reason, status, message) in cases {
        let c = progress.condition();
        assert_eq!(c.reason(), reason, "{progress:?}");
        assert_eq!(
            c.reason().condition_type(),
            ConditionType::AgentBootstrapped
        );
        assert_eq!(c.reason().status().as_str(), status, "{progress:?}");
        assert_eq!(c.message(), message);
        assert_eq!(c.observed_generation(), None, "{progress:?}");
    }
}

#[test]
fn a_long_error_is_capped_at_1_kib_on_a_character_boundary() {
    // Three-byte characters, offset by one byte: the cut must step back to a whole one.
    let error = format!("x{}", "€".repeat(MAX_MESSAGE_BYTES));
    let c = Progress::Failed(error.clone()).condition();
    let message = c.message();
    assert!(message.len() <= MAX_MESSAGE_BYTES, "{}", message.len());
    let kept = message
        .strip_suffix(TRUNCATION_MARKER)
        .expect("marked as cut");
    assert!(error.starts_with(kept));
    assert!(kept.ends_with('€'));
}

#[test]
fn a_bootstrap_starts_from_the_checkpoint_its_own_decision_names() {
    let c = config();
    let fingerprint = version::fingerprint(&c).expect("fingerprint");
    let record = |machine: &str, fingerprint: &str, checkpoint| InstallRecord {
        schema: SCHEMA,
        machine_name: machine.into(),
        config_fingerprint: fingerprint.into(),
        version: "v1".into(),
        checkpoint,
    };
    let name = c.machine_name.clone();
    // A fresh host; a cut-short bootstrap resumes; a finished node is repaired from the start.
    assert_eq!(checkpoint_for(None, &c, false), "setup-host");
    let cut = record(&name, &fingerprint, Checkpoint::StartNode);
    assert_eq!(checkpoint_for(Some(&cut), &c, false), "start-node");
    let done = record(&name, &fingerprint, Checkpoint::Complete);
    assert_eq!(checkpoint_for(Some(&done), &c, false), "setup-host");
    // Another config: refused without --force (it stops at the start), restarted with it,
    // and on a finished node --force is an upgrade.
    let other = record(&name, "other", Checkpoint::Install);
    assert_eq!(checkpoint_for(Some(&other), &c, false), "preflight");
    assert_eq!(checkpoint_for(Some(&other), &c, true), "setup-host");
    let other_done = record(&name, "other", Checkpoint::Complete);
    assert_eq!(checkpoint_for(Some(&other_done), &c, true), "preflight");
}

#[test]
fn only_agent_bootstrapped_is_written_and_everything_else_is_kept() {
    let before = written_machine("w1");
    let api = FakeApi::with(before.clone());
    let running = Progress::Running {
        checkpoint: "setup-host",
    }
    .condition();
    let r = block_on(report(&api, "w1", &running, &at(NOW))).expect("reported");
    assert_eq!(r, Reported::Written { conflicts: 0 });
    let after = api.stored();
    let (b, a) = (
        before.status.clone().expect("status"),
        after.status.clone().expect("status"),
    );
    // The status moved from True to Unknown: a transition, at NOW.
    let c = agent_bootstrapped(&after);
    assert_eq!(
        (c.status.as_str(), c.reason.as_str(), c.message.as_str()),
        ("Unknown", "Bootstrapping", "running: setup-host")
    );
    assert_eq!(c.last_transition_time, at(NOW));
    assert_eq!(
        c.observed_generation, None,
        "a bootstrap observes no generation"
    );
    // Every other condition, in its place, and every other field, as they were.
    assert_eq!(a.conditions.len(), 3);
    assert_eq!(a.conditions[1..], b.conditions[1..]);
    assert_eq!(
        MachineStatus {
            conditions: Vec::new(),
            ..a
        },
        MachineStatus {
            conditions: Vec::new(),
            ..b
        }
    );
    assert_eq!(after.spec, before.spec);
    assert_eq!(api.writes.get(), 1);
}

#[test]
fn a_machine_never_written_gets_just_the_one_condition() {
    let mut m = crate::daemon::test_machine("w1", "1.34.1");
    m.metadata.resource_version = Some("1".into());
    let api = FakeApi::with(m);
    let done = Progress::Done.condition();
    assert_eq!(
        block_on(report(&api, "w1", &done, &at(NOW))),
        Ok(Reported::Written { conflicts: 0 })
    );
    let st = api.stored().status.expect("status");
    assert_eq!(st.conditions.len(), 1);
    assert_eq!(st.phase, None, "the phase is the daemon's");
    assert_eq!(st.observed_generation, None);
    let c = agent_bootstrapped(&api.stored());
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("True", "Bootstrapped")
    );
}

#[test]
fn the_same_report_again_writes_nothing_and_a_new_message_keeps_the_transition_time() {
    let api = FakeApi::with(written_machine("w1"));
    let first = Progress::Running {
        checkpoint: "setup-host",
    }
    .condition();
    block_on(report(&api, "w1", &first, &at(NOW))).expect("first");
    assert_eq!(
        block_on(report(&api, "w1", &first, &at(LATER))),
        Ok(Reported::Unchanged)
    );
    assert_eq!(api.writes.get(), 1);
    // Still Unknown, another message: written, but no transition.
    let resumed = Progress::Running {
        checkpoint: "install",
    }
    .condition();
    block_on(report(&api, "w1", &resumed, &at(LATER))).expect("resumed");
    let c = agent_bootstrapped(&api.stored());
    assert_eq!(c.message, "running: install");
    assert_eq!(c.last_transition_time, at(NOW));
}

#[test]
fn conflicts_are_re_read_and_retried_keeping_the_concurrent_writes() {
    let api = FakeApi::with(written_machine("w1"));
    api.conflicts_to_inject.set(2);
    let failed = Progress::Failed("step install: boom".into()).condition();
    assert_eq!(
        block_on(report(&api, "w1", &failed, &at(NOW))),
        Ok(Reported::Written { conflicts: 2 })
    );
    assert_eq!(api.reads.get(), 3, "read again after each conflict");
    let after = api.stored();
    let types: Vec<String> = after
        .status
        .as_ref()
        .expect("status")
        .conditions
        .iter()
        .map(|c| c.type_.clone())
        .collect();
    // What the concurrent writer added survives: the retry laid the condition over it.
    assert_eq!(
        types,
        [
            "AgentBootstrapped",
            "NodeUpdated",
            "SomethingNewer",
            "Concurrent2",
            "Concurrent1"
        ]
    );
    let c = agent_bootstrapped(&after);
    assert_eq!(
        (c.status.as_str(), c.reason.as_str(), c.message.as_str()),
        ("False", "BootstrapFailed", "step install: boom")
    );
}

#[test]
fn conflicts_beyond_the_bound_are_an_error_not_a_loop() {
    let api = FakeApi::with(written_machine("w1"));
    api.conflicts_to_inject.set(MAX_CONFLICTS + 1);
    let done = Progress::Done.condition();
    assert_eq!(
        block_on(report(&api, "w1", &done, &at(NOW))),
        Err(ApiError::Conflict)
    );
    assert_eq!(api.reads.get(), MAX_CONFLICTS + 1);
    assert_eq!(api.writes.get(), 0);
}

#[test]
fn no_machine_is_nothing_to_report_and_a_refusal_is_returned() {
    let api = FakeApi::default();
    let done = Progress::Done.condition();
    assert_eq!(
        block_on(report(&api, "w1", &done, &at(NOW))),
        Ok(Reported::NoMachine)
    );
    let api = FakeApi::with(written_machine("other"));
    assert_eq!(
        block_on(report(&api, "w1", &done, &at(NOW))),
        Ok(Reported::NoMachine)
    );
    assert_eq!(api.writes.get(), 0);
    let forbidden = ApiError::Refused("403 Forbidden: machines/status is forbidden".into());
    api.fail.replace(Some(forbidden.clone()));
    assert_eq!(
        block_on(report(&api, "other", &done, &at(NOW))),
        Err(forbidden)
    );
}

/// The embedded config pointed at `server` (an `https://` URL).
fn config_on(server: &str) -> NodeConfig {
    let mut c = config();
    c.cluster.api_server = server.to_string();
    c
}

#[test]
fn an_unreachable_server_is_asked_once_and_the_bootstrap_goes_on() {
    // A port nothing listens on: bound, then closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a port");
    let c = config_on(&format!("https://127.0.0.1:{port}"));
    let mut reporter = Reporter::new(&c, Redactor::new(c.secrets()));
    assert!(reporter.active());
    reporter.report(&Progress::Running {
        checkpoint: "setup-host",
    });
    assert!(!reporter.active(), "connection refused: not asked again");
    // The end of the bootstrap is not reported, and does not fail either.
    reporter.report(&Progress::Done);
}

#[test]
fn a_server_that_never_answers_is_given_up_on_within_the_bound() {
    // Accepts the connection (the kernel completes the handshake) and never says a word.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = silent.local_addr().expect("addr").port();
    let c = config_on(&format!("https://127.0.0.1:{port}"));
    let mut reporter = Reporter::new(&c, Redactor::new(c.secrets()));
    reporter.report(&Progress::Running {
        checkpoint: "setup-host",
    });
    assert!(!reporter.active(), "no answer: not asked again");
    drop(silent);
}

#[test]
fn warnings_never_carry_the_token() {
    let c = config();
    let token = c.kubelet.auth.bootstrap_token.expose().to_string();
    let reporter = Reporter {
        machine: c.machine_name.clone(),
        server: c.cluster.api_server.clone(),
        redactor: Redactor::new(c.secrets()),
        target: None,
    };
    // A server may echo what it was sent into its refusal.
    let e = ReportError::Api(ApiError::Refused(format!(
        "401 Unauthorized: token {token} is not valid"
    )));
    let line = reporter.warning(&format!("not reported: {e}"));
    assert!(!line.contains(&token), "{line}");
    let secret = token.split_once('.').map(|(_, s)| s).expect("id.secret");
    assert!(!line.contains(secret), "{line}");
    assert!(line.contains("<redacted>"), "{line}");
}
