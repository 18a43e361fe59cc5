//! The host runtime's own durable record of a none node, beneath the host root in
//! [`layout::STATE_DIR`](nodeward_node_config::layout::STATE_DIR):
//! - `install-record.json`: written before a bootstrap's first change; machine name, config
//!   fingerprint and the checkpoint a failed run resumes at;
//! - `upgrade-journal.json`: written before an upgrade stops the old stack; the version and
//!   configuration to return to, and the digest of the configuration the upgrade applies;
//! - `applied-config.json` with its `applied-config.json.sha256` sidecar: the configuration the
//!   node runs, persisted once the node is healthy;
//! - `previous-version.json`: the version the node ran before its last upgrade and its
//!   artifacts' digests, which the artifact cache keeps (`crate::node::cache`).
//!
//! Every file is written atomically ([`durable::write_file`]: temp file, fsync, rename,
//! directory fsync) and 0600: the configuration holds the bootstrap token. A write killed
//! before its rename may leave a `.nodeward-tmp.state.…` temp file; the next run sweeps it
//! under the lock, and `reset` ([`NodeState::remove_all`]) never leaves one. Every write and
//! removal is recorded in the run's change log as a [`ChangeKind::NodeState`], so the audit
//! log and the crash tests see it.
//!
//! A bootstrap, upgrade, reset or apply holds [`NodeLock`] (`run/nodeward/node.lock`) for its
//! whole run.

use crate::caps::RunContext;
use crate::durable;
use crate::plan::ChangeKind;
use nodeward_node_config::NodeConfig;
use nodeward_node_config::layout::{CURRENT_LINK, STATE_DIR};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The schema version of the record and the journal this agent writes and reads.
pub const SCHEMA: u32 = 1;
/// The lock a mutating run holds, relative to the root.
pub const LOCK_FILE: &str = "run/nodeward/node.lock";

/// Where the bootstrap is; a failed run resumes at its checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Checkpoint {
    /// Nothing installed yet (host prepared next).
    SetupHost,
    /// Host prepared; artifacts next.
    DownloadArtifacts,
    /// Version directory complete; the `current` link next.
    Install,
    /// Binaries linked; configuration next.
    Configure,
    /// Configuration written; units and start next.
    StartNode,
    /// Units started; waiting for the kubelet and the Node.
    WaitHealthy,
    /// Node healthy; the applied config is persisted next.
    Persist,
    /// Bootstrap finished.
    Complete,
}

impl Checkpoint {
    /// Its name, as in the record and in `status`.
    pub fn name(self) -> &'static str {
        match self {
            Checkpoint::SetupHost => "setup-host",
            Checkpoint::DownloadArtifacts => "download-artifacts",
            Checkpoint::Install => "install",
            Checkpoint::Configure => "configure",
            Checkpoint::StartNode => "start-node",
            Checkpoint::WaitHealthy => "wait-healthy",
            Checkpoint::Persist => "persist",
            Checkpoint::Complete => "complete",
        }
    }
}

/// The install record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InstallRecord {
    /// [`SCHEMA`]; a newer one is refused.
    pub schema: u32,
    /// The node's name.
    pub machine_name: String,
    /// The fingerprint of the configuration being (or last) installed.
    pub config_fingerprint: String,
    /// The version directory that configuration installs.
    pub version: String,
    /// The next step.
    pub checkpoint: Checkpoint,
}

/// The upgrade journal.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Journal {
    /// [`SCHEMA`].
    pub schema: u32,
    /// The version directory the node ran before the upgrade.
    pub from_version: String,
    /// The version directory the upgrade switches to.
    pub to_version: String,
    /// The fingerprint of the configuration the upgrade applies: only an applied config with
    /// this fingerprint on `to_version` is a finished upgrade.
    pub to_fingerprint: String,
    /// The configuration the node ran before (what a rollback restores).
    pub previous_config: NodeConfig,
}

