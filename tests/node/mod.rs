//! The fixture of the none-mode tests (`nodeward bootstrap --root DIR --config FILE`).
//!
//! Include it with `mod cluster; mod node;` (it uses [`crate::cluster`] for the real cluster's
//! paths and images). What it offers:
//! - [`ArtifactServer`]: a real HTTP server on 127.0.0.1 serving files in-process (tiny_http),
//!   with a wrong-bytes mode for the digest-mismatch refusal;
//! - [`packed`]: the upstream artifact formats (containerd and CNI tarballs, raw runc) packed
//!   from the Debian packages on this machine, once per test binary run;
//! - [`stub_kubelet`]: the path of `examples/stub_kubelet.rs`, a stand-in for the kubelet used
//!   only in the crash-at-every-mutation loop;
//! - [`StubApiServer`]: HTTPS on 127.0.0.1 answering `GET /api/v1/nodes/<name>` with a Ready
//!   Node, recording each request;
//! - [`NodeRoot`]: a temporary host root; inside the systemd harness it binds the harness's unit
//!   directory at `<root>/etc/systemd/system` (and, for a real kubelet, scratch directories over
//!   the kubelet's hard-coded paths), and its teardown stops and removes what the node left, then
//!   asserts that nothing is left;
//! - [`node_config`]: a NodeConfig YAML for the real cluster or the stub setup, and
//!   [`import_cluster_images`] for the real cluster's local images ([`docker_archive`] makes a
//!   tiny one without the cluster).
//!
//! Rules it keeps: it ends only processes its node started (by PID), sends traffic only to
//! 127.0.0.1 and this machine's own address, and leaves no mount, cgroup, unit or file outside
//! its temporary directories; [`NodeRoot::teardown`] checks that.
#![allow(dead_code)]

use crate::cluster::{Cluster, wait_for};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The `#[ignore]` reason of tests that need the systemd harness.
pub const NEEDS_HARNESS: &str = "needs the real systemd harness (scripts/test.sh)";

/// Whether this process runs inside the systemd harness (its PID 1 is systemd; the test
/// machine's own PID 1 is not).
pub fn in_harness() -> bool {
    std::fs::read_to_string("/proc/1/comm").is_ok_and(|c| c.trim() == "systemd")
}

