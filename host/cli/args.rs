//! The command line's arguments (clap): the commands, each with the flag groups of
//! [`flags`](super::flags) that apply to it.

use super::audit::AuditCommand;
use super::flags::{
    AuditArgs, BundleArgs, ConfigArgs, HostArgs, KeyArgs, LogArgs, MAX_TIMEOUT_SECS, ModeArg,
    OutputArgs, PreflightArgs, RootArgs, RunArgs, StateArgs, WaitArgs,
};
use super::offline::{OfflineArgs, OfflineCommand};
use crate::digest::Sha256Hex;
use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

/// nodeward: turns a Linux host into a Kubernetes worker node; every host change is a
/// WebAssembly phase with typed, granted capabilities.
#[derive(Debug, Parser)]
#[command(
    name = "nodeward",
    version,
    about,
    long_about = None,
    disable_help_subcommand = true,
    after_help = "Each command's --help lists the flags it takes."
)]
pub struct Cli {
    #[command(subcommand)]
    pub(super) command: Command,
    #[command(flatten)]
    pub(super) log: LogArgs,
    #[command(flatten)]
    pub(super) leading: Leading,
}

/// `--root` and `--state-dir` before the command (`nodeward --root R plan`), as scripts
/// write them; they apply to the command that follows, which must take them.
#[derive(Debug, Args)]
pub struct Leading {
    /// Host root of the command that follows (for commands that take --root).
    #[arg(long = "root", id = "leading_root", value_name = "DIR")]
    pub(super) root: Option<PathBuf>,
    /// Agent state directory of the command that follows (for commands that take it).
    #[arg(long = "state-dir", id = "leading_state_dir", value_name = "DIR")]
    pub(super) state_dir: Option<PathBuf>,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub(super) enum Command {
    /// Show every host change a bootstrap would make (or the --phase ones), making none.
    Plan(PlanArgs),
    /// Run single phases for real (--phase NAME, repeatable); a node is made by `bootstrap`.
    Apply(ApplyArgs),
    /// Make this host a node (none mode): resumes an unfinished bootstrap at its checkpoint,
    /// repairs a finished one; refuses a different machine or config without --force.
    Bootstrap(BootstrapArgs),
    /// Upgrade a bootstrapped node to this config (journaled; rolled back on failure).
    Upgrade(UpgradeArgs),
    /// Check whether this host is fit to become a node, changing nothing: the checks bootstrap
    /// and upgrade run first (swap, kernel modules and sysctls, cgroups, ports, other runtimes,
    /// leftover files, disk space, the API server, its CA, the clock). Exits 1 when a check
    /// fails that --ignore-preflight-errors does not name.
    Preflight(PreflightCommandArgs),
    /// Remove the node: units, configs, version directories, node state; keeps the agent.
    Reset(ResetArgs),
    /// Restart the node's units (containerd, the kubelet) in place with its applied config,
    /// then wait until it is healthy; the host is not rebooted. With --phase, run those phases
    /// again first (after installing a bundle whose phases changed).
    Restart(RestartArgs),
    /// Finish or roll back an upgrade that was cut short (its journal is there); nothing else.
    /// Every node command does this first; the daemon runs it at start.
    Recover(RecoverArgs),
    /// Keep this node as its Machine resource says and carry out the MachineOperations naming
    /// it (docs/daemon.md); run by systemd (deploy/nodeward.service). Exits 69 when there is
    /// no node to keep or an installation owns the host.
    Daemon(DaemonArgs),
    /// Mode, active version, applied config, checkpoint or upgrade in progress, units, health.
    Status(StatusArgs),
    /// Build, sign, verify, install, roll back, inspect and diff phase bundles.
    #[command(subcommand)]
    Phases(PhasesCommand),
    /// Verify, show and summarise the audit trail: every capability call, run and bundle
    /// change, hash-chained (docs/audit.md).
    #[command(subcommand)]
    Audit(AuditCommand),
    /// Air-gapped installs: pack a config's artifacts and bundle into one archive for
    /// `--offline FILE` (docs/none-mode.md, "Air-gapped install").
    #[command(subcommand)]
    Offline(OfflineCommand),
    /// Print the default node config, or check a node config file.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Print the agent, wasmtime and WIT versions and the bundle's digest.
    Version(VersionArgs),
    /// Print a shell completion script (e.g. `nodeward completions bash > /etc/bash_completion.d/nodeward`).
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the systemd unit that runs `nodeward daemon`, as built into this binary
    /// (`nodeward unit > /etc/systemd/system/nodeward.service`; scripts/install.sh does).
    Unit,
    /// Print the man page (roff) of nodeward or of a command, e.g. `nodeward man | man -l -`.
    Man {
        /// The command, and subcommand (`nodeward man phases install`).
        command: Vec<String>,
    },
    /// Print the help of nodeward or of a command (`nodeward help phases install`).
    Help {
        /// The command, and subcommand.
        command: Vec<String>,
    },
}

/// `plan`.
#[derive(Debug, Args)]
pub(super) struct PlanArgs {
    /// Plan only this phase (repeatable); without it, plan a whole bootstrap.
    #[arg(long = "phase", value_name = "NAME")]
    pub(super) phases: Vec<String>,
    /// The node mode of the bootstrap plan; default: the config's `mode`. Only `none` is
    /// implemented.
    #[arg(long, value_enum, conflicts_with = "phases")]
    pub(super) mode: Option<ModeArg>,
    #[command(flatten)]
    pub(super) run: RunArgs,
}

/// `apply`.
#[derive(Debug, Args)]
pub(super) struct ApplyArgs {
    /// Run this phase (repeatable; at least one).
    #[arg(long = "phase", value_name = "NAME")]
    pub(super) phases: Vec<String>,
    #[command(flatten)]
    pub(super) offline: OfflineArgs,
    #[command(flatten)]
    pub(super) run: RunArgs,
}

/// `bootstrap`.
#[derive(Debug, Args)]
pub(super) struct BootstrapArgs {
    /// Adopt this config even though the install record names another: an unfinished
    /// bootstrap restarts with it, a finished node is upgraded to it.
    #[arg(long)]
    pub(super) force: bool,
    /// The node mode; default: the config's `mode`. Only `none` is implemented.
    #[arg(long, value_enum)]
    pub(super) mode: Option<ModeArg>,
    #[command(flatten)]
    pub(super) preflight: PreflightArgs,
    #[command(flatten)]
    pub(super) waits: WaitArgs,
    #[command(flatten)]
    pub(super) offline: OfflineArgs,
    #[command(flatten)]
    pub(super) run: RunArgs,
}

/// `upgrade`.
#[derive(Debug, Args)]
pub(super) struct UpgradeArgs {
    /// The node mode; default: the config's `mode`. Only `none` is implemented.
    #[arg(long, value_enum)]
    pub(super) mode: Option<ModeArg>,
    #[command(flatten)]
    pub(super) preflight: PreflightArgs,
    #[command(flatten)]
    pub(super) waits: WaitArgs,
    #[command(flatten)]
    pub(super) offline: OfflineArgs,
    #[command(flatten)]
    pub(super) run: RunArgs,
}

/// `preflight`.
#[derive(Debug, Args)]
pub(super) struct PreflightCommandArgs {
    /// Host root: every path checked resolves beneath it (its own `proc` and `sys` too).
    #[arg(long, env = "NODEWARD_ROOT", value_name = "DIR", default_value = "/")]
    pub(super) root: PathBuf,
    #[command(flatten)]
    pub(super) config: ConfigArgs,
    #[command(flatten)]
    pub(super) preflight: PreflightArgs,
    #[command(flatten)]
    pub(super) output: OutputArgs,
}

/// `reset`.
#[derive(Debug, Args)]
pub(super) struct ResetArgs {
    /// The node mode; default: the config's `mode`. Only `none` is implemented.
    #[arg(long, value_enum)]
    pub(super) mode: Option<ModeArg>,
    #[command(flatten)]
    pub(super) run: RunArgs,
}

/// `restart`.
#[derive(Debug, Args)]
pub(super) struct RestartArgs {
    /// Run this phase again with the applied config before the restart (repeatable; any of
    /// setup-host, download-artifacts, install, configure; run in that order): what puts the
    /// changed phases of a newly installed bundle to work. The daemon does this after a bundle
    /// roll-out.
    #[arg(
        long = "phase",
        value_name = "NAME",
        value_parser = clap::builder::PossibleValuesParser::new(crate::node::pipeline::restart::RERUNNABLE)
    )]
    pub(super) phases: Vec<String>,
    #[command(flatten)]
    pub(super) waits: WaitArgs,
    #[command(flatten)]
    pub(super) run: RunArgs,
}

