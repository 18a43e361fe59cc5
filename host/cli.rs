//! The `nodeward` command line.
//!
//! Exit codes: 0 success; 1 the run failed (a phase failed or was refused, a bundle or
//! component was refused); 2 usage or configuration error (bad flags, an unreadable or invalid
//! node config, an unknown `--phase`).
//!
//! Which bundle runs: `--bundle PATH` when given, else the installed current bundle
//! (`phases install`), else the one embedded in the binary; every command says which.
//!
//! This module holds the arguments, the dispatch and what the commands share; `phases`
//! the bundle commands, `node` the none-mode ones.

use crate::audit::Redactor;
use crate::bundle::diff::{self, BundleDiff};
use crate::bundle::signature::{self, TrustedKeys};
use crate::bundle::store::{self, Store};
use crate::bundle::{self as bundles, Bundle, BundleFiles};
use crate::caps::RunContext;
use crate::hostpath::{HostPath, HostRoot};
use crate::node::pipeline::{Node, NodeError, Report, Step, Waits};
use crate::node::state::NodeLock;
use crate::plan::{Change, RunMode};
use crate::runtime::{Limits, Runtime};
use crate::session::{self, PhaseOutcome, RunError};
use clap::{Args, Parser, Subcommand, ValueEnum};
use nodeward_node_config::input::PhaseInput;
use nodeward_node_config::layout::Layout;
use serde_json::json;
use std::io::{IsTerminal, Write as _};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

mod node;
mod phases;
use node::*;
use phases::*;

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
    /// Phase bundle (directory or archive) to run instead of the installed one. A signed one is
    /// verified; an unsigned one runs only with a warning, and `apply` needs --allow-unsigned.
    #[arg(long, global = true, env = "NODEWARD_BUNDLE")]
    bundle: Option<PathBuf>,
    /// Let `apply --bundle` run an unsigned bundle (development only).
    #[arg(long, global = true)]
    allow_unsigned: bool,
    /// A trusted minisign public key (repeatable); replaces the trusted keys directory.
    #[arg(long = "trusted-key", global = true, value_name = "FILE")]
    trusted_keys: Vec<PathBuf>,
    /// Directory whose `*.pub` files are the trusted keys (when no --trusted-key is given).
    #[arg(
        long,
        global = true,
        env = "NODEWARD_TRUSTED_KEYS_DIR",
        default_value = signature::DEFAULT_TRUSTED_KEYS_DIR
    )]
    trusted_keys_dir: PathBuf,
    /// `plan`/`apply`: run only this phase (repeatable); `plan` without it plans a bootstrap.
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
    /// Memory budget of one phase run, in MiB: all its linear memories and tables together.
    #[arg(long, global = true, default_value_t = 256)]
    memory_limit: usize,
    /// systemd unit directory, relative to --root.
    #[arg(long, global = true, env = "NODEWARD_UNIT_DIR", default_value = crate::caps::systemd::DEFAULT_UNIT_DIR)]
    unit_dir: String,
    /// Longest wait for each health check (kubelet health, TLS bootstrap, Node Ready), seconds;
    /// default 60, 120 and 180.
    #[arg(long, global = true)]
    wait_timeout: Option<u64>,
    /// The node mode; default: the config's `mode`. Only `none` is implemented.
    #[arg(long, global = true, value_enum)]
    mode: Option<ModeArg>,
}

