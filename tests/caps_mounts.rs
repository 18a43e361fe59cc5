//! `mounts` capability, for real, through the probe guest.
//!
//! Every test mounts only inside a private mount namespace of its own. A test process is
//! multi-threaded, so it cannot `unshare(CLONE_NEWNS)` itself; instead each test re-executes
//! this test binary for just itself under `unshare --mount --propagation private`, with
//! `NODEWARD_IN_MOUNT_NS` set to the host namespace's id. The child refuses to mount unless its
//! own namespace differs, runs the body in a temp dir the parent made, and exits; its mounts die
//! with its namespace. The parent then checks that its own (host) `/proc/self/mountinfo` has no
//! entry under that temp dir. Without root the tests fail, saying so.

mod common;

use common::{Probe, err_kind, ok};
use nodeward::grants::{FsGrant, Grants, MountsGrant};
use nodeward::plan::{ChangeKind, RunMode};
use rustix::io::Errno;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::Command;

const IN_NS: &str = "NODEWARD_IN_MOUNT_NS";
const BASE: &str = "NODEWARD_MOUNT_TEST_DIR";

/// Runs `body` with a fresh temp dir inside a private mount namespace (see the module docs).
fn in_private_mount_ns(name: &str, body: impl FnOnce(&Path)) {
    if let Some(host_ns) = std::env::var_os(IN_NS) {
        let own = std::fs::read_link("/proc/self/ns/mnt").expect("own mount namespace");
        assert_ne!(
            own.as_os_str(),
            host_ns,
            "refusing to mount: not in a private mount namespace"
        );
        let base = PathBuf::from(std::env::var_os(BASE).expect("test dir from the parent"));
        body(&base.canonicalize().expect("canonical test dir"));
        return;
    }
    // A skipped test would assert nothing: without root these tests fail, saying why.
    assert!(
        rustix::process::geteuid().is_root(),
        "{name}: mounting needs root (CAP_SYS_ADMIN) for a private mount namespace; run as root"
    );
    let tmp = tempfile::tempdir().expect("tempdir");
    let base = tmp.path().canonicalize().expect("canonical tempdir");
    let host_ns = std::fs::read_link("/proc/self/ns/mnt").expect("host mount namespace");
    let exe = std::env::current_exe().expect("test binary");
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private"])
        .arg(exe)
        .args([
            "--exact",
            name,
            "--nocapture",
            "--include-ignored",
            "--test-threads=1",
        ])
        .env(IN_NS, host_ns)
        .env(BASE, &base)
        .output()
        .expect("run unshare");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "{name} in a private mount namespace: {}\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        out.status
    );
    let host_mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("host mountinfo");
    let leaked = mounts_under(&host_mounts, &base);
    assert!(leaked.is_empty(), "mounts leaked to the host: {leaked:?}");
}

/// One `/proc/self/mountinfo` entry: mount point, options, fs type.
#[derive(Debug, Clone, PartialEq)]
struct MountEntry {
    point: PathBuf,
    options: String,
    fstype: String,
}

fn mounts_under(mountinfo: &str, dir: &Path) -> Vec<MountEntry> {
    mountinfo
        .lines()
        .filter_map(|l| {
            let fields: Vec<&str> = l.split(' ').collect();
            let sep = fields.iter().position(|f| *f == "-")?;
            Some(MountEntry {
                point: PathBuf::from(nodeward::caps::mount_sys::unescape_mountinfo(
                    fields.get(4)?,
                )),
                options: fields.get(5)?.to_string(),
                fstype: fields.get(sep + 1)?.to_string(),
            })
        })
        .filter(|m| m.point.starts_with(dir))
        .collect()
}

fn own_mounts_under(dir: &Path) -> Vec<MountEntry> {
    mounts_under(
        &std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo"),
        dir,
    )
}

