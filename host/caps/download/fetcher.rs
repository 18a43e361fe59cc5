//! The download engine behind `nodeward:host/download`: one call's [`Fetcher`], which
//! serves an artifact from the cache (`super::cache`) or downloads it (`super::http`),
//! verifies it, and puts it in place; extraction is `super::archive`.
//!
//! # Background
//! A phase names every artifact by its sha256, so the bytes it gets are the bytes its author
//! pinned, whoever serves them. The engine (this module and its siblings) is the only code
//! that talks to the network. The capability module ([`super`]) checks the grants and the run mode, then calls
//! a [`Fetcher`], which does the rest against the host root's `cap_std` directory, so every
//! file it writes resolves beneath the root. Failures are [`DownloadError`]s, which the
//! capability converts to the WIT error once, at its boundary.
//!
//! # Guarantees
//! - Bytes that do not hash to the expected digest never reach their destination: a body is
//!   streamed into a `0600` temp file ([`crate::durable::TempFile`]) in the destination's own
//!   directory while it is hashed, fsynced, and renamed over the destination only after the
//!   digest matched. On any failure the temp file is removed; a download killed mid-body
//!   leaves nothing where the filesystem supports unnamed temp files, else a
//!   `.nodeward-tmp.download.…` file the next locked run sweeps (`crate::node::sweep`).
//! - Every URL requested is covered by the phase's grant: redirects are not followed by the
//!   HTTP client (its policy is "none") but by [`Fetcher`], which checks each target against
//!   the grant first (`denied` naming the redirect target).
//! - Waiting is bounded by the phase deadline: connect and request timeouts are the policy's
//!   values cut down to the time left, and no retry starts that could not finish in time.
//! - Retries (exponential backoff with jitter) happen on connection errors, bodies cut short
//!   and 5xx answers only; never on 4xx, a size-cap breach, a hash mismatch or a timeout.
//! - The cache (`<cache_dir>/sha256/<hex>`) is content-addressed and never trusted: a cached
//!   artifact is hashed again every time it is used, and discarded when it does not match.
//! - An archive is validated whole before anything is extracted; a refused archive writes
//!   nothing. Writes go through a `cap_std` handle on the destination directory, so even an
//!   archive that slipped past validation could not write outside it.
//!
//! # Caveats
//! - Symlinks that already exist in an extraction directory are trusted as far as the host
//!   root's confinement goes: the archive may not write *through* them, but a new link's
//!   target is checked against the archive and the disk as they are at validation time.
//! - A downloaded file and its cache entry are hard links to one inode when they share a
//!   filesystem (no second copy is written); changing the file in place therefore changes the
//!   cache entry, which the next use detects by its digest and discards.

use super::bounds::{ExtractBounds, ExtractLimits, LimitHit};
use super::cache::ArtifactCache;
use super::error::DownloadError;
use super::trust::Trust;
use crate::durable::TempFile;
use crate::hostpath::{HostPath, open_dir_nofollow_at};
use cap_std::fs::{Dir, File};
use sha2::{Digest, Sha256};
use std::cell::OnceCell;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::time::{Duration, Instant};
use url::Url;

/// Where artifacts are cached beneath the host root unless configured otherwise.
pub const DEFAULT_CACHE_DIR: &str = "var/lib/nodeward/artifacts";

/// The purpose in the temp names of downloaded bodies and of cache copies placed at a
/// destination (`.nodeward-tmp.download.…`, see [`crate::durable`]).
pub(super) const DOWNLOAD_TEMP: &str = "download";

/// The read buffer: large enough that hashing and writing, not call overhead, dominate.
pub(super) const CHUNK: usize = 1 << 20;

/// How failed attempts are retried.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included (1 means no retry).
    pub max_attempts: u32,
    /// The wait before the first retry; it doubles for each further retry.
    pub base_delay: Duration,
    /// The longest wait between two attempts.
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 4,
            base_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(10),
        }
    }
}

impl RetryPolicy {
    /// The wait before retry number `retry` (1-based): `base * 2^(retry-1)`, capped at
    /// `max_delay`, then drawn uniformly from its upper half so that many nodes retrying the
    /// same mirror do not retry in lockstep.
    pub fn delay(&self, retry: u32) -> Duration {
        let exp = self
            .base_delay
            .saturating_mul(1u32 << retry.saturating_sub(1).min(20));
        let full = exp.min(self.max_delay);
        let half = full / 2;
        let nanos = u64::try_from(half.as_nanos()).unwrap_or(u64::MAX);
        half + Duration::from_nanos(fastrand::u64(0..=nanos))
    }
}

