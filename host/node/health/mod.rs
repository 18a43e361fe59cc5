//! Waiting for a started node to be healthy: the kubelet's health endpoint, then its TLS
//! bootstrap (the kubeconfig it writes once its CSR is signed), then the Node Ready through the
//! API server with the kubelet's own credentials.
//!
//! Each wait has its own deadline and fails with a [`WaitError`] naming what it waited for and
//! the last thing it saw, e.g. the API server URL that refused connections. This changes
//! nothing on the host, which is why it is host code and not a phase.

use nodeward_node_config::NodeConfig;
use nodeward_node_config::layout::{KUBELET_HEALTHZ_PORT, KUBELET_KUBECONFIG, Layout};
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A wait that did not finish.
#[derive(Debug, thiserror::Error)]
pub enum WaitError {
    /// The deadline passed.
    #[error("timed out after {waited:?} waiting for {what}: {last}")]
    Timeout {
        /// What was awaited, naming the URL or file.
        what: String,
        /// How long.
        waited: Duration,
        /// The last observation.
        #[source]
        last: NotYet,
    },
    /// The kubeconfig the kubelet wrote cannot be used.
    #[error("{path}: {message}")]
    Kubeconfig {
        /// The file.
        path: String,
        /// What is wrong.
        message: String,
        /// The underlying error, where there is one.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
}

/// What one look at the node saw instead of health: the observation a timeout reports.
#[derive(Debug, thiserror::Error)]
pub enum NotYet {
    /// An HTTP client could not be made.
    #[error("{0}")]
    Client(#[source] reqwest::Error),
    /// The kubelet's health endpoint did not answer.
    #[error("{}", crate::errors::chain(.0))]
    Health(#[source] reqwest::Error),
    /// The kubelet's health endpoint's body could not be read (or was cut off).
    #[error("{url}: {source}")]
    HealthBody {
        /// The health endpoint.
        url: String,
        /// Why.
        source: std::io::Error,
    },
    /// The kubelet's health endpoint answered, but not `ok`.
    #[error("HTTP {status}: {body}")]
    Unhealthy {
        /// The status.
        status: reqwest::StatusCode,
        /// The body, trimmed, at most [`HEALTH_BODY_MAX`] bytes of it.
        body: String,
    },
    /// The configured API server is not a URL.
    #[error("{api}: {source}")]
    ApiUrl {
        /// The API server.
        api: String,
        /// What the parser said.
        source: url::ParseError,
    },
    /// The API server's name does not resolve.
    #[error("API server {api}: cannot resolve: {source}")]
    ApiResolve {
        /// The API server.
        api: String,
        /// Why.
        source: std::io::Error,
    },
    /// The API server's name resolves to nothing.
    #[error("API server {api}: no address")]
    ApiNoAddress {
        /// The API server.
        api: String,
    },
    /// No address of the API server accepts TCP connections.
    #[error("API server {api} unreachable: {source}")]
    ApiUnreachable {
        /// The API server.
        api: String,
        /// The last address's error.
        source: std::io::Error,
    },
    /// The API server is reachable but the kubelet has not written its kubeconfig.
    #[error("{path} not written yet; API server {api} is reachable (is the CSR approved?)")]
    NoKubeconfig {
        /// The kubeconfig the kubelet writes.
        path: String,
        /// The API server.
        api: String,
    },
    /// The API server did not answer the kubelet's client.
    #[error("API server {server} unreachable: {}", crate::errors::chain(source))]
    NodeUnreachable {
        /// The API server.
        server: String,
        /// Why.
        source: reqwest::Error,
    },
    /// The API server refused the request for the Node.
    #[error("GET {url}: HTTP {status}")]
    NodeStatus {
        /// The Node's URL.
        url: String,
        /// The status.
        status: reqwest::StatusCode,
    },
    /// The Node's body could not be read.
    #[error("GET {url}: {source}")]
    NodeBody {
        /// The Node's URL.
        url: String,
        /// Why.
        source: std::io::Error,
    },
    /// The Node's body is longer than any Node the agent reads.
    #[error("GET {url}: the body is longer than {NODE_BODY_MAX} bytes")]
    NodeTooLarge {
        /// The Node's URL.
        url: String,
    },
    /// The Node's body is not JSON.
    #[error("GET {url}: not JSON: {source}")]
    NodeJson {
        /// The Node's URL.
        url: String,
        /// What the parser said.
        source: serde_json::Error,
    },
    /// The Ready condition is the previous kubelet's.
    #[error(
        "Node {name}'s Ready condition is from before the kubelet restarted (heartbeat {heartbeat})"
    )]
    StaleReady {
        /// The Node.
        name: String,
        /// Its `lastHeartbeatTime`.
        heartbeat: String,
    },
    /// The Node is not Ready.
    #[error("Node {name} is not Ready: {reason} ({message})")]
    NotReady {
        /// The Node.
        name: String,
        /// The condition's reason.
        reason: String,
        /// The condition's message.
        message: String,
    },
    /// The Node has no Ready condition.
    #[error("Node {name} has no Ready condition yet")]
    NoReadyCondition {
        /// The Node.
        name: String,
    },
}

/// What the Node looks like once Ready.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeReady {
    /// `status.nodeInfo.kubeletVersion`.
    pub kubelet_version: String,
}

