//! The flag groups: each is flattened only into the commands it applies to, so a command's
//! `--help` lists what it takes and a flag it does not take is a usage error naming it
//! (`status --phase x`, `apply --mode none`).
//!
//! Limits are checked while parsing (clap value ranges): a zero or absurd timeout or memory
//! budget is refused before anything runs, naming the flag.

use crate::bundle::signature;
use clap::{Args, ValueEnum};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Longest `--phase-timeout` and `--wait-timeout`: a day. Also keeps `now + deadline` far
/// from overflowing an `Instant`.
pub(super) const MAX_TIMEOUT_SECS: u64 = 86_400;
/// Largest `--memory-limit`, in MiB (64 GiB): beyond any phase, and `MiB << 20` still fits.
const MAX_MEMORY_MIB: u64 = 65_536;

/// The host root alone, for the commands that touch only the agent's own state beneath it
/// (the bundle store, the compiled cache, the trusted keys, the audit trail), not the node.
#[derive(Debug, Args)]
pub struct RootArgs {
    /// Host root: the agent's state, trusted keys and audit trail default beneath it.
    #[arg(
        id = "root",
        long = "root",
        env = "NODEWARD_ROOT",
        value_name = "DIR",
        default_value = "/"
    )]
    pub dir: PathBuf,
}

/// Where the audit trail is (`docs/audit.md`).
#[derive(Debug, Args)]
pub struct AuditArgs {
    /// Audit log directory; default `var/log/nodeward/audit` beneath --root.
    #[arg(long, env = "NODEWARD_AUDIT_DIR", value_name = "DIR")]
    pub audit_dir: Option<PathBuf>,
}

impl AuditArgs {
    /// The audit log directory: `--audit-dir`, else [`AUDIT_DIR`] beneath `root`.
    pub fn dir(&self, root: &Path) -> PathBuf {
        self.audit_dir
            .clone()
            .unwrap_or_else(|| root.join(AUDIT_DIR))
    }
}

/// The audit trail's directory beneath the host root.
pub const AUDIT_DIR: &str = "var/log/nodeward/audit";

/// The host a command works on.
#[derive(Debug, Args)]
pub struct HostArgs {
    /// Host root: every host path resolves beneath it.
    #[arg(long, env = "NODEWARD_ROOT", value_name = "DIR", default_value = "/")]
    pub root: PathBuf,
    /// systemd unit directory, relative to --root.
    #[arg(
        long,
        env = "NODEWARD_UNIT_DIR",
        value_name = "DIR",
        default_value = crate::caps::systemd::DEFAULT_UNIT_DIR
    )]
    pub unit_dir: String,
}

/// The agent's own state: installed bundles and the compiled component cache.
#[derive(Debug, Args)]
pub struct StateArgs {
    /// Agent state directory: installed bundles (`bundles/`) and compiled components
    /// (`compiled/`); default `var/lib/nodeward` beneath --root.
    #[arg(long, env = "NODEWARD_STATE_DIR", value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
}

impl StateArgs {
    /// The state directory: `--state-dir`, else [`config::STATE_DIR`](crate::config::STATE_DIR)
    /// beneath `root`, so that a command given only `--root` keeps its state there too
    /// (a `plan` of a temp root writes nothing on the real host).
    pub fn dir(&self, root: &Path) -> PathBuf {
        self.state_dir
            .clone()
            .unwrap_or_else(|| root.join(crate::config::STATE_DIR))
    }
}

/// The keys a bundle signature is checked against.
#[derive(Debug, Args)]
pub struct KeyArgs {
    /// A trusted minisign public key (repeatable); replaces the trusted keys directory.
    #[arg(long = "trusted-key", value_name = "FILE")]
    pub trusted_keys: Vec<PathBuf>,
    /// Directory whose `*.pub` files are the trusted keys (when no --trusted-key is given);
    /// default `etc/nodeward/trusted-keys` beneath --root.
    #[arg(long, env = "NODEWARD_TRUSTED_KEYS_DIR", value_name = "DIR")]
    pub trusted_keys_dir: Option<PathBuf>,
}

impl KeyArgs {
    /// The trusted keys directory: `--trusted-keys-dir`, else
    /// [`signature::TRUSTED_KEYS_DIR`] beneath `root`.
    pub fn dir(&self, root: &Path) -> PathBuf {
        self.trusted_keys_dir
            .clone()
            .unwrap_or_else(|| root.join(signature::TRUSTED_KEYS_DIR))
    }
}

/// Which bundle a command uses instead of the installed (or embedded) one.
#[derive(Debug, Args)]
pub struct BundleArgs {
    /// Phase bundle (directory or archive) to use instead of the installed one. A signed one is
    /// verified; an unsigned one is used only with a warning.
    #[arg(long, env = "NODEWARD_BUNDLE", value_name = "PATH")]
    pub bundle: Option<PathBuf>,
    #[command(flatten)]
    pub keys: KeyArgs,
}

/// The node configuration a command renders.
#[derive(Debug, Args)]
pub struct ConfigArgs {
    /// Node configuration file (YAML or JSON); default: the embedded example
    /// (`nodeward config print-defaults`).
    #[arg(long, env = "NODEWARD_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
}

impl ConfigArgs {
    /// How errors name the node config: its path, or the embedded example.
    pub fn source(&self) -> String {
        self.config
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| "the embedded example config".into())
    }

    /// The config file, if one was given.
    pub fn path(&self) -> Option<&Path> {
        self.config.as_deref()
    }
}

