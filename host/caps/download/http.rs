//! The network side of a [`Fetcher`]: the HTTP client, the retried download of one URL into
//! a temp file with every redirect checked against the grant, and the hashing that accepts the
//! bytes only when they match the pinned sha256.

use super::error::{DownloadError, RetryReason};
use super::fetcher::{CHUNK, Fetcher};
use super::progress::Progress;
use crate::durable::TempFile;
use cap_std::fs::File;
use sha2::{Digest, Sha256};
use std::io::{self, Read, Seek, SeekFrom, Write};
use url::Url;

/// Why one attempt did not produce the bytes.
enum Failure {
    /// Worth another attempt: a connection error, a body cut short, a 5xx.
    Retry(RetryReason),
    /// Final: the error the call returns.
    Fatal(DownloadError),
}

/// Whether an I/O error from a response body is reqwest's timeout.
fn is_timeout_io(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::TimedOut
        || e.get_ref()
            .and_then(|inner| inner.downcast_ref::<reqwest::Error>())
            .is_some_and(reqwest::Error::is_timeout)
}

/// rustls's verdict when `e` is the refusal of the server's certificate (an unknown issuer,
/// a name mismatch, an expired certificate...): the same on every attempt, so never retried.
fn certificate_refused(e: &reqwest::Error) -> Option<String> {
    super::trust::certificate_refused(e)
}

