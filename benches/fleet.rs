//! Fleet behaviour by simulation (issue 14, benchmarks): N agents' watch/reconcile loops — the
//! daemon's real loop (`nodeward::daemon::watch::run`) over the real `KubeApi`, each with its
//! own Machine and its own node identity — against the one real API server of the one-VM
//! cluster, with a stand-in node that makes no host change (`fleet/standin.rs`).
//!
//! Measured, and printed (nothing about them is asserted):
//! 1. start: all N agents connect at once; how long until every one watches.
//! 2. a spec change on every Machine, one after another: change → the agent's pass measures
//!    the new generation, and → its status write reaches the API server.
//! 3. the API server restarted (SIGTERM; started again `NODEWARD_FLEET_DOWN_SECS` later,
//!    default 30 s): the time until all N watch again, the spread of their reconnections, the
//!    peak request rate per second, relists; and the attempts the agents made while it was
//!    down (their own warnings: those never reach the server).
//! 4. idle (`NODEWARD_FLEET_IDLE_SECS`, default 660 s: each agent's first resync falls inside):
//!    the requests the API server received from the fleet, per node, extrapolated to an hour;
//!    the busiest second; this process's CPU time per daemon-hour (`/proc/self/stat`).
//!
//! Requests are counted from the API server's audit log (`Cluster::start_audited`), read once
//! the agents have stopped: the v1.20 server logs a quiet watch only once it ends, so the idle
//! phase comes after the restart (whose SIGKILL would cut the first server's watches unlogged)
//! and ends with the agents' stop (which ends every watch). Needs the
//! hybrid systemd harness (the control plane lives in its pid namespace) and the kube builds:
//! run `scripts/bench-fleet.sh`. `NODEWARD_FLEET_AGENTS` (default 200) sets N.

#[path = "fleet/agents.rs"]
mod agents;
#[path = "fleet/audit.rs"]
mod audit;
#[path = "../tests/cluster/mod.rs"]
mod cluster;
#[path = "fleet/report.rs"]
mod report;
#[path = "fleet/standin.rs"]
mod standin;

use agents::{AgentLayer, Observed, name};
use kube::api::{Api, Patch, PatchParams, PostParams};
use nodeward_api::Machine;
use report::{bins, busiest_window, kinds_line, ms, peak, per_second, quantiles, secs_between};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use tracing_subscriber::Layer as _;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

/// The run's shape, from the environment.
struct Plan {
    agents: usize,
    idle: Duration,
    down: Duration,
    /// The longest wait for every agent to watch (at the start, and after the restart).
    reconnect_limit: Duration,
}

fn env_number(key: &str, default: u64) -> u64 {
    match std::env::var(key) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{key}={v}: not a whole number")),
        Err(_) => default,
    }
}

impl Plan {
    fn from_env() -> Plan {
        Plan {
            agents: env_number("NODEWARD_FLEET_AGENTS", 200) as usize,
            idle: Duration::from_secs(env_number("NODEWARD_FLEET_IDLE_SECS", 660)),
            down: Duration::from_secs(env_number("NODEWARD_FLEET_DOWN_SECS", 30)),
            // The watch backoff's ceiling is 5 min: every agent retries within that of the
            // server's return.
            reconnect_limit: Duration::from_secs(env_number("NODEWARD_FLEET_RECONNECT_SECS", 420)),
        }
    }
}

/// What the agents do, seen from their side ([`AgentLayer`]), and the daemon's own log on
/// stderr when `RUST_LOG` asks for it.
fn init_tracing(observed: Arc<Observed>) {
    let counted =
        AgentLayer(observed).with_filter(tracing_subscriber::filter::filter_fn(AgentLayer::wants));
    let log = std::env::var_os("RUST_LOG").map(|_| {
        tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_filter(tracing_subscriber::EnvFilter::from_default_env())
    });
    tracing_subscriber::registry()
        .with(counted)
        .with(log)
        .init();
}

/// The admin's client, on a runtime of the main thread (the agents have their own thread).
struct Admin {
    runtime: tokio::runtime::Runtime,
    machines: Api<Machine>,
}

impl Admin {
    fn new(kubeconfig: &Path) -> Admin {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("the admin's runtime");
        let client = runtime.block_on(async {
            let kubeconfig =
                kube::config::Kubeconfig::read_from(kubeconfig).expect("admin kubeconfig");
            let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
                .await
                .expect("admin config");
            kube::Client::try_from(config).expect("admin client")
        });
        Admin {
            runtime,
            machines: Api::all(client),
        }
    }

