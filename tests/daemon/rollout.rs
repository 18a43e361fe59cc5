//! Signed phase bundles for the daemon's roll-out: the embedded bundle exported, tweaked (a
//! version, a grant), packed into an archive and signed with a key the node trusts, then served
//! by the test's artifact server.

use crate::cluster::Cluster;
use crate::node::{ArtifactServer, NodeRoot};
use crate::{condition, kubelet_invocation, ok, wait_logged};
use serde_json::{Value, json};
use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A platform team's signing key, trusted by the node under test.
pub struct Publisher {
    dir: PathBuf,
    secret: PathBuf,
    public: PathBuf,
}

/// A published bundle: where it is served, its archive's sha256, its manifest digest.
pub struct Published {
    pub url: String,
    pub sha256: String,
    pub digest: String,
}

impl Publisher {
    /// A fresh key pair in `dir`, its public key installed as trusted beneath `root`'s root
    /// (`etc/nodeward/trusted-keys`, which the daemon's children read by default).
    pub fn new(root: &NodeRoot, dir: &Path) -> Publisher {
        let kp = minisign::KeyPair::generate_unencrypted_keypair().expect("keypair");
        let dir = dir.join("publisher");
        std::fs::create_dir_all(&dir).expect("publisher dir");
        let public = dir.join("platform.pub");
        let secret = dir.join("platform.key");
        std::fs::write(&public, kp.pk.to_box().expect("pk").to_string()).expect("pub");
        std::fs::write(&secret, kp.sk.to_box(None).expect("sk").to_string()).expect("key");
        let trusted = root.root.join("etc/nodeward/trusted-keys");
        std::fs::create_dir_all(&trusted).expect("trusted keys dir");
        std::fs::copy(&public, trusted.join("platform.pub")).expect("trust the key");
        use std::os::unix::fs::PermissionsExt;
        for f in [&public, &trusted.join("platform.pub")] {
            std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        }
        Publisher {
            dir,
            secret,
            public,
        }
    }

    /// The embedded bundle as version `version` with `tweak` applied to its manifest, packed,
    /// signed and served as `name`.
    pub fn publish(
        &self,
        root: &NodeRoot,
        server: &ArtifactServer,
        name: &str,
        version: i64,
        tweak: impl FnOnce(&mut toml::Table),
    ) -> Published {
        self.publish_dir(root, server, name, version, |t, _| tweak(t))
    }

    /// [`Self::publish`], where `tweak` may also put files beside the manifest (the bundle's
    /// source directory, its second argument).
    pub fn publish_dir(
        &self,
        root: &NodeRoot,
        server: &ArtifactServer,
        name: &str,
        version: i64,
        tweak: impl FnOnce(&mut toml::Table, &Path),
    ) -> Published {
        let src = self.dir.join(format!("{name}-src"));
        run(root, &["phases", "export", s(&src)]);
        let manifest = src.join("manifest.toml");
        let mut t: toml::Table = std::fs::read_to_string(&manifest)
            .expect("exported manifest")
            .parse()
            .expect("manifest TOML");
        t["bundle"]
            .as_table_mut()
            .expect("[bundle]")
            .insert("version".into(), toml::Value::Integer(version));
        tweak(&mut t, &src);
        std::fs::write(&manifest, toml::to_string(&t).expect("manifest")).expect("write");
        let archive = self.dir.join(format!("{name}.tar.gz"));
        run(root, &["phases", "pack", s(&src), "-o", s(&archive)]);
        run(
            root,
            &["phases", "sign", s(&archive), "--key", s(&self.secret)],
        );
        let verified = run(
            root,
            &[
                "phases",
                "verify",
                s(&archive),
                "--trusted-key",
                s(&self.public),
                "--output",
                "json",
            ],
        );
        let digest = verified["bundle"]["digest"]
            .as_str()
            .expect("digest")
            .to_string();
        let (url, sha256) = server.serve_file(&format!("{name}.tar.gz"), &archive);
        Published {
            url,
            sha256,
            digest,
        }
    }
}

/// The `[[phases]]` table named `name`.
pub fn phase<'a>(t: &'a mut toml::Table, name: &str) -> &'a mut toml::Table {
    t["phases"]
        .as_array_mut()
        .expect("phases")
        .iter_mut()
        .filter_map(toml::Value::as_table_mut)
        .find(|p| p.get("name").and_then(toml::Value::as_str) == Some(name))
        .expect("the phase")
}

