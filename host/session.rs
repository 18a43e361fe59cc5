//! One plan or apply run: a bundle's phases, in order, against a host root.
//!
//! # Expected flow
//! 1. Every selected phase is loaded first (digest already verified by [`Bundle`], compiled or
//!    taken from the cache, imports checked against its world), so a bad component stops the
//!    run before any phase's code runs.
//! 2. Each phase runs with its own input (the parts of the run's [`PhaseInput`] its grants
//!    name, secrets as references: [`PhaseInput::restricted_to`]), its grants, the run's pinned
//!    artifacts, the shared [`Session`] and a fresh deadline.
//! 3. The first failing phase stops the run; the changes made so far stay in the session.
//!
//! # Guarantees
//! Plan and apply run exactly the same code; only [`RunMode`] differs, and only the
//! capabilities look at it.

use crate::audit::{AuditLog, Redactor};
use crate::bundle::Bundle;
use crate::caps::PhaseCtx;
use crate::caps::download::PinnedArtifact;
use crate::caps::systemd_dbus::SystemdBus;
use crate::fetch::{DEFAULT_CACHE_DIR, FetchConfig, FetchPolicy};
use crate::hostpath::{HostPath, HostRoot};
use crate::plan::{Change, ChangeKind, Overlay, RunMode};
use crate::runtime::{Limits, LoadError, PhaseError, PhaseReport, Runtime};
use crate::secrets::Secrets;
use nodeward_node_config::input::PhaseInput;
use serde::Serialize;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Test hook: abort right after the k-th host mutation of an apply (see [`Session::record`]).
pub const ABORT_AFTER_MUTATION_ENV: &str = "NODEWARD_TEST_ABORT_AFTER_MUTATION";

/// The most changes one run lists (see [`Session::record`]).
pub const MAX_CHANGES: usize = 4096;
/// The most diff text one run's change list keeps.
pub const MAX_DIFF_BYTES: usize = 8 << 20;
/// The most planned file contents one plan holds in memory.
pub const MAX_PLANNED_BYTES: usize = 32 << 20;

/// The run's change list and its bounds.
#[derive(Debug, Default)]
struct ChangeLog {
    kept: Vec<Change>,
    total: usize,
    diff_bytes: usize,
    planned_bytes: usize,
}

/// Where unit files go unless configured otherwise.
pub const DEFAULT_UNIT_DIR: &str = "etc/systemd/system";

/// The state one run's capabilities share.
#[derive(Debug)]
pub struct Session {
    /// The host root every path resolves beneath.
    pub root: HostRoot,
    /// Plan or apply.
    pub mode: RunMode,
    /// The systemd unit directory, beneath the root.
    pub unit_dir: HostPath,
    /// Removes known secrets from everything logged or printed.
    pub redactor: Redactor,
    /// The run's secrets, substituted for their references in granted files
    /// ([`crate::secrets`]); none unless set (a session without secrets writes references
    /// as they are).
    pub secrets: Secrets,
    /// Every capability call.
    pub audit: AuditLog,
    /// The content-addressed artifact cache beneath the root (`<dir>/sha256/<hex>`). A field so
    /// that a deployment (or a test) can place it, e.g. on a larger volume.
    pub artifact_cache: HostPath,
    /// Size cap, retries and timeouts of downloads.
    pub fetch_policy: FetchPolicy,
    pub(crate) overlay: Mutex<Overlay>,
    changes: Mutex<ChangeLog>,
    /// Test hook: abort the process right after this many host mutations (apply mode only);
    /// read from [`ABORT_AFTER_MUTATION_ENV`] when the session is made.
    abort_after_mutation: Option<usize>,
    /// The systemd D-Bus connection, made on first use (see [`Session::systemd`]).
    systemd: Mutex<Option<Arc<SystemdBus>>>,
}

impl Session {
    /// A session over `root` in `mode`.
    pub fn new(root: HostRoot, mode: RunMode, redactor: Redactor) -> Self {
        Session {
            root,
            mode,
            unit_dir: HostPath::parse(DEFAULT_UNIT_DIR)
                .unwrap_or_else(|_| unreachable!("constant is a valid host path")),
            redactor,
            secrets: Secrets::default(),
            audit: AuditLog::default(),
            artifact_cache: HostPath::parse(DEFAULT_CACHE_DIR)
                .unwrap_or_else(|_| unreachable!("constant is a valid host path")),
            fetch_policy: FetchPolicy::default(),
            overlay: Mutex::new(Overlay::default()),
            changes: Mutex::new(ChangeLog::default()),
            abort_after_mutation: std::env::var(ABORT_AFTER_MUTATION_ENV)
                .ok()
                .and_then(|v| v.parse().ok()),
            systemd: Mutex::new(None),
        }
    }