/// Limits and timeouts of one run's downloads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FetchPolicy {
    /// The largest body accepted, in bytes; a larger one fails the download.
    pub max_bytes: u64,
    /// Retries on connection errors and 5xx answers.
    pub retry: RetryPolicy,
    /// Connect timeout per attempt (cut down to the time left before the deadline).
    pub connect_timeout: Duration,
    /// Whole-request timeout per attempt, body included (cut down likewise).
    pub request_timeout: Duration,
    /// Redirects followed per attempt.
    pub max_redirects: u32,
    /// Bounds on unpacking an archive (`fetch-and-extract`).
    pub extract: ExtractLimits,
}

impl Default for FetchPolicy {
    fn default() -> Self {
        FetchPolicy {
            max_bytes: 2 << 30,
            retry: RetryPolicy::default(),
            connect_timeout: Duration::from_secs(15),
            request_timeout: Duration::from_secs(30 * 60),
            max_redirects: 10,
            extract: ExtractLimits::default(),
        }
    }
}

/// Everything a [`Fetcher`] is configured with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FetchConfig {
    /// The artifact cache beneath the host root; entries are `<cache_dir>/sha256/<hex>`.
    pub cache_dir: HostPath,
    /// Limits, retries and timeouts.
    pub policy: FetchPolicy,
    /// The CAs HTTPS downloads trust.
    pub trust: Trust,
    /// The offline archive the run's artifacts came from (`--offline FILE`): when set, no
    /// request is ever sent; what the cache does not hold is refused naming it.
    pub offline: Option<String>,
}

/// Performs one capability call's download work against the host root.
pub struct Fetcher<'a> {
    pub(super) config: FetchConfig,
    pub(super) deadline: Instant,
    pub(super) may_fetch: &'a dyn Fn(&Url) -> bool,
    pub(super) client: OnceCell<reqwest::blocking::Client>,
    root: &'a Dir,
    cache: ArtifactCache<'a>,
}

/// Hashes everything `r` yields, copying it to `w` when given; stops with a
/// [`LimitHit::Deadline`] error at `deadline`, since a large file takes seconds.
pub(super) fn hash_copy(
    r: &mut impl Read,
    mut w: Option<&mut File>,
    deadline: Instant,
) -> io::Result<(String, u64)> {
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; CHUNK];
    let mut total = 0u64;
    loop {
        if Instant::now() >= deadline {
            return Err(LimitHit::Deadline.io());
        }
        let n = match r.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        hasher.update(&buf[..n]);
        if let Some(w) = w.as_deref_mut() {
            w.write_all(&buf[..n])?;
        }
        total += n as u64;
    }
    Ok((hex::encode(hasher.finalize()), total))
}

impl<'a> Fetcher<'a> {
    /// A fetcher over the host root `root` for one call: `deadline` bounds all waiting and
    /// `may_fetch` is the phase's URL grant, applied to every redirect target.
    pub fn new(
        root: &'a Dir,
        config: FetchConfig,
        deadline: Instant,
        may_fetch: &'a dyn Fn(&Url) -> bool,
    ) -> Self {
        Fetcher {
            cache: ArtifactCache::new(root, config.cache_dir.clone(), deadline),
            root,
            config,
            deadline,
            may_fetch,
            client: OnceCell::new(),
        }
    }

