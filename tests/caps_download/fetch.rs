//! `download.fetch`: verified downloads, retries and back-off, deadlines, redirects checked
//! against the grant, the artifact cache, size caps, refusals, and plan mode.

use super::*;

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
