//! `nodeward:host/download`: verified downloads.
//!
//! # Background
//! This module is the capability's boundary: argument checks, the grant check, and the choice
//! between planning and doing. The work is the download engine's, which this module hands a
//! [`Fetcher`] configured from the run (cache location, size cap, retries, timeouts), the
//! phase deadline, and the phase's URL grant so that redirects are checked against it too:
//! - `fetcher`: one call's [`Fetcher`] and its [`FetchPolicy`]: cache or download, verify,
//!   put in place;
//! - `cache`: the content-addressed artifact cache (entry naming, verified open, copy out,
//!   remember, forget, marking an entry used);
//! - `evict`: keeping the cache under its size cap, least recently used first, never a
//!   pinned entry (called by the node pipeline after a successful bootstrap or upgrade);
//! - `http`: the HTTP client, retries, redirects checked against the grant, the hashed body;
//! - `trust`: which CAs HTTPS downloads trust (the system store, plus the config's
//!   `downloadOptions.caFile`);
//! - `progress`: what a long download shows (a bar on a terminal, a line every 5 s
//!   otherwise);
//! - `batch`: `fetch-all`, a phase's downloads at once (each checked as its single call,
//!   all before any starts; at most [`MAX_PARALLEL`] at a time);
//! - `archive` and `bounds`: validated tarball extraction within [`ExtractLimits`];
//! - `error`: [`DownloadError`], the engine's failures in its own terms, converted to the
//!   WIT error once, here, by `?` (its one `From` impl picks the kind and keeps the text).
//!
//! # Guarantees
//! - Grant check first: the (URL, sha256) pair against the run's pinned artifacts
//!   (`download.pinned-artifacts`) or the URL against `download.urls` prefixes, the
//!   destination against `fs.write`; a refusal touches nothing and sends no request.
//! - A pinned artifact is admitted only as a whole: its URL exactly (as parsed) *and* its
//!   sha256, so a phase can neither add a byte to the URL nor fetch another object from the
//!   same server. Its redirects are followed to any http(s) URL without credentials: the
//!   server, not the phase, chose them, and the sha256 pins the bytes.
//! - Plan and apply agree: both return `unchanged` when `dest` already holds bytes with the
//!   digest (and the mode), both record the same [`ChangeKind`] otherwise. A file holding a
//!   secret (or a part of one) never counts as holding the digest, nor an extracted entry as
//!   in place: a digest a phase gives would otherwise confirm a guess ([`crate::secrets`]).
//! - `fetch` converges the mode too: right bytes with the wrong mode are a mode change, made
//!   by replacing the file with a copy that has the new mode, never by a chmod in place.
//! - A file at `dest` with a name besides `dest` and its own cache entry (a hard link planted
//!   to a file elsewhere) is never hashed, compared or changed in place: it is replaced by the
//!   download (`changed`), whatever it holds, and its other names keep their bytes and mode.
//! - `fetch-and-extract` in plan mode is exact when the archive is in the cache (it is
//!   validated and compared with the directory, read-only); without it, the plan says the
//!   directory will be created or changed.

use super::fs::Access;
use super::{Error, Outcome, PhaseCtx, denied, host_path};
use crate::hostpath::HostPath;
use crate::plan::{ChangeKind, RunMode, octal};
use crate::rootfs::{EntryKind, Final};
use crate::wit::download;
use serde_json::json;

mod archive;
mod batch;
mod bounds;
mod cache;
mod error;
mod evict;
mod fetcher;
mod http;
mod progress;
mod trust;
pub use archive::{Extracted, entry_path, extract};
pub use batch::{MAX_PARALLEL, MAX_REQUESTS, REQUEST_CALLS};
pub use bounds::{ExtractBounds, ExtractLimits, LimitHit};
pub use error::{DownloadError, RetryReason};
pub use evict::{EvictError, EvictPolicy, Evicted, Eviction, evict};
pub use fetcher::{DEFAULT_CACHE_DIR, FetchConfig, FetchPolicy, Fetcher, Imported, RetryPolicy};
pub(crate) use trust::certificate_refused;
pub use trust::{CaFile, MAX_CA_FILE_BYTES, SystemRoots, Trust, TrustError, system_roots};

