//! [`AuditTrail`]: the persistent writer of one run's records.
//!
//! # Expected flow
//! 1. [`AuditTrail::open`] opens the directory without following links and checks it
//!    ([`super::dir`]), and, under the log lock: removes the temp files killed head updates
//!    left beside the heads, takes the run's own lock file (`runs/<run-id>.lock`, `flock`ed
//!    while the run lives), checks the log against the head and notes what it finds damaged
//!    ([`super::repair`]) — or, for a trail without a record, writes its head first
//!    ([`Head::genesis`]) —, closes every run whose lock file is there but no longer held (the
//!    agent died mid-run: [`super::close`]), and writes this run's `run-start`.
//! 2. Each record is appended under the log lock ([`super::lock`]), so two runs (a `plan`
//!    beside an `apply`) never interleave inside a line and the chain stays one sequence:
//!    the writer reads the real last record when another process appended since its own.
//! 3. The log is fsynced and the head rewritten ([`super::head::Head`]) at each run start,
//!    phase end, run end, bundle-store record and rotation ([`AuditTrail::end`] last).
//!
//! # Guarantees
//! - A kill at any moment leaves a trail `audit verify` accepts (a torn last line is only a
//!   warning): the head exists before the first record, and each head update renames a new
//!   head over the old one after the log it names is durable (`docs/audit.md`, "Crashes").
//! - A record is one `write` of one whole line of at most
//!   [`limits::MAX_RECORD_LINE_BYTES`] ([`super::fit`]); a crash leaves at most one torn line,
//!   which the next writer removes (at most [`limits::MAX_TORN_BYTES`]) and records
//!   (`repair` `torn-tail`).
//! - `seq` never goes below a record the writer has seen or the head names: a log found
//!   behind either gets a `log-behind-head` repair record numbered after it, naming the gap.
//! - The active file is rotated once it reaches its size ([`limits::MAX_FILE_BYTES`]);
//!   at most [`limits::ROTATED_FILES`] rotated files are kept.
//! - The run writes at most [`TrailConfig::max_call_bytes`] of call records
//!   ([`AuditTrail::call_budget_left`] says when it is spent).
//! - A write failure is kept ([`AuditTrail::failure`]); the capabilities of an apply then
//!   refuse to act (`crate::caps`), so an apply fails closed.
//!
//! # Caveats
//! Liveness of a run is its `flock`: a run in another mount namespace with another view of
//! the directory is not seen (one trail per host root is the contract).

use super::chain::{ACTIVE, line_hash};
use super::dir::{Access, FileMode, TrailDir};
use super::entry::{AGENT_VERSION, BundleRef, CallCount, Entry, Event, Mode, Outcome, ZERO_HASH};
use super::head::Head;
use super::lock::{LogLock, RunLock, log_lock};
use super::repair::HeadState;
use super::{AuditRecord, files, journal, limits};
use std::fs::File;
use std::io::{self, Write as _};
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// Where a trail lives and how large it grows.
#[derive(Clone, Debug)]
pub struct TrailConfig {
    /// The log's directory (`<root>/var/log/nodeward/audit` by default).
    pub dir: PathBuf,
    /// The head file (in the agent state directory: [`super::head::head_path`]).
    pub head: PathBuf,
    /// Size at which the active file rotates.
    pub max_file_bytes: u64,
    /// Rotated files kept (at least one is).
    pub rotated_files: usize,
    /// Longest wait for the log lock.
    pub lock_wait: Duration,
    /// Bytes of call records one run writes.
    pub max_call_bytes: u64,
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
            lock_wait: limits::LOCK_WAIT,
            max_call_bytes: limits::MAX_CALL_BYTES_PER_RUN,
        }
    }
}

/// What a run is, for its `run-start` record.
#[derive(Clone, Debug)]
pub struct RunInfo {
    /// The command (`bootstrap`, `apply --phase setup-host`, `phases install` …).
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
    /// Another process held the log lock for longer than the writer waits.
    #[error(
        "audit log lock {path}: held by another process for more than {}s; not waiting longer",
        waited.as_secs_f32()
    )]
    LockTimeout {
        /// The lock file.
        path: PathBuf,
        /// How long the writer waited.
        waited: Duration,
    },
    /// The head could not be read or written.
    #[error(transparent)]
    Head(#[from] super::head::HeadError),
}

