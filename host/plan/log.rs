//! The run's change log: every change, in order, and its bounds.
//!
//! # Background
//! Files, units, mounts, kernel settings and downloads all record what they changed (or would
//! change) here, so apply reports exactly what plan predicted. A phase decides how many
//! changes it makes, not how much memory the agent spends on listing them: the log keeps its
//! first [`MAX_CHANGES`] changes and [`MAX_DIFF_BYTES`] of their diffs, and counts the rest.

use super::{Change, ChangeKind, RunMode};
use crate::hostpath::HostPath;
use std::sync::Mutex;

/// The most changes one run lists.
pub const MAX_CHANGES: usize = 4096;
/// The most diff text one run's change list keeps.
pub const MAX_DIFF_BYTES: usize = 8 << 20;
/// The most planned file contents one plan holds in memory.
pub const MAX_PLANNED_BYTES: usize = 32 << 20;

/// One run's changes, shared by every capability of the run.
#[derive(Debug)]
pub struct ChangeLog {
    mode: RunMode,
    inner: Mutex<Kept>,
    /// Test hook: abort the process right after this many host mutations (apply mode only).
    abort_after_mutation: Option<usize>,
}

#[derive(Debug, Default)]
struct Kept {
    kept: Vec<Change>,
    total: usize,
    diff_bytes: usize,
    planned_bytes: usize,
}

/// A plan would hold more planned file contents than [`MAX_PLANNED_BYTES`].
#[derive(Debug, thiserror::Error)]
#[error(
    "{path}: this plan would hold more than {MAX_PLANNED_BYTES} bytes of planned file \
     contents; plan fewer phases at once"
)]
pub struct PlannedTooLarge {
    /// The file whose planned contents passed the bound.
    pub path: HostPath,
}

impl ChangeLog {
    /// An empty log of a run in `mode`.
    pub fn new(mode: RunMode) -> Self {
        ChangeLog {
            mode,
            inner: Mutex::new(Kept::default()),
            abort_after_mutation: crate::test_hooks::abort_after_mutation(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Kept> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds a change made (or planned) by `phase`.
    ///
    /// In apply mode every recorded change is a host mutation that already happened, which is
    /// where the crash tests cut (the `test-hooks` build's `mutation:K` abort point).
    ///
    /// Bounded: the first [`MAX_CHANGES`] changes and [`MAX_DIFF_BYTES`] of their diffs are
    /// kept; later changes are counted ([`ChangeLog::dropped`]), later diffs replaced by a
    /// one-line note.
    pub fn add(&self, phase: &str, mut kind: ChangeKind) {
        let armed = self.mode == RunMode::Apply && self.abort_after_mutation.is_some();
        let what = armed.then(|| kind.describe());
        let mut log = self.lock();
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
        if let Some(what) = what
            && self.abort_after_mutation == Some(log.total)
        {
            crate::test_hooks::abort(&format!("host mutation {} ({phase}: {what})", log.total));
        }
    }

    /// How many changes were made (or planned) beyond [`MAX_CHANGES`] and not listed.
    pub fn dropped(&self) -> usize {
        let log = self.lock();
        log.total - log.kept.len()
    }

    /// Every change made (or planned) so far, listed or not.
    pub fn total(&self) -> usize {
        self.lock().total
    }

    /// How many changes of each kind (`file-create` …) were made after the first `from`
    /// (a [`ChangeLog::total`] taken earlier), for the audit trail's phase end; those beyond
    /// the listed ones count as `unlisted`.
    pub fn kinds_since(&self, from: usize) -> std::collections::BTreeMap<String, u64> {
        let log = self.lock();
        let mut out = std::collections::BTreeMap::new();
        for c in log.kept.iter().skip(from) {
            let kind = serde_json::to_value(&c.kind)
                .ok()
                .and_then(|v| Some(v.get("kind")?.as_str()?.to_string()))
                .unwrap_or_else(|| "other".to_string());
            *out.entry(kind).or_insert(0u64) += 1;
        }
        let unlisted = log.total.saturating_sub(log.kept.len().max(from));
        if unlisted > 0 {
            out.insert("unlisted".to_string(), unlisted as u64);
        }
        out
    }

    /// Every change listed so far, in order.
    pub fn changes(&self) -> Vec<Change> {
        self.lock().kept.clone()
    }

    /// Counts `bytes` more of planned file contents held by plan mode's overlay; refused once
    /// the run's planned contents pass [`MAX_PLANNED_BYTES`] (a plan holds what it would write
    /// in memory, so it needs a bound of its own).
    pub fn reserve_planned(&self, path: &HostPath, bytes: usize) -> Result<(), PlannedTooLarge> {
        let mut log = self.lock();
        log.planned_bytes += bytes;
        if log.planned_bytes > MAX_PLANNED_BYTES {
            return Err(PlannedTooLarge { path: path.clone() });
        }
        Ok(())
    }
}
