//! The agent's own state follows `--root`: with only `--root R` given, the state directory
//! (installed bundles, compiled components), the trusted keys and the node's state are all
//! beneath `R`, so a `plan` of a temp root writes nothing on the real host.
//!
//! `plan_writes_nothing_outside_the_root` proves it: in a private mount namespace every mount
//! but the root's is remounted read-only, then `plan`, `phases list`, `version` and `status`
//! run there. A write anywhere else would fail with EROFS, and the commands would fail. Like
//! `tests/caps_mounts.rs`, the test re-executes itself under `unshare --mount`; without root it
//! fails, saying so.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const IN_NS: &str = "NODEWARD_READONLY_HOST_NS";
const ROOT: &str = "NODEWARD_READONLY_HOST_ROOT";

fn nodeward(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_nodeward"));
    cmd.args(args)
        .env_remove("NODEWARD_LOG")
        .env_remove("NODEWARD_ROOT")
        .env_remove("NODEWARD_STATE_DIR")
        .env_remove("NODEWARD_TRUSTED_KEYS_DIR")
        .env_remove("NODEWARD_CONFIG")
        .env_remove("NODEWARD_BUNDLE")
        .env_remove("NODEWARD_TEST_ABORT");
    cmd
}

fn ok(mut cmd: Command) -> Output {
    let out = cmd.output().expect("run nodeward");
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// Whether `dir` holds at least one file, at any depth.
fn has_files(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|entries| {
        entries.flatten().any(|e| {
            let p = e.path();
            if p.is_dir() { has_files(&p) } else { true }
        })
    })
}

#[test]
fn state_and_trusted_keys_default_beneath_the_root() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path().join("root");
    std::fs::create_dir_all(&root).expect("root");
    ok(nodeward(&[
        "plan",
        "--root",
        s(&root),
        "--phase",
        "setup-host",
    ]));
    // The embedded bundle's phases come precompiled with the binary: a plan compiles nothing,
    // so no compiled cache appears (beneath the root or anywhere: the second test below looks
    // at the whole host through a read-only view).
    assert!(
        !has_files(&root.join("var/lib/nodeward/compiled")),
        "the embedded phases are served precompiled"
    );

    // A bundle signed by a key that is trusted only beneath the root.
    let kp = minisign::KeyPair::generate_unencrypted_keypair().expect("keypair");
    let secret = tmp.path().join("platform.key");
    std::fs::write(&secret, kp.sk.to_box(None).expect("sk box").to_string()).expect("key");
    let src = tmp.path().join("src");
    ok(nodeward(&["phases", "export", s(&src)]));
    let bundle = tmp.path().join("bundle.tgz");
    ok(nodeward(&["phases", "pack", s(&src), "-o", s(&bundle)]));
    ok(nodeward(&[
        "phases",
        "sign",
        s(&bundle),
        "--key",
        s(&secret),
    ]));
    let refused = nodeward(&["phases", "verify", "--root", s(&root), s(&bundle)])
        .output()
        .expect("verify");
    assert_eq!(refused.status.code(), Some(1), "no trusted keys yet");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains(s(&root.join("etc/nodeward/trusted-keys"))),
        "the error names the keys directory beneath the root: {stderr}"
    );
    let keys = root.join("etc/nodeward/trusted-keys");
    std::fs::create_dir_all(&keys).expect("keys dir");
    let public = keys.join("platform.pub");
    std::fs::write(&public, kp.pk.to_box().expect("pk box").to_string()).expect("pub");
    use std::os::unix::fs::PermissionsExt;
    for (p, mode) in [(&public, 0o644), (&keys, 0o755)] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).expect("chmod");
    }
    ok(nodeward(&[
        "phases",
        "verify",
        "--root",
        s(&root),
        s(&bundle),
    ]));
    ok(nodeward(&[
        "phases",
        "install",
        "--root",
        s(&root),
        s(&bundle),
        "--allow-downgrade",
    ]));
    assert!(root.join("var/lib/nodeward/bundles/current").is_symlink());
    let history = ok(nodeward(&[
        "--root",
        s(&root),
        "phases",
        "history",
        "--output",
        "json",
    ]));
    let history: serde_json::Value = serde_json::from_slice(&history.stdout).expect("json");
    assert_eq!(history["entries"].as_array().map(Vec::len), Some(1));

    // An explicit --state-dir and --trusted-keys-dir still win.
    let elsewhere = tmp.path().join("elsewhere");
    ok(nodeward(&[
        "phases",
        "history",
        "--root",
        s(&root),
        "--state-dir",
        s(&elsewhere),
    ]));
    let out = nodeward(&[
        "phases",
        "verify",
        "--root",
        s(&root),
        "--trusted-keys-dir",
        s(&elsewhere),
        s(&bundle),
    ])
    .output()
    .expect("verify");
    assert_eq!(out.status.code(), Some(1), "no key in the named directory");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(s(&elsewhere)),
        "the error names the explicit keys directory: {stderr}"
    );
}