/// The last record the next one chains to, and the active file it was read from.
#[derive(Clone, Debug)]
pub(super) struct Tail {
    pub(super) seq: u64,
    pub(super) hash: String,
    ino: u64,
    len: u64,
}

/// What the writer knows of the log between appends.
#[derive(Debug, Default)]
pub(super) struct State {
    /// The last record, and the size of the active file after it.
    pub(super) tail: Option<Tail>,
    /// The highest `seq` the writer has written, read back, or seen the head name: no record
    /// is numbered at or below it again.
    pub(super) high: u64,
    /// The head's floor when the trail was opened (for the gap of a log found empty).
    pub(super) floor: u64,
    /// The last gap a `log-behind-head` record named.
    pub(super) gap: Option<super::chain::Gap>,
}

/// One run's writer (see the module doc).
#[derive(Debug)]
pub struct AuditTrail {
    pub(super) config: TrailConfig,
    pub(super) dir: TrailDir,
    pub(super) runs: TrailDir,
    pub(super) run_id: String,
    mode: Mode,
    log_lock: File,
    run_lock: Option<RunLock>,
    pub(super) state: Mutex<State>,
    phase: Mutex<Option<PhaseRef>>,
    failure: Mutex<Option<String>>,
    call_bytes: AtomicU64,
    opened: AtomicBool,
    /// The dead runs this one closed when it opened ([`super::close`]).
    pub(super) closed: Mutex<Vec<String>>,
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
        let dir = TrailDir::open(&config.dir, Access::Write)
            .map_err(io_at(&config.dir))?
            .ok_or_else(|| io_at(&config.dir)(io::ErrorKind::NotFound.into()))?;
        let runs = dir.subdir("runs").map_err(io_at(&config.dir))?;
        let log_lock = dir
            .file(".lock", FileMode::Lock)
            .map_err(io_at(&dir.join(".lock")))?;
        let mut trail = AuditTrail {
            config,
            dir,
            runs,
            run_id: new_run_id(),
            mode: run.mode,
            log_lock,
            run_lock: None,
            state: Mutex::new(State::default()),
            phase: Mutex::new(None),
            failure: Mutex::new(None),
            call_bytes: AtomicU64::new(0),
            opened: AtomicBool::new(false),
            closed: Mutex::new(Vec::new()),
        };
        let held = trail.lock()?;
        trail.sweep_heads()?;
        trail.run_lock = Some(RunLock::take(&trail.runs, &trail.run_id)?);
        super::repair::check_open(&trail)?;
        trail.close_dangling()?;
        trail.append_locked(
            &trail.run_id,
            Event::RunStart {
                command: run.command,
                mode: run.mode,
                root: run.root,
                pid: std::process::id(),
            },
        )?;
        trail.sync_locked(true)?;
        trail.opened.store(true, Ordering::Relaxed);
        drop(held);
        Ok(trail)
    }

    /// This run's ID.
    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// The dead runs this one found and closed as `interrupted` when it opened
    /// ([`super::close`]).
    pub fn closed_runs(&self) -> Vec<String> {
        guard(&self.closed).clone()
    }

    /// Plan or apply.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The first write that failed, if any: an apply stops acting then.
    pub fn failure(&self) -> Option<String> {
        guard(&self.failure).clone()
    }

    /// Whether this run may still write call records: it has written less than
    /// [`TrailConfig::max_call_bytes`] of them.
    pub fn call_budget_left(&self) -> bool {
        self.call_room_for(1)
    }

    /// Whether this run may still write `records` call records, each as long as a record can
    /// be ([`limits::MAX_RECORD_LINE_BYTES`] and its newline): a call that writes one record per part
    /// (`download.fetch-all`) is admitted only when all of them will be written.
    pub fn call_room_for(&self, records: usize) -> bool {
        // A line as long as a record can be, and its newline.
        let reserved = (records.saturating_sub(1) as u64)
            .saturating_mul(limits::MAX_RECORD_LINE_BYTES as u64 + 1);
        self.call_bytes
            .load(Ordering::Relaxed)
            .saturating_add(reserved)
            < self.config.max_call_bytes
    }

    /// The phase whose calls follow (its bundle and component go into each call record).
    pub fn enter_phase(&self, phase: Option<PhaseRef>) {
        *guard(&self.phase) = phase;
    }

    /// Records one capability call (not synced: the phase end is), counting its bytes against
    /// the run's budget.
    pub fn call(&self, record: &AuditRecord) {
        let phase = guard(&self.phase)
            .clone()
            .filter(|p| p.phase == record.phase);
        let (bundle, component) = match phase {
            Some(p) => (Some(p.bundle), Some(p.component)),
            None => (None, None),
        };
        let event = Event::call(record, self.mode, bundle, component);
        if let Some(bytes) = self.write(event, false) {
            self.call_bytes.fetch_add(bytes, Ordering::Relaxed);
        }
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
        self.sync_locked(false)?;
        if let Some(lock) = &self.run_lock {
            lock.release(&self.runs)?;
        }
        Ok(())
    }

    /// Appends `event` under the log lock (and syncs when `sync`); its line's length. A
    /// failure is kept and logged, not returned: the record's caller is a capability call or a
    /// phase end, and what a failure means for the run is decided where
    /// [`AuditTrail::failure`] is read.
    fn write(&self, event: Event, sync: bool) -> Option<u64> {
        let result = self.lock().and_then(|_held| {
            let bytes = self.append_locked(&self.run_id, event)?;
            if sync {
                self.sync_locked(false)?;
            }
            Ok(bytes)
        });
        match result {
            Ok(bytes) => Some(bytes),
            Err(e) => {
                tracing::error!(target: "nodeward::audit", "cannot write the audit log: {e}");
                guard(&self.failure).get_or_insert_with(|| e.to_string());
                None
            }
        }
    }

    /// Takes the log lock ([`super::lock`]).
    fn lock(&self) -> Result<LogLock, TrailError> {
        log_lock(
            &self.log_lock,
            &self.dir.join(".lock"),
            self.config.lock_wait,
        )
    }

    pub(super) fn active(&self) -> PathBuf {
        self.dir.join(ACTIVE)
    }

    pub(super) fn open_active(&self) -> Result<File, TrailError> {
        self.dir
            .file(ACTIVE, FileMode::Append)
            .map_err(io_at(&self.active()))
    }

    /// The record the next one chains to: the cached one while the active file is as this
    /// writer left it, else read back (repairing a torn line and a log behind what the writer
    /// has seen: [`super::repair::read_tail`]).
    pub(super) fn tail_locked(&self, file: &File) -> Result<Option<Tail>, TrailError> {
        let meta = file.metadata().map_err(io_at(&self.active()))?;
        if let Some(t) = guard(&self.state)
            .tail
            .clone()
            .filter(|t| t.ino == meta.ino() && t.len == meta.len())
        {
            return Ok(Some(t));
        }
        super::repair::read_tail(self, file, meta.ino(), meta.len())
    }

    /// The tail a line read back names.
    pub(super) fn tail_of(
        line: &[u8],
        path: &Path,
        ino: u64,
        len: u64,
    ) -> Result<Tail, TrailError> {
        let seq = files::seq_of(line).ok_or_else(|| TrailError::Tail {
            path: path.to_path_buf(),
            detail: "no seq".into(),
        })?;
        Ok(Tail {
            seq,
            hash: line_hash(line),
            ino,
            len,
        })
    }

    /// Appends one record about `run_id` (rotating first when the file would pass its size);
    /// its line's length.
    pub(super) fn append_locked(&self, run_id: &str, event: Event) -> Result<u64, TrailError> {
        let mut file = self.open_active()?;
        let mut tail = self.tail_locked(&file)?;
        if let Some(t) = tail
            .as_ref()
            .filter(|t| t.len >= self.config.max_file_bytes)
        {
            let head = self.head_now(t)?;
            files::rotate(
                &self.dir,
                self.config.rotated_files,
                &file,
                head,
                &self.config.head,
            )?;
            file = self.open_active()?;
            let ino = file.metadata().map_err(io_at(&self.active()))?.ino();
            tail = tail.map(|t| Tail { ino, len: 0, ..t });
        }
        self.append_to(
            &file,
            tail.as_ref().map(|t| (t.seq, t.hash.as_str())),
            run_id,
            event,
        )
    }

    /// Appends one record numbered after `after` (`seq` and hash; none: the first record) to
    /// `file`, the active file; its line's length.
    pub(super) fn append_to(
        &self,
        mut file: &File,
        after: Option<(u64, &str)>,
        run_id: &str,
        event: Event,
    ) -> Result<u64, TrailError> {
        let path = self.active();
        let seq = match after {
            None => 1,
            Some((s, _)) => s.checked_add(1).ok_or_else(|| TrailError::Tail {
                path: path.clone(),
                detail: format!("seq {s} is the last there can be"),
            })?,
        };
        let mut entry = Entry {
            seq,
            time: super::entry::now(),
            prev: after.map_or_else(|| ZERO_HASH.to_string(), |(_, h)| h.to_string()),
            run_id: run_id.to_string(),
            agent: AGENT_VERSION.to_string(),
            event,
        };
        let mut line = super::fit::line(&mut entry).map_err(|e| io_at(&path)(e.into()))?;
        let hash = line_hash(&line);
        line.push(b'\n');
        file.write_all(&line).map_err(io_at(&path))?;
        crate::test_hooks::abort_at("audit:after-record");
        journal::emit(&entry, line.strip_suffix(b"\n").unwrap_or(&line));
        let meta = file.metadata().map_err(io_at(&path))?;
        let mut state = guard(&self.state);
        state.high = state.high.max(seq);
        state.tail = Some(Tail {
            seq,
            hash,
            ino: meta.ino(),
            len: meta.len(),
        });
        Ok(line.len() as u64)
    }

    /// The head naming `tail`, with the floor the head on disk has (or, with none or a
    /// damaged one, the log's first `seq`).
    fn head_now(&self, tail: &Tail) -> Result<Head, TrailError> {
        let (floor, pending_floor) = match super::repair::read_head(self)? {
            HeadState::Present(h) => (h.floor, h.pending_floor),
            _ => (files::first_seq(&self.dir)?.unwrap_or(tail.seq), None),
        };
        Ok(Head {
            seq: tail.seq,
            hash: tail.hash.clone(),
            floor,
            pending_floor,
        })
    }

    /// fsyncs the active file and the directory, and records the head (its floor where the
    /// log now starts when `reset_floor`: at open, after the checks noted what they found). A
    /// head gone since the run opened is a break: noted in the log first.
    pub(super) fn sync_locked(&self, reset_floor: bool) -> Result<(), TrailError> {
        if self.opened.load(Ordering::Relaxed) {
            let state = super::repair::read_head(self)?;
            super::repair::note_head_gone(self, &state)?;
        }
        let file = self.open_active()?;
        file.sync_all().map_err(io_at(&self.active()))?;
        self.dir.fsync().map_err(io_at(self.dir.path()))?;
        let Some(t) = guard(&self.state).tail.clone() else {
            return Ok(());
        };
        crate::test_hooks::abort_at("audit:after-sync");
        let mut head = self.head_now(&t)?;
        if reset_floor && let Some(first) = files::first_seq(&self.dir)? {
            head.floor = first;
            head.pending_floor = None;
        }
        head.write(&self.config.head)?;
        Ok(())
    }

    /// Removes the head writers' temp files that killed runs left beside the heads (one a
    /// killed head update leaves), never a live writer's ([`crate::durable::sweep`]): the
    /// heads directory is shared by every trail of the state directory.
    fn sweep_heads(&self) -> Result<(), TrailError> {
        let Some(heads) = self
            .config
            .head
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
        else {
            return Ok(());
        };
        let removed = TrailDir::open(heads, Access::Read)
            .and_then(|d| match d {
                Some(d) => crate::durable::sweep(&d.cap_dir()?, crate::durable::TempDirs::Leave),
                None => Ok(Vec::new()),
            })
            .map_err(io_at(heads))?;
        if !removed.is_empty() {
            tracing::warn!(target: "nodeward::audit", dir = %heads.display(), ?removed, "removed the temp files a killed head update left");
        }
        Ok(())
    }
}

/// An error message as records keep it: bounded like a call's outcome (the caller redacted it).
fn bounded(text: &str) -> String {
    super::bound_text(text, limits::MAX_OUTCOME_BYTES).into_owned()
}

pub(super) fn guard<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
