//! A small API server on 127.0.0.1 (plain HTTP) for the daemon tests that run anywhere: the
//! MachineOperations of `nodeward.io/v1alpha1` in memory, served as the daemon asks for them
//! (list, watch, get, replace the status at a `resourceVersion` with 409 when it is stale,
//! delete), no Machine (every get is a 404 `Status`, every list empty); or, instead, one
//! answer to every request: throttled (429 and 503, alternately, with `Retry-After: 30`) or
//! silence (the request is read and never answered).
//!
//! A watch is answered with its headers and no event, and ended after two seconds (the daemon
//! watches again); the operations the daemon must handle reach it through the list its
//! watcher starts with. Each connection gets `connection: close`, so every request is one
//! connection and one line of [`FakeApi::requests`].
#![allow(dead_code)]

use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// How the server answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// As an API server would (see the module doc).
    Serve,
    /// 429 and 503 with `Retry-After: 30`, alternately, to every request.
    Throttle,
    /// Nothing: each request is read, and its connection held open without a word.
    Silent,
}

const GROUP: &str = "/apis/nodeward.io/v1alpha1/";

#[derive(Default)]
struct State {
    resource_version: u64,
    operations: BTreeMap<String, Value>,
    requests: Vec<String>,
}

/// The server; it ends with the test binary (its threads hold nothing else).
pub struct FakeApi {
    pub addr: SocketAddr,
    state: Arc<Mutex<State>>,
}

impl FakeApi {
    /// Starts the server, answering as `answer` says.
    pub fn start(answer: Answer) -> FakeApi {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the API server");
        let addr = listener.local_addr().expect("its address");
        let state = Arc::new(Mutex::new(State::default()));
        let shared = state.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let state = shared.clone();
                std::thread::spawn(move || serve(conn, answer, &state));
            }
        });
        FakeApi { addr, state }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A kubeconfig in `dir` naming this server, without credentials.
    pub fn kubeconfig(&self, dir: &Path) -> PathBuf {
        let path = dir.join("kubeconfig");
        std::fs::write(
            &path,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://{}\n\
                 users:\n- name: u\n  user: {{}}\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\n\
                 current-context: x\n",
                self.addr
            ),
        )
        .expect("kubeconfig");
        path
    }

    /// Adds the operation `name` (`kind` on Machine `machine`, uid `uid-<name>`), with no
    /// status.
    pub fn add_operation(&self, name: &str, machine: &str, kind: &str) {
        let mut s = self.state();
        s.resource_version += 1;
        let op = json!({
            "apiVersion": "nodeward.io/v1alpha1",
            "kind": "MachineOperation",
            "metadata": {
                "name": name,
                "uid": format!("uid-{name}"),
                "resourceVersion": s.resource_version.to_string(),
                "generation": 1,
            },
            "spec": {"machineRef": {"name": machine}, "kind": kind},
        });
        s.operations.insert(name.to_string(), op);
    }

    /// The operation `name` as stored.
    pub fn operation(&self, name: &str) -> Option<Value> {
        self.state().operations.get(name).cloned()
    }

    /// Every request so far: `METHOD PATH?QUERY`.
    pub fn requests(&self) -> Vec<String> {
        self.state().requests.clone()
    }
}

/// One request: its method, path, query and body.
struct Request {
    method: String,
    path: String,
    query: String,
    body: Vec<u8>,
}

/// Reads one request from `conn`; `None` when the client went away first.
fn read_request(conn: &TcpStream) -> Option<Request> {
    let mut reader = BufReader::new(conn);
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let mut parts = line.split_whitespace();
    let method = parts.next()?.to_string();
    let target = parts.next()?.to_string();
    let mut length = 0usize;
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header).ok()? == 0 {
            return None;
        }
        if header == "\r\n" {
            break;
        }
        if let Some((name, value)) = header.split_once(':')
            && name.eq_ignore_ascii_case("content-length")
        {
            length = value.trim().parse().ok()?;
        }
    }
    let mut body = vec![0u8; length];
    reader.read_exact(&mut body).ok()?;
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p.to_string(), q.to_string()),
        None => (target, String::new()),
    };
    Some(Request {
        method,
        path,
        query,
        body,
    })
}

