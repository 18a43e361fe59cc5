//! The `teardown` phase (`reset`): removes the node, keeps the agent's state and files it did
//! not write, works on a half-bootstrapped root, and is idempotent.

use super::*;

/// A root as bootstrap leaves it (minus what needs systemd), plus runtime state.
fn bootstrapped(f: &Fixture) -> PhaseInput {
    let input = input(f);
    let s = f.session(RunMode::Apply);
    put_version(f, VERSION, true);
    put_version(f, "1.33.0-old", true);
    for p in ["setup-host", "install", "configure"] {
        phase(&s, p, &input).unwrap_or_else(|e| panic!("{p}: {e}"));
    }
    f.put(
        "var/lib/kubelet/pods/uid/volumes/kubernetes.io~empty-dir/cache/x",
        "pod data",
    );
    f.put("var/lib/kubelet/pki/kubelet-client-current.pem", "cert");
    f.put(
        "var/lib/containerd/io.containerd.content.v1.content/blobs/x",
        "blob",
    );
    f.put("run/containerd/containerd.sock.ttrpc", "");
    f.put("var/lib/cni/networks/nodeward/10.244.0.2", "lease");
    f.put("etc/systemd/system/nodeward-kubelet.service", "[Service]\n");
    f.put("var/lib/nodeward/node/install.json", "{}");
    input
}

const GONE: &[&str] = &[
    "etc/containerd",
    "etc/kubernetes",
    "etc/cni/net.d",
    "etc/modules-load.d/nodeward.conf",
    "etc/sysctl.d/99-nodeward.conf",
    "opt/cni",
    "opt/nodeward/node",
    "var/lib/kubelet",
    "var/lib/containerd",
    "run/containerd",
    "var/lib/cni",
    "etc/systemd/system/nodeward-kubelet.service",
];

#[test]
fn removes_the_node_keeps_agent_state_and_is_idempotent() {
    let f = Fixture::new();
    let mut input = bootstrapped(&f);
    input.mounts = vec!["var/lib/kubelet/pods/uid/volumes/kubernetes.io~empty-dir/cache".into()];
    let outside = snapshot(&f.outside);
    let s = f.session(RunMode::Apply);
    let out = phase(&s, "teardown", &input).expect("teardown");
    assert_eq!(out.report.changed, ["node-removed"]);
    no_denials(&s, "teardown");
    for p in GONE {
        assert!(
            std::fs::symlink_metadata(f.root.join(p)).is_err(),
            "{p} is left: {:?}",
            snapshot(&f.root).keys().collect::<Vec<_>>()
        );
    }
    assert_eq!(read(&f, "var/lib/nodeward/node/install.json"), "{}");
    assert!(f.root.join("etc/systemd/system").is_dir());
    assert_eq!(snapshot(&f.outside), outside);

    let after = snapshot(&f.root);
    let s = f.session(RunMode::Apply);
    let again = phase(&s, "teardown", &input).expect("teardown again");
    assert!(again.report.changed.is_empty(), "{:?}", again.report);
    assert_eq!(snapshot(&f.root), after);
}

#[test]
fn keeps_files_it_did_not_write_and_works_half_bootstrapped() {
    let f = Fixture::new();
    let input = input(&f);
    let s = f.session(RunMode::Apply);
    phase(&s, "setup-host", &input).expect("setup-host");
    f.put("etc/kubernetes/manifests/etcd.yaml", "kind: Pod\n");
    f.put("etc/cni/net.d/99-other.conflist", "{}");
    phase(&s, "teardown", &input).expect("teardown");
    assert_eq!(
        read(&f, "etc/kubernetes/manifests/etcd.yaml"),
        "kind: Pod\n"
    );
    assert_eq!(read(&f, "etc/cni/net.d/99-other.conflist"), "{}");
    assert!(!f.root.join("etc/kubernetes/pki").exists());
    assert!(!f.root.join("etc/containerd").exists());
    assert!(!f.root.join("var/lib/kubelet").exists());
    f.put("var/lib/nodeward/node/install-record.json", "{}");
    phase(&s, "teardown", &input).expect("teardown again");
    assert_eq!(
        read(&f, "var/lib/nodeward/node/install-record.json"),
        "{}",
        "the agent's state is the host's to remove, never a phase's"
    );
}

#[test]
fn plan_mode_records_and_touches_nothing() {
    let f = Fixture::new();
    let input = bootstrapped(&f);
    let before = snapshot(&f.root);
    let s = f.session(RunMode::Plan);
    phase(&s, "teardown", &input).expect("plan");
    assert_eq!(snapshot(&f.root), before);
    let removed: Vec<String> = changes_json(&s)
        .iter()
        .filter(|c| c["kind"] == "remove")
        .map(|c| c["path"].as_str().unwrap_or("").to_string())
        .collect();
    for p in [
        "opt/nodeward/node",
        "var/lib/kubelet",
        "etc/kubernetes/pki/ca.crt",
        "opt/cni/bin",
        "opt/cni",
        "etc/kubernetes",
    ] {
        assert!(
            removed.iter().any(|r| r == p),
            "{p} not planned: {removed:?}"
        );
    }
    assert!(!removed.iter().any(|r| r.starts_with("var/lib/nodeward")));
}
