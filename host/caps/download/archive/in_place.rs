//! Whether an archive's entries are already in place in the destination: what lets a re-run
//! of `fetch-and-extract` answer `unchanged`, and so what a hard link planted under an entry's
//! name or a file holding a secret must never pass for (see [`ArchivePlan::out_of_place`]).

use super::{ArchivePlan, Item};
use crate::audit::Redactor;
use crate::caps::download::fetcher::hash_copy;
use cap_std::fs::{Dir, File, MetadataExt, OpenOptions, OpenOptionsExt, PermissionsExt};
use rustix::fs::OFlags;
use rustix::io::Errno;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, Read, Seek, SeekFrom};
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

    /// The names of the hard links the archive makes to each of its files (a file not named
    /// here has one name, its own).
    fn hard_links(&self) -> BTreeMap<&str, Vec<&str>> {
        let mut links: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (name, (_, item)) in &self.items {
            if let Item::HardLink { target } = item {
                links
                    .entry(target.as_str())
                    .or_default()
                    .push(name.as_str());
            }
        }
        links
    }

    /// Whether `item` is already at `path` beneath `dest`. A file is in place only with as
    /// many names as the archive gives it and that are there: its own and those of the
    /// archive's hard links to it that are already the same inode beneath `dest` (a link of
    /// the archive not made yet is no name of it). A file with any other name, such as a
    /// link planted to a file outside the destination, is neither hashed nor kept, but
    /// replaced. The file is opened once, never through a link at its own name, and its
    /// type, mode, size, link count, hash and secrets all come from that one descriptor (the
    /// `lstat` by name before only keeps a device from being opened). A file holding one of
    /// `secrets` is never in place (see [`ArchivePlan::out_of_place`]).
    fn in_place(
        &self,
        dest: &Dir,
        path: &str,
        item: &Item,
        links: &BTreeMap<&str, Vec<&str>>,
        secrets: &Redactor,
        deadline: Instant,
    ) -> io::Result<bool> {
        let Some(meta) = lstat_in(dest, path)? else {
            return Ok(false);
        };
        match item {
            Item::Symlink { target } => {
                return Ok(meta.file_type().is_symlink()
                    && dest
                        .read_link_contents(path)
                        .is_ok_and(|t| t.as_os_str() == target.as_str()));
            }
            // Opened only when a directory or a regular file is there: opening a device
            // could act on it.
            _ if !(meta.is_dir() || meta.is_file()) => return Ok(false),
            _ => {}
        }
        let Some(mut file) = open_nofollow(dest, path)? else {
            return Ok(false);
        };
        let meta = file.metadata()?;
        let mode = meta.permissions().mode() & 0o777;
        match item {
            Item::Dir { mode: want } => Ok(meta.is_dir() && mode == *want),
            Item::File {
                mode: want,
                sha256,
                size,
            } => {
                if !meta.is_file() || mode != *want || meta.size() != *size {
                    return Ok(false);
                }
                let mut names = 1;
                for link in links.get(path).into_iter().flatten() {
                    if lstat_in(dest, link)?
                        .is_some_and(|l| (l.dev(), l.ino()) == (meta.dev(), meta.ino()))
                    {
                        names += 1;
                    }
                }
                if meta.nlink() != names {
                    return Ok(false);
                }
                let (sha, _) = hash_copy(&mut file, None, deadline)?;
                if sha != *sha256 {
                    return Ok(false);
                }
                file.seek(SeekFrom::Start(0))?;
                Ok(!holds_secret(&mut file, secrets)?)
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
            // Answered above, by name: a link is never opened.
            Item::Symlink { .. } => Ok(false),
        }
    }
}

/// Whether `file` holds one of `secrets` (or a part of one), read from where it stands.
fn holds_secret(file: &mut File, secrets: &Redactor) -> io::Result<bool> {
    let mut scan = secrets.scan();
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

/// `path` beneath `dest` opened for reading, never through a link at its last component
/// (`O_NOFOLLOW`) and never waiting (`O_NONBLOCK`: a FIFO swapped in has no writer); `None`
/// when nothing, or a link, is there.
fn open_nofollow(dest: &Dir, path: &str) -> io::Result<Option<File>> {
    let mut opts = OpenOptions::new();
    opts.read(true)
        .custom_flags((OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY).bits() as i32);
    match dest.open_with(path, &opts) {
        Ok(f) => Ok(Some(f)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e)
            if [Errno::NOTDIR, Errno::LOOP]
                .iter()
                .any(|n| e.raw_os_error() == Some(n.raw_os_error())) =>
        {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// `lstat` of `path` beneath `dest`; `None` when nothing is there.
fn lstat_in(dest: &Dir, path: &str) -> io::Result<Option<cap_std::fs::Metadata>> {
    match dest.symlink_metadata(path) {
        Ok(m) => Ok(Some(m)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) if e.raw_os_error() == Some(Errno::NOTDIR.raw_os_error()) => Ok(None),
        Err(e) => Err(e),
    }
}
