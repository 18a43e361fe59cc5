//! **A stand-in for the real kubelet, for tests only.** The none-mode crash loop
//! (`tests/none_stub.rs`, fixture in `tests/node/`) kills `nodeward bootstrap` at every mutation
//! and reruns it; a real kubelet needs the hybrid harness, a control plane and ≈ 17 s to become
//! Ready, which would make that loop take hours. This program does the little the host's checks
//! look at, and nothing else: it is never shipped and never used outside that loop (the
//! real-cluster tests run the real kubelet).
//!
//! What it does:
//! - accepts every kubelet flag and ignores all but `--config`, `--bootstrap-kubeconfig` and
//!   `--kubeconfig` (`--flag=value` or `--flag value`);
//! - reads `healthzPort` (default 10248) and `healthzBindAddress` (default 127.0.0.1) from the
//!   KubeletConfiguration YAML of `--config` and answers `GET /healthz` with `200 ok` there;
//! - "completes the TLS bootstrap": unless the `--kubeconfig` file already exists, writes it
//!   (0600, atomically: temp file, fsync, rename) with the cluster server and CA copied from the
//!   bootstrap kubeconfig and a user with `token: stub-kubelet`;
//! - runs until SIGTERM (the default action ends it; systemd counts that as a clean stop).
//!
//! Errors in its input (missing or unreadable files, bad YAML, an address it cannot bind) go to
//! stderr and exit 1, like a kubelet that refuses its configuration.

use serde_yaml_ng::{Mapping, Value};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The token the written kubeconfig carries; tests can check for it.
const TOKEN: &str = "stub-kubelet";

fn main() {
    if let Err(e) = run() {
        eprintln!("stub-kubelet: {e}");
        std::process::exit(1);
    }
}

#[derive(Default)]
struct Flags {
    config: Option<PathBuf>,
    bootstrap_kubeconfig: Option<PathBuf>,
    kubeconfig: Option<PathBuf>,
}

fn parse_flags(args: &[String]) -> Flags {
    let mut flags = Flags::default();
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) => (n, Some(v.to_string())),
            None => (arg.as_str(), None),
        };
        let slot = match name {
            "--config" => Some(&mut flags.config),
            "--bootstrap-kubeconfig" => Some(&mut flags.bootstrap_kubeconfig),
            "--kubeconfig" => Some(&mut flags.kubeconfig),
            _ => None,
        };
        if let Some(slot) = slot {
            let value = match inline {
                Some(v) => Some(v),
                None => {
                    i += 1;
                    args.get(i).cloned()
                }
            };
            *slot = value.filter(|v| !v.is_empty()).map(PathBuf::from);
        }
        i += 1;
    }
    flags
}

fn read_yaml(path: &Path, what: &str) -> Result<Value, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("reading the {what} {}: {e}", path.display()))?;
    serde_yaml_ng::from_str(&text).map_err(|e| format!("the {what} {}: {e}", path.display()))
}

/// `healthzBindAddress:healthzPort` from the KubeletConfiguration (kubelet defaults otherwise).
fn healthz_addr(config: Option<&Path>) -> Result<String, String> {
    let mut port: u64 = 10248;
    let mut host = "127.0.0.1".to_string();
    if let Some(path) = config {
        let doc = read_yaml(path, "kubelet config")?;
        if let Some(p) = doc.get("healthzPort") {
            port = p
                .as_u64()
                .filter(|p| *p <= u64::from(u16::MAX))
                .ok_or_else(|| format!("{}: healthzPort is not a port", path.display()))?;
        }
        if let Some(h) = doc.get("healthzBindAddress") {
            host = h
                .as_str()
                .ok_or_else(|| format!("{}: healthzBindAddress is not a string", path.display()))?
                .to_string();
        }
    }
    Ok(if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    })
}

/// The cluster entry the bootstrap kubeconfig's current context names (or its first cluster).
fn bootstrap_cluster(path: &Path) -> Result<Value, String> {
    let doc = read_yaml(path, "bootstrap kubeconfig")?;
    let clusters = doc
        .get("clusters")
        .and_then(Value::as_sequence)
        .ok_or_else(|| format!("{}: no clusters", path.display()))?;
    let wanted = doc
        .get("current-context")
        .and_then(Value::as_str)
        .and_then(|ctx| {
            doc.get("contexts")?
                .as_sequence()?
                .iter()
                .find(|c| c.get("name").and_then(Value::as_str) == Some(ctx))?
                .get("context")?
                .get("cluster")?
                .as_str()
        });
    let entry = clusters
        .iter()
        .find(|c| wanted.is_some() && c.get("name").and_then(Value::as_str) == wanted)
        .or_else(|| clusters.first())
        .ok_or_else(|| format!("{}: no clusters", path.display()))?;
    let cluster = entry
        .get("cluster")
        .ok_or_else(|| format!("{}: a cluster entry without `cluster`", path.display()))?;
    if cluster.get("server").and_then(Value::as_str).is_none() {
        return Err(format!("{}: the cluster has no server", path.display()));
    }
    let mut out = Mapping::new();
    for key in [
        "server",
        "certificate-authority",
        "certificate-authority-data",
    ] {
        if let Some(v) = cluster.get(key) {
            out.insert(Value::from(key), v.clone());
        }
    }
    Ok(Value::Mapping(out))
}

