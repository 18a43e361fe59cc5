//! The `download-artifacts` phase against an HTTP server on 127.0.0.1: fetches and verifies
//! the pinned artifacts into a version directory, marks it complete, short-circuits when it is,
//! and refuses wrong digests, bad version names and unpinned URLs.

use super::*;
use crate::common::http::{HttpServer, Reply};

/// Serves fixed bodies by request target (404 otherwise) on the tests' HTTP server.
fn file_server(files: Vec<(&'static str, Vec<u8>)>) -> HttpServer {
    HttpServer::start(
        move |req| match files.iter().find(|(p, _)| *p == req.target) {
            Some((_, body)) => Reply::ok(body),
            None => Reply::not_found(),
        },
    )
}

fn sha(bytes: &[u8]) -> String {
    nodeward::bundle::sha256_hex(bytes)
}

/// A tar.gz with `top/<name>` entries (mode 0755).
fn tarball(top: &str, files: &[(&str, &[u8])]) -> Vec<u8> {
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    let mut b = tar::Builder::new(gz);
    for (name, body) in files {
        let mut h = tar::Header::new_gnu();
        h.set_size(body.len() as u64);
        h.set_mode(0o755);
        h.set_cksum();
        b.append_data(&mut h, format!("{top}{name}"), *body)
            .expect("append");
    }
    b.into_inner().expect("tar").finish().expect("gz")
}

fn artifacts(server: &HttpServer, kubelet: &[u8], tgz: &[u8]) -> Vec<Artifact> {
    vec![
        Artifact {
            name: "kubelet".into(),
            url: server.url("/kubelet"),
            sha256: Some(sha(kubelet)),
            kind: ArtifactKind::Binary {
                dest: "bin/kubelet".into(),
            },
        },
        Artifact {
            name: "containerd".into(),
            url: server.url("/containerd.tar.gz"),
            sha256: Some(sha(tgz)),
            kind: ArtifactKind::Tarball {
                dest: "bin".into(),
                strip: 1,
            },
        },
    ]
}

#[test]
fn fetches_verifies_marks_complete_and_then_short_circuits() {
    let f = Fixture::new();
    let kubelet = b"#!/bin/sh\necho kubelet\n".to_vec();
    let tgz = tarball(
        "bin/",
        &[
            ("containerd", b"containerd"),
            ("containerd-shim-runc-v2", b"shim"),
        ],
    );
    let server = file_server(vec![
        ("/kubelet", kubelet.clone()),
        ("/containerd.tar.gz", tgz.clone()),
    ]);
    let mut input = input(&f);
    input.artifacts = artifacts(&server, &kubelet, &tgz);
    let s = f.session(RunMode::Apply);
    phase(&s, "setup-host", &input).expect("setup-host");
    let out = phase(&s, "download-artifacts", &input).expect("download");
    assert_eq!(out.report.changed, ["artifacts"]);
    no_denials(&s, "download-artifacts");
    let vdir = format!("opt/nodeward/node/{VERSION}");
    assert_eq!(read(&f, &format!("{vdir}/bin/kubelet")).as_bytes(), kubelet);
    let mode = std::fs::metadata(f.root.join(format!("{vdir}/bin/kubelet")))
        .expect("kubelet")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o755);
    assert_eq!(read(&f, &format!("{vdir}/bin/containerd")), "containerd");
    assert_eq!(
        read(&f, &format!("{vdir}/bin/containerd-shim-runc-v2")),
        "shim"
    );
    assert!(f.root.join(format!("{vdir}/libexec/cni")).is_dir());
    assert_eq!(
        read(&f, &format!("{vdir}/.complete")),
        format!("{VERSION}\n")
    );
    assert!(
        std::fs::symlink_metadata(f.root.join("opt/nodeward/node/current")).is_err(),
        "the link is install's"
    );

    let hits = server.requests().len();
    let before = snapshot(&f.root);
    let again = phase(&s, "download-artifacts", &input).expect("again");
    assert!(
        again.report.summary.contains("already installed"),
        "{:?}",
        again.report
    );
    assert!(again.report.changed.is_empty());
    assert_eq!(snapshot(&f.root), before);
    assert_eq!(server.requests().len(), hits);
}

