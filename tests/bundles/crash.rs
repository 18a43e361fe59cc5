//! `phases install` killed on a fresh root (`docs/audit.md`, "Crashes"): at every write of the
//! audit trail, its head and the bundle history (the `test-hooks` crash points, one run per
//! write), and by SIGKILL at random moments. After each kill the trail verifies; after the
//! next install it verifies, no run is left "running", the install is recorded once, every
//! history entry has its time, no temp file and no run lock file is left; and a removed or
//! replaced head is still detected.
//!
//! The root keeps the agent state directory where it is by default (`var/lib/nodeward`), as on
//! a node; its compiled components come from a cache the test shares between roots (a link),
//! so a run costs what a node's second install costs.

use super::*;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// The signed bundle every root installs, its key, and the shared compiled cache.
struct Crashes {
    env: Env,
    bundle: PathBuf,
    digest: String,
    compiled: PathBuf,
}

/// A fresh host root.
struct Fresh {
    _tmp: tempfile::TempDir,
    root: PathBuf,
}

impl Crashes {
    fn new() -> Crashes {
        let env = Env::new();
        let bundle = env.bundle("v1.tgz", 1, &[setup_phase()], true);
        let digest = env.digest(&bundle);
        let compiled = env.path("compiled");
        std::fs::create_dir(&compiled).expect("compiled");
        std::fs::set_permissions(
            &compiled,
            std::os::unix::fs::PermissionsExt::from_mode(0o700),
        )
        .expect("cache mode");
        Crashes {
            env,
            bundle,
            digest,
            compiled,
        }
    }

    fn fresh(&self) -> Fresh {
        let tmp = tempfile::tempdir().expect("tmp");
        let root = tmp.path().join("root");
        let state = root.join("var/lib/nodeward");
        std::fs::create_dir_all(&state).expect("state");
        std::os::unix::fs::symlink(&self.compiled, state.join("compiled")).expect("cache");
        Fresh { _tmp: tmp, root }
    }

    /// `nodeward ARGS` on `f`'s root, its state directory the default one beneath it.
    fn command(&self, f: &Fresh, args: &[&str], abort: Option<&str>) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_nodeward"));
        cmd.args(args)
            .env("NODEWARD_ROOT", &f.root)
            .env_remove("NODEWARD_STATE_DIR")
            .env_remove("NODEWARD_AUDIT_DIR")
            .env_remove("NODEWARD_LOG")
            .env_remove("NODEWARD_BUNDLE")
            .env_remove("NODEWARD_TEST_ABORT")
            .env_remove("JOURNAL_STREAM")
            .env_remove("INVOCATION_ID");
        if let Some(point) = abort {
            cmd.env("NODEWARD_TEST_ABORT", point);
        }
        cmd
    }

    fn install(&self, f: &Fresh, abort: Option<&str>) -> Command {
        let mut cmd = self.command(
            f,
            &[
                "phases",
                "install",
                s(&self.bundle),
                "--allow-incomplete",
                "--accept-new-grants",
            ],
            abort,
        );
        cmd.arg("--trusted-key").arg(&self.env.public);
        cmd
    }

    /// `--output json` of `args`, requiring exit `code`.
    #[track_caller]
    fn json(&self, f: &Fresh, args: &[&str], code: i32, what: &str) -> Value {
        let mut all = args.to_vec();
        all.extend(["--output", "json"]);
        let out = self.command(f, &all, None).output().expect("run");
        assert_eq!(
            out.status.code(),
            Some(code),
            "{what}: {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            stderr(&out)
        );
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{what}: {args:?}: {e}"))
    }

    /// The trail verifies (a kill leaves nothing `verify` calls damage).
    #[track_caller]
    fn assert_verifies(&self, f: &Fresh, what: &str) -> Value {
        let v = self.json(f, &["audit", "verify"], 0, what);
        assert_eq!(v["ok"], true, "{what}: {v:#}");
        v
    }

    /// What the next install must leave, whatever killed the runs before it.
    #[track_caller]
    fn assert_true_records(&self, f: &Fresh, what: &str) {
        let v = self.assert_verifies(f, what);
        let summary = self.json(f, &["audit", "summary"], 0, what);
        let runs = summary["runs"].as_array().expect("runs");
        assert!(
            runs.iter().all(|r| r["outcome"] != "running"),
            "{what}: a run left running: {summary:#}"
        );
        let log = f.root.join("var/log/nodeward/audit/audit.jsonl");
        let installs = std::fs::read_to_string(&log)
            .expect("log")
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).expect("record"))
            .filter(|r| r["kind"] == "bundle")
            .map(|r| r["current"]["digest"].as_str().unwrap_or("-").to_string())
            .collect::<Vec<_>>();
        assert_eq!(
            installs,
            std::slice::from_ref(&self.digest),
            "{what}: recorded once"
        );
        let history = self.json(f, &["phases", "history"], 0, what);
        assert_eq!(
            history["current"],
            self.digest.as_str(),
            "{what}: {history:#}"
        );
        for e in history["entries"].as_array().expect("entries") {
            assert!(
                e["installedAt"].as_u64().is_some_and(|t| t > 0),
                "{what}: an entry without its time: {history:#}"
            );
        }
        let left = temp_files(&f.root);
        assert!(left.is_empty(), "{what}: temp files left: {left:?}");
        let runs_dir = f.root.join("var/log/nodeward/audit/runs");
        let locks: Vec<_> = std::fs::read_dir(&runs_dir)
            .expect("runs/")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert!(locks.is_empty(), "{what}: run lock files left: {locks:?}");
        self.assert_tampering_detected(f, &v, what);
    }

    /// A removed head, and one replaced by another, still fail `verify`.
    #[track_caller]
    fn assert_tampering_detected(&self, f: &Fresh, verdict: &Value, what: &str) {
        let head = PathBuf::from(verdict["headFile"].as_str().expect("head file"));
        let kept = std::fs::read(&head).expect("head");
        std::fs::remove_file(&head).expect("rm head");
        let v = self.json(f, &["audit", "verify"], 1, what);
        assert_eq!(v["problem"]["reason"], "head-missing", "{what}: {v:#}");
        let mut other: Value = serde_json::from_slice(&kept).expect("head json");
        other["hash"] = Value::from("ab".repeat(32));
        std::fs::write(&head, other.to_string()).expect("replace head");
        let v = self.json(f, &["audit", "verify"], 1, what);
        assert_eq!(v["problem"]["reason"], "head-mismatch", "{what}: {v:#}");
        std::fs::write(&head, &kept).expect("restore head");
    }
}

