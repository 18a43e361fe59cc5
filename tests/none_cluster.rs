//! None mode against the real cluster: the real kube-apiserver and controller-manager of
//! `tests/cluster/mod.rs`, the real kubelet builds of `scripts/kube-build.sh`, Debian's
//! containerd, runc and CNI plugins packed into tarballs and served from 127.0.0.1. `nodeward
//! bootstrap` joins the node with a bootstrap token; `nodeward upgrade` switches it to the
//! second kubelet build; `nodeward reset` takes it away again.
//!
//! While it runs, `nodeward bootstrap` reports to the node's Machine with the bootstrap token
//! (`AgentBootstrapped`, `host/bootstrap_report.rs`) under `deploy/rbac.yaml`: a finished
//! bootstrap leaves `Bootstrapped` and every other status field as it was, a failed one
//! `BootstrapFailed` with its error, and one without a Machine (or without the RBAC) goes on
//! with a warning.
//!
//! Runs only inside the hybrid systemd harness that `NODEWARD_TEST_CLUSTER=1 scripts/test.sh`
//! starts (README, Testing).

mod cluster;
mod node;

use cluster::{Cluster, require_cluster_env, serial, wait_for};
use node::*;
use serde_json::{Value, json};
use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

fn run(root: &NodeRoot, args: &[&str]) -> (Output, Value) {
    let mut all = args.to_vec();
    all.extend(["--output", "json"]);
    let out = root.command(&all).output().expect("nodeward runs");
    let v = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (out, v)
}

#[track_caller]
fn ok(root: &NodeRoot, args: &[&str]) -> Value {
    let (out, v) = run(root, args);
    assert!(
        out.status.success(),
        "nodeward {args:?} failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    v
}

fn condition<'a>(obj: &'a Value, kind: &str) -> Option<&'a Value> {
    obj["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
}

/// The nodeward.io API on the cluster: the CRDs and `deploy/rbac.yaml` (nodes and bootstrap
/// tokens), once the CRDs are served.
fn install_api(cluster: &Cluster) {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    for f in ["deploy/crds", "deploy/rbac.yaml"] {
        cluster.kubectl_ok(&["apply", "-f", &repo.join(f).display().to_string()]);
    }
    wait_for("the CRDs established", Duration::from_secs(30), || {
        cluster
            .kubectl(&["get", "machines.nodeward.io"])
            .status
            .success()
            .then_some(())
    });
}

/// A Machine `name` whose status says what a daemon would have written before: `Ready` at
/// generation 1, `NodeUpdated=True`; the bootstrap's report must keep all of it.
fn machine_with_status(cluster: &Cluster, dir: &Path, name: &str) -> Value {
    let version = cluster.kube_version.trim_start_matches('v');
    let file = dir.join(format!("machine-{name}.json"));
    let machine = json!({
        "apiVersion": "nodeward.io/v1alpha1",
        "kind": "Machine",
        "metadata": {"name": name},
        "spec": {"kubernetesVersion": version},
    });
    std::fs::write(&file, machine.to_string()).expect("manifest");
    cluster.kubectl_ok(&["apply", "-f", &file.display().to_string()]);
    let mut m = cluster
        .get_json(&["get", "machines.nodeward.io", name])
        .expect("the Machine");
    m["status"] = json!({
        "phase": "Ready",
        "observedGeneration": 1,
        "conditions": [{
            "type": "NodeUpdated",
            "status": "True",
            "reason": "UpToDate",
            "message": "written by the test",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
            "observedGeneration": 1,
        }],
    });
    std::fs::write(&file, m.to_string()).expect("status");
    cluster.kubectl_ok(&[
        "replace",
        "--raw",
        &format!("/apis/nodeward.io/v1alpha1/machines/{name}/status"),
        "-f",
        &file.display().to_string(),
    ]);
    cluster
        .get_json(&["get", "machines.nodeward.io", name])
        .expect("the Machine")
}

/// The Machine's status without its `AgentBootstrapped` condition: what the bootstrap must
/// not change.
fn status_but_agent_bootstrapped(machine: &Value) -> Value {
    let mut status = machine["status"].clone();
    if let Some(conditions) = status["conditions"].as_array_mut() {
        conditions.retain(|c| c["type"] != "AgentBootstrapped");
    }
    status
}

/// stdout and stderr of a run, which must not hold the bootstrap token or its secret half.
#[track_caller]
fn assert_no_token(cluster: &Cluster, out: &Output) {
    for stream in [&out.stdout, &out.stderr] {
        let text = String::from_utf8_lossy(stream);
        assert!(
            !text.contains(&cluster.bootstrap_token.secret),
            "the token was printed:\n{text}"
        );
    }
}

