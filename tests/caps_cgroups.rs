//! `cgroups` capability, for real, through the probe guest.
//!
//! Two kinds of tests:
//! - plain ones (malformed and ungranted paths, no cgroup file system) touch no cgroup and
//!   run anywhere;
//! - `#[ignore]`d ones need the systemd harness (`scripts/test.sh` runs them inside it with
//!   `--include-ignored`): its `/sys/fs/cgroup` is the harness's own cgroup tree (cgroup2 by
//!   default, v1 hierarchies plus cgroup2 with `TEST_SYSTEMD_CGROUP=hybrid`), and a busy cgroup
//!   is a real `systemd-run` service in a slice of the test's own (`nwtest<pid>.slice`), as
//!   the kubelet's systemd driver makes them. A guard stops the unit and removes every cgroup
//!   the test made, even when it fails.

mod common;

use common::{Probe, err_kind, ok};
use nodeward::audit::Redactor;
use nodeward::caps::RunContext;
use nodeward::grants::{CgroupsGrant, Grants};
use nodeward::hostpath::HostRoot;
use nodeward::plan::{ChangeKind, RunMode};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::Command;

const MOUNT: &str = "/sys/fs/cgroup";

fn grants(paths: &[&str]) -> Grants {
    let g = Grants {
        cgroups: CgroupsGrant {
            remove: paths.iter().map(|s| s.to_string()).collect(),
        },
        ..Grants::default()
    };
    g.validate().expect("valid grants");
    g
}

fn remove(path: &str) -> Value {
    json!({"op": "cgroups.remove-empty", "path": path})
}

fn probe(mode: RunMode, mount: &Path) -> (tempfile::TempDir, Probe) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut session = RunContext::new(
        HostRoot::open(tmp.path()).expect("root"),
        mode,
        Redactor::default(),
    );
    session.cgroups.mount = Some(mount.to_path_buf());
    (tmp, Probe::with_session(session))
}

fn statfs_magic(p: &Path) -> u64 {
    rustix::fs::statfs(p).map(|s| s.f_type as u64).unwrap_or(0)
}

fn is_cgroup_fs(p: &Path) -> bool {
    matches!(statfs_magic(p), 0x0027_e0eb | 0x6367_7270)
}

/// The hierarchies beneath `mount`, as the capability finds them: `(label, dir)`.
fn hierarchies(mount: &Path) -> Vec<(String, PathBuf)> {
    if is_cgroup_fs(mount) {
        return vec![(String::new(), mount.to_path_buf())];
    }
    let mut out: Vec<(String, PathBuf)> = std::fs::read_dir(mount)
        .expect("cgroup mount")
        .map(|e| e.expect("entry"))
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter(|e| is_cgroup_fs(&e.path()))
        .map(|e| (e.file_name().to_string_lossy().into_owned(), e.path()))
        .collect();
    out.sort();
    out
}

fn label(h: &str, path: &str) -> String {
    if h.is_empty() {
        path.to_string()
    } else {
        format!("{h}/{path}")
    }
}

/// Every cgroup directory at and beneath `dir`, relative to `base`, parents first.
fn tree(base: &Path, dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    if !dir.is_dir() {
        return out;
    }
    out.push(
        dir.strip_prefix(base)
            .expect("beneath")
            .display()
            .to_string(),
    );
    let mut subs: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("read cgroup")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.is_dir())
        .collect();
    subs.sort();
    for s in subs {
        out.extend(tree(base, &s));
    }
    out
}

fn has_procs(dir: &Path) -> bool {
    std::fs::read_to_string(dir.join("cgroup.procs")).is_ok_and(|p| !p.trim().is_empty())
}

/// A slice of this test's own, with empty cgroups made by hand in every hierarchy and,
/// optionally, a running service in it; removes all of it on drop.
struct Slice {
    name: String,
    unit: Option<String>,
}

