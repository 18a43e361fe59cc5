//! `nodeward daemon` killed while it carries out a MachineOperation (issue 33), against the
//! small API server of `tests/daemon/fake_api.rs` on loopback, the node a temporary root
//! (`tests/daemon/fixture.rs`), the operation a `NodeReboot` whose `nodeward restart` child
//! runs for real (and fails: there is no systemd to restart units with).
//!
//! - At each crash point of an operation's end (`host/test_hooks.rs`), through the
//!   `test-hooks` build: the next daemon brings the operation to a final status with a
//!   `completionTime`, its ledger entry final and equal to that status, and the act (a
//!   `restart` run in the audit trail) ran at most once.
//! - A daemon killed while its child runs: the child dies with it, and the next daemon's start
//!   closes the child's audit run as `interrupted`.
//! - SIGKILL at random moments, a few hundred times (`NODEWARD_DAEMON_KILLS`, default 300):
//!   every operation ends final and agreeing with the ledger; the figures are printed.

#[path = "daemon/fake_api.rs"]
mod fake_api;
#[path = "daemon/fixture.rs"]
mod fixture;
#[path = "daemon/notify.rs"]
#[allow(dead_code)]
mod notify;
#[path = "daemon/running.rs"]
mod running;

use fake_api::{Answer, FakeApi};
use running::{Daemon, TestNode, wait_for};
use serde_json::Value;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// How long one daemon may take to bring an operation to its end (a broken test's bound).
const BOUND: Duration = Duration::from_secs(60);

/// What the end of an operation must say after a kill.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum End {
    /// The act's own end: the child's outcome.
    Act,
    /// Failed as cut short: the daemon stopped after the act started.
    CutShort,
}

/// The message of an operation whose act was cut short (`host/daemon/reconcile.rs`).
const CUT_SHORT: &str = "the daemon stopped while this operation ran";

/// The status and the ledger entry of `name` on `node`, once both are final and agree.
fn settled(api: &FakeApi, node: &TestNode, name: &str) -> Option<(Value, Value)> {
    let op = api.operation(name)?;
    let status = op["status"].clone();
    if !matches!(status["phase"].as_str(), Some("Complete" | "Failed")) {
        return None;
    }
    let entry = node.ledger_entry(&format!("uid-{name}"))?;
    (entry["mark"] == "final").then_some((status, entry))
}

/// Asserts that `status` is final, dated, and says what the ledger's `entry` recorded.
#[track_caller]
fn assert_agree(name: &str, status: &Value, entry: &Value) {
    let ending = &entry["ending"];
    let phase = if ending["complete"] == true {
        "Complete"
    } else {
        "Failed"
    };
    assert_eq!(status["phase"], phase, "{name}: {status} / {entry}");
    assert_eq!(
        status["reason"], ending["reason"],
        "{name}: {status} / {entry}"
    );
    assert_eq!(
        status["message"], ending["message"],
        "{name}: {status} / {entry}"
    );
    assert!(status["completionTime"].is_string(), "{name}: {status}");
    assert_eq!(
        status["completionTime"], ending["at"],
        "{name}: {status} / {entry}"
    );
    assert!(status["startTime"].is_string(), "{name}: {status}");
}

/// How the end of `status` came about.
fn end_of(status: &Value) -> End {
    if status["message"]
        .as_str()
        .is_some_and(|m| m.contains(CUT_SHORT))
    {
        End::CutShort
    } else {
        End::Act
    }
}

/// The `restart` runs in the node's audit trail: one per act carried out.
fn restart_runs(node: &TestNode) -> Vec<Value> {
    node.audit_runs()
        .into_iter()
        .filter(|r| r["command"] == "restart")
        .collect()
}