/// The limits of each phase run.
#[derive(Debug, Args)]
pub struct LimitArgs {
    /// Deadline of one phase run, in seconds (1 to 86400).
    #[arg(
        long,
        value_name = "SECS",
        default_value_t = 300,
        allow_negative_numbers = true,
        value_parser = clap::value_parser!(u64).range(1..=MAX_TIMEOUT_SECS)
    )]
    pub phase_timeout: u64,
    /// Memory budget of one phase run, in MiB (1 to 65536): all its linear memories and
    /// tables together.
    #[arg(
        long,
        value_name = "MIB",
        default_value_t = 256,
        allow_negative_numbers = true,
        value_parser = clap::value_parser!(u64).range(1..=MAX_MEMORY_MIB)
    )]
    pub memory_limit: u64,
}

impl LimitArgs {
    /// The per-phase limits.
    pub fn limits(&self) -> crate::runtime::Limits {
        crate::runtime::Limits {
            deadline: Duration::from_secs(self.phase_timeout),
            // At most 64 GiB: fits a 64-bit usize; a 32-bit host gets its whole address space.
            memory: usize::try_from(self.memory_limit << 20).unwrap_or(usize::MAX),
        }
    }
}

/// The longest health waits of `bootstrap` and `upgrade`.
#[derive(Debug, Args)]
pub struct WaitArgs {
    /// Longest wait for each health check (kubelet health, TLS bootstrap, Node Ready), in
    /// seconds (1 to 86400); default 60, 120 and 180.
    #[arg(
        long,
        value_name = "SECS",
        allow_negative_numbers = true,
        value_parser = clap::value_parser!(u64).range(1..=MAX_TIMEOUT_SECS)
    )]
    pub wait_timeout: Option<u64>,
}

impl WaitArgs {
    /// The waits: `--wait-timeout` for each, else the defaults.
    pub fn waits(&self) -> crate::node::pipeline::Waits {
        self.wait_timeout
            .map(|s| crate::node::pipeline::Waits::all(Duration::from_secs(s)))
            .unwrap_or_default()
    }
}

/// Which preflight failures do not stop `bootstrap` or `upgrade` (as `kubeadm join
/// --ignore-preflight-errors`).
#[derive(Debug, Args)]
pub struct PreflightArgs {
    /// Preflight checks whose failures are shown but do not stop the command: check names
    /// (comma-separated or repeated, any case, as `nodeward preflight` lists them) or `all`.
    /// A name that is no check is a usage error listing the checks.
    #[arg(long, value_name = "NAME,...|all", value_delimiter = ',')]
    pub ignore_preflight_errors: Vec<String>,
}

/// Where a command's report goes in which shape.
#[derive(Debug, Args)]
pub struct OutputArgs {
    /// Output format on stdout.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub output: Format,
}

impl OutputArgs {
    /// Whether the output is for people.
    pub fn text(&self) -> bool {
        self.output == Format::Text
    }
}

/// Everything a run of phases takes: the host, the agent state, the config, the bundle, the
/// limits and the output format (`plan`, `apply`, `bootstrap`, `upgrade`, `reset`).
#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub host: HostArgs,
    #[command(flatten)]
    pub state: StateArgs,
    #[command(flatten)]
    pub config: ConfigArgs,
    #[command(flatten)]
    pub bundle: BundleArgs,
    /// Let an unsigned --bundle make changes (development only).
    #[arg(long)]
    pub allow_unsigned: bool,
    #[command(flatten)]
    pub audit: AuditArgs,
    #[command(flatten)]
    pub limits: LimitArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// `--mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ModeArg {
    /// Host-native: versioned directories, units on the host.
    None,
    /// Blue/green nspawn machines (not implemented yet).
    Nspawn,
}

/// Text or JSON.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// For people.
    Text,
    /// For programs.
    Json,
}

/// When to colour log lines.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ColorWhen {
    /// When stderr is a terminal, unless `NO_COLOR` is set or `TERM=dumb`.
    Auto,
    /// Always.
    Always,
    /// Never.
    Never,
}

/// Logging: process-wide, so every command takes these (`global`).
#[derive(Debug, Args)]
#[command(next_help_heading = "Logging")]
pub struct LogArgs {
    /// Log filter for nodeward's own logs (tracing syntax): a level (`error`, `warn`, `info`,
    /// `debug`, `trace`, `off`) and/or `target=level` directives, e.g. `debug` or
    /// `warn,nodeward::audit=debug`; other crates stay at `warn` unless a directive names them.
    /// Default: `info` for apply, bootstrap, upgrade and reset, `warn` otherwise; also read
    /// from NODEWARD_LOG.
    #[arg(
        long,
        global = true,
        value_name = "FILTER",
        conflicts_with_all = ["quiet", "verbose"]
    )]
    pub log_level: Option<String>,
    /// Warnings and errors only.
    #[arg(short, long, global = true, conflicts_with = "verbose")]
    pub quiet: bool,
    /// Debug logs of nodeward (the audit record of every capability call included).
    #[arg(short, long, global = true)]
    pub verbose: bool,
    /// Log format on stderr; with `json` every line is one JSON object, the final error too.
    #[arg(long, global = true, value_enum, default_value_t = Format::Text)]
    pub log_format: Format,
    /// Colour in text logs.
    #[arg(long, global = true, value_enum, value_name = "WHEN", default_value_t = ColorWhen::Auto)]
    pub color: ColorWhen,
}
