//! [`KubeApi`]: the daemon's [`MachineApi`] over kube's client, with the node's credentials.
//!
//! # Background
//! The daemon talks to the API server with whatever identity its kubeconfig carries: on a
//! node, the kubelet's own rotated client certificate (`system:node:<name>`, which
//! `deploy/rbac.yaml` lets read Machines and write their status); in tests, the admin's.
//! Every request is bounded by [`REQUEST_TIMEOUT`], as a whole: connecting, sending, the
//! answer and its body, so a silent or trickling API server is an error the loop backs off
//! from, never a reconcile that hangs. Watches are silent while nothing changes, so they have a
//! client of their own whose bound is the watch's own length ([`WATCH_READ_TIMEOUT`]).
//!
//! kube's client retries 429, 503 and 504 by itself (`Config::default_retry`: up to 15 times,
//! waiting as long as the server's `Retry-After` asks, up to 1000 s each): one request under a
//! throttling API server then took minutes (11–12 retries of one write were measured), and the
//! per-connection timeouts bounded each attempt, not the request. Both clients here turn that
//! retry off: the daemon's own backoff ([`crate::daemon::backoff`], full jitter, at least
//! 200 ms, and a watch's own) is the only retry, so one request is one attempt, and the bound
//! is a [`tokio::time::timeout`] around it rather than the connection's timeouts alone. The
//! loop pings the watchdog while a request waits (`super::watch`).
//!
//! Each watch asks the server to end it after a timeout drawn anew for each watch request
//! from `(¾ · WATCH_SECONDS, WATCH_SECONDS]`, 219–290 s ([`jittered_watch_uri`]; client-go's
//! reflector draws from 5–10 min for the same reason). With one fixed timeout, a fleet whose
//! daemons connected together (a restarted API server, nodes booted together) renews every
//! watch at the same moment every ~295 s, for good: the fleet benchmark (`benches/fleet.rs`,
//! `docs/daemon.md`) measured 200 daemons' 400 renewals land within 90 s of one another, 40 in
//! one second, 295 s apart. Drawn, the renewals drift apart at each one. The draw is never
//! above [`WATCH_SECONDS`]: kube-runtime's watcher (watch.rs's `Config`) ends a watch on its
//! own once it has been silent for its configured timeout + 5 s, so a longer timeout asked of
//! the server would be cut at 295 s all the same. (A longer range, client-go's, needs the
//! draw in the watcher's `Config` itself.) It costs one watch request in eight more.
//!
//! # Guarantees
//! - One request is one attempt, over within [`REQUEST_TIMEOUT`] (connecting included);
//!   nothing is retried here, not even 429 or 503.
//! - 409 is [`ApiError::Conflict`] (the caller re-reads), 401 [`ApiError::Unauthorized`]
//!   (the daemon restarts with the current credentials), 404 on a read is `None`; a transport
//!   failure, no answer within the bound, and 429, 503 and 504 (the server asks for time) are
//!   [`ApiError::Unreachable`] (back off); every other answer [`ApiError::Refused`] with the
//!   server's message. Every error names the request (`get MachineOperation op-1`).
//! - A kubeconfig that cannot be read or used is a [`ClientError`] naming its path.

use crate::daemon::reconcile::{ApiError, MachineApi};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{DeleteParams, PostParams};
use kube::client::{Body, ClientBuilder};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use nodeward_api::{Machine, MachineOperation};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The longest one request (not a watch) may take, as a whole: connecting, sending, the
/// answer and its body. It is one attempt: the client retries nothing.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(20);
/// The longest time the API server keeps one watch open before the watcher starts the next
/// from the last `resourceVersion` (kube's usual 290 s). The watch client shortens each
/// watch's timeout to a draw from `(¾ · WATCH_SECONDS, WATCH_SECONDS]` ([`jittered_watch_uri`]):
/// one request per watch per ~4¼ min on average when idle.
pub const WATCH_SECONDS: u32 = 290;
/// The longest a watch connection may stay silent: the server ends it after at most
/// [`WATCH_SECONDS`], so a longer silence is a dead connection (a NAT or proxy dropped it).
pub const WATCH_READ_TIMEOUT: Duration = Duration::from_secs(WATCH_SECONDS as u64 + 30);

/// Why the client could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The kubeconfig could not be read or parsed.
    #[error("kubeconfig {path}: {source}")]
    Kubeconfig {
        /// The kubeconfig.
        path: PathBuf,
        /// Why.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// The client could not be built from it (a bad certificate, say).
    #[error("kubeconfig {path}: cannot make a client: {source}")]
    Client {
        /// The kubeconfig.
        path: PathBuf,
        /// Why.
        #[source]
        source: kube::Error,
    },
}

