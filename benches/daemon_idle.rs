//! `nodeward daemon` at rest (issue 14's budget: idle RSS ≤ 20 MB, ~0 % CPU after 5 min idle,
//! no polling loops): a none-mode node joined to the local real cluster with the real kubelet,
//! its Machine, and the daemon (the bench profile's binary: release, LTO, stripped) watching it
//! with the node's own credentials. After its first pass nothing changes; the bench samples
//! `/proc/PID/status` (VmRSS, VmHWM) and `/proc/PID/stat` (utime + stime) over the idle period.
//!
//! Needs the hybrid systemd harness and the kube builds: run `scripts/bench-daemon-idle.sh`.
//! `NODEWARD_BENCH_IDLE_SECS` sets the idle period (default 300). Prints; asserts nothing.

#[path = "../tests/cluster/mod.rs"]
mod cluster;
#[path = "../tests/node/mod.rs"]
mod node;

use node::*;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// One reading of the daemon's `/proc` files.
#[derive(Clone, Copy, Debug)]
struct Sample {
    rss_kib: u64,
    hwm_kib: u64,
    /// utime + stime, in clock ticks.
    cpu_ticks: u64,
    threads: u64,
}

/// A `VmRSS:`-style field of `/proc/PID/status`, in KiB.
fn status_kib(status: &str, field: &str) -> u64 {
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn sample(pid: u32) -> Sample {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("the daemon runs");
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("the daemon runs");
    // Fields after the command name (which may hold spaces) in parentheses: utime is the 14th
    // field of the line, stime the 15th (proc(5)), i.e. the 12th and 13th after ") ".
    let after = stat.rsplit_once(") ").map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    let tick = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    Sample {
        rss_kib: status_kib(&status, "VmRSS:"),
        hwm_kib: status_kib(&status, "VmHWM:"),
        cpu_ticks: tick(11) + tick(12),
        threads: status_kib(&status, "Threads:"),
    }
}

/// Clock ticks per second (`getconf CLK_TCK`; 100 on Linux everywhere this runs).
fn clock_ticks() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

fn main() {
    if std::env::var(cluster::OPT_IN).as_deref() != Ok("1") {
        eprintln!(
            "daemon idle bench: skipped; it needs the real cluster: run scripts/bench-daemon-idle.sh"
        );
        return;
    }
    let idle = Duration::from_secs(
        std::env::var("NODEWARD_BENCH_IDLE_SECS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(300),
    );
    let cluster = cluster::Cluster::shared();
    cluster.install_nodeward_api();

    let mut root = NodeRoot::new(RootKind::HarnessRealKubelet);
    let server = ArtifactServer::start_temp();
    let served = serve_artifacts(&server, &cluster.kubelet);
    let name = format!("idle-{:06x}", fastrand::u32(..1 << 24));
    let opts = NodeOptions::new(&root.root, &name);
    root.write_config(&node_config(
        &ClusterInfo::of_cluster(cluster),
        &served,
        &opts,
    ));
    let out = root.nodeward(&["bootstrap"]);
    assert!(
        out.status.success(),
        "bootstrap: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let machine = root.dir.join("machine.json");
    let version = cluster.kube_version.trim_start_matches('v');
    std::fs::write(
        &machine,
        serde_json::json!({
            "apiVersion": "nodeward.io/v1alpha1",
            "kind": "Machine",
            "metadata": {"name": name},
            "spec": {"kubernetesVersion": version},
        })
        .to_string(),
    )
    .expect("write the Machine");
    cluster.kubectl_ok(&["apply", "-f", &machine.display().to_string()]);

    let kubeconfig = root.root.join("var/lib/kubelet/kubeconfig");
    let log_path = root.dir.join("daemon.log");
    let log = std::fs::File::create(&log_path).expect("daemon log");
    let started = Instant::now();
    let mut daemon = root
        .command(&["daemon", "--metrics-addr", "127.0.0.1:0", "--kubeconfig"])
        .arg(&kubeconfig)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("the daemon starts");
    let pid = daemon.id();
    cluster::wait_for(
        "the daemon's first pass (observedGeneration)",
        Duration::from_secs(60),
        || {
            let m = cluster.get_json(&["get", "machines.nodeward.io", &name])?;
            (m["status"]["observedGeneration"] == m["metadata"]["generation"]).then_some(())
        },
    );
    let first_pass = started.elapsed();
    // Settle: the first pass's allocations returned, the watches established.
    std::thread::sleep(Duration::from_secs(10));
    let before = sample(pid);
    let idle_start = Instant::now();
    let mut peak_rss = before.rss_kib;
    while idle_start.elapsed() < idle {
        std::thread::sleep(Duration::from_secs(5).min(idle));
        peak_rss = peak_rss.max(sample(pid).rss_kib);
    }
    let after = sample(pid);
    let idle_secs = idle_start.elapsed().as_secs_f64();
    let cpu_secs = after.cpu_ticks.saturating_sub(before.cpu_ticks) as f64 / clock_ticks();
    let binary = Path::new(env!("CARGO_BIN_EXE_nodeward"));
    let size = std::fs::metadata(binary).map(|m| m.len()).unwrap_or(0);

    println!("daemon idle ({} binary, {size} bytes):", binary.display());
    println!(
        "  first pass done {:.2} s after start",
        first_pass.as_secs_f64()
    );
    println!(
        "  RSS at idle start {:.1} MiB, after {:.0} s idle {:.1} MiB, peak while idle {:.1} MiB, \
         high-water mark since start {:.1} MiB (budget: idle RSS <= 20 MB)",
        mib(before.rss_kib),
        idle_secs,
        mib(after.rss_kib),
        mib(peak_rss),
        mib(after.hwm_kib)
    );
    println!(
        "  CPU while idle: {cpu_secs:.3} s in {idle_secs:.0} s = {:.4} % of one core ({:.1} ms per hour)",
        100.0 * cpu_secs / idle_secs,
        cpu_secs / idle_secs * 3_600_000.0
    );
    println!("  threads: {}", after.threads);

    // The daemon by its PID (SIGTERM: a clean stop), then the node and its Machine.
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
    let _ = daemon.wait();
    let out = root.nodeward(&["reset"]);
    if !out.status.success() {
        eprintln!("reset: {}", String::from_utf8_lossy(&out.stderr));
    }
    cluster.kubectl(&["delete", "machines.nodeward.io", &name]);
}
