//! Symlink resolution for grant checks: where a host path really leads.
//!
//! # Background
//! A grant names path prefixes. Checking it on the path as the guest wrote it is not enough:
//! with `fs.write = ["w"]` a phase could make `w/e -> ../etc` and then write `w/e/shadow`, and a
//! link already present in the root (planted by anyone) would do the same. So every `fs` and
//! `download` call resolves its path here first, the way the operation will act on it, and the
//! grant must cover every path the resolution passes through.
//!
//! # Guarantees
//! - Each symlink among the parents is followed (and the final component too when the
//!   operation reads through it by contract: `read-file`, `list-dir`, `create-dir`, an
//!   extraction's directory). After every link, the whole path it now leads to must be
//!   covered by the grant, else the call is `denied` naming the link and where it leads.
//! - A link's target is taken relative to the link's directory; a target climbing above the
//!   root is `escape`. An absolute target means the machine's `/`: beneath the machine's own
//!   root (`--root /`) that is the root, beneath any other root it leads outside (`escape`).
//! - At most [`MAX_LINKS`] links and [`MAX_STEPS`] components per resolution (`io`, like
//!   `ELOOP`), and none past the phase deadline (`timeout`): one call's work is bounded.
//! - A new link's target is judged the same way ([`RootFs::resolve_link_target`]): by where
//!   it really leads through the links on the way, not by its text.
//! - No resolution passes through the agent's own process in a procfs mounted beneath the
//!   root (`super::procfs`): every component reached, links followed, is checked, and
//!   reaching `self`, `thread-self`, the agent's pid or one of its thread ids is `denied`,
//!   whatever the grant.
//! - Resolution reads through plan mode's overlay, so a plan sees the links it planned.
//! - The result holds no symlink (as the run sees the host at that moment); the operations
//!   then act on it without following any link ([`crate::hostpath::HostRoot::open_dir_nofollow`]),
//!   so a link swapped in after the check is refused, never followed.

use super::{EntryKind, RootFs};
use crate::hostpath::HostPath;
use crate::wit::Error;
use std::collections::VecDeque;
use std::time::Instant;

/// The most symlinks one path may pass through (Linux's `MAXSYMLINKS`).
pub const MAX_LINKS: usize = 40;

/// The most components one resolution walks (links' targets included): a normal path has a
/// few dozen; 40 links of 4 KiB targets could otherwise make one call walk ~80,000.
pub const MAX_STEPS: usize = 4096;

/// Whether the final component is followed when it is a symlink.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Final {
    /// Act on the link itself (`stat`, `remove`, `write-file`, `symlink`, a download's `dest`).
    NoFollow,
    /// Act on what it points at (`read-file`, `list-dir`, `create-dir`, `dest-dir`).
    Follow,
}

/// What a resolution is checked against, for the `denied` message.
pub struct Check<'a> {
    /// What the call does, e.g. `write`.
    pub verb: &'a str,
    /// The grant consulted, e.g. `fs.write`.
    pub grant: &'a str,
    /// Whether the grant covers a path.
    pub covers: &'a dyn Fn(&HostPath) -> bool,
    /// The phase deadline: a resolution past it is `timeout`.
    pub deadline: Instant,
}

/// Where a symlink at `link` with a relative `target` leads, lexically, from the link's
/// directory. `None` for the root itself; `escape` above the root; `invalid-argument` for a
/// destination that is no valid host path. An absolute target is taken relative to the root
/// (callers decide first whether that is the machine's `/`).
pub fn link_destination(link: &HostPath, target: &str) -> Result<Option<HostPath>, Error> {
    let mut parts: Vec<String> = if target.starts_with('/') {
        Vec::new()
    } else {
        link.parent()
            .map(|p| p.as_str().split('/').map(String::from).collect())
            .unwrap_or_default()
    };
    push_components(&mut parts, target.split('/').map(String::from), link)?;
    if parts.is_empty() {
        return Ok(None);
    }
    HostPath::from_parts(&parts).map(Some).ok_or_else(|| {
        Error::InvalidArgument(format!(
            "symlink {link} -> {target:?}: the target is not a valid host path (NUL, or over \
             4096 bytes)"
        ))
    })
}

/// Appends `components` to `parts`, applying `.` and `..`; `escape` when `..` leaves the root.
fn push_components(
    parts: &mut Vec<String>,
    components: impl IntoIterator<Item = String>,
    link: &HostPath,
) -> Result<(), Error> {
    for c in components {
        match c.as_str() {
            "" | "." => {}
            ".." => {
                if parts.pop().is_none() {
                    return Err(Error::Escape(format!(
                        "{link}: the symlink leads above the host root"
                    )));
                }
            }
            _ => parts.push(c),
        }
    }
    Ok(())
}

impl RootFs {
    /// Resolves `path` as an operation acts on it (see the module docs) and checks `check`
    /// against the path as written and after every symlink. Returns the resolved path, which
    /// holds no symlink.
    pub fn resolve(
        &self,
        path: &HostPath,
        last: Final,
        check: &Check<'_>,
    ) -> Result<HostPath, Error> {
        if !(check.covers)(path) {
            return Err(crate::wit::denied(
                format!("{} {path}", check.verb),
                check.grant,
            ));
        }
        let todo = path.as_str().split('/').map(String::from).collect();
        let resolved = self.walk(path.as_str(), todo, last, check)?;
        covered(path.as_str(), resolved, check)
    }

