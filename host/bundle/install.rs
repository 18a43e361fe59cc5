//! Installing a verified bundle into the store, and rolling back to last-good: the policy of
//! `phases install` and `phases rollback`, callable by a long-running agent as well.
//!
//! # Expected flow (install)
//! 1. Take the store's lock; read the current bundle (an unusable one is an error).
//! 2. The bundle is already current: done, nothing changes.
//! 3. Its version must be higher than the current one's, unless downgrades are allowed; it
//!    must have every phase the node pipelines run ([`PIPELINE_PHASES`]), unless an
//!    incomplete bundle is allowed (a node it runs could not be bootstrapped, upgraded or
//!    reset).
//! 4. Compare its authority with what runs now (the current bundle, else the embedded one):
//!    wider capabilities or grants need the caller's consent ([`BundleDiff::widens`]).
//! 5. Precompile every component: this also refuses imports beyond a phase's world.
//! 6. Stage it in the store, write its intent (the time and the bundle it replaces:
//!    [`crate::bundle::intent`]), append it to the history and make it current (the previous
//!    entry is last-good), prune what no rollback can reach.
//! 7. The caller records the change (the CLI: the audit trail's `bundle` record), then
//!    [`Committed::recorded`] removes the intent and releases the lock.
//!
//! Steps 1–4 are [`prepare`], 5–6 [`PendingInstall::commit`], 7 [`Committed::recorded`], so a
//! caller can put off making a runtime until something is to be compiled; [`install`] does all
//! (and keeps no record).
//!
//! # Expected flow (rollback)
//! Take the lock, find the previous history entry (or the embedded bundle when there is none),
//! precompile it, make it current, `last-good` naming the entry before it
//! ([`prepare_rollback`], [`PendingRollback::commit`]; [`rollback`] does both). Repeated
//! rollbacks walk the history down to the embedded bundle.
//!
//! # Expected flow (uninstall)
//! Take the lock, remove `current` and `last-good`: the embedded bundle runs; the history
//! keeps its entries ([`uninstall`]).
//!
//! # Guarantees
//! - Nothing in the store changes before every component of the bundle that is to run has
//!   compiled ([`precompile`], shared by both).
//! - The store's own guarantees hold (see [`store`](super::store)): `current` always names a
//!   complete bundle, whatever the moment of a crash.

use crate::bundle::diff::{self, BundleDiff};
use crate::bundle::history::History;
use crate::bundle::intent::InstallIntent;
use crate::bundle::select::UnusableCurrent;
use crate::bundle::store::{self, Store, StoreLock};
use crate::bundle::{Bundle, BundleError, BundleFiles, BundleSource};
use crate::runtime::{LoadError, Runtime};
use std::path::PathBuf;

