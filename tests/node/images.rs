//! Container images for a test node's containerd: the real cluster's local images
//! ([`import_cluster_images`]), any image tarball ([`import_images`]), and a tiny
//! docker-archive image made on the spot ([`docker_archive`]) for tests without the cluster.
//!
//! The test machines have no registry access, so every image a pod uses is imported into the
//! node's containerd before the pod is scheduled.

use super::sha256_hex;
use crate::cluster::{Cluster, wait_for};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

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
