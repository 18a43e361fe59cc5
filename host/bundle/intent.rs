//! [`InstallIntent`]: the install under way, written into the store before its links change,
//! so that a kill at any later point leaves what the install was — its time above all.
//!
//! # Background
//! An install makes its bundle current by renaming a new `current` link over the old one, and
//! only then writes the history and, in the CLI, the audit trail's `bundle` record. A kill
//! between the two left a `current` the history did not know: the next store operation
//! reconciled the history with the link and had no time for the entry (`phases history` said
//! "installed at 1970-01-01"), and the trail never recorded the change.
//!
//! The intent is written durably before the links change: the bundle (digest, name, version),
//! its install time and the digest that was current before. So every state a kill leaves in
//! which `current` names the new bundle also holds its time and its predecessor:
//! - the history's reconcile takes the entry's time from it ([`super::store::Store::history`]);
//! - the next install finds the change unrecorded (`crate::cli`'s install records it in the
//!   trail, unless the trail's newest `bundle` record already names it).
//!
//! # Lifecycle
//! 1. [`crate::bundle::install::PendingInstall::commit`] writes it (`install-intent.json`,
//!    0600), then changes the links and the history.
//! 2. Once the change is recorded (or the caller keeps no record),
//!    [`crate::bundle::install::Committed::recorded`] removes it, under the store's lock.
//! 3. A rollback, roll forward or uninstall removes it (whatever it said is history now); the
//!    next install overwrites it.
//!
//! An intent naming a bundle `current` does not name is an install that died before its
//! switch: nothing changed, and nothing is recorded.

use super::BundleError;
use super::store::Store;
use crate::durable;
use serde::{Deserialize, Serialize};

/// The intent's file name in the store.
pub const INTENT_FILE: &str = "install-intent.json";

/// Largest intent file read (one is about 250 bytes).
const MAX_INTENT_BYTES: u64 = 4096;

/// An install under way (see the module doc). Unknown fields are not refused: a later agent
/// may add some, and this one must still read the time.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InstallIntent {
    /// The bundle being made current: its manifest sha256.
    pub digest: String,
    /// Its manifest's name.
    pub name: String,
    /// Its manifest's version.
    pub version: u64,
    /// When it was installed, in seconds since the Unix epoch: its history entry's time.
    pub installed_at: u64,
    /// The digest current before; `None`: the embedded bundle.
    pub from: Option<String>,
}

impl Store {
    /// The intent in the store, if any. One that is not an intent is an error naming it.
    pub fn intent(&self) -> Result<Option<InstallIntent>, BundleError> {
        use std::io::Read as _;
        let path = self.dir().join(INTENT_FILE);
        let err = |m: String| BundleError::Store {
            path: path.clone(),
            message: m,
        };
        let file = match std::fs::File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(err(e.to_string())),
        };
        let mut bytes = Vec::new();
        file.take(MAX_INTENT_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| err(e.to_string()))?;
        if bytes.len() as u64 > MAX_INTENT_BYTES {
            return Err(err(format!(
                "longer than {MAX_INTENT_BYTES} bytes: not an install intent"
            )));
        }
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| err(format!("is not an install intent: {e}")))
    }

    /// Writes `intent` durably ([`durable::write_file`], 0600). Call under the store's lock.
    pub fn write_intent(&self, intent: &InstallIntent) -> Result<(), BundleError> {
        let path = self.dir().join(INTENT_FILE);
        let err = |m: String| BundleError::Store {
            path: path.clone(),
            message: m,
        };
        let json = serde_json::to_vec_pretty(intent).map_err(|e| err(e.to_string()))?;
        durable::open_dir(self.dir())
            .and_then(|dir| durable::write_file(&dir, INTENT_FILE, &json, 0o600, "intent"))
            .map_err(|e| err(e.to_string()))
    }

    /// Removes the intent, durably; nothing when there is none. Call under the store's lock.
    pub fn clear_intent(&self) -> Result<(), BundleError> {
        let path = self.dir().join(INTENT_FILE);
        let err = |e: std::io::Error| BundleError::Store {
            path: path.clone(),
            message: e.to_string(),
        };
        match std::fs::remove_file(&path) {
            Ok(()) => durable::open_dir(self.dir())
                .and_then(|d| durable::fsync_dir(&d))
                .map_err(err),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(err(e)),
        }
    }

    /// The intent of an install that made its bundle current and whose change may be
    /// unrecorded: the intent, when the `current` link names its bundle.
    pub fn unrecorded_install(&self) -> Result<Option<InstallIntent>, BundleError> {
        let Some(intent) = self.intent()? else {
            return Ok(None);
        };
        let current = self.link(super::store::CURRENT)?;
        Ok((current.as_deref() == Some(intent.digest.as_str())).then_some(intent))
    }
}