/// Why an install or a rollback did not happen. The store is as it was, except that a failure
/// while switching links leaves whichever complete bundle the store's guarantees allow.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    /// The store, or a bundle in it, cannot be read or written.
    #[error(transparent)]
    Store(#[from] BundleError),
    /// The installed current bundle does not load.
    #[error(transparent)]
    UnusableCurrent(#[from] UnusableCurrent),
    /// The bundle's version is not higher than the current one's.
    #[error(
        "{bundle}: version {version} is not higher than the current bundle's ({current}); pass --allow-downgrade to install it anyway"
    )]
    Downgrade {
        /// The bundle being installed.
        bundle: BundleSource,
        /// Its version.
        version: u64,
        /// The current bundle (`name vVERSION (sha256 DIGEST)`).
        current: String,
    },
    /// The bundle lacks phases the node pipelines run.
    #[error(
        "{bundle}: lacks phases the node pipelines need: {}; pass --allow-incomplete to install it anyway",
        missing_text(missing)
    )]
    Incomplete {
        /// The bundle being installed.
        bundle: BundleSource,
        /// Per pipeline, the phases it needs that the bundle lacks.
        missing: Vec<(&'static str, Vec<&'static str>)>,
    },
    /// A grant entry lies inside a path (or names a unit) reserved to the agent.
    #[error("{bundle}: phase {phase}: {entry}; no phase may be granted the agent's own files")]
    ReservedGrant {
        /// The bundle being installed.
        bundle: BundleSource,
        /// The phase whose grant it is.
        phase: String,
        /// The entry and why.
        entry: Box<crate::grants::InvalidGrant>,
    },
    /// The bundle may do more than what runs now, and that was not accepted.
    #[error(
        "{bundle}: its capabilities or grants are wider than the current bundle's (above); pass --accept-grants-digest {digest} (or --accept-new-grants) to install it"
    )]
    Widens {
        /// The bundle being installed.
        bundle: BundleSource,
        /// Its digest (the sha256 of its manifest): what consent by digest names.
        digest: String,
    },
    /// A component does not compile, or imports beyond its phase's world.
    #[error("{bundle}: {source}")]
    Precompile {
        /// The bundle.
        bundle: BundleSource,
        /// What the runtime said.
        source: LoadError,
    },
    /// The embedded bundle runs already: there is nothing to roll back to.
    #[error(
        "{}: the embedded bundle runs already; there is nothing to roll back to (`nodeward phases history` lists the installs)",
        store.display()
    )]
    NothingToRollBack {
        /// The store directory.
        store: PathBuf,
    },
    /// `phases rollforward` with no rollback or uninstall to undo since the last install.
    #[error(
        "{}: no rollback or uninstall since the last install; there is nothing to roll forward to (`nodeward phases history` lists the installs)",
        store.display()
    )]
    NothingToRollForward {
        /// The store directory.
        store: PathBuf,
    },
}

/// What kind of failure an [`InstallError`] is, for a caller that acts on it rather than
/// print it: `phases install` exits 4, 5 or 1 by it, and a daemon running that command tells
/// "fix the bundle" from "consent needed" from "try again" the same way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailureKind {
    /// The bundle was refused: its signature or key, a malformed manifest, archive or
    /// component, a digest, a downgrade or missing pipeline phases (without the flag that
    /// allows them), a component that does not compile or imports beyond its world. The same
    /// bytes with the same options fail again.
    Refused,
    /// Its authority is wider than what runs now, and that was not accepted.
    NotAccepted,
    /// Anything else: the store, the current bundle, the compiled cache, I/O.
    Other,
}

impl InstallError {
    /// Which [`FailureKind`] this is.
    pub fn kind(&self) -> FailureKind {
        match self {
            InstallError::Store(e) if e.refuses_bundle() => FailureKind::Refused,
            InstallError::Downgrade { .. }
            | InstallError::Incomplete { .. }
            | InstallError::ReservedGrant { .. } => FailureKind::Refused,
            InstallError::Precompile { source, .. } => match source {
                LoadError::Malformed { .. }
                | LoadError::ImportsExceedWorld { .. }
                | LoadError::UnknownWorld { .. }
                | LoadError::ExportType { .. }
                | LoadError::StringEncoding { .. }
                | LoadError::Link { .. } => FailureKind::Refused,
                LoadError::Cache { .. } => FailureKind::Other,
            },
            InstallError::Widens { .. } => FailureKind::NotAccepted,
            InstallError::Store(_)
            | InstallError::UnusableCurrent(_)
            | InstallError::NothingToRollBack { .. }
            | InstallError::NothingToRollForward { .. } => FailureKind::Other,
        }
    }
}

/// What an install may do besides installing a newer, complete bundle of no wider authority.
#[derive(Clone, Copy, Debug, Default)]
pub struct InstallOptions {
    /// Install a version lower than, or equal to, the current one's.
    pub allow_downgrade: bool,
    /// Install a bundle that lacks phases the node pipelines need (for single-phase use).
    pub allow_incomplete: bool,
}

/// The phases each node pipeline runs (`host/node/pipeline.rs`, `pipeline/upgrade.rs`; a
/// test keeps this list in step with them): an installed bundle without one of them makes
/// that operation fail on the node.
pub const PIPELINE_PHASES: &[(&str, &[&str])] = &[
    (
        "bootstrap",
        &[
            "preflight",
            "setup-host",
            "download-artifacts",
            "install",
            "configure",
            "start-node",
        ],
    ),
    (
        "upgrade",
        &[
            "setup-host",
            "download-artifacts",
            "stop-node",
            "install",
            "configure",
            "start-node",
        ],
    ),
    ("reset", &["teardown"]),
];

