//! The `download` capability in apply and plan mode against a real HTTP server on 127.0.0.1
//! that this file starts: scripted answers per path, and a count of requests per path.
//!
//! The server is a few lines over `std::net` rather than a server crate because the failure
//! cases need control no crate gives: a body shorter than its Content-Length followed by a
//! closed connection, and an answer that stalls past the phase deadline.
//!
//! Success, wrong hash and the refusals go through the real component boundary with the probe
//! guest; the rest call the host code directly.

mod common;

use flate2::Compression;
use flate2::write::GzEncoder;
use nodeward::audit::Redactor;
use nodeward::caps::RunContext;
use nodeward::caps::bindings::download::Host as _;
use nodeward::caps::download::RetryPolicy;
use nodeward::caps::{Error, Outcome, PhaseCtx};
use nodeward::grants::{DownloadGrant, FsGrant, Grants};
use nodeward::hostpath::{HostPath, HostRoot};
use nodeward::plan::{ChangeKind, RunMode};
use nodeward::runtime::Limits;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use std::collections::{HashMap, VecDeque};
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

// ------------------------------------------------------------------------------------------
// A scripted HTTP/1.1 server. Written here rather than taken from a crate on purpose: the
// failure cases need a server that misbehaves on cue (announce a Content-Length and close after
// a shorter body, stall past a deadline, answer 5xx a set number of times), which tiny_http and
// the like do not do (tiny_http keeps the connection alive after a short body, so the client
// would wait for a timeout instead of seeing a cut-short body). It speaks real HTTP over a real
// socket on 127.0.0.1; the client under test is the agent's own reqwest.
// ------------------------------------------------------------------------------------------

#[derive(Clone, Default)]
struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    /// Content-Length to announce when it should differ from the body (a cut-short body).
    announced: Option<usize>,
    /// Wait this long before answering.
    delay: Duration,
}

fn ok(body: &[u8]) -> Reply {
    Reply {
        status: 200,
        body: body.to_vec(),
        ..Reply::default()
    }
}

fn status(code: u16) -> Reply {
    Reply {
        status: code,
        body: format!("status {code}\n").into_bytes(),
        ..Reply::default()
    }
}

fn redirect(to: &str) -> Reply {
    Reply {
        status: 302,
        headers: vec![("Location".into(), to.into())],
        ..Reply::default()
    }
}

type Routes = Arc<Mutex<HashMap<String, VecDeque<Reply>>>>;

/// Serves scripted replies: each path has a queue, popped per request, whose last reply
/// repeats. Unknown paths get 404. Every connection is closed after one answer.
struct Server {
    port: u16,
    routes: Routes,
    hits: Arc<Mutex<HashMap<String, usize>>>,
    stop: Arc<AtomicBool>,
}