impl Fetcher<'_> {
    /// The HTTP client, built on first use so cache hits never start one (nor read the system
    /// trust store). Redirect policy none: [`Fetcher::attempt`] follows redirects itself so
    /// that each target is checked against the grant. It trusts the run's
    /// [`super::Trust`] and nothing else.
    fn client(&self) -> Result<&reqwest::blocking::Client, DownloadError> {
        if let Some(c) = self.client.get() {
            return Ok(c);
        }
        let builder = reqwest::blocking::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(self.config.policy.connect_timeout.min(self.remaining()))
            .user_agent(concat!("nodeward/", env!("CARGO_PKG_VERSION")));
        let client = self
            .config
            .trust
            .configure(builder)
            .and_then(reqwest::blocking::ClientBuilder::build)
            .map_err(|source| DownloadError::Client { source })?;
        Ok(self.client.get_or_init(|| client))
    }

    /// Downloads `url` into `tmp` with retries, returning it once the body hashed to `sha256`;
    /// `dest` names the file in errors.
    pub(super) fn download<'t>(
        &self,
        url: &Url,
        sha256: &str,
        mut tmp: TempFile<'t>,
        dest: &dyn std::fmt::Display,
    ) -> Result<TempFile<'t>, DownloadError> {
        // The one place a request would be sent: an offline run refuses here, at once.
        if let Some(archive) = &self.config.offline {
            return Err(DownloadError::Offline {
                url: Box::new(url.clone()),
                sha256: sha256.to_string(),
                archive: archive.clone(),
            });
        }
        let retry = &self.config.policy.retry;
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            tmp.file
                .set_len(0)
                .and_then(|()| tmp.file.seek(SeekFrom::Start(0)).map(drop))
                .map_err(|e| DownloadError::io(dest, e))?;
            let why = match self.attempt(url, sha256, &mut tmp.file, dest) {
                Ok(()) => return Ok(tmp),
                Err(Failure::Fatal(e)) => return Err(e),
                Err(Failure::Retry(why)) => why,
            };
            if attempt >= retry.max_attempts.max(1) {
                return Err(DownloadError::GaveUp {
                    url: Box::new(url.clone()),
                    attempts: attempt,
                    last: why,
                });
            }
            let delay = retry.delay(attempt);
            if delay >= self.remaining() {
                return Err(DownloadError::NoRetryFits {
                    url: Box::new(url.clone()),
                    attempt,
                    last: why,
                });
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
        dest: &dyn std::fmt::Display,
    ) -> Result<(), Failure> {
        let client = self.client().map_err(Failure::Fatal)?;
        let policy = &self.config.policy;
        let mut current = url.clone();
        let mut hops = 0u32;
        let mut resp = loop {
            let left = self.remaining();
            if left.is_zero() {
                return Err(Failure::Fatal(DownloadError::Timeout {
                    url: Box::new(url.clone()),
                    what: "deadline passed".into(),
                }));
            }
            let sent = client
                .get(current.clone())
                .timeout(policy.request_timeout.min(left))
                .send();
            let resp = match sent {
                Ok(r) => r,
                Err(source) if source.is_timeout() => {
                    return Err(Failure::Fatal(DownloadError::NoAnswer {
                        url: Box::new(url.clone()),
                        at: Box::new(current),
                        source,
                    }));
                }
                Err(source) if source.is_builder() => {
                    return Err(Failure::Fatal(DownloadError::BadRequest {
                        at: Box::new(current),
                        source,
                    }));
                }
                Err(source) => {
                    if let Some(reason) = certificate_refused(&source) {
                        return Err(Failure::Fatal(DownloadError::Untrusted {
                            url: Box::new(url.clone()),
                            at: Box::new(current),
                            reason,
                            source,
                        }));
                    }
                    return Err(Failure::Retry(RetryReason::Request {
                        at: Box::new(current),
                        source,
                    }));
                }
            };
            let status = resp.status();
            if status.is_redirection() {
                let next = resp
                    .headers()
                    .get(reqwest::header::LOCATION)
                    .and_then(|l| l.to_str().ok())
                    .and_then(|l| current.join(l).ok());
                let Some(next) = next else {
                    return Err(Failure::Fatal(DownloadError::NoLocation {
                        url: Box::new(url.clone()),
                        at: Box::new(current),
                        code: status,
                    }));
                };
                hops += 1;
                if hops > policy.max_redirects {
                    return Err(Failure::Fatal(DownloadError::TooManyRedirects {
                        url: Box::new(url.clone()),
                        limit: policy.max_redirects,
                    }));
                }
                if !matches!(next.scheme(), "http" | "https")
                    || !next.username().is_empty()
                    || next.password().is_some()
                    || !(self.may_fetch)(&next)
                {
                    return Err(Failure::Fatal(DownloadError::RedirectRefused {
                        url: Box::new(url.clone()),
                        target: Box::new(next),
                    }));
                }
                current = next;
                continue;
            }
            if status.is_server_error() {
                return Err(Failure::Retry(RetryReason::ServerError {
                    at: Box::new(current),
                    code: status,
                }));
            }
            if !status.is_success() {
                return Err(Failure::Fatal(DownloadError::Status {
                    url: Box::new(url.clone()),
                    at: Box::new(current),
                    code: status,
                }));
            }
            break resp;
        };
        let len = resp.content_length();
        if let Some(n) = len.filter(|n| *n > policy.max_bytes) {
            return Err(Failure::Fatal(DownloadError::TooLarge {
                url: Box::new(url.clone()),
                limit: policy.max_bytes,
                announced: Some(n),
            }));
        }
        let mut progress = Progress::start(len, url);
        let mut hasher = Sha256::new();
        let mut buf = vec![0u8; CHUNK];
        let mut total = 0u64;
        loop {
            let n = match resp.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(source) if is_timeout_io(&source) || self.remaining().is_zero() => {
                    return Err(Failure::Fatal(DownloadError::Stalled {
                        url: Box::new(url.clone()),
                        at: Box::new(current),
                        bytes: total,
                        source,
                    }));
                }
                Err(source) => {
                    return Err(Failure::Retry(RetryReason::BodyFailed {
                        at: Box::new(current),
                        bytes: total,
                        source,
                    }));
                }
            };
            total += n as u64;
            // reqwest's timeouts cover the body too; this also stops a body that trickles in
            // just fast enough never to trip a per-read timeout.
            if self.remaining().is_zero() {
                return Err(Failure::Fatal(DownloadError::Timeout {
                    url: Box::new(url.clone()),
                    what: format!("body from {current} still arriving after {total} bytes"),
                }));
            }
            if total > policy.max_bytes {
                return Err(Failure::Fatal(DownloadError::TooLarge {
                    url: Box::new(url.clone()),
                    limit: policy.max_bytes,
                    announced: None,
                }));
            }
            hasher.update(&buf[..n]);
            file.write_all(&buf[..n])
                .map_err(|e| Failure::Fatal(DownloadError::io(dest, e)))?;
            progress.advance(n as u64);
        }
        progress.finish();
        if let Some(n) = len.filter(|n| *n != total) {
            return Err(Failure::Retry(RetryReason::BodyShort {
                at: Box::new(current),
                bytes: total,
                expected: n,
            }));
        }
        let actual = hex::encode(hasher.finalize());
        if actual != sha256 {
            return Err(Failure::Fatal(DownloadError::DigestMismatch {
                url: Box::new(url.clone()),
                expected: sha256.to_string(),
                got: actual,
                bytes: total,
            }));
        }
        Ok(())
    }
}
