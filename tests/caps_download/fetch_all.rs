//! `download.fetch-all`: a batch's downloads really run at once (a server that answers only
//! once it holds every request at the same time), each result in request order, one failure
//! stopping none of the others, overlapping destinations ending as the requests in order, and
//! the refusals: one refused request refuses the batch before anything is sent.

use super::fetch_and_extract::tgz;
use super::*;
use crate::common::http::HttpServer;
use nodeward::wit::download::{ArchiveFetch, FetchRequest, FileFetch};
use std::sync::{Condvar, Mutex};

fn file(url: &str, body: &[u8], dest: &str) -> FetchRequest {
    FetchRequest::File(FileFetch {
        url: url.into(),
        sha256: sha(body),
        dest: dest.into(),
        mode: 0o755,
    })
}

fn archive(url: &str, body: &[u8], dest: &str) -> FetchRequest {
    FetchRequest::Archive(ArchiveFetch {
        url: url.into(),
        sha256: sha(body),
        dest_dir: dest.into(),
        strip_components: 0,
    })
}

fn url_grants(prefix: String) -> Grants {
    Grants {
        fs: FsGrant {
            read: vec![],
            write: vec!["opt".into()],
        },
        download: DownloadGrant {
            urls: vec![prefix],
            ..Default::default()
        },
        ..Grants::default()
    }
}