/// A state file could not be read, parsed or written; names the file.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {message}")]
pub struct StateError {
    /// The file at fault.
    pub path: String,
    /// What went wrong.
    pub message: String,
    /// The underlying error, where one is kept.
    #[source]
    pub source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

/// The node state files of one host root.
#[derive(Clone, Debug)]
pub struct NodeState {
    root: PathBuf,
}

const RECORD: &str = "install-record.json";
const JOURNAL: &str = "upgrade-journal.json";
const APPLIED: &str = "applied-config.json";
const APPLIED_SUM: &str = "applied-config.json.sha256";
/// The previous version's record (`crate::node::cache`).
pub(super) const PREVIOUS: &str = "previous-version.json";
/// The purpose in the temp names of state files (`.nodeward-tmp.state.…`), and so the test
/// hook `state:after-temp-write`.
const TEMP_PURPOSE: &str = "state";

impl NodeState {
    /// The state files beneath `root` (an absolute path).
    pub fn new(root: &Path) -> Self {
        NodeState {
            root: root.to_path_buf(),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.root.join(STATE_DIR).join(name)
    }

    fn rel(name: &str) -> String {
        format!("/{STATE_DIR}/{name}")
    }

    pub(super) fn err(&self, name: &str, message: impl ToString) -> StateError {
        StateError {
            path: self.path(name).display().to_string(),
            message: message.to_string(),
            source: None,
        }
    }

    /// `value` as the JSON the state file `name` holds; an error (never empty bytes) when it
    /// does not encode.
    pub(super) fn encode(
        &self,
        name: &str,
        value: &impl Serialize,
        pretty: bool,
    ) -> Result<Vec<u8>, StateError> {
        let bytes = if pretty {
            serde_json::to_vec_pretty(value)
        } else {
            serde_json::to_vec(value)
        };
        bytes.map_err(|e| StateError {
            path: self.path(name).display().to_string(),
            message: format!("cannot encode: {e}"),
            source: Some(Box::new(e)),
        })
    }

    pub(super) fn read_json<T: for<'de> Deserialize<'de>>(
        &self,
        name: &str,
    ) -> Result<Option<T>, StateError> {
        let bytes = match std::fs::read(self.path(name)) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(self.err(name, format!("cannot read: {e}"))),
        };
        serde_json::from_slice(&bytes).map(Some).map_err(|e| {
            self.err(
                name,
                format!("unreadable ({e}); move it aside or run `nodeward reset`"),
            )
        })
    }

    /// Writes `bytes` to the state file `name` atomically, 0600, and records it.
    pub(super) fn write(
        &self,
        session: &RunContext,
        name: &str,
        bytes: &[u8],
        action: &str,
    ) -> Result<(), StateError> {
        let dir = self.root.join(STATE_DIR);
        std::fs::create_dir_all(&dir)
            .map_err(|e| self.err(name, format!("cannot create its directory: {e}")))?;
        let dir = durable::open_dir(&dir)
            .map_err(|e| self.err(name, format!("cannot open its directory: {e}")))?;
        durable::write_file(&dir, name, bytes, 0o600, TEMP_PURPOSE)
            .map_err(|e| self.err(name, format!("cannot write: {e}")))?;
        session.changes.add(
            "nodeward",
            ChangeKind::NodeState {
                path: Self::rel(name),
                action: action.to_string(),
            },
        );
        Ok(())
    }

