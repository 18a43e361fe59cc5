//! [`Lock`]: the exclusive lock a mutating run holds, for the node (`run/nodeward/node.lock`
//! beneath the host root) and for the bundle store (`<state-dir>/bundles/.lock`) alike.

use std::io::{self, Write};
use std::path::Path;

/// An exclusive `flock` on a lock file, held until dropped. `flock` rather than the file's
/// existence: a killed holder's lock is gone with its process, so a crash never strands it. The
/// file holds the holder's PID, for the error a second run prints.
#[derive(Debug)]
pub struct Lock {
    _file: std::fs::File,
}

/// Why a [`Lock`] was not taken.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// The lock file could not be opened (or created).
    #[error("cannot open: {source}")]
    Open {
        /// The failure.
        #[source]
        source: io::Error,
    },
    /// Another process holds the lock.
    #[error("held by pid {}: {source}", holder.as_deref().unwrap_or("unknown"))]
    Held {
        /// The PID the file names, when it could be read.
        holder: Option<String>,
        /// What `flock` said.
        #[source]
        source: io::Error,
    },
}

impl Lock {
    /// Takes the lock on the file at `path` (created when missing; its directory must exist)
    /// without waiting: [`LockError::Held`] when another process has it.
    pub fn acquire(path: &Path) -> Result<Lock, LockError> {
        use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
        // `O_NOFOLLOW`: a link planted under the lock's name is refused, never written
        // through (the PID below would land in whatever file it names).
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
            .open(path)
            .map_err(|source| LockError::Open { source })?;
        if let Err(e) =
            rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive)
        {
            let holder = std::fs::read_to_string(path)
                .ok()
                .map(|s| s.trim().to_string());
            return Err(LockError::Held {
                holder,
                source: e.into(),
            });
        }
        // Best effort: the PID only improves the message a second run prints. Not into a
        // file with another name (a hard link planted here), which would change that file.
        let sole = file.metadata().is_ok_and(|m| m.is_file() && m.nlink() == 1);
        if sole {
            let _ = file.set_len(0);
            let _ = writeln!(file, "{}", std::process::id());
        }
        Ok(Lock { _file: file })
    }
}
