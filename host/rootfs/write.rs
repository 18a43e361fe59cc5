//! The mutations of [`RootFs`], the plan-aware file layer: write, create, remove, link, and the
//! kernel-interface files. Each branches on the run mode first (plan mode records and updates
//! the overlay only) and records its [`ChangeKind`] in both modes.

use super::sys::{chmod_dir_nofollow, mount_id, remove_tree};
use super::{EntryKind, EntryStat, MAX_FILE_BYTES, RootFs, hash_stream, in_the_way, io_error};
use crate::durable::{self, fsync_dir};
use crate::hostpath::HostPath;
use crate::plan::{ChangeKind, Planned, file_diff, octal};
use crate::wit::{Error, Outcome};
use std::io::{self, Write};

impl RootFs {
    /// Replaces the file at `path` with `contents` and `mode` (see `fs.write-file`).
    pub fn write_file(
        &self,
        phase: &str,
        path: &HostPath,
        contents: &[u8],
        mode: u32,
        deadline: std::time::Instant,
    ) -> Result<Outcome, Error> {
        self.write_file_replacing(phase, path, contents, mode, deadline, false)
    }

    /// [`RootFs::write_file`], which when `always_replace` neither answers `unchanged` nor
    /// changes the mode alone: the file is replaced (`changed`) even when it holds `contents`
    /// already. For contents a phase sent holding a secret value, which are a guess: whether
    /// they equal the file must not show ([`crate::secrets`]).
    pub fn write_file_replacing(
        &self,
        phase: &str,
        path: &HostPath,
        contents: &[u8],
        mode: u32,
        deadline: std::time::Instant,
        always_replace: bool,
    ) -> Result<Outcome, Error> {
        if mode > 0o7777 {
            return Err(Error::InvalidArgument(format!(
                "{path}: mode {mode:o} is above 0o7777"
            )));
        }
        if contents.len() as u64 > MAX_FILE_BYTES {
            return Err(Error::InvalidArgument(format!(
                "{path}: {} bytes; write-file takes at most {MAX_FILE_BYTES} bytes",
                contents.len()
            )));
        }
        self.require_parent_dir(path)?;
        let secret = self.redactor.contains_secret(contents);
        // A plan shows no digest of bytes holding a secret: it could be checked against guesses.
        let sha256 = (!secret).then(|| crate::digest::sha256_hex(contents));
        let (kind, outcome) = match self.lstat(path)? {
            None => (
                ChangeKind::FileCreate {
                    path: path.to_string(),
                    mode: octal(mode),
                    sha256,
                    size: contents.len() as u64,
                    diff: file_diff(path, None, contents, mode, secret, deadline),
                },
                Outcome::Created,
            ),
            Some(EntryStat {
                kind: EntryKind::File,
                mode: old_mode,
                size: old_size,
                links,
            }) => {
                // Files of another size differ without reading them; a previous file too large
                // to read is replaced without a line diff. A file with another name (a hard
                // link) is neither read nor compared: that name may lie outside every grant,
                // so neither its contents nor whether they equal `contents` may reach the
                // phase or the plan.
                let old = if links == 1
                    && (old_size == contents.len() as u64 || old_size <= MAX_FILE_BYTES)
                {
                    Some(self.read(path)?)
                } else {
                    None
                };
                if old.as_deref() == Some(contents) && !always_replace {
                    if old_mode == mode {
                        return Ok(Outcome::Unchanged);
                    }
                    (
                        ChangeKind::ModeChange {
                            path: path.to_string(),
                            from: octal(old_mode),
                            to: octal(mode),
                        },
                        Outcome::Changed,
                    )
                } else {
                    let secret = secret
                        || old
                            .as_deref()
                            .is_some_and(|o| self.redactor.contains_secret(o))
                        || old_mode & 0o077 == 0;
                    let diff = match &old {
                        Some(old) => file_diff(path, Some(old), contents, mode, secret, deadline),
                        None if links > 1 => Some(format!(
                            "(not diffed: the previous file has {links} names (hard links); it \
                             is replaced, not read)\n"
                        )),
                        None => Some(format!(
                            "(not diffed: the previous file is {old_size} bytes)\n"
                        )),
                    };
                    (
                        ChangeKind::FileReplace {
                            path: path.to_string(),
                            mode: octal(mode),
                            previous_mode: octal(old_mode),
                            sha256,
                            size: contents.len() as u64,
                            diff,
                        },
                        Outcome::Changed,
                    )
                }
            }
            Some(st) => return Err(in_the_way(path, st.kind)),
        };
        if self.plan_mode() {
            self.plan_file(path, contents, mode)?;
        } else {
            // A new mode alone is given by replacing the file too: a chmod in place would
            // reach every other name of the file, wherever it is.
            self.atomic_write(path, contents, mode)?;
        }
        self.changed(phase, kind);
        Ok(outcome)
    }

    /// The durable replace of [`durable::write_file`] in `path`'s directory, opened without
    /// following any link.
    fn atomic_write(&self, path: &HostPath, contents: &[u8], mode: u32) -> Result<(), Error> {
        let dir = self.parent_dir(path)?;
        durable::write_file(&dir, path.file_name(), contents, mode, "write")
            .map_err(|e| io_error(path, e))
    }

