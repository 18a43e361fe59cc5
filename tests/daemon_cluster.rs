//! `nodeward daemon` against the real API server of `tests/cluster/mod.rs` (v1.20), keeping a
//! none-mode node that `nodeward bootstrap` joined with the real kubelet: the Machine's exact
//! status, the watch-driven reaction to a spec change, each MachineOperation end to end, and
//! `READY=1` / `WATCHDOG=1` on a notify socket the test binds. The daemon talks with the node's
//! own credentials (the kubelet's kubeconfig) under `deploy/rbac.yaml`.
//!
//! The `real_cluster_*` test runs only inside the hybrid systemd harness that `scripts/test.sh`
//! starts (README, Testing); the others run anywhere.

mod cluster;
#[path = "daemon/config_map.rs"]
mod config_map;
#[path = "daemon/fixture.rs"]
mod fixture;
#[path = "daemon/gate.rs"]
mod gate;
mod node;
#[path = "daemon/notify.rs"]
mod notify;
#[path = "daemon/proxy.rs"]
mod proxy;
#[path = "daemon/rollout.rs"]
mod rollout;
#[path = "daemon/writers.rs"]
mod writers;

use cluster::{Cluster, require_cluster_env, serial, wait_for};
use node::*;
use notify::NotifySocket;
use proxy::Proxy;
use serde_json::{Value, json};
use std::path::Path;
use std::process::{Child, Output, Stdio};
use std::time::{Duration, Instant};

/// [`NotifySocket::wait_for_line`] for this file's tests.
trait WaitForLine {
    fn wait_for_line(&self, line: &str, timeout: Duration);
}

impl WaitForLine for NotifySocket {
    /// Waits until a line is `line`.
    fn wait_for_line(&self, line: &str, timeout: Duration) {
        wait_for(&format!("`{line}` on the notify socket"), timeout, || {
            (self.count(line) > 0).then_some(())
        });
    }
}

fn condition<'a>(obj: &'a Value, kind: &str) -> Option<&'a Value> {
    obj["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
}

/// `(status, reason)` of each condition of `machine`, by type.
fn conditions(machine: &Value) -> Vec<(String, String, String)> {
    machine["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            let s = |k: &str| c[k].as_str().unwrap_or_default().to_string();
            (s("type"), s("status"), s("reason"))
        })
        .collect()
}

#[track_caller]
fn ok(root: &NodeRoot, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.extend(["--output", "json"]);
    let out: Output = root.command(&all).output().expect("nodeward runs");
    assert!(
        out.status.success(),
        "nodeward {args:?} failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
}

/// `kubectl apply` of `object`, written beside the root.
fn apply(cluster: &Cluster, dir: &Path, object: &Value) {
    let file = dir.join(format!("object-{}.json", fastrand::u32(..)));
    std::fs::write(&file, object.to_string()).expect("manifest");
    cluster.kubectl_ok(&["apply", "-f", &file.display().to_string()]);
}

fn operation(cluster: &Cluster, dir: &Path, name: &str, machine: &str, kind: &str) {
    apply(
        cluster,
        dir,
        &json!({
            "apiVersion": "nodeward.io/v1alpha1",
            "kind": "MachineOperation",
            "metadata": {"name": name},
            "spec": {"machineRef": {"name": machine}, "kind": kind},
        }),
    );
}

/// Waits until the operation `name` has finished; its status.
fn finished(cluster: &Cluster, name: &str, timeout: Duration) -> Value {
    wait_for(&format!("operation {name} finished"), timeout, || {
        let op = cluster.get_json(&["get", "machineoperations.nodeward.io", name])?;
        let phase = op["status"]["phase"].as_str()?;
        matches!(phase, "Complete" | "Failed").then(|| op["status"].clone())
    })
}

/// The kubelet unit's `InvocationID` in the harness (changes on every start).
fn kubelet_invocation() -> String {
    let out = std::process::Command::new("systemctl")
        .args(["show", "-p", "InvocationID", "--value", NODE_UNITS[1]])
        .output()
        .expect("systemctl");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// [`wait_for`], with the daemon's log in the panic message when it times out.
fn wait_logged<T>(
    what: &str,
    timeout: Duration,
    log: &Path,
    mut f: impl FnMut() -> Option<T>,
) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        if start.elapsed() > timeout {
            panic!(
                "{what}: not within {timeout:?}; the daemon's log:\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Waits for `child` to exit, at most `timeout`; its exit code.
fn exit_code(child: &mut Child, timeout: Duration) -> Option<i32> {
    wait_for("the daemon to exit", timeout, || {
        child.try_wait().expect("try_wait").map(|s| s.code())
    })
}

/// `nodeward daemon --machine m --metrics-addr METRICS --root ROOT`, run to its end.
fn daemon_on(root: &Path, metrics: &str) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_nodeward"))
        .args([
            "daemon",
            "--machine",
            "m",
            "--metrics-addr",
            metrics,
            "--root",
        ])
        .arg(root)
        .output()
        .expect("nodeward runs")
}

#[test]
fn daemon_without_a_node_exits_69_and_says_why() {
    let root = tempfile::tempdir().expect("tempdir");
    let out = daemon_on(root.path(), "off");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(69), "{stderr}");
    assert!(stderr.contains("no node on this host"), "{stderr}");
    // It decided from the host's state alone: nothing written beneath the root.
    let entries: Vec<_> = std::fs::read_dir(root.path())
        .expect("root")
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(entries.is_empty(), "{entries:?}");
}

#[test]
fn daemon_waits_while_an_installation_holds_the_node_lock_then_starts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("root");
    fixture::finished_node(&root);
    let lock_path = root.join(nodeward::node::state::LOCK_FILE);
    std::fs::create_dir_all(lock_path.parent().expect("parent")).expect("lock dir");
    let lock = nodeward::durable::Lock::acquire(&lock_path).expect("the test holds the lock");
    let notify = NotifySocket::bind(dir.path());
    let mut daemon = std::process::Command::new(env!("CARGO_BIN_EXE_nodeward"))
        .args([
            "daemon",
            "--machine",
            "w1",
            "--metrics-addr",
            "off",
            "--root",
        ])
        .arg(&root)
        .env("NOTIFY_SOCKET", &notify.path)
        .stderr(Stdio::piped())
        .spawn()
        .expect("the daemon starts");
    notify.wait_for_line("READY=1", Duration::from_secs(10));
    assert!(
        notify.has_line_starting("STATUS=waiting: another nodeward run holds the node lock"),
        "{:?}",
        notify.lines()
    );
    assert!(daemon.try_wait().expect("try_wait").is_none(), "it waits");
    // The installation ends: the daemon goes on, to the kubeconfig this host lacks (exit 1,
    // naming it).
    drop(lock);
    let code = exit_code(&mut daemon, Duration::from_secs(30));
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut daemon.stderr.take().expect("stderr"), &mut stderr)
        .expect("stderr");
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("var/lib/kubelet/kubeconfig"), "{stderr}");
}

