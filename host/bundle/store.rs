//! The agent's installed bundles: `<state-dir>/bundles/`.
//!
//! # Layout
//! ```text
//! <state-dir>/bundles/
//!   <digest>/            one verified bundle: manifest.toml, manifest.toml.minisig, components
//!   current -> <digest>  the bundle plan and apply run
//!   last-good -> <digest>  the bundle `phases rollback` returns to (absent: it returns to the
//!                        embedded bundle, or the embedded bundle runs already)
//!   history.json         every install, oldest first ([`history`](super::history))
//!   install-intent.json  the install under way or not yet recorded ([`super::intent`])
//!   .lock                held while installing, rolling back or uninstalling
//! ```
//!
//! # Guarantees
//! - The current bundle is always intact: a new bundle is written beside it under a temporary
//!   name, every file and the directory fsynced, renamed to its digest, and only then is the
//!   `current` link replaced, by rename(2) of a freshly made link (atomic), and the directory
//!   fsynced. A crash at any point leaves `current` naming a complete bundle, old or new.
//! - Temporary names are [`crate::durable`]'s (`.nodeward-tmp.stage.…`, `.nodeward-tmp.link.…`):
//!   what a killed install or rollback left is removed under the lock by the next one
//!   ([`Store::lock`]).
//! - A bundle directory's name is its manifest's sha256 and is checked on every load, with
//!   every component's digest, so a damaged store is refused, never run.
//! - The signature is checked at install, not at every run: the store is as trusted as the
//!   agent binary (root-owned, 0700), and re-checking would make a key rotation strand the
//!   installed bundle.
//!
//! # Test hook
//! In a `test-hooks` build, `NODEWARD_TEST_ABORT=install:after-precompile` (or
//! `install:after-stage`, `install:after-intent`, `install:after-last-good`,
//! `install:after-current`, `install:after-history`, and `history:after-temp-write`,
//! `intent:after-temp-write` between a temp file and its rename) aborts the process at that
//! point, so tests can prove the above.

use crate::bundle::history::{self, Entry, History};
use crate::bundle::{
    Bundle, BundleError, BundleFiles, BundleSource, MANIFEST_FILE, SIGNATURE_FILE,
};
use crate::durable;
use std::io::Write;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

/// The link naming the current bundle.
pub const CURRENT: &str = "current";
/// The link naming the last-good bundle.
pub const LAST_GOOD: &str = "last-good";

/// A crash point of the crash-safety tests ([`crate::test_hooks::abort_at`]; nothing in
/// builds without the `test-hooks` feature).
pub fn abort_point(point: &str) {
    crate::test_hooks::abort_at(point);
}

/// The bundle store of one state directory.
pub struct Store {
    dir: PathBuf,
}

/// Held while the store is being changed (a [`durable::Lock`] on `.lock`); released on drop.
pub struct StoreLock {
    _lock: durable::Lock,
}

fn is_digest(s: &str) -> bool {
    nodeward_node_config::is_sha256(s)
}

impl Store {
    /// The store in `<state_dir>/bundles`. Nothing is created until it is written.
    pub fn new(state_dir: &Path) -> Self {
        Store {
            dir: state_dir.join("bundles"),
        }
    }

