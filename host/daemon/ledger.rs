//! [`Ledger`]: which MachineOperations this node has started and finished, by uid, and how
//! each ended, kept in the node's own state, so an operation runs at most once whatever its
//! status on the API server says, and a finished one always gets its final status.
//!
//! # Background
//! An operation's status lives on the API server, and without the admission policy
//! (`deploy/admission-policy.yaml`, clusters ≥ 1.30) any node may write any operation's
//! status: a compromised node could set another node's finished `AgentReset` back to
//! `Pending`. A daemon that decided from the status alone would reset its node again. So the
//! daemon records each operation's uid here before its act starts and again when it ends, and
//! never starts a uid it has recorded: the status only reports.
//!
//! The ledger and the status are two writes to two places, and the daemon can be killed
//! between any two of them. So the end is recorded in two steps, the final status to write
//! with it: [`Mark::Done`] ("the act ended; this is its status; not known to be written"),
//! then the status written, then [`Mark::Final`] ("written"). A daemon that finds
//! [`Mark::Done`] writes the recorded status and only then marks it final; one that finds
//! [`Mark::Final`] while the status is not final writes it again. The states, and what the
//! next pass does after a kill at each point, are in `docs/daemon.md` ("The operation
//! ledger").
//!
//! # Guarantees
//! - Each mark is written durably ([`crate::durable::write_file`]) before the step it
//!   announces: [`Mark::Started`] before the act, [`Mark::Done`] before the final status is
//!   written, [`Mark::Final`] after it.
//! - An operation found [`Mark::Started`] (the daemon stopped while its act ran) is not run
//!   again: it is failed with that reason, through [`Mark::Done`] like any other end.
//! - The file keeps the last [`MAX_ENTRIES`] uids (the oldest final ones go first); it lives
//!   in the agent state directory, which a reset keeps.
//! - An unreadable ledger refuses every operation (fails closed) and says which file.
//! - A ledger an earlier agent wrote (marks `started` and `finished`, no ending) is read:
//!   `finished` is [`Mark::Final`] without an ending.
//!
//! # Caveats
//! An agent older than the [`Mark::Done`] mark cannot read a ledger that has one: it
//! refuses operations until the ledger is removed (a downgrade of the agent).

use crate::daemon::operation::Ending;
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The most uids kept.
pub const MAX_ENTRIES: usize = 512;
/// The ledger's file in the agent state directory.
pub const FILE: &str = "daemon-operations.json";

/// Where an operation is, as this node knows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mark {
    /// Its act started (and may have been cut short).
    Started,
    /// Its act ended (or was found cut short) with this final status, which is not known to
    /// be on the API server yet.
    Done(Ending),
    /// Its final status was written (`None`: by an agent that did not record it).
    Final(Option<Ending>),
}

/// A mark as the file spells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
enum Stage {
    Started,
    Done,
    /// `finished`: the one end mark of earlier agents, written before the status.
    #[serde(alias = "finished")]
    Final,
}

/// One operation in the file. Unknown fields are ignored: a newer agent may add some.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct Entry {
    uid: String,
    name: String,
    mark: Stage,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ending: Option<Ending>,
}

impl Entry {
    fn mark(&self) -> Option<Mark> {
        Some(match self.mark {
            Stage::Started => Mark::Started,
            Stage::Done => Mark::Done(self.ending.clone()?),
            Stage::Final => Mark::Final(self.ending.clone()),
        })
    }
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
    fn record(&self, uid: &str, name: &str, mark: &Mark) -> Result<(), LedgerError>;
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

    /// Writes `entries`; `stage` names the write's crash point (`ledger-done:after-temp-write`).
    fn write(&self, entries: &VecDeque<Entry>, stage: Stage) -> Result<(), LedgerError> {
        let bytes = serde_json::to_vec(entries).map_err(|e| self.err(e))?;
        let dir = self.path.parent().ok_or_else(|| self.err("no directory"))?;
        std::fs::create_dir_all(dir).map_err(|e| self.err(e))?;
        let dir = crate::durable::open_dir(dir).map_err(|e| self.err(e))?;
        let purpose = match stage {
            Stage::Started => "ledger-started",
            Stage::Done => "ledger-done",
            Stage::Final => "ledger-final",
        };
        crate::durable::write_file(&dir, FILE, &bytes, 0o600, purpose).map_err(|e| self.err(e))
    }
}