/// Where one run's downloads go and how they are bounded: the artifact cache and the policy.
#[derive(Clone, Debug)]
pub struct DownloadContext {
    /// The content-addressed artifact cache beneath the root (`<dir>/sha256/<hex>`). A field so
    /// that a deployment (or a test) can place it, e.g. on a larger volume.
    pub cache_dir: HostPath,
    /// Size cap, retries and timeouts of downloads.
    pub policy: FetchPolicy,
    /// The CAs HTTPS downloads trust: the system store, plus the config's
    /// `downloadOptions.caFile` when the run was given one.
    pub trust: Trust,
    /// Set (to the archive's name) by `--offline FILE`: the run's artifacts were imported
    /// from that offline archive, and a cache miss is refused instead of downloaded.
    pub offline: Option<String>,
}

impl Default for DownloadContext {
    fn default() -> Self {
        DownloadContext {
            cache_dir: HostPath::parse(DEFAULT_CACHE_DIR)
                .unwrap_or_else(|_| unreachable!("constant is a valid host path")),
            policy: FetchPolicy::default(),
            trust: Trust::default(),
            offline: None,
        }
    }
}

impl DownloadContext {
    /// The cache entry that keeps a verified download of `sha256`; where the file system
    /// allows, it shares the downloaded file's inode (its one expected second name).
    fn cache_entry(&self, sha256: &str) -> Option<HostPath> {
        HostPath::parse(&cache::entry_name(&self.cache_dir, sha256)).ok()
    }

    /// The download engine's configuration for this run.
    pub fn config(&self) -> FetchConfig {
        FetchConfig {
            cache_dir: self.cache_dir.clone(),
            policy: self.policy.clone(),
            trust: self.trust.clone(),
            offline: self.offline.clone(),
        }
    }
}

/// The mode `fetch` uses when the guest passes 0.
const DEFAULT_MODE: u32 = 0o644;

/// One artifact the host resolved from the node config for a run, with its pinned digest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PinnedArtifact {
    /// Its URL, parsed (so equality is on the normalized form).
    pub url: url::Url,
    /// Its sha256, 64 lowercase hex digits.
    pub sha256: String,
}

impl PinnedArtifact {
    /// The pinned ones of `artifacts`: those with a sha256 and a URL that parses (an apply
    /// refuses a config with an unpinned artifact before any phase runs; a plan skips them).
    pub fn of(artifacts: &[nodeward_node_config::input::Artifact]) -> Vec<PinnedArtifact> {
        artifacts
            .iter()
            .filter_map(|a| {
                Some(PinnedArtifact {
                    url: url::Url::parse(&a.url).ok()?,
                    sha256: a.sha256.clone()?,
                })
            })
            .collect()
    }
}

/// Which grant admitted a download, which decides what its redirects may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Admitted {
    /// One of the run's pinned artifacts: redirects anywhere http(s).
    Pinned,
    /// A `download.urls` prefix: every redirect checked against the prefixes.
    Prefix,
}

impl PhaseCtx {
    /// Whether the grants admit downloading `url` with `sha256`, and by which grant.
    fn admitted(&self, url: &url::Url, sha256: &str) -> Option<Admitted> {
        let pinned = self.grants.download.pinned_artifacts
            && self
                .pinned_artifacts
                .iter()
                .any(|a| &a.url == url && a.sha256 == sha256);
        if pinned {
            Some(Admitted::Pinned)
        } else if self.grants.may_download(url) {
            Some(Admitted::Prefix)
        } else {
            None
        }
    }

    fn download_request(
        &self,
        url: &str,
        sha256: &str,
        dest: &str,
        last: Final,
    ) -> Result<(url::Url, HostPath, Admitted), Error> {
        let u = url::Url::parse(url)
            .map_err(|e| Error::InvalidArgument(format!("URL {url:?}: {e}")))?;
        if !matches!(u.scheme(), "http" | "https")
            || !u.username().is_empty()
            || u.password().is_some()
        {
            return Err(Error::InvalidArgument(format!(
                "URL {url:?}: http(s) without credentials only"
            )));
        }
        if !nodeward_node_config::is_sha256(sha256) {
            return Err(Error::InvalidArgument(format!(
                "sha256 {sha256:?}: must be 64 lowercase hex digits"
            )));
        }
        host_path(dest)?;
        let Some(admitted) = self.admitted(&u, sha256) else {
            return Err(denied(
                format!("download {u} with sha256 {sha256}"),
                "download.pinned-artifacts or download.urls",
            ));
        };
        // The destination is resolved like any `fs` write: a symlink on the way must not
        // lead out of the write grant.
        let dest = self.resolved(dest, Access::Write, last)?;
        Ok((u, dest, admitted))
    }

