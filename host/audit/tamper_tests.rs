//! A forged, cut or replaced trail, and what `verify` and the next writer make of it: each
//! tampering `verify` used to pass fails now, the writer never numbers below the head, and it
//! never cuts more than a torn record.

use super::chain::ACTIVE;
use super::head::Head;
use super::tests::{config, info, run};
use super::trail::AuditTrail;
use super::verify::{Verdict, verify};
use serde_json::Value;
use std::path::Path;

fn check(dir: &Path) -> Verdict {
    let c = config(dir, 1 << 20);
    verify(&c.dir, &c.head).expect("verify")
}

fn reason(v: &Verdict) -> &'static str {
    v.problem.as_ref().map_or("ok", |p| p.reason)
}

fn log(dir: &Path) -> std::path::PathBuf {
    dir.join("audit").join(ACTIVE)
}

fn lines(dir: &Path) -> Vec<String> {
    std::fs::read_to_string(log(dir))
        .expect("log")
        .lines()
        .map(str::to_string)
        .collect()
}

fn write_lines(dir: &Path, l: &[String]) {
    std::fs::write(log(dir), l.join("\n") + "\n").expect("tamper");
}

fn records(dir: &Path) -> Vec<Value> {
    lines(dir)
        .iter()
        .map(|l| serde_json::from_str(l).expect("json"))
        .collect()
}

#[test]
fn a_missing_head_fails_verify_naming_it() {
    let tmp = tempfile::tempdir().expect("tmp");
    run(tmp.path(), 3);
    assert!(check(tmp.path()).ok);
    let head = config(tmp.path(), 1).head;
    std::fs::remove_file(&head).expect("rm head");
    let v = check(tmp.path());
    assert_eq!(reason(&v), "head-missing", "{v:?}");
    let p = v.problem.expect("problem");
    assert_eq!(p.file, head.display().to_string());
    assert!(p.detail.contains(&head.display().to_string()), "{p:?}");
}

#[test]
fn a_log_cut_at_its_start_fails_verify() {
    let tmp = tempfile::tempdir().expect("tmp");
    run(tmp.path(), 6);
    let all = lines(tmp.path());
    // The first three records removed: no rotation dropped them (the floor is 1).
    write_lines(tmp.path(), &all[3..]);
    let v = check(tmp.path());
    assert_eq!(reason(&v), "floor-mismatch", "{v:?}");
    assert_eq!(
        v.problem.as_ref().map(|p| (p.line, p.seq)),
        Some((1, Some(4)))
    );
}

#[test]
fn a_log_starting_before_the_floor_was_replaced() {
    let tmp = tempfile::tempdir().expect("tmp");
    run(tmp.path(), 4);
    let c = config(tmp.path(), 1);
    let mut head = Head::read(&c.head).expect("head").expect("some");
    // As if rotation had dropped seq 1..2: a log that starts at 1 is not that log.
    head.floor = 3;
    head.write(&c.head).expect("write");
    let v = check(tmp.path());
    assert_eq!(reason(&v), "floor-mismatch", "{v:?}");
    assert!(v.problem.expect("p").detail.contains("replaced"));
    // And the head naming a record before the log's first.
    head.floor = 1;
    head.seq = 2;
    head.hash = super::chain::line_hash(lines(tmp.path())[1].as_bytes());
    head.write(&c.head).expect("write");
    let all = lines(tmp.path());
    write_lines(tmp.path(), &all[3..]);
    let v = check(tmp.path());
    assert_eq!(reason(&v), "head-before-log", "{v:?}");
}

#[test]
fn the_writer_numbers_after_the_head_and_names_the_gap() {
    let tmp = tempfile::tempdir().expect("tmp");
    run(tmp.path(), 5);
    let head = Head::read(&config(tmp.path(), 1).head)
        .expect("head")
        .expect("some");
    assert_eq!(head.seq, 7);
    let all = lines(tmp.path());
    write_lines(tmp.path(), &all[..3]);
    assert_eq!(reason(&check(tmp.path())), "truncated");
    let t = AuditTrail::open(config(tmp.path(), 1 << 20), info("next")).expect("open");
    t.end(None, 0, 0, 0).expect("end");
    let r = records(tmp.path());
    let seqs: Vec<u64> = r.iter().filter_map(|r| r["seq"].as_u64()).collect();
    assert_eq!(seqs, [1, 2, 3, 8, 9, 10], "never below the head: {r:?}");
    assert_eq!(r[3]["kind"], "repair");
    assert_eq!(r[3]["repair"], "log-behind-head");
    assert_eq!(r[3]["gap"], serde_json::json!({"first": 4, "last": 7}));
    assert_eq!(
        r[3]["prev"].as_str(),
        Some(super::chain::line_hash(all[2].as_bytes()).as_str()),
        "chained to the real last record"
    );
    // The gap is part of the chain; the record that names it is a break.
    let v = check(tmp.path());
    assert_eq!(reason(&v), "break", "{v:?}");
    assert_eq!(v.problem.as_ref().and_then(|p| p.seq), Some(8));
    assert!(
        v.warnings.iter().any(|w| w.contains("log-behind-head")),
        "{v:?}"
    );
}

