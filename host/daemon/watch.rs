//! The daemon's loop: two watches (its own Machine, and the MachineOperations), one
//! serialized reconcile pass at a time, a jittered resync, backoff when the API server is
//! unreachable, and systemd told how it goes.
//!
//! # Expected flow
//! 1. [`start_decision`] reads the host's facts: `nodeward daemon` exits 69 when there is no
//!    node to keep and waits while an installation owns the host.
//! 2. [`run`] starts both watches (kube-runtime's watcher: list, then watch from the list's
//!    `resourceVersion`, re-listing only when the server says it is too old) and sends
//!    `READY=1`.
//! 3. Any event on the Machine, or on an operation naming it, schedules a pass right away; with
//!    no event, a pass runs every [`backoff::resync`] (10 min + up to 10 %).
//! 4. A pass ([`reconcile::reconcile_machine`], then each pending operation through
//!    [`reconcile::handle_operation`]) that fails on the API server is retried after the
//!    backoff's next delay; a watch that fails is polled again after its own backoff. Neither
//!    blocks the loop: the watchdog is fed, and signals are handled, while they wait.
//! 5. SIGTERM or SIGINT ends the loop ([`Exit::Stopped`], exit 0); an `AgentReset` that
//!    completed ends it with [`Exit::Reset`] (exit 69: the node is gone).
//!
//! # Guarantees
//! - Never a tight loop: each watch waits at least the backoff's floor (200 ms) after each
//!   failure, and so does a failed pass, whatever else asks for a pass meanwhile (an event, a
//!   resync that fell due during an outage: [`crate::daemon::schedule`]).
//! - `WATCHDOG=1` is sent only from this loop (or while it waits on a bounded node operation:
//!   `super::none_mode`): a pass that hangs stops it, and systemd restarts the daemon
//!   (`tests/daemon_watchdog.rs`, through the `daemon:hang-pass` test hook).
//!
//! # Caveats
//! A finished operation past its `ttlSecondsAfterFinished` is deleted by the next pass that
//! sees it (at the latest the next resync), not at the second its TTL ends.

use crate::daemon::backoff;
use crate::daemon::kube_api::{ClientError, KubeApi, WATCH_SECONDS, clients};
use crate::daemon::ledger::Ledger;
use crate::daemon::metrics::{Metrics, ReconcileResult};
use crate::daemon::notify::Notifier;
use crate::daemon::reconcile::{self, ApiError, ModeOperator};
use crate::daemon::schedule::{PassSchedule, WatchBackoff};
use crate::daemon::start::{self, HostFacts, Start};
use crate::node::state::{Checkpoint, NodeLock, NodeState, StateError};
use futures_lite::StreamExt as _;
use kube::runtime::watcher::{self, Event, watcher};
use nodeward_api::Time;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};
use tokio::signal::unix::{SignalKind, signal};
use tokio::time::Instant;

/// How the daemon ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// Asked to stop (SIGTERM, SIGINT).
    Stopped,
    /// An `AgentReset` removed the node: nothing to keep (exit 69).
    Reset,
}