/// `nodeward ARGS` with the node's flags; its JSON output when it printed any.
fn run(root: &NodeRoot, args: &[&str]) -> Value {
    let out = root.nodeward(args);
    assert!(
        out.status.success(),
        "nodeward {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// The BundleApplied condition's (status, reason) and `status.activeBundle.digest`.
pub fn bundle_state(m: &Value) -> (String, String, String) {
    let c = condition(m, "BundleApplied")
        .cloned()
        .unwrap_or(Value::Null);
    let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
    (
        s(&c["status"]),
        s(&c["reason"]),
        s(&m["status"]["activeBundle"]["digest"]),
    )
}

/// Phase bundle roll-outs from `spec.phaseBundle`: a widening bundle waits for consent by
/// digest, then is installed, its changed phase run and the node restarted behind the health
/// gate; a bundle whose changed phase fails on the node is rolled back. The bundle the node
/// runs afterwards (v2).
pub fn roll_out_bundles(
    cluster: &Cluster,
    root: &NodeRoot,
    server: &ArtifactServer,
    name: &str,
    log_path: &Path,
    publisher: &Publisher,
) -> Published {
    // v2: `configure` may also read etc/hosts: wider than the embedded bundle.
    let v2 = publisher.publish(root, server, "bundle-v2", 2, |t| {
        let fs = phase(t, "configure")["grants"]["fs"]
            .as_table_mut()
            .expect("configure fs grants");
        let read = fs
            .entry("read")
            .or_insert(toml::Value::Array(vec![]))
            .as_array_mut()
            .expect("read");
        read.push("etc/hosts".into());
    });
    let machine = |cluster: &Cluster| cluster.get_json(&["get", "machines.nodeward.io", name]);
    let patch = |spec: Value| {
        cluster.patch_machine(name, &json!({"spec": {"phaseBundle": spec}}));
    };
    patch(json!({"url": v2.url, "sha256": v2.sha256}));
    let m = wait_logged("GrantsWiden", Duration::from_secs(120), log_path, || {
        let m = machine(cluster)?;
        (bundle_state(&m).1 == "GrantsWiden").then_some(m)
    });
    assert_eq!(bundle_state(&m).0, "False", "{m}");
    assert_eq!(m["status"]["phase"], "Failed", "{m}");

    // Consent by digest: installed, `configure` run again, the node restarted and healthy.
    let before = kubelet_invocation();
    let t = Instant::now();
    patch(json!({"url": v2.url, "sha256": v2.sha256, "acceptGrantsDigest": v2.digest}));
    let m = wait_logged("v2 active", Duration::from_secs(300), log_path, || {
        let m = machine(cluster)?;
        (bundle_state(&m) == ("True".into(), "BundleActive".into(), v2.digest.clone())).then_some(m)
    });
    eprintln!(
        "daemon: bundle roll-out (install, configure, restart, health gate) in {} ms",
        t.elapsed().as_millis()
    );
    assert_eq!(m["status"]["phase"], "Ready", "{m}");
    // The roll-out's child runs, in the daemon's metrics (read from their audit records).
    let metrics = scrape_metrics(log_path);
    assert!(
        metrics.contains(
            "nodeward_daemon_phase_duration_seconds_count{phase=\"configure\",outcome=\"ok\"}"
        ),
        "{metrics}"
    );
    assert!(
        metrics
            .contains("nodeward_daemon_capability_calls_total{interface=\"fs\",denied=\"false\"}"),
        "{metrics}"
    );
    let after = kubelet_invocation();
    assert!(
        !after.is_empty() && after != before,
        "restarted: {before} -> {after}"
    );
    let history = ok(root, &["phases", "history"]);
    assert!(history.to_string().contains(&v2.digest), "{history}");

    // v3: `configure` loses its `bootstrap-kubeconfig` input part (a narrower grant: no consent
    // asked), so it is not told the kubeconfig's path and fails on the node: rolled back to v2.
    let v3 = publisher.publish(root, server, "bundle-v3", 3, |t| {
        let input = phase(t, "configure")["grants"]["input"]
            .as_array_mut()
            .expect("configure input grants");
        let before = input.len();
        input.retain(|part| part.as_str() != Some("bootstrap-kubeconfig"));
        assert_eq!(input.len() + 1, before, "the part was granted");
    });
    patch(json!({"url": v3.url, "sha256": v3.sha256, "acceptGrantsDigest": v2.digest}));
    let m = wait_logged("v3 rolled back", Duration::from_secs(300), log_path, || {
        let m = machine(cluster)?;
        (bundle_state(&m).1 == "BundleRolledBack").then_some(m)
    });
    let (status, _, active) = bundle_state(&m);
    assert_eq!(
        (status.as_str(), active.as_str()),
        ("False", v2.digest.as_str()),
        "{m}"
    );
    let message = condition(&m, "BundleApplied").expect("BundleApplied")["message"].to_string();
    assert!(
        message.contains("configure") && message.contains("rolled back"),
        "{message}"
    );
    let current = std::fs::read_link(root.state_dir.join("bundles/current")).expect("current");
    assert!(
        current.to_string_lossy().contains(&v2.digest),
        "{}",
        current.display()
    );
    let node = cluster.get_json(&["get", "node", name]).expect("the Node");
    let ready = node["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["status"] == "True");
    assert!(ready, "the node is Ready again with v2: {node}");
    v2
}

/// The daemon's metrics, from the endpoint its log names (`serving metrics bound=…`).
pub fn scrape_metrics(log_path: &Path) -> String {
    let log = std::fs::read_to_string(log_path).expect("daemon log");
    let addr = log
        .lines()
        .find(|l| l.contains("serving metrics"))
        .and_then(|l| l.split("bound=").nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("the metrics address in the log:\n{log}"))
        .to_string();
    let mut stream = std::net::TcpStream::connect(&addr).expect("connect to the metrics");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .expect("request");
    let mut body = String::new();
    stream.read_to_string(&mut body).expect("response");
    body
}
