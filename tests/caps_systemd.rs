//! The `systemd` capability through the real component boundary (the probe test guest).
//!
//! Two kinds of tests:
//! - plain ones (grant refusals, plan mode) need no systemd and run anywhere;
//! - `#[ignore]`d ones need the real systemd of the test harness, which `scripts/test.sh` starts
//!   (`scripts/test-systemd-start.sh`) and runs these binaries inside with `--include-ignored`.
//!   There the host root is `/`, `/etc/systemd/system` is the harness's scratch unit directory
//!   and the system bus is systemd's own (docs/testing-systemd.md).
//!
//! Every harness test uses unit names of its own (`nodeward-test-<pid>-<tag>.service`) and a
//! [`Units`] guard that stops, disables, unmasks and removes them, even when the test fails.

mod common;

use nodeward::audit::Redactor;
use nodeward::caps::PhaseCtx;
use nodeward::caps::RunContext;
use nodeward::grants::{Grants, SystemdGrant};
use nodeward::hostpath::{HostPath, HostRoot};
use nodeward::plan::{ChangeKind, RunMode};
use nodeward::runtime::Limits;
use serde_json::{Value, json};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Runs the probe with `grants` until `deadline`, making `calls`; one result per call.
fn probe_until(
    session: &Arc<RunContext>,
    grants: &Grants,
    deadline: Instant,
    calls: Value,
) -> Vec<Value> {
    let loaded = common::load_guest(
        nodeward::built::TEST_GUEST_PROBE_COMPONENT,
        "probe",
        "probe",
    );
    let ctx = PhaseCtx {
        phase: "probe".into(),
        bundle_digest: "test-bundle".into(),
        grants: Arc::new(grants.clone()),
        run: session.clone(),
        deadline,
        budget: Default::default(),
        pinned_artifacts: Default::default(),
        node_bridge: None,
    };
    let report = common::runtime()
        .run(&loaded, ctx, &calls.to_string(), Limits::default())
        .expect("probe runs");
    serde_json::from_str(&report.summary).expect("probe summary is JSON")
}

/// [`probe_until`] with a deadline a minute away.
fn probe(session: &Arc<RunContext>, grants: &Grants, calls: Value) -> Vec<Value> {
    probe_until(
        session,
        grants,
        Instant::now() + Duration::from_secs(60),
        calls,
    )
}

/// The one call's result, `{"ok": ..}` or `{"err": ..}`.
fn one(session: &Arc<RunContext>, grants: &Grants, call: Value) -> Value {
    probe(session, grants, json!([call])).remove(0)
}

#[track_caller]
fn ok(v: &Value) -> &Value {
    v.get("ok")
        .unwrap_or_else(|| panic!("expected ok, got {v}"))
}

#[track_caller]
fn err(v: &Value, kind: &str) -> String {
    assert_eq!(v["err"]["kind"], kind, "expected a {kind} error, got {v}");
    v["err"]["message"].as_str().unwrap_or_default().to_string()
}

/// Grants every verb on `units`, and the reload.
fn all_grants(units: &[String]) -> Grants {
    Grants {
        systemd: SystemdGrant {
            write: units.to_vec(),
            enable: units.to_vec(),
            start: units.to_vec(),
            mask: units.to_vec(),
            status: units.to_vec(),
            reload: true,
        },
        ..Grants::default()
    }
}

/// An apply session on the harness's real root (`/`), units in `unit_dir`.
fn harness_session(unit_dir: &str) -> Arc<RunContext> {
    let root = HostRoot::open(Path::new("/")).expect("open /");
    let mut session = RunContext::new(root, RunMode::Apply, Redactor::default());
    session.systemd.unit_dir = HostPath::parse(unit_dir).expect("unit dir");
    Arc::new(session)
}

/// Units this test created; dropping it stops, disables, unmasks and removes them, then
/// reloads systemd, whatever state the test left them in.
struct Units {
    names: Vec<String>,
    session: Arc<RunContext>,
}