    /// Runs `f` with a [`Fetcher`] for this call; redirects are checked as `admitted` says.
    fn with_fetcher<T>(&self, admitted: Admitted, f: impl FnOnce(&Fetcher<'_>) -> T) -> T {
        let grants = self.grants.clone();
        // The fetcher itself refuses redirects to anything but http(s) without credentials.
        let may = move |u: &url::Url| admitted == Admitted::Pinned || grants.may_download(u);
        let fetcher = Fetcher::new(
            self.run.files.root.dir(),
            self.run.downloads.config(),
            self.deadline,
            &may,
        );
        f(&fetcher)
    }

    fn fetch_file(
        &self,
        admitted: Admitted,
        u: &url::Url,
        sha256: &str,
        dest: &HostPath,
        mode: u32,
    ) -> Result<Outcome, Error> {
        let files = &self.run.files;
        files.require_parent_dir(dest)?;
        let existing = files.lstat(dest)?;
        // A file with a name besides `dest` and its cache entry hashes as `None`: it is
        // another file's inode, neither compared nor changed, but replaced below.
        let cache_entry = self.run.downloads.cache_entry(sha256);
        match existing {
            Some(st) if st.kind == EntryKind::Dir => {
                return Err(Error::Io(format!("{dest}: is a directory")));
            }
            Some(st)
                if st.kind == EntryKind::File
                    && files
                        .file_sha256(dest, cache_entry.as_ref(), self.deadline)?
                        .as_deref()
                        == Some(sha256) =>
            {
                if st.mode == mode {
                    return Ok(Outcome::Unchanged);
                }
                if files.mode == RunMode::Apply {
                    files.replace_with_mode(
                        dest,
                        sha256,
                        mode,
                        cache_entry.as_ref(),
                        self.deadline,
                    )?;
                }
                self.changed(ChangeKind::ModeChange {
                    path: dest.to_string(),
                    from: octal(st.mode),
                    to: octal(mode),
                });
                return Ok(Outcome::Changed);
            }
            _ => {}
        }
        if files.mode == RunMode::Apply {
            self.with_fetcher(admitted, |f| f.fetch_to(u, sha256, dest, mode))?;
        }
        self.changed(ChangeKind::Download {
            url: u.to_string(),
            sha256: sha256.to_string(),
            dest: dest.to_string(),
        });
        Ok(if existing.is_some() {
            Outcome::Changed
        } else {
            Outcome::Created
        })
    }

    fn fetch_archive(
        &self,
        admitted: Admitted,
        u: &url::Url,
        sha256: &str,
        dest: &HostPath,
        strip: u32,
    ) -> Result<Outcome, Error> {
        let files = &self.run.files;
        files.require_parent_dir(dest)?;
        let exists = match files.lstat(dest)? {
            None => false,
            Some(_) if files.is_dir(dest)? => true,
            Some(_) => return Err(Error::Io(format!("{dest}: exists and is not a directory"))),
        };
        let root = files.root.dir();
        let extracted = self.with_fetcher(admitted, |f| {
            if files.mode == RunMode::Plan {
                return match f.open_cached(sha256)? {
                    Some(mut archive) => {
                        let secrets = &self.run.redactor;
                        extract(
                            root,
                            &mut archive,
                            dest,
                            strip,
                            u,
                            true,
                            secrets,
                            f.extract_bounds(),
                        )
                    }
                    None if exists => Ok(Extracted::Changed),
                    None => Ok(Extracted::Created),
                };
            }
            let mut archive = f.cached(u, sha256)?;
            let result = extract(
                root,
                &mut archive,
                dest,
                strip,
                u,
                false,
                &self.run.redactor,
                f.extract_bounds(),
            );
            if result.as_ref().is_err_and(DownloadError::condemns_archive) {
                // A refused archive leaves nothing behind, not even in the cache.
                f.forget(sha256);
            }
            result
        })?;
        let outcome = match extracted {
            Extracted::Unchanged => return Ok(Outcome::Unchanged),
            Extracted::Created => Outcome::Created,
            Extracted::Changed => Outcome::Changed,
        };
        self.changed(ChangeKind::DownloadExtract {
            url: u.to_string(),
            sha256: sha256.to_string(),
            dest_dir: dest.to_string(),
            strip_components: strip,
        });
        Ok(outcome)
    }
}

/// A download whose arguments and grants passed the checks: what is left is to do it.
#[derive(Debug)]
enum Checked {
    /// `fetch`: the file at `dest`, with `mode`.
    File {
        admitted: Admitted,
        url: url::Url,
        sha256: String,
        dest: HostPath,
        mode: u32,
    },
    /// `fetch-and-extract`: the archive unpacked into `dest`.
    Archive {
        admitted: Admitted,
        url: url::Url,
        sha256: String,
        dest: HostPath,
        strip: u32,
    },
}

impl Checked {
    /// Where it writes.
    fn dest(&self) -> &HostPath {
        match self {
            Checked::File { dest, .. } | Checked::Archive { dest, .. } => dest,
        }
    }
}

impl PhaseCtx {
    /// The checks of `fetch`: arguments, the download grant, the write grant on `dest`.
    fn check_file(&self, url: &str, sha256: &str, dest: &str, mode: u32) -> Result<Checked, Error> {
        let (url, dest, admitted) = self.download_request(url, sha256, dest, Final::NoFollow)?;
        if mode > 0o7777 {
            return Err(Error::InvalidArgument(format!(
                "{dest}: mode {mode:o} is above 0o7777"
            )));
        }
        Ok(Checked::File {
            admitted,
            url,
            sha256: sha256.to_string(),
            dest,
            mode: if mode == 0 { DEFAULT_MODE } else { mode },
        })
    }

