//! The download engine behind `nodeward:host/download`: HTTP, verification, the artifact cache
//! and tarball extraction.
//!
//! # Background
//! A phase names every artifact by its sha256, so the bytes it gets are the bytes its author
//! pinned, whoever serves them. This module is the only code that talks to the network. The
//! capability module ([`crate::caps::download`]) checks the grants and the run mode, then calls
//! a [`Fetcher`], which does the rest against the host root's `cap_std` directory, so every
//! file it writes resolves beneath the root.
//!
//! # Guarantees
//! - Bytes that do not hash to the expected digest never reach their destination: a body is
//!   streamed into a `0600` temp file in the destination's own directory while it is hashed,
//!   fsynced, and renamed over the destination only after the digest matched. On any failure
//!   the temp file is removed.
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

use crate::caps::Error;
use crate::caps::hostfs::io_error;
use crate::hostpath::{HostPath, is_escape, open_dir_nofollow_at};
use cap_std::fs::{Dir, File, MetadataExt, OpenOptions, OpenOptionsExt, PermissionsExt};
use sha2::{Digest, Sha256};
use std::cell::OnceCell;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, IsTerminal, Read, Seek, SeekFrom, Write};
use std::time::{Duration, Instant};
use url::Url;

mod bounds;
use bounds::{Bounded, Meter};
pub use bounds::{ExtractBounds, ExtractLimits, LimitHit};

/// Where artifacts are cached beneath the host root unless configured otherwise.
pub const DEFAULT_CACHE_DIR: &str = "var/lib/nodeward/artifacts";

/// The read buffer: large enough that hashing and writing, not call overhead, dominate.
const CHUNK: usize = 1 << 20;

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
}

/// Performs one capability call's download work against the host root.
pub struct Fetcher<'a> {
    root: &'a Dir,
    config: FetchConfig,
    deadline: Instant,
    may_fetch: &'a dyn Fn(&Url) -> bool,
    client: OnceCell<reqwest::blocking::Client>,
}

/// What extracting an archive did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Extracted {
    /// The directory did not exist; it was created and filled.
    Created,
    /// Some entries were written.
    Changed,
    /// Every entry already was in place.
    Unchanged,
}

/// Why one attempt did not produce the bytes.
enum Failure {
    /// Worth another attempt: a connection error, a body cut short, a 5xx.
    Retry(String),
    /// Final: the error the call returns.
    Fatal(Error),
}

/// A named temp file that is removed when dropped unless it was renamed into place.
///
/// A name (rather than an unnamed `O_TMPFILE`) is needed so the verified file can be hard
/// linked into the cache before it is renamed over its destination.
struct TempFile<'d> {
    dir: &'d Dir,
    name: String,
    file: File,
    live: bool,
}

impl<'d> TempFile<'d> {
    /// Creates `<parent>/.<base>.nodeward-<random>` (mode 0600) in `dir`, where `parent` is a
    /// path relative to `dir` (empty for `dir` itself).
    fn create(dir: &'d Dir, parent: &str, base: &str) -> io::Result<Self> {
        let mut last = io::Error::other("no temp name tried");
        for _ in 0..16 {
            let leaf = format!(".{base}.nodeward-{:016x}", fastrand::u64(..));
            let name = join(parent, &leaf);
            let mut opts = OpenOptions::new();
            opts.read(true).write(true).create_new(true).mode(0o600);
            match dir.open_with(&name, &opts) {
                Ok(file) => {
                    return Ok(TempFile {
                        dir,
                        name,
                        file,
                        live: true,
                    });
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = e,
                Err(e) => return Err(e),
            }
        }
        Err(last)
    }

    /// Sets the mode and makes the contents durable.
    fn finish(&self, mode: u32) -> io::Result<()> {
        rustix::fs::fchmod(&self.file, rustix::fs::Mode::from_raw_mode(mode))?;
        self.file.sync_all()
    }

    /// Renames the temp file over `to` (relative to the same directory handle).
    fn persist(mut self, to: &str) -> io::Result<()> {
        self.dir.rename(&self.name, self.dir, to)?;
        self.live = false;
        Ok(())
    }
}

impl Drop for TempFile<'_> {
    fn drop(&mut self) {
        if self.live {
            let _ = self.dir.remove_file(&self.name);
        }
    }
}

/// `parent/leaf`, or `leaf` when `parent` is empty.
fn join(parent: &str, leaf: &str) -> String {
    if parent.is_empty() {
        leaf.to_string()
    } else {
        format!("{parent}/{leaf}")
    }
}

