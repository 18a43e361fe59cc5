//! `nodeward:host/mounts`: mounts beneath the host root.
//!
//! # Background
//! A mount changes what every process sees under a path, so both where it lands and what it
//! exposes must stay beneath the host root and inside the phase's grants. This module is the
//! grant check and dispatch; [`super::mount_sys`] makes the syscalls.
//!
//! # Guarantees
//! - Grant check first, on the paths as given: `mounts.targets` prefixes for the target,
//!   `fs.read` for bind and overlay lower directories, `fs.write` for overlay upper and work
//!   directories. Nothing is opened for a call the grant does not cover.
//! - Each directory is then opened beneath the root through cap-std (`..` is refused lexically
//!   as `invalid-argument`; a symlink leading outside the root is `escape`), and the syscall
//!   acts on that descriptor (`/proc/self/fd/<fd>`), so a symlink swapped in afterwards cannot
//!   redirect the mount. Symlinks inside the root are followed, so the directory's resolved
//!   location must be covered by the same grant too (`denied` otherwise), and must not be the
//!   root itself (`invalid-argument`): a symlink the phase may plant cannot widen its grant.
//!   Nor may it be (or lie in) the agent's own process in a procfs (`denied`, see
//!   [`crate::rootfs::RootFs::reaches_agent_process`]): a bind of `proc/self` would expose the
//!   agent's environment wherever the phase may read.
//! - `unchanged` when the target already is a mount point (bind, tmpfs, overlay) or is not one
//!   (unmount), decided on the opened directory (statx `STATX_ATTR_MOUNT_ROOT`).
//! - Apply mode records exactly the [`ChangeKind`] plan mode records. Syscall failures
//!   (EPERM, EBUSY, ...) are `io` naming the target.
//! - Plan mode mounts nothing. It resolves and checks directories that exist on the host the
//!   same way; a directory that exists only in the plan's overlay (created earlier in the run)
//!   is checked lexically and counts as not mounted.
//!
//! # Caveats
//! The plan overlay does not model mounts, so in plan mode `is-mounted` after a planned mount
//! still answers from the host.

use super::mount_sys;
use super::{Error, Outcome, PhaseCtx, denied, host_path, reserved_denied};
use crate::grants::Grants;
use crate::hostpath::{HostPath, is_escape};
use crate::plan::{ChangeKind, RunMode};
use crate::rootfs::io_error;
use crate::wit::mounts;
use cap_std::fs::Dir;
use serde_json::json;

/// A directory a mount call names, opened beneath the root.
struct Opened {
    /// The directory (crossing any mount already on it).
    dir: Dir,
    /// Where it is beneath the root, symlinks followed.
    at: HostPath,
}

/// What a path names, as this run sees it.
enum Lookup {
    /// A directory on the host.
    Host(Opened),
    /// A directory that exists only in the plan's overlay.
    Planned,
    /// Nothing.
    Missing,
}

/// Which grant a directory must be covered by.
#[derive(Clone, Copy)]
enum Use {
    Target,
    Read,
    Write,
}

impl Use {
    fn allows(self, grants: &Grants, p: &HostPath) -> bool {
        match self {
            Use::Target => grants.may_mount(p),
            Use::Read => grants.may_read(p),
            Use::Write => grants.may_write(p),
        }
    }

    fn grant(self) -> &'static str {
        match self {
            Use::Target => "mounts.targets",
            Use::Read => "fs.read",
            Use::Write => "fs.write",
        }
    }

    fn what(self) -> &'static str {
        match self {
            Use::Target => "mount on",
            Use::Read | Use::Write => "use as a mount source",
        }
    }
}

fn not_a_dir(p: &HostPath) -> Error {
    Error::InvalidArgument(format!("{p}: not a directory"))
}