/// The host root every test uses, beneath `base`:
/// - `src/hello.txt`: a bind source (read grant);
/// - `lower/l1/a.txt`, `lower/l2/b.txt`: overlay lowers (read grant);
/// - `ovl/upper`, `ovl/work`: overlay upper and work (write grant);
/// - `mnt/{bind,tmp,ovl,other}`: targets (mount grant);
/// - `private/secret`: covered by no grant;
/// - `mnt/escape` → `../../outside` (outside the root), `mnt/sneaky` → `../private`,
///   `mnt/up` → `..` (the root itself), `src/escape` → `../../outside`.
fn fixture(base: &Path) -> PathBuf {
    let root = base.join("root");
    for d in [
        "src",
        "lower/l1",
        "lower/l2",
        "ovl/upper",
        "ovl/work",
        "mnt/bind",
        "mnt/tmp",
        "mnt/ovl",
        "mnt/other",
        "private",
    ] {
        std::fs::create_dir_all(root.join(d)).expect("mkdir");
    }
    std::fs::create_dir_all(base.join("outside")).expect("mkdir");
    std::fs::write(root.join("src/hello.txt"), "hello\n").expect("write");
    std::fs::write(root.join("lower/l1/a.txt"), "from l1\n").expect("write");
    std::fs::write(root.join("lower/l2/b.txt"), "from l2\n").expect("write");
    std::fs::write(root.join("private/secret"), "secret\n").expect("write");
    for (link, target) in [
        ("mnt/escape", "../../outside"),
        ("mnt/sneaky", "../private"),
        ("mnt/up", ".."),
        ("src/escape", "../../outside"),
    ] {
        std::os::unix::fs::symlink(target, root.join(link)).expect("symlink");
    }
    root
}

fn grants() -> Grants {
    Grants {
        fs: FsGrant {
            read: vec!["src".into(), "lower".into()],
            write: vec!["ovl".into()],
        },
        mounts: MountsGrant {
            targets: vec!["mnt".into()],
        },
        ..Grants::default()
    }
}

fn bind(source: &str, target: &str, ro: bool) -> Value {
    json!({"op": "mounts.bind", "source": source, "target": target, "read-only": ro})
}

fn tmpfs(target: &str, size: u64) -> Value {
    json!({"op": "mounts.tmpfs", "target": target, "size-bytes": size})
}

fn overlay(target: &str) -> Value {
    json!({"op": "mounts.overlay", "lower": ["lower/l1", "lower/l2"],
           "upper": "ovl/upper", "work": "ovl/work", "target": target})
}

fn unmount(target: &str, lazy: bool) -> Value {
    json!({"op": "mounts.unmount", "target": target, "lazy": lazy})
}

fn is_mounted(target: &str) -> Value {
    json!({"op": "mounts.is-mounted", "target": target})
}

fn errno(e: &std::io::Error) -> Option<Errno> {
    e.raw_os_error().map(Errno::from_raw_os_error)
}

