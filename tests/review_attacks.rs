//! Hostile review of issue 10 ("a grant means exactly what it says"), after its first
//! implementation.
//!
//! Each test is an attack by a phase (the probe guest, with the narrow grants an auditor could
//! approve) or by someone who planted links in the host root before the run. A test that still
//! asserts what the contract promises. The findings of the review are fixed (link targets
//! judged through existing links, bounded resolution, bounded `remove-all`, bounded plan
//! overlay and change list, the artifact cache opened without following links, in
//! `tests/caps_fs_links.rs`); the last, a phase granted the bootstrap kubeconfig choosing its
//! `server`, is gone with the host rendering that file (`tests/phases/bootstrap_kubeconfig.rs`).

mod common;

use common::*;
use nodeward::audit::limits::MAX_EMITTED_PER_PHASE;
use nodeward::grants::Grants;
use nodeward::plan::{ChangeKind, RunMode};
use nodeward::runtime::Limits;
use serde_json::{Value, json};
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::Path;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Attacks measuring this process's peak RSS run one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// The ceiling `tests/bounds.rs` holds the agent to for one attack, in MiB.
const RSS_CEILING_MIB: u64 = 96;

fn kinds(results: &[Value]) -> Vec<String> {
    results.iter().map(kind).collect()
}

/// Where the kernel resolves `p` (following every link), or `None` when it does not exist.
fn kernel_resolves(p: &Path) -> Option<std::path::PathBuf> {
    std::fs::canonicalize(p).ok()
}

// ---------------------------------------------------------------------------------------------
// Links
// ---------------------------------------------------------------------------------------------

/// `fs.symlink` checks a new link's target lexically from the link's directory, but the kernel
/// resolves it component by component, following the links the phase made before. A link to
/// `.` is lexically one level deeper than where it leads, so `k/..` is lexically inside the
/// grant and really its parent. With `fs.write = ["w"]` three accepted links make `w/z` lead to
/// `etc` (and one more makes `w/o` lead above the host root, to the fixture's `outside/`): the
/// kubelet, containerd or any program following them gets a path no grant names. The agent's own
/// resolution (`Session::resolve`) still refuses to act through them; the link's promise
/// ("a link may only lead where this phase may write", `wit/fs.wit`) is what breaks.
#[test]
fn a_chain_of_links_each_lexically_inside_the_grant_leads_outside_it() {
    for mode in [RunMode::Apply, RunMode::Plan] {
        let f = Fixture::new();
        std::fs::create_dir_all(f.root.join("w")).expect("w");
        std::fs::create_dir_all(f.root.join("etc")).expect("etc");
        std::fs::write(f.root.join("etc/shadow"), "root:$6$secret:::\n").expect("shadow");
        let s = f.session(mode);
        let g = grants("[fs]\nwrite = [\"w\"]\n");
        let r = probe(
            &s,
            g,
            json!([
                {"op": "fs.symlink", "target": ".", "path": "w/k"},
                // Lexically w/k/.. = w; really w/.. = the root.
                {"op": "fs.symlink", "target": "k/..", "path": "w/y"},
                // Lexically w/y/etc; really etc.
                {"op": "fs.symlink", "target": "y/etc", "path": "w/z"},
                // Lexically w/y/../outside = w/outside; really the root's parent's outside/.
                {"op": "fs.symlink", "target": "y/../outside", "path": "w/o"},
            ]),
        );
        if mode == RunMode::Apply {
            // Whatever the kernel makes of the links that were accepted, each must lead inside
            // the write grant.
            let w = kernel_resolves(&f.root.join("w")).expect("w");
            let out: Vec<String> = ["w/k", "w/y", "w/z", "w/o"]
                .iter()
                .filter_map(|link| {
                    let to = kernel_resolves(&f.root.join(link))?;
                    (!to.starts_with(&w)).then(|| format!("{link} -> {}", to.display()))
                })
                .collect();
            assert!(
                out.is_empty(),
                "accepted ({r:?}) and leading out of w (root {}): {out:?}",
                f.root.display()
            );
        } else {
            // Plan mode plans exactly what apply would make.
            assert!(
                kinds(&r).iter().any(|k| k == "denied"),
                "{mode:?}: every link of the chain was planned: {r:?}"
            );
        }
    }
}

