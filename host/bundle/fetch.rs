//! A bundle named by where it is and the sha256 of its bytes: [`Source`] (a path on this host,
//! an `http://`/`https://` URL, or an `oci://` reference), [`download`] for a URL, [`pull`] for
//! an OCI artifact ([`super::oci`]), [`open_pinned`] for an archive on the host.
//!
//! # Background
//! The daemon rolls out the bundle a Machine's `spec.phaseBundle` names (`{url` or
//! `ociReference, sha256, acceptGrantsDigest}`) by running `nodeward phases install SOURCE
//! --sha256 HEX`, and an operator can do the same by hand. The sha256 pins the archive's bytes, so neither the server nor a
//! redirect is trusted with anything: bytes that do not hash to it are never parsed, and the
//! bundle's signature is checked on those that do, exactly as for a path.
//!
//! # Guarantees
//! - Only `http(s)` without credentials is requested: a URL with a user or a password is
//!   refused before any request (it would end up in logs, the audit trail and `ps`), and a
//!   redirect to anything else fails the download (the download engine's rule).
//! - The body is streamed by the download engine ([`Fetcher`]: retries with backoff on
//!   connection errors, cut-short bodies and 5xx) into a `0600` temp file in
//!   `<state-dir>/downloads/`, anonymous where the filesystem allows, and hashed on the way.
//!   It is refused past [`MAX_BUNDLE_BYTES`], announced or not; the whole download (connects,
//!   retries, waits, body) ends by the timeout given.
//! - The temp file is gone when [`download`] returns, whatever happened: the archive is read
//!   into memory from the open, verified file (with the archive reader's own caps), and the
//!   file is dropped. Nothing is cached, so no stored copy is ever trusted; every install by
//!   URL downloads again.
//! - Downloads into that directory take its lock (`downloads/.lock`, not waiting: a second
//!   one fails naming the holder), under which what a killed run left there
//!   (`.nodeward-tmp.download.*`, only where `O_TMPFILE` is unsupported) is swept first.
//! - HTTPS (a URL's or a registry's) trusts exactly what artifact downloads trust: the
//!   [`Trust`] the caller read from the node config (the system store, plus its
//!   `downloadOptions.caFile`), so a bundle from a private mirror or registry needs nothing
//!   an artifact from it does not.
//! - [`open_pinned`] reads a local archive once and parses the very bytes it hashed; the file
//!   is not opened again, so it cannot change in between.

use super::oci::{self, OciError, OciReference, ReferenceError};
use super::{BundleError, BundleFiles, BundleSource, archive};
use crate::caps::download::{DownloadContext, DownloadError, FetchPolicy, Fetcher, Trust};
use crate::digest::{Sha256Hex, sha256_hex};
use crate::durable;
use std::io::Read;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use url::Url;

/// The largest bundle archive downloaded, in bytes (64 MiB): a bundle is a few MiB of
/// components; a body beyond this is refused at the byte that passes it.
pub const MAX_BUNDLE_BYTES: u64 = 64 << 20;

/// The directory of the agent state directory that downloads are streamed into.
pub const DOWNLOADS_DIR: &str = "downloads";

/// Where a bundle to install is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// A bundle directory or archive on this host.
    Path(PathBuf),
    /// A bundle archive at an `http://` or `https://` URL.
    Url(Url),
    /// A bundle archive as an OCI artifact (`oci://REGISTRY/REPOSITORY:TAG` or `@sha256:…`).
    Oci(OciReference),
}

/// Why a [`Source`] was refused (a usage error: nothing was read or requested).
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// It looks like a URL (`scheme://`) of another scheme.
    #[error("{arg}: only http://, https:// and oci:// sources are fetched")]
    Scheme {
        /// The argument.
        arg: String,
    },
    /// An `http(s)` URL that does not parse.
    #[error("{arg}: not a valid URL: {source}")]
    Invalid {
        /// The argument.
        arg: String,
        /// The parser's error.
        #[source]
        source: url::ParseError,
    },
    /// An `oci://` reference that is not one this agent pulls.
    #[error(transparent)]
    Oci(#[from] ReferenceError),
    /// A URL with a user name or password.
    #[error(
        "{url}: a URL with credentials is refused (they would be logged); serve the bundle without them"
    )]
    Credentials {
        /// The URL, credentials removed.
        url: String,
    },
}