/// `recover`.
#[derive(Debug, Args)]
pub(super) struct RecoverArgs {
    #[command(flatten)]
    pub(super) run: RunArgs,
}

/// `daemon`.
#[derive(Debug, Args)]
pub(super) struct DaemonArgs {
    /// The Machine this node is; default: the node's name (its applied config's
    /// `machineName`), else the host name.
    #[arg(long, env = "NODEWARD_MACHINE", value_name = "NAME")]
    pub(super) machine: Option<String>,
    /// kubeconfig the daemon talks to the API server with; default: the kubelet's own
    /// (`var/lib/kubelet/kubeconfig` beneath --root, the node's rotated credentials).
    #[arg(long, env = "NODEWARD_KUBECONFIG", value_name = "FILE")]
    pub(super) kubeconfig: Option<PathBuf>,
    /// Where the Prometheus metrics are served (a loopback address; port 0 picks one), or
    /// `off`.
    #[arg(
        long,
        env = "NODEWARD_METRICS_ADDR",
        value_name = "ADDR",
        default_value = "127.0.0.1:9464"
    )]
    pub(super) metrics_addr: String,
    /// How long a phase bundle roll-out's health gate waits for the restarted node (seconds,
    /// at most 1200: the restart itself is bounded by 30 min): past it, the bundle is rolled
    /// back.
    #[arg(long, value_name = "SECS", default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..=1200))]
    pub(super) health_timeout: u64,
    #[command(flatten)]
    pub(super) host: HostArgs,
    #[command(flatten)]
    pub(super) state: StateArgs,
    #[command(flatten)]
    pub(super) audit: AuditArgs,
    #[command(flatten)]
    pub(super) config: ConfigArgs,
}