/// Fails the test unless it runs inside the systemd harness.
#[track_caller]
pub fn require_harness() {
    assert!(
        in_harness(),
        "this test needs the systemd harness: run it with scripts/test.sh (docs/testing-systemd.md)"
    );
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// sha256 of a file, streamed.
pub fn sha256_file(path: &Path) -> String {
    let mut f = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f
            .read(&mut buf)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    hex::encode(h.finalize())
}

/// sha256 of a file that does not change during the test binary's run (packed artifacts, the
/// cluster's kubelets): computed once.
pub fn sha256_cached(path: &Path) -> String {
    static CACHE: Mutex<BTreeMap<PathBuf, String>> = Mutex::new(BTreeMap::new());
    if let Some(s) = lock(&CACHE).get(path) {
        return s.clone();
    }
    let s = sha256_file(path);
    lock(&CACHE).insert(path.to_path_buf(), s.clone());
    s
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

// ------------------------------------------------------------------------------------------------
// Artifact server
// ------------------------------------------------------------------------------------------------

/// A URL and the sha256 its bytes must have: one `downloads.<name>` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Download {
    pub url: String,
    pub sha256: String,
}

#[derive(Default)]
struct Routes {
    /// Names served from a file elsewhere (packed artifacts, kubelets): no copy.
    files: HashMap<String, PathBuf>,
    /// Names answered with these bytes instead of the real ones (the wrong-bytes mode).
    wrong: HashMap<String, Vec<u8>>,
    /// Every request, `GET /name`, in order.
    log: Vec<String>,
}

/// A static HTTP server on 127.0.0.1 (a random port bound directly, no pick-then-bind race),
/// serving the files of a directory and registered paths, on a thread of this process. It stops
/// when dropped.
pub struct ArtifactServer {
    /// `http://127.0.0.1:<port>`, no trailing slash.
    pub url_base: String,
    pub dir: PathBuf,
    _tmp: Option<tempfile::TempDir>,
    server: Arc<tiny_http::Server>,
    routes: Arc<Mutex<Routes>>,
    thread: Option<JoinHandle<()>>,
}

impl ArtifactServer {
    /// Serves the files of `dir` (`GET /<name>` → `dir/<name>`).
    pub fn start(dir: &Path) -> ArtifactServer {
        Self::start_inner(dir.to_path_buf(), None)
    }

    /// Serves a fresh temporary directory, removed on drop.
    pub fn start_temp() -> ArtifactServer {
        let tmp = tempfile::Builder::new()
            .prefix("nodeward-artifacts-")
            .tempdir_in("/tmp")
            .expect("artifact dir");
        Self::start_inner(tmp.path().to_path_buf(), Some(tmp))
    }

    fn start_inner(dir: PathBuf, tmp: Option<tempfile::TempDir>) -> ArtifactServer {
        let server = Arc::new(tiny_http::Server::http("127.0.0.1:0").expect("bind 127.0.0.1:0"));
        let port = server.server_addr().to_ip().expect("an IP listener").port();
        let routes = Arc::new(Mutex::new(Routes::default()));
        let thread = {
            let (server, routes, dir) = (server.clone(), routes.clone(), dir.clone());
            std::thread::spawn(move || {
                // recv fails once `unblock` is called on drop.
                while let Ok(req) = server.recv() {
                    let (routes, dir) = (routes.clone(), dir.clone());
                    std::thread::spawn(move || answer(req, &routes, &dir));
                }
            })
        };
        ArtifactServer {
            url_base: format!("http://127.0.0.1:{port}"),
            dir,
            _tmp: tmp,
            server,
            routes,
            thread: Some(thread),
        }
    }

    /// The URL of `name`.
    pub fn url(&self, name: &str) -> String {
        format!("{}/{name}", self.url_base)
    }

    /// Writes `bytes` as `name` in the served directory; its URL and sha256.
    pub fn serve(&self, name: &str, bytes: &[u8]) -> (String, String) {
        assert!(
            !name.contains('/') && !name.starts_with('.'),
            "flat names only: {name}"
        );
        std::fs::write(self.dir.join(name), bytes).expect("write artifact");
        (self.url(name), sha256_hex(bytes))
    }

    /// Serves the file at `path` as `name` without copying it; its URL and sha256.
    pub fn serve_file(&self, name: &str, path: &Path) -> (String, String) {
        assert!(path.is_file(), "{} is not a file", path.display());
        lock(&self.routes)
            .files
            .insert(name.to_string(), path.to_path_buf());
        (self.url(name), sha256_cached(path))
    }

    /// [`ArtifactServer::serve_file`] as a [`Download`].
    pub fn download(&self, name: &str, path: &Path) -> Download {
        let (url, sha256) = self.serve_file(name, path);
        Download { url, sha256 }
    }

    /// From now on `name` answers with `bytes` (200, the right length for them): a download
    /// pinned to the real digest must refuse it.
    pub fn serve_wrong_bytes(&self, name: &str, bytes: &[u8]) {
        lock(&self.routes)
            .wrong
            .insert(name.to_string(), bytes.to_vec());
    }

    /// Undoes [`ArtifactServer::serve_wrong_bytes`].
    pub fn serve_right_bytes(&self, name: &str) {
        lock(&self.routes).wrong.remove(name);
    }

    /// Every request so far, as `METHOD /path`.
    pub fn requests(&self) -> Vec<String> {
        lock(&self.routes).log.clone()
    }
}

fn answer(req: tiny_http::Request, routes: &Mutex<Routes>, dir: &Path) {
    let path = req.url().split('?').next().unwrap_or("").to_string();
    let name = path.trim_start_matches('/').to_string();
    let (file, wrong) = {
        let mut r = lock(routes);
        r.log.push(format!("{} {path}", req.method()));
        (r.files.get(&name).cloned(), r.wrong.get(&name).cloned())
    };
    let ok_name = !name.is_empty() && !name.contains('/') && !name.starts_with('.');
    let result = if !matches!(
        req.method(),
        tiny_http::Method::Get | tiny_http::Method::Head
    ) {
        req.respond(tiny_http::Response::empty(405))
    } else if let Some(bytes) = wrong {
        req.respond(tiny_http::Response::from_data(bytes))
    } else if let Some(f) = file
        .or_else(|| ok_name.then(|| dir.join(&name)))
        .and_then(|p| std::fs::File::open(p).ok())
        .filter(|f| f.metadata().is_ok_and(|m| m.is_file()))
    {
        req.respond(tiny_http::Response::from_file(f))
    } else {
        req.respond(tiny_http::Response::from_string("not found\n").with_status_code(404))
    };
    // The client may hang up early (a refused download); that is its business.
    let _ = result;
}

impl Drop for ArtifactServer {
    fn drop(&mut self) {
        self.server.unblock();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

// ------------------------------------------------------------------------------------------------
// Packed artifacts from the Debian packages
// ------------------------------------------------------------------------------------------------

/// containerd's files, as in the upstream `containerd-<v>-linux-<arch>.tar.gz` (`bin/<file>`).
pub const CONTAINERD_FILES: &[&str] = &[
    "/usr/bin/containerd",
    "/usr/bin/containerd-shim-runc-v2",
    "/usr/bin/ctr",
];
/// runc, served raw like upstream's `runc.<arch>`.
pub const RUNC_FILE: &str = "/usr/sbin/runc";
/// The CNI plugins, as in upstream's `cni-plugins-linux-<arch>-v<v>.tgz` (`./<plugin>`).
pub const CNI_DIR: &str = "/usr/lib/cni";
/// The versions of the Debian packages above (what the config's `components` names).
pub const CONTAINERD_VERSION: &str = "1.6.20";
pub const RUNC_VERSION: &str = "1.1.5";
pub const CNI_PLUGINS_VERSION: &str = "1.1.1";

/// The artifacts in their upstream formats.
#[derive(Debug)]
pub struct Packed {
    pub containerd_tgz: PathBuf,
    pub runc: PathBuf,
    pub cni_tgz: PathBuf,
    /// The CNI plugin names in the tarball.
    pub cni_plugins: Vec<String>,
    /// Milliseconds this run spent packing (0 when the cache was valid).
    pub pack_ms: u128,
}

/// The packed artifacts, made once per test binary run and cached across runs under cargo's
/// per-target temp dir (`target/tmp/node-artifacts`), keyed by the source files' size and
/// mtime. The tarballs are deterministic (sorted entries, uid/gid 0, mtime 0), so their sha256
/// is the same on every run that packs the same files.
pub fn packed() -> &'static Packed {
    static PACKED: OnceLock<Packed> = OnceLock::new();
    PACKED.get_or_init(|| pack_into(&Path::new(env!("CARGO_TARGET_TMPDIR")).join("node-artifacts")))
}

fn cni_sources() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(CNI_DIR)
        .unwrap_or_else(|e| panic!("{CNI_DIR}: {e} (apt-get install containernetworking-plugins)"))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .collect();
    v.sort();
    v
}

/// A stamp of the inputs: path, size and mtime of each.
fn stamp(paths: &[PathBuf]) -> String {
    let mut s = String::from("v1\n");
    for p in paths {
        let m = std::fs::metadata(p)
            .unwrap_or_else(|e| panic!("{}: {e} (apt-get install containerd runc)", p.display()));
        s.push_str(&format!(
            "{} {} {}.{}\n",
            p.display(),
            m.len(),
            m.mtime(),
            m.mtime_nsec()
        ));
    }
    s
}

/// Packs into `dir` unless its stamp matches the sources.
pub fn pack_into(dir: &Path) -> Packed {
    let t = Instant::now();
    std::fs::create_dir_all(dir).expect("artifact cache dir");
    let containerd_src: Vec<PathBuf> = CONTAINERD_FILES.iter().map(PathBuf::from).collect();
    let cni_src = cni_sources();
    let mut all = containerd_src.clone();
    all.push(PathBuf::from(RUNC_FILE));
    all.extend(cni_src.iter().cloned());
    let stamp_text = stamp(&all);
    let packed = Packed {
        containerd_tgz: dir.join(format!(
            "containerd-{CONTAINERD_VERSION}-linux-amd64.tar.gz"
        )),
        runc: dir.join("runc.amd64"),
        cni_tgz: dir.join(format!(
            "cni-plugins-linux-amd64-v{CNI_PLUGINS_VERSION}.tgz"
        )),
        cni_plugins: cni_src
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect(),
        pack_ms: 0,
    };
    let stamp_file = dir.join("stamp");
    if std::fs::read_to_string(&stamp_file).is_ok_and(|s| s == stamp_text)
        && [&packed.containerd_tgz, &packed.runc, &packed.cni_tgz]
            .iter()
            .all(|p| p.is_file())
    {
        return packed;
    }
    let _ = std::fs::remove_file(&stamp_file);
    let containerd_entries: Vec<(String, PathBuf)> = containerd_src
        .iter()
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy();
            (format!("bin/{name}"), p.clone())
        })
        .collect();
    write_tgz(&packed.containerd_tgz, Some("bin/"), &containerd_entries);
    let cni_entries: Vec<(String, PathBuf)> = cni_src
        .iter()
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy();
            (format!("./{name}"), p.clone())
        })
        .collect();
    write_tgz(&packed.cni_tgz, Some("./"), &cni_entries);
    let tmp = packed.runc.with_extension("tmp");
    std::fs::copy(RUNC_FILE, &tmp).expect("copy runc");
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)).expect("chmod runc");
    std::fs::rename(&tmp, &packed.runc).expect("rename runc");
    std::fs::write(&stamp_file, stamp_text).expect("stamp");
    Packed {
        pack_ms: t.elapsed().as_millis(),
        ..packed
    }
}

/// A tar header with `name` written verbatim (the tar crate's `set_path` drops a leading `./`,
/// which upstream's CNI tarball has), owned by root, mtime 0.
fn header(name: &str, kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    let bytes = name.as_bytes();
    assert!(bytes.len() < 100, "short names only: {name}");
    h.as_gnu_mut().expect("gnu header").name[..bytes.len()].copy_from_slice(bytes);
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_size(size);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    h.set_cksum();
    h
}