    fn remove(&self, session: &RunContext, name: &str) -> Result<bool, StateError> {
        match std::fs::remove_file(self.path(name)) {
            Ok(()) => {
                durable::open_dir(&self.root.join(STATE_DIR))
                    .and_then(|dir| durable::fsync_dir(&dir))
                    .map_err(|e| self.err(name, format!("cannot sync its directory: {e}")))?;
                session.changes.add(
                    "nodeward",
                    ChangeKind::NodeState {
                        path: Self::rel(name),
                        action: "removed".into(),
                    },
                );
                Ok(true)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(self.err(name, format!("cannot remove: {e}"))),
        }
    }

    /// The install record, if any. A newer schema is refused.
    pub fn record(&self) -> Result<Option<InstallRecord>, StateError> {
        let r: Option<InstallRecord> = self.read_json(RECORD)?;
        if let Some(r) = &r
            && r.schema > SCHEMA
        {
            return Err(self.err(
                RECORD,
                format!(
                    "schema {} is newer than this agent's {SCHEMA}; use a newer nodeward",
                    r.schema
                ),
            ));
        }
        Ok(r)
    }

    /// Writes the install record.
    pub fn write_record(&self, session: &RunContext, r: &InstallRecord) -> Result<(), StateError> {
        let bytes = self.encode(RECORD, r, true)?;
        self.write(
            session,
            RECORD,
            &bytes,
            &format!("checkpoint {}", r.checkpoint.name()),
        )
    }

    /// The upgrade journal, if an upgrade is in progress.
    pub fn journal(&self) -> Result<Option<Journal>, StateError> {
        let j: Option<Journal> = self.read_json(JOURNAL)?;
        if let Some(j) = &j
            && j.schema > SCHEMA
        {
            return Err(self.err(
                JOURNAL,
                format!(
                    "schema {} is newer than this agent's {SCHEMA}; use a newer nodeward",
                    j.schema
                ),
            ));
        }
        Ok(j)
    }

    /// Writes the upgrade journal.
    pub fn write_journal(&self, session: &RunContext, j: &Journal) -> Result<(), StateError> {
        let bytes = self.encode(JOURNAL, j, true)?;
        self.write(
            session,
            JOURNAL,
            &bytes,
            &format!("journal {} -> {}", j.from_version, j.to_version),
        )
    }

    /// Drops the upgrade journal (the upgrade is committed or rolled back).
    pub fn drop_journal(&self, session: &RunContext) -> Result<(), StateError> {
        self.remove(session, JOURNAL).map(|_| ())
    }

    /// The applied config, verified against its sidecar. A missing or mismatched sidecar is an
    /// error: the file was changed by hand or torn.
    pub fn applied(&self) -> Result<Option<NodeConfig>, StateError> {
        let bytes = match std::fs::read(self.path(APPLIED)) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(self.err(APPLIED, format!("cannot read: {e}"))),
        };
        let sum = std::fs::read_to_string(self.path(APPLIED_SUM)).map_err(|e| {
            self.err(
                APPLIED_SUM,
                format!("cannot read the applied config's digest: {e}"),
            )
        })?;
        let want = sum.split_whitespace().next().unwrap_or_default();
        let got = crate::bundle::sha256_hex(&bytes);
        if want != got {
            return Err(self.err(APPLIED, format!("sha256 {got} does not match its sidecar ({want}); the file was changed outside nodeward")));
        }
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| self.err(APPLIED, format!("unreadable: {e}")))
    }

    /// Persists the applied config: the sidecar first would name a file that is not there yet,
    /// so the config goes first and the sidecar last; a crash between leaves a mismatch that
    /// [`NodeState::applied`] reports and the next bootstrap rewrites.
    pub fn write_applied(
        &self,
        session: &RunContext,
        config: &NodeConfig,
    ) -> Result<String, StateError> {
        let bytes = self.encode(APPLIED, config, false)?;
        let digest = crate::bundle::sha256_hex(&bytes);
        self.write(session, APPLIED, &bytes, "applied config written")?;
        self.write(
            session,
            APPLIED_SUM,
            format!("{digest}  {APPLIED}\n").as_bytes(),
            "applied config digest written",
        )?;
        Ok(digest)
    }

    /// The sha256 the sidecar records, without verifying (for `status`).
    pub fn applied_digest(&self) -> Option<String> {
        let sum = std::fs::read_to_string(self.path(APPLIED_SUM)).ok()?;
        sum.split_whitespace().next().map(str::to_string)
    }

