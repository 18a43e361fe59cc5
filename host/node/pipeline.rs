//! The none-mode operations, each a sequence of phases around the host's own durable record:
//! [`Node::bootstrap`], [`Node::upgrade`], [`Node::recover`] and [`Node::reset`].
//!
//! # Bootstrap
//! preflight-checks (host, read-only: [`crate::preflight`]) → preflight → (install record
//! written, under the lock) → setup-host → download-artifacts →
//! install → configure → start-node → wait-healthy → persist the applied config → evict from
//! the artifact cache what neither this nor the previous version needs. The record's
//! checkpoint advances after each step, so a failed or killed run resumes where it stopped; every
//! phase is idempotent, so re-running the step that was cut short is safe.
//!
//! # Upgrade (journaled)
//! When there is something to change: the preflight checks, then provision the new version while the old stack runs (setup-host, download-artifacts), write
//! the journal, stop the stack, switch the link, configure, start, wait; then persist the
//! applied config, record the version it ran before (its artifacts stay cached), prune old
//! versions, drop the journal and evict from the artifact cache. A failure rolls back at once; a
//! crash is finished or rolled back by [`Node::recover`] at the start of the next run.
//!
//! Each operation takes the node lock and sweeps what a killed run left ([`sweep`]) before it
//! writes anything.
//!
//! What each operation does given the host's state (install record, journal, applied config,
//! `current` link, `--force`) is decided in [`decide`]; this module reads those facts under
//! the lock, asks, and runs the phases.
//!
//! # Guarantees
//! - Nothing is changed before the preflight checks and phase pass and every artifact is
//!   pinned.
//! - Unchanged inputs change nothing: a second bootstrap records no change.
//! - Every host change, the host's own state files included, goes through the run's context, so the
//!   audit log and the crash tests see each one.

use crate::bundle::Bundle;
use crate::caps::RunContext;
use crate::node::decide::{self, Refusal};
use crate::node::health::{self, NodeReady, WaitError};
use crate::node::state::{
    Checkpoint, InstallRecord, Journal, NodeLock, NodeState, SCHEMA, StateError,
};
use crate::node::sweep::{self, StartError, SweepError};

use crate::node::version::{self, FingerprintError};
use crate::runtime::{Limits, Runtime};
pub use crate::session::Step;
use crate::session::{self, PhaseOutcome, RunError, StepClock};
use nodeward_node_config::NodeConfig;
use nodeward_node_config::input::PhaseInput;
use nodeward_node_config::layout::{CONTAINERD_ROOT, CONTAINERD_STATE, KUBELET_DIR, Layout};
use serde::Serialize;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub mod restart;
mod upgrade;

use crate::node::input;

/// How long each health wait may take.
#[derive(Clone, Copy, Debug)]
pub struct Waits {
    /// The kubelet's health endpoint.
    pub kubelet: Duration,
    /// The kubelet's TLS bootstrap.
    pub tls_bootstrap: Duration,
    /// The Node Ready.
    pub node_ready: Duration,
}

impl Default for Waits {
    fn default() -> Self {
        Waits {
            kubelet: Duration::from_secs(60),
            tls_bootstrap: Duration::from_secs(120),
            node_ready: Duration::from_secs(180),
        }
    }
}

impl Waits {
    /// Every wait at most `d`.
    pub fn all(d: Duration) -> Self {
        Waits {
            kubelet: d,
            tls_bootstrap: d,
            node_ready: d,
        }
    }
}