/// Every entry beneath `dir` named by the agent's temp scheme; links are not followed.
fn temp_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).expect("read_dir") {
        let e = e.expect("entry");
        let path = e.path();
        if e.file_name()
            .to_string_lossy()
            .starts_with(".nodeward-tmp.")
        {
            out.push(path.clone());
        }
        if e.file_type().expect("type").is_dir() {
            out.extend(temp_files(&path));
        }
    }
    out
}

/// What a killed daemon or head update left in the agent state directory is swept by the next
/// install; a temp file a live writer holds (its `flock`; here the test's) is not.
#[test]
fn temp_files_a_killed_run_left_in_the_state_directory_are_swept_and_a_live_ones_kept() {
    let c = Crashes::new();
    let f = c.fresh();
    let state = f.root.join("var/lib/nodeward");
    std::fs::create_dir_all(state.join("audit-heads")).expect("heads");
    std::fs::create_dir_all(state.join("downloads")).expect("downloads");
    let dead = [
        ".nodeward-tmp.repave.0000000000000001",
        ".nodeward-tmp.ledger.0000000000000002",
        "audit-heads/.nodeward-tmp.audit.0000000000000003",
        "downloads/.nodeward-tmp.download.0000000000000004",
    ];
    for rel in dead {
        std::fs::write(state.join(rel), "a bootstrap token").expect("leftover");
    }
    let live_path = state.join(".nodeward-tmp.rollout.0000000000000005");
    let live = std::fs::File::create(&live_path).expect("live");
    rustix::fs::flock(&live, rustix::fs::FlockOperation::LockExclusive).expect("flock");
    let out = c.install(&f, None).output().expect("install");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let left: Vec<String> = temp_files(&f.root)
        .iter()
        .map(|p| p.strip_prefix(&state).unwrap_or(p).display().to_string())
        .collect();
    assert_eq!(
        left,
        [".nodeward-tmp.rollout.0000000000000005"],
        "{}",
        stderr(&out)
    );
    drop(live);
    c.assert_verifies(&f, "after the sweep");
}

/// The crash points of an install's writes: the trail's records, syncs and head updates, the
/// store's intent, links and history (`docs/audit.md`, "Crashes").
#[cfg(feature = "test-hooks")]
const WRITES: &[&str] = &[
    "audit:after-genesis",
    "audit:after-record",
    "audit:after-sync",
    "audit:after-temp-write",
    "install:after-precompile",
    "install:after-stage",
    "intent:after-temp-write",
    "install:after-intent",
    "install:after-last-good",
    "link:after-temp-write",
    "install:after-current",
    "history:after-temp-write",
    "install:after-history",
];