/// `status`.
#[derive(Debug, Args)]
pub(super) struct StatusArgs {
    #[command(flatten)]
    pub(super) host: HostArgs,
    #[command(flatten)]
    pub(super) output: OutputArgs,
}

/// `version` (and `phases list`): the bundle that runs.
#[derive(Debug, Args)]
pub(super) struct VersionArgs {
    #[command(flatten)]
    pub(super) root: RootArgs,
    #[command(flatten)]
    pub(super) state: StateArgs,
    #[command(flatten)]
    pub(super) bundle: BundleArgs,
    #[command(flatten)]
    pub(super) output: OutputArgs,
}

/// `nodeward phases …`.
#[derive(Debug, Subcommand)]
#[command(disable_help_subcommand = true)]
pub(super) enum PhasesCommand {
    /// The bundle's phases, in run order.
    List(VersionArgs),
    /// Each phase's digest, WIT imports and grants (of BUNDLE, or the bundle that runs).
    Inspect {
        /// Bundle directory or archive; default: --bundle, else the installed, else embedded.
        #[arg(value_name = "BUNDLE")]
        path: Option<PathBuf>,
        #[command(flatten)]
        root: RootArgs,
        #[command(flatten)]
        state: StateArgs,
        #[command(flatten)]
        bundle: BundleArgs,
        #[command(flatten)]
        output: OutputArgs,
    },
    /// Builds a bundle from DIR (manifest.toml and components), filling in each sha256.
    Pack {
        /// Directory holding manifest.toml and the component files it names.
        dir: PathBuf,
        /// The bundle to write: an archive if it ends in .tar, .tar.gz or .tgz, else a directory.
        #[arg(short = 'o', long = "output-bundle", value_name = "BUNDLE")]
        out: PathBuf,
        #[command(flatten)]
        output: OutputArgs,
    },
    /// Writes the embedded bundle (manifest and components, unsigned) to DIR, or to an archive
    /// if the name ends in .tar, .tar.gz or .tgz: the start of your own bundle.
    Export {
        /// A new (or empty) directory, or an archive name.
        dir: PathBuf,
    },
    /// Signs BUNDLE's manifest with a minisign secret key (writes manifest.toml.minisig).
    Sign {
        /// Bundle directory or archive.
        bundle: PathBuf,
        /// minisign secret key file.
        #[arg(long, value_name = "FILE")]
        key: PathBuf,
        /// File holding the secret key's password (otherwise asked on a terminal).
        #[arg(long, value_name = "FILE")]
        password_file: Option<PathBuf>,
        #[command(flatten)]
        output: OutputArgs,
    },
    /// Checks BUNDLE's signature against the trusted keys, and every digest.
    Verify {
        /// Bundle directory or archive.
        bundle: PathBuf,
        #[command(flatten)]
        root: RootArgs,
        #[command(flatten)]
        keys: KeyArgs,
        #[command(flatten)]
        output: OutputArgs,
    },
    /// Verifies a bundle (a path, or a URL or oci:// reference pinned by --sha256), precompiles it, and makes it
    /// current (the old one becomes last-good). HTTPS trusts what artifact downloads trust: the
    /// system store, plus the downloadOptions.caFile of --config, else of the node's applied
    /// config.
    #[command(after_help = INSTALL_EXIT_CODES)]
    Install(InstallArgs),
    /// Makes the previous install current again (repeatable, down to the embedded bundle).
    Rollback {
        /// Roll back only if that makes this bundle current: its digest, or `embedded`;
        /// otherwise change nothing and fail (exit 1). What the daemon's roll-out restores
        /// with, so it never lands on another bundle than the one current before it.
        #[arg(long, value_name = "DIGEST|embedded")]
        expect: Option<String>,
        #[command(flatten)]
        root: RootArgs,
        #[command(flatten)]
        state: StateArgs,
        #[command(flatten)]
        audit: AuditArgs,
        #[command(flatten)]
        output: OutputArgs,
    },
    /// Undoes the last rollback or uninstall: makes the install it left current again
    /// (repeatable, until the last install).
    Rollforward {
        #[command(flatten)]
        root: RootArgs,
        #[command(flatten)]
        state: StateArgs,
        #[command(flatten)]
        audit: AuditArgs,
        #[command(flatten)]
        output: OutputArgs,
    },
    /// Lists the installs, oldest first, and which one runs.
    History {
        #[command(flatten)]
        root: RootArgs,
        #[command(flatten)]
        state: StateArgs,
        #[command(flatten)]
        output: OutputArgs,
    },
    /// Makes the embedded bundle current again; the history is kept.
    Uninstall {
        #[command(flatten)]
        root: RootArgs,
        #[command(flatten)]
        state: StateArgs,
        #[command(flatten)]
        audit: AuditArgs,
        #[command(flatten)]
        output: OutputArgs,
    },
    /// What changed from OLD to NEW, per phase: capabilities, grants, digests, phases.
    Diff {
        /// Bundle directory or archive, or `@current` (the bundle that runs now).
        old: PathBuf,
        /// Bundle directory or archive, or `@current`.
        new: PathBuf,
        #[command(flatten)]
        root: RootArgs,
        #[command(flatten)]
        state: StateArgs,
        #[command(flatten)]
        output: OutputArgs,
    },
}