    /// Creates `path` and its missing parents with `mode` (see `fs.create-dir`).
    pub fn create_dir(&self, phase: &str, path: &HostPath, mode: u32) -> Result<Outcome, Error> {
        if mode > 0o7777 {
            return Err(Error::InvalidArgument(format!(
                "{path}: mode {mode:o} is above 0o7777"
            )));
        }
        let mut outcome = Outcome::Unchanged;
        for prefix in path.prefixes() {
            match self.lstat(&prefix)? {
                Some(_) if self.is_dir(&prefix)? => continue,
                Some(st) => {
                    return Err(Error::Io(format!(
                        "{prefix}: exists and is a {:?}, not a directory",
                        st.kind
                    )));
                }
                None => {}
            }
            if self.plan_mode() {
                self.set_planned(&prefix, Planned::Dir { mode });
            } else {
                let fail = |e: io::Error| io_error(&prefix, e);
                let (parent, name) = self.root.open_parent_nofollow(&prefix).map_err(fail)?;
                parent.create_dir(name).map_err(fail)?;
                chmod_dir_nofollow(&parent, name, mode).map_err(fail)?;
                fsync_dir(&parent).map_err(fail)?;
            }
            self.changed(
                phase,
                ChangeKind::DirCreate {
                    path: prefix.to_string(),
                    mode: octal(mode),
                },
            );
            outcome = Outcome::Created;
        }
        Ok(outcome)
    }

    /// Removes the file, symlink or empty directory at `path` (see `fs.remove`).
    pub fn remove(&self, phase: &str, path: &HostPath) -> Result<Outcome, Error> {
        let Some(st) = self.lstat(path)? else {
            return Ok(Outcome::Unchanged);
        };
        if st.kind == EntryKind::Dir && !self.list(path)?.is_empty() {
            return Err(Error::Io(format!("{path}: directory is not empty")));
        }
        if self.plan_mode() {
            self.set_planned(path, Planned::Removed);
        } else {
            let (dir, name) = self
                .root
                .open_parent_nofollow(path)
                .map_err(|e| io_error(path, e))?;
            let r = if st.kind == EntryKind::Dir {
                dir.remove_dir(name)
            } else {
                dir.remove_file(name)
            };
            r.map_err(|e| io_error(path, e))?;
        }
        self.changed(
            phase,
            ChangeKind::Remove {
                path: path.to_string(),
            },
        );
        Ok(Outcome::Removed)
    }

    /// Removes `path` and everything beneath it without following symlinks or crossing into
    /// another mount (see `fs.remove-all`).
    pub fn remove_all(
        &self,
        phase: &str,
        path: &HostPath,
        deadline: std::time::Instant,
    ) -> Result<Outcome, Error> {
        let Some(st) = self.lstat(path)? else {
            return Ok(Outcome::Unchanged);
        };
        if self.plan_mode() {
            let mut overlay = self.overlay.lock().unwrap_or_else(|p| p.into_inner());
            overlay.remove_beneath(path);
            overlay.set(path.clone(), Planned::Removed);
        } else {
            let parent = self.parent_dir(path)?;
            let name = path.file_name();
            if st.kind == EntryKind::Dir {
                let parent_mount = mount_id(&parent).map_err(|e| io_error(path, e))?;
                remove_tree(
                    &parent,
                    name.as_ref(),
                    parent_mount,
                    path.as_str(),
                    deadline,
                )?;
            } else {
                parent.remove_file(name).map_err(|e| io_error(path, e))?;
            }
            fsync_dir(&parent).map_err(|e| io_error(path, e))?;
        }
        self.changed(
            phase,
            ChangeKind::Remove {
                path: path.to_string(),
            },
        );
        Ok(Outcome::Removed)
    }

    /// Makes `path` a symlink to `target` (see `fs.symlink`).
    pub fn symlink(&self, phase: &str, target: &str, path: &HostPath) -> Result<Outcome, Error> {
        check_link_target(path, target)?;
        self.require_parent_dir(path)?;
        let previous = match self.lstat(path)? {
            None => None,
            Some(EntryStat {
                kind: EntryKind::Symlink,
                ..
            }) => {
                let current = self.read_link(path)?;
                if current == target {
                    return Ok(Outcome::Unchanged);
                }
                Some(current)
            }
            Some(st) => {
                return Err(Error::Io(format!(
                    "{path}: a {:?} is in the way of the symlink",
                    st.kind
                )));
            }
        };
        if self.plan_mode() {
            self.set_planned(
                path,
                Planned::Symlink {
                    target: target.to_string(),
                },
            );
        } else {
            let dir = self.parent_dir(path)?;
            durable::replace_symlink(&dir, target, path.file_name())
                .map_err(|e| io_error(path, e))?;
        }
        let outcome = if previous.is_some() {
            Outcome::Changed
        } else {
            Outcome::Created
        };
        self.changed(
            phase,
            ChangeKind::Symlink {
                path: path.to_string(),
                target: target.to_string(),
                previous,
            },
        );
        Ok(outcome)
    }

