//! [`AuditTrail`]: the persistent writer of one run's records.
//!
//! # Expected flow
//! 1. [`AuditTrail::open`] makes the directory, takes the run's own lock file
//!    (`runs/<run-id>.lock`, `flock`ed while the run lives), and, under the log lock: removes a
//!    torn last line a killed writer left, notes a log that ends before the recorded head,
//!    writes an `interrupted` run end for every run whose lock file is there but no longer
//!    held (the agent died mid-run), and writes this run's `run-start`.
//! 2. Each record is appended under the log lock (`.lock`, `flock`), so two runs (a `plan`
//!    beside an `apply`) never interleave inside a line and the chain stays one sequence:
//!    the writer reads the real last record when another process appended since its own.
//! 3. The log is fsynced and the head rewritten ([`super::chain::Head`]) at each run start,
//!    phase end, run end and bundle-store record ([`AuditTrail::end`] last).
//!
//! # Guarantees
//! - A record is one `write` of one whole line; a crash leaves at most one torn line, which
//!   the next writer removes and records (`repair` `torn-tail`).
//! - The active file is rotated once it reaches its size ([`limits::MAX_FILE_BYTES`]);
//!   at most [`limits::ROTATED_FILES`] rotated files are kept.
//! - A write failure is kept ([`AuditTrail::failure`]); the capabilities of an apply then
//!   refuse to act (`crate::caps`), so an apply fails closed.
//!
//! # Caveats
//! Liveness of a run is its `flock`: a run in another mount namespace with another view of
//! the directory is not seen (one trail per host root is the contract).

use super::chain::{ACTIVE, Head, line_hash};
use super::entry::{AGENT_VERSION, BundleRef, CallCount, Entry, Event, Mode, Outcome, ZERO_HASH};
use super::{AuditRecord, files, journal, limits};
use rustix::fs::{FlockOperation, flock};
use std::fs::{File, OpenOptions};
use std::io::{self, Write as _};
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Where a trail lives and how large it grows.
#[derive(Clone, Debug)]
pub struct TrailConfig {
    /// The log's directory (`<root>/var/log/nodeward/audit` by default).
    pub dir: PathBuf,
    /// The head file (in the agent state directory: `docs/audit.md`).
    pub head: PathBuf,
    /// Size at which the active file rotates.
    pub max_file_bytes: u64,
    /// Rotated files kept.
    pub rotated_files: usize,
}

impl TrailConfig {
    /// The trail in `dir` with its head at `head`, at the default bounds (a `test-hooks` build
    /// may rotate smaller: `crate::test_hooks::audit_rotate_bytes`).
    pub fn new(dir: PathBuf, head: PathBuf) -> Self {
        TrailConfig {
            dir,
            head,
            max_file_bytes: crate::test_hooks::audit_rotate_bytes()
                .unwrap_or(limits::MAX_FILE_BYTES),
            rotated_files: limits::ROTATED_FILES,
        }
    }
}

/// What a run is, for its `run-start` record.
#[derive(Clone, Debug)]
pub struct RunInfo {
    /// The command (`bootstrap`, `apply --phase`, `phases install` …).
    pub command: String,
    /// Plan or apply.
    pub mode: Mode,
    /// The host root.
    pub root: String,
}

/// The phase whose calls are being recorded.
#[derive(Clone, Debug)]
pub struct PhaseRef {
    /// The phase.
    pub phase: String,
    /// Its bundle.
    pub bundle: BundleRef,
    /// sha256 of its component.
    pub component: String,
}

/// Why the trail could not be opened or written.
#[derive(Debug, thiserror::Error)]
pub enum TrailError {
    /// A file or directory of the trail.
    #[error("audit log {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The failure.
        #[source]
        source: io::Error,
    },
    /// The last record, which the next one must name, is not a record.
    #[error(
        "audit log {path}: its last record is not valid ({detail}); see `nodeward audit verify`"
    )]
    Tail {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// The head could not be written.
    #[error(transparent)]
    Head(#[from] super::chain::HeadError),
}

/// The last record the next one chains to, and the active file it was read from.
#[derive(Clone, Debug)]
struct Tail {
    seq: u64,
    hash: String,
    ino: u64,
    len: u64,
}

/// One run's writer (see the module doc).
#[derive(Debug)]
pub struct AuditTrail {
    config: TrailConfig,
    run_id: String,
    mode: Mode,
    log_lock: File,
    run_lock: Option<(File, PathBuf)>,
    tail: Mutex<Option<Tail>>,
    phase: Mutex<Option<PhaseRef>>,
    failure: Mutex<Option<String>>,
}

/// A fresh run ID: 16 hex digits.
pub fn new_run_id() -> String {
    format!("{:016x}", fastrand::u64(..))
}

pub(super) fn io_at(path: &Path) -> impl Fn(io::Error) -> TrailError + '_ {
    move |source| TrailError::Io {
        path: path.to_path_buf(),
        source,
    }
}