impl PhaseCtx {
    /// `unmount` of a mount on a file (not a directory): its parent directory is opened and
    /// checked as any target is (beneath the root, granted where it really is), the file is
    /// looked at without following a symlink, and unmounted only if the mount table lists it
    /// and it is still the same file.
    fn unmount_file(&self, t: &HostPath, lazy: bool) -> Result<Outcome, Error> {
        let parent = t.parent().ok_or_else(|| not_a_dir(t))?;
        let Lookup::Host(Opened { dir, at }) = self.look_up(&parent, Use::Target)? else {
            return Ok(Outcome::Unchanged);
        };
        let name = t.file_name();
        let st = match rustix::fs::statat(&dir, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(rustix::io::Errno::NOENT) => return Ok(Outcome::Unchanged),
            Err(e) => return Err(io_error(t, e.into())),
        };
        if rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Symlink {
            return Err(Error::InvalidArgument(format!(
                "{t}: a symlink, not a mount point"
            )));
        }
        let location = mount_sys::fd_location(&dir)
            .map_err(|e| io_error(t, e))?
            .join(name);
        let mountinfo =
            std::fs::read_to_string("/proc/self/mountinfo").map_err(|e| io_error(t, e))?;
        if !mount_sys::mountinfo_has(&mountinfo, &location) {
            return Ok(Outcome::Unchanged);
        }
        if self.run.files.mode == RunMode::Apply {
            let file_at = at
                .join(name)
                .map_err(|e| Error::InvalidArgument(e.to_string()))?;
            mount_sys::unmount(&dir, name, (st.st_dev, st.st_ino), lazy)
                .map_err(|e| mount_error(t, &file_at, e))?;
        }
        self.changed(ChangeKind::Unmount {
            target: t.to_string(),
            lazy,
        });
        Ok(Outcome::Removed)
    }

    /// The lexical check, the reserved-path check and the grant check on the path as given.
    fn granted(&self, raw: &str, usage: Use) -> Result<HostPath, Error> {
        let p = host_path(raw)?;
        self.not_reserved(&p, &p, usage)?;
        if !usage.allows(&self.grants, &p) {
            return Err(denied(format!("{} {p}", usage.what()), usage.grant()));
        }
        Ok(p)
    }

    /// `denied` when the directory `at` (where `p` resolves to) is, lies in or holds a path
    /// reserved to the agent: a mount on it would hide the agent's files from the agent, a
    /// mount of it would expose them where the phase's grants reach.
    fn not_reserved(&self, p: &HostPath, at: &HostPath, usage: Use) -> Result<(), Error> {
        if matches!(usage, Use::Target) && crate::reserved::is_reserved_mount_target(at) {
            return Err(Error::Denied(format!(
                "{} {p}: {at} is a kernel file system the agent relies on (no grant covers it)",
                usage.what()
            )));
        }
        match self.run.reserved.touching(at) {
            Some(r) if p == at => Err(reserved_denied(format!("{} {p}", usage.what()), &r)),
            Some(r) => Err(reserved_denied(
                format!("{} {p} (resolves to {at})", usage.what()),
                &r,
            )),
            None => Ok(()),
        }
    }

