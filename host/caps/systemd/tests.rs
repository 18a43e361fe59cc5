//! The capability's plan/apply logic against the [`RecordingManager`]: which verbs reach
//! systemd in which mode, which changes are recorded, what a phase gets back when systemd
//! fails, and that grants are checked before systemd is even connected. Unit files go through
//! the root filesystem of a temporary host root. What systemd itself does with each verb is
//! tested against a real systemd in `tests/caps_systemd.rs`.

use super::recording::{Activity, Call, Op, RecordingManager, UnitEntry};
use super::*;
use crate::audit::Redactor;
use crate::caps::RunContext;
use crate::grants::{Grants, SystemdGrant};
use crate::hostpath::HostRoot;
use crate::wit::systemd::Host as _;
use std::os::unix::fs::PermissionsExt as _;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

const KUBELET: &str = "kubelet.service";
const CONTAINERD: &str = "containerd.service";

/// A run over a fresh temporary host root in `mode`, systemd being `systemd`.
fn run_with(mode: RunMode, systemd: SystemdContext) -> (tempfile::TempDir, Arc<RunContext>) {
    let root = tempfile::tempdir().expect("tempdir");
    let mut run = RunContext::new(
        HostRoot::open(root.path()).expect("host root"),
        mode,
        Redactor::default(),
    );
    run.systemd = systemd;
    (root, Arc::new(run))
}

fn unit_dir() -> HostPath {
    HostPath::parse(DEFAULT_UNIT_DIR).expect("unit dir")
}

/// The run's systemd is `manager`.
fn recorded(manager: &Arc<RecordingManager>) -> SystemdContext {
    SystemdContext::with_manager(unit_dir(), manager.clone())
}

/// systemd is `manager`, reached through a connector that counts its calls in `connects`.
fn counted(manager: &Arc<RecordingManager>, connects: &Arc<AtomicUsize>) -> SystemdContext {
    let (manager, connects) = (manager.clone(), connects.clone());
    SystemdContext::with_connector(unit_dir(), move || {
        connects.fetch_add(1, Ordering::SeqCst);
        Ok(manager.clone() as Arc<dyn UnitManager>)
    })
}

/// systemd cannot be reached; `connects` counts the attempts.
fn unreachable_systemd(connects: &Arc<AtomicUsize>) -> SystemdContext {
    let connects = connects.clone();
    SystemdContext::with_connector(unit_dir(), move || {
        connects.fetch_add(1, Ordering::SeqCst);
        Err(Error::Unavailable("systemd: no system bus".into()))
    })
}

fn phase(run: &Arc<RunContext>, grants: Grants) -> PhaseCtx {
    PhaseCtx {
        phase: "test".into(),
        bundle_digest: "test-bundle".into(),
        grants: Arc::new(grants),
        run: run.clone(),
        deadline: Instant::now() + Duration::from_secs(60),
        pinned_artifacts: Default::default(),
        node_bridge: None,
        budget: Default::default(),
    }
}

/// Every verb on `units`, and the reload.
fn granted(units: &[&str]) -> Grants {
    let units: Vec<String> = units.iter().map(|u| u.to_string()).collect();
    Grants {
        systemd: SystemdGrant {
            write: units.clone(),
            enable: units.clone(),
            start: units.clone(),
            mask: units.clone(),
            status: units,
            reload: true,
        },
        ..Grants::default()
    }
}

/// The run's changes that are about units (unit files and lifecycle), in order.
fn unit_changes(run: &RunContext) -> Vec<ChangeKind> {
    run.changes()
        .into_iter()
        .map(|c| c.kind)
        .filter(|k| {
            !matches!(
                k,
                ChangeKind::FileCreate { .. }
                    | ChangeKind::FileReplace { .. }
                    | ChangeKind::DirCreate { .. }
                    | ChangeKind::Remove { .. }
            )
        })
        .collect()
}

/// The outcome of a call that must succeed.
#[track_caller]
fn ok(r: Result<Outcome, Error>) -> Outcome {
    r.unwrap_or_else(|e| panic!("expected success, got {e:?}"))
}

fn s(unit: &str) -> String {
    unit.to_string()
}

