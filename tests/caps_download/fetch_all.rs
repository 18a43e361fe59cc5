//! `download.fetch-all`: a batch's downloads really run at once (a server that answers only
//! once it holds every request at the same time), each result in request order, one failure
//! stopping none of the others, overlapping destinations ending as the requests in order, and
//! the refusals: one refused request refuses the batch before anything is sent.

use super::fetch_and_extract::tgz;
use super::*;
use crate::common::http::HttpServer;
use nodeward::caps::download::MAX_REQUESTS;
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
    assert_eq!(
        records.len(),
        4,
        "the call's record, then one per request: {records:?}"
    );
    assert_eq!(records[0].call, "download.fetch-all");
    assert_eq!(records[0].outcome, "ok:3 requests: created 3");
    assert_eq!(records[0].args["count"], 3);
    for (i, r) in records[1..].iter().enumerate() {
        assert_eq!(r.call, format!("download.fetch-all[{}]", i + 1));
        assert_eq!(r.outcome, "ok:created");
        assert!(!r.denied);
    }
    assert_eq!(records[2].args["fetch"]["dest"], "opt/bin/kubelet");
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
    let many: Vec<FetchRequest> = (0..=MAX_REQUESTS)
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

/// The probe with `calls` under `limits`, its summary parsed, or how the run stopped.
fn run_probe_limited(
    h: &Host,
    grants: Grants,
    calls: Value,
    limits: Limits,
) -> Result<Vec<Value>, nodeward::runtime::PhaseError> {
    let loaded = common::load_guest(
        nodeward::built::TEST_GUEST_PROBE_COMPONENT,
        "probe",
        "probe",
    );
    let report = common::runtime().run(
        &loaded,
        ctx(h, grants, Duration::from_secs(60)),
        &calls.to_string(),
        limits,
    )?;
    Ok(serde_json::from_str(&report.summary).expect("probe summary is JSON"))
}

/// 100,000 requests lifted from guest memory are refused as too many (`invalid-argument`),
/// with one record, nothing sent; what the host held meanwhile is bounded by the phase's
/// memory limit (the guest's own memory, in this process too) plus what one call's arguments
/// may take (`Limits::hostcall_bytes`).
#[test]
fn a_batch_of_100000_requests_is_refused_within_bounded_memory() {
    let server = Server::start();
    let h = host(RunMode::Apply);
    // Load (compile) the probe before measuring: compiling is not the guest's doing.
    common::load_guest(
        nodeward::built::TEST_GUEST_PROBE_COMPONENT,
        "probe",
        "probe",
    );
    let limits = Limits {
        memory: 128 << 20,
        ..Limits::default()
    };
    let request = json!({ "op": "download.fetch", "url": server.url("/ok/x"),
                          "sha256": sha(b"x"), "dest": "opt/bin/x", "mode": 0o755 });
    let before = common::reset_peak();
    let out = run_probe_limited(
        &h,
        grants(&server),
        json!([{ "op": "download.fetch-all", "requests": [request],
                 "repeat-requests": 100_000 }]),
        limits,
    )
    .expect("the probe runs");
    let grew = common::peak_growth_mib(before);
    assert_eq!(out[0]["err"]["kind"], "invalid-argument", "{out:?}");
    let text = out[0]["err"]["message"].as_str().unwrap_or_default();
    assert!(text.contains("100000 requests"), "{text}");
    assert_eq!(server.total_hits(), 0);
    let records = h.session.audit.records();
    assert_eq!(records.len(), 1, "one record, no per-request ones");
    let ceiling = (limits.memory + limits.hostcall_bytes()) >> 20;
    eprintln!("peak RSS grew {grew} MiB lifting 100,000 requests (ceiling {ceiling} MiB)");
    assert!(grew < ceiling as u64, "{grew} MiB");
}

/// A hostile guest limited to 32 MiB names one 1 MiB buffer as the URL of 100 requests:
/// lifted, 100 MiB in the host (within wasmtime's default 128 MiB of hostcall fuel, were it not
/// set). The call
/// is not made: the run stops at the hostcall limit (20 MiB), naming it, and
/// the host never holds the 100 MiB.
#[test]
fn a_list_naming_one_buffer_many_times_stops_at_the_hostcall_limit() {
    let server = Server::start();
    let h = host(RunMode::Apply);
    common::load_guest(
        nodeward::built::TEST_GUEST_PROBE_COMPONENT,
        "probe",
        "probe",
    );
    let limits = Limits {
        memory: 32 << 20,
        ..Limits::default()
    };
    assert_eq!(limits.hostcall_bytes(), 20 << 20);
    let request = json!({ "op": "download.fetch", "url": server.url("/ok/x"),
                          "sha256": sha(b"x"), "dest": "opt/bin/x", "mode": 0o755 });
    let before = common::reset_peak();
    let err = run_probe_limited(
        &h,
        grants(&server),
        json!([{ "op": "download.fetch-all", "requests": [request],
                 "repeat-requests": 100, "alias-url": 1 << 20 }]),
        limits,
    )
    .expect_err("the hostcall limit stops the run");
    let grew = common::peak_growth_mib(before);
    let text = err.to_string();
    assert!(
        matches!(err, nodeward::runtime::PhaseError::Trapped { .. })
            && text.contains("at most 20971520 bytes"),
        "{text}"
    );
    assert_eq!(server.total_hits(), 0);
    assert!(
        h.session.audit.records().is_empty(),
        "the call was never made"
    );
    eprintln!("peak RSS grew {grew} MiB for 100 × 1 MiB named (ceiling 96 MiB)");
    assert!(grew < 96, "{grew} MiB: the host copied the aliased buffer");
}