/// Opens cache entry `name` in `cache` for reading, without following a symlink there.
fn open_entry(cache: &Dir, name: &str) -> io::Result<File> {
    use rustix::fs::{Mode, OFlags, openat};
    let fd = openat(
        cache,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    Ok(File::from_std(std::fs::File::from(fd)))
}

/// Makes a directory's entries durable (the handle may be `O_PATH`, so it is reopened).
fn fsync_dir(dir: &Dir, path: &str) -> io::Result<()> {
    let path = if path.is_empty() { "." } else { path };
    dir.open_with(path, OpenOptions::new().read(true))?
        .sync_all()
}

/// The error and its sources, `: `-separated (reqwest's own message is terse).
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        let text = inner.to_string();
        if !s.contains(&text) {
            s.push_str(": ");
            s.push_str(&text);
        }
        source = inner.source();
    }
    s
}

/// Whether an I/O error from a response body is reqwest's timeout.
fn is_timeout_io(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::TimedOut
        || e.get_ref()
            .and_then(|inner| inner.downcast_ref::<reqwest::Error>())
            .is_some_and(reqwest::Error::is_timeout)
}

/// Hashes everything `r` yields, copying it to `w` when given; stops with a
/// [`LimitHit::Deadline`] error at `deadline`, since a large file takes seconds.
fn hash_copy(
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

/// A progress bar on stderr when it is a terminal; a hidden one (which draws nothing) when it
/// is not, so logs and CI output stay clean.
fn progress(len: Option<u64>, url: &Url) -> indicatif::ProgressBar {
    if !io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = match len {
        Some(n) => indicatif::ProgressBar::new(n),
        None => indicatif::ProgressBar::new_spinner(),
    };
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
    ) {
        bar.set_style(style.progress_chars("=> "));
    }
    let name = url.path_segments().and_then(|mut s| s.next_back());
    bar.set_message(name.unwrap_or("download").to_string());
    bar
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
            root,
            config,
            deadline,
            may_fetch,
            client: OnceCell::new(),
        }
    }

    fn remaining(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    /// What bounds an extraction made for this call.
    pub fn extract_bounds(&self) -> ExtractBounds {
        ExtractBounds {
            limits: self.config.policy.extract,
            deadline: self.deadline,
        }
    }

    /// `timeout` for verifying the cache entry `entry` when the deadline passed meanwhile.
    fn cache_timeout(entry: &str) -> Error {
        Error::Timeout(format!(
            "{entry}: the phase deadline passed while verifying the cached artifact"
        ))
    }

    fn cache_entry(&self, sha256: &str) -> String {
        format!("{}/sha256/{sha256}", self.config.cache_dir)
    }

    fn timeout(&self, url: &Url, what: &str) -> Error {
        Error::Timeout(format!(
            "download {url}: {what} (the phase deadline allows no more waiting)"
        ))
    }

    /// The HTTP client, built on first use so cache hits never start one. Redirect policy
    /// none: [`Fetcher::attempt`] follows redirects itself so that each target is checked
    /// against the grant.
    fn client(&self) -> Result<&reqwest::blocking::Client, Error> {
        if let Some(c) = self.client.get() {
            return Ok(c);
        }
        let client = reqwest::blocking::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(self.config.policy.connect_timeout.min(self.remaining()))
            .user_agent(concat!("nodeward/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| Error::Io(format!("cannot start the HTTP client: {}", chain(&e))))?;
        Ok(self.client.get_or_init(|| client))
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
    ) -> Result<bool, Error> {
        let fail = |e: io::Error| io_error(dest, e);
        // `dest` was resolved against the grant (it holds no symlink); its directory is opened
        // without following any, so a link swapped in since is refused, never written through.
        let parent = open_dir_nofollow_at(self.root, dest.parent().as_ref()).map_err(fail)?;
        let base = dest.file_name();
        let (tmp, from_cache) = match self.copy_from_cache(sha256, &parent, base, dest)? {
            Some(tmp) => (tmp, true),
            None => {
                let tmp = TempFile::create(&parent, "", base).map_err(fail)?;
                (self.download(url, sha256, tmp, dest)?, false)
            }
        };
        tmp.finish(mode).map_err(fail)?;
        if !from_cache {
            self.remember(sha256, &parent, &tmp.name);
        }
        tmp.persist(base).map_err(fail)?;
        fsync_dir(&parent, "").map_err(fail)?;
        Ok(from_cache)
    }

    /// Copies the cached artifact into a temp file next to `dest`, hashing it on the way;
    /// `None` when there is no entry or it does not match (a bad entry is removed).
    fn copy_from_cache<'p>(
        &self,
        sha256: &str,
        parent: &'p Dir,
        base: &str,
        dest: &HostPath,
    ) -> Result<Option<TempFile<'p>>, Error> {
        let entry = self.cache_entry(sha256);
        let Ok(cache) = self.cache_dir(false) else {
            return Ok(None);
        };
        let Ok(mut cached) = open_entry(&cache, sha256) else {
            return Ok(None);
        };
        let mut tmp = TempFile::create(parent, "", base).map_err(|e| io_error(dest, e))?;
        match hash_copy(&mut cached, Some(&mut tmp.file), self.deadline) {
            Ok((digest, _)) if digest == sha256 => Ok(Some(tmp)),
            Err(e) if LimitHit::of(&e).is_some() => Err(Self::cache_timeout(&entry)),
            Ok((digest, _)) => {
                tracing::warn!(
                    entry,
                    digest,
                    "cached artifact does not match its name; removed"
                );
                let _ = cache.remove_file(sha256);
                Ok(None)
            }
            Err(e) => {
                tracing::warn!(entry, error = %e, "cannot read cached artifact; downloading");
                Ok(None)
            }
        }
    }

    /// Adds the verified file `name` (in directory `src`) to the cache: a hard link when
    /// possible, a copy otherwise. Best effort: a cache that cannot be written costs a
    /// download next time, not this call.
    fn remember(&self, sha256: &str, src: &Dir, name: &str) {
        let entry = self.cache_entry(sha256);
        let result = (|| -> io::Result<()> {
            let cache = self.cache_dir(true)?;
            let link = format!(".{sha256}.nodeward-{:016x}", fastrand::u64(..));
            if src.hard_link(name, &cache, &link).is_ok() {
                let renamed = cache.rename(&link, &cache, sha256);
                if renamed.is_err() {
                    let _ = cache.remove_file(&link);
                }
                renamed?;
            } else {
                let mut src = src.open(name)?;
                let mut tmp = TempFile::create(&cache, "", sha256)?;
                io::copy(&mut src, &mut tmp.file)?;
                tmp.finish(0o644)?;
                tmp.persist(sha256)?;
            }
            fsync_dir(&cache, "")
        })();
        if let Err(e) = result {
            tracing::warn!(entry, error = %e, "cannot add the artifact to the cache");
        }
    }

    /// The cache entry for `sha256` opened and verified, downloading it from `url` first when
    /// it is missing or bad. The open handle is what callers read, so the bytes they see are
    /// the bytes that were verified.
    pub fn cached(&self, url: &Url, sha256: &str) -> Result<File, Error> {
        if let Some(f) = self.open_cached(sha256)? {
            return Ok(f);
        }
        let entry = HostPath::parse(&self.cache_entry(sha256))
            .map_err(|e| Error::InvalidArgument(e.to_string()))?;
        let fail = |e: io::Error| io_error(&entry, e);
        let cache = self.cache_dir(true).map_err(fail)?;
        let tmp = TempFile::create(&cache, "", sha256).map_err(fail)?;
        let tmp = self.download(url, sha256, tmp, &entry)?;
        tmp.finish(0o644).map_err(fail)?;
        let mut file = tmp.file.try_clone().map_err(fail)?;
        tmp.persist(sha256).map_err(fail)?;
        fsync_dir(&cache, "").map_err(fail)?;
        file.seek(SeekFrom::Start(0)).map_err(fail)?;
        Ok(file)
    }

    /// The cache entry for `sha256`, verified, without any request and without writing
    /// anything (plan mode uses it); `None` when it is missing or does not match.
    pub fn open_cached(&self, sha256: &str) -> Result<Option<File>, Error> {
        let entry = self.cache_entry(sha256);
        let Ok(cache) = self.cache_dir(false) else {
            return Ok(None);
        };
        let Ok(mut f) = open_entry(&cache, sha256) else {
            return Ok(None);
        };
        match hash_copy(&mut f, None, self.deadline) {
            Err(e) if LimitHit::of(&e).is_some() => Err(Self::cache_timeout(&entry)),
            Ok((digest, _)) if digest == sha256 => {
                f.seek(SeekFrom::Start(0))
                    .map_err(|e| Error::Io(format!("{entry}: {e}")))?;
                Ok(Some(f))
            }
            Ok(_) | Err(_) => Ok(None),
        }
    }

    /// Removes the cache entry for `sha256` (an archive that was refused).
    pub fn forget(&self, sha256: &str) {
        if let Ok(cache) = self.cache_dir(false) {
            let _ = cache.remove_file(sha256);
        }
    }

    /// The cache's `sha256/` directory, opened without following any link (made first, with
    /// its parents, when `create`): the cache is the agent's own path, not a grant's, so a link
    /// planted in it is refused rather than followed to wherever it points beneath the root.
    fn cache_dir(&self, create: bool) -> io::Result<Dir> {
        let dir = HostPath::parse(&format!("{}/sha256", self.config.cache_dir))
            .map_err(io::Error::other)?;
        if create {
            for prefix in dir.prefixes() {
                let parent = open_dir_nofollow_at(self.root, prefix.parent().as_ref())?;
                match parent.create_dir(prefix.file_name()) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(e),
                }
            }
        }
        open_dir_nofollow_at(self.root, Some(&dir))
    }

    /// Downloads `url` into `tmp` with retries, returning it once the body hashed to `sha256`.
    fn download<'t>(
        &self,
        url: &Url,
        sha256: &str,
        mut tmp: TempFile<'t>,
        dest: &HostPath,
    ) -> Result<TempFile<'t>, Error> {
        let retry = &self.config.policy.retry;
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            tmp.file
                .set_len(0)
                .and_then(|()| tmp.file.seek(SeekFrom::Start(0)).map(drop))
                .map_err(|e| io_error(dest, e))?;
            let why = match self.attempt(url, sha256, &mut tmp.file, dest) {
                Ok(()) => return Ok(tmp),
                Err(Failure::Fatal(e)) => return Err(e),
                Err(Failure::Retry(why)) => why,
            };
            if attempt >= retry.max_attempts.max(1) {
                return Err(Error::Failed(format!(
                    "download {url}: {why} (gave up after {attempt} attempts)"
                )));
            }
            let delay = retry.delay(attempt);
            if delay >= self.remaining() {
                return Err(self.timeout(
                    url,
                    &format!(
                        "{why}; attempt {attempt} failed and no retry fits before the deadline"
                    ),
                ));
            }
            tracing::warn!(%url, attempt, ?delay, reason = %why, "download failed; retrying");
            std::thread::sleep(delay);
        }
    }

    /// One attempt: follow redirects (each re-checked against the grant), then stream the
    /// body into `file` while hashing it.
    fn attempt(
        &self,
        url: &Url,
        sha256: &str,
        file: &mut File,
        dest: &HostPath,
    ) -> Result<(), Failure> {
        let client = self.client().map_err(Failure::Fatal)?;
        let policy = &self.config.policy;
        let mut current = url.clone();
        let mut hops = 0u32;
        let mut resp = loop {
            let left = self.remaining();
            if left.is_zero() {
                return Err(Failure::Fatal(self.timeout(url, "deadline passed")));
            }
            let sent = client
                .get(current.clone())
                .timeout(policy.request_timeout.min(left))
                .send();
            let resp = match sent {
                Ok(r) => r,
                Err(e) if e.is_timeout() => {
                    return Err(Failure::Fatal(
                        self.timeout(url, &format!("no answer from {current} in time")),
                    ));
                }
                Err(e) if e.is_builder() => {
                    return Err(Failure::Fatal(Error::InvalidArgument(format!(
                        "download {current}: {}",
                        chain(&e)
                    ))));
                }
                Err(e) => return Err(Failure::Retry(format!("{current}: {}", chain(&e)))),
            };
            let status = resp.status();
            if status.is_redirection() {
                let next = resp
                    .headers()
                    .get(reqwest::header::LOCATION)
                    .and_then(|l| l.to_str().ok())
                    .and_then(|l| current.join(l).ok());
                let Some(next) = next else {
                    return Err(Failure::Fatal(Error::Failed(format!(
                        "download {url}: {current} answered {status} without a usable Location"
                    ))));
                };
                hops += 1;
                if hops > policy.max_redirects {
                    return Err(Failure::Fatal(Error::Failed(format!(
                        "download {url}: more than {} redirects",
                        policy.max_redirects
                    ))));
                }
                if !matches!(next.scheme(), "http" | "https")
                    || !next.username().is_empty()
                    || next.password().is_some()
                    || !(self.may_fetch)(&next)
                {
                    return Err(Failure::Fatal(crate::caps::denied(
                        format!("download {url}: redirect to {next}"),
                        "download.urls",
                    )));
                }
                current = next;
                continue;
            }
            if status.is_server_error() {
                return Err(Failure::Retry(format!("{current} answered {status}")));
            }
            if !status.is_success() {
                return Err(Failure::Fatal(Error::Failed(format!(
                    "download {url}: {current} answered {status}"
                ))));
            }
            break resp;
        };
        let len = resp.content_length();
        if let Some(n) = len.filter(|n| *n > policy.max_bytes) {
            return Err(Failure::Fatal(Error::Failed(format!(
                "download {url}: body of {n} bytes is larger than the {} byte limit",
                policy.max_bytes
            ))));
        }
        let bar = progress(len, url);
        let mut hasher = Sha256::new();
        let mut buf = vec![0u8; CHUNK];
        let mut total = 0u64;
        loop {
            let n = match resp.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if is_timeout_io(&e) || self.remaining().is_zero() => {
                    return Err(Failure::Fatal(self.timeout(
                        url,
                        &format!("body from {current} stalled after {total} bytes"),
                    )));
                }
                Err(e) => {
                    return Err(Failure::Retry(format!(
                        "{current}: body cut short after {total} bytes: {}",
                        chain(&e)
                    )));
                }
            };
            total += n as u64;
            // reqwest's timeouts cover the body too; this also stops a body that trickles in
            // just fast enough never to trip a per-read timeout.
            if self.remaining().is_zero() {
                return Err(Failure::Fatal(self.timeout(
                    url,
                    &format!("body from {current} still arriving after {total} bytes"),
                )));
            }
            if total > policy.max_bytes {
                return Err(Failure::Fatal(Error::Failed(format!(
                    "download {url}: body is larger than the {} byte limit",
                    policy.max_bytes
                ))));
            }
            hasher.update(&buf[..n]);
            file.write_all(&buf[..n])
                .map_err(|e| Failure::Fatal(io_error(dest, e)))?;
            bar.inc(n as u64);
        }
        bar.finish_and_clear();
        if let Some(n) = len.filter(|n| *n != total) {
            return Err(Failure::Retry(format!(
                "{current}: body cut short: {total} of {n} bytes"
            )));
        }
        let actual = hex::encode(hasher.finalize());
        if actual != sha256 {
            return Err(Failure::Fatal(Error::Failed(format!(
                "download {url}: sha256 mismatch: expected {sha256}, got {actual} \
                 ({total} bytes); the bytes were discarded"
            ))));
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Extraction
// ---------------------------------------------------------------------------------------------

/// The longest symlink target extracted (Linux `PATH_MAX`); each is kept in memory until the
/// archive is written.
const MAX_LINK_TARGET: usize = 4096;

/// One archive entry as it will exist beneath the destination.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Item {
    Dir {
        mode: u32,
    },
    File {
        mode: u32,
        sha256: String,
        size: u64,
    },
    Symlink {
        target: String,
    },
    HardLink {
        target: String,
    },
}

