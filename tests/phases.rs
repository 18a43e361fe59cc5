//! One test per shipped phase (the build's `foreach_phase!` fails this file's compilation when
//! a phase has no test), each running the real component against a temporary root and checking
//! what it wrote.

mod common;

use common::*;
use nodeward::bundle::Bundle;
use nodeward::plan::RunMode;
use nodeward::runtime::Limits;
use nodeward::session;
use nodeward_node_config::input::PhaseInput;
use std::os::unix::fs::PermissionsExt;

macro_rules! assert_test_exists {
    ($name:ident) => {
        #[allow(unused_imports)]
        use self::$name as _;
    };
}
nodeward::foreach_phase!(assert_test_exists);

fn apply(f: &Fixture, phases: &[&str]) -> std::sync::Arc<nodeward::session::Session> {
    let bundle = Bundle::embedded().expect("bundle");
    let config = nodeward::config::load(None).expect("config");
    let s = f.session(RunMode::Apply);
    let only: Vec<String> = phases.iter().map(|p| p.to_string()).collect();
    session::run(
        runtime(),
        &bundle,
        &s,
        &PhaseInput::new(config),
        &only,
        Limits::default(),
        |_| {},
    )
    .expect("phases run");
    s
}

fn read(f: &Fixture, rel: &str) -> String {
    std::fs::read_to_string(f.root.join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

#[test]
fn setup_host() {
    let f = Fixture::new();
    f.put(
        "proc/swaps",
        "Filename\tType\tSize\tUsed\tPriority\n/swapfile file 1024 0 -2\n",
    );
    let s = apply(&f, &["setup-host"]);
    for dir in [
        "etc/containerd",
        "etc/cni/net.d",
        "opt/cni/bin",
        "etc/kubernetes/pki",
        "var/lib/kubelet",
        "opt/nodeward/node",
    ] {
        assert!(f.root.join(dir).is_dir(), "{dir}");
    }
    let sysctl = read(&f, "etc/sysctl.d/99-nodeward.conf");
    assert!(
        sysctl.contains("net.ipv4.ip_forward = 1")
            && sysctl.contains("net.bridge.bridge-nf-call-iptables = 1")
    );
    assert_eq!(
        read(&f, "etc/modules-load.d/nodeward.conf")
            .lines()
            .filter(|l| !l.starts_with('#'))
            .collect::<Vec<_>>(),
        ["overlay", "br_netfilter"]
    );
    assert_eq!(read(&f, "proc/sys/net/ipv4/ip_forward"), "1\n");
    assert!(read(&f, "proc/modules").starts_with("overlay "));
    assert_eq!(read(&f, "proc/swaps").lines().count(), 1, "swap turned off");
    let calls: Vec<String> = s.audit.records().iter().map(|r| r.call.clone()).collect();
    assert!(
        calls.contains(&"kernel.swap-off".to_string())
            && calls.contains(&"kernel.load-module".to_string())
    );
    assert!(
        s.audit.records().iter().all(|r| !r.denied),
        "setup-host stays within its grants"
    );
}

#[test]
fn configure() {
    let f = Fixture::new();
    let s = apply(&f, &["setup-host", "configure"]);
    let containerd: toml::Table = read(&f, "etc/containerd/config.toml")
        .parse()
        .expect("containerd config is TOML");
    assert_eq!(containerd["version"].as_integer(), Some(3));
    let kubelet: serde_json::Value =
        serde_yaml_ng::from_str(&read(&f, "var/lib/kubelet/config.yaml"))
            .expect("kubelet config is YAML");
    assert_eq!(kubelet["kind"], "KubeletConfiguration");
    assert_eq!(kubelet["cgroupDriver"], "systemd");
    assert_eq!(kubelet["clusterDNS"][0], "10.96.0.10");
    let dropin = read(&f, "etc/systemd/system/kubelet.service.d/10-nodeward.conf");
    assert!(
        dropin.contains("--node-labels=topology.kubernetes.io/zone=edge-1"),
        "{dropin}"
    );
    assert!(dropin.contains("--hostname-override=worker-01"), "{dropin}");
    assert!(
        !dropin.contains("--register-with-taints"),
        "no taints configured: {dropin}"
    );
    let cni: serde_json::Value =
        serde_json::from_str(&read(&f, "etc/cni/net.d/10-nodeward-bridge.conflist"))
            .expect("CNI JSON");
    assert_eq!(
        cni["plugins"][0]["ipam"]["ranges"][0][0]["subnet"],
        "10.244.0.0/24"
    );
    let kubeconfig = f.root.join("etc/kubernetes/bootstrap-kubelet.conf");
    let kc: serde_json::Value =
        serde_yaml_ng::from_str(&read(&f, "etc/kubernetes/bootstrap-kubelet.conf"))
            .expect("kubeconfig YAML");
    assert_eq!(
        kc["clusters"][0]["cluster"]["server"],
        "https://10.0.0.1:6443"
    );
    assert_eq!(kc["users"][0]["user"]["token"], TOKEN);
    assert_eq!(
        std::fs::metadata(kubeconfig)
            .expect("meta")
            .permissions()
            .mode()
            & 0o777,
        0o600
    );
    assert!(read(&f, "etc/kubernetes/pki/ca.crt").starts_with("-----BEGIN CERTIFICATE-----"));
    assert!(
        s.audit.records().iter().all(|r| !r.denied),
        "configure stays within its grants"
    );
}

#[test]
fn configure_alone_on_a_bare_root_fails_naming_the_missing_directory() {
    let f = Fixture::new();
    let bundle = Bundle::embedded().expect("bundle");
    let config = nodeward::config::load(None).expect("config");
    let s = f.session(RunMode::Apply);
    let err = session::run(
        runtime(),
        &bundle,
        &s,
        &PhaseInput::new(config),
        &["configure".into()],
        Limits::default(),
        |_| {},
    )
    .expect_err("parents are missing");
    let msg = err.to_string();
    assert!(
        msg.contains("phase configure failed") && msg.contains("setup-host"),
        "{msg}"
    );
}