/// Per pipeline, the phases of [`PIPELINE_PHASES`] that `bundle` lacks (none: complete).
pub fn missing_phases(bundle: &Bundle) -> Vec<(&'static str, Vec<&'static str>)> {
    let has = |name: &str| bundle.manifest.phases.iter().any(|p| p.name == name);
    PIPELINE_PHASES
        .iter()
        .filter_map(|(pipeline, phases)| {
            let missing: Vec<&str> = phases.iter().copied().filter(|p| !has(p)).collect();
            (!missing.is_empty()).then_some((*pipeline, missing))
        })
        .collect()
}

fn missing_text(missing: &[(&str, Vec<&str>)]) -> String {
    missing
        .iter()
        .map(|(pipeline, phases)| format!("{pipeline} needs {}", phases.join(", ")))
        .collect::<Vec<_>>()
        .join("; ")
}

/// Compiles every component of `bundle` (or loads it from the compiled cache), refusing one
/// that does not compile or imports beyond its phase's world.
pub fn precompile(runtime: &Runtime, bundle: &Bundle) -> Result<(), InstallError> {
    for p in &bundle.manifest.phases {
        let wasm = bundle.verified_component(&p.name)?;
        runtime
            .load(&p.name, &p.world, wasm, &p.sha256)
            .map_err(|source| InstallError::Precompile {
                bundle: bundle.source.clone(),
                source,
            })?;
    }
    Ok(())
}

/// An install that passed every check and holds the store's lock; nothing has changed yet.
pub struct PendingInstall<'a> {
    store: &'a Store,
    _lock: StoreLock,
    bundle: &'a Bundle,
    files: &'a BundleFiles,
    widened: bool,
    unrecorded: Option<InstallIntent>,
}

/// An install that made its bundle current and holds the store's lock until the caller has
/// recorded it ([`Committed::recorded`]); dropped unrecorded, its intent stays, and the next
/// install finds the change unrecorded ([`crate::bundle::intent`]).
pub struct Committed<'a> {
    store: &'a Store,
    _lock: StoreLock,
    /// What the install did.
    pub installed: Installed,
}

impl Committed<'_> {
    /// The change is recorded (or the caller keeps no record): its intent is removed.
    pub fn recorded(self) -> Result<Installed, InstallError> {
        self.store.clear_intent()?;
        Ok(self.installed)
    }
}

/// The store's lock and an install that a killed run made and may not have recorded (its
/// intent names the current bundle): [`Prepared::AlreadyCurrent`] holds them until the caller
/// has recorded it ([`Unrecorded::recorded`]).
pub struct Unrecorded<'a> {
    store: &'a Store,
    _lock: StoreLock,
    /// The install, as its intent says.
    pub intent: InstallIntent,
}

impl Unrecorded<'_> {
    /// The change is recorded: the history is written with the install's time (a kill left
    /// it unwritten), then its intent is removed.
    pub fn recorded(self) -> Result<(), InstallError> {
        let history = self.store.history()?;
        self.store.write_history(&history)?;
        Ok(self.store.clear_intent()?)
    }
}

/// What [`prepare`] found.
pub enum Prepared<'a> {
    /// The bundle is the current one already; the lock is released, unless a killed install
    /// made it current and may not have recorded the change.
    AlreadyCurrent(Option<Unrecorded<'a>>),
    /// The bundle may be installed: [`PendingInstall::commit`].
    Ready(PendingInstall<'a>),
}

/// What an install did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InstallOutcome {
    /// The bundle was current already; nothing changed.
    AlreadyCurrent,
    /// The bundle is current now.
    Installed(Installed),
}

/// A bundle made current.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Installed {
    /// The digest `phases rollback` now returns to (`None`: the embedded bundle).
    pub last_good: Option<String>,
    /// Whether the bundle's authority is wider than what ran before (it was accepted).
    pub widened: bool,
}