impl Item {
    fn kind(&self) -> &'static str {
        match self {
            Item::Dir { .. } => "directory",
            Item::File { .. } => "file",
            Item::Symlink { .. } => "symlink",
            Item::HardLink { .. } => "hard link",
        }
    }
}

/// The validated contents of an archive: each destination path's final entry and the index
/// of that entry in the archive.
#[derive(Debug, Default)]
pub struct ArchivePlan {
    items: BTreeMap<String, (usize, Item)>,
}

/// Splits an archive name into its components after `strip` leading ones, refusing absolute
/// names and `..`; `None` when nothing is left (the entry is skipped, as `tar` does).
/// Public (hidden) only so the fuzzer (`fuzz/`) can reach it.
#[doc(hidden)]
pub fn entry_path(raw: &[u8], strip: u32) -> Result<Option<String>, String> {
    let name = std::str::from_utf8(raw).map_err(|_| "name is not UTF-8".to_string())?;
    if name.starts_with('/') {
        return Err("absolute name".into());
    }
    let mut parts = Vec::new();
    for c in name.split('/') {
        match c {
            "" | "." => {}
            ".." => return Err("name contains '..'".into()),
            c if c.contains('\0') => return Err("name contains a NUL byte".into()),
            c => parts.push(c),
        }
    }
    let strip = usize::try_from(strip).unwrap_or(usize::MAX);
    if parts.len() <= strip {
        return Ok(None);
    }
    let path = parts[strip..].join("/");
    HostPath::parse(&path).map_err(|e| e.reason.to_string())?;
    Ok(Some(path))
}