/// What `phases install` exits with: its `--help` shows this; `docs/bundle-format.md`
/// ("The exit codes of `phases install`") is the reference, `super::install` where the
/// codes are chosen.
const INSTALL_EXIT_CODES: &str = "\
Exit codes:
  0  installed, or already current
  1  anything else (the bundle store, the compiled cache, I/O, the audit trail)
  2  usage: bad flags, a URL or oci:// reference without --sha256 or malformed, a malformed
     sha256 or digest, --sha256 with a directory, unusable trusted keys, an unusable --config
     or downloadOptions.caFile
  3  the bundle could not be fetched: network, HTTP or registry status, timeout, the 64 MiB
     size cap (4 MiB for an OCI manifest), bytes or a layer digest that do not match --sha256
  4  the bundle was refused: unsigned or signed by an untrusted key, malformed, a digest that
     does not match, a downgrade, an incomplete bundle, a component that does not compile,
     an OCI artifact that is not a bundle artifact (one layer of the bundle mediaType)
  5  its capabilities or grants are wider than the current bundle's, and that was not
     accepted (--accept-new-grants, --accept-grants-digest, or yes on a terminal)";

/// `phases install`.
#[derive(Debug, Args)]
pub(super) struct InstallArgs {
    /// Bundle directory or archive, the http:// or https:// URL of an archive, or an OCI
    /// artifact as oci://REGISTRY/REPOSITORY:TAG or …@sha256:HEX (both need --sha256).
    #[arg(value_name = "SOURCE")]
    pub(super) bundle: PathBuf,
    /// sha256 of the archive's bytes (64 lowercase hex digits): required with a URL or an OCI
    /// reference, checked while it downloads; with a path, the archive is checked against it.
    #[arg(long, value_name = "HEX")]
    pub(super) sha256: Option<Sha256Hex>,
    /// Longest time a download by URL (retries included) or an OCI pull may take, in seconds
    /// (1 to 86400).
    #[arg(
        long,
        value_name = "SECS",
        default_value_t = 300,
        allow_negative_numbers = true,
        value_parser = clap::value_parser!(u64).range(1..=MAX_TIMEOUT_SECS)
    )]
    pub(super) timeout: u64,
    /// Allow a version lower than (or equal to) the current one's.
    #[arg(long)]
    pub(super) allow_downgrade: bool,
    /// Allow a bundle that lacks phases bootstrap, upgrade or reset need (such a node
    /// cannot run them).
    #[arg(long)]
    pub(super) allow_incomplete: bool,
    /// Accept grants wider than the current bundle's without asking.
    #[arg(long)]
    pub(super) accept_new_grants: bool,
    /// Accept grants wider than the current bundle's only when the bundle's digest (the
    /// sha256 of its manifest, as `phases inspect` prints it) is DIGEST; never asks.
    #[arg(long, value_name = "DIGEST", conflicts_with = "accept_new_grants")]
    pub(super) accept_grants_digest: Option<Sha256Hex>,
    // The node config whose downloadOptions.caFile a URL or OCI source's HTTPS trusts, as
    // artifact downloads do; default: the node's applied config (see `install::download_trust`).
    #[command(flatten)]
    pub(super) config: ConfigArgs,
    #[command(flatten)]
    pub(super) keys: KeyArgs,
    #[command(flatten)]
    pub(super) root: RootArgs,
    #[command(flatten)]
    pub(super) state: StateArgs,
    #[command(flatten)]
    pub(super) audit: AuditArgs,
    #[command(flatten)]
    pub(super) output: OutputArgs,
}

