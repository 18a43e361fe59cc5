//! The systemd watchdog of `nodeward daemon` when its reconcile loop hangs (issue 14).
//!
//! The daemon pings `WATCHDOG=1` from its loop, also while a pass runs, so a slow pass is not a
//! hung daemon; a loop that is really stuck must stop the pings, so that systemd's
//! `WatchdogSec=` kills it and `Restart=` starts it again. The `test-hooks` point
//! `daemon:hang-pass` (`host/test_hooks.rs`) makes the pass block the single-threaded runtime's
//! one thread: a deadlock. Two levels:
//! - anywhere: the daemon notifies a socket the test binds (`WATCHDOG_USEC` one second); the
//!   pings keep coming without the hook and stop with it, the process still alive;
//! - inside the systemd harness (`#[ignore]`d; `scripts/test.sh` runs them there,
//!   docs/testing-systemd.md): the daemon as a transient `Type=notify` service with
//!   `WatchdogSec=2s` and `NotifyAccess=main`; systemd keeps the healthy one running on its
//!   pings and ends the hung one with `Result=watchdog` and SIGABRT.
//!
//! Each daemon keeps a temporary root with a finished install record, with a kubeconfig naming
//! 127.0.0.1 on a port nobody listens on: its passes fail at once (connection refused) and it
//! backs off, the loop a hung pass must be told apart from. The tests end only the processes
//! and units they started (by PID, by unit name), also when they fail.

#[path = "daemon/fixture.rs"]
mod fixture;
#[path = "daemon/notify.rs"]
mod notify;
#[path = "daemon/running.rs"]
mod running;

use notify::NotifySocket;
use running::{Daemon, TestNode as Node, wait_for};
use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::Duration;

/// The hook point that hangs the pass.
#[cfg(feature = "test-hooks")]
const HANG_PASS: &str = "daemon:hang-pass";
/// What the daemon says on stderr when the hook hangs its pass.
#[cfg(feature = "test-hooks")]
const HANG_LINE: &str = "test hook: hanging at daemon:hang-pass";
/// SIGABRT on Linux: systemd's default `WatchdogSignal=`.
#[cfg(feature = "test-hooks")]
const SIGABRT: &str = "6";

/// A node for the daemon to keep: a temporary root with a finished install record, and a
/// kubeconfig naming an API server nobody listens on.
fn node() -> Node {
    Node::new(|dir| {
        let kubeconfig = dir.join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    \
                 server: https://127.0.0.1:{}\n    insecure-skip-tls-verify: true\n\
                 contexts:\n- name: x\n  context:\n    cluster: c\n    user: u\n\
                 current-context: x\nusers:\n- name: u\n  user:\n    token: not-a-real-token\n",
                closed_port()
            ),
        )
        .expect("kubeconfig");
        kubeconfig
    })
}

/// A port on 127.0.0.1 that was free a moment ago and that nobody listens on now.
fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a port");
    listener.local_addr().expect("its address").port()
}

/// Waiting on the notify socket while the daemon must stay alive.
trait WaitForLine {
    fn wait_for_line(&self, prefix: &str, daemon: &mut Daemon);
}

impl WaitForLine for NotifySocket {
    /// Waits until a line starts with `prefix`.
    #[track_caller]
    fn wait_for_line(&self, prefix: &str, daemon: &mut Daemon) {
        wait_for(
            &format!("`{prefix}…` on the notify socket"),
            Duration::from_secs(30),
            || {
                daemon.assert_alive();
                self.has_line_starting(prefix).then_some(())
            },
        );
    }
}

/// How long the pings are watched: three `WATCHDOG_USEC`, six ping intervals.
const WATCH: Duration = Duration::from_secs(3);

