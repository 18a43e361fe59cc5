//! Why the download engine failed ([`DownloadError`]), and the one place where that becomes
//! the WIT error a phase sees.
//!
//! # Background
//! The engine (fetcher, cache, HTTP, extraction) knows what went wrong in its own terms: a
//! status code, a digest mismatch, an extraction limit, an I/O error on a path. The
//! capability ([`super`]) converts at its boundary, once, with `?` through
//! `From<DownloadError> for crate::wit::Error`.
//!
//! # Guarantees
//! - Each variant's `Display` is the message the guest receives, word for word; the WIT kind
//!   is chosen in the one `From` impl below. Sources are kept (`#[source]`) for logs and
//!   [`crate::errors::chain`], which prints each source only once.
//! - An I/O error is classified when it is made ([`DownloadError::io`]): leaving the host
//!   root and a refused symlink are `escape`, a missing path is `not-found`, anything else
//!   `io`.

use super::bounds::{ExtractLimits, LimitHit};
use crate::errors::chain;
use crate::hostpath::{InvalidPath, is_escape, is_link_refused};
use crate::wit::Error;
use reqwest::StatusCode;
use std::io;
use url::Url;

/// Why a download, a cache lookup or an extraction failed.
///
/// URLs are boxed: the error travels back through every call of the engine, and two inline
/// `Url`s would make every `Result` of it large.
#[derive(Debug, thiserror::Error)]
pub enum DownloadError {
    /// An offline run (`--offline FILE`) needs an artifact the cache does not hold.
    #[error(
        "download {url} (sha256 {sha256}): not in the offline archive {archive} nor in the \
         artifact cache; an offline run sends no request (pack the archive with this config: \
         `nodeward offline pack`)"
    )]
    Offline {
        /// The artifact's URL.
        url: Box<Url>,
        /// Its pinned sha256.
        sha256: String,
        /// The offline archive.
        archive: String,
    },
    /// Resolving a path led outside the host root.
    #[error("{path}: resolving it led outside the host root")]
    Escape {
        /// The host path at fault.
        path: String,
        /// cap-std's (or `openat2`'s) refusal.
        #[source]
        source: io::Error,
    },
    /// A symlink appeared on a resolved path and was not followed.
    #[error(
        "{path}: a symlink on the way was not followed (it appeared after the path was \
         resolved and checked against the grant)"
    )]
    LinkRefused {
        /// The host path at fault.
        path: String,
        /// The `ELOOP` of an open without following links.
        #[source]
        source: io::Error,
    },
    /// A path (or a directory on the way) does not exist.
    #[error("{path}: no such file or directory")]
    NotFound {
        /// The host path at fault.
        path: String,
        /// The `ENOENT`.
        #[source]
        source: io::Error,
    },
    /// Any other I/O error on a host path.
    #[error("{path}: {source}")]
    Io {
        /// The host path at fault (or the cache entry).
        path: String,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// The artifact cache's location is not a host path.
    #[error("{source}")]
    CachePath {
        /// Why.
        #[source]
        source: InvalidPath,
    },
    /// Verifying a cached artifact reached the phase deadline.
    #[error("{entry}: the phase deadline passed while verifying the cached artifact")]
    CacheTimeout {
        /// The cache entry (`<cache_dir>/sha256/<hex>`).
        entry: String,
    },
    /// The HTTP client could not be built.
    #[error("cannot start the HTTP client: {}", chain(.source))]
    Client {
        /// reqwest's error.
        #[source]
        source: reqwest::Error,
    },
    /// The HTTP client cannot make a request of this URL.
    #[error("download {at}: {}", chain(.source))]
    BadRequest {
        /// The URL requested (the original or a redirect target).
        at: Box<Url>,
        /// reqwest's (builder) error.
        #[source]
        source: reqwest::Error,
    },
    /// The server's TLS certificate was refused: not worth another attempt.
    #[error(
        "download {url}: the TLS certificate of {at} is not trusted ({reason}); its CA must be \
         in the system trust store or in the node config's downloadOptions.caFile"
    )]
    Untrusted {
        /// The URL the phase asked for.
        url: Box<Url>,
        /// The URL requested (the original or a redirect target).
        at: Box<Url>,
        /// rustls's verdict on the certificate.
        reason: String,
        /// reqwest's error.
        #[source]
        source: reqwest::Error,
    },
    /// The server answered with a status that is neither success, redirect nor 5xx.
    #[error("download {url}: {at} answered {code}")]
    Status {
        /// The URL the phase asked for.
        url: Box<Url>,
        /// The URL that answered (after redirects).
        at: Box<Url>,
        /// The status.
        code: StatusCode,
    },
    /// A redirect without a `Location` the client can follow.
    #[error("download {url}: {at} answered {code} without a usable Location")]
    NoLocation {
        /// The URL the phase asked for.
        url: Box<Url>,
        /// The URL that answered.
        at: Box<Url>,
        /// The redirect status.
        code: StatusCode,
    },
    /// More redirects than [`super::FetchPolicy::max_redirects`].
    #[error("download {url}: more than {limit} redirects")]
    TooManyRedirects {
        /// The URL the phase asked for.
        url: Box<Url>,
        /// The limit.
        limit: u32,
    },
    /// A redirect target the grant does not cover (or not http(s) without credentials). The
    /// wording is `crate::wit::denied`'s.
    #[error("download {url}: redirect to {target}: not covered by the phase's download.urls grant")]
    RedirectRefused {
        /// The URL the phase asked for.
        url: Box<Url>,
        /// Where the server redirected to.
        target: Box<Url>,
    },
    /// The body is larger than [`super::FetchPolicy::max_bytes`].
    #[error("download {url}: body {} larger than the {limit} byte limit", body_size(*.announced))]
    TooLarge {
        /// The URL the phase asked for.
        url: Box<Url>,
        /// The limit in bytes.
        limit: u64,
        /// The `Content-Length` when it announced the breach; `None` when the body ran over.
        announced: Option<u64>,
    },
    /// The body does not hash to the pinned sha256; its bytes were discarded.
    #[error(
        "download {url}: sha256 mismatch: expected {expected}, got {got} ({bytes} bytes); the \
         bytes were discarded"
    )]
    DigestMismatch {
        /// The URL the phase asked for.
        url: Box<Url>,
        /// The pinned sha256.
        expected: String,
        /// The body's sha256.
        got: String,
        /// The body's length.
        bytes: u64,
    },
    /// Every attempt failed with an error worth retrying.
    #[error("download {url}: {last} (gave up after {attempts} attempts)")]
    GaveUp {
        /// The URL the phase asked for.
        url: Box<Url>,
        /// Attempts made.
        attempts: u32,
        /// Why the last one failed.
        #[source]
        last: RetryReason,
    },
    /// An attempt failed with an error worth retrying, but no retry fits before the deadline.
    #[error(
        "download {url}: {last}; attempt {attempt} failed and no retry fits before the \
         deadline (the phase deadline allows no more waiting)"
    )]
    NoRetryFits {
        /// The URL the phase asked for.
        url: Box<Url>,
        /// The attempt that failed (1-based).
        attempt: u32,
        /// Why it failed.
        #[source]
        last: RetryReason,
    },
    /// The server did not answer before the request timeout or the deadline.
    #[error(
        "download {url}: no answer from {at} in time (the phase deadline allows no more waiting)"
    )]
    NoAnswer {
        /// The URL the phase asked for.
        url: Box<Url>,
        /// The URL requested.
        at: Box<Url>,
        /// reqwest's timeout.
        #[source]
        source: reqwest::Error,
    },
    /// Reading the body timed out.
    #[error(
        "download {url}: body from {at} stalled after {bytes} bytes (the phase deadline allows \
         no more waiting)"
    )]
    Stalled {
        /// The URL the phase asked for.
        url: Box<Url>,
        /// The URL that answered.
        at: Box<Url>,
        /// Bytes received.
        bytes: u64,
        /// The read error.
        #[source]
        source: io::Error,
    },
    /// The deadline passed between requests or while the body was still arriving.
    #[error("download {url}: {what} (the phase deadline allows no more waiting)")]
    Timeout {
        /// The URL the phase asked for.
        url: Box<Url>,
        /// What was being waited for.
        what: String,
    },
    /// An archive entry the validation refuses; nothing was extracted.
    #[error("archive {url}: entry {entry:?} refused ({reason}); nothing was extracted")]
    EntryRefused {
        /// The archive's URL.
        url: Box<Url>,
        /// The entry's name as the archive spells it.
        entry: String,
        /// Why it is refused.
        reason: String,
    },
    /// The archive is not a readable gzip-compressed tar; nothing was extracted.
    #[error("archive {url}: not a valid .tar.gz: {source}")]
    NotTarGz {
        /// The archive's URL.
        url: Box<Url>,
        /// The reader's error.
        #[source]
        source: io::Error,
    },
    /// Reading the archive failed while its entries were written.
    #[error("archive {url}: {source}")]
    Unreadable {
        /// The archive's URL.
        url: Box<Url>,
        /// The reader's error.
        #[source]
        source: io::Error,
    },
    /// An entry's contents differ from those validated (the verified file changed).
    #[error("archive {url}: entry {entry} changed between validation and extraction")]
    EntryChanged {
        /// The archive's URL.
        url: Box<Url>,
        /// The entry's destination path, relative to the destination directory.
        entry: String,
    },
    /// An extraction limit ([`ExtractLimits`]) stopped the archive.
    #[error("archive {url}: {}; {after}", limit_reason(*.hit, .limits))]
    Limit {
        /// The archive's URL.
        url: Box<Url>,
        /// Which limit (never [`LimitHit::Deadline`], which is [`DownloadError::ExtractTimeout`]).
        hit: LimitHit,
        /// The limits in force.
        limits: ExtractLimits,
        /// The state the destination is left in.
        after: &'static str,
    },
    /// The phase deadline passed while the archive was unpacked.
    #[error("archive {url}: the phase deadline passed while unpacking it; {after}")]
    ExtractTimeout {
        /// The archive's URL.
        url: Box<Url>,
        /// The state the destination is left in.
        after: &'static str,
    },
    /// The destination of an extraction exists and is not a directory.
    #[error("{path}: exists and is not a directory")]
    NotADirectory {
        /// The destination.
        path: String,
    },
    /// The destination of an extraction has no parent directory to be created in.
    #[error("{path}: parent directory {parent} does not exist")]
    NoParent {
        /// The destination.
        path: String,
        /// Its missing parent.
        parent: String,
    },
}