    /// Opens `p` beneath the root and checks where it really is (see the module docs).
    fn look_up(&self, p: &HostPath, usage: Use) -> Result<Lookup, Error> {
        let root = &self.run.files.root;
        let dir = match root.dir().open_dir(p.as_path()) {
            Ok(dir) => dir,
            Err(e) if e.raw_os_error() == Some(rustix::io::Errno::NOTDIR.raw_os_error()) => {
                return Err(not_a_dir(p));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !is_escape(&e) => {
                if self.run.files.mode == RunMode::Plan && self.run.files.is_dir(p)? {
                    return Ok(Lookup::Planned);
                }
                return Ok(Lookup::Missing);
            }
            Err(e) => return Err(io_error(p, e)),
        };
        let location = mount_sys::fd_location(&dir).map_err(|e| io_error(p, e))?;
        let relative = location.strip_prefix(root.path()).map_err(|_| {
            Error::Escape(format!(
                "{p}: resolves to {}, outside the host root",
                location.display()
            ))
        })?;
        if relative.as_os_str().is_empty() {
            return Err(Error::InvalidArgument(format!(
                "{p}: resolves to the host root itself"
            )));
        }
        let at = relative
            .to_str()
            .and_then(|s| HostPath::parse(s).ok())
            .ok_or_else(|| {
                Error::Io(format!(
                    "{p}: resolves to {}, which is not a valid host path",
                    relative.display()
                ))
            })?;
        self.not_reserved(p, &at, usage)?;
        if self.run.files.reaches_agent_process(&at)? {
            return Err(Error::Denied(format!(
                "{} {p}: resolves to {at}, the agent's own process (no grant covers it)",
                usage.what()
            )));
        }
        if at != *p && !usage.allows(&self.grants, &at) {
            return Err(denied(
                format!("{} {p} (resolves to {at})", usage.what()),
                usage.grant(),
            ));
        }
        Ok(Lookup::Host(Opened { dir, at }))
    }

    /// [`Self::look_up`] for a directory that must exist: `Some` on the host, `None` when it
    /// exists only in the plan.
    fn existing(&self, p: &HostPath, usage: Use) -> Result<Option<Opened>, Error> {
        match self.look_up(p, usage)? {
            Lookup::Host(o) => Ok(Some(o)),
            Lookup::Planned => Ok(None),
            Lookup::Missing => Err(Error::NotFound(format!("{p}: no such directory"))),
        }
    }

    fn is_mount_root(&self, opened: &Opened) -> Result<bool, Error> {
        mount_sys::is_mount_root(&opened.dir).map_err(|e| io_error(&opened.at, e))
    }

    /// The shared tail of bind, tmpfs and overlay: `unchanged` when `target` already is a
    /// mount point; otherwise mount (apply mode only) and record `kind`.
    fn mount_on(
        &self,
        t: &HostPath,
        target: Option<&Opened>,
        kind: ChangeKind,
        mount: impl FnOnce(&Dir) -> Result<(), rustix::io::Errno>,
    ) -> Result<Outcome, Error> {
        if let Some(target) = target
            && self.is_mount_root(target)?
        {
            return Ok(Outcome::Unchanged);
        }
        if self.run.files.mode == RunMode::Apply {
            let Some(target) = target else {
                return Err(Error::NotFound(format!("{t}: no such directory")));
            };
            mount(&target.dir).map_err(|e| mount_error(t, &target.at, e))?;
        }
        self.changed(kind);
        Ok(Outcome::Created)
    }
}

/// `io` naming the target (and where it resolved to, when that differs).
fn mount_error(t: &HostPath, at: &HostPath, e: rustix::io::Errno) -> Error {
    let hint = match e {
        rustix::io::Errno::PERM => " (the agent needs CAP_SYS_ADMIN in its mount namespace)",
        rustix::io::Errno::STALE => " (it was renamed or replaced while being unmounted)",
        _ => "",
    };
    if t == at {
        Error::Io(format!("{t}: {e}{hint}"))
    } else {
        Error::Io(format!("{t} (resolved to {at}): {e}{hint}"))
    }
}

/// Source directories of a mount, opened; `None` when any exists only in the plan.
fn all_on_host(dirs: Vec<Option<Opened>>) -> Option<Vec<Dir>> {
    dirs.into_iter().map(|d| d.map(|o| o.dir)).collect()
}

impl mounts::Host for PhaseCtx {
    fn bind(&mut self, source: String, target: String, read_only: bool) -> Result<Outcome, Error> {
        let args = json!({ "source": source, "target": target, "read-only": read_only });
        self.audited("mounts.bind", args, |ctx| {
            let t = ctx.granted(&target, Use::Target)?;
            // A writable bind lets writes through the target land in the source: that needs
            // the write grant on the source, not only the read grant.
            let source_use = if read_only { Use::Read } else { Use::Write };
            let s = ctx.granted(&source, source_use)?;
            let opened_t = ctx.existing(&t, Use::Target)?;
            let opened_s = ctx.existing(&s, source_use)?;
            let kind = ChangeKind::MountBind {
                source: s.to_string(),
                target: t.to_string(),
                read_only,
            };
            ctx.mount_on(&t, opened_t.as_ref(), kind, |target| {
                let Some(src) = &opened_s else {
                    return Err(rustix::io::Errno::NOENT);
                };
                mount_sys::bind(&src.dir, target, read_only)
            })
        })
    }

    fn tmpfs(&mut self, target: String, size_bytes: u64) -> Result<Outcome, Error> {
        self.audited(
            "mounts.tmpfs",
            json!({ "target": target, "size-bytes": size_bytes }),
            |ctx| {
                let t = ctx.granted(&target, Use::Target)?;
                if size_bytes == 0 {
                    // tmpfs reads size=0 as "no limit".
                    return Err(Error::InvalidArgument(format!(
                        "tmpfs on {t}: size-bytes must be greater than 0"
                    )));
                }
                let opened_t = ctx.existing(&t, Use::Target)?;
                let kind = ChangeKind::MountTmpfs {
                    target: t.to_string(),
                    size_bytes,
                };
                ctx.mount_on(&t, opened_t.as_ref(), kind, |target| {
                    mount_sys::tmpfs(target, size_bytes)
                })
            },
        )
    }

