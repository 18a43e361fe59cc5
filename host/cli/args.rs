//! The command line's arguments (clap): the commands and the flags every command takes.

use crate::bundle::signature;
use clap::{Args, Parser, Subcommand, ValueEnum};
use std::path::PathBuf;

/// nodeward: turns a Linux host into a Kubernetes worker node; every host change is a
/// WebAssembly phase with typed, granted capabilities.
#[derive(Debug, Parser)]
#[command(name = "nodeward", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub(super) command: Command,
    #[command(flatten)]
    pub(super) common: Common,
}

/// Flags every command takes.
#[derive(Debug, Args)]
pub struct Common {
    /// Host root: every host path resolves beneath it.
    #[arg(long, global = true, default_value = "/", env = "NODEWARD_ROOT")]
    pub(super) root: PathBuf,
    /// Node configuration file (YAML or JSON); default: the embedded example.
    #[arg(long, global = true, env = "NODEWARD_CONFIG")]
    pub(super) config: Option<PathBuf>,
    /// Phase bundle (directory or archive) to run instead of the installed one. A signed one is
    /// verified; an unsigned one runs only with a warning, and `apply` needs --allow-unsigned.
    #[arg(long, global = true, env = "NODEWARD_BUNDLE")]
    pub(super) bundle: Option<PathBuf>,
    /// Let `apply --bundle` run an unsigned bundle (development only).
    #[arg(long, global = true)]
    pub(super) allow_unsigned: bool,
    /// A trusted minisign public key (repeatable); replaces the trusted keys directory.
    #[arg(long = "trusted-key", global = true, value_name = "FILE")]
    pub(super) trusted_keys: Vec<PathBuf>,
    /// Directory whose `*.pub` files are the trusted keys (when no --trusted-key is given).
    #[arg(
        long,
        global = true,
        env = "NODEWARD_TRUSTED_KEYS_DIR",
        default_value = signature::DEFAULT_TRUSTED_KEYS_DIR
    )]
    pub(super) trusted_keys_dir: PathBuf,
    /// `plan`/`apply`: run only this phase (repeatable); `plan` without it plans a bootstrap.
    #[arg(long = "phase", global = true, value_name = "NAME")]
    pub(super) phases: Vec<String>,
    /// Output format on stdout.
    #[arg(long, global = true, value_enum, default_value_t = Format::Text)]
    pub(super) output: Format,
    /// Log format on stderr (the audit log included).
    #[arg(long, global = true, value_enum, default_value_t = Format::Text)]
    pub(super) log_format: Format,
    /// Log filter (tracing syntax), e.g. `info` or `warn,nodeward::audit=info`.
    /// Default: `info` for apply, `warn` otherwise.
    #[arg(long, global = true, env = "NODEWARD_LOG")]
    pub(super) log_level: Option<String>,
    /// Agent state directory (the compiled component cache lives in `compiled/` there).
    #[arg(long, global = true, env = "NODEWARD_STATE_DIR")]
    pub(super) state_dir: Option<PathBuf>,
    /// Deadline of one phase run, in seconds.
    #[arg(long, global = true, default_value_t = 300)]
    pub(super) phase_timeout: u64,
    /// Memory budget of one phase run, in MiB: all its linear memories and tables together.
    #[arg(long, global = true, default_value_t = 256)]
    pub(super) memory_limit: usize,
    /// systemd unit directory, relative to --root.
    #[arg(long, global = true, env = "NODEWARD_UNIT_DIR", default_value = crate::caps::systemd::DEFAULT_UNIT_DIR)]
    pub(super) unit_dir: String,
    /// Longest wait for each health check (kubelet health, TLS bootstrap, Node Ready), seconds;
    /// default 60, 120 and 180.
    #[arg(long, global = true)]
    pub(super) wait_timeout: Option<u64>,
    /// The node mode; default: the config's `mode`. Only `none` is implemented.
    #[arg(long, global = true, value_enum)]
    pub(super) mode: Option<ModeArg>,
}

/// `--mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ModeArg {
    /// Host-native: versioned directories, units on the host.
    None,
    /// Blue/green nspawn machines (not implemented yet).
    Nspawn,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub(super) enum Command {
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

/// `nodeward phases …`.
#[derive(Debug, Subcommand)]
pub(super) enum PhasesCommand {
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
