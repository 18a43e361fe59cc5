//! `fs` capability through the real boundary (the probe guest): what it does, what grants
//! allow, and confinement: every escape is refused with a typed error and nothing outside the
//! host root is read or changed.

mod common;

use common::*;
use nodeward::plan::RunMode;
use serde_json::json;
use std::os::unix::fs::{PermissionsExt, symlink};

const GRANTS: &str = r#"
[fs]
read = ["etc", "link-out", "magic", "fd", "abs-link", "relative-escape"]
write = ["etc", "var/lib/kubelet", "link-out", "magic", "abs-link"]
"#;

#[test]
fn writes_reads_lists_and_is_idempotent() {
    let f = Fixture::new();
    let s = f.session(RunMode::Apply);
    let r = probe(
        &s,
        grants(GRANTS),
        json!([
            {"op": "fs.create-dir", "path": "etc/containerd", "mode": 0o755},
            {"op": "fs.create-dir", "path": "etc/containerd", "mode": 0o755},
            {"op": "fs.write-file", "path": "etc/containerd/config.toml", "contents": "version = 3\n", "mode": 0o644},
            {"op": "fs.write-file", "path": "etc/containerd/config.toml", "contents": "version = 3\n", "mode": 0o644},
            {"op": "fs.write-file", "path": "etc/containerd/config.toml", "contents": "version = 3\n", "mode": 0o600},
            {"op": "fs.write-file", "path": "etc/containerd/config.toml", "contents": "version = 2\n", "mode": 0o600},
            {"op": "fs.read-file", "path": "etc/containerd/config.toml"},
            {"op": "fs.stat", "path": "etc/containerd/config.toml"},
            {"op": "fs.stat", "path": "etc/nothing"},
            {"op": "fs.list-dir", "path": "etc"},
            {"op": "fs.symlink", "target": "containerd/config.toml", "path": "etc/current"},
            {"op": "fs.symlink", "target": "containerd/config.toml", "path": "etc/current"},
            {"op": "fs.symlink", "target": "containerd", "path": "etc/current"},
            {"op": "fs.remove", "path": "etc/current"},
            {"op": "fs.remove", "path": "etc/current"},
            {"op": "fs.write-file", "path": "var/lib/kubelet/config.yaml", "contents": "x", "mode": 0o644},
            {"op": "fs.remove", "path": "etc/containerd"},
        ]),
    );
    let ok: Vec<_> = r
        .iter()
        .map(|v| v.get("ok").cloned().unwrap_or_else(|| json!(kind(v))))
        .collect();
    assert_eq!(ok[0], "created");
    assert_eq!(ok[1], "unchanged");
    assert_eq!(ok[2], "created");
    assert_eq!(ok[3], "unchanged");
    assert_eq!(ok[4], "changed", "mode-only change");
    assert_eq!(ok[5], "changed");
    assert_eq!(ok[6], "version = 2\n");
    assert_eq!(ok[7], json!({"kind": "file", "mode": 0o600, "size": 12}));
    assert_eq!(ok[8], json!(null));
    assert_eq!(ok[9], json!([{"name": "containerd", "kind": "directory"}]));
    assert_eq!(ok[10], "created");
    assert_eq!(ok[11], "unchanged");
    assert_eq!(ok[12], "changed");
    assert_eq!(ok[13], "removed");
    assert_eq!(ok[14], "unchanged");
    assert_eq!(ok[15], "not-found", "parent var/lib/kubelet does not exist");
    assert_eq!(ok[16], "io", "directory not empty");

    let file = f.root.join("etc/containerd/config.toml");
    assert_eq!(
        std::fs::read_to_string(&file).expect("file"),
        "version = 2\n"
    );
    assert_eq!(
        std::fs::metadata(&file).expect("meta").permissions().mode() & 0o777,
        0o600
    );
    assert!(!f.root.join("etc/current").exists());
    // No temp files left beside the target.
    let names: Vec<_> = std::fs::read_dir(f.root.join("etc/containerd"))
        .expect("dir")
        .map(|e| e.expect("e").file_name())
        .collect();
    assert_eq!(names, ["config.toml"]);
}