    pub(super) fn remaining(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    /// What bounds an extraction made for this call.
    pub fn extract_bounds(&self) -> ExtractBounds {
        ExtractBounds {
            limits: self.config.policy.extract,
            deadline: self.deadline,
        }
    }

    /// Makes `dest` (a regular file beneath the root) hold the artifact `sha256` with `mode`:
    /// from the cache when it holds a verified copy, otherwise downloaded from `url`.
    /// Returns whether the cache served it.
    pub fn fetch_to(
        &self,
        url: &Url,
        sha256: &str,
        dest: &HostPath,
        mode: u32,
    ) -> Result<bool, DownloadError> {
        let fail = |e: io::Error| DownloadError::io(dest, e);
        // `dest` was resolved against the grant (it holds no symlink); its directory is opened
        // without following any, so a link swapped in since is refused, never written through.
        let parent = open_dir_nofollow_at(self.root, dest.parent().as_ref()).map_err(fail)?;
        let (tmp, from_cache) = match self.cache.copy_into(sha256, &parent, dest)? {
            Some(tmp) => (tmp, true),
            None => {
                let tmp = TempFile::new(&parent, DOWNLOAD_TEMP).map_err(fail)?;
                (self.download(url, sha256, tmp, dest)?, false)
            }
        };
        tmp.finish(mode).map_err(fail)?;
        if !from_cache {
            self.cache.remember(sha256, &tmp);
        }
        tmp.persist(dest.file_name()).map_err(fail)?;
        Ok(from_cache)
    }

    /// The cache entry for `sha256` opened and verified, downloading it from `url` first when
    /// it is missing or bad. The open handle is what callers read, so the bytes they see are
    /// the bytes that were verified.
    pub fn cached(&self, url: &Url, sha256: &str) -> Result<File, DownloadError> {
        if let Some(f) = self.cache.open_verified(sha256)? {
            super::cache::touch(&f, &self.cache.entry(sha256));
            return Ok(f);
        }
        let entry = HostPath::parse(&self.cache.entry(sha256))
            .map_err(|source| DownloadError::CachePath { source })?;
        let fail = |e: io::Error| DownloadError::io(&entry, e);
        let cache = self.cache.dir(true).map_err(fail)?;
        let tmp = TempFile::new(&cache, DOWNLOAD_TEMP).map_err(fail)?;
        let tmp = self.download(url, sha256, tmp, &entry)?;
        tmp.finish(0o644).map_err(fail)?;
        let mut file = tmp.file.try_clone().map_err(fail)?;
        tmp.persist(sha256).map_err(fail)?;
        file.seek(SeekFrom::Start(0)).map_err(fail)?;
        Ok(file)
    }

    /// Downloads `url` into a new temp file in `dir` (`0600`, anonymous where the filesystem
    /// allows) and returns it once its bytes hashed to `sha256`, positioned at its start: for
    /// a caller that reads the bytes once and keeps nothing (a bundle installed by URL,
    /// `crate::bundle::fetch`). The cache is neither consulted nor written. `name` names the
    /// file in errors. Dropping the returned file removes it.
    pub fn download_temp<'d>(
        &self,
        dir: &'d Dir,
        url: &Url,
        sha256: &str,
        name: &dyn std::fmt::Display,
    ) -> Result<TempFile<'d>, DownloadError> {
        let fail = |e: io::Error| DownloadError::io(name, e);
        let tmp = TempFile::new(dir, DOWNLOAD_TEMP).map_err(fail)?;
        let mut tmp = self.download(url, sha256, tmp, name)?;
        tmp.file.seek(SeekFrom::Start(0)).map_err(fail)?;
        Ok(tmp)
    }

    /// The cache entry for `sha256`, verified, without any request and without writing
    /// anything (plan mode uses it); `None` when it is missing or does not match.
    pub fn open_cached(&self, sha256: &str) -> Result<Option<File>, DownloadError> {
        self.cache.open_verified(sha256)
    }

    /// Removes the cache entry for `sha256` (an archive that was refused).
    pub fn forget(&self, sha256: &str) {
        self.cache.forget(sha256);
    }

    /// Adds the bytes `reader` yields as the cache entry for `sha256` (an offline archive's
    /// artifact, `crate::offline`), hashing them on the way: only bytes that hash to `sha256`
    /// become an entry. An entry already there and verified is kept (the bytes are still
    /// hashed, so a bad archive is refused whatever the cache holds). No request is sent.
    pub fn import(
        &self,
        sha256: &str,
        mut reader: &mut dyn Read,
    ) -> Result<Imported, DownloadError> {
        let entry = HostPath::parse(&self.cache.entry(sha256))
            .map_err(|source| DownloadError::CachePath { source })?;
        let fail = |e: io::Error| DownloadError::io(&entry, e);
        if self.cache.open_verified(sha256)?.is_some() {
            let (actual, _) = hash_copy(&mut reader, None, self.deadline).map_err(fail)?;
            return Ok(if actual == sha256 {
                Imported::AlreadyCached
            } else {
                Imported::Mismatch { actual }
            });
        }
        let cache = self.cache.dir(true).map_err(fail)?;
        let mut tmp = TempFile::new(&cache, DOWNLOAD_TEMP).map_err(fail)?;
        let (actual, _) =
            hash_copy(&mut reader, Some(&mut tmp.file), self.deadline).map_err(fail)?;
        if actual != sha256 {
            return Ok(Imported::Mismatch { actual });
        }
        tmp.finish(0o644).map_err(fail)?;
        tmp.persist(sha256).map_err(fail)?;
        Ok(Imported::Added)
    }
}

/// What [`Fetcher::import`] did with an artifact's bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Imported {
    /// They hashed to the digest and are now its cache entry.
    Added,
    /// They hashed to the digest, which the cache already held.
    AlreadyCached,
    /// They hashed to `actual`, not to the digest: nothing was added.
    Mismatch {
        /// Their sha256.
        actual: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_is_capped() {
        let p = RetryPolicy {
            max_attempts: 5,
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_millis(300),
        };
        for _ in 0..50 {
            let d1 = p.delay(1);
            assert!(d1 >= Duration::from_millis(50) && d1 <= Duration::from_millis(100));
            let d2 = p.delay(2);
            assert!(d2 >= Duration::from_millis(100) && d2 <= Duration::from_millis(200));
            let d9 = p.delay(9);
            assert!(d9 >= Duration::from_millis(150) && d9 <= Duration::from_millis(300));
        }
    }
}
