//! Symlinks cannot widen an `fs` or `download` grant (issue 10, attack class "links").
//!
//! Each test is an attack by a phase (the probe guest) with a narrow grant, against a link it
//! made itself or one planted in the root by anyone: every call is refused with a typed error
//! and nothing outside the grant changes. Links that stay inside the grant keep working.

mod common;

use common::*;
use nodeward::hostpath::{HostPath, is_link_refused};
use nodeward::plan::RunMode;
use nodeward::rootfs::EntryKind;
use serde_json::{Value, json};
use std::os::unix::fs::{PermissionsExt, symlink};

/// A root with `etc/shadow` (0600) that no grant below covers, and an empty `w/`.
fn shadowed_root() -> Fixture {
    let f = Fixture::new();
    std::fs::create_dir_all(f.root.join("etc")).expect("etc");
    std::fs::create_dir_all(f.root.join("w")).expect("w");
    std::fs::write(f.root.join("etc/shadow"), "root:$6$secret:::\n").expect("shadow");
    std::fs::set_permissions(
        f.root.join("etc/shadow"),
        std::fs::Permissions::from_mode(0o600),
    )
    .expect("chmod");
    f
}

fn kinds(results: &[Value]) -> Vec<String> {
    results.iter().map(kind).collect()
}

/// With `fs.write = ["w"]`, a link `w/e -> ../etc` neither can be made nor, when planted by
/// someone else, used by any `fs` function, in plan and in apply.
#[test]
fn a_link_inside_a_write_grant_does_not_reach_outside_it() {
    for mode in [RunMode::Apply, RunMode::Plan] {
        let f = shadowed_root();
        let g = grants("[fs]\nwrite = [\"w\"]\n");
        let made = probe(
            &f.session(mode),
            g.clone(),
            json!([{"op": "fs.symlink", "target": "../etc", "path": "w/e"}]),
        );
        assert_eq!(kinds(&made), ["denied"], "{mode:?}: {made:?}");
        assert!(
            err_message(&made[0]).contains("leads to etc"),
            "{}",
            made[0]
        );

        symlink("../etc", f.root.join("w/e")).expect("planted link");
        let before = snapshot(&f.root);
        let s = f.session(mode);
        let r = probe(
            &s,
            g,
            json!([
                {"op": "fs.write-file", "path": "w/e/shadow", "contents": "owned", "mode": 0o644},
                {"op": "fs.read-file", "path": "w/e/shadow"},
                {"op": "fs.create-dir", "path": "w/e/sub", "mode": 0o755},
                {"op": "fs.remove", "path": "w/e/shadow"},
                {"op": "fs.remove-all", "path": "w/e/shadow"},
                {"op": "fs.list-dir", "path": "w/e"},
                {"op": "fs.stat", "path": "w/e/shadow"},
                {"op": "fs.symlink", "target": "shadow", "path": "w/e/again"},
                {"op": "fs.stat", "path": "w/e"},
            ]),
        );
        let expected = [
            "denied", "denied", "denied", "denied", "denied", "denied", "denied", "denied",
        ];
        assert_eq!(kinds(&r[..8]), expected, "{mode:?}: {r:?}");
        for result in &r[..8] {
            let m = err_message(result);
            assert!(
                m.contains("symlink w/e") && m.contains("etc"),
                "names the link: {m}"
            );
        }
        assert_eq!(
            ok(&r[8]),
            &json!({"kind": "symlink", "mode": 0o777, "size": 6}),
            "the link itself lies in the grant"
        );
        assert_eq!(snapshot(&f.root), before, "{mode:?}: nothing changed");
        assert!(s.changes().is_empty());
        let denied = s.audit.records().iter().filter(|r| r.denied).count();
        assert_eq!(denied, 8, "every refusal is audited as denied");
    }
}

/// Removing the link itself is what the grant allows: `remove` and `remove-all` of `w/e`
/// remove the link, never what it points at.
#[test]
fn removing_a_planted_link_removes_only_the_link() {
    let f = shadowed_root();
    symlink("../etc", f.root.join("w/e")).expect("planted link");
    symlink("../etc/shadow", f.root.join("w/f")).expect("planted file link");
    let r = probe(
        &f.session(RunMode::Apply),
        grants("[fs]\nwrite = [\"w\"]\n"),
        json!([
            {"op": "fs.remove-all", "path": "w/e"},
            {"op": "fs.remove", "path": "w/f"},
        ]),
    );
    assert_eq!(ok(&r[0]), "removed");
    assert_eq!(ok(&r[1]), "removed");
    assert!(f.root.join("etc/shadow").is_file());
    assert!(std::fs::symlink_metadata(f.root.join("w/e")).is_err());
}