/// Every proper ancestor of a relative path: `a`, `a/b` for `a/b/c`.
fn ancestors(path: &str) -> impl Iterator<Item = &str> {
    path.match_indices('/').map(|(i, _)| &path[..i])
}

/// Whether `path` (relative to `dest`) is a symlink on disk.
fn is_disk_symlink(dest: Option<&Dir>, path: &str) -> bool {
    dest.and_then(|d| d.symlink_metadata(path).ok())
        .is_some_and(|m| m.file_type().is_symlink())
}

impl ArchivePlan {
    /// Reads the whole archive and refuses it, before anything is written, when an entry is
    /// absolute, contains `..`, is not a file, directory, symlink or hard link, would lie
    /// beneath something that is not a directory, is a symlink whose target leaves the
    /// destination (or climbs out of another symlink), or is a hard link to anything but an
    /// earlier file of the archive. `dest` is the destination directory when it exists.
    ///
    /// Reading stops, and the archive is refused, at the phase deadline (`timeout`) and at
    /// each limit of `bounds` (`failed` naming it), so nothing is written in either case.
    pub fn validate(
        archive: &mut File,
        strip: u32,
        dest: Option<&Dir>,
        url: &Url,
        bounds: &ExtractBounds,
    ) -> Result<Self, Error> {
        let refuse = |name: &str, why: &str| {
            Error::Failed(format!(
                "archive {url}: entry {name:?} refused ({why}); nothing was extracted"
            ))
        };
        let meter = Meter::new(true);
        let bad = |e: io::Error| match meter.hit().or(LimitHit::of(&e)) {
            Some(hit) => hit.error(&bounds.limits, url, "nothing was extracted"),
            None => Error::Failed(format!("archive {url}: not a valid .tar.gz: {e}")),
        };
        archive.seek(SeekFrom::Start(0)).map_err(bad)?;
        let stream = Bounded::new(archive, &meter, bounds.limits, bounds.deadline);
        let mut tar = tar::Archive::new(stream);
        let mut plan = ArchivePlan::default();
        for (index, entry) in tar.entries().map_err(bad)?.enumerate() {
            if index >= bounds.limits.max_entries {
                return Err(bad(meter.stop(LimitHit::Entries)));
            }
            let mut entry = entry.map_err(bad)?;
            meter.next_entry();
            let raw = entry.path_bytes().into_owned();
            let shown = String::from_utf8_lossy(&raw).into_owned();
            let header = entry.header();
            let kind = header.entry_type();
            let mode = header.mode().map_err(bad)? & 0o777;
            let path = entry_path(&raw, strip).map_err(|why| refuse(&shown, &why))?;
            let item = match kind {
                tar::EntryType::XGlobalHeader => continue,
                tar::EntryType::Directory => Item::Dir { mode },
                tar::EntryType::Regular | tar::EntryType::Continuous => {
                    let (sha256, size) = meter
                        .contents(|| hash_copy(&mut entry, None, bounds.deadline))
                        .map_err(bad)?;
                    Item::File { mode, sha256, size }
                }
                tar::EntryType::Symlink => {
                    let target = entry
                        .link_name_bytes()
                        .map(|t| t.into_owned())
                        .unwrap_or_default();
                    let target = String::from_utf8(target)
                        .map_err(|_| refuse(&shown, "link target is not UTF-8"))?;
                    if target.is_empty() || target.contains('\0') {
                        return Err(refuse(&shown, "empty link target"));
                    }
                    if target.len() > MAX_LINK_TARGET {
                        return Err(refuse(&shown, "link target longer than 4096 bytes"));
                    }
                    if target.starts_with('/') {
                        return Err(refuse(&shown, "absolute symlink target"));
                    }
                    Item::Symlink { target }
                }
                tar::EntryType::Link => {
                    let target = entry
                        .link_name_bytes()
                        .map(|t| t.into_owned())
                        .unwrap_or_default();
                    let target = entry_path(&target, strip)
                        .map_err(|why| refuse(&shown, &format!("hard link target: {why}")))?
                        .ok_or_else(|| refuse(&shown, "hard link target is stripped away"))?;
                    match plan.items.get(&target) {
                        Some((_, Item::File { .. })) => Item::HardLink { target },
                        _ => {
                            return Err(refuse(
                                &shown,
                                "hard link to something that is not an earlier file",
                            ));
                        }
                    }
                }
                other => {
                    return Err(refuse(
                        &shown,
                        &format!("{other:?} entries are not extracted"),
                    ));
                }
            };
            let Some(path) = path else { continue };
            plan.items.insert(path, (index, item));
        }
        // Structure: nothing beneath a non-directory (no writing through links), no link that
        // climbs out of the destination, no hard link whose target was replaced later.
        for (path, (index, item)) in &plan.items {
            for prefix in ancestors(path) {
                if let Some((_, other)) = plan.items.get(prefix)
                    && !matches!(other, Item::Dir { .. })
                {
                    return Err(refuse(
                        path,
                        &format!("lies beneath {prefix}, which is a {}", other.kind()),
                    ));
                }
                if is_disk_symlink(dest, prefix) {
                    return Err(refuse(
                        path,
                        &format!("{prefix} is an existing symlink in the destination"),
                    ));
                }
            }
            match item {
                Item::Symlink { target } => plan
                    .check_link(path, target, dest)
                    .map_err(|why| refuse(path, &format!("symlink to {target:?} {why}")))?,
                Item::HardLink { target } => match plan.items.get(target) {
                    Some((t, Item::File { .. })) if t < index => {}
                    _ => {
                        return Err(refuse(path, "hard link target is replaced later"));
                    }
                },
                Item::Dir { .. } if is_disk_symlink(dest, path) => {
                    return Err(refuse(path, "an existing symlink is in the way"));
                }
                _ => {}
            }
        }
        Ok(plan)
    }

