//! `nodeward:host/fs`: files and directories beneath the host root.
//!
//! Grant check (`fs.read` / `fs.write` path prefixes), then the [`crate::rootfs`] operation.
//! Confinement is by construction: [`crate::hostpath::HostPath`] refuses absolute paths and
//! `..` lexically, and every access goes through the root's `cap_std` directory handle.
//!
//! Secrets ([`crate::secrets`]): `write-file` substitutes secret references in granted secret
//! files (after the `fs.write` check, before the write), and `read-file` returns secret values
//! and their parts as their references, so a phase never holds a secret. Contents that hold a
//! secret value or part as sent (a guess) always replace the file and answer `changed`, so no
//! answer tells a right guess from a wrong one.

use super::{Error, Outcome, PhaseCtx, denied, host_path, reserved_denied};
use crate::hostpath::HostPath;
use crate::rootfs::{Check, EntryKind, Final, link_destination};
use crate::wit::fs::{self, DirEntry, FileKind, FileStat};
use serde_json::json;
use std::borrow::Cow;

fn file_kind(k: EntryKind) -> FileKind {
    match k {
        EntryKind::File => FileKind::File,
        EntryKind::Dir => FileKind::Directory,
        EntryKind::Symlink => FileKind::Symlink,
        EntryKind::Other => FileKind::Other,
    }
}

/// What a call does with the path it names.
#[derive(Clone, Copy)]
pub(crate) enum Access {
    /// Read, list or stat: `fs.read` (or `fs.write`) must cover it.
    Read,
    /// Create, replace or remove: `fs.write` must cover it.
    Write,
}

impl PhaseCtx {
    /// `path` resolved as the call acts on it, with the grant for `access` covering every path
    /// the resolution passes through (see [`crate::rootfs::RootFs::resolve`]).
    pub(crate) fn resolved(
        &self,
        path: &str,
        access: Access,
        last: Final,
    ) -> Result<HostPath, Error> {
        let p = host_path(path)?;
        let (verb, grant) = match access {
            Access::Read => ("read", "fs.read"),
            Access::Write => ("write", "fs.write"),
        };
        let reserved = &self.run.reserved;
        // Reading inside a reserved path is refused; a change is refused on one that holds a
        // reserved path as well: removing, replacing or extracting into `var/lib`, or
        // replacing the link `usr/local`, would reach the agent's files.
        let reach = |p: &HostPath| match access {
            Access::Read => reserved.holding(p),
            Access::Write => reserved.touching(p),
        };
        if let Some(r) = reach(&p) {
            return Err(reserved_denied(format!("{verb} {p}"), &r));
        }
        let grants = &self.grants;
        // A reserved path is covered by no grant, so a link leading into one is refused too.
        let covers = |p: &HostPath| {
            reach(p).is_none()
                && match access {
                    Access::Read => grants.may_read(p),
                    Access::Write => grants.may_write(p),
                }
        };
        let check = Check {
            verb,
            grant,
            covers: &covers,
            deadline: self.deadline,
        };
        self.run.files.resolve(&p, last, &check)
    }
}

impl fs::Host for PhaseCtx {
    fn read_file(&mut self, path: String) -> Result<Vec<u8>, Error> {
        self.audited("fs.read-file", json!({ "path": path }), |ctx| {
            let p = ctx.resolved(&path, Access::Read, Final::Follow)?;
            Ok(ctx.run.secrets.mask(ctx.run.files.read(&p)?))
        })
    }

    fn write_file(&mut self, path: String, contents: Vec<u8>, mode: u32) -> Result<Outcome, Error> {
        let mut args =
            json!({ "path": path, "bytes": contents.len(), "mode": format!("{mode:04o}") });
        let secrets = self.run.secrets.referenced(&contents);
        if !secrets.is_empty() {
            args["secrets"] = json!(secrets);
        }
        self.audited("fs.write-file", args, |ctx| {
            let p = ctx.resolved(&path, Access::Write, Final::NoFollow)?;
            let substituted = ctx.with_secrets(&p, &contents, mode)?;
            ctx.write_sent(&p, &contents, &substituted, mode)
        })
    }

    fn create_dir(&mut self, path: String, mode: u32) -> Result<Outcome, Error> {
        self.audited(
            "fs.create-dir",
            json!({ "path": path, "mode": format!("{mode:04o}") }),
            |ctx| {
                let p = ctx.resolved(&path, Access::Write, Final::Follow)?;
                ctx.run.files.create_dir(&ctx.phase, &p, mode)
            },
        )
    }

    fn remove(&mut self, path: String) -> Result<Outcome, Error> {
        self.audited("fs.remove", json!({ "path": path }), |ctx| {
            let p = ctx.resolved(&path, Access::Write, Final::NoFollow)?;
            ctx.run.files.remove(&ctx.phase, &p)
        })
    }

