//! One plan or apply run (a session): a bundle's phases, in order, against a host root.
//!
//! # Expected flow
//! 1. Every selected phase is loaded first (digest already verified by [`Bundle`], compiled or
//!    taken from the cache, imports checked against its world), so a bad component stops the
//!    run before any phase's code runs.
//! 2. Each phase runs with its own input (the parts of the run's [`PhaseInput`] its grants
//!    name, secrets as references: [`PhaseInput::restricted_to`]), its grants, the run's pinned
//!    artifacts, the run's shared [`RunContext`] and a fresh deadline. Right before a phase
//!    granted the `bootstrap-kubeconfig` input part, the host renders that file from the run's
//!    config ([`crate::bootstrap_kubeconfig`]) and the phase gets its path; when the file
//!    changed, the phase's report names its restart group.
//! 3. The first failing phase stops the run; the changes made so far stay in the run's
//!    change log ([`RunContext::changes`]), and the progress callback sees the failed phase
//!    as a [`Step`] with its error, so a report of a failed run still lists what ran.
//!
//! # Guarantees
//! Plan and apply run exactly the same code; only [`RunMode`] differs, and only the
//! capabilities look at it.

use crate::audit::entry::{BundleRef, Event, Outcome};
use crate::audit::trail::PhaseRef;
use crate::bootstrap_kubeconfig;
use crate::bundle::Bundle;
use crate::caps::download::PinnedArtifact;
use crate::caps::{PhaseCtx, RunContext};
use crate::runtime::{Limits, LoadError, PhaseError, PhaseReport, Runtime};
use nodeward_node_config::input::PhaseInput;
use serde::Serialize;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What one phase run produced.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PhaseOutcome {
    /// Phase name.
    pub name: String,
    /// What the phase reported.
    #[serde(flatten)]
    pub report: PhaseReport,
    /// Wall time in milliseconds.
    pub duration_ms: u64,
    /// Of which inside host capability calls, milliseconds.
    pub capability_ms: u64,
}

/// One step of a run as reports and progress output show it: a phase, or (in the none-mode
/// pipelines) a host step such as `wait-healthy`. A step that failed carries its error, so a
/// failed run's report still lists every step that ran (`docs/schemas/run.schema.json`).
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Step {
    /// The phase or host step name.
    pub name: String,
    /// What it did (`failed` when it failed).
    pub summary: String,
    /// Wall time, milliseconds.
    pub duration_ms: u64,
    /// Of which inside host capability calls (phases only), milliseconds.
    pub capability_ms: u64,
    /// Whether the step is a WebAssembly phase (else host code: state, waits).
    pub phase: bool,
    /// What the phase reported changing that later phases care about (restart tags).
    pub changed: Vec<String>,
    /// Why the step failed; `None` for a step that finished.
    pub error: Option<String>,
}

impl Step {
    /// The step of a phase that finished.
    pub fn of(outcome: &PhaseOutcome) -> Step {
        Step {
            name: outcome.name.clone(),
            summary: outcome.report.summary.clone(),
            duration_ms: outcome.duration_ms,
            capability_ms: outcome.capability_ms,
            phase: true,
            changed: outcome.report.changed.clone(),
            error: None,
        }
    }
}

/// Times one step: wall time, and the time spent in the run's capability calls meanwhile
/// (counted over every call, kept in the audit's memory or not).
#[derive(Clone, Copy, Debug)]
pub struct StepClock {
    started: Instant,
    audit_us: u64,
}

impl StepClock {
    /// Starts timing a step of `run`.
    pub fn start(run: &RunContext) -> Self {
        StepClock {
            started: Instant::now(),
            audit_us: run.audit.total_duration_us(),
        }
    }

    /// Wall milliseconds since [`StepClock::start`].
    pub fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Milliseconds spent in `run`'s capability calls since [`StepClock::start`].
    pub fn capability_ms(&self, run: &RunContext) -> u64 {
        run.audit.total_duration_us().saturating_sub(self.audit_us) / 1000
    }