impl Source {
    /// `arg` as a URL when it has a `scheme://` prefix (`http`, `https`, or `oci` for an OCI
    /// reference), else as a path. A URL with credentials is refused.
    pub fn parse(arg: &Path) -> Result<Source, SourceError> {
        let Some(text) = arg.to_str().filter(|t| has_scheme(t)) else {
            return Ok(Source::Path(arg.to_path_buf()));
        };
        let scheme = text.split("://").next().unwrap_or_default();
        if scheme.eq_ignore_ascii_case("oci") {
            return Ok(Source::Oci(OciReference::parse(
                &text[oci::SCHEME.len()..],
            )?));
        }
        if !scheme.eq_ignore_ascii_case("http") && !scheme.eq_ignore_ascii_case("https") {
            return Err(SourceError::Scheme { arg: text.into() });
        }
        let mut url = Url::parse(text).map_err(|source| SourceError::Invalid {
            arg: text.into(),
            source,
        })?;
        if !url.username().is_empty() || url.password().is_some() {
            // Best effort: only the message needs them gone; the URL is not used.
            let _ = url.set_username("");
            let _ = url.set_password(None);
            return Err(SourceError::Credentials { url: url.into() });
        }
        Ok(Source::Url(url))
    }
}

/// Whether `s` starts with `scheme://` (RFC 3986: a letter, then letters, digits, `+-.`).
fn has_scheme(s: &str) -> bool {
    let Some((scheme, _)) = s.split_once("://") else {
        return false;
    };
    scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
}