#[test]
fn plan_calls_no_mutating_verb_and_lists_each_change() {
    // kubelet could be enabled and started; containerd could be disabled and stopped.
    let manager = Arc::new(
        RecordingManager::new()
            .with_unit(KUBELET, UnitEntry::default())
            .with_unit(CONTAINERD, UnitEntry::running()),
    );
    let (_root, run) = run_with(RunMode::Plan, recorded(&manager));
    let mut ctx = phase(&run, granted(&[KUBELET, CONTAINERD]));

    ctx.daemon_reload().expect("reload");
    for outcome in [
        ctx.enable(s(KUBELET)),
        ctx.start(s(KUBELET)),
        ctx.restart(s(KUBELET)),
        ctx.mask(s(KUBELET)),
        ctx.unmask(s(KUBELET)),
        ctx.disable(s(CONTAINERD)),
        ctx.stop(s(CONTAINERD)),
    ] {
        assert_eq!(outcome.expect("planned"), Outcome::Changed);
    }
    ctx.reset_failed(s(KUBELET)).expect("reset-failed");

    assert_eq!(manager.mutations(), [], "plan mode changed systemd");
    assert_eq!(
        manager.calls(),
        [
            Call::new(Op::WouldEnable, KUBELET),
            Call::new(Op::WouldStart, KUBELET),
            Call::new(Op::WouldDisable, CONTAINERD),
            Call::new(Op::WouldStop, CONTAINERD),
        ],
        "only the probes"
    );
    assert_eq!(manager.unit(KUBELET), Some(UnitEntry::default()));
    assert_eq!(manager.unit(CONTAINERD), Some(UnitEntry::running()));
    assert_eq!(
        unit_changes(&run),
        [
            ChangeKind::DaemonReload,
            ChangeKind::UnitEnable { unit: s(KUBELET) },
            ChangeKind::UnitStart { unit: s(KUBELET) },
            ChangeKind::UnitRestart { unit: s(KUBELET) },
            ChangeKind::UnitMask { unit: s(KUBELET) },
            ChangeKind::UnitUnmask { unit: s(KUBELET) },
            ChangeKind::UnitDisable {
                unit: s(CONTAINERD)
            },
            ChangeKind::UnitStop {
                unit: s(CONTAINERD)
            },
            ChangeKind::UnitResetFailed { unit: s(KUBELET) },
        ]
    );
}

/// A plan against a running node is empty: what systemd says is already so is not listed.
/// Restart is not probed (a phase calls it only when the unit's inputs changed).
#[test]
fn plan_with_systemd_saying_already_so_is_unchanged() {
    let manager = Arc::new(
        RecordingManager::new()
            .with_unit(KUBELET, UnitEntry::running())
            .with_unit(CONTAINERD, UnitEntry::default()),
    );
    let (_root, run) = run_with(RunMode::Plan, recorded(&manager));
    let mut ctx = phase(&run, granted(&[KUBELET, CONTAINERD, "gone.service"]));

    for outcome in [
        ctx.enable(s(KUBELET)),
        ctx.start(s(KUBELET)),
        ctx.disable(s(CONTAINERD)),
        ctx.stop(s(CONTAINERD)),
        ctx.stop(s("gone.service")),
        ctx.disable(s("gone.service")),
    ] {
        assert_eq!(outcome.expect("planned"), Outcome::Unchanged);
    }
    assert_eq!(unit_changes(&run), []);
    assert_eq!(ok(ctx.restart(s(KUBELET))), Outcome::Changed);
    assert_eq!(manager.mutations(), []);
}

/// Without systemd a plan cannot know, so it lists every verb; each call tries to connect
/// again, and `status` (which must ask) reports `unavailable`.
#[test]
fn plan_without_systemd_lists_every_verb() {
    let connects = Arc::new(AtomicUsize::new(0));
    let (_root, run) = run_with(RunMode::Plan, unreachable_systemd(&connects));
    let mut ctx = phase(&run, granted(&[KUBELET]));

    for outcome in [
        ctx.enable(s(KUBELET)),
        ctx.start(s(KUBELET)),
        ctx.stop(s(KUBELET)),
        ctx.disable(s(KUBELET)),
    ] {
        assert_eq!(outcome.expect("planned"), Outcome::Changed);
    }
    let e = ctx.status(s(KUBELET)).expect_err("no systemd");
    assert!(
        matches!(&e, Error::Unavailable(m) if m.contains("no system bus")),
        "{e:?}"
    );
    assert_eq!(
        connects.load(Ordering::SeqCst),
        5,
        "a failed connect is not kept"
    );
    assert_eq!(unit_changes(&run).len(), 4);
}

