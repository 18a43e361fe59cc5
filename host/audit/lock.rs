//! The trail's locks: the log lock every append is made under ([`LogLock`]), and each run's
//! own lock file ([`RunLock`], [`dangling`]).
//!
//! # Background
//! Appends of all runs on a host go through one `flock` of `<audit-dir>/.lock`, so records never
//! interleave and `seq` stays one sequence. `flock` belongs to an open file description, which
//! every thread of a process (and every duplicate of the descriptor) shares, so it does not
//! keep two threads of one process apart, nor two trails one process opened (a library caller,
//! the tests): a process-wide mutex is taken first. Another process may hold the lock for one
//! append; one that holds it longer (stopped, or hostile) must not hang the agent: the lock is
//! polled ([`LOCK_NB`](rustix::fs::FlockOperation::NonBlockingLockExclusive)) for at most
//! [`super::limits::LOCK_WAIT`], then the write fails naming the file.
//!
//! A run holds `runs/<run-id>.lock` (`flock`) while it lives; a run lock file nobody holds is a
//! run that died. Only entries named like a run lock (`^[0-9a-f]{16}\.lock$`) and that are
//! regular files are taken for one; anything else in `runs/` is left alone.

use super::dir::{FileMode, TrailDir};
use super::trail::{TrailError, io_at};
use rustix::fs::{FlockOperation, flock};
use std::fs::File;
use std::path::Path;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Taken before the `flock` (see the module doc).
static PROCESS: Mutex<()> = Mutex::new(());

/// The log lock, released when dropped.
pub(super) struct LogLock {
    file: File,
    _process: MutexGuard<'static, ()>,
}

impl Drop for LogLock {
    fn drop(&mut self) {
        let _ = flock(&self.file, FlockOperation::Unlock);
    }
}

/// Takes the log lock on `file` (`path` for messages), waiting at most `wait`.
pub(super) fn log_lock(file: &File, path: &Path, wait: Duration) -> Result<LogLock, TrailError> {
    let process = PROCESS.lock().unwrap_or_else(|p| p.into_inner());
    let file = file.try_clone().map_err(io_at(path))?;
    let started = Instant::now();
    let mut pause = Duration::from_millis(1);
    loop {
        match flock(&file, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {
                return Ok(LogLock {
                    file,
                    _process: process,
                });
            }
            Err(e) if e == rustix::io::Errno::WOULDBLOCK || e == rustix::io::Errno::INTR => {
                if started.elapsed() >= wait {
                    return Err(TrailError::LockTimeout {
                        path: path.to_path_buf(),
                        waited: wait,
                    });
                }
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(50));
            }
            Err(e) => return Err(io_at(path)(e.into())),
        }
    }
}

/// Whether `name` is a run lock's name: 16 lowercase hex digits and `.lock`.
pub(super) fn run_id_of(name: &str) -> Option<&str> {
    let id = name.strip_suffix(".lock")?;
    (id.len() == 16 && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))).then_some(id)
}

/// A run's own lock file, held while the run lives.
#[derive(Debug)]
pub(super) struct RunLock {
    _file: File,
    name: String,
}

impl RunLock {
    /// Makes and takes `runs/<run_id>.lock`.
    pub(super) fn take(runs: &TrailDir, run_id: &str) -> Result<RunLock, TrailError> {
        let name = format!("{run_id}.lock");
        let path = runs.join(&name);
        let file = runs
            .file(&name, FileMode::CreateNew)
            .map_err(io_at(&path))?;
        flock(&file, FlockOperation::NonBlockingLockExclusive)
            .map_err(|e| io_at(&path)(e.into()))?;
        Ok(RunLock { _file: file, name })
    }

    /// Removes the lock file (the run ended).
    pub(super) fn release(&self, runs: &TrailDir) -> Result<(), TrailError> {
        runs.remove(&self.name)
            .map(drop)
            .map_err(io_at(&runs.join(&self.name)))
    }
}

/// The runs whose lock file is in `runs` but held by nobody (they died), but `own`; each with
/// its file, locked, so no other writer takes it for dangling meanwhile.
pub(super) fn dangling(runs: &TrailDir, own: &str) -> Result<Vec<(String, File)>, TrailError> {
    let mut out = Vec::new();
    let mut names = runs.names().map_err(io_at(runs.path()))?;
    names.sort();
    for name in names {
        let Some(id) = run_id_of(&name).filter(|id| *id != own) else {
            continue;
        };
        let file = match runs.file(&name, FileMode::Read) {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(target: "nodeward::audit", "ignoring {}: {e}", runs.join(&name).display());
                continue;
            }
        };
        if flock(&file, FlockOperation::NonBlockingLockExclusive).is_ok() {
            out.push((id.to_string(), file));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_run_lock_names_are_run_locks() {
        assert_eq!(run_id_of("0123456789abcdef.lock"), Some("0123456789abcdef"));
        for other in [
            "0123456789ABCDEF.lock",
            "0123456789abcde.lock",
            "0123456789abcdef0.lock",
            "../0123456789abcdef.lock",
            "0123456789abcdef",
            "x.lock",
            ".lock",
        ] {
            assert_eq!(run_id_of(other), None, "{other}");
        }
    }
}
