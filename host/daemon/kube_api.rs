//! [`KubeApi`]: the daemon's [`MachineApi`] over kube's client, with the node's credentials.
//!
//! # Background
//! The daemon talks to the API server with whatever identity its kubeconfig carries: on a
//! node, the kubelet's own rotated client certificate (`system:node:<name>`, which
//! `deploy/rbac.yaml` lets read Machines and write their status); in tests, the admin's.
//! Every request is bounded by [`REQUEST_TIMEOUT`], so a silent API server is an error the
//! loop backs off from, never a reconcile that hangs (and stops feeding the watchdog). Watches
//! are silent while nothing changes, so they have a client of their own whose bound is the
//! watch's own length ([`WATCH_READ_TIMEOUT`]).
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
//! - 409 is [`ApiError::Conflict`] (the caller re-reads), 401 [`ApiError::Unauthorized`]
//!   (the daemon restarts with the current credentials), 404 on a read is `None`, a transport
//!   failure or timeout is [`ApiError::Unreachable`] (back off), every other answer
//!   [`ApiError::Refused`] with the server's message; nothing is retried here.
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

/// The longest one request (not a watch) may take, connecting included.
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
/// for requests (each bounded by [`REQUEST_TIMEOUT`]) and one for watches (silent for at most
/// [`WATCH_READ_TIMEOUT`], each watch's timeout jittered by [`jittered_watch_uri`]).
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
}

