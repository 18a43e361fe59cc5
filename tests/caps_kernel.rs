//! `kernel` capability through the probe guest, against a temp root: there the capability acts
//! on the root's `proc/sys/...`, `proc/modules` and `proc/swaps` files, so nothing touches the
//! running kernel.

mod common;

use common::{Probe, err_kind, ok, snapshot};
use nodeward::grants::{Grants, KernelGrant};
use nodeward::plan::{ChangeKind, RunMode};
use serde_json::json;
use std::path::Path;

const SWAPS: &str = "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n\
                     /swapfile                               file\t\t1048572\t\t0\t\t-2\n";
const SWAPS_HEADER: &str = "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n";

fn grants() -> Grants {
    Grants {
        kernel: KernelGrant {
            modules: vec!["br_netfilter".into(), "overlay".into()],
            sysctls: vec!["net.ipv4.ip_forward".into(), "net.bridge.*".into()],
            swap_off: true,
        },
        ..Grants::default()
    }
}

/// A temp root with the kernel files a node has.
fn root() -> tempfile::TempDir {
    let tmp = tempfile::tempdir().expect("tempdir");
    let r = tmp.path();
    std::fs::create_dir_all(r.join("proc/sys/net/ipv4")).expect("mkdir");
    std::fs::write(r.join("proc/sys/net/ipv4/ip_forward"), "0\n").expect("write");
    std::fs::write(r.join("proc/modules"), "ext4 1 0 - Live 0x0\n").expect("write");
    std::fs::write(r.join("proc/swaps"), SWAPS).expect("write");
    tmp
}

fn read(root: &Path, p: &str) -> String {
    std::fs::read_to_string(root.join(p)).expect("read")
}

fn denied_audited(probe: &Probe, call: &str) {
    assert!(
        probe
            .audit()
            .iter()
            .any(|r| r.call == call && r.denied && r.outcome.starts_with("denied")),
        "{call} denial must be audited: {:?}",
        probe.audit()
    );
}

#[test]
fn set_sysctl_writes_the_root_file_once() {
    let tmp = root();
    let probe = Probe::new(tmp.path(), RunMode::Apply);
    let call = json!({"op": "kernel.set-sysctl", "key": "net.ipv4.ip_forward", "value": "1"});
    assert_eq!(ok(&probe.call(&grants(), call.clone())), "changed");
    assert_eq!(read(tmp.path(), "proc/sys/net/ipv4/ip_forward"), "1\n");
    assert_eq!(ok(&probe.call(&grants(), call)), "unchanged");
    let get = json!({"op": "kernel.get-sysctl", "key": "net.ipv4.ip_forward"});
    assert_eq!(ok(&probe.call(&grants(), get)), "1");
    // A prefix grant covers a key that does not exist yet beneath a non-system root.
    let bridge = json!({"op": "kernel.set-sysctl",
                        "key": "net.bridge.bridge-nf-call-iptables", "value": "1"});
    assert_eq!(ok(&probe.call(&grants(), bridge)), "created");
    assert_eq!(
        read(tmp.path(), "proc/sys/net/bridge/bridge-nf-call-iptables"),
        "1\n"
    );
    let sysctls: Vec<_> = probe
        .changes()
        .into_iter()
        .filter(|c| matches!(c.kind, ChangeKind::Sysctl { .. }))
        .collect();
    assert_eq!(sysctls.len(), 2, "the unchanged call records nothing");
}

#[test]
fn sysctl_outside_the_grant_is_denied_and_audited() {
    let tmp = root();
    let before = snapshot(tmp.path());
    let probe = Probe::new(tmp.path(), RunMode::Apply);
    let r = probe.call(
        &grants(),
        json!({"op": "kernel.set-sysctl", "key": "kernel.panic", "value": "1"}),
    );
    assert_eq!(err_kind(&r), "denied");
    let r = probe.call(
        &grants(),
        json!({"op": "kernel.get-sysctl", "key": "net.ipv4.conf.all.forwarding"}),
    );
    assert_eq!(err_kind(&r), "denied");
    denied_audited(&probe, "kernel.set-sysctl");
    denied_audited(&probe, "kernel.get-sysctl");
    assert!(probe.changes().is_empty());
    assert_eq!(snapshot(tmp.path()), before);
}

#[test]
fn malformed_sysctl_keys_are_invalid() {
    let tmp = root();
    let before = snapshot(tmp.path());
    let probe = Probe::new(tmp.path(), RunMode::Apply);
    let mut g = grants();
    g.kernel.sysctls.push("*".into());
    for key in [
        "net/../x",
        "a..b",
        "net.ipv4/ip_forward",
        "",
        ".net",
        "net.",
    ] {
        let r = probe.call(
            &g,
            json!({"op": "kernel.set-sysctl", "key": key, "value": "1"}),
        );
        assert_eq!(err_kind(&r), "invalid-argument", "key {key:?}: {r}");
    }
    let r = probe.call(
        &g,
        json!({"op": "kernel.set-sysctl", "key": "net.ipv4.ip_forward", "value": "1\nx"}),
    );
    assert_eq!(err_kind(&r), "invalid-argument", "newline in value");
    assert_eq!(snapshot(tmp.path()), before);
}