    /// The checks of `fetch-and-extract`: arguments, the download grant, the write grant on
    /// `dest_dir`.
    fn check_archive(
        &self,
        url: &str,
        sha256: &str,
        dest_dir: &str,
        strip: u32,
    ) -> Result<Checked, Error> {
        let (url, dest, admitted) = self.download_request(url, sha256, dest_dir, Final::Follow)?;
        Ok(Checked::Archive {
            admitted,
            url,
            sha256: sha256.to_string(),
            dest,
            strip,
        })
    }

    /// Does a checked download.
    fn run_checked(&self, c: &Checked) -> Result<Outcome, Error> {
        match c {
            Checked::File {
                admitted,
                url,
                sha256,
                dest,
                mode,
            } => self.fetch_file(*admitted, url, sha256, dest, *mode),
            Checked::Archive {
                admitted,
                url,
                sha256,
                dest,
                strip,
            } => self.fetch_archive(*admitted, url, sha256, dest, *strip),
        }
    }
}

impl download::Host for PhaseCtx {
    fn fetch(
        &mut self,
        url: String,
        sha256: String,
        dest: String,
        mode: u32,
    ) -> Result<Outcome, Error> {
        let args =
            json!({ "url": url, "sha256": sha256, "dest": dest, "mode": format!("{mode:04o}") });
        self.audited("download.fetch", args, |ctx| {
            let checked = ctx.check_file(&url, &sha256, &dest, mode)?;
            ctx.run_checked(&checked)
        })
    }

    fn fetch_and_extract(
        &mut self,
        url: String,
        sha256: String,
        dest_dir: String,
        strip_components: u32,
    ) -> Result<Outcome, Error> {
        let args = json!({ "url": url, "sha256": sha256, "dest-dir": dest_dir, "strip-components": strip_components });
        self.audited("download.fetch-and-extract", args, |ctx| {
            let checked = ctx.check_archive(&url, &sha256, &dest_dir, strip_components)?;
            ctx.run_checked(&checked)
        })
    }

    fn fetch_all(
        &mut self,
        requests: Vec<download::FetchRequest>,
    ) -> Result<Vec<Result<Outcome, Error>>, Error> {
        let args = batch::audit_args(&requests);
        let parts = requests.len().min(MAX_REQUESTS);
        let ran = self.audited_with_parts("download.fetch-all", args, parts, |ctx| {
            let checked = ctx.check_batch(&requests)?;
            Ok(batch::Outcomes(ctx.fetch_batch(&checked)))
        })?;
        // Every request that ran: its own record, after the batch's (`check_batch` took at
        // most MAX_REQUESTS, so each has its name).
        for ((i, request), (result, elapsed)) in requests.iter().enumerate().zip(&ran.0) {
            if let Some(call) = batch::REQUEST_CALLS.get(i) {
                let args = batch::request_args(i, requests.len(), request);
                self.record_part(call, args, result, *elapsed);
            }
        }
        Ok(ran.0.into_iter().map(|(r, _)| r).collect())
    }
}