/// Writes a deterministic tar.gz: the directory entry `dir` (if any), then `entries` (name in
/// the archive, source file) in order, each mode 0755, owned by root, mtime 0.
pub fn write_tgz(dest: &Path, dir: Option<&str>, entries: &[(String, PathBuf)]) {
    let tmp = dest.with_extension("tmp");
    let file = std::fs::File::create(&tmp).unwrap_or_else(|e| panic!("{}: {e}", tmp.display()));
    // Level 1: these are test fixtures, ~100 MB of binaries; speed matters more than size.
    let gz =
        flate2::write::GzEncoder::new(std::io::BufWriter::new(file), flate2::Compression::fast());
    let mut b = tar::Builder::new(gz);
    if let Some(d) = dir {
        b.append(
            &header(d, tar::EntryType::Directory, 0o755, 0),
            std::io::empty(),
        )
        .expect("tar dir");
    }
    for (name, src) in entries {
        let f = std::fs::File::open(src).unwrap_or_else(|e| panic!("{}: {e}", src.display()));
        let len = f.metadata().expect("metadata").len();
        b.append(&header(name, tar::EntryType::Regular, 0o755, len), f)
            .unwrap_or_else(|e| panic!("tar {name}: {e}"));
    }
    let gz = b.into_inner().expect("finish tar");
    let w = gz.finish().expect("finish gzip");
    let f = w.into_inner().expect("flush");
    f.sync_all().expect("fsync tarball");
    std::fs::rename(&tmp, dest).expect("rename tarball");
}

/// The entries of a tar.gz: name → (mode, sha256 of the contents; empty for directories).
pub fn tgz_entries(path: &Path) -> BTreeMap<String, (u32, String)> {
    let f = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut a = tar::Archive::new(flate2::read::GzDecoder::new(f));
    let mut out = BTreeMap::new();
    for e in a.entries().expect("tar entries") {
        let mut e = e.expect("tar entry");
        let name = String::from_utf8_lossy(&e.path_bytes()).into_owned();
        let mode = e.header().mode().expect("mode");
        let mut bytes = Vec::new();
        e.read_to_end(&mut bytes).expect("tar contents");
        let sha = if e.header().entry_type().is_dir() {
            String::new()
        } else {
            sha256_hex(&bytes)
        };
        out.insert(name, (mode, sha));
    }
    out
}

/// The four `downloads` of a none node.
#[derive(Clone, Debug)]
pub struct Served {
    pub kubelet: Download,
    pub containerd: Download,
    pub runc: Download,
    pub cni_plugins: Download,
}

impl Served {
    /// `(name in the config's downloads map, download)`.
    pub fn entries(&self) -> [(&'static str, &Download); 4] {
        [
            ("kubelet", &self.kubelet),
            ("containerd", &self.containerd),
            ("runc", &self.runc),
            ("cni-plugins", &self.cni_plugins),
        ]
    }
}

/// Serves the packed artifacts and `kubelet` (the real one or [`stub_kubelet`]), raw.
pub fn serve_artifacts(server: &ArtifactServer, kubelet: &Path) -> Served {
    let p = packed();
    Served {
        kubelet: server.download("kubelet", kubelet),
        containerd: server.download(
            p.containerd_tgz.file_name().unwrap().to_str().unwrap(),
            &p.containerd_tgz,
        ),
        runc: server.download("runc.amd64", &p.runc),
        cni_plugins: server.download(p.cni_tgz.file_name().unwrap().to_str().unwrap(), &p.cni_tgz),
    }
}

/// The stub kubelet (`examples/stub_kubelet.rs`), which `cargo test` builds: a stand-in for the
/// kubelet used only in the crash-at-every-mutation loop.
pub fn stub_kubelet() -> PathBuf {
    // target/<profile>/deps/<test binary> → target/<profile>/examples/stub_kubelet
    let exe = std::env::current_exe().expect("current_exe");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps");
    let p = profile_dir.join("examples").join("stub_kubelet");
    assert!(
        p.is_file(),
        "{} missing: `cargo test` builds the examples; run `cargo build --examples`",
        p.display()
    );
    p
}

// ------------------------------------------------------------------------------------------------
// Stub API server
// ------------------------------------------------------------------------------------------------

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

#[derive(Default)]
struct ApiState {
    nodes: BTreeMap<String, StubNode>,
    requests: Vec<ApiRequest>,
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
    addr: SocketAddr,
    dir: tempfile::TempDir,
    state: Arc<Mutex<ApiState>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
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
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("local addr");
        let state = Arc::new(Mutex::new(ApiState::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (state, stop) = (state.clone(), stop.clone());
            std::thread::spawn(move || {
                for conn in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(tcp) = conn else { continue };
                    let (config, state) = (config.clone(), state.clone());
                    std::thread::spawn(move || {
                        if let Err(e) = api_connection(tcp, config, &state) {
                            eprintln!("stub api server: {e}");
                        }
                    });
                }
            })
        };
        StubApiServer {
            addr,
            dir,
            state,
            stop,
            thread: Some(thread),
        }
    }

    /// `https://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
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
        lock(&self.state).nodes.insert(name.to_string(), node);
    }

    /// Removes the Node `name` (it answers 404 again).
    pub fn remove_node(&self, name: &str) {
        lock(&self.state).nodes.remove(name);
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<ApiRequest> {
        lock(&self.state).requests.clone()
    }
}

impl Drop for StubApiServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accept loop so it sees the flag.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
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

fn api_connection(
    tcp: TcpStream,
    config: Arc<rustls::ServerConfig>,
    state: &Mutex<ApiState>,
) -> Result<(), String> {
    tcp.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    let conn = rustls::ServerConnection::new(config).map_err(|e| e.to_string())?;
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        if buf.len() > 64 * 1024 {
            return Err("request head over 64 KiB".into());
        }
        let n = tls.read(&mut chunk).map_err(|e| format!("read: {e}"))?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let head = String::from_utf8_lossy(&buf).into_owned();
    let mut lines = head.lines();
    let mut first = lines.next().unwrap_or("").split_whitespace();
    let method = first.next().unwrap_or("").to_string();
    let target = first.next().unwrap_or("").to_string();
    let authorization = lines
        .take_while(|l| !l.is_empty())
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("authorization"))
        .map(|(_, v)| v.trim().to_string());
    let (status, body) = {
        let mut st = lock(state);
        st.requests.push(ApiRequest {
            method: method.clone(),
            path: target.clone(),
            authorization,
        });
        route(&method, &target, &st.nodes)
    };
    let body = body.to_string();
    let reason = match status {
        200 => "OK",
        404 => "Not Found",
        _ => "Method Not Allowed",
    };
    write!(
        tls,
        "HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .map_err(|e| format!("write: {e}"))?;
    tls.conn.send_close_notify();
    tls.flush().map_err(|e| format!("flush: {e}"))?;
    Ok(())
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

// ------------------------------------------------------------------------------------------------
// The host root
// ------------------------------------------------------------------------------------------------

/// What a [`NodeRoot`] sets up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RootKind {
    /// A temporary root only: plan-mode and tree tests, anywhere.
    Plain,
    /// Inside the systemd harness: the harness's unit directory bound at
    /// `<root>/etc/systemd/system`.
    Harness,
    /// [`RootKind::Harness`] plus scratch directories over `/var/lib/kubelet`, `/var/log/pods`
    /// and `/var/log/containers` (a real kubelet hard-codes them), as
    /// `scripts/kube-node-start.sh` does; also records `net.ipv4.ip_forward`, which the CNI
    /// bridge plugin turns on, to restore it.
    HarnessRealKubelet,
}

