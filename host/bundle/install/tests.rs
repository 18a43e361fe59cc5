//! Install and rollback against a store in a temporary directory, with the real runtime
//! compiling the real (embedded) `preflight` component.

use super::*;
use crate::bundle::testing;
use std::path::Path;

/// A runtime without the embedded bundle's precompiled forms: these tests watch what an install
/// precompiles into the on-disk cache, and their bundles reuse the embedded bundle's phases
/// (which the binary would otherwise serve precompiled, writing no cache file).
fn runtime(state: &Path) -> Runtime {
    Runtime::new(&state.join("compiled"))
        .expect("runtime")
        .without_embedded_precompiled()
}

/// The test bundles have one phase: allowed explicitly.
fn incomplete() -> InstallOptions {
    InstallOptions {
        allow_incomplete: true,
        ..InstallOptions::default()
    }
}

fn never(_: &BundleDiff) -> bool {
    panic!("no widening to accept")
}

fn write_grant(t: &mut toml::Table) {
    fs_write_grant(t, "etc/x");
}

/// The one phase's `fs.write` grant: `path`.
fn fs_write_grant(t: &mut toml::Table, path: &str) {
    let grants = testing::phase_table(t)
        .entry("grants")
        .or_insert_with(|| toml::Table::new().into())
        .as_table_mut()
        .expect("grants");
    let fs = grants
        .entry("fs")
        .or_insert_with(|| toml::Table::new().into())
        .as_table_mut()
        .expect("fs");
    fs.insert("write".into(), toml::Value::Array(vec![path.into()]));
}

#[test]
fn install_upgrades_refuses_a_downgrade_and_a_reinstall_changes_nothing() {
    let tmp = tempfile::tempdir().expect("tmp");
    let store = Store::new(&tmp.path().join("state"));
    let rt = runtime(tmp.path());
    let (v2, f2) = testing::bundle(tmp.path(), "v2", 2, |_| {});
    let (v1, f1) = testing::bundle(tmp.path(), "v1", 1, |_| {});
    let opts = incomplete();

    // The same phase as the embedded bundle's, fewer phases: not wider, nothing to accept.
    let out = install(&store, &rt, &v2, &f2, opts, never).expect("install v2");
    assert_eq!(
        out,
        InstallOutcome::Installed(Installed {
            last_good: None,
            widened: false
        })
    );
    assert_eq!(
        store.link(store::CURRENT).expect("link"),
        Some(v2.digest.clone())
    );
    assert!(
        rt.cache_path(&v2.manifest.phases[0].sha256).exists(),
        "precompiled"
    );

    let again = install(&store, &rt, &v2, &f2, opts, never).expect("again");
    assert_eq!(again, InstallOutcome::AlreadyCurrent);

    let e = install(&store, &rt, &v1, &f1, opts, never).expect_err("downgrade");
    assert!(
        matches!(e, InstallError::Downgrade { version: 1, .. }),
        "{e}"
    );
    assert_eq!(e.kind(), FailureKind::Refused);
    assert!(
        e.to_string().contains(&format!(
            ": version 1 is not higher than the current bundle's ({}); pass --allow-downgrade",
            v2.id_text()
        )),
        "{e}"
    );
    assert_eq!(
        store.link(store::CURRENT).expect("link"),
        Some(v2.digest.clone())
    );

    let allow = InstallOptions {
        allow_downgrade: true,
        ..incomplete()
    };
    let out = install(&store, &rt, &v1, &f1, allow, never).expect("allowed downgrade");
    assert_eq!(
        out,
        InstallOutcome::Installed(Installed {
            last_good: Some(v2.digest.clone()),
            widened: false
        })
    );
    assert_eq!(store.link(store::LAST_GOOD).expect("link"), Some(v2.digest));
}

