//! Smoke tests of the real-cluster harness (tests/cluster/mod.rs), no nodeward yet: a kubelet
//! configured by hand joins with a bootstrap token and runs a pod from a local image; the
//! control plane starts and stops twice. They run only inside the hybrid systemd harness that
//! `NODEWARD_TEST_CLUSTER=1 scripts/test.sh` starts (README, Testing).

mod cluster;

use cluster::{Cluster, Node, require_cluster_env, serial, wait_for};
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// Mount points in this (the harness's) mount namespace.
fn mount_points() -> BTreeSet<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(str::to_string))
        .collect()
}

/// Processes in this pid namespace that belong to a node or control plane.
fn kube_processes() -> Vec<String> {
    let names = [
        "kubelet",
        "kubelet-upgrade",
        "containerd",
        "containerd-shim",
        "containerd-shim-runc-v2",
        "runc",
        "pause",
        "workload",
        "etcd",
        "kube-apiserver",
        "kube-controller",
    ];
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(comm) = std::fs::read_to_string(format!("/proc/{pid}/comm")) else {
            continue;
        };
        let comm = comm.trim();
        if names.contains(&comm) {
            found.push(format!("{pid} {comm}"));
        }
    }
    found
}

/// kubepods cgroups under the harness's cgroup roots.
fn kubepods_cgroups() -> Vec<String> {
    let mut found = Vec::new();
    for h in std::fs::read_dir("/sys/fs/cgroup").unwrap().flatten() {
        let Ok(entries) = std::fs::read_dir(h.path()) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with("kubepods") {
                found.push(e.path().display().to_string());
            }
        }
    }
    found
}

fn link_exists(name: &str) -> bool {
    Path::new("/sys/class/net").join(name).exists()
}

/// Links enslaved to `bridge` (the pods' veths).
fn bridge_ports(bridge: &str) -> Vec<String> {
    std::fs::read_dir(format!("/sys/class/net/{bridge}/brif"))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

fn ip_forward() -> String {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_forward")
        .unwrap()
        .trim()
        .to_string()
}

const VAR_PATHS: [&str; 3] = ["/var/lib/kubelet", "/var/log/pods", "/var/log/containers"];

fn var_paths() -> Vec<(String, bool)> {
    VAR_PATHS
        .iter()
        .map(|p| (p.to_string(), Path::new(p).exists()))
        .collect()
}

fn condition<'a>(obj: &'a Value, kind: &str) -> Option<&'a Value> {
    obj["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
}

