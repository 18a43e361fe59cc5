//! The artifact cache: `<cache_dir>/sha256/<hex>` beneath the host root, content-addressed
//! and never trusted.
//!
//! # Guarantees
//! - An entry is hashed again every time it is used, and removed when it does not match its
//!   name; the open handle that was hashed is the one handed out.
//! - The cache's directory is opened without following any link: it is the agent's own path,
//!   not a grant's, so a link planted in it is refused rather than followed to wherever it
//!   points beneath the root.
//! - Adding to the cache is best effort: a cache that cannot be written costs a download next
//!   time, not the call that tried.
//! - An entry's mtime says when it was last *used*: written when it is added, set to now when
//!   an apply is served from it ([`touch`]); plan mode reads an entry without touching it.
//!   Eviction (`super::evict`) removes the least recently used first. Not atime, which the
//!   `noatime`/`relatime` mount options make unreliable and any reader (a backup, the kubelet
//!   running the hard-linked binary) would move; an entry is immutable, so its mtime means
//!   nothing else.

use super::bounds::LimitHit;
use super::error::DownloadError;
use super::fetcher::DOWNLOAD_TEMP;
use super::fetcher::hash_copy;
use crate::durable::{self, TempFile};
use crate::hostpath::{HostPath, open_dir_nofollow_at};
use cap_std::fs::{Dir, File};
use std::io::{self, Seek, SeekFrom};
use std::time::Instant;

/// The artifact cache as one call sees it: where it is beneath the root, and the deadline
/// that bounds verifying an entry.
pub(super) struct ArtifactCache<'a> {
    root: &'a Dir,
    dir: HostPath,
    deadline: Instant,
}

/// The host path of the entry for `sha256` in the cache at `dir`: `<dir>/sha256/<hex>`.
pub(super) fn entry_name(dir: &HostPath, sha256: &str) -> String {
    format!("{dir}/sha256/{sha256}")
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

/// Marks the entry open as `file` as used now (its mtime; see the module doc). Best effort:
/// an entry that cannot be marked is only evicted sooner.
pub(super) fn touch(file: &File, entry: &str) {
    use rustix::fs::{Timespec, Timestamps, UTIME_NOW, UTIME_OMIT, futimens};
    let times = Timestamps {
        last_access: Timespec {
            tv_sec: 0,
            tv_nsec: UTIME_OMIT,
        },
        last_modification: Timespec {
            tv_sec: 0,
            tv_nsec: UTIME_NOW,
        },
    };
    if let Err(e) = futimens(file, &times) {
        tracing::debug!(entry, error = %e, "cannot mark the cached artifact as used");
    }
}

impl<'a> ArtifactCache<'a> {
    /// The cache at `dir` beneath `root`; verifying an entry stops at `deadline`.
    pub(super) fn new(root: &'a Dir, dir: HostPath, deadline: Instant) -> Self {
        ArtifactCache {
            root,
            dir,
            deadline,
        }
    }

    /// The entry's host path, `<cache_dir>/sha256/<hex>`, as errors and logs name it.
    pub(super) fn entry(&self, sha256: &str) -> String {
        entry_name(&self.dir, sha256)
    }

    /// The cache's `sha256/` directory, opened without following any link (made first, with
    /// its parents, when `create`).
    pub(super) fn dir(&self, create: bool) -> io::Result<Dir> {
        let dir = HostPath::parse(&format!("{}/sha256", self.dir)).map_err(io::Error::other)?;
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

    /// The entry for `sha256`, verified, without writing anything; `None` when it is missing
    /// or does not match.
    pub(super) fn open_verified(&self, sha256: &str) -> Result<Option<File>, DownloadError> {
        let entry = self.entry(sha256);
        let Ok(cache) = self.dir(false) else {
            return Ok(None);
        };
        let Ok(mut f) = open_entry(&cache, sha256) else {
            return Ok(None);
        };
        match hash_copy(&mut f, None, self.deadline) {
            Err(e) if LimitHit::of(&e).is_some() => Err(DownloadError::CacheTimeout { entry }),
            Ok((digest, _)) if digest == sha256 => {
                f.seek(SeekFrom::Start(0))
                    .map_err(|e| DownloadError::io(&entry, e))?;
                Ok(Some(f))
            }
            Ok(_) | Err(_) => Ok(None),
        }
    }

    /// Copies the entry for `sha256` into a temp file in `parent`, hashing it on the way; `None` when there is no entry or it does not match (a bad entry
    /// is removed). `dest` names the destination in errors.
    pub(super) fn copy_into<'p>(
        &self,
        sha256: &str,
        parent: &'p Dir,
        dest: &HostPath,
    ) -> Result<Option<TempFile<'p>>, DownloadError> {
        let entry = self.entry(sha256);
        let Ok(cache) = self.dir(false) else {
            return Ok(None);
        };
        let Ok(mut cached) = open_entry(&cache, sha256) else {
            return Ok(None);
        };
        let mut tmp =
            TempFile::new(parent, DOWNLOAD_TEMP).map_err(|e| DownloadError::io(dest, e))?;
        match hash_copy(&mut cached, Some(&mut tmp.file), self.deadline) {
            Ok((digest, _)) if digest == sha256 => {
                touch(&cached, &entry);
                Ok(Some(tmp))
            }
            Err(e) if LimitHit::of(&e).is_some() => Err(DownloadError::CacheTimeout { entry }),
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

    /// Adds the verified temp file `verified` as the entry for `sha256`: a second name for it
    /// (a hard link) when possible, a copy otherwise. Best effort: a failure is logged.
    pub(super) fn remember(&self, sha256: &str, verified: &TempFile<'_>) {
        let entry = self.entry(sha256);
        let result = (|| -> io::Result<()> {
            let cache = self.dir(true)?;
            if verified.link_into(&cache, sha256, "cache").is_err() {
                let mut src = verified.file.try_clone()?;
                src.seek(SeekFrom::Start(0))?;
                let mut tmp = TempFile::new(&cache, "cache")?;
                io::copy(&mut src, &mut tmp.file)?;
                tmp.finish(0o644)?;
                tmp.rename(sha256)?;
            }
            durable::fsync_dir(&cache)
        })();
        if let Err(e) = result {
            tracing::warn!(entry, error = %e, "cannot add the artifact to the cache");
        }
    }

    /// Removes the entry for `sha256` (an archive that was refused). Best effort.
    pub(super) fn forget(&self, sha256: &str) {
        if let Ok(cache) = self.dir(false) {
            let _ = cache.remove_file(sha256);
        }
    }
}