impl Ledger for FileLedger {
    fn mark_of(&self, uid: &str) -> Result<Option<Mark>, LedgerError> {
        let _held = self.lock.lock().map_err(|_| self.err("lock poisoned"))?;
        match self.read()?.iter().find(|e| e.uid == uid) {
            None => Ok(None),
            Some(entry) => entry
                .mark()
                .map(Some)
                .ok_or_else(|| self.err(format!("{uid} is done without its ending"))),
        }
    }

    fn record(&self, uid: &str, name: &str, mark: &Mark) -> Result<(), LedgerError> {
        let _held = self.lock.lock().map_err(|_| self.err("lock poisoned"))?;
        let mut entries = self.read()?;
        entries.retain(|e| e.uid != uid);
        let (stage, ending) = match mark {
            Mark::Started => (Stage::Started, None),
            Mark::Done(ending) => (Stage::Done, Some(ending.clone())),
            Mark::Final(ending) => (Stage::Final, ending.clone()),
        };
        entries.push_back(Entry {
            uid: uid.to_string(),
            name: name.to_string(),
            mark: stage,
            ending,
        });
        while entries.len() > MAX_ENTRIES {
            // The oldest final one goes first; one that is not only when all are not.
            match entries.iter().position(|e| e.mark == Stage::Final) {
                Some(i) => entries.remove(i),
                None => entries.pop_front(),
            };
        }
        self.write(&entries, stage)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ending(message: &str) -> Ending {
        Ending {
            complete: false,
            reason: "OperationFailed".into(),
            message: message.into(),
            at: serde_json::from_value(serde_json::json!("2026-12-01T10:00:00Z")).expect("time"),
        }
    }

    #[test]
    fn marks_survive_a_new_ledger_on_the_same_file_and_the_file_stays_bounded() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ledger = FileLedger::new(dir.path());
        assert_eq!(ledger.mark_of("u1").expect("read"), None);
        ledger
            .record("u1", "reset-w1", &Mark::Started)
            .expect("record");
        ledger
            .record("u1", "reset-w1", &Mark::Done(ending("gone")))
            .expect("record");
        ledger
            .record("u2", "reboot-w1", &Mark::Started)
            .expect("record");
        ledger
            .record("u3", "reboot-w1", &Mark::Final(Some(ending("written"))))
            .expect("record");
        let again = FileLedger::new(dir.path());
        assert_eq!(
            again.mark_of("u1").expect("read"),
            Some(Mark::Done(ending("gone")))
        );
        assert_eq!(again.mark_of("u2").expect("read"), Some(Mark::Started));
        assert_eq!(
            again.mark_of("u3").expect("read"),
            Some(Mark::Final(Some(ending("written"))))
        );
        for i in 0..MAX_ENTRIES + 10 {
            again
                .record(&format!("x{i}"), "op", &Mark::Final(None))
                .expect("record");
        }
        let entries = again.read().expect("read");
        assert_eq!(entries.len(), MAX_ENTRIES);
        // What is not final (a status still owed, an act cut short) is kept over final ones.
        assert_eq!(
            again.mark_of("u1").expect("read"),
            Some(Mark::Done(ending("gone")))
        );
        assert_eq!(again.mark_of("u2").expect("read"), Some(Mark::Started));
        assert_eq!(again.mark_of("u3").expect("read"), None);
    }

    #[test]
    fn a_ledger_of_an_earlier_agent_is_read() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(
            dir.path().join(FILE),
            br#"[{"uid":"u1","name":"rb","mark":"started"},{"uid":"u2","name":"rs","mark":"finished"}]"#,
        )
        .expect("write");
        let ledger = FileLedger::new(dir.path());
        assert_eq!(ledger.mark_of("u1").expect("read"), Some(Mark::Started));
        assert_eq!(ledger.mark_of("u2").expect("read"), Some(Mark::Final(None)));
    }

    #[test]
    fn an_unreadable_ledger_is_an_error_naming_its_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join(FILE), b"{not json").expect("write");
        let e = FileLedger::new(dir.path())
            .mark_of("u1")
            .expect_err("refused");
        assert!(e.to_string().contains(FILE), "{e}");
        // A done mark without the status it owes cannot be acted on: refused, named.
        std::fs::write(
            dir.path().join(FILE),
            br#"[{"uid":"u1","name":"rb","mark":"done"}]"#,
        )
        .expect("write");
        let e = FileLedger::new(dir.path())
            .mark_of("u1")
            .expect_err("refused");
        assert!(
            e.to_string().contains("u1 is done without its ending"),
            "{e}"
        );
    }
}
