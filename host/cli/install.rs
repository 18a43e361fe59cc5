//! `nodeward phases install SOURCE`: a bundle from a path, or from a URL or an `oci://`
//! reference pinned by the sha256 of its bytes ([`crate::bundle::fetch`]); consent to wider
//! grants by flag, by the bundle's digest, or on a terminal; and exit codes a caller acts on
//! without reading the message.
//!
//! # Exit codes
//! 0 installed or already current; [`NOT_FETCHED`] (3) the bundle's bytes could not be had as
//! pinned; [`REFUSED`] (4) the bundle was refused; [`NOT_ACCEPTED`] (5) it widens grants and
//! that was not accepted; 2 usage; 1 anything else. The daemon runs this command as a child and
//! reports a Machine's `BundleApplied` condition by them, so which error gets which code is
//! decided by the library's own classification ([`FetchError::not_fetched`],
//! [`BundleError::refuses_bundle`], [`InstallError::kind`]), never by matching messages. The
//! help text is `args::INSTALL_EXIT_CODES`; `docs/bundle-format.md` is the reference.

use super::args::InstallArgs;
use super::audit::StoreTrail;
use super::json::InstallOutput;
use super::output::{confirm_on_terminal, print_json};
use super::*;
use crate::audit::entry::BundleAction;
use crate::bundle::fetch::{self, FetchError, Source};
use crate::bundle::install::{self, FailureKind, InstallError, InstallOptions, Prepared};
use crate::bundle::{BundleError, BundleFiles, diff};
use crate::caps::download::Trust;
use crate::digest::Sha256Hex;
use std::io::IsTerminal as _;
use std::time::Duration;

/// The bundle could not be fetched: the network, an HTTP status, the timeout, a size cap,
/// bytes (or an OCI layer digest) that do not match `--sha256`.
pub(super) const NOT_FETCHED: u8 = 3;
/// The bundle was refused: its signature or key, its archive, manifest or digests, a
/// downgrade, an incomplete bundle, a component that does not load.
pub(super) const REFUSED: u8 = 4;
/// Its authority widens, and that was not accepted.
pub(super) const NOT_ACCEPTED: u8 = 5;

/// How wider capabilities or grants may be accepted.
enum Consent {
    /// `--accept-new-grants`: whatever they are.
    Any,
    /// `--accept-grants-digest`: only for the bundle with this digest; never asks.
    Digest(Sha256Hex),
    /// Neither: asked on a terminal, refused otherwise.
    Ask,
}

/// `phases install`.
pub(super) fn install(args: &InstallArgs) -> Result<(), Failure> {
    let at = StoreTrail {
        root: &args.root.dir,
        audit: &args.audit,
    };
    let source = Source::parse(&args.bundle).map_err(usage)?;
    if matches!(source, Source::Url(_) | Source::Oci(_)) && args.sha256.is_none() {
        return Err(url_needs_sha256(&args.bundle));
    }
    let consent = match (&args.accept_grants_digest, args.accept_new_grants) {
        (Some(d), _) => Consent::Digest(d.clone()),
        (None, true) => Consent::Any,
        (None, false) => Consent::Ask,
    };
    // The keys first: a node that can verify nothing downloads nothing.
    let keys = trusted_keys(at.root, &args.keys)?;
    let files = read(args, source, &args.state.dir(at.root))?;
    let bundle = crate::bundle::verify_files(&files, &keys).map_err(bundle_failure)?;
    let store = bundle_store(at.root, &args.state);
    // Shown whenever the authority widens; then accepted as `consent` says.
    let accept = |d: &diff::BundleDiff| {
        eprintln!(
            "{} may do more than the current bundle:\n{}",
            bundle.id_text(),
            d.to_text()
        );
        match &consent {
            Consent::Any => true,
            Consent::Digest(digest) => digest.as_str() == bundle.digest,
            Consent::Ask => std::io::stdin().is_terminal() && confirm_on_terminal(),
        }
    };
    let options = InstallOptions {
        allow_downgrade: args.allow_downgrade,
        allow_incomplete: args.allow_incomplete,
    };
    let pending = match install::prepare(&store, &bundle, &files, options, accept) {
        Ok(Prepared::Ready(pending)) => pending,
        Ok(Prepared::AlreadyCurrent(unrecorded)) => {
            // The work may be a killed install's: its run is closed, its change recorded.
            match unrecorded {
                Some(u) => {
                    let trail = super::audit::bundle_trail(at, &args.state, "phases install")?;
                    super::audit::record_unrecorded_install(at, &args.state, &trail, &u.intent)?;
                    trail.end(None, 0, 0, 0).map_err(failed)?;
                    u.recorded().map_err(failed)?;
                }
                None => super::audit::close_interrupted(at, &args.state, "phases install"),
            }
            if !args.output.text() {
                return print_json(&InstallOutput {
                    installed: bundle.id(),
                    already_current: true,
                    last_good: None,
                    widened: false,
                });
            }
            println!("{} is already current", bundle.id_text());
            return Ok(());
        }
        Err(e) => return Err(install_failure(&e, &consent)),
    };
    let runtime = runtime(at.root, &args.state)?;
    let trail = super::audit::bundle_trail(at, &args.state, "phases install")?;
    if let Some(intent) = pending.unrecorded() {
        super::audit::record_unrecorded_install(at, &args.state, &trail, intent)
            .map_err(|e| super::audit::bundle_failed(&trail, e.message))?;
    }
    let from = store
        .link(crate::bundle::store::CURRENT)
        .map_err(|e| super::audit::bundle_failed(&trail, e))?;
    let committed = pending.commit(&runtime).map_err(|e| {
        let code = install_failure(&e, &consent).code;
        Failure {
            code,
            ..super::audit::bundle_failed(&trail, e)
        }
    })?;
    let current = super::audit::bundle_ref(&bundle);
    super::audit::bundle_done(&trail, BundleAction::Install, current, from)?;
    // Recorded: the intent goes (a kill before this leaves it for the next install to check).
    let installed = committed.recorded().map_err(failed)?;
    if !args.output.text() {
        print_json(&InstallOutput {
            installed: bundle.id(),
            already_current: false,
            last_good: installed.last_good,
            widened: installed.widened,
        })?;
    } else {
        println!(
            "installed {} as current (signed by {}); last-good: {}",
            bundle.id_text(),
            bundle.signed_by.as_deref().unwrap_or_default(),
            installed
                .last_good
                .as_deref()
                .unwrap_or("none (the embedded bundle)")
        );
    }
    Ok(())
}

