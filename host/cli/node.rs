//! The none-mode commands: `bootstrap`, `upgrade`, `reset`, `status`, and `plan` of a
//! bootstrap. What they do is decided in [`crate::node`]; this module prints it.

use super::flags::OutputArgs;
use super::output::{bundle_json, print_json, print_redacted_json, print_step};
use super::*;
use crate::node::pipeline::{Node, NodeError, Report, Step, Waits};

/// A none-mode operation.
#[derive(Clone, Copy, Debug)]
pub(super) enum NodeOp {
    Bootstrap { force: bool },
    Upgrade,
    Reset,
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
    op: NodeOp,
) -> Result<(), Failure> {
    let config = crate::config::load(run.config.path()).map_err(usage)?;
    check_mode(node_mode, &config)?;
    let config_source = run.config.source();
    let bundle = run_bundle(run, mode)?;
    let root = HostRoot::open(&run.host.root).map_err(usage)?;
    let runtime = runtime(&run.state)?;
    let limits = run.limits.limits();
    let layout = layout(&run.host, &root);
    let text = run.output.text();
    let verb = match (mode, op) {
        (RunMode::Plan, _) => "plan",
        (_, NodeOp::Bootstrap { .. }) => "bootstrap",
        (_, NodeOp::Upgrade) => "upgrade",
        (_, NodeOp::Reset) => "reset",
    };
    if text {
        println!(
            "nodeward {verb} (mode none): {} {} v{} (sha256 {}) against {}",
            bundle.source,
            bundle.manifest.bundle.name,
            bundle.manifest.bundle.version,
            &bundle.digest[..16],
            layout.root
        );
    }
    let session = session(&run.host, root, mode, &config)?;
    let mut node = Node::new(&runtime, &bundle, session.clone(), layout, limits, waits);
    let printer_session = session.clone();
    let mut printed = 0usize;
    if text {
        node.on_step =
            Box::new(move |step: &Step| print_step(step, &printer_session, &mut printed));
    }
    let result: Result<Report, NodeError> = match (mode, op) {
        (RunMode::Plan, _) => node.plan_bootstrap(&config),
        (_, NodeOp::Bootstrap { force }) => node.bootstrap(&config, &config_source, force),
        (_, NodeOp::Upgrade) => node.upgrade(&config, &config_source),
        (_, NodeOp::Reset) => node.reset(&config),
    };
    drop(node);
    let changes = session.changes();
    let error = result
        .as_ref()
        .err()
        .map(|e| session.redactor.redact(&e.to_string()));
    if text {
        if let Ok(r) = &result {
            if let Some(what) = &r.recovered {
                println!("recovered: {}", session.redactor.redact(what));
            }
            if let Some(v) = &r.version {
                println!("version: {v}");
            }
        }
        let what = if mode == RunMode::Plan {
            "planned"
        } else {
            "made"
        };
        println!("{} change(s) {what}.", changes.len());
    } else {
        let report = json!({
            "mode": mode,
            "operation": verb,
            "root": session.root().path(),
            "bundle": bundle_json(&bundle),
            "report": result.as_ref().ok(),
            "changes": changes,
            "mutations": changes.len(),
            "error": error,
        });
        print_redacted_json(report, &session.redactor);
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
    let status = crate::node::status::read(Path::new(&layout.root), &session);
    if !output.text() {
        print_json(&serde_json::to_value(&status).map_err(failed)?);
        return Ok(());
    }
    println!("mode: {}", status.mode);
    println!("installed: {}", status.installed);
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
        println!("upgrade in progress: {u}");
    }
    for u in &status.units {
        println!("unit {}: {} {}", u.unit, u.active_state, u.sub_state);
    }
    println!("kubelet health: {}", status.kubelet_health);
    Ok(())
}