#[test]
fn wider_grants_need_consent_and_are_refused_without_it() {
    let tmp = tempfile::tempdir().expect("tmp");
    let store = Store::new(&tmp.path().join("state"));
    let rt = runtime(tmp.path());
    let (wide, files) = testing::bundle(tmp.path(), "wide", 5, write_grant);
    let opts = incomplete();

    let mut asked = None;
    let e = install(&store, &rt, &wide, &files, opts, |d| {
        asked = Some(d.to_text());
        false
    })
    .expect_err("refused");
    assert!(matches!(e, InstallError::Widens { .. }), "{e}");
    assert_eq!(e.kind(), FailureKind::NotAccepted);
    assert!(
        e.to_string().ends_with(&format!(
            "its capabilities or grants are wider than the current bundle's (above); pass --accept-grants-digest {} (or --accept-new-grants) to install it",
            wide.digest
        )),
        "{e}"
    );
    let diff = asked.expect("asked");
    assert!(diff.contains("+ grant fs.write etc/x"), "{diff}");
    assert_eq!(
        store.link(store::CURRENT).expect("link"),
        None,
        "nothing installed"
    );

    let out = install(&store, &rt, &wide, &files, opts, |_| true).expect("accepted");
    assert_eq!(
        out,
        InstallOutcome::Installed(Installed {
            last_good: None,
            widened: true
        })
    );
}

#[test]
fn a_component_that_does_not_load_changes_nothing() {
    let tmp = tempfile::tempdir().expect("tmp");
    let state = tmp.path().join("state");
    let store = Store::new(&state);
    let rt = runtime(tmp.path());
    // preflight's component declared for the stop-node world, which has no fs to import.
    let (bad, files) = testing::bundle(tmp.path(), "bad", 9, |t| {
        testing::phase_table(t).insert("world".into(), "stop-node".into());
    });
    let e = install(&store, &rt, &bad, &files, incomplete(), |_| true).expect_err("does not load");
    assert!(matches!(e, InstallError::Precompile { .. }), "{e}");
    assert_eq!(e.kind(), FailureKind::Refused);
    assert!(
        e.to_string().starts_with(&format!("{}: ", bad.source)),
        "{e}"
    );
    assert_eq!(store.link(store::CURRENT).expect("link"), None);
    assert!(!store.dir().join(&bad.digest).exists(), "not staged");
}

#[test]
fn rollback_walks_the_history_down_to_the_embedded_bundle() {
    let tmp = tempfile::tempdir().expect("tmp");
    let store = Store::new(&tmp.path().join("state"));
    let rt = runtime(tmp.path());

    let e = rollback(&store, &rt).expect_err("nothing to roll back to");
    assert!(matches!(e, InstallError::NothingToRollBack { .. }), "{e}");
    assert_eq!(e.kind(), FailureKind::Other);
    assert!(
        e.to_string().contains(
            "bundles: the embedded bundle runs already; there is nothing to roll back to"
        ),
        "{e}"
    );

    let (v1, f1) = testing::bundle(tmp.path(), "v1", 1, |_| {});
    let (v2, f2) = testing::bundle(tmp.path(), "v2", 2, |_| {});
    let opts = incomplete();
    install(&store, &rt, &v1, &f1, opts, never).expect("v1");
    install(&store, &rt, &v2, &f2, opts, never).expect("v2");

    let pending = prepare_move(&store, Direction::Back).expect("prepare");
    assert_eq!(pending.target().digest, v1.digest);
    // The lock is held until the rollback is done.
    assert!(store.lock().is_err(), "locked");
    let done = pending.commit(&rt).expect("rollback");
    assert_eq!(done.current.digest, v1.digest);
    assert_eq!(done.from, Some(v2.digest.clone()));
    assert_eq!(
        store.link(store::CURRENT).expect("link"),
        Some(v1.digest.clone())
    );
    assert_eq!(store.link(store::LAST_GOOD).expect("link"), None);

    // The second rollback goes to the embedded bundle.
    let done = rollback(&store, &rt).expect("to embedded");
    assert_eq!(done.current.source, BundleSource::Embedded);
    assert_eq!(done.from, Some(v1.digest.clone()));
    assert_eq!(store.link(store::CURRENT).expect("link"), None);

    let e = rollback(&store, &rt).expect_err("the embedded bundle runs");
    assert!(matches!(e, InstallError::NothingToRollBack { .. }), "{e}");

    // Roll forward undoes the two rollbacks, one at a time, with the bundles kept for it.
    let forward = |want: &str| {
        let done = prepare_move(&store, Direction::Forward)
            .and_then(|p| p.commit(&rt))
            .expect("roll forward");
        assert_eq!(done.current.digest, want);
        assert_eq!(
            store.link(store::CURRENT).expect("link").as_deref(),
            Some(want)
        );
    };
    forward(&v1.digest);
    forward(&v2.digest);
    assert_eq!(
        store.link(store::LAST_GOOD).expect("link"),
        Some(v1.digest.clone())
    );
    let e = prepare_move(&store, Direction::Forward)
        .err()
        .expect("nothing to roll forward to");
    assert!(
        matches!(e, InstallError::NothingToRollForward { .. }),
        "{e}"
    );
    let history = {
        let _lock = store.lock().expect("lock");
        store.history().expect("history")
    };
    assert_eq!(history.entries.len(), 2);
    assert_eq!(history.current, Some(1), "rolled forward to v2");
    assert!(history.forward.is_empty());
}