/// `nodeward config …`.
#[derive(Debug, Subcommand)]
#[command(disable_help_subcommand = true)]
pub(super) enum ConfigCommand {
    /// Print the embedded example config: what every command uses when --config is not given.
    PrintDefaults,
    /// Check FILE with the same strict parser every command uses; exit 2 naming the field.
    Validate {
        /// Node config file (YAML or JSON).
        file: PathBuf,
    },
}

impl Command {
    /// The host root of the command, when it takes `--root` (for a leading `--root`).
    pub(super) fn root_mut(&mut self) -> Option<&mut PathBuf> {
        match self {
            Command::Status(s) => Some(&mut s.host.root),
            Command::Preflight(p) => Some(&mut p.root),
            Command::Daemon(d) => Some(&mut d.host.root),
            Command::Version(v) | Command::Phases(PhasesCommand::List(v)) => Some(&mut v.root.dir),
            Command::Phases(
                PhasesCommand::Inspect { root, .. }
                | PhasesCommand::Verify { root, .. }
                | PhasesCommand::Install(InstallArgs { root, .. })
                | PhasesCommand::Rollback { root, .. }
                | PhasesCommand::Rollforward { root, .. }
                | PhasesCommand::History { root, .. }
                | PhasesCommand::Uninstall { root, .. }
                | PhasesCommand::Diff { root, .. },
            ) => Some(&mut root.dir),
            Command::Audit(a) => Some(&mut a.trail_mut().root.dir),
            Command::Offline(OfflineCommand::Pack(p)) => Some(&mut p.root.dir),
            _ => self.run_mut().map(|r| &mut r.host.root),
        }
    }

