//! The none-mode commands: `bootstrap`, `upgrade`, `reset`, `status`, and `plan` of a
//! bootstrap (`preflight` is in [`super::preflight`]). What they do is decided in [`crate::node`]; this module prints it.

use super::flags::OutputArgs;
use super::json::RunOutput;
use super::output::{
    print_change_total, print_json, print_new_changes, print_redacted_json, print_step,
};
use super::*;
use crate::bootstrap_report::{self, Progress, Reporter};
use crate::node::pipeline::{Node, NodeError, Report, Step, Waits};
use crate::node::status::{Health, NodePresence as Presence};
use std::cell::Cell;

/// A none-mode operation.
#[derive(Clone, Copy, Debug)]
pub(super) enum NodeOp<'a> {
    Bootstrap {
        force: bool,
        /// `--ignore-preflight-errors`.
        ignore: &'a [String],
    },
    Upgrade {
        /// `--ignore-preflight-errors`.
        ignore: &'a [String],
    },
    Reset,
    /// Restart, after running these phases again (`restart --phase`).
    Restart {
        rerun: &'a [String],
    },
    Recover,
}

/// Refuses a mode this build does not implement (`--mode`, else the config's `mode`).
fn check_mode(
    flag: Option<ModeArg>,
    config: &nodeward_node_config::NodeConfig,
) -> Result<(), Failure> {
    let mode = match flag {
        Some(m) => m,
        None => match config.mode {
            nodeward_node_config::Mode::None => ModeArg::None,
            nodeward_node_config::Mode::Nspawn => ModeArg::Nspawn,
        },
    };
    match mode {
        ModeArg::None => Ok(()),
        ModeArg::Nspawn => Err(usage(
            "mode nspawn is not implemented in this version of nodeward; use --mode none (config `mode: none`)",
        )),
    }
}

/// bootstrap, upgrade, reset, and plan (of a bootstrap).
pub(super) fn op(
    run: &RunArgs,
    node_mode: Option<ModeArg>,
    waits: Waits,
    mode: RunMode,
    op: NodeOp<'_>,
    offline: Option<&std::path::Path>,
) -> Result<(), Failure> {
    let config = match op {
        // A restart or recovery runs with the config the node was made with; --config only
        // stands in when there is none.
        NodeOp::Restart { .. } | NodeOp::Recover => {
            match crate::node::state::NodeState::new(&run.host.root).applied() {
                Ok(Some(applied)) => applied,
                Ok(None) => crate::config::load(run.config.path()).map_err(usage)?,
                Err(e) => return Err(failed(e)),
            }
        }
        _ => crate::config::load(run.config.path()).map_err(usage)?,
    };
    check_mode(node_mode, &config)?;
    // Before anything runs: an unknown check name is a usage error listing the checks.
    let ignore_preflight = match op {
        NodeOp::Bootstrap { ignore, .. } | NodeOp::Upgrade { ignore } => {
            crate::preflight::Ignore::parse(ignore, &config).map_err(usage)?
        }
        _ => crate::preflight::Ignore::none(),
    };
    let config_source = run.config.source();
    let offline = match offline {
        Some(file) => Some(super::offline::prepare(run, file, &config, mode)?),
        None => None,
    };
    let bundle = match &offline {
        Some(o) => o.bundle.clone(),
        None => run_bundle(run, mode)?,
    };
    let root = HostRoot::open(&run.host.root).map_err(usage)?;
    let runtime = runtime(&run.host.root, &run.state)?;
    let limits = run.limits.limits();
    let layout = layout(&run.host, &root);
    let text = run.output.text();
    let verb = match op {
        NodeOp::Bootstrap { .. } => "bootstrap",
        NodeOp::Upgrade { .. } => "upgrade",
        NodeOp::Reset => "reset",
        NodeOp::Restart { .. } => "restart",
        NodeOp::Recover => "recover",
    };
    if text {
        println!(
            "nodeward {} (mode none): {} {} v{} (sha256 {}) against {}",
            if mode == RunMode::Plan { "plan" } else { verb },
            bundle.source,
            bundle.manifest.bundle.name,
            bundle.manifest.bundle.version,
            &bundle.digest[..16],
            layout.root
        );
    }
    let session = session(run, root, mode, &config, offline.map(|o| o.name))?;
    let command = if mode == RunMode::Plan { "plan" } else { verb };
    let audit = super::audit::start(&run.host.root, &run.state, &run.audit, command, &session)?;
    // A test build can stop here, the run open in the trail (a child of the daemon the test
    // kills: `tests/daemon_crash.rs`).
    crate::test_hooks::hang_at("run:hang-after-start");
    let mut node = Node::new(&runtime, &bundle, session.clone(), layout, limits, waits);
    node.ignore_preflight = ignore_preflight;
    // How many changes are printed: shared by the step printer and the end of the run, which
    // prints what a failed step changed.
    let printed = Cell::new(0usize);
    if text {
        let printer_session = session.clone();
        let printed = &printed;
        node.on_step = Box::new(move |step: &Step| {
            let mut n = printed.get();
            print_step(step, &printer_session, true, &mut n);
            printed.set(n);
        });
    }
    // An applied bootstrap tells its Machine it runs, and later how it ended (best effort:
    // never an error, never more than a few seconds; `crate::bootstrap_report`).
    let mut reporter = match (mode, op) {
        (RunMode::Apply, NodeOp::Bootstrap { force, .. }) => {
            let mut r = Reporter::new(&config, session.redactor.clone());
            r.report(&Progress::Running {
                checkpoint: bootstrap_report::starting_checkpoint(&run.host.root, &config, force),
            });
            Some(r)
        }
        _ => None,
    };
    let result: Result<Report, NodeError> = match (mode, op) {
        (RunMode::Plan, _) => node.plan_bootstrap(&config),
        (_, NodeOp::Bootstrap { force, .. }) => node.bootstrap(&config, &config_source, force),
        (_, NodeOp::Upgrade { .. }) => node.upgrade(&config, &config_source),
        (_, NodeOp::Reset) => node.reset(&config),
        (_, NodeOp::Restart { rerun }) => node.restart(rerun),
        (_, NodeOp::Recover) => node.recover(),
    };
    // A failed operation keeps the steps it ran in the node; a finished one's are in its report.
    let (report, error) = match result {
        Ok(report) => (report, None),
        Err(e) => {
            let report = Report {
                operation: verb.to_string(),
                steps: node.take_steps(),
                ..Report::default()
            };
            (report, Some(session.redactor.redact(&e.to_string())))
        }
    };
    let error = audit.end(error);
    if let Some(r) = reporter.as_mut() {
        r.report(&match &error {
            None => Progress::Done,
            Some(e) => Progress::Failed(e.clone()),
        });
    }
    drop(node);
    if text {
        let mut n = printed.get();
        print_new_changes(&session, &mut n);
        if let Some(what) = &report.recovered {
            println!("recovered: {}", session.redactor.redact(what));
        }
        if let Some(v) = &report.version {
            println!("version: {v}");
        }
        print_change_total(&session);
    } else {
        let output = RunOutput {
            version: report.version,
            kubelet_version: report.kubelet_version,
            recovered: report.recovered,
            ..RunOutput::new(
                mode,
                report.operation,
                &session,
                bundle.id(),
                report.steps,
                error.clone(),
            )
        };
        print_redacted_json(&output, &session.redactor)?;
    }
    match error {
        Some(e) => Err(failed(e)),
        None => Ok(()),
    }
}

