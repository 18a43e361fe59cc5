//! The `nodeward` command line.
//!
//! Exit codes: 0 success; 1 the run failed (a phase failed or was refused, a bundle or
//! component was refused); 2 usage or configuration error (bad flags, an unreadable or invalid
//! node config, an unknown `--phase`).
//!
//! Which bundle runs: `--bundle PATH` when given, else the installed current bundle
//! (`phases install`), else the one embedded in the binary; every command says which.

use crate::audit::Redactor;
use crate::bundle::diff::{self, BundleDiff};
use crate::bundle::signature::{self, TrustedKeys};
use crate::bundle::store::{self, Store};
use crate::bundle::{self as bundles, Bundle, BundleFiles};
use crate::hostpath::{HostPath, HostRoot};
use crate::node::pipeline::{Node, NodeError, Report, Step, Waits};
use crate::plan::{Change, RunMode};
use crate::runtime::{Limits, Runtime};
use crate::session::{self, PhaseOutcome, RunError, Session};
use clap::{Args, Parser, Subcommand, ValueEnum};
use nodeward_node_config::input::PhaseInput;
use nodeward_node_config::layout::Layout;
use serde_json::json;
use std::io::{IsTerminal, Write as _};
use std::path::{Path, PathBuf};
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
    #[arg(long, global = true, env = "NODEWARD_UNIT_DIR", default_value = crate::session::DEFAULT_UNIT_DIR)]
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
            "root": session.root.path(),
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

