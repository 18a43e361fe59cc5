//! The daemon's Prometheus metrics (`prometheus-client`), served as OpenMetrics text on a
//! loopback address.
//!
//! # Background
//! A fleet operator wants to see, per node, whether the daemon reconciles, how long a pass
//! takes, when one last succeeded, and which phase bundle runs, without reading each node's
//! journal. The endpoint is deliberately tiny: one thread, one request per connection, `GET
//! /metrics` only, so it adds neither an HTTP stack nor an async runtime to the agent.
//!
//! # Metrics
//! - `nodeward_daemon_reconciles_total{result}`: passes by result (`success`, `error`,
//!   `conflict`: a status write refused with 409 and retried).
//! - `nodeward_daemon_reconcile_duration_seconds`: how long a pass took (histogram).
//! - `nodeward_daemon_last_successful_reconcile_timestamp_seconds`: Unix time of the last
//!   successful pass.
//! - `nodeward_daemon_active_bundle_info{name,version,digest}`: 1 for the bundle that runs.
//! - `nodeward_daemon_phase_duration_seconds{phase,outcome}`: how long each phase of the
//!   daemon's child runs took (histogram), read from their audit records
//!   ([`crate::daemon::run_metrics`]); at most [`MAX_PHASE_LABELS`] phase names, later ones as
//!   `other` (a bundle names its phases).
//! - `nodeward_daemon_capability_calls_total{interface,denied}`: capability calls those runs
//!   made, by WIT interface, and whether the grant refused them.
//!
//! # Guarantees
//! - [`serve`] refuses an address that is not loopback: the metrics name the node's bundle and
//!   are not meant for the network (`--metrics-addr`, default `127.0.0.1:9464`).
//! - A request is read with a deadline and a size bound, so a client that never finishes its
//!   request cannot hold the endpoint.

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::io::{self, Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How a reconcile pass ended, as the `result` label says it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReconcileResult {
    /// The pass finished and its status was written (or needed no write).
    Success,
    /// The pass failed (the API server unreachable, a node operation failed).
    Error,
    /// A status write was refused with 409 Conflict and is retried.
    Conflict,
}

impl ReconcileResult {
    fn label(self) -> &'static str {
        match self {
            ReconcileResult::Success => "success",
            ReconcileResult::Error => "error",
            ReconcileResult::Conflict => "conflict",
        }
    }
}

