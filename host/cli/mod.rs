//! The `nodeward` command line: it parses, calls the library and prints; the policy it
//! applies lives in [`bundle`](crate::bundle) and [`node`](crate::node).
//!
//! Exit codes: 0 success; 1 the run failed (a phase failed or was refused, a bundle or
//! component was refused); 2 usage or configuration error (bad flags, an unreadable or invalid
//! node config, an unknown `--phase`).
//!
//! Which bundle runs: `--bundle PATH` when given, else the installed current bundle
//! (`phases install`), else the one embedded in the binary; every command says which
//! ([`bundle::select`](crate::bundle::select)).
//!
//! `args` holds the arguments, `output` the printing shared by the commands, `phases` the
//! bundle commands (and single-phase `plan`/`apply`), `node` the none-mode ones; this module
//! the dispatch and what the commands share.

use crate::audit::Redactor;
use crate::bundle::Bundle;
use crate::bundle::select::{self, SelectError};
use crate::bundle::signature::{KeysError, TrustedKeys};
use crate::bundle::store::Store;
use crate::caps::RunContext;
use crate::hostpath::{HostPath, HostRoot};
use crate::plan::RunMode;
use crate::runtime::{Limits, Runtime};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

mod args;
mod node;
mod output;
mod phases;

pub use args::{Cli, Common, Format, ModeArg};
use args::{Command, PhasesCommand};

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
            Command::Plan if self.common.phases.is_empty() => node::op(
                &self.common,
                RunMode::Plan,
                node::NodeOp::Bootstrap { force: false },
            ),
            Command::Plan => phases::run(&self.common, RunMode::Plan),
            Command::Apply if self.common.phases.is_empty() => Err(usage(
                "apply runs single phases (--phase NAME); `nodeward bootstrap` makes a node",
            )),
            Command::Apply => phases::run(&self.common, RunMode::Apply),
            Command::Bootstrap { force } => node::op(
                &self.common,
                RunMode::Apply,
                node::NodeOp::Bootstrap { force },
            ),
            Command::Upgrade => node::op(&self.common, RunMode::Apply, node::NodeOp::Upgrade),
            Command::Reset => node::op(&self.common, RunMode::Apply, node::NodeOp::Reset),
            Command::Status => node::status(&self.common),
            Command::Phases(PhasesCommand::List) => phases::list(&self.common),
            Command::Phases(PhasesCommand::Inspect { bundle }) => {
                phases::inspect(&self.common, bundle.as_deref())
            }
            Command::Phases(PhasesCommand::Pack { dir, out }) => phases::pack(&dir, &out),
            Command::Phases(PhasesCommand::Sign {
                bundle,
                key,
                password_file,
            }) => phases::sign(&bundle, &key, password_file.as_deref()),
            Command::Phases(PhasesCommand::Verify { bundle }) => {
                phases::verify(&self.common, &bundle)
            }
            Command::Phases(PhasesCommand::Install {
                bundle,
                allow_downgrade,
                accept_new_grants,
            }) => phases::install(&self.common, &bundle, allow_downgrade, accept_new_grants),
            Command::Phases(PhasesCommand::Rollback) => phases::rollback(&self.common),
            Command::Phases(PhasesCommand::Diff { old, new }) => {
                phases::diff(&self.common, &old, &new)
            }
            Command::Version => phases::version(&self.common),
        }
    }
}

fn state_dir(common: &Common) -> PathBuf {
    common
        .state_dir
        .clone()
        .unwrap_or_else(crate::config::default_state_dir)
}

fn bundle_store(common: &Common) -> Store {
    Store::new(&state_dir(common))
}

fn load_keys(common: &Common) -> Result<TrustedKeys, KeysError> {
    TrustedKeys::load(&common.trusted_keys, &common.trusted_keys_dir)
}

fn trusted_keys(common: &Common) -> Result<TrustedKeys, Failure> {
    load_keys(common).map_err(usage)
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
fn effective_bundle(common: &Common) -> Result<Bundle, Failure> {
    select::effective(&bundle_store(common)).map_err(select_failure)
}

/// The bundle a command in `mode` runs: `--bundle` (an unsigned one with a loud warning),
/// else [`effective_bundle`].
fn load_bundle(common: &Common, mode: RunMode) -> Result<Bundle, Failure> {
    let Some(path) = &common.bundle else {
        return effective_bundle(common);
    };
    select::explicit(
        path,
        mode,
        common.allow_unsigned,
        || load_keys(common),
        |source| {
            eprintln!(
                "WARNING: {source} is UNSIGNED: its signature was not checked; `phases install` would refuse it"
            )
        },
    )
    .map_err(select_failure)
}

fn runtime(common: &Common) -> Result<Runtime, Failure> {
    Runtime::new(&state_dir(common).join("compiled")).map_err(failed)
}

/// Per-phase limits from the flags.
fn limits(common: &Common) -> Limits {
    Limits {
        deadline: Duration::from_secs(common.phase_timeout),
        memory: common.memory_limit << 20,
    }
}

/// A plan or apply session over `root` with the unit directory of the flags and the config's
/// secrets to redact. With [`status_session`], the only place the CLI makes one.
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

/// The read-only session `status` asks systemd through.
fn status_session(root: HostRoot) -> RunContext {
    RunContext::new(root, RunMode::Plan, Redactor::default())
}

/// How errors name the node config: its path, or the embedded example.
fn config_source(common: &Common) -> String {
    common
        .config
        .as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "the embedded example config".into())
}

/// The layout phases render paths with (see [`crate::node::input::layout`]).
fn layout(common: &Common, root: &HostRoot) -> nodeward_node_config::layout::Layout {
    crate::node::input::layout(root.path(), &common.unit_dir)
}
