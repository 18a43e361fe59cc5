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
//!   another pid namespace is judged in its own numbers), the id of one of the agent's
//!   threads at that moment (`self/task/<id>` exists there), or the pid or thread id of any
//!   process running the agent's own binary (its `exe` link leads to the same file, same
//!   device and inode, as the agent's `/proc/self/exe`): the daemon while a phase runs in the
//!   `nodeward restart|upgrade|reset` it started, an operator's run while the daemon runs, a
//!   phase's run while another one waits for the run lock. Their environment, maps, open
//!   files and command lines are the agent's as much as its own.
//! - Everything beneath such an entry is then out of reach, `task/<tid>` included; under
//!   another process's directory the kernel itself shows only that process's threads.
//!
//! # Caveats
//! - Other processes are not the agent: its children (`modprobe`, `swapoff`), the kubelet or
//!   PID 1 stay readable through a grant covering `proc`, as that grant says. So is a
//!   nodeward process running another file than the agent's (an older binary the daemon
//!   still runs after an upgrade replaced it on disk), and one whose `exe` the agent cannot
//!   follow (`EACCES`, or gone: a zombie, a kernel thread).
//! - The check and the open that follows it are two steps: an id that names no process (or
//!   another one) when checked, and that the kernel hands to a new thread or process of the
//!   agent's binary before the open, is not caught. Ids are handed out in order, so a phase
//!   that guesses the next one and races a nodeward process starting a thread or a child
//!   could win this. A procfs mounted after the resolution (which needs `CAP_SYS_ADMIN`,
//!   i.e. root) is not seen either.

use super::RootFs;
use crate::hostpath::HostPath;
use crate::wit::Error;
use rustix::fs::{AtFlags, PROC_SUPER_MAGIC, fstat, fstatfs, readlinkat, stat, statat};
use rustix::io::Errno;
use std::sync::OnceLock;

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
            Ok(_) => match statat(&dir, format!("self/task/{name}"), AtFlags::empty()) {
                Ok(_) => return Ok(true),
                Err(Errno::NOENT) => {}
                Err(e) => return Err(fail(e)),
            },
            Err(Errno::NOENT) => {}
            Err(e) => return Err(fail(e)),
        }
        // Any process (or thread) running the agent's binary. Following `exe` is what the
        // kernel allows the agent (`ptrace` access); one it refuses, or one with no `exe`
        // (a kernel thread, a zombie, a process gone meanwhile), is no nodeward process
        // this agent could tell.
        let own = agent_binary().map_err(|e| {
            Error::Io(format!(
                "{path}: checking for the agent's process: /proc/self/exe: {e}"
            ))
        })?;
        match statat(&dir, format!("{name}/exe"), AtFlags::empty()) {
            Ok(st) => Ok((st.st_dev, st.st_ino) == own),
            Err(Errno::NOENT | Errno::ACCESS | Errno::PERM | Errno::SRCH | Errno::NOTDIR) => {
                Ok(false)
            }
            Err(e) => Err(fail(e)),
        }
    }
}

/// The device and inode of the file the agent runs (`/proc/self/exe`, which still leads to
/// it when an upgrade has replaced the file on disk), looked up once.
fn agent_binary() -> Result<(u64, u64), Errno> {
    static BINARY: OnceLock<Result<(u64, u64), Errno>> = OnceLock::new();
    *BINARY.get_or_init(|| stat("/proc/self/exe").map(|st| (st.st_dev, st.st_ino)))
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