/// Two clients of the API server from the kubeconfig at `path` (its current context): one
/// for requests (each connection and read bounded by [`REQUEST_TIMEOUT`]; [`KubeApi`] bounds
/// each request as a whole) and one for watches (silent for at most [`WATCH_READ_TIMEOUT`],
/// each watch's timeout jittered by [`jittered_watch_uri`]). Neither retries anything itself
/// (see the module docs).
pub async fn clients(path: &Path) -> Result<(Client, Client), ClientError> {
    let kubeconfig_error = |source| ClientError::Kubeconfig {
        path: path.to_path_buf(),
        source,
    };
    let kubeconfig = Kubeconfig::read_from(path).map_err(kubeconfig_error)?;
    let mut config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(kubeconfig_error)?;
    config.connect_timeout = Some(REQUEST_TIMEOUT);
    config.read_timeout = Some(REQUEST_TIMEOUT);
    config.write_timeout = Some(REQUEST_TIMEOUT);
    // kube's own retry of 429/503/504 would keep one request going for minutes, unbounded
    // (see the module docs): the daemon's backoff retries instead.
    config.default_retry = false;
    let mut watch_config = config.clone();
    watch_config.read_timeout = Some(WATCH_READ_TIMEOUT);
    let client_error = |source| ClientError::Client {
        path: path.to_path_buf(),
        source,
    };
    let jitter = tower::util::MapRequestLayer::new(|mut request: http::Request<Body>| {
        if let Some(uri) = jittered_watch_uri(request.uri(), fastrand::f64()) {
            *request.uri_mut() = uri;
        }
        request
    });
    Ok((
        Client::try_from(config).map_err(client_error)?,
        ClientBuilder::try_from(watch_config)
            .map_err(client_error)?
            .with_layer(&jitter)
            .build(),
    ))
}

/// The watch request `uri` with its `timeoutSeconds=T` shortened to `T − ⌊unit · T/4⌋`, a
/// draw from `(¾T, T]` for `unit` drawn uniformly from `[0, 1)` (a `unit` outside it, or NaN,
/// is clamped: the result stays within `[¾T, T]`). `None` for a request that is not a watch
/// (`watch=true`) with a timeout: those go out as they are. See the module docs for why.
pub fn jittered_watch_uri(uri: &http::Uri, unit: f64) -> Option<http::Uri> {
    let path_and_query = uri.path_and_query()?;
    let query = path_and_query.query()?;
    if !query.split('&').any(|pair| pair == "watch=true") {
        return None;
    }
    let unit = if unit.is_nan() {
        0.0
    } else {
        unit.clamp(0.0, 1.0)
    };
    let mut drawn = false;
    let pairs: Vec<String> = query
        .split('&')
        .map(|pair| {
            match pair
                .strip_prefix("timeoutSeconds=")
                .and_then(|t| t.parse::<u32>().ok())
            {
                Some(t) if !drawn => {
                    drawn = true;
                    // `unit` ≤ 1, so `unit · t/4` ≤ t/4: the cast neither wraps nor saturates.
                    let less = (unit * f64::from(t / 4)).floor() as u32;
                    format!("timeoutSeconds={}", t - less.min(t / 4))
                }
                _ => pair.to_string(),
            }
        })
        .collect();
    if !drawn {
        return None;
    }
    let mut parts = uri.clone().into_parts();
    let rebuilt = format!("{}?{}", path_and_query.path(), pairs.join("&"));
    parts.path_and_query = Some(rebuilt.parse().ok()?);
    http::Uri::from_parts(parts).ok()
}

/// The Machine and MachineOperation APIs, for requests and for watches.
#[derive(Clone)]
pub struct KubeApi {
    machines: Api<Machine>,
    operations: Api<MachineOperation>,
    requests: Client,
    watches: Client,
    /// How long one request may take as a whole ([`REQUEST_TIMEOUT`]).
    bound: Duration,
}

impl KubeApi {
    /// Both resources are cluster-scoped; `requests` and `watches` as [`clients`] makes them.
    /// Each request is bounded by [`REQUEST_TIMEOUT`].
    pub fn new(requests: Client, watches: Client) -> Self {
        KubeApi {
            machines: Api::all(requests.clone()),
            operations: Api::all(requests.clone()),
            requests,
            watches,
            bound: REQUEST_TIMEOUT,
        }
    }

