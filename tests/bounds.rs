//! Host work a hostile phase drives is bounded: the audit trail (records kept, each record's
//! size, records emitted per phase), guest log lines (size and number) and plan-mode diffs.
//!
//! Each attack runs through the real boundary with the probe guest's `repeat` op. Memory is
//! measured as the growth of this process's peak RSS (`VmHWM`, reset through
//! `/proc/self/clear_refs` before each attack), since the agent here is this test process;
//! the tests of this file run one at a time so that one attack's peak is not another's. What
//! is emitted is captured by a tracing subscriber installed for the run.

mod common;

use common::*;
use nodeward::audit::limits::{
    MAX_ARG_BYTES, MAX_EMITTED_PER_PHASE, MAX_OUTCOME_BYTES, MAX_RECORDS,
};
use nodeward::caps::RunContext;
use nodeward::caps::log::limits::{MAX_LINE_BYTES, MAX_LINES_PER_PHASE};
use nodeward::grants::Grants;
use nodeward::plan::{ChangeKind, RunMode, diff_limits};
use nodeward::runtime::{Limits, PhaseError, PhaseReport};
use serde_json::{Value, json};
use std::io::Write;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Most the agent's peak RSS may grow during one attack, in MiB, beyond the memory the guest
/// itself was allowed (its linear memory lives in this process too). Without the bounds the
/// 10⁶-call attack alone grew it by about 1 GiB.
const RSS_CEILING_MIB: u64 = 96;

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// What a run emitted through tracing: the text (up to a cap, so a failing bound cannot take
/// the test down) and the number of bytes and lines.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<(Vec<u8>, u64, u64)>>);

const CAPTURE_CAP: usize = 16 << 20;

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut c = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if c.0.len() < CAPTURE_CAP {
            c.0.extend_from_slice(buf);
        }
        c.1 += buf.len() as u64;
        c.2 += buf.iter().filter(|b| **b == b'\n').count() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("capture").0).into_owned()
    }
    fn bytes(&self) -> u64 {
        self.0.lock().expect("capture").1
    }
    fn lines(&self) -> u64 {
        self.0.lock().expect("capture").2
    }
}

/// Runs the probe with `calls` under a capturing subscriber; `deadline` is the phase's.
fn run(
    session: &Arc<RunContext>,
    grants: Grants,
    calls: Value,
    deadline: Duration,
) -> (Result<PhaseReport, PhaseError>, Captured) {
    let loaded = load_guest(
        nodeward::built::TEST_GUEST_PROBE_COMPONENT,
        "probe",
        "probe",
    );
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::DEBUG)
        .finish();
    let mut ctx = ctx(session, "probe", grants);
    ctx.deadline = Instant::now() + deadline;
    let limits = Limits {
        deadline,
        ..Limits::default()
    };
    let result = tracing::subscriber::with_default(subscriber, || {
        runtime().run(&loaded, ctx, &calls.to_string(), limits)
    });
    (result, captured)
}

/// The single result of a probe run of one op.
fn only(result: Result<PhaseReport, PhaseError>) -> Value {
    let report = result.expect("probe run");
    let mut v: Vec<Value> = serde_json::from_str(&report.summary).expect("probe summary");
    assert_eq!(v.len(), 1);
    v.remove(0)
}

#[test]
fn a_million_allowed_calls_keep_the_agent_small() {
    let _serial = serial();
    let f = Fixture::new();
    f.put("etc/hosts", "127.0.0.1 localhost\n");
    let s = f.session(RunMode::Apply);
    let g = grants("[fs]\nread = [\"etc\"]\n");
    // Compile and warm up outside the measurement.
    let _ = run(&s, g.clone(), json!([]), Duration::from_secs(60));
    let before = reset_peak();
    let n = 1_000_000u64;
    let (result, out) = run(
        &s,
        g,
        json!([{"op": "repeat", "n": n, "call": {"op": "fs.stat", "path": "etc/hosts"}}]),
        Duration::from_secs(600),
    );
    let growth = peak_growth_mib(before);
    assert_eq!(only(result), json!({"ok": {"ok": n}}));
    // Every call is accounted for; the first MAX_RECORDS are kept, the rest counted.
    assert_eq!(s.audit.total(), n);
    assert_eq!(s.audit.records().len(), MAX_RECORDS);
    let over = s.audit.overflow();
    assert_eq!(over.len(), 1);
    assert_eq!(
        (over[0].call.as_str(), over[0].denied, over[0].count),
        ("fs.stat", false, n - MAX_RECORDS as u64)
    );
    // Emitted: the first MAX_EMITTED_PER_PHASE records, then one summary line.
    let text = out.text();
    assert_eq!(
        text.matches("capability call").count() as u64,
        MAX_EMITTED_PER_PHASE as u64 + 1,
        "{}",
        &text[text.len().saturating_sub(2000)..]
    );
    assert!(
        text.contains(&format!(
            "{} further capability calls of this phase were counted, not logged one by one",
            n - MAX_EMITTED_PER_PHASE as u64
        )) && text.contains(&format!("fs.stat: {}", n - MAX_EMITTED_PER_PHASE as u64)),
        "{}",
        &text[text.len().saturating_sub(2000)..]
    );
    assert!(out.lines() <= MAX_EMITTED_PER_PHASE as u64 + 10);
    eprintln!(
        "10^6 allowed calls: peak RSS grew {growth} MiB; {} bytes emitted",
        out.bytes()
    );
    assert!(
        growth < RSS_CEILING_MIB,
        "peak RSS grew {growth} MiB over 10^6 calls"
    );
}