    /// The step `name` (a phase when `phase`), failed with `error` (redacted by `run`).
    pub fn failed(
        &self,
        run: &RunContext,
        name: &str,
        phase: bool,
        error: &dyn std::fmt::Display,
    ) -> Step {
        Step {
            name: name.to_string(),
            summary: "failed".to_string(),
            duration_ms: self.elapsed_ms(),
            capability_ms: self.capability_ms(run),
            phase,
            changed: Vec::new(),
            error: Some(run.redactor.redact(&error.to_string())),
        }
    }
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
    #[error("phase {phase}: encoding its input")]
    Input {
        /// The phase.
        phase: String,
        /// What serde said.
        #[source]
        source: serde_json::Error,
    },
    /// The bundle lists a phase without its component (a verified bundle always has it).
    #[error("phase {0}: the bundle has no component for it")]
    MissingComponent(String),
    /// The bootstrap kubeconfig a phase's input names could not be rendered or written; the
    /// phase did not run.
    #[error("phase {phase}: rendering the bootstrap kubeconfig for it: {source}")]
    BootstrapKubeconfig {
        /// The phase that was to run.
        phase: String,
        /// Why.
        #[source]
        source: crate::bootstrap_kubeconfig::Error,
    },
    /// An apply's audit trail could not be written: the run stops (it fails closed).
    #[error("phase {phase}: {reason}")]
    Audit {
        /// The phase during which it failed.
        phase: String,
        /// The trail's error.
        reason: String,
    },
}

/// What the audit trail's phase-end record counts: the run's counters when the phase started.
struct PhaseAudit {
    calls: u64,
    denied: u64,
    changes: usize,
}

impl PhaseAudit {
    /// Tells the run's trail (if any) which phase, bundle and component the next calls are
    /// of, and notes the counters.
    fn start(run: &RunContext, bundle: &Bundle, phase: &crate::bundle::PhaseEntry) -> Self {
        if let Some(trail) = run.trail() {
            trail.enter_phase(Some(PhaseRef {
                phase: phase.name.clone(),
                bundle: BundleRef {
                    name: bundle.manifest.bundle.name.clone(),
                    version: bundle.manifest.bundle.version,
                    digest: bundle.digest.clone(),
                },
                component: phase.sha256.clone(),
            }));
        }
        PhaseAudit {
            calls: run.audit.total(),
            denied: run.audit.denied(),
            changes: run.changes.total(),
        }
    }

    /// Writes the phase-end record (durably) and the phase's one summary line on stderr.
    fn end(self, run: &RunContext, phase: &str, duration_ms: u64, error: Option<&PhaseError>) {
        let calls = run.audit.total().saturating_sub(self.calls);
        let denied = run.audit.denied().saturating_sub(self.denied);
        let changes = run.changes.kinds_since(self.changes);
        let changed: u64 = changes.values().sum();
        let changes = crate::audit::entry::kind_counts(&changes);
        tracing::info!(
            target: "nodeward::audit",
            phase, calls, denied, changes = changed,
            "phase {phase}: {calls} call(s) audited, {denied} denied, {changed} change(s)"
        );
        let Some(trail) = run.trail() else { return };
        trail.phase_end(Event::PhaseEnd {
            mode: trail.mode(),
            phase: phase.to_string(),
            bundle: None,
            outcome: if error.is_some() {
                Outcome::Failed
            } else {
                Outcome::Ok
            },
            error: error.map(|e| run.redactor.redact(&e.to_string())),
            calls,
            denied,
            changes,
            duration_ms,
        });
    }
}

/// Runs the bundle's phases (all, or those named in `only`, in bundle order), each with the
/// parts of `input` its grants name and `input`'s pinned artifacts. `on_step` sees each phase
/// as it ends, the failed one included (with its error).
pub fn run(
    runtime: &Runtime,
    bundle: &Bundle,
    run: &Arc<RunContext>,
    input: &PhaseInput,
    only: &[String],
    limits: Limits,
    mut on_step: impl FnMut(&Step),
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
        let wasm = bundle
            .component(&phase.name)
            .ok_or_else(|| RunError::MissingComponent(phase.name.clone()))?;
        loaded.push(runtime.load(&phase.name, &phase.world, wasm, &phase.sha256)?);
    }
    let mut outcomes = Vec::new();
    for (phase, loaded) in selected.iter().zip(&loaded) {
        let clock = StepClock::start(run);
        match run_loaded(runtime, bundle, run, phase, loaded, input, limits) {
            Ok(outcome) => {
                on_step(&Step::of(&outcome));
                outcomes.push(outcome);
            }
            Err(e) => {
                on_step(&clock.failed(run, &phase.name, true, &e));
                return Err(e);
            }
        }
    }
    Ok(outcomes)
}

