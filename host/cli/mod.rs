//! The `nodeward` command line: it parses, calls the library and prints; the policy it
//! applies lives in [`bundle`](crate::bundle) and [`node`](crate::node).
//!
//! Exit codes: 0 success; 1 the run failed (a phase failed or was refused, a bundle or
//! component was refused); 2 usage or configuration error (bad flags, a flag the command does
//! not take, a limit out of range, an invalid log filter, an unreadable or invalid node config,
//! an unknown `--phase`). `phases install` tells more apart: 3 not fetched, 4 refused, 5 wider
//! grants not accepted ([`install`]); `daemon` exits 69 when it steps aside.
//!
//! Which bundle runs: `--bundle PATH` when given, else the installed current bundle
//! (`phases install`), else the one embedded in the binary; every command says which
//! ([`bundle::select`](crate::bundle::select)).
//!
//! `args` holds the commands and `flags` the flag groups each takes; `logging` sets up stderr;
//! `output` the printing shared by the commands, `json` the typed shapes of `--output json`
//! (one schema each under `docs/schemas/`), `phases` the bundle commands (and single-phase
//! `plan`/`apply`), `install` `phases install` (its sources, consent and exit codes), `node`
//! the none-mode ones, `preflight` the host checks, `config` the node config ones, `help` help, completions and man pages,
//! `audit` the audit trail (opening it for a run, and the `audit` commands); this module
//! parsing, dispatch and what the commands share.

use crate::audit::Redactor;
use crate::bundle::Bundle;
use crate::bundle::select::{self, SelectError};
use crate::bundle::signature::{KeysError, TrustedKeys};
use crate::bundle::store::Store;
use crate::caps::RunContext;
use crate::hostpath::{HostPath, HostRoot};
use crate::plan::RunMode;
use crate::runtime::Runtime;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

mod args;
mod audit;
mod config;
mod daemon;
mod flags;
mod help;
mod install;
mod json;
mod logging;
mod node;
mod offline;
mod output;
mod phases;
mod preflight;

use crate::bundle::install::Direction;
pub use args::Cli;
use args::{Command, ConfigCommand, PhasesCommand};
use flags::{BundleArgs, HostArgs, KeyArgs, RunArgs, StateArgs};
pub use flags::{Format, ModeArg};
pub use logging::{FilterError, Logging};

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

/// The whole program: parse (a usage error exits 2, help and version 0), set up logging, run.
pub fn main() -> ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let cli = match Cli::try_parse_args(&args) {
        Ok(cli) => cli,
        Err(e) => return parse_failure(&e, &args),
    };
    let logging = match Logging::from_args(&cli.log, cli.command.default_log_level()) {
        Ok(l) => l,
        Err(e) => {
            let json = cli.log.log_format == Format::Json;
            return report(&Logging::for_errors(json), usage(e));
        }
    };
    logging.init();
    cli.run(&logging)
}

/// Prints a clap error (or help) and returns its exit code; under `--log-format json` a
/// usage error is a JSON log line like every other.
fn parse_failure(e: &clap::Error, args: &[std::ffi::OsString]) -> ExitCode {
    let wants_json = args
        .windows(2)
        .any(|w| w[0] == "--log-format" && w[1] == "json")
        || args.iter().any(|a| a == "--log-format=json");
    if !e.use_stderr() || !wants_json {
        // Help and version on stdout (0); errors rendered by clap (2).
        let _ = e.print();
        return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2));
    }
    let rendered = e.render().to_string();
    let message = rendered
        .split("\n\n")
        .next()
        .unwrap_or_default()
        .trim()
        .trim_start_matches("error: ")
        .to_string();
    report(&Logging::for_errors(true), usage(message))
}

/// Prints `failure` as the final error line; its exit code.
fn report(logging: &Logging, failure: Failure) -> ExitCode {
    logging.print_error(failure.code, &failure.message);
    ExitCode::from(failure.code)
}