    fn create_machines(&self, n: usize, version: &str) {
        self.runtime.block_on(async {
            for i in 0..n {
                let machine: Machine = serde_json::from_value(json!({
                    "apiVersion": "nodeward.io/v1alpha1",
                    "kind": "Machine",
                    "metadata": {"name": name(i)},
                    "spec": {"kubernetesVersion": version},
                }))
                .expect("a Machine");
                self.machines
                    .create(&PostParams::default(), &machine)
                    .await
                    .unwrap_or_else(|e| panic!("creating Machine {}: {e}", name(i)));
            }
        });
    }

    /// Changes agent `i`'s Machine's spec (a label); when the request was sent, and the
    /// generation the server gave the new spec.
    fn change_spec(&self, i: usize) -> (Instant, SystemTime, i64) {
        let patch = json!({"spec": {"labels": {"fleet-bench": "changed"}}});
        let (sent, wall) = (Instant::now(), SystemTime::now());
        let machine = self
            .runtime
            .block_on(
                self.machines
                    .patch(&name(i), &PatchParams::default(), &Patch::Merge(&patch)),
            )
            .unwrap_or_else(|e| panic!("patching Machine {}: {e}", name(i)));
        (
            sent,
            wall,
            machine.metadata.generation.expect("a generation"),
        )
    }
}