impl AuditTrail {
    /// Opens the trail for a new run and writes its `run-start` (see the module doc).
    pub fn open(config: TrailConfig, run: RunInfo) -> Result<AuditTrail, TrailError> {
        let runs = config.dir.join("runs");
        std::fs::create_dir_all(&runs).map_err(io_at(&runs))?;
        let lock_path = config.dir.join(".lock");
        let log_lock = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o640)
            .open(&lock_path)
            .map_err(io_at(&lock_path))?;
        let run_id = new_run_id();
        let mut trail = AuditTrail {
            config,
            run_id,
            mode: run.mode,
            log_lock,
            run_lock: None,
            tail: Mutex::new(None),
            phase: Mutex::new(None),
            failure: Mutex::new(None),
        };
        let held = trail.lock()?;
        let own = runs.join(format!("{}.lock", trail.run_id));
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o640)
            .open(&own)
            .map_err(io_at(&own))?;
        flock(&file, FlockOperation::NonBlockingLockExclusive)
            .map_err(|e| io_at(&own)(e.into()))?;
        trail.run_lock = Some((file, own));
        trail.check_head()?;
        trail.close_dangling(&runs)?;
        trail.append_locked(
            &trail.run_id,
            Event::RunStart {
                command: run.command,
                mode: run.mode,
                root: run.root,
                pid: std::process::id(),
            },
        )?;
        trail.sync_locked()?;
        drop(held);
        Ok(trail)
    }

    /// This run's ID.
    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// Plan or apply.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The first write that failed, if any: an apply stops acting then.
    pub fn failure(&self) -> Option<String> {
        guard(&self.failure).clone()
    }

    /// The phase whose calls follow (its bundle and component go into each call record).
    pub fn enter_phase(&self, phase: Option<PhaseRef>) {
        *guard(&self.phase) = phase;
    }

    /// Records one capability call (not synced: the phase end is).
    pub fn call(&self, record: &AuditRecord) {
        let phase = guard(&self.phase)
            .clone()
            .filter(|p| p.phase == record.phase);
        let (bundle, component) = match phase {
            Some(p) => (Some(p.bundle), Some(p.component)),
            None => (None, None),
        };
        let event = Event::call(record, self.mode, bundle, component);
        self.write(event, false);
    }

    /// Records the calls of `phase` counted over its per-phase limit.
    pub fn overflow(&self, phase: &str, calls: Vec<CallCount>) {
        self.write(
            Event::CallOverflow {
                phase: phase.to_string(),
                calls,
            },
            false,
        );
    }

    /// Records the end of a phase run and makes the log durable. `event` must be a
    /// `phase-end`; its bundle is filled in from [`AuditTrail::enter_phase`].
    pub fn phase_end(&self, mut event: Event) {
        if let Event::PhaseEnd { bundle, error, .. } = &mut event {
            if bundle.is_none() {
                *bundle = guard(&self.phase).clone().map(|p| p.bundle);
            }
            *error = error.as_deref().map(bounded);
        }
        self.enter_phase(None);
        self.write(event, true);
    }

    /// Records a bundle-store change and makes the log durable.
    pub fn bundle(&self, event: Event) {
        self.write(event, true);
    }

    /// Records the run's end, makes the log durable and releases the run's lock file.
    pub fn end(
        &self,
        error: Option<&str>,
        calls: u64,
        denied: u64,
        changes: u64,
    ) -> Result<(), TrailError> {
        let event = Event::RunEnd {
            outcome: if error.is_some() {
                Outcome::Failed
            } else {
                Outcome::Ok
            },
            error: error.map(bounded),
            calls: Some(calls),
            denied: Some(denied),
            changes: Some(changes),
            detected_by: None,
        };
        let _held = self.lock()?;
        self.append_locked(&self.run_id, event)?;
        self.sync_locked()?;
        if let Some((_, path)) = &self.run_lock {
            std::fs::remove_file(path).map_err(io_at(path))?;
        }
        Ok(())
    }

    /// Appends `event` under the log lock (and syncs when `sync`); a failure is kept and
    /// logged, not returned: the record's caller is a capability call or a phase end, and
    /// what a failure means for the run is decided where [`AuditTrail::failure`] is read.
    fn write(&self, event: Event, sync: bool) {
        let result = self.lock().and_then(|_held| {
            self.append_locked(&self.run_id, event)?;
            if sync {
                self.sync_locked()?;
            }
            Ok(())
        });
        if let Err(e) = result {
            tracing::error!(target: "nodeward::audit", "cannot write the audit log: {e}");
            guard(&self.failure).get_or_insert_with(|| e.to_string());
        }
    }

    /// Takes the log lock (blocking: other writers hold it for one append).
    fn lock(&self) -> Result<LogLock, TrailError> {
        let path = self.config.dir.join(".lock");
        let file = self.log_lock.try_clone().map_err(io_at(&path))?;
        flock(&file, FlockOperation::LockExclusive).map_err(|e| io_at(&path)(e.into()))?;
        Ok(LogLock(file))
    }

    fn active(&self) -> PathBuf {
        self.config.dir.join(ACTIVE)
    }

    fn open_active(&self) -> Result<File, TrailError> {
        let path = self.active();
        OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .mode(0o640)
            .open(&path)
            .map_err(io_at(&path))
    }

    /// The record the next one chains to; repairs a torn last line on the way.
    fn tail_locked(&self, file: &File) -> Result<Option<Tail>, TrailError> {
        let path = self.active();
        let meta = file.metadata().map_err(io_at(&path))?;
        if let Some(t) = guard(&self.tail)
            .clone()
            .filter(|t| t.ino == meta.ino() && t.len == meta.len())
        {
            return Ok(Some(t));
        }
        let (last, torn) = files::last_line(file, meta.len(), &path)?;
        if let Some(torn) = torn {
            file.set_len(meta.len() - torn).map_err(io_at(&path))?;
            file.sync_data().map_err(io_at(&path))?;
            tracing::warn!(
                target: "nodeward::audit",
                "{}: removed a torn last record ({torn} bytes): a writer was cut off mid-write",
                path.display()
            );
            let tail = self.chain_to(last, &path, meta.ino(), meta.len() - torn)?;
            *guard(&self.tail) = tail.clone();
            let repair = Event::Repair {
                repair: "torn-tail".into(),
                detail: format!(
                    "removed {torn} bytes of a record cut off mid-write at the end of {}",
                    path.display()
                ),
            };
            self.append_to(file, tail, &self.run_id, repair)?;
            return Ok(guard(&self.tail).clone());
        }
        self.chain_to(last, &path, meta.ino(), meta.len())
    }

    /// The tail from the active file's last line, or the newest rotated file's when the
    /// active one is empty.
    fn chain_to(
        &self,
        last: Option<Vec<u8>>,
        path: &Path,
        ino: u64,
        len: u64,
    ) -> Result<Option<Tail>, TrailError> {
        let line = match last {
            Some(l) => Some(l),
            None => {
                let rotated = self.config.dir.join(format!("{ACTIVE}.1"));
                match File::open(&rotated) {
                    Ok(f) => {
                        let n = f.metadata().map_err(io_at(&rotated))?.len();
                        files::last_line(&f, n, &rotated)?.0
                    }
                    Err(e) if e.kind() == io::ErrorKind::NotFound => None,
                    Err(e) => return Err(io_at(&rotated)(e)),
                }
            }
        };
        let Some(line) = line else { return Ok(None) };
        let seq = serde_json::from_slice::<serde_json::Value>(&line)
            .ok()
            .and_then(|v| v.get("seq")?.as_u64())
            .ok_or_else(|| TrailError::Tail {
                path: path.to_path_buf(),
                detail: "no seq".into(),
            })?;
        Ok(Some(Tail {
            seq,
            hash: line_hash(&line),
            ino,
            len,
        }))
    }

    /// Appends one record about `run_id` (rotating first when the file would pass its size).
    fn append_locked(&self, run_id: &str, event: Event) -> Result<(), TrailError> {
        let mut file = self.open_active()?;
        let mut tail = self.tail_locked(&file)?;
        let len = tail.as_ref().map_or(0, |t| t.len);
        if len > 0 && len >= self.config.max_file_bytes {
            self.rotate()?;
            file = self.open_active()?;
            let path = self.active();
            let ino = file.metadata().map_err(io_at(&path))?.ino();
            tail = tail.map(|t| Tail { ino, len: 0, ..t });
        }
        self.append_to(&file, tail, run_id, event)
    }

    fn append_to(
        &self,
        mut file: &File,
        tail: Option<Tail>,
        run_id: &str,
        event: Event,
    ) -> Result<(), TrailError> {
        let path = self.active();
        let entry = Entry {
            seq: tail.as_ref().map_or(1, |t| t.seq + 1),
            time: super::entry::now(),
            prev: tail
                .as_ref()
                .map_or_else(|| ZERO_HASH.to_string(), |t| t.hash.clone()),
            run_id: run_id.to_string(),
            agent: AGENT_VERSION.to_string(),
            event,
        };
        let mut line = serde_json::to_vec(&entry).map_err(|e| io_at(&path)(e.into()))?;
        let hash = line_hash(&line);
        line.push(b'\n');
        file.write_all(&line).map_err(io_at(&path))?;
        journal::emit(&entry, line.strip_suffix(b"\n").unwrap_or(&line));
        let meta = file.metadata().map_err(io_at(&path))?;
        *guard(&self.tail) = Some(Tail {
            seq: entry.seq,
            hash,
            ino: meta.ino(),
            len: meta.len(),
        });
        Ok(())
    }

    /// Rotates the files ([`files::rotate`]).
    fn rotate(&self) -> Result<(), TrailError> {
        files::rotate(&self.config.dir, self.config.rotated_files)
    }

    /// fsyncs the active file (and the directory: it may be new) and records the head.
    fn sync_locked(&self) -> Result<(), TrailError> {
        let path = self.active();
        let file = File::open(&path).map_err(io_at(&path))?;
        file.sync_all().map_err(io_at(&path))?;
        crate::durable::open_dir(&self.config.dir)
            .and_then(|d| crate::durable::fsync_dir(&d))
            .map_err(io_at(&self.config.dir))?;
        if let Some(t) = guard(&self.tail).clone() {
            Head {
                seq: t.seq,
                hash: t.hash,
            }
            .write(&self.config.head)?;
        }
        Ok(())
    }

    /// Notes in the log when it does not reach the recorded head (records were removed from
    /// its end, or the log was replaced): the note stays in the chain for auditors.
    fn check_head(&self) -> Result<(), TrailError> {
        let Some(head) = Head::read(&self.config.head)? else {
            return Ok(());
        };
        let file = self.open_active()?;
        let tail = self.tail_locked(&file)?;
        let (repair, detail) = match &tail {
            Some(t) if t.seq > head.seq => return Ok(()),
            Some(t) if t.seq == head.seq && t.hash == head.hash => return Ok(()),
            Some(t) if t.seq == head.seq => (
                "head-mismatch",
                format!(
                    "the last record (seq {}) is not the one the head names",
                    t.seq
                ),
            ),
            t => (
                "log-behind-head",
                format!(
                    "the log ends at seq {} before the head's seq {}: records were removed",
                    t.as_ref().map_or(0, |t| t.seq),
                    head.seq
                ),
            ),
        };
        tracing::warn!(target: "nodeward::audit", "audit log {}: {detail}", self.config.dir.display());
        self.append_to(
            &file,
            tail,
            &self.run_id,
            Event::Repair {
                repair: repair.into(),
                detail,
            },
        )
    }

    /// Writes an `interrupted` run end for every run whose lock file nobody holds.
    fn close_dangling(&self, runs: &Path) -> Result<(), TrailError> {
        let own = self.run_lock.as_ref().map(|(_, p)| p.clone());
        for entry in std::fs::read_dir(runs).map_err(io_at(runs))? {
            let path = entry.map_err(io_at(runs))?.path();
            let Some(id) = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_suffix(".lock"))
            else {
                continue;
            };
            if Some(&path) == own.as_ref() {
                continue;
            }
            let Ok(f) = File::open(&path) else { continue };
            if flock(&f, FlockOperation::NonBlockingLockExclusive).is_err() {
                continue; // alive
            }
            let id = id.to_string();
            tracing::warn!(
                target: "nodeward::audit",
                "run {id} ended without its run-end record (the agent died): recording it as interrupted"
            );
            self.append_locked(
                &id,
                Event::RunEnd {
                    outcome: Outcome::Interrupted,
                    error: None,
                    calls: None,
                    denied: None,
                    changes: None,
                    detected_by: Some(self.run_id.clone()),
                },
            )?;
            std::fs::remove_file(&path).map_err(io_at(&path))?;
        }
        Ok(())
    }
}

/// The log lock, released when dropped: a duplicate of the trail's lock file descriptor
/// (`flock` belongs to the open file, which the duplicate shares).
struct LogLock(File);

impl Drop for LogLock {
    fn drop(&mut self) {
        let _ = flock(&self.0, FlockOperation::Unlock);
    }
}

/// An error message as records keep it: bounded like a call's outcome (the caller redacted it).
fn bounded(text: &str) -> String {
    super::bound_text(text, limits::MAX_OUTCOME_BYTES).into_owned()
}

fn guard<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