/// The kubelet's health URL from its configuration (`healthzBindAddress`, `healthzPort`).
pub fn healthz_url(config: &NodeConfig) -> String {
    let port = config
        .kubelet
        .config
        .get("healthzPort")
        .and_then(|v| v.as_u64())
        .unwrap_or(u64::from(KUBELET_HEALTHZ_PORT));
    let addr = config
        .kubelet
        .config
        .get("healthzBindAddress")
        .and_then(|v| v.as_str())
        .unwrap_or("127.0.0.1");
    format!("http://{addr}:{port}/healthz")
}

/// The client the kubelet health checks use: made once per wait and reused by every look
/// (every [`LOCAL_POLL`]), so a wait keeps one connection pool instead of building a client,
/// and its pool, ten times a second.
fn health_client() -> Result<reqwest::blocking::Client, NotYet> {
    reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .map_err(NotYet::Client)
}

/// One GET of the kubelet's health endpoint: Ok when it answers 200 `ok`.
pub fn kubelet_healthy(config: &NodeConfig) -> Result<(), NotYet> {
    kubelet_healthy_with(&health_client()?, &healthz_url(config))
}

/// One GET of `url` with `client`: Ok when it answers 200 `ok`.
fn kubelet_healthy_with(client: &reqwest::blocking::Client, url: &str) -> Result<(), NotYet> {
    let resp = client.get(url).send().map_err(NotYet::Health)?;
    let status = resp.status();
    // A body cut off is no answer: the observation is the read error (it names the URL).
    // Whatever listens on the port, the agent reads at most HEALTH_BODY_MAX bytes of it.
    // One byte more than that tells a longer body, which is never `ok`, from one that fits.
    let body = read_capped(resp, HEALTH_BODY_MAX + 1).map_err(|source| NotYet::HealthBody {
        url: url.to_string(),
        source,
    })?;
    let whole = body.len() as u64 <= HEALTH_BODY_MAX;
    let body = String::from_utf8_lossy(&body[..body.len().min(HEALTH_BODY_MAX as usize)]);
    if status.is_success() && whole && body.trim() == "ok" {
        Ok(())
    } else {
        let more = if whole {
            String::new()
        } else {
            format!(" … (longer than {HEALTH_BODY_MAX} bytes)")
        };
        Err(NotYet::Unhealthy {
            status,
            body: format!("{}{more}", body.trim()),
        })
    }
}