impl Units {
    fn new(session: &Arc<RunContext>, tags: &[&str]) -> Self {
        let names = tags
            .iter()
            .map(|t| format!("nodeward-test-{}-{t}.service", std::process::id()))
            .collect();
        Units {
            names,
            session: session.clone(),
        }
    }

    fn grants(&self) -> Grants {
        all_grants(&self.names)
    }
}

impl Drop for Units {
    fn drop(&mut self) {
        let mut calls = Vec::new();
        for u in &self.names {
            for op in ["stop", "disable", "unmask", "remove-unit", "reset-failed"] {
                calls.push(json!({ "op": format!("systemd.{op}"), "unit": u }));
            }
        }
        calls.push(json!({ "op": "systemd.daemon-reload" }));
        probe(&self.session, &self.grants(), Value::Array(calls));
    }
}

fn unit_file(exec: &str, extra_service: &str, install: &str) -> String {
    format!(
        "[Unit]\nDescription=nodeward test unit\n\n[Service]\nExecStart={exec}\n{extra_service}\n{install}"
    )
}

fn status(session: &Arc<RunContext>, grants: &Grants, unit: &str) -> Value {
    ok(&one(
        session,
        grants,
        json!({ "op": "systemd.status", "unit": unit }),
    ))
    .clone()
}

fn call(op: &str, unit: &str) -> Value {
    json!({ "op": format!("systemd.{op}"), "unit": unit })
}

fn reload() -> Value {
    json!({ "op": "systemd.daemon-reload" })
}

#[test]
#[ignore = "needs the real systemd harness (scripts/test.sh)"]
fn start_restart_stop_a_real_service() {
    let session = harness_session("etc/systemd/system");
    let units = Units::new(&session, &["sleep"]);
    let (g, u) = (units.grants(), units.names[0].as_str());
    let r = probe(
        &session,
        &g,
        json!([
            { "op": "systemd.write-unit", "unit": u, "contents": unit_file("/bin/sleep 300", "", "") },
            reload(),
            call("status", u),
            call("start", u),
            call("start", u),
        ]),
    );
    assert_eq!(ok(&r[0]), "created");
    assert_eq!(ok(&r[2])["load-state"], "loaded", "{}", r[2]);
    assert_eq!(ok(&r[2])["active-state"], "inactive", "{}", r[2]);
    assert_eq!(ok(&r[3]), "changed");
    assert_eq!(ok(&r[4]), "unchanged", "start of an active unit");

    let st = status(&session, &g, u);
    assert_eq!(
        (&st["active-state"], &st["sub-state"]),
        (&json!("active"), &json!("running")),
        "{st}"
    );
    let pid = st["main-pid"].as_u64().expect("main pid");
    assert!(pid > 0, "{st}");
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).expect("main PID is alive");
    assert!(
        String::from_utf8_lossy(&cmdline).contains("sleep"),
        "PID {pid} is the unit's sleep (so the test runs inside the harness's pid namespace)"
    );

    assert_eq!(ok(&one(&session, &g, call("restart", u))), "changed");
    let st = status(&session, &g, u);
    let new_pid = st["main-pid"].as_u64().expect("main pid");
    assert!(
        new_pid > 0 && new_pid != pid,
        "restart gives a new PID: {st}"
    );
    assert_eq!(st["active-state"], "active");

    let r = probe(&session, &g, json!([call("stop", u), call("stop", u)]));
    assert_eq!(ok(&r[0]), "changed");
    assert_eq!(ok(&r[1]), "unchanged", "stop of an inactive unit");
    let st = status(&session, &g, u);
    assert_eq!(st["active-state"], "inactive", "{st}");
    assert_eq!(st["main-pid"], 0, "{st}");
    assert!(
        !Path::new(&format!("/proc/{new_pid}")).exists(),
        "stopped main PID is gone"
    );

    let kinds: Vec<String> = session
        .changes()
        .iter()
        .filter(|c| {
            !matches!(
                c.kind,
                ChangeKind::FileCreate { .. } | ChangeKind::UnitWrite { .. }
            )
        })
        .map(|c| format!("{:?}", c.kind))
        .collect();
    assert_eq!(
        kinds,
        [
            "DaemonReload".to_string(),
            format!("UnitStart {{ unit: \"{u}\" }}"),
            format!("UnitRestart {{ unit: \"{u}\" }}"),
            format!("UnitStop {{ unit: \"{u}\" }}"),
        ],
        "only what changed is recorded"
    );
}