/// A refused request has its own record flagged `denied`, as has the batch's, so that
/// `audit show --denied` finds both: a redirect outside the URL grant, found while the batch
/// runs (its checks all passed).
#[test]
fn a_request_refused_while_running_is_a_denied_record_of_its_own() {
    let server = Server::start();
    server.script("/ok/a", vec![ok(b"a")]);
    server.script("/ok/b", vec![redirect(&server.url("/elsewhere/b"))]);
    let h = host(RunMode::Apply);
    let mut c = ctx(&h, grants(&server), Duration::from_secs(30));
    let results = c
        .fetch_all(vec![
            file(&server.url("/ok/a"), b"a", "opt/bin/a"),
            file(&server.url("/ok/b"), b"b", "opt/bin/b"),
        ])
        .expect("the batch ran");
    assert!(matches!(results[0], Ok(Outcome::Created)), "{results:?}");
    assert_eq!(
        err_kind(results[1].as_ref().expect_err("redirect out")),
        "denied"
    );
    drop(c);
    let records = h.session.audit.records();
    let calls: Vec<(&str, bool)> = records
        .iter()
        .map(|r| (r.call.as_str(), r.denied))
        .collect();
    assert_eq!(
        calls,
        vec![
            ("download.fetch-all", true),
            ("download.fetch-all[1]", false),
            ("download.fetch-all[2]", true),
        ]
    );
    assert_eq!(records[0].outcome, "ok:2 requests: created 1, denied 1 [2]");
    assert_eq!(records[1].outcome, "ok:created");
    assert!(records[2].outcome.starts_with("denied: "), "{records:?}");
    assert_eq!(records[2].args["fetch"]["dest"], "opt/bin/b");
    assert_eq!(records[2].args["request"], 2);
    assert_eq!(records[2].args["of"], 2);

    // As the trail holds them, `audit show --denied` (its filter) keeps the batch and the
    // refused request, not the one that was fetched.
    use nodeward::audit::entry::{AGENT_VERSION, Entry, Event, Mode, ZERO_HASH, now};
    use nodeward::audit::query::Filter;
    let denied = Filter {
        denied: true,
        ..Filter::default()
    };
    let shown: Vec<String> = records
        .iter()
        .enumerate()
        .map(|(i, r)| Entry {
            seq: i as u64 + 1,
            time: now(),
            prev: ZERO_HASH.into(),
            run_id: "0123456789abcdef".into(),
            agent: AGENT_VERSION.into(),
            event: Event::call(r, Mode::Apply, None, None),
        })
        .filter(|e| denied.matches(e))
        .filter_map(|e| match e.event {
            Event::Call { call, .. } => Some(call),
            _ => None,
        })
        .collect();
    assert_eq!(shown, vec!["download.fetch-all", "download.fetch-all[2]"]);
}

/// Sixteen requests each failing with a long error (a URL of 200 bytes, answered 404): each
/// request's record holds its own URL and error, none cut off by the others'.
#[test]
fn sixteen_long_errors_are_each_recorded_whole() {
    let server = Server::start();
    let h = host(RunMode::Apply);
    let mut c = ctx(&h, grants(&server), Duration::from_secs(30));
    let url = |i: usize| server.url(&format!("/ok/{i:02}-{}", "x".repeat(200)));
    for i in 0..MAX_REQUESTS {
        server.script(&url(i)[server.url("").len()..], vec![status(404)]);
    }
    let requests: Vec<FetchRequest> = (0..MAX_REQUESTS)
        .map(|i| file(&url(i), b"gone", &format!("opt/bin/f{i:02}")))
        .collect();
    let results = c.fetch_all(requests).expect("the batch ran");
    assert!(results.iter().all(|r| r.is_err()), "{results:?}");
    drop(c);
    let records = h.session.audit.records();
    assert_eq!(records.len(), 1 + MAX_REQUESTS);
    assert!(
        records[0]
            .outcome
            .starts_with("ok:16 requests: failed 16 [1, 2, 3"),
        "{}",
        records[0].outcome
    );
    for (i, r) in records[1..].iter().enumerate() {
        assert_eq!(r.call, nodeward::caps::download::REQUEST_CALLS[i]);
        assert_eq!(r.args["fetch"]["dest"], format!("opt/bin/f{i:02}"));
        assert!(
            r.outcome.starts_with("failed: ") && r.outcome.contains(&format!("/ok/{i:02}-")),
            "request {}: {}",
            i + 1,
            r.outcome
        );
        assert!(r.outcome.contains("404"), "{}", r.outcome);
    }
}