impl Cli {
    /// Parses `args` (the program name first), then applies a leading `--root`/`--state-dir`
    /// to the command that follows; a leading flag the command does not take is a usage error.
    pub fn try_parse_args(args: &[std::ffi::OsString]) -> Result<Cli, clap::Error> {
        use clap::{CommandFactory as _, FromArgMatches as _};
        let mut command = Cli::command();
        let matches = command.try_get_matches_from_mut(args)?;
        let mut cli = Cli::from_arg_matches(&matches)?;
        let mut leaf = &matches;
        let mut name = String::from("nodeward");
        while let Some((sub, m)) = leaf.subcommand() {
            name = format!("{name} {sub}");
            leaf = m;
        }
        let explicit =
            |id: &str| leaf.value_source(id) == Some(clap::parser::ValueSource::CommandLine);
        let mut not_taken = None;
        if let Some(root) = cli.leading.root.take() {
            match cli.command.root_mut() {
                Some(dir) if !explicit("root") => *dir = root,
                Some(_) => {}
                None => not_taken = Some("--root"),
            }
        }
        if let Some(dir) = cli.leading.state_dir.take() {
            match cli.command.state_mut() {
                Some(state) if !explicit("state_dir") => state.state_dir = Some(dir),
                Some(_) => {}
                None => not_taken = Some("--state-dir"),
            }
        }
        if let Some(flag) = not_taken {
            return Err(command.error(
                clap::error::ErrorKind::UnknownArgument,
                format!("{flag} does not apply to `{name}` (see `{name} --help`)"),
            ));
        }
        Ok(cli)
    }

    /// Runs the command, printing its output and, on failure, its error; the exit code.
    pub fn run(self, logging: &Logging) -> ExitCode {
        let json_output = self.command.output().is_some_and(|o| !o.text());
        match self.dispatch() {
            Ok(()) => ExitCode::SUCCESS,
            // The report's error shape when the logs are text (a contract of --output json,
            // docs/schemas/error.schema.json); a JSON log line when the logs are JSON.
            Err(f) if json_output && !logging.json() => {
                let error = json::ErrorOutput {
                    error: &f.message,
                    exit_code: f.code,
                };
                match serde_json::to_string(&error) {
                    Ok(line) => eprintln!("{line}"),
                    Err(_) => eprintln!("error: {}", f.message),
                }
                ExitCode::from(f.code)
            }
            Err(f) => report(logging, f),
        }
    }