/// Why the daemon could not run.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// The node's state could not be read.
    #[error("reading the node's state: {0}")]
    Facts(#[from] StateError),
    /// No client of the API server.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// A signal handler could not be installed.
    #[error("installing the signal handlers: {0}")]
    Signals(#[source] std::io::Error),
    /// A watch stream ended (kube-runtime's watcher never ends on its own).
    #[error("the watch of {0} ended")]
    WatchEnded(&'static str),
    /// The API server no longer accepts the credentials the daemon loaded: exit, so that
    /// systemd starts it again with the kubelet's current ones.
    #[error("{0}; exiting to reload the kubeconfig's credentials")]
    Unauthorized(String),
}

/// What the daemon needs to know to run.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Its Machine's name.
    pub machine: String,
    /// The kubeconfig it talks to the API server with.
    pub kubeconfig: PathBuf,
    /// An upgrade journal was found at start: recover it first.
    pub resume_journal: bool,
}

/// The host's facts beneath `root`, as the start decision needs them.
pub fn host_facts(root: &Path) -> Result<HostFacts, StateError> {
    let state = NodeState::new(root);
    let record = state.record()?;
    Ok(HostFacts {
        lock_held: NodeLock::held(root)?,
        record: record.is_some(),
        bootstrap_complete: record.is_some_and(|r| r.checkpoint == Checkpoint::Complete),
        journal: state.journal()?.is_some(),
    })
}

/// Whether the daemon may run on the host at `root` ([`start::decide`]).
pub fn start_decision(root: &Path) -> Result<Start, StateError> {
    host_facts(root).map(start::decide)
}

/// One watch's failures: it is not polled again until its backoff's delay has passed.
struct WatchHealth {
    what: &'static str,
    backoff: WatchBackoff,
    paused_until: Option<Instant>,
}

impl WatchHealth {
    fn new(what: &'static str) -> Self {
        WatchHealth {
            what,
            backoff: WatchBackoff::new(Instant::now()),
            paused_until: None,
        }
    }

    fn ok(&mut self) {
        self.backoff.worked();
    }

    /// The pause is over: the watch is polled again.
    fn resume(&mut self) {
        self.paused_until = None;
        self.backoff.resumed(Instant::now());
    }

    /// Pauses the watch for the backoff's next delay; a 401 ends the daemon instead.
    fn failed(&mut self, e: &watcher::Error) -> Result<(), DaemonError> {
        if unauthorized(e) {
            return Err(DaemonError::Unauthorized(format!(
                "the watch of {}: {e}",
                self.what
            )));
        }
        let gone = matches!(e, watcher::Error::WatchError(status) if status.code == 410);
        let delay = self.backoff.failed(Instant::now(), gone, fastrand::f64());
        tracing::warn!(
            watch = self.what,
            error = %e,
            retry_in_ms = delay.as_millis() as u64,
            "watch failed; backing off"
        );
        self.paused_until = Some(Instant::now() + delay);
        Ok(())
    }

    /// When to poll again; far in the future when not paused (the branch is disabled then).
    fn until(&self) -> Instant {
        self.paused_until
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(3600))
    }
}

/// Whether a watch failed because the server refused the credentials (401).
fn unauthorized(e: &watcher::Error) -> bool {
    let mut source: Option<&dyn std::error::Error> = Some(e);
    while let Some(s) = source {
        if let Some(kube::Error::Api(status)) = s.downcast_ref::<kube::Error>()
            && status.code == 401
        {
            return true;
        }
        if let Some(status) = s.downcast_ref::<kube::core::Status>()
            && status.code == 401
        {
            return true;
        }
        source = s.source();
    }
    false
}

/// The longest a pass may take: a bundle roll-out's worst case (install, restart, rollback,
/// restart: [`crate::daemon::rollout::MAX_ROLL_OUT`]), plus a node operation's own bound and
/// the API requests. Past it the pass is abandoned (an error, backed off from) rather than fed
/// to the watchdog forever.
const PASS_DEADLINE: Duration = Duration::from_secs(
    crate::daemon::rollout::MAX_ROLL_OUT.as_secs()
        + crate::daemon::none_mode::OPERATION_TIMEOUT.as_secs()
        + 600,
);

/// What one pass did.
struct Pass {
    conflicts: u32,
    exit: bool,
}

