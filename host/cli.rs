//! The `nodeward` command line.
//!
//! Exit codes: 0 success; 1 the run failed (a phase failed or was refused, a bundle or
//! component was refused); 2 usage or configuration error (bad flags, an unreadable or invalid
//! node config, an unknown `--phase`).

use crate::audit::Redactor;
use crate::bundle::Bundle;
use crate::hostpath::HostRoot;
use crate::plan::{Change, RunMode};
use crate::runtime::{Limits, Runtime};
use crate::session::{self, PhaseOutcome, RunError, Session};
use clap::{Args, Parser, Subcommand, ValueEnum};
use serde_json::json;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

/// nodeward: turns a Linux host into a Kubernetes worker node; every host change is a
/// WebAssembly phase with typed, granted capabilities.
#[derive(Debug, Parser)]
#[command(name = "nodeward", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
    #[command(flatten)]
    common: Common,
}

/// Flags every command takes.
#[derive(Debug, Args)]
pub struct Common {
    /// Host root: every host path resolves beneath it.
    #[arg(long, global = true, default_value = "/", env = "NODEWARD_ROOT")]
    root: PathBuf,
    /// Node configuration file (YAML or JSON); default: the embedded example.
    #[arg(long, global = true, env = "NODEWARD_CONFIG")]
    config: Option<PathBuf>,
    /// Phase bundle directory; default: the embedded bundle.
    #[arg(long, global = true, env = "NODEWARD_BUNDLE")]
    bundle: Option<PathBuf>,
    /// Run only this phase (repeatable); default: all, in bundle order.
    #[arg(long = "phase", global = true, value_name = "NAME")]
    phases: Vec<String>,
    /// Output format on stdout.
    #[arg(long, global = true, value_enum, default_value_t = Format::Text)]
    output: Format,
    /// Log format on stderr (the audit log included).
    #[arg(long, global = true, value_enum, default_value_t = Format::Text)]
    log_format: Format,
    /// Log filter (tracing syntax), e.g. `info` or `warn,nodeward::audit=info`.
    /// Default: `info` for apply, `warn` otherwise.
    #[arg(long, global = true, env = "NODEWARD_LOG")]
    log_level: Option<String>,
    /// Agent state directory (the compiled component cache lives in `compiled/` there).
    #[arg(long, global = true, env = "NODEWARD_STATE_DIR")]
    state_dir: Option<PathBuf>,
    /// Deadline of one phase run, in seconds.
    #[arg(long, global = true, default_value_t = 300)]
    phase_timeout: u64,
    /// Memory cap of one phase run, in MiB.
    #[arg(long, global = true, default_value_t = 256)]
    memory_limit: usize,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Show every host change the phases would make, without making any.
    Plan,
    /// Make the changes.
    Apply,
    /// List and inspect the bundle's phases.
    #[command(subcommand)]
    Phases(PhasesCommand),
    /// Print the agent, wasmtime and WIT versions and the embedded bundle's digest.
    Version,
}

#[derive(Debug, Subcommand)]
enum PhasesCommand {
    /// The bundle's phases, in run order.
    List,
    /// Each phase's digest, WIT imports and grants.
    Inspect,
}

/// Text or JSON.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// For people.
    Text,
    /// For programs.
    Json,
}

/// An error with its exit code.
struct Failure {
    code: u8,
    message: String,
}

fn usage(message: impl ToString) -> Failure {
    Failure {
        code: 2,
        message: message.to_string(),
    }
}

fn failed(message: impl ToString) -> Failure {
    Failure {
        code: 1,
        message: message.to_string(),
    }
}

impl Cli {
    /// The tracing filter this invocation should start with.
    pub fn log_filter(&self) -> String {
        match (&self.common.log_level, &self.command) {
            (Some(l), _) => l.clone(),
            (None, Command::Apply) => "info".into(),
            (None, _) => "warn".into(),
        }
    }

    /// Whether logs should be JSON.
    pub fn json_logs(&self) -> bool {
        self.common.log_format == Format::Json
    }

    /// Runs the command, printing its output; returns the process exit code.
    pub fn run(self) -> ExitCode {
        let output = self.common.output;
        match self.dispatch() {
            Ok(()) => ExitCode::SUCCESS,
            Err(f) => {
                if output == Format::Json {
                    eprintln!("{}", json!({ "error": f.message, "exit-code": f.code }));
                } else {
                    eprintln!("error: {}", f.message);
                }
                ExitCode::from(f.code)
            }
        }
    }

    fn dispatch(self) -> Result<(), Failure> {
        match self.command {
            Command::Plan => run_phases(&self.common, RunMode::Plan),
            Command::Apply => run_phases(&self.common, RunMode::Apply),
            Command::Phases(PhasesCommand::List) => phases_list(&self.common),
            Command::Phases(PhasesCommand::Inspect) => phases_inspect(&self.common),
            Command::Version => version(&self.common),
        }
    }
}

fn load_bundle(common: &Common) -> Result<Bundle, Failure> {
    match &common.bundle {
        Some(dir) => Bundle::load_dir(dir),
        None => Bundle::embedded(),
    }
    .map_err(failed)
}

fn runtime(common: &Common) -> Result<Runtime, Failure> {
    let state = common
        .state_dir
        .clone()
        .unwrap_or_else(crate::config::default_state_dir);
    Runtime::new(&state.join("compiled")).map_err(failed)
}

fn bundle_json(bundle: &Bundle) -> serde_json::Value {
    json!({
        "name": bundle.manifest.bundle.name,
        "version": bundle.manifest.bundle.version,
        "digest": bundle.digest,
        "source": bundle.source.to_string(),
    })
}

