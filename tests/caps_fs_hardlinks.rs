//! Hard links planted by a second party cannot widen a grant (issue 26, item 1).
//!
//! Someone who can write into a granted directory (a pod with a hostPath mount of it, an
//! earlier tool) plants a hard link there to a file no grant covers: `etc/shadow` in the root,
//! or a file outside the root on the same file system (the fixture's `outside/`, a sibling of
//! the root in one temp dir). A phase (the probe guest) then writes, re-modes, downloads,
//! extracts, writes a kernel file or reads through that name. Each test asserts that the
//! planted link's target keeps its bytes and its mode exactly, in apply and in plan, and that
//! its contents reach neither the phase nor the plan.

mod common;

use common::http::{HttpServer, Reply};
use common::*;
use nodeward::hostpath::HostPath;
use nodeward::plan::{ChangeKind, RunMode};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// What the planted link's target holds: the secret a phase must neither change nor learn.
const SECRET: &[u8] = b"root:$6$secret:19000:0:99999:7:::\n";
const SECRET_MODE: u32 = 0o600;

/// A file a hard link was planted to, as it was before the phase ran.
struct Target {
    path: PathBuf,
    ino: u64,
}

impl Target {
    /// Writes [`SECRET`] (mode 0600) at `path`.
    fn make(path: PathBuf) -> Target {
        std::fs::create_dir_all(path.parent().expect("parent")).expect("target dir");
        std::fs::write(&path, SECRET).expect("target");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(SECRET_MODE))
            .expect("chmod target");
        let ino = std::fs::metadata(&path).expect("target").ino();
        Target { path, ino }
    }

    /// Byte for byte and mode for mode what it was, the same inode.
    fn assert_unchanged(&self, what: &str) {
        let meta = std::fs::metadata(&self.path).expect("target still there");
        assert_eq!(
            meta.ino(),
            self.ino,
            "{what}: {} replaced",
            self.path.display()
        );
        assert_eq!(
            meta.permissions().mode() & 0o7777,
            SECRET_MODE,
            "{what}: mode of {} changed",
            self.path.display()
        );
        assert_eq!(
            std::fs::read(&self.path).expect("target"),
            SECRET,
            "{what}: bytes of {} changed",
            self.path.display()
        );
    }
}

/// Where the planted link points: a file inside the root no grant covers, or one outside it.
#[derive(Clone, Copy, Debug)]
enum Place {
    Inside,
    Outside,
}

const PLACES: [Place; 2] = [Place::Inside, Place::Outside];

/// A root with an empty granted `w/`, the target in `place`, and a hard link to it at
/// `w/<name>` planted by the test (the second party).
fn planted(place: Place, name: &str) -> (Fixture, Target) {
    let f = Fixture::new();
    std::fs::create_dir_all(f.root.join("w")).expect("w");
    let target = Target::make(match place {
        Place::Inside => f.root.join("etc/shadow"),
        Place::Outside => f.outside.join("shadow"),
    });
    plant(&target.path, &f.root.join("w").join(name));
    (f, target)
}

fn plant(target: &Path, at: &Path) {
    std::fs::create_dir_all(at.parent().expect("parent")).expect("link dir");
    std::fs::hard_link(target, at).expect("planted hard link");
}

