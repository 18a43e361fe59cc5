//! Host paths and the host root they resolve beneath.
//!
//! # Background
//! A phase never sees a raw host path. It names files relative to the host root the agent was
//! started with (`--root`, `/` on a real node), and every access resolves beneath that root.
//!
//! # Guarantees
//! - [`HostPath`] can only be built through [`HostPath::parse`], which refuses absolute paths,
//!   `.`/`..` components, empty components and NUL bytes (the lexical check).
//! - [`HostRoot`] holds a `cap_std::fs::Dir`; every operation goes through it, so symlinks and
//!   magic links that would leave the root are refused by cap-std (`openat2` with
//!   `RESOLVE_BENEATH` on Linux ≥ 5.6, manual resolution otherwise). The lexical check and the
//!   resolution check are independent: either one alone keeps `..` out.
//! - [`HostRoot::open`] is the only place that uses ambient authority.
//!
//! # Caveats
//! Hard links already inside the root that point at files outside it (or at files no grant
//! covers) cannot be detected by path checks. [`crate::rootfs`] copes instead: it never changes
//! a regular file in place (it replaces it) and never reads one that has more than one name.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

/// The longest host path accepted (Linux `PATH_MAX`).
const MAX_PATH: usize = 4096;

/// A validated path relative to the host root: `etc/containerd/config.toml`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HostPath(String);

/// Why a string is not a host path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid host path {path:?}: {reason}")]
pub struct InvalidPath {
    /// The offending input.
    pub path: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

impl HostPath {
    /// Validates `s` as a host path (the lexical check).
    pub fn parse(s: &str) -> Result<Self, InvalidPath> {
        let bad = |reason| {
            Err(InvalidPath {
                path: s.chars().take(200).collect(),
                reason,
            })
        };
        if s.is_empty() {
            return bad("is empty");
        }
        if s.len() > MAX_PATH {
            return bad("is longer than 4096 bytes");
        }
        if s.contains('\0') {
            return bad("contains a NUL byte");
        }
        if s.starts_with('/') {
            return bad("is absolute; host paths are relative to the host root");
        }
        for component in s.split('/') {
            match component {
                "" => return bad("has an empty component (// or a trailing /)"),
                "." | ".." => return bad("has a . or .. component"),
                _ => {}
            }
        }
        Ok(HostPath(s.to_string()))
    }

    /// The path as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The path for cap-std calls.
    pub fn as_path(&self) -> &Path {
        Path::new(&self.0)
    }

    /// The parent directory, `None` for a top-level entry (whose parent is the root).
    pub fn parent(&self) -> Option<HostPath> {
        self.0
            .rsplit_once('/')
            .map(|(p, _)| HostPath(p.to_string()))
    }

    /// The last component.
    pub fn file_name(&self) -> &str {
        self.0.rsplit_once('/').map_or(&self.0, |(_, n)| n)
    }

    /// Every ancestor from the top down, then the path itself: `a`, `a/b`, `a/b/c`.
    pub fn prefixes(&self) -> impl Iterator<Item = HostPath> + '_ {
        self.0
            .match_indices('/')
            .map(|(i, _)| HostPath(self.0[..i].to_string()))
            .chain(std::iter::once(self.clone()))
    }

    /// Whether `self` is `prefix` or lies beneath it (whole components only).
    pub fn starts_with(&self, prefix: &HostPath) -> bool {
        self.0 == prefix.0
            || (self.0.starts_with(&prefix.0)
                && self.0.as_bytes().get(prefix.0.len()) == Some(&b'/'))
    }

    /// The path made of `parts` (each a single component); `None` for no parts (the root
    /// itself) or parts that do not make a valid host path.
    pub fn from_parts(parts: &[String]) -> Option<HostPath> {
        if parts.is_empty() {
            return None;
        }
        HostPath::parse(&parts.join("/")).ok()
    }

    /// `self/child` for a single validated component.
    pub fn join(&self, child: &str) -> Result<HostPath, InvalidPath> {
        HostPath::parse(&format!("{}/{child}", self.0))
    }
}

impl fmt::Display for HostPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The directory every host path resolves beneath.
#[derive(Debug)]
pub struct HostRoot {
    path: PathBuf,
    dir: cap_std::fs::Dir,
}

impl HostRoot {
    /// Opens the host root at `path` (the one use of ambient authority in the agent).
    pub fn open(path: &Path) -> io::Result<Self> {
        let dir = cap_std::fs::Dir::open_ambient_dir(path, cap_std::ambient_authority()).map_err(
            |e| {
                io::Error::new(
                    e.kind(),
                    format!("cannot open host root {}: {e}", path.display()),
                )
            },
        )?;
        let path = path.canonicalize()?;
        Ok(HostRoot { path, dir })
    }

    /// The root's path on the machine, for messages.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether this is the machine's own `/`, where kernel capabilities act on the running
    /// kernel rather than on files beneath the root.
    pub fn is_system_root(&self) -> bool {
        self.path == Path::new("/")
    }

    /// The confined directory handle.
    pub fn dir(&self) -> &cap_std::fs::Dir {
        &self.dir
    }

