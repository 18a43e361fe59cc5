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

use super::bounds::LimitHit;
use super::error::DownloadError;
use super::fetcher::hash_copy;
use super::temp::{TempFile, fsync_dir};
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
        format!("{}/sha256/{sha256}", self.dir)
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

    /// Copies the entry for `sha256` into a temp file in `parent` (named after `base`),
    /// hashing it on the way; `None` when there is no entry or it does not match (a bad entry
    /// is removed). `dest` names the destination in errors.
    pub(super) fn copy_into<'p>(
        &self,
        sha256: &str,
        parent: &'p Dir,
        base: &str,
        dest: &HostPath,
    ) -> Result<Option<TempFile<'p>>, DownloadError> {
        let entry = self.entry(sha256);
        let Ok(cache) = self.dir(false) else {
            return Ok(None);
        };
        let Ok(mut cached) = open_entry(&cache, sha256) else {
            return Ok(None);
        };
        let mut tmp = TempFile::create(parent, "", base).map_err(|e| DownloadError::io(dest, e))?;
        match hash_copy(&mut cached, Some(&mut tmp.file), self.deadline) {
            Ok((digest, _)) if digest == sha256 => Ok(Some(tmp)),
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

    /// Adds the verified file `name` (in directory `src`) as the entry for `sha256`: a hard
    /// link when possible, a copy otherwise. Best effort: a failure is logged.
    pub(super) fn remember(&self, sha256: &str, src: &Dir, name: &str) {
        let entry = self.entry(sha256);
        let result = (|| -> io::Result<()> {
            let cache = self.dir(true)?;
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

    /// Removes the entry for `sha256` (an archive that was refused). Best effort.
    pub(super) fn forget(&self, sha256: &str) {
        if let Ok(cache) = self.dir(false) {
            let _ = cache.remove_file(sha256);
        }
    }
}