#[test]
fn bind_read_only_is_readable_and_refuses_writes() {
    in_private_mount_ns("bind_read_only_is_readable_and_refuses_writes", |base| {
        let root = fixture(base);
        let p = Probe::new(&root, RunMode::Apply);
        let g = grants();
        assert_eq!(ok(&p.call(&g, bind("src", "mnt/bind", true))), "created");
        assert_eq!(ok(&p.call(&g, is_mounted("mnt/bind"))), true);
        assert_eq!(
            std::fs::read_to_string(root.join("mnt/bind/hello.txt")).expect("read through"),
            "hello\n"
        );
        let e = std::fs::write(root.join("mnt/bind/new.txt"), "x").expect_err("read-only");
        assert_eq!(errno(&e), Some(Errno::ROFS), "{e}");
        std::fs::write(root.join("src/direct.txt"), "x").expect("the source stays writable");
        let entry = own_mounts_under(&root);
        assert_eq!(entry.len(), 1, "{entry:?}");
        assert_eq!(entry[0].point, root.join("mnt/bind"));
        assert!(entry[0].options.split(',').any(|o| o == "ro"), "{entry:?}");
        assert_eq!(ok(&p.call(&g, bind("src", "mnt/bind", true))), "unchanged");

        // A read-write bind: writes through the target land in the source, so the source's
        // read grant is not enough (it would turn fs.read into write access).
        let rw = p.call(&g, bind("src", "mnt/other", false));
        assert_eq!(err_kind(&rw), "denied", "{rw}");
        assert!(rw.to_string().contains("fs.write"), "{rw}");
        assert!(own_mounts_under(&root.join("mnt/other")).is_empty());
        let mut writable = g.clone();
        writable.fs.write.push("src".into());
        assert_eq!(
            ok(&p.call(&writable, bind("src", "mnt/other", false))),
            "created"
        );
        std::fs::write(root.join("mnt/other/through.txt"), "t").expect("rw bind");
        assert!(root.join("src/through.txt").exists());

        assert_eq!(ok(&p.call(&g, unmount("mnt/bind", false))), "removed");
        assert_eq!(ok(&p.call(&g, unmount("mnt/other", false))), "removed");
        assert_eq!(ok(&p.call(&g, is_mounted("mnt/bind"))), false);
        assert!(own_mounts_under(&root).is_empty());
        let kinds: Vec<_> = p.changes().into_iter().map(|c| c.kind).collect();
        assert_eq!(
            kinds[0],
            ChangeKind::MountBind {
                source: "src".into(),
                target: "mnt/bind".into(),
                read_only: true
            }
        );
        assert_eq!(kinds.len(), 4, "unchanged calls record nothing: {kinds:?}");
    });
}

#[test]
fn tmpfs_is_mounted_with_its_size_limit() {
    in_private_mount_ns("tmpfs_is_mounted_with_its_size_limit", |base| {
        let root = fixture(base);
        let p = Probe::new(&root, RunMode::Apply);
        let g = grants();
        const SIZE: u64 = 1 << 20;
        assert_eq!(ok(&p.call(&g, tmpfs("mnt/tmp", SIZE))), "created");
        assert_eq!(ok(&p.call(&g, is_mounted("mnt/tmp"))), true);
        let entry = own_mounts_under(&root);
        assert_eq!(entry.len(), 1, "{entry:?}");
        assert_eq!(entry[0].fstype, "tmpfs");
        let st = rustix::fs::statfs(root.join("mnt/tmp")).expect("statfs");
        assert_eq!(st.f_type as u64, 0x0102_1994, "TMPFS_MAGIC");
        assert_eq!(st.f_blocks as u64 * st.f_bsize as u64, SIZE);
        let e = std::fs::write(root.join("mnt/tmp/big"), vec![0u8; 2 * SIZE as usize])
            .expect_err("over the size limit");
        assert_eq!(errno(&e), Some(Errno::NOSPC), "{e}");
        let mode = std::fs::metadata(root.join("mnt/tmp")).expect("stat");
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o7777,
            0o755
        );
        assert_eq!(ok(&p.call(&g, tmpfs("mnt/tmp", SIZE))), "unchanged");
        let r = p.call(&g, tmpfs("mnt/other", 0));
        assert_eq!(err_kind(&r), "invalid-argument", "size 0 means unlimited");
        let r = p.call(&g, tmpfs("mnt/missing", SIZE));
        assert_eq!(err_kind(&r), "not-found");
        assert_eq!(ok(&p.call(&g, unmount("mnt/tmp", false))), "removed");
        assert!(own_mounts_under(&root).is_empty());
    });
}

