//! The agent's own process as procfs shows it, which no resolution reaches.
//!
//! # Background
//! With `--root /`, a grant covering `proc` would hand a phase the agent's own state:
//! `proc/self/environ`, its command line, its open files (`fd/`), its memory maps. procfs
//! names that process many ways: `self`, `thread-self`, its pid, the id of each of its threads
//! (every thread id is also a directory at the procfs root, though not listed), and links
//! lead there (`proc/net -> self/net`, `proc/mounts -> self/mounts`, `proc/1/root` back to
//! `/`, a link planted in a granted directory). Checking names as the phase spells them
//! cannot catch all of these; the resolution (`super::resolve`) sees every component a path
//! really passes, links followed, so it asks here about each one.
//!
//! # Guarantees
//! - [`RootFs::is_agent_process`] is true for an entry of the root directory of a procfs
//!   mount (its file system is procfs and its inode procfs's root inode: wherever a procfs is
//!   mounted beneath the host root, not only at `proc`) that is `self`, `thread-self`, the
//!   agent's pid as that procfs numbers it (what its own `self` link says, so a procfs of
//!   another pid namespace is judged in its own numbers) or the id of one of the agent's
//!   threads at that moment (`self/task/<id>` exists there).
//! - Everything beneath such an entry is then out of reach, `task/<tid>` included; under
//!   another process's directory the kernel itself shows only that process's threads.
//!
//! # Caveats
//! - Other processes are not the agent: its children (`modprobe`, `swapoff`), the kubelet or
//!   PID 1 stay readable through a grant covering `proc`, as that grant says.
//! - A procfs mounted after the resolution (which needs `CAP_SYS_ADMIN`, i.e. root) is not
//!   seen; a thread the agent starts after the check with the id just checked (after the
//!   kernel wrapped its ids around) neither.

use super::RootFs;
use crate::hostpath::HostPath;
use crate::wit::Error;
use rustix::fs::{AtFlags, PROC_SUPER_MAGIC, fstat, fstatfs, readlinkat, statat};
use rustix::io::Errno;

/// The inode number of a procfs mount's root directory (`PROC_ROOT_INO` in the kernel).
const PROC_ROOT_INO: u64 = 1;

impl RootFs {
    /// Whether `path` names the agent's own process (or one of its threads) in a procfs
    /// mounted beneath the root (see the module docs). Looks at the disk only when the last
    /// component could name a process (`self`, `thread-self`, digits); a parent that cannot
    /// be opened is no procfs the agent could act through either.
    pub(super) fn is_agent_process(&self, path: &HostPath) -> Result<bool, Error> {
        let name = path.file_name();
        let pid_like = name.bytes().all(|b| b.is_ascii_digit());
        if !(pid_like || name == "self" || name == "thread-self") {
            return Ok(false);
        }
        let Ok(dir) = self.root.open_dir_nofollow(path.parent().as_ref()) else {
            return Ok(false);
        };
        let fail = |e: Errno| Error::Io(format!("{path}: checking for the agent's process: {e}"));
        let is_procfs = fstatfs(&dir).map_err(fail)?.f_type == PROC_SUPER_MAGIC;
        if !is_procfs || fstat(&dir).map_err(fail)?.st_ino != PROC_ROOT_INO {
            return Ok(false);
        }
        if !pid_like {
            return Ok(true);
        }
        // The agent as this procfs numbers it; none when it is not in the procfs's pid
        // namespace.
        match readlinkat(&dir, "self", Vec::new()) {
            Ok(own) if own.as_bytes() == name.as_bytes() => return Ok(true),
            Ok(_) => {}
            Err(Errno::NOENT) => return Ok(false),
            Err(e) => return Err(fail(e)),
        }
        match statat(&dir, format!("self/task/{name}"), AtFlags::empty()) {
            Ok(_) => Ok(true),
            Err(Errno::NOENT) => Ok(false),
            Err(e) => Err(fail(e)),
        }
    }
}

impl RootFs {
    /// Whether `path` (resolved: it holds no symlink) is or lies beneath the agent's own
    /// process in a procfs ([`RootFs::is_agent_process`] of each of its prefixes): for
    /// callers that resolve a path themselves (a mount's source and target, found through
    /// their descriptors).
    pub fn reaches_agent_process(&self, path: &HostPath) -> Result<bool, Error> {
        for prefix in path.prefixes() {
            if self.is_agent_process(&prefix)? {
                return Ok(true);
            }
        }
        Ok(false)
    }
}
