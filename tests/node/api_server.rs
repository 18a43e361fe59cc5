//! The stub API server: the few Kubernetes API answers a none node's bootstrap needs, over HTTPS
//! on 127.0.0.1, so the none-mode tests run without a real control plane.
//!
//! nodeward's `wait-node-ready` phase asks the API server for its Node; a test sets what that
//! Node looks like ([`StubApiServer::set_node`], [`StubNode`]) and afterwards checks which
//! requests came with which credential ([`StubApiServer::requests`]). The TLS certificates are
//! made by the `openssl` CLI (a CA and a server certificate for IP 127.0.0.1), so the node's
//! kubeconfig pins a real CA as it would for a real cluster. The HTTP itself is the tests' one
//! server, [`crate::node::http::HttpServer`].

use super::http::{HttpServer, Reply, Request};
use super::lock;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
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

/// An HTTPS server on 127.0.0.1 (random port) with a CA and a server certificate for IP
/// 127.0.0.1 made by the `openssl` CLI, served with rustls, one thread per connection, one
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
    dir: tempfile::TempDir,
}

fn openssl(args: &[&str], dir: &Path) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl runs (apt-get install openssl)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl StubApiServer {
    pub fn start() -> StubApiServer {
        let dir = tempfile::Builder::new()
            .prefix("nodeward-stub-api-")
            .tempdir_in("/tmp")
            .expect("stub api dir");
        let d = dir.path();
        let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];
        let mut ca = vec!["req", "-x509", "-nodes"];
        ca.extend(ec);
        ca.extend([
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "2",
            "-subj",
            "/CN=stub-ca",
        ]);
        openssl(&ca, d);
        let mut csr = vec!["req", "-nodes"];
        csr.extend(ec);
        csr.extend([
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=127.0.0.1",
        ]);
        openssl(&csr, d);
        std::fs::write(
            d.join("server.ext"),
            "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n\
             keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n",
        )
        .expect("ext file");
        openssl(
            &[
                "x509",
                "-req",
                "-in",
                "server.csr",
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                "server.crt",
                "-days",
                "2",
                "-extfile",
                "server.ext",
            ],
            d,
        );
        let config = Arc::new(server_tls_config(d));
        let nodes: Arc<Mutex<BTreeMap<String, StubNode>>> = Arc::default();
        let server = {
            let nodes = nodes.clone();
            HttpServer::start_tls(config, move |req| {
                let (status, body) = route(&req.method, &req.target, &lock(&nodes));
                Reply::json(status, &body)
            })
        };
        StubApiServer { nodes, server, dir }
    }

    /// `https://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        self.server.base_url()
    }

    /// The CA certificate (PEM) that signed the server certificate.
    pub fn ca_pem(&self) -> String {
        std::fs::read_to_string(self.ca_path()).expect("ca.crt")
    }

    pub fn ca_path(&self) -> PathBuf {
        self.dir.path().join("ca.crt")
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

fn server_tls_config(dir: &Path) -> rustls::ServerConfig {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(dir.join("server.crt"))
        .expect("server.crt")
        .collect::<Result<_, _>>()
        .expect("server.crt PEM");
    let key = PrivateKeyDer::from_pem_file(dir.join("server.key")).expect("server.key PEM");
    rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .expect("server certificate")
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