    fn overlay(
        &mut self,
        lower: Vec<String>,
        upper: String,
        work: String,
        target: String,
    ) -> Result<Outcome, Error> {
        let args = json!({ "lower": lower, "upper": upper, "work": work, "target": target });
        self.audited("mounts.overlay", args, |ctx| {
            let t = ctx.granted(&target, Use::Target)?;
            if lower.is_empty() {
                return Err(Error::InvalidArgument(format!(
                    "overlay on {t}: needs at least one lower directory"
                )));
            }
            let lower = lower
                .iter()
                .map(|l| ctx.granted(l, Use::Read))
                .collect::<Result<Vec<_>, _>>()?;
            let upper = ctx.granted(&upper, Use::Write)?;
            let work = ctx.granted(&work, Use::Write)?;
            let opened_t = ctx.existing(&t, Use::Target)?;
            let mut sources = Vec::new();
            for l in &lower {
                sources.push(ctx.existing(l, Use::Read)?);
            }
            sources.push(ctx.existing(&upper, Use::Write)?);
            sources.push(ctx.existing(&work, Use::Write)?);
            let kind = ChangeKind::MountOverlay {
                lower: lower.iter().map(HostPath::to_string).collect(),
                upper: upper.to_string(),
                work: work.to_string(),
                target: t.to_string(),
            };
            ctx.mount_on(&t, opened_t.as_ref(), kind, |target| {
                let Some(mut dirs) = all_on_host(sources) else {
                    return Err(rustix::io::Errno::NOENT);
                };
                let (Some(work), Some(upper)) = (dirs.pop(), dirs.pop()) else {
                    return Err(rustix::io::Errno::INVAL);
                };
                mount_sys::overlay(&dirs, &upper, &work, target)
            })
        })
    }

    fn unmount(&mut self, target: String, lazy: bool) -> Result<Outcome, Error> {
        self.audited(
            "mounts.unmount",
            json!({ "target": target, "lazy": lazy }),
            |ctx| {
                let t = ctx.granted(&target, Use::Target)?;
                let opened = match ctx.look_up(&t, Use::Target) {
                    Ok(Lookup::Host(opened)) => opened,
                    Ok(_) => return Ok(Outcome::Unchanged),
                    // A file mount point (a pod's network namespace is an nsfs file).
                    Err(Error::InvalidArgument(m)) if m.ends_with("not a directory") => {
                        return ctx.unmount_file(&t, lazy);
                    }
                    Err(e) => return Err(e),
                };
                if !ctx.is_mount_root(&opened)? {
                    return Ok(Outcome::Unchanged);
                }
                if ctx.run.files.mode == RunMode::Apply {
                    let Opened { dir, at } = opened;
                    let id = mount_sys::identity(&dir).map_err(|e| mount_error(&t, &at, e))?;
                    // Our own descriptor on the mount would keep it busy.
                    drop(dir);
                    let parent = match at.parent() {
                        Some(p) => ctx
                            .run
                            .files
                            .root
                            .dir()
                            .open_dir(p.as_path())
                            .map_err(|e| io_error(&p, e))?,
                        None => ctx
                            .run
                            .files
                            .root
                            .dir()
                            .try_clone()
                            .map_err(|e| io_error(&at, e))?,
                    };
                    mount_sys::unmount(&parent, at.file_name(), id, lazy)
                        .map_err(|e| mount_error(&t, &at, e))?;
                }
                ctx.changed(ChangeKind::Unmount {
                    target: t.to_string(),
                    lazy,
                });
                Ok(Outcome::Removed)
            },
        )
    }

    fn is_mounted(&mut self, target: String) -> Result<bool, Error> {
        self.audited("mounts.is-mounted", json!({ "target": target }), |ctx| {
            let t = ctx.granted(&target, Use::Target)?;
            match ctx.look_up(&t, Use::Target)? {
                Lookup::Host(opened) => ctx.is_mount_root(&opened),
                Lookup::Planned | Lookup::Missing => Ok(false),
            }
        })
    }
}
