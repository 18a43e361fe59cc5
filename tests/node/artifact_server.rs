//! [`ArtifactServer`]: the web server a none node downloads its artifacts from, on 127.0.0.1.
//!
//! A node config names each download by URL and sha256 ([`Download`]); the tests serve the
//! packed artifacts and kubelets from where they already are ([`ArtifactServer::serve_file`],
//! no copy of ~100 MB binaries), small files from a directory, and switch a name to the wrong
//! bytes on cue ([`ArtifactServer::serve_wrong_bytes`]) for the digest-mismatch refusal. The
//! HTTP is the tests' one server, [`crate::node::http::HttpServer`].

use super::http::{HttpServer, Reply, Request};
use super::{lock, sha256_cached, sha256_hex};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

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
}

/// A static HTTP server on 127.0.0.1 (a random port bound directly, no pick-then-bind race),
/// serving the files of a directory and registered paths, on a thread of this process. It stops
/// when dropped.
pub struct ArtifactServer {
    /// `http://127.0.0.1:<port>`, no trailing slash.
    pub url_base: String,
    pub dir: PathBuf,
    routes: Arc<Mutex<Routes>>,
    server: HttpServer,
    // Dropped after the server, which may still be reading from it.
    _tmp: Option<tempfile::TempDir>,
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
        let routes = Arc::new(Mutex::new(Routes::default()));
        let server = {
            let (routes, dir) = (routes.clone(), dir.clone());
            HttpServer::start(move |req| answer(req, &routes, &dir))
        };
        ArtifactServer {
            url_base: server.base_url(),
            dir,
            routes,
            server,
            _tmp: tmp,
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

    /// Every request so far, as `METHOD /path` (query left out).
    pub fn requests(&self) -> Vec<String> {
        self.server
            .requests()
            .iter()
            .map(|r| format!("{} {}", r.method, r.path()))
            .collect()
    }
}

/// `GET`/`HEAD /<name>`: the wrong bytes if set, else the registered file, else `dir/<name>`
/// (flat names only), else 404; any other method 405.
fn answer(req: &Request, routes: &Mutex<Routes>, dir: &Path) -> Reply {
    let name = req.path().trim_start_matches('/');
    let (file, wrong) = {
        let r = lock(routes);
        (r.files.get(name).cloned(), r.wrong.get(name).cloned())
    };
    let ok_name = !name.is_empty() && !name.contains('/') && !name.starts_with('.');
    if !matches!(req.method.as_str(), "GET" | "HEAD") {
        Reply::empty(405)
    } else if let Some(bytes) = wrong {
        Reply::ok(&bytes)
    } else if let Some(path) = file
        .or_else(|| ok_name.then(|| dir.join(name)))
        .filter(|p| std::fs::metadata(p).is_ok_and(|m| m.is_file()))
    {
        Reply::file(path)
    } else {
        Reply::not_found()
    }
}