fn node_ready(cluster: &Cluster, name: &str) -> Value {
    wait_for("Node Ready", Duration::from_secs(120), || {
        let n = cluster.get_json(&["get", "node", name])?;
        (condition(&n, "Ready")?["status"] == "True").then_some(n)
    })
}

fn pod_running(cluster: &Cluster, ns: &str) {
    wait_for("the pod Running", Duration::from_secs(180), || {
        let p = cluster.get_json(&["-n", ns, "get", "pod", "workload"])?;
        (p["status"]["phase"] == "Running").then_some(())
    });
}

/// Step name → milliseconds, from a bootstrap or upgrade report.
fn step_times(report: &Value) -> Vec<(String, u64, u64)> {
    report["steps"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| {
            (
                s["name"].as_str().unwrap_or_default().to_string(),
                s["durationMs"].as_u64().unwrap_or_default(),
                s["capabilityMs"].as_u64().unwrap_or_default(),
            )
        })
        .collect()
}

#[test]
#[ignore = "needs the real cluster (scripts/test.sh with NODEWARD_TEST_CLUSTER=1)"]
fn real_cluster_none_mode_bootstrap_upgrade_and_reset() {
    require_cluster_env();
    let _serial = serial();
    let cluster = Cluster::shared();
    let mut root = NodeRoot::new(RootKind::HarnessRealKubelet);
    let server = ArtifactServer::start_temp();
    let served = serve_artifacts(&server, &cluster.kubelet);
    let name = format!("none-{:06x}", fastrand::u32(..1 << 24));
    let opts = NodeOptions::new(&root.root, &name);
    let config_v1 = node_config(&ClusterInfo::of_cluster(cluster), &served, &opts);
    let served_v2 = Served {
        kubelet: server.download("kubelet-upgrade", &cluster.kubelet_upgrade),
        ..served.clone()
    };
    let mut info_v2 = ClusterInfo::of_cluster(cluster);
    info_v2.kube_version = cluster.upgrade_version.trim_start_matches('v').to_string();
    let config_v2 = node_config(&info_v2, &served_v2, &opts);
    let v2_path = root.dir.join("v2.yaml");
    std::fs::write(&v2_path, &config_v2).expect("v2 config");
    root.write_config(&config_v1);
    let pristine = root.tree();
    install_api(cluster);
    let before = machine_with_status(cluster, &root.dir, &name);

    // --- bootstrap --------------------------------------------------------------------------
    let t = Instant::now();
    let (out, boot) = run(&root, &["bootstrap"]);
    let t_boot = t.elapsed();
    assert!(
        out.status.success(),
        "bootstrap failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert_no_token(cluster, &out);
    // The Machine says so, with the bootstrap token's write, and nothing else changed.
    let m = cluster
        .get_json(&["get", "machines.nodeward.io", &name])
        .expect("the Machine");
    let c = condition(&m, "AgentBootstrapped").expect("AgentBootstrapped");
    assert_eq!(
        (&c["status"], &c["reason"]),
        (&json!("True"), &json!("Bootstrapped")),
        "{m}"
    );
    assert_eq!(
        c["message"], "the bootstrap finished and the node joined",
        "{m}"
    );
    assert!(
        c.get("observedGeneration").is_none(),
        "a bootstrap observes no spec: {m}"
    );
    assert_eq!(
        status_but_agent_bootstrapped(&m),
        status_but_agent_bootstrapped(&before),
        "{m}"
    );
    let v1 = boot["version"].as_str().expect("version").to_string();
    assert_eq!(boot["kubeletVersion"], cluster.kube_version.as_str());
    // The CSR of this node's bootstrap was approved and signed.
    let csrs = cluster.get_json(&["get", "csr"]).expect("csrs");
    let ours = csrs["items"].as_array().expect("items").iter().find(|c| {
        c["spec"]["username"]
            .as_str()
            .is_some_and(|u| u == format!("system:bootstrap:{}", cluster.bootstrap_token.id))
            && condition(c, "Approved").is_some()
            && c["status"]["certificate"].is_string()
    });
    assert!(ours.is_some(), "no approved, signed CSR: {csrs}");
    // The Node is Ready with the labels and taints the config asked for.
    let n = node_ready(cluster, &name);
    assert_eq!(n["metadata"]["labels"][TEST_LABEL.0], TEST_LABEL.1, "{n}");
    let taints = n["spec"]["taints"].as_array().cloned().unwrap_or_default();
    assert!(
        taints.iter().any(|t| t["key"] == TEST_TAINT.0
            && t["value"] == TEST_TAINT.1
            && t["effect"] == TEST_TAINT.2),
        "{taints:?}"
    );
    // A pod runs on it.
    import_cluster_images(&root.root, cluster);
    let ns = format!("nodeward-none-{}", std::process::id());
    cluster.kubectl_ok(&["create", "namespace", &ns]);
    let pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "workload", "namespace": ns},
        "spec": {
            "nodeName": name,
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 5,
            "tolerations": [{"key": TEST_TAINT.0, "operator": "Exists"}],
            "containers": [{
                "name": "workload",
                "image": cluster.workload_image,
                "imagePullPolicy": "Never",
                "args": ["none"],
            }],
        },
    });
    let manifest = root.dir.join("pod.json");
    std::fs::write(&manifest, pod.to_string()).expect("manifest");
    let manifest_s = manifest.display().to_string();
    wait_for("the pod created", Duration::from_secs(30), || {
        let out = cluster.kubectl(&["apply", "-f", &manifest_s]);
        out.status.success().then_some(())
    });
    pod_running(cluster, &ns);
    // status says so.
    let st = ok(&root, &["status"]);
    assert_eq!(st["activeVersion"], v1.as_str());
    assert_eq!(st["checkpoint"], "complete");
    assert_eq!(st["kubeletHealth"], "ok");
    for u in st["units"].as_array().expect("units") {
        assert_eq!(u["activeState"], "active", "{u}");
    }

    // --- a second bootstrap changes nothing, and needs no Machine ----------------------------
    let plan = ok(&root, &["plan"]);
    assert_eq!(plan["changes"], Value::Array(vec![]), "{}", plan["changes"]);
    cluster.kubectl_ok(&["delete", "machines.nodeward.io", &name]);
    let (out, again) = run(&root, &["bootstrap"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(again["mutations"], 0, "{}", again["changes"]);
    assert!(
        stderr.contains(&format!("no Machine {name}")),
        "the missing Machine is a warning: {stderr}"
    );
    assert_no_token(cluster, &out);

    // --- upgrade to the second kubelet build -------------------------------------------------
    let v2s = v2_path.display().to_string();
    let t = Instant::now();
    let up = ok(&root, &["upgrade", "--config", &v2s]);
    let t_up = t.elapsed();
    let v2 = up["version"].as_str().expect("version").to_string();
    assert_ne!(v1, v2);
    assert_eq!(up["kubeletVersion"], cluster.upgrade_version.as_str());
    let n = node_ready(cluster, &name);
    assert_eq!(
        n["status"]["nodeInfo"]["kubeletVersion"],
        cluster.upgrade_version.as_str()
    );
    let st = ok(&root, &["status"]);
    assert_eq!(st["activeVersion"], v2.as_str());
    assert_eq!(st["versions"], json!([v2]), "the old version was pruned");
    assert_eq!(
        std::fs::read_link(root.root.join("opt/nodeward/node/current"))
            .expect("link")
            .to_string_lossy(),
        v2
    );
    // The pod's node is still Ready and the pod runs again after the stack restarted.
    pod_running(cluster, &ns);

    // --- reset --------------------------------------------------------------------------------
    cluster.kubectl_ok(&["delete", "namespace", &ns, "--wait=false"]);
    let bridge = root
        .bridge()
        .expect("the config names a bridge")
        .to_string();
    assert!(
        Path::new("/sys/class/net").join(&bridge).exists(),
        "the pods' bridge {bridge} is there before the reset"
    );
    assert!(
        !kubepods_cgroups().is_empty(),
        "the kubelet made its cgroups"
    );
    let t = Instant::now();
    ok(&root, &["reset"]);
    let t_reset = t.elapsed();
    let after = root.tree();
    let extra: Vec<&String> = after
        .keys()
        .filter(|p| !pristine.contains_key(*p) && !stays_after_reset(p))
        .collect();
    assert!(extra.is_empty(), "reset left {extra:?}");
    for (unit, (active, _)) in root.unit_states() {
        assert_eq!(active, "inactive", "{unit} after reset");
    }
    // Nothing of the node stays: no unit, process, mount, cgroup (the kubelet's kubepods
    // cgroups in every hierarchy, v1 ones systemd does not manage included), link (the bridge,
    // the pods' veths) or file. Only beneath a temporary root, two directories containerd
    // hard-codes outside it stay (`outside_the_root`: its shims' socket directory and
    // libcni's result cache); with the root `/` they are the node's, and reset removes them.
    let leftovers = root.leftovers();
    assert!(
        leftovers.iter().all(|l| outside_the_root(l)),
        "after reset: {leftovers:?}"
    );
    let audit = std::fs::read_to_string(root.audit_dir.join("audit.jsonl")).unwrap_or_default();
    assert!(
        audit.contains("\"network.delete-link\"") && audit.contains("\"cgroups.remove\""),
        "each deleted link and removed cgroup has its audit record"
    );
    let second = ok(&root, &["reset"]);
    assert_eq!(second["mutations"], 0, "{}", second["changes"]);
    cluster.kubectl_ok(&["delete", "node", &name, "--wait=false"]);
    let left = root.teardown();
    eprintln!(
        "none-mode on the real cluster: bootstrap {t_boot:?} (steps {:?}), upgrade {t_up:?} \
         (steps {:?}), reset {t_reset:?}; the fixture cleaned up after reset: {left:?}",
        step_times(&boot),
        step_times(&up)
    );
    // The same leftovers as checked above.
    assert!(left.iter().all(|l| outside_the_root(l)), "{left:?}");
}

#[test]
#[ignore = "needs the real cluster (scripts/test.sh with NODEWARD_TEST_CLUSTER=1)"]
fn real_cluster_a_failed_bootstrap_is_reported_in_its_machine() {
    require_cluster_env();
    let _serial = serial();
    let cluster = Cluster::shared();
    install_api(cluster);
    let mut root = NodeRoot::new(RootKind::Harness);
    let server = ArtifactServer::start_temp();
    let served = serve_artifacts(&server, &cluster.kubelet);
    let name = format!("failed-{:06x}", fastrand::u32(..1 << 24));
    let opts = NodeOptions::new(&root.root, &name);
    root.write_config(&node_config(
        &ClusterInfo::of_cluster(cluster),
        &served,
        &opts,
    ));
    let pristine = root.tree();
    // containerd's tarball is served with other bytes than its pinned sha256.
    let containerd = packed()
        .containerd_tgz
        .file_name()
        .and_then(|n| n.to_str())
        .expect("name")
        .to_string();
    server.serve_wrong_bytes(&containerd, b"not a containerd tarball");
    let before = machine_with_status(cluster, &root.dir, &name);

    // Without the bootstrap tokens' RBAC the report is refused: a warning, the same failure,
    // the Machine untouched (so it is the token that writes, not some other credential).
    cluster.kubectl_ok(&["delete", "clusterrolebinding", "nodeward:bootstrapper"]);
    let (out, v) = run(&root, &["bootstrap"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        v["error"].as_str().is_some_and(|e| e.contains("sha256")),
        "{v}"
    );
    assert!(stderr.contains("403"), "the refusal is a warning: {stderr}");
    assert_no_token(cluster, &out);
    let m = cluster
        .get_json(&["get", "machines.nodeward.io", &name])
        .expect("the Machine");
    assert_eq!(m["status"], before["status"], "{m}");

    // With it, the failure is in the Machine: the error the command printed, as its message.
    install_api(cluster);
    let (out, v) = run(&root, &["bootstrap"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_no_token(cluster, &out);
    let error = v["error"].as_str().expect("the error").to_string();
    assert!(
        error.contains("download-artifacts") && error.contains(&containerd),
        "{error}"
    );
    let m = cluster
        .get_json(&["get", "machines.nodeward.io", &name])
        .expect("the Machine");
    let c = condition(&m, "AgentBootstrapped").expect("AgentBootstrapped");
    assert_eq!(
        (&c["status"], &c["reason"]),
        (&json!("False"), &json!("BootstrapFailed")),
        "{m}"
    );
    assert_eq!(c["message"], error.as_str(), "{m}");
    assert!(c.get("observedGeneration").is_none(), "{m}");
    assert_eq!(
        status_but_agent_bootstrapped(&m),
        status_but_agent_bootstrapped(&before),
        "{m}"
    );

    ok(&root, &["reset"]);
    let after = root.tree();
    let extra: Vec<&String> = after
        .keys()
        .filter(|p| !pristine.contains_key(*p) && !stays_after_reset(p))
        .collect();
    assert!(extra.is_empty(), "reset left {extra:?}");
    cluster.kubectl_ok(&["delete", "machines.nodeward.io", &name]);
    let left = root.teardown();
    assert!(left.is_empty(), "{left:?}");
}