impl Slice {
    fn new(tag: &str, service: bool) -> Slice {
        common_harness();
        let base = format!("nwtest{}{tag}", std::process::id());
        let mut s = Slice {
            name: format!("{base}.slice"),
            unit: None,
        };
        if service {
            let unit = format!("{base}-busy.service");
            let out = Command::new("systemd-run")
                .args(["--unit", &unit, "--slice", &base, "--quiet", "sleep", "300"])
                .output()
                .expect("systemd-run");
            assert!(
                out.status.success(),
                "systemd-run: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            s.unit = Some(unit);
        }
        for (_, h) in hierarchies(Path::new(MOUNT)) {
            for d in ["empty1/deeper/deepest", "empty2"] {
                std::fs::create_dir_all(h.join(&s.name).join(d)).expect("mkdir cgroup");
            }
        }
        s
    }

    /// `(label, has processes)` of every cgroup of this slice in every hierarchy.
    fn cgroups(&self) -> Vec<(String, bool)> {
        let mut out = Vec::new();
        for (name, h) in hierarchies(Path::new(MOUNT)) {
            for rel in tree(&h, &h.join(&self.name)) {
                let busy = tree(&h, &h.join(&rel))
                    .iter()
                    .any(|r| has_procs(&h.join(r)));
                out.push((label(&name, &rel), busy));
            }
        }
        out
    }
}

impl Drop for Slice {
    fn drop(&mut self) {
        if let Some(u) = &self.unit {
            let _ = Command::new("systemctl").args(["stop", u]).output();
        }
        let _ = Command::new("systemctl")
            .args(["stop", &self.name])
            .output();
        for _ in 0..20 {
            let mut left = false;
            for (_, h) in hierarchies(Path::new(MOUNT)) {
                let mut all = tree(&h, &h.join(&self.name));
                all.reverse();
                for rel in all {
                    left |= std::fs::remove_dir(h.join(&rel)).is_err();
                }
            }
            if !left {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        if !std::thread::panicking() {
            panic!("cgroups of {} left behind", self.name);
        }
    }
}

fn common_harness() {
    assert!(
        std::fs::read_to_string("/proc/1/comm").is_ok_and(|c| c.trim() == "systemd"),
        "this test needs the systemd harness: run it with scripts/test.sh (docs/testing-systemd.md)"
    );
}

fn removed_paths(p: &Probe) -> Vec<String> {
    p.changes()
        .into_iter()
        .filter_map(|c| match c.kind {
            ChangeKind::CgroupRemove { path } => Some(path),
            _ => None,
        })
        .collect()
}

#[test]
fn malformed_and_ungranted_paths_are_refused_before_any_cgroup_is_read() {
    // A mount point that does not exist: a call that got past its checks would be
    // `unavailable`, so every refusal below is the check's own.
    let (_tmp, p) = probe(RunMode::Apply, Path::new("/nonexistent-nodeward-cgroup"));
    let g = grants(&["kubepods", "kubepods.slice"]);
    for bad in [
        "",
        "/kubepods",
        "..",
        "kubepods/..",
        "kubepods/../system.slice",
        "./kubepods",
        "kubepods//x",
        "kubepods/",
    ] {
        let r = p.call(&g, remove(bad));
        assert_eq!(err_kind(&r), "invalid-argument", "{bad:?}: {r}");
    }
    for ungranted in [
        "kubepods2",
        "system.slice",
        "init.scope",
        "kube",
        "user.slice/kubepods",
    ] {
        let r = p.call(&g, remove(ungranted));
        assert_eq!(err_kind(&r), "denied", "{ungranted:?}: {r}");
    }
    let r = p.call(&g, remove("kubepods/burstable"));
    assert_eq!(err_kind(&r), "unavailable", "granted beneath: {r}");
    let plain = tempfile::tempdir().expect("tempdir");
    let (_t, p2) = probe(RunMode::Apply, plain.path());
    let r = p2.call(&g, remove("kubepods"));
    assert_eq!(
        err_kind(&r),
        "unavailable",
        "a directory without cgroup mounts: {r}"
    );
    // By default the cgroup mounts are `sys/fs/cgroup` beneath the host root: a test root has
    // none, and a link there leading out of the root is not followed.
    let tmp = tempfile::tempdir().expect("tempdir");
    let session = RunContext::new(
        HostRoot::open(tmp.path()).expect("root"),
        RunMode::Apply,
        Redactor::default(),
    );
    let p3 = Probe::with_session(session);
    let r = p3.call(&g, remove("kubepods"));
    assert_eq!(err_kind(&r), "unavailable", "{r}");
    std::fs::create_dir_all(tmp.path().join("sys/fs")).expect("mkdir");
    std::os::unix::fs::symlink("/sys/fs/cgroup", tmp.path().join("sys/fs/cgroup"))
        .expect("symlink");
    let r = p3.call(&g, remove("kubepods"));
    assert!(
        r.get("ok").is_none(),
        "the link out of the root is not followed: {r}"
    );
    assert!(p.changes().is_empty() && p2.changes().is_empty() && p3.changes().is_empty());
    for bad in ["system.slice", "-.slice/x", "", "/", "a/../b"] {
        let g = Grants {
            cgroups: CgroupsGrant {
                remove: vec![bad.into()],
            },
            ..Grants::default()
        };
        assert_eq!(
            g.validate().expect_err("refused grant").field,
            "cgroups.remove",
            "{bad:?}"
        );
    }
}

#[test]
#[ignore = "needs the systemd harness (scripts/test.sh)"]
fn removes_empty_cgroups_deepest_first_and_keeps_those_with_processes() {
    let slice = Slice::new("a", true);
    let before = slice.cgroups();
    let expect_removed: Vec<String> = before
        .iter()
        .filter(|(_, busy)| !busy)
        .map(|(l, _)| l.clone())
        .collect();
    let expect_kept: Vec<String> = before
        .iter()
        .filter(|(_, busy)| *busy)
        .map(|(l, _)| l.clone())
        .collect();
    assert!(
        !expect_kept.is_empty(),
        "the service is somewhere: {before:?}"
    );
    assert!(expect_removed.len() >= 4, "{before:?}");

    // Plan first: the same list, nothing removed.
    let (_t, plan) = probe(RunMode::Plan, Path::new(MOUNT));
    let g = grants(&[&slice.name]);
    let r = ok(&plan.call(&g, remove(&slice.name))).clone();
    assert_eq!(r["removed"], expect_removed.len(), "{r}");
    assert_eq!(slice.cgroups(), before, "plan removes nothing");
    let mut planned = removed_paths(&plan);
    planned.sort();
    let mut expected_sorted = expect_removed.clone();
    expected_sorted.sort();
    assert_eq!(planned, expected_sorted);

    let (_t, p) = probe(RunMode::Apply, Path::new(MOUNT));
    let r = ok(&p.call(&g, remove(&slice.name))).clone();
    assert_eq!(r["removed"], expect_removed.len(), "{r}");
    let kept: Vec<String> = r["kept"]
        .as_array()
        .expect("kept")
        .iter()
        .map(|k| k.as_str().expect("text").to_string())
        .collect();
    for k in &expect_kept {
        assert!(
            kept.iter().any(|line| line.starts_with(&format!("{k}: "))),
            "{k} reported in {kept:?}"
        );
    }
    assert!(
        kept.iter().any(|l| l.ends_with(": has processes")),
        "{kept:?}"
    );
    let after: Vec<String> = slice.cgroups().into_iter().map(|(l, _)| l).collect();
    assert_eq!(after, expect_kept, "exactly the busy ones stay");
    // Deepest first: a child's removal comes before its parent's.
    let order = removed_paths(&p);
    for (i, path) in order.iter().enumerate() {
        for later in &order[i + 1..] {
            assert!(
                !later.starts_with(&format!("{path}/")),
                "{path} before {later}"
            );
        }
    }
    let records = p
        .audit()
        .iter()
        .filter(|r| r.call == "cgroups.remove")
        .count();
    assert_eq!(
        records,
        expect_removed.len(),
        "one audit record per removed cgroup"
    );

    // Once the service is stopped, the rest goes too; a third call changes nothing.
    if let Some(u) = &slice.unit {
        let out = Command::new("systemctl")
            .args(["stop", u])
            .output()
            .expect("stop");
        assert!(out.status.success());
    }
    let r = ok(&p.call(&g, remove(&slice.name))).clone();
    assert_eq!(r["kept"], json!([]), "{r}");
    assert!(slice.cgroups().is_empty(), "{:?}", slice.cgroups());
    let r = ok(&p.call(&g, remove(&slice.name))).clone();
    assert_eq!(r, json!({"removed": 0, "kept": []}));
}

#[test]
#[ignore = "needs the systemd harness (scripts/test.sh)"]
fn a_mount_in_the_tree_or_a_tree_over_the_limits_refuses_before_anything_is_removed() {
    let slice = Slice::new("b", false);
    let before = slice.cgroups();
    let (_, h) = hierarchies(Path::new(MOUNT))
        .into_iter()
        .next()
        .expect("a hierarchy");
    let target = h.join(&slice.name).join("empty2");
    let out = Command::new("mount")
        .args(["-n", "-t", "tmpfs", "-o", "size=1m", "tmpfs"])
        .arg(&target)
        .output()
        .expect("mount");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (_t, p) = probe(RunMode::Apply, Path::new(MOUNT));
    let g = grants(&[&slice.name]);
    let r = p.call(&g, remove(&slice.name));
    let _ = Command::new("umount").arg("-n").arg(&target).output();
    assert_eq!(err_kind(&r), "denied", "{r}");
    assert!(r.to_string().contains("mounted"), "{r}");
    assert_eq!(slice.cgroups(), before, "nothing removed");
    // A bind of another cgroup of the same hierarchy: the same device, still a mount.
    let out = Command::new("mount")
        .args(["-n", "--bind"])
        .arg(h.join(&slice.name).join("empty1/deeper"))
        .arg(&target)
        .output()
        .expect("mount");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = p.call(&g, remove(&slice.name));
    let _ = Command::new("umount").arg("-n").arg(&target).output();
    assert_eq!(err_kind(&r), "denied", "{r}");
    assert_eq!(slice.cgroups(), before, "nothing removed");

    let tmp = tempfile::tempdir().expect("tempdir");
    for (max_cgroups, max_depth, what) in [
        (3, 32, "more than 3 cgroups"),
        (4096, 1, "more than 1 levels"),
    ] {
        let mut session = RunContext::new(
            HostRoot::open(tmp.path()).expect("root"),
            RunMode::Apply,
            Redactor::default(),
        );
        session.cgroups.mount = Some(PathBuf::from(MOUNT));
        session.cgroups.max_cgroups = max_cgroups;
        session.cgroups.max_depth = max_depth;
        let p = Probe::with_session(session);
        let r = p.call(&g, remove(&slice.name));
        assert_eq!(err_kind(&r), "failed", "{r}");
        assert!(r.to_string().contains(what), "{r}");
        assert_eq!(slice.cgroups(), before, "nothing removed");
    }
}

#[test]
#[ignore = "needs the systemd harness (scripts/test.sh)"]
fn symlinks_among_the_hierarchies_are_never_followed() {
    let slice = Slice::new("c", false);
    let before = slice.cgroups();
    // A mount point of the test's own: one real hierarchy (a bind of the first) and a link
    // to the same hierarchy, which must not be visited.
    let dir = tempfile::tempdir().expect("tempdir");
    let (_, h) = hierarchies(Path::new(MOUNT))
        .into_iter()
        .next()
        .expect("a hierarchy");
    let real = dir.path().join("real");
    std::fs::create_dir(&real).expect("mkdir");
    std::os::unix::fs::symlink(&h, dir.path().join("alink")).expect("symlink");
    let out = Command::new("mount")
        .args(["-n", "--bind"])
        .arg(&h)
        .arg(&real)
        .output()
        .expect("mount");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (_t, p) = probe(RunMode::Plan, dir.path());
    let r = p.call(&grants(&[&slice.name]), remove(&slice.name));
    let _ = Command::new("umount").arg("-n").arg(&real).output();
    let r = ok(&r).clone();
    let paths = removed_paths(&p);
    assert!(!paths.is_empty(), "{r}");
    assert!(paths.iter().all(|p| p.starts_with("real/")), "{paths:?}");
    assert_eq!(slice.cgroups(), before);
}

#[test]
#[ignore = "needs the systemd harness (scripts/test.sh)"]
fn by_default_the_cgroup_mounts_are_those_beneath_the_host_root() {
    let slice = Slice::new("d", false);
    let before = slice.cgroups();
    // A host root whose `sys/fs/cgroup` is the harness's tree (as the real-cluster fixture
    // binds it), recursive and private so that undoing it never propagates.
    let tmp = tempfile::tempdir().expect("tempdir");
    let cg = tmp.path().join("sys/fs/cgroup");
    std::fs::create_dir_all(&cg).expect("mkdir");
    for args in [&["--rbind", MOUNT][..], &["--make-rprivate"][..]] {
        let out = Command::new("mount")
            .arg("-n")
            .args(args)
            .arg(&cg)
            .output()
            .expect("mount");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let session = RunContext::new(
        HostRoot::open(tmp.path()).expect("root"),
        RunMode::Apply,
        Redactor::default(),
    );
    let p = Probe::with_session(session);
    let r = p.call(&grants(&[&slice.name]), remove(&slice.name));
    // Lazily: another test of this binary may hold a cgroup of the tree open at this moment;
    // the bind is detached at once all the same and goes when they let go.
    let out = Command::new("umount")
        .args(["-n", "-R", "-l"])
        .arg(&cg)
        .output()
        .expect("umount");
    assert!(
        out.status.success(),
        "umount -R -l {}: {}",
        cg.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let r = ok(&r).clone();
    assert_eq!(r["removed"], before.len(), "{r}");
    assert!(slice.cgroups().is_empty());
}