    fn remove_all(&mut self, path: String) -> Result<Outcome, Error> {
        self.audited("fs.remove-all", json!({ "path": path }), |ctx| {
            // A tree holding a reserved path is refused by the resolution (a write).
            let p = ctx.resolved(&path, Access::Write, Final::NoFollow)?;
            ctx.run.files.remove_all(&ctx.phase, &p, ctx.deadline)
        })
    }

    fn list_dir(&mut self, path: String) -> Result<Vec<DirEntry>, Error> {
        self.audited("fs.list-dir", json!({ "path": path }), |ctx| {
            let p = ctx.resolved(&path, Access::Read, Final::Follow)?;
            Ok(ctx
                .run
                .files
                .list(&p)?
                .into_iter()
                .map(|(name, kind)| DirEntry {
                    name,
                    kind: file_kind(kind),
                })
                .collect())
        })
    }

    fn stat(&mut self, path: String) -> Result<Option<FileStat>, Error> {
        self.audited("fs.stat", json!({ "path": path }), |ctx| {
            let p = ctx.resolved(&path, Access::Read, Final::NoFollow)?;
            Ok(ctx.run.files.lstat(&p)?.map(|st| FileStat {
                kind: file_kind(st.kind),
                mode: st.mode,
                size: st.size,
            }))
        })
    }

    fn symlink(&mut self, target: String, path: String) -> Result<Outcome, Error> {
        self.audited(
            "fs.symlink",
            json!({ "target": target, "path": path }),
            |ctx| {
                let p = ctx.resolved(&path, Access::Write, Final::NoFollow)?;
                // A link may only lead where this phase may write, judged by where it really
                // leads through the links on the way: otherwise it would hand whoever follows
                // it later (the kubelet, containerd, another phase) a path the grant never
                // named. A target whose destination is no valid host path (too long) is
                // refused here, never let through unchecked; an absolute one, or one climbing
                // above the root, is `RootFs::symlink`'s to refuse.
                let judged = match link_destination(&p, &target) {
                    // `RootFs::symlink` refuses it as `invalid-argument`, as documented.
                    Err(Error::Escape(_)) => false,
                    Err(e) => return Err(e),
                    Ok(_) => true,
                };
                if !target.starts_with('/') && judged {
                    let grants = &ctx.grants;
                    let reserved = &ctx.run.reserved;
                    let covers =
                        |p: &HostPath| reserved.holding(p).is_none() && grants.may_write(p);
                    let check = Check {
                        verb: "symlink",
                        grant: "fs.write",
                        covers: &covers,
                        deadline: ctx.deadline,
                    };
                    ctx.run.files.resolve_link_target(&p, &target, &check)?;
                }
                ctx.run.files.symlink(&ctx.phase, &target, &p)
            },
        )
    }
}

impl PhaseCtx {
    /// Writes `contents` at `path` with `mode`: the bytes the phase sent (`sent`), secrets
    /// substituted. Sent bytes holding a secret value or part are a guess (no phase is given
    /// one): whether they equal the file must not show, so they replace it and the answer is
    /// `changed`, right or wrong ([`crate::secrets`]).
    pub(crate) fn write_sent(
        &self,
        path: &HostPath,
        sent: &[u8],
        contents: &[u8],
        mode: u32,
    ) -> Result<Outcome, Error> {
        let guessed = self.run.secrets.holds_value(sent);
        self.run.files.write_file_replacing(
            &self.phase,
            path,
            contents,
            mode,
            self.deadline,
            guessed,
        )
    }

    /// What `fs.write-file` puts on disk for `contents` at `path` with `mode`: `contents`
    /// itself when it holds no secret reference; else, when the phase's `secrets` grant names
    /// `path` for every secret referenced and `mode` has no group/other bits, `contents` with
    /// the values substituted. Called after the `fs.write` grant check.
    pub fn with_secrets<'a>(
        &self,
        path: &HostPath,
        contents: &'a [u8],
        mode: u32,
    ) -> Result<Cow<'a, [u8]>, Error> {
        let secrets = &self.run.secrets;
        let names = secrets.referenced(contents);
        if names.is_empty() {
            return Ok(Cow::Borrowed(contents));
        }
        for name in &names {
            if !self.grants.may_receive_secret(name, path) {
                return Err(denied(
                    format!("write secret {name} into {path}"),
                    &format!("secrets.{name}"),
                ));
            }
        }
        if mode & crate::secrets::GROUP_OTHER != 0 {
            return Err(Error::InvalidArgument(format!(
                "{path}: mode {mode:04o} gives group or other access, and the file would hold secret {}; use 0600",
                names.join(", ")
            )));
        }
        Ok(Cow::Owned(secrets.substitute(contents)))
    }
}