/// Why one download attempt failed in a way worth another attempt.
#[derive(Debug, thiserror::Error)]
pub enum RetryReason {
    /// The request failed (connection refused or reset, TLS, DNS…).
    #[error("{at}: {}", chain(.source))]
    Request {
        /// The URL requested.
        at: Box<Url>,
        /// reqwest's error.
        #[source]
        source: reqwest::Error,
    },
    /// The server answered 5xx.
    #[error("{at} answered {code}")]
    ServerError {
        /// The URL that answered.
        at: Box<Url>,
        /// The status.
        code: StatusCode,
    },
    /// Reading the body failed.
    #[error("{at}: body cut short after {bytes} bytes: {}", chain(.source))]
    BodyFailed {
        /// The URL that answered.
        at: Box<Url>,
        /// Bytes received.
        bytes: u64,
        /// The read error.
        #[source]
        source: io::Error,
    },
    /// The body ended before its `Content-Length`.
    #[error("{at}: body cut short: {bytes} of {expected} bytes")]
    BodyShort {
        /// The URL that answered.
        at: Box<Url>,
        /// Bytes received.
        bytes: u64,
        /// The announced length.
        expected: u64,
    },
}

/// `of <n> bytes is` when the length was announced, `is` otherwise.
fn body_size(announced: Option<u64>) -> String {
    match announced {
        Some(n) => format!("of {n} bytes is"),
        None => "is".to_string(),
    }
}

