//! A `nodeward daemon` a test runs on a temporary node (a finished install record, nothing
//! else: `fixture.rs`), talking to the API server a kubeconfig names; killed by PID and
//! reaped when dropped.
#![allow(dead_code)]

use super::fixture;
use super::notify::NotifySocket;
use serde_json::Value;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Waits until `f` gives a value, at most `timeout` (a bound for a broken test, not a
/// timing the test asserts).
#[track_caller]
pub fn wait_for<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "{what}: not within {timeout:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A node for the daemon to keep, in a temporary directory.
pub struct TestNode {
    pub dir: tempfile::TempDir,
    pub root: PathBuf,
    pub kubeconfig: PathBuf,
}

impl TestNode {
    /// A node whose kubeconfig `kubeconfig` writes into the node's directory.
    pub fn new(kubeconfig: impl FnOnce(&Path) -> PathBuf) -> TestNode {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("root");
        fixture::finished_node(&root);
        let kubeconfig = kubeconfig(dir.path());
        TestNode {
            dir,
            root,
            kubeconfig,
        }
    }

    /// `daemon --machine w1 --metrics-addr off --root ROOT --kubeconfig KUBECONFIG`.
    pub fn daemon_args(&self) -> Vec<OsString> {
        let mut args: Vec<OsString> = ["daemon", "--machine", "w1", "--metrics-addr", "off"]
            .map(OsString::from)
            .to_vec();
        args.push("--root".into());
        args.push(self.root.clone().into());
        args.push("--kubeconfig".into());
        args.push(self.kubeconfig.clone().into());
        args
    }

    /// The agent state directory beneath the root (the ledger's, the audit heads').
    pub fn state_dir(&self) -> PathBuf {
        self.root.join("var/lib/nodeward")
    }

    /// The operation ledger's entries (`[]` before the first).
    pub fn ledger(&self) -> Vec<Value> {
        match std::fs::read(self.state_dir().join("daemon-operations.json")) {
            Ok(bytes) => serde_json::from_slice(&bytes).expect("the ledger is JSON"),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => panic!("the ledger: {e}"),
        }
    }

    /// The ledger's entry for `uid`.
    pub fn ledger_entry(&self, uid: &str) -> Option<Value> {
        self.ledger().into_iter().find(|e| e["uid"] == uid)
    }

    /// The runs `nodeward audit summary` shows for the node.
    pub fn audit_runs(&self) -> Vec<Value> {
        let out = Command::new(env!("CARGO_BIN_EXE_nodeward"))
            .args(["audit", "summary", "--output", "json", "--root"])
            .arg(&self.root)
            .output()
            .expect("nodeward audit summary runs");
        assert!(
            out.status.success(),
            "audit summary: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let summary: Value = serde_json::from_slice(&out.stdout).expect("JSON");
        summary["runs"].as_array().cloned().unwrap_or_default()
    }
}

/// A daemon this test started.
pub struct Daemon {
    pub child: Child,
    pub log: PathBuf,
}

impl Daemon {
    /// Starts the daemon on `node` with `env` on top of the test's environment (and
    /// `NOTIFY_SOCKET`, a one-second watchdog, when `notify` is given); its stderr goes to
    /// `daemon-<n>.log` in the node's directory.
    pub fn start(node: &TestNode, notify: Option<&NotifySocket>, env: &[(&str, &str)]) -> Daemon {
        let n = std::fs::read_dir(node.dir.path()).map_or(0, |d| d.count());
        let log = node.dir.path().join(format!("daemon-{n}.log"));
        let stderr = std::fs::File::create(&log).expect("the daemon's log");
        let mut command = Command::new(env!("CARGO_BIN_EXE_nodeward"));
        command
            .args(node.daemon_args())
            .env_remove("NOTIFY_SOCKET")
            .env_remove("WATCHDOG_USEC")
            .env_remove("WATCHDOG_PID");
        if let Some(socket) = notify {
            command
                .env("NOTIFY_SOCKET", &socket.path)
                .env("WATCHDOG_USEC", "1000000");
        }
        let child = command
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("the daemon starts");
        Daemon { child, log }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    #[track_caller]
    pub fn assert_alive(&mut self) {
        if let Some(status) = self.child.try_wait().expect("try_wait") {
            panic!("the daemon ended ({status}); its log:\n{}", self.log());
        }
    }

    /// Waits for the daemon to end on its own, at most `timeout`.
    #[track_caller]
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let child = &mut self.child;
        wait_for("the daemon to end", timeout, || {
            child.try_wait().expect("try_wait")
        })
    }

    /// SIGKILL, then reaped.
    pub fn kill(&mut self) {
        // Kill sends SIGKILL to this child's PID only.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill();
    }
}