    /// Opens the directory `path` (`None`: the root itself) without following any symlink:
    /// each component is opened relative to the previous one with `O_NOFOLLOW | O_DIRECTORY`.
    /// A symlink anywhere on the way fails with `ELOOP` (see [`is_link_refused`]), a missing
    /// component with `ENOENT`, a file with `ENOTDIR`. Capabilities resolve links themselves
    /// (checking every step against the grant) and then act on the resolved path through this,
    /// so a link swapped in between resolution and action is refused rather than followed.
    pub fn open_dir_nofollow(&self, path: Option<&HostPath>) -> io::Result<cap_std::fs::Dir> {
        open_dir_nofollow_at(&self.dir, path)
    }

    /// Opens the directory holding `path` without following any symlink (see
    /// [`HostRoot::open_dir_nofollow`]), and returns it with `path`'s last component.
    pub fn open_parent_nofollow<'p>(
        &self,
        path: &'p HostPath,
    ) -> io::Result<(cap_std::fs::Dir, &'p str)> {
        let dir = self.open_dir_nofollow(path.parent().as_ref())?;
        Ok((dir, path.file_name()))
    }
}

/// Opens the directory `path` beneath `base` (`None`: `base` itself) without following any
/// symlink, as [`HostRoot::open_dir_nofollow`] does for the root; for code that holds only the
/// root's directory handle (downloads, extraction).
pub fn open_dir_nofollow_at(
    base: &cap_std::fs::Dir,
    path: Option<&HostPath>,
) -> io::Result<cap_std::fs::Dir> {
    use rustix::fs::{AtFlags, FileType, Mode, OFlags, openat, statat};
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let Some(path) = path else {
        let fd = openat(base, ".", flags, Mode::empty())?;
        return Ok(cap_std::fs::Dir::from_std_file(std::fs::File::from(fd)));
    };
    let mut fd: Option<rustix::fd::OwnedFd> = None;
    for component in path.as_str().split('/') {
        let next = match &fd {
            None => openat(base, component, flags, Mode::empty()),
            Some(parent) => openat(parent, component, flags, Mode::empty()),
        };
        fd = Some(match next {
            Ok(next) => next,
            // `O_DIRECTORY | O_NOFOLLOW` on a symlink says ENOTDIR; say ELOOP instead, so
            // callers tell "a link was refused" from "a file is in the way".
            Err(rustix::io::Errno::NOTDIR) => {
                let st = match &fd {
                    None => statat(base, component, AtFlags::SYMLINK_NOFOLLOW),
                    Some(parent) => statat(parent, component, AtFlags::SYMLINK_NOFOLLOW),
                }?;
                if FileType::from_raw_mode(st.st_mode) == FileType::Symlink {
                    return Err(rustix::io::Errno::LOOP.into());
                }
                return Err(rustix::io::Errno::NOTDIR.into());
            }
            Err(e) => return Err(e.into()),
        });
    }
    let fd = fd.ok_or_else(|| io::Error::other("empty host path"))?;
    Ok(cap_std::fs::Dir::from_std_file(std::fs::File::from(fd)))
}

/// Whether `e` is the refusal of a symlink met where none may be followed (`O_NOFOLLOW`).
pub fn is_link_refused(e: &io::Error) -> bool {
    e.raw_os_error() == Some(rustix::io::Errno::LOOP.raw_os_error())
}

/// Whether `e` is cap-std's (or openat2's) refusal of a path that led outside the root.
pub fn is_escape(e: &io::Error) -> bool {
    e.raw_os_error() == Some(rustix::io::Errno::XDEV.raw_os_error())
        || (e.kind() == io::ErrorKind::PermissionDenied
            && e.to_string().contains("outside of the filesystem"))
}

#[cfg(test)]
mod test_valid_host_path {
    use super::*;

    #[test]
    fn accepts_relative_paths() {
        let p = HostPath::parse("etc/containerd/config.toml").expect("valid");
        assert_eq!(p.file_name(), "config.toml");
        assert_eq!(p.parent().expect("parent").as_str(), "etc/containerd");
        let prefixes: Vec<String> = p.prefixes().map(|p| p.0).collect();
        assert_eq!(
            prefixes,
            ["etc", "etc/containerd", "etc/containerd/config.toml"]
        );
        assert!(HostPath::parse("etc").expect("top").parent().is_none());
    }

    #[test]
    fn refuses_escapes_and_junk() {
        for bad in [
            "",
            "/etc/passwd",
            "../x",
            "a/../b",
            "a/./b",
            ".",
            "a//b",
            "a/",
            "a\0b",
        ] {
            assert!(HostPath::parse(bad).is_err(), "{bad:?} must be refused");
        }
        assert!(HostPath::parse(&"a/".repeat(3000)).is_err());
    }

    #[test]
    fn prefix_matches_whole_components() {
        let p = |s| HostPath::parse(s).expect("valid");
        assert!(p("etc/containerd/config.toml").starts_with(&p("etc/containerd")));
        assert!(p("etc/containerd").starts_with(&p("etc/containerd")));
        assert!(!p("etc/containerd-old/x").starts_with(&p("etc/containerd")));
    }
}