/// One pass: the Machine's status, then each pending operation (handled ones leave the set).
async fn pass(
    api: &KubeApi,
    mode: &impl ModeOperator,
    ledger: &impl Ledger,
    name: &str,
    pending: &mut BTreeSet<String>,
) -> Result<Pass, ApiError> {
    // A test build can make the pass block the runtime's one thread (a deadlock), to show
    // that the watchdog pings stop and systemd restarts the daemon.
    crate::test_hooks::hang_at("daemon:hang-pass");
    // The operations are carried out even when the Machine's status cannot be written (a
    // 403 or 422 on it must not hold an AgentReset back); the pass still fails after them.
    let machine = reconcile::reconcile_machine(api, mode, name, || Time(now())).await;
    let mut conflicts = machine.as_ref().map_or(0, |w| w.conflicts);
    if let Err(e @ (ApiError::Unreachable(_) | ApiError::Unauthorized(_))) = machine {
        return Err(e);
    }
    while let Some(op) = pending.first().cloned() {
        let done = match reconcile::handle_operation(api, mode, ledger, name, &op, || Time(now()))
            .await
        {
            Ok(done) => done,
            // Refused (403, 422 …): retrying would be refused again; the next event or resync
            // on this operation tries once more.
            Err(ApiError::Refused(why)) => {
                tracing::warn!(operation = %op, error = %why, "the API server refused the operation's update");
                pending.remove(&op);
                continue;
            }
            Err(e) => return Err(e),
        };
        pending.remove(&op);
        conflicts += done.conflicts;
        tracing::info!(operation = %op, action = ?done.action, "operation handled");
        if done.exit {
            return Ok(Pass {
                conflicts,
                exit: true,
            });
        }
    }
    machine?;
    Ok(Pass {
        conflicts,
        exit: false,
    })
}

/// The wall clock as the API's timestamps (k8s-openapi's, over jiff).
fn now() -> k8s_openapi::jiff::Timestamp {
    k8s_openapi::jiff::Timestamp::now()
}

