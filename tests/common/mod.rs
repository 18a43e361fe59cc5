//! Shared test fixtures: a temporary host root with a sibling "outside" directory that must
//! never change, a shared runtime whose compiled-component cache lives under cargo's
//! per-target temp dir, and a driver for the probe test guest (tests/guests/probe).
#![allow(dead_code)]

pub mod components;
pub mod http;
pub mod tls;

use nodeward::audit::{AuditRecord, Redactor};
use nodeward::caps::PhaseCtx;
use nodeward::caps::RunContext;
use nodeward::grants::Grants;
use nodeward::hostpath::HostRoot;
use nodeward::plan::RunMode;
use nodeward::runtime::{Limits, LoadedPhase, PhaseError, PhaseReport, Runtime};
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// The example bootstrap token of the embedded config.
pub const TOKEN: &str = "abcdef.0123456789abcdef";
/// Its secret half.
pub const TOKEN_SECRET: &str = "0123456789abcdef";

/// One runtime per test binary: compiling a component once is the point of the cache. It
/// admits the test worlds (`tests/wit`: `probe`, `pure`) so the test guests run through it;
/// bundles still cannot declare them, and the CLI's runtime never admits them.
pub fn runtime() -> &'static Runtime {
    static RUNTIME: OnceLock<Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("compiled-cache");
        Runtime::new_admitting_test_worlds(&dir).expect("runtime")
    })
}

/// A temporary directory holding `root/` (the host root) and `outside/` (must not change).
pub struct Fixture {
    pub tmp: tempfile::TempDir,
    pub root: PathBuf,
    pub outside: PathBuf,
}

impl Fixture {
    pub fn new() -> Self {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path().join("root");
        let outside = tmp.path().join("outside");
        std::fs::create_dir_all(&root).expect("root");
        std::fs::create_dir_all(&outside).expect("outside");
        std::fs::write(outside.join("secret.txt"), b"outside the root\n").expect("outside file");
        Fixture { tmp, root, outside }
    }

    /// A session knowing the embedded example config's secret (the token [`TOKEN`]) as the
    /// CLI's does: redacted from output, substituted for its reference in granted files.
    pub fn session(&self, mode: RunMode) -> Arc<RunContext> {
        let root = HostRoot::open(&self.root).expect("open root");
        let mut session = RunContext::new(
            root,
            mode,
            Redactor::new(vec![TOKEN.into(), TOKEN_SECRET.into()]),
        );
        let config = nodeward::config::load(None).expect("embedded config");
        session.secrets = nodeward::secrets::Secrets::from_config(&config);
        Arc::new(session)
    }

    /// Writes `contents` at `rel` beneath the root, creating parents.
    pub fn put(&self, rel: &str, contents: &str) {
        let p = self.root.join(rel);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(p, contents).expect("write");
    }
}