/// The unit directory of the harness (its scratch `$STATE/units`).
pub const HARNESS_UNIT_DIR: &str = "/etc/systemd/system";
/// The paths a real kubelet hard-codes.
pub const KUBELET_HOST_PATHS: &[&str] =
    &["/var/lib/kubelet", "/var/log/pods", "/var/log/containers"];
/// The units nodeward writes in none mode (`node_config::layout`).
pub const NODE_UNITS: &[&str] = &["nodeward-containerd.service", "nodeward-kubelet.service"];

/// Host paths a node's components use by default; a none node below a temporary root must not
/// create any of them on the shared host ([`NodeRoot::leftovers`] reports a new one). E.g.
/// containerd's `io.containerd.internal.v1.opt` plugin makes `/opt/containerd` unless its `path`
/// is set, and the kubelet makes `/usr/libexec/kubernetes/...` unless `volumePluginDir` is.
pub const HOST_PATHS_WATCHED: &[&str] = &[
    "/opt/containerd",
    "/var/lib/containerd",
    "/etc/containerd",
    "/run/containerd",
    "/opt/cni",
    "/etc/cni",
    "/var/lib/cni",
    "/usr/libexec/kubernetes",
    "/etc/kubernetes",
    "/var/lib/nodeward",
];

/// Where containerd 1.6's shims put their sockets (`/run/containerd/s`), hard-coded: a node
/// beneath a temporary root still makes it, in the harness's private /run. A reset of a root
/// other than `/` cannot remove it (it is outside the root); the fixture does.
pub const SHIM_SOCKET_PARENT: &str = "/run/containerd";

/// Root-relative paths [`NodeRoot::tree`] leaves out: runtime state that legitimately differs
/// between two runs of the same bootstrap. A path is left out when it equals an entry or lies
/// below it.
pub const TREE_EXCLUDES: &[&str] = &[
    // containerd's sockets and the runtime state below the root (`run/containerd`).
    "run",
    // containerd's images, snapshots and metadata.
    "var/lib/containerd",
    // CNI IPAM leases.
    "var/lib/cni",
    // Logs (pods', containers', anything else).
    "var/log",
];
/// Inside `var/lib/kubelet` only these (written by nodeward) are kept: everything else there is
/// the kubelet's own (pods, plugins, checkpoints, certificates, the kubeconfig of its TLS
/// bootstrap, cpu/memory manager state).
pub const KUBELET_DIR_KEPT: &[&str] = &["config.yaml", "nodeward-flags.env"];

/// What a reset legitimately leaves beneath a root that started empty, besides the artifact
/// cache (`var/lib/nodeward/artifacts`, kept so a re-bootstrap downloads nothing): standard
/// host directories setup-host made because the temporary root lacked them (a reset never
/// removes a directory other software may share) and the agent's own `opt/nodeward`. Also
/// below `proc/` (see [`stays_after_reset`]): beneath a root other than `/` the kernel
/// capability writes sysctls and module loads into `<root>/proc/...` files, and a reset keeps
/// runtime kernel settings (it removes only their boot-time files).
pub const STAYS_AFTER_RESET: &[&str] = &[
    "etc/sysctl.d",
    "etc/modules-load.d",
    "etc/cni",
    "opt",
    "opt/nodeward",
    "var",
    "var/lib",
    "var/lib/nodeward",
];

/// Whether `path` (root-relative) may remain after a reset of a root that started empty.
pub fn stays_after_reset(path: &str) -> bool {
    path.starts_with("var/lib/nodeward/artifacts")
        || path == "proc"
        || path.starts_with("proc/")
        || STAYS_AFTER_RESET.contains(&path)
}

/// One entry of [`NodeRoot::tree`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Entry {
    File {
        mode: u32,
        sha256: String,
    },
    Dir {
        mode: u32,
    },
    Symlink {
        target: String,
    },
    /// Sockets, fifos, devices.
    Other {
        mode: u32,
    },
}

/// A temporary host root for `nodeward bootstrap --root`, in `/tmp/nodeward-noneroot-*/`:
/// `root/` (the host root), `state/` (the agent's state directory, `--state-dir`; its
/// `compiled/` is shared by every root of this build, so each phase is compiled once),
/// `config.yaml`, `scratch/` (what is bound over the kubelet's host paths).
///
/// Only one lives at a time per test binary (it holds a lock): the units have fixed names.
/// [`NodeRoot::teardown`] (or drop) stops the node's units, kills what is left of its processes
/// (by PID), unmounts, undoes the binds, removes the unit files the node wrote into the harness,
/// deletes the bridge and restores `ip_forward` (real kubelet), removes the directory, and then
/// **asserts** that nothing is left ([`NodeRoot::leftovers`] is the same check, without the
/// cleanup, for tests of nodeward's own teardown).
pub struct NodeRoot {
    pub kind: RootKind,
    /// The temporary directory holding everything.
    pub dir: PathBuf,
    /// The host root.
    pub root: PathBuf,
    /// `--state-dir`.
    pub state_dir: PathBuf,
    /// Where [`NodeRoot::write_config`] writes.
    pub config_path: PathBuf,
    /// Mount points this fixture bound, in order.
    binds: Vec<PathBuf>,
    /// Mount points this fixture created (did not exist), to remove again.
    created: Vec<PathBuf>,
    /// Mount points before the fixture started.
    mounts_before: BTreeSet<String>,
    /// Entries of the harness unit dir before (relative paths).
    units_before: BTreeSet<PathBuf>,
    /// `nodeward-*` units loaded before.
    loaded_before: BTreeSet<String>,
    ip_forward_before: Option<String>,
    /// Which of [`HOST_PATHS_WATCHED`] existed before.
    host_paths_before: BTreeSet<&'static str>,
    /// The bridge of the written config (deleted at teardown).
    bridge: Option<String>,
    done: bool,
    _guard: MutexGuard<'static, ()>,
}

fn run(cmd: &str, args: &[&str]) -> Output {
    Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{cmd}: {e}"))
}

fn mount_points() -> BTreeSet<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .expect("mountinfo")
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        // mountinfo escapes spaces and such as \040; our paths have none.
        .map(str::to_string)
        .collect()
}

fn files_below(dir: &Path) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if let Ok(rel) = p.strip_prefix(dir) {
                out.insert(rel.to_path_buf());
            }
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(p);
            }
        }
    }
    out
}

/// `nodeward-*` units systemd has loaded (any state).
pub fn loaded_nodeward_units() -> BTreeSet<String> {
    let out = run(
        "systemctl",
        &[
            "list-units",
            "--all",
            "--plain",
            "--no-legend",
            "--full",
            "nodeward-*",
        ],
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

/// `kubepods*` cgroup directories under /sys/fs/cgroup (the harness's own hierarchy).
pub fn kubepods_cgroups() -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![PathBuf::from("/sys/fs/cgroup")];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            if !e.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let p = e.path();
            if e.file_name().to_string_lossy().starts_with("kubepods") {
                found.push(p);
            } else if p.components().count() < 8 {
                stack.push(p);
            }
        }
    }
    found.sort();
    found
}