/// Checks whether the verified `bundle` (read from `files`) may be installed into `store`
/// (steps 1–4 of the module docs). `accept_widening` is asked, with the diff, only when the
/// bundle's authority is wider than what runs now.
pub fn prepare<'a>(
    store: &'a Store,
    bundle: &'a Bundle,
    files: &'a BundleFiles,
    options: InstallOptions,
    accept_widening: impl FnOnce(&BundleDiff) -> bool,
) -> Result<Prepared<'a>, InstallError> {
    let lock = store.lock()?;
    let current = store.current().map_err(UnusableCurrent)?;
    let unrecorded = store.unrecorded_install()?;
    if current.as_ref().is_some_and(|c| c.digest == bundle.digest) {
        return Ok(Prepared::AlreadyCurrent(unrecorded.map(|intent| {
            Unrecorded {
                store,
                _lock: lock,
                intent,
            }
        })));
    }
    if let Some(c) = &current {
        let (old, new) = (c.manifest.bundle.version, bundle.manifest.bundle.version);
        if new <= old && !options.allow_downgrade {
            return Err(InstallError::Downgrade {
                bundle: files.source.clone(),
                version: new,
                current: c.id_text(),
            });
        }
    }
    for phase in &bundle.manifest.phases {
        if let Some(entry) = phase.grants.reserved_entries().into_iter().next() {
            return Err(InstallError::ReservedGrant {
                bundle: files.source.clone(),
                phase: phase.name.clone(),
                entry: Box::new(entry),
            });
        }
    }
    let missing = missing_phases(bundle);
    if !missing.is_empty() && !options.allow_incomplete {
        return Err(InstallError::Incomplete {
            bundle: files.source.clone(),
            missing,
        });
    }
    // Escalation is judged against what runs now: the installed bundle, else the embedded one.
    let baseline = match current {
        Some(c) => c,
        None => Bundle::embedded()?,
    };
    let d = diff::diff(&baseline, bundle)?;
    let widened = d.widens();
    if widened && !accept_widening(&d) {
        return Err(InstallError::Widens {
            bundle: files.source.clone(),
            digest: bundle.digest.clone(),
        });
    }
    Ok(Prepared::Ready(PendingInstall {
        store,
        _lock: lock,
        bundle,
        files,
        widened,
        unrecorded,
    }))
}

impl<'a> PendingInstall<'a> {
    /// Whether the bundle's authority is wider than what runs now (and was accepted).
    pub fn widened(&self) -> bool {
        self.widened
    }

    /// The install a killed run made current before this one, when it may be unrecorded (its
    /// intent names the current bundle): record it before committing, which replaces it.
    pub fn unrecorded(&self) -> Option<&InstallIntent> {
        self.unrecorded.as_ref()
    }

    /// Precompiles the bundle with `runtime`, stages it, writes its intent
    /// ([`crate::bundle::intent`]), makes it current and prunes the store (steps 5–6 of the
    /// module docs). The store stays locked until the caller has recorded the change
    /// ([`Committed::recorded`]).
    pub fn commit(self, runtime: &Runtime) -> Result<Committed<'a>, InstallError> {
        precompile(runtime, self.bundle)?;
        store::abort_point("install:after-precompile");
        self.store.stage(self.bundle, self.files)?;
        store::abort_point("install:after-stage");
        let mut history = self.store.history()?;
        let installed_at = now();
        self.store.write_intent(&InstallIntent {
            digest: self.bundle.digest.clone(),
            name: self.bundle.manifest.bundle.name.clone(),
            version: self.bundle.manifest.bundle.version,
            installed_at,
            from: self.store.link(store::CURRENT)?,
        })?;
        store::abort_point("install:after-intent");
        history.push(self.store.entry_of(&self.bundle.digest, installed_at));
        self.store.apply_history(&history)?;
        Ok(Committed {
            store: self.store,
            _lock: self._lock,
            installed: Installed {
                last_good: history.last_good().map(str::to_string),
                widened: self.widened,
            },
        })
    }
}