/// Every entry beneath `dir`: relative path → (kind, mode, contents or link target).
pub fn snapshot(dir: &Path) -> BTreeMap<String, (char, u32, Vec<u8>)> {
    fn walk(base: &Path, dir: &Path, out: &mut BTreeMap<String, (char, u32, Vec<u8>)>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .expect("read_dir")
            .map(|e| e.expect("entry"))
            .collect();
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let p = e.path();
            let rel = p
                .strip_prefix(base)
                .expect("prefix")
                .to_string_lossy()
                .into_owned();
            let m = std::fs::symlink_metadata(&p).expect("lstat");
            let mode = m.permissions().mode() & 0o7777;
            if m.file_type().is_symlink() {
                let t = std::fs::read_link(&p).expect("readlink");
                out.insert(rel, ('l', 0, t.to_string_lossy().into_owned().into_bytes()));
            } else if m.is_dir() {
                out.insert(rel, ('d', mode, Vec::new()));
                walk(base, &p, out);
            } else {
                out.insert(rel, ('f', mode, std::fs::read(&p).expect("read")));
            }
            let _ = m.ino();
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

/// Loads a test guest component by path.
pub fn load_guest(path: &str, name: &str, world: &str) -> LoadedPhase {
    let wasm = std::fs::read(path).expect("built test guest");
    let digest = hex::encode(Sha256::digest(&wasm));
    runtime()
        .load(name, world, &wasm, &digest)
        .expect("load test guest")
}

/// A capability context for `phase` with `grants`.
pub fn ctx(session: &Arc<RunContext>, phase: &str, grants: Grants) -> PhaseCtx {
    PhaseCtx {
        phase: phase.into(),
        bundle_digest: "test-bundle".into(),
        grants: Arc::new(grants),
        run: session.clone(),
        deadline: Instant::now() + Duration::from_secs(60),
        budget: Default::default(),
        pinned_artifacts: Default::default(),
        node_bridge: None,
    }
}

/// Runs the probe guest with `grants`, making `calls`; returns one result per call.
pub fn probe(session: &Arc<RunContext>, grants: Grants, calls: Value) -> Vec<Value> {
    let loaded = load_guest(
        nodeward::built::TEST_GUEST_PROBE_COMPONENT,
        "probe",
        "probe",
    );
    let report = runtime()
        .run(
            &loaded,
            ctx(session, "probe", grants),
            &calls.to_string(),
            Limits::default(),
        )
        .expect("probe runs");
    serde_json::from_str(&report.summary).expect("probe summary is JSON")
}

/// Runs the misbehave guest with `input` and `limits`.
pub fn misbehave(
    session: &Arc<RunContext>,
    input: &str,
    limits: Limits,
) -> Result<PhaseReport, PhaseError> {
    let loaded = load_guest(
        nodeward::built::TEST_GUEST_MISBEHAVE_COMPONENT,
        "misbehave",
        "pure",
    );
    runtime().run(
        &loaded,
        ctx(session, "misbehave", Grants::default()),
        input,
        limits,
    )
}

/// The error kind of a probe result, or "ok".
pub fn kind(result: &Value) -> String {
    match result.get("err") {
        Some(e) => e["kind"].as_str().unwrap_or("?").to_string(),
        None => "ok".into(),
    }
}

/// The audit records for `call`.
pub fn audited(session: &RunContext, call: &str) -> Vec<AuditRecord> {
    session
        .audit
        .records()
        .into_iter()
        .filter(|r| r.call == call)
        .collect()
}

/// Grants parsed from a TOML snippet, as a manifest would carry them.
pub fn grants(toml_text: &str) -> Grants {
    let g: Grants = toml::from_str(toml_text).expect("grants TOML");
    g.validate().expect("valid grants");
    g
}

/// A run over one host root with the probe guest loaded, for tests that make many calls
/// against the same session.
pub struct Probe {
    pub session: Arc<RunContext>,
    loaded: LoadedPhase,
}

impl Probe {
    pub fn new(root: &Path, mode: RunMode) -> Probe {
        let session = Arc::new(RunContext::new(
            HostRoot::open(root).expect("open host root"),
            mode,
            Redactor::default(),
        ));
        let loaded = load_guest(
            nodeward::built::TEST_GUEST_PROBE_COMPONENT,
            "probe",
            "probe",
        );
        Probe { session, loaded }
    }

    /// A probe over a session the caller set up (e.g. with other capability bounds).
    pub fn with_session(session: RunContext) -> Probe {
        let loaded = load_guest(
            nodeward::built::TEST_GUEST_PROBE_COMPONENT,
            "probe",
            "probe",
        );
        Probe {
            session: Arc::new(session),
            loaded,
        }
    }

    /// Makes `calls` through the guest; one result per call: `{"ok": ...}` or
    /// `{"err": {"kind": ..., "message": ...}}`.
    pub fn run(&self, grants: &Grants, calls: Value) -> Vec<Value> {
        self.run_with_bridge(grants, None, calls)
    }

    /// [`Probe::run`] with the run's node bridge (what `network.node-bridge` admits) set.
    pub fn run_with_bridge(
        &self,
        grants: &Grants,
        node_bridge: Option<&str>,
        calls: Value,
    ) -> Vec<Value> {
        let mut c = ctx(&self.session, "probe", grants.clone());
        c.node_bridge = node_bridge.map(str::to_string);
        let report = runtime()
            .run(&self.loaded, c, &calls.to_string(), Limits::default())
            .expect("probe run");
        let results: Value = serde_json::from_str(&report.summary).expect("probe summary");
        results.as_array().cloned().expect("probe results array")
    }

    /// Makes one call through the guest.
    pub fn call(&self, grants: &Grants, call: Value) -> Value {
        let mut results = self.run(grants, Value::Array(vec![call]));
        assert_eq!(results.len(), 1);
        results.remove(0)
    }

    pub fn changes(&self) -> Vec<nodeward::plan::Change> {
        self.session.changes()
    }

    pub fn audit(&self) -> Vec<AuditRecord> {
        self.session.audit.records()
    }
}

/// The `ok` value of a call result, or a panic naming the error.
pub fn ok(result: &Value) -> &Value {
    match result.get("ok") {
        Some(v) => v,
        None => panic!("expected ok, got {result}"),
    }
}

/// The error kind of a call result, or a panic when it succeeded.
pub fn err_kind(result: &Value) -> &str {
    match result.pointer("/err/kind").and_then(Value::as_str) {
        Some(k) => k,
        None => panic!("expected an error, got {result}"),
    }
}

/// Runs the built `nodeward` binary with `args` against the fixture's root. The state dir (the
/// compiled-component cache) is shared across tests so each component is compiled once per test
/// run; no test installs a bundle into it. Both go through the environment, which a command
/// that does not take them ignores (a flag it does not take is a usage error).
pub fn nodeward(f: &Fixture, args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_nodeward"))
        .args(args)
        .env("NODEWARD_ROOT", &f.root)
        .env("NODEWARD_STATE_DIR", cli_state_dir())
        .env_remove("NODEWARD_LOG")
        .output()
        .expect("run nodeward")
}

/// The state dir [`nodeward`] runs with.
pub fn cli_state_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli-state")
}

/// A field of /proc/self/status (`VmRSS`, `VmHWM`), in KiB: the test process is the agent.
pub fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/self/status"))
}

/// Resets the peak RSS to the current RSS and returns it (KiB). Fails rather than measure
/// nothing when the kernel does not allow the reset.
pub fn reset_peak() -> u64 {
    std::fs::write("/proc/self/clear_refs", "5").expect("reset VmHWM through clear_refs");
    status_kib("VmRSS")
}

/// How much the peak RSS grew since `before` (KiB), in MiB.
pub fn peak_growth_mib(before: u64) -> u64 {
    status_kib("VmHWM").saturating_sub(before) / 1024
}
