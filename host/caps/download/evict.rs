//! Keeping the artifact cache under its size cap: [`evict`].
//!
//! # Background
//! Every download is kept in the cache (`<cache_dir>/sha256/<hex>`) so that a re-bootstrap, a
//! repair or a return to an earlier version downloads nothing; without eviction it grows by a
//! version's artifacts (about 200 MB) with every upgrade. The node pipeline (`crate::node`)
//! calls [`evict`] after a *successful* bootstrap or upgrade, never in the middle of one, with
//! the digests it must keep: those of the version the node runs and of the one it ran before.
//!
//! # What it does
//! 1. Removes the cache's temp files (`.nodeward-tmp.*`, in the cache directory and in
//!    `sha256/`) older than [`EvictPolicy::temp_max_age`]: what a killed download left. The
//!    node lock's sweep removes them at the start of every locked run anyway; the age keeps
//!    this safe even for a writer that holds no lock.
//! 2. Lists the entries: regular files in `sha256/` named by 64 lowercase hex digits. Their
//!    size is the cache's size. Anything else there is neither counted nor touched.
//! 3. While the cache is over [`EvictPolicy::max_bytes`], removes the least recently used
//!    entry that is not pinned: the oldest mtime first (see `super::cache` for what sets it),
//!    ties broken by name so that two runs agree.
//!
//! # Guarantees
//! - Pinned entries are never removed, even when that leaves the cache over its cap
//!   ([`Eviction::over_cap`] says so; the caller warns).
//! - Nothing is followed: the cache directory and `sha256/` are opened without following a
//!   link (a link there refuses the whole eviction), entries are examined with `lstat` and
//!   removed with `unlinkat` relative to those directories, so nothing outside the cache can be
//!   deleted. A symlink named like an entry is not an entry: it is left alone, uncounted.
//! - Crash-safe and idempotent: removing an entry is one `unlink`, and a missing entry is only
//!   a download next time (the cache is never trusted anyway). A second call removes nothing.
//!
//! # Caveats
//! An entry added as a hard link shares its inode with the installed file (`bin/kubelet` of a
//! version), so removing it frees nothing while that version is installed; its size is counted
//! all the same, which makes the cap an upper bound on what the cache can hold on its own.

use crate::durable::is_temp_name;
use crate::hostpath::{HostPath, open_dir_nofollow_at};
use cap_std::fs::Dir;
use rustix::fs::{AtFlags, FileType, statat};
use std::collections::BTreeSet;
use std::io;
use std::time::{Duration, SystemTime};

/// How much the cache may hold, and when a temp file counts as left over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EvictPolicy {
    /// The size cap: the sum of the entries' sizes after eviction, pins allowing.
    pub max_bytes: u64,
    /// A temp file older than this is a leftover of a killed download.
    pub temp_max_age: Duration,
}

impl EvictPolicy {
    /// The default temp-file age: an hour, far longer than any download writes one file
    /// under its temp name (it has one only in the instant before its rename).
    pub const TEMP_MAX_AGE: Duration = Duration::from_secs(3600);

    /// A cap of `max_bytes` with the default temp-file age.
    pub fn with_max_bytes(max_bytes: u64) -> Self {
        EvictPolicy {
            max_bytes,
            temp_max_age: Self::TEMP_MAX_AGE,
        }
    }
}

/// One entry removed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Evicted {
    /// Its digest (its name).
    pub sha256: String,
    /// Its size.
    pub bytes: u64,
}

/// What [`evict`] found and did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Eviction {
    /// Entries before.
    pub entries: usize,
    /// Their total size before.
    pub bytes_before: u64,
    /// The total size after.
    pub bytes_after: u64,
    /// The entries removed, least recently used first.
    pub evicted: Vec<Evicted>,
    /// The pinned entries present (kept whatever their age).
    pub pinned: usize,
    /// Whether the cache is still over its cap: everything left is pinned.
    pub over_cap: bool,
    /// Temp files removed, as `<dir>/<name>` relative to the cache directory.
    pub temp_removed: Vec<String>,
}

/// Eviction stopped: names the directory or entry at fault.
#[derive(Debug, thiserror::Error)]
#[error("artifact cache {path}: {what}: {source}")]
pub struct EvictError {
    /// The cache directory, or the entry.
    pub path: String,
    /// What was being done.
    pub what: &'static str,
    /// The error.
    #[source]
    pub source: io::Error,
}

/// One regular file named like an entry.
struct Entry {
    name: String,
    bytes: u64,
    used: (i64, u64),
}

