//! The persistent audit trail (`docs/audit.md`), through the built binary on temporary roots:
//! plan and apply write a record per call and per run and phase; refused calls are recorded as
//! denied; a run killed mid-way leaves a log that verifies, and the next run marks it
//! interrupted and repairs a torn last line, saying so; `audit verify` names the first bad
//! record for each kind of tampering and a truncated tail; rotation keeps the chain; an apply
//! refuses to run without a trail, a plan warns; the journal gets the records as fields under
//! the real systemd harness.

#[path = "common/mod.rs"]
mod common;

use nodeward::audit::trail::{AuditTrail, RunInfo, TrailConfig};
use nodeward::plan::RunMode;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::Arc;

/// A host root with a state directory of its own (so its own audit head), sharing the
/// compiled-component cache of the CLI tests.
struct Host {
    f: common::Fixture,
    state: PathBuf,
}

impl Host {
    fn new() -> Host {
        let f = common::Fixture::new();
        let state = f.tmp.path().join("state");
        let shared = common::cli_state_dir().join("compiled");
        std::fs::create_dir_all(&shared).expect("shared cache");
        std::fs::set_permissions(&shared, std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .expect("cache mode");
        std::fs::create_dir_all(&state).expect("state");
        std::os::unix::fs::symlink(&shared, state.join("compiled")).expect("link the cache");
        Host { f, state }
    }

    fn dir(&self) -> PathBuf {
        self.f.root.join("var/log/nodeward/audit")
    }

    fn log(&self) -> PathBuf {
        self.dir().join("audit.jsonl")
    }

    /// The head `audit verify` names (one per trail; see `docs/audit.md`).
    fn head(&self) -> PathBuf {
        let v = self.verify_json();
        PathBuf::from(v["headFile"].as_str().expect("head file"))
    }

    fn verify_json(&self) -> Value {
        let out = self.run(&["audit", "verify", "--output", "json"], &[]);
        serde_json::from_slice(&out.stdout).expect("verify JSON")
    }

    fn run(&self, args: &[&str], env: &[(&str, &str)]) -> Output {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_nodeward"));
        cmd.args(args)
            .env("NODEWARD_ROOT", &self.f.root)
            .env("NODEWARD_STATE_DIR", &self.state)
            .env_remove("NODEWARD_LOG")
            .env_remove("NODEWARD_AUDIT_DIR")
            .env_remove("NODEWARD_TEST_ABORT")
            .env_remove("NODEWARD_TEST_AUDIT_ROTATE_BYTES")
            .env_remove("JOURNAL_STREAM")
            .env_remove("INVOCATION_ID");
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.output().expect("run nodeward")
    }

    /// Runs with `--output json`, requires `code`, returns stdout as JSON.
    #[track_caller]
    fn json(&self, args: &[&str], code: i32) -> Value {
        let mut all = args.to_vec();
        all.extend(["--output", "json"]);
        let out = self.run(&all, &[]);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {}", text(&out));
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{args:?}: {e}"))
    }

    fn records(&self) -> Vec<Value> {
        lines(&self.log())
            .iter()
            .map(|l| serde_json::from_str(l).expect("a record is JSON"))
            .collect()
    }

    fn verify(&self) -> Value {
        let out = self.run(&["audit", "verify", "--output", "json"], &[]);
        let v: Value = serde_json::from_slice(&out.stdout).expect("verify JSON");
        let want = if v["ok"] == true { 0 } else { 1 };
        assert_eq!(out.status.code(), Some(want), "{v:#}: {}", text(&out));
        v
    }
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .expect("audit log")
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn plan_and_apply_record_every_call_phase_and_run() {
    let h = Host::new();
    let plan = h.json(
        &["plan", "--phase", "preflight", "--phase", "setup-host"],
        0,
    );
    let apply = h.json(&["apply", "--phase", "setup-host"], 0);
    let records = h.records();
    let (plan_id, apply_id) = (
        plan["runId"].as_str().expect("plan run id"),
        apply["runId"].as_str().expect("apply run id"),
    );
    assert_ne!(plan_id, apply_id);
    for (id, mode, phases) in [
        (plan_id, "plan", vec!["preflight", "setup-host"]),
        (apply_id, "apply", vec!["setup-host"]),
    ] {
        let run: Vec<&Value> = records.iter().filter(|r| r["runId"] == id).collect();
        let first = run.first().expect("records of the run");
        assert_eq!(first["kind"], "run-start");
        assert_eq!(first["mode"], mode);
        assert_eq!(run.last().map(|r| &r["kind"]), Some(&json!("run-end")));
        assert_eq!(run.last().map(|r| &r["outcome"]), Some(&json!("ok")));
        let ended: Vec<&str> = run
            .iter()
            .filter(|r| r["kind"] == "phase-end")
            .filter_map(|r| r["phase"].as_str())
            .collect();
        assert_eq!(ended, phases);
        let calls: Vec<&&Value> = run.iter().filter(|r| r["kind"] == "call").collect();
        assert!(calls.len() > 5, "{mode}: {calls:?}");
        for c in &calls {
            assert_eq!(c["mode"], mode);
            assert_eq!(c["bundle"]["name"], "nodeward-default");
            assert!(
                c["component"].as_str().is_some_and(|d| d.len() == 64),
                "{c}"
            );
        }
        // What the run report counts is what the trail counts.
        let changes: u64 = run
            .iter()
            .filter(|r| r["kind"] == "phase-end")
            .flat_map(|r| r["changes"].as_array().into_iter().flatten())
            .filter_map(|c| c["count"].as_u64())
            .sum();
        let report = if mode == "plan" { &plan } else { &apply };
        assert_eq!(json!(changes), report["mutations"], "{mode}");
    }
    for (i, r) in records.iter().enumerate() {
        assert_eq!(r["seq"], i + 1, "seq counts every record");
    }
    assert_eq!(h.verify()["ok"], true);

    // Queries.
    let summary = h.json(&["audit", "summary"], 0);
    let runs = summary["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 2, "{summary:#}");
    assert_eq!(runs[0]["runId"], plan_id);
    assert_eq!(runs[0]["mode"], "plan");
    assert_eq!(runs[1]["outcome"], "ok");
    assert_eq!(runs[1]["phases"], json!(["setup-host"]));
    assert!(
        runs[1]["changes"]
            .as_array()
            .is_some_and(|c| c.iter().any(|c| c["kind"] == "file-create")),
        "{summary:#}"
    );
    let shown = |args: &[&str]| -> Vec<Value> {
        let mut all = vec!["audit", "show"];
        all.extend(args);
        h.json(&all, 0)["records"]
            .as_array()
            .cloned()
            .expect("records")
    };
    assert!(
        shown(&["--run", apply_id])
            .iter()
            .all(|r| r["runId"] == apply_id)
    );
    let preflight = shown(&["--phase", "preflight"]);
    assert!(!preflight.is_empty());
    assert!(preflight.iter().all(|r| r["runId"] == plan_id));
    let digest = records[1]["bundle"]["digest"].as_str().expect("digest");
    assert_eq!(
        shown(&["--bundle", &digest[..12]]).len(),
        records
            .iter()
            .filter(|r| r["bundle"]["digest"] == digest)
            .count()
    );
    assert!(shown(&["--bundle", "ffffffffffff"]).is_empty());
    assert_eq!(shown(&["--since", "1h"]).len(), records.len());
    assert!(shown(&["--since", "2999-01-01T00:00:00Z"]).is_empty());
    assert!(
        shown(&["--denied"]).is_empty(),
        "the default bundle is refused nothing"
    );
    let bad = h.run(&["audit", "show", "--since", "yesterday-ish"], &[]);
    assert_eq!(bad.status.code(), Some(2), "{}", text(&bad));

    // As text, a plan says it is one, with the command that made it, and its changes are
    // planned ones.
    let out = h.run(&["audit", "summary"], &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let summary = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = summary.lines().collect();
    assert_eq!(lines.len(), 2, "{summary}");
    assert!(
        lines[0].starts_with(&format!(
            "{plan_id} ok: plan of `nodeward plan --phase preflight --phase setup-host`, "
        )) && lines[0].contains(" planned changes ["),
        "{summary}"
    );
    assert!(
        lines[1].starts_with(&format!(
            "{apply_id} ok: `nodeward apply --phase setup-host`, "
        )) && lines[1].contains(" denied, changes [")
            && !lines[1].contains("plan"),
        "{summary}"
    );
}

/// Refused calls: the probe guest with grants that cover none of its calls, run by the library
/// with the trail the command line would open; `audit show --denied` lists each of them.
#[test]
fn refused_calls_are_recorded_as_denied() {
    let h = Host::new();
    let session = h.f.session(RunMode::Apply);
    let trail = AuditTrail::open(
        TrailConfig::new(h.dir(), h.head()),
        RunInfo {
            command: "probe".into(),
            mode: nodeward::audit::entry::Mode::Apply,
            root: h.f.root.display().to_string(),
        },
    )
    .expect("open the trail");
    assert!(session.trail.set(Arc::new(trail)).is_ok());
    let calls = json!([
        {"op": "fs.write-file", "path": "etc/shadow", "contents": "x", "mode": 0o644},
        {"op": "fs.remove-all", "path": "etc"},
        {"op": "systemd.daemon-reload"},
        // A terminal escape in an argument: clear the screen, set the window title.
        {"op": "fs.stat", "path": "etc/\u{1b}[2J\u{1b}]0;owned\u{7}"},
    ]);
    let results = common::probe(&session, common::grants("[fs]\nwrite = [\"w\"]\n"), calls);
    assert!(
        results.iter().all(|r| common::kind(r) == "denied"),
        "{results:?}"
    );
    let trail = session.trail().expect("trail");
    trail
        .end(None, session.audit.total(), session.audit.denied(), 0)
        .expect("run end");
    let denied = h.json(&["audit", "show", "--denied"], 0);
    let denied = denied["records"].as_array().expect("records");
    let calls: Vec<&str> = denied.iter().filter_map(|r| r["call"].as_str()).collect();
    assert_eq!(
        calls,
        [
            "fs.write-file",
            "fs.remove-all",
            "systemd.daemon-reload",
            "fs.stat"
        ]
    );
    assert!(denied.iter().all(|r| {
        r["outcome"]
            .as_str()
            .is_some_and(|o| o.starts_with("denied: "))
    }));
    let summary = h.json(&["audit", "summary"], 0);
    assert_eq!(summary["runs"][0]["denials"], 4, "{summary:#}");
    assert_eq!(h.verify()["ok"], true);
    // As text, the escape is shown, not obeyed.
    let shown = h.run(&["audit", "show", "--denied"], &[]);
    let out = String::from_utf8_lossy(&shown.stdout);
    assert!(!out.contains('\u{1b}') && !out.contains('\u{7}'), "{out:?}");
    assert!(out.contains("etc/\\u{1b}[2J\\u{1b}]0;owned\\u{7}"), "{out}");
}

/// Phases cannot flush the trail's retention: each line is cut to its cap after JSON
/// escaping, and a run writes at most its budget of call records; the rest are counted in the
/// `call-overflow` records. (Each of these calls' arguments escapes to about 80 KiB of JSON,
/// cut to a line of about 800 bytes; six phase runs of 1,000 calls each pass the run's
/// budget.)
#[test]
fn phases_cannot_flush_retention() {
    use nodeward::audit::limits::{MAX_CALL_BYTES_PER_RUN, MAX_RECORD_LINE_BYTES};
    let h = Host::new();
    let session = h.f.session(RunMode::Plan);
    let trail = AuditTrail::open(
        TrailConfig::new(h.dir(), h.head()),
        RunInfo {
            command: "flood".into(),
            mode: nodeward::audit::entry::Mode::Plan,
            root: h.f.root.display().to_string(),
        },
    )
    .expect("open the trail");
    assert!(session.trail.set(Arc::new(trail)).is_ok());
    let nasty = "\u{1}".repeat(300);
    let per_phase = 1000u64;
    let n = 6 * per_phase;
    for _ in 0..6 {
        let results = common::probe(
            &session,
            common::grants("[fs]\nwrite = [\"w\"]\n"),
            json!([{"op": "repeat", "n": per_phase, "call": {"op": "mounts.overlay",
                "lower": vec![nasty.clone(); 40], "upper": nasty, "work": nasty, "target": nasty}}]),
        );
        assert_eq!(
            results[0]["ok"],
            json!({"denied": per_phase}),
            "{results:?}"
        );
    }
    session
        .trail()
        .expect("trail")
        .end(None, n, n, 0)
        .expect("end");
    let text = std::fs::read_to_string(h.log()).expect("log");
    assert!(
        text.lines().all(|l| l.len() <= MAX_RECORD_LINE_BYTES),
        "a line over the cap"
    );
    let call_bytes: usize = text
        .lines()
        .filter(|l| l.contains("\"kind\":\"call\""))
        .map(|l| l.len() + 1)
        .sum();
    assert!(
        call_bytes as u64 <= MAX_CALL_BYTES_PER_RUN + MAX_RECORD_LINE_BYTES as u64,
        "{call_bytes}"
    );
    let records = h.records();
    let written = records.iter().filter(|r| r["kind"] == "call").count() as u64;
    let counted: u64 = records
        .iter()
        .filter(|r| r["kind"] == "call-overflow")
        .flat_map(|r| r["calls"].as_array().cloned().unwrap_or_default())
        .filter_map(|c| c["count"].as_u64())
        .sum();
    assert!(written < n, "the run's budget ended the records: {written}");
    assert_eq!(written + counted, n);
    assert_eq!(h.verify()["ok"], true);
}

#[cfg(feature = "test-hooks")]
#[test]
fn a_crash_mid_run_verifies_and_the_next_run_marks_it_interrupted_and_repairs_a_torn_line() {
    let h = Host::new();
    let out = h.run(
        &["apply", "--phase", "setup-host"],
        &[("NODEWARD_TEST_ABORT", "mutation:3")],
    );
    assert_eq!(out.status.code(), None, "killed: {}", text(&out));
    let dead = h.records()[0]["runId"]
        .as_str()
        .expect("run id")
        .to_string();
    assert_eq!(h.verify()["ok"], true, "the log of a killed run verifies");
    let summary = h.json(&["audit", "summary"], 0);
    assert_eq!(summary["runs"][0]["outcome"], "running");

    // A writer cut off mid-line.
    let torn = r#"{"seq":99,"time":"2026-"#;
    let mut bytes = std::fs::read(h.log()).expect("log");
    bytes.extend_from_slice(torn.as_bytes());
    std::fs::write(h.log(), &bytes).expect("torn line");
    let v = h.verify();
    assert_eq!(
        v["ok"], true,
        "a torn line past the head is no break: {v:#}"
    );
    assert!(v["warnings"].to_string().contains("torn"), "{v:#}");

    let next = h.run(&["plan", "--phase", "preflight"], &[]);
    assert_eq!(next.status.code(), Some(0), "{}", text(&next));
    let logged = text(&next);
    assert!(logged.contains("removed a torn last record"), "{logged}");
    assert!(
        logged.contains(&format!("run {dead} ended without its run-end record")),
        "{logged}"
    );
    let records = h.records();
    assert!(
        !std::fs::read_to_string(h.log())
            .expect("log")
            .contains(torn)
    );
    let repair = records
        .iter()
        .find(|r| r["kind"] == "repair")
        .expect("a repair record");
    assert_eq!(repair["repair"], "torn-tail");
    let end = records
        .iter()
        .find(|r| r["kind"] == "run-end" && r["runId"] == dead.as_str())
        .expect("the dead run's end");
    assert_eq!(end["outcome"], "interrupted");
    assert!(end["detectedBy"].is_string());
    assert_eq!(h.verify()["ok"], true);
    let summary = h.json(&["audit", "summary"], 0);
    assert_eq!(summary["runs"][0]["outcome"], "interrupted", "{summary:#}");
    assert_eq!(summary["runs"][1]["outcome"], "ok");
    // Noted once: a later run finds nothing dangling.
    h.run(&["plan", "--phase", "preflight"], &[]);
    let interrupted = h
        .records()
        .iter()
        .filter(|r| r["outcome"] == "interrupted")
        .count();
    assert_eq!(interrupted, 1);
}

#[test]
fn audit_verify_names_the_first_bad_record_of_each_kind_of_tampering() {
    let h = Host::new();
    h.json(
        &["plan", "--phase", "preflight", "--phase", "setup-host"],
        0,
    );
    let original = lines(&h.log());
    assert!(original.len() >= 6, "{original:?}");
    assert_eq!(h.verify()["ok"], true);
    let log = h.log().display().to_string();
    let tamper = |what: &str, edit: &dyn Fn(&mut Vec<String>), reason: &str, line, seq| {
        let mut l = original.clone();
        edit(&mut l);
        std::fs::write(h.log(), l.join("\n") + "\n").expect("tamper");
        let v = h.verify();
        assert_eq!(v["ok"], false, "{what}: {v:#}");
        let p = &v["problem"];
        assert_eq!(p["reason"], reason, "{what}: {v:#}");
        assert_eq!(p["file"], log.as_str(), "{what}");
        assert_eq!(p["line"], line, "{what}: {v:#}");
        assert_eq!(p["seq"], seq, "{what}: {v:#}");
        // And as text: exit 1 naming the file, line and seq.
        let out = h.run(&["audit", "verify"], &[]);
        assert_eq!(out.status.code(), Some(1));
        assert!(
            text(&out).contains(&format!("{log}:{line} (seq {seq})")),
            "{what}: {}",
            text(&out)
        );
    };
    tamper("remove", &|l| drop(l.remove(3)), "missing", 4, 5);
    tamper(
        "insert",
        &|l| {
            let copy = l[1].clone();
            l.insert(3, copy);
        },
        "out-of-order",
        4,
        2,
    );
    tamper("reorder", &|l| l.swap(2, 3), "out-of-order", 3, 4);
    tamper(
        "edit",
        &|l| l[2] = l[2].replacen("\"seq\":3,", "\"seq\":3, ", 1),
        "edited",
        3,
        3,
    );
    let n = original.len();
    tamper(
        "truncate the tail",
        &|l| drop(l.pop()),
        "truncated",
        n - 1,
        n,
    );
    tamper(
        "edit the last record",
        &|l| {
            let last = l.len() - 1;
            l[last] = l[last].replace("\"outcome\":\"ok\"", "\"outcome\":\"failed\"");
        },
        "head-mismatch",
        n,
        n,
    );
    std::fs::write(h.log(), original.join("\n") + "\n").expect("restore");
    assert_eq!(h.verify()["ok"], true);

    // Every spelling of the root finds the one head.
    let name = h.f.root.file_name().and_then(|n| n.to_str()).expect("name");
    let spelled = format!("{}/../{name}/.", h.f.root.display());
    let out = h.run(&["--root", &spelled, "audit", "verify"], &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));

    // A log without its head is not vouched for: exit 1, naming where the head belongs.
    let head = h.head();
    let kept = std::fs::read(&head).expect("head");
    std::fs::remove_file(&head).expect("remove the head");
    let v = h.verify();
    assert_eq!(v["problem"]["reason"], "head-missing", "{v:#}");
    let out = h.run(&["audit", "verify"], &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out).contains(&head.display().to_string()),
        "{}",
        text(&out)
    );
    std::fs::write(&head, kept).expect("restore the head");
    assert_eq!(h.verify()["ok"], true);
}

#[cfg(feature = "test-hooks")]
#[test]
fn rotation_keeps_the_chain_and_bounds_the_files() {
    let h = Host::new();
    let small = [("NODEWARD_TEST_AUDIT_ROTATE_BYTES", "2000")];
    for _ in 0..3 {
        let out = h.run(
            &["plan", "--phase", "preflight", "--phase", "setup-host"],
            &small,
        );
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    }
    let v = h.verify();
    assert_eq!(v["ok"], true, "{v:#}");
    let files = v["files"].as_array().expect("files");
    assert_eq!(files.len(), 8, "7 rotated files and the active one: {v:#}");
    assert!(
        v["retainedFrom"].as_u64() > Some(1),
        "the oldest were dropped: {v:#}"
    );
    // Across a rotation: the first record of the active file names the last of `.1`.
    let rotated = lines(&h.dir().join("audit.jsonl.1"));
    let active = lines(&h.log());
    let first: Value = serde_json::from_str(&active[0]).expect("record");
    let last = rotated.last().expect("a rotated record");
    assert_eq!(
        first["prev"].as_str(),
        Some(nodeward::audit::chain::line_hash(last.as_bytes()).as_str())
    );
    for f in files {
        let size = std::fs::metadata(f.as_str().expect("path"))
            .expect("file")
            .len();
        assert!(size < 2000 + 4096, "{f}: {size} bytes");
    }
    // Tampering with a rotated file is still found, and named there.
    let middle = h.dir().join("audit.jsonl.3");
    let mut l = lines(&middle);
    l.remove(1);
    std::fs::write(&middle, l.join("\n") + "\n").expect("tamper");
    let v = h.verify();
    assert_eq!(v["problem"]["file"], middle.display().to_string(), "{v:#}");
}

#[test]
fn apply_refuses_to_run_without_a_trail_and_plan_warns() {
    let h = Host::new();
    // A file where the trail's directory belongs: nothing can be written there.
    let blocker = h.f.root.join("var/log/nodeward");
    std::fs::create_dir_all(blocker.parent().expect("parent")).expect("var/log");
    std::fs::write(&blocker, b"not a directory").expect("blocker");
    let apply = h.run(&["apply", "--phase", "setup-host"], &[]);
    assert_eq!(apply.status.code(), Some(1), "{}", text(&apply));
    assert!(
        text(&apply).contains("refusing to apply without an audit trail")
            && text(&apply).contains("var/log/nodeward/audit"),
        "{}",
        text(&apply)
    );
    assert!(
        !h.f.root.join("etc").exists(),
        "the refused apply changed nothing"
    );
    let plan = h.json(&["plan", "--phase", "setup-host"], 0);
    assert_eq!(plan["runId"], Value::Null);

    // A link where the trail's directory belongs (to a directory that would do): refused, not
    // followed.
    std::fs::remove_file(&blocker).expect("unblock");
    std::fs::create_dir_all(&blocker).expect("var/log/nodeward");
    let elsewhere = h.f.tmp.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).expect("elsewhere");
    std::os::unix::fs::symlink(&elsewhere, blocker.join("audit")).expect("link");
    let apply = h.run(&["apply", "--phase", "setup-host"], &[]);
    assert_eq!(apply.status.code(), Some(1), "{}", text(&apply));
    assert!(
        text(&apply).contains("is a symbolic link: refused"),
        "{}",
        text(&apply)
    );
    assert_eq!(std::fs::read_dir(&elsewhere).expect("dir").count(), 0);
    let out = h.run(&["plan", "--phase", "setup-host"], &[]);
    assert!(
        text(&out).contains("planning without an audit trail"),
        "{}",
        text(&out)
    );
}

/// Under systemd the records reach the journal as `NODEWARD_*` fields. Run by
/// `scripts/test.sh` inside the harness's namespaces (docs/testing-systemd.md), where the
/// harness's journald listens on `/run/systemd/journal/socket`; the agent is told it runs
/// under systemd the way a service is (`INVOCATION_ID`).
#[test]
#[ignore = "needs the real systemd harness (scripts/test.sh)"]
fn the_journal_gets_each_record_as_fields() {
    assert!(
        Path::new(nodeward::audit::journal::JOURNAL_SOCKET).exists(),
        "no journal socket: run through scripts/test.sh"
    );
    let h = Host::new();
    let invocation = format!("{:032x}", std::process::id());
    let out = h.run(
        &["plan", "--phase", "preflight", "--output", "json"],
        &[("INVOCATION_ID", &invocation)],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let report: Value = serde_json::from_slice(&out.stdout).expect("report");
    let run = report["runId"].as_str().expect("run id");
    let sync = std::process::Command::new("journalctl")
        .arg("--sync")
        .status()
        .expect("journalctl --sync");
    assert!(sync.success());
    let journal = std::process::Command::new("journalctl")
        .args([
            "--no-pager",
            "-o",
            "json",
            &format!("NODEWARD_RUN={run}"),
            "NODEWARD_PHASE=preflight",
        ])
        .output()
        .expect("journalctl");
    let entries: Vec<Value> = String::from_utf8_lossy(&journal.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let calls: Vec<&Value> = entries
        .iter()
        .filter(|e| e["NODEWARD_KIND"] == "call")
        .collect();
    let recorded = h
        .records()
        .into_iter()
        .filter(|r| r["kind"] == "call" && r["phase"] == "preflight")
        .count();
    assert!(recorded > 0);
    assert_eq!(calls.len(), recorded, "{entries:#?}");
    assert!(calls.iter().all(|e| e["NODEWARD_CALL"].is_string()
        && e["NODEWARD_SEQ"].is_string()
        && e["NODEWARD_MODE"] == "plan"));
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("NODEWARD_"),
        "the journal's events never reach stderr"
    );
}