    /// Walks a symlink's target from the link's directory: it must stay beneath the
    /// destination, and must not apply `..` to a path that is itself a symlink (in the archive
    /// or on disk), because there the lexical walk and the real one part ways.
    fn check_link(&self, path: &str, target: &str, dest: Option<&Dir>) -> Result<(), String> {
        let mut cur: Vec<&str> = path.split('/').collect();
        cur.pop();
        for c in target.split('/') {
            match c {
                "" | "." => {}
                ".." => {
                    let here = cur.join("/");
                    if !here.is_empty()
                        && (matches!(self.items.get(&here), Some((_, Item::Symlink { .. })))
                            || is_disk_symlink(dest, &here))
                    {
                        return Err(format!("climbs out of the symlink {here}"));
                    }
                    if cur.pop().is_none() {
                        return Err("leaves the destination".into());
                    }
                }
                c => cur.push(c),
            }
        }
        Ok(())
    }

    /// The paths (relative to the destination) whose entry is not already in place; a
    /// [`LimitHit::Deadline`] error when hashing the files there reaches `deadline`.
    pub fn out_of_place(
        &self,
        dest: Option<&Dir>,
        deadline: Instant,
    ) -> Result<BTreeSet<String>, io::Error> {
        let mut todo = BTreeSet::new();
        for (path, (_, item)) in &self.items {
            let in_place = match dest {
                None => false,
                Some(d) => self.in_place(d, path, item, deadline)?,
            };
            if !in_place {
                todo.insert(path.clone());
            }
        }
        Ok(todo)
    }