#[test]
#[ignore = "needs the real cluster (scripts/test.sh with NODEWARD_TEST_CLUSTER=1)"]
fn real_cluster_smoke_bootstrap_node_pod_logs_teardown() {
    require_cluster_env();
    let _serial = serial();
    let t0 = Instant::now();
    let cluster = Cluster::shared();
    let t_cluster = t0.elapsed();

    let mounts_before = mount_points();
    let forward_before = ip_forward();
    let var_before = var_paths();
    assert!(
        kubepods_cgroups().is_empty(),
        "kubepods cgroups before the node started"
    );

    let name = format!("nodeward-smoke-{}", std::process::id());
    let t1 = Instant::now();
    let node = Node::start(cluster, &name, None);
    let t_node_started = t1.elapsed();

    // TLS bootstrap: the kubelet's CSR, made with the bootstrap token, is approved and signed.
    let bootstrap_user = format!("system:bootstrap:{}", cluster.bootstrap_token.id);
    wait_for(
        "the kubelet's CSR approved and signed",
        Duration::from_secs(120),
        || {
            let list = cluster.get_json(&["get", "csr"])?;
            list["items"].as_array()?.iter().find_map(|csr| {
                (csr["spec"]["username"] == bootstrap_user.as_str()
                    && condition(csr, "Approved").is_some()
                    && csr["status"]["certificate"]
                        .as_str()
                        .is_some_and(|c| !c.is_empty()))
                .then_some(())
            })
        },
    );
    let t_csr = t1.elapsed();

    // The Node registers with the node identity and becomes Ready, reporting the built version.
    let node_obj = wait_for("Node Ready", Duration::from_secs(120), || {
        let n = cluster.get_json(&["get", "node", &name])?;
        (condition(&n, "Ready")?["status"] == "True").then_some(n)
    });
    let t_ready = t1.elapsed();
    assert_eq!(
        node_obj["status"]["nodeInfo"]["kubeletVersion"],
        cluster.kube_version.as_str()
    );
    assert!(
        node.kubeconfig.exists(),
        "the kubelet wrote {}",
        node.kubeconfig.display()
    );
    let cert = node.state.join("pki/kubelet-client-current.pem");
    let subject = Command::new("openssl")
        .args(["x509", "-noout", "-subject", "-in"])
        .arg(&cert)
        .output()
        .expect("openssl");
    let subject = String::from_utf8_lossy(&subject.stdout);
    assert!(
        subject.contains(&format!("system:node:{name}")) && subject.contains("system:nodes"),
        "node client certificate subject: {subject}"
    );

    // A pod bound to the node, from the local image, reaches Running and its output is readable.
    let ns = format!("nodeward-smoke-{}", std::process::id());
    cluster.kubectl_ok(&["create", "namespace", &ns]);
    let pod = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "workload", "namespace": ns},
        "spec": {
            "nodeName": name,
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 5,
            "containers": [{
                "name": "workload",
                "image": cluster.workload_image,
                "imagePullPolicy": "Never",
                "args": ["smoke"],
            }],
        },
    });
    let manifest = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(manifest.path(), pod.to_string()).unwrap();
    let t2 = Instant::now();
    // Admission refuses pods until the controller-manager made the namespace's default
    // ServiceAccount: retry briefly.
    wait_for("the pod created", Duration::from_secs(30), || {
        let out = cluster.kubectl(&["apply", "-f", manifest.path().to_str().unwrap()]);
        out.status.success().then_some(())
    });
    wait_for("the pod Running", Duration::from_secs(120), || {
        let p = cluster.get_json(&["-n", &ns, "get", "pod", "workload"])?;
        (p["status"]["phase"] == "Running").then_some(())
    });
    let t_running = t2.elapsed();
    let logs = wait_for("kubectl logs", Duration::from_secs(30), || {
        let out = cluster.kubectl(&["-n", &ns, "logs", "workload"]);
        let s = String::from_utf8_lossy(&out.stdout).into_owned();
        (out.status.success() && !s.is_empty()).then_some(s)
    });
    assert_eq!(logs.trim(), "nodeward-workload: hello from smoke");
    let veths = bridge_ports(&node.bridge);
    assert!(!veths.is_empty(), "the pod's veth on {}", node.bridge);
    assert_eq!(ip_forward(), "1", "the bridge plugin turned forwarding on");

    // Teardown, then nothing may be left.
    let bridge = node.bridge.clone();
    let state = node.state.clone();
    let t3 = Instant::now();
    node.stop();
    let t_teardown = t3.elapsed();
    cluster.kubectl_ok(&["delete", "namespace", &ns, "--wait=false"]);

    assert_eq!(
        kube_processes()
            .iter()
            .filter(|p| !p.contains("etcd") && !p.contains("kube-"))
            .count(),
        0,
        "node processes left: {:?}",
        kube_processes()
    );
    assert_eq!(
        mount_points(),
        mounts_before,
        "mount points before the node vs after"
    );
    assert_eq!(
        kubepods_cgroups(),
        Vec::<String>::new(),
        "kubepods cgroups left"
    );
    assert!(!link_exists(&bridge), "bridge {bridge} left");
    for v in &veths {
        assert!(!link_exists(v), "veth {v} left");
    }
    assert_eq!(var_paths(), var_before, "/var paths before vs after");
    assert_eq!(ip_forward(), forward_before, "net.ipv4.ip_forward restored");
    assert!(!state.exists(), "{} removed", state.display());

    eprintln!(
        "cluster-smoke timings: control plane {:?} (cluster start {} ms), node started {:?}, \
         CSR signed {:?}, Node Ready {:?}, pod Running {:?} after apply, teardown {:?}",
        t_cluster, cluster.start_ms, t_node_started, t_csr, t_ready, t_running, t_teardown
    );
}

#[test]
#[ignore = "needs the real cluster (scripts/test.sh with NODEWARD_TEST_CLUSTER=1)"]
fn real_cluster_start_stop_twice() {
    require_cluster_env();
    let _serial = serial();
    for round in 1..=2 {
        let t = Instant::now();
        let c = Cluster::start();
        let started = t.elapsed();
        assert_eq!(c.kubectl_ok(&["get", "--raw", "/readyz"]).trim(), "ok");
        // The bootstrap token is a kube-system Secret the API knows.
        let secret = format!("bootstrap-token-{}", c.bootstrap_token.id);
        c.kubectl_ok(&["-n", "kube-system", "get", "secret", &secret]);
        let state = c.state.clone();
        let t = Instant::now();
        c.stop();
        let stopped = t.elapsed();
        assert!(!state.exists(), "{} removed", state.display());
        let needle = state.to_string_lossy().into_owned();
        for e in std::fs::read_dir("/proc").unwrap().flatten() {
            if let Ok(cmdline) = std::fs::read(e.path().join("cmdline")) {
                assert!(
                    !String::from_utf8_lossy(&cmdline).contains(&needle),
                    "process {:?} still names {needle}",
                    e.file_name()
                );
            }
        }
        eprintln!("cluster round {round}: ready after {started:?}, stopped after {stopped:?}");
    }
}