impl Server {
    fn start() -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1");
        let port = listener.local_addr().expect("addr").port();
        let routes: Routes = Arc::default();
        let hits: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (r, h, s) = (routes.clone(), hits.clone(), stop.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if s.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let (r, h) = (r.clone(), h.clone());
                std::thread::spawn(move || serve(conn, &r, &h));
            }
        });
        Server {
            port,
            routes,
            hits,
            stop,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    fn script(&self, path: &str, replies: Vec<Reply>) {
        self.routes
            .lock()
            .expect("routes")
            .insert(path.into(), replies.into());
    }

    fn hits(&self, path: &str) -> usize {
        self.hits
            .lock()
            .expect("hits")
            .get(path)
            .copied()
            .unwrap_or(0)
    }

    fn total_hits(&self) -> usize {
        self.hits.lock().expect("hits").values().sum()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

fn serve(conn: TcpStream, routes: &Routes, hits: &Mutex<HashMap<String, usize>>) {
    let mut reader = BufReader::new(match conn.try_clone() {
        Ok(c) => c,
        Err(_) => return,
    });
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() {
        return;
    }
    let path = line.split_whitespace().nth(1).unwrap_or("/").to_string();
    loop {
        let mut header = String::new();
        match reader.read_line(&mut header) {
            Ok(0) | Err(_) => return,
            Ok(_) if header == "\r\n" || header == "\n" => break,
            Ok(_) => {}
        }
    }
    *hits.lock().expect("hits").entry(path.clone()).or_default() += 1;
    let reply = {
        let mut routes = routes.lock().expect("routes");
        match routes.get_mut(&path) {
            Some(q) if q.len() > 1 => q.pop_front().unwrap_or_default(),
            Some(q) => q.front().cloned().unwrap_or_default(),
            None => status(404),
        }
    };
    std::thread::sleep(reply.delay);
    let mut out = conn;
    let mut head = format!(
        "HTTP/1.1 {} Scripted\r\nContent-Length: {}\r\nConnection: close\r\n",
        reply.status,
        reply.announced.unwrap_or(reply.body.len())
    );
    for (k, v) in &reply.headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let _ = out.write_all(head.as_bytes());
    let _ = out.write_all(&reply.body);
    let _ = out.flush();
    let _ = out.shutdown(std::net::Shutdown::Both);
}

// ------------------------------------------------------------------------------------------
// Host setup.
// ------------------------------------------------------------------------------------------

fn sha(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

const CACHE: &str = "var/cache/test-artifacts";

struct Host {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    session: Arc<RunContext>,
}

fn host(mode: RunMode) -> Host {
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
    Host {
        _tmp: tmp,
        root,
        session: Arc::new(session),
    }
}

fn grants(server: &Server) -> Grants {
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

fn ctx(h: &Host, grants: Grants, deadline: Duration) -> PhaseCtx {
    PhaseCtx {
        phase: "test".into(),
        bundle_digest: "test".into(),
        grants: Arc::new(grants),
        run: h.session.clone(),
        deadline: Instant::now() + deadline,
        budget: Default::default(),
        pinned_artifacts: Default::default(),
    }
}

/// Every file and directory beneath `dir`, relative, sorted (symlinks not followed).
fn tree(dir: &Path) -> Vec<String> {
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

fn err_kind(e: &Error) -> &'static str {
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

fn message(e: &Error) -> &str {
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

// ------------------------------------------------------------------------------------------
// The probe guest (compiled once per test run; see tests/common).
// ------------------------------------------------------------------------------------------

/// Runs the probe guest with `calls`; returns one JSON result per call.
fn run_probe(h: &Host, grants: Grants, calls: Value) -> Vec<Value> {
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

// ------------------------------------------------------------------------------------------
// fetch
// ------------------------------------------------------------------------------------------

#[test]
fn fetch_through_the_guest_verifies_and_installs() {
    let server = Server::start();
    let body = b"#!/bin/sh\necho kubelet\n".repeat(1000);
    server.script("/ok/kubelet", vec![ok(&body)]);
    let h = host(RunMode::Apply);
    let call = json!({ "op": "download.fetch", "url": server.url("/ok/kubelet"),
                       "sha256": sha(&body), "dest": "opt/bin/kubelet", "mode": 0o755 });
    let out = run_probe(&h, grants(&server), json!([call, call]));
    assert_eq!(out[0], json!({ "ok": "created" }));
    assert_eq!(
        out[1],
        json!({ "ok": "unchanged" }),
        "dest already has the digest"
    );
    assert_eq!(server.hits("/ok/kubelet"), 1);
    let dest = h.root.join("opt/bin/kubelet");
    assert_eq!(std::fs::read(&dest).expect("dest"), body);
    let mode = std::fs::metadata(&dest).expect("meta").permissions().mode() & 0o7777;
    assert_eq!(mode, 0o755);
    assert_eq!(
        tree(&h.root.join("opt/bin")),
        vec!["kubelet"],
        "no temp file"
    );
    assert!(
        h.root.join(CACHE).join("sha256").join(sha(&body)).is_file(),
        "the artifact is cached"
    );
    let changes = h.session.changes();
    assert_eq!(changes.len(), 1);
    assert_eq!(
        changes[0].kind,
        ChangeKind::Download {
            url: server.url("/ok/kubelet"),
            sha256: sha(&body),
            dest: "opt/bin/kubelet".into()
        }
    );
    let records = h.session.audit.records();
    assert_eq!(records.len(), 2);
    assert_eq!(records[0].call, "download.fetch");
    assert_eq!(records[0].outcome, "ok:created");
}

#[test]
fn wrong_hash_through_the_guest_leaves_nothing() {
    let server = Server::start();
    server.script("/ok/tool", vec![ok(b"evil bytes")]);
    let h = host(RunMode::Apply);
    let expected = sha(b"good bytes");
    let out = run_probe(
        &h,
        grants(&server),
        json!([{ "op": "download.fetch", "url": server.url("/ok/tool"),
                 "sha256": expected, "dest": "opt/bin/tool", "mode": 0o755 }]),
    );
    assert_eq!(out[0]["err"]["kind"], "failed", "{out:?}");
    let msg = out[0]["err"]["message"].as_str().expect("message");
    assert!(msg.contains(&server.url("/ok/tool")), "{msg}");
    assert!(msg.contains(&expected), "{msg}");
    assert!(msg.contains(&sha(b"evil bytes")), "{msg}");
    assert_eq!(server.hits("/ok/tool"), 1, "a hash mismatch is not retried");
    assert!(
        tree(&h.root.join("opt"))
            .iter()
            .all(|p| p == "bin" || p == "pkg"),
        "no dest, no temp file: {:?}",
        tree(&h.root.join("opt"))
    );
    assert!(
        tree(&h.root.join(CACHE))
            .iter()
            .all(|p| !p.contains(&expected))
    );
    assert!(h.session.changes().is_empty());
}

#[test]
fn refusals_through_the_guest_are_denied_and_audited() {
    let server = Server::start();
    server.script("/ok/tool", vec![ok(b"x")]);
    server.script("/other/tool", vec![ok(b"x")]);
    let h = host(RunMode::Apply);
    let digest = sha(b"x");
    let out = run_probe(
        &h,
        grants(&server),
        json!([
            { "op": "download.fetch", "url": server.url("/other/tool"),
              "sha256": digest, "dest": "opt/bin/tool", "mode": 0o755 },
            { "op": "download.fetch", "url": server.url("/ok/tool"),
              "sha256": digest, "dest": "etc/tool", "mode": 0o755 },
            { "op": "download.fetch-and-extract", "url": server.url("/other/tool"),
              "sha256": digest, "dest-dir": "opt/pkg/x", "strip-components": 0 },
            { "op": "download.fetch-and-extract", "url": server.url("/ok/tool"),
              "sha256": digest, "dest-dir": "etc/x", "strip-components": 0 },
        ]),
    );
    for (i, r) in out.iter().enumerate() {
        assert_eq!(r["err"]["kind"], "denied", "call {i}: {r}");
    }
    assert!(
        out[0]["err"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("download.urls"))
    );
    assert!(
        out[1]["err"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("fs.write") && m.contains("etc/tool"))
    );
    assert_eq!(server.total_hits(), 0, "nothing was requested");
    let records = h.session.audit.records();
    assert_eq!(records.len(), 4);
    assert!(records.iter().all(|r| r.denied), "{records:?}");
    assert_eq!(records[0].call, "download.fetch");
    assert_eq!(records[2].call, "download.fetch-and-extract");
    assert!(!h.root.join("etc/tool").exists() && !h.root.join("opt/bin/tool").exists());
}

#[test]
fn truncated_body_is_retried_then_fails_cleanly() {
    let server = Server::start();
    let body = vec![7u8; 100_000];
    server.script(
        "/ok/cut",
        vec![Reply {
            announced: Some(200_000),
            ..ok(&body)
        }],
    );
    let h = host(RunMode::Apply);
    let mut c = ctx(&h, grants(&server), Duration::from_secs(30));
    let e = c
        .fetch(server.url("/ok/cut"), sha(&body), "opt/bin/cut".into(), 0)
        .expect_err("cut short");
    assert_eq!(err_kind(&e), "failed", "{e:?}");
    assert!(message(&e).contains("/ok/cut"), "{e:?}");
    assert_eq!(
        server.hits("/ok/cut"),
        3,
        "a body cut short is a connection error"
    );
    assert!(tree(&h.root.join("opt/bin")).is_empty());
}

#[test]
fn not_found_is_not_retried() {
    let server = Server::start();
    let h = host(RunMode::Apply);
    let mut c = ctx(&h, grants(&server), Duration::from_secs(30));
    let e = c
        .fetch(server.url("/ok/missing"), sha(b"x"), "opt/bin/x".into(), 0)
        .expect_err("404");
    assert_eq!(err_kind(&e), "failed");
    assert!(message(&e).contains("404"), "{e:?}");
    assert_eq!(server.hits("/ok/missing"), 1, "exactly one request");
    assert!(tree(&h.root.join("opt/bin")).is_empty());
}

#[test]
fn server_errors_are_retried_with_backoff() {
    let server = Server::start();
    server.script("/ok/flaky", vec![status(500), status(503), ok(b"finally")]);
    let h = host(RunMode::Apply);
    let mut c = ctx(&h, grants(&server), Duration::from_secs(30));
    let got = c
        .fetch(
            server.url("/ok/flaky"),
            sha(b"finally"),
            "opt/bin/flaky".into(),
            0o644,
        )
        .expect("third attempt succeeds");
    assert_eq!(got, Outcome::Created);
    assert_eq!(server.hits("/ok/flaky"), 3);
    assert_eq!(
        std::fs::read(h.root.join("opt/bin/flaky")).expect("dest"),
        b"finally"
    );
}

#[test]
fn server_errors_give_up_after_the_last_attempt() {
    let server = Server::start();
    server.script("/ok/down", vec![status(502)]);
    let h = host(RunMode::Apply);
    let mut c = ctx(&h, grants(&server), Duration::from_secs(30));
    let e = c
        .fetch(server.url("/ok/down"), sha(b"x"), "opt/bin/x".into(), 0)
        .expect_err("always 502");
    assert_eq!(err_kind(&e), "failed");
    assert!(
        message(&e).contains("502") && message(&e).contains("3 attempts"),
        "{e:?}"
    );
    assert_eq!(server.hits("/ok/down"), 3);
}

#[test]
fn a_server_slower_than_the_deadline_times_out() {
    let server = Server::start();
    server.script(
        "/ok/slow",
        vec![Reply {
            delay: Duration::from_secs(5),
            ..ok(b"late")
        }],
    );
    let h = host(RunMode::Apply);
    let mut c = ctx(&h, grants(&server), Duration::from_millis(700));
    let started = Instant::now();
    let e = c
        .fetch(
            server.url("/ok/slow"),
            sha(b"late"),
            "opt/bin/late".into(),
            0,
        )
        .expect_err("too slow");
    assert_eq!(err_kind(&e), "timeout", "{e:?}");
    assert!(message(&e).contains(&server.url("/ok/slow")), "{e:?}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "bounded by the deadline"
    );
    assert_eq!(server.hits("/ok/slow"), 1, "a timeout is not retried");
    assert!(tree(&h.root.join("opt/bin")).is_empty());
}

#[test]
fn redirects_are_checked_against_the_grant() {
    let server = Server::start();
    server.script("/ok/moved", vec![redirect(&server.url("/other/evil"))]);
    server.script("/ok/relative", vec![redirect("/ok/real")]);
    server.script("/other/evil", vec![ok(b"evil")]);
    server.script("/ok/real", vec![ok(b"real")]);
    let h = host(RunMode::Apply);
    let mut c = ctx(&h, grants(&server), Duration::from_secs(30));
    let e = c
        .fetch(server.url("/ok/moved"), sha(b"evil"), "opt/bin/x".into(), 0)
        .expect_err("redirect leaves the grant");
    assert_eq!(err_kind(&e), "denied", "{e:?}");
    assert!(message(&e).contains(&server.url("/other/evil")), "{e:?}");
    assert_eq!(server.hits("/other/evil"), 0, "the target was never asked");
    assert!(!h.root.join("opt/bin/x").exists());
    let records = h.session.audit.records();
    assert!(records.last().is_some_and(|r| r.denied));

    let got = c
        .fetch(
            server.url("/ok/relative"),
            sha(b"real"),
            "opt/bin/y".into(),
            0,
        )
        .expect("redirect within the grant");
    assert_eq!(got, Outcome::Created);
    assert_eq!(std::fs::read(h.root.join("opt/bin/y")).expect("y"), b"real");
}

#[test]
fn a_second_fetch_is_served_from_the_cache() {
    let server = Server::start();
    let body = vec![42u8; 300_000];
    server.script("/ok/blob", vec![ok(&body)]);
    let h = host(RunMode::Apply);
    let mut c = ctx(&h, grants(&server), Duration::from_secs(30));
    let url = server.url("/ok/blob");
    c.fetch(url.clone(), sha(&body), "opt/bin/a".into(), 0o644)
        .expect("first");
    c.fetch(url.clone(), sha(&body), "opt/bin/b".into(), 0o755)
        .expect("second");
    assert_eq!(server.hits("/ok/blob"), 1, "the second came from the cache");
    assert_eq!(std::fs::read(h.root.join("opt/bin/b")).expect("b"), body);
    let mode = |p: &str| {
        std::fs::metadata(h.root.join(p))
            .expect("meta")
            .permissions()
            .mode()
            & 0o777
    };
    assert_eq!((mode("opt/bin/a"), mode("opt/bin/b")), (0o644, 0o755));

    // A cache entry that no longer matches its name is discarded and fetched again.
    let entry = h.root.join(CACHE).join("sha256").join(sha(&body));
    std::fs::remove_file(&entry).expect("unlink");
    std::fs::write(&entry, b"rotten").expect("corrupt");
    c.fetch(url, sha(&body), "opt/bin/c".into(), 0o644)
        .expect("third");
    assert_eq!(server.hits("/ok/blob"), 2);
    assert_eq!(std::fs::read(h.root.join("opt/bin/c")).expect("c"), body);
    assert_eq!(
        std::fs::read(&entry).expect("entry"),
        body,
        "cache repaired"
    );
    assert_eq!(tree(&h.root.join("opt/bin")), vec!["a", "b", "c"]);
}

#[test]
fn right_bytes_with_the_wrong_mode_are_a_mode_change() {
    let server = Server::start();
    server.script("/ok/m", vec![ok(b"m")]);
    let h = host(RunMode::Apply);
    let mut c = ctx(&h, grants(&server), Duration::from_secs(30));
    c.fetch(server.url("/ok/m"), sha(b"m"), "opt/bin/m".into(), 0o644)
        .expect("first");
    let got = c
        .fetch(server.url("/ok/m"), sha(b"m"), "opt/bin/m".into(), 0o755)
        .expect("second");
    assert_eq!(got, Outcome::Changed);
    assert_eq!(server.hits("/ok/m"), 1);
    let mode = std::fs::metadata(h.root.join("opt/bin/m"))
        .expect("meta")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o755);
}

#[test]
fn bodies_over_the_size_cap_fail() {
    let server = Server::start();
    let body = vec![1u8; 10_000];
    server.script("/ok/big", vec![ok(&body)]);
    let tmp = host(RunMode::Apply);
    let mut session = RunContext::new(
        HostRoot::open(&tmp.root).expect("root"),
        RunMode::Apply,
        Redactor::default(),
    );
    session.downloads.policy.max_bytes = 1000;
    let h = Host {
        session: Arc::new(session),
        ..tmp
    };
    let mut c = ctx(&h, grants(&server), Duration::from_secs(30));
    let e = c
        .fetch(server.url("/ok/big"), sha(&body), "opt/bin/big".into(), 0)
        .expect_err("too big");
    assert_eq!(err_kind(&e), "failed");
    assert!(message(&e).contains("limit"), "{e:?}");
    assert_eq!(server.hits("/ok/big"), 1);
    assert!(tree(&h.root.join("opt/bin")).is_empty());
}

#[test]
fn bad_arguments_are_invalid() {
    let server = Server::start();
    let h = host(RunMode::Apply);
    let mut c = ctx(&h, grants(&server), Duration::from_secs(30));
    let url = server.url("/ok/x");
    for (u, d, dest) in [
        ("ftp://127.0.0.1/ok/x".to_string(), sha(b"x"), "opt/bin/x"),
        (url.clone(), "ABC".to_string(), "opt/bin/x"),
        (url.clone(), sha(b"x"), "/opt/bin/x"),
        (url.clone(), sha(b"x"), "opt/../etc/x"),
    ] {
        let e = c.fetch(u, d, dest.into(), 0).expect_err("invalid");
        assert_eq!(err_kind(&e), "invalid-argument", "{e:?}");
    }
    assert_eq!(server.total_hits(), 0);
}

#[test]
fn plan_mode_records_and_requests_nothing() {
    let server = Server::start();
    server.script("/ok/p", vec![ok(b"planned")]);
    let h = host(RunMode::Plan);
    std::fs::write(h.root.join("opt/bin/same"), b"planned").expect("seed");
    std::fs::set_permissions(
        h.root.join("opt/bin/same"),
        std::fs::Permissions::from_mode(0o644),
    )
    .expect("chmod");
    let mut c = ctx(&h, grants(&server), Duration::from_secs(30));
    let url = server.url("/ok/p");
    let got = c
        .fetch(url.clone(), sha(b"planned"), "opt/bin/new".into(), 0o755)
        .expect("plan");
    assert_eq!(got, Outcome::Created);
    let got = c
        .fetch(url.clone(), sha(b"planned"), "opt/bin/same".into(), 0o644)
        .expect("plan");
    assert_eq!(got, Outcome::Unchanged);
    let got = c
        .fetch_and_extract(url.clone(), sha(b"planned"), "opt/pkg/x".into(), 1)
        .expect("plan");
    assert_eq!(got, Outcome::Created);
    assert_eq!(server.total_hits(), 0);
    assert!(!h.root.join("opt/bin/new").exists());
    assert!(!h.root.join(CACHE).exists());
    assert_eq!(
        h.session
            .changes()
            .into_iter()
            .map(|c| c.kind)
            .collect::<Vec<_>>(),
        vec![
            ChangeKind::Download {
                url: url.clone(),
                sha256: sha(b"planned"),
                dest: "opt/bin/new".into()
            },
            ChangeKind::DownloadExtract {
                url,
                sha256: sha(b"planned"),
                dest_dir: "opt/pkg/x".into(),
                strip_components: 1
            },
        ]
    );
}

// ------------------------------------------------------------------------------------------
// fetch-and-extract
// ------------------------------------------------------------------------------------------

/// Appends an entry with a raw header, bypassing `tar::Builder`'s own path checks, so hostile
/// names reach the archive.
fn raw_entry(
    b: &mut tar::Builder<Vec<u8>>,
    name: &str,
    kind: tar::EntryType,
    link: Option<&str>,
    data: &[u8],
    mode: u32,
) {
    let mut h = tar::Header::new_gnu();
    let old = h.as_old_mut();
    old.name[..name.len()].copy_from_slice(name.as_bytes());
    if let Some(l) = link {
        old.linkname[..l.len()].copy_from_slice(l.as_bytes());
    }
    h.set_size(data.len() as u64);
    h.set_mode(mode);
    h.set_entry_type(kind);
    h.set_mtime(0);
    h.set_cksum();
    b.append(&h, data).expect("append");
}

/// An archive entry: name, type, link target, contents, mode.
type Spec<'a> = (&'a str, tar::EntryType, Option<&'a str>, &'a [u8], u32);

fn tgz(entries: &[Spec<'_>]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (name, kind, link, data, mode) in entries {
        raw_entry(&mut b, name, *kind, *link, data, *mode);
    }
    let tar = b.into_inner().expect("tar");
    let mut gz = GzEncoder::new(Vec::new(), Compression::default());
    gz.write_all(&tar).expect("gz");
    gz.finish().expect("gz")
}

use tar::EntryType as T;

fn good_archive() -> Vec<u8> {
    tgz(&[
        ("cni-v1/", T::Directory, None, b"", 0o755),
        ("cni-v1/bin/", T::Directory, None, b"", 0o755),
        (
            "cni-v1/bin/bridge",
            T::Regular,
            None,
            b"\x7fELF bridge",
            0o755,
        ),
        ("cni-v1/README", T::Regular, None, b"read me\n", 0o644),
        ("cni-v1/bin/br", T::Symlink, Some("bridge"), b"", 0o777),
        (
            "cni-v1/docs/readme",
            T::Symlink,
            Some("../README"),
            b"",
            0o777,
        ),
        (
            "cni-v1/bin/bridge2",
            T::Link,
            Some("cni-v1/bin/bridge"),
            b"",
            0o755,
        ),
    ])
}

#[test]
fn extracts_with_modes_links_and_strip_components() {
    let server = Server::start();
    let archive = good_archive();
    server.script("/ok/cni.tgz", vec![ok(&archive)]);
    let h = host(RunMode::Apply);
    let mut c = ctx(&h, grants(&server), Duration::from_secs(30));
    let url = server.url("/ok/cni.tgz");
    let got = c
        .fetch_and_extract(url.clone(), sha(&archive), "opt/pkg/cni".into(), 1)
        .expect("extract");
    assert_eq!(got, Outcome::Created);
    let d = h.root.join("opt/pkg/cni");
    assert_eq!(
        tree(&d),
        vec![
            "README",
            "bin",
            "bin/br",
            "bin/bridge",
            "bin/bridge2",
            "docs",
            "docs/readme"
        ]
    );
    let mode = |p: &str| {
        std::fs::symlink_metadata(d.join(p))
            .expect("meta")
            .permissions()
            .mode()
            & 0o777
    };
    assert_eq!(mode("bin/bridge"), 0o755, "executables stay executable");
    assert_eq!(mode("README"), 0o644);
    assert_eq!(
        std::fs::read_link(d.join("bin/br")).expect("link"),
        Path::new("bridge")
    );
    assert_eq!(
        std::fs::read(d.join("docs/readme")).expect("via link"),
        b"read me\n"
    );
    assert_eq!(
        std::fs::read(d.join("bin/bridge2")).expect("hard link"),
        b"\x7fELF bridge"
    );
    assert!(
        tree(&h.root.join("opt/pkg"))
            .iter()
            .all(|p| p.starts_with("cni"))
    );

    // Everything in place: unchanged, from the cache, no request.
    let got = c
        .fetch_and_extract(url.clone(), sha(&archive), "opt/pkg/cni".into(), 1)
        .expect("again");
    assert_eq!(got, Outcome::Unchanged);
    assert_eq!(server.hits("/ok/cni.tgz"), 1);

    // One file changed on disk: only it is rewritten.
    std::fs::write(d.join("README"), b"edited").expect("edit");
    let got = c
        .fetch_and_extract(url.clone(), sha(&archive), "opt/pkg/cni".into(), 1)
        .expect("repair");
    assert_eq!(got, Outcome::Changed);
    assert_eq!(
        std::fs::read(d.join("README")).expect("readme"),
        b"read me\n"
    );
    assert_eq!(server.hits("/ok/cni.tgz"), 1);

    let kinds: Vec<_> = h.session.changes().into_iter().map(|c| c.kind).collect();
    assert_eq!(kinds.len(), 2, "created, then repaired: {kinds:?}");

    // Plan mode over the same root, archive cached: exact, read-only, no request.
    let mut session = RunContext::new(
        HostRoot::open(&h.root).expect("root"),
        RunMode::Plan,
        Redactor::default(),
    );
    session.downloads.cache_dir = HostPath::parse(CACHE).expect("cache");
    let plan = Host {
        _tmp: tempfile::tempdir().expect("tmp"),
        root: h.root.clone(),
        session: Arc::new(session),
    };
    let mut p = ctx(&plan, grants(&server), Duration::from_secs(30));
    let got = p
        .fetch_and_extract(url.clone(), sha(&archive), "opt/pkg/cni".into(), 1)
        .expect("plan in place");
    assert_eq!(got, Outcome::Unchanged);
    std::fs::remove_file(d.join("bin/bridge2")).expect("rm");
    let got = p
        .fetch_and_extract(url, sha(&archive), "opt/pkg/cni".into(), 1)
        .expect("plan repair");
    assert_eq!(got, Outcome::Changed);
    assert!(!d.join("bin/bridge2").exists(), "plan wrote nothing");
    assert_eq!(plan.session.changes().len(), 1);
    assert_eq!(server.hits("/ok/cni.tgz"), 1);
}

#[test]
fn extract_wrong_hash_fails_and_leaves_nothing() {
    let server = Server::start();
    let archive = good_archive();
    server.script("/ok/cni.tgz", vec![ok(&archive)]);
    let h = host(RunMode::Apply);
    let mut c = ctx(&h, grants(&server), Duration::from_secs(30));
    let e = c
        .fetch_and_extract(
            server.url("/ok/cni.tgz"),
            sha(b"other"),
            "opt/pkg/cni".into(),
            1,
        )
        .expect_err("mismatch");
    assert_eq!(err_kind(&e), "failed");
    assert!(!h.root.join("opt/pkg/cni").exists());
    assert!(
        tree(&h.root.join(CACHE)).iter().all(|p| p == "sha256"),
        "{:?}",
        tree(&h.root.join(CACHE))
    );
}

fn assert_refused(archive: Vec<u8>, strip: u32, why: &str) {
    let server = Server::start();
    server.script("/ok/evil.tgz", vec![ok(&archive)]);
    let h = host(RunMode::Apply);
    let before = tree(&h.root);
    let mut c = ctx(&h, grants(&server), Duration::from_secs(30));
    let e = c
        .fetch_and_extract(
            server.url("/ok/evil.tgz"),
            sha(&archive),
            "opt/pkg/evil".into(),
            strip,
        )
        .expect_err(why);
    assert_eq!(err_kind(&e), "failed", "{why}: {e:?}");
    assert!(message(&e).contains("refused"), "{why}: {e:?}");
    eprintln!("{why}: {}", message(&e));
    // Nothing written anywhere: not the destination, not outside it, not the cache entry.
    let after: Vec<_> = tree(&h.root)
        .into_iter()
        .filter(|p| !p.starts_with("var/cache"))
        .collect();
    assert_eq!(after, before, "{why}");
    assert!(
        tree(&h.root.join(CACHE)).iter().all(|p| p == "sha256"),
        "{why}: {:?}",
        tree(&h.root.join(CACHE))
    );
    assert!(h.session.changes().is_empty());
}

#[test]
fn archive_with_dotdot_is_refused() {
    assert_refused(
        tgz(&[
            ("pkg/ok", T::Regular, None, b"fine", 0o644),
            ("pkg/../../../etc/evil", T::Regular, None, b"evil", 0o644),
        ]),
        1,
        "dotdot",
    );
    assert_refused(
        tgz(&[("../evil", T::Regular, None, b"evil", 0o644)]),
        0,
        "leading dotdot",
    );
}

#[test]
fn archive_with_absolute_name_is_refused() {
    assert_refused(
        tgz(&[
            ("ok", T::Regular, None, b"fine", 0o644),
            ("/etc/evil", T::Regular, None, b"evil", 0o644),
        ]),
        0,
        "absolute",
    );
}

#[test]
fn archive_with_escaping_links_is_refused() {
    assert_refused(
        tgz(&[("pkg/esc", T::Symlink, Some("../../etc"), b"", 0o777)]),
        1,
        "symlink up and out",
    );
    assert_refused(
        tgz(&[("esc", T::Symlink, Some("/etc"), b"", 0o777)]),
        0,
        "absolute symlink",
    );
    assert_refused(
        tgz(&[
            ("d", T::Symlink, Some("."), b"", 0o777),
            ("up", T::Symlink, Some("d/.."), b"", 0o777),
        ]),
        0,
        "climbing out through another symlink",
    );
    assert_refused(
        tgz(&[
            ("link", T::Symlink, Some("sub"), b"", 0o777),
            ("link/file", T::Regular, None, b"through", 0o644),
        ]),
        0,
        "writing through a symlink",
    );
    assert_refused(
        tgz(&[("hard", T::Link, Some("../../etc/passwd"), b"", 0o644)]),
        0,
        "hard link out",
    );
    assert_refused(
        tgz(&[("hard", T::Link, Some("missing"), b"", 0o644)]),
        0,
        "hard link to nothing in the archive",
    );
    assert_refused(tgz(&[("dev", T::Char, None, b"", 0o644)]), 0, "device");
}

#[test]
fn extract_into_a_missing_parent_is_not_found() {
    let server = Server::start();
    let archive = good_archive();
    server.script("/ok/cni.tgz", vec![ok(&archive)]);
    let h = host(RunMode::Apply);
    let mut c = ctx(&h, grants(&server), Duration::from_secs(30));
    let e = c
        .fetch_and_extract(
            server.url("/ok/cni.tgz"),
            sha(&archive),
            "opt/none/cni".into(),
            1,
        )
        .expect_err("no parent");
    assert_eq!(err_kind(&e), "not-found", "{e:?}");
    assert_eq!(server.total_hits(), 0);
}

#[test]
fn archive_writing_through_an_existing_symlink_is_refused() {
    let server = Server::start();
    let archive = tgz(&[("sub/evil", T::Regular, None, b"evil", 0o644)]);
    server.script("/ok/evil.tgz", vec![ok(&archive)]);
    let h = host(RunMode::Apply);
    std::fs::create_dir_all(h.root.join("opt/pkg/evil")).expect("mkdir");
    // Within the host root, but outside the destination directory.
    std::os::unix::fs::symlink("../../../etc", h.root.join("opt/pkg/evil/sub")).expect("link");
    let mut c = ctx(&h, grants(&server), Duration::from_secs(30));
    let e = c
        .fetch_and_extract(
            server.url("/ok/evil.tgz"),
            sha(&archive),
            "opt/pkg/evil".into(),
            0,
        )
        .expect_err("through a symlink");
    assert_eq!(err_kind(&e), "failed", "{e:?}");
    assert!(message(&e).contains("existing symlink"), "{e:?}");
    assert!(!h.root.join("etc/evil").exists());
    assert!(tree(&h.root.join("etc")).is_empty());
}