/// The same lexical check against a link someone else planted: a phase with `fs.write = ["w"]`
/// may make `w/q -> p/shadow` when `w/p -> ../etc` was planted, since `w/p/shadow` is lexically
/// inside `w`. The new link, made by this phase, leads to `etc/shadow`.
#[test]
fn a_new_link_through_a_planted_link_leads_outside_the_grant() {
    let f = Fixture::new();
    std::fs::create_dir_all(f.root.join("w")).expect("w");
    std::fs::create_dir_all(f.root.join("etc")).expect("etc");
    std::fs::write(f.root.join("etc/shadow"), "root:$6$secret:::\n").expect("shadow");
    symlink("../etc", f.root.join("w/p")).expect("planted link");
    let r = probe(
        &f.session(RunMode::Apply),
        grants("[fs]\nwrite = [\"w\"]\n"),
        json!([{"op": "fs.symlink", "target": "p/shadow", "path": "w/q"}]),
    );
    assert_eq!(kinds(&r), ["denied"], "{r:?}");
    assert!(std::fs::symlink_metadata(f.root.join("w/q")).is_err());
}

/// Held: every `fs` function refuses to act through the `.`-chain (the agent's resolution is
/// component by component), in both modes. Planted here, so the test holds whatever
/// `fs.symlink` decides.
#[test]
fn the_agent_itself_does_not_follow_a_dot_chain() {
    for mode in [RunMode::Apply, RunMode::Plan] {
        let f = Fixture::new();
        std::fs::create_dir_all(f.root.join("w")).expect("w");
        std::fs::create_dir_all(f.root.join("etc")).expect("etc");
        std::fs::write(f.root.join("etc/shadow"), "root:$6$secret:::\n").expect("shadow");
        symlink(".", f.root.join("w/k")).expect("k");
        symlink("k/..", f.root.join("w/y")).expect("y");
        symlink("y/etc", f.root.join("w/z")).expect("z");
        let before = snapshot(&f.root);
        let outside = snapshot(&f.outside);
        let r = probe(
            &f.session(mode),
            grants("[fs]\nwrite = [\"w\"]\n"),
            json!([
                {"op": "fs.read-file", "path": "w/z/shadow"},
                {"op": "fs.write-file", "path": "w/z/shadow", "contents": "x", "mode": 0o644},
                {"op": "fs.list-dir", "path": "w/z"},
                {"op": "fs.create-dir", "path": "w/z/new", "mode": 0o755},
                {"op": "fs.remove-all", "path": "w/z/shadow"},
                {"op": "fs.stat", "path": "w/y/etc/shadow"},
                {"op": "fs.read-file", "path": "w/k/k/k/y/etc/shadow"},
            ]),
        );
        assert_eq!(kinds(&r), ["denied"; 7], "{mode:?}: {r:?}");
        assert_eq!(snapshot(&f.root), before);
        assert_eq!(snapshot(&f.outside), outside);
    }
}

// ---------------------------------------------------------------------------------------------
// Host-side work and memory
// ---------------------------------------------------------------------------------------------

/// Plan mode keeps every planned file's contents in the overlay: it used to keep any number
/// (24 files of 8 MiB grew the agent by about 200 MiB). A plan now holds at most 32 MiB of
/// planned contents; a write past that is `failed`.
#[test]
fn planned_files_are_bounded_in_host_memory() {
    let _serial = serial();
    let f = Fixture::new();
    std::fs::create_dir_all(f.root.join("w")).expect("w");
    let s = f.session(RunMode::Plan);
    let calls: Vec<Value> = (0..24)
        .map(|i| {
            json!({"op": "repeat", "n": 1,
                   "call": {"op": "fs.write-file", "path": format!("w/f{i}"), "contents": "", "mode": 0o644},
                   "pad": {"key": "contents", "len": 8 << 20}})
        })
        .collect();
    let before = reset_peak();
    let r = probe(&s, grants("[fs]\nwrite = [\"w\"]\n"), Value::Array(calls));
    let growth = peak_growth_mib(before);
    eprintln!("24 planned 8 MiB files: peak RSS grew {growth} MiB");
    // The first four fit the plan's 32 MiB of planned contents; the rest are refused.
    assert!(r[..4].iter().all(|r| ok(r) == &json!({"ok": 1})), "{r:?}");
    // (The probe's `repeat` reports counts by outcome; a slow debug run may reach the
    // deadline in the last calls.)
    assert!(
        r[4..].iter().all(|r| {
            let v = ok(r);
            v == &json!({"failed": 1}) || v == &json!({"timeout": 1})
        }),
        "{r:?}"
    );
    // The guest's own memory (one 8 MiB string at a time, in a 256 MiB budget) is not the point:
    // what the host keeps after each call returned is.
    assert!(
        growth < 8 + RSS_CEILING_MIB,
        "peak RSS grew {growth} MiB for 24 planned files"
    );
}

