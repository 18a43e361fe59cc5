//! Each request of `nodeward daemon` is one attempt within its bound, and the watchdog is fed
//! while it waits (issue 26): the daemon against an API server on loopback
//! (`tests/daemon/fake_api.rs`) that throttles every request (429 and 503 with
//! `Retry-After: 30`, which kube's client would retry for minutes) or never answers, with a
//! notify socket the test binds and a one-second `WATCHDOG_USEC`.
//!
//! The outcome is asserted, never a duration: the pass ends with an error naming its request
//! (`get Machine w1`), after that one attempt, and `WATCHDOG=1` keeps coming meanwhile.

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
use notify::NotifySocket;
use running::{Daemon, TestNode, wait_for};
use std::time::Duration;

/// The request a pass starts with.
const GET_MACHINE: &str = "GET /apis/nodeward.io/v1alpha1/machines/w1";

/// A bound for a broken test, not a timing the test asserts.
const BOUND: Duration = Duration::from_secs(60);

/// How long the pings are counted: three `WATCHDOG_USEC`, six ping intervals.
const WATCH: Duration = Duration::from_secs(3);

/// How many times the server was asked for the Machine.
fn machine_gets(api: &FakeApi) -> usize {
    api.requests()
        .iter()
        .filter(|r| r.starts_with(GET_MACHINE))
        .count()
}

/// The first `STATUS=` line starting with `prefix`, once there is one.
#[track_caller]
fn status_line(notify: &NotifySocket, daemon: &mut Daemon, prefix: &str) -> String {
    wait_for(
        &format!("`{prefix}…` on the notify socket"),
        BOUND,
        || {
            daemon.assert_alive();
            notify.lines().into_iter().find(|l| l.starts_with(prefix))
        },
    )
}

/// How many `WATCHDOG=1` came in [`WATCH`], the daemon alive throughout.
fn pings_over_watch(notify: &NotifySocket, daemon: &mut Daemon) -> usize {
    let before = notify.count("WATCHDOG=1");
    std::thread::sleep(WATCH);
    daemon.assert_alive();
    notify.count("WATCHDOG=1") - before
}

#[test]
fn a_throttled_request_fails_after_one_attempt_naming_it_and_the_watchdog_is_fed() {
    let api = FakeApi::start(Answer::Throttle);
    let node = TestNode::new(|dir| api.kubeconfig(dir));
    let notify = NotifySocket::bind(node.dir.path());
    let mut daemon = Daemon::start(&node, Some(&notify), &[]);
    // kube's own retry would keep this first request going for 15 × 30 s.
    let failed = status_line(&notify, &mut daemon, "STATUS=reconcile failed");
    assert!(
        failed.contains("API server unreachable: get Machine w1: ")
            && (failed.contains("429") || failed.contains("503")),
        "{failed}"
    );
    let pinged = pings_over_watch(&notify, &mut daemon);
    // Six are due; tokio's interval catches up on ticks a busy machine delayed.
    assert!(pinged >= 3, "{pinged} pings: {:?}", notify.lines());
    // Each pass asked once and backed off: never two requests for the Machine in a row
    // without the daemon's backoff between them (at least 200 ms, so at most one per pass).
    let gets = machine_gets(&api);
    let failures = notify
        .lines()
        .iter()
        .filter(|l| l.starts_with("STATUS=reconcile failed"))
        .count();
    assert!(
        gets <= failures + 1,
        "{gets} requests for the Machine, {failures} failed passes:\n{}",
        daemon.log()
    );
}

#[test]
fn a_request_never_answered_keeps_the_watchdog_fed_and_ends_at_its_bound() {
    let api = FakeApi::start(Answer::Silent);
    let node = TestNode::new(|dir| api.kubeconfig(dir));
    let notify = NotifySocket::bind(node.dir.path());
    let mut daemon = Daemon::start(&node, Some(&notify), &[]);
    wait_for("the pass's first request", BOUND, || {
        daemon.assert_alive();
        (machine_gets(&api) > 0).then_some(())
    });
    // The request waits (20 s at most); the loop pings meanwhile.
    let pinged = pings_over_watch(&notify, &mut daemon);
    assert!(pinged >= 3, "{pinged} pings: {:?}", notify.lines());
    // Then it ends, naming itself, and the daemon backs off.
    let failed = status_line(&notify, &mut daemon, "STATUS=reconcile failed");
    assert!(
        failed.contains("get Machine w1: no answer within 20 s"),
        "{failed}"
    );
}