/// Each write of an install cut short, one fresh root per write: `<point>@K` for every K the
/// install reaches.
#[cfg(feature = "test-hooks")]
#[test]
fn an_install_cut_short_at_any_write_leaves_true_records() {
    let c = Crashes::new();
    let mut kills = 0;
    for family in WRITES {
        for k in 1.. {
            let point = format!("{family}@{k}");
            let f = c.fresh();
            let out = c.install(&f, Some(&point)).output().expect("install");
            if out.status.code() == Some(0) {
                assert!(k > 1, "{point}: an install never reaches it");
                break;
            }
            assert_eq!(out.status.code(), None, "{point}: {}", stderr(&out));
            assert!(
                stderr(&out).contains(&format!("aborting at {point}")),
                "{point}: {}",
                stderr(&out)
            );
            kills += 1;
            c.assert_verifies(&f, &point);
            let again = c.install(&f, None).output().expect("install");
            assert_eq!(again.status.code(), Some(0), "{point}: {}", stderr(&again));
            c.assert_true_records(&f, &point);
        }
    }
    assert!(kills >= WRITES.len() + 6, "{kills} kills");
    eprintln!("an install cut short at each of its writes: {kills} kills");
}

/// SIGKILLs `phases install` on fresh roots at random moments (up to three kills per root,
/// each followed by `audit verify`, then an install that completes). The seed is printed;
/// `CRASH_TEST_SEED` repeats a run, `CRASH_TEST_KILLS` sets how many kills (300).
#[test]
fn random_sigkills_of_an_install_leave_true_records() {
    let seed = std::env::var("CRASH_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    let target: usize = std::env::var("CRASH_TEST_KILLS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(300);
    eprintln!("random SIGKILLs of phases install: seed {seed} (CRASH_TEST_SEED), {target} kills");
    let mut rng = fastrand::Rng::with_seed(seed);
    let c = Crashes::new();
    // A clean install fills the compiled cache; the next shows how long one takes.
    let mut span = Duration::ZERO;
    for _ in 0..2 {
        let clean = c.fresh();
        let started = Instant::now();
        let out = c.install(&clean, None).output().expect("install");
        span = started.elapsed();
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        c.assert_true_records(&clean, "a clean install");
    }

    let started = Instant::now();
    let (mut kills, mut roots, mut finished) = (0, 0, 0);
    // Where the kills landed, by what the log held after them.
    let mut landed = [0usize; 3];
    while kills < target {
        let f = c.fresh();
        roots += 1;
        for _ in 0..3 {
            let at = Duration::from_micros(rng.u64(0..=span.as_micros() as u64 * 6 / 5));
            let what = format!("seed {seed}, root {roots}, killed {at:?} in");
            let before = trail_stage(&f);
            match kill_after(c.install(&f, None), at) {
                true => kills += 1,
                false => {
                    finished += 1;
                    break;
                }
            }
            let after = trail_stage(&f);
            landed[match (after.0 > before.0, after.1 > before.1) {
                (false, _) => 0,
                (true, false) => 1,
                (true, true) => 2,
            }] += 1;
            c.assert_verifies(&f, &what);
        }
        let out = c.install(&f, None).output().expect("install");
        let what = format!("seed {seed}, root {roots}");
        assert_eq!(out.status.code(), Some(0), "{what}: {}", stderr(&out));
        c.assert_true_records(&f, &what);
    }
    let left = temp_files(&c.compiled);
    assert!(left.is_empty(), "the compiled cache: {left:?}");
    eprintln!(
        "random SIGKILLs of phases install: {kills} kills on {roots} fresh roots ({finished} \
         runs finished before their kill; a clean install takes {span:?}), {:?}; {} wrote no \
         record, {} wrote records but not the install's, {} wrote the install's",
        started.elapsed(),
        landed[0],
        landed[1],
        landed[2]
    );
}

/// How far the trail of `f` got: its lines, and its `bundle` records.
fn trail_stage(f: &Fresh) -> (usize, usize) {
    let log = std::fs::read_to_string(f.root.join("var/log/nodeward/audit/audit.jsonl"))
        .unwrap_or_default();
    (
        log.lines().count(),
        log.matches("\"kind\":\"bundle\"").count(),
    )
}

/// Spawns `cmd`, SIGKILLs it after `at`; whether the kill ended it (it was still running).
fn kill_after(mut cmd: Command, at: Duration) -> bool {
    use std::os::unix::process::ExitStatusExt as _;
    let mut child: Child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    std::thread::sleep(at);
    // An exited child not yet waited for is a zombie: the signal reaches nothing.
    child.kill().expect("SIGKILL");
    let status = child.wait().expect("wait");
    status.signal() == Some(9)
}