/// A store in `dir` with v1 installed, the runtime, and v1 and v2.
struct V1Installed {
    store: Store,
    rt: Runtime,
    v1: Bundle,
    v2: Bundle,
    f2: BundleFiles,
}

fn v1_installed(dir: &Path) -> V1Installed {
    let store = Store::new(&dir.join("state"));
    let rt = runtime(dir);
    let (v1, f1) = testing::bundle(dir, "v1", 1, |_| {});
    let (v2, f2) = testing::bundle(dir, "v2", 2, |_| {});
    install(&store, &rt, &v1, &f1, incomplete(), never).expect("v1");
    V1Installed {
        store,
        rt,
        v1,
        v2,
        f2,
    }
}

#[test]
fn an_unusable_current_bundle_stops_an_install() {
    let tmp = tempfile::tempdir().expect("tmp");
    let V1Installed {
        store, v1, v2, f2, ..
    } = v1_installed(tmp.path());
    let dir = store.dir().join(&v1.digest);
    std::fs::write(dir.join(testing::COMPONENT), b"damaged").expect("damage");
    let Err(e) = prepare(&store, &v2, &f2, incomplete(), never) else {
        panic!("a damaged current bundle must stop the install");
    };
    assert!(matches!(e, InstallError::UnusableCurrent(_)), "{e}");
    assert_eq!(e.kind(), FailureKind::Other);
}

#[test]
fn an_incomplete_bundle_is_refused_naming_what_it_lacks() {
    let tmp = tempfile::tempdir().expect("tmp");
    let store = Store::new(&tmp.path().join("state"));
    let (v1, f1) = testing::bundle(tmp.path(), "v1", 1, |_| {});
    let Err(e) = prepare(&store, &v1, &f1, InstallOptions::default(), never) else {
        panic!("an incomplete bundle was accepted");
    };
    assert!(matches!(e, InstallError::Incomplete { .. }), "{e}");
    assert_eq!(e.kind(), FailureKind::Refused);
    let text = e.to_string();
    assert!(
        text.contains("bootstrap needs setup-host, download-artifacts")
            && text.contains("upgrade needs setup-host")
            && text.contains("reset needs teardown")
            && text.contains("--allow-incomplete"),
        "{text}"
    );
    // The embedded bundle is complete.
    let embedded = Bundle::embedded().expect("embedded");
    assert!(missing_phases(&embedded).is_empty());
}

/// Every phase the node pipelines run is in [`PIPELINE_PHASES`], so the check keeps up with
/// the pipelines.
#[test]
fn pipeline_phases_lists_every_phase_the_pipelines_run() {
    let sources = [
        include_str!("../../node/pipeline.rs"),
        include_str!("../../node/pipeline/upgrade.rs"),
    ];
    let listed: Vec<&str> = PIPELINE_PHASES
        .iter()
        .flat_map(|(_, p)| p.iter().copied())
        .collect();
    for src in sources {
        for part in src.split("self.phase(\"").skip(1) {
            let name = part.split('"').next().unwrap_or_default();
            assert!(
                listed.contains(&name),
                "phase {name:?} is not in PIPELINE_PHASES"
            );
        }
    }
}

