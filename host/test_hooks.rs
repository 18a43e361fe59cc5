//! Crash points for the crash-safety tests, compiled only with the `test-hooks` cargo feature.
//!
//! # Background
//! The crash tests kill the agent at chosen moments (right after the k-th host mutation, or at
//! a named point of a bundle install) and check that the next run repairs the host. The hook
//! is one environment variable, read only by a binary built with `--features test-hooks`
//! (`scripts/test.sh` builds the tests that way). A release build has no hook: the functions
//! below compile to "never", and the variable's name is not in the binary.
//!
//! The variable holds one abort point: `mutation:K` (abort after the K-th host mutation of an
//! apply) or a named point such as `install:after-stage` (see [`abort_at`]'s callers), among
//! them `<purpose>:after-temp-write` (`state:after-temp-write`, `download:after-temp-write`,
//! ...): right after a durable write's temp file got its name, before its rename
//! (`crate::durable`).
//!
//! A named point may carry a count, `<point>@K`: abort the K-th time the process reaches it
//! (`audit:after-record@3`: right after the run's third audit record), so a test can crash a
//! run at every write of a kind, one run per write.
//!
//! Two points hang instead of aborting ([`hang_at`]): `daemon:hang-pass` makes the daemon's
//! reconcile pass block its thread for good, a deadlock on its single-threaded runtime, so
//! the watchdog tests (`tests/daemon_watchdog.rs`) can see the `WATCHDOG=1` pings stop and
//! systemd kill the daemon; `run:hang-after-start` stops a node command (`restart`, `reset`
//! …) right after its audit run started, so a test can kill the daemon while its child's run
//! is open.
//!
//! The daemon's crash points (`tests/daemon_crash.rs`) are those of an operation's end, in
//! order: `daemon:after-status-in-progress`, `ledger-started:after-temp-write`,
//! `daemon:after-ledger-started`, `daemon:after-act`, `ledger-done:after-temp-write`,
//! `daemon:after-ledger-done`, `daemon:after-status-final`, `ledger-final:after-temp-write`,
//! `daemon:after-ledger-final` (`crate::daemon::reconcile::handle_operation`).
//!
//! The daemon's child runs get none of its `NODEWARD_*` variables; a test reaches them with
//! [`CHILD_ABORT_ENV`], which the daemon hands them as their [`ABORT_ENV`]
//! ([`child_abort_point`]).

/// The one variable (see the module doc). Only in `test-hooks` builds.
#[cfg(feature = "test-hooks")]
pub const ABORT_ENV: &str = "NODEWARD_TEST_ABORT";

#[cfg(feature = "test-hooks")]
fn point() -> Option<String> {
    std::env::var(ABORT_ENV).ok()
}

/// The variable whose value the daemon's child runs get as their [`ABORT_ENV`] (see the
/// module doc). Only in `test-hooks` builds.
#[cfg(feature = "test-hooks")]
pub const CHILD_ABORT_ENV: &str = "NODEWARD_TEST_CHILD_ABORT";

/// The variable and the point to set in the environment of the daemon's child runs, when a
/// test asked for one ([`CHILD_ABORT_ENV`]); always `None` without the `test-hooks` feature.
pub fn child_abort_point() -> Option<(&'static str, String)> {
    #[cfg(feature = "test-hooks")]
    {
        Some((ABORT_ENV, std::env::var(CHILD_ABORT_ENV).ok()?))
    }
    #[cfg(not(feature = "test-hooks"))]
    {
        None
    }
}

/// After how many host mutations an apply aborts (`mutation:K`); always `None` without the
/// `test-hooks` feature.
pub fn abort_after_mutation() -> Option<usize> {
    #[cfg(feature = "test-hooks")]
    {
        point()?.strip_prefix("mutation:")?.parse().ok()
    }
    #[cfg(not(feature = "test-hooks"))]
    {
        None
    }
}

/// Aborts the process when the hook names `point` (e.g. `install:after-stage`), or names it
/// with a count (`install:after-stage@2`) and this is the process's K-th time at it; does
/// nothing without the `test-hooks` feature.
pub fn abort_at(point: &str) {
    #[cfg(feature = "test-hooks")]
    if let Some(hook) = self::point() {
        if hook == point {
            abort(point);
        }
        let nth = hook
            .strip_prefix(point)
            .and_then(|rest| rest.strip_prefix('@'))
            .and_then(|k| k.parse::<usize>().ok());
        if nth.is_some_and(|k| reached(point) == k) {
            abort(&hook);
        }
    }
    #[cfg(not(feature = "test-hooks"))]
    let _ = point;
}

/// How many times the process has reached `point`, this time included.
#[cfg(feature = "test-hooks")]
fn reached(point: &str) -> usize {
    static COUNTS: std::sync::Mutex<Vec<(String, usize)>> = std::sync::Mutex::new(Vec::new());
    let mut counts = COUNTS.lock().unwrap_or_else(|p| p.into_inner());
    let i = match counts.iter().position(|(p, _)| p == point) {
        Some(i) => i,
        None => {
            counts.push((point.to_string(), 0));
            counts.len() - 1
        }
    };
    counts[i].1 += 1;
    counts[i].1
}

/// Blocks the calling thread for good when the hook names `point` (`daemon:hang-pass`,
/// `run:hang-after-start`),
/// saying where: a deadlock, as a watchdog test needs one. It sleeps rather than spins, so a
/// hung test process costs no CPU while it waits to be killed. Does nothing without the
/// `test-hooks` feature.
pub fn hang_at(point: &str) {
    #[cfg(feature = "test-hooks")]
    if self::point().is_some_and(|p| p == point) {
        eprintln!("nodeward: test hook: hanging at {point}");
        loop {
            std::thread::sleep(std::time::Duration::from_secs(3600));
        }
    }
    #[cfg(not(feature = "test-hooks"))]
    let _ = point;
}

/// Aborts the process now (no unwinding, no cleanup, like a power cut), saying where.
pub fn abort(at: &str) -> ! {
    eprintln!("nodeward: test hook: aborting at {at}");
    std::process::abort()
}

/// The variable that makes the audit trail rotate small (see [`audit_rotate_bytes`]). Only in
/// `test-hooks` builds.
#[cfg(feature = "test-hooks")]
pub const AUDIT_ROTATE_ENV: &str = "NODEWARD_TEST_AUDIT_ROTATE_BYTES";

/// The size at which the audit trail rotates its active file, when a test sets it small
/// ([`AUDIT_ROTATE_ENV`]); always `None` without the `test-hooks` feature.
pub fn audit_rotate_bytes() -> Option<u64> {
    #[cfg(feature = "test-hooks")]
    {
        std::env::var(AUDIT_ROTATE_ENV).ok()?.parse().ok()
    }
    #[cfg(not(feature = "test-hooks"))]
    {
        None
    }
}