/// A write grant on ONE file: the phase removes it and re-creates it as a link to
/// `etc/shadow` (refused), and a link planted there is neither read through nor written
/// through.
#[test]
fn a_single_file_grant_cannot_be_turned_into_a_link() {
    let f = shadowed_root();
    std::fs::write(f.root.join("w/file"), "mine").expect("file");
    let g = grants("[fs]\nwrite = [\"w/file\"]\n");
    let r = probe(
        &f.session(RunMode::Apply),
        g.clone(),
        json!([
            {"op": "fs.remove", "path": "w/file"},
            {"op": "fs.symlink", "target": "../etc/shadow", "path": "w/file"},
            {"op": "fs.read-file", "path": "w/file"},
        ]),
    );
    assert_eq!(kinds(&r), ["ok", "denied", "not-found"], "{r:?}");

    symlink("../etc/shadow", f.root.join("w/file")).expect("planted");
    let before = snapshot(&f.root);
    let r = probe(
        &f.session(RunMode::Apply),
        g,
        json!([
            {"op": "fs.read-file", "path": "w/file"},
            {"op": "fs.write-file", "path": "w/file", "contents": "owned", "mode": 0o644},
        ]),
    );
    assert_eq!(kinds(&r), ["denied", "io"], "{r:?}");
    assert!(err_message(&r[1]).contains("in the way"), "{}", r[1]);
    assert_eq!(snapshot(&f.root), before);
    let shadow = std::fs::metadata(f.root.join("etc/shadow")).expect("shadow");
    assert_eq!(shadow.permissions().mode() & 0o777, 0o600, "mode untouched");
}

/// A chain of links is checked at every hop: a link in the grant that leads through a
/// location outside it is refused even when the chain ends inside the grant again.
#[test]
fn every_hop_of_a_chain_must_stay_in_the_grant() {
    let f = shadowed_root();
    std::fs::create_dir_all(f.root.join("x")).expect("x");
    std::fs::create_dir_all(f.root.join("w/real")).expect("real");
    symlink("../x/l2", f.root.join("w/l1")).expect("l1");
    symlink("../w/real", f.root.join("x/l2")).expect("l2");
    symlink("b", f.root.join("w/a")).expect("a");
    symlink("a", f.root.join("w/b")).expect("b");
    let r = probe(
        &f.session(RunMode::Apply),
        grants("[fs]\nwrite = [\"w\"]\n"),
        json!([
            {"op": "fs.write-file", "path": "w/l1/f", "contents": "x", "mode": 0o644},
            {"op": "fs.read-file", "path": "w/a/f"},
        ]),
    );
    assert_eq!(kinds(&r), ["denied", "io"], "{r:?}");
    assert!(err_message(&r[0]).contains("x/l2"), "{}", r[0]);
    assert!(err_message(&r[1]).contains("symlinks"), "{}", r[1]);
    assert!(!f.root.join("w/real/f").exists());
}

/// Links that stay inside the grant work as links: the default bundle's `opt/cni/bin ->
/// ../nodeward/node/current/libexec/cni` and `current -> <version>`. The change list names the
/// path really written.
#[test]
fn links_inside_the_grant_are_followed_and_the_change_names_the_real_path() {
    let f = Fixture::new();
    std::fs::create_dir_all(f.root.join("opt/nodeward/node/v1/libexec/cni")).expect("dirs");
    std::fs::create_dir_all(f.root.join("opt/cni")).expect("opt/cni");
    let s = f.session(RunMode::Apply);
    let r = probe(
        &s,
        grants("[fs]\nwrite = [\"opt/nodeward/node\", \"opt/cni/bin\"]\n"),
        json!([
            {"op": "fs.symlink", "target": "v1", "path": "opt/nodeward/node/current"},
            {"op": "fs.symlink", "target": "../nodeward/node/current/libexec/cni", "path": "opt/cni/bin"},
            {"op": "fs.write-file", "path": "opt/cni/bin/bridge", "contents": "#!", "mode": 0o755},
            {"op": "fs.read-file", "path": "opt/cni/bin/bridge"},
            {"op": "fs.list-dir", "path": "opt/cni/bin"},
        ]),
    );
    assert_eq!(kinds(&r), ["ok", "ok", "ok", "ok", "ok"], "{r:?}");
    assert_eq!(ok(&r[3]), "#!");
    assert_eq!(ok(&r[4]), &json!([{"name": "bridge", "kind": "file"}]));
    assert!(
        f.root
            .join("opt/nodeward/node/v1/libexec/cni/bridge")
            .is_file()
    );
    let paths: Vec<String> = s
        .changes()
        .iter()
        .filter_map(|c| serde_json::to_value(&c.kind).ok())
        .filter_map(|v| v.get("path").and_then(Value::as_str).map(String::from))
        .collect();
    assert!(
        paths.contains(&"opt/nodeward/node/v1/libexec/cni/bridge".to_string()),
        "{paths:?}"
    );
}