/// Plan-mode `download.fetch` records a `download` change every time, each keeping its URL:
/// 40,000 calls with a 4 KiB URL used to keep about 160 MiB in the change list (10,000 here,
/// past the bound, to keep the suite short). The list now
/// keeps 4096 changes and counts the rest. (A plan is not refused past the audit record
/// budget, as an apply is: it changes nothing, so its calls past the budget are counted.)
#[test]
fn the_plan_change_list_is_bounded() {
    let _serial = serial();
    let f = Fixture::new();
    std::fs::create_dir_all(f.root.join("w")).expect("w");
    let s = f.session(RunMode::Plan);
    let g = grants("[fs]\nwrite = [\"w\"]\n[download]\nurls = [\"https://artifacts.example/\"]\n");
    let n = 10_000u64;
    let before = reset_peak();
    let r = probe(
        &s,
        g,
        json!([{"op": "repeat", "n": n,
                "call": {"op": "download.fetch", "url": "https://artifacts.example/",
                         "sha256": "0".repeat(64), "dest": "w/f", "mode": 0o644},
                "pad": {"key": "url", "len": 4096}}]),
    );
    let growth = peak_growth_mib(before);
    let changes = s
        .changes()
        .iter()
        .filter(|c| matches!(c.kind, ChangeKind::Download { .. }))
        .count();
    eprintln!("{n} planned downloads: {changes} changes kept, peak RSS grew {growth} MiB");
    assert_eq!(ok(&r[0]), &json!({"ok": n}));
    // The run lists at most MAX_CHANGES and counts the rest. (A repeated planned download is
    // still listed each time: plan mode does not know the bytes it would write.)
    assert_eq!(changes, nodeward::plan::MAX_CHANGES);
    assert_eq!(s.changes_dropped(), n as usize - changes);
    assert!(growth < RSS_CEILING_MIB, "peak RSS grew {growth} MiB");
}

/// Past its first 1,000 calls a phase's calls were only counted (one `call-overflow` record
/// per phase run): an apply phase could make its 1,001st to millionth host change with no
/// record of which path it wrote. Past the record budget an apply now refuses every call that
/// could change the host (`denied`, naming the limit), so every host change has its record;
/// read-only calls are still answered, and counted. A plan only counts them
/// (`the_plan_change_list_is_bounded`).
#[test]
fn host_changes_past_the_audit_record_budget_are_refused_in_apply() {
    let f = Fixture::new();
    std::fs::create_dir_all(f.root.join("w")).expect("w");
    let s = f.session(RunMode::Apply);
    let n = MAX_EMITTED_PER_PHASE as u64;
    let write =
        |path: &str| json!({"op": "fs.write-file", "path": path, "contents": "x", "mode": 0o644});
    let r = probe(
        &s,
        grants("[fs]\nwrite = [\"w\"]\n"),
        json!([
            {"op": "repeat", "n": n, "call": write("w/f")},
            write("w/past"),
            {"op": "fs.stat", "path": "w/f"},
            {"op": "repeat", "n": 5, "call": {"op": "fs.create-dir", "path": "w/d", "mode": 0o755}},
            {"op": "fs.read-file", "path": "w/f"},
        ]),
    );
    assert_eq!(ok(&r[0]), &json!({"ok": n}), "{r:?}");
    assert_eq!(err_kind(&r[1]), "denied", "{r:?}");
    let message = r[1]
        .pointer("/err/message")
        .and_then(Value::as_str)
        .unwrap_or_default();
    assert!(
        message.contains(&format!(
            "past the audit record limit ({n} audit records per phase run)"
        )),
        "{message}"
    );
    assert!(
        !f.root.join("w/past").exists(),
        "the refused write changed nothing"
    );
    assert!(ok(&r[2]).is_object(), "a read-only call is answered: {r:?}");
    assert_eq!(ok(&r[3]), &json!({"denied": 5}));
    assert!(!f.root.join("w/d").exists());
    assert_eq!(ok(&r[4]), "x");
    // Every call is counted, the refused ones as denied.
    assert_eq!(s.audit.total(), n + 8);
    assert_eq!(s.audit.denied(), 6);
}

