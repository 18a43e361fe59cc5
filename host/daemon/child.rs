//! [`Children`]: the `nodeward` runs the daemon makes its changes with.
//!
//! # Background
//! Every change the daemon makes to the node or its bundle store is a run of its own binary
//! (`nodeward upgrade|restart|reset|recover`, `nodeward phases install|rollback`) as a child
//! process: one audited run each, under the same locks and crash recovery as a run by hand. A
//! phase that exhausts its memory budget or a bug in a pipeline ends that child, never the
//! daemon, and the daemon itself never compiles or instantiates a component, which keeps its
//! idle memory small.
//!
//! # Guarantees
//! - A child runs at most its timeout; past it, it is killed and the call fails saying so.
//! - While a child runs, `WATCHDOG=1` is sent at the watchdog interval: the loop is alive and
//!   waiting on a bounded child, which is what the watchdog asks.
//! - A child does not inherit `NOTIFY_SOCKET` (it must not speak for the unit) nor the
//!   daemon's `NODEWARD_*` variables but the log settings: its host, state, audit trail and
//!   config are the flags the daemon passes.
//! - At most [`MAX_OUTPUT_BYTES`] of each of its stdout and stderr are kept (the rest is
//!   drained and dropped); a failure's message is its last stderr line (the CLI's `error:`
//!   line), capped at [`MAX_ERROR_BYTES`].
//! - A child dies with the daemon (`PR_SET_PDEATHSIG`, SIGKILL): a killed daemon leaves no
//!   child changing the node unwatched, whose operation the next daemon fails as cut short.
//!   The child's own audit run is then left open; the daemon's start closes every run whose
//!   process is gone as `interrupted` ([`close_interrupted_runs`]), so none stays "running".
//!
//! # Caveats
//! The parent-death signal follows the *thread* that started the child: the daemon runs on a
//! single-threaded runtime, so that is its main thread. Under systemd the unit's cgroup is
//! killed with the daemon anyway (`KillMode=control-group`); the signal is what holds when
//! the daemon runs by hand or in a container without systemd.

use crate::audit::entry::Mode;
use crate::audit::trail::{RunInfo, TrailConfig};
use crate::daemon::notify::Notifier;
use crate::daemon::reconcile::OperatorError;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt as _};

/// The longest error message kept from a failed child.
pub const MAX_ERROR_BYTES: usize = 1024;
/// The most of a child's stdout or stderr the daemon reads.
pub const MAX_OUTPUT_BYTES: usize = 64 * 1024;

/// How the daemon runs its own binary.
#[derive(Debug, Clone)]
pub struct Children {
    /// The agent binary (the daemon's own, `/proc/self/exe`).
    pub exe: PathBuf,
    /// Where `WATCHDOG=1` goes while a child runs.
    pub notifier: Notifier,
    /// Where each child's audit records are counted for the metrics, when they are.
    pub feed: Option<crate::daemon::run_metrics::AuditFeed>,
}

/// How a child ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finished {
    /// Its exit code (`None`: killed by a signal).
    pub code: Option<i32>,
    /// Its stdout, up to [`MAX_OUTPUT_BYTES`].
    pub stdout: Vec<u8>,
    /// Its last non-empty stderr line, capped (`(no error output)` when there was none).
    pub last_error: String,
    /// How it ended, for messages (`exit status: 1`).
    pub status: String,
}

impl Finished {
    /// Whether it exited 0.
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }
}

