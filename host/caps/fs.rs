//! `nodeward:host/fs`: files and directories beneath the host root.
//!
//! Grant check (`fs.read` / `fs.write` path prefixes), then the [`super::hostfs`] operation.
//! Confinement is by construction: [`crate::hostpath::HostPath`] refuses absolute paths and
//! `..` lexically, and every access goes through the root's `cap_std` directory handle.
//!
//! Secrets ([`crate::secrets`]): `write-file` substitutes secret references in granted secret
//! files (after the `fs.write` check, before the write), and `read-file` returns secret values
//! as their references, so a phase never holds a secret.

use super::bindings::fs::{self, DirEntry, FileKind, FileStat};
use super::hostfs::NodeKind;
use super::resolve::{Check, Final, link_destination};
use super::{Error, Outcome, PhaseCtx, host_path};
use crate::hostpath::HostPath;
use serde_json::json;

fn file_kind(k: NodeKind) -> FileKind {
    match k {
        NodeKind::File => FileKind::File,
        NodeKind::Dir => FileKind::Directory,
        NodeKind::Symlink => FileKind::Symlink,
        NodeKind::Other => FileKind::Other,
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
    /// the resolution passes through (see [`super::resolve`]).
    pub(crate) fn resolved(
        &self,
        path: &str,
        access: Access,
        last: Final,
    ) -> Result<HostPath, Error> {
        let p = host_path(path)?;
        let grants = &self.grants;
        let covers = |p: &HostPath| match access {
            Access::Read => grants.may_read(p),
            Access::Write => grants.may_write(p),
        };
        let (verb, grant) = match access {
            Access::Read => ("read", "fs.read"),
            Access::Write => ("write", "fs.write"),
        };
        let check = Check {
            verb,
            grant,
            covers: &covers,
            deadline: self.deadline,
        };
        self.session.resolve(&p, last, &check)
    }
}

impl fs::Host for PhaseCtx {
    fn read_file(&mut self, path: String) -> Result<Vec<u8>, Error> {
        self.audited("fs.read-file", json!({ "path": path }), |ctx| {
            let p = ctx.resolved(&path, Access::Read, Final::Follow)?;
            Ok(ctx.session.secrets.mask(ctx.session.read(&p)?))
        })
    }

    fn write_file(&mut self, path: String, contents: Vec<u8>, mode: u32) -> Result<Outcome, Error> {
        let mut args =
            json!({ "path": path, "bytes": contents.len(), "mode": format!("{mode:04o}") });
        let secrets = self.session.secrets.referenced(&contents);
        if !secrets.is_empty() {
            args["secrets"] = json!(secrets);
        }
        self.audited("fs.write-file", args, |ctx| {
            let p = ctx.resolved(&path, Access::Write, Final::NoFollow)?;
            let contents = ctx.with_secrets(&p, &contents, mode)?;
            ctx.session
                .write_file(&ctx.phase, &p, &contents, mode, ctx.deadline)
        })
    }

    fn create_dir(&mut self, path: String, mode: u32) -> Result<Outcome, Error> {
        self.audited(
            "fs.create-dir",
            json!({ "path": path, "mode": format!("{mode:04o}") }),
            |ctx| {
                let p = ctx.resolved(&path, Access::Write, Final::Follow)?;
                ctx.session.create_dir(&ctx.phase, &p, mode)
            },
        )
    }

    fn remove(&mut self, path: String) -> Result<Outcome, Error> {
        self.audited("fs.remove", json!({ "path": path }), |ctx| {
            let p = ctx.resolved(&path, Access::Write, Final::NoFollow)?;
            ctx.session.remove(&ctx.phase, &p)
        })
    }

    fn remove_all(&mut self, path: String) -> Result<Outcome, Error> {
        self.audited("fs.remove-all", json!({ "path": path }), |ctx| {
            let p = ctx.resolved(&path, Access::Write, Final::NoFollow)?;
            ctx.session.remove_all(&ctx.phase, &p, ctx.deadline)
        })
    }

    fn list_dir(&mut self, path: String) -> Result<Vec<DirEntry>, Error> {
        self.audited("fs.list-dir", json!({ "path": path }), |ctx| {
            let p = ctx.resolved(&path, Access::Read, Final::Follow)?;
            Ok(ctx
                .session
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
            Ok(ctx.session.lstat(&p)?.map(|st| FileStat {
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
                // named.
                // (An absolute or lexically escaping target is the session's `invalid-argument`.)
                if !target.starts_with('/') && link_destination(&p, &target).is_ok() {
                    let grants = &ctx.grants;
                    let covers = |p: &HostPath| grants.may_write(p);
                    let check = Check {
                        verb: "symlink",
                        grant: "fs.write",
                        covers: &covers,
                        deadline: ctx.deadline,
                    };
                    ctx.session.resolve_link_target(&p, &target, &check)?;
                }
                ctx.session.symlink(&ctx.phase, &target, &p)
            },
        )
    }
}