#[test]
fn daemon_refuses_a_metrics_address_that_is_not_one() {
    let root = tempfile::tempdir().expect("tempdir");
    let out = daemon_on(root.path(), "nine");
    // A usage error (2) before the start decision, naming the flag.
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--metrics-addr nine"), "{stderr}");
}

#[test]
#[ignore = "needs the real cluster (scripts/test.sh with NODEWARD_TEST_CLUSTER=1)"]
fn real_cluster_daemon_keeps_a_none_node_and_carries_out_its_operations() {
    require_cluster_env();
    let _serial = serial();
    let cluster = Cluster::shared();
    cluster.install_nodeward_api();

    let mut root = NodeRoot::new(RootKind::HarnessRealKubelet);
    let server = ArtifactServer::start_temp();
    let served = serve_artifacts(&server, &cluster.kubelet);
    let name = format!("daemon-{:06x}", fastrand::u32(..1 << 24));
    let opts = NodeOptions::new(&root.root, &name);
    let bootstrapped_with = node_config(&ClusterInfo::of_cluster(cluster), &served, &opts);
    root.write_config(&bootstrapped_with);
    ok(&root, &["bootstrap"]);
    let version = cluster.kube_version.trim_start_matches('v').to_string();
    apply(
        cluster,
        &root.dir,
        &json!({
            "apiVersion": "nodeward.io/v1alpha1",
            "kind": "Machine",
            "metadata": {"name": name},
            "spec": {"kubernetesVersion": version},
        }),
    );

    // The daemon, with the kubelet's own credentials, through a proxy the test can cut.
    let upstream = cluster
        .api_url
        .trim_start_matches("https://")
        .parse()
        .expect("the API server's address");
    let proxy = Proxy::start(upstream);
    let kubelet_kubeconfig =
        std::fs::read_to_string(root.root.join("var/lib/kubelet/kubeconfig")).expect("kubeconfig");
    assert!(kubelet_kubeconfig.contains(&cluster.api_url));
    let kubeconfig = root.dir.join("daemon.kubeconfig");
    std::fs::write(
        &kubeconfig,
        kubelet_kubeconfig.replace(&cluster.api_url, &format!("https://{}", proxy.addr)),
    )
    .expect("write the daemon's kubeconfig");
    let notify = NotifySocket::bind(&root.dir);
    let log = std::fs::File::create(root.dir.join("daemon.log")).expect("log");
    let mut daemon = root
        .command(&[
            "daemon",
            "--metrics-addr",
            "127.0.0.1:0",
            // The roll-outs' health gate (and only theirs): short, so that a node that fails
            // it is rolled back soon.
            "--health-timeout",
            "30",
            "--kubeconfig",
        ])
        .arg(&kubeconfig)
        .env("NOTIFY_SOCKET", &notify.path)
        .env("WATCHDOG_USEC", "2000000")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("the daemon starts");
    let daemon_log = || std::fs::read_to_string(root.dir.join("daemon.log")).unwrap_or_default();
    notify.wait_for_line("READY=1", Duration::from_secs(30));

    // The status, exactly.
    let log_path = root.dir.join("daemon.log");
    let m = wait_logged(
        "the Machine's status",
        Duration::from_secs(30),
        &log_path,
        || {
            let m = cluster.get_json(&["get", "machines.nodeward.io", &name])?;
            (m["status"]["observedGeneration"] == m["metadata"]["generation"]).then_some(m)
        },
    );
    assert_eq!(m["status"]["phase"], "Ready", "{m}\n{}", daemon_log());
    let expected = [
        ("AgentBootstrapped", "True", "Bootstrapped"),
        ("NodeUpdated", "True", "UpToDate"),
        ("BundleApplied", "True", "BundleActive"),
        ("RepavePending", "False", "NoRepaveNeeded"),
    ];
    let expected: Vec<_> = expected
        .iter()
        .map(|(t, s, r)| (t.to_string(), s.to_string(), r.to_string()))
        .collect();
    assert_eq!(conditions(&m), expected, "{m}");
    // The audit trail's head, as the bootstrap left it, for auditors to hold the log to.
    let head = &m["status"]["auditHead"];
    assert!(head["seq"].as_i64().is_some_and(|s| s > 0), "{m}");
    assert_eq!(head["sha256"].as_str().map(str::len), Some(64), "{m}");
    notify.wait_for_line("WATCHDOG=1", Duration::from_secs(10));
    // Figures, not asserts (budget: idle RSS ≤ 20 MB): the daemon after its first pass.
    let rss_kib = std::fs::read_to_string(format!("/proc/{}/status", daemon.id()))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .map(|v| v.trim().to_string())
        .unwrap_or_default();
    eprintln!("daemon: RSS after its first pass: {rss_kib}");

    // A spec change reaches the daemon through its watch, not a poll: the second kubelet
    // build, pinned in the Machine, is the node's repave (the journaled upgrade).
    let upgrade = server.download("kubelet-upgrade", &cluster.kubelet_upgrade);
    let to = cluster.upgrade_version.trim_start_matches('v').to_string();
    let patch = json!({"spec": {
        "kubernetesVersion": to,
        "artifacts": {"kubelet": {"url": upgrade.url, "sha256": upgrade.sha256}},
    }});
    let t = Instant::now();
    cluster.patch_machine(&name, &patch);
    let m = wait_logged(
        "the repave started",
        Duration::from_secs(30),
        &log_path,
        || {
            let m = cluster.get_json(&["get", "machines.nodeward.io", &name])?;
            (m["status"]["phase"] == "Repaving").then_some(m)
        },
    );
    eprintln!(
        "daemon: spec change -> Repaving written in {} ms (seeds: a 10 min poll)",
        t.elapsed().as_millis()
    );
    let updated = condition(&m, "NodeUpdated").expect("NodeUpdated");
    assert_eq!(updated["reason"], "Updating", "{m}");
    let m = wait_logged(
        "the repave done",
        Duration::from_secs(300),
        &log_path,
        || {
            let m = cluster.get_json(&["get", "machines.nodeward.io", &name])?;
            (m["status"]["phase"] != "Repaving").then_some(m)
        },
    );
    assert_eq!(m["status"]["phase"], "Ready", "{m}\n{}", daemon_log());
    assert_eq!(conditions(&m), expected, "{m}");
    eprintln!(
        "daemon: spec change -> node repaved (upgraded) in {} ms",
        t.elapsed().as_millis()
    );
    let node = cluster.get_json(&["get", "node", &name]).expect("the Node");
    assert_eq!(
        node["status"]["nodeInfo"]["kubeletVersion"],
        cluster.upgrade_version.as_str(),
        "{node}"
    );

    // The node config from a ConfigMap, read with the node's credentials.
    config_map::walk(cluster, &root.dir, &log_path, &name, &bootstrapped_with);

    // The API server out of reach for 20 s: the daemon backs off (connections counted), keeps
    // feeding the watchdog, and picks up what changed meanwhile once it is back: an
    // AgentUpgrade, refused with its reason.
    let (accepted, pings) = (proxy.accepted(), notify.count("WATCHDOG=1"));
    proxy.cut();
    operation(
        cluster,
        &root.dir,
        &format!("{name}-up"),
        &name,
        "AgentUpgrade",
    );
    std::thread::sleep(Duration::from_secs(20));
    let attempts = proxy.accepted() - accepted;
    let pinged = notify.count("WATCHDOG=1") - pings;
    eprintln!(
        "daemon: 20 s without the API server: {attempts} connection attempts, {pinged} watchdog pings"
    );
    assert!(
        attempts <= 40,
        "{attempts} connections in 20 s: no backoff\n{}",
        daemon_log()
    );
    assert!(
        pinged >= 5,
        "the loop stopped feeding the watchdog: {pinged} pings"
    );
    let t = Instant::now();
    // Picked up once a watch's or the pass's backoff ends: full jitter under a ceiling that
    // doubled through the outage (up to ~32 s here), so the wait is a figure, not a bound.
    proxy.restore();
    let st = finished(cluster, &format!("{name}-up"), Duration::from_secs(240));
    eprintln!(
        "daemon: API server back -> the operation made meanwhile handled in {} ms",
        t.elapsed().as_millis()
    );
    assert_eq!(st["phase"], "Failed", "{st}");
    assert!(st.to_string().contains("AgentUpgradeUnsupported"), "{st}");

    // NodeReboot: the kubelet restarted in place, the node Ready again.
    let before = kubelet_invocation();
    operation(
        cluster,
        &root.dir,
        &format!("{name}-reboot"),
        &name,
        "NodeReboot",
    );
    let st = finished(cluster, &format!("{name}-reboot"), Duration::from_secs(300));
    assert_eq!(st["phase"], "Complete", "{st}\n{}", daemon_log());
    let after = kubelet_invocation();
    assert!(!after.is_empty() && after != before, "{before} -> {after}");

    let publisher = rollout::Publisher::new(&root, &root.dir);
    let v2 = rollout::roll_out_bundles(cluster, &root, &server, &name, &log_path, &publisher);
    let node = gate::Node {
        cluster,
        root: &root,
        name: &name,
        log_path: &log_path,
    };
    gate::roll_out_a_bundle_the_node_fails(&node, &server, &publisher, &v2);

    // Another writer of the status beside the daemon: 409s on both sides, retried; in the end
    // each one's condition is there, the daemon's exactly as before.
    let daemon_conditions = |m: &Value| {
        let mut c = conditions(m);
        c.retain(|(t, _, _)| t != writers::FOREIGN);
        c
    };
    let before = daemon_conditions(
        &cluster
            .get_json(&["get", "machines.nodeward.io", &name])
            .expect("the Machine"),
    );
    let writes = 30;
    let conflicts = writers::write_concurrently(cluster, &name, writes);
    let m = wait_logged(
        "both writers' conditions",
        Duration::from_secs(60),
        &log_path,
        || {
            let m = cluster.get_json(&["get", "machines.nodeward.io", &name])?;
            let foreign = condition(&m, writers::FOREIGN)?;
            (foreign["message"] == format!("write {}", writes - 1).as_str()
                && daemon_conditions(&m) == before)
                .then_some(m)
        },
    );
    eprintln!(
        "daemon: {writes} status writes beside the daemon: {conflicts} conflicts for the test's writer; daemon's: {}",
        rollout::scrape_metrics(&log_path)
            .lines()
            .find(|l| l.starts_with("nodeward_daemon_reconciles_total{result=\"conflict\"}"))
            .unwrap_or("none")
    );
    assert_eq!(daemon_conditions(&m), before, "{m}");

    // AgentReset: the node removed, the operation Complete, the daemon gone with 69.
    operation(
        cluster,
        &root.dir,
        &format!("{name}-reset"),
        &name,
        "AgentReset",
    );
    let st = finished(cluster, &format!("{name}-reset"), Duration::from_secs(300));
    assert_eq!(st["phase"], "Complete", "{st}\n{}", daemon_log());
    let code = exit_code(&mut daemon, Duration::from_secs(60));
    assert_eq!(code, Some(69), "{}", daemon_log());
    assert!(notify.count("WATCHDOG=1") >= 1);
    let status = ok(&root, &["status"]);
    assert_eq!(status["presence"], "absent", "{status}");

    for op in ["up", "reboot", "reset"] {
        cluster.kubectl(&[
            "delete",
            "machineoperations.nodeward.io",
            &format!("{name}-{op}"),
        ]);
    }
    cluster.kubectl_ok(&["delete", "machines.nodeward.io", &name]);
    root.teardown();
}
