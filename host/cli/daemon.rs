//! `nodeward daemon`: the start decision, the settings from the flags, then the loop of
//! [`crate::daemon::watch`] on a single-threaded tokio runtime.

use super::args::DaemonArgs;
use super::*;
use crate::daemon::ledger::FileLedger;
use crate::daemon::metrics::{self, Metrics};
use crate::daemon::none_mode::NoneOperator;
use crate::daemon::notify::Notifier;
use crate::daemon::start::{Deferred, Start};
use crate::daemon::watch::{self, Exit, Settings};
use crate::node::state::NodeState;
use nodeward_node_config::layout::KUBELET_KUBECONFIG;
use std::ffi::OsString;
use std::net::SocketAddr;

/// `nodeward unit`: the daemon's systemd unit ([`crate::daemon::UNIT_FILE`]).
pub(super) fn print_unit() -> Result<(), Failure> {
    use std::io::Write as _;
    std::io::stdout()
        .write_all(crate::daemon::UNIT_FILE.as_bytes())
        .map_err(failed)
}

/// Runs the daemon until it is stopped (exit 0) or has nothing to keep (exit 69).
pub(super) fn run(a: &DaemonArgs) -> Result<(), Failure> {
    let root = &a.host.root;
    let metrics_addr: Option<SocketAddr> = match a.metrics_addr.as_str() {
        "off" => None,
        addr => Some(addr.parse().map_err(|e| {
            usage(format!(
                "--metrics-addr {addr}: neither an address (IP:PORT) nor `off`: {e}"
            ))
        })?),
    };
    let notifier = Notifier::from_env();
    let resume_journal = wait_for_node(root, &notifier)?;
    let settings = Settings {
        machine: match &a.machine {
            Some(m) => m.clone(),
            None => machine_name(root)?,
        },
        kubeconfig: a
            .kubeconfig
            .clone()
            .unwrap_or_else(|| root.join(KUBELET_KUBECONFIG)),
        resume_journal,
    };
    let metrics = Metrics::new();
    // A port another process holds costs the metrics, not the node's upkeep.
    match metrics_addr.map(|addr| metrics::serve(metrics.clone(), addr)) {
        Some(Ok(bound)) => tracing::info!(%bound, "serving metrics"),
        Some(Err(e)) => tracing::warn!(error = %e, "no metrics: cannot serve them"),
        None => {}
    }
    // The binary this process runs, even if a package upgrade has replaced the file since: the
    // children are the same version as the daemon until systemd restarts it.
    let exe = std::path::PathBuf::from("/proc/self/exe");
    // A repave's config a killed daemon left behind holds the bootstrap token; the temp files
    // of its ledger, roll-out record and repave config (and of a killed head update) go too.
    let state_dir = a.state.dir(root);
    crate::daemon::none_mode::remove_repave_config(&state_dir);
    match crate::durable::sweep_state_dir(&state_dir) {
        Ok(removed) if !removed.is_empty() => {
            tracing::info!(state_dir = %state_dir.display(), removed = ?removed, "removed what killed writers left");
        }
        Ok(_) => {}
        Err(e) => {
            tracing::warn!(state_dir = %state_dir.display(), error = %e, "cannot sweep the state directory");
        }
    }
    // The runs of the children a killed daemon took with it are closed as interrupted.
    crate::daemon::child::close_interrupted_runs(
        super::audit::config(root, &a.state, &a.audit),
        root,
    );
    let operator = NoneOperator {
        children: crate::daemon::child::Children {
            exe,
            notifier: notifier.clone(),
            feed: Some(crate::daemon::run_metrics::AuditFeed {
                audit_dir: a.audit.dir(root),
                heads_dir: a.state.dir(root).join(crate::audit::head::HEADS_DIR),
                metrics: metrics.clone(),
            }),
        },
        root: root.clone(),
        state_dir: a.state.dir(root),
        audit_dir: a.audit.dir(root),
        flags: child_flags(a, true),
        store_flags: child_flags(a, false),
        config: a.config.config.clone(),
        failed_repave: Default::default(),
        health_timeout: std::time::Duration::from_secs(a.health_timeout),
    };
    tracing::info!(machine = %settings.machine, kubeconfig = %settings.kubeconfig.display(), "daemon starting");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| failed(format!("cannot start the event loop: {e}")))?;
    let exit = runtime
        .block_on(watch::run(
            &settings,
            &operator,
            &FileLedger::new(&a.state.dir(root)),
            &notifier,
            &metrics,
        ))
        .map_err(failed)?;
    match exit {
        Exit::Stopped => Ok(()),
        Exit::Reset => Err(deferred(
            "the node was reset (AgentReset): nothing to keep on this host",
        )),
    }
}