    /// The connection to systemd, made on first use: plan runs and phases that never touch a
    /// unit's lifecycle must work on hosts without a system bus. A failed connect is not kept,
    /// so the next call tries again.
    pub fn systemd(&self) -> Result<Arc<SystemdBus>, crate::caps::Error> {
        let mut slot = self.systemd.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(bus) = slot.as_ref() {
            return Ok(bus.clone());
        }
        let bus = Arc::new(SystemdBus::connect()?);
        *slot = Some(bus.clone());
        Ok(bus)
    }

    /// Records a change made (or planned) by `phase`.
    ///
    /// In apply mode every recorded change is a host mutation that already happened, which is
    /// where the crash tests cut: with [`ABORT_AFTER_MUTATION_ENV`]`=k` the process aborts (no
    /// unwinding, no cleanup, like a power cut) right after the k-th one.
    ///
    /// Bounded: the run keeps its first [`MAX_CHANGES`] changes and [`MAX_DIFF_BYTES`] of
    /// their diffs; later changes are counted ([`Session::changes_dropped`]), later diffs
    /// replaced by a one-line note. A phase decides how many changes it makes, not how much
    /// memory the agent spends on listing them.
    pub fn record(&self, phase: &str, mut kind: ChangeKind) {
        let mut log = self.changes.lock().unwrap_or_else(|p| p.into_inner());
        let what = kind.describe();
        log.total += 1;
        if log.kept.len() < MAX_CHANGES {
            if let ChangeKind::FileCreate { diff, .. } | ChangeKind::FileReplace { diff, .. } =
                &mut kind
                && let Some(text) = diff
            {
                if log.diff_bytes + text.len() > MAX_DIFF_BYTES {
                    *text =
                        format!("(diff withheld: the run's diffs passed {MAX_DIFF_BYTES} bytes)\n");
                }
                log.diff_bytes += text.len();
            }
            log.kept.push(Change {
                phase: phase.to_string(),
                kind,
            });
        } else if log.total == MAX_CHANGES + 1 {
            tracing::warn!(
                phase,
                "the run made more than {MAX_CHANGES} changes; further ones are counted, not listed"
            );
        }
        if self.mode == RunMode::Apply && self.abort_after_mutation == Some(log.total) {
            eprintln!(
                "nodeward: test hook {ABORT_AFTER_MUTATION_ENV}: aborting after host mutation {} ({phase}: {what})",
                log.total
            );
            std::process::abort();
        }
    }

    /// How many changes were made (or planned) beyond [`MAX_CHANGES`] and not listed.
    pub fn changes_dropped(&self) -> usize {
        let log = self.changes.lock().unwrap_or_else(|p| p.into_inner());
        log.total - log.kept.len()
    }

    /// Counts `bytes` more of planned file contents held by plan mode's overlay; `failed` once
    /// the run's planned contents pass [`MAX_PLANNED_BYTES`] (a plan holds what it would write
    /// in memory, so it needs a bound of its own).
    pub fn reserve_planned(&self, path: &HostPath, bytes: usize) -> Result<(), crate::caps::Error> {
        let mut log = self.changes.lock().unwrap_or_else(|p| p.into_inner());
        log.planned_bytes += bytes;
        if log.planned_bytes > MAX_PLANNED_BYTES {
            return Err(crate::caps::Error::Failed(format!(
                "{path}: this plan would hold more than {MAX_PLANNED_BYTES} bytes of planned \
                 file contents; plan fewer phases at once"
            )));
        }
        Ok(())
    }

    /// The download engine's configuration for this run.
    pub fn fetch_config(&self) -> FetchConfig {
        FetchConfig {
            cache_dir: self.artifact_cache.clone(),
            policy: self.fetch_policy.clone(),
        }
    }

    /// Every change so far, in order.
    pub fn changes(&self) -> Vec<Change> {
        let log = self.changes.lock().unwrap_or_else(|p| p.into_inner());
        log.kept.clone()
    }
}

/// What one phase run produced.
#[derive(Clone, Debug, Serialize)]
pub struct PhaseOutcome {
    /// Phase name.
    pub name: String,
    /// What the phase reported.
    #[serde(flatten)]
    pub report: PhaseReport,
    /// Wall time in milliseconds.
    pub duration_ms: u64,
}

