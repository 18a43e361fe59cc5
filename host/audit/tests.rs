//! The trail's writer and its chain, on temporary directories: two writers interleave into one
//! chain, rotation keeps it, a dangling run is closed once.

use super::chain::{self, Head};
use super::entry::{CallCount, Mode};
use super::trail::{AuditTrail, RunInfo, TrailConfig};

fn info(command: &str) -> RunInfo {
    RunInfo {
        command: command.into(),
        mode: Mode::Plan,
        root: "/".into(),
    }
}

fn config(dir: &std::path::Path, max_file_bytes: u64) -> TrailConfig {
    TrailConfig {
        dir: dir.join("audit"),
        head: dir.join("state/head.json"),
        max_file_bytes,
        rotated_files: 2,
    }
}

fn overflow(trail: &AuditTrail, n: u64) {
    trail.overflow(
        "p",
        vec![CallCount {
            call: "fs.stat".into(),
            denied: false,
            count: n,
        }],
    );
}

#[test]
fn two_writers_share_one_chain() {
    let tmp = tempfile::tempdir().expect("tmp");
    let a = AuditTrail::open(config(tmp.path(), 1 << 20), info("a")).expect("a");
    let b = AuditTrail::open(config(tmp.path(), 1 << 20), info("b")).expect("b");
    for n in 1..=5 {
        overflow(&a, n);
        overflow(&b, n);
    }
    a.end(None, 0, 0, 0).expect("a ends");
    b.end(None, 0, 0, 0).expect("b ends");
    assert_eq!(a.failure(), None);
    let c = config(tmp.path(), 1 << 20);
    let v = chain::verify(&c.dir, &c.head).expect("verify");
    assert!(v.ok, "{v:?}");
    assert_eq!(v.records, 14);
    assert_eq!(Head::read(&c.head).expect("head").map(|h| h.seq), Some(14));
}

#[test]
fn rotation_keeps_the_chain_and_drops_the_oldest() {
    let tmp = tempfile::tempdir().expect("tmp");
    let t = AuditTrail::open(config(tmp.path(), 400), info("r")).expect("open");
    for n in 1..=40 {
        overflow(&t, n);
    }
    t.end(None, 0, 0, 0).expect("end");
    let c = config(tmp.path(), 400);
    let files = chain::files(&c.dir).expect("files");
    assert_eq!(files.len(), 3, "{files:?}");
    let v = chain::verify(&c.dir, &c.head).expect("verify");
    assert!(v.ok, "{v:?}");
    assert!(v.retained_from.is_some_and(|s| s > 1), "{v:?}");
    assert_eq!(v.last_seq, Some(42));
}

#[test]
fn a_dangling_run_is_closed_once() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dead = AuditTrail::open(config(tmp.path(), 1 << 20), info("dead")).expect("dead");
    let id = dead.run_id().to_string();
    // Dropped without its end: its lock file stays, its flock is gone (as when killed).
    drop(dead);
    let next = AuditTrail::open(config(tmp.path(), 1 << 20), info("next")).expect("next");
    next.end(None, 0, 0, 0).expect("end");
    let again = AuditTrail::open(config(tmp.path(), 1 << 20), info("again")).expect("again");
    again.end(None, 0, 0, 0).expect("end");
    let entries = super::query::read(&tmp.path().join("audit")).expect("read");
    let summary = super::query::summarize(&entries);
    let outcomes: Vec<(&str, &str)> = summary
        .iter()
        .map(|r| (r.command.as_deref().unwrap_or("?"), r.outcome.as_str()))
        .collect();
    assert_eq!(
        outcomes,
        [("dead", "interrupted"), ("next", "ok"), ("again", "ok")]
    );
    assert_eq!(summary[0].run_id, id);
}