fn kinds(results: &[Value]) -> Vec<String> {
    results.iter().map(kind).collect()
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// `w/<name>` after an apply: a file of its own (one name, not the target's inode).
fn assert_own_file(f: &Fixture, name: &str, target: &Target, bytes: &[u8], mode: u32) {
    let p = f.root.join("w").join(name);
    let meta = std::fs::symlink_metadata(&p).expect("replaced name");
    assert_ne!(meta.ino(), target.ino, "{name} is still the target's inode");
    assert_eq!(meta.nlink(), 1, "{name} has one name");
    assert_eq!(meta.permissions().mode() & 0o7777, mode, "{name} mode");
    assert_eq!(
        std::fs::read(&p).expect("replaced name"),
        bytes,
        "{name} bytes"
    );
}

/// No change the plan lists shows the target's contents.
fn assert_plan_hides_secret(changes: &[nodeward::plan::Change]) {
    let text = serde_json::to_string(changes).expect("changes as JSON");
    assert!(
        !text.contains("$6$secret"),
        "the plan shows the target's contents: {text}"
    );
}

/// The attack of the issue: the same bytes with a new mode made `etc/shadow` (and a file
/// outside the root) 0644 in place. Now the name is replaced by a file of its own, in apply;
/// plan mode touches nothing and lists a replacement without a diff of the target.
#[test]
fn a_new_mode_over_a_hard_link_replaces_the_name_not_the_file() {
    for place in PLACES {
        for mode in [RunMode::Apply, RunMode::Plan] {
            let (f, target) = planted(place, "l");
            let before = snapshot(&f.root);
            let s = f.session(mode);
            let secret = String::from_utf8(SECRET.to_vec()).expect("utf-8");
            let r = probe(
                &s,
                grants("[fs]\nwrite = [\"w\"]\n"),
                json!([{"op": "fs.write-file", "path": "w/l", "contents": secret, "mode": 0o644}]),
            );
            assert_eq!(kinds(&r), ["ok"], "{place:?} {mode:?}: {r:?}");
            assert_eq!(ok(&r[0]), "changed", "{place:?} {mode:?}");
            target.assert_unchanged(&format!("{place:?} {mode:?}"));
            let changes = s.changes();
            assert_plan_hides_secret(&changes);
            assert!(
                matches!(&changes[..], [c] if matches!(c.kind, ChangeKind::FileReplace { .. })),
                "{place:?} {mode:?}: a replacement, not a chmod: {changes:?}"
            );
            match mode {
                RunMode::Apply => assert_own_file(&f, "l", &target, SECRET, 0o644),
                RunMode::Plan => assert_eq!(snapshot(&f.root), before, "{place:?}: plan"),
            }
        }
    }
}

/// New bytes over the planted name replace the name; the target keeps its own.
#[test]
fn new_bytes_over_a_hard_link_replace_the_name_not_the_file() {
    for place in PLACES {
        let (f, target) = planted(place, "l");
        let r = probe(
            &f.session(RunMode::Apply),
            grants("[fs]\nwrite = [\"w\"]\n"),
            json!([{"op": "fs.write-file", "path": "w/l", "contents": "owned\n", "mode": 0o600}]),
        );
        assert_eq!(ok(&r[0]), "changed", "{place:?}: {r:?}");
        target.assert_unchanged(&format!("{place:?}"));
        assert_own_file(&f, "l", &target, b"owned\n", 0o600);
    }
}

/// Writing through a hard link is no oracle: the right guess (the target's exact bytes and
/// mode) and a wrong one both answer `changed`, in plan (nothing touched) and in apply.
#[test]
fn writing_over_a_hard_link_answers_changed_whatever_it_holds() {
    let secret = String::from_utf8(SECRET.to_vec()).expect("utf-8");
    for place in PLACES {
        for mode in [RunMode::Plan, RunMode::Apply] {
            let (f, target) = planted(place, "right");
            plant(&target.path, &f.root.join("w/wrong"));
            let s = f.session(mode);
            let r = probe(
                &s,
                grants("[fs]\nwrite = [\"w\"]\n"),
                json!([
                    {"op": "fs.write-file", "path": "w/right", "contents": secret, "mode": SECRET_MODE},
                    {"op": "fs.write-file", "path": "w/wrong", "contents": "root:x:::\n", "mode": SECRET_MODE},
                ]),
            );
            assert_eq!(ok(&r[0]), ok(&r[1]), "{place:?} {mode:?}: {r:?}");
            assert_eq!(ok(&r[0]), "changed", "{place:?} {mode:?}");
            assert_plan_hides_secret(&s.changes());
            target.assert_unchanged(&format!("{place:?} {mode:?}"));
        }
    }
}

/// Serves `body` and returns the server, its URL and sha256, and grants to download it into
/// `w`.
fn serve(body: Vec<u8>) -> (HttpServer, String, String, nodeward::grants::Grants) {
    let sha = sha256_hex(&body);
    let server = HttpServer::start(move |_| Reply::ok(&body));
    let url = server.url("/artifact");
    let g = grants(&format!(
        "[fs]\nwrite = [\"w\"]\n[download]\nurls = [\"{}/\"]\n",
        server.base_url()
    ));
    (server, url, sha, g)
}

/// A download over the planted name with the target's own sha256 (a new mode, then the same
/// mode): the name is replaced by the download each time, never re-moded or kept as
/// `unchanged` (which would confirm the target's digest).
#[test]
fn a_download_over_a_hard_link_with_its_own_sha256_replaces_it() {
    let (_server, url, sha, g) = serve(SECRET.to_vec());
    for place in PLACES {
        for (i, new_mode) in [0o644, SECRET_MODE].into_iter().enumerate() {
            for mode in [RunMode::Plan, RunMode::Apply] {
                let name = format!("l{i}");
                let (f, target) = planted(place, &name);
                let before = snapshot(&f.root);
                let r = probe(
                    &f.session(mode),
                    g.clone(),
                    json!([{"op": "download.fetch", "url": url, "sha256": sha,
                            "dest": format!("w/{name}"), "mode": new_mode}]),
                );
                assert_eq!(kinds(&r), ["ok"], "{place:?} {new_mode:o} {mode:?}: {r:?}");
                assert_eq!(ok(&r[0]), "changed", "{place:?} {new_mode:o} {mode:?}");
                target.assert_unchanged(&format!("{place:?} {new_mode:o} {mode:?}"));
                if mode == RunMode::Apply {
                    let dest = f.root.join("w").join(&name);
                    let meta = std::fs::metadata(&dest).expect("downloaded");
                    assert_ne!(
                        meta.ino(),
                        target.ino,
                        "the download has an inode of its own"
                    );
                    assert_eq!(meta.permissions().mode() & 0o7777, new_mode);
                    assert_eq!(std::fs::read(&dest).expect("downloaded"), SECRET);
                } else {
                    assert_eq!(snapshot(&f.root), before, "plan touched the root");
                }
            }
        }
    }
}

/// The agent's own download shares its inode with its cache entry: that one second name is
/// expected, so fetching it again is `unchanged`, and a new mode replaces the file without
/// changing the cache entry's mode.
#[test]
fn a_download_and_its_own_cache_entry_stay_one_artifact() {
    const BODY: &[u8] = b"#!/bin/sh\necho tool\n";
    let (_server, url, sha, g) = serve(BODY.to_vec());
    let f = Fixture::new();
    std::fs::create_dir_all(f.root.join("w")).expect("w");
    let fetch = |mode: u32| {
        probe(
            &f.session(RunMode::Apply),
            g.clone(),
            json!([{"op": "download.fetch", "url": url, "sha256": sha, "dest": "w/tool", "mode": mode}]),
        )
    };
    assert_eq!(ok(&fetch(0o644)[0]), "created");
    let entry = f.root.join("var/lib/nodeward/artifacts/sha256").join(&sha);
    let dest = f.root.join("w/tool");
    let linked = std::fs::metadata(&dest).expect("dest");
    assert_eq!(
        linked.ino(),
        std::fs::metadata(&entry).expect("cache entry").ino(),
        "precondition: the download is linked into the cache"
    );
    assert_eq!(ok(&fetch(0o644)[0]), "unchanged");
    assert_eq!(ok(&fetch(0o755)[0]), "changed");
    let dest_meta = std::fs::metadata(&dest).expect("dest");
    assert_eq!(dest_meta.permissions().mode() & 0o7777, 0o755);
    assert_eq!(std::fs::read(&dest).expect("dest"), BODY);
    let entry_meta = std::fs::metadata(&entry).expect("cache entry");
    assert_eq!(
        entry_meta.permissions().mode() & 0o7777,
        0o644,
        "cache entry re-moded"
    );
    assert_ne!(
        dest_meta.ino(),
        entry_meta.ino(),
        "a new file was given the mode"
    );
    assert_eq!(ok(&fetch(0o755)[0]), "unchanged");
}

/// A `.tar.gz` of `files` (name, bytes, mode), then hard links (name, target) to them.
fn tgz(files: &[(&str, &[u8], u32)], links: &[(&str, &str)]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (name, bytes, mode) in files {
        let mut h = tar::Header::new_gnu();
        h.set_size(bytes.len() as u64);
        h.set_mode(*mode);
        h.set_entry_type(tar::EntryType::Regular);
        b.append_data(&mut h, name, *bytes).expect("file entry");
    }
    for (name, target) in links {
        let mut h = tar::Header::new_gnu();
        h.set_size(0);
        h.set_mode(0o644);
        h.set_entry_type(tar::EntryType::Link);
        b.append_link(&mut h, name, target)
            .expect("hard link entry");
    }
    let tar = b.into_inner().expect("tar");
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, &tar).expect("gzip");
    gz.finish().expect("gzip")
}