/// Apply calls the verb and records a change only when systemd reports one; it never probes.
#[test]
fn apply_records_a_change_only_when_systemd_reports_one() {
    let manager = Arc::new(RecordingManager::new().with_unit(KUBELET, UnitEntry::default()));
    let (_root, run) = run_with(RunMode::Apply, recorded(&manager));
    let mut ctx = phase(&run, granted(&[KUBELET]));
    let u = || s(KUBELET);

    ctx.daemon_reload().expect("reload");
    let outcomes = [
        ctx.enable(u()),
        ctx.enable(u()),
        ctx.start(u()),
        ctx.start(u()),
        ctx.restart(u()),
        ctx.stop(u()),
        ctx.stop(u()),
        ctx.disable(u()),
        ctx.disable(u()),
        ctx.mask(u()),
        ctx.mask(u()),
        ctx.unmask(u()),
        ctx.unmask(u()),
    ]
    .map(|o| o.expect("applied"));
    use Outcome::{Changed as C, Unchanged as U};
    assert_eq!(outcomes, [C, U, C, U, C, C, U, C, U, C, U, C, U]);
    ctx.reset_failed(u()).expect("nothing to reset");
    manager.set_unit(
        KUBELET,
        UnitEntry {
            activity: Activity::Failed,
            ..UnitEntry::default()
        },
    );
    ctx.reset_failed(u()).expect("reset");

    assert_eq!(
        unit_changes(&run),
        [
            ChangeKind::DaemonReload,
            ChangeKind::UnitEnable { unit: u() },
            ChangeKind::UnitStart { unit: u() },
            ChangeKind::UnitRestart { unit: u() },
            ChangeKind::UnitStop { unit: u() },
            ChangeKind::UnitDisable { unit: u() },
            ChangeKind::UnitMask { unit: u() },
            ChangeKind::UnitUnmask { unit: u() },
            ChangeKind::UnitResetFailed { unit: u() },
        ]
    );
    let ops: Vec<Op> = manager.calls().into_iter().map(|c| c.op).collect();
    assert_eq!(
        ops,
        [
            Op::Reload,
            Op::Enable,
            Op::Enable,
            Op::Start,
            Op::Start,
            Op::Restart,
            Op::Stop,
            Op::Stop,
            Op::Disable,
            Op::Disable,
            Op::Mask,
            Op::Mask,
            Op::Unmask,
            Op::Unmask,
            Op::ResetFailed,
            Op::ResetFailed,
        ],
        "apply calls each verb once and never probes"
    );
    assert_eq!(
        manager.unit(KUBELET).map(|e| e.activity),
        Some(Activity::Inactive)
    );
}

/// What systemd reports as an error reaches the phase as the same typed WIT error, naming the
/// unit; nothing is recorded for a verb that failed.
#[test]
fn failures_reach_the_phase_as_typed_errors_naming_the_unit() {
    let manager = Arc::new(RecordingManager::new().with_unit(KUBELET, UnitEntry::default()));
    let (_root, run) = run_with(RunMode::Apply, recorded(&manager));
    let mut ctx = phase(&run, granted(&[KUBELET, CONTAINERD]));

    manager.fail(
        Op::Start,
        Some(KUBELET),
        Error::Failed("start kubelet.service: job failed (unit result: exit-code)".into()),
    );
    let e = ctx.start(s(KUBELET)).expect_err("injected");
    assert!(
        matches!(&e, Error::Failed(m) if m.contains("exit-code")),
        "{e:?}"
    );
    assert_eq!(
        manager.unit(KUBELET).map(|e| e.activity),
        Some(Activity::Inactive)
    );

    manager.fail(
        Op::Stop,
        None,
        Error::Timeout("stop kubelet.service: job 7 did not finish".into()),
    );
    assert!(matches!(ctx.stop(s(KUBELET)), Err(Error::Timeout(_))));
    manager.fail(
        Op::Reload,
        None,
        Error::Io("daemon-reload: org.freedesktop.DBus.Error.AccessDenied: no".into()),
    );
    assert!(matches!(ctx.daemon_reload(), Err(Error::Io(m)) if m.contains("AccessDenied")));

    // The manager's own refusals: no unit file, a masked unit.
    let e = ctx.start(s(CONTAINERD)).expect_err("no file");
    assert!(
        matches!(&e, Error::NotFound(m) if m.contains(CONTAINERD)),
        "{e:?}"
    );
    ctx.mask(s(KUBELET)).expect("mask");
    let e = ctx.restart(s(KUBELET)).expect_err("masked");
    assert!(
        matches!(&e, Error::Failed(m) if m.contains(KUBELET)),
        "{e:?}"
    );

    assert_eq!(
        unit_changes(&run),
        [ChangeKind::UnitMask { unit: s(KUBELET) }],
        "only the mask succeeded"
    );
    let failed: Vec<String> = run
        .audit
        .records()
        .into_iter()
        .filter(|r| !r.outcome.starts_with("ok:"))
        .map(|r| r.outcome)
        .collect();
    assert_eq!(failed.len(), 5, "{failed:?}");
    assert!(
        failed[0].starts_with("failed: start kubelet.service"),
        "{failed:?}"
    );
}

