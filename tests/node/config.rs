//! The NodeConfig YAML of a test node, for the real cluster or the stub setup.
//!
//! [`ClusterInfo`] says what the node joins ([`ClusterInfo::of_cluster`] or
//! [`ClusterInfo::of_stub`]), [`NodeOptions`] what varies per node (name, bridge, pod CIDR,
//! ports: fresh values so runs do not collide), and [`node_config`] writes the YAML, tuned as
//! `scripts/kube-node-start.sh` tunes a node for these shared VMs.

use super::api_server::{StubApiServer, StubNode};
use super::artifacts::{CNI_PLUGINS_VERSION, CONTAINERD_VERSION, RUNC_VERSION, Served};
use super::host::run;
use crate::cluster::Cluster;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The cluster a node joins, whichever kind.
#[derive(Clone, Debug)]
pub struct ClusterInfo {
    /// `https://host:port`.
    pub api_server: String,
    pub ca_pem: String,
    /// `<id>.<secret>`.
    pub bootstrap_token: String,
    /// Without the leading `v`.
    pub kube_version: String,
    /// The sandbox image, when the cluster has a local one.
    pub sandbox_image: Option<String>,
}

/// A bootstrap token for the stub setup (the stub API server accepts anything).
pub const STUB_TOKEN: &str = "stubid.0123456789abcdef";

impl ClusterInfo {
    /// The real cluster of `tests/cluster/mod.rs`.
    pub fn of_cluster(c: &Cluster) -> ClusterInfo {
        ClusterInfo {
            api_server: c.api_url.clone(),
            ca_pem: std::fs::read_to_string(&c.ca_cert).expect("cluster CA"),
            bootstrap_token: c.bootstrap_token.token(),
            kube_version: c.kube_version.trim_start_matches('v').to_string(),
            sandbox_image: Some(c.pause_image.clone()),
        }
    }

    /// The stub setup: [`StubApiServer`], the kubelet version `version` (without `v`).
    pub fn of_stub(api: &StubApiServer, version: &str) -> ClusterInfo {
        ClusterInfo {
            api_server: api.url(),
            ca_pem: api.ca_pem(),
            bootstrap_token: STUB_TOKEN.into(),
            kube_version: version.trim_start_matches('v').to_string(),
            sandbox_image: None,
        }
    }
}

/// What varies per node; [`NodeOptions::new`] picks fresh values.
#[derive(Clone, Debug)]
pub struct NodeOptions {
    pub machine_name: String,
    pub labels: BTreeMap<String, String>,
    /// `(key, value, effect)`.
    pub taints: Vec<(String, String, String)>,
    /// `nwbr<6 hex>`.
    pub bridge: String,
    /// A /24 out of 10.200.0.0/13 not routed on this machine.
    pub pod_cidr: String,
    /// This machine's primary IPv4 (the kubelet refuses a loopback node IP).
    pub node_ip: String,
    pub kubelet_port: u16,
    pub healthz_port: u16,
    /// The host root the node lives in (for paths the kubelet would otherwise create on the
    /// shared host, e.g. `volumePluginDir`).
    pub root: PathBuf,
}

/// The label every test node gets (`node.nodeward.io/test: "true"`) and its taint
/// (`node.nodeward.io/test=true:NoSchedule`), for the tests to assert.
pub const TEST_LABEL: (&str, &str) = ("node.nodeward.io/test", "true");
pub const TEST_TAINT: (&str, &str, &str) = ("node.nodeward.io/test", "true", "NoSchedule");

impl NodeOptions {
    pub fn new(root: &Path, machine_name: &str) -> NodeOptions {
        let kubelet_port = free_port();
        let mut healthz_port = free_port();
        while healthz_port == kubelet_port {
            healthz_port = free_port();
        }
        NodeOptions {
            machine_name: machine_name.to_string(),
            labels: BTreeMap::from([(TEST_LABEL.0.to_string(), TEST_LABEL.1.to_string())]),
            taints: vec![(
                TEST_TAINT.0.to_string(),
                TEST_TAINT.1.to_string(),
                TEST_TAINT.2.to_string(),
            )],
            bridge: format!("nwbr{:06x}", fastrand::u32(..1 << 24)),
            pod_cidr: free_pod_cidr(),
            node_ip: node_ip(),
            kubelet_port,
            healthz_port,
            root: root.to_path_buf(),
        }
    }

    /// The stub Node that matches these options (for [`StubApiServer::set_node`]).
    pub fn stub_node(&self, version: &str) -> StubNode {
        StubNode {
            labels: self.labels.clone(),
            taints: self
                .taints
                .iter()
                .map(|(k, v, e)| json!({"key": k, "value": v, "effect": e}))
                .collect(),
            ready: true,
            kubelet_version: version.trim_start_matches('v').to_string(),
        }
    }
}

/// A port free on 127.0.0.1 and on this machine's address right now (the kubelet binds it
/// later; another process could take it in between, which then fails the start loudly).
pub fn free_port() -> u16 {
    loop {
        let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind 127.0.0.1:0");
        let port = l.local_addr().expect("addr").port();
        let ip: Ipv4Addr = node_ip().parse().expect("node ip");
        if TcpListener::bind((ip, port)).is_ok() {
            return port;
        }
    }
}