/// How often a daemon waiting for an installation looks again.
const WAIT_POLL: std::time::Duration = std::time::Duration::from_secs(5);

/// Waits while an installation owns the host (a run holds the node lock, or a bootstrap has
/// not finished: at first boot the daemon starts beside `nodeward bootstrap`), telling
/// systemd it is up and waiting; exit 69 when there is no node at all. Whether a cut-short
/// upgrade must be recovered first.
fn wait_for_node(root: &std::path::Path, notifier: &Notifier) -> Result<bool, Failure> {
    let mut said = false;
    loop {
        match watch::start_decision(root).map_err(failed)? {
            Start::Reconcile { resume_journal } => return Ok(resume_journal),
            Start::Deferred(Deferred::NoNode) => {
                return Err(deferred(&Deferred::NoNode.to_string()));
            }
            Start::Deferred(why) => {
                if !said {
                    tracing::info!(reason = %why, "waiting for the installation to finish");
                    let status = format!("waiting: {why}");
                    if let Err(e) = notifier.ready(&status) {
                        tracing::warn!(error = %e, "cannot notify systemd");
                    }
                    said = true;
                }
                if let Err(e) = notifier.watchdog() {
                    tracing::warn!(error = %e, "cannot notify systemd");
                }
                std::thread::sleep(WAIT_POLL);
            }
        }
    }
}

/// Exit 69 ([`crate::daemon::DEFERRED_EXIT_CODE`]) with why.
fn deferred(why: &str) -> Failure {
    Failure {
        code: crate::daemon::DEFERRED_EXIT_CODE,
        message: format!("daemon: {why} (exit 69: systemd leaves the unit stopped)"),
    }
}

/// The node's name (its applied config's `machineName`), else the host name.
fn machine_name(root: &std::path::Path) -> Result<String, Failure> {
    if let Ok(Some(config)) = NodeState::new(root).applied() {
        return Ok(config.machine_name);
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map_err(|e| failed(format!("/proc/sys/kernel/hostname: {e}; give --machine")))?;
    let host = host.trim();
    if host.is_empty() {
        return Err(usage("the host has no name; give --machine"));
    }
    Ok(host.to_string())
}

/// The flags of the daemon's child runs: the host, state and audit trail the daemon itself was
/// given (`--config` is the operator's to add); with `unit_dir` (node operations, `nodeward
/// upgrade|restart|reset`) the unit directory too, which the bundle store's commands do not
/// take.
fn child_flags(a: &DaemonArgs, unit_dir: bool) -> Vec<OsString> {
    let mut flags: Vec<OsString> = vec!["--root".into(), a.host.root.clone().into()];
    if unit_dir {
        flags.push("--unit-dir".into());
        flags.push(a.host.unit_dir.clone().into());
    }
    let mut pass = |flag: &str, value: &Option<std::path::PathBuf>| {
        if let Some(v) = value {
            flags.push(flag.into());
            flags.push(v.clone().into());
        }
    };
    pass("--state-dir", &a.state.state_dir);
    pass("--audit-dir", &a.audit.audit_dir);
    flags
}
