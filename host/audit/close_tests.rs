//! Closing dead runs ([`super::close`]): a dead run is closed once, with what it had done; one
//! that ended (killed before removing its lock file) or never started gets no record;
//! [`close_interrupted_runs`] writes nothing when no run is dead, and the heads' temp files a
//! killed head update left are swept, never a live writer's.

use super::close::close_interrupted_runs;
use super::entry::{BundleAction, BundleRef, Event, Mode, Outcome, kind_counts};
use super::tests::{config, info, overflow};
use super::trail::AuditTrail;
use super::verify::verify;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;

fn records(dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(dir.join("audit/audit.jsonl"))
        .expect("log")
        .lines()
        .map(|l| serde_json::from_str(l).expect("json"))
        .collect()
}

fn run_ends<'a>(all: &'a [Value], id: &str) -> Vec<&'a Value> {
    all.iter()
        .filter(|r| r["kind"] == "run-end" && r["runId"] == id)
        .collect()
}

fn lock_files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir.join("audit/runs"))
        .expect("runs")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// No run lock file is left, and the trail verifies.
#[track_caller]
fn assert_no_lock_file_and_whole(dir: &Path) {
    assert!(lock_files(dir).is_empty());
    let c = config(dir, 1 << 20);
    assert!(verify(&c.dir, &c.head).expect("verify").ok);
}

/// A run that ended a phase (2 changes), made 5 calls and installed a bundle, then died.
fn dead_run(dir: &Path) -> String {
    let dead = AuditTrail::open(config(dir, 1 << 20), info("dead")).expect("dead");
    overflow(&dead, 5);
    dead.phase_end(Event::PhaseEnd {
        mode: Mode::Plan,
        phase: "configure".into(),
        bundle: None,
        outcome: Outcome::Ok,
        error: None,
        calls: 5,
        denied: 0,
        changes: kind_counts(&BTreeMap::from([("file-create".into(), 2)])),
        duration_ms: 1,
    });
    dead.bundle(Event::Bundle {
        action: BundleAction::Install,
        current: Some(BundleRef {
            name: "b".into(),
            version: 2,
            digest: "ab".repeat(32),
        }),
        from: None,
    });
    let id = dead.run_id().to_string();
    // Dropped without its end: its lock file stays, its flock is gone (as when killed).
    drop(dead);
    id
}

#[test]
fn a_dead_run_is_closed_with_what_it_did_and_an_ended_or_unstarted_one_is_not() {
    let tmp = tempfile::tempdir().expect("tmp");
    let ended = AuditTrail::open(config(tmp.path(), 1 << 20), info("ended")).expect("ended");
    ended.end(None, 0, 0, 0).expect("end");
    let ended_id = ended.run_id().to_string();
    drop(ended);
    let dead = dead_run(tmp.path());
    // The run that ended, as if killed after its end, before removing its lock file.
    let runs = tmp.path().join("audit/runs");
    std::fs::write(runs.join(format!("{ended_id}.lock")), "").expect("its lock file");
    // A run killed after taking its lock file, before its run-start.
    std::fs::write(runs.join("fedcba9876543210.lock"), "").expect("unstarted");

    let next = AuditTrail::open(config(tmp.path(), 1 << 20), info("next")).expect("next");
    assert_eq!(next.closed_runs(), std::slice::from_ref(&dead));
    next.end(None, 0, 0, 0).expect("end");

    let all = records(tmp.path());
    let ends = run_ends(&all, &dead);
    assert_eq!(ends.len(), 1, "{all:#?}");
    let end = ends[0];
    assert_eq!(end["outcome"], "interrupted");
    assert_eq!(
        (&end["calls"], &end["denied"], &end["changes"]),
        (&Value::from(5), &Value::from(0), &Value::from(2))
    );
    assert_eq!(end["detectedBy"], next.run_id());
    let said = end["error"].as_str().expect("what it did");
    for part in [
        "its last record",
        "(bundle)",
        "phases ended: configure",
        "install",
    ] {
        assert!(said.contains(part), "{part}: {said}");
    }
    assert_eq!(run_ends(&all, &ended_id).len(), 1, "no second end");
    assert_eq!(run_ends(&all, &ended_id)[0]["outcome"], "ok");
    assert!(!all.iter().any(|r| r["runId"] == "fedcba9876543210"));
    assert_no_lock_file_and_whole(tmp.path());
}

#[test]
fn close_interrupted_runs_writes_only_when_a_run_is_dead() {
    let tmp = tempfile::tempdir().expect("tmp");
    let closed = close_interrupted_runs(config(tmp.path(), 1 << 20), info("closer"));
    assert_eq!(closed.expect("no trail"), Vec::<String>::new());
    assert!(!tmp.path().join("audit").exists(), "nothing made");

    super::tests::run(tmp.path(), 1);
    let before = records(tmp.path()).len();
    let live = AuditTrail::open(config(tmp.path(), 1 << 20), info("live")).expect("live");
    let closed = close_interrupted_runs(config(tmp.path(), 1 << 20), info("closer"));
    assert!(closed.expect("live only").is_empty(), "a live run is left");
    assert_eq!(
        records(tmp.path()).len(),
        before + 1,
        "only the live run's start"
    );
    live.end(None, 0, 0, 0).expect("end");

    let dead = dead_run(tmp.path());
    let closed = close_interrupted_runs(config(tmp.path(), 1 << 20), info("closer"));
    assert_eq!(closed.expect("closed"), std::slice::from_ref(&dead));
    let all = records(tmp.path());
    assert_eq!(run_ends(&all, &dead)[0]["outcome"], "interrupted");
    let closer: Vec<&Value> = all.iter().filter(|r| r["command"] == "closer").collect();
    assert_eq!(closer.len(), 1, "one run of its own");
    let closer_id = closer[0]["runId"].as_str().expect("id");
    assert_eq!(run_ends(&all, closer_id)[0]["outcome"], "ok");
    assert_no_lock_file_and_whole(tmp.path());
}

#[test]
fn a_dead_head_writers_temp_file_is_swept_and_a_live_ones_is_not() {
    let tmp = tempfile::tempdir().expect("tmp");
    super::tests::run(tmp.path(), 0);
    let heads = tmp.path().join("state");
    let dead = heads.join(".nodeward-tmp.audit.0123456789abcdef");
    std::fs::write(&dead, "{\"seq\":1").expect("a killed head update's temp file");
    let dir = crate::durable::open_dir(&heads).expect("heads");
    // A live writer of another trail's head, between its temp file and its rename.
    let mut live = crate::durable::TempFile::new_named(&dir, "audit").expect("live");
    std::io::Write::write_all(&mut live.file, b"{}").expect("write");
    super::tests::run(tmp.path(), 0);
    assert!(!dead.exists(), "swept");
    let left: Vec<String> = std::fs::read_dir(&heads)
        .expect("heads")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| crate::durable::is_temp_name(n))
        .collect();
    assert_eq!(left.len(), 1, "the live writer's is kept: {left:?}");
    live.persist("other.json")
        .expect("the live write completes");
}