/// A download's `dest` and an extraction's `dest-dir` are resolved like any write: a planted
/// link refuses the call before any request is sent (the URL's port is closed, so an attempt
/// would fail with `failed`, not `denied`).
#[test]
fn download_destinations_do_not_follow_links_out_of_the_grant() {
    let f = shadowed_root();
    symlink("../etc", f.root.join("w/e")).expect("planted link");
    let before = snapshot(&f.root);
    let sha = "0".repeat(64);
    let r = probe(
        &f.session(RunMode::Apply),
        grants("[fs]\nwrite = [\"w\"]\n[download]\nurls = [\"http://127.0.0.1:1/\"]\n"),
        json!([
            {"op": "download.fetch", "url": "http://127.0.0.1:1/x", "sha256": sha, "dest": "w/e/shadow", "mode": 0o644},
            {"op": "download.fetch-and-extract", "url": "http://127.0.0.1:1/x.tgz", "sha256": sha, "dest-dir": "w/e", "strip-components": 0},
            {"op": "download.fetch-and-extract", "url": "http://127.0.0.1:1/x.tgz", "sha256": sha, "dest-dir": "w/e/sub", "strip-components": 0},
        ]),
    );
    assert_eq!(kinds(&r), ["denied", "denied", "denied"], "{r:?}");
    assert_eq!(snapshot(&f.root), before);
}

/// Beneath a test root an absolute link leads outside the root (`escape`); a link climbing
/// above the root is `escape` too.
#[test]
fn absolute_and_climbing_links_are_escapes() {
    let f = shadowed_root();
    symlink("/etc", f.root.join("w/abs")).expect("abs");
    symlink("../../..", f.root.join("w/up")).expect("up");
    let r = probe(
        &f.session(RunMode::Apply),
        grants("[fs]\nwrite = [\"w\"]\n"),
        json!([
            {"op": "fs.read-file", "path": "w/abs/shadow"},
            {"op": "fs.write-file", "path": "w/up/x", "contents": "x", "mode": 0o644},
        ]),
    );
    assert_eq!(kinds(&r), ["escape", "escape"], "{r:?}");
}

/// The race: a link swapped in after the grant check is never followed. The session's
/// operations act on resolved paths through `O_NOFOLLOW` opens, so a path whose parent is a
/// link fails (`escape`, or `io` when the parent is seen to be a link) instead of acting on the
/// link's target.
#[test]
fn operations_never_follow_a_link_that_appears_after_the_check() {
    let f = shadowed_root();
    symlink("../etc", f.root.join("w/e")).expect("link swapped in");
    let s = f.session(RunMode::Apply);
    let p = HostPath::parse("w/e/shadow").expect("path");
    let err = s
        .files
        .write_file(
            "probe",
            &p,
            b"owned",
            0o644,
            std::time::Instant::now() + std::time::Duration::from_secs(10),
        )
        .expect_err("write through the link");
    assert!(
        matches!(
            err,
            nodeward::caps::Error::Escape(_) | nodeward::caps::Error::Io(_)
        ),
        "{err:?}"
    );
    assert!(matches!(
        s.files.read(&p),
        Err(nodeward::caps::Error::Escape(_))
    ));
    let e = s
        .root()
        .open_dir_nofollow(Some(&HostPath::parse("w/e").expect("path")))
        .expect_err("a link is not opened as a directory");
    assert!(is_link_refused(&e), "{e}");
    assert_eq!(
        s.files
            .lstat(&HostPath::parse("w/e").expect("path"))
            .expect("lstat")
            .map(|st| st.kind),
        Some(EntryKind::Symlink)
    );
    let shadow = std::fs::read_to_string(f.root.join("etc/shadow")).expect("shadow");
    assert!(shadow.starts_with("root:"), "unchanged");
}