impl KubeApi {
    /// Both resources are cluster-scoped; `requests` and `watches` as [`clients`] makes them.
    pub fn new(requests: Client, watches: Client) -> Self {
        KubeApi {
            machines: Api::all(requests.clone()),
            operations: Api::all(requests.clone()),
            requests,
            watches,
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
}

/// What `e` means to the daemon (see the module's guarantees).
pub fn classify(e: kube::Error) -> ApiError {
    match e {
        kube::Error::Api(status) if status.is_conflict() => ApiError::Conflict,
        kube::Error::Api(status) if status.code == 401 => ApiError::Unauthorized(status.message),
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

/// A read that may find nothing: 404 is `None`.
fn found<K>(r: Result<Option<K>, kube::Error>) -> Result<Option<K>, ApiError> {
    r.map_err(classify)
}

fn name_of(meta: &kube::api::ObjectMeta) -> Result<&str, ApiError> {
    meta.name
        .as_deref()
        .ok_or_else(|| ApiError::Refused("the object has no metadata.name".into()))
}

impl MachineApi for KubeApi {
    async fn machine(&self, name: &str) -> Result<Option<Machine>, ApiError> {
        found(self.machines.get_opt(name).await)
    }

    async fn replace_machine_status(&self, machine: &Machine) -> Result<Machine, ApiError> {
        let name = name_of(&machine.metadata)?;
        self.machines
            .replace_status(name, &PostParams::default(), machine)
            .await
            .map_err(classify)
    }

    async fn operation(&self, name: &str) -> Result<Option<MachineOperation>, ApiError> {
        found(self.operations.get_opt(name).await)
    }

    async fn replace_operation_status(
        &self,
        op: &MachineOperation,
    ) -> Result<MachineOperation, ApiError> {
        let name = name_of(&op.metadata)?;
        self.operations
            .replace_status(name, &PostParams::default(), op)
            .await
            .map_err(classify)
    }

    async fn delete_operation(&self, name: &str) -> Result<(), ApiError> {
        match self.operations.delete(name, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.is_not_found() => Ok(()),
            Err(e) => Err(classify(e)),
        }
    }

    async fn config_map(&self, namespace: &str, name: &str) -> Result<Option<ConfigMap>, ApiError> {
        let api: Api<ConfigMap> = Api::namespaced(self.requests.clone(), namespace);
        found(api.get_opt(name).await)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: u16, reason: &str) -> kube::Error {
        kube::Error::Api(Box::new(kube::core::Status {
            code,
            reason: reason.into(),
            message: format!("{reason} happened"),
            ..Default::default()
        }))
    }

    #[test]
    fn a_conflict_is_retried_and_other_answers_are_refusals_naming_the_server_message() {
        assert_eq!(classify(status(409, "Conflict")), ApiError::Conflict);
        assert!(matches!(
            classify(status(401, "Unauthorized")),
            ApiError::Unauthorized(_)
        ));
        assert_eq!(
            classify(status(403, "Forbidden")),
            ApiError::Refused("403 Forbidden: Forbidden happened".into())
        );
    }

    const WATCH: &str = "/apis/nodeward.io/v1alpha1/machines?&watch=true&timeoutSeconds=290&fieldSelector=metadata.name%3Dw1&allowWatchBookmarks=true&resourceVersion=17";

    fn uri(s: &str) -> http::Uri {
        s.parse().expect("a URI")
    }

    #[test]
    fn a_watch_timeout_is_shortened_to_between_three_quarters_and_all_of_itself() {
        let at = |unit: f64| {
            jittered_watch_uri(&uri(WATCH), unit)
                .map(|u| u.to_string())
                .unwrap_or_default()
        };
        let with = |t: u32| WATCH.replace("timeoutSeconds=290", &format!("timeoutSeconds={t}"));
        assert_eq!(at(0.0), with(290));
        assert_eq!(at(0.5), with(254));
        assert_eq!(at(0.9999), with(219));
        // Out-of-range draws are clamped: never above T, never below T − T/4.
        assert_eq!(at(f64::NAN), with(290));
        assert_eq!(at(-3.0), with(290));
        assert_eq!(at(7.0), with(218));
        // The scheme and authority (when the URI has them) stay.
        let absolute = format!("https://127.0.0.1:6443{WATCH}");
        let stretched = jittered_watch_uri(&uri(&absolute), 0.5).map(|u| u.to_string());
        assert_eq!(
            stretched,
            Some(format!("https://127.0.0.1:6443{}", with(254)))
        );
    }

    #[test]
    fn requests_that_are_not_watches_with_a_timeout_go_out_as_they_are() {
        for other in [
            "/apis/nodeward.io/v1alpha1/machines?&fieldSelector=metadata.name%3Dw1",
            "/apis/nodeward.io/v1alpha1/machines/w1",
            "/apis/nodeward.io/v1alpha1/machines?&watch=true&resourceVersion=17",
            "/apis/nodeward.io/v1alpha1/machines?&watch=false&timeoutSeconds=290",
            "/apis/nodeward.io/v1alpha1/machines?&watch=true&timeoutSeconds=soon",
        ] {
            assert_eq!(jittered_watch_uri(&uri(other), 0.5), None, "{other}");
        }
    }

    /// A plain-HTTP server on loopback that answers every request with an empty 200 and
    /// sends its request line to the test.
    fn recording_server() -> (std::net::SocketAddr, std::sync::mpsc::Receiver<String>) {
        use std::io::{BufRead as _, Write as _};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("address");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let mut reader = std::io::BufReader::new(&conn);
                let mut head = Vec::new();
                loop {
                    let mut line = String::new();
                    match reader.read_line(&mut line) {
                        Ok(0) | Err(_) => break,
                        Ok(_) if line == "\r\n" => break,
                        Ok(_) => head.push(line),
                    }
                }
                if let Some(first) = head.first() {
                    let _ = tx.send(first.trim_end().to_string());
                }
                let _ = (&conn).write_all(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                );
            }
        });
        (addr, rx)
    }

    #[tokio::test]
    async fn the_watch_client_gives_each_watch_its_own_drawn_timeout() {
        let (addr, requests) = recording_server();
        let dir = tempfile::tempdir().expect("tempdir");
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://{addr}\nusers:\n- name: u\n  user: {{}}\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n"
            ),
        )
        .expect("kubeconfig");
        let (plain, watches) = clients(&kubeconfig).await.expect("clients");
        let api = KubeApi::new(plain.clone(), watches);
        let params = kube::api::WatchParams::default().timeout(WATCH_SECONDS);
        let timeout_of = |line: String| -> u32 {
            let t = line
                .split(['?', '&', ' '])
                .find_map(|pair| pair.strip_prefix("timeoutSeconds="))
                .and_then(|t| t.parse().ok());
            t.unwrap_or_else(|| panic!("no timeoutSeconds in {line}"))
        };
        let mut drawn = Vec::new();
        for _ in 0..12 {
            let watch = api.watch_machines().watch(&params, "0").await;
            assert!(watch.is_ok(), "the watch request failed");
            drawn.push(timeout_of(requests.recv().expect("a request line")));
        }
        assert!(
            drawn
                .iter()
                .all(|t| (WATCH_SECONDS - WATCH_SECONDS / 4..=WATCH_SECONDS).contains(t)),
            "{drawn:?}"
        );
        // Drawn anew per watch: twelve equal draws of 73 values would be a fixed timeout.
        assert!(drawn.iter().any(|t| *t != drawn[0]), "{drawn:?}");
        // The request client leaves a watch's timeout as asked.
        let plain: Api<Machine> = Api::all(plain);
        assert!(plain.watch(&params, "0").await.is_ok());
        assert_eq!(
            timeout_of(requests.recv().expect("a request line")),
            WATCH_SECONDS
        );
    }

    #[tokio::test]
    async fn a_missing_kubeconfig_is_an_error_naming_its_path() {
        let e = clients(Path::new("/nonexistent/nodeward/kubeconfig"))
            .await
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("/nonexistent/nodeward/kubeconfig"), "{e}");
    }
}