/// Apply without systemd: `unavailable`, and nothing recorded.
#[test]
fn apply_without_systemd_is_unavailable() {
    let connects = Arc::new(AtomicUsize::new(0));
    let (_root, run) = run_with(RunMode::Apply, unreachable_systemd(&connects));
    let mut ctx = phase(&run, granted(&[KUBELET]));
    assert!(matches!(ctx.enable(s(KUBELET)), Err(Error::Unavailable(_))));
    assert!(matches!(ctx.daemon_reload(), Err(Error::Unavailable(_))));
    assert_eq!(unit_changes(&run), []);
}

/// A unit the grant does not cover never reaches systemd: not even the connection is made.
#[test]
fn grants_are_checked_before_systemd_is_connected() {
    let manager = Arc::new(RecordingManager::new().with_unit(KUBELET, UnitEntry::running()));
    for mode in [RunMode::Plan, RunMode::Apply] {
        let connects = Arc::new(AtomicUsize::new(0));
        let (root, run) = run_with(mode, counted(&manager, &connects));
        let mut grants = granted(&["other.service"]);
        grants.systemd.reload = false;
        let mut ctx = phase(&run, grants);

        let denied = |r: Result<Outcome, Error>, verb: &str| {
            assert!(
                matches!(&r, Err(Error::Denied(m)) if m.starts_with(&format!("{verb} {KUBELET}"))),
                "{verb}: {r:?}"
            );
        };
        denied(ctx.enable(s(KUBELET)), "enable");
        denied(ctx.disable(s(KUBELET)), "enable");
        denied(ctx.start(s(KUBELET)), "start");
        denied(ctx.stop(s(KUBELET)), "start");
        denied(ctx.restart(s(KUBELET)), "start");
        denied(
            ctx.reset_failed(s(KUBELET)).map(|()| Outcome::Changed),
            "start",
        );
        denied(ctx.mask(s(KUBELET)), "mask");
        denied(ctx.unmask(s(KUBELET)), "mask");
        denied(ctx.status(s(KUBELET)).map(|_| Outcome::Changed), "status");
        denied(ctx.write_unit(s(KUBELET), "[Unit]\n".into()), "write");
        denied(
            ctx.write_drop_in(s(KUBELET), "10-x".into(), "[Unit]\n".into()),
            "write",
        );
        denied(ctx.remove_unit(s(KUBELET)), "write");
        assert!(matches!(ctx.daemon_reload(), Err(Error::Denied(_))));
        // A name systemd would refuse is refused before the grant is even looked at.
        assert!(matches!(
            ctx.start(s("../kubelet.service")),
            Err(Error::InvalidArgument(_))
        ));

        assert_eq!(connects.load(Ordering::SeqCst), 0, "{mode:?}: connected");
        assert_eq!(manager.calls(), [], "{mode:?}");
        assert!(run.changes().is_empty(), "{mode:?}");
        let records = run.audit.records();
        assert_eq!(records.iter().filter(|r| r.denied).count(), 13, "{mode:?}");
        assert_eq!(
            std::fs::read_dir(root.path()).expect("root").count(),
            0,
            "{mode:?}: nothing written"
        );
    }
}

