//! Installing a verified bundle into the store, and rolling back to last-good: the policy of
//! `phases install` and `phases rollback`, callable by a long-running agent as well.
//!
//! # Expected flow (install)
//! 1. Take the store's lock; read the current bundle (an unusable one is an error).
//! 2. The bundle is already current: done, nothing changes.
//! 3. Its version must be higher than the current one's, unless downgrades are allowed.
//! 4. Compare its authority with what runs now (the current bundle, else the embedded one):
//!    wider capabilities or grants need the caller's consent ([`BundleDiff::widens`]).
//! 5. Precompile every component: this also refuses imports beyond a phase's world.
//! 6. Stage it in the store, make it current (the old current becomes last-good), prune.
//!
//! Steps 1–4 are [`prepare`], 5–6 [`PendingInstall::commit`], so a caller can put off making
//! a runtime until something is to be compiled; [`install`] does both.
//!
//! # Expected flow (rollback)
//! Take the lock, find last-good, precompile it, point `current` at it, drop `last-good`
//! ([`prepare_rollback`], [`PendingRollback::commit`]; [`rollback`] does both).
//!
//! # Guarantees
//! - Nothing in the store changes before every component of the bundle that is to run has
//!   compiled ([`precompile`], shared by both).
//! - The store's own guarantees hold (see [`store`](super::store)): `current` always names a
//!   complete bundle, whatever the moment of a crash.

use crate::bundle::diff::{self, BundleDiff};
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
    /// The bundle may do more than what runs now, and that was not accepted.
    #[error(
        "{bundle}: its capabilities or grants are wider than the current bundle's (above); pass --accept-new-grants to install it"
    )]
    Widens {
        /// The bundle being installed.
        bundle: BundleSource,
    },
    /// A component does not compile, or imports beyond its phase's world.
    #[error("{bundle}: {source}")]
    Precompile {
        /// The bundle.
        bundle: BundleSource,
        /// What the runtime said.
        source: LoadError,
    },
    /// There is no last-good bundle to roll back to.
    #[error("{}: there is no last-good bundle to roll back to", store.display())]
    NoLastGood {
        /// The store directory.
        store: PathBuf,
    },
}

/// What an install may do besides installing a newer bundle of no wider authority.
#[derive(Clone, Copy, Debug, Default)]
pub struct InstallOptions {
    /// Install a version lower than, or equal to, the current one's.
    pub allow_downgrade: bool,
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
}

/// What [`prepare`] found.
pub enum Prepared<'a> {
    /// The bundle is the current one already; the lock is released.
    AlreadyCurrent,
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
    /// The previous current bundle's digest, now last-good (`None`: the embedded bundle ran).
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
    if current.as_ref().is_some_and(|c| c.digest == bundle.digest) {
        return Ok(Prepared::AlreadyCurrent);
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
        });
    }
    Ok(Prepared::Ready(PendingInstall {
        store,
        _lock: lock,
        bundle,
        files,
        widened,
    }))
}

impl PendingInstall<'_> {
    /// Whether the bundle's authority is wider than what runs now (and was accepted).
    pub fn widened(&self) -> bool {
        self.widened
    }

    /// Precompiles the bundle with `runtime`, stages it, makes it current and prunes the
    /// store (steps 5–6 of the module docs).
    pub fn commit(self, runtime: &Runtime) -> Result<Installed, InstallError> {
        precompile(runtime, self.bundle)?;
        store::abort_point("install:after-precompile");
        self.store.stage(self.bundle, self.files)?;
        store::abort_point("install:after-stage");
        let last_good = self.store.switch(&self.bundle.digest)?;
        self.store.prune()?;
        Ok(Installed {
            last_good,
            widened: self.widened,
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
        Prepared::AlreadyCurrent => Ok(InstallOutcome::AlreadyCurrent),
        Prepared::Ready(pending) => Ok(InstallOutcome::Installed(pending.commit(runtime)?)),
    }
}

/// A rollback that found its target and holds the store's lock; nothing has changed yet.
pub struct PendingRollback<'a> {
    store: &'a Store,
    _lock: StoreLock,
    target: Bundle,
    from: Option<String>,
}

/// What a rollback did.
#[derive(Clone, Debug)]
pub struct RolledBack {
    /// The bundle current now (the former last-good).
    pub current: Bundle,
    /// The digest that was current before, if any.
    pub from: Option<String>,
}

/// Finds the last-good bundle of `store` (loaded and digest-checked) under the store's lock.
pub fn prepare_rollback(store: &Store) -> Result<PendingRollback<'_>, InstallError> {
    let lock = store.lock()?;
    let target = store.last_good()?.ok_or_else(|| InstallError::NoLastGood {
        store: store.dir().to_path_buf(),
    })?;
    let from = store.link(store::CURRENT)?;
    Ok(PendingRollback {
        store,
        _lock: lock,
        target,
        from,
    })
}

impl PendingRollback<'_> {
    /// The bundle the rollback makes current.
    pub fn target(&self) -> &Bundle {
        &self.target
    }

    /// Precompiles the target (it is about to run: its components must compile and stay in
    /// their worlds), points `current` at it and drops `last-good`.
    pub fn commit(self, runtime: &Runtime) -> Result<RolledBack, InstallError> {
        precompile(runtime, &self.target)?;
        self.store.set_link(store::CURRENT, &self.target.digest)?;
        self.store.remove_link(store::LAST_GOOD)?;
        Ok(RolledBack {
            current: self.target,
            from: self.from,
        })
    }
}

/// [`prepare_rollback`] then [`PendingRollback::commit`] with `runtime`.
pub fn rollback(store: &Store, runtime: &Runtime) -> Result<RolledBack, InstallError> {
    prepare_rollback(store)?.commit(runtime)
}

#[cfg(test)]
mod tests;