#[test]
fn writes_outside_the_grant_are_denied_and_audited() {
    let f = Fixture::new();
    f.put("etc/hosts", "127.0.0.1 localhost\n");
    let s = f.session(RunMode::Apply);
    let g = grants(
        r#"
[fs]
read = ["etc/hosts"]
write = ["etc/containerd"]
"#,
    );
    let r = probe(
        &s,
        g,
        json!([
            {"op": "fs.write-file", "path": "etc/hosts", "contents": "x", "mode": 0o644},
            {"op": "fs.write-file", "path": "etc/containerd-old/x", "contents": "x", "mode": 0o644},
            {"op": "fs.create-dir", "path": "var/lib", "mode": 0o755},
            {"op": "fs.remove", "path": "etc/hosts"},
            {"op": "fs.symlink", "target": "hosts", "path": "etc/hosts2"},
            {"op": "fs.read-file", "path": "etc/passwd"},
            {"op": "fs.list-dir", "path": "etc"},
            {"op": "fs.stat", "path": "var"},
            {"op": "fs.read-file", "path": "etc/hosts"},
        ]),
    );
    let kinds: Vec<String> = r.iter().map(kind).collect();
    assert_eq!(
        kinds,
        [
            "denied", "denied", "denied", "denied", "denied", "denied", "denied", "denied", "ok"
        ]
    );
    assert_eq!(
        std::fs::read_to_string(f.root.join("etc/hosts")).expect("hosts"),
        "127.0.0.1 localhost\n"
    );
    let denied: Vec<_> = s.audit.records().into_iter().filter(|r| r.denied).collect();
    assert_eq!(denied.len(), 8, "every refusal is audited");
    assert!(
        denied
            .iter()
            .all(|r| r.phase == "probe" && r.outcome.starts_with("denied:"))
    );
    let calls: Vec<&str> = denied.iter().map(|r| r.call.as_str()).collect();
    assert_eq!(
        calls,
        [
            "fs.write-file",
            "fs.write-file",
            "fs.create-dir",
            "fs.remove",
            "fs.symlink",
            "fs.read-file",
            "fs.list-dir",
            "fs.stat"
        ]
    );
    assert!(
        denied[0].outcome.contains("etc/hosts"),
        "the refusal names the path: {}",
        denied[0].outcome
    );
}