/// `Session::resolve` checks no deadline, and each step `lstat`s through
/// `open_dir_nofollow`, which opens every component from the root again: one call costs
/// O(links × depth²) `openat`s. 40 links (the limit), each with a 4 KiB target that walks 800
/// directories down and back up, make one `fs.stat` call run for seconds to tens of seconds,
/// none of it interruptible, against a 2 s phase deadline. (Links planted here for speed; the
/// phase can make all of them itself: every target is lexically inside `w`.)
#[test]
fn one_resolution_runs_far_past_the_deadline() {
    let f = Fixture::new();
    // 800 took 125 s for the one call (debug build, shared 2-core machine); 400 about a quarter.
    let k = 400;
    let deep = format!("w/{}", vec!["d"; k].join("/"));
    std::fs::create_dir_all(f.root.join(&deep)).expect("deep tree");
    let down_and_up = format!("{}{}", "d/".repeat(k), "../".repeat(k));
    for i in 1..40 {
        symlink(
            format!("{down_and_up}L{}", i + 1),
            f.root.join(format!("w/L{i}")),
        )
        .expect("link");
    }
    symlink(&down_and_up, f.root.join("w/L40")).expect("last link");
    let s = f.session(RunMode::Apply);
    let loaded = load_guest(
        nodeward::built::TEST_GUEST_PROBE_COMPONENT,
        "probe",
        "probe",
    );
    let deadline = Duration::from_secs(2);
    let mut c = ctx(&s, "probe", grants("[fs]\nread = [\"w\"]\n"));
    c.deadline = Instant::now() + deadline;
    let started = Instant::now();
    let result = runtime().run(
        &loaded,
        c,
        &json!([{"op": "fs.stat", "path": "w/L1/x"}]).to_string(),
        Limits {
            deadline,
            ..Limits::default()
        },
    );
    let took = started.elapsed();
    eprintln!("one fs.stat through 40 links: {took:?} ({result:?})");
    // Generous slack: the point is an order of magnitude, not a tight bound.
    assert!(
        took < deadline + Duration::from_secs(3),
        "one host call ran {took:?} against a {deadline:?} deadline"
    );
}

// ---------------------------------------------------------------------------------------------
// Secrets
// ---------------------------------------------------------------------------------------------

/// A root with `etc/kubernetes/` and the configure phase's grants (narrowed to what matters).
fn secret_grants() -> Grants {
    grants(
        "[fs]\nwrite = [\"etc/kubernetes/bootstrap-kubelet.conf\", \"etc/kubernetes/pub\"]\n\
         [secrets]\nbootstrap-token = [\"etc/kubernetes/bootstrap-kubelet.conf\"]\n",
    )
}

const REF: &str = "nodeward-secret:bootstrap-token";

