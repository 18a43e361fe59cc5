//! Every capability refuses what its grant does not allow, with a typed `denied` error, before
//! touching the host, and writes an audit record marked denied. One refusal per capability
//! verb; the allowed twin of each call proves the refusal comes from the grant (for `network`
//! and `cgroups`, whose allowed calls act on the machine's links and cgroups, the twins are in
//! `tests/caps_network.rs` and `tests/caps_cgroups.rs`).

mod common;

use common::*;
use nodeward::plan::RunMode;
use serde_json::{Value, json};

const SHA: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// Grants that allow exactly the "allowed" calls below.
const GRANTS: &str = r#"
[fs]
write = ["opt/nodeward", "mnt"]
[kernel]
modules = ["overlay"]
sysctls = ["net.ipv4.ip_forward", "net.bridge.*"]
[systemd]
write = ["kubelet.service"]
enable = ["kubelet.service"]
start = ["kube*.service"]
mask = ["kubelet.service"]
status = ["kubelet.service"]
[mounts]
targets = ["mnt/pods"]
[download]
urls = ["https://dl.k8s.io/release/"]
[network]
bridges = ["cni0"]
[cgroups]
remove = ["kubepods"]
"#;

fn calls_denied() -> Value {
    json!([
        {"op": "kernel.load-module", "name": "br_netfilter"},
        {"op": "kernel.set-sysctl", "key": "net.ipv4.conf.all.forwarding", "value": "1"},
        {"op": "kernel.get-sysctl", "key": "kernel.panic"},
        {"op": "kernel.swap-off"},
        {"op": "systemd.write-unit", "unit": "containerd.service", "contents": "[Unit]\n"},
        {"op": "systemd.write-drop-in", "unit": "containerd.service", "name": "10-x", "contents": "[Unit]\n"},
        {"op": "systemd.remove-unit", "unit": "containerd.service"},
        {"op": "systemd.daemon-reload"},
        {"op": "systemd.enable", "unit": "containerd.service"},
        {"op": "systemd.disable", "unit": "containerd.service"},
        {"op": "systemd.start", "unit": "containerd.service"},
        {"op": "systemd.stop", "unit": "containerd.service"},
        {"op": "systemd.restart", "unit": "containerd.service"},
        {"op": "systemd.reset-failed", "unit": "containerd.service"},
        {"op": "systemd.mask", "unit": "containerd.service"},
        {"op": "systemd.unmask", "unit": "containerd.service"},
        {"op": "systemd.status", "unit": "containerd.service"},
        {"op": "mounts.bind", "source": "opt/nodeward", "target": "mnt/other", "read-only": true},
        {"op": "mounts.tmpfs", "target": "mnt/other", "size-bytes": 1024},
        {"op": "mounts.overlay", "lower": ["opt/nodeward"], "upper": "mnt/u", "work": "mnt/w", "target": "mnt/other"},
        {"op": "mounts.unmount", "target": "mnt/other", "lazy": false},
        {"op": "mounts.is-mounted", "target": "mnt/other"},
        {"op": "mounts.bind", "source": "etc", "target": "mnt/pods", "read-only": true},
        {"op": "download.fetch", "url": "https://evil.example/kubelet", "sha256": SHA, "dest": "opt/nodeward/kubelet", "mode": 0o755},
        {"op": "download.fetch", "url": "https://dl.k8s.io.evil.example/release/kubelet", "sha256": SHA, "dest": "opt/nodeward/kubelet", "mode": 0o755},
        {"op": "download.fetch", "url": "https://dl.k8s.io/release/kubelet", "sha256": SHA, "dest": "usr/bin/kubelet", "mode": 0o755},
        {"op": "download.fetch-and-extract", "url": "https://evil.example/cni.tgz", "sha256": SHA, "dest-dir": "opt/nodeward", "strip-components": 0},
        {"op": "network.delete-bridge", "name": "cni1"},
        {"op": "network.delete-bridge", "name": "cni"},
        {"op": "cgroups.remove-empty", "path": "kubepods2"},
        {"op": "cgroups.remove-empty", "path": "system.slice"},
    ])
}

#[test]
fn every_ungranted_call_is_denied_and_audited() {
    let f = Fixture::new();
    let before = snapshot(&f.root);
    let s = f.session(RunMode::Plan);
    let calls = calls_denied();
    let r = probe(&s, grants(GRANTS), calls.clone());
    for (call, result) in calls.as_array().into_iter().flatten().zip(&r) {
        assert_eq!(kind(result), "denied", "{call} gave {result}");
    }
    let records = s.audit.records();
    assert_eq!(records.len(), r.len(), "one audit record per call");
    for (call, record) in calls.as_array().into_iter().flatten().zip(&records) {
        assert!(record.denied, "{record:?}");
        assert_eq!(record.call, call["op"].as_str().unwrap_or_default());
        assert_eq!(record.phase, "probe");
        assert_eq!(record.bundle, "test-bundle");
    }
    assert!(s.changes().is_empty(), "nothing was planned");
    assert_eq!(snapshot(&f.root), before);
}

#[test]
fn the_granted_twins_are_allowed() {
    let f = Fixture::new();
    std::fs::create_dir_all(f.root.join("etc/systemd/system")).expect("unit dir");
    std::fs::create_dir_all(f.root.join("opt/nodeward")).expect("download destination's parent");
    let s = f.session(RunMode::Plan);
    let r = probe(
        &s,
        grants(GRANTS),
        json!([
            {"op": "kernel.load-module", "name": "overlay"},
            {"op": "kernel.set-sysctl", "key": "net.ipv4.ip_forward", "value": "1"},
            {"op": "kernel.set-sysctl", "key": "net.bridge.bridge-nf-call-iptables", "value": "1"},
            {"op": "systemd.write-unit", "unit": "kubelet.service", "contents": "[Unit]\n"},
            {"op": "systemd.enable", "unit": "kubelet.service"},
            {"op": "systemd.start", "unit": "kube-proxy.service"},
            {"op": "systemd.mask", "unit": "kubelet.service"},
            {"op": "download.fetch", "url": "https://dl.k8s.io/release/v1.34.1/bin/linux/amd64/kubelet", "sha256": SHA, "dest": "opt/nodeward/kubelet", "mode": 0o755},
        ]),
    );
    let kinds: Vec<String> = r.iter().map(kind).collect();
    assert_eq!(kinds, ["ok"; 8], "{r:?}");
    let planned: Vec<String> = s
        .changes()
        .iter()
        .map(|c| {
            serde_json::to_value(c).expect("json")["kind"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect();
    assert_eq!(
        planned,
        [
            "module-load",
            "sysctl",
            "sysctl",
            "file-create",
            "unit-write",
            "unit-enable",
            "unit-start",
            "unit-mask",
            "download"
        ]
    );
}

#[test]
fn an_empty_grant_allows_nothing_but_log() {
    let f = Fixture::new();
    f.put("etc/hostname", "worker-01\n");
    let s = f.session(RunMode::Apply);
    let r = probe(
        &s,
        nodeward::grants::Grants::default(),
        json!([
            {"op": "fs.read-file", "path": "etc/hostname"},
            {"op": "kernel.load-module", "name": "overlay"},
            {"op": "systemd.daemon-reload"},
            {"op": "log", "message": "hello"},
        ]),
    );
    assert_eq!(
        r.iter().map(kind).collect::<Vec<_>>(),
        ["denied", "denied", "denied", "ok"]
    );
}