/// `--mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ModeArg {
    /// Host-native: versioned directories, units on the host.
    None,
    /// Blue/green nspawn machines (not implemented yet).
    Nspawn,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Show every host change a bootstrap would make (or the --phase ones), making none.
    Plan,
    /// Run single phases for real (--phase NAME, repeatable); a node is made by `bootstrap`.
    Apply,
    /// Make this host a node (none mode): resumes an unfinished bootstrap at its checkpoint,
    /// repairs a finished one; refuses a different machine or config without --force.
    Bootstrap {
        /// Adopt this config even though the install record names another: an unfinished
        /// bootstrap restarts with it, a finished node is upgraded to it.
        #[arg(long)]
        force: bool,
    },
    /// Upgrade a bootstrapped node to this config (journaled; rolled back on failure).
    Upgrade,
    /// Remove the node: units, configs, version directories, node state; keeps the agent.
    Reset,
    /// Mode, active version, applied config, checkpoint or upgrade in progress, units, health.
    Status,
    /// Build, sign, verify, install, roll back, inspect and diff phase bundles.
    #[command(subcommand)]
    Phases(PhasesCommand),
    /// Print the agent, wasmtime and WIT versions and the embedded bundle's digest.
    Version,
}

#[derive(Debug, Subcommand)]
enum PhasesCommand {
    /// The bundle's phases, in run order.
    List,
    /// Each phase's digest, WIT imports and grants (of BUNDLE, or the bundle that runs).
    Inspect {
        /// Bundle directory or archive; default: --bundle, else the installed, else embedded.
        bundle: Option<PathBuf>,
    },
    /// Builds a bundle from DIR (manifest.toml and components), filling in each sha256.
    Pack {
        /// Directory holding manifest.toml and the component files it names.
        dir: PathBuf,
        /// The bundle to write: an archive if it ends in .tar, .tar.gz or .tgz, else a directory.
        #[arg(short = 'o', long = "output-bundle", value_name = "BUNDLE")]
        out: PathBuf,
    },
    /// Signs BUNDLE's manifest with a minisign secret key (writes manifest.toml.minisig).
    Sign {
        /// Bundle directory or archive.
        bundle: PathBuf,
        /// minisign secret key file.
        #[arg(long)]
        key: PathBuf,
        /// File holding the secret key's password (otherwise asked on a terminal).
        #[arg(long)]
        password_file: Option<PathBuf>,
    },
    /// Checks BUNDLE's signature against the trusted keys, and every digest.
    Verify {
        /// Bundle directory or archive.
        bundle: PathBuf,
    },
    /// Verifies BUNDLE, precompiles it, and makes it current (the old one becomes last-good).
    Install {
        /// Bundle directory or archive.
        bundle: PathBuf,
        /// Allow a version lower than (or equal to) the current one's.
        #[arg(long)]
        allow_downgrade: bool,
        /// Accept grants wider than the current bundle's without asking.
        #[arg(long)]
        accept_new_grants: bool,
    },
    /// Makes the last-good bundle current again.
    Rollback,
    /// What changed from OLD to NEW, per phase: capabilities, grants, digests, phases.
    Diff {
        /// Bundle directory or archive, or `@current` (the bundle that runs now).
        old: PathBuf,
        /// Bundle directory or archive, or `@current`.
        new: PathBuf,
    },
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
            (
                None,
                Command::Apply | Command::Bootstrap { .. } | Command::Upgrade | Command::Reset,
            ) => "info".into(),
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
            Command::Plan if self.common.phases.is_empty() => node_op(
                &self.common,
                RunMode::Plan,
                NodeOp::Bootstrap { force: false },
            ),
            Command::Plan => run_phases(&self.common, RunMode::Plan),
            Command::Apply if self.common.phases.is_empty() => Err(usage(
                "apply runs single phases (--phase NAME); `nodeward bootstrap` makes a node",
            )),
            Command::Apply => run_phases(&self.common, RunMode::Apply),
            Command::Bootstrap { force } => {
                node_op(&self.common, RunMode::Apply, NodeOp::Bootstrap { force })
            }
            Command::Upgrade => node_op(&self.common, RunMode::Apply, NodeOp::Upgrade),
            Command::Reset => node_op(&self.common, RunMode::Apply, NodeOp::Reset),
            Command::Status => node_status(&self.common),
            Command::Phases(PhasesCommand::List) => phases_list(&self.common),
            Command::Phases(PhasesCommand::Inspect { bundle }) => {
                phases_inspect(&self.common, bundle.as_deref())
            }
            Command::Phases(PhasesCommand::Pack { dir, out }) => phases_pack(&dir, &out),
            Command::Phases(PhasesCommand::Sign {
                bundle,
                key,
                password_file,
            }) => phases_sign(&bundle, &key, password_file.as_deref()),
            Command::Phases(PhasesCommand::Verify { bundle }) => {
                phases_verify(&self.common, &bundle)
            }
            Command::Phases(PhasesCommand::Install {
                bundle,
                allow_downgrade,
                accept_new_grants,
            }) => phases_install(&self.common, &bundle, allow_downgrade, accept_new_grants),
            Command::Phases(PhasesCommand::Rollback) => phases_rollback(&self.common),
            Command::Phases(PhasesCommand::Diff { old, new }) => {
                phases_diff(&self.common, &old, &new)
            }
            Command::Version => version(&self.common),
        }
    }
}