#[test]
fn huge_denied_arguments_are_kept_and_logged_bounded() {
    let _serial = serial();
    let f = Fixture::new();
    let s = f.session(RunMode::Apply);
    let _ = run(&s, Grants::default(), json!([]), Duration::from_secs(60));
    let before = reset_peak();
    let big = 4 << 20;
    let calls = json!([
        // The value is checked for newlines, then the grant: denied with the value in the
        // arguments.
        {"op": "repeat", "n": 50, "pad": {"key": "value", "len": big},
         "call": {"op": "kernel.set-sysctl", "key": "net.ipv4.ip_forward", "value": "1"}},
        // The URL is in the arguments and in the denial's message (the outcome).
        {"op": "repeat", "n": 50, "pad": {"key": "url", "len": big},
         "call": {"op": "download.fetch", "url": "http://127.0.0.1:9/", "dest": "etc/x",
                  "sha256": "0".repeat(64)}},
    ]);
    let (result, out) = run(&s, Grants::default(), calls, Duration::from_secs(600));
    let report = result.expect("probe run");
    let growth = peak_growth_mib(before);
    let results: Vec<Value> = serde_json::from_str(&report.summary).expect("summary");
    assert_eq!(
        results,
        [json!({"ok": {"denied": 50}}), json!({"ok": {"denied": 50}})]
    );
    let records = s.audit.records();
    assert_eq!(records.len(), 100);
    for r in &records {
        assert!(r.denied);
        for v in r.args.as_object().expect("args object").values() {
            if let Some(text) = v.as_str() {
                assert!(
                    text.len() <= MAX_ARG_BYTES + 100,
                    "{} bytes kept",
                    text.len()
                );
            }
        }
        assert!(
            r.outcome.len() <= MAX_OUTCOME_BYTES + 100,
            "{}",
            r.outcome.len()
        );
    }
    // The kept prefix says what the value was: its length and digest.
    let value = records[0].args["value"].as_str().expect("value");
    assert!(
        value.contains(&format!("… ({big} bytes, sha256 ")),
        "{value}"
    );
    assert!(
        records[99]
            .outcome
            .starts_with("denied: download http://127.0.0.1:9/xxx")
    );
    assert!(records[99].outcome.contains(" bytes, sha256 "));
    // 100 records emitted, each a few KiB at most (4 MiB and more without the bounds).
    assert_eq!(out.text().matches("capability call denied").count(), 100);
    assert!(out.bytes() < 100 * 4096, "{} bytes emitted", out.bytes());
    eprintln!(
        "100 denied calls with 4 MiB arguments: peak RSS grew {growth} MiB; {} bytes emitted",
        out.bytes()
    );
    assert!(
        growth < RSS_CEILING_MIB,
        "peak RSS grew {growth} MiB over 100 huge denied calls"
    );
}

/// Logs one line of `len` bytes (`begin xxx…`) from a fresh session, after a warm-up run:
/// the run's result, its output, and how much the peak RSS grew (MiB).
fn log_one_line(len: u64) -> (Result<PhaseReport, PhaseError>, Captured, u64) {
    let _serial = serial();
    let f = Fixture::new();
    let s = f.session(RunMode::Apply);
    let _ = run(&s, Grants::default(), json!([]), Duration::from_secs(60));
    let before = reset_peak();
    let (result, out) = run(
        &s,
        Grants::default(),
        json!([{"op": "repeat", "n": 1, "pad": {"key": "message", "len": len},
                "call": {"op": "log", "message": "begin "}}]),
        Duration::from_secs(600),
    );
    (result, out, peak_growth_mib(before))
}

#[test]
fn a_huge_log_line_is_cut_and_described() {
    // Within the per-call bound on arguments (20 MiB, `Limits::hostcall_bytes`).
    let len = 16_000_000u64;
    let (result, out, growth) = log_one_line(len);
    assert_eq!(only(result), json!({"ok": {"ok": 1}}));
    let text = out.text();
    let line = text
        .lines()
        .find(|l| l.contains("begin xxx"))
        .expect("the log line");
    assert!(line.len() < MAX_LINE_BYTES + 300, "{} bytes", line.len());
    assert!(line.contains(&format!("… ({len} bytes, sha256 ")), "{line}");
    assert!(out.bytes() < 64 * 1024, "{} bytes emitted", out.bytes());
    // The guest holds the line (16 MB) and the host lifts one copy of it across the
    // boundary: the rest of the growth is what the host kept or wrote of it.
    let held = 2 * len / (1 << 20);
    eprintln!("a 16 MB log line: peak RSS grew {growth} MiB ({held} MiB of it the line itself)");
    assert!(
        growth < held + RSS_CEILING_MIB,
        "peak RSS grew {growth} MiB for a 16 MB line"
    );
}