/// The same race for downloads: the fetcher writes a download next to its resolved `dest` and
/// an extraction into its resolved `dest-dir` through directories opened without following any
/// link, so a link swapped in after the check fails the call before any request is made.
#[test]
fn downloads_never_follow_a_link_that_appears_after_the_check() {
    let f = shadowed_root();
    symlink("../etc", f.root.join("w/e")).expect("link swapped in");
    let before = snapshot(&f.root);
    let s = f.session(RunMode::Apply);
    let may = |_: &url::Url| true;
    let fetcher = nodeward::caps::download::Fetcher::new(
        s.root().dir(),
        s.downloads.config(),
        std::time::Instant::now() + std::time::Duration::from_secs(5),
        &may,
    );
    let url = url::Url::parse("http://127.0.0.1:1/x").expect("url");
    let dest = HostPath::parse("w/e/shadow").expect("path");
    let err = fetcher
        .fetch_to(&url, &"0".repeat(64), &dest, 0o644)
        .map_err(nodeward::caps::Error::from)
        .expect_err("through the link");
    assert!(
        matches!(err, nodeward::caps::Error::Escape(_)),
        "refused as a link, before any request: {err:?}"
    );
    assert_eq!(snapshot(&f.root), before);
}

/// The artifact cache (`var/lib/nodeward/artifacts/sha256/<hex>`) is the agent's own path: a
/// link planted there (`sha256 -> ../../../../etc/cron.d`) used to receive every download, with
/// bytes a phase chose, in a file no grant names. Its directory is now opened without following
/// links: the download still lands in `dest`, nothing lands in `etc/cron.d`.
#[test]
fn the_artifact_cache_does_not_follow_a_planted_link() {
    const BODY: &[u8] = b"* * * * * root /bin/sh -c 'echo owned'\n";
    let server = common::http::HttpServer::start(|_| common::http::Reply::ok(BODY));
    let port = server.port();
    let f = Fixture::new();
    for d in ["w", "etc/cron.d", "var/lib/nodeward/artifacts"] {
        std::fs::create_dir_all(f.root.join(d)).expect("dir");
    }
    symlink(
        "../../../../etc/cron.d",
        f.root.join("var/lib/nodeward/artifacts/sha256"),
    )
    .expect("planted link");
    let sha = {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(BODY))
    };
    let url = format!("http://127.0.0.1:{port}/artifact");
    let r = probe(
        &f.session(RunMode::Apply),
        grants(&format!(
            "[fs]\nwrite = [\"w\"]\n[download]\nurls = [\"http://127.0.0.1:{port}/\"]\n"
        )),
        json!([{"op": "download.fetch", "url": url, "sha256": sha, "dest": "w/f", "mode": 0o644}]),
    );
    drop(server);
    assert_eq!(ok(&r[0]), "created", "{r:?}");
    assert_eq!(std::fs::read(f.root.join("w/f")).expect("dest"), BODY);
    let cron: Vec<_> = std::fs::read_dir(f.root.join("etc/cron.d"))
        .expect("cron.d")
        .filter_map(|e| e.ok().map(|e| e.file_name()))
        .collect();
    assert!(cron.is_empty(), "written outside every grant: {cron:?}");
}

/// `read-file` returns at most 16 MiB and `write-file` takes at most 16 MiB: both pass through
/// host memory whole.
#[test]
fn file_sizes_are_capped() {
    let f = Fixture::new();
    std::fs::create_dir_all(f.root.join("w")).expect("w");
    let big = std::fs::File::create(f.root.join("w/big")).expect("big");
    big.set_len((16 << 20) + 1).expect("sparse 16 MiB + 1");
    let r = probe(
        &f.session(RunMode::Apply),
        grants("[fs]\nwrite = [\"w\"]\n"),
        json!([
            {"op": "fs.read-file", "path": "w/big"},
            {"op": "fs.write-file", "path": "w/new", "contents": "x".repeat((16 << 20) + 1), "mode": 0o644},
        ]),
    );
    assert_eq!(kinds(&r), ["failed", "invalid-argument"], "{r:?}");
    assert!(!f.root.join("w/new").exists());
}

fn err_message(result: &Value) -> String {
    result
        .pointer("/err/message")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}