/// Why a pinned bundle could not be had. Nothing was installed.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The downloads directory cannot be made, opened or swept.
    #[error("{}: {source}", path.display())]
    Dir {
        /// The directory.
        path: PathBuf,
        /// The failure.
        #[source]
        source: std::io::Error,
    },
    /// The downloads directory's lock is held, or cannot be taken.
    #[error("{}: another download of a bundle is running: {source}", path.display())]
    Busy {
        /// The lock file.
        path: PathBuf,
        /// Why it was not taken.
        #[source]
        source: durable::LockError,
    },
    /// The download failed: the network, an HTTP status, the size cap, the timeout, or bytes
    /// that do not hash to the pinned sha256 (discarded).
    #[error("cannot fetch the bundle: {source}")]
    Download {
        /// The download engine's error, naming the URL.
        #[source]
        source: DownloadError,
    },
    /// A local archive's bytes do not hash to the pinned sha256.
    #[error("{}: sha256 {actual}, but {expected} is pinned", path.display())]
    Mismatch {
        /// The archive.
        path: PathBuf,
        /// The pinned sha256.
        expected: String,
        /// The file's.
        actual: String,
    },
    /// A sha256 pins an archive's bytes; a directory has none.
    #[error("{}: is a directory; a sha256 pins the bytes of a bundle archive", path.display())]
    NotAnArchive {
        /// The directory.
        path: PathBuf,
    },
    /// A local archive cannot be read.
    #[error("{}: {source}", path.display())]
    Read {
        /// The archive.
        path: PathBuf,
        /// The failure.
        #[source]
        source: std::io::Error,
    },
    /// The OCI artifact could not be pulled as pinned, or is not a bundle artifact.
    #[error(transparent)]
    Oci(#[from] OciError),
    /// The bytes are the pinned ones, but not a bundle archive (malformed, truncated, too
    /// large unpacked, no manifest).
    #[error(transparent)]
    Bundle(#[from] BundleError),
}

impl FetchError {
    /// Whether the bundle's bytes could not be had as pinned: the download failed, or the
    /// bytes are not the pinned ones (`phases install` exits 3). Not for a local failure
    /// (the downloads directory, its lock, reading a file) nor a refused archive.
    pub fn not_fetched(&self) -> bool {
        match self {
            FetchError::Download { .. } | FetchError::Mismatch { .. } => true,
            FetchError::Oci(e) => e.not_fetched(),
            _ => false,
        }
    }

    /// Whether the bundle was refused (`phases install` exits 4): an archive that is not a
    /// bundle's, or an OCI artifact that is not a bundle artifact.
    pub fn refuses_bundle(&self) -> bool {
        match self {
            FetchError::Bundle(e) => e.refuses_bundle(),
            FetchError::Oci(e) => e.refuses_bundle(),
            _ => false,
        }
    }
}

/// Downloads the bundle archive at `url` (over HTTPS trusting `trust`), checks its bytes
/// against `sha256` while they arrive, and reads it (see the module doc); the whole download
/// ends by `timeout`.
pub fn download(
    state_dir: &Path,
    url: &Url,
    sha256: &Sha256Hex,
    timeout: Duration,
    trust: &Trust,
) -> Result<BundleFiles, FetchError> {
    let deadline = Instant::now() + timeout;
    let path = state_dir.join(DOWNLOADS_DIR);
    let dir_err = |source| FetchError::Dir {
        path: path.clone(),
        source,
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&path)
        .map_err(dir_err)?;
    let lock_path = path.join(".lock");
    let _lock = durable::Lock::acquire(&lock_path).map_err(|source| FetchError::Busy {
        path: lock_path.clone(),
        source,
    })?;
    let removed = durable::sweep_path(&path, durable::TempDirs::Leave).map_err(dir_err)?;
    if !removed.is_empty() {
        tracing::info!(dir = %path.display(), ?removed, "removed what a killed download left");
    }
    let dir = durable::open_dir(&path).map_err(dir_err)?;
    let config = {
        // The artifact cache named here is never touched: `download_temp` bypasses it.
        let mut c = DownloadContext {
            trust: trust.clone(),
            ..DownloadContext::default()
        }
        .config();
        c.policy = FetchPolicy {
            max_bytes: MAX_BUNDLE_BYTES,
            request_timeout: timeout,
            ..FetchPolicy::default()
        };
        c
    };
    // The sha256 pins the bytes: a redirect may go to any http(s) URL without credentials
    // (the engine refuses anything else), as for a pinned artifact.
    let anywhere = |_: &Url| true;
    let fetcher = Fetcher::new(&dir, config, deadline, &anywhere);
    let name = path.display();
    let mut tmp = fetcher
        .download_temp(&dir, url, sha256.as_str(), &name)
        .map_err(|source| FetchError::Download { source })?;
    let files = BundleFiles::from_archive(BundleSource::Url(Box::new(url.clone())), &mut tmp.file)?;
    drop(tmp);
    Ok(files)
}

/// Pulls the bundle archive of the OCI artifact `reference`, pinned by `sha256`, within
/// `timeout` (over HTTPS trusting `trust`), and reads it from memory (see [`super::oci`]).
/// Nothing is written to disk.
pub fn pull(
    reference: &OciReference,
    sha256: &Sha256Hex,
    timeout: Duration,
    trust: &Trust,
) -> Result<BundleFiles, FetchError> {
    let bytes = oci::pull(reference, sha256, timeout, trust)?;
    let source = BundleSource::Oci(reference.to_string());
    Ok(BundleFiles::from_archive(source, bytes.as_slice())?)
}

/// Reads the bundle archive at `path`, checks that its bytes hash to `sha256`, and reads the
/// bundle from those bytes. A directory is refused ([`FetchError::NotAnArchive`]).
pub fn open_pinned(path: &Path, sha256: &Sha256Hex) -> Result<BundleFiles, FetchError> {
    let read_err = |source| FetchError::Read {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(read_err)?;
    if file.metadata().map_err(read_err)?.is_dir() {
        return Err(FetchError::NotAnArchive {
            path: path.to_path_buf(),
        });
    }
    let mut bytes = Vec::new();
    file.take(archive::MAX_ARCHIVE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(read_err)?;
    let source = BundleSource::Archive(path.to_path_buf());
    if bytes.len() as u64 > archive::MAX_ARCHIVE_BYTES {
        return Err(FetchError::Bundle(BundleError::Archive {
            source_desc: source.to_string(),
            source: archive::ArchiveError::TooLarge,
        }));
    }
    let actual = sha256_hex(&bytes);
    if actual != sha256.as_str() {
        return Err(FetchError::Mismatch {
            path: path.to_path_buf(),
            expected: sha256.to_string(),
            actual,
        });
    }
    Ok(BundleFiles::from_archive(source, bytes.as_slice())?)
}

#[cfg(test)]
mod tests;