/// Why a run stopped.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// `--phase` named a phase the bundle does not have.
    #[error("the bundle has no phase {0:?} (see `nodeward phases list`)")]
    UnknownPhase(String),
    /// A component could not be loaded.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// A phase failed.
    #[error(transparent)]
    Phase(#[from] PhaseError),
    /// A phase's input could not be encoded (a host bug: every field is plain data).
    #[error("phase {phase}: encoding its input: {message}")]
    Input {
        /// The phase.
        phase: String,
        /// What serde said.
        message: String,
    },
}

/// Runs the bundle's phases (all, or those named in `only`, in bundle order), each with the
/// parts of `input` its grants name and `input`'s pinned artifacts.
pub fn run(
    runtime: &Runtime,
    bundle: &Bundle,
    session: &Arc<Session>,
    input: &PhaseInput,
    only: &[String],
    limits: Limits,
    mut on_phase: impl FnMut(&PhaseOutcome),
) -> Result<Vec<PhaseOutcome>, RunError> {
    if let Some(unknown) = only.iter().find(|n| bundle.phase(n).is_none()) {
        return Err(RunError::UnknownPhase(unknown.clone()));
    }
    let selected: Vec<_> = bundle
        .manifest
        .phases
        .iter()
        .filter(|p| only.is_empty() || only.contains(&p.name))
        .collect();
    let mut loaded = Vec::new();
    for phase in &selected {
        let wasm = bundle.component(&phase.name).unwrap_or_default();
        loaded.push(runtime.load(&phase.name, &phase.world, wasm, &phase.sha256)?);
    }
    let mut outcomes = Vec::new();
    for (phase, loaded) in selected.iter().zip(&loaded) {
        let outcome = run_loaded(runtime, bundle, session, phase, loaded, input, limits)?;
        on_phase(&outcome);
        outcomes.push(outcome);
    }
    Ok(outcomes)
}

/// Runs one loaded phase with its grants, its part of `input`, the run's pinned artifacts,
/// the session and a fresh deadline. What the phase reports is redacted like everything else
/// the run prints.
fn run_loaded(
    runtime: &Runtime,
    bundle: &Bundle,
    session: &Arc<Session>,
    phase: &crate::bundle::PhaseEntry,
    loaded: &crate::runtime::LoadedPhase,
    input: &PhaseInput,
    limits: Limits,
) -> Result<PhaseOutcome, RunError> {
    let started = Instant::now();
    let ctx = PhaseCtx {
        phase: phase.name.clone(),
        bundle_digest: bundle.digest.clone(),
        grants: Arc::new(phase.grants.clone()),
        session: session.clone(),
        deadline: started + limits.deadline,
        budget: Default::default(),
        pinned_artifacts: Arc::new(PinnedArtifact::of(&input.artifacts)),
    };
    let input = phase_input_json(input, phase)?;
    tracing::info!(phase = %phase.name, mode = ?session.mode, "running phase");
    let mut report = runtime.run(loaded, ctx, &input, limits)?;
    report.summary = session.redactor.redact(&report.summary);
    for tag in &mut report.changed {
        *tag = session.redactor.redact(tag);
    }
    Ok(PhaseOutcome {
        name: phase.name.clone(),
        report,
        duration_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
    })
}

/// The default per-phase deadline.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(300);

/// Runs one phase of the bundle with its part of `input`: what the none-mode pipelines
/// (bootstrap, upgrade, reset) do step by step, each step with its own input and a fresh
/// deadline.
pub fn run_phase(
    runtime: &Runtime,
    bundle: &Bundle,
    session: &Arc<Session>,
    name: &str,
    input: &PhaseInput,
    limits: Limits,
) -> Result<PhaseOutcome, RunError> {
    let phase = bundle
        .phase(name)
        .ok_or_else(|| RunError::UnknownPhase(name.to_string()))?;
    let wasm = bundle.component(&phase.name).unwrap_or_default();
    let loaded = runtime.load(&phase.name, &phase.world, wasm, &phase.sha256)?;
    run_loaded(runtime, bundle, session, phase, &loaded, input, limits)
}

/// The JSON input `phase` receives: the parts of `input` its grants name, secrets as
/// references (see [`PhaseInput::restricted_to`]).
fn phase_input_json(
    input: &PhaseInput,
    phase: &crate::bundle::PhaseEntry,
) -> Result<String, RunError> {
    serde_json::to_string(&input.restricted_to(&phase.grants.input)).map_err(|e| RunError::Input {
        phase: phase.name.clone(),
        message: e.to_string(),
    })
}