    /// The Machines, for the watch.
    pub fn watch_machines(&self) -> Api<Machine> {
        Api::all(self.watches.clone())
    }

    /// The MachineOperations, for the watch.
    pub fn watch_operations(&self) -> Api<MachineOperation> {
        Api::all(self.watches.clone())
    }

    /// `request` (the request `what`: `get Machine w1`) within the bound, as a whole; its
    /// error classified and naming `what`.
    async fn send<T>(
        &self,
        what: &str,
        request: impl Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, ApiError> {
        match tokio::time::timeout(self.bound, request).await {
            Ok(answer) => answer.map_err(|e| naming(what, classify(e))),
            Err(_) => Err(ApiError::Unreachable(format!(
                "{what}: no answer within {} s",
                self.bound.as_secs_f32()
            ))),
        }
    }
}

/// `e` with the request `what` before its message.
fn naming(what: &str, e: ApiError) -> ApiError {
    match e {
        ApiError::Conflict => ApiError::Conflict,
        ApiError::Unreachable(m) => ApiError::Unreachable(format!("{what}: {m}")),
        ApiError::Refused(m) => ApiError::Refused(format!("{what}: {m}")),
        ApiError::Unauthorized(m) => ApiError::Unauthorized(format!("{what}: {m}")),
    }
}

/// What `e` means to the daemon (see the module's guarantees).
pub fn classify(e: kube::Error) -> ApiError {
    match e {
        kube::Error::Api(status) if status.is_conflict() => ApiError::Conflict,
        kube::Error::Api(status) if status.code == 401 => ApiError::Unauthorized(status.message),
        // The server asks for time (throttled, overloaded, a proxy in front of it waiting):
        // backed off from like an outage, never dropped as a refusal.
        kube::Error::Api(status) if matches!(status.code, 429 | 503 | 504) => {
            ApiError::Unreachable(format!(
                "{} {}: {}",
                status.code, status.reason, status.message
            ))
        }
        kube::Error::Api(status) => ApiError::Refused(format!(
            "{} {}: {}",
            status.code, status.reason, status.message
        )),
        e @ (kube::Error::HyperError(_) | kube::Error::Service(_)) => {
            ApiError::Unreachable(error_chain(&e))
        }
        e => ApiError::Refused(error_chain(&e)),
    }
}

/// `e` and its sources, `: `-joined (hyper's own message alone says only "client error").
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let s_text = s.to_string();
        if !text.contains(&s_text) {
            text = format!("{text}: {s_text}");
        }
        source = s.source();
    }
    text
}

fn name_of(meta: &kube::api::ObjectMeta) -> Result<&str, ApiError> {
    meta.name
        .as_deref()
        .ok_or_else(|| ApiError::Refused("the object has no metadata.name".into()))
}

impl MachineApi for KubeApi {
    async fn machine(&self, name: &str) -> Result<Option<Machine>, ApiError> {
        self.send(&format!("get Machine {name}"), self.machines.get_opt(name))
            .await
    }

    async fn replace_machine_status(&self, machine: &Machine) -> Result<Machine, ApiError> {
        let name = name_of(&machine.metadata)?;
        self.send(
            &format!("replace the status of Machine {name}"),
            self.machines
                .replace_status(name, &PostParams::default(), machine),
        )
        .await
    }

    async fn operation(&self, name: &str) -> Result<Option<MachineOperation>, ApiError> {
        self.send(
            &format!("get MachineOperation {name}"),
            self.operations.get_opt(name),
        )
        .await
    }

    async fn replace_operation_status(
        &self,
        op: &MachineOperation,
    ) -> Result<MachineOperation, ApiError> {
        let name = name_of(&op.metadata)?;
        self.send(
            &format!("replace the status of MachineOperation {name}"),
            self.operations
                .replace_status(name, &PostParams::default(), op),
        )
        .await
    }

    async fn delete_operation(&self, name: &str) -> Result<(), ApiError> {
        let delete = async {
            match self.operations.delete(name, &DeleteParams::default()).await {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(status)) if status.is_not_found() => Ok(()),
                Err(e) => Err(e),
            }
        };
        self.send(&format!("delete MachineOperation {name}"), delete)
            .await
    }

    async fn config_map(&self, namespace: &str, name: &str) -> Result<Option<ConfigMap>, ApiError> {
        let api: Api<ConfigMap> = Api::namespaced(self.requests.clone(), namespace);
        self.send(
            &format!("get ConfigMap {namespace}/{name}"),
            api.get_opt(name),
        )
        .await
    }
}

#[cfg(test)]
#[path = "kube_api_tests.rs"]
mod tests;