impl Children {
    /// Runs `nodeward <args>` to its end, at most `timeout`; how it ended. An error only when
    /// it could not be started, waited for, or outlived `timeout` (then it is killed).
    pub async fn run(
        &self,
        args: &[OsString],
        timeout: Duration,
    ) -> Result<Finished, OperatorError> {
        let what = args
            .first()
            .map(|a| a.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mut command = tokio::process::Command::new(&self.exe);
        command
            .args(args)
            .env_remove("NOTIFY_SOCKET")
            .env_remove("WATCHDOG_USEC")
            .env_remove("WATCHDOG_PID")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        for (key, _) in std::env::vars_os() {
            let k = key.to_string_lossy();
            if k.starts_with("NODEWARD_") && !k.starts_with("NODEWARD_LOG") {
                command.env_remove(&key);
            }
        }
        // A test build may hand the child a crash point (`crate::test_hooks`).
        if let Some((key, point)) = crate::test_hooks::child_abort_point() {
            command.env(key, point);
        }
        let daemon = rustix::process::getpid();
        // SAFETY: the closure runs in the forked child before `exec`, where only
        // async-signal-safe calls are allowed: it makes two raw system calls (`prctl`,
        // `getppid`) through rustix and builds its error from an errno, allocating nothing.
        #[allow(unsafe_code)]
        unsafe {
            command.pre_exec(move || die_with(daemon));
        }
        let since = self.feed.as_ref().map(|f| f.head());
        let mut child = command
            .spawn()
            .map_err(|e| OperatorError(format!("cannot run {} {what}: {e}", self.exe.display())))?;
        let stdout = read_capped(child.stdout.take());
        let stderr = read_capped(child.stderr.take());
        let watchdog = async {
            let Some(every) = self.notifier.watchdog_interval() else {
                return std::future::pending().await;
            };
            loop {
                tokio::time::sleep(every).await;
                if let Err(e) = self.notifier.watchdog() {
                    tracing::warn!(error = %e, "cannot notify the watchdog");
                }
            }
        };
        let waited = async { tokio::join!(child.wait(), stdout, stderr) };
        let (status, stdout, stderr) = tokio::select! {
            r = tokio::time::timeout(timeout, waited) => r.map_err(|_| OperatorError(format!(
                "nodeward {what} did not finish within {} s and was killed",
                timeout.as_secs()
            )))?,
            never = watchdog => never,
        };
        if let (Some(feed), Some(since)) = (&self.feed, since) {
            feed.observe_since(since);
        }
        let status =
            status.map_err(|e| OperatorError(format!("waiting for nodeward {what}: {e}")))?;
        let text = String::from_utf8_lossy(&stderr);
        let last = text
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("(no error output)");
        Ok(Finished {
            code: status.code(),
            stdout,
            last_error: cap(last),
            status: status.to_string(),
        })
    }

    /// [`Self::run`], an error naming the command and its last error line unless it exited 0.
    pub async fn succeed(
        &self,
        args: &[OsString],
        timeout: Duration,
    ) -> Result<Finished, OperatorError> {
        let finished = self.run(args, timeout).await?;
        if finished.success() {
            return Ok(finished);
        }
        Err(failure(args, &finished))
    }
}

/// In the child before `exec`: asks for SIGKILL when the thread that started it (the
/// daemon's) ends, and fails the start when the daemon is gone already (it died before the
/// request, so the signal would never come).
fn die_with(daemon: rustix::process::Pid) -> std::io::Result<()> {
    rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))?;
    if rustix::process::getppid() != Some(daemon) {
        return Err(rustix::io::Errno::SRCH.into());
    }
    Ok(())
}

/// Closes, in the audit trail `trail`, every run whose process is gone (a child killed with
/// an earlier daemon, or by its timeout) as `interrupted`, so that `nodeward audit summary`
/// shows none "running"; the daemon's start calls it. Writes nothing when no run is dead
/// ([`crate::audit::close_interrupted_runs`]). A failure is a warning: the next run that
/// opens the trail closes them as well.
pub fn close_interrupted_runs(trail: TrailConfig, root: &Path) {
    let dir = trail.dir.clone();
    let info = RunInfo {
        command: "daemon".into(),
        mode: Mode::Apply,
        root: root.display().to_string(),
    };
    match crate::audit::close_interrupted_runs(trail, info) {
        Ok(closed) if !closed.is_empty() => {
            tracing::info!(audit_dir = %dir.display(), runs = ?closed, "closed the audit runs a killed daemon's children left open as interrupted");
        }
        Ok(_) => {}
        Err(e) => {
            tracing::warn!(audit_dir = %dir.display(), error = %e, "cannot close the audit runs a killed daemon's children left open");
        }
    }
}

/// The error of a child that did not exit 0: `nodeward <command> failed (<status>): <line>`.
pub fn failure(args: &[OsString], finished: &Finished) -> OperatorError {
    let what = args
        .first()
        .map(|a| a.to_string_lossy().into_owned())
        .unwrap_or_default();
    OperatorError(cap(&format!(
        "nodeward {what} failed ({}): {}",
        finished.status, finished.last_error
    )))
}

/// Reads `stream` to its end, keeping its first [`MAX_OUTPUT_BYTES`].
async fn read_capped(stream: Option<impl AsyncRead + Unpin>) -> Vec<u8> {
    let mut kept = Vec::new();
    if let Some(mut s) = stream {
        let mut buf = [0u8; 8192];
        while let Ok(n) = s.read(&mut buf).await {
            if n == 0 {
                break;
            }
            let room = MAX_OUTPUT_BYTES.saturating_sub(kept.len());
            kept.extend_from_slice(&buf[..n.min(room)]);
        }
    }
    kept
}

/// `text` cut to [`MAX_ERROR_BYTES`] on a character boundary.
pub fn cap(text: &str) -> String {
    if text.len() <= MAX_ERROR_BYTES {
        return text.to_string();
    }
    let mut end = MAX_ERROR_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}
