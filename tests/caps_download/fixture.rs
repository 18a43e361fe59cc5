//! The host side of the tests: a temporary host root with a session whose artifact cache and
//! retry policy suit a test (short back-off), the phase context with the download grant for the
//! scripted server's `/ok/` prefix, the probe guest, and readers of the capability's errors.

use super::*;

pub fn sha(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

pub const CACHE: &str = "var/cache/test-artifacts";

pub struct Host {
    pub _tmp: tempfile::TempDir,
    pub root: PathBuf,
    pub session: Arc<RunContext>,
}

pub fn host(mode: RunMode) -> Host {
    host_with(mode, |_, _| {})
}

/// [`host`], with `setup` given the root and the session before the run starts (to place a
/// file beneath the root and configure the session from it).
pub fn host_with(mode: RunMode, setup: impl FnOnce(&Path, &mut RunContext)) -> Host {
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path().join("root");
    for d in ["opt/bin", "opt/pkg", "etc", "var"] {
        std::fs::create_dir_all(root.join(d)).expect("mkdir");
    }
    let mut session = RunContext::new(
        HostRoot::open(&root).expect("root"),
        mode,
        Redactor::default(),
    );
    session.downloads.cache_dir = HostPath::parse(CACHE).expect("cache path");
    session.downloads.policy.retry = RetryPolicy {
        max_attempts: 3,
        base_delay: Duration::from_millis(10),
        max_delay: Duration::from_millis(40),
    };
    setup(&root, &mut session);
    Host {
        _tmp: tmp,
        root,
        session: Arc::new(session),
    }
}

pub fn grants(server: &Server) -> Grants {
    Grants {
        fs: FsGrant {
            read: vec![],
            write: vec!["opt".into()],
        },
        download: DownloadGrant {
            urls: vec![server.url("/ok/")],
            ..Default::default()
        },
        ..Grants::default()
    }
}

pub fn ctx(h: &Host, grants: Grants, deadline: Duration) -> PhaseCtx {
    PhaseCtx {
        phase: "test".into(),
        bundle_digest: "test".into(),
        grants: Arc::new(grants),
        run: h.session.clone(),
        deadline: Instant::now() + deadline,
        budget: Default::default(),
        pinned_artifacts: Default::default(),
        node_bridge: None,
    }
}

/// Every file and directory beneath `dir`, relative, sorted (symlinks not followed).
pub fn tree(dir: &Path) -> Vec<String> {
    fn walk(base: &Path, dir: &Path, out: &mut Vec<String>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            out.push(p.strip_prefix(base).expect("beneath").display().to_string());
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                walk(base, &p, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

pub fn err_kind(e: &Error) -> &'static str {
    match e {
        Error::Denied(_) => "denied",
        Error::InvalidArgument(_) => "invalid-argument",
        Error::NotFound(_) => "not-found",
        Error::Escape(_) => "escape",
        Error::Io(_) => "io",
        Error::Failed(_) => "failed",
        Error::Timeout(_) => "timeout",
        Error::Unavailable(_) => "unavailable",
    }
}

pub fn message(e: &Error) -> &str {
    match e {
        Error::Denied(m)
        | Error::InvalidArgument(m)
        | Error::NotFound(m)
        | Error::Escape(m)
        | Error::Io(m)
        | Error::Failed(m)
        | Error::Timeout(m)
        | Error::Unavailable(m) => m,
    }
}

/// Runs the probe guest with `calls`; returns one JSON result per call.
pub fn run_probe(h: &Host, grants: Grants, calls: Value) -> Vec<Value> {
    let loaded = common::load_guest(
        nodeward::built::TEST_GUEST_PROBE_COMPONENT,
        "probe",
        "probe",
    );
    let report = common::runtime()
        .run(
            &loaded,
            ctx(h, grants, Duration::from_secs(60)),
            &calls.to_string(),
            Limits::default(),
        )
        .expect("probe runs");
    serde_json::from_str(&report.summary).expect("probe summary is JSON")
}