/// Processes that belong to the node under `root`: their executable is below it, their
/// command line names it (containerd's shims), or (with `kubepods`, inside the harness) they
/// are in a kubepods cgroup (containers, whose executables are in their own mount namespace).
pub fn node_processes(root: &Path, kubepods: bool) -> Vec<(u32, String)> {
    let me = std::process::id();
    let root_s = root.to_string_lossy().into_owned();
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if pid == me {
            continue;
        }
        let exe = std::fs::read_link(e.path().join("exe")).unwrap_or_default();
        let cmdline = std::fs::read(e.path().join("cmdline"))
            .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
            .unwrap_or_default();
        let cgroup = std::fs::read_to_string(e.path().join("cgroup")).unwrap_or_default();
        if exe.starts_with(root)
            || cmdline.contains(&root_s)
            || (kubepods && cgroup.contains("kubepods"))
        {
            found.push((pid, format!("{} ({})", cmdline.trim(), exe.display())));
        }
    }
    found
}

impl NodeRoot {
    pub fn new(kind: RootKind) -> NodeRoot {
        static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
        let guard = lock(&ONE_AT_A_TIME);
        if kind != RootKind::Plain {
            require_harness();
        }
        let dir = tempfile::Builder::new()
            .prefix("nodeward-noneroot-")
            .tempdir_in("/tmp")
            .expect("temp root")
            .keep();
        let root = dir.join("root");
        let state_dir = dir.join("state");
        std::fs::create_dir_all(&root).expect("root");
        std::fs::create_dir_all(&state_dir).expect("state");
        let shared_compiled = Path::new(env!("CARGO_TARGET_TMPDIR")).join("none-compiled-cache");
        std::fs::create_dir_all(&shared_compiled).expect("compiled cache");
        std::os::unix::fs::symlink(&shared_compiled, state_dir.join("compiled"))
            .expect("compiled link");
        let mut me = NodeRoot {
            kind,
            config_path: dir.join("config.yaml"),
            dir,
            root,
            state_dir,
            binds: Vec::new(),
            created: Vec::new(),
            mounts_before: BTreeSet::new(),
            units_before: BTreeSet::new(),
            loaded_before: BTreeSet::new(),
            ip_forward_before: None,
            host_paths_before: BTreeSet::new(),
            bridge: None,
            done: false,
            _guard: guard,
        };
        if kind == RootKind::Plain {
            return me;
        }
        me.mounts_before = mount_points();
        me.host_paths_before = HOST_PATHS_WATCHED
            .iter()
            .copied()
            .filter(|p| Path::new(p).exists())
            .collect();
        me.units_before = files_below(Path::new(HARNESS_UNIT_DIR));
        me.loaded_before = loaded_nodeward_units();
        for u in NODE_UNITS {
            assert!(
                !me.loaded_before.contains(*u),
                "{u} is already loaded in the harness: another node is running"
            );
        }
        let unit_dir = me.root.join("etc/systemd/system");
        std::fs::create_dir_all(&unit_dir).expect("unit dir");
        me.bind(Path::new(HARNESS_UNIT_DIR), &unit_dir);
        if kind == RootKind::HarnessRealKubelet {
            me.ip_forward_before = std::fs::read_to_string("/proc/sys/net/ipv4/ip_forward").ok();
            for p in KUBELET_HOST_PATHS {
                let scratch = me.dir.join("scratch").join(p.replace('/', "_"));
                std::fs::create_dir_all(&scratch).expect("scratch dir");
                let target = Path::new(p);
                if !target.is_dir() {
                    std::fs::create_dir(target)
                        .unwrap_or_else(|e| panic!("mkdir {}: {e}", target.display()));
                    me.created.push(target.to_path_buf());
                }
                me.bind(&scratch, target);
            }
        }
        me
    }

    fn bind(&mut self, src: &Path, target: &Path) {
        let out = Command::new("mount")
            .args(["-n", "--bind"])
            .arg(src)
            .arg(target)
            .output()
            .expect("mount");
        assert!(
            out.status.success(),
            "mount --bind {} {}: {}",
            src.display(),
            target.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        self.binds.push(target.to_path_buf());
    }

    /// Writes the node config; remembers its `network.bridgeName` for the teardown.
    pub fn write_config(&mut self, yaml: &str) -> PathBuf {
        std::fs::write(&self.config_path, yaml).expect("write config");
        let doc: Value = serde_yaml_ng::from_str(yaml).unwrap_or(Value::Null);
        self.bridge = doc["network"]["bridgeName"].as_str().map(str::to_string);
        self.config_path.clone()
    }

    /// A `nodeward` command with `--root`, `--state-dir` and (once written) `--config` set
    /// through their environment variables, so `args` may still override them.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_nodeward"));
        c.args(args)
            .env("NODEWARD_ROOT", &self.root)
            .env("NODEWARD_STATE_DIR", &self.state_dir)
            .env_remove("NODEWARD_CONFIG")
            .env_remove("NODEWARD_BUNDLE");
        if self.config_path.exists() {
            c.env("NODEWARD_CONFIG", &self.config_path);
        }
        c
    }

    /// Runs `nodeward ARGS` (see [`NodeRoot::command`]) to completion.
    pub fn nodeward(&self, args: &[&str]) -> Output {
        self.command(args).output().expect("nodeward runs")
    }

    /// A snapshot of the root: root-relative path → entry, without [`TREE_EXCLUDES`], the
    /// kubelet's own files in `var/lib/kubelet` (see [`KUBELET_DIR_KEPT`]) and what the
    /// harness's unit directory held before this root existed.
    pub fn tree(&self) -> BTreeMap<String, Entry> {
        self.tree_excluding(&[])
    }

    /// [`NodeRoot::tree`] leaving out `extra` root-relative paths too.
    pub fn tree_excluding(&self, extra: &[&str]) -> BTreeMap<String, Entry> {
        let units_before: BTreeSet<String> = self
            .units_before
            .iter()
            .map(|p| format!("etc/systemd/system/{}", p.display()))
            .collect();
        let skip = |rel: &str| {
            let below = |e: &&str| rel == *e || rel.starts_with(&format!("{e}/"));
            TREE_EXCLUDES.iter().any(below)
                || extra.iter().any(below)
                || units_before.contains(rel)
                || rel.strip_prefix("var/lib/kubelet/").is_some_and(|k| {
                    !KUBELET_DIR_KEPT
                        .iter()
                        .any(|keep| k == *keep || k.starts_with(&format!("{keep}/")))
                })
        };
        snapshot(&self.root, skip)
    }

    /// `(ActiveState, SubState)` of the node's units and of any other `nodeward-*` unit loaded
    /// since this root was made.
    pub fn unit_states(&self) -> BTreeMap<String, (String, String)> {
        let mut names: BTreeSet<String> = NODE_UNITS.iter().map(|s| s.to_string()).collect();
        names.extend(
            loaded_nodeward_units()
                .into_iter()
                .filter(|u| !self.loaded_before.contains(u)),
        );
        names
            .into_iter()
            .map(|u| {
                let out = run(
                    "systemctl",
                    &["show", "-p", "ActiveState", "-p", "SubState", &u],
                );
                let text = String::from_utf8_lossy(&out.stdout).into_owned();
                let get = |k: &str| {
                    text.lines()
                        .find_map(|l| l.strip_prefix(&format!("{k}=")))
                        .unwrap_or("")
                        .to_string()
                };
                let states = (get("ActiveState"), get("SubState"));
                (u, states)
            })
            .collect()
    }