/// Waits until `name` is settled on `node` while `daemon` runs; its status and entry. The
/// panic of a broken test says where the operation and the ledger got to.
#[track_caller]
fn until_settled(
    api: &FakeApi,
    node: &TestNode,
    daemon: &mut Daemon,
    name: &str,
) -> (Value, Value) {
    let deadline = Instant::now() + BOUND;
    loop {
        daemon.assert_alive();
        if let Some(pair) = settled(api, node, name) {
            return pair;
        }
        assert!(
            Instant::now() < deadline,
            "{name} not final within {BOUND:?}: status {}, ledger {:?}\nthe daemon's log:\n{}",
            api.operation(name)
                .map_or(Value::Null, |op| op["status"].clone()),
            node.ledger_entry(&format!("uid-{name}")),
            daemon.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The crash points of an operation's end, in order, with what the next daemon must end the
/// operation with and how many acts the trail must show.
const POINTS: [(&str, End, usize); 9] = [
    // Nothing ran yet: the next daemon runs it.
    ("daemon:after-status-in-progress", End::Act, 1),
    ("ledger-started:after-temp-write", End::Act, 1),
    // Started: never run again, failed as cut short (whether the act ran or not).
    ("daemon:after-ledger-started", End::CutShort, 0),
    ("daemon:after-act", End::CutShort, 1),
    ("ledger-done:after-temp-write", End::CutShort, 1),
    // The end recorded: the next daemon writes it (or finds it written) and marks it final.
    ("daemon:after-ledger-done", End::Act, 1),
    ("daemon:after-status-final", End::Act, 1),
    ("ledger-final:after-temp-write", End::Act, 1),
    ("daemon:after-ledger-final", End::Act, 1),
];

#[test]
#[cfg(feature = "test-hooks")]
fn an_operation_reaches_its_final_status_after_a_kill_at_each_point() {
    for (point, end, acts) in POINTS {
        let api = FakeApi::start(Answer::Serve);
        api.add_operation("rb", "w1", "NodeReboot");
        let node = TestNode::new(|dir| api.kubeconfig(dir));
        let mut first = Daemon::start(&node, None, &[(nodeward::test_hooks::ABORT_ENV, point)]);
        let status = first.wait_exit(BOUND);
        let log = first.log();
        assert!(
            log.contains(&format!("test hook: aborting at {point}")),
            "{point}: the daemon ended ({status}) elsewhere:\n{log}"
        );
        let mut next = Daemon::start(&node, None, &[]);
        let (status, entry) = until_settled(&api, &node, &mut next, "rb");
        next.kill();
        assert_agree(point, &status, &entry);
        // The next daemon's start swept what the killed one's writes left.
        assert_eq!(temp_leftovers(&node), Vec::<String>::new(), "{point}");
        assert_eq!(end_of(&status), end, "{point}: {status}");
        let runs = restart_runs(&node);
        assert_eq!(runs.len(), acts, "{point}: {runs:?}");
        assert!(
            node.audit_runs().iter().all(|r| r["outcome"] != "running"),
            "{point}: {:?}",
            node.audit_runs()
        );
    }
}

/// The temp files (`.nodeward-tmp.*`) in the node's agent state directory.
fn temp_leftovers(node: &TestNode) -> Vec<String> {
    std::fs::read_dir(node.state_dir())
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".nodeward-tmp."))
        .collect()
}

/// The PIDs of `pid`'s children.
fn children_of(pid: u32) -> Vec<u32> {
    let task = format!("/proc/{pid}/task");
    let mut out = Vec::new();
    for t in std::fs::read_dir(&task).into_iter().flatten().flatten() {
        let list = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
        out.extend(
            list.split_whitespace()
                .filter_map(|p| p.parse::<u32>().ok()),
        );
    }
    out
}

/// Whether the process `pid` is gone (or a zombie nobody reaped yet: it runs no more).
fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        // `pid (comm) S …`: the state follows the last `)`.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| matches!(rest.trim_start().chars().next(), Some('Z' | 'X'))),
    }
}

/// A process of this test's (the daemon's hung child), killed by PID when dropped if it still
/// runs.
struct KillOnDrop(u32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let ours = std::fs::read(format!("/proc/{}/cmdline", self.0))
            .is_ok_and(|c| c.split(|b| *b == 0).any(|arg| arg == b"restart"));
        if ours
            && !gone(self.0)
            && let Some(pid) = rustix::process::Pid::from_raw(self.0 as i32)
        {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
        }
    }
}