type Labels = Vec<(&'static str, String)>;

/// The daemon's metrics; cheap to clone (every metric is shared).
#[derive(Clone)]
pub struct Metrics {
    registry: Arc<Registry>,
    reconciles: Family<Labels, Counter>,
    duration: Histogram,
    last_success: Gauge<f64, AtomicU64>,
    bundle: Family<Labels, Gauge>,
    phases: Family<Labels, Histogram>,
    phase_names: Arc<std::sync::Mutex<std::collections::BTreeSet<String>>>,
    calls: Family<Labels, Counter>,
}

/// The most distinct phase names the phase-duration metric labels.
pub const MAX_PHASE_LABELS: usize = 64;

/// The WIT interfaces a capability call's label may name; anything else is `other`.
const INTERFACES: [&str; 8] = [
    "fs", "kernel", "systemd", "mounts", "download", "network", "cgroups", "log",
];

impl Metrics {
    /// The metrics, registered and at zero.
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let reconciles = Family::<Labels, Counter>::default();
        registry.register(
            "nodeward_daemon_reconciles",
            "Reconcile passes of the node's Machine, by result",
            reconciles.clone(),
        );
        // 10 ms up to ~11 min: a pass that runs an upgrade takes minutes.
        let duration = Histogram::new(exponential_buckets(0.01, 2.0, 17));
        registry.register(
            "nodeward_daemon_reconcile_duration_seconds",
            "How long a reconcile pass took",
            duration.clone(),
        );
        let last_success = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "nodeward_daemon_last_successful_reconcile_timestamp_seconds",
            "Unix time of the last successful reconcile pass",
            last_success.clone(),
        );
        let bundle = Family::<Labels, Gauge>::default();
        registry.register(
            "nodeward_daemon_active_bundle_info",
            "The phase bundle the node runs (1)",
            bundle.clone(),
        );
        let phases = Family::<Labels, Histogram>::new_with_constructor(
            (|| Histogram::new(exponential_buckets(0.01, 2.0, 17))) as fn() -> Histogram,
        );
        registry.register(
            "nodeward_daemon_phase_duration_seconds",
            "How long a phase of the daemon's node operations took, by phase and outcome",
            phases.clone(),
        );
        let calls = Family::<Labels, Counter>::default();
        registry.register(
            "nodeward_daemon_capability_calls",
            "Capability calls of the daemon's node operations, by interface and refusal",
            calls.clone(),
        );
        Metrics {
            registry: Arc::new(registry),
            reconciles,
            duration,
            last_success,
            bundle,
            phases,
            phase_names: Arc::default(),
            calls,
        }
    }

    /// Records a phase run: its name, `ok` or `failed`, and how long it took.
    pub fn phase_ran(&self, phase: &str, outcome: &str, took: Duration) {
        let label = {
            let mut names = self.phase_names.lock().unwrap_or_else(|p| p.into_inner());
            if names.contains(phase) || names.len() < MAX_PHASE_LABELS {
                names.insert(phase.to_string());
                phase.to_string()
            } else {
                "other".to_string()
            }
        };
        self.phases
            .get_or_create(&vec![("phase", label), ("outcome", outcome.to_string())])
            .observe(took.as_secs_f64());
    }

    /// Records `count` capability calls of `call` (`interface.function`), refused or not.
    pub fn capability_calls(&self, call: &str, denied: bool, count: u64) {
        let interface = call.split('.').next().unwrap_or_default();
        let interface = INTERFACES
            .iter()
            .find(|i| **i == interface)
            .copied()
            .unwrap_or("other");
        self.calls
            .get_or_create(&vec![
                ("interface", interface.to_string()),
                ("denied", denied.to_string()),
            ])
            .inc_by(count);
    }

    /// Records a pass that ended with `result` after `took`, at `now`.
    pub fn reconciled(&self, result: ReconcileResult, took: Duration, now: SystemTime) {
        self.reconciles
            .get_or_create(&vec![("result", result.label().to_string())])
            .inc();
        self.duration.observe(took.as_secs_f64());
        // A clock before 1970 is not a time worth reporting: the gauge keeps its last value.
        if result == ReconcileResult::Success
            && let Ok(unix) = now.duration_since(UNIX_EPOCH)
        {
            self.last_success.set(unix.as_secs_f64());
        }
    }

    /// Sets the bundle that runs (the previous one's series goes away).
    pub fn active_bundle(&self, name: &str, version: i64, digest: &str) {
        self.bundle.clear();
        self.bundle
            .get_or_create(&vec![
                ("name", name.to_string()),
                ("version", version.to_string()),
                ("digest", digest.to_string()),
            ])
            .set(1);
    }

    /// The metrics as OpenMetrics text.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

/// Why the endpoint could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The address is not a loopback one.
    #[error("--metrics-addr {0} is not a loopback address: metrics are served on localhost only")]
    NotLoopback(SocketAddr),
    /// The address could not be bound.
    #[error("binding the metrics endpoint {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: io::Error,
    },
}

/// The bound on a request's head, and how long a client may take to send it.
const MAX_REQUEST: usize = 8 * 1024;
const REQUEST_DEADLINE: Duration = Duration::from_secs(5);

/// Binds `addr` (loopback only) and serves `metrics` on a thread of its own until the process
/// ends. Returns the bound address (with the port chosen when `addr` asked for 0).
pub fn serve(metrics: Metrics, addr: SocketAddr) -> Result<SocketAddr, ServeError> {
    if !addr.ip().is_loopback() {
        return Err(ServeError::NotLoopback(addr));
    }
    let listener = TcpListener::bind(addr).map_err(|source| ServeError::Bind { addr, source })?;
    let bound = listener
        .local_addr()
        .map_err(|source| ServeError::Bind { addr, source })?;
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || {
            for stream in listener.incoming() {
                match stream {
                    Ok(s) => {
                        if let Err(e) = answer(&metrics, s) {
                            tracing::debug!(error = %e, "metrics request");
                        }
                    }
                    Err(e) => tracing::debug!(error = %e, "metrics accept"),
                }
            }
        })
        .map_err(|source| ServeError::Bind { addr, source })?;
    Ok(bound)
}