    /// Removes every node state file, the install record last, then the temp files a killed
    /// write left (one could hold the bootstrap token), then the directory (reset). Call it
    /// under the [`NodeLock`].
    pub fn remove_all(&self, session: &RunContext) -> Result<(), StateError> {
        for name in [JOURNAL, APPLIED_SUM, APPLIED, PREVIOUS, RECORD] {
            self.remove(session, name)?;
        }
        let dir = self.root.join(STATE_DIR);
        durable::sweep_path(&dir, durable::TempDirs::Leave).map_err(|e| StateError {
            path: dir.display().to_string(),
            message: format!("cannot remove the temp files a killed run left: {e}"),
            source: None,
        })?;
        if std::fs::remove_dir(&dir).is_ok() {
            session.changes.add(
                "nodeward",
                ChangeKind::NodeState {
                    path: format!("/{STATE_DIR}"),
                    action: "removed".into(),
                },
            );
        }
        Ok(())
    }

    /// The version directory the `current` link selects.
    pub fn active_version(&self) -> Option<String> {
        std::fs::read_link(self.root.join(CURRENT_LINK))
            .ok()
            .map(|t| t.display().to_string())
    }

    /// Whether any node state file exists.
    pub fn any(&self) -> bool {
        [RECORD, JOURNAL, APPLIED, APPLIED_SUM, PREVIOUS]
            .iter()
            .any(|n| self.path(n).exists())
    }
}

/// The exclusive lock of a mutating run on one host root (a [`durable::Lock`] on
/// [`LOCK_FILE`]), held until dropped. Whoever takes it sweeps what a killed run left before
/// writing anything (`crate::node::sweep`).
#[derive(Debug)]
pub struct NodeLock {
    _lock: durable::Lock,
}

impl NodeLock {
    /// Whether another run holds the node lock beneath `root` right now (the daemon's start
    /// decision). Takes and drops it when free; a lock file that cannot be opened is an error.
    pub fn held(root: &Path) -> Result<bool, StateError> {
        let path = root.join(LOCK_FILE);
        if !path.exists() {
            return Ok(false);
        }
        match durable::Lock::acquire(&path) {
            Ok(_) => Ok(false),
            Err(durable::LockError::Held { .. }) => Ok(true),
            Err(durable::LockError::Open { source }) => Err(StateError {
                path: path.display().to_string(),
                message: format!("cannot open: {source}"),
                source: None,
            }),
        }
    }