pub(super) fn status(host: &HostArgs, output: &OutputArgs) -> Result<(), Failure> {
    let root = HostRoot::open(&host.root).map_err(usage)?;
    let layout = layout(host, &root);
    let session = status_session(root);
    let status = crate::node::status::read(&layout, &session);
    if !output.text() {
        return print_json(&status);
    }
    let presence = match status.presence {
        Presence::Absent => "no",
        Presence::Partial => "no (PARTIAL: traces of a node, no install record)",
        Presence::Bootstrapping => "no (a bootstrap has not finished)",
        Presence::Installed => "yes",
    };
    println!("mode: {}", status.mode);
    println!("installed: {presence}");
    println!(
        "active version: {}",
        status.active_version.as_deref().unwrap_or("-")
    );
    if status.versions.len() > 1 {
        println!("installed versions: {}", status.versions.join(", "));
    }
    match &status.applied_config {
        Some(a) => println!(
            "applied config: sha256 {}{}",
            a.sha256,
            if a.verified {
                ""
            } else {
                " (DOES NOT MATCH the file)"
            }
        ),
        None => println!("applied config: -"),
    }
    println!(
        "checkpoint: {}",
        status.checkpoint.as_deref().unwrap_or("-")
    );
    if let Some(u) = &status.upgrade_in_progress {
        println!("upgrade in progress: {} -> {}", u.from, u.to);
    }
    for u in &status.units {
        match (&u.active_state, &u.sub_state, &u.error) {
            (Some(active), Some(sub), _) => println!("unit {}: {active} {sub}", u.unit),
            (_, _, error) => println!(
                "unit {}: unknown ({})",
                u.unit,
                error.as_deref().unwrap_or("no state")
            ),
        }
    }
    match (status.kubelet_health, &status.kubelet_health_error) {
        (Health::Ok, _) => println!("kubelet health: ok"),
        (Health::Failing, e) => {
            println!("kubelet health: FAILING ({})", e.as_deref().unwrap_or("-"))
        }
        (Health::Unknown, e) => {
            println!("kubelet health: unknown ({})", e.as_deref().unwrap_or("-"))
        }
    }
    if status.presence != Presence::Installed && !status.traces.is_empty() {
        println!("traces of a node (`nodeward reset` removes them):");
        for t in &status.traces {
            println!("  {}", t.path);
        }
    }
    for e in &status.errors {
        println!("unreadable: {e}");
    }
    Ok(())
}
