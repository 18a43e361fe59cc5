//! The network side of a [`Fetcher`]: the HTTP client, the retried download of one URL into
//! a temp file with every redirect checked against the grant, and the hashing that accepts the
//! bytes only when they match the pinned sha256.

use super::fetcher::*;
use crate::errors::chain;
use crate::hostpath::HostPath;
use crate::rootfs::io_error;
use crate::wit::Error;
use cap_std::fs::File;
use sha2::{Digest, Sha256};
use std::io::{self, IsTerminal, Read, Seek, SeekFrom, Write};
use url::Url;

/// Why one attempt did not produce the bytes.
enum Failure {
    /// Worth another attempt: a connection error, a body cut short, a 5xx.
    Retry(String),
    /// Final: the error the call returns.
    Fatal(Error),
}

/// Whether an I/O error from a response body is reqwest's timeout.
fn is_timeout_io(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::TimedOut
        || e.get_ref()
            .and_then(|inner| inner.downcast_ref::<reqwest::Error>())
            .is_some_and(reqwest::Error::is_timeout)
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

impl Fetcher<'_> {
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

    /// Downloads `url` into `tmp` with retries, returning it once the body hashed to `sha256`.
    pub(super) fn download<'t>(
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
                    return Err(Failure::Fatal(crate::wit::denied(
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