/// Extracts the served archive into `w` (apply); the outcome.
fn extract(f: &Fixture, g: &nodeward::grants::Grants, url: &str, sha: &str) -> Value {
    let r = probe(
        &f.session(RunMode::Apply),
        g.clone(),
        json!([{"op": "download.fetch-and-extract", "url": url, "sha256": sha,
                "dest-dir": "w", "strip-components": 0}]),
    );
    ok(&r[0]).clone()
}

/// A `.tar.gz` holding one file `l` with exactly the target's bytes and mode, extracted into
/// `w` where `w/l` is the planted link: the entry is not in place (the file has a name the
/// archive does not give it), so it is written to a new file and renamed over `w/l`.
#[test]
fn an_extraction_over_a_hard_link_replaces_it() {
    let archive = tgz(&[("l", SECRET, SECRET_MODE)], &[]);
    let (_server, url, sha, g) = serve(archive);
    for place in PLACES {
        let (f, target) = planted(place, "l");
        assert_eq!(extract(&f, &g, &url, &sha), "changed", "{place:?}");
        target.assert_unchanged(&format!("{place:?}"));
        assert_own_file(&f, "l", &target, SECRET, SECRET_MODE);
        assert_eq!(
            extract(&f, &g, &url, &sha),
            "unchanged",
            "{place:?}: the file of its own is in place"
        );
    }
}