    /// Takes the lock beneath `root`, or says who holds it.
    pub fn acquire(root: &Path) -> Result<NodeLock, StateError> {
        let path = root.join(LOCK_FILE);
        let err = |m: String| StateError {
            path: path.display().to_string(),
            message: m,
            source: None,
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .map_err(|e| err(format!("cannot create its directory: {e}")))?;
        }
        match durable::Lock::acquire(&path) {
            Ok(lock) => Ok(NodeLock { _lock: lock }),
            Err(durable::LockError::Open { source }) => Err(err(format!("cannot open: {source}"))),
            Err(durable::LockError::Held { holder, .. }) => Err(err(format!(
                "another nodeward run holds the node lock (pid {}); wait for it to finish",
                holder.as_deref().unwrap_or("")
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::Redactor;
    use crate::hostpath::HostRoot;
    use crate::plan::RunMode;
    use std::os::unix::fs::PermissionsExt as _;

    fn session(root: &Path) -> RunContext {
        RunContext::new(
            HostRoot::open(root).expect("root"),
            RunMode::Apply,
            Redactor::default(),
        )
    }

    fn record(checkpoint: Checkpoint) -> InstallRecord {
        InstallRecord {
            schema: SCHEMA,
            machine_name: "worker-01".into(),
            config_fingerprint: "f".repeat(64),
            version: "1.34.1-abc".into(),
            checkpoint,
        }
    }

    #[test]
    fn record_round_trips_private_and_is_recorded_as_a_change() {
        let tmp = tempfile::tempdir().expect("tmp");
        let s = session(tmp.path());
        let st = NodeState::new(tmp.path());
        assert_eq!(st.record().expect("none"), None);
        st.write_record(&s, &record(Checkpoint::Configure))
            .expect("write");
        assert_eq!(
            st.record().expect("read"),
            Some(record(Checkpoint::Configure))
        );
        let meta = std::fs::metadata(tmp.path().join(STATE_DIR).join(RECORD)).expect("meta");
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        let changes = s.changes();
        assert_eq!(changes.len(), 1);
        assert!(
            changes[0].kind.describe().contains("checkpoint configure"),
            "{:?}",
            changes[0]
        );
    }

    #[test]
    fn newer_schema_and_garbage_are_refused_naming_the_file() {
        let tmp = tempfile::tempdir().expect("tmp");
        let st = NodeState::new(tmp.path());
        let dir = tmp.path().join(STATE_DIR);
        std::fs::create_dir_all(&dir).expect("dir");
        let mut r = serde_json::to_value(record(Checkpoint::Complete)).expect("json");
        r["schema"] = 99.into();
        std::fs::write(dir.join(RECORD), r.to_string()).expect("write");
        let e = st.record().expect_err("newer").to_string();
        assert!(
            e.contains("install-record.json") && e.contains("schema 99"),
            "{e}"
        );
        std::fs::write(dir.join(RECORD), "{not json").expect("write");
        let e = st.record().expect_err("garbage").to_string();
        assert!(
            e.contains("install-record.json") && e.contains("unreadable"),
            "{e}"
        );
    }

    #[test]
    fn applied_config_is_verified_against_its_sidecar() {
        let tmp = tempfile::tempdir().expect("tmp");
        let s = session(tmp.path());
        let st = NodeState::new(tmp.path());
        let config = crate::config::load(None).expect("config");
        let digest = st.write_applied(&s, &config).expect("write");
        assert_eq!(st.applied_digest().as_deref(), Some(digest.as_str()));
        assert_eq!(st.applied().expect("verified"), Some(config.clone()));
        // Edited by hand: refused, naming the file.
        let path = tmp.path().join(STATE_DIR).join(APPLIED);
        let text = std::fs::read_to_string(&path).expect("read");
        std::fs::write(&path, text.replace("worker-01", "worker-02")).expect("edit");
        let e = st.applied().expect_err("tampered").to_string();
        assert!(
            e.contains("applied-config.json") && e.contains("does not match"),
            "{e}"
        );
    }

    #[test]
    fn remove_all_removes_the_record_last_and_is_idempotent() {
        let tmp = tempfile::tempdir().expect("tmp");
        let s = session(tmp.path());
        let st = NodeState::new(tmp.path());
        st.write_record(&s, &record(Checkpoint::Complete))
            .expect("record");
        st.write_applied(&s, &crate::config::load(None).expect("config"))
            .expect("applied");
        let before = s.changes().len();
        st.remove_all(&s).expect("remove");
        let removed: Vec<String> = s.changes()[before..]
            .iter()
            .map(|c| c.kind.describe())
            .collect();
        assert!(removed[removed.len() - 2].contains(RECORD), "{removed:?}");
        assert!(!st.any());
        assert!(!tmp.path().join(STATE_DIR).exists());
        let again = s.changes().len();
        st.remove_all(&s).expect("again");
        assert_eq!(s.changes().len(), again, "a second removal changes nothing");
    }

    #[test]
    fn a_second_holder_of_the_lock_is_refused_with_the_first_ones_pid() {
        let tmp = tempfile::tempdir().expect("tmp");
        let first = NodeLock::acquire(tmp.path()).expect("first");
        let e = NodeLock::acquire(tmp.path()).expect_err("held").to_string();
        assert!(e.contains(&format!("pid {}", std::process::id())), "{e}");
        drop(first);
        NodeLock::acquire(tmp.path()).expect("free again");
    }
}