fn state_dir(common: &Common) -> PathBuf {
    common
        .state_dir
        .clone()
        .unwrap_or_else(crate::config::default_state_dir)
}

fn trusted_keys(common: &Common) -> Result<TrustedKeys, Failure> {
    TrustedKeys::load(&common.trusted_keys, &common.trusted_keys_dir).map_err(usage)
}

/// What `plan`/`apply` run, and what `phases list|inspect` and `version` show: the installed
/// current bundle, else the embedded one.
fn effective_bundle(common: &Common) -> Result<Bundle, Failure> {
    match Store::new(&state_dir(common)).current().map_err(|e| {
        failed(format!(
            "{e} (the installed current bundle is unusable; `nodeward phases rollback` returns to last-good)"
        ))
    })? {
        Some(b) => Ok(b),
        None => Bundle::embedded().map_err(failed),
    }
}

/// An explicitly named bundle: verified when it is signed (any failure refuses it); when
/// unsigned, run only with a loud warning, and for `apply` only with --allow-unsigned.
fn explicit_bundle(common: &Common, path: &Path, apply: bool) -> Result<Bundle, Failure> {
    let files = BundleFiles::open(path).map_err(failed)?;
    if files.signature.is_some() {
        let keys = trusted_keys(common)?;
        return bundles::verify_files(&files, &keys).map_err(failed);
    }
    if apply && !common.allow_unsigned {
        return Err(failed(format!(
            "{}: unsigned; apply runs only signed bundles (sign and install it, or pass --allow-unsigned for development)",
            files.source
        )));
    }
    eprintln!(
        "WARNING: {} is UNSIGNED: its signature was not checked; `phases install` would refuse it",
        files.source
    );
    Bundle::from_files(&files).map_err(failed)
}

fn load_bundle(common: &Common, apply: bool) -> Result<Bundle, Failure> {
    match &common.bundle {
        Some(path) => explicit_bundle(common, path, apply),
        None => effective_bundle(common),
    }
}

fn runtime(common: &Common) -> Result<Runtime, Failure> {
    Runtime::new(&state_dir(common).join("compiled")).map_err(failed)
}

fn bundle_json(bundle: &Bundle) -> serde_json::Value {
    let mut v = bundle.id_json();
    v["signed-by"] = json!(bundle.signed_by);
    v
}

fn print_json(v: &serde_json::Value) {
    println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
}

/// Prints one change, every line through the redactor (a path, URL or diff could hold a
/// secret however it got there).
fn print_change(change: &Change, redactor: &Redactor) {
    println!("  {}", redactor.redact(&change.kind.describe()));
    if let Some(diff) = change.kind.diff() {
        for line in diff.lines() {
            println!("      {}", redactor.redact(line));
        }
    }
}

/// Prints a JSON report with every string in it through the redactor.
fn print_redacted_json(mut report: serde_json::Value, redactor: &Redactor) {
    redactor.redact_json(&mut report);
    print_json(&report);
}