fn kubeconfig_text(cluster: Value) -> Result<String, String> {
    let mut doc = Mapping::new();
    let put = |m: &mut Mapping, k: &str, v: Value| {
        m.insert(Value::from(k), v);
    };
    let named = |name: &str, key: &str, body: Value| {
        let mut m = Mapping::new();
        m.insert(Value::from("name"), Value::from(name));
        m.insert(Value::from(key), body);
        Value::Mapping(m)
    };
    let mut user = Mapping::new();
    user.insert(Value::from("token"), Value::from(TOKEN));
    let mut context = Mapping::new();
    context.insert(Value::from("cluster"), Value::from("default-cluster"));
    context.insert(Value::from("user"), Value::from("default-auth"));
    put(&mut doc, "apiVersion", Value::from("v1"));
    put(&mut doc, "kind", Value::from("Config"));
    put(
        &mut doc,
        "clusters",
        Value::Sequence(vec![named("default-cluster", "cluster", cluster)]),
    );
    put(
        &mut doc,
        "users",
        Value::Sequence(vec![named("default-auth", "user", Value::Mapping(user))]),
    );
    put(
        &mut doc,
        "contexts",
        Value::Sequence(vec![named(
            "default-context",
            "context",
            Value::Mapping(context),
        )]),
    );
    put(&mut doc, "current-context", Value::from("default-context"));
    serde_yaml_ng::to_string(&Value::Mapping(doc)).map_err(|e| format!("kubeconfig: {e}"))
}

/// Writes `text` to `path` with mode 0600: a temp file beside it, fsynced, then renamed.
fn write_atomic(path: &Path, text: &str) -> Result<(), String> {
    let dir = path
        .parent()
        .ok_or_else(|| format!("{}: no parent directory", path.display()))?;
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let name = path
        .file_name()
        .ok_or_else(|| format!("{}: no file name", path.display()))?
        .to_string_lossy();
    let tmp = dir.join(format!(".{name}.stub-kubelet-{}", std::process::id()));
    let result = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    result.map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        format!("writing {}: {e}", path.display())
    })
}

fn serve(stream: &mut TcpStream) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < 16 * 1024 {
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let line = String::from_utf8_lossy(&buf);
    let mut parts = line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let (status, body) = if method == "GET" && path == "/healthz" {
        ("200 OK", "ok")
    } else {
        ("404 Not Found", "404 page not found\n")
    };
    write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; charset=utf-8\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    stream.flush()
}

fn run() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flags = parse_flags(&args);
    let addr = healthz_addr(flags.config.as_deref())?;
    let listener = TcpListener::bind(&addr).map_err(|e| format!("healthz on {addr}: {e}"))?;

    match (&flags.kubeconfig, &flags.bootstrap_kubeconfig) {
        (Some(kc), _) if kc.exists() => {
            eprintln!("stub-kubelet: {} exists, no bootstrap", kc.display());
        }
        (Some(kc), Some(boot)) => {
            let text = kubeconfig_text(bootstrap_cluster(boot)?)?;
            write_atomic(kc, &text)?;
            eprintln!(
                "stub-kubelet: TLS bootstrap \"completed\": wrote {}",
                kc.display()
            );
        }
        (Some(kc), None) => {
            return Err(format!(
                "{} does not exist and no --bootstrap-kubeconfig was given",
                kc.display()
            ));
        }
        (None, _) => return Err("--kubeconfig is required".into()),
    }

    eprintln!("stub-kubelet: healthz on http://{addr}/healthz");
    for stream in listener.incoming() {
        match stream {
            Ok(mut s) => {
                if let Err(e) = serve(&mut s) {
                    eprintln!("stub-kubelet: healthz connection: {e}");
                }
            }
            Err(e) => eprintln!("stub-kubelet: accept: {e}"),
        }
    }
    Ok(())
}