#[test]
fn the_writer_notes_a_missing_or_damaged_head_an_edited_head_record_and_a_cut_start() {
    for tamper in ["head", "invalid", "edit", "start"] {
        let tmp = tempfile::tempdir().expect("tmp");
        run(tmp.path(), 4);
        let c = config(tmp.path(), 1);
        let all = lines(tmp.path());
        let expected = match tamper {
            "head" => {
                std::fs::remove_file(&c.head).expect("rm");
                "head-missing"
            }
            "invalid" => {
                std::fs::write(&c.head, "{").expect("damage");
                "head-invalid"
            }
            "edit" => {
                // The record the head names (the run's end) edited.
                let mut l = all.clone();
                let last = l.len() - 1;
                l[last] = l[last].replace("\"ok\"", "\"failed\"");
                write_lines(tmp.path(), &l);
                "head-mismatch"
            }
            _ => {
                write_lines(tmp.path(), &all[2..]);
                "floor-mismatch"
            }
        };
        let t = AuditTrail::open(config(tmp.path(), 1 << 20), info("next")).expect("open");
        t.end(None, 0, 0, 0).expect("end");
        let r = records(tmp.path());
        assert!(
            r.iter().any(|r| r["repair"] == expected),
            "{tamper}: {r:#?}"
        );
        let v = check(tmp.path());
        assert_eq!(reason(&v), "break", "{tamper}: {v:?}");
        assert!(v.warnings.iter().any(|w| w.contains(expected)), "{v:?}");
    }
}

#[test]
fn a_torn_tail_is_removed_up_to_its_cap_and_a_longer_one_refused() {
    let tmp = tempfile::tempdir().expect("tmp");
    run(tmp.path(), 1);
    let before = std::fs::read(log(tmp.path())).expect("log");
    let mut big = before.clone();
    big.extend(std::iter::repeat_n(
        b'y',
        super::limits::MAX_TORN_BYTES + 10,
    ));
    std::fs::write(log(tmp.path()), &big).expect("write");
    let e = AuditTrail::open(config(tmp.path(), 1 << 20), info("x")).expect_err("refused");
    assert!(e.to_string().contains("not removed"), "{e}");
    assert_eq!(
        std::fs::read(log(tmp.path())).expect("log"),
        big,
        "untouched"
    );
    assert_eq!(reason(&check(tmp.path())), "too-long");

    let mut small = before;
    small.extend_from_slice(b"{\"seq\":4,\"ti");
    std::fs::write(log(tmp.path()), &small).expect("write");
    assert!(check(tmp.path()).ok, "a torn record is only a warning");
    let t = AuditTrail::open(config(tmp.path(), 1 << 20), info("x")).expect("open");
    t.end(None, 0, 0, 0).expect("end");
    let r = records(tmp.path());
    assert!(r.iter().any(|r| r["repair"] == "torn-tail"), "{r:#?}");
    assert!(check(tmp.path()).ok);
}

#[test]
fn a_line_longer_than_any_record_is_reported_not_read() {
    let tmp = tempfile::tempdir().expect("tmp");
    run(tmp.path(), 2);
    let mut l = lines(tmp.path());
    l.insert(
        2,
        format!("{{\"seq\":3,\"x\":\"{}\"}}", "z".repeat(1 << 20)),
    );
    write_lines(tmp.path(), &l);
    let v = check(tmp.path());
    assert_eq!(reason(&v), "too-long", "{v:?}");
    assert_eq!(v.problem.as_ref().map(|p| p.line), Some(3));
    let e = super::query::read(&tmp.path().join("audit")).expect_err("too long");
    assert!(e.to_string().contains(":3: not an audit record"), "{e}");
}