/// Runs one loaded phase with its grants, its part of `input`, the run's pinned artifacts
/// and node bridge (what `download.pinned-artifacts` and `network.node-bridge` admit),
/// the run's context and a fresh deadline. What the phase reports is redacted like everything else
/// the run prints.
fn run_loaded(
    runtime: &Runtime,
    bundle: &Bundle,
    run: &Arc<RunContext>,
    phase: &crate::bundle::PhaseEntry,
    loaded: &crate::runtime::LoadedPhase,
    input: &PhaseInput,
    limits: Limits,
) -> Result<PhaseOutcome, RunError> {
    let clock = StepClock::start(run);
    // The host's own file, written before the phase that is told its path (and before the
    // phase's deadline starts).
    let rendered = if bootstrap_kubeconfig::needed_by(&phase.grants) {
        Some(
            bootstrap_kubeconfig::write_for(run, input).map_err(|source| {
                RunError::BootstrapKubeconfig {
                    phase: phase.name.clone(),
                    source,
                }
            })?,
        )
    } else {
        None
    };
    let input = rendered.as_ref().map_or(input, |(with_path, _)| with_path);
    let started = Instant::now();
    let ctx = PhaseCtx {
        phase: phase.name.clone(),
        bundle_digest: bundle.digest.clone(),
        grants: Arc::new(phase.grants.clone()),
        run: run.clone(),
        deadline: started + limits.deadline,
        budget: Default::default(),
        pinned_artifacts: Arc::new(PinnedArtifact::of(&input.artifacts)),
        node_bridge: (!input.bridge.is_empty()).then(|| input.bridge.clone()),
    };
    let input = phase_input_json(input, phase)?;
    tracing::info!(phase = %phase.name, mode = %run.mode(), "running phase");
    let audit = PhaseAudit::start(run, bundle, phase);
    let result = runtime.run(loaded, ctx, &input, limits);
    audit.end(run, &phase.name, clock.elapsed_ms(), result.as_ref().err());
    if let Some(refused) = run.audit_refusal() {
        return Err(RunError::Audit {
            phase: phase.name.clone(),
            reason: refused.to_string(),
        });
    }
    let mut report = result?;
    report.summary = run.redactor.redact(&report.summary);
    for tag in &mut report.changed {
        *tag = run.redactor.redact(tag);
    }
    let group = bootstrap_kubeconfig::RESTART_GROUP;
    if rendered
        .as_ref()
        .is_some_and(|(_, o)| !matches!(o, crate::wit::Outcome::Unchanged))
        && !report.changed.iter().any(|g| g == group)
    {
        report.changed.push(group.to_string());
    }
    Ok(PhaseOutcome {
        name: phase.name.clone(),
        report,
        duration_ms: clock.elapsed_ms(),
        capability_ms: clock.capability_ms(run),
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
    run: &Arc<RunContext>,
    name: &str,
    input: &PhaseInput,
    limits: Limits,
) -> Result<PhaseOutcome, RunError> {
    let phase = bundle
        .phase(name)
        .ok_or_else(|| RunError::UnknownPhase(name.to_string()))?;
    let wasm = bundle
        .component(&phase.name)
        .ok_or_else(|| RunError::MissingComponent(phase.name.clone()))?;
    let loaded = runtime.load(&phase.name, &phase.world, wasm, &phase.sha256)?;
    run_loaded(runtime, bundle, run, phase, &loaded, input, limits)
}

/// The JSON input `phase` receives: the parts of `input` its grants name, secrets as
/// references (see [`PhaseInput::restricted_to`]).
fn phase_input_json(
    input: &PhaseInput,
    phase: &crate::bundle::PhaseEntry,
) -> Result<String, RunError> {
    serde_json::to_string(&input.restricted_to(&phase.grants.input)).map_err(|source| {
        RunError::Input {
            phase: phase.name.clone(),
            source,
        }
    })
}