/// What an extraction limit means, naming its value.
fn limit_reason(hit: LimitHit, limits: &ExtractLimits) -> String {
    match hit {
        LimitHit::Deadline => "the phase deadline passed while unpacking it".to_string(),
        LimitHit::Unpacked => format!(
            "unpacks to more than {} bytes (the unpacked size limit)",
            limits.max_unpacked_bytes
        ),
        LimitHit::Ratio => format!(
            "unpacks to more than {} times its compressed size (the ratio limit, applied after \
             the first {} bytes)",
            limits.max_ratio, limits.ratio_grace_bytes
        ),
        LimitHit::Entries => format!(
            "has more than {} entries (the entry limit)",
            limits.max_entries
        ),
        LimitHit::Metadata => format!(
            "has more than {} bytes of headers, long names or skipped data before one entry \
             (the entry metadata limit)",
            limits.max_entry_metadata_bytes
        ),
    }
}

impl DownloadError {
    /// The I/O error `source` on the host path `path`, classified: a path that led outside
    /// the host root or met a refused symlink is an [`DownloadError::Escape`] or
    /// [`DownloadError::LinkRefused`], a missing one [`DownloadError::NotFound`].
    pub fn io(path: impl std::fmt::Display, source: io::Error) -> Self {
        let path = path.to_string();
        if is_escape(&source) {
            DownloadError::Escape { path, source }
        } else if is_link_refused(&source) {
            DownloadError::LinkRefused { path, source }
        } else if source.kind() == io::ErrorKind::NotFound {
            DownloadError::NotFound { path, source }
        } else {
            DownloadError::Io { path, source }
        }
    }