    fn in_place(&self, dest: &Dir, path: &str, item: &Item, deadline: Instant) -> io::Result<bool> {
        let meta = match dest.symlink_metadata(path) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(e) if e.raw_os_error() == Some(rustix::io::Errno::NOTDIR.raw_os_error()) => {
                return Ok(false);
            }
            Err(e) => return Err(e),
        };
        let mode = meta.permissions().mode() & 0o777;
        let file_matches = |want_mode: u32, want_sha: &str, want_size: u64| -> io::Result<bool> {
            if !meta.is_file() || mode != want_mode || meta.size() != want_size {
                return Ok(false);
            }
            let (sha, _) = hash_copy(&mut dest.open(path)?, None, deadline)?;
            Ok(sha == want_sha)
        };
        match item {
            Item::Dir { mode: want } => Ok(meta.is_dir() && mode == *want),
            Item::File { mode, sha256, size } => file_matches(*mode, sha256, *size),
            Item::HardLink { target } => match self.items.get(target) {
                Some((_, Item::File { mode, sha256, size })) => file_matches(*mode, sha256, *size),
                _ => Ok(false),
            },
            Item::Symlink { target } => Ok(meta.file_type().is_symlink()
                && dest
                    .read_link_contents(path)
                    .is_ok_and(|t| t.as_os_str() == target.as_str())),
        }
    }

    /// Writes the entries in `todo` into `dest` (a handle on the destination directory), each
    /// file through a temp file and a rename, then sets directory modes and fsyncs.
    ///
    /// The archive was validated within the same `bounds`, so only the deadline can stop this
    /// (`timeout`): the entries already renamed into place stay, the one being written is
    /// removed with its temp file, and a later run extracts what is missing.
    #[allow(clippy::too_many_arguments)]
    pub fn write(
        &self,
        archive: &mut File,
        strip: u32,
        dest: &Dir,
        dest_path: &HostPath,
        todo: &BTreeSet<String>,
        url: &Url,
        bounds: &ExtractBounds,
    ) -> Result<(), Error> {
        const PARTIAL: &str = "the entries written before it stay and a later run completes them";
        let meter = Meter::new(false);
        let at = |path: &str| HostPath::parse(&join(dest_path.as_str(), path)).ok();
        let fail = |path: &str, e: io::Error| match (meter.hit().or(LimitHit::of(&e)), at(path)) {
            (Some(hit), _) => hit.error(&bounds.limits, url, PARTIAL),
            (None, Some(p)) => io_error(&p, e),
            (None, None) => Error::Io(format!("{dest_path}/{path}: {e}")),
        };
        let bad = |e: io::Error| match meter.hit().or(LimitHit::of(&e)) {
            Some(hit) => hit.error(&bounds.limits, url, PARTIAL),
            None => Error::Failed(format!("archive {url}: {e}")),
        };
        archive.seek(SeekFrom::Start(0)).map_err(bad)?;
        let stream = Bounded::new(archive, &meter, bounds.limits, bounds.deadline);
        let mut tar = tar::Archive::new(stream);
        let mut touched: BTreeSet<String> = BTreeSet::new();
        for (index, entry) in tar.entries().map_err(bad)?.enumerate() {
            let mut entry = entry.map_err(bad)?;
            let Ok(Some(path)) = entry_path(&entry.path_bytes(), strip) else {
                continue;
            };
            let Some((final_index, item)) = self.items.get(&path) else {
                continue;
            };
            if *final_index != index || !todo.contains(&path) {
                continue;
            }
            let (parent, leaf) = path.rsplit_once('/').unwrap_or(("", path.as_str()));
            if !parent.is_empty() {
                dest.create_dir_all(parent).map_err(|e| fail(parent, e))?;
            }
            match item {
                Item::Dir { .. } => match dest.create_dir(&path) {
                    Ok(()) => {}
                    Err(e)
                        if e.kind() == io::ErrorKind::AlreadyExists
                            && dest.symlink_metadata(&path).is_ok_and(|m| m.is_dir()) => {}
                    Err(e) => return Err(fail(&path, e)),
                },
                Item::File { mode, sha256, .. } => {
                    let mut tmp =
                        TempFile::create(dest, parent, leaf).map_err(|e| fail(&path, e))?;
                    let (got, _) = hash_copy(&mut entry, Some(&mut tmp.file), bounds.deadline)
                        .map_err(|e| fail(&path, e))?;
                    if got != *sha256 {
                        return Err(Error::Failed(format!(
                            "archive {url}: entry {path} changed between validation and extraction"
                        )));
                    }
                    tmp.finish(*mode).map_err(|e| fail(&path, e))?;
                    tmp.persist(&path).map_err(|e| fail(&path, e))?;
                }
                Item::Symlink { target } => {
                    let tmp = join(
                        parent,
                        &format!(".{leaf}.nodeward-{:016x}", fastrand::u64(..)),
                    );
                    dest.symlink(target, &tmp).map_err(|e| fail(&path, e))?;
                    if let Err(e) = dest.rename(&tmp, dest, &path) {
                        let _ = dest.remove_file(&tmp);
                        return Err(fail(&path, e));
                    }
                }
                Item::HardLink { target } => {
                    let tmp = join(
                        parent,
                        &format!(".{leaf}.nodeward-{:016x}", fastrand::u64(..)),
                    );
                    dest.hard_link(target, dest, &tmp)
                        .map_err(|e| fail(&path, e))?;
                    if let Err(e) = dest.rename(&tmp, dest, &path) {
                        let _ = dest.remove_file(&tmp);
                        return Err(fail(&path, e));
                    }
                }
            }
            touched.insert(parent.to_string());
        }
        // Directory modes last, so a read-only directory does not stop its own extraction.
        for (path, (_, item)) in self.items.iter().rev() {
            if let Item::Dir { mode } = item
                && todo.contains(path)
            {
                dest.set_permissions(path, cap_std::fs::Permissions::from_mode(*mode))
                    .map_err(|e| fail(path, e))?;
                touched.insert(path.clone());
            }
        }
        for dir in &touched {
            fsync_dir(dest, dir).map_err(|e| fail(dir, e))?;
        }
        Ok(())
    }
}