#[test]
fn a_wrong_digest_names_the_artifact_and_leaves_no_marker() {
    let f = Fixture::new();
    let server = file_server(vec![("/kubelet", b"evil".to_vec())]);
    let mut input = input(&f);
    input.artifacts = artifacts(&server, b"good", b"unused");
    input.artifacts.truncate(1);
    let s = f.session(RunMode::Apply);
    phase(&s, "setup-host", &input).expect("setup-host");
    let err = phase(&s, "download-artifacts", &input).expect_err("hash mismatch");
    let msg = err.to_string();
    assert!(
        msg.contains(&format!(
            "downloading kubelet from {}",
            server.url("/kubelet")
        )),
        "{msg}"
    );
    let vdir = f.root.join(format!("opt/nodeward/node/{VERSION}"));
    assert!(!vdir.join(".complete").exists());
    assert!(!vdir.join("bin/kubelet").exists());
}

#[test]
fn plan_skips_unpinned_artifacts_and_plans_the_marker() {
    let f = Fixture::new();
    let mut input = input(&f);
    input.artifacts = nodeward_node_config::input::default_artifacts(
        input.config().expect("config"),
        &input.arch,
    );
    assert!(input.artifacts.iter().all(|a| a.sha256.is_none()));
    std::fs::create_dir_all(f.root.join("opt/nodeward/node")).expect("node dir");
    let before = snapshot(&f.root);
    let s = f.session(RunMode::Plan);
    let out = phase(&s, "download-artifacts", &input).expect("plan");
    assert!(
        out.report.summary.contains("plan only: skipped kubelet"),
        "{:?}",
        out.report
    );
    assert_eq!(snapshot(&f.root), before, "plan touches nothing");
    let changes = changes_json(&s);
    // Directories and the marker (so `install` can plan against it), no download.
    assert!(
        changes
            .iter()
            .all(|c| c["kind"] == "dir-create" || c["kind"] == "file-create"),
        "{changes:?}"
    );
    assert!(
        changes
            .iter()
            .any(|c| c["path"].as_str().is_some_and(|p| p.ends_with(".complete")))
    );
}

#[test]
fn refuses_a_bad_version_name_and_urls_not_pinned_for_the_run() {
    let f = Fixture::new();
    let s = f.session(RunMode::Plan);
    let mut bad = input(&f);
    bad.version = "../etc".into();
    let err = phase(&s, "download-artifacts", &bad).expect_err("bad version");
    assert!(err.to_string().contains("input.version"), "{err}");

    let mut input = input(&f);
    input.artifacts = vec![Artifact {
        name: "kubelet".into(),
        url: "http://example.com/kubelet".into(),
        sha256: Some("0".repeat(64)),
        kind: ArtifactKind::Binary {
            dest: "bin/kubelet".into(),
        },
    }];
    std::fs::create_dir_all(f.root.join("opt/nodeward/node")).expect("node dir");
    // The operator's config pinned it, so the host admits exactly it (plain http too:
    // the sha256 pins the bytes).
    phase(&s, "download-artifacts", &input).expect("a pinned artifact is planned");
    assert!(
        changes_json(&s)
            .iter()
            .any(|c| c["kind"] == "download" && c["url"] == "http://example.com/kubelet"),
        "{:?}",
        changes_json(&s)
    );
    // The same request without the host having pinned it for this run is refused.
    let err = phase_with_grants(
        &f.session(RunMode::Plan),
        "download-artifacts",
        bundle_grants("download-artifacts"),
        &input,
    )
    .expect_err("not pinned for this run");
    let msg = err.to_string();
    assert!(
        msg.contains("downloading kubelet from http://example.com/kubelet")
            && msg.contains("denied")
            && msg.contains("download.pinned-artifacts"),
        "{msg}"
    );
}