#[test]
fn a_grant_inside_a_reserved_path_is_refused_at_install_but_loads() {
    let tmp = tempfile::tempdir().expect("tmp");
    let store = Store::new(&tmp.path().join("state"));
    let (b, files) = testing::bundle(tmp.path(), "reserved", 2, |t| {
        fs_write_grant(t, "var/lib/nodeward/node")
    });
    let Err(e) = prepare(&store, &b, &files, incomplete(), |_| true) else {
        panic!("installed a bundle granted the agent's state");
    };
    assert!(matches!(e, InstallError::ReservedGrant { .. }), "{e}");
    assert!(
        e.to_string().contains("var/lib/nodeward") && e.to_string().contains("reserved"),
        "{e}"
    );
    assert_eq!(store.link(store::CURRENT).expect("link"), None);
}

/// A kill after the switch, before the history (the history written before this install left
/// in place): the history's entry takes its time from the intent, the next `prepare` finds the
/// install unrecorded, and recording it writes the history and removes the intent; a rollback
/// removes an intent too.
#[test]
fn an_install_killed_after_its_switch_keeps_its_time_and_is_found_unrecorded() {
    let tmp = tempfile::tempdir().expect("tmp");
    let V1Installed {
        store,
        rt,
        v1,
        v2,
        f2,
    } = v1_installed(tmp.path());
    let history_file = store.dir().join(crate::bundle::history::HISTORY_FILE);
    let before = std::fs::read(&history_file).expect("history");
    let Ok(Prepared::Ready(pending)) = prepare(&store, &v2, &f2, incomplete(), never) else {
        panic!("v2 is installable");
    };
    assert!(pending.unrecorded().is_none());
    // Dropped unrecorded: the intent stays; the history is put back as a kill leaves it.
    drop(pending.commit(&rt).expect("commit"));
    std::fs::write(&history_file, &before).expect("as before the history write");

    let history = {
        let _lock = store.lock().expect("lock");
        store.history().expect("history")
    };
    let entry = history.current_entry().expect("v2 current");
    assert_eq!(entry.digest, v2.digest);
    assert!(
        entry.installed_at > 0,
        "its time, from the intent: {entry:?}"
    );

    let Ok(Prepared::AlreadyCurrent(Some(unrecorded))) =
        prepare(&store, &v2, &f2, incomplete(), never)
    else {
        panic!("found unrecorded");
    };
    assert_eq!(unrecorded.intent.digest, v2.digest);
    assert_eq!(unrecorded.intent.from.as_deref(), Some(v1.digest.as_str()));
    assert_eq!(unrecorded.intent.installed_at, entry.installed_at);
    unrecorded.recorded().expect("recorded");
    assert_eq!(store.intent().expect("intent"), None);
    let written: crate::bundle::history::History =
        serde_json::from_slice(&std::fs::read(&history_file).expect("history")).expect("json");
    assert_eq!(
        written.current_entry().map(|e| e.installed_at),
        Some(entry.installed_at),
        "written with its time"
    );
    assert!(matches!(
        prepare(&store, &v2, &f2, incomplete(), never),
        Ok(Prepared::AlreadyCurrent(None))
    ));

    // An intent a rollback finds is history after it.
    let (v3, f3) = testing::bundle(tmp.path(), "v3", 3, |_| {});
    let Ok(Prepared::Ready(pending)) = prepare(&store, &v3, &f3, incomplete(), never) else {
        panic!("v3 is installable");
    };
    drop(pending.commit(&rt).expect("commit"));
    assert!(store.intent().expect("intent").is_some());
    rollback(&store, &rt).expect("rollback");
    assert_eq!(store.intent().expect("intent"), None);
}