/// `status` only reads, so plan mode asks systemd too.
#[test]
fn status_asks_systemd_in_both_modes() {
    for mode in [RunMode::Plan, RunMode::Apply] {
        let manager = Arc::new(RecordingManager::new().with_unit(KUBELET, UnitEntry::running()));
        let (_root, run) = run_with(mode, recorded(&manager));
        let mut ctx = phase(&run, granted(&[KUBELET, CONTAINERD]));
        let st = ctx.status(s(KUBELET)).expect("status");
        assert_eq!(
            (
                st.load_state.as_str(),
                st.active_state.as_str(),
                st.sub_state.as_str(),
                st.main_pid
            ),
            ("loaded", "active", "running", 4242)
        );
        let st = ctx.status(s(CONTAINERD)).expect("status");
        assert_eq!((st.load_state.as_str(), st.main_pid), ("not-found", 0));
        assert_eq!(
            manager.calls(),
            [
                Call::new(Op::Status, KUBELET),
                Call::new(Op::Status, CONTAINERD)
            ]
        );
        assert!(run.changes().is_empty());
    }
}

/// Unit files and drop-ins are files beneath the host root, written and removed through the
/// root filesystem; writing never reloads systemd, `daemon-reload` does.
#[test]
fn unit_files_go_through_the_root_and_reload_is_explicit() {
    let manager = Arc::new(RecordingManager::new());
    let (root, run) = run_with(RunMode::Apply, recorded(&manager));
    let mut ctx = phase(&run, granted(&[KUBELET]));
    let unit_file = root.path().join("etc/systemd/system/kubelet.service");
    let drop_in_dir = root.path().join("etc/systemd/system/kubelet.service.d");
    let drop_in = drop_in_dir.join("10-nodeward.conf");

    let unit = "[Service]\nExecStart=/usr/bin/kubelet\n";
    assert_eq!(
        ok(ctx.write_unit(s(KUBELET), unit.into())),
        Outcome::Created
    );
    assert_eq!(
        ok(ctx.write_drop_in(
            s(KUBELET),
            "10-nodeward".into(),
            "[Service]\nNice=1\n".into()
        )),
        Outcome::Created
    );
    assert_eq!(
        ok(ctx.write_unit(s(KUBELET), unit.into())),
        Outcome::Unchanged
    );
    let e = ctx
        .write_drop_in(s(KUBELET), "../x".into(), String::new())
        .expect_err("bad drop-in name");
    assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
    assert_eq!(std::fs::read_to_string(&unit_file).expect("unit"), unit);
    assert_eq!(
        std::fs::read_to_string(&drop_in).expect("drop-in"),
        "[Service]\nNice=1\n"
    );
    for f in [&unit_file, &drop_in] {
        let mode = std::fs::metadata(f).expect("stat").permissions().mode();
        assert_eq!(mode & 0o7777, 0o644, "{}", f.display());
    }
    assert_eq!(
        manager.calls(),
        [],
        "writing a unit does not reload systemd"
    );

    ctx.daemon_reload().expect("reload");
    assert_eq!(ok(ctx.remove_unit(s(KUBELET))), Outcome::Removed);
    assert!(!unit_file.exists() && !drop_in_dir.exists());
    assert_eq!(ok(ctx.remove_unit(s(KUBELET))), Outcome::Unchanged);
    assert_eq!(
        manager.calls(),
        [Call {
            op: Op::Reload,
            unit: None
        }]
    );

    let path = |p: &str| format!("etc/systemd/system/{p}");
    assert_eq!(
        unit_changes(&run),
        [
            ChangeKind::UnitWrite {
                unit: s(KUBELET),
                path: path("kubelet.service"),
            },
            ChangeKind::UnitWrite {
                unit: s(KUBELET),
                path: path("kubelet.service.d/10-nodeward.conf"),
            },
            ChangeKind::DaemonReload,
            ChangeKind::UnitRemove { unit: s(KUBELET) },
        ]
    );
}

/// Plan mode lists unit file writes and leaves the host root as it was.
#[test]
fn plan_lists_unit_files_and_writes_nothing() {
    let manager = Arc::new(RecordingManager::new());
    let (root, run) = run_with(RunMode::Plan, recorded(&manager));
    let mut ctx = phase(&run, granted(&[KUBELET]));
    assert_eq!(
        ok(ctx.write_unit(s(KUBELET), "[Service]\n".into())),
        Outcome::Created
    );
    assert_eq!(
        ok(ctx.write_drop_in(s(KUBELET), "10-x".into(), "[Service]\n".into())),
        Outcome::Created
    );
    ctx.daemon_reload().expect("reload");
    assert_eq!(unit_changes(&run).len(), 3);
    assert_eq!(manager.calls(), []);
    assert_eq!(
        std::fs::read_dir(root.path()).expect("root").count(),
        0,
        "plan mode wrote to the host root"
    );
}