fn url_needs_sha256(arg: &Path) -> Failure {
    usage(format!(
        "{}: installing from a URL or an OCI reference needs --sha256 HEX (the sha256 of the archive's bytes)",
        arg.display()
    ))
}

/// The bundle's files from `source`: downloaded or pulled, or read from the path (checked against
/// `--sha256` when it is given).
fn read(args: &InstallArgs, source: Source, state_dir: &Path) -> Result<BundleFiles, Failure> {
    let timeout = Duration::from_secs(args.timeout);
    let files = match (source, &args.sha256) {
        (Source::Url(url), Some(pin)) => {
            fetch::download(state_dir, &url, pin, timeout, &download_trust(args)?)
        }
        (Source::Oci(reference), Some(pin)) => {
            fetch::pull(&reference, pin, timeout, &download_trust(args)?)
        }
        (Source::Url(_) | Source::Oci(_), None) => return Err(url_needs_sha256(&args.bundle)),
        (Source::Path(path), Some(pin)) => fetch::open_pinned(&path, pin),
        (Source::Path(path), None) => BundleFiles::open(&path).map_err(FetchError::from),
    };
    files.map_err(fetch_failure)
}

/// What a download by URL or an OCI pull trusts: what the node's artifact downloads trust,
/// the system store plus the `downloadOptions.caFile` of `--config` when given, else of the
/// node's applied config (the config the daemon's `restart` runs with too), else nothing more.
/// Read only for a URL or OCI source: a local install needs no network and is not stopped by
/// a broken `caFile`. A `caFile` that cannot be used is a config error naming it (exit 2).
fn download_trust(args: &InstallArgs) -> Result<Trust, Failure> {
    let root_dir = &args.root.dir;
    let (config, source) = match args.config.path() {
        Some(path) => (
            crate::config::load(Some(path)).map_err(usage)?,
            args.config.source(),
        ),
        None => match crate::node::state::NodeState::new(root_dir).applied() {
            Ok(Some(applied)) => (applied, "the node's applied config".to_string()),
            Ok(None) => return Ok(Trust::default()),
            // Not the system store alone: the node's config may name a caFile it needs.
            Err(e) => return Err(failed(e)),
        },
    };
    if config.download_options.ca_file.is_none() {
        return Ok(Trust::default());
    }
    let root = crate::hostpath::HostRoot::open(root_dir).map_err(usage)?;
    Trust::from_config(&root, &config.download_options)
        .map_err(|e| usage(format!("{source}: downloadOptions.caFile {e}")))
}

fn fetch_failure(e: FetchError) -> Failure {
    let code = match &e {
        e if e.not_fetched() => NOT_FETCHED,
        FetchError::NotAnArchive { .. } => 2,
        e if e.refuses_bundle() => REFUSED,
        _ => 1,
    };
    Failure {
        code,
        message: e.to_string(),
    }
}

fn bundle_failure(e: BundleError) -> Failure {
    Failure {
        code: if e.refuses_bundle() { REFUSED } else { 1 },
        message: e.to_string(),
    }
}

/// An install refused or failed; a digest given for consent that is not the bundle's is named.
fn install_failure(e: &InstallError, consent: &Consent) -> Failure {
    match (e.kind(), consent) {
        (FailureKind::NotAccepted, Consent::Digest(given)) => Failure {
            code: NOT_ACCEPTED,
            message: format!("{e} (--accept-grants-digest {given} is not its digest)"),
        },
        (FailureKind::NotAccepted, _) => Failure {
            code: NOT_ACCEPTED,
            message: e.to_string(),
        },
        (FailureKind::Refused, _) => Failure {
            code: REFUSED,
            message: e.to_string(),
        },
        (FailureKind::Other, _) => failed(e),
    }
}