/// A crash between the two head writes of a rotation leaves the old floor with the pending
/// one: the log verifies at either, and the next writer settles the floor without a note.
#[test]
fn a_rotation_cut_short_leaves_a_log_that_verifies() {
    let tmp = tempfile::tempdir().expect("tmp");
    let t = AuditTrail::open(config(tmp.path(), 400), info("r")).expect("open");
    for n in 1..=30 {
        super::tests::overflow(&t, n);
    }
    t.end(None, 0, 0, 0).expect("end");
    let c = config(tmp.path(), 400);
    let settled = Head::read(&c.head).expect("head").expect("some");
    assert!(
        settled.floor > 1 && settled.pending_floor.is_none(),
        "{settled:?}"
    );
    let mut cut = settled.clone();
    cut.pending_floor = Some(settled.floor);
    cut.floor = 1;
    cut.write(&c.head).expect("write");
    assert!(verify(&c.dir, &c.head).expect("verify").ok);
    cut.pending_floor = None;
    cut.write(&c.head).expect("write");
    let v = verify(&c.dir, &c.head).expect("verify");
    assert_eq!(reason(&v), "floor-mismatch", "{v:?}");
    cut.pending_floor = Some(settled.floor);
    cut.write(&c.head).expect("write");
    let t = AuditTrail::open(config(tmp.path(), 1 << 20), info("next")).expect("open");
    t.end(None, 0, 0, 0).expect("end");
    let after = Head::read(&c.head).expect("head").expect("some");
    assert_eq!((after.floor, after.pending_floor), (settled.floor, None));
    let v = verify(&c.dir, &c.head).expect("verify");
    assert!(v.ok, "{v:?}");
}

/// A head that names no record yet (the genesis head a new trail starts with) is what a kill
/// before the first head update leaves: the log after it verifies and the next writer goes on
/// without a note. It still vouches for where the log starts, and a forged one that names a
/// hash is no head; removing it is a removed head.
#[test]
fn a_head_naming_no_record_vouches_for_the_start_and_its_removal_is_a_break() {
    let tmp = tempfile::tempdir().expect("tmp");
    run(tmp.path(), 2);
    let c = config(tmp.path(), 1);
    Head::genesis().write(&c.head).expect("genesis");
    assert!(
        check(tmp.path()).ok,
        "records after the head: a kill leaves this"
    );
    let t = AuditTrail::open(config(tmp.path(), 1 << 20), info("next")).expect("open");
    t.end(None, 0, 0, 0).expect("end");
    assert!(!records(tmp.path()).iter().any(|r| r["kind"] == "repair"));
    assert!(check(tmp.path()).ok);

    let all = lines(tmp.path());
    Head::genesis().write(&c.head).expect("genesis");
    write_lines(tmp.path(), &all[2..]);
    assert_eq!(
        reason(&check(tmp.path())),
        "floor-mismatch",
        "cut at its start"
    );
    write_lines(tmp.path(), &all);

    let mut forged = Head::genesis();
    forged.hash = "ab".repeat(32);
    forged.write(&c.head).expect("forged");
    let v = check(tmp.path());
    assert_eq!(reason(&v), "head-mismatch", "{v:?}");
    assert_eq!(
        v.problem.map(|p| p.file),
        Some(c.head.display().to_string())
    );

    Head::genesis().write(&c.head).expect("genesis");
    std::fs::remove_file(&c.head).expect("rm");
    assert_eq!(reason(&check(tmp.path())), "head-missing");
    let t = AuditTrail::open(config(tmp.path(), 1 << 20), info("after")).expect("open");
    t.end(None, 0, 0, 0).expect("end");
    assert!(
        records(tmp.path())
            .iter()
            .any(|r| r["repair"] == "head-missing")
    );
    assert_eq!(reason(&check(tmp.path())), "break");
}

/// A new trail's head is written before its first record; a log that holds no record is no
/// evidence of anything, so a damaged head beside it is replaced by the genesis head.
#[test]
fn a_new_trail_starts_with_its_head() {
    let tmp = tempfile::tempdir().expect("tmp");
    let c = config(tmp.path(), 1 << 20);
    std::fs::create_dir_all(c.head.parent().expect("heads")).expect("heads");
    std::fs::write(&c.head, "{").expect("not a head");
    let t = AuditTrail::open(c.clone(), info("first")).expect("open");
    assert_eq!(
        Head::read(&c.head).expect("head").map(|h| h.seq),
        Some(1),
        "the run-start's"
    );
    t.end(None, 0, 0, 0).expect("end");
    assert!(!records(tmp.path()).iter().any(|r| r["kind"] == "repair"));
    assert!(check(tmp.path()).ok);
}