#[test]
#[ignore = "needs the real systemd harness (scripts/test.sh)"]
fn enable_creates_the_wants_link_and_disable_removes_it() {
    let session = harness_session("etc/systemd/system");
    let units = Units::new(&session, &["enable"]);
    let (g, u) = (units.grants(), units.names[0].as_str());
    let contents = unit_file(
        "/bin/sleep 300",
        "",
        "[Install]\nWantedBy=multi-user.target\n",
    );
    let link = Path::new("/etc/systemd/system/multi-user.target.wants").join(u);
    let r = probe(
        &session,
        &g,
        json!([
            { "op": "systemd.write-unit", "unit": u, "contents": contents },
            reload(),
            call("enable", u),
            call("enable", u),
        ]),
    );
    assert_eq!(ok(&r[2]), "changed", "{r:?}");
    assert_eq!(ok(&r[3]), "unchanged", "already enabled");
    let target = std::fs::read_link(&link).expect("wants link");
    assert_eq!(target, Path::new("/etc/systemd/system").join(u));

    let r = probe(
        &session,
        &g,
        json!([call("disable", u), call("disable", u)]),
    );
    assert_eq!(ok(&r[0]), "changed");
    assert_eq!(ok(&r[1]), "unchanged", "already disabled");
    assert!(std::fs::symlink_metadata(&link).is_err(), "link removed");
}

#[test]
#[ignore = "needs the real systemd harness (scripts/test.sh)"]
fn mask_prevents_start_and_never_replaces_a_unit_file() {
    // The unit file lives in /run/systemd/system, so the mask link in /etc/systemd/system
    // (which takes precedence) can shadow it.
    let session = harness_session("run/systemd/system");
    let units = Units::new(&session, &["masked"]);
    let (g, u) = (units.grants(), units.names[0].as_str());
    let r = probe(
        &session,
        &g,
        json!([
            { "op": "systemd.write-unit", "unit": u, "contents": unit_file("/bin/sleep 300", "", "") },
            call("mask", u),
            call("mask", u),
            reload(),
            call("start", u),
            call("status", u),
        ]),
    );
    assert_eq!(ok(&r[1]), "changed", "{r:?}");
    assert_eq!(ok(&r[2]), "unchanged", "already masked");
    assert_eq!(
        std::fs::read_link(Path::new("/etc/systemd/system").join(u)).expect("mask link"),
        Path::new("/dev/null")
    );
    let message = err(&r[4], "failed");
    assert!(
        message.contains(u) && message.contains("masked"),
        "{message}"
    );
    assert_eq!(ok(&r[5])["load-state"], "masked");

    let r = probe(
        &session,
        &g,
        json!([
            call("unmask", u),
            call("unmask", u),
            reload(),
            call("start", u),
            call("stop", u)
        ]),
    );
    assert_eq!(ok(&r[0]), "changed", "{r:?}");
    assert_eq!(ok(&r[1]), "unchanged");
    assert_eq!(ok(&r[3]), "changed", "starts once unmasked: {r:?}");

    // A unit file of the same name in /etc/systemd/system is never replaced by the mask link.
    let etc = harness_session("etc/systemd/system");
    let _etc_copy = Units {
        names: units.names.clone(),
        session: etc.clone(),
    };
    let r = probe(
        &etc,
        &g,
        json!([
            { "op": "systemd.write-unit", "unit": u, "contents": unit_file("/bin/true", "", "") },
            call("mask", u),
        ]),
    );
    assert_eq!(ok(&r[0]), "created");
    let message = err(&r[1], "io");
    assert!(
        message.contains(&format!("mask {u}"))
            && message.contains("org.freedesktop.systemd1.UnitExists"),
        "names the unit and the D-Bus error: {message}"
    );
    let file = Path::new("/etc/systemd/system").join(u);
    assert!(
        std::fs::symlink_metadata(&file)
            .expect("unit file")
            .is_file(),
        "still the unit file"
    );
    assert_eq!(
        ok(&one(&etc, &g, call("remove-unit", u))),
        "removed",
        "clean up the /etc copy"
    );
}