/// Evicts from the cache at `cache_dir` beneath `root` (see the module doc); `pinned` holds
/// the digests never removed, `now` dates the temp files. A cache that does not exist is
/// empty.
pub fn evict(
    root: &Dir,
    cache_dir: &HostPath,
    policy: &EvictPolicy,
    pinned: &BTreeSet<String>,
    now: SystemTime,
) -> Result<Eviction, EvictError> {
    let err = |path: String, what| move |source| EvictError { path, what, source };
    let mut out = Eviction::default();
    let cache = match open_dir_nofollow_at(root, Some(cache_dir)) {
        Ok(d) => d,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(err(cache_dir.to_string(), "cannot open it")(e)),
    };
    let sha_path = cache_dir
        .join("sha256")
        .map_err(|e| err(cache_dir.to_string(), "cannot name sha256/")(io::Error::other(e)))?;
    let sha = match open_dir_nofollow_at(root, Some(&sha_path)) {
        Ok(d) => Some(d),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(err(sha_path.to_string(), "cannot open it")(e)),
    };
    let cutoff = now
        .checked_sub(policy.temp_max_age)
        .unwrap_or(SystemTime::UNIX_EPOCH);
    for (dir, label) in [(Some(&cache), ""), (sha.as_ref(), "sha256/")] {
        let Some(dir) = dir else { continue };
        for name in
            old_temp_files(dir, cutoff).map_err(err(cache_dir.to_string(), "cannot list it"))?
        {
            match dir.remove_file(&name) {
                Ok(()) => out.temp_removed.push(format!("{label}{name}")),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(err(
                        format!("{cache_dir}/{label}{name}"),
                        "cannot remove it",
                    )(e));
                }
            }
        }
    }
    let Some(sha) = sha else { return Ok(out) };
    let mut entries = list(&sha).map_err(err(format!("{cache_dir}/sha256"), "cannot list it"))?;
    out.entries = entries.len();
    out.bytes_before = entries.iter().map(|e| e.bytes).sum();
    out.pinned = entries.iter().filter(|e| pinned.contains(&e.name)).count();
    let mut total = out.bytes_before;
    entries.retain(|e| !pinned.contains(&e.name));
    entries.sort_by(|a, b| a.used.cmp(&b.used).then_with(|| a.name.cmp(&b.name)));
    for e in entries {
        if total <= policy.max_bytes {
            break;
        }
        match sha.remove_file(&e.name) {
            Ok(()) => {}
            // Gone already: what eviction wanted.
            Err(x) if x.kind() == io::ErrorKind::NotFound => {}
            Err(x) => {
                return Err(err(
                    format!("{cache_dir}/sha256/{}", e.name),
                    "cannot remove it",
                )(x));
            }
        }
        total -= e.bytes;
        out.evicted.push(Evicted {
            sha256: e.name,
            bytes: e.bytes,
        });
    }
    out.bytes_after = total;
    out.over_cap = total > policy.max_bytes;
    Ok(out)
}

/// The temp files and links directly in `dir` last modified before `cutoff`.
fn old_temp_files(dir: &Dir, cutoff: SystemTime) -> io::Result<Vec<String>> {
    let cutoff = cutoff
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut out = Vec::new();
    for entry in dir.entries()? {
        let name = entry?.file_name();
        let Some(name) = name.to_str().filter(|n| is_temp_name(n)) else {
            continue;
        };
        let st = match statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(rustix::io::Errno::NOENT) => continue,
            Err(e) => return Err(e.into()),
        };
        let kind = FileType::from_raw_mode(st.st_mode);
        let old = u64::try_from(st.st_mtime).unwrap_or(0) < cutoff;
        if old && matches!(kind, FileType::RegularFile | FileType::Symlink) {
            out.push(name.to_string());
        }
    }
    out.sort();
    Ok(out)
}

/// The entries of `sha256/`: regular files named by a digest.
fn list(dir: &Dir) -> io::Result<Vec<Entry>> {
    let mut out = Vec::new();
    for entry in dir.entries()? {
        let name = entry?.file_name();
        let Some(name) = name.to_str().filter(|n| nodeward_node_config::is_sha256(n)) else {
            continue;
        };
        let st = match statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(rustix::io::Errno::NOENT) => continue,
            Err(e) => return Err(e.into()),
        };
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            continue;
        }
        out.push(Entry {
            name: name.to_string(),
            bytes: u64::try_from(st.st_size).unwrap_or(0),
            used: (st.st_mtime, st.st_mtime_nsec),
        });
    }
    Ok(out)
}