    /// The store directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn err(&self, path: &Path, message: impl ToString) -> BundleError {
        BundleError::Store {
            path: path.to_path_buf(),
            message: message.to_string(),
        }
    }

    /// Creates the store (0700) and takes its lock, so two installs cannot interleave; then
    /// removes what a killed install or rollback left in it ([`durable::sweep`]: temp links,
    /// a staging directory), before anything is written.
    pub fn lock(&self) -> Result<StoreLock, BundleError> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)
            .map_err(|e| self.err(&self.dir, e))?;
        let path = self.dir.join(".lock");
        let lock = durable::Lock::acquire(&path).map_err(|e| match e {
            durable::LockError::Open { source } => self.err(&path, source),
            durable::LockError::Held { source, .. } => self.err(
                &path,
                format!("another install or rollback is running: {source}"),
            ),
        })?;
        let removed = durable::sweep_path(&self.dir, durable::TempDirs::Remove).map_err(|e| {
            self.err(
                &self.dir,
                format!("cannot remove the temp files a killed run left: {e}"),
            )
        })?;
        if !removed.is_empty() {
            tracing::info!(store = %self.dir.display(), ?removed, "removed what a killed install left");
        }
        Ok(StoreLock { _lock: lock })
    }

    /// Removes what a killed install or rollback left in the store, as [`Store::lock`] does,
    /// when no store operation holds the lock (one that does swept when it took it); returns
    /// what it removed. Nothing is created: a store that does not exist is left so.
    pub fn sweep_if_idle(&self) -> Result<Vec<String>, BundleError> {
        if !self.dir.is_dir() {
            return Ok(Vec::new());
        }
        let path = self.dir.join(".lock");
        let _lock = match durable::Lock::acquire(&path) {
            Ok(l) => l,
            Err(durable::LockError::Held { .. }) => return Ok(Vec::new()),
            Err(durable::LockError::Open { source }) => return Err(self.err(&path, source)),
        };
        let removed = durable::sweep_path(&self.dir, durable::TempDirs::Remove)
            .map_err(|e| self.err(&self.dir, e))?;
        Ok(removed
            .into_iter()
            .map(|n| self.dir.join(n).display().to_string())
            .collect())
    }

    /// The digest the link `name` points to, if the link exists.
    pub fn link(&self, name: &str) -> Result<Option<String>, BundleError> {
        let path = self.dir.join(name);
        match std::fs::read_link(&path) {
            Ok(target) => {
                let t = target.to_str().unwrap_or_default();
                if is_digest(t) {
                    Ok(Some(t.to_string()))
                } else {
                    Err(self.err(&path, format!("points to {target:?}, not a bundle digest")))
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(self.err(&path, e)),
        }
    }

    /// Loads the stored bundle `digest`, checking its manifest digest and every component's.
    pub fn load(&self, digest: &str) -> Result<Bundle, BundleError> {
        let dir = self.dir.join(digest);
        let mut files = BundleFiles::open(&dir)?;
        files.source = BundleSource::Installed(dir.clone());
        let bundle = Bundle::from_files(&files)?;
        if bundle.digest != digest {
            return Err(self.err(
                &dir,
                format!(
                    "{MANIFEST_FILE} has sha256 {}, not the directory's name: the store is damaged",
                    bundle.digest
                ),
            ));
        }
        Ok(bundle)
    }

    /// The current bundle, if one is installed.
    pub fn current(&self) -> Result<Option<Bundle>, BundleError> {
        self.link(CURRENT)?.map(|d| self.load(&d)).transpose()
    }

    /// The last-good bundle, if there is one.
    pub fn last_good(&self) -> Result<Option<Bundle>, BundleError> {
        self.link(LAST_GOOD)?.map(|d| self.load(&d)).transpose()
    }

    /// Writes the verified `bundle` (read from `files`) into `<digest>/`, durably. An existing
    /// complete copy is kept; a damaged one that no link names is replaced.
    pub fn stage(&self, bundle: &Bundle, files: &BundleFiles) -> Result<PathBuf, BundleError> {
        let final_dir = self.dir.join(&bundle.digest);
        if final_dir.exists() {
            if self.load(&bundle.digest).is_ok() {
                return Ok(final_dir);
            }
            let linked = [CURRENT, LAST_GOOD]
                .iter()
                .any(|l| self.link(l).ok().flatten().as_deref() == Some(bundle.digest.as_str()));
            if linked {
                return Err(self.err(&final_dir, "is damaged and in use; not replacing it"));
            }
            std::fs::remove_dir_all(&final_dir).map_err(|e| self.err(&final_dir, e))?;
        }
        // A temp name of the durable scheme: a staging directory a killed install left is
        // swept by the next [`Store::lock`].
        let tmp = self.dir.join(durable::temp_name("stage"));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&tmp)
            .map_err(|e| self.err(&tmp, e))?;
        let mut contents: Vec<(String, Vec<u8>)> =
            vec![(MANIFEST_FILE.to_string(), files.manifest.clone())];
        if let Some(sig) = &files.signature {
            contents.push((SIGNATURE_FILE.to_string(), sig.clone()));
        }
        for p in &bundle.manifest.phases {
            let bytes = bundle.verified_component(&p.name)?.to_vec();
            contents.push((p.component.clone(), bytes));
        }
        for (name, bytes) in &contents {
            let path = tmp.join(name);
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
                .map_err(|e| self.err(&path, e))?;
            f.write_all(bytes).map_err(|e| self.err(&path, e))?;
            f.sync_all().map_err(|e| self.err(&path, e))?;
        }
        sync_dir(&tmp).map_err(|e| self.err(&tmp, e))?;
        std::fs::rename(&tmp, &final_dir).map_err(|e| self.err(&final_dir, e))?;
        sync_dir(&self.dir).map_err(|e| self.err(&self.dir, e))?;
        Ok(final_dir)
    }

    /// Points link `name` at `digest` atomically: a new link under a temporary name, renamed
    /// over the old one, then the directory fsynced ([`durable::replace_symlink`]).
    pub fn set_link(&self, name: &str, digest: &str) -> Result<(), BundleError> {
        let path = self.dir.join(name);
        durable::open_dir(&self.dir)
            .and_then(|dir| durable::replace_symlink(&dir, digest, name))
            .map_err(|e| self.err(&path, e))
    }

    /// Removes link `name`.
    pub fn remove_link(&self, name: &str) -> Result<(), BundleError> {
        let path = self.dir.join(name);
        match std::fs::remove_file(&path) {
            Ok(()) => sync_dir(&self.dir).map_err(|e| self.err(&self.dir, e)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(self.err(&path, e)),
        }
    }

    /// The store's history, agreeing with the `current` link ([`History::reconcile`]). A store
    /// written before the history existed gets one from its links (last-good, then current).
    /// Call under the store's lock.
    pub fn history(&self) -> Result<History, BundleError> {
        let path = self.dir.join(history::HISTORY_FILE);
        let mut h = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice::<History>(&bytes)
                .map_err(|e| self.err(&path, format!("is not a bundle history: {e}")))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let mut h = History::new();
                if let Some(d) = self.link(LAST_GOOD)? {
                    h.push(self.entry_of(&d, 0));
                }
                h
            }
            Err(e) => return Err(self.err(&path, e)),
        };
        let current = self.link(CURRENT)?;
        // An install killed between its link and its history: its time is in its intent.
        let intent = self.intent()?;
        h.reconcile(current.as_deref(), |d| {
            let at = intent.as_ref().filter(|i| i.digest == d);
            self.entry_of(d, at.map_or(0, |i| i.installed_at))
        });
        Ok(h)
    }

    /// A history entry for the stored bundle `digest`; one that does not load is named
    /// "unknown" (the history describes, the digest identifies).
    pub fn entry_of(&self, digest: &str, installed_at: u64) -> Entry {
        let (name, version) = match self.load(digest) {
            Ok(b) => (b.manifest.bundle.name, b.manifest.bundle.version),
            Err(_) => ("unknown".to_string(), 0),
        };
        Entry {
            digest: digest.to_string(),
            name,
            version,
            installed_at,
            rolled_back: false,
        }
    }

    /// Writes `history` durably ([`durable::write_file`], 0600).
    pub fn write_history(&self, history: &History) -> Result<(), BundleError> {
        let path = self.dir.join(history::HISTORY_FILE);
        let json = serde_json::to_vec_pretty(history).map_err(|e| self.err(&path, e))?;
        durable::open_dir(&self.dir)
            .and_then(|dir| {
                durable::write_file(&dir, history::HISTORY_FILE, &json, 0o600, "history")
            })
            .map_err(|e| self.err(&path, e))
    }

    /// Makes the store what `history` says, in crash-safe order: `last-good` first, then
    /// `current` (what runs), then the history file, then the bundles no rollback can reach
    /// are pruned. A crash between steps leaves `current` naming a complete bundle (or none:
    /// the embedded one), and the next [`Store::history`] reconciles.
    pub fn apply_history(&self, history: &History) -> Result<(), BundleError> {
        match history.last_good() {
            Some(d) => self.set_link(LAST_GOOD, d)?,
            None => self.remove_link(LAST_GOOD)?,
        }
        abort_point("install:after-last-good");
        match history.current_entry() {
            Some(e) => self.set_link(CURRENT, &e.digest)?,
            None => self.remove_link(CURRENT)?,
        }
        abort_point("install:after-current");
        self.write_history(history)?;
        abort_point("install:after-history");
        self.prune(history)
    }

    /// Removes stored bundles no rollback can reach, and leftovers.
    fn prune(&self, history: &History) -> Result<(), BundleError> {
        let mut keep: Vec<String> = [CURRENT, LAST_GOOD]
            .iter()
            .filter_map(|l| self.link(l).ok().flatten())
            .collect();
        keep.extend(history.reachable().into_iter().map(str::to_string));
        let entries = std::fs::read_dir(&self.dir).map_err(|e| self.err(&self.dir, e))?;
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            // `.staging-*`: the staging directories of agents before the durable temp names.
            let stale =
                (is_digest(&name) && !keep.contains(&name)) || name.starts_with(".staging-");
            if stale && e.file_type().is_ok_and(|t| t.is_dir()) {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
        Ok(())
    }
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    durable::fsync_dir(&durable::open_dir(dir)?)
}
