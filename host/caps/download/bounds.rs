//! Bounds on the host work an archive makes `download.fetch-and-extract` do.
//!
//! # Background
//! The archive is pinned by its sha256, but its author is not trusted more than the phase: a
//! few MiB of gzip can unpack to many GiB (a "gzip bomb"), and a tar can hold millions of
//! entries or megabyte-long names that the reader keeps in memory. Every read of the
//! decompressed stream therefore goes through [`Bounded`], which stops it at the phase
//! deadline and at the limits of [`ExtractLimits`]; the reason is kept in a [`Meter`] so the
//! caller can name it whatever error the tar reader wraps it in.
//!
//! # Guarantees
//! - The checks run on every read, before the bytes are used, so a limit is hit within one
//!   read buffer of being passed: no hashing or writing runs past it.
//! - The limits are documented in `wit/download.wit`; each one is named in the error.

use cap_std::fs::File;
use flate2::read::GzDecoder;
use std::cell::Cell;
use std::io::{self, Read};
use std::time::Instant;
use url::Url;

use super::error::DownloadError;

/// Limits of one archive's extraction (part of [`super::FetchPolicy`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExtractLimits {
    /// Most bytes the archive may unpack to: the whole tar stream (headers, names, contents).
    pub max_unpacked_bytes: u64,
    /// Most unpacked bytes per compressed byte, once [`ExtractLimits::ratio_grace_bytes`] are
    /// unpacked (real artifacts compress 2-10:1; zeros compress about 1000:1).
    pub max_ratio: u64,
    /// Unpacked bytes before the ratio applies (a small archive of text may compress well).
    pub ratio_grace_bytes: u64,
    /// Most entries in the archive; each one costs memory while the archive is validated.
    pub max_entries: usize,
    /// Most bytes read between two entries outside their contents: headers, GNU long names,
    /// PAX records and data of entries that should have none (a directory's), which the tar
    /// reader keeps in memory or skips.
    pub max_entry_metadata_bytes: u64,
}

impl Default for ExtractLimits {
    fn default() -> Self {
        ExtractLimits {
            max_unpacked_bytes: 4 << 30,
            max_ratio: 200,
            ratio_grace_bytes: 8 << 20,
            max_entries: 10_000,
            max_entry_metadata_bytes: 1 << 20,
        }
    }
}

/// Which bound stopped an extraction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LimitHit {
    /// The phase deadline passed.
    Deadline,
    /// [`ExtractLimits::max_unpacked_bytes`].
    Unpacked,
    /// [`ExtractLimits::max_ratio`].
    Ratio,
    /// [`ExtractLimits::max_entries`].
    Entries,
    /// [`ExtractLimits::max_entry_metadata_bytes`].
    Metadata,
}

impl std::fmt::Display for LimitHit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "extraction limit reached: {self:?}")
    }
}

impl std::error::Error for LimitHit {}

impl LimitHit {
    /// The I/O error that carries this hit through readers that only know `io::Error`.
    pub(super) fn io(self) -> io::Error {
        io::Error::other(self)
    }

    /// The hit an I/O error carries, if it carries one.
    pub(super) fn of(e: &io::Error) -> Option<LimitHit> {
        e.get_ref()
            .and_then(|inner| inner.downcast_ref::<LimitHit>())
            .copied()
    }

    /// The error for this hit on the archive at `url`; `after` says what state the
    /// destination is left in. The deadline is a timeout, every other limit a refusal.
    pub(super) fn error(
        self,
        limits: &ExtractLimits,
        url: &Url,
        after: &'static str,
    ) -> DownloadError {
        let url = Box::new(url.clone());
        match self {
            LimitHit::Deadline => DownloadError::ExtractTimeout { url, after },
            hit => DownloadError::Limit {
                url,
                hit,
                limits: *limits,
                after,
            },
        }
    }
}

/// What the bounded stream and the loop over its entries share.
#[derive(Debug, Default)]
pub(super) struct Meter {
    hit: Cell<Option<LimitHit>>,
    metadata: Cell<u64>,
    in_contents: Cell<bool>,
    check_metadata: bool,
}

impl Meter {
    /// A meter; `check_metadata` when every entry's contents are read through
    /// [`Meter::contents`] (validation), so that what is read between them is metadata.
    pub(super) fn new(check_metadata: bool) -> Self {
        Meter {
            check_metadata,
            ..Meter::default()
        }
    }

    /// The bound that stopped the stream, if one did.
    pub(super) fn hit(&self) -> Option<LimitHit> {
        self.hit.get()
    }

    /// Records `hit` (the loop's own checks, e.g. the entry count) and returns its error.
    pub(super) fn stop(&self, hit: LimitHit) -> io::Error {
        self.hit.set(Some(hit));
        hit.io()
    }

    /// A new entry was yielded: what follows is counted afresh.
    pub(super) fn next_entry(&self) {
        self.metadata.set(0);
    }

    /// Runs `f` (reading one entry's contents), which does not count as metadata.
    pub(super) fn contents<T>(&self, f: impl FnOnce() -> T) -> T {
        self.in_contents.set(true);
        let out = f();
        self.in_contents.set(false);
        self.metadata.set(0);
        out
    }
}

/// Counts the compressed bytes read.
struct Counted<R> {
    inner: R,
    read: u64,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read += n as u64;
        Ok(n)
    }
}

/// The decompressed stream of an archive, checked on every read against the deadline and
/// the limits.
pub(super) struct Bounded<'a> {
    gz: GzDecoder<Counted<&'a File>>,
    meter: &'a Meter,
    limits: ExtractLimits,
    deadline: Instant,
    unpacked: u64,
}

impl<'a> Bounded<'a> {
    /// `archive` (positioned at its start) decompressed, within `limits` and `deadline`.
    pub(super) fn new(
        archive: &'a File,
        meter: &'a Meter,
        limits: ExtractLimits,
        deadline: Instant,
    ) -> Self {
        Bounded {
            gz: GzDecoder::new(Counted {
                inner: archive,
                read: 0,
            }),
            meter,
            limits,
            deadline,
            unpacked: 0,
        }
    }
}

impl Read for Bounded<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if let Some(hit) = self.meter.hit() {
            return Err(hit.io());
        }
        if Instant::now() >= self.deadline {
            return Err(self.meter.stop(LimitHit::Deadline));
        }
        let n = self.gz.read(buf)?;
        self.unpacked += n as u64;
        let l = &self.limits;
        if self.unpacked > l.max_unpacked_bytes {
            return Err(self.meter.stop(LimitHit::Unpacked));
        }
        if self.unpacked > l.ratio_grace_bytes
            && self.unpacked > self.gz.get_ref().read.saturating_mul(l.max_ratio)
        {
            return Err(self.meter.stop(LimitHit::Ratio));
        }
        if self.meter.check_metadata && !self.meter.in_contents.get() {
            let m = self.meter.metadata.get() + n as u64;
            self.meter.metadata.set(m);
            if m > l.max_entry_metadata_bytes {
                return Err(self.meter.stop(LimitHit::Metadata));
            }
        }
        Ok(n)
    }
}

/// What bounds one extraction: the policy's limits and the phase deadline.
#[derive(Clone, Copy, Debug)]
pub struct ExtractBounds {
    /// The limits.
    pub limits: ExtractLimits,
    /// The phase deadline.
    pub deadline: Instant,
}