    fn dispatch(self) -> Result<(), Failure> {
        match self.command {
            Command::Plan(a) if a.phases.is_empty() => node::op(
                &a.run,
                a.mode,
                Default::default(),
                RunMode::Plan,
                node::NodeOp::Bootstrap {
                    force: false,
                    ignore: &[],
                },
                None,
            ),
            Command::Plan(a) => phases::run(&a.run, &a.phases, RunMode::Plan, None),
            Command::Apply(a) if a.phases.is_empty() => Err(usage(
                "apply runs single phases (--phase NAME); `nodeward bootstrap` makes a node",
            )),
            Command::Apply(a) => phases::run(
                &a.run,
                &a.phases,
                RunMode::Apply,
                a.offline.offline.as_deref(),
            ),
            Command::Bootstrap(a) => node::op(
                &a.run,
                a.mode,
                a.waits.waits(),
                RunMode::Apply,
                node::NodeOp::Bootstrap {
                    force: a.force,
                    ignore: &a.preflight.ignore_preflight_errors,
                },
                a.offline.offline.as_deref(),
            ),
            Command::Upgrade(a) => node::op(
                &a.run,
                a.mode,
                a.waits.waits(),
                RunMode::Apply,
                node::NodeOp::Upgrade {
                    ignore: &a.preflight.ignore_preflight_errors,
                },
                a.offline.offline.as_deref(),
            ),
            Command::Reset(a) => node::op(
                &a.run,
                a.mode,
                Default::default(),
                RunMode::Apply,
                node::NodeOp::Reset,
                None,
            ),
            Command::Restart(a) => node::op(
                &a.run,
                None,
                a.waits.waits(),
                RunMode::Apply,
                node::NodeOp::Restart { rerun: &a.phases },
                None,
            ),
            Command::Recover(a) => node::op(
                &a.run,
                None,
                Default::default(),
                RunMode::Apply,
                node::NodeOp::Recover,
                None,
            ),
            Command::Daemon(a) => daemon::run(&a),
            Command::Status(a) => node::status(&a.host, &a.output),
            Command::Preflight(a) => preflight::run(&a),
            Command::Phases(PhasesCommand::List(a)) => {
                phases::list(&a.root.dir, &a.state, &a.bundle, &a.output)
            }
            Command::Phases(PhasesCommand::Inspect {
                path,
                root,
                state,
                bundle,
                output,
            }) => phases::inspect(&root.dir, &state, &bundle, &output, path.as_deref()),
            Command::Phases(PhasesCommand::Pack { dir, out, output }) => {
                phases::pack(&output, &dir, &out)
            }
            Command::Phases(PhasesCommand::Export { dir }) => phases::export(&dir),
            Command::Phases(PhasesCommand::Sign {
                bundle,
                key,
                password_file,
                output,
            }) => phases::sign(&output, &bundle, &key, password_file.as_deref()),
            Command::Phases(PhasesCommand::Verify {
                bundle,
                root,
                keys,
                output,
            }) => phases::verify(&root.dir, &keys, &output, &bundle),
            Command::Phases(PhasesCommand::Install(a)) => install::install(&a),
            Command::Phases(PhasesCommand::Rollback {
                expect,
                root,
                state,
                audit,
                output,
            }) => phases::move_bundle(
                audit::StoreTrail {
                    root: &root.dir,
                    audit: &audit,
                },
                &state,
                &output,
                Direction::Back,
                expect.as_deref(),
            ),
            Command::Phases(PhasesCommand::Rollforward {
                root,
                state,
                audit,
                output,
            }) => phases::move_bundle(
                audit::StoreTrail {
                    root: &root.dir,
                    audit: &audit,
                },
                &state,
                &output,
                Direction::Forward,
                None,
            ),
            Command::Phases(PhasesCommand::History {
                root,
                state,
                output,
            }) => phases::history(&root.dir, &state, &output),
            Command::Phases(PhasesCommand::Uninstall {
                root,
                state,
                audit,
                output,
            }) => phases::uninstall(
                audit::StoreTrail {
                    root: &root.dir,
                    audit: &audit,
                },
                &state,
                &output,
            ),
            Command::Phases(PhasesCommand::Diff {
                old,
                new,
                root,
                state,
                output,
            }) => phases::diff(&root.dir, &state, &output, &old, &new),
            Command::Audit(a) => a.run(),
            Command::Offline(c) => offline::run(&c),
            Command::Config(ConfigCommand::PrintDefaults) => config::print_defaults(),
            Command::Config(ConfigCommand::Validate { file }) => config::validate(&file),
            Command::Version(a) => phases::version(&a.root.dir, &a.state, &a.bundle, &a.output),
            Command::Unit => daemon::print_unit(),
            Command::Completions { shell } => help::completions(shell),
            Command::Man { command } => help::man(&command),
            Command::Help { command } => help::help(&command),
        }
    }
}

/// The bundle store in the agent state directory beneath `root` (or `--state-dir`).
fn bundle_store(root: &Path, state: &StateArgs) -> Store {
    Store::new(&state.dir(root))
}

/// The trusted keys: `--trusted-key` files, else the keys directory beneath `root` (or
/// `--trusted-keys-dir`).
fn load_keys(root: &Path, keys: &KeyArgs) -> Result<TrustedKeys, KeysError> {
    TrustedKeys::load(&keys.trusted_keys, &keys.dir(root))
}

fn trusted_keys(root: &Path, keys: &KeyArgs) -> Result<TrustedKeys, Failure> {
    load_keys(root, keys).map_err(usage)
}

/// A bundle that could not be selected: the trusted keys are configuration (exit 2), the
/// rest a refused bundle (exit 1).
fn select_failure(e: SelectError) -> Failure {
    match e {
        SelectError::Keys(e) => usage(e),
        e => failed(e),
    }
}