/// Most bytes of the kubelet health endpoint's body read: `ok`, or a short reason; anything
/// else listening on the port answers with no more than this kept.
pub const HEALTH_BODY_MAX: u64 = 4096;

/// Most bytes of a Node object read from the API server: a Node with hundreds of images and
/// volumes is well under 1 MiB; a longer body is refused, not held.
pub const NODE_BODY_MAX: u64 = 8 << 20;

/// Reads at most `cap` bytes of `from` (the rest is left unread).
fn read_capped(from: impl std::io::Read, cap: u64) -> std::io::Result<Vec<u8>> {
    let mut body = Vec::new();
    std::io::Read::read_to_end(&mut from.take(cap), &mut body)?;
    Ok(body)
}

/// How often a wait looks again at something on this host (the kubelet's health endpoint on
/// loopback, the kubeconfig file): cheap, and each look sooner is up to that much off a
/// bootstrap.
const LOCAL_POLL: Duration = Duration::from_millis(100);

/// How often the Node Ready wait asks the API server: a GET per look, from every node that
/// bootstraps at once.
const API_POLL: Duration = Duration::from_millis(250);

fn poll<T>(
    what: &str,
    timeout: Duration,
    every: Duration,
    mut f: impl FnMut() -> Result<T, NotYet>,
) -> Result<T, WaitError> {
    let started = Instant::now();
    loop {
        match f() {
            Ok(v) => return Ok(v),
            Err(last) if started.elapsed() >= timeout => {
                return Err(WaitError::Timeout {
                    what: what.to_string(),
                    waited: started.elapsed(),
                    last,
                });
            }
            Err(_) => std::thread::sleep(every),
        }
    }
}

/// Waits for the kubelet's health endpoint.
pub fn wait_kubelet(config: &NodeConfig, timeout: Duration) -> Result<(), WaitError> {
    let url = healthz_url(config);
    let what = format!("kubelet health at {url}");
    // One client for the whole wait; made again only while making it fails.
    let mut client = None;
    poll(&what, timeout, LOCAL_POLL, || {
        let c = match client.take() {
            Some(c) => c,
            None => health_client()?,
        };
        let healthy = kubelet_healthy_with(&c, &url);
        client = Some(c);
        healthy
    })
}

/// Whether the API server accepts TCP connections (for naming it when the bootstrap stalls).
fn api_reachable(api: &str) -> Result<(), NotYet> {
    let url = url::Url::parse(api).map_err(|source| NotYet::ApiUrl {
        api: api.to_string(),
        source,
    })?;
    let host = url.host_str().unwrap_or_default().to_string();
    let port = url.port_or_known_default().unwrap_or(443);
    let addrs =
        std::net::ToSocketAddrs::to_socket_addrs(&(host.as_str(), port)).map_err(|source| {
            NotYet::ApiResolve {
                api: api.to_string(),
                source,
            }
        })?;
    let mut last = NotYet::ApiNoAddress {
        api: api.to_string(),
    };
    for a in addrs {
        match std::net::TcpStream::connect_timeout(&a, Duration::from_secs(2)) {
            Ok(_) => return Ok(()),
            Err(source) => {
                last = NotYet::ApiUnreachable {
                    api: api.to_string(),
                    source,
                }
            }
        }
    }
    Err(last)
}

/// Waits for the kubelet's TLS bootstrap: the kubeconfig it writes once its client certificate
/// is signed. While it is missing, the last observation names the API server if that is
/// unreachable.
pub fn wait_tls_bootstrap(
    config: &NodeConfig,
    layout: &Layout,
    timeout: Duration,
) -> Result<PathBuf, WaitError> {
    let path = PathBuf::from(layout.abs(KUBELET_KUBECONFIG));
    let what = format!(
        "the kubelet's TLS bootstrap ({} to be written)",
        path.display()
    );
    poll(&what, timeout, LOCAL_POLL, || {
        if path.is_file() {
            return Ok(path.clone());
        }
        api_reachable(&config.cluster.api_server)?;
        Err(NotYet::NoKubeconfig {
            path: path.display().to_string(),
            api: config.cluster.api_server.clone(),
        })
    })
}