fn respond(mut conn: &TcpStream, code: u16, reason: &str, extra: &str, body: &Value) {
    let body = body.to_string();
    let _ = write!(
        conn,
        "HTTP/1.1 {code} {reason}\r\ncontent-type: application/json\r\n{extra}content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
}

/// A `Status` object, as the API server says what went wrong.
fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code,
    })
}

fn serve(conn: TcpStream, answer: Answer, state: &Mutex<State>) {
    let Some(request) = read_request(&conn) else {
        return;
    };
    let count = {
        let mut s = state.lock().unwrap_or_else(|p| p.into_inner());
        let line = if request.query.is_empty() {
            format!("{} {}", request.method, request.path)
        } else {
            format!("{} {}?{}", request.method, request.path, request.query)
        };
        s.requests.push(line);
        s.requests.len()
    };
    match answer {
        Answer::Throttle if count % 2 == 1 => respond(
            &conn,
            429,
            "Too Many Requests",
            "retry-after: 30\r\n",
            &status(429, "TooManyRequests", "throttled (test server)"),
        ),
        Answer::Throttle => respond(
            &conn,
            503,
            "Service Unavailable",
            "retry-after: 30\r\n",
            &status(503, "ServiceUnavailable", "unavailable (test server)"),
        ),
        Answer::Silent => std::thread::sleep(Duration::from_secs(120)),
        Answer::Serve => route(&conn, &request, state),
    }
}

fn route(conn: &TcpStream, request: &Request, state: &Mutex<State>) {
    let Some(rest) = request.path.strip_prefix(GROUP) else {
        return respond(
            conn,
            404,
            "Not Found",
            "",
            &status(404, "NotFound", "no such path"),
        );
    };
    let watch = request.query.split('&').any(|p| p == "watch=true");
    let parts: Vec<&str> = rest.split('/').collect();
    let mut s = state.lock().unwrap_or_else(|p| p.into_inner());
    match (request.method.as_str(), parts.as_slice()) {
        ("GET", [_]) if watch => {
            drop(s);
            let mut c = conn;
            let _ = c.write_all(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n",
            );
            std::thread::sleep(Duration::from_secs(2));
        }
        ("GET", [kind]) => {
            let (list, items): (&str, Vec<Value>) = match *kind {
                "machineoperations" => (
                    "MachineOperationList",
                    s.operations.values().cloned().collect(),
                ),
                _ => ("MachineList", Vec::new()),
            };
            let body = json!({
                "apiVersion": "nodeward.io/v1alpha1", "kind": list,
                "metadata": {"resourceVersion": s.resource_version.to_string()},
                "items": items,
            });
            respond(conn, 200, "OK", "", &body);
        }
        ("GET", ["machineoperations", name]) => match s.operations.get(*name) {
            Some(op) => respond(conn, 200, "OK", "", op),
            None => not_found(conn, name),
        },
        ("PUT", ["machineoperations", name, "status"]) => {
            let Ok(sent) = serde_json::from_slice::<Value>(&request.body) else {
                return respond(
                    conn,
                    400,
                    "Bad Request",
                    "",
                    &status(400, "BadRequest", "not JSON"),
                );
            };
            s.resource_version += 1;
            let version = s.resource_version.to_string();
            let Some(stored) = s.operations.get_mut(*name) else {
                return not_found(conn, name);
            };
            if sent["metadata"]["resourceVersion"] != stored["metadata"]["resourceVersion"] {
                let message = format!("the object {name} has been modified");
                return respond(
                    conn,
                    409,
                    "Conflict",
                    "",
                    &status(409, "Conflict", &message),
                );
            }
            stored["status"] = sent["status"].clone();
            stored["metadata"]["resourceVersion"] = json!(version);
            respond(conn, 200, "OK", "", stored);
        }
        ("DELETE", ["machineoperations", name]) => match s.operations.remove(*name) {
            Some(op) => respond(conn, 200, "OK", "", &op),
            None => not_found(conn, name),
        },
        (_, [_, name, ..]) => not_found(conn, name),
        _ => respond(
            conn,
            404,
            "Not Found",
            "",
            &status(404, "NotFound", "no such path"),
        ),
    }
}

fn not_found(conn: &TcpStream, name: &str) {
    respond(
        conn,
        404,
        "Not Found",
        "",
        &status(404, "NotFound", &format!("{name:?} not found")),
    );
}