/// Why an operation stopped.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The host or the request is not one this operation may act on (see [`decide`]).
    #[error("refused: {0}")]
    Refused(#[from] Refusal),
    /// A preflight check failed and was not ignored ([`crate::preflight`]); nothing changed.
    #[error(transparent)]
    Preflight(#[from] crate::preflight::Refused),
    /// A node state file.
    #[error(transparent)]
    State(#[from] StateError),
    /// What a killed run left could not be removed.
    #[error(transparent)]
    Sweep(#[from] SweepError),
    /// A configuration could not be fingerprinted.
    #[error(transparent)]
    Fingerprint(#[from] FingerprintError),
    /// A phase failed or was refused.
    #[error("step {step}: {source}")]
    Phase {
        /// The step.
        step: String,
        /// The failure.
        source: RunError,
    },
    /// A health wait did not finish.
    #[error("step wait-healthy: {0}")]
    Wait(#[from] WaitError),
    /// `restart` was asked to run again a phase it does not run again
    /// ([`restart::RERUNNABLE`]); nothing ran.
    #[error(
        "phase {0} cannot be run again before a restart (only setup-host, download-artifacts, install, configure)"
    )]
    NotRerunnable(String),
    /// An upgrade failed and was rolled back.
    #[error("upgrade to {to} failed ({cause}); rolled back to {from}")]
    RolledBack {
        /// The version the upgrade tried.
        to: String,
        /// The version running again.
        from: String,
        /// What failed.
        cause: Box<NodeError>,
    },
}

/// What an operation did.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// The operation (`bootstrap`, `upgrade`, `reset`, `recover`); a planned bootstrap is a
    /// `bootstrap` too (the run mode says it was planned).
    pub operation: String,
    /// The active version directory afterwards.
    pub version: Option<String>,
    /// The steps, in order.
    pub steps: Vec<Step>,
    /// What the Node looked like once Ready.
    pub kubelet_version: Option<String>,
    /// What a recovery at the start did, if anything.
    pub recovered: Option<String>,
    /// Host mutations made.
    pub mutations: usize,
}

/// A none node beneath one host root, with the runtime and bundle that change it.
pub struct Node<'a> {
    /// The runtime.
    pub runtime: &'a Runtime,
    /// The phase bundle.
    pub bundle: &'a Bundle,
    /// The run's session (plan or apply).
    pub session: Arc<RunContext>,
    /// The root and unit directory.
    pub layout: Layout,
    /// Per-phase limits.
    pub limits: Limits,
    /// Health wait deadlines.
    pub waits: Waits,
    /// Called after each step (progress output).
    pub on_step: Box<dyn FnMut(&Step) + 'a>,
    /// The preflight failures `--ignore-preflight-errors` lets through (none by default: every
    /// bootstrap and upgrade runs the checks).
    pub ignore_preflight: crate::preflight::Ignore,
    steps: Vec<Step>,
}

impl<'a> Node<'a> {
    /// A node operation context.
    pub fn new(
        runtime: &'a Runtime,
        bundle: &'a Bundle,
        session: Arc<RunContext>,
        layout: Layout,
        limits: Limits,
        waits: Waits,
    ) -> Self {
        Node {
            runtime,
            bundle,
            session,
            layout,
            limits,
            waits,
            on_step: Box::new(|_| {}),
            ignore_preflight: crate::preflight::Ignore::none(),
            steps: Vec::new(),
        }
    }

    fn root(&self) -> PathBuf {
        PathBuf::from(&self.layout.root)
    }

    fn state(&self) -> NodeState {
        NodeState::new(&self.root())
    }

    /// Takes the node lock, then removes what a killed run left ([`sweep::sweep`]) before
    /// this one writes anything.
    fn lock(&self) -> Result<NodeLock, NodeError> {
        sweep::lock(&self.session, self.runtime).map_err(|e| match e {
            StartError::Lock(e) => NodeError::State(e),
            StartError::Sweep(e) => NodeError::Sweep(e),
        })
    }

    /// The phase input for `config` on the version directory `version` (its artifacts are
    /// derived from the config).
    fn input(&self, config: &NodeConfig, version: &str) -> PhaseInput {
        input::phase_input(config, &self.layout, version)
    }

    fn push(&mut self, step: Step) {
        (self.on_step)(&step);
        self.steps.push(step);
    }

    /// Runs one phase as a step; a failed phase is listed as a failed step.
    fn phase(&mut self, name: &str, input: &PhaseInput) -> Result<PhaseOutcome, NodeError> {
        let clock = StepClock::start(&self.session);
        match session::run_phase(
            self.runtime,
            self.bundle,
            &self.session,
            name,
            input,
            self.limits,
        ) {
            Ok(out) => {
                self.push(Step::of(&out));
                Ok(out)
            }
            Err(source) => {
                let step = clock.failed(&self.session, name, true, &source);
                self.push(step);
                Err(NodeError::Phase {
                    step: name.to_string(),
                    source,
                })
            }
        }
    }

    /// Runs a host step (not a phase) and records its time; a failed one is listed as a
    /// failed step.
    fn host_step<T>(
        &mut self,
        name: &str,
        f: impl FnOnce(&mut Self) -> Result<(T, String), NodeError>,
    ) -> Result<T, NodeError> {
        let clock = StepClock::start(&self.session);
        let (v, summary) = match f(self) {
            Ok(done) => done,
            Err(e) => {
                let step = clock.failed(&self.session, name, false, &e);
                self.push(step);
                return Err(e);
            }
        };
        self.push(Step {
            name: name.to_string(),
            summary,
            duration_ms: clock.elapsed_ms(),
            capability_ms: 0,
            phase: false,
            changed: Vec::new(),
            error: None,
        });
        Ok(v)
    }

    /// The steps run since the last report, failed ones included: what a failed operation
    /// did before it stopped (a successful one returns them in its [`Report`]).
    pub fn take_steps(&mut self) -> Vec<Step> {
        std::mem::take(&mut self.steps)
    }

    fn report(&mut self, operation: &str, version: Option<String>) -> Report {
        Report {
            operation: operation.to_string(),
            version,
            steps: std::mem::take(&mut self.steps),
            kubelet_version: None,
            recovered: None,
            mutations: self.session.changes().len(),
        }
    }

    /// The version the `current` link points at.
    pub fn current_version(&self) -> Option<String> {
        self.state().active_version()
    }

    /// Waits for the kubelet, its TLS bootstrap and Node Ready. `restarted`: when this run
    /// (re)started the kubelet, so a Ready left over from the previous kubelet (with its
    /// version) must not count (see [`health::wait_node_ready`]).
    fn wait_healthy(
        &mut self,
        config: &NodeConfig,
        restarted: Option<std::time::SystemTime>,
    ) -> Result<NodeReady, NodeError> {
        let waits = self.waits;
        let layout = self.layout.clone();
        self.host_step("wait-healthy", |_| {
            let t = Instant::now();
            health::wait_kubelet(config, waits.kubelet)?;
            let kubelet_ms = t.elapsed().as_millis();
            let kubeconfig = health::wait_tls_bootstrap(config, &layout, waits.tls_bootstrap)?;
            let tls_ms = t.elapsed().as_millis();
            let ready =
                health::wait_node_ready(config, &kubeconfig, waits.node_ready, restarted)?;
            let summary = format!(
                "kubelet healthy after {kubelet_ms} ms, TLS bootstrap done after {tls_ms} ms, Node {} Ready after {} ms (kubelet {})",
                config.machine_name,
                t.elapsed().as_millis(),
                ready.kubelet_version
            );
            Ok((ready, summary))
        })
    }

    /// The host step `preflight-checks`: every check of [`crate::preflight`] against the
    /// run's root and `config`; a failure not ignored stops the operation before it changes
    /// anything, naming each failed check. Warnings and ignored failures are logged.
    fn preflight_checks(&mut self, config: &NodeConfig) -> Result<(), NodeError> {
        let ignore = self.ignore_preflight.clone();
        let session = self.session.clone();
        self.host_step("preflight-checks", |_| {
            let report = crate::node::preflight::check(&session, config, &ignore);
            for c in &report.checks {
                match c.status {
                    crate::preflight::Status::Warning => {
                        tracing::warn!(check = %c.name, "preflight: {}", c.message)
                    }
                    crate::preflight::Status::Fail if c.ignored => {
                        tracing::warn!(check = %c.name, "preflight (ignored): {}", c.message)
                    }
                    _ => {}
                }
            }
            let summary = report.summary();
            report.into_result()?;
            Ok(((), summary))
        })
    }

    /// Plans a bootstrap: the same phases in plan mode, no state written, no wait.
    pub fn plan_bootstrap(&mut self, config: &NodeConfig) -> Result<Report, NodeError> {
        let version = input::version_of(config);
        let input = self.input(config, &version);
        for name in [
            "preflight",
            "setup-host",
            "download-artifacts",
            "install",
            "configure",
            "start-node",
        ] {
            self.phase(name, &input)?;
        }
        Ok(self.report("bootstrap", Some(version)))
    }

    /// Bootstraps (or repairs) the node for `config`; see the module docs.
    pub fn bootstrap(
        &mut self,
        config: &NodeConfig,
        config_source: &str,
        force: bool,
    ) -> Result<Report, NodeError> {
        let fingerprint = version::fingerprint(config)?;
        let arch = version::arch();
        let artifacts = version::artifacts(config, arch);
        version::require_pinned(&artifacts, config_source).map_err(Refusal::from)?;
        let version = version::version_name(config, arch, &artifacts);
        let _lock = self.lock()?;
        let recovered = self.recover_locked()?;
        let state = self.state();

        let record = state.record()?;
        let action = decide::bootstrap(record.as_ref(), &config.machine_name, &fingerprint, force)?;
        let Some(steps) = action.steps() else {
            // --force on a finished node: changing its configuration is an upgrade.
            drop(_lock);
            return self.upgrade(config, config_source);
        };
        if let decide::Bootstrap::Resume(at) = action {
            tracing::info!(
                checkpoint = at.name(),
                "resuming bootstrap at its checkpoint"
            );
        }
        let start = steps.start;

        self.preflight_checks(config)?;
        let input = self.input(config, &version);
        self.phase("preflight", &input)?;

        let mut rec = InstallRecord {
            schema: SCHEMA,
            machine_name: config.machine_name.clone(),
            config_fingerprint: fingerprint.clone(),
            version: version.clone(),
            checkpoint: steps.record,
        };
        // A finished node being repaired keeps its record at `complete`; anything else has its
        // record (and checkpoint) durable before the first change.
        let repairing = rec.checkpoint == Checkpoint::Complete;
        if record.as_ref() != Some(&rec) {
            state.write_record(&self.session, &rec)?;
        }
        let mut advance = |node: &mut Self, to: Checkpoint| -> Result<(), NodeError> {
            if !repairing && rec.checkpoint < to {
                rec.checkpoint = to;
                node.state().write_record(&node.session, &rec)?;
            }
            Ok(())
        };

        let mut restart: Vec<String> = Vec::new();
        if start <= Checkpoint::SetupHost {
            self.phase("setup-host", &input)?;
            advance(self, Checkpoint::DownloadArtifacts)?;
        }
        if start <= Checkpoint::DownloadArtifacts {
            self.phase("download-artifacts", &input)?;
            advance(self, Checkpoint::Install)?;
        }
        if start <= Checkpoint::Install {
            restart.extend(self.phase("install", &input)?.report.changed);
            advance(self, Checkpoint::Configure)?;
        }
        if start <= Checkpoint::Configure {
            restart.extend(self.phase("configure", &input)?.report.changed);
            advance(self, Checkpoint::StartNode)?;
        }
        if start <= Checkpoint::StartNode {
            let input = PhaseInput {
                restart,
                ..input.clone()
            };
            self.phase("start-node", &input)?;
            advance(self, Checkpoint::WaitHealthy)?;
        }
        let mut ready = None;
        if start <= Checkpoint::WaitHealthy {
            ready = Some(self.wait_healthy(config, None)?);
            advance(self, Checkpoint::Persist)?;
        }
        self.persist(config)?;
        advance(self, Checkpoint::Complete)?;
        self.evict_cache(config)?;

        let mut report = self.report("bootstrap", Some(version));
        report.kubelet_version = ready.map(|r| r.kubelet_version);
        report.recovered = recovered;
        report.mutations = self.session.changes().len();
        Ok(report)
    }

    /// The last step of a successful bootstrap or upgrade: evicts from the artifact cache
    /// what neither the current nor the previous version needs ([`crate::node::cache`]).
    /// Never fails the operation.
    fn evict_cache(&mut self, config: &NodeConfig) -> Result<(), NodeError> {
        let session = self.session.clone();
        let state = self.state();
        self.host_step("evict-cache", |_| {
            Ok(((), crate::node::cache::evict_for(&session, &state, config)))
        })
    }

    /// Persists the applied config unless it is already the one on disk.
    fn persist(&mut self, config: &NodeConfig) -> Result<(), NodeError> {
        let state = self.state();
        let session = self.session.clone();
        self.host_step("persist", |_| {
            let fp = version::fingerprint(config)?;
            // An unreadable applied config is rewritten, as a missing one is written.
            let on_disk = state
                .applied()
                .ok()
                .flatten()
                .map(|c| version::fingerprint(&c))
                .transpose()?;
            if !decide::persist_needed(on_disk.as_deref(), &fp) {
                return Ok(((), "applied config unchanged".to_string()));
            }
            let digest = state.write_applied(&session, config)?;
            Ok((
                (),
                format!("applied config written (sha256 {})", &digest[..12]),
            ))
        })
    }

    /// Removes the node: the teardown phase, then the node state files (record last). Works
    /// on a half-bootstrapped host; a second reset changes nothing. The pods' bridge is
    /// deleted only when the node has an applied config, and is the one that config names.
    pub fn reset(&mut self, fallback: &NodeConfig) -> Result<Report, NodeError> {
        let _lock = self.lock()?;
        let state = self.state();
        // Unreadable state files do not stop a reset: it removes them.
        let applied = state.applied().ok().flatten();
        let journal = match applied {
            Some(_) => None,
            None => state.journal().ok().flatten(),
        };
        let config = decide::reset_config(applied.as_ref(), journal.as_ref(), fallback);
        let mut input = self.input(config, "");
        // What pods and containers left mounted: volumes below the kubelet's directory,
        // container root filesystems below containerd's state and root. Deepest first.
        let mut mounts: Vec<String> = [KUBELET_DIR, CONTAINERD_STATE, CONTAINERD_ROOT]
            .iter()
            .flat_map(|d| mounts_below(&self.root(), d))
            .collect();
        mounts.sort_by_key(|m| std::cmp::Reverse(m.matches('/').count()));
        mounts.dedup();
        input.mounts = mounts;
        // The bridge a reset deletes: only ever the one the node's own applied config names,
        // never one of a config given now (which may name any link) or a fallback.
        input.bridge = applied
            .as_ref()
            .map(|c| c.network.bridge_name.clone())
            .unwrap_or_default();
        self.phase("teardown", &input)?;
        let session = self.session.clone();
        self.host_step("forget", |_| {
            state.remove_all(&session)?;
            Ok(((), "node state removed".to_string()))
        })?;
        let report = self.report("reset", None);
        Ok(report)
    }
}

/// Mount points at or below `<root>/<rel>` in this mount namespace, root-relative, deepest
/// first (the order they must be unmounted in).
pub fn mounts_below(root: &std::path::Path, rel: &str) -> Vec<String> {
    let base = root.join(rel);
    let base = base.to_string_lossy().trim_end_matches('/').to_string();
    let root_s = root.to_string_lossy().trim_end_matches('/').to_string();
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut out: Vec<String> = text
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(crate::caps::mount_sys::unescape_mountinfo)
        .filter(|m| m == &base || m.starts_with(&format!("{base}/")))
        .filter_map(|m| {
            m.strip_prefix(&root_s)
                .map(|r| r.trim_start_matches('/').to_string())
        })
        .collect();
    out.sort_by_key(|m| std::cmp::Reverse(m.matches('/').count()));
    out.dedup();
    out
}