fn run_phases(common: &Common, mode: RunMode) -> Result<(), Failure> {
    let config = crate::config::load(common.config.as_deref()).map_err(usage)?;
    let bundle = load_bundle(common, mode == RunMode::Apply)?;
    let root = HostRoot::open(&common.root).map_err(usage)?;
    let runtime = runtime(common)?;
    let limits = limits(common);
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
    let layout = layout(common, &root);
    let session = session(common, root, mode, &config)?;
    let mut printed = 0;
    let arch = crate::node::version::arch();
    let artifacts = crate::node::version::artifacts(&config, arch);
    if mode == RunMode::Apply && common.phases.iter().any(|p| p == "download-artifacts") {
        crate::node::version::require_pinned(&artifacts, &config_source(common)).map_err(failed)?;
    }
    let input = PhaseInput {
        layout,
        version: crate::node::version::version_name(&config, arch, &artifacts),
        arch: arch.to_string(),
        artifacts,
        ..PhaseInput::new(config.clone())
    };
    // apply writes where bootstrap does: under the node lock, after the sweep.
    let _lock = match mode {
        RunMode::Apply => Some(apply_lock(&session, &runtime)?),
        RunMode::Plan => None,
    };
    let result = session::run(
        &runtime,
        &bundle,
        &session,
        &input,
        &common.phases,
        limits,
        |outcome: &PhaseOutcome| {
            if text {
                let summary = session.redactor.redact(&outcome.report.summary);
                println!("phase {}: {summary}", outcome.name);
                let changes = session.changes();
                for change in &changes[printed..] {
                    print_change(change, &session.redactor);
                }
                printed = changes.len();
            }
        },
    );
    let changes = session.changes();
    let (phases, error) = match result {
        Ok(phases) => (phases, None),
        Err(RunError::UnknownPhase(p)) => return Err(usage(RunError::UnknownPhase(p))),
        Err(e) => (Vec::new(), Some(session.redactor.redact(&e.to_string()))),
    };
    if text {
        for change in &changes[printed..] {
            print_change(change, &session.redactor);
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
            "root": session.root().path(),
            "bundle": bundle_json(&bundle),
            "phases": phases,
            "changes": changes,
            "error": error,
        });
        print_redacted_json(report, &session.redactor);
    }
    match error {
        Some(e) => Err(failed(e)),
        None => Ok(()),
    }
}

/// The node lock an `apply` holds, taken before it writes, and the sweep of what a killed run
/// left ([`crate::node::sweep`]).
fn apply_lock(session: &RunContext, runtime: &Runtime) -> Result<NodeLock, Failure> {
    let lock = NodeLock::acquire(session.root().path()).map_err(failed)?;
    crate::node::sweep::sweep(session, runtime).map_err(failed)?;
    Ok(lock)
}

/// Per-phase limits from the flags.
fn limits(common: &Common) -> Limits {
    Limits {
        deadline: Duration::from_secs(common.phase_timeout),
        memory: common.memory_limit << 20,
    }
}

/// A plan or apply session over `root` with the unit directory of the flags and the config's
/// secrets to redact.
fn session(
    common: &Common,
    root: HostRoot,
    mode: RunMode,
    config: &nodeward_node_config::NodeConfig,
) -> Result<Arc<RunContext>, Failure> {
    let mut session = RunContext::new(root, mode, Redactor::new(config.secrets()));
    session.secrets = crate::secrets::Secrets::from_config(config);
    session.systemd.unit_dir = HostPath::parse(&common.unit_dir).map_err(usage)?;
    Ok(Arc::new(session))
}

/// How errors name the node config: its path, or the embedded example.
fn config_source(common: &Common) -> String {
    common
        .config
        .as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "the embedded example config".into())
}

/// The layout phases render paths with: the root as an absolute path, and the unit directory.
fn layout(common: &Common, root: &HostRoot) -> Layout {
    let abs = std::fs::canonicalize(root.path()).unwrap_or_else(|_| root.path().to_path_buf());
    Layout {
        root: abs.display().to_string(),
        unit_dir: common.unit_dir.trim_matches('/').to_string(),
    }
}