/// What `plan`/`apply` run, and what `phases list|inspect` and `version` show: the installed
/// current bundle, else the embedded one.
fn effective_bundle(root: &Path, state: &StateArgs) -> Result<Bundle, Failure> {
    select::effective(&bundle_store(root, state)).map_err(select_failure)
}

/// The bundle a command in `mode` runs: `--bundle` (an unsigned one with a loud warning;
/// applied only with `allow_unsigned`), else [`effective_bundle`].
fn load_bundle(
    root: &Path,
    state: &StateArgs,
    bundle: &BundleArgs,
    mode: RunMode,
    allow_unsigned: bool,
) -> Result<Bundle, Failure> {
    let Some(path) = &bundle.bundle else {
        return effective_bundle(root, state);
    };
    select::explicit(
        path,
        mode,
        allow_unsigned,
        || load_keys(root, &bundle.keys),
        |source| {
            eprintln!(
                "WARNING: {source} is UNSIGNED: its signature was not checked; `phases install` would refuse it"
            )
        },
    )
    .map_err(select_failure)
}

/// The bundle a run of phases uses.
fn run_bundle(run: &RunArgs, mode: RunMode) -> Result<Bundle, Failure> {
    load_bundle(
        &run.host.root,
        &run.state,
        &run.bundle,
        mode,
        run.allow_unsigned,
    )
}

/// The runtime, with its compiled cache in the agent state directory beneath `root`.
fn runtime(root: &Path, state: &StateArgs) -> Result<Runtime, Failure> {
    Runtime::new(&state.dir(root).join("compiled")).map_err(failed)
}

/// A plan or apply session over `root` with the unit directory of the flags and the config's
/// secrets to redact. With [`status_session`], the only place the CLI makes one.
///
/// `offline` names the offline archive of a `--offline` run (its downloads send no request).
///
/// HTTPS downloads trust the system store plus the config's `downloadOptions.caFile`, read
/// here: a missing or empty one is a usage (config) error naming it.
///
/// The agent directories and files the run was given (state, audit trail, trusted keys, its
/// config, its unit in the unit directory) are reserved from every phase when they lie beneath
/// the root, at their real locations too ([`crate::reserved`]).
fn session(
    run: &RunArgs,
    root: HostRoot,
    mode: RunMode,
    config: &nodeward_node_config::NodeConfig,
    offline: Option<String>,
) -> Result<Arc<RunContext>, Failure> {
    let host_root = &run.host.root;
    let unit_dir = HostPath::parse(&run.host.unit_dir).map_err(usage)?;
    let mut session = RunContext::new(root, mode, Redactor::new(config.secrets()));
    session.secrets = crate::secrets::Secrets::from_config(config);
    let mut reserved = crate::reserved::Reserved::default()
        .with_dir(host_root, &run.state.dir(host_root))
        .with_dir(host_root, &run.audit.dir(host_root))
        .with_dir(host_root, &run.bundle.keys.dir(host_root))
        .with_unit_dir(&unit_dir);
    let keys = run
        .bundle
        .keys
        .trusted_keys
        .iter()
        .map(std::path::PathBuf::as_path);
    for file in keys.chain(run.config.path()) {
        reserved = reserved.with_dir(host_root, file);
    }
    session.reserved = reserved.resolved_in(host_root);
    session.systemd.unit_dir = unit_dir;
    // `--offline FILE`: its artifacts are in the cache; a miss is refused, never downloaded.
    session.downloads.offline = offline;
    // A config error, like a bad field: the run stops before anything happens.
    session.downloads.trust =
        crate::caps::download::Trust::from_config(session.root(), &config.download_options)
            .map_err(|e| {
                usage(format!(
                    "{}: downloadOptions.caFile {e}",
                    run.config.source()
                ))
            })?;
    Ok(Arc::new(session))
}

/// The read-only session `status` asks systemd through.
fn status_session(root: HostRoot) -> RunContext {
    RunContext::new(root, RunMode::Plan, Redactor::default())
}

/// The layout phases render paths with (see [`crate::node::input::layout`]).
fn layout(host: &HostArgs, root: &HostRoot) -> nodeward_node_config::layout::Layout {
    crate::node::input::layout(root.path(), &host.unit_dir)
}