    /// Checks that a symlink at `link` with the relative `target` leads, when followed the way
    /// any program follows it (through the links already on disk or planned), only to paths
    /// `check` covers; returns where it leads. A target whose text looks lexically inside the
    /// grant but passes through a link (`k -> .`, then `k/..`) is judged by where it really
    /// goes.
    pub fn resolve_link_target(
        &self,
        link: &HostPath,
        target: &str,
        check: &Check<'_>,
    ) -> Result<HostPath, Error> {
        let what = format!("{link} -> {target:?}");
        let mut todo: VecDeque<String> = link
            .parent()
            .map(|p| p.as_str().split('/').map(String::from).collect())
            .unwrap_or_default();
        todo.extend(target.split('/').map(String::from));
        let resolved = self.walk(&what, todo, Final::Follow, check)?;
        covered(&what, resolved, check)
    }

    /// Walks `todo` component by component from the root, following symlinks (see the module
    /// docs), checking `check` after every link. `what` names the request in errors.
    fn walk(
        &self,
        what: &str,
        mut todo: VecDeque<String>,
        last: Final,
        check: &Check<'_>,
    ) -> Result<Vec<String>, Error> {
        let mut done: Vec<String> = Vec::new();
        let (mut links, mut steps) = (0, 0);
        while let Some(c) = todo.pop_front() {
            steps += 1;
            if steps > MAX_STEPS {
                return Err(Error::Io(format!(
                    "{what}: resolving it takes more than {MAX_STEPS} steps"
                )));
            }
            if Instant::now() >= check.deadline {
                return Err(Error::Timeout(format!(
                    "{what}: resolving it reached the phase deadline"
                )));
            }
            match c.as_str() {
                "" | "." => continue,
                ".." => {
                    if done.pop().is_none() {
                        return Err(Error::Escape(format!(
                            "{what}: a symlink on the way leads above the host root"
                        )));
                    }
                    continue;
                }
                _ => {
                    done.push(c);
                    self.refuse_agent_process(what, &done, check)?;
                }
            }
            if todo.is_empty() && last == Final::NoFollow {
                break;
            }
            let Some(here) = HostPath::from_parts(&done) else {
                return Err(Error::InvalidArgument(format!(
                    "{what}: resolves to a path longer than 4096 bytes"
                )));
            };
            let Some(st) = self.lstat(&here)? else {
                continue;
            };
            if st.kind != EntryKind::Symlink {
                continue;
            }
            links += 1;
            if links > MAX_LINKS {
                return Err(Error::Io(format!(
                    "{what}: more than {MAX_LINKS} symlinks on the way (a loop?)"
                )));
            }
            let target = self.read_link(&here)?;
            done.pop();
            if target.starts_with('/') {
                if !self.root.is_system_root() {
                    return Err(Error::Escape(format!(
                        "{what}: the symlink {here} -> {target:?} leads outside the host root"
                    )));
                }
                done.clear();
            }
            let mut next: VecDeque<String> = target.split('/').map(String::from).collect();
            next.extend(todo.drain(..));
            todo = next;
            let mut whole = done.clone();
            push_components(&mut whole, todo.iter().cloned(), &here)?;
            let covered = HostPath::from_parts(&whole).filter(|p| (check.covers)(p));
            if covered.is_none() {
                let leads = HostPath::from_parts(&whole)
                    .map_or_else(|| "the host root".to_string(), |p| p.to_string());
                return Err(Error::Denied(format!(
                    "{} {what}: the symlink {here} -> {target:?} leads to {leads}, \
                     not covered by the phase's {} grant",
                    check.verb, check.grant
                )));
            }
        }
        Ok(done)
    }
}

impl RootFs {
    /// `denied` when the path `done` has reached so far is the agent's own process in a
    /// procfs ([`RootFs::is_agent_process`]): checked at every component, after every link,
    /// so no spelling (`proc/self`, `proc/<pid>`, `proc/thread-self`, `proc/net`, a link
    /// planted in a granted directory) gets there.
    fn refuse_agent_process(
        &self,
        what: &str,
        done: &[String],
        check: &Check<'_>,
    ) -> Result<(), Error> {
        let Some(here) = HostPath::from_parts(done) else {
            return Ok(());
        };
        if self.is_agent_process(&here)? {
            return Err(Error::Denied(format!(
                "{} {what}: {here} is the agent's own process, which no {} grant covers",
                check.verb, check.grant
            )));
        }
        Ok(())
    }
}

/// The resolved `parts` as a path `check` covers, or `denied` (the root itself included).
fn covered(what: &str, parts: Vec<String>, check: &Check<'_>) -> Result<HostPath, Error> {
    match HostPath::from_parts(&parts) {
        Some(p) if (check.covers)(&p) => Ok(p),
        Some(p) => Err(Error::Denied(format!(
            "{} {what}: leads to {p}, not covered by the phase's {} grant",
            check.verb, check.grant
        ))),
        None => Err(Error::Denied(format!(
            "{} {what}: leads to the host root itself, which no {} grant covers",
            check.verb, check.grant
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> HostPath {
        HostPath::parse(s).expect("path")
    }

    #[test]
    fn link_destinations_are_lexical_and_stay_beneath_the_root() {
        let link = p("opt/cni/bin");
        assert_eq!(
            link_destination(&link, "../nodeward/node/current/libexec/cni").expect("ok"),
            Some(p("opt/nodeward/node/current/libexec/cni"))
        );
        assert_eq!(
            link_destination(&link, "/usr/lib/cni").expect("ok"),
            Some(p("usr/lib/cni"))
        );
        assert_eq!(link_destination(&link, "../..").expect("ok"), None);
        assert!(matches!(
            link_destination(&link, "../../../etc"),
            Err(Error::Escape(_))
        ));
        assert_eq!(
            link_destination(&p("current"), "./v1/.//x").expect("ok"),
            Some(p("v1/x"))
        );
    }
}