/// Polls every second until each of `n` agents watches both its resources again after
/// `after`, at most `limit`; when each did (`None`: not within the limit).
fn wait_watching(
    observed: &Observed,
    n: usize,
    after: SystemTime,
    limit: Duration,
) -> Vec<Option<SystemTime>> {
    let deadline = Instant::now() + limit;
    loop {
        let since = observed.watching_since(n, after, SystemTime::now());
        if since.iter().all(Option::is_some) || Instant::now() > deadline {
            return since;
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// `(median, p90, max)` of `values` as one line in `unit`.
fn spread(values: &[f64], unit: &str) -> String {
    let (median, p90, max) = quantiles(values);
    format!("median {median:.1}{unit}, p90 {p90:.1}{unit}, max {max:.1}{unit}")
}

/// The seconds from `from` at which each agent watched again; the agents that did not.
fn reconnects(since: &[Option<SystemTime>], from: SystemTime) -> (Vec<f64>, usize) {
    let done: Vec<f64> = since
        .iter()
        .flatten()
        .map(|t| secs_between(from, *t))
        .collect();
    let missing = since.len() - done.len();
    (done, missing)
}

/// The phases' boundaries and what was seen live; the audit log is read once the agents have
/// stopped (every watch has ended then, and only then is every watch in it).
struct Run {
    started: SystemTime,
    start_since: Vec<Option<SystemTime>>,
    start_cpu_ms: u64,
    /// Requests the agents sent in the start phase: watches, others.
    start_sent: [u64; 2],
    idle_from: SystemTime,
    idle_to: SystemTime,
    idle_cpu_ms: u64,
    idle_passes: usize,
    idle_sent: [u64; 2],
    /// Watch requests sent per 30 s of the idle phase, and failed attempts in it.
    idle_watch_bins: String,
    idle_failures: u64,
    rss_kib: u64,
    changes: Vec<(SystemTime, Option<Duration>)>,
    restart: cluster::ApiServerRestart,
    restart_since: Vec<Option<SystemTime>>,
    recovery_end: SystemTime,
    recovery_sent: [u64; 2],
    attempts: Vec<[u64; 2]>,
    outage_peak_attempts: u64,
}

fn main() {
    if std::env::var(cluster::OPT_IN).as_deref() != Ok("1") {
        eprintln!("fleet bench: skipped; it needs the real cluster: run scripts/bench-fleet.sh");
        return;
    }
    let plan = Plan::from_env();
    let n = plan.agents;
    let observed = Arc::new(Observed::default());
    init_tracing(observed.clone());

    let cluster = cluster::Cluster::start_audited();
    let log = cluster
        .audit_log
        .clone()
        .expect("an audited cluster names its audit log");
    println!(
        "control plane ready in {} ms (kube-apiserver {}); audit log {}",
        cluster.start_ms,
        cluster.kube_version,
        log.display()
    );
    cluster.install_nodeward_api();
    let dir = tempfile::tempdir().expect("a directory for the kubeconfigs and ledgers");
    let t = Instant::now();
    let agents: Vec<(usize, PathBuf)> = (0..n)
        .map(|i| (i, cluster.node_kubeconfig(&name(i), dir.path())))
        .collect();
    println!(
        "{n} node identities (system:node:fleet-NNN client certificates) in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let admin = Admin::new(&cluster.admin_kubeconfig);
    admin.create_machines(n, cluster.kube_version.trim_start_matches('v'));

    // 1. Start: every agent at once.
    println!("starting {n} agents …");
    let started = SystemTime::now();
    let cpu = agents::cpu_ms();
    let fleet = agents::start(agents, dir.path().join("ledgers"));
    let start_since = wait_watching(&observed, n, started, plan.reconnect_limit);
    let start_cpu_ms = agents::cpu_ms() - cpu;
    let start_sent = observed.sent(started, SystemTime::now() + Duration::from_secs(1));
    // The first passes' status writes come back as Machine events (one more pass each).
    std::thread::sleep(Duration::from_secs(15));

    // 2. A spec change on every Machine, one after another.
    println!("changing {n} specs …");
    let sent: Vec<(Instant, SystemTime, i64)> = (0..n)
        .map(|i| {
            let change = admin.change_spec(i);
            std::thread::sleep(Duration::from_millis(20));
            change
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    let changes = loop {
        let reacted: Vec<(SystemTime, Option<Duration>)> = sent
            .iter()
            .enumerate()
            .map(|(i, (at, wall, generation))| {
                let pass = fleet.passes.first_at_least(i, *generation);
                (*wall, pass.map(|p| p.saturating_duration_since(*at)))
            })
            .collect();
        if reacted.iter().all(|(_, r)| r.is_some()) || Instant::now() > deadline {
            break reacted;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    std::thread::sleep(Duration::from_secs(10));

    // 3. The API server restarted.
    println!(
        "restarting the API server (down {} s) …",
        plan.down.as_secs()
    );
    let failures_before = observed.failures();
    let restart = cluster.restart_apiserver(plan.down);
    let restart_since = wait_watching(&observed, n, restart.stopped, plan.reconnect_limit);
    // What follows the last reconnection (relists, passes) is part of the recovery too.
    std::thread::sleep(Duration::from_secs(20));
    let recovery_end = SystemTime::now();
    let recovery_sent = observed.sent(restart.stopped, recovery_end);
    let failures_after = observed.failures();
    let attempts: Vec<[u64; 2]> = (0..n)
        .map(|i| {
            let [w1, p1] = failures_after.get(&i).copied().unwrap_or_default();
            let [w0, p0] = failures_before.get(&i).copied().unwrap_or_default();
            [w1 - w0, p1 - p0]
        })
        .collect();
    let stopped_second = restart
        .stopped
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let outage_peak_attempts = observed
        .failures_per_second()
        .range(stopped_second..)
        .map(|(_, c)| *c)
        .max()
        .unwrap_or(0);

    // 4. Idle, after the recovery: the audit log then has every watch of it (the first server
    // logs a quiet watch only once it ends, and its restart cut them).
    println!("idle for {} s …", plan.idle.as_secs());
    let passes = fleet.passes.count();
    let failures_at_idle = total_failures(&observed);
    let (idle_from, cpu) = (SystemTime::now(), agents::cpu_ms());
    std::thread::sleep(plan.idle);
    let (idle_to, idle_cpu_ms) = (SystemTime::now(), agents::cpu_ms() - cpu);
    let idle_passes = fleet.passes.count() - passes;
    let idle_sent = observed.sent(idle_from, idle_to);
    let from_second = idle_from
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let idle_watch_bins = bins(
        &observed
            .watches_sent_per_second(idle_from, idle_to)
            .into_iter()
            .map(|(s, c)| (s - from_second, c))
            .collect(),
        30,
        plan.idle.as_secs(),
    );
    let idle_failures = total_failures(&observed) - failures_at_idle;
    let rss_kib = agents::rss_kib();

    // Stop: SIGTERM, as systemd stops the daemon. Every watch ends, so the audit log has them.
    match fleet.stop(Duration::from_secs(30)) {
        Some(exits) => {
            let clean = exits
                .iter()
                .filter(|e| matches!(e, Ok(nodeward::daemon::watch::Exit::Stopped)))
                .count();
            println!("SIGTERM: {clean} of {n} loops stopped cleanly");
            for e in exits.iter().filter_map(|e| e.as_ref().err()).take(5) {
                println!("  an agent ended with: {e}");
            }
        }
        None => println!("SIGTERM: the loops did not all stop within 30 s"),
    }
    std::thread::sleep(Duration::from_secs(2));
    let requests = audit::read(&log);
    drop(admin);
    cluster.stop();
    report_all(
        n,
        &requests,
        &Run {
            started,
            start_since,
            start_cpu_ms,
            start_sent,
            idle_from,
            idle_to,
            idle_cpu_ms,
            idle_passes,
            idle_sent,
            idle_watch_bins,
            idle_failures,
            rss_kib,
            changes,
            restart,
            restart_since,
            recovery_end,
            recovery_sent,
            attempts,
            outage_peak_attempts,
        },
    );
}

/// Failed attempts so far, all agents.
fn total_failures(observed: &Observed) -> u64 {
    observed.failures().values().map(|[w, p]| w + p).sum()
}

/// Prints every figure of the run.
fn report_all(n: usize, requests: &[audit::Request], run: &Run) {
    let mut summary: Vec<String> = Vec::new();
    let lasted: Vec<f64> = requests
        .iter()
        .filter(|r| r.verb == "watch")
        .filter_map(|r| r.lasted().map(|d| d.as_secs_f64()))
        .collect();
    println!(
        "watches in the audit log: {}, of which {} ended, open for {}",
        requests.iter().filter(|r| r.verb == "watch").count(),
        lasted.len(),
        spread(&lasted, " s"),
    );

    let (up, missing) = reconnects(&run.start_since, run.started);
    let all_up = quantiles(&up).2;
    let start_requests = audit::within(
        requests,
        run.started,
        run.started + Duration::from_secs_f64(all_up + 5.0),
    );
    let start_peak = peak(&per_second(
        start_requests.iter().map(|r| r.received),
        run.started,
    ));
    println!(
        "start: {} of {n} agents watching within {all_up:.1} s ({}); the agents sent {} watches \
         and {} other requests; the server logged {} of them (the first server's quiet watches \
         are not: its restart cut them), peak {} req/s; CPU {} ms",
        n - missing,
        spread(&up, " s"),
        run.start_sent[0],
        run.start_sent[1],
        start_requests.len(),
        start_peak.1,
        run.start_cpu_ms,
    );
    println!("  {}", kinds_line(&start_requests, 1.0));

    let pass_ms: Vec<f64> = run.changes.iter().filter_map(|(_, d)| d.map(ms)).collect();
    let written: Vec<f64> = run
        .changes
        .iter()
        .enumerate()
        .filter_map(|(i, (wall, _))| {
            requests
                .iter()
                .find(|r| {
                    r.agent == i
                        && r.verb == "update"
                        && r.resource == "machines/status"
                        && r.received >= *wall
                })
                .map(|r| secs_between(*wall, r.received) * 1000.0)
        })
        .collect();
    println!(
        "spec change → the pass measures it: {} of {n}, {}; → its status write received: {} of {n}, {}",
        pass_ms.len(),
        spread(&pass_ms, " ms"),
        written.len(),
        spread(&written, " ms"),
    );
    summary.push(format!(
        "spec change → reconcile: {}",
        spread(&pass_ms, " ms")
    ));

    let r = &run.restart;
    let down = secs_between(r.stopped, r.ready);
    let (back, missing) = reconnects(&run.restart_since, r.ready);
    let all_back = quantiles(&back).2;
    let reconnect_buckets = per_second(run.restart_since.iter().flatten().copied(), r.ready);
    let until = secs_between(r.ready, run.recovery_end).ceil() as u64;
    println!(
        "restart: SIGTERM → exit {:.1} s, → started {:.1} s, → /readyz {down:.1} s; {} of {n} agents \
         watching again {all_back:.1} s after /readyz ({:.1} s after the SIGTERM); reconnections \
         after /readyz {}, most in one second {}",
        secs_between(r.stopped, r.exited),
        secs_between(r.stopped, r.started),
        n - missing,
        all_back + down,
        spread(&back, " s"),
        peak(&reconnect_buckets).1,
    );
    println!(
        "  reconnections per 10 s after /readyz: {}",
        bins(&reconnect_buckets, 10, until)
    );
    let recovery = audit::within(requests, r.stopped, run.recovery_end);
    let buckets = per_second(recovery.iter().map(|q| q.received), r.ready);
    let (peak_at, peak_rate) = peak(&buckets);
    let failed_at_once = recovery
        .iter()
        .filter(|q| q.verb == "watch" && q.lasted().is_some_and(|d| d < Duration::from_secs(1)))
        .count();
    let lists = recovery.iter().filter(|q| q.verb == "list").count();
    println!(
        "  received from the SIGTERM to +{until} s after /readyz: {} ({}); {failed_at_once} watches \
         ended within 1 s (410 Gone: too old for the new server), {lists} lists (relists); \
         peak {peak_rate} req/s at +{peak_at} s, busiest 10 s {}; the agents counted {} watches \
         and {} other requests sent",
        recovery.len(),
        kinds_line(&recovery, 1.0),
        busiest_window(&buckets, 10),
        run.recovery_sent[0],
        run.recovery_sent[1],
    );
    println!(
        "  received per 10 s after /readyz: {}",
        bins(&buckets, 10, until)
    );
    let per_agent: Vec<f64> = run.attempts.iter().map(|[w, p]| (w + p) as f64).collect();
    let total: u64 = run.attempts.iter().map(|[w, p]| w + p).sum();
    let by_passes: u64 = run.attempts.iter().map(|[_, p]| p).sum();
    println!(
        "  failed attempts while it was away (the agents' own warnings; none reach the server): \
         {total} in all ({by_passes} by passes), per agent {}; at most {} in one second",
        spread(&per_agent, ""),
        run.outage_peak_attempts,
    );
    if total == 0 {
        println!(
            "  (no failure warning seen at all: has the loop's warning text changed? benches/fleet/agents.rs matches it)"
        );
    }
    summary.push(format!(
        "API server restart (down {down:.0} s): {} of {n} watching again {all_back:.0} s after /readyz \
         ({:.0} s after the SIGTERM), reconnections {}; peak {peak_rate} req/s; {lists} relists; \
         failed attempts per agent while down {}",
        n - missing,
        all_back + down,
        spread(&back, " s"),
        spread(&per_agent, ""),
    ));

    let idle_secs = secs_between(run.idle_from, run.idle_to);
    let hours = idle_secs / 3600.0;
    let idle = audit::within(requests, run.idle_from, run.idle_to);
    let per_node_hour = idle.len() as f64 / n as f64 / hours;
    let cpu_per_daemon_hour = run.idle_cpu_ms as f64 / n as f64 / hours;
    let idle_buckets = per_second(idle.iter().map(|r| r.received), run.idle_from);
    let idle_peak = peak(&idle_buckets);
    println!(
        "idle {idle_secs:.0} s, extrapolated to an hour: {} requests = {per_node_hour:.1} req/node/h \
         ({}); busiest second {} req (+{} s), busiest 10 s {} req; {} passes (resyncs); \
         the agents counted {} watches and {} other requests sent",
        idle.len(),
        kinds_line(&idle, 1.0 / n as f64 / hours),
        idle_peak.1,
        idle_peak.0,
        busiest_window(&idle_buckets, 10),
        run.idle_passes,
        run.idle_sent[0],
        run.idle_sent[1],
    );
    println!(
        "  watches sent per 30 s of it (the agents' count): {}; failed attempts in it: {}",
        run.idle_watch_bins, run.idle_failures
    );
    println!(
        "idle CPU: {} ms for {n} agents in {idle_secs:.0} s = {cpu_per_daemon_hour:.1} ms per daemon-hour; \
         process RSS {:.1} MiB ({:.2} MiB per agent, the shared runtime included)",
        run.idle_cpu_ms,
        run.rss_kib as f64 / 1024.0,
        run.rss_kib as f64 / 1024.0 / n as f64,
    );
    summary.push(format!(
        "idle: {per_node_hour:.1} requests per node per hour (measured over {idle_secs:.0} s, extrapolated); \
         busiest second {} req, busiest 10 s {} req; {cpu_per_daemon_hour:.1} ms CPU per daemon-hour",
        idle_peak.1,
        busiest_window(&idle_buckets, 10),
    ));

    println!("--- fleet of {n} agents: figures ---");
    for line in summary {
        println!("{line}");
    }
}