    /// Whether this error says the archive itself is bad (refused, unreadable, over a
    /// limit), so that its cache entry is dropped: the `failed` errors of an extraction.
    pub fn condemns_archive(&self) -> bool {
        matches!(
            self,
            DownloadError::EntryRefused { .. }
                | DownloadError::NotTarGz { .. }
                | DownloadError::Unreadable { .. }
                | DownloadError::EntryChanged { .. }
                | DownloadError::Limit { .. }
        )
    }
}

impl From<DownloadError> for Error {
    /// The WIT error kind of each failure (documented in `wit/download.wit`), with the
    /// error's message.
    fn from(e: DownloadError) -> Self {
        use DownloadError as D;
        let message = e.to_string();
        match e {
            D::Escape { .. } | D::LinkRefused { .. } => Error::Escape(message),
            D::NotFound { .. } | D::NoParent { .. } => Error::NotFound(message),
            D::CachePath { .. } | D::BadRequest { .. } => Error::InvalidArgument(message),
            D::RedirectRefused { .. } => Error::Denied(message),
            D::Io { .. } | D::Client { .. } | D::NotADirectory { .. } => Error::Io(message),
            D::CacheTimeout { .. }
            | D::NoRetryFits { .. }
            | D::NoAnswer { .. }
            | D::Stalled { .. }
            | D::Timeout { .. }
            | D::ExtractTimeout { .. } => Error::Timeout(message),
            D::Status { .. }
            | D::Untrusted { .. }
            | D::NoLocation { .. }
            | D::TooManyRedirects { .. }
            | D::TooLarge { .. }
            | D::DigestMismatch { .. }
            | D::GaveUp { .. }
            | D::Offline { .. }
            | D::EntryRefused { .. }
            | D::NotTarGz { .. }
            | D::Unreadable { .. }
            | D::EntryChanged { .. }
            | D::Limit { .. } => Error::Failed(message),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url() -> Box<Url> {
        Box::new(Url::parse("http://mirror.example/a.tgz").expect("url"))
    }

    /// The WIT error's kind and message (the generated type has no `PartialEq`).
    fn guest_sees(e: DownloadError) -> (&'static str, String) {
        match Error::from(e) {
            Error::Denied(m) => ("denied", m),
            Error::InvalidArgument(m) => ("invalid-argument", m),
            Error::NotFound(m) => ("not-found", m),
            Error::Escape(m) => ("escape", m),
            Error::Io(m) => ("io", m),
            Error::Failed(m) => ("failed", m),
            Error::Timeout(m) => ("timeout", m),
            Error::Unavailable(m) => ("unavailable", m),
        }
    }

    #[test]
    fn io_errors_are_classified_with_their_path() {
        let escape = io::Error::from_raw_os_error(rustix::io::Errno::XDEV.raw_os_error());
        assert_eq!(
            guest_sees(DownloadError::io("w/x", escape)),
            (
                "escape",
                "w/x: resolving it led outside the host root".into()
            )
        );
        let link = io::Error::from_raw_os_error(rustix::io::Errno::LOOP.raw_os_error());
        let (kind, message) = guest_sees(DownloadError::io("w/x", link));
        assert_eq!(kind, "escape");
        assert!(
            message.starts_with("w/x: a symlink on the way was not followed"),
            "{message}"
        );
        let missing = io::Error::from(io::ErrorKind::NotFound);
        assert_eq!(
            guest_sees(DownloadError::io("w/x", missing)),
            ("not-found", "w/x: no such file or directory".into())
        );
        let other = io::Error::other("disk on fire");
        assert_eq!(
            guest_sees(DownloadError::io("w/x", other)),
            ("io", "w/x: disk on fire".into())
        );
    }

    #[test]
    fn extraction_limits_fail_and_the_deadline_times_out() {
        let limits = ExtractLimits::default();
        let hit = LimitHit::Entries.error(&limits, &url(), "nothing was extracted");
        assert!(hit.condemns_archive());
        assert_eq!(
            guest_sees(hit),
            (
                "failed",
                "archive http://mirror.example/a.tgz: has more than 10000 entries (the entry \
                 limit); nothing was extracted"
                    .into()
            )
        );
        let late = LimitHit::Deadline.error(&limits, &url(), "nothing was extracted");
        assert!(!late.condemns_archive());
        assert_eq!(
            guest_sees(late),
            (
                "timeout",
                "archive http://mirror.example/a.tgz: the phase deadline passed while unpacking \
                 it; nothing was extracted"
                    .into()
            )
        );
    }

    #[test]
    fn a_refused_redirect_is_denied_in_the_grant_wording() {
        let target = Url::parse("http://elsewhere.example/x").expect("url");
        let e = DownloadError::RedirectRefused {
            url: url(),
            target: Box::new(target.clone()),
        };
        let Error::Denied(expected) = crate::wit::denied(
            format!("download {}: redirect to {target}", url()),
            "download.urls",
        ) else {
            panic!("denied() makes a denied error");
        };
        assert_eq!(guest_sees(e), ("denied", expected));
    }

    #[test]
    fn a_body_over_the_limit_says_whether_it_was_announced() {
        let big = |announced| DownloadError::TooLarge {
            url: url(),
            limit: 10,
            announced,
        };
        assert_eq!(
            guest_sees(big(Some(11))),
            (
                "failed",
                "download http://mirror.example/a.tgz: body of 11 bytes is larger than the 10 \
                 byte limit"
                    .into()
            )
        );
        assert_eq!(
            guest_sees(big(None)).1,
            "download http://mirror.example/a.tgz: body is larger than the 10 byte limit"
        );
    }
}
