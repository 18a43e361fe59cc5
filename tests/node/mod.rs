//! The fixture of the none-mode tests (`nodeward bootstrap --root DIR --config FILE`).
//!
//! Include it with `mod cluster; mod node;` (it uses [`crate::cluster`] for the real cluster's
//! paths and images). Everything is re-exported here, so tests name `node::NodeRoot` and the
//! like; each concept lives in its own module:
//! - [`artifact_server`] — [`ArtifactServer`]: a real HTTP server on 127.0.0.1 serving files
//!   in-process, with a wrong-bytes mode for the digest-mismatch refusal;
//! - [`artifacts`] — [`packed`]: the upstream artifact formats (containerd and CNI tarballs, raw
//!   runc) packed from the Debian packages on this machine, once per test binary run, with the
//!   tarball helpers; [`stub_kubelet`]: the path of `examples/stub_kubelet.rs`, a stand-in for
//!   the kubelet used only in the crash-at-every-mutation loop;
//! - [`api_server`] — [`StubApiServer`]: HTTPS on 127.0.0.1 answering
//!   `GET /api/v1/nodes/<name>` with a Ready Node, recording each request;
//! - [`root`] — [`NodeRoot`]: a temporary host root; inside the systemd harness it binds the
//!   harness's unit directory at `<root>/etc/systemd/system` (and, for a real kubelet, scratch
//!   directories over the kubelet's hard-coded paths), and its teardown stops and removes what
//!   the node left, then asserts that nothing is left;
//! - [`host`] — what a node leaves on the shared host (units, cgroups, processes, mounts);
//! - [`tree`] — [`snapshot`]s of a root's tree, to compare runs;
//! - [`config`] — [`node_config`]: a NodeConfig YAML for the real cluster or the stub setup;
//! - [`images`] — [`import_cluster_images`] for the real cluster's local images
//!   ([`docker_archive`] makes a tiny one without the cluster);
//! - [`http`] — the tests' one HTTP server (`tests/common/http.rs`), which the two servers
//!   above are built on.
//!
//! This file keeps what they all share: whether the test runs in the systemd harness, and
//! sha256 helpers.
//!
//! Rules it keeps: it ends only processes its node started (by PID), sends traffic only to
//! 127.0.0.1 and this machine's own address, and leaves no mount, cgroup, unit or file outside
//! its temporary directories; [`NodeRoot::teardown`] checks that.
// Each test binary uses a different part of the fixture: what one leaves unused is not dead.
#![allow(dead_code)]

pub mod api_server;
pub mod artifact_server;
pub mod artifacts;
pub mod config;
pub mod host;
#[path = "../common/http.rs"]
pub mod http;
pub mod images;
pub mod root;
#[path = "../common/tls.rs"]
pub mod tls;
pub mod tree;

// A test binary that leaves some of these unused is still using the fixture.
#[allow(unused_imports)]
pub use self::{
    api_server::*, artifact_server::*, artifacts::*, config::*, host::*, images::*, root::*,
    tree::*,
};

use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

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

pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
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

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
