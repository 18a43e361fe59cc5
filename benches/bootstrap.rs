//! Time from `nodeward bootstrap` to Node Ready against the local real cluster (warm caches:
//! compiled phases, packed artifacts), split per step (the critical path is the sequence
//! itself), and the time spent inside WebAssembly vs in host capability calls.
//!
//! The split of bootstrap → Node Ready printed per round and as medians: the downloads
//! (`download-artifacts`), containerd's start (its `systemd.start`, which waits for
//! containerd's `READY=1`), the kubelet from its start to its TLS bootstrap, the TLS
//! bootstrap (from the kubeconfig it writes to its signed certificate, by the files' times),
//! from the certificate to its health endpoint, from there to Node Ready (the first Ready
//! status), and the rest of the agent's work (the other phases, state, the waits' polling).
//!
//! Needs the hybrid systemd harness and the kube builds: run `scripts/bench-none.sh`, which
//! starts them and runs this inside. Prints; asserts nothing about speed.

#[path = "../tests/cluster/mod.rs"]
mod cluster;
#[path = "../tests/node/mod.rs"]
mod node;

use node::*;
use serde_json::Value;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

const ROUNDS: usize = 3;

/// The parts of one bootstrap, in ms, in the order printed.
const SPLIT: [&str; 8] = [
    "downloads",
    "containerd start",
    "kubelet start→TLS bootstrap begins",
    "TLS bootstrap (CSR→cert)",
    "cert→kubelet healthz",
    "healthz→Node Ready",
    "rest of the agent",
    "total",
];

/// The `N` of each "after N ms" in the wait-healthy summary: kubelet healthy, kubeconfig
/// written, Node Ready, each counted from the wait's start.
fn wait_marks(summary: &str) -> Vec<u64> {
    summary
        .split("after ")
        .skip(1)
        .filter_map(|rest| rest.split(' ').next()?.parse().ok())
        .collect()
}

/// How long `systemd.start` of the unit whose name contains `unit` took, in ms, from the
/// node's audit trail (0 when not found).
fn start_ms(audit: &Path, unit: &str) -> u64 {
    let text = std::fs::read_to_string(audit.join("audit.jsonl")).unwrap_or_default();
    text.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["call"] == "systemd.start")
        .filter(|v| v["args"]["unit"].as_str().is_some_and(|u| u.contains(unit)))
        .filter_map(|v| v["durationUs"].as_u64().or(v["duration_us"].as_u64()))
        .map(|us| us / 1000)
        .sum()
}

/// Milliseconds from `since` to the modification time of `path` (not followed), 0 if unknown.
fn mtime_ms(path: &Path, since: SystemTime) -> u64 {
    std::fs::symlink_metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(since).ok())
        .map_or(0, |d| d.as_millis() as u64)
}

/// One round's split (see [`SPLIT`]) from its report, the node's files, its audit trail, when
/// the command started and how long it took. The kubelet writes its kubeconfig when its TLS
/// bootstrap begins (with certificate rotation on, the kubeconfig names the certificate file
/// before there is one) and links `pki/kubelet-client-current.pem` once its certificate is
/// signed; its health endpoint answers only after that.
fn split(steps: &[Value], root: &Path, audit: &Path, started: SystemTime, total: u64) -> [u64; 8] {
    let ms = |name: &str| {
        steps
            .iter()
            .find(|s| s["name"] == name)
            .and_then(|s| s["durationMs"].as_u64())
            .unwrap_or_default()
    };
    let downloads = ms("download-artifacts");
    let containerd = start_ms(audit, "containerd");
    // The kubelet starts at the end of start-node: every step before wait-healthy is done.
    let before_wait: u64 = steps
        .iter()
        .take_while(|s| s["name"] != "wait-healthy")
        .filter_map(|s| s["durationMs"].as_u64())
        .sum();
    let summary = steps
        .iter()
        .find(|s| s["name"] == "wait-healthy")
        .and_then(|s| s["summary"].as_str())
        .unwrap_or_default();
    let marks = wait_marks(summary);
    let [healthy, _, ready] = [0, 1, 2].map(|i| marks.get(i).copied().unwrap_or_default());
    let kubeconfig = mtime_ms(&root.join("var/lib/kubelet/kubeconfig"), started);
    let cert = mtime_ms(
        &root.join("var/lib/kubelet/pki/kubelet-client-current.pem"),
        started,
    );
    let healthz = before_wait + healthy;
    let mut parts = [
        downloads,
        containerd,
        kubeconfig.saturating_sub(before_wait),
        cert.saturating_sub(kubeconfig),
        healthz.saturating_sub(cert),
        ready.saturating_sub(healthy),
        0,
        total,
    ];
    parts[6] = total.saturating_sub(parts[..6].iter().sum());
    parts
}