#[derive(Deserialize)]
struct Kubeconfig {
    #[serde(default)]
    clusters: Vec<NamedCluster>,
    #[serde(default)]
    users: Vec<NamedUser>,
}

#[derive(Deserialize)]
struct NamedCluster {
    cluster: ClusterEntry,
}

#[derive(Deserialize)]
struct NamedUser {
    #[serde(default)]
    user: UserEntry,
}

#[derive(Deserialize)]
struct ClusterEntry {
    server: String,
    #[serde(rename = "certificate-authority")]
    ca_file: Option<String>,
    #[serde(rename = "certificate-authority-data")]
    ca_data: Option<String>,
}

#[derive(Deserialize, Default)]
struct UserEntry {
    #[serde(rename = "client-certificate")]
    cert_file: Option<String>,
    #[serde(rename = "client-key")]
    key_file: Option<String>,
    token: Option<String>,
}

/// An API client with the kubelet's credentials from the kubeconfig it wrote.
struct KubeletClient {
    server: String,
    client: reqwest::blocking::Client,
    token: Option<String>,
}

fn kubelet_client(path: &Path, config: &NodeConfig) -> Result<KubeletClient, WaitError> {
    // `what: <source>`, or the source alone when `what` is empty; the source is kept.
    let err = |what: &str, e: Box<dyn std::error::Error + Send + Sync>| WaitError::Kubeconfig {
        path: path.display().to_string(),
        message: if what.is_empty() {
            e.to_string()
        } else {
            format!("{what}: {e}")
        },
        source: Some(e),
    };
    let text = std::fs::read_to_string(path).map_err(|e| err("cannot read", e.into()))?;
    let kc: Kubeconfig =
        serde_yaml_ng::from_str(&text).map_err(|e| err("not a kubeconfig", e.into()))?;
    let cluster = kc
        .clusters
        .first()
        .map(|c| &c.cluster)
        .ok_or_else(|| WaitError::Kubeconfig {
            path: path.display().to_string(),
            message: "has no cluster".into(),
            source: None,
        })?;
    let user = kc.users.first().map(|u| &u.user);
    let ca_pem = match (&cluster.ca_data, &cluster.ca_file) {
        (Some(data), _) => {
            use base64::Engine as _;
            base64::engine::general_purpose::STANDARD
                .decode(data.trim())
                .map_err(|e| err("certificate-authority-data", e.into()))?
        }
        (None, Some(file)) => std::fs::read(file)
            .map_err(|e| err(&format!("certificate-authority {file}"), e.into()))?,
        (None, None) => config
            .ca_cert_pem()
            .map(String::into_bytes)
            .map_err(|e| err("", e.into()))?,
    };
    let ca = reqwest::Certificate::from_pem(&ca_pem).map_err(|e| err("CA", e.into()))?;
    let mut builder = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(5))
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(ca);
    let mut token = None;
    if let Some(u) = user {
        if let Some(cert) = &u.cert_file {
            let mut pem = std::fs::read(cert)
                .map_err(|e| err(&format!("client-certificate {cert}"), e.into()))?;
            if let Some(key) = &u.key_file
                && key != cert
            {
                pem.extend(
                    std::fs::read(key).map_err(|e| err(&format!("client-key {key}"), e.into()))?,
                );
            }
            let id = reqwest::Identity::from_pem(&pem)
                .map_err(|e| err("client certificate", e.into()))?;
            builder = builder.identity(id);
        }
        token = u.token.clone();
    }
    let client = builder.build().map_err(|e| WaitError::Kubeconfig {
        path: path.display().to_string(),
        message: crate::errors::chain(&e),
        source: Some(e.into()),
    })?;
    Ok(KubeletClient {
        server: cluster.server.trim_end_matches('/').to_string(),
        client,
        token,
    })
}

