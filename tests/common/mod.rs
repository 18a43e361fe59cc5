//! Shared by the capability tests: a session over a temp root, and the probe guest, which
//! makes the capability calls its input lists through the real component boundary.

#![allow(dead_code)]

use nodeward::audit::{AuditRecord, Redactor};
use nodeward::caps::PhaseCtx;
use nodeward::grants::Grants;
use nodeward::hostpath::HostRoot;
use nodeward::plan::{Change, RunMode};
use nodeward::runtime::{Limits, LoadedPhase, Runtime};
use nodeward::session::Session;
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A run over one host root, with the probe guest loaded.
pub struct Probe {
    pub session: Arc<Session>,
    runtime: Runtime,
    loaded: LoadedPhase,
}

/// The compiled-component cache every test process shares (writes are atomic renames).
fn cache_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("probe-cache")
}

impl Probe {
    pub fn new(root: &Path, mode: RunMode) -> Probe {
        let session = Arc::new(Session::new(
            HostRoot::open(root).expect("open host root"),
            mode,
            Redactor::default(),
        ));
        let runtime = Runtime::new(&cache_dir()).expect("runtime");
        let wasm =
            std::fs::read(nodeward::built::TEST_GUEST_PROBE_COMPONENT).expect("probe component");
        let digest = hex::encode(Sha256::digest(&wasm));
        let loaded = runtime
            .load("probe", "probe", &wasm, &digest)
            .expect("load probe");
        Probe {
            session,
            runtime,
            loaded,
        }
    }

    /// A capability context for `grants`, as a phase run gets one.
    pub fn ctx(&self, grants: &Grants) -> PhaseCtx {
        PhaseCtx {
            phase: "probe".into(),
            bundle_digest: "test".into(),
            grants: Arc::new(grants.clone()),
            session: self.session.clone(),
            deadline: Instant::now() + Duration::from_secs(120),
        }
    }

    /// Makes `calls` through the guest; one result per call: `{"ok": ...}` or
    /// `{"err": {"kind": ..., "message": ...}}`.
    pub fn run(&self, grants: &Grants, calls: Value) -> Vec<Value> {
        let report = self
            .runtime
            .run(
                &self.loaded,
                self.ctx(grants),
                &calls.to_string(),
                Limits::default(),
            )
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

    pub fn changes(&self) -> Vec<Change> {
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

/// Every file beneath `dir` with its contents (directories as `None`), for byte-identity.
pub fn snapshot(dir: &Path) -> Vec<(PathBuf, Option<Vec<u8>>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let mut entries: Vec<_> = std::fs::read_dir(&d)
            .expect("read_dir")
            .map(|e| e.expect("entry").path())
            .collect();
        entries.sort();
        for p in entries {
            let meta = std::fs::symlink_metadata(&p).expect("lstat");
            if meta.is_dir() {
                out.push((p.clone(), None));
                stack.push(p);
            } else if meta.is_file() {
                out.push((p.clone(), Some(std::fs::read(&p).expect("read"))));
            } else {
                out.push((p, None));
            }
        }
    }
    out.sort();
    out
}