/// The archive's own hard links are expected names: extracting an archive holding `a` and a
/// hard link `b` to it a second time finds both in place (`unchanged`); a third name planted
/// for `a` makes it, and its link, out of place again, and the planted name keeps the old
/// file.
#[test]
fn an_archives_own_hard_links_stay_in_place() {
    let (_server, url, sha, g) = serve(tgz(&[("a", b"tool\n", 0o755)], &[("b", "a")]));
    let f = Fixture::new();
    std::fs::create_dir_all(f.root.join("w")).expect("w");
    let run = || extract(&f, &g, &url, &sha);
    assert_eq!(run(), "changed");
    let ino = |name: &str| {
        std::fs::metadata(f.root.join("w").join(name))
            .expect(name)
            .ino()
    };
    assert_eq!(ino("a"), ino("b"), "one file, two names");
    assert_eq!(run(), "unchanged");
    let third = f.outside.join("third");
    std::fs::hard_link(f.root.join("w/a"), &third).expect("a third name, outside");
    assert_eq!(run(), "changed");
    assert_eq!(ino("a"), ino("b"));
    assert_ne!(ino("a"), std::fs::metadata(&third).expect("third").ino());
    assert_eq!(std::fs::read(&third).expect("third"), b"tool\n");
    assert_eq!(run(), "unchanged");
}

/// An archive's hard link counts as a name of its file only once it is there: with the
/// archive holding `a` and a link `b` to it, a hard link planted at `w/a` (the target's
/// bytes and mode, two names) and no `w/b` is no archive file in place. `a` becomes a new
/// inode, `b` its second name, and the target keeps its bytes, mode and single name.
#[test]
fn a_planted_link_does_not_pass_for_an_archive_link_not_made_yet() {
    let archive = tgz(&[("a", SECRET, SECRET_MODE)], &[("b", "a")]);
    let (_server, url, sha, g) = serve(archive);
    for place in PLACES {
        let (f, target) = planted(place, "a");
        assert_eq!(extract(&f, &g, &url, &sha), "changed", "{place:?}");
        target.assert_unchanged(&format!("{place:?}"));
        let nlink = std::fs::metadata(&target.path).expect("target").nlink();
        assert_eq!(nlink, 1, "{place:?}: the target has its one name back");
        let meta = |name: &str| std::fs::symlink_metadata(f.root.join("w").join(name)).expect(name);
        assert_ne!(meta("a").ino(), target.ino, "{place:?}: a is a new inode");
        assert_eq!(meta("a").ino(), meta("b").ino(), "{place:?}: b is a's name");
        assert_eq!(meta("a").nlink(), 2, "{place:?}");
        assert_eq!(extract(&f, &g, &url, &sha), "unchanged", "{place:?}");
    }
}