/// cap-std's adversarial cases: absolute paths, `..`, symlinked directories and files pointing
/// outside, `/proc/self/root` and `/proc/self/fd` magic links.
#[test]
fn escapes_are_refused_and_nothing_outside_changes() {
    let f = Fixture::new();
    std::fs::create_dir_all(f.root.join("etc")).expect("etc");
    symlink("../outside", f.root.join("link-out")).expect("dir link");
    symlink(f.outside.join("secret.txt"), f.root.join("abs-link")).expect("file link");
    symlink("/proc/self/root", f.root.join("magic")).expect("magic link");
    symlink("/proc/self/fd", f.root.join("fd")).expect("fd link");
    symlink(
        "etc/../../outside/secret.txt",
        f.root.join("relative-escape"),
    )
    .expect("relative link");
    let outside_before = snapshot(&f.outside);
    let root_before = snapshot(&f.root);
    let s = f.session(RunMode::Apply);
    let abs = f.outside.join("secret.txt").display().to_string();
    let r = probe(
        &s,
        grants(GRANTS),
        json!([
            {"op": "fs.read-file", "path": abs},
            {"op": "fs.read-file", "path": "/etc/passwd"},
            {"op": "fs.read-file", "path": "../outside/secret.txt"},
            {"op": "fs.read-file", "path": "etc/../../outside/secret.txt"},
            {"op": "fs.read-file", "path": "./etc"},
            {"op": "fs.read-file", "path": "link-out/secret.txt"},
            {"op": "fs.write-file", "path": "link-out/new.txt", "contents": "x", "mode": 0o644},
            {"op": "fs.write-file", "path": "link-out/secret.txt", "contents": "x", "mode": 0o644},
            {"op": "fs.create-dir", "path": "link-out/sub", "mode": 0o755},
            {"op": "fs.list-dir", "path": "link-out"},
            {"op": "fs.remove", "path": "link-out/secret.txt"},
            {"op": "fs.read-file", "path": "abs-link"},
            {"op": "fs.read-file", "path": "relative-escape"},
            {"op": "fs.read-file", "path": "magic/etc/hostname"},
            {"op": "fs.write-file", "path": "magic/tmp/nodeward-escape", "contents": "x", "mode": 0o644},
            {"op": "fs.read-file", "path": "fd/0"},
            {"op": "fs.symlink", "target": "/etc/passwd", "path": "etc/passwd-link"},
            {"op": "fs.symlink", "target": "../../outside", "path": "etc/out"},
        ]),
    );
    let kinds: Vec<String> = r.iter().map(kind).collect();
    let expected = [
        "invalid-argument", // absolute
        "invalid-argument", // absolute
        "invalid-argument", // ..
        "invalid-argument", // .. in the middle
        "invalid-argument", // .
        "escape",           // directory symlink to outside
        "escape",
        "escape",
        "escape",
        "escape",
        "escape",
        "escape", // absolute file symlink
        "escape", // relative symlink climbing out
        "escape", // /proc/self/root
        "escape",
        "escape",           // /proc/self/fd
        "invalid-argument", // absolute link target
        "invalid-argument", // link target above the root
    ];
    for (i, (got, want)) in kinds.iter().zip(expected).enumerate() {
        assert_eq!(got, want, "call {i}: {}", r[i]);
    }
    assert_eq!(kinds.len(), expected.len());
    assert_eq!(
        snapshot(&f.outside),
        outside_before,
        "nothing outside the root changed"
    );
    assert_eq!(
        snapshot(&f.root),
        root_before,
        "nothing inside the root changed either"
    );
    assert!(!std::path::Path::new("/tmp/nodeward-escape").exists());
    let records = s.audit.records();
    assert_eq!(records.len(), expected.len(), "every call is audited");
    assert!(
        records.iter().all(|r| !r.denied),
        "these are confinement refusals, not grant refusals"
    );
}

#[test]
fn plan_mode_reads_see_planned_writes_and_disk_is_untouched() {
    let f = Fixture::new();
    f.put("etc/containerd/config.toml", "version = 2\n");
    let before = snapshot(&f.root);
    let s = f.session(RunMode::Plan);
    let r = probe(
        &s,
        grants(GRANTS),
        json!([
            {"op": "fs.write-file", "path": "etc/containerd/config.toml", "contents": "version = 3\n", "mode": 0o644},
            {"op": "fs.read-file", "path": "etc/containerd/config.toml"},
            {"op": "fs.create-dir", "path": "etc/cni/net.d", "mode": 0o755},
            {"op": "fs.write-file", "path": "etc/cni/net.d/10.conflist", "contents": "{}", "mode": 0o644},
            {"op": "fs.list-dir", "path": "etc"},
            {"op": "fs.remove", "path": "etc/containerd/config.toml"},
            {"op": "fs.stat", "path": "etc/containerd/config.toml"},
            {"op": "fs.list-dir", "path": "etc/containerd"},
        ]),
    );
    assert_eq!(r[0]["ok"], "changed");
    assert_eq!(r[1]["ok"], "version = 3\n");
    assert_eq!(r[2]["ok"], "created");
    assert_eq!(r[3]["ok"], "created");
    assert_eq!(
        r[4]["ok"],
        json!([{"name": "cni", "kind": "directory"}, {"name": "containerd", "kind": "directory"}])
    );
    assert_eq!(r[5]["ok"], "removed");
    assert_eq!(r[6]["ok"], json!(null));
    assert_eq!(r[7]["ok"], json!([]));
    assert_eq!(snapshot(&f.root), before, "plan never changes the host");
    let kinds: Vec<String> = s
        .changes()
        .iter()
        .map(|c| {
            serde_json::to_value(c).expect("json")["kind"]
                .as_str()
                .unwrap_or("")
                .to_string()
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "file-replace",
            "dir-create",
            "dir-create",
            "file-create",
            "remove"
        ]
    );
    let diff = s.changes()[0].kind.diff().expect("text diff").to_string();
    assert!(
        diff.contains("-version = 2") && diff.contains("+version = 3"),
        "{diff}"
    );
}