/// Runs the loop until a signal or a completed `AgentReset` (see the module docs).
pub async fn run(
    settings: &Settings,
    mode: &impl ModeOperator,
    ledger: &impl Ledger,
    notifier: &Notifier,
    metrics: &Metrics,
) -> Result<Exit, DaemonError> {
    let (requests, watches) = clients(&settings.kubeconfig).await?;
    let api = KubeApi::new(requests, watches);
    let name = settings.machine.as_str();
    let mut sigterm = signal(SignalKind::terminate()).map_err(DaemonError::Signals)?;
    let mut sigint = signal(SignalKind::interrupt()).map_err(DaemonError::Signals)?;

    let every = watcher::Config::default().timeout(WATCH_SECONDS);
    let by_name = every.clone().fields(&format!("metadata.name={name}"));
    let mut machines = std::pin::pin!(watcher(api.watch_machines(), by_name));
    let mut operations = std::pin::pin!(watcher(api.watch_operations(), every));
    let mut machine_health = WatchHealth::new("machine");
    let mut operation_health = WatchHealth::new("machineoperations");

    let mut schedule = PassSchedule::new(Instant::now(), backoff::resync());
    // Operations naming this Machine: every one seen (for the resync), and those an event
    // asks a pass to look at.
    let mut known: BTreeSet<String> = BTreeSet::new();
    let mut pending: BTreeSet<String> = BTreeSet::new();
    let mut watchdog = tokio::time::interval(
        notifier
            .watchdog_interval()
            .unwrap_or(Duration::from_secs(3600)),
    );

    if settings.resume_journal {
        // An upgrade a crash cut short: finished or rolled back before anything else.
        match mode.recover().await {
            Ok(summary) => tracing::info!(%summary, "recovered a cut-short upgrade"),
            Err(e) => tracing::warn!(error = %e, "recovering a cut-short upgrade failed"),
        }
    }
    notify(notifier.ready(&format!("watching Machine {name}")));
    loop {
        let wake = schedule.wake();
        tokio::select! {
            biased;
            _ = sigterm.recv() => return Ok(stopped(notifier, "SIGTERM")),
            _ = sigint.recv() => return Ok(stopped(notifier, "SIGINT")),
            _ = watchdog.tick() => notify(notifier.watchdog()),
            event = machines.next(), if machine_health.paused_until.is_none() => match event {
                Some(Ok(Event::Init)) => {}
                Some(Ok(_)) => {
                    machine_health.ok();
                    schedule.want(Instant::now());
                }
                Some(Err(e)) => machine_health.failed(&e)?,
                None => return Err(DaemonError::WatchEnded("the Machine")),
            },
            event = operations.next(), if operation_health.paused_until.is_none() => match event {
                Some(Ok(Event::Apply(op) | Event::InitApply(op))) => {
                    operation_health.ok();
                    if op.spec.machine_ref.name == name
                        && let Some(op_name) = op.metadata.name
                    {
                        known.insert(op_name.clone());
                        pending.insert(op_name);
                        schedule.want(Instant::now());
                    }
                }
                Some(Ok(Event::Delete(op))) => {
                    operation_health.ok();
                    if let Some(op_name) = &op.metadata.name {
                        known.remove(op_name);
                        pending.remove(op_name);
                    }
                }
                Some(Ok(Event::Init | Event::InitDone)) => operation_health.ok(),
                Some(Err(e)) => operation_health.failed(&e)?,
                None => return Err(DaemonError::WatchEnded("the MachineOperations")),
            },
            _ = tokio::time::sleep_until(machine_health.until()),
                if machine_health.paused_until.is_some() => machine_health.resume(),
            _ = tokio::time::sleep_until(operation_health.until()),
                if operation_health.paused_until.is_some() => operation_health.resume(),
            _ = tokio::time::sleep_until(wake) => {
                let started = Instant::now();
                if schedule.resync_due(started) {
                    pending.extend(known.iter().cloned());
                }
                // The pass runs beside the watchdog and the signals: a slow API server or a
                // long node operation within its deadline is not a hung daemon.
                let result = {
                    let run = tokio::time::timeout(PASS_DEADLINE, pass(&api, mode, ledger, name, &mut pending));
                    let mut run = std::pin::pin!(run);
                    loop {
                        tokio::select! {
                            biased;
                            _ = sigterm.recv() => return Ok(stopped(notifier, "SIGTERM")),
                            _ = sigint.recv() => return Ok(stopped(notifier, "SIGINT")),
                            r = &mut run => break r.unwrap_or_else(|_| Err(ApiError::Unreachable(
                                format!("the pass took longer than {} s and was abandoned", PASS_DEADLINE.as_secs()),
                            ))),
                            _ = watchdog.tick() => notify(notifier.watchdog()),
                        }
                    }
                };
                let took = started.elapsed();
                notify(notifier.watchdog());
                match result {
                    Ok(p) if p.exit => {
                        metrics.reconciled(ReconcileResult::Success, took, SystemTime::now());
                        notify(notifier.stopping("the node was reset (AgentReset): nothing to keep"));
                        return Ok(Exit::Reset);
                    }
                    Ok(p) => {
                        let result = if p.conflicts > 0 {
                            ReconcileResult::Conflict
                        } else {
                            ReconcileResult::Success
                        };
                        metrics.reconciled(result, took, SystemTime::now());
                        schedule.succeeded(Instant::now(), backoff::resync());
                        tracing::debug!(took_ms = took.as_millis() as u64, conflicts = p.conflicts, "reconciled");
                        notify(notifier.status(&format!("Machine {name} reconciled")));
                    }
                    Err(ApiError::Unauthorized(why)) => return Err(DaemonError::Unauthorized(why)),
                    Err(e) => {
                        metrics.reconciled(ReconcileResult::Error, took, SystemTime::now());
                        let delay = schedule.failed(Instant::now(), fastrand::f64());
                        tracing::warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "reconcile failed; backing off");
                        notify(notifier.status(&format!("reconcile failed, retrying: {e}")));
                    }
                }
            }
        }
    }
}

/// A notification that could not be sent is logged, not fatal: systemd's watchdog is the
/// judge of a daemon that cannot speak to it.
fn notify(r: Result<(), crate::daemon::notify::NotifyError>) {
    if let Err(e) = r {
        tracing::warn!(error = %e, "cannot notify systemd");
    }
}

fn stopped(notifier: &Notifier, signal: &str) -> Exit {
    tracing::info!(signal, "stopping");
    notify(notifier.stopping(&format!("stopping on {signal}")));
    Exit::Stopped
}