#[test]
fn overlay_writes_land_in_upper() {
    in_private_mount_ns("overlay_writes_land_in_upper", |base| {
        let root = fixture(base);
        let p = Probe::new(&root, RunMode::Apply);
        let g = grants();
        assert_eq!(ok(&p.call(&g, overlay("mnt/ovl"))), "created");
        assert_eq!(ok(&p.call(&g, is_mounted("mnt/ovl"))), true);
        let m = root.join("mnt/ovl");
        assert_eq!(
            std::fs::read_to_string(m.join("a.txt")).expect("a"),
            "from l1\n"
        );
        assert_eq!(
            std::fs::read_to_string(m.join("b.txt")).expect("b"),
            "from l2\n"
        );
        std::fs::write(m.join("new.txt"), "new\n").expect("write through overlay");
        std::fs::write(m.join("a.txt"), "changed\n").expect("copy-up");
        assert_eq!(
            std::fs::read_to_string(root.join("ovl/upper/new.txt")).expect("upper"),
            "new\n"
        );
        assert_eq!(
            std::fs::read_to_string(root.join("ovl/upper/a.txt")).expect("upper copy"),
            "changed\n"
        );
        assert_eq!(
            std::fs::read_to_string(root.join("lower/l1/a.txt")).expect("lower"),
            "from l1\n",
            "the lower is untouched"
        );
        assert!(!root.join("lower/l1/new.txt").exists());
        assert!(!root.join("lower/l2/new.txt").exists());
        let entry = own_mounts_under(&root);
        assert_eq!(entry.len(), 1, "{entry:?}");
        assert_eq!(entry[0].fstype, "overlay");
        assert_eq!(ok(&p.call(&g, overlay("mnt/ovl"))), "unchanged");
        assert_eq!(ok(&p.call(&g, unmount("mnt/ovl", false))), "removed");
        assert!(own_mounts_under(&root).is_empty());
        let r = p.call(
            &g,
            json!({"op": "mounts.overlay", "lower": [], "upper": "ovl/upper",
                   "work": "ovl/work", "target": "mnt/ovl"}),
        );
        assert_eq!(err_kind(&r), "invalid-argument");
    });
}

#[test]
fn unmount_and_lazy_unmount() {
    in_private_mount_ns("unmount_and_lazy_unmount", |base| {
        let root = fixture(base);
        let p = Probe::new(&root, RunMode::Apply);
        let g = grants();
        assert_eq!(ok(&p.call(&g, unmount("mnt/tmp", false))), "unchanged");
        assert_eq!(ok(&p.call(&g, tmpfs("mnt/tmp", 1 << 20))), "created");
        assert_eq!(ok(&p.call(&g, unmount("mnt/tmp", false))), "removed");
        assert_eq!(ok(&p.call(&g, is_mounted("mnt/tmp"))), false);
        assert_eq!(ok(&p.call(&g, unmount("mnt/tmp", false))), "unchanged");

        // Busy: a plain unmount fails naming the target; a lazy one detaches it.
        assert_eq!(ok(&p.call(&g, tmpfs("mnt/tmp", 1 << 20))), "created");
        std::fs::write(root.join("mnt/tmp/held"), "held\n").expect("write");
        let held = std::fs::File::open(root.join("mnt/tmp/held")).expect("hold it busy");
        let r = p.call(&g, unmount("mnt/tmp", false));
        assert_eq!(err_kind(&r), "io", "{r}");
        let msg = r
            .pointer("/err/message")
            .and_then(Value::as_str)
            .unwrap_or("");
        assert!(msg.contains("mnt/tmp"), "names the target: {msg}");
        assert_eq!(ok(&p.call(&g, is_mounted("mnt/tmp"))), true);
        assert_eq!(ok(&p.call(&g, unmount("mnt/tmp", true))), "removed");
        assert_eq!(ok(&p.call(&g, is_mounted("mnt/tmp"))), false);
        assert!(own_mounts_under(&root).is_empty());
        let mut s = String::new();
        std::io::Read::read_to_string(&mut &held, &mut s).expect("still readable");
        assert_eq!(s, "held\n");
        let last = p.changes().pop().expect("a change");
        assert_eq!(
            last.kind,
            ChangeKind::Unmount {
                target: "mnt/tmp".into(),
                lazy: true
            }
        );

        // Unmount through a symlink inside the root and the grant.
        std::os::unix::fs::symlink("tmp", root.join("mnt/tmp-link")).expect("symlink");
        assert_eq!(ok(&p.call(&g, tmpfs("mnt/tmp-link", 1 << 20))), "created");
        assert_eq!(ok(&p.call(&g, is_mounted("mnt/tmp"))), true);
        assert_eq!(ok(&p.call(&g, unmount("mnt/tmp-link", false))), "removed");
        assert!(own_mounts_under(&root).is_empty());
    });
}

