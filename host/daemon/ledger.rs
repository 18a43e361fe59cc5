//! [`Ledger`]: which MachineOperations this node has started and finished, by uid, kept in the
//! node's own state, so an operation runs at most once whatever its status on the API server
//! says.
//!
//! # Background
//! An operation's status lives on the API server, and without the admission policy
//! (`deploy/admission-policy.yaml`, clusters ≥ 1.30) any node may write any operation's
//! status: a compromised node could set another node's finished `AgentReset` back to
//! `Pending`. A daemon that decided from the status alone would reset its node again. So the
//! daemon records each operation's uid here before its act starts and again when it ends, and
//! never starts a uid it has recorded: the status only reports.
//!
//! # Guarantees
//! - A uid is recorded `started` (durably: [`crate::durable::write_file`]) before its act, and
//!   `finished` after it; an operation found started but not finished (the daemon stopped
//!   while it ran) is not run again, it is failed with that reason.
//! - The file keeps the last [`MAX_ENTRIES`] uids (the oldest finished ones go first); it
//!   lives in the agent state directory, which a reset keeps.
//! - An unreadable ledger refuses every operation (fails closed) and says which file.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The most uids kept.
pub const MAX_ENTRIES: usize = 512;
/// The ledger's file in the agent state directory.
pub const FILE: &str = "daemon-operations.json";

/// Where an operation is, as this node knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mark {
    /// Its act started (and may have been cut short).
    Started,
    /// Its act ended (Complete or Failed was written, or was about to be).
    Finished,
}

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct Entry {
    uid: String,
    name: String,
    mark: Mark,
}

/// Why the ledger could not be read or written; names the file.
#[derive(Debug, thiserror::Error)]
#[error("operation ledger {path}: {message}")]
pub struct LedgerError {
    /// The file.
    pub path: PathBuf,
    /// What went wrong.
    pub message: String,
}

/// The operations this node has started and finished; see the module docs.
pub trait Ledger {
    /// What is recorded for `uid`.
    fn mark_of(&self, uid: &str) -> Result<Option<Mark>, LedgerError>;
    /// Records `mark` for `uid` (the operation `name`), durably.
    fn record(&self, uid: &str, name: &str, mark: Mark) -> Result<(), LedgerError>;
}

/// The ledger in a file of the agent state directory.
#[derive(Debug)]
pub struct FileLedger {
    path: PathBuf,
    lock: Mutex<()>,
}

impl FileLedger {
    /// The ledger in `state_dir`.
    pub fn new(state_dir: &Path) -> Self {
        FileLedger {
            path: state_dir.join(FILE),
            lock: Mutex::new(()),
        }
    }

    fn err(&self, message: impl ToString) -> LedgerError {
        LedgerError {
            path: self.path.clone(),
            message: message.to_string(),
        }
    }

    fn read(&self) -> Result<VecDeque<Entry>, LedgerError> {
        match std::fs::read(&self.path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| self.err(e)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(VecDeque::new()),
            Err(e) => Err(self.err(e)),
        }
    }

    fn write(&self, entries: &VecDeque<Entry>) -> Result<(), LedgerError> {
        let bytes = serde_json::to_vec(entries).map_err(|e| self.err(e))?;
        let dir = self.path.parent().ok_or_else(|| self.err("no directory"))?;
        std::fs::create_dir_all(dir).map_err(|e| self.err(e))?;
        let dir = crate::durable::open_dir(dir).map_err(|e| self.err(e))?;
        crate::durable::write_file(&dir, FILE, &bytes, 0o600, "ledger").map_err(|e| self.err(e))
    }
}

impl Ledger for FileLedger {
    fn mark_of(&self, uid: &str) -> Result<Option<Mark>, LedgerError> {
        let _held = self.lock.lock().map_err(|_| self.err("lock poisoned"))?;
        Ok(self.read()?.iter().find(|e| e.uid == uid).map(|e| e.mark))
    }

    fn record(&self, uid: &str, name: &str, mark: Mark) -> Result<(), LedgerError> {
        let _held = self.lock.lock().map_err(|_| self.err("lock poisoned"))?;
        let mut entries = self.read()?;
        entries.retain(|e| e.uid != uid);
        entries.push_back(Entry {
            uid: uid.to_string(),
            name: name.to_string(),
            mark,
        });
        while entries.len() > MAX_ENTRIES {
            // The oldest finished one goes first; an unfinished one only when all are.
            match entries.iter().position(|e| e.mark == Mark::Finished) {
                Some(i) => entries.remove(i),
                None => entries.pop_front(),
            };
        }
        self.write(&entries)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_survive_a_new_ledger_on_the_same_file_and_the_file_stays_bounded() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ledger = FileLedger::new(dir.path());
        assert_eq!(ledger.mark_of("u1").expect("read"), None);
        ledger
            .record("u1", "reset-w1", Mark::Started)
            .expect("record");
        ledger
            .record("u1", "reset-w1", Mark::Finished)
            .expect("record");
        ledger
            .record("u2", "reboot-w1", Mark::Started)
            .expect("record");
        let again = FileLedger::new(dir.path());
        assert_eq!(again.mark_of("u1").expect("read"), Some(Mark::Finished));
        assert_eq!(again.mark_of("u2").expect("read"), Some(Mark::Started));
        for i in 0..MAX_ENTRIES + 10 {
            again
                .record(&format!("x{i}"), "op", Mark::Finished)
                .expect("record");
        }
        let entries = again.read().expect("read");
        assert_eq!(entries.len(), MAX_ENTRIES);
        // The unfinished one is kept over finished ones.
        assert_eq!(again.mark_of("u2").expect("read"), Some(Mark::Started));
    }

    #[test]
    fn an_unreadable_ledger_is_an_error_naming_its_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join(FILE), b"{not json").expect("write");
        let e = FileLedger::new(dir.path())
            .mark_of("u1")
            .expect_err("refused");
        assert!(e.to_string().contains(FILE), "{e}");
    }
}
