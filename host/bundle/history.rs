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
//!   "current": 0,
//!   "forward": [] }
//! ```
//! `current` is the index of the entry that runs, or `null` when the embedded bundle runs;
//! `forward` the entries `phases rollforward` returns to, the next one last.
//!
//! # Rules
//! - An install appends an entry and makes it current.
//! - A rollback marks the current entry `rolledBack` and makes the nearest earlier entry that
//!   was not rolled back current, or the embedded bundle when there is none: a bundle rolled
//!   back from is never returned to by a later rollback.
//! - An uninstall makes the embedded bundle current and keeps every entry.
//! - A rollback or an uninstall pushes the entry it left onto `forward`; a roll forward pops
//!   the last one and makes it current again (clearing its `rolledBack`), so a run of
//!   rollbacks is undone one step at a time. An install clears `forward`: what was rolled
//!   back from before it is history, not a way forward.
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
    /// The entries left by rollbacks and uninstalls since the last install, the one a roll
    /// forward returns to last.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub forward: Vec<usize>,
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
            forward: Vec::new(),
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

    /// The index `phases rollforward` goes to: the entry the last rollback or uninstall left.
    pub fn roll_forward_target(&self) -> Option<usize> {
        self.forward
            .last()
            .copied()
            .filter(|&i| i < self.entries.len() && Some(i) != self.current)
    }

    /// Records an install of `entry`, which becomes current.
    pub fn push(&mut self, entry: Entry) {
        self.entries.push(entry);
        self.current = Some(self.entries.len() - 1);
        self.forward.clear();
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
        self.forward.push(current);
        self.current = target;
        target
    }

    /// Records a roll forward to [`History::roll_forward_target`]; returns the new current
    /// index, `None` when there is nothing to roll forward to.
    pub fn roll_forward(&mut self) -> Option<usize> {
        let target = self.roll_forward_target()?;
        self.forward.pop();
        if let Some(e) = self.entries.get_mut(target) {
            e.rolled_back = false;
        }
        self.current = Some(target);
        Some(target)
    }

    /// Records an uninstall: the embedded bundle runs; the entries stay, and a roll forward
    /// returns to the one that ran.
    pub fn uninstall(&mut self) {
        if let Some(current) = self.current.take() {
            self.forward.push(current);
        }
    }

    /// Every digest a rollback or a roll forward can still reach, the current one included:
    /// the stored bundles that must be kept.
    pub fn reachable(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        if let Some(current) = self.current {
            if let Some(e) = self.entries.get(current) {
                out.push(&e.digest);
            }
            out.extend(
                self.entries[..current.min(self.entries.len())]
                    .iter()
                    .filter(|e| !e.rolled_back)
                    .map(|e| e.digest.as_str()),
            );
        }
        for &i in self.forward.iter().rev() {
            if let Some(e) = self.entries.get(i)
                && !out.contains(&e.digest.as_str())
            {
                out.push(&e.digest);
            }
        }
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
                let back = self.rollback_target().flatten();
                let forward = self.roll_forward_target();
                if back.is_some_and(|i| self.entries[i].digest == d) {
                    // A rollback switched the link, then stopped.
                    self.roll_back();
                } else if forward.is_some_and(|i| self.entries[i].digest == d) {
                    // So did a roll forward.
                    self.roll_forward();
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
    fn roll_forward_undoes_rollbacks_one_at_a_time_until_an_install() {
        let mut h = History::new();
        assert_eq!(h.roll_forward(), None);
        h.push(e("a"));
        h.push(e("b"));
        h.push(e("c"));
        assert_eq!(h.roll_forward(), None, "nothing was rolled back");
        assert_eq!(h.roll_back(), Some(1));
        assert_eq!(h.roll_back(), Some(0));
        assert_eq!(h.reachable(), ["a", "b", "c"], "kept for the way forward");
        assert_eq!(h.roll_forward(), Some(1));
        assert!(!h.entries[1].rolled_back);
        assert_eq!(h.last_good(), Some("a"));
        assert_eq!(h.roll_forward(), Some(2));
        assert_eq!(h.roll_forward(), None);
        // Uninstall, then forward again to what ran.
        h.uninstall();
        assert_eq!(h.current, None);
        assert_eq!(h.roll_forward_target(), Some(2));
        assert_eq!(h.roll_forward(), Some(2));
        // An install after a rollback: the way forward is gone.
        assert_eq!(h.roll_back(), Some(1));
        h.push(e("d"));
        assert_eq!(h.roll_forward(), None);
        assert_eq!(h.reachable(), ["d", "a", "b"]);
    }

    #[test]
    fn a_stale_forward_index_is_ignored() {
        let mut h = History::new();
        h.push(e("a"));
        h.forward = vec![7];
        assert_eq!(h.roll_forward_target(), None);
        assert_eq!(h.roll_forward(), None);
        assert_eq!(h.reachable(), ["a"]);
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
        // A roll forward that switched the link, then stopped.
        assert!(h.reconcile(Some("x"), e));
        assert_eq!(h.current, Some(2));
        assert_eq!(h.entries.len(), 3);
    }
}
