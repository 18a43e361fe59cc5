//! The trail's writer and its chain, on temporary directories: two writers (and the threads of
//! two trails in one process) interleave into one chain, rotation keeps it and moves the head's
//! floor, a dangling run is closed once, and what the writer refuses: a link, a FIFO, a
//! writable directory, a lock held too long, a seq with no successor.

use super::chain;
use super::entry::{CallCount, Mode};
use super::head::Head;
use super::trail::{AuditTrail, RunInfo, TrailConfig};
use super::verify::verify;
use std::path::Path;
use std::time::Duration;

pub(super) fn info(command: &str) -> RunInfo {
    RunInfo {
        command: command.into(),
        mode: Mode::Plan,
        root: "/".into(),
    }
}

pub(super) fn config(dir: &Path, max_file_bytes: u64) -> TrailConfig {
    TrailConfig {
        dir: dir.join("audit"),
        head: dir.join("state/head.json"),
        max_file_bytes,
        rotated_files: 2,
        lock_wait: Duration::from_secs(30),
        max_call_bytes: 1 << 20,
    }
}

pub(super) fn overflow(trail: &AuditTrail, n: u64) {
    trail.overflow(
        "p",
        vec![CallCount {
            call: "fs.stat".into(),
            denied: false,
            count: n,
        }],
    );
}

/// A trail of one run with `n` overflow records: `n + 2` records.
pub(super) fn run(dir: &Path, n: u64) {
    let t = AuditTrail::open(config(dir, 1 << 20), info("r")).expect("open");
    for i in 1..=n {
        overflow(&t, i);
    }
    t.end(None, 0, 0, 0).expect("end");
    assert_eq!(t.failure(), None);
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
    let v = verify(&c.dir, &c.head).expect("verify");
    assert!(v.ok, "{v:?}");
    assert_eq!(v.records, 14);
    assert_eq!(Head::read(&c.head).expect("head").map(|h| h.seq), Some(14));
}

/// `flock` does not keep apart the threads of one process (nor two trails it opened): the
/// process-wide mutex does.
#[test]
fn threads_of_two_trails_in_one_process_keep_one_chain() {
    let tmp = tempfile::tempdir().expect("tmp");
    let a = AuditTrail::open(config(tmp.path(), 1 << 20), info("a")).expect("a");
    let b = AuditTrail::open(config(tmp.path(), 1 << 20), info("b")).expect("b");
    std::thread::scope(|s| {
        for t in [&a, &b, &a, &b] {
            s.spawn(move || (1..=100).for_each(|n| overflow(t, n)));
        }
    });
    a.end(None, 0, 0, 0).expect("a ends");
    b.end(None, 0, 0, 0).expect("b ends");
    let c = config(tmp.path(), 1 << 20);
    let v = verify(&c.dir, &c.head).expect("verify");
    assert!(v.ok, "{v:?}");
    assert_eq!(v.records, 404);
}

#[test]
fn rotation_keeps_the_chain_drops_the_oldest_and_moves_the_floor() {
    let tmp = tempfile::tempdir().expect("tmp");
    let t = AuditTrail::open(config(tmp.path(), 400), info("r")).expect("open");
    for n in 1..=40 {
        overflow(&t, n);
    }
    t.end(None, 0, 0, 0).expect("end");
    let c = config(tmp.path(), 400);
    let files = chain::files(&c.dir).expect("files");
    assert_eq!(files.len(), 3, "{files:?}");
    let v = verify(&c.dir, &c.head).expect("verify");
    assert!(v.ok, "{v:?}");
    let first = v.retained_from.expect("the oldest were dropped");
    assert!(first > 1, "{v:?}");
    assert_eq!(v.last_seq, Some(42));
    let head = Head::read(&c.head).expect("head").expect("some");
    assert_eq!((head.floor, head.pending_floor), (first, None));
}

#[test]
fn a_dangling_run_is_closed_once_and_other_entries_of_runs_are_left_alone() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dead = AuditTrail::open(config(tmp.path(), 1 << 20), info("dead")).expect("dead");
    let id = dead.run_id().to_string();
    // Dropped without its end: its lock file stays, its flock is gone (as when killed).
    drop(dead);
    let runs = tmp.path().join("audit/runs");
    // Not run locks: a name that is no run ID, and a link named like one.
    std::fs::write(runs.join("notes.lock"), "x").expect("junk");
    std::os::unix::fs::symlink("/etc/hostname", runs.join("0123456789abcdef.lock")).expect("link");
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
    assert!(runs.join("notes.lock").exists());
    assert!(std::fs::symlink_metadata(runs.join("0123456789abcdef.lock")).is_ok());
}