/// Extracts the verified archive `archive` into `dest_dir` beneath `root`, creating the
/// directory when missing (its parent must exist). In `dry_run` nothing is written: the
/// result says what extracting would do. `bounds` stop it at the phase deadline and the
/// extraction limits (see [`ArchivePlan::validate`] and [`ArchivePlan::write`]).
pub fn extract(
    root: &Dir,
    archive: &mut File,
    dest_dir: &HostPath,
    strip: u32,
    url: &Url,
    dry_run: bool,
    bounds: ExtractBounds,
) -> Result<Extracted, Error> {
    let fail = |e: io::Error| match LimitHit::of(&e) {
        Some(hit) => hit.error(&bounds.limits, url, "nothing was extracted"),
        None => io_error(dest_dir, e),
    };
    let existing = match root.symlink_metadata(dest_dir.as_path()) {
        Ok(m) if m.is_dir() => Some(open_dir_nofollow_at(root, Some(dest_dir)).map_err(fail)?),
        Ok(_) => {
            return Err(Error::Io(format!(
                "{dest_dir}: exists and is not a directory"
            )));
        }
        Err(e) if is_escape(&e) => return Err(fail(e)),
        Err(_) => None,
    };
    let plan = ArchivePlan::validate(archive, strip, existing.as_ref(), url, &bounds)?;
    let todo = plan
        .out_of_place(existing.as_ref(), bounds.deadline)
        .map_err(fail)?;
    let outcome = match (&existing, todo.is_empty()) {
        (None, _) => Extracted::Created,
        (Some(_), true) => return Ok(Extracted::Unchanged),
        (Some(_), false) => Extracted::Changed,
    };
    if dry_run {
        return Ok(outcome);
    }
    let dest = match existing {
        Some(d) => d,
        None => {
            if let Some(parent) = dest_dir.parent()
                && !root
                    .symlink_metadata(parent.as_path())
                    .is_ok_and(|m| m.is_dir())
            {
                return Err(Error::NotFound(format!(
                    "{dest_dir}: parent directory {parent} does not exist"
                )));
            }
            // As for `fetch`: the resolved path is opened without following any link.
            let parent = open_dir_nofollow_at(root, dest_dir.parent().as_ref()).map_err(fail)?;
            parent.create_dir(dest_dir.file_name()).map_err(fail)?;
            let dest = open_dir_nofollow_at(root, Some(dest_dir)).map_err(fail)?;
            rustix::fs::fchmod(&dest, rustix::fs::Mode::from_raw_mode(0o755))
                .map_err(|e| fail(e.into()))?;
            fsync_dir(&parent, "").map_err(fail)?;
            dest
        }
    };
    plan.write(archive, strip, &dest, dest_dir, &todo, url, &bounds)?;
    fsync_dir(&dest, "").map_err(fail)?;
    Ok(outcome)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_names_are_checked_and_stripped() {
        assert_eq!(entry_path(b"pkg/bin/tool", 1), Ok(Some("bin/tool".into())));
        assert_eq!(entry_path(b"./pkg/", 1), Ok(None));
        assert_eq!(entry_path(b"pkg", 0), Ok(Some("pkg".into())));
        assert!(entry_path(b"../x", 0).is_err());
        assert!(entry_path(b"a/../../x", 1).is_err());
        assert!(entry_path(b"/etc/passwd", 0).is_err());
    }

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
