//! The artifact cache as the node sees it: which digests it must keep, the record of the
//! previous version that makes those known, and the eviction after a successful operation.
//!
//! # Background
//! The cache (`crate::caps::download`) keeps every artifact it downloaded, so that a repair
//! or a return to an earlier version needs no network. Eviction (`crate::caps::download::evict`)
//! bounds it; this module decides what eviction must never remove:
//! - the artifacts of the config being applied, and of the applied config on disk (the
//!   current version);
//! - the artifacts of the version the node ran before its last upgrade (last-good: where an
//!   operator's downgrade or a Machine's rollback returns). An upgrade prunes that version's
//!   directory and drops its journal once committed, so the commit first records its
//!   artifacts' digests in `previous-version.json` ([`write_previous`]);
//! - while an upgrade journal exists, its previous config's artifacts (the rollback target).
//!
//! # Guarantees
//! - Eviction runs only at the end of a successful bootstrap or upgrade, under the node lock,
//!   never between two of its steps (the pipeline's `evict-cache` step, [`evict_for`]).
//! - When any of those records cannot be read, nothing is evicted: a pin that cannot be known
//!   is never guessed away.
//! - Eviction never fails an operation: its error is a warning and the step's summary.

use super::state::{Journal, NodeState, PREVIOUS, SCHEMA, StateError};
use super::version;
use crate::caps::RunContext;
use crate::caps::download::{EvictPolicy, Eviction, evict};
use nodeward_node_config::NodeConfig;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::time::SystemTime;

/// `previous-version.json`: the version the node ran before its last upgrade, and the
/// digests of its artifacts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PreviousVersion {
    /// [`SCHEMA`].
    pub schema: u32,
    /// The version directory's name.
    pub version: String,
    /// The sha256 of each of its artifacts, by artifact name.
    pub artifacts: std::collections::BTreeMap<String, String>,
}

/// The digests of `config`'s pinned artifacts.
fn digests(config: &NodeConfig) -> impl Iterator<Item = (String, String)> {
    version::artifacts(config, version::arch())
        .into_iter()
        .filter_map(|a| Some((a.name, a.sha256?)))
}

/// The previous version's record, if any; a newer schema is refused.
pub fn previous(state: &NodeState) -> Result<Option<PreviousVersion>, StateError> {
    let p: Option<PreviousVersion> = state.read_json(PREVIOUS)?;
    match p {
        Some(p) if p.schema > SCHEMA => Err(state.err(
            PREVIOUS,
            format!(
                "schema {} is newer than this agent's {SCHEMA}; use a newer nodeward",
                p.schema
            ),
        )),
        p => Ok(p),
    }
}

/// Records the journal's previous version as the one the node ran before (an upgrade's
/// commit, before it prunes that version), unless the upgrade kept the version directory (a
/// config-only change: the version before stays the previous one) or the record already says
/// so.
pub fn write_previous(
    state: &NodeState,
    session: &RunContext,
    journal: &Journal,
) -> Result<(), StateError> {
    if journal.from_version == journal.to_version {
        return Ok(());
    }
    let record = PreviousVersion {
        schema: SCHEMA,
        version: journal.from_version.clone(),
        artifacts: digests(&journal.previous_config).collect(),
    };
    // An unreadable record is rewritten.
    if previous(state).ok().flatten().as_ref() == Some(&record) {
        return Ok(());
    }
    let bytes = state.encode(PREVIOUS, &record, true)?;
    state.write(
        session,
        PREVIOUS,
        &bytes,
        &format!("previous version {}", record.version),
    )
}

/// Every digest the cache must keep with `config` applied (see the module doc).
pub fn pinned(state: &NodeState, config: &NodeConfig) -> Result<BTreeSet<String>, StateError> {
    let mut pins: BTreeSet<String> = digests(config).map(|(_, d)| d).collect();
    if let Some(applied) = state.applied()? {
        pins.extend(digests(&applied).map(|(_, d)| d));
    }
    if let Some(j) = state.journal()? {
        pins.extend(digests(&j.previous_config).map(|(_, d)| d));
    }
    if let Some(p) = previous(state)? {
        pins.extend(p.artifacts.into_values());
    }
    Ok(pins)
}

/// `n` bytes for a person: `1.5 GiB`, `300 MiB`, `12 KiB`, `7 B`.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = UNITS[0];
    for u in &UNITS[1..] {
        if v < 1024.0 {
            break;
        }
        v /= 1024.0;
        unit = u;
    }
    format!("{v:.1} {unit}")
}