/// A line longer than one call may pass (20 MiB) is not copied into the host: the run stops
/// with a trap naming the bound, and the agent's memory grows by the guest's own copy only.
#[test]
fn a_log_line_past_the_hostcall_bound_stops_the_run() {
    let len = 100_000_000u64;
    let (result, out, growth) = log_one_line(len);
    let err = result.expect_err("the hostcall bound stops the run");
    let text = err.to_string();
    assert!(
        matches!(err, PhaseError::Trapped { .. }) && text.contains("at most 20971520 bytes"),
        "{text}"
    );
    assert!(
        !out.text().contains("begin xxx"),
        "the line was never logged"
    );
    let held = len / (1 << 20);
    eprintln!(
        "a 100 MB log line refused: peak RSS grew {growth} MiB (the guest's copy {held} MiB)"
    );
    assert!(
        growth < held + RSS_CEILING_MIB,
        "peak RSS grew {growth} MiB: the host copied the line"
    );
}

#[test]
fn a_log_flood_is_cut_at_the_per_phase_limit_and_summarised() {
    let _serial = serial();
    let f = Fixture::new();
    let s = f.session(RunMode::Apply);
    let n = 100_000u64;
    let (result, out) = run(
        &s,
        Grants::default(),
        json!([{"op": "repeat", "n": n, "call": {"op": "log", "message": "flood"}}]),
        Duration::from_secs(600),
    );
    assert_eq!(only(result), json!({"ok": {"ok": n}}));
    let text = out.text();
    assert_eq!(
        text.lines().filter(|l| l.contains(": flood")).count() as u64,
        MAX_LINES_PER_PHASE
    );
    let dropped = n - MAX_LINES_PER_PHASE;
    assert!(
        text.contains(&format!(
            "{dropped} log lines ({} bytes) of this phase run were dropped",
            dropped * 5
        )),
        "{}",
        &text[text.len().saturating_sub(1000)..]
    );
    assert!(out.lines() <= MAX_LINES_PER_PHASE + 5);
}

/// `n` lines, each different from the same line of `lines(n, other_seed)`.
fn lines(n: usize, seed: &str) -> String {
    (0..n).map(|i| format!("{seed} {i}\n")).collect()
}

#[test]
fn a_huge_plan_diff_is_summarised_and_the_phase_finishes() {
    let _serial = serial();
    let f = Fixture::new();
    // 80,000 changed lines took 28.6 s against a 3 s deadline before diffs were bounded.
    f.put("etc/big.conf", &lines(80_000, "old"));
    f.put("etc/mid.conf", &lines(diff_limits::MAX_LINES, "old"));
    let s = f.session(RunMode::Plan);
    let g = grants("[fs]\nread = [\"etc\"]\nwrite = [\"etc\"]\n");
    let (result, _) = run(
        &s,
        g,
        json!([
            {"op": "fs.write-file", "path": "etc/big.conf", "contents": lines(80_000, "new"), "mode": 0o644},
            {"op": "fs.write-file", "path": "etc/mid.conf", "contents": lines(diff_limits::MAX_LINES, "new"), "mode": 0o644},
        ]),
        Duration::from_secs(5),
    );
    // The phase finished (no timeout) with both writes planned.
    let report = result.expect("the phase finishes within its deadline");
    let results: Vec<Value> = serde_json::from_str(&report.summary).expect("summary");
    assert_eq!(
        results,
        [json!({"ok": "changed"}), json!({"ok": "changed"})]
    );
    let changes = s.changes();
    let diff_of = |path: &str| -> String {
        changes
            .iter()
            .find_map(|c| match &c.kind {
                ChangeKind::FileReplace { path: p, diff, .. } if p == path => diff.clone(),
                _ => None,
            })
            .unwrap_or_else(|| panic!("a replace of {path}"))
    };
    let big = diff_of("etc/big.conf");
    assert!(
        big.starts_with("(no line diff: 80000 lines, above the 10000 line limit; sha256 "),
        "{big}"
    );
    // At the line limit a diff is tried; it is either complete or, past the time allowed,
    // the same summary: never a partial one.
    let mid = diff_of("etc/mid.conf");
    assert!(
        (mid.starts_with("--- a/etc/mid.conf") && mid.contains("+new 9999"))
            || mid.starts_with("(no line diff: the time allowed for diffing passed; sha256 "),
        "{}",
        &mid[..mid.len().min(300)]
    );
}