    /// Writes a kernel-interface file (`proc/sys/...`, `proc/modules`) without a rename:
    /// procfs files cannot be replaced, only written. Beneath a root that is not `/`, missing
    /// parents are created so the root's equivalent exists, and the file (a plain file there)
    /// is emptied before it is written. A file with more than one name (hard link) is refused
    /// before anything is written: writing it in place would change its other names, which
    /// may lie anywhere. Records no change: the kernel capability records its own.
    pub fn write_kernel_file(&self, path: &HostPath, contents: &[u8]) -> Result<(), Error> {
        if self.plan_mode() {
            return self.plan_file(path, contents, 0o644);
        }
        use rustix::fs::{Mode, OFlags, openat};
        let system = self.root.is_system_root();
        if !system && let Some(parent) = path.parent() {
            for prefix in parent.prefixes() {
                let (dir, name) = self
                    .root
                    .open_parent_nofollow(&prefix)
                    .map_err(|e| io_error(&prefix, e))?;
                match dir.create_dir(name) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(io_error(&prefix, e)),
                }
            }
        }
        let (dir, name) = self
            .root
            .open_parent_nofollow(path)
            .map_err(|e| io_error(path, e))?;
        // procfs files cannot be created, only written; beneath another root they are files.
        // Never `O_TRUNC`: that would empty a hard-linked file before its links are seen.
        let create = if system {
            OFlags::empty()
        } else {
            OFlags::CREATE
        };
        let fd = openat(
            &dir,
            name,
            OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | create,
            Mode::from_raw_mode(0o644),
        )
        .map_err(|e| io_error(path, e.into()))?;
        let st = rustix::fs::fstat(&fd).map_err(|e| io_error(path, e.into()))?;
        if st.st_nlink > 1 {
            return Err(Error::Denied(format!(
                "write {path}: the file has {} names (hard links); another of them may lie \
                 outside every grant, so it is not written in place",
                st.st_nlink
            )));
        }
        let procfs = rustix::fs::fstatfs(&fd)
            .map_err(|e| io_error(path, e.into()))?
            .f_type
            == rustix::fs::PROC_SUPER_MAGIC;
        if !procfs {
            rustix::fs::ftruncate(&fd, 0).map_err(|e| io_error(path, e.into()))?;
        }
        std::fs::File::from(fd)
            .write_all(contents)
            .map_err(|e| io_error(path, e))
    }

    /// Gives the downloaded file at `path` the permission bits `mode` without changing it in
    /// place (`download.fetch` of bytes already there with another mode): its bytes are copied
    /// into a new file in the same directory, hashed on the way (they must still hash to
    /// `sha256`, else `failed`), and the copy is given `mode` and renamed over `path`. A file
    /// with a name besides `path` and `also` (its artifact cache entry) is `denied` and left
    /// as it is: the caller replaces such a file by a download instead.
    pub fn replace_with_mode(
        &self,
        path: &HostPath,
        sha256: &str,
        mode: u32,
        also: Option<&HostPath>,
        deadline: std::time::Instant,
    ) -> Result<(), Error> {
        let Some(mut from) = self.open_sole(path, also)? else {
            return Err(Error::Denied(format!(
                "chmod {path}: the file gained another name (a hard link) while it was checked"
            )));
        };
        let dir = self.parent_dir(path)?;
        let mut tmp = durable::TempFile::new(&dir, "write").map_err(|e| io_error(path, e))?;
        let copied = hash_stream(path, &mut from, Some(&mut tmp.file), deadline)?;
        if copied != sha256 {
            return Err(Error::Failed(format!(
                "{path}: changed while its mode was being set (sha256 {copied}, not {sha256})"
            )));
        }
        tmp.finish(mode).map_err(|e| io_error(path, e))?;
        tmp.persist(path.file_name()).map_err(|e| io_error(path, e))
    }
}

/// Refuses absolute link targets and targets that climb above the root from the link's
/// directory (checked lexically; resolution is confined again whenever the link is used).
fn check_link_target(path: &HostPath, target: &str) -> Result<(), Error> {
    let bad = |why: &str| {
        Err(Error::InvalidArgument(format!(
            "symlink {path} -> {target:?}: {why}"
        )))
    };
    if target.is_empty() || target.contains('\0') {
        return bad("empty target or NUL byte");
    }
    if target.starts_with('/') {
        return bad("absolute targets are refused; use a path relative to the link");
    }
    let mut depth = path.parent().map_or(0, |p| p.prefixes().count());
    for component in target.split('/') {
        match component {
            "" | "." => {}
            ".." => {
                if depth == 0 {
                    return bad("leads above the host root");
                }
                depth -= 1;
            }
            _ => depth += 1,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_targets_stay_beneath_the_root() {
        let p = HostPath::parse("opt/nodeward/node/current").expect("path");
        assert!(check_link_target(&p, "v1.34.1").is_ok());
        assert!(check_link_target(&p, "../../../etc").is_ok());
        assert!(check_link_target(&p, "../../../../etc").is_err());
        assert!(check_link_target(&p, "/etc").is_err());
        assert!(check_link_target(&p, "").is_err());
    }
}