/// Remounts every mount of this (private) namespace read-only except `root`'s own bind mount.
fn remount_all_read_only_but(root: &Path) {
    use rustix::mount::{MountFlags, mount_bind, mount_remount};
    mount_bind(root, root).expect("bind the root onto itself");
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    let points: Vec<PathBuf> = mountinfo
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        // Octal escapes (a space in a mount point) are left alone: such a mount stays
        // writable, and the checks below would only be weaker for it, never wrong.
        .filter(|p| !p.contains('\\'))
        .map(PathBuf::from)
        .collect();
    for point in points {
        if point == root {
            continue;
        }
        // Some pseudo file systems refuse; the writes checked below are what count.
        let _ = mount_remount(&point, MountFlags::BIND | MountFlags::RDONLY, "");
    }
}

#[test]
fn plan_writes_nothing_outside_the_root() {
    if let Some(host_ns) = std::env::var_os(IN_NS) {
        let own = std::fs::read_link("/proc/self/ns/mnt").expect("own mount namespace");
        assert_ne!(own.as_os_str(), host_ns, "not in a private mount namespace");
        let root = PathBuf::from(std::env::var_os(ROOT).expect("root from the parent"));
        remount_all_read_only_but(&root);
        // The view really is read-only outside the root…
        let home = std::env::var_os("HOME").map(PathBuf::from);
        let target = PathBuf::from(env!("CARGO_BIN_EXE_nodeward"));
        let mut probes = vec![
            PathBuf::from("/"),
            PathBuf::from("/tmp"),
            PathBuf::from("/var/tmp"),
            PathBuf::from("/var/lib"),
            PathBuf::from("/etc"),
            std::env::temp_dir(),
            target.parent().expect("target dir").to_path_buf(),
        ];
        probes.extend(home);
        for dir in probes.iter().filter(|d| d.is_dir()) {
            let e = std::fs::write(dir.join(".nodeward-readonly-probe"), b"x")
                .expect_err("a read-only view");
            assert_eq!(
                e.raw_os_error(),
                Some(rustix::io::Errno::ROFS.raw_os_error()),
                "{}: {e}",
                dir.display()
            );
        }
        // …and the root is not.
        std::fs::write(root.join(".probe"), b"x").expect("the root is writable");
        std::fs::remove_file(root.join(".probe")).expect("remove probe");

        // With only --root, plan writes nothing outside it (the embedded phases come
        // precompiled: no compiled cache either), nor do the read commands.
        ok(nodeward(&["plan", "--root", s(&root), "--output", "json"]));
        assert!(!has_files(&root.join("var/lib/nodeward/compiled")));
        ok(nodeward(&["phases", "list", "--root", s(&root)]));
        ok(nodeward(&["version", "--root", s(&root)]));
        ok(nodeward(&["status", "--root", s(&root)]));
        ok(nodeward(&["phases", "history", "--root", s(&root)]));
        return;
    }
    assert!(
        rustix::process::geteuid().is_root(),
        "a read-only view of the host needs root (CAP_SYS_ADMIN) for a private mount namespace; run as root"
    );
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path().join("root");
    std::fs::create_dir_all(&root).expect("root");
    let root = root.canonicalize().expect("canonical root");
    let host_ns = std::fs::read_link("/proc/self/ns/mnt").expect("host mount namespace");
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private"])
        .arg(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            "plan_writes_nothing_outside_the_root",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(IN_NS, host_ns)
        .env(ROOT, &root)
        .output()
        .expect("run unshare");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "in a read-only view of the host: {}\n--- stdout\n{stdout}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    assert!(
        !mounts.contains(s(&root)),
        "the namespace's bind mount leaked to the host"
    );
}