/// A server whose `/ok/` answers (the bodies of `bodies`, by path) are held until `together`
/// requests are in at once; a request still alone after 20 s gets 404, so downloads made one
/// after the other fail instead of passing.
fn rendezvous(together: usize, bodies: Vec<(&'static str, Vec<u8>)>) -> HttpServer {
    let waiting = std::sync::Arc::new((Mutex::new(0usize), Condvar::new()));
    HttpServer::start(move |req| {
        let Some((_, body)) = bodies.iter().find(|(p, _)| *p == req.target) else {
            return status(404);
        };
        let (count, all_in) = &*waiting;
        let mut n = count.lock().unwrap_or_else(|p| p.into_inner());
        *n += 1;
        all_in.notify_all();
        let (n, timeout) = all_in
            .wait_timeout_while(n, Duration::from_secs(20), |n| *n < together)
            .unwrap_or_else(|p| p.into_inner());
        drop(n);
        if timeout.timed_out() {
            return status(404);
        }
        ok(body)
    })
}

#[test]
fn a_batch_downloads_at_once_through_the_guest_and_answers_in_order() {
    let kubelet = b"\x7fELF kubelet".repeat(5000);
    let runc = b"\x7fELF runc".repeat(3000);
    let cni = tgz(&[(
        "bridge",
        tar::EntryType::Regular,
        None,
        b"\x7fELF bridge",
        0o755,
    )]);
    let server = rendezvous(
        3,
        vec![
            ("/ok/kubelet", kubelet.clone()),
            ("/ok/runc", runc.clone()),
            ("/ok/cni.tgz", cni.clone()),
        ],
    );
    let h = host(RunMode::Apply);
    let req = |op: &str, path: &str, body: &[u8], dest: &str| {
        json!({ "op": op, "url": server.url(path), "sha256": sha(body),
                "dest": dest, "dest-dir": dest, "mode": 0o755, "strip-components": 0 })
    };
    let out = run_probe(
        &h,
        url_grants(server.url("/ok/")),
        json!([{ "op": "download.fetch-all", "requests": [
            req("download.fetch-and-extract", "/ok/cni.tgz", &cni, "opt/pkg/cni"),
            req("download.fetch", "/ok/kubelet", &kubelet, "opt/bin/kubelet"),
            req("download.fetch", "/ok/runc", &runc, "opt/bin/runc"),
        ] }]),
    );
    assert_eq!(
        out[0],
        json!({ "ok": [{ "ok": "created" }, { "ok": "created" }, { "ok": "created" }] }),
        "three requests in at once, answered in request order"
    );
    assert_eq!(
        std::fs::read(h.root.join("opt/bin/kubelet")).expect("kubelet"),
        kubelet
    );
    assert_eq!(
        std::fs::read(h.root.join("opt/bin/runc")).expect("runc"),
        runc
    );
    assert_eq!(
        std::fs::read(h.root.join("opt/pkg/cni/bridge")).expect("bridge"),
        b"\x7fELF bridge"
    );
    let records = h.session.audit.records();
    assert_eq!(records.len(), 1, "one call, one record: {records:?}");
    assert_eq!(records[0].call, "download.fetch-all");
    assert_eq!(records[0].outcome, "ok:created; created; created");
    assert_eq!(
        records[0].args["requests"][1]["fetch"]["dest"],
        "opt/bin/kubelet"
    );
    let mut changed: Vec<String> = h
        .session
        .changes()
        .iter()
        .map(|c| c.kind.describe())
        .collect();
    changed.sort();
    assert_eq!(changed.len(), 3, "{changed:?}");
}

#[test]
fn one_refused_request_refuses_the_batch_and_nothing_is_sent() {
    let server = Server::start();
    server.script("/ok/a", vec![ok(b"a")]);
    server.script("/other/b", vec![ok(b"b")]);
    let h = host(RunMode::Apply);
    let out = run_probe(
        &h,
        grants(&server),
        json!([{ "op": "download.fetch-all", "requests": [
            { "op": "download.fetch", "url": server.url("/ok/a"), "sha256": sha(b"a"),
              "dest": "opt/bin/a", "mode": 0o755 },
            { "op": "download.fetch", "url": server.url("/other/b"), "sha256": sha(b"b"),
              "dest": "opt/bin/b", "mode": 0o755 },
        ] }]),
    );
    assert_eq!(out[0]["err"]["kind"], "denied", "{out:?}");
    let text = out[0]["err"]["message"].as_str().unwrap_or_default();
    assert!(
        text.starts_with("request 2: ") && text.contains("download.urls"),
        "{text}"
    );
    assert_eq!(server.total_hits(), 0, "nothing was requested");
    assert!(
        !h.root.join("opt/bin/a").exists(),
        "not even the admitted one"
    );
    let records = h.session.audit.records();
    assert_eq!(records.len(), 1);
    assert!(records[0].denied, "{records:?}");

    // A write grant missing for one destination refuses the batch the same way.
    let mut c = ctx(&h, grants(&server), Duration::from_secs(30));
    let e = c
        .fetch_all(vec![
            file(&server.url("/ok/a"), b"a", "opt/bin/a"),
            archive(&server.url("/ok/a"), b"a", "etc/a"),
        ])
        .expect_err("etc is not granted");
    assert_eq!(err_kind(&e), "denied", "{e:?}");
    assert!(message(&e).starts_with("request 2: "), "{e:?}");
    assert_eq!(server.total_hits(), 0);
}

#[test]
fn empty_oversized_and_malformed_batches_are_invalid() {
    let server = Server::start();
    let h = host(RunMode::Apply);
    let mut c = ctx(&h, grants(&server), Duration::from_secs(30));
    let e = c.fetch_all(vec![]).expect_err("empty");
    assert_eq!(err_kind(&e), "invalid-argument", "{e:?}");
    let many: Vec<FetchRequest> = (0..=nodeward::caps::download::MAX_REQUESTS)
        .map(|i| file(&server.url("/ok/x"), b"x", &format!("opt/bin/x{i}")))
        .collect();
    let e = c.fetch_all(many).expect_err("too many");
    assert_eq!(err_kind(&e), "invalid-argument", "{e:?}");
    let e = c
        .fetch_all(vec![
            file(&server.url("/ok/x"), b"x", "opt/bin/x"),
            file(&server.url("/ok/y"), b"y", "opt/../etc/y"),
        ])
        .expect_err("bad dest");
    assert_eq!(err_kind(&e), "invalid-argument", "{e:?}");
    assert!(message(&e).starts_with("request 2: "), "{e:?}");
    assert_eq!(server.total_hits(), 0);
    assert_eq!(h.session.audit.records().len(), 3);
}

#[test]
fn one_failure_stops_none_of_the_others() {
    let server = Server::start();
    server.script("/ok/evil", vec![ok(b"evil bytes")]);
    server.script("/ok/good", vec![ok(b"good bytes")]);
    server.script("/ok/gone", vec![status(404)]);
    let h = host(RunMode::Apply);
    let mut c = ctx(&h, grants(&server), Duration::from_secs(30));
    let results = c
        .fetch_all(vec![
            file(&server.url("/ok/evil"), b"expected bytes", "opt/bin/evil"),
            file(&server.url("/ok/good"), b"good bytes", "opt/bin/good"),
            file(&server.url("/ok/gone"), b"gone", "opt/bin/gone"),
        ])
        .expect("the batch ran");
    assert_eq!(results.len(), 3);
    let e = results[0].as_ref().expect_err("hash mismatch");
    assert_eq!(err_kind(e), "failed", "{e:?}");
    assert!(matches!(results[1], Ok(Outcome::Created)), "{results:?}");
    assert_eq!(err_kind(results[2].as_ref().expect_err("404")), "failed");
    assert_eq!(
        std::fs::read(h.root.join("opt/bin/good")).expect("good"),
        b"good bytes"
    );
    assert_eq!(
        tree(&h.root.join("opt/bin")),
        vec!["good"],
        "nothing else left"
    );
}

#[test]
fn overlapping_destinations_end_as_the_requests_in_order() {
    // An archive unpacked into opt/pkg that holds `tool`, and a file fetched to opt/pkg/tool:
    // whichever comes later in the batch wins, every time.
    let packed = tgz(&[(
        "tool",
        tar::EntryType::Regular,
        None,
        b"from the archive",
        0o755,
    )]);
    let single: &[u8] = b"the single file";
    let server = Server::start();
    server.script("/ok/pkg.tgz", vec![ok(&packed)]);
    server.script("/ok/tool", vec![ok(single)]);
    for (archive_first, wins) in [(true, single), (false, b"from the archive".as_slice())] {
        for _ in 0..3 {
            let h = host(RunMode::Apply);
            let mut c = ctx(&h, grants(&server), Duration::from_secs(30));
            let a = archive(&server.url("/ok/pkg.tgz"), &packed, "opt/pkg");
            let f = file(&server.url("/ok/tool"), single, "opt/pkg/tool");
            let requests = if archive_first {
                vec![a, f]
            } else {
                vec![f, a]
            };
            let results = c.fetch_all(requests).expect("the batch ran");
            assert!(results.iter().all(Result::is_ok), "{results:?}");
            assert_eq!(
                std::fs::read(h.root.join("opt/pkg/tool")).expect("tool"),
                wins,
                "archive first: {archive_first}"
            );
        }
    }
}

#[test]
fn plan_mode_plans_in_request_order_and_requests_nothing() {
    let server = Server::start();
    let h = host(RunMode::Plan);
    let mut c = ctx(&h, grants(&server), Duration::from_secs(30));
    let results = c
        .fetch_all(vec![
            file(&server.url("/ok/b"), b"b", "opt/bin/b"),
            archive(&server.url("/ok/a.tgz"), b"a", "opt/pkg/a"),
            file(&server.url("/ok/c"), b"c", "opt/bin/c"),
        ])
        .expect("plan");
    assert!(
        results.iter().all(|r| matches!(r, Ok(Outcome::Created))),
        "{results:?}"
    );
    assert_eq!(server.total_hits(), 0);
    let dests: Vec<String> = h
        .session
        .changes()
        .iter()
        .map(|c| match &c.kind {
            ChangeKind::Download { dest, .. } => dest.clone(),
            ChangeKind::DownloadExtract { dest_dir, .. } => dest_dir.clone(),
            other => panic!("unexpected change {other:?}"),
        })
        .collect();
    assert_eq!(dests, vec!["opt/bin/b", "opt/pkg/a", "opt/bin/c"]);
    assert!(!h.root.join("opt/bin/b").exists());
}