#[test]
#[cfg(feature = "test-hooks")]
fn a_child_dies_with_its_daemon_and_the_next_start_closes_its_run() {
    let api = FakeApi::start(Answer::Serve);
    api.add_operation("rb", "w1", "NodeReboot");
    let node = TestNode::new(|dir| api.kubeconfig(dir));
    let mut daemon = Daemon::start(
        &node,
        None,
        &[(
            nodeward::test_hooks::CHILD_ABORT_ENV,
            "run:hang-after-start",
        )],
    );
    // The `restart` child stops right after its run started in the trail.
    let child = wait_for("the restart child's run to start", BOUND, || {
        daemon.assert_alive();
        let running = restart_runs(&node)
            .iter()
            .any(|r| r["outcome"] == "running");
        let children = children_of(daemon.child.id());
        running.then(|| children.first().copied()).flatten()
    });
    // Should the child outlive the test's assertions, it is ended with the test.
    let _child = KillOnDrop(child);
    daemon.kill();
    wait_for("the child to die with the daemon", BOUND, || {
        gone(child).then_some(())
    });
    // Nobody has closed its run yet.
    let runs = restart_runs(&node);
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(runs[0]["outcome"], "running", "{runs:?}");
    // The next daemon's start closes it; the operation, cut short, is failed.
    let mut next = Daemon::start(&node, None, &[]);
    let (status, entry) = until_settled(&api, &node, &mut next, "rb");
    next.kill();
    assert_agree("rb", &status, &entry);
    assert_eq!(end_of(&status), End::CutShort, "{status}");
    let runs = restart_runs(&node);
    assert_eq!(runs.len(), 1, "never run twice: {runs:?}");
    assert_eq!(runs[0]["outcome"], "interrupted", "{runs:?}");
    let all = node.audit_runs();
    assert!(all.iter().all(|r| r["outcome"] != "running"), "{all:?}");
}

/// How many times the random test kills the daemon: `NODEWARD_DAEMON_KILLS`, else 300.
fn kills() -> usize {
    std::env::var("NODEWARD_DAEMON_KILLS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(300)
}

#[test]
fn killed_at_random_moments_every_operation_ends_final() {
    let api = FakeApi::start(Answer::Serve);
    let node = TestNode::new(|dir| api.kubeconfig(dir));
    // One clean operation first: how long a daemon takes from its start to an operation's
    // end, the span the kills are drawn from.
    api.add_operation("op-0", "w1", "NodeReboot");
    let started = Instant::now();
    let mut daemon = Daemon::start(&node, None, &[]);
    let first = until_settled(&api, &node, &mut daemon, "op-0");
    let span = started.elapsed();
    daemon.kill();
    let mut done: BTreeMap<String, (Value, Value)> = BTreeMap::from([("op-0".into(), first)]);
    let mut open: Vec<String> = Vec::new();
    let rounds = kills();
    let began = Instant::now();
    let mut ended_alone = 0;
    for i in 1..=rounds {
        let name = format!("op-{i}");
        api.add_operation(&name, "w1", "NodeReboot");
        open.push(name);
        let mut daemon = Daemon::start(&node, None, &[]);
        std::thread::sleep(span.mul_f64(1.5 * fastrand::f64()));
        if daemon.child.try_wait().expect("try_wait").is_some() {
            ended_alone += 1;
        }
        daemon.kill();
        // What is final in both places is done: checked, and kept from the next passes.
        open.retain(|name| match settled(&api, &node, name) {
            Some(pair) => {
                done.insert(name.clone(), pair);
                false
            }
            None => true,
        });
    }
    let cut_open = open.len();
    let mut last = Daemon::start(&node, None, &[]);
    for name in &open {
        let pair = until_settled(&api, &node, &mut last, name);
        done.insert(name.clone(), pair);
    }
    last.kill();
    let took = began.elapsed();
    assert_eq!(ended_alone, 0, "a daemon ended before it was killed");
    for (name, (status, entry)) in &done {
        assert_agree(name, status, entry);
    }
    assert_eq!(done.len(), rounds + 1);
    let ends = done
        .values()
        .filter(|(s, _)| end_of(s) == End::CutShort)
        .count();
    let runs = node.audit_runs();
    let acts = restart_runs(&node).len();
    let interrupted = runs
        .iter()
        .filter(|r| r["outcome"] == "interrupted")
        .count();
    assert!(runs.iter().all(|r| r["outcome"] != "running"), "{runs:?}");
    assert!(
        acts <= rounds + 1,
        "{acts} acts for {} operations",
        rounds + 1
    );
    let leftovers = temp_leftovers(&node);
    eprintln!(
        "daemon kills: {rounds} in {:.1} s (kills drawn from 0–{:.0} ms; a clean operation took {:.0} ms); \
         operations not yet final after the last kill (ended by one more daemon): {cut_open}; ends: {} the act's, {ends} cut short; \
         restart acts in the trail: {acts} for {} operations, {interrupted} runs closed as interrupted; \
         temp files left in the state directory: {leftovers:?}",
        took.as_secs_f64(),
        span.as_secs_f64() * 1500.0,
        span.as_secs_f64() * 1000.0,
        done.len() - ends,
        rounds + 1,
    );
    assert_eq!(
        leftovers,
        Vec::<String>::new(),
        "swept by the last daemon's start"
    );
}