#[test]
fn load_module_records_it_once() {
    let tmp = root();
    let probe = Probe::new(tmp.path(), RunMode::Apply);
    let call = json!({"op": "kernel.load-module", "name": "br_netfilter"});
    assert_eq!(ok(&probe.call(&grants(), call.clone())), "created");
    let modules = read(tmp.path(), "proc/modules");
    assert!(modules.starts_with("ext4 "), "{modules}");
    assert!(
        modules
            .lines()
            .any(|l| l.split_whitespace().next() == Some("br_netfilter")),
        "{modules}"
    );
    assert_eq!(ok(&probe.call(&grants(), call)), "unchanged");
    // Built in: /sys/module/<name> exists.
    std::fs::create_dir_all(tmp.path().join("sys/module/overlay")).expect("mkdir");
    let overlay = json!({"op": "kernel.load-module", "name": "overlay"});
    assert_eq!(ok(&probe.call(&grants(), overlay)), "unchanged");
    assert_eq!(
        probe.changes().len(),
        1,
        "only the first load is a change: {:?}",
        probe.changes()
    );
}

#[test]
fn load_module_outside_the_grant_or_malformed_is_refused() {
    let tmp = root();
    let before = snapshot(tmp.path());
    let probe = Probe::new(tmp.path(), RunMode::Apply);
    let r = probe.call(
        &grants(),
        json!({"op": "kernel.load-module", "name": "nbd"}),
    );
    assert_eq!(err_kind(&r), "denied");
    denied_audited(&probe, "kernel.load-module");
    for name in ["../overlay", "a/b", "", "over lay", "-r"] {
        let r = probe.call(&grants(), json!({"op": "kernel.load-module", "name": name}));
        let kind = err_kind(&r);
        assert!(
            kind == "invalid-argument" || (name == "-r" && kind == "denied"),
            "module {name:?}: {r}"
        );
    }
    assert!(probe.changes().is_empty());
    assert_eq!(snapshot(tmp.path()), before);
}

#[test]
fn swap_off_resets_the_swaps_file_once() {
    let tmp = root();
    let probe = Probe::new(tmp.path(), RunMode::Apply);
    let call = json!({"op": "kernel.swap-off"});
    assert_eq!(ok(&probe.call(&grants(), call.clone())), "changed");
    assert_eq!(read(tmp.path(), "proc/swaps"), SWAPS_HEADER);
    assert_eq!(ok(&probe.call(&grants(), call)), "unchanged");
    let changes = probe.changes();
    assert_eq!(changes.len(), 1);
    match &changes[0].kind {
        ChangeKind::SwapOff { areas } => assert_eq!(areas, &["/swapfile".to_string()]),
        other => panic!("unexpected change {other:?}"),
    }
}

#[test]
fn swap_off_without_the_grant_is_denied() {
    let tmp = root();
    let probe = Probe::new(tmp.path(), RunMode::Apply);
    let mut g = grants();
    g.kernel.swap_off = false;
    let r = probe.call(&g, json!({"op": "kernel.swap-off"}));
    assert_eq!(err_kind(&r), "denied");
    denied_audited(&probe, "kernel.swap-off");
    assert_eq!(read(tmp.path(), "proc/swaps"), SWAPS);
    assert!(probe.changes().is_empty());
}

#[test]
fn plan_mode_records_changes_and_leaves_the_root_byte_identical() {
    let tmp = root();
    let before = snapshot(tmp.path());
    let probe = Probe::new(tmp.path(), RunMode::Plan);
    let results = probe.run(
        &grants(),
        json!([
            {"op": "kernel.set-sysctl", "key": "net.ipv4.ip_forward", "value": "1"},
            {"op": "kernel.get-sysctl", "key": "net.ipv4.ip_forward"},
            {"op": "kernel.set-sysctl", "key": "net.ipv4.ip_forward", "value": "1"},
            {"op": "kernel.load-module", "name": "br_netfilter"},
            {"op": "kernel.load-module", "name": "br_netfilter"},
            {"op": "kernel.swap-off"},
            {"op": "kernel.swap-off"},
        ]),
    );
    let oks: Vec<_> = results.iter().map(|r| ok(r).clone()).collect();
    assert_eq!(
        oks,
        [
            json!("changed"),
            json!("1"),
            json!("unchanged"),
            json!("created"),
            json!("unchanged"),
            json!("changed"),
            json!("unchanged"),
        ],
        "plan mode sees its own planned state"
    );
    let kinds: Vec<_> = probe.changes().into_iter().map(|c| c.kind).collect();
    assert!(matches!(
        kinds.as_slice(),
        [
            ChangeKind::Sysctl { .. },
            ChangeKind::ModuleLoad { .. },
            ChangeKind::SwapOff { .. }
        ]
    ));
    assert_eq!(snapshot(tmp.path()), before, "plan mode changed the root");
}
