//! Time from `nodeward bootstrap` to Node Ready against the local real cluster (warm caches:
//! compiled phases, packed artifacts), split per step (the critical path is the sequence
//! itself), and the time spent inside WebAssembly vs in host capability calls.
//!
//! Needs the hybrid systemd harness and the kube builds: run `scripts/bench-none.sh`, which
//! starts them and runs this inside. Prints; asserts nothing about speed.

#[path = "../tests/cluster/mod.rs"]
mod cluster;
#[path = "../tests/node/mod.rs"]
mod node;

use node::*;
use serde_json::Value;
use std::time::{Duration, Instant};

const ROUNDS: usize = 3;

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
        if round > 0 {
            totals.push(elapsed.as_millis());
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