    /// What the node left on the shared host, as readable problems: new `nodeward-*` units
    /// loaded, processes of the node, mounts that were not there before (beyond this fixture's
    /// binds), kubepods cgroups, the bridge. Empty when nodeward's own teardown was complete.
    pub fn leftovers(&self) -> Vec<String> {
        let mut p = Vec::new();
        for (pid, what) in node_processes(&self.root, self.kind != RootKind::Plain) {
            p.push(format!("process {pid}: {what}"));
        }
        if self.kind == RootKind::Plain {
            return p;
        }
        for u in loaded_nodeward_units() {
            if !self.loaded_before.contains(&u) {
                p.push(format!("unit loaded: {u}"));
            }
        }
        let binds: BTreeSet<String> = self
            .binds
            .iter()
            .map(|b| b.to_string_lossy().into_owned())
            .collect();
        for m in mount_points() {
            if !self.mounts_before.contains(&m) && !binds.contains(&m) {
                p.push(format!("mounted: {m}"));
            }
        }
        for c in kubepods_cgroups() {
            p.push(format!("cgroup: {}", c.display()));
        }
        if let Some(b) = &self.bridge
            && Path::new("/sys/class/net").join(b).exists()
        {
            p.push(format!("bridge: {b}"));
        }
        for h in HOST_PATHS_WATCHED {
            if !self.host_paths_before.contains(h) && Path::new(h).exists() {
                p.push(format!(
                    "created on the host: {h} (not removed by the fixture)"
                ));
            }
        }
        p
    }

    /// Cleans up (see the type's doc) and asserts that nothing is left; returns what the node
    /// had left before the cleanup (empty when nodeward tore it down itself).
    #[track_caller]
    pub fn teardown(mut self) -> Vec<String> {
        let before = self.leftovers();
        let problems = self.cleanup();
        assert!(
            problems.is_empty(),
            "the node root's teardown left things behind:\n  {}",
            problems.join("\n  ")
        );
        before
    }

    /// The cleanup; returns what is still left afterwards.
    fn cleanup(&mut self) -> Vec<String> {
        if self.done {
            return Vec::new();
        }
        self.done = true;
        let mut problems = Vec::new();
        if self.kind != RootKind::Plain {
            // Units: the node's, any new nodeward-* one, and the kubelet's pod slices.
            let mut units: BTreeSet<String> = NODE_UNITS.iter().map(|s| s.to_string()).collect();
            units.extend(
                loaded_nodeward_units()
                    .into_iter()
                    .filter(|u| !self.loaded_before.contains(u)),
            );
            // One by one (a failed stop of one must not keep the others running), the kubelet
            // before containerd (reverse order of the names).
            for u in units.iter().rev() {
                let _ = run("systemctl", &["stop", u]);
            }
            let pods = run(
                "systemctl",
                &[
                    "list-units",
                    "--all",
                    "--plain",
                    "--no-legend",
                    "--full",
                    "kubepods*",
                ],
            );
            for u in String::from_utf8_lossy(&pods.stdout)
                .lines()
                .filter_map(|l| l.split_whitespace().next())
            {
                let _ = run("systemctl", &["stop", u]);
            }
        }
        // Whatever still runs from the root: SIGKILL by PID.
        for _ in 0..20 {
            let procs = node_processes(&self.root, self.kind != RootKind::Plain);
            if procs.is_empty() {
                break;
            }
            for (pid, _) in procs {
                let _ = rustix::process::kill_process(
                    rustix::process::Pid::from_raw(pid as i32).expect("pid"),
                    rustix::process::Signal::KILL,
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        if self.kind != RootKind::Plain {
            // Mounts new since the start (containerd's, pods' volumes, netns), deepest first,
            // then this fixture's binds in reverse.
            let binds: BTreeSet<String> = self
                .binds
                .iter()
                .map(|b| b.to_string_lossy().into_owned())
                .collect();
            let mut new: Vec<String> = mount_points()
                .into_iter()
                .filter(|m| !self.mounts_before.contains(m) && !binds.contains(m))
                .collect();
            new.sort_by_key(|m| std::cmp::Reverse(m.len()));
            for m in new.iter().chain(binds.iter().rev()) {
                umount(m);
            }
            for c in &self.created {
                if let Err(e) = std::fs::remove_dir(c) {
                    problems.push(format!("cannot remove {} (created here): {e}", c.display()));
                }
            }
            // Unit files the node wrote into the harness's unit directory.
            let now = files_below(Path::new(HARNESS_UNIT_DIR));
            let mut new_units: Vec<&PathBuf> = now.difference(&self.units_before).collect();
            new_units.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
            for rel in new_units {
                let p = Path::new(HARNESS_UNIT_DIR).join(rel);
                let _ = if p.is_dir() && !p.is_symlink() {
                    std::fs::remove_dir_all(&p)
                } else {
                    std::fs::remove_file(&p)
                };
            }
            // containerd 1.6's shims keep their sockets in /run/containerd/s whatever the
            // configured state directory is (hard-coded there); beneath a temporary root that
            // is the harness's private /run. Remove it when this root's node made it.
            if !self.host_paths_before.contains(SHIM_SOCKET_PARENT)
                && Path::new(SHIM_SOCKET_PARENT).exists()
            {
                let _ = std::fs::remove_dir_all(SHIM_SOCKET_PARENT);
            }
            let _ = run("systemctl", &["daemon-reload"]);
            let units: Vec<String> = loaded_nodeward_units()
                .into_iter()
                .filter(|u| !self.loaded_before.contains(u))
                .collect();
            for u in &units {
                let _ = run("systemctl", &["reset-failed", u]);
            }
            // kubepods cgroups in the hierarchies systemd does not manage: remove once empty.
            for _ in 0..10 {
                let left = kubepods_cgroups();
                if left.is_empty() {
                    break;
                }
                let mut all: Vec<PathBuf> = Vec::new();
                for c in left {
                    let mut below: Vec<PathBuf> = files_below(&c)
                        .into_iter()
                        .map(|r| c.join(r))
                        .filter(|p| p.is_dir())
                        .collect();
                    all.append(&mut below);
                    all.push(c);
                }
                all.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
                for d in all {
                    let _ = std::fs::remove_dir(d);
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            if let Some(b) = &self.bridge {
                delete_bridge(b);
            }
            if let Some(v) = &self.ip_forward_before {
                let _ = std::fs::write("/proc/sys/net/ipv4/ip_forward", v);
            }
        }
        problems.extend(self.leftovers());
        if self.kind != RootKind::Plain {
            let unit_files = files_below(Path::new(HARNESS_UNIT_DIR));
            for f in unit_files.difference(&self.units_before) {
                problems.push(format!(
                    "unit file left: {HARNESS_UNIT_DIR}/{}",
                    f.display()
                ));
            }
            for b in &self.binds {
                let s = b.to_string_lossy().into_owned();
                if !self.mounts_before.contains(&s) && mount_points().contains(&s) {
                    problems.push(format!("still bound: {s}"));
                }
            }
            if let Some(v) = &self.ip_forward_before
                && std::fs::read_to_string("/proc/sys/net/ipv4/ip_forward")
                    .ok()
                    .as_ref()
                    != Some(v)
            {
                problems.push("net.ipv4.ip_forward not restored".into());
            }
        }
        if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            problems.push(format!("cannot remove {}: {e}", self.dir.display()));
        }
        problems
    }
}

fn umount(m: &str) {
    let ok = Command::new("umount")
        .args(["-n", m])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        let _ = Command::new("umount").args(["-n", "-l", m]).output();
    }
}

fn delete_bridge(bridge: &str) {
    let out = run("ip", &["-o", "link", "show", "master", bridge]);
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        if let Some(name) = line.split(": ").nth(1) {
            let name = name.split('@').next().unwrap_or(name);
            let _ = run("ip", &["link", "del", name]);
        }
    }
    if Path::new("/sys/class/net").join(bridge).exists() {
        let _ = run("ip", &["link", "del", bridge]);
    }
}

impl Drop for NodeRoot {
    fn drop(&mut self) {
        let problems = self.cleanup();
        if !problems.is_empty() {
            let msg = format!(
                "the node root's teardown left things behind:\n  {}",
                problems.join("\n  ")
            );
            if std::thread::panicking() {
                eprintln!("{msg}");
            } else {
                panic!("{msg}");
            }
        }
    }
}

/// A snapshot of the tree at `root`, without what `skip` (given root-relative paths) rejects.
pub fn snapshot(root: &Path, skip: impl Fn(&str) -> bool) -> BTreeMap<String, Entry> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            let rel = p
                .strip_prefix(root)
                .expect("below root")
                .to_string_lossy()
                .into_owned();
            if skip(&rel) {
                continue;
            }
            let Ok(m) = std::fs::symlink_metadata(&p) else {
                continue;
            };
            let mode = m.permissions().mode() & 0o7777;
            let ft = m.file_type();
            let entry = if ft.is_symlink() {
                Entry::Symlink {
                    target: std::fs::read_link(&p)
                        .map(|t| t.to_string_lossy().into_owned())
                        .unwrap_or_default(),
                }
            } else if ft.is_dir() {
                stack.push(p);
                Entry::Dir { mode }
            } else if ft.is_file() {
                Entry::File {
                    mode,
                    sha256: sha256_file(&p),
                }
            } else {
                Entry::Other { mode }
            };
            out.insert(rel, entry);
        }
    }
    out
}