fn main() {
    if std::env::var(cluster::OPT_IN).as_deref() != Ok("1") {
        eprintln!("bootstrap bench: skipped; it needs the real cluster: run scripts/bench-none.sh");
        return;
    }
    let cluster = cluster::Cluster::shared();
    println!(
        "control plane ready in {} ms; kubelet {}",
        cluster.start_ms, cluster.kube_version
    );
    let mut totals: Vec<u128> = Vec::new();
    let mut wasm_ms = 0u64;
    let mut cap_ms = 0u64;
    let mut host_ms = 0u64;
    let mut per_step: Vec<(String, Vec<u64>)> = Vec::new();
    let mut splits: Vec<[u64; 8]> = Vec::new();
    // Round 0 warms the compiled-component cache and packs the artifacts; it is not counted.
    for round in 0..=ROUNDS {
        let mut root = NodeRoot::new(RootKind::HarnessRealKubelet);
        let server = ArtifactServer::start_temp();
        let served = serve_artifacts(&server, &cluster.kubelet);
        let name = format!("bench-{round}-{:06x}", fastrand::u32(..1 << 24));
        let opts = NodeOptions::new(&root.root, &name);
        root.write_config(&node_config(
            &ClusterInfo::of_cluster(cluster),
            &served,
            &opts,
        ));
        let t = Instant::now();
        let started = SystemTime::now();
        let out = root
            .command(&["bootstrap", "--output", "json"])
            .output()
            .expect("nodeward runs");
        let elapsed = t.elapsed();
        assert!(
            out.status.success(),
            "bootstrap failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report: Value = serde_json::from_slice(&out.stdout).expect("report");
        let steps = report["steps"].as_array().cloned().unwrap_or_default();
        let parts = split(
            &steps,
            &root.root,
            &root.audit_dir,
            started,
            elapsed.as_millis() as u64,
        );
        if round > 0 {
            totals.push(elapsed.as_millis());
            splits.push(parts);
            for s in &steps {
                let name = s["name"].as_str().unwrap_or_default().to_string();
                let d = s["durationMs"].as_u64().unwrap_or_default();
                let c = s["capabilityMs"].as_u64().unwrap_or_default();
                if s["phase"] == true {
                    wasm_ms += d.saturating_sub(c);
                    cap_ms += c;
                } else {
                    host_ms += d;
                }
                match per_step.iter_mut().find(|(n, _)| *n == name) {
                    Some((_, v)) => v.push(d),
                    None => per_step.push((name, vec![d])),
                }
            }
        }
        let waits = steps
            .iter()
            .find(|s| s["name"] == "wait-healthy")
            .and_then(|s| s["summary"].as_str())
            .unwrap_or_default()
            .to_string();
        println!(
            "round {round}{}: bootstrap → Node Ready {} ms ({waits})",
            if round == 0 { " (warm-up)" } else { "" },
            elapsed.as_millis()
        );
        let line: Vec<String> = SPLIT
            .iter()
            .zip(parts)
            .map(|(name, ms)| format!("{name} {ms}"))
            .collect();
        println!("  split (ms): {}", line.join(", "));
        let reset = root
            .command(&["reset", "--output", "json"])
            .output()
            .expect("reset");
        assert!(
            reset.status.success(),
            "{}",
            String::from_utf8_lossy(&reset.stderr)
        );
        cluster.kubectl_ok(&["delete", "node", &name, "--wait=false"]);
        let _ = root.teardown();
        std::thread::sleep(Duration::from_millis(200));
    }
    totals.sort();
    println!(
        "\nbootstrap → Node Ready over {ROUNDS} rounds: median {} ms (min {}, max {})",
        totals[totals.len() / 2],
        totals[0],
        totals[totals.len() - 1]
    );
    println!("{:<20} {:>10}", "step", "median ms");
    for (name, mut v) in per_step {
        v.sort();
        println!("{:<20} {:>10}", name, v[v.len() / 2]);
    }
    println!("\n{:<24} {:>10}", "split", "median ms");
    for (i, name) in SPLIT.iter().enumerate() {
        let mut v: Vec<u64> = splits.iter().map(|s| s[i]).collect();
        v.sort();
        println!("{:<24} {:>10}", name, v[v.len() / 2]);
    }
    let all = (wasm_ms + cap_ms + host_ms).max(1) as f64;
    println!(
        "\nsummed over rounds: inside WebAssembly {wasm_ms} ms ({:.1}%), in host capability calls {cap_ms} ms ({:.1}%), host steps (waits, state) {host_ms} ms ({:.1}%)",
        100.0 * wasm_ms as f64 / all,
        100.0 * cap_ms as f64 / all,
        100.0 * host_ms as f64 / all
    );
    println!("for scale: AKS reports ~13 s from its provisioning script's start to NodeReady");
    cluster.stop_now();
}