    /// The state flags of the command, when it takes them (for a leading `--state-dir`).
    pub(super) fn state_mut(&mut self) -> Option<&mut StateArgs> {
        match self {
            Command::Version(v) | Command::Phases(PhasesCommand::List(v)) => Some(&mut v.state),
            Command::Phases(
                PhasesCommand::Inspect { state, .. }
                | PhasesCommand::Install(InstallArgs { state, .. })
                | PhasesCommand::Rollback { state, .. }
                | PhasesCommand::Rollforward { state, .. }
                | PhasesCommand::History { state, .. }
                | PhasesCommand::Uninstall { state, .. }
                | PhasesCommand::Diff { state, .. },
            ) => Some(state),
            Command::Audit(a) => Some(&mut a.trail_mut().state),
            Command::Daemon(d) => Some(&mut d.state),
            Command::Offline(OfflineCommand::Pack(p)) => Some(&mut p.state),
            _ => self.run_mut().map(|r| &mut r.state),
        }
    }

    /// The output flags of the command, when it takes them.
    pub(super) fn output(&self) -> Option<&OutputArgs> {
        match self {
            Command::Plan(PlanArgs { run, .. })
            | Command::Apply(ApplyArgs { run, .. })
            | Command::Bootstrap(BootstrapArgs { run, .. })
            | Command::Upgrade(UpgradeArgs { run, .. })
            | Command::Reset(ResetArgs { run, .. })
            | Command::Restart(RestartArgs { run, .. })
            | Command::Recover(RecoverArgs { run }) => Some(&run.output),
            Command::Status(StatusArgs { output, .. })
            | Command::Preflight(PreflightCommandArgs { output, .. })
            | Command::Version(VersionArgs { output, .. })
            | Command::Phases(
                PhasesCommand::List(VersionArgs { output, .. })
                | PhasesCommand::Inspect { output, .. }
                | PhasesCommand::Pack { output, .. }
                | PhasesCommand::Sign { output, .. }
                | PhasesCommand::Verify { output, .. }
                | PhasesCommand::Install(InstallArgs { output, .. })
                | PhasesCommand::Rollback { output, .. }
                | PhasesCommand::Rollforward { output, .. }
                | PhasesCommand::History { output, .. }
                | PhasesCommand::Uninstall { output, .. }
                | PhasesCommand::Diff { output, .. },
            ) => Some(output),
            Command::Audit(a) => Some(a.output()),
            Command::Offline(OfflineCommand::Pack(p)) => Some(&p.output),
            _ => None,
        }
    }

    fn run_mut(&mut self) -> Option<&mut RunArgs> {
        match self {
            Command::Plan(PlanArgs { run, .. })
            | Command::Apply(ApplyArgs { run, .. })
            | Command::Bootstrap(BootstrapArgs { run, .. })
            | Command::Upgrade(UpgradeArgs { run, .. })
            | Command::Reset(ResetArgs { run, .. })
            | Command::Restart(RestartArgs { run, .. })
            | Command::Recover(RecoverArgs { run }) => Some(run),
            _ => None,
        }
    }

    /// The log level when neither a flag nor NODEWARD_LOG names one: the commands that change
    /// the host say what they do.
    pub(super) fn default_log_level(&self) -> &'static str {
        match self {
            Command::Apply(_)
            | Command::Bootstrap(_)
            | Command::Upgrade(_)
            | Command::Reset(_)
            | Command::Restart(_)
            | Command::Recover(_)
            | Command::Daemon(_) => "info",
            _ => "warn",
        }
    }
}