#[test]
fn a_mount_on_a_file_is_unmounted_and_one_outside_the_grant_is_not() {
    in_private_mount_ns(
        "a_mount_on_a_file_is_unmounted_and_one_outside_the_grant_is_not",
        |base| {
            let root = fixture(base);
            // What containerd does for a pod's network namespace: a mount on a regular file.
            std::fs::write(root.join("mnt/netns-file"), "").expect("mount point file");
            std::fs::write(root.join("private/netns-file"), "").expect("mount point file");
            for target in ["mnt/netns-file", "private/netns-file"] {
                let out = Command::new("mount")
                    .args(["--bind"])
                    .arg(root.join("src/hello.txt"))
                    .arg(root.join(target))
                    .output()
                    .expect("mount");
                assert!(out.status.success(), "{out:?}");
            }
            let p = Probe::new(&root, RunMode::Apply);
            let g = grants();
            assert_eq!(ok(&p.call(&g, unmount("mnt/netns-file", false))), "removed");
            assert_eq!(
                ok(&p.call(&g, unmount("mnt/netns-file", false))),
                "unchanged"
            );
            let mounted: Vec<String> = own_mounts_under(&root)
                .iter()
                .map(|m| format!("{m:?}"))
                .collect();
            assert_eq!(
                mounted.len(),
                1,
                "only the ungranted one is left: {mounted:?}"
            );
            assert!(mounted[0].contains("private/netns-file"), "{mounted:?}");
            let r = p.call(&g, unmount("private/netns-file", false));
            assert_eq!(err_kind(&r), "denied", "{r}");
            assert_eq!(own_mounts_under(&root).len(), 1, "the denied one stays");
            let _ = Command::new("umount")
                .arg(root.join("private/netns-file"))
                .status();
        },
    );
}

#[test]
fn targets_and_sources_outside_the_root_are_refused() {
    in_private_mount_ns("targets_and_sources_outside_the_root_are_refused", |base| {
        let root = fixture(base);
        let p = Probe::new(&root, RunMode::Apply);
        let g = grants();
        let cases = [
            (bind("src", "mnt/../private", false), "invalid-argument"),
            (tmpfs("mnt/../private", 1 << 20), "invalid-argument"),
            (tmpfs("/tmp", 1 << 20), "invalid-argument"),
            (tmpfs("mnt/escape", 1 << 20), "escape"),
            (bind("src", "mnt/escape", true), "escape"),
            (bind("src/escape", "mnt/bind", true), "escape"),
            (unmount("mnt/escape", false), "escape"),
            (is_mounted("mnt/escape"), "escape"),
            // Symlinks inside the root cannot widen the grant or reach the root itself.
            (tmpfs("mnt/sneaky", 1 << 20), "denied"),
            (tmpfs("mnt/up", 1 << 20), "invalid-argument"),
            (tmpfs("mnt/bind/../../private", 1 << 20), "invalid-argument"),
        ];
        for (call, kind) in cases {
            let r = p.call(&g, call.clone());
            assert_eq!(err_kind(&r), kind, "{call}: {r}");
        }
        assert!(own_mounts_under(base).is_empty(), "nothing mounted");
        assert!(p.changes().is_empty());
        assert!(
            p.audit()
                .iter()
                .any(|r| r.call == "mounts.tmpfs" && r.outcome.starts_with("escape")),
            "refusals are audited"
        );
    });
}