// ------------------------------------------------------------------------------------------------
// Node config
// ------------------------------------------------------------------------------------------------

/// The cluster a node joins, whichever kind.
#[derive(Clone, Debug)]
pub struct ClusterInfo {
    /// `https://host:port`.
    pub api_server: String,
    pub ca_pem: String,
    /// `<id>.<secret>`.
    pub bootstrap_token: String,
    /// Without the leading `v`.
    pub kube_version: String,
    /// The sandbox image, when the cluster has a local one.
    pub sandbox_image: Option<String>,
}

/// A bootstrap token for the stub setup (the stub API server accepts anything).
pub const STUB_TOKEN: &str = "stubid.0123456789abcdef";

impl ClusterInfo {
    /// The real cluster of `tests/cluster/mod.rs`.
    pub fn of_cluster(c: &Cluster) -> ClusterInfo {
        ClusterInfo {
            api_server: c.api_url.clone(),
            ca_pem: std::fs::read_to_string(&c.ca_cert).expect("cluster CA"),
            bootstrap_token: c.bootstrap_token.token(),
            kube_version: c.kube_version.trim_start_matches('v').to_string(),
            sandbox_image: Some(c.pause_image.clone()),
        }
    }

    /// The stub setup: [`StubApiServer`], the kubelet version `version` (without `v`).
    pub fn of_stub(api: &StubApiServer, version: &str) -> ClusterInfo {
        ClusterInfo {
            api_server: api.url(),
            ca_pem: api.ca_pem(),
            bootstrap_token: STUB_TOKEN.into(),
            kube_version: version.trim_start_matches('v').to_string(),
            sandbox_image: None,
        }
    }
}

/// What varies per node; [`NodeOptions::new`] picks fresh values.
#[derive(Clone, Debug)]
pub struct NodeOptions {
    pub machine_name: String,
    pub labels: BTreeMap<String, String>,
    /// `(key, value, effect)`.
    pub taints: Vec<(String, String, String)>,
    /// `nwbr<6 hex>`.
    pub bridge: String,
    /// A /24 out of 10.200.0.0/13 not routed on this machine.
    pub pod_cidr: String,
    /// This machine's primary IPv4 (the kubelet refuses a loopback node IP).
    pub node_ip: String,
    pub kubelet_port: u16,
    pub healthz_port: u16,
    /// The host root the node lives in (for paths the kubelet would otherwise create on the
    /// shared host, e.g. `volumePluginDir`).
    pub root: PathBuf,
}

/// The label every test node gets (`node.nodeward.io/test: "true"`) and its taint
/// (`node.nodeward.io/test=true:NoSchedule`), for the tests to assert.
pub const TEST_LABEL: (&str, &str) = ("node.nodeward.io/test", "true");
pub const TEST_TAINT: (&str, &str, &str) = ("node.nodeward.io/test", "true", "NoSchedule");

impl NodeOptions {
    pub fn new(root: &Path, machine_name: &str) -> NodeOptions {
        let kubelet_port = free_port();
        let mut healthz_port = free_port();
        while healthz_port == kubelet_port {
            healthz_port = free_port();
        }
        NodeOptions {
            machine_name: machine_name.to_string(),
            labels: BTreeMap::from([(TEST_LABEL.0.to_string(), TEST_LABEL.1.to_string())]),
            taints: vec![(
                TEST_TAINT.0.to_string(),
                TEST_TAINT.1.to_string(),
                TEST_TAINT.2.to_string(),
            )],
            bridge: format!("nwbr{:06x}", fastrand::u32(..1 << 24)),
            pod_cidr: free_pod_cidr(),
            node_ip: node_ip(),
            kubelet_port,
            healthz_port,
            root: root.to_path_buf(),
        }
    }

    /// The stub Node that matches these options (for [`StubApiServer::set_node`]).
    pub fn stub_node(&self, version: &str) -> StubNode {
        StubNode {
            labels: self.labels.clone(),
            taints: self
                .taints
                .iter()
                .map(|(k, v, e)| json!({"key": k, "value": v, "effect": e}))
                .collect(),
            ready: true,
            kubelet_version: version.trim_start_matches('v').to_string(),
        }
    }
}

/// A port free on 127.0.0.1 and on this machine's address right now (the kubelet binds it
/// later; another process could take it in between, which then fails the start loudly).
pub fn free_port() -> u16 {
    loop {
        let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind 127.0.0.1:0");
        let port = l.local_addr().expect("addr").port();
        let ip: Ipv4Addr = node_ip().parse().expect("node ip");
        if TcpListener::bind((ip, port)).is_ok() {
            return port;
        }
    }
}

/// This machine's primary IPv4 (`ip route get`'s `src`), as `scripts/kube-node-start.sh`.
pub fn node_ip() -> String {
    static IP: OnceLock<String> = OnceLock::new();
    IP.get_or_init(|| {
        let out = run("ip", &["-4", "-o", "route", "get", "1.1.1.1"]);
        let text = String::from_utf8_lossy(&out.stdout);
        let src = text
            .split_whitespace()
            .skip_while(|w| *w != "src")
            .nth(1)
            .map(str::to_string);
        src.or_else(|| {
            let out = run("ip", &["-4", "-o", "addr", "show", "scope", "global"]);
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .next()
                .and_then(|l| l.split_whitespace().nth(3))
                .and_then(|a| a.split('/').next())
                .map(str::to_string)
        })
        .expect("a global IPv4 address on this machine for the node IP")
    })
    .clone()
}