/// One look at the Node: Ok once its Ready condition is True.
fn node_ready_once(
    c: &KubeletClient,
    name: &str,
    since: Option<std::time::SystemTime>,
) -> Result<NodeReady, NotYet> {
    let url = format!("{}/api/v1/nodes/{name}", c.server);
    let mut req = c.client.get(&url);
    if let Some(t) = &c.token {
        req = req.bearer_auth(t);
    }
    let resp = req.send().map_err(|source| NotYet::NodeUnreachable {
        server: c.server.clone(),
        source,
    })?;
    let status = resp.status();
    if !status.is_success() {
        return Err(NotYet::NodeStatus { url, status });
    }
    let body = match read_capped(resp, NODE_BODY_MAX + 1) {
        Ok(b) if b.len() as u64 > NODE_BODY_MAX => return Err(NotYet::NodeTooLarge { url }),
        Ok(b) => b,
        Err(source) => return Err(NotYet::NodeBody { url, source }),
    };
    let node: serde_json::Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(source) => return Err(NotYet::NodeJson { url, source }),
    };
    let ready = node["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "Ready");
    if let (Some(r), Some(since)) = (ready, since)
        && let Some(beat) = r["lastHeartbeatTime"].as_str().and_then(unix_seconds)
        && beat + 1 < unix_seconds_of(since)
    {
        return Err(NotYet::StaleReady {
            name: name.to_string(),
            heartbeat: r["lastHeartbeatTime"].as_str().unwrap_or("?").to_string(),
        });
    }
    match ready {
        Some(r) if r["status"] == "True" => Ok(NodeReady {
            kubelet_version: node["status"]["nodeInfo"]["kubeletVersion"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        }),
        Some(r) => Err(NotYet::NotReady {
            name: name.to_string(),
            reason: r["reason"].as_str().unwrap_or("no reason").to_string(),
            message: r["message"].as_str().unwrap_or("").to_string(),
        }),
        None => Err(NotYet::NoReadyCondition {
            name: name.to_string(),
        }),
    }
}

/// Waits for the Node to be Ready, asking the API server with the kubelet's credentials.
///
/// With `since` (the kubelet was restarted then, e.g. by an upgrade), a Ready condition whose
/// `lastHeartbeatTime` is older does not count: the Node object still shows the previous
/// kubelet's status (and version) until the new one posts its first. The kubelet stamps the
/// heartbeat with this host's clock, so the comparison needs no skew allowance beyond the
/// timestamp's one-second resolution. A condition without a heartbeat time counts as fresh.
pub fn wait_node_ready(
    config: &NodeConfig,
    kubeconfig: &Path,
    timeout: Duration,
    since: Option<std::time::SystemTime>,
) -> Result<NodeReady, WaitError> {
    let client = kubelet_client(kubeconfig, config)?;
    let what = format!(
        "Node {} to be Ready (API server {})",
        config.machine_name, client.server
    );
    poll(&what, timeout, API_POLL, || {
        node_ready_once(&client, &config.machine_name, since)
    })
}

/// Seconds since the Unix epoch of `t` (0 before it).
fn unix_seconds_of(t: std::time::SystemTime) -> i64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// Seconds since the Unix epoch of a Kubernetes timestamp (`2026-12-01T06:03:38Z`, RFC 3339
/// in UTC, as the API server writes `metav1.Time`); `None` for anything else.
fn unix_seconds(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    if b.len() != 20 || b[4] != b'-' || b[7] != b'-' || b[10] != b'T' || b[19] != b'Z' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
    let (y, m, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hh, mm, ss) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) || hh > 23 || mm > 59 || ss > 60 {
        return None;
    }
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + hh * 3_600 + mm * 60 + ss)
}

#[cfg(test)]
mod tests;
