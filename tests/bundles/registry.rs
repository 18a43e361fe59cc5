//! A real OCI registry for the tests: Debian's `docker-registry` (the CNCF distribution
//! registry) serving a temporary directory on a free 127.0.0.1 port, killed by its PID when
//! dropped. Artifacts are pushed to it with oci-client's push API, as a platform team's client
//! would; its storage can be tampered with to serve bytes that are not what it advertises.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Where Debian installs the registry (`scripts/setup-debian.sh`).
const BINARY: &str = "/usr/bin/docker-registry";

/// A running registry; stopped (SIGKILL, by PID) and its storage removed when dropped.
pub struct Registry {
    child: Child,
    /// `127.0.0.1:PORT`.
    pub addr: String,
    dir: tempfile::TempDir,
}

impl Registry {
    /// Starts a registry with empty storage and waits until it answers `GET /v2/`. Fails the
    /// test (never skips it) when the binary is missing.
    pub fn start() -> Registry {
        assert!(
            Path::new(BINARY).is_file(),
            "{BINARY} is missing: run scripts/setup-debian.sh (it installs Debian's \
             docker-registry package, which these tests run on 127.0.0.1)"
        );
        let dir = tempfile::tempdir().expect("registry dir");
        // The port is free when asked; another process may take it before the registry binds
        // it, so a registry that exits at start is tried again on another port.
        for _ in 0..5 {
            let port = TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .expect("a free port")
                .port();
            let addr = format!("127.0.0.1:{port}");
            let config = dir.path().join("config.yml");
            std::fs::write(
                &config,
                format!(
                    "version: 0.1\nlog:\n  level: info\nstorage:\n  filesystem:\n    \
                     rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: {addr}\n",
                    dir.path().join("storage").display()
                ),
            )
            .expect("registry config");
            let log = std::fs::File::create(dir.path().join("registry.log")).expect("log");
            let mut child = Command::new(BINARY)
                .arg("serve")
                .arg(&config)
                .stdin(Stdio::null())
                .stdout(log.try_clone().expect("log"))
                .stderr(log)
                .spawn()
                .expect("start docker-registry");
            if wait_ready(&mut child, &addr) {
                return Registry { child, addr, dir };
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!(
            "docker-registry did not start on a free 127.0.0.1 port in 5 attempts: {}",
            std::fs::read_to_string(dir.path().join("registry.log")).unwrap_or_default()
        )
    }

    /// The registry's own log, for assertion messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default()
    }

    /// The file the registry serves the blob `sha256:<hex>` from.
    pub fn blob_file(&self, hex: &str) -> PathBuf {
        self.dir
            .path()
            .join("storage/docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether `child`'s `GET /v2/` on `addr` answers 200 within 20 s (false when it exited).
fn wait_ready(child: &mut Child, addr: &str) -> bool {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if child.try_wait().ok().flatten().is_some() {
            return false;
        }
        if get_status(addr, "/v2/") == Some(200) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// The status code of `GET path` on `addr`, if it answered.
fn get_status(addr: &str, path: &str) -> Option<u16> {
    let mut stream = TcpStream::connect(addr).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).ok()?;
    std::str::from_utf8(&head[9..12]).ok()?.parse().ok()
}
