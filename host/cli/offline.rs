//! `nodeward offline pack`, and `--offline FILE` of `bootstrap`, `upgrade` and `apply`:
//! the command-line side of [`crate::offline`] (docs/none-mode.md, "Air-gapped install").

use super::flags::{BundleArgs, ConfigArgs, MAX_TIMEOUT_SECS, OutputArgs, RootArgs, StateArgs};
use super::output::print_json;
use super::{Failure, RunArgs, failed, load_bundle, load_keys, usage};
use crate::bundle::Bundle;
use crate::caps::download::{DownloadContext, Fetcher, Trust};
use crate::hostpath::HostRoot;
use crate::offline::{self, OfflineError};
use crate::plan::RunMode;
use clap::{Args, Subcommand};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// `nodeward offline …`.
#[derive(Debug, Subcommand)]
#[command(disable_help_subcommand = true)]
pub(super) enum OfflineCommand {
    /// Download every artifact the config pins (through the artifact cache beneath --root) and
    /// write them with the phase bundle that would run into one archive, for
    /// `bootstrap|upgrade|apply --offline FILE` on a host without network.
    Pack(PackArgs),
}

/// `offline pack`.
#[derive(Debug, Args)]
pub(super) struct PackArgs {
    /// The archive to write (a tar).
    #[arg(short = 'o', long = "output-archive", value_name = "FILE")]
    pub(super) out: PathBuf,
    /// Sign offline.json with this minisign secret key (as `phases sign` does bundles).
    #[arg(long, value_name = "FILE")]
    pub(super) key: Option<PathBuf>,
    /// File holding the secret key's password (otherwise asked on a terminal).
    #[arg(long, value_name = "FILE", requires = "key")]
    pub(super) password_file: Option<PathBuf>,
    /// Longest time all downloads together may take, in seconds (1 to 86400).
    #[arg(
        long,
        value_name = "SECS",
        default_value_t = 1800,
        value_parser = clap::value_parser!(u64).range(1..=MAX_TIMEOUT_SECS)
    )]
    pub(super) timeout: u64,
    #[command(flatten)]
    pub(super) config: ConfigArgs,
    #[command(flatten)]
    pub(super) root: RootArgs,
    #[command(flatten)]
    pub(super) state: StateArgs,
    #[command(flatten)]
    pub(super) bundle: BundleArgs,
    #[command(flatten)]
    pub(super) output: OutputArgs,
}

/// `--offline FILE` (bootstrap, upgrade, apply).
#[derive(Debug, Args)]
pub struct OfflineArgs {
    /// An offline archive (`nodeward offline pack`): its artifacts are added to the artifact
    /// cache (each checked against the config's sha256), its bundle runs when it is not the
    /// one that would run anyway, and no download request is sent.
    #[arg(long, value_name = "FILE", conflicts_with = "bundle")]
    pub offline: Option<PathBuf>,
}