/// Held: the oracles a phase with the secret grant has (outcome of guesses, read-back, stat,
/// planting links to the secret file, writing the reference elsewhere) tell it nothing beyond
/// the token's length; the token never reaches a guest, the change list or a second file. A
/// guess written over the file is answered `changed`, right or wrong (issue 26; more ways in
/// `tests/secret_guesses.rs`). Read back, a right guess comes back as the reference: masking by
/// value cannot hide from a phase what it guessed (`host/secrets.rs`, ~2^82 tries for the
/// 16-character `[a-z0-9]` secret half).
#[test]
fn secret_oracles_give_away_nothing_but_the_length() {
    for mode in [RunMode::Apply, RunMode::Plan] {
        let f = Fixture::new();
        std::fs::create_dir_all(f.root.join("etc/kubernetes")).expect("dir");
        let s = f.session(mode);
        let conf = "etc/kubernetes/bootstrap-kubelet.conf";
        let r = probe(
            &s,
            secret_grants(),
            json!([
                {"op": "fs.write-file", "path": conf, "contents": REF, "mode": 0o600},
                {"op": "fs.read-file", "path": conf},
                {"op": "fs.stat", "path": conf},
                // A prefix guess: only a whole-value equality is ever observable.
                {"op": "fs.write-file", "path": conf, "contents": "abcdef.0", "mode": 0o600},
                {"op": "fs.write-file", "path": conf, "contents": REF, "mode": 0o600},
                // Loosen the mode with the reference: refused.
                {"op": "fs.write-file", "path": conf, "contents": REF, "mode": 0o644},
                // The reference into a file the secret grant does not name: refused.
                {"op": "fs.write-file", "path": "etc/kubernetes/pub", "contents": REF, "mode": 0o600},
                // A link to the secret file, then a read through it: masked.
                {"op": "fs.symlink", "target": "bootstrap-kubelet.conf", "path": "etc/kubernetes/pub"},
                {"op": "fs.read-file", "path": "etc/kubernetes/pub"},
                // Writing through that link would write the link's path (refused, a link is
                // in the way) and never move the value.
                {"op": "fs.write-file", "path": "etc/kubernetes/pub", "contents": REF, "mode": 0o600},
                // The right guess over the file that holds it: answered as a wrong one.
                {"op": "fs.write-file", "path": conf, "contents": TOKEN, "mode": 0o600},
            ]),
        );
        let text = serde_json::to_string(&r).expect("json");
        assert!(!text.contains(TOKEN_SECRET), "{mode:?}: {text}");
        assert_eq!(ok(&r[1]), REF, "{mode:?}");
        assert_eq!(
            ok(&r[2])["size"],
            json!(TOKEN.len()),
            "{mode:?}: the length is visible"
        );
        assert_eq!(ok(&r[3]), "changed");
        assert_eq!(ok(&r[4]), "changed");
        assert_eq!(err_kind(&r[5]), "invalid-argument", "{mode:?}: {r:?}");
        assert_eq!(err_kind(&r[6]), "denied", "{mode:?}: {r:?}");
        assert_eq!(ok(&r[8]), REF, "{mode:?}");
        assert_eq!(err_kind(&r[9]), "denied", "{mode:?}: {r:?}");
        assert_eq!(
            ok(&r[10]),
            "changed",
            "{mode:?}: a right guess is no `unchanged`"
        );
        let changes = serde_json::to_string(
            &s.changes()
                .iter()
                .map(|c| c.kind.describe())
                .collect::<Vec<_>>(),
        )
        .expect("json");
        assert!(!changes.contains(TOKEN_SECRET), "{mode:?}: {changes}");
        for rec in s.audit.records() {
            let t = format!("{rec:?}");
            assert!(!t.contains(TOKEN_SECRET), "{mode:?}: {t}");
        }
        if mode == RunMode::Apply {
            let on_disk = std::fs::read_to_string(f.root.join(conf)).expect("conf");
            assert_eq!(on_disk, TOKEN);
            let m = std::fs::metadata(f.root.join(conf)).expect("meta");
            assert_eq!(m.permissions().mode() & 0o777, 0o600);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Deep trees
// ---------------------------------------------------------------------------------------------

/// Makes `depth` nested directories `d/d/…` beneath `dir` without ever holding a long path.
fn deep_tree(dir: &Path, depth: usize) {
    use rustix::fs::{Mode, OFlags, mkdirat, openat};
    let mut fd = openat(
        rustix::fs::CWD,
        dir,
        OFlags::RDONLY | OFlags::DIRECTORY,
        Mode::empty(),
    )
    .expect("open");
    for _ in 0..depth {
        mkdirat(&fd, "d", Mode::from_raw_mode(0o755)).expect("mkdir");
        fd = openat(&fd, "d", OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()).expect("open d");
    }
}

/// `fs.remove-all` used to recurse once per directory level on the agent's native stack: a
/// tree 100,000 levels deep planted in a granted directory (a workload can make one in an
/// `emptyDir` the teardown phase removes) crashed the agent. The walk now keeps its own stack,
/// stops past 512 levels with `io` naming where, and removes a tree within the bound whole.
#[test]
fn remove_all_of_a_deep_planted_tree_is_bounded_not_a_crash() {
    let f = Fixture::new();
    std::fs::create_dir_all(f.root.join("w/ok")).expect("w/ok");
    std::fs::create_dir_all(f.root.join("w/deep")).expect("w/deep");
    deep_tree(&f.root.join("w/ok"), 300);
    deep_tree(&f.root.join("w/deep"), 600);
    let r = probe(
        &f.session(RunMode::Apply),
        grants("[fs]\nwrite = [\"w\"]\n"),
        json!([
            {"op": "fs.remove-all", "path": "w/ok"},
            {"op": "fs.remove-all", "path": "w/deep"},
        ]),
    );
    assert_eq!(ok(&r[0]), "removed", "{r:?}");
    assert!(!f.root.join("w/ok").exists());
    assert_eq!(kind(&r[1]), "io", "{r:?}");
    let m = r[1]
        .pointer("/err/message")
        .and_then(Value::as_str)
        .unwrap_or_default();
    assert!(m.contains("deeper than 512 levels"), "{m}");
    // What is left is the part below the bound; `rm` (not std's recursive remove) cleans it.
    let _ = std::process::Command::new("rm")
        .arg("-rf")
        .arg(f.root.join("w/deep"))
        .status();
}
