//! The stub API server: the few Kubernetes API answers a none node's bootstrap needs, over HTTPS
//! on 127.0.0.1, so the none-mode tests run without a real control plane.
//!
//! nodeward's `wait-node-ready` phase asks the API server for its Node; a test sets what that
//! Node looks like ([`StubApiServer::set_node`], [`StubNode`]) and afterwards checks which
//! requests came with which credential ([`StubApiServer::requests`]). The TLS certificates are
//! the tests' [`TestCa`] (made by the `openssl` CLI: a CA and a server certificate for IP
//! 127.0.0.1), so the node's kubeconfig pins a real CA as it would for a real cluster. The HTTP itself is the tests' one
//! server, [`crate::node::http::HttpServer`].

use super::http::{HttpServer, Reply, Request};
use super::lock;
use super::tls::TestCa;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// What the stub API server says about one Node.
#[derive(Clone, Debug)]
pub struct StubNode {
    pub labels: BTreeMap<String, String>,
    /// `{key, value, effect}` objects, as in `spec.taints`.
    pub taints: Vec<Value>,
    /// Whether its Ready condition is `"True"` (else `"False"`).
    pub ready: bool,
    /// `status.nodeInfo.kubeletVersion` without the leading `v`.
    pub kubelet_version: String,
}

impl StubNode {
    /// A Ready node with `version` and no labels or taints.
    pub fn ready(version: &str) -> StubNode {
        StubNode {
            labels: BTreeMap::new(),
            taints: Vec::new(),
            ready: true,
            kubelet_version: version.to_string(),
        }
    }
}

/// One request the stub API server received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiRequest {
    pub method: String,
    /// The request target, query included.
    pub path: String,
    /// The `Authorization` header, if any (tests check which credential was used).
    pub authorization: Option<String>,
}

impl From<&Request> for ApiRequest {
    fn from(r: &Request) -> ApiRequest {
        ApiRequest {
            method: r.method.clone(),
            path: r.target.clone(),
            authorization: r.header("authorization").map(str::to_string),
        }
    }
}

/// An HTTPS server on 127.0.0.1 (random port) with a [`TestCa`]'s server certificate for IP
/// 127.0.0.1, served with rustls, one thread per connection, one
/// request per connection (`Connection: close`). It answers:
/// - `GET /api/v1/nodes/<name>`: a Node (see [`StubNode`]); 404 with a Status for unknown names;
/// - `GET /api/v1/nodes[?fieldSelector=metadata.name=<name>]`: a NodeList;
/// - `GET /healthz`, `/readyz`, `/livez`: `ok`; `GET /version`: the version of the first node;
/// - anything else: 404 with a Status.
///
/// It records every request ([`StubApiServer::requests`]). It stops when dropped.
pub struct StubApiServer {
    nodes: Arc<Mutex<BTreeMap<String, StubNode>>>,
    server: HttpServer,
    // Dropped after the server.
    ca: TestCa,
}

impl StubApiServer {
    pub fn start() -> StubApiServer {
        let ca = TestCa::new("stub-ca");
        let config = ca.server_config();
        let nodes: Arc<Mutex<BTreeMap<String, StubNode>>> = Arc::default();
        let server = {
            let nodes = nodes.clone();
            HttpServer::start_tls(config, move |req| {
                let (status, body) = route(&req.method, &req.target, &lock(&nodes));
                Reply::json(status, &body)
            })
        };
        StubApiServer { nodes, server, ca }
    }

    /// `https://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        self.server.base_url()
    }

    /// The CA certificate (PEM) that signed the server certificate.
    pub fn ca_pem(&self) -> String {
        self.ca.ca_pem()
    }

    pub fn ca_path(&self) -> PathBuf {
        self.ca.ca_path()
    }

    /// Adds or replaces the Node `name`.
    pub fn set_node(&self, name: &str, node: StubNode) {
        lock(&self.nodes).insert(name.to_string(), node);
    }

    /// Removes the Node `name` (it answers 404 again).
    pub fn remove_node(&self, name: &str) {
        lock(&self.nodes).remove(name);
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<ApiRequest> {
        self.server
            .requests()
            .iter()
            .map(ApiRequest::from)
            .collect()
    }
}

fn node_json(name: &str, n: &StubNode) -> Value {
    json!({
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {"name": name, "labels": n.labels},
        "spec": {"taints": n.taints},
        "status": {
            "conditions": [{"type": "Ready", "status": if n.ready { "True" } else { "False" }}],
            "nodeInfo": {"kubeletVersion": format!("v{}", n.kubelet_version)},
        },
    })
}

fn status_404(what: &str) -> (u16, Value) {
    (
        404,
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
               "message": format!("{what} not found"), "reason": "NotFound", "code": 404}),
    )
}

fn route(method: &str, target: &str, nodes: &BTreeMap<String, StubNode>) -> (u16, Value) {
    if method != "GET" {
        return (
            405,
            json!({"kind": "Status", "status": "Failure", "reason": "MethodNotAllowed", "code": 405}),
        );
    }
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    match path {
        "/healthz" | "/readyz" | "/livez" => (200, json!("ok")),
        "/version" => {
            let v = nodes
                .values()
                .next()
                .map_or("v0.0.0".to_string(), |n| format!("v{}", n.kubelet_version));
            (200, json!({"gitVersion": v}))
        }
        "/api/v1/nodes" => {
            let only = query
                .split('&')
                .find_map(|kv| kv.strip_prefix("fieldSelector="))
                .map(|s| s.replace("%3D", "="))
                .and_then(|s| s.strip_prefix("metadata.name=").map(str::to_string));
            let items: Vec<Value> = nodes
                .iter()
                .filter(|(name, _)| only.as_deref().is_none_or(|o| o == name.as_str()))
                .map(|(name, n)| node_json(name, n))
                .collect();
            (
                200,
                json!({"kind": "NodeList", "apiVersion": "v1", "items": items}),
            )
        }
        _ => match path.strip_prefix("/api/v1/nodes/") {
            Some(name) if !name.contains('/') => match nodes.get(name) {
                Some(n) => (200, node_json(name, n)),
                None => status_404(&format!("nodes \"{name}\"")),
            },
            _ => status_404(path),
        },
    }
}