/// A /24 out of 10.200.0.0/13 that no route or address of this machine uses.
pub fn free_pod_cidr() -> String {
    let routes = format!(
        "{}\n{}",
        String::from_utf8_lossy(&run("ip", &["-4", "route", "show"]).stdout),
        String::from_utf8_lossy(&run("ip", &["-4", "addr", "show"]).stdout)
    );
    loop {
        let net = format!("10.{}.{}", 200 + fastrand::u8(..8), fastrand::u8(..));
        let used = routes.lines().any(|l| {
            l.trim_start().starts_with(&format!("{net}.")) || l.contains(&format!(" {net}."))
        });
        if !used {
            return format!("{net}.0/24");
        }
    }
}

/// A NodeConfig YAML joining `cluster` with the `artifacts`, tuned as
/// `scripts/kube-node-start.sh` tunes its kubelet for these shared VMs (no swap check, eviction
/// and image GC thresholds for a full disk, no iptables chains, healthz on 127.0.0.1, the
/// kubelet API on the node IP with webhook auth off) and containerd (`restrict_oom_score_adj`,
/// no SELinux, no snapshotters that probe the host).
pub fn node_config(cluster: &ClusterInfo, artifacts: &Served, opts: &NodeOptions) -> String {
    use base64::Engine as _;
    let downloads: serde_json::Map<String, Value> = artifacts
        .entries()
        .iter()
        .map(|(name, d)| (name.to_string(), json!({"url": d.url, "sha256": d.sha256})))
        .collect();
    let mut components = json!({
        "containerd": CONTAINERD_VERSION,
        "runc": RUNC_VERSION,
        "cniPlugins": CNI_PLUGINS_VERSION,
    });
    if let Some(img) = &cluster.sandbox_image {
        components["sandboxImage"] = json!(img);
    }
    let doc = json!({
        "apiVersion": "nodeward.io/v1alpha1",
        "kind": "NodeConfig",
        "machineName": opts.machine_name,
        "mode": "none",
        "cluster": {
            "apiServer": cluster.api_server,
            "caCertData": base64::engine::general_purpose::STANDARD.encode(&cluster.ca_pem),
            "kubernetesVersion": cluster.kube_version,
        },
        "kubelet": {
            "auth": {"bootstrapToken": cluster.bootstrap_token},
            "labels": opts.labels,
            "registerWithTaints": opts.taints.iter()
                .map(|(k, v, e)| json!({"key": k, "value": v, "effect": e}))
                .collect::<Vec<_>>(),
            "flags": [format!("--node-ip={}", opts.node_ip)],
            "config": {
                "address": opts.node_ip,
                "port": opts.kubelet_port,
                "healthzPort": opts.healthz_port,
                "healthzBindAddress": "127.0.0.1",
                "readOnlyPort": 0,
                "failSwapOn": false,
                "makeIPTablesUtilChains": false,
                "serializeImagePulls": false,
                "volumePluginDir": opts.root.join("var/lib/kubelet/volume-plugins"),
                // The shared disk is fuller than the default eviction thresholds allow.
                "evictionHard": {
                    "memory.available": "50Mi",
                    "nodefs.available": "1%",
                    "imagefs.available": "1%",
                    "nodefs.inodesFree": "1%",
                },
                "imageGCHighThresholdPercent": 100,
                "imageGCLowThresholdPercent": 99,
                "authentication": {
                    "anonymous": {"enabled": false},
                    "webhook": {"enabled": false},
                },
                "authorization": {"mode": "AlwaysAllow"},
            },
        },
        "network": {
            "podCIDR": opts.pod_cidr,
            "bridgeName": opts.bridge,
            "ipMasq": false,
        },
        "components": components,
        "containerd": {
            "config": {
                "disabled_plugins": [
                    "io.containerd.snapshotter.v1.devmapper",
                    "io.containerd.snapshotter.v1.zfs",
                    "io.containerd.snapshotter.v1.btrfs",
                    "io.containerd.snapshotter.v1.aufs",
                ],
                "plugins": {
                    "io.containerd.grpc.v1.cri": {
                        // These VMs lack CAP_SYS_RESOURCE: without it every sandbox fails.
                        "restrict_oom_score_adj": true,
                        "enable_selinux": false,
                    },
                },
            },
        },
        "downloads": downloads,
    });
    serde_yaml_ng::to_string(&doc).expect("config YAML")
}

/// The containerd socket of the node under `root`.
pub fn containerd_socket(root: &Path) -> PathBuf {
    root.join("run/containerd/containerd.sock")
}

/// Imports the real cluster's pause and workload images into the node's containerd: call it
/// after bootstrap started containerd and before any pod.
pub fn import_cluster_images(root: &Path, cluster: &Cluster) {
    import_images(
        root,
        &[&cluster.pause_image_tar, &cluster.workload_image_tar],
    );
}

/// Imports image tarballs (docker-archive or OCI) into the `k8s.io` namespace (the one the CRI
/// uses) of the containerd of the node under `root`, once it answers (≤ 30 s). Uses the node's
/// own `ctr` when installed, else the host's.
pub fn import_images(root: &Path, tars: &[&Path]) {
    let sock = containerd_socket(root);
    let address = sock.to_string_lossy().into_owned();
    let ctr = root.join("opt/nodeward/node/current/bin/ctr");
    let ctr = if ctr.is_file() {
        ctr
    } else {
        PathBuf::from("ctr")
    };
    wait_for(
        "the node's containerd answers",
        Duration::from_secs(30),
        || {
            Command::new(&ctr)
                .args(["--address", &address, "version"])
                .output()
                .ok()
                .filter(|o| o.status.success())
        },
    );
    for tar in tars {
        let out = Command::new(&ctr)
            .args(["--address", &address, "-n", "k8s.io", "images", "import"])
            .arg(tar)
            .output()
            .expect("ctr runs");
        assert!(
            out.status.success(),
            "ctr images import {}: {}",
            tar.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Writes a minimal docker-archive image `reference` (e.g. `localhost/fixture:test`) to `dest`:
/// one layer holding `/hello` with `contents`. For tests that need an image without the cluster.
pub fn docker_archive(dest: &Path, reference: &str, contents: &[u8]) {
    fn tar_bytes(files: &[(&str, &[u8])]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (name, data) in files {
            let mut h = tar::Header::new_gnu();
            h.set_path(name).expect("tar path");
            h.set_mode(0o644);
            h.set_size(data.len() as u64);
            h.set_mtime(0);
            h.set_cksum();
            b.append(&h, *data).expect("tar entry");
        }
        b.into_inner().expect("tar")
    }
    let layer = tar_bytes(&[("hello", contents)]);
    let diff_id = sha256_hex(&layer);
    let config = json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {"Cmd": ["/hello"]},
        "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{diff_id}")]},
    })
    .to_string();
    let config_name = format!("{}.json", sha256_hex(config.as_bytes()));
    let layer_name = format!("{diff_id}/layer.tar");
    let manifest = json!([{
        "Config": config_name,
        "RepoTags": [reference],
        "Layers": [layer_name],
    }])
    .to_string();
    let outer = tar_bytes(&[
        ("manifest.json", manifest.as_bytes()),
        (&config_name, config.as_bytes()),
        (&layer_name, &layer),
    ]);
    std::fs::write(dest, outer).expect("write image tarball");
}