#[test]
fn a_linked_or_writable_directory_and_a_fifo_log_are_refused() {
    let tmp = tempfile::tempdir().expect("tmp");
    let real = tmp.path().join("elsewhere");
    std::fs::create_dir(&real).expect("dir");
    std::os::unix::fs::symlink(&real, tmp.path().join("audit")).expect("link");
    let e = AuditTrail::open(config(tmp.path(), 1 << 20), info("x")).expect_err("linked dir");
    assert!(e.to_string().contains("symbolic link"), "{e}");
    std::fs::remove_file(tmp.path().join("audit")).expect("unlink");

    run(tmp.path(), 1);
    let dir = tmp.path().join("audit");
    let log = dir.join(chain::ACTIVE);
    std::fs::rename(&log, dir.join("kept")).expect("move the log aside");
    rustix::fs::mknodat(
        rustix::fs::CWD,
        &log,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o600),
        0,
    )
    .expect("fifo");
    // Opening a FIFO for writing would wait for a reader forever; it is refused instead.
    let e = AuditTrail::open(config(tmp.path(), 1 << 20), info("x")).expect_err("a fifo");
    assert!(e.to_string().contains("not a regular file"), "{e}");
    let v = verify(&dir, &tmp.path().join("state/head.json"));
    assert!(v.is_err_and(|e| e.to_string().contains("not a regular file")));
    std::fs::remove_file(&log).expect("rm fifo");
    std::fs::rename(dir.join("kept"), &log).expect("back");

    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o757)).expect("chmod");
    let e = AuditTrail::open(config(tmp.path(), 1 << 20), info("x")).expect_err("writable");
    assert!(e.to_string().contains("group- or world-writable"), "{e}");
}

#[test]
fn a_lock_held_too_long_fails_the_write_naming_the_lock() {
    let tmp = tempfile::tempdir().expect("tmp");
    run(tmp.path(), 0);
    // Another open file description holds the lock (as another process would).
    let held = std::fs::File::open(tmp.path().join("audit/.lock")).expect("lock file");
    rustix::fs::flock(&held, rustix::fs::FlockOperation::LockExclusive).expect("flock");
    let mut c = config(tmp.path(), 1 << 20);
    c.lock_wait = Duration::from_millis(50);
    let e = AuditTrail::open(c, info("x")).expect_err("not waiting forever");
    let text = e.to_string();
    assert!(
        text.contains(&tmp.path().join("audit/.lock").display().to_string())
            && text.contains("held by another process"),
        "{text}"
    );
}

#[test]
fn a_seq_with_no_successor_is_an_error_not_a_wrap() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("audit");
    std::fs::create_dir(&dir).expect("dir");
    let line = format!(
        "{{\"seq\":{},\"prev\":\"{}\"}}\n",
        u64::MAX,
        super::entry::ZERO_HASH
    );
    std::fs::write(dir.join(chain::ACTIVE), line).expect("log");
    let e = AuditTrail::open(config(tmp.path(), 1 << 20), info("x")).expect_err("overflow");
    assert!(e.to_string().contains("is the last there can be"), "{e}");
}

/// One `fs.stat` call record with a 200-byte path.
fn stat_record() -> super::AuditRecord {
    super::AuditRecord::new(
        &super::Redactor::default(),
        "p",
        "b",
        "fs.stat",
        serde_json::json!({"path": "x".repeat(200)}),
        "ok:absent",
        false,
        Duration::ZERO,
    )
}

#[test]
fn a_run_past_its_call_bytes_has_no_budget_left() {
    let tmp = tempfile::tempdir().expect("tmp");
    let mut c = config(tmp.path(), 1 << 20);
    c.max_call_bytes = 2000;
    let t = AuditTrail::open(c, info("x")).expect("open");
    let r = stat_record();
    let mut written = 0;
    while t.call_budget_left() {
        t.call(&r);
        written += 1;
    }
    assert!((3..=6).contains(&written), "{written}");
    t.end(None, 0, 0, 0).expect("end");
}

#[test]
fn a_batch_is_admitted_only_when_the_run_has_room_for_all_its_records() {
    let tmp = tempfile::tempdir().expect("tmp");
    let mut c = config(tmp.path(), 1 << 20);
    let line = super::limits::MAX_RECORD_LINE_BYTES as u64;
    c.max_call_bytes = 4 * (line + 1);
    let t = AuditTrail::open(c, info("x")).expect("open");
    assert!(t.call_room_for(1) && t.call_room_for(4));
    assert!(
        !t.call_room_for(5),
        "five worst-case records do not fit in four lines"
    );
    let r = stat_record();
    t.call(&r);
    assert!(t.call_budget_left() && t.call_room_for(1));
    assert!(
        t.call_room_for(4),
        "one short record and three worst-case ones fit"
    );
    assert!(
        !t.call_room_for(5),
        "one record and four worst-case ones do not"
    );
    t.end(None, 0, 0, 0).expect("end");
}