fn print_change(change: &Change) {
    println!("  {}", change.kind.describe());
    if let Some(diff) = change.kind.diff() {
        for line in diff.lines() {
            println!("      {line}");
        }
    }
}

fn run_phases(common: &Common, mode: RunMode) -> Result<(), Failure> {
    let config = crate::config::load(common.config.as_deref()).map_err(usage)?;
    let bundle = load_bundle(common)?;
    let root = HostRoot::open(&common.root).map_err(usage)?;
    let runtime = runtime(common)?;
    let limits = Limits {
        deadline: Duration::from_secs(common.phase_timeout),
        memory: common.memory_limit << 20,
    };
    let verb = if mode == RunMode::Plan {
        "plan"
    } else {
        "apply"
    };
    let text = common.output == Format::Text;
    if text {
        println!(
            "nodeward {verb}: {} {} v{} (sha256 {}) against {}",
            bundle.source,
            bundle.manifest.bundle.name,
            bundle.manifest.bundle.version,
            &bundle.digest[..16],
            root.path().display()
        );
    }
    let session = Arc::new(Session::new(root, mode, Redactor::new(config.secrets())));
    let mut printed = 0;
    let result = session::run(
        &runtime,
        &bundle,
        &session,
        &config,
        &common.phases,
        limits,
        |outcome: &PhaseOutcome| {
            if text {
                println!("phase {}: {}", outcome.name, outcome.report.summary);
                let changes = session.changes();
                for change in &changes[printed..] {
                    print_change(change);
                }
                printed = changes.len();
            }
        },
    );
    let changes = session.changes();
    let (phases, error) = match result {
        Ok(phases) => (phases, None),
        Err(RunError::UnknownPhase(p)) => return Err(usage(RunError::UnknownPhase(p))),
        Err(e) => (Vec::new(), Some(e.to_string())),
    };
    if text {
        for change in &changes[printed..] {
            print_change(change);
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
            "root": session.root.path(),
            "bundle": bundle_json(&bundle),
            "phases": phases,
            "changes": changes,
            "error": error,
        });
        println!(
            "{}",
            serde_json::to_string_pretty(&report).unwrap_or_default()
        );
    }
    match error {
        Some(e) => Err(failed(e)),
        None => Ok(()),
    }
}

fn phases_list(common: &Common) -> Result<(), Failure> {
    let bundle = load_bundle(common)?;
    if common.output == Format::Json {
        let phases: Vec<_> = bundle
            .manifest
            .phases
            .iter()
            .map(|p| json!({ "name": p.name, "world": p.world, "sha256": p.sha256 }))
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(
                &json!({ "bundle": bundle_json(&bundle), "phases": phases })
            )
            .unwrap_or_default()
        );
    } else {
        println!(
            "{} {} v{} (sha256 {})",
            bundle.source,
            bundle.manifest.bundle.name,
            bundle.manifest.bundle.version,
            bundle.digest
        );
        for p in &bundle.manifest.phases {
            println!("  {:<16} world {:<12} sha256 {}", p.name, p.world, p.sha256);
        }
    }
    Ok(())
}

fn phases_inspect(common: &Common) -> Result<(), Failure> {
    let bundle = load_bundle(common)?;
    let runtime = runtime(common)?;
    let mut phases = Vec::new();
    for p in &bundle.manifest.phases {
        let loaded = runtime
            .load(
                &p.name,
                &p.world,
                bundle.component(&p.name).unwrap_or_default(),
                &p.sha256,
            )
            .map_err(failed)?;
        phases.push(json!({
            "name": p.name,
            "world": p.world,
            "component": p.component,
            "sha256": p.sha256,
            "imports": loaded.imports,
            "grants": p.grants,
        }));
    }
    if common.output == Format::Json {
        println!(
            "{}",
            serde_json::to_string_pretty(
                &json!({ "bundle": bundle_json(&bundle), "phases": phases })
            )
            .unwrap_or_default()
        );
    } else {
        println!(
            "{} {} v{} (sha256 {})",
            bundle.source,
            bundle.manifest.bundle.name,
            bundle.manifest.bundle.version,
            bundle.digest
        );
        for p in &phases {
            println!(
                "\nphase {} (world {}, sha256 {})",
                p["name"].as_str().unwrap_or_default(),
                p["world"].as_str().unwrap_or_default(),
                p["sha256"].as_str().unwrap_or_default()
            );
            println!("  imports:");
            for i in p["imports"].as_array().into_iter().flatten() {
                println!("    {}", i.as_str().unwrap_or_default());
            }
            let grants = toml::to_string(&p["grants"]).unwrap_or_default();
            println!("  grants:");
            for line in grants.lines() {
                println!("    {line}");
            }
        }
    }
    Ok(())
}

fn version(common: &Common) -> Result<(), Failure> {
    let bundle = load_bundle(common)?;
    let v = json!({
        "nodeward": env!("CARGO_PKG_VERSION"),
        "wasmtime": "48.0.8",
        "wit": crate::WIT_PACKAGE,
        "bundle": bundle_json(&bundle),
    });
    if common.output == Format::Json {
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
    } else {
        println!(
            "nodeward {} (wasmtime 48.0.8, WIT {}, {} {} v{} sha256 {})",
            env!("CARGO_PKG_VERSION"),
            crate::WIT_PACKAGE,
            bundle.source,
            bundle.manifest.bundle.name,
            bundle.manifest.bundle.version,
            bundle.digest
        );
    }
    Ok(())
}