/// This machine's primary IPv4 (`ip route get`'s `src`), as `scripts/kube-node-start.sh`.
pub fn node_ip() -> String {
    static IP: OnceLock<String> = OnceLock::new();
    IP.get_or_init(|| {
        let out = run("ip", &["-4", "-o", "route", "get", "1.1.1.1"]);
        let text = String::from_utf8_lossy(&out.stdout);
        let src = text
            .split_whitespace()
            .skip_while(|w| *w != "src")
            .nth(1)
            .map(str::to_string);
        src.or_else(|| {
            let out = run("ip", &["-4", "-o", "addr", "show", "scope", "global"]);
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .next()
                .and_then(|l| l.split_whitespace().nth(3))
                .and_then(|a| a.split('/').next())
                .map(str::to_string)
        })
        .expect("a global IPv4 address on this machine for the node IP")
    })
    .clone()
}

/// A /24 out of 10.200.0.0/13 that no route or address of this machine uses.
pub fn free_pod_cidr() -> String {
    let routes = format!(
        "{}\n{}",
        String::from_utf8_lossy(&run("ip", &["-4", "route", "show"]).stdout),
        String::from_utf8_lossy(&run("ip", &["-4", "addr", "show"]).stdout)
    );
    loop {
        let net = format!("10.{}.{}", 200 + fastrand::u8(..8), fastrand::u8(..));
        let used = routes.lines().any(|l| {
            l.trim_start().starts_with(&format!("{net}.")) || l.contains(&format!(" {net}."))
        });
        if !used {
            return format!("{net}.0/24");
        }
    }
}

/// A NodeConfig YAML joining `cluster` with the `artifacts`, tuned as
/// `scripts/kube-node-start.sh` tunes its kubelet for these shared VMs (no swap check, eviction
/// and image GC thresholds for a full disk, no iptables chains, healthz on 127.0.0.1, the
/// kubelet API on the node IP with webhook auth off) and containerd (`restrict_oom_score_adj`,
/// no SELinux, no snapshotters that probe the host).
pub fn node_config(cluster: &ClusterInfo, artifacts: &Served, opts: &NodeOptions) -> String {
    use base64::Engine as _;
    let downloads: serde_json::Map<String, Value> = artifacts
        .entries()
        .iter()
        .map(|(name, d)| (name.to_string(), json!({"url": d.url, "sha256": d.sha256})))
        .collect();
    let mut components = json!({
        "containerd": CONTAINERD_VERSION,
        "runc": RUNC_VERSION,
        "cniPlugins": CNI_PLUGINS_VERSION,
    });
    if let Some(img) = &cluster.sandbox_image {
        components["sandboxImage"] = json!(img);
    }
    let doc = json!({
        "apiVersion": "nodeward.io/v1alpha1",
        "kind": "NodeConfig",
        "machineName": opts.machine_name,
        "mode": "none",
        "cluster": {
            "apiServer": cluster.api_server,
            "caCertData": base64::engine::general_purpose::STANDARD.encode(&cluster.ca_pem),
            "kubernetesVersion": cluster.kube_version,
        },
        "kubelet": {
            "auth": {"bootstrapToken": cluster.bootstrap_token},
            "labels": opts.labels,
            "registerWithTaints": opts.taints.iter()
                .map(|(k, v, e)| json!({"key": k, "value": v, "effect": e}))
                .collect::<Vec<_>>(),
            "flags": [format!("--node-ip={}", opts.node_ip)],
            "config": {
                "address": opts.node_ip,
                "port": opts.kubelet_port,
                "healthzPort": opts.healthz_port,
                "healthzBindAddress": "127.0.0.1",
                "readOnlyPort": 0,
                "failSwapOn": false,
                "makeIPTablesUtilChains": false,
                "serializeImagePulls": false,
                "volumePluginDir": opts.root.join("var/lib/kubelet/volume-plugins"),
                // The shared disk is fuller than the default eviction thresholds allow.
                "evictionHard": {
                    "memory.available": "50Mi",
                    "nodefs.available": "1%",
                    "imagefs.available": "1%",
                    "nodefs.inodesFree": "1%",
                },
                "imageGCHighThresholdPercent": 100,
                "imageGCLowThresholdPercent": 99,
                "authentication": {
                    "anonymous": {"enabled": false},
                    "webhook": {"enabled": false},
                },
                "authorization": {"mode": "AlwaysAllow"},
            },
        },
        "network": {
            "podCIDR": opts.pod_cidr,
            "bridgeName": opts.bridge,
            "ipMasq": false,
        },
        "components": components,
        "containerd": {
            "config": {
                "disabled_plugins": [
                    "io.containerd.snapshotter.v1.devmapper",
                    "io.containerd.snapshotter.v1.zfs",
                    "io.containerd.snapshotter.v1.btrfs",
                    "io.containerd.snapshotter.v1.aufs",
                ],
                "plugins": {
                    "io.containerd.grpc.v1.cri": {
                        // These VMs lack CAP_SYS_RESOURCE: without it every sandbox fails.
                        "restrict_oom_score_adj": true,
                        "enable_selinux": false,
                    },
                },
            },
        },
        "downloads": downloads,
    });
    serde_yaml_ng::to_string(&doc).expect("config YAML")
}