fn phases_list(common: &Common) -> Result<(), Failure> {
    let bundle = load_bundle(common, false)?;
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

/// The signature status of an explicitly named bundle, for auditors: never refuses.
fn signature_status(common: &Common, files: &BundleFiles) -> serde_json::Value {
    let keys = match trusted_keys(common) {
        Ok(k) => k,
        Err(f) => return json!({ "verified": false, "problem": f.message }),
    };
    match bundles::verify_files(files, &keys) {
        Ok(b) => json!({ "verified": true, "key-id": b.signed_by }),
        Err(e) => json!({ "verified": false, "problem": e.to_string() }),
    }
}

fn phases_inspect(common: &Common, path: Option<&Path>) -> Result<(), Failure> {
    let (bundle, sig) = match path.or(common.bundle.as_deref()) {
        Some(p) => {
            let files = BundleFiles::open(p).map_err(failed)?;
            let bundle = Bundle::from_files(&files).map_err(failed)?;
            (bundle, signature_status(common, &files))
        }
        None => {
            let b = effective_bundle(common)?;
            let s = match &b.source {
                bundles::BundleSource::Embedded => json!({ "verified": true, "embedded": true }),
                _ => json!({ "verified": true, "at": "install" }),
            };
            (b, s)
        }
    };
    let mut phases = Vec::new();
    for p in &bundle.manifest.phases {
        let imports = diff::component_imports(bundle.component(&p.name).unwrap_or_default())
            .map_err(|e| {
                failed(format!(
                    "{}: phase {}: {}: {e}",
                    bundle.source, p.name, p.component
                ))
            })?;
        let beyond = crate::runtime::check_imports(&p.name, &p.world, &imports).err();
        phases.push(json!({
            "name": p.name,
            "world": p.world,
            "component": p.component,
            "sha256": p.sha256,
            "imports": imports,
            "capabilities": diff::capabilities(&imports),
            "within-world": beyond.is_none(),
            "problem": beyond.map(|e| e.to_string()),
            "grants": p.grants,
        }));
    }
    if common.output == Format::Json {
        print_json(&json!({ "bundle": bundle_json(&bundle), "signature": sig, "phases": phases }));
    } else {
        println!("{} {}", bundle.source, bundle.id_text());
        println!("signature: {sig}");
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
            if let Some(problem) = p["problem"].as_str() {
                println!("  REFUSED: {problem}");
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
    let bundle = load_bundle(common, false)?;
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

/// Resolves a bundle argument of `phases diff`: `@current` is the bundle that runs now.
fn diff_operand(common: &Common, path: &Path) -> Result<Bundle, Failure> {
    if path.as_os_str() == "@current" {
        return effective_bundle(common);
    }
    let files = BundleFiles::open(path).map_err(failed)?;
    Bundle::from_files(&files).map_err(failed)
}

fn phases_pack(dir: &Path, out: &Path) -> Result<(), Failure> {
    let manifest_path = dir.join(bundles::MANIFEST_FILE);
    let text = std::fs::read_to_string(&manifest_path)
        .map_err(|e| failed(format!("{}: {e}", manifest_path.display())))?;
    let mut table: toml::Table = text
        .parse()
        .map_err(|e| failed(format!("{}: {e}", manifest_path.display())))?;
    let mut files: Vec<(String, Vec<u8>)> = Vec::new();
    let phases = table
        .get_mut("phases")
        .and_then(toml::Value::as_array_mut)
        .ok_or_else(|| failed(format!("{}: no [[phases]]", manifest_path.display())))?;
    for (i, entry) in phases.iter_mut().enumerate() {
        let t = entry.as_table_mut().ok_or_else(|| {
            failed(format!(
                "{}: phases[{i}] is not a table",
                manifest_path.display()
            ))
        })?;
        let component = t
            .get("component")
            .and_then(toml::Value::as_str)
            .filter(|c| !c.is_empty() && !c.contains('/') && !c.starts_with('.'))
            .ok_or_else(|| {
                failed(format!(
                    "{}: phases[{i}].component must be a plain file name",
                    manifest_path.display()
                ))
            })?
            .to_string();
        let path = dir.join(&component);
        let bytes = std::fs::read(&path).map_err(|e| failed(format!("{}: {e}", path.display())))?;
        t.insert(
            "sha256".into(),
            toml::Value::String(bundles::sha256_hex(&bytes)),
        );
        files.push((component, bytes));
    }
    let manifest = toml::to_string(&table).map_err(failed)?.into_bytes();
    // Check the result exactly as the agent will, before writing anything.
    Bundle::from_parts(
        &manifest,
        bundles::BundleSource::Dir(dir.to_path_buf()),
        |f| {
            files
                .iter()
                .find(|(n, _)| n == f)
                .map(|(_, b)| b.clone())
                .ok_or_else(|| "not listed".to_string())
        },
    )
    .map_err(failed)?;
    let mut all: Vec<(&str, &[u8])> = vec![(bundles::MANIFEST_FILE, &manifest)];
    all.extend(files.iter().map(|(n, b)| (n.as_str(), b.as_slice())));
    if bundles::archive::is_archive_name(out) {
        bundles::archive::write(out, &all).map_err(failed)?;
    } else {
        if out.exists() {
            return Err(failed(format!("{}: already exists", out.display())));
        }
        std::fs::create_dir_all(out).map_err(|e| failed(format!("{}: {e}", out.display())))?;
        for (name, bytes) in &all {
            let p = out.join(name);
            std::fs::write(&p, bytes).map_err(|e| failed(format!("{}: {e}", p.display())))?;
        }
    }
    println!(
        "packed {} phase(s) into {} (manifest sha256 {}); sign it next",
        files.len(),
        out.display(),
        bundles::sha256_hex(&manifest)
    );
    Ok(())
}

fn phases_sign(path: &Path, key: &Path, password_file: Option<&Path>) -> Result<(), Failure> {
    let files = BundleFiles::open(path).map_err(failed)?;
    // Parse and digest-check first: never sign a manifest the agent would refuse.
    let bundle = Bundle::from_files(&files).map_err(failed)?;
    let password = match password_file {
        Some(p) => Some(
            std::fs::read_to_string(p)
                .map_err(|e| failed(format!("{}: {e}", p.display())))?
                .trim_end_matches(['\n', '\r'])
                .to_string(),
        ),
        None => None,
    };
    let meta = &bundle.manifest.bundle;
    let sig = signature::sign(&files.manifest, key, password, &meta.name, meta.version)
        .map_err(failed)?;
    if path.is_dir() {
        let p = path.join(bundles::SIGNATURE_FILE);
        std::fs::write(&p, &sig).map_err(|e| failed(format!("{}: {e}", p.display())))?;
    } else {
        let mut all: Vec<(&str, &[u8])> = vec![
            (bundles::MANIFEST_FILE, &files.manifest),
            (bundles::SIGNATURE_FILE, sig.as_bytes()),
        ];
        let mut comps = Vec::new();
        for p in &bundle.manifest.phases {
            comps.push((
                p.component.as_str(),
                bundle.component(&p.name).unwrap_or_default(),
            ));
        }
        all.extend(comps);
        bundles::archive::write(path, &all).map_err(failed)?;
    }
    println!(
        "signed {} ({}) with {}",
        path.display(),
        bundle.id_text(),
        key.display()
    );
    Ok(())
}

fn phases_verify(common: &Common, path: &Path) -> Result<(), Failure> {
    let keys = trusted_keys(common)?;
    let (bundle, _) = bundles::open_verified(path, &keys).map_err(failed)?;
    if common.output == Format::Json {
        print_json(&json!({ "verified": true, "bundle": bundle_json(&bundle) }));
    } else {
        println!(
            "{}: {} verified: signed by trusted key {}, every component digest matches",
            path.display(),
            bundle.id_text(),
            bundle.signed_by.as_deref().unwrap_or_default()
        );
    }
    Ok(())
}

/// Asks on the terminal whether to accept wider grants.
fn confirm_on_terminal() -> bool {
    eprint!("Accept the wider authority? [y/N] ");
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    std::io::stdin().read_line(&mut answer).is_ok() && matches!(answer.trim(), "y" | "Y" | "yes")
}

fn phases_install(
    common: &Common,
    path: &Path,
    allow_downgrade: bool,
    accept_new_grants: bool,
) -> Result<(), Failure> {
    let keys = trusted_keys(common)?;
    let (bundle, files) = bundles::open_verified(path, &keys).map_err(failed)?;
    let store = Store::new(&state_dir(common));
    let _lock = store.lock().map_err(failed)?;
    let current = store.current().map_err(|e| {
        failed(format!(
            "{e} (the installed current bundle is unusable; `nodeward phases rollback` returns to last-good)"
        ))
    })?;
    if current.as_ref().is_some_and(|c| c.digest == bundle.digest) {
        println!("{} is already current", bundle.id_text());
        return Ok(());
    }
    if let Some(c) = &current {
        let (old, new) = (c.manifest.bundle.version, bundle.manifest.bundle.version);
        if new <= old && !allow_downgrade {
            return Err(failed(format!(
                "{}: version {new} is not higher than the current bundle's ({}); pass --allow-downgrade to install it anyway",
                files.source,
                c.id_text()
            )));
        }
    }
    // Escalation is judged against what runs now: the installed bundle, else the embedded one.
    let baseline = match current {
        Some(c) => c,
        None => Bundle::embedded().map_err(failed)?,
    };
    let d: BundleDiff = diff::diff(&baseline, &bundle).map_err(failed)?;
    if d.widens() {
        eprintln!(
            "{} may do more than the current bundle:\n{}",
            bundle.id_text(),
            d.to_text()
        );
        if !accept_new_grants {
            let accepted = std::io::stdin().is_terminal() && confirm_on_terminal();
            if !accepted {
                return Err(failed(format!(
                    "{}: its capabilities or grants are wider than the current bundle's (above); pass --accept-new-grants to install it",
                    files.source
                )));
            }
        }
    }
    // Precompile every component (this also refuses imports beyond a phase's world) before
    // anything of the store changes.
    let runtime = runtime(common)?;
    for p in &bundle.manifest.phases {
        runtime
            .load(
                &p.name,
                &p.world,
                bundle.component(&p.name).unwrap_or_default(),
                &p.sha256,
            )
            .map_err(|e| failed(format!("{}: {e}", files.source)))?;
    }
    store::abort_point("install:after-precompile");
    store.stage(&bundle, &files).map_err(failed)?;
    store::abort_point("install:after-stage");
    let previous = store.switch(&bundle.digest).map_err(failed)?;
    store.prune().map_err(failed)?;
    if common.output == Format::Json {
        print_json(&json!({
            "installed": bundle_json(&bundle),
            "last-good": previous,
            "widened": d.widens(),
        }));
    } else {
        println!(
            "installed {} as current (signed by {}); last-good: {}",
            bundle.id_text(),
            bundle.signed_by.as_deref().unwrap_or_default(),
            previous.as_deref().unwrap_or("none (the embedded bundle)")
        );
    }
    Ok(())
}

fn phases_rollback(common: &Common) -> Result<(), Failure> {
    let store = Store::new(&state_dir(common));
    let _lock = store.lock().map_err(failed)?;
    let target = store.last_good().map_err(failed)?.ok_or_else(|| {
        failed(format!(
            "{}: there is no last-good bundle to roll back to",
            store.dir().display()
        ))
    })?;
    let from = store.link(store::CURRENT).map_err(failed)?;
    // The target is about to run: make sure its components compile and stay in their worlds.
    let runtime = runtime(common)?;
    for p in &target.manifest.phases {
        runtime
            .load(
                &p.name,
                &p.world,
                target.component(&p.name).unwrap_or_default(),
                &p.sha256,
            )
            .map_err(|e| failed(format!("{}: {e}", target.source)))?;
    }
    store
        .set_link(store::CURRENT, &target.digest)
        .map_err(failed)?;
    store.remove_link(store::LAST_GOOD).map_err(failed)?;
    if common.output == Format::Json {
        print_json(&json!({ "current": bundle_json(&target), "rolled-back-from": from }));
    } else {
        println!(
            "rolled back to {} (from {})",
            target.id_text(),
            from.as_deref().unwrap_or("none")
        );
    }
    Ok(())
}

fn phases_diff(common: &Common, old: &Path, new: &Path) -> Result<(), Failure> {
    let old = diff_operand(common, old)?;
    let new = diff_operand(common, new)?;
    let d = diff::diff(&old, &new).map_err(failed)?;
    if common.output == Format::Json {
        print_json(&d.to_json());
    } else {
        print!("{}", d.to_text());
    }
    Ok(())
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
) -> Result<Arc<Session>, Failure> {
    let mut session = Session::new(root, mode, Redactor::new(config.secrets()));
    session.secrets = crate::secrets::Secrets::from_config(config);
    session.unit_dir = HostPath::parse(&common.unit_dir).map_err(usage)?;
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

/// A none-mode operation.
#[derive(Clone, Copy, Debug)]
enum NodeOp {
    Bootstrap { force: bool },
    Upgrade,
    Reset,
}

fn check_mode(common: &Common, config: &nodeward_node_config::NodeConfig) -> Result<(), Failure> {
    let mode = match common.mode {
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

fn print_step(step: &Step, session: &Session, printed: &mut usize) {
    let kind = if step.phase { "phase" } else { "step" };
    println!(
        "{kind} {}: {} ({} ms)",
        step.name,
        session.redactor.redact(&step.summary),
        step.duration_ms
    );
    let changes = session.changes();
    for change in &changes[(*printed).min(changes.len())..] {
        print_change(change, &session.redactor);
    }
    *printed = changes.len();
}

/// bootstrap, upgrade, reset, and plan (of a bootstrap).
fn node_op(common: &Common, mode: RunMode, op: NodeOp) -> Result<(), Failure> {
    let config = crate::config::load(common.config.as_deref()).map_err(usage)?;
    check_mode(common, &config)?;
    let config_source = config_source(common);
    let bundle = load_bundle(common, mode == RunMode::Apply)?;
    let root = HostRoot::open(&common.root).map_err(usage)?;
    let runtime = runtime(common)?;
    let limits = limits(common);
    let waits = common
        .wait_timeout
        .map(|s| Waits::all(Duration::from_secs(s)))
        .unwrap_or_default();
    let layout = layout(common, &root);
    let text = common.output == Format::Text;
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
    let session = session(common, root, mode, &config)?;
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
            "root": session.root.path(),
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

fn node_status(common: &Common) -> Result<(), Failure> {
    let root = HostRoot::open(&common.root).map_err(usage)?;
    let layout = layout(common, &root);
    let session = Session::new(root, RunMode::Plan, Redactor::default());
    let status = crate::node::status::read(std::path::Path::new(&layout.root), &session);
    if common.output == Format::Json {
        print_json(&serde_json::to_value(&status).unwrap_or_default());
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