/// `remove-all`: removes a tree with files, nested directories and symlinks (never following
/// them, not even one pointing outside), is `unchanged` when nothing is there, and removes a
/// single file or a symlink itself.
#[test]
fn remove_all_removes_a_tree_without_following_links() {
    let f = Fixture::new();
    f.put("var/lib/kubelet/pods/a/volumes/x/data.txt", "pod data\n");
    f.put(
        "var/lib/kubelet/config.yaml",
        "kind: KubeletConfiguration\n",
    );
    f.put("etc/keep.txt", "kept\n");
    symlink("../../../outside", f.root.join("var/lib/kubelet/pods/out")).expect("link out");
    symlink("../../../etc", f.root.join("var/lib/kubelet/etc-link")).expect("link in");
    std::fs::set_permissions(
        f.root.join("var/lib/kubelet/pods/a"),
        std::fs::Permissions::from_mode(0o500),
    )
    .expect("read-only dir");
    let outside_before = snapshot(&f.outside);
    let s = f.session(RunMode::Apply);
    let r = probe(
        &s,
        grants(GRANTS),
        json!([
            {"op": "fs.remove-all", "path": "var/lib/kubelet"},
            {"op": "fs.remove-all", "path": "var/lib/kubelet"},
            {"op": "fs.stat", "path": "var/lib/kubelet"},
            {"op": "fs.remove-all", "path": "etc/keep.txt"},
            {"op": "fs.remove-all", "path": "link-out"},
        ]),
    );
    // link-out does not exist in this root: unchanged.
    let kinds: Vec<_> = r.iter().map(|v| v["ok"].clone()).collect();
    assert_eq!(
        kinds,
        [
            json!("removed"),
            json!("unchanged"),
            json!(null),
            json!("removed"),
            json!("unchanged")
        ],
        "{r:?}"
    );
    assert!(!f.root.join("var/lib/kubelet").exists());
    assert!(f.root.join("var/lib").is_dir(), "the parent stays");
    assert!(f.root.join("etc").is_dir() && !f.root.join("etc/keep.txt").exists());
    assert_eq!(
        snapshot(&f.outside),
        outside_before,
        "the link out was not followed"
    );
    let changes = s.changes();
    let removes: Vec<_> = changes
        .iter()
        .map(|c| serde_json::to_value(c).expect("change json"))
        .filter(|c| c["kind"] == "remove")
        .map(|c| c["path"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(
        removes,
        ["var/lib/kubelet", "etc/keep.txt"],
        "one change per removed path"
    );
}

#[test]
fn remove_all_removes_a_symlink_not_its_target() {
    let f = Fixture::new();
    std::fs::create_dir_all(f.root.join("etc")).expect("etc");
    symlink("../outside", f.root.join("link-out")).expect("dir link");
    f.put("etc/target/file.txt", "target\n");
    symlink("target", f.root.join("etc/link")).expect("inner link");
    let outside_before = snapshot(&f.outside);
    let s = f.session(RunMode::Apply);
    let r = probe(
        &s,
        grants(GRANTS),
        json!([
            {"op": "fs.remove-all", "path": "link-out"},
            {"op": "fs.remove-all", "path": "etc/link"},
        ]),
    );
    assert_eq!(r[0]["ok"], "removed", "{r:?}");
    assert_eq!(r[1]["ok"], "removed", "{r:?}");
    assert!(std::fs::symlink_metadata(f.root.join("link-out")).is_err());
    assert!(std::fs::symlink_metadata(f.root.join("etc/link")).is_err());
    assert_eq!(read(&f, "etc/target/file.txt"), "target\n");
    assert_eq!(snapshot(&f.outside), outside_before);
}

#[test]
fn remove_all_refuses_without_grant_and_escapes() {
    let f = Fixture::new();
    f.put("opt/other/file", "x\n");
    f.put("etc/sub/file", "x\n");
    symlink("../outside", f.root.join("link-out")).expect("dir link");
    symlink("/proc/self/root", f.root.join("magic")).expect("magic link");
    let outside_before = snapshot(&f.outside);
    let root_before = snapshot(&f.root);
    let s = f.session(RunMode::Apply);
    let r = probe(
        &s,
        grants(GRANTS),
        json!([
            {"op": "fs.remove-all", "path": "opt/other"},
            {"op": "fs.remove-all", "path": "opt"},
            {"op": "fs.remove-all", "path": "etc/../opt"},
            {"op": "fs.remove-all", "path": "../outside"},
            {"op": "fs.remove-all", "path": "/tmp"},
            {"op": "fs.remove-all", "path": "link-out/secret.txt"},
            {"op": "fs.remove-all", "path": "magic/tmp"},
        ]),
    );
    let kinds: Vec<String> = r.iter().map(kind).collect();
    assert_eq!(
        kinds,
        [
            "denied",
            "denied",
            "invalid-argument",
            "invalid-argument",
            "invalid-argument",
            "escape",
            "escape"
        ],
        "{r:?}"
    );
    assert_eq!(snapshot(&f.outside), outside_before);
    assert_eq!(snapshot(&f.root), root_before);
    let denied: Vec<_> = audited(&s, "fs.remove-all")
        .into_iter()
        .filter(|r| r.denied)
        .collect();
    assert_eq!(denied.len(), 2, "grant refusals are audited as denied");
}

/// Plan mode: `remove-all` records one change, touches nothing, and later reads in the same
/// run see nothing beneath the path (also paths planned earlier in the run).
#[test]
fn remove_all_in_plan_mode_updates_the_overlay() {
    let f = Fixture::new();
    f.put("var/lib/kubelet/pods/a/data", "x\n");
    let before = snapshot(&f.root);
    let s = f.session(RunMode::Plan);
    let r = probe(
        &s,
        grants(GRANTS),
        json!([
            {"op": "fs.write-file", "path": "var/lib/kubelet/config.yaml", "contents": "a", "mode": 0o644},
            {"op": "fs.remove-all", "path": "var/lib/kubelet"},
            {"op": "fs.stat", "path": "var/lib/kubelet"},
            {"op": "fs.stat", "path": "var/lib/kubelet/config.yaml"},
            {"op": "fs.read-file", "path": "var/lib/kubelet/pods/a/data"},
            {"op": "fs.remove-all", "path": "var/lib/kubelet"},
        ]),
    );
    assert!(
        r.iter()
            .all(|v| kind(v) == "ok" || v.pointer("/err/kind").is_some())
    );
    assert_eq!(kind(&r[2]), "ok", "{r:?}");
    assert_eq!(r[1]["ok"], "removed", "{r:?}");
    assert_eq!(r[2]["ok"], json!(null), "{r:?}");
    assert_eq!(r[3]["ok"], json!(null), "{r:?}");
    assert_eq!(kind(&r[4]), "not-found", "{r:?}");
    assert_eq!(r[5]["ok"], "unchanged", "{r:?}");
    assert_eq!(snapshot(&f.root), before, "plan touched nothing");
    let kinds: Vec<_> = s
        .changes()
        .iter()
        .map(|c| serde_json::to_value(c).expect("json")["kind"].clone())
        .collect();
    assert_eq!(kinds, [json!("file-create"), json!("remove")]);
}

fn read(f: &Fixture, rel: &str) -> String {
    std::fs::read_to_string(f.root.join(rel)).expect("read")
}