/// Reads one request head and answers it.
fn answer(metrics: &Metrics, mut stream: TcpStream) -> io::Result<()> {
    stream.set_read_timeout(Some(REQUEST_DEADLINE))?;
    stream.set_write_timeout(Some(REQUEST_DEADLINE))?;
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < MAX_REQUEST {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let first = match head.split(|&b| b == b'\n').next() {
        Some(line) => String::from_utf8_lossy(line).into_owned(),
        None => String::new(),
    };
    let mut parts = first.split_whitespace();
    let (status, content_type, body) = match (parts.next(), parts.next()) {
        (Some("GET"), Some("/metrics")) => (
            "200 OK",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            metrics.render(),
        ),
        (Some("GET"), Some(_)) => ("404 Not Found", "text/plain", "GET /metrics\n".into()),
        _ => (
            "405 Method Not Allowed",
            "text/plain",
            "GET /metrics\n".into(),
        ),
    };
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(response.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(addr: SocketAddr, request: &str) -> String {
        let mut s = TcpStream::connect(addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        s.write_all(request.as_bytes()).expect("request");
        let mut out = String::new();
        s.read_to_string(&mut out).expect("response");
        out
    }

    #[test]
    fn reconciles_duration_last_success_and_bundle_are_rendered() {
        let m = Metrics::new();
        let now = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        m.reconciled(ReconcileResult::Success, Duration::from_millis(40), now);
        m.reconciled(ReconcileResult::Conflict, Duration::from_millis(5), now);
        m.reconciled(
            ReconcileResult::Error,
            Duration::from_secs(2),
            now + Duration::from_secs(60),
        );
        m.active_bundle("default", 2, "aa");
        m.active_bundle("default", 3, "bb");
        let text = m.render();
        for line in [
            "nodeward_daemon_reconciles_total{result=\"success\"} 1",
            "nodeward_daemon_reconciles_total{result=\"conflict\"} 1",
            "nodeward_daemon_reconciles_total{result=\"error\"} 1",
            "nodeward_daemon_reconcile_duration_seconds_count 3",
            "nodeward_daemon_last_successful_reconcile_timestamp_seconds 1800000000.0",
            "nodeward_daemon_active_bundle_info{name=\"default\",version=\"3\",digest=\"bb\"} 1",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in:\n{text}"
            );
        }
        assert!(
            !text.contains("digest=\"aa\""),
            "the old bundle's series:\n{text}"
        );
        assert!(text.ends_with("# EOF\n"), "{text}");
    }

    #[test]
    fn the_endpoint_serves_metrics_on_loopback() {
        let m = Metrics::new();
        m.reconciled(
            ReconcileResult::Success,
            Duration::from_millis(1),
            SystemTime::now(),
        );
        let addr = serve(m, "127.0.0.1:0".parse().expect("addr")).expect("serve");
        let response = get(addr, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{response}");
        assert!(
            response.contains("application/openmetrics-text"),
            "{response}"
        );
        assert!(
            response.contains("nodeward_daemon_reconciles_total{result=\"success\"} 1"),
            "{response}"
        );
        let other = get(addr, "GET / HTTP/1.1\r\n\r\n");
        assert!(other.starts_with("HTTP/1.1 404"), "{other}");
        let post = get(addr, "POST /metrics HTTP/1.1\r\n\r\n");
        assert!(post.starts_with("HTTP/1.1 405"), "{post}");
    }

    #[test]
    fn phase_durations_and_capability_calls_are_rendered_with_bounded_labels() {
        let m = Metrics::new();
        m.phase_ran("configure", "ok", Duration::from_millis(250));
        m.capability_calls("fs.write-file", false, 3);
        m.capability_calls("fs.read-file", true, 1);
        m.capability_calls("evil\n.call", false, 1);
        for i in 0..MAX_PHASE_LABELS + 5 {
            m.phase_ran(&format!("p{i}"), "failed", Duration::from_millis(1));
        }
        let text = m.render();
        assert!(
            text.contains(
                "nodeward_daemon_phase_duration_seconds_count{phase=\"configure\",outcome=\"ok\"} 1"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "nodeward_daemon_capability_calls_total{interface=\"fs\",denied=\"false\"} 3"
            ),
            "{text}"
        );
        assert!(
            text.contains("interface=\"fs\",denied=\"true\"} 1"),
            "{text}"
        );
        assert!(text.contains("interface=\"other\""), "{text}");
        // The first 64 names (configure among them), then `other`.
        assert!(
            text.contains("phase=\"other\",outcome=\"failed\"} 6"),
            "{text}"
        );
        assert!(!text.contains("phase=\"p64\""), "{text}");
    }

    #[test]
    fn a_non_loopback_address_is_refused() {
        let addr: SocketAddr = "0.0.0.0:0".parse().expect("addr");
        match serve(Metrics::new(), addr) {
            Err(ServeError::NotLoopback(a)) => assert_eq!(a, addr),
            other => panic!("{:?}", other.map(|_| ())),
        }
    }
}