#[test]
#[ignore = "needs the real systemd harness (scripts/test.sh)"]
fn a_unit_that_fails_gives_a_typed_failed_error() {
    let session = harness_session("etc/systemd/system");
    let units = Units::new(&session, &["false"]);
    let (g, u) = (units.grants(), units.names[0].as_str());
    let r = probe(
        &session,
        &g,
        json!([
            { "op": "systemd.write-unit", "unit": u, "contents": unit_file("/bin/false", "Type=oneshot", "") },
            reload(),
            call("start", u),
            call("status", u),
            call("reset-failed", u),
            call("status", u),
        ]),
    );
    let message = err(&r[2], "failed");
    assert!(
        message.contains(u) && message.contains("job failed") && message.contains("exit-code"),
        "names the unit, the job result and the unit's result: {message}"
    );
    assert_eq!(ok(&r[3])["active-state"], "failed", "{}", r[3]);
    assert!(ok(&r[4]).is_null(), "{}", r[4]);
    assert_eq!(ok(&r[5])["active-state"], "inactive", "{}", r[5]);
}

#[test]
#[ignore = "needs the real systemd harness (scripts/test.sh)"]
fn unknown_units_and_the_deadline() {
    let session = harness_session("etc/systemd/system");
    let units = Units::new(&session, &["absent", "slow"]);
    let g = units.grants();
    let (absent, slow) = (units.names[0].as_str(), units.names[1].as_str());

    let r = probe(
        &session,
        &g,
        json!([call("status", absent), call("start", absent)]),
    );
    assert_eq!(ok(&r[0])["load-state"], "not-found", "{}", r[0]);
    assert_eq!(ok(&r[0])["main-pid"], 0);
    assert!(err(&r[1], "not-found").contains(absent));

    // A oneshot that takes 30 s cannot finish before a deadline 1 s away.
    let r = probe(
        &session,
        &g,
        json!([
            { "op": "systemd.write-unit", "unit": slow, "contents": unit_file("/bin/sleep 30", "Type=oneshot", "") },
            reload(),
        ]),
    );
    assert!(r.iter().all(|v| v.get("ok").is_some()), "{r:?}");
    let started = Instant::now();
    let r = probe_until(
        &session,
        &g,
        started + Duration::from_secs(1),
        json!([call("start", slow)]),
    );
    let waited = started.elapsed();
    let message = err(&r[0], "timeout");
    assert!(message.contains(slow), "{message}");
    assert!(
        waited >= Duration::from_millis(900) && waited < Duration::from_secs(10),
        "waited until the deadline, not longer: {waited:?}"
    );
}