/// The longest an import may hash (gigabytes take seconds; this only bounds a stuck disk).
const IMPORT_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// A fetcher over `root`'s artifact cache (the place a run's downloads use).
fn with_fetcher<T>(
    root: &HostRoot,
    trust: Trust,
    offline: Option<String>,
    timeout: Duration,
    f: impl FnOnce(&Fetcher<'_>) -> T,
) -> T {
    let ctx = DownloadContext {
        trust,
        offline,
        ..DownloadContext::default()
    };
    let any = |_: &url::Url| true;
    let fetcher = Fetcher::new(root.dir(), ctx.config(), Instant::now() + timeout, &any);
    f(&fetcher)
}

pub(super) fn run(cmd: &OfflineCommand) -> Result<(), Failure> {
    let OfflineCommand::Pack(a) = cmd;
    let config = crate::config::load(a.config.path()).map_err(usage)?;
    let source = a.config.source();
    let bundle = load_bundle(&a.root.dir, &a.state, &a.bundle, RunMode::Plan, true)?;
    let root = HostRoot::open(&a.root.dir).map_err(usage)?;
    let trust = Trust::from_config(&root, &config.download_options)
        .map_err(|e| usage(format!("{source}: downloadOptions.caFile {e}")))?;
    let password = match &a.password_file {
        Some(f) => Some(
            std::fs::read_to_string(f)
                .map_err(|e| usage(format!("password file {}: {e}", f.display())))?
                .lines()
                .next()
                .unwrap_or_default()
                .to_string(),
        ),
        None => None,
    };
    let req = offline::PackRequest {
        config: &config,
        config_source: &source,
        bundle: &bundle,
        key: a.key.as_deref().map(|k| (k, password)),
        out: &a.out,
    };
    let timeout = Duration::from_secs(a.timeout);
    let packed = with_fetcher(&root, trust, None, timeout, |f| offline::pack(&req, f)).map_err(
        |e| match e {
            OfflineError::Unpinned(e) => usage(e),
            e => failed(e),
        },
    )?;
    if !a.output.text() {
        return print_json(&packed);
    }
    println!(
        "offline archive {}: {} artifacts ({} from the cache), bundle {} v{} (sha256 {}){}",
        packed.archive.display(),
        packed.manifest.artifacts.len(),
        packed.from_cache,
        packed.manifest.bundle.name,
        packed.manifest.bundle.version,
        &packed.manifest.bundle.digest[..16],
        match &packed.signed_by {
            Some(k) => format!(", signed by key {k}"),
            None => ", unsigned".into(),
        }
    );
    for art in &packed.manifest.artifacts {
        println!("  {} {} ({} bytes)", art.name, art.sha256, art.size);
    }
    Ok(())
}

/// What `--offline FILE` gives a run: the bundle to run and the archive's name for the
/// downloads' refusals.
pub(super) struct Prepared {
    pub(super) bundle: Bundle,
    pub(super) name: String,
}

/// Opens `archive` for a run of `run` with `config`: imports its pinned artifacts into the
/// artifact cache and selects its bundle (the one that would run when it is that one; else
/// checked as `--bundle` would be). Before the pipeline, so a bad archive changes nothing but
/// verified cache entries.
pub(super) fn prepare(
    run: &RunArgs,
    archive: &Path,
    config: &nodeward_node_config::NodeConfig,
    mode: RunMode,
) -> Result<Prepared, Failure> {
    let root = HostRoot::open(&run.host.root).map_err(usage)?;
    let name = archive.display().to_string();
    let keys = || load_keys(&run.host.root, &run.bundle.keys);
    let opened = with_fetcher(
        &root,
        Trust::default(),
        Some(name.clone()),
        IMPORT_TIMEOUT,
        |f| offline::import(archive, config, f, keys),
    )
    .map_err(|e| match e {
        OfflineError::Keys(e) => usage(e),
        e => failed(e),
    })?;
    for (artifact, outcome) in &opened.imported {
        tracing::info!(archive = %name, artifact, ?outcome, "offline artifact in the cache");
    }
    if !opened.skipped.is_empty() {
        tracing::info!(archive = %name, skipped = ?opened.skipped, "artifacts the config does not pin: skipped");
    }
    let effective = super::effective_bundle(&run.host.root, &run.state)?;
    let bundle = if crate::digest::sha256_hex(&opened.bundle.manifest) == effective.digest {
        effective
    } else {
        crate::bundle::select::from_files(
            opened.bundle,
            mode,
            run.allow_unsigned,
            keys,
            |source| {
                eprintln!(
                    "WARNING: {source} is UNSIGNED: its signature was not checked; `phases install` would refuse it"
                )
            },
        )
        .map_err(|e| match e {
            crate::bundle::select::SelectError::Keys(e) => usage(e),
            e => failed(OfflineError::Bundle {
                archive: archive.to_path_buf(),
                source: Box::new(e),
            }),
        })?
    };
    Ok(Prepared { bundle, name })
}