#[test]
fn ungranted_targets_and_sources_are_denied_and_audited() {
    in_private_mount_ns(
        "ungranted_targets_and_sources_are_denied_and_audited",
        |base| {
            let root = fixture(base);
            let p = Probe::new(&root, RunMode::Apply);
            let g = grants();
            let cases = [
                tmpfs("private", 1 << 20),
                bind("src", "private", true),
                bind("private", "mnt/bind", true),
                json!({"op": "mounts.overlay", "lower": ["private"], "upper": "ovl/upper",
                   "work": "ovl/work", "target": "mnt/ovl"}),
                json!({"op": "mounts.overlay", "lower": ["lower/l1"], "upper": "lower/l2",
                   "work": "ovl/work", "target": "mnt/ovl"}),
                unmount("src", false),
                is_mounted("private"),
            ];
            for call in &cases {
                let r = p.call(&g, call.clone());
                assert_eq!(err_kind(&r), "denied", "{call}: {r}");
            }
            let denied: Vec<_> = p.audit().into_iter().filter(|r| r.denied).collect();
            assert_eq!(denied.len(), cases.len(), "{denied:?}");
            assert!(
                denied
                    .iter()
                    .any(|r| r.call == "mounts.bind" && r.outcome.contains("fs.read")),
                "{denied:?}"
            );
            assert!(own_mounts_under(base).is_empty(), "nothing mounted");
            assert!(p.changes().is_empty());
            // With no grant at all, nothing is allowed.
            let r = p.call(&Grants::default(), tmpfs("mnt/tmp", 1 << 20));
            assert_eq!(err_kind(&r), "denied");
        },
    );
}

#[test]
fn plan_mode_records_the_same_changes_and_mounts_nothing() {
    in_private_mount_ns(
        "plan_mode_records_the_same_changes_and_mounts_nothing",
        |base| {
            let root = fixture(base);
            let g = grants();
            let calls = json!([
                bind("src", "mnt/bind", true),
                tmpfs("mnt/tmp", 1 << 20),
                overlay("mnt/ovl"),
                unmount("mnt/tmp", true),
                unmount("mnt/other", false),
                tmpfs("mnt/escape", 1 << 20),
            ]);
            let before = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
            let plan = Probe::new(&root, RunMode::Plan);
            let planned = plan.run(&g, calls.clone());
            assert_eq!(
                std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo"),
                before,
                "plan mode mounted something"
            );
            assert_eq!(ok(&planned[0]), "created");
            assert_eq!(ok(&planned[1]), "created");
            assert_eq!(ok(&planned[2]), "created");
            // The overlay does not model mounts: the host's tmp is not mounted.
            assert_eq!(ok(&planned[3]), "unchanged");
            assert_eq!(ok(&planned[4]), "unchanged");
            assert_eq!(
                err_kind(&planned[5]),
                "escape",
                "plan refuses what apply refuses"
            );

            let apply = Probe::new(&root, RunMode::Apply);
            let applied = apply.run(&g, calls);
            assert_eq!(ok(&applied[3]), "removed", "apply mounted tmp before");
            let plan_kinds: Vec<_> = plan.changes().into_iter().map(|c| c.kind).collect();
            let apply_kinds: Vec<_> = apply.changes().into_iter().map(|c| c.kind).collect();
            assert_eq!(apply_kinds[..3], plan_kinds[..], "same change kinds");
            assert_eq!(own_mounts_under(&root).len(), 2, "bind and overlay");

            // Plan mode over mounted targets: unchanged / removed, and still nothing changes.
            let before = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
            let plan = Probe::new(&root, RunMode::Plan);
            let r = plan.run(
                &g,
                json!([bind("src", "mnt/bind", true), unmount("mnt/ovl", false)]),
            );
            assert_eq!(ok(&r[0]), "unchanged");
            assert_eq!(ok(&r[1]), "removed");
            assert_eq!(
                std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo"),
                before
            );
            // A target created earlier in the plan counts as an unmounted directory.
            let mut g2 = g.clone();
            g2.fs.write.push("mnt".into());
            let r = plan.run(
                &g2,
                json!([
                    {"op": "fs.create-dir", "path": "mnt/planned", "mode": 0o755},
                    tmpfs("mnt/planned", 1 << 20),
                    tmpfs("mnt/never", 1 << 20),
                ]),
            );
            assert_eq!(ok(&r[1]), "created", "{r:?}");
            assert_eq!(err_kind(&r[2]), "not-found");
            assert!(!root.join("mnt/planned").exists());
        },
    );
}