/// Grant refusals need no systemd: the grant is checked before any file or bus access.
#[test]
fn every_verb_is_refused_without_its_grant() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let session = Arc::new(RunContext::new(
        HostRoot::open(tmp.path()).expect("root"),
        RunMode::Apply,
        Redactor::default(),
    ));
    // Grants for another unit only, and no reload.
    let g = all_grants(&["other.service".to_string()]);
    let g = Grants {
        systemd: SystemdGrant {
            reload: false,
            ..g.systemd
        },
        ..g
    };
    let u = "kubelet.service";
    let calls = [
        (
            "systemd.write-unit",
            json!({ "op": "systemd.write-unit", "unit": u, "contents": "[Unit]\n" }),
        ),
        ("systemd.enable", call("enable", u)),
        ("systemd.start", call("start", u)),
        ("systemd.mask", call("mask", u)),
        ("systemd.status", call("status", u)),
        ("systemd.daemon-reload", reload()),
    ];
    let r = probe(
        &session,
        &g,
        Value::Array(calls.iter().map(|(_, c)| c.clone()).collect()),
    );
    for ((name, _), result) in calls.iter().zip(&r) {
        let message = err(result, "denied");
        assert!(message.contains("grant"), "{name}: {message}");
    }
    let records = session.audit.records();
    for (name, _) in &calls {
        let rec = records
            .iter()
            .find(|rec| rec.call == *name)
            .unwrap_or_else(|| panic!("{name} is audited"));
        assert!(rec.denied, "{name}: {rec:?}");
    }
    assert!(session.changes().is_empty());
    assert_eq!(
        std::fs::read_dir(tmp.path()).expect("root").count(),
        0,
        "nothing written"
    );
}

/// Plan mode records the lifecycle verbs and changes nothing. Without a bus it lists every
/// verb (it cannot know); with one (inside the harness) it asks systemd and leaves out what
/// would change nothing: a unit that is not running is not stopped, one that is not enabled
/// is not disabled.
#[test]
fn plan_mode_records_lifecycle_verbs_and_asks_systemd_when_it_can() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let session = Arc::new(RunContext::new(
        HostRoot::open(tmp.path()).expect("root"),
        RunMode::Plan,
        Redactor::default(),
    ));
    let unit_dir = tmp.path().join("etc/systemd/system");
    std::fs::create_dir_all(&unit_dir).expect("unit dir");
    let u = "kubelet.service";
    let g = all_grants(&[u.to_string()]);
    let r = probe(
        &session,
        &g,
        json!([
            { "op": "systemd.write-unit", "unit": u, "contents": "[Service]\nExecStart=/bin/true\n" },
            reload(),
            call("enable", u),
            call("start", u),
            call("restart", u),
            call("stop", u),
            call("mask", u),
            call("unmask", u),
            call("disable", u),
            call("reset-failed", u),
        ]),
    );
    assert_eq!(ok(&r[0]), "created");
    for v in &r[1..] {
        assert!(v.get("ok").is_some(), "{v}");
    }
    let kinds: Vec<&'static str> = session
        .changes()
        .iter()
        .map(|c| match &c.kind {
            ChangeKind::FileCreate { .. } => "file",
            ChangeKind::UnitWrite { .. } => "write",
            ChangeKind::DaemonReload => "reload",
            ChangeKind::UnitEnable { .. } => "enable",
            ChangeKind::UnitStart { .. } => "start",
            ChangeKind::UnitRestart { .. } => "restart",
            ChangeKind::UnitStop { .. } => "stop",
            ChangeKind::UnitMask { .. } => "mask",
            ChangeKind::UnitUnmask { .. } => "unmask",
            ChangeKind::UnitDisable { .. } => "disable",
            ChangeKind::UnitResetFailed { .. } => "reset-failed",
            _ => "other",
        })
        .collect();
    let with_bus = session.systemd.manager().is_ok();
    let expected: Vec<&str> = [
        "file",
        "write",
        "reload",
        "enable",
        "start",
        "restart",
        "stop",
        "mask",
        "unmask",
        "disable",
        "reset-failed",
    ]
    .into_iter()
    .filter(|k| !(with_bus && matches!(*k, "stop" | "disable")))
    .collect();
    assert_eq!(kinds, expected, "with a bus: {with_bus}");
    assert_eq!(
        std::fs::read_dir(&unit_dir).expect("unit dir").count(),
        0,
        "plan mode touched nothing"
    );
}
