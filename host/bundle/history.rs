//! The ordered history of a bundle store: every bundle `phases install` made current, oldest
//! first, and which one runs now. `phases rollback` walks it back, one entry at a time, down
//! to the embedded bundle; `phases history` prints it.
//!
//! # Layout
//! `<state-dir>/bundles/history.json` (camelCase, like every JSON nodeward writes):
//! ```json
//! { "format": 1,
//!   "entries": [ { "digest": "…", "name": "…", "version": 3, "installedAt": 1767225600,
//!                  "rolledBack": false } ],
//!   "current": 0 }
//! ```
//! `current` is the index of the entry that runs, or `null` when the embedded bundle runs.
//!
//! # Rules
//! - An install appends an entry and makes it current.
//! - A rollback marks the current entry `rolledBack` and makes the nearest earlier entry that
//!   was not rolled back current, or the embedded bundle when there is none: a bundle rolled
//!   back from is never returned to by a later rollback.
//! - An uninstall makes the embedded bundle current and keeps every entry.
//! - The store's `current` link is what runs; the history is written after the links change
//!   and [`History::reconcile`]d with them under the store's lock, so a crash between the two
//!   loses nothing that runs.

use serde::{Deserialize, Serialize};

/// The history file's name in the store.
pub const HISTORY_FILE: &str = "history.json";

/// One install.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Entry {
    /// The bundle's manifest sha256 (its directory in the store).
    pub digest: String,
    /// The bundle's name.
    pub name: String,
    /// The bundle's version.
    pub version: u64,
    /// When it was installed, in seconds since the Unix epoch (0: unknown, e.g. recovered from
    /// the links of a store without history).
    pub installed_at: u64,
    /// Whether a rollback left it; a later rollback skips it.
    #[serde(default)]
    pub rolled_back: bool,
}

/// The store's history (see the module docs).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct History {
    /// The file format (1).
    #[serde(default = "format_one")]
    pub format: u32,
    /// Every install, oldest first.
    pub entries: Vec<Entry>,
    /// The entry that runs now; `None`: the embedded bundle.
    pub current: Option<usize>,
}

fn format_one() -> u32 {
    1
}

impl History {
    /// An empty history: the embedded bundle runs.
    pub fn new() -> Self {
        History {
            format: 1,
            entries: Vec::new(),
            current: None,
        }
    }

    /// The entry that runs now, if a stored bundle does.
    pub fn current_entry(&self) -> Option<&Entry> {
        self.current.and_then(|i| self.entries.get(i))
    }

    /// The index `phases rollback` goes to from the current entry: `Some(Some(i))` an earlier
    /// entry, `Some(None)` the embedded bundle, `None` nothing (the embedded bundle runs).
    pub fn rollback_target(&self) -> Option<Option<usize>> {
        let current = self.current?;
        Some(
            (0..current.min(self.entries.len()))
                .rev()
                .find(|&i| !self.entries[i].rolled_back),
        )
    }

    /// The digest of the bundle `phases rollback` goes to (the `last-good` link); `None`: the
    /// embedded bundle, or nothing.
    pub fn last_good(&self) -> Option<&str> {
        self.rollback_target()
            .flatten()
            .map(|i| self.entries[i].digest.as_str())
    }

    /// Records an install of `entry`, which becomes current.
    pub fn push(&mut self, entry: Entry) {
        self.entries.push(entry);
        self.current = Some(self.entries.len() - 1);
    }

    /// Records a rollback to [`History::rollback_target`]; returns the new current index
    /// (`None`: the embedded bundle). Does nothing when the embedded bundle runs.
    pub fn roll_back(&mut self) -> Option<usize> {
        let (Some(current), Some(target)) = (self.current, self.rollback_target()) else {
            return None;
        };
        if let Some(e) = self.entries.get_mut(current) {
            e.rolled_back = true;
        }
        self.current = target;
        target
    }

    /// Records an uninstall: the embedded bundle runs; the entries stay.
    pub fn uninstall(&mut self) {
        self.current = None;
    }

    /// Every digest a rollback can still reach, the current one included: the stored bundles
    /// that must be kept.
    pub fn reachable(&self) -> Vec<&str> {
        let Some(current) = self.current else {
            return Vec::new();
        };
        let mut out: Vec<&str> = Vec::new();
        if let Some(e) = self.entries.get(current) {
            out.push(&e.digest);
        }
        out.extend(
            self.entries[..current.min(self.entries.len())]
                .iter()
                .filter(|e| !e.rolled_back)
                .map(|e| e.digest.as_str()),
        );
        out
    }

    /// Makes the history agree with what the store's `current` link names (the link is what
    /// runs): after a crash between a link change and the history write. `make_entry` describes
    /// a digest the history does not know. Returns whether anything changed.
    pub fn reconcile(
        &mut self,
        current_link: Option<&str>,
        make_entry: impl FnOnce(&str) -> Entry,
    ) -> bool {
        let recorded = self.current_entry().map(|e| e.digest.clone());
        if recorded.as_deref() == current_link {
            return false;
        }
        match current_link {
            None => self.uninstall(),
            Some(d) => {
                let target = self.rollback_target().flatten();
                if target.is_some_and(|i| self.entries[i].digest == d) {
                    // A rollback switched the link, then stopped.
                    self.roll_back();
                } else {
                    self.push(make_entry(d));
                }
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(d: &str) -> Entry {
        Entry {
            digest: d.into(),
            name: "t".into(),
            version: 1,
            installed_at: 0,
            rolled_back: false,
        }
    }

    #[test]
    fn rollback_walks_back_to_embedded_skipping_rolled_back_entries() {
        let mut h = History::new();
        assert_eq!(h.rollback_target(), None);
        h.push(e("a"));
        h.push(e("b"));
        assert_eq!(h.last_good(), Some("a"));
        assert_eq!(h.roll_back(), Some(0));
        h.push(e("c"));
        // b was rolled back from: c's previous is a.
        assert_eq!(h.last_good(), Some("a"));
        assert_eq!(h.reachable(), ["c", "a"]);
        assert_eq!(h.roll_back(), Some(0));
        assert_eq!(h.roll_back(), None);
        assert_eq!(h.current, None);
        assert_eq!(h.rollback_target(), None);
        assert_eq!(h.entries.len(), 3);
    }

    #[test]
    fn reconcile_follows_the_link() {
        let mut h = History::new();
        h.push(e("a"));
        h.push(e("b"));
        assert!(!h.reconcile(Some("b"), e));
        assert!(h.reconcile(Some("a"), e));
        assert_eq!(h.current, Some(0));
        assert!(h.entries[1].rolled_back);
        assert!(h.reconcile(Some("x"), e));
        assert_eq!(h.current_entry().map(|e| e.digest.as_str()), Some("x"));
        assert!(h.reconcile(None, e));
        assert_eq!(h.current, None);
    }
}