#[test]
fn without_a_hang_the_daemon_keeps_pinging_the_watchdog() {
    let node = node();
    let notify = NotifySocket::bind(node.dir.path());
    let mut daemon = Daemon::start(&node, Some(&notify), &[]);
    notify.wait_for_line("READY=1", &mut daemon);
    // A pass ran and failed (nobody listens): the loop backs off and goes on.
    notify.wait_for_line("STATUS=reconcile failed", &mut daemon);
    let before = notify.count("WATCHDOG=1");
    std::thread::sleep(WATCH);
    let pinged = notify.count("WATCHDOG=1") - before;
    daemon.assert_alive();
    // Six are due; tokio's interval catches up on ticks a busy machine delayed, so a loaded
    // machine still gets well over half of them.
    assert!(
        pinged >= 3,
        "{pinged} pings in {WATCH:?} at a 0.5 s interval: {:?}\nthe daemon's log:\n{}",
        notify.lines(),
        daemon.log()
    );
}

#[test]
#[cfg(feature = "test-hooks")]
fn a_hung_pass_stops_the_watchdog_pings() {
    let node = node();
    let notify = NotifySocket::bind(node.dir.path());
    let mut daemon = Daemon::start(
        &node,
        Some(&notify),
        &[(nodeward::test_hooks::ABORT_ENV, HANG_PASS)],
    );
    notify.wait_for_line("READY=1", &mut daemon);
    wait_for("the pass to hang", Duration::from_secs(30), || {
        daemon.assert_alive();
        daemon.log().contains(HANG_LINE).then_some(())
    });
    // A ping sent just before the pass hung may still be on its way to the socket's reader.
    std::thread::sleep(Duration::from_millis(500));
    let before = notify.count("WATCHDOG=1");
    std::thread::sleep(WATCH);
    daemon.assert_alive();
    let lines = notify.lines();
    assert_eq!(
        notify.count("WATCHDOG=1"),
        before,
        "pings after the pass hung: {lines:?}"
    );
    // The pass never ended: no outcome was reported.
    assert!(
        !lines
            .iter()
            .any(|l| l.starts_with("STATUS=reconcile") || l.starts_with("STATUS=Machine")),
        "{lines:?}"
    );
}

// ---- inside the systemd harness ---------------------------------------------------------------

/// Whether this process runs inside the systemd harness (its PID 1 is systemd; the test
/// machine's own PID 1 is not).
fn in_harness() -> bool {
    std::fs::read_to_string("/proc/1/comm").is_ok_and(|c| c.trim() == "systemd")
}

/// A transient service this test started with `systemd-run`; dropping it stops it and resets
/// its failed state, so systemd forgets it, whatever state the test left it in.
struct TransientUnit {
    name: String,
}

impl TransientUnit {
    /// Runs the daemon on `node` as the transient `Type=notify` service
    /// `nodeward-test-<pid>-<tag>.service`, watched every 2 s, never restarted, with `env`;
    /// returns once systemd counts it started (it said `READY=1`).
    fn start(tag: &str, node: &Node, env: &[(&str, &str)]) -> TransientUnit {
        assert!(
            in_harness(),
            "this test needs the systemd harness: run it with scripts/test.sh (docs/testing-systemd.md)"
        );
        // The guard first: a start that fails half-way is cleaned up too.
        let unit = TransientUnit {
            name: format!("nodeward-test-{}-{tag}.service", std::process::id()),
        };
        let mut run = Command::new("systemd-run");
        run.arg(format!("--unit={}", unit.name))
            .args(["--service-type=notify", "--quiet"])
            .args(["-p", "WatchdogSec=2s", "-p", "NotifyAccess=main"])
            .args(["-p", "Restart=no"])
            // A hung daemon ignores SIGTERM: the guard's stop must not wait systemd's 90 s.
            .args(["-p", "TimeoutStopSec=5s"])
            // A SIGABRT would otherwise dump a core into the service's working directory, `/`.
            .args(["-p", "LimitCORE=0"]);
        for (k, v) in env {
            run.arg(format!("--setenv={k}={v}"));
        }
        let out = run
            .arg("--")
            .arg(env!("CARGO_BIN_EXE_nodeward"))
            .args(node.daemon_args())
            .output()
            .expect("systemd-run runs");
        assert!(
            out.status.success(),
            "systemd-run {} ({}): {}\n{}",
            unit.name,
            out.status,
            String::from_utf8_lossy(&out.stderr),
            unit.journal()
        );
        unit
    }