/// [`prepare`] then [`PendingInstall::commit`] with `runtime`.
pub fn install(
    store: &Store,
    runtime: &Runtime,
    bundle: &Bundle,
    files: &BundleFiles,
    options: InstallOptions,
    accept_widening: impl FnOnce(&BundleDiff) -> bool,
) -> Result<InstallOutcome, InstallError> {
    match prepare(store, bundle, files, options, accept_widening)? {
        Prepared::AlreadyCurrent(unrecorded) => {
            // This caller keeps no record.
            if let Some(u) = unrecorded {
                u.recorded()?;
            }
            Ok(InstallOutcome::AlreadyCurrent)
        }
        Prepared::Ready(pending) => Ok(InstallOutcome::Installed(
            pending.commit(runtime)?.recorded()?,
        )),
    }
}

/// Seconds since the Unix epoch, for the history (0 if the clock is before it).
fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Which way a [`PendingMove`] walks the store's history.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// `phases rollback`: to the previous install, down to the embedded bundle.
    Back,
    /// `phases rollforward`: to the install the last rollback or uninstall left.
    Forward,
}

/// A rollback or roll forward that found its target and holds the store's lock; nothing has
/// changed yet.
pub struct PendingMove<'a> {
    store: &'a Store,
    _lock: StoreLock,
    history: History,
    direction: Direction,
    target: Bundle,
    from: Option<String>,
}

/// What a rollback or roll forward did.
#[derive(Clone, Debug)]
pub struct Moved {
    /// The bundle current now.
    pub current: Bundle,
    /// The digest that was current before, if any (`None`: the embedded bundle).
    pub from: Option<String>,
}

/// Finds the bundle a move of `store` in `direction` goes to (a history entry, loaded and
/// digest-checked, or the embedded bundle) under the store's lock.
pub fn prepare_move(store: &Store, direction: Direction) -> Result<PendingMove<'_>, InstallError> {
    let lock = store.lock()?;
    let history = store.history()?;
    let target = match direction {
        Direction::Back => history.rollback_target(),
        Direction::Forward => history.roll_forward_target().map(Some),
    };
    let target = match target {
        None if direction == Direction::Back => {
            return Err(InstallError::NothingToRollBack {
                store: store.dir().to_path_buf(),
            });
        }
        None => {
            return Err(InstallError::NothingToRollForward {
                store: store.dir().to_path_buf(),
            });
        }
        Some(None) => Bundle::embedded()?,
        Some(Some(i)) => store.load(&history.entries[i].digest)?,
    };
    let from = history.current_entry().map(|e| e.digest.clone());
    Ok(PendingMove {
        store,
        _lock: lock,
        history,
        direction,
        target,
        from,
    })
}

impl PendingMove<'_> {
    /// The bundle the move makes current.
    pub fn target(&self) -> &Bundle {
        &self.target
    }

    /// Precompiles the target (it is about to run: its components must compile and stay in
    /// their worlds), makes it current and records the move in the history.
    pub fn commit(mut self, runtime: &Runtime) -> Result<Moved, InstallError> {
        precompile(runtime, &self.target)?;
        match self.direction {
            Direction::Back => {
                self.history.roll_back();
            }
            Direction::Forward => {
                self.history.roll_forward();
            }
        }
        self.store.apply_history(&self.history)?;
        // Whatever install was under way is history now.
        self.store.clear_intent()?;
        Ok(Moved {
            current: self.target,
            from: self.from,
        })
    }
}

/// [`prepare_move`] back, then [`PendingMove::commit`] with `runtime`.
pub fn rollback(store: &Store, runtime: &Runtime) -> Result<Moved, InstallError> {
    prepare_move(store, Direction::Back)?.commit(runtime)
}

/// Makes the embedded bundle current again (its history kept); returns the digest that was
/// current, `None` if the embedded bundle ran already. Nothing is compiled: the embedded
/// bundle is part of the binary.
pub fn uninstall(store: &Store) -> Result<Option<String>, InstallError> {
    let _lock = store.lock()?;
    let mut history = store.history()?;
    let from = history.current_entry().map(|e| e.digest.clone());
    if from.is_some() {
        history.uninstall();
        store.apply_history(&history)?;
        store.clear_intent()?;
    }
    Ok(from)
}

#[cfg(test)]
mod tests;