/// The step's summary of `e` with a cap of `max` bytes.
fn summary(e: &Eviction, max: u64) -> String {
    let mut s = format!(
        "artifact cache: {} entries, {}",
        e.entries - e.evicted.len(),
        human_bytes(e.bytes_after)
    );
    if !e.evicted.is_empty() {
        s.push_str(&format!(
            "; evicted {} least recently used ({})",
            e.evicted.len(),
            human_bytes(e.bytes_before - e.bytes_after)
        ));
    }
    if e.over_cap {
        s.push_str(&format!(
            "; still over its {} cap: the {} entries left are pinned by the current or previous \
             version",
            human_bytes(max),
            e.entries - e.evicted.len()
        ));
    } else {
        s.push_str(&format!(" (cap {})", human_bytes(max)));
    }
    if !e.temp_removed.is_empty() {
        s.push_str(&format!(
            "; {} stale temp files removed",
            e.temp_removed.len()
        ));
    }
    s
}

/// Evicts from the run's artifact cache with `config` applied: its pins kept, its
/// `downloadOptions.cacheMaxBytes` as the cap. Returns the step summary; never an error.
pub fn evict_for(session: &RunContext, state: &NodeState, config: &NodeConfig) -> String {
    let max = config.download_options.cache_max_bytes();
    let pins = match pinned(state, config) {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(error = %e, "artifact cache not evicted: cannot tell what to keep");
            return format!("artifact cache not evicted: cannot tell what to keep: {e}");
        }
    };
    let cache_dir = &session.downloads.cache_dir;
    match evict(
        session.root().dir(),
        cache_dir,
        &EvictPolicy::with_max_bytes(max),
        &pins,
        SystemTime::now(),
    ) {
        Ok(e) => {
            if e.over_cap {
                tracing::warn!(
                    cache = %cache_dir,
                    bytes = e.bytes_after,
                    cap = max,
                    "the artifact cache is over its cap (downloadOptions.cacheMaxBytes) with \
                     only pinned entries left: those of the current and previous version"
                );
            }
            if !e.evicted.is_empty() {
                tracing::info!(cache = %cache_dir, evicted = ?e.evicted, "artifact cache evicted");
            }
            summary(&e, max)
        }
        Err(e) => {
            tracing::warn!(error = %e, "artifact cache not evicted");
            format!("artifact cache not evicted: {e}")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::Redactor;
    use crate::bundle::sha256_hex;
    use crate::hostpath::HostRoot;
    use crate::plan::RunMode;
    use nodeward_node_config::DownloadOverride;
    use nodeward_node_config::input::ARTIFACT_NAMES;
    use std::path::Path;

    fn session(root: &Path) -> RunContext {
        RunContext::new(
            HostRoot::open(root).expect("root"),
            RunMode::Apply,
            Redactor::default(),
        )
    }

    /// The embedded config with every artifact pinned to a digest derived from `tag`.
    fn config(tag: &str) -> NodeConfig {
        let mut c = crate::config::load(None).expect("embedded config");
        for name in ARTIFACT_NAMES {
            c.downloads.insert(
                name.to_string(),
                DownloadOverride {
                    url: format!("https://mirror.example/{tag}/{name}"),
                    sha256: sha256_hex(format!("{tag}/{name}").as_bytes()),
                },
            );
        }
        c
    }

    fn pins_of(c: &NodeConfig) -> BTreeSet<String> {
        digests(c).map(|(_, d)| d).collect()
    }

    fn journal(from: &str, to: &str, previous: NodeConfig) -> Journal {
        Journal {
            schema: SCHEMA,
            from_version: from.into(),
            to_version: to.into(),
            to_fingerprint: "f".repeat(64),
            previous_config: previous,
        }
    }

    /// Puts a 100-byte entry named `digest` in the default cache, used `age` seconds ago.
    fn put(root: &Path, digest: &str, age: u64) {
        let dir = root.join("var/lib/nodeward/artifacts/sha256");
        std::fs::create_dir_all(&dir).expect("cache");
        let f = std::fs::File::create(dir.join(digest)).expect("entry");
        f.set_len(100).expect("size");
        f.set_modified(SystemTime::now() - std::time::Duration::from_secs(age))
            .expect("mtime");
    }

    fn cached(root: &Path) -> BTreeSet<String> {
        std::fs::read_dir(root.join("var/lib/nodeward/artifacts/sha256"))
            .expect("cache")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn the_pins_are_the_current_applied_rollback_and_previous_versions() {
        let tmp = tempfile::tempdir().expect("tmp");
        let s = session(tmp.path());
        let state = NodeState::new(tmp.path());
        let (a, b, c, d) = (config("a"), config("b"), config("c"), config("d"));
        assert_eq!(pinned(&state, &a).expect("pins"), pins_of(&a));

        state.write_applied(&s, &b).expect("applied");
        write_previous(&state, &s, &journal("v-d", "v-b", d.clone())).expect("previous");
        state
            .write_journal(&s, &journal("v-b", "v-a", c.clone()))
            .expect("journal");
        let want: BTreeSet<String> = [&a, &b, &c, &d].into_iter().flat_map(pins_of).collect();
        assert_eq!(pinned(&state, &a).expect("pins"), want);
        assert_eq!(
            previous(&state).expect("read").map(|p| p.version),
            Some("v-d".to_string())
        );
    }

    #[test]
    fn the_previous_version_is_recorded_once_and_not_by_a_config_only_upgrade() {
        let tmp = tempfile::tempdir().expect("tmp");
        let s = session(tmp.path());
        let state = NodeState::new(tmp.path());
        write_previous(&state, &s, &journal("v-1", "v-1", config("x"))).expect("same version");
        assert_eq!(previous(&state).expect("read"), None);
        assert!(s.changes().is_empty());
        let j = journal("v-1", "v-2", config("x"));
        write_previous(&state, &s, &j).expect("recorded");
        write_previous(&state, &s, &j).expect("again");
        assert_eq!(s.changes().len(), 1, "written once: {:?}", s.changes());
        // A config-only upgrade after it keeps v-1 as the previous version.
        write_previous(&state, &s, &journal("v-2", "v-2", config("y"))).expect("same");
        let p = previous(&state).expect("read").expect("record");
        assert_eq!(p.version, "v-1");
        assert_eq!(
            p.artifacts.values().cloned().collect::<BTreeSet<_>>(),
            pins_of(&config("x"))
        );
    }

    #[test]
    fn eviction_keeps_the_current_and_previous_version_and_says_when_that_is_over_the_cap() {
        let tmp = tempfile::tempdir().expect("tmp");
        let s = session(tmp.path());
        let state = NodeState::new(tmp.path());
        let mut current = config("current");
        current.download_options.cache_max_bytes = Some(1);
        let before = config("before");
        state.write_applied(&s, &current).expect("applied");
        write_previous(&state, &s, &journal("v-0", "v-1", before.clone())).expect("previous");
        // Pinned entries older than the one that is not.
        for d in pins_of(&current).iter().chain(&pins_of(&before)) {
            put(tmp.path(), d, 86400);
        }
        let stray = sha256_hex(b"an artifact of a version long gone");
        put(tmp.path(), &stray, 60);

        let summary = evict_for(&s, &state, &current);
        assert!(summary.contains("evicted 1"), "{summary}");
        assert!(summary.contains("still over"), "{summary}");
        let keep: BTreeSet<String> = pins_of(&current)
            .union(&pins_of(&before))
            .cloned()
            .collect();
        assert_eq!(cached(tmp.path()), keep);
        let again = evict_for(&s, &state, &current);
        assert!(!again.contains("evicted"), "idempotent: {again}");
        assert!(
            s.changes()
                .iter()
                .all(|c| !c.kind.describe().contains("artifacts"))
        );
    }

    #[test]
    fn nothing_is_evicted_when_the_pins_cannot_be_read() {
        let tmp = tempfile::tempdir().expect("tmp");
        let s = session(tmp.path());
        let state = NodeState::new(tmp.path());
        let mut current = config("current");
        current.download_options.cache_max_bytes = Some(0);
        state.write_applied(&s, &current).expect("applied");
        let stray = sha256_hex(b"stray");
        put(tmp.path(), &stray, 60);
        // The applied config edited by hand: its pins are unknown.
        let applied = tmp
            .path()
            .join(nodeward_node_config::layout::STATE_DIR)
            .join("applied-config.json");
        let text = std::fs::read_to_string(&applied).expect("read");
        std::fs::write(&applied, text.replace("worker-01", "worker-02")).expect("edit");
        let summary = evict_for(&s, &state, &current);
        assert!(summary.contains("cannot tell what to keep"), "{summary}");
        assert_eq!(cached(tmp.path()), BTreeSet::from([stray]));
    }

    #[test]
    fn sizes_read_like_a_person_writes_them() {
        assert_eq!(human_bytes(7), "7 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(2 << 30), "2.0 GiB");
        assert_eq!(human_bytes(300 << 20), "300.0 MiB");
    }
}
