//! `nodeward:host/mounts`: mounts beneath the host root.
//!
//! Grant check: `mounts.targets` prefixes for the target, `fs.read` for bind and overlay
//! sources, `fs.write` for overlay upper and work directories. `is-mounted` reads
//! `/proc/self/mountinfo` for real in both modes.
//!
//! # Current limitations
//! bind, tmpfs, overlay and unmount have their grant checks and plan-mode records; their
//! mount(2) implementation is tracked by the "real host capabilities" issue. In apply mode they
//! return `unavailable` naming the target.

use super::bindings::mounts;
use super::{Error, Outcome, PhaseCtx, denied, host_path};
use crate::hostpath::HostPath;
use crate::plan::{ChangeKind, RunMode};
use serde_json::json;

impl PhaseCtx {
    fn mount_target(&self, target: &str) -> Result<HostPath, Error> {
        let p = host_path(target)?;
        if !self.grants.may_mount(&p) {
            return Err(denied(format!("mount on {p}"), "mounts.targets"));
        }
        Ok(p)
    }

    fn mount_source(&self, source: &str, write: bool) -> Result<HostPath, Error> {
        let p = host_path(source)?;
        let (ok, grant) = if write {
            (self.grants.may_write(&p), "fs.write")
        } else {
            (self.grants.may_read(&p), "fs.read")
        };
        if !ok {
            return Err(denied(format!("use {p} as a mount source"), grant));
        }
        Ok(p)
    }

    fn mounted(&self, target: &HostPath) -> Result<bool, Error> {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
            .map_err(|e| Error::Io(format!("/proc/self/mountinfo: {e}")))?;
        let wanted = self.session.root.path().join(target.as_path());
        Ok(mountinfo
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .any(|mount_point| unescape_mountinfo(mount_point) == wanted.to_string_lossy()))
    }

    fn mount_change(&self, target: &HostPath, kind: ChangeKind) -> Result<Outcome, Error> {
        if self.session.mode == RunMode::Apply {
            return Err(Error::Unavailable(format!(
                "mount on {target}: this agent build has no mount backend yet"
            )));
        }
        if self.mounted(target)? {
            return Ok(Outcome::Unchanged);
        }
        self.record(kind);
        Ok(Outcome::Created)
    }
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape_mountinfo(s: &str) -> String {
    s.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

impl mounts::Host for PhaseCtx {
    fn bind(&mut self, source: String, target: String, read_only: bool) -> Result<Outcome, Error> {
        let args = json!({ "source": source, "target": target, "read-only": read_only });
        self.audited("mounts.bind", args, |ctx| {
            let t = ctx.mount_target(&target)?;
            let s = ctx.mount_source(&source, false)?;
            ctx.mount_change(
                &t,
                ChangeKind::MountBind {
                    source: s.to_string(),
                    target: t.to_string(),
                    read_only,
                },
            )
        })
    }

    fn tmpfs(&mut self, target: String, size_bytes: u64) -> Result<Outcome, Error> {
        self.audited(
            "mounts.tmpfs",
            json!({ "target": target, "size-bytes": size_bytes }),
            |ctx| {
                let t = ctx.mount_target(&target)?;
                ctx.mount_change(
                    &t,
                    ChangeKind::MountTmpfs {
                        target: t.to_string(),
                        size_bytes,
                    },
                )
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
            let t = ctx.mount_target(&target)?;
            if lower.is_empty() {
                return Err(Error::InvalidArgument(format!(
                    "overlay on {t}: needs at least one lower directory"
                )));
            }
            let lower = lower
                .iter()
                .map(|l| ctx.mount_source(l, false).map(|p| p.to_string()))
                .collect::<Result<Vec<_>, _>>()?;
            let upper = ctx.mount_source(&upper, true)?.to_string();
            let work = ctx.mount_source(&work, true)?.to_string();
            ctx.mount_change(
                &t,
                ChangeKind::MountOverlay {
                    lower,
                    upper,
                    work,
                    target: t.to_string(),
                },
            )
        })
    }

    fn unmount(&mut self, target: String, lazy: bool) -> Result<Outcome, Error> {
        self.audited(
            "mounts.unmount",
            json!({ "target": target, "lazy": lazy }),
            |ctx| {
                let t = ctx.mount_target(&target)?;
                if ctx.session.mode == RunMode::Apply {
                    return Err(Error::Unavailable(format!(
                        "unmount {t}: this agent build has no mount backend yet"
                    )));
                }
                if !ctx.mounted(&t)? {
                    return Ok(Outcome::Unchanged);
                }
                ctx.record(ChangeKind::Unmount {
                    target: t.to_string(),
                    lazy,
                });
                Ok(Outcome::Removed)
            },
        )
    }

    fn is_mounted(&mut self, target: String) -> Result<bool, Error> {
        self.audited("mounts.is-mounted", json!({ "target": target }), |ctx| {
            let t = ctx.mount_target(&target)?;
            ctx.mounted(&t)
        })
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn unescapes_mountinfo_paths() {
        assert_eq!(super::unescape_mountinfo("/a\\040b\\134c"), "/a b\\c");
    }
}