    /// The unit's properties `names`, as `systemctl show` gives them.
    fn show(&self, names: &[&str]) -> BTreeMap<String, String> {
        let mut show = Command::new("systemctl");
        show.arg("show");
        for n in names {
            show.args(["-p", n]);
        }
        let out = show.arg(&self.name).output().expect("systemctl runs");
        assert!(out.status.success(), "systemctl show {}", self.name);
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// The unit's journal (flushed first), for assertions and failure messages.
    fn journal(&self) -> String {
        let _ = Command::new("journalctl").arg("--sync").status();
        let out = Command::new("journalctl")
            .args(["--no-pager", "-o", "cat", "-u", &self.name])
            .output();
        out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    }
}

impl Drop for TransientUnit {
    fn drop(&mut self) {
        for verb in ["stop", "reset-failed"] {
            let _ = Command::new("systemctl")
                .args([verb, &self.name])
                .stderr(Stdio::null())
                .status();
        }
    }
}

#[test]
#[ignore = "needs the real systemd harness (scripts/test.sh)"]
fn systemd_keeps_a_daemon_whose_loop_pings_it() {
    let node = node();
    let unit = TransientUnit::start("wd-alive", &node, &[]);
    let watched = |u: &TransientUnit| {
        let p = u.show(&["ActiveState", "SubState", "WatchdogTimestampMonotonic"]);
        let at: u64 = p["WatchdogTimestampMonotonic"]
            .parse()
            .expect("WatchdogTimestampMonotonic is a number");
        (p["ActiveState"].clone(), p["SubState"].clone(), at)
    };
    let (_, _, first) = watched(&unit);
    // Three watchdog periods: without pings systemd would have ended it twice over.
    std::thread::sleep(Duration::from_secs(6));
    let (active, sub, last) = watched(&unit);
    assert_eq!(
        (active.as_str(), sub.as_str()),
        ("active", "running"),
        "{}",
        unit.journal()
    );
    assert!(
        last > first,
        "no ping reached systemd (WatchdogTimestampMonotonic {first} then {last})"
    );
}

#[test]
#[cfg(feature = "test-hooks")]
#[ignore = "needs the real systemd harness (scripts/test.sh)"]
fn systemd_kills_a_daemon_whose_pass_hangs() {
    let node = node();
    let unit = TransientUnit::start(
        "wd-hang",
        &node,
        &[(nodeward::test_hooks::ABORT_ENV, HANG_PASS)],
    );
    // Started means READY=1 came; the pass then hangs and the pings stop. systemd's own
    // bound is 2 s; this one only keeps a broken test from waiting for ever.
    let props = ["ActiveState", "Result", "ExecMainCode", "ExecMainStatus"];
    let end = wait_for(
        "systemd to end the hung daemon",
        Duration::from_secs(30),
        || {
            let p = unit.show(&props);
            matches!(p["ActiveState"].as_str(), "failed" | "inactive").then_some(p)
        },
    );
    let journal = unit.journal();
    assert_eq!(end["Result"], "watchdog", "{end:?}\n{journal}");
    // Killed (2), or dumped (3) where a core pattern pipes cores despite LimitCORE=0.
    assert!(
        matches!(end["ExecMainCode"].as_str(), "2" | "3"),
        "{end:?}\n{journal}"
    );
    assert_eq!(end["ExecMainStatus"], SIGABRT, "{end:?}\n{journal}");
    assert!(journal.contains(HANG_LINE), "{journal}");
}
