//! Tarball extraction for `download.fetch-and-extract`: the whole archive validated before
//! anything is written ([`ArchivePlan::validate`]), compared with what is in place, then
//! written entry by entry beneath the destination's directory handle, all within the
//! extraction bounds and the phase deadline (`super::bounds`).

use super::bounds::{Bounded, ExtractBounds, LimitHit, Meter};
use super::error::DownloadError;
use super::fetcher::hash_copy;
use crate::audit::Redactor;
use crate::durable::{self, TempFile};
use crate::hostpath::{HostPath, is_escape, open_dir_nofollow_at};
use crate::rootfs::chmod_dir_nofollow;
use cap_std::fs::{Dir, File};
use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, Seek, SeekFrom};
use url::Url;

mod in_place;

/// The longest symlink target extracted (Linux `PATH_MAX`); each is kept in memory until the
/// archive is written.
const MAX_LINK_TARGET: usize = 4096;

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
struct ArchivePlan {
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
    /// Reading stops, and the archive is refused, at the phase deadline
    /// ([`DownloadError::ExtractTimeout`]) and at each limit of `bounds`
    /// ([`DownloadError::Limit`] naming it), so nothing is written in either case.
    fn validate(
        archive: &mut File,
        strip: u32,
        dest: Option<&Dir>,
        url: &Url,
        bounds: &ExtractBounds,
    ) -> Result<Self, DownloadError> {
        let refuse = |name: &str, why: &str| DownloadError::EntryRefused {
            url: Box::new(url.clone()),
            entry: name.to_string(),
            reason: why.to_string(),
        };
        let meter = Meter::new(true);
        let bad = |e: io::Error| match meter.hit().or(LimitHit::of(&e)) {
            Some(hit) => hit.error(&bounds.limits, url, "nothing was extracted"),
            None => DownloadError::NotTarGz {
                url: Box::new(url.clone()),
                source: e,
            },
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

    /// Writes the entries in `todo` into `dest` (a handle on the destination directory), each
    /// file through a temp file and a rename, then sets directory modes and fsyncs.
    ///
    /// The archive was validated within the same `bounds`, so only the deadline can stop this
    /// ([`DownloadError::ExtractTimeout`]): the entries already renamed into place stay, the
    /// one being written is removed with its temp file, and a later run extracts what is
    /// missing.
    #[allow(clippy::too_many_arguments)]
    fn write(
        &self,
        archive: &mut File,
        strip: u32,
        dest: &Dir,
        dest_path: &HostPath,
        todo: &BTreeSet<String>,
        url: &Url,
        bounds: &ExtractBounds,
    ) -> Result<(), DownloadError> {
        const PARTIAL: &str = "the entries written before it stay and a later run completes them";
        let meter = Meter::new(false);
        let fail = |path: &str, e: io::Error| match meter.hit().or(LimitHit::of(&e)) {
            Some(hit) => hit.error(&bounds.limits, url, PARTIAL),
            None => DownloadError::io(join(dest_path.as_str(), path), e),
        };
        let bad = |e: io::Error| match meter.hit().or(LimitHit::of(&e)) {
            Some(hit) => hit.error(&bounds.limits, url, PARTIAL),
            None => DownloadError::Unreadable {
                url: Box::new(url.clone()),
                source: e,
            },
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
                // Files and links are made in their own directory (temp files live beside
                // their target) and renamed into place; the directories are fsynced below.
                Item::File { mode, sha256, .. } => {
                    let dir = sub_dir(dest, parent).map_err(|e| fail(parent, e))?;
                    let mut tmp = TempFile::new(&dir, "extract").map_err(|e| fail(&path, e))?;
                    let (got, _) = hash_copy(&mut entry, Some(&mut tmp.file), bounds.deadline)
                        .map_err(|e| fail(&path, e))?;
                    if got != *sha256 {
                        return Err(DownloadError::EntryChanged {
                            url: Box::new(url.clone()),
                            entry: path,
                        });
                    }
                    tmp.finish(*mode).map_err(|e| fail(&path, e))?;
                    tmp.rename(leaf).map_err(|e| fail(&path, e))?;
                }
                Item::Symlink { target } => {
                    let dir = sub_dir(dest, parent).map_err(|e| fail(parent, e))?;
                    durable::place(&dir, leaf, "link", |tmp| dir.symlink(target, tmp))
                        .map_err(|e| fail(&path, e))?;
                }
                Item::HardLink { target } => {
                    let dir = sub_dir(dest, parent).map_err(|e| fail(parent, e))?;
                    durable::place(&dir, leaf, "link", |tmp| dest.hard_link(target, &dir, tmp))
                        .map_err(|e| fail(&path, e))?;
                }
            }
            touched.insert(parent.to_string());
        }
        // Directory modes last, so a read-only directory does not stop its own extraction.
        for (path, (_, item)) in self.items.iter().rev() {
            if let Item::Dir { mode } = item
                && todo.contains(path)
            {
                chmod_dir(dest, path, *mode).map_err(|e| fail(path, e))?;
                touched.insert(path.clone());
            }
        }
        for dir in &touched {
            sub_dir(dest, dir)
                .and_then(|d| durable::fsync_dir(&d))
                .map_err(|e| fail(dir, e))?;
        }
        Ok(())
    }
}

/// Sets the permission bits of the directory `path` beneath `dest` through a descriptor
/// opened `O_DIRECTORY | O_NOFOLLOW` in its parent ([`chmod_dir_nofollow`]): whatever was
/// swapped in under that name (a symlink to a hard-linked file) is refused, never chmodded.
fn chmod_dir(dest: &Dir, path: &str, mode: u32) -> io::Result<()> {
    let (parent, leaf) = path.rsplit_once('/').unwrap_or(("", path));
    chmod_dir_nofollow(&sub_dir(dest, parent)?, leaf, mode)
}

/// The directory `rel` beneath `dest` (`dest` itself when empty), opened through `dest`'s
/// `cap_std` handle, so it resolves beneath `dest` as every extracted path does.
fn sub_dir(dest: &Dir, rel: &str) -> io::Result<Dir> {
    if rel.is_empty() {
        dest.try_clone()
    } else {
        dest.open_dir(rel)
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

/// Extracts the verified archive `archive` into `dest_dir` beneath `root`, creating the
/// directory when missing (its parent must exist). In `dry_run` nothing is written: the
/// result says what extracting would do. A file there holding one of `secrets` is never taken
/// as already in place. `bounds` stop it at the phase deadline and the
/// extraction limits: an archive refused by its validation writes nothing; the deadline may
/// stop the writing itself, leaving the entries already in place.
#[allow(clippy::too_many_arguments)]
pub fn extract(
    root: &Dir,
    archive: &mut File,
    dest_dir: &HostPath,
    strip: u32,
    url: &Url,
    dry_run: bool,
    secrets: &Redactor,
    bounds: ExtractBounds,
) -> Result<Extracted, DownloadError> {
    let fail = |e: io::Error| match LimitHit::of(&e) {
        Some(hit) => hit.error(&bounds.limits, url, "nothing was extracted"),
        None => DownloadError::io(dest_dir, e),
    };
    let existing = match root.symlink_metadata(dest_dir.as_path()) {
        Ok(m) if m.is_dir() => Some(open_dir_nofollow_at(root, Some(dest_dir)).map_err(fail)?),
        Ok(_) => {
            return Err(DownloadError::NotADirectory {
                path: dest_dir.to_string(),
            });
        }
        Err(e) if is_escape(&e) => return Err(fail(e)),
        Err(_) => None,
    };
    let plan = ArchivePlan::validate(archive, strip, existing.as_ref(), url, &bounds)?;
    let todo = plan
        .out_of_place(existing.as_ref(), secrets, bounds.deadline)
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
                return Err(DownloadError::NoParent {
                    path: dest_dir.to_string(),
                    parent: parent.to_string(),
                });
            }
            // As for `fetch`: the resolved path is opened without following any link.
            let parent = open_dir_nofollow_at(root, dest_dir.parent().as_ref()).map_err(fail)?;
            parent.create_dir(dest_dir.file_name()).map_err(fail)?;
            let dest = open_dir_nofollow_at(root, Some(dest_dir)).map_err(fail)?;
            rustix::fs::fchmod(&dest, rustix::fs::Mode::from_raw_mode(0o755))
                .map_err(|e| fail(e.into()))?;
            durable::fsync_dir(&parent).map_err(fail)?;
            dest
        }
    };
    plan.write(archive, strip, &dest, dest_dir, &todo, url, &bounds)?;
    durable::fsync_dir(&dest).map_err(fail)?;
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
}
