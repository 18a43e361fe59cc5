//! Whether an archive's entries are already in place in the destination: what lets a re-run
//! of `fetch-and-extract` answer `unchanged`, and so what a hard link planted under an entry's
//! name or a file holding a secret must never pass for (see [`ArchivePlan::out_of_place`]).

use super::{ArchivePlan, Item};
use crate::audit::Redactor;
use crate::caps::download::fetcher::hash_copy;
use cap_std::fs::{Dir, MetadataExt, PermissionsExt};
use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, Read};
use std::time::Instant;

impl ArchivePlan {
    /// The paths (relative to the destination) whose entry is not already in place; a
    /// [`super::LimitHit::Deadline`] error when hashing the files there reaches `deadline`. A file
    /// holding one of `secrets` is never in place: an archive entry equal to it would be a
    /// guess confirmed ([`crate::secrets`]), so it is written over like any other.
    pub(super) fn out_of_place(
        &self,
        dest: Option<&Dir>,
        secrets: &Redactor,
        deadline: Instant,
    ) -> Result<BTreeSet<String>, io::Error> {
        let mut todo = BTreeSet::new();
        let links = self.hard_links();
        for (path, (_, item)) in &self.items {
            let in_place = match dest {
                None => false,
                Some(d) => self.in_place(d, path, item, &links, secrets, deadline)?,
            };
            if !in_place {
                todo.insert(path.clone());
            }
        }
        Ok(todo)
    }

    /// How many hard links the archive makes to each of its files (a file not named here
    /// has one name, its own).
    fn hard_links(&self) -> BTreeMap<&str, u64> {
        let mut links = BTreeMap::new();
        for (_, item) in self.items.values() {
            if let Item::HardLink { target } = item {
                *links.entry(target.as_str()).or_default() += 1;
            }
        }
        links
    }

    /// Whether `item` is already at `path` beneath `dest`. A file is in place only with as
    /// many names as the archive gives it (a hard link of the archive is the same inode as
    /// its target): a file with a name the archive does not know, such as a link planted to
    /// a file outside the destination, is neither hashed nor kept, but replaced. A file
    /// holding one of `secrets` is never in place either (see [`ArchivePlan::out_of_place`]).
    fn in_place(
        &self,
        dest: &Dir,
        path: &str,
        item: &Item,
        links: &BTreeMap<&str, u64>,
        secrets: &Redactor,
        deadline: Instant,
    ) -> io::Result<bool> {
        let Some(meta) = lstat_in(dest, path)? else {
            return Ok(false);
        };
        let mode = meta.permissions().mode() & 0o777;
        match item {
            Item::Dir { mode: want } => Ok(meta.is_dir() && mode == *want),
            Item::File {
                mode: want,
                sha256,
                size,
            } => {
                if !meta.is_file()
                    || mode != *want
                    || meta.size() != *size
                    || meta.nlink() != 1 + links.get(path).copied().unwrap_or(0)
                {
                    return Ok(false);
                }
                let (sha, _) = hash_copy(&mut dest.open(path)?, None, deadline)?;
                Ok(sha == *sha256 && !holds_secret(dest, path, secrets)?)
            }
            Item::HardLink { target } => {
                let Some(file) = lstat_in(dest, target)? else {
                    return Ok(false);
                };
                let same = (meta.dev(), meta.ino()) == (file.dev(), file.ino());
                match self.items.get(target) {
                    Some((_, file)) if same => {
                        self.in_place(dest, target, file, links, secrets, deadline)
                    }
                    _ => Ok(false),
                }
            }
            Item::Symlink { target } => Ok(meta.file_type().is_symlink()
                && dest
                    .read_link_contents(path)
                    .is_ok_and(|t| t.as_os_str() == target.as_str())),
        }
    }
}

/// Whether the file at `path` beneath `dest` holds one of `secrets` (or a part of one).
fn holds_secret(dest: &Dir, path: &str, secrets: &Redactor) -> io::Result<bool> {
    let mut scan = secrets.scan();
    let mut file = dest.open(path)?;
    let mut buf = vec![0u8; 1 << 16];
    loop {
        match file.read(&mut buf) {
            Ok(0) => return Ok(scan.found()),
            Ok(n) => scan.feed(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// `lstat` of `path` beneath `dest`; `None` when nothing is there.
fn lstat_in(dest: &Dir, path: &str) -> io::Result<Option<cap_std::fs::Metadata>> {
    match dest.symlink_metadata(path) {
        Ok(m) => Ok(Some(m)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) if e.raw_os_error() == Some(rustix::io::Errno::NOTDIR.raw_os_error()) => Ok(None),
        Err(e) => Err(e),
    }
}