/// Beneath a root that is not `/`, the kernel capability reads and writes the root's
/// `proc/sys` files: a hard link planted there is neither read (`get-sysctl` would return the
/// target) nor written.
#[test]
fn a_kernel_file_that_is_a_hard_link_is_neither_read_nor_written() {
    for place in PLACES {
        for mode in [RunMode::Apply, RunMode::Plan] {
            let (f, target) = planted(place, "unused");
            plant(&target.path, &f.root.join("proc/sys/net/ipv4/ip_forward"));
            let r = probe(
                &f.session(mode),
                grants("[kernel]\nsysctls = [\"net.ipv4.ip_forward\"]\n"),
                json!([
                    {"op": "kernel.get-sysctl", "key": "net.ipv4.ip_forward"},
                    {"op": "kernel.set-sysctl", "key": "net.ipv4.ip_forward", "value": "1"},
                ]),
            );
            assert_eq!(kinds(&r), ["denied", "denied"], "{place:?} {mode:?}: {r:?}");
            assert!(
                !r.iter().any(|v| v.to_string().contains("$6$secret")),
                "{r:?}"
            );
            target.assert_unchanged(&format!("{place:?} {mode:?}"));
        }
    }
}

/// The host writes a kernel file in place only when it has one name, checked on the open
/// descriptor before anything is written (the capability reads it first; this is the write
/// alone, as a link planted between the two would meet it).
#[test]
fn a_kernel_file_gaining_a_link_before_the_write_is_refused() {
    let (f, target) = planted(Place::Outside, "unused");
    plant(&target.path, &f.root.join("proc/sys/vm/swappiness"));
    let s = f.session(RunMode::Apply);
    let p = HostPath::parse("proc/sys/vm/swappiness").expect("path");
    let err = s
        .files
        .write_kernel_file(&p, b"0\n")
        .expect_err("a hard-linked kernel file");
    assert!(matches!(err, nodeward::caps::Error::Denied(_)), "{err:?}");
    target.assert_unchanged("write_kernel_file");
}

/// Reads: `read-file` of a planted hard link is `denied` (its contents are the target's); `stat`
/// describes the name (kind, mode, size) as it describes any file.
#[test]
fn a_hard_link_is_not_read() {
    for place in PLACES {
        for mode in [RunMode::Apply, RunMode::Plan] {
            let (f, target) = planted(place, "l");
            std::fs::write(f.root.join("w/plain"), "mine\n").expect("plain file");
            let r = probe(
                &f.session(mode),
                grants("[fs]\nread = [\"w\"]\n"),
                json!([
                    {"op": "fs.read-file", "path": "w/l"},
                    {"op": "fs.stat", "path": "w/l"},
                    {"op": "fs.read-file", "path": "w/plain"},
                ]),
            );
            assert_eq!(
                kinds(&r),
                ["denied", "ok", "ok"],
                "{place:?} {mode:?}: {r:?}"
            );
            assert!(
                r[0].pointer("/err/message")
                    .and_then(Value::as_str)
                    .is_some_and(|m| m.contains("w/l") && m.contains("hard link")),
                "names the file and why: {}",
                r[0]
            );
            assert!(!r[0].to_string().contains("$6$secret"));
            assert_eq!(
                ok(&r[1]),
                &json!({"kind": "file", "mode": SECRET_MODE, "size": SECRET.len()})
            );
            assert_eq!(ok(&r[2]), "mine\n");
            target.assert_unchanged(&format!("{place:?} {mode:?}"));
        }
    }
}
