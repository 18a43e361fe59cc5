//! Tests of the none-mode fixture itself (tests/node/), no nodeward yet.
//!
//! Plain tests (run anywhere): the artifact packing, the artifact server (right digest, wrong
//! bytes on request), the stub API server over TLS, the stub kubelet, the config builder and the
//! tree snapshot. `#[ignore]`d ones need the systemd harness (`scripts/test.sh`): the root
//! fixture's bind of the harness's unit directory and of the kubelet's host paths, and that its
//! teardown stops, removes and checks everything.

mod cluster;
mod node;

use node::*;
use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn client(ca_pem: Option<&str>) -> reqwest::blocking::Client {
    let mut b = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(10))
        .no_proxy();
    if let Some(pem) = ca_pem {
        b = b.add_root_certificate(reqwest::Certificate::from_pem(pem.as_bytes()).unwrap());
    }
    b.build().unwrap()
}

fn get(url: &str) -> (u16, Vec<u8>) {
    let r = client(None).get(url).send().unwrap();
    (r.status().as_u16(), r.bytes().unwrap().to_vec())
}

fn sha(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}

#[test]
fn packing_makes_the_upstream_layouts_deterministically() {
    let t = Instant::now();
    let p = packed();
    eprintln!(
        "packed() {} ms (packing {} ms; 0 = cache valid); containerd {} MB, cni {} MB",
        t.elapsed().as_millis(),
        p.pack_ms,
        std::fs::metadata(&p.containerd_tgz).unwrap().len() >> 20,
        std::fs::metadata(&p.cni_tgz).unwrap().len() >> 20,
    );

    let c = tgz_entries(&p.containerd_tgz);
    let names: Vec<&str> = c.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        [
            "bin/",
            "bin/containerd",
            "bin/containerd-shim-runc-v2",
            "bin/ctr"
        ]
    );
    for src in CONTAINERD_FILES {
        let name = format!(
            "bin/{}",
            Path::new(src).file_name().unwrap().to_string_lossy()
        );
        assert_eq!(c[&name], (0o755, sha256_file(Path::new(src))), "{name}");
    }

    let cni = tgz_entries(&p.cni_tgz);
    assert_eq!(cni["./"].0, 0o755);
    assert!(cni.contains_key("./bridge") && cni.contains_key("./host-local"));
    assert_eq!(cni.len(), p.cni_plugins.len() + 1);
    for name in &p.cni_plugins {
        let src = Path::new(CNI_DIR).join(name);
        assert_eq!(
            cni[&format!("./{name}")],
            (0o755, sha256_file(&src)),
            "{name}"
        );
    }

    assert_eq!(sha256_file(&p.runc), sha256_file(Path::new(RUNC_FILE)));
    let mode = std::fs::metadata(&p.runc).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o755);

    // Deterministic: the same files packed twice give the same bytes (so the digests stay the
    // same when the cache is rebuilt).
    let other = tempfile::tempdir().unwrap();
    let entries: Vec<(String, std::path::PathBuf)> = p.cni_plugins[..2]
        .iter()
        .map(|n| (format!("./{n}"), Path::new(CNI_DIR).join(n)))
        .collect();
    let (a, b) = (other.path().join("a.tgz"), other.path().join("b.tgz"));
    write_tgz(&a, Some("./"), &entries);
    std::thread::sleep(Duration::from_millis(1100));
    write_tgz(&b, Some("./"), &entries);
    assert_eq!(sha256_file(&a), sha256_file(&b));
}

#[test]
fn artifact_server_serves_with_the_right_digest_and_wrong_bytes_on_request() {
    let s = ArtifactServer::start_temp();
    assert!(s.url_base.starts_with("http://127.0.0.1:"));
    let (url, digest) = s.serve("hello.bin", b"hello artifact\n");
    assert_eq!(digest, sha(b"hello artifact\n"));
    let (code, body) = get(&url);
    assert_eq!((code, body.as_slice()), (200, &b"hello artifact\n"[..]));

    // A registered file, served in place.
    let src = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(src.path(), vec![7u8; 3 << 20]).unwrap();
    let d = s.download("big", src.path());
    let (code, body) = get(&d.url);
    assert_eq!(code, 200);
    assert_eq!(sha(&body), d.sha256);

    // The wrong-bytes mode: same URL, other bytes, so the pinned digest no longer matches.
    s.serve_wrong_bytes("hello.bin", b"tampered\n");
    let (code, body) = get(&url);
    assert_eq!((code, body.as_slice()), (200, &b"tampered\n"[..]));
    assert_ne!(sha(&body), digest);
    s.serve_right_bytes("hello.bin");
    assert_eq!(get(&url).1, b"hello artifact\n");

    assert_eq!(get(&s.url("missing")).0, 404);
    assert_eq!(get(&s.url("..%2Fetc%2Fpasswd")).0, 404);
    assert_eq!(
        s.requests()
            .iter()
            .filter(|r| *r == "GET /hello.bin")
            .count(),
        3
    );

    // Stops on drop: the port refuses connections.
    let base = s.url_base.clone();
    drop(s);
    assert!(
        client(None)
            .get(format!("{base}/hello.bin"))
            .send()
            .is_err()
    );
}

#[test]
fn stub_api_server_answers_over_tls_verified_with_its_ca() {
    let api = StubApiServer::start();
    assert!(api.url().starts_with("https://127.0.0.1:"));
    let mut node = StubNode::ready("1.20.2");
    node.labels.insert("a".into(), "b".into());
    node.taints
        .push(serde_json::json!({"key": "k", "value": "v", "effect": "NoSchedule"}));
    api.set_node("n1", node);

    let c = client(Some(&api.ca_pem()));
    let r = c
        .get(format!("{}/api/v1/nodes/n1", api.url()))
        .bearer_auth("stub-kubelet")
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let v: serde_json::Value = serde_json::from_slice(&r.bytes().unwrap()).unwrap();
    assert_eq!(v["metadata"]["name"], "n1");
    assert_eq!(v["metadata"]["labels"]["a"], "b");
    assert_eq!(v["spec"]["taints"][0]["effect"], "NoSchedule");
    assert_eq!(v["status"]["conditions"][0]["type"], "Ready");
    assert_eq!(v["status"]["conditions"][0]["status"], "True");
    assert_eq!(v["status"]["nodeInfo"]["kubeletVersion"], "v1.20.2");

    let r = c
        .get(format!("{}/api/v1/nodes/nope", api.url()))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);
    let v: serde_json::Value = serde_json::from_slice(&r.bytes().unwrap()).unwrap();
    assert_eq!(
        (v["kind"].as_str(), v["code"].as_u64()),
        (Some("Status"), Some(404))
    );

    let list = c
        .get(format!(
            "{}/api/v1/nodes?fieldSelector=metadata.name%3Dn1",
            api.url()
        ))
        .send()
        .unwrap()
        .bytes()
        .unwrap();
    let list: serde_json::Value = serde_json::from_slice(&list).unwrap();
    assert_eq!(list["items"].as_array().unwrap().len(), 1);

    // Without the CA the certificate is not trusted.
    assert!(
        client(None)
            .get(format!("{}/healthz", api.url()))
            .send()
            .is_err()
    );

    let reqs = api.requests();
    assert_eq!(reqs[0].method, "GET");
    assert_eq!(reqs[0].path, "/api/v1/nodes/n1");
    assert_eq!(
        reqs[0].authorization.as_deref(),
        Some("Bearer stub-kubelet")
    );
    assert_eq!(reqs[1].authorization, None);
    assert_eq!(reqs.len(), 3, "{reqs:?}");
}

fn wait_healthz(port: u16, child: &mut std::process::Child) -> Duration {
    let t = Instant::now();
    loop {
        if let Ok((200, body)) = client(None)
            .get(format!("http://127.0.0.1:{port}/healthz"))
            .send()
            .map(|r| (r.status().as_u16(), r.bytes().unwrap().to_vec()))
        {
            assert_eq!(body, b"ok");
            return t.elapsed();
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "stub kubelet exited early"
        );
        assert!(t.elapsed() < Duration::from_secs(10), "no healthz");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn stub_kubelet_serves_healthz_and_completes_the_bootstrap() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = dir.path().join("config.yaml");
    std::fs::write(
        &config,
        format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
             healthzPort: {port}\nhealthzBindAddress: 127.0.0.1\nfailSwapOn: false\n"
        ),
    )
    .unwrap();
    let boot = dir.path().join("bootstrap.conf");
    std::fs::write(
        &boot,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: other\n  cluster:\n    server: https://10.9.9.9:1\n\
         - name: c\n  cluster:\n    server: https://127.0.0.1:6443\n    certificate-authority-data: Q0E=\n\
         contexts:\n- name: ctx\n  context:\n    cluster: c\n    user: u\ncurrent-context: ctx\n\
         users:\n- name: u\n  user:\n    token: abcdef.0123456789abcdef\n",
    )
    .unwrap();
    let kubeconfig = dir.path().join("kubelet/kubeconfig");
    let mut child = Command::new(stub_kubelet())
        .arg(format!("--config={}", config.display()))
        .arg(format!("--bootstrap-kubeconfig={}", boot.display()))
        .args(["--kubeconfig"])
        .arg(&kubeconfig)
        .args([
            "--container-runtime=remote",
            "--node-ip=10.0.0.1",
            "--hostname-override",
            "x",
            "--v=2",
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let took = wait_healthz(port, &mut child);
    eprintln!("stub kubelet healthy after {} ms", took.as_millis());
    let r = client(None)
        .get(format!("http://127.0.0.1:{port}/other"))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);

    let meta = std::fs::metadata(&kubeconfig).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    let kc: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(&kubeconfig).unwrap()).unwrap();
    let cluster = &kc["clusters"][0]["cluster"];
    assert_eq!(cluster["server"].as_str(), Some("https://127.0.0.1:6443"));
    assert_eq!(cluster["certificate-authority-data"].as_str(), Some("Q0E="));
    assert_eq!(
        kc["users"][0]["user"]["token"].as_str(),
        Some("stub-kubelet")
    );
    // No temp file left beside it.
    let names: Vec<_> = std::fs::read_dir(kubeconfig.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["kubeconfig"]);

    // SIGTERM, by PID, ends it.
    let pid = rustix::process::Pid::from_child(&child);
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let status = child.wait().unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(15), "{status:?}");
}

#[test]
fn stub_kubelet_refuses_bad_input_with_exit_1() {
    let dir = tempfile::tempdir().unwrap();
    let run = |args: &[String]| {
        let out = Command::new(stub_kubelet()).args(args).output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let missing = dir.path().join("missing.yaml");
    let (code, err) = run(&[format!("--config={}", missing.display())]);
    assert_eq!(code, Some(1));
    assert!(err.contains("missing.yaml"), "{err}");
    assert!(!err.contains("panicked"), "{err}");

    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "healthzPort: [not a port\n").unwrap();
    let (code, err) = run(&[format!("--config={}", bad.display())]);
    assert_eq!(code, Some(1), "{err}");

    let cfg = dir.path().join("ok.yaml");
    std::fs::write(&cfg, format!("healthzPort: {}\n", free_port())).unwrap();
    let (code, err) = run(&[
        format!("--config={}", cfg.display()),
        format!("--kubeconfig={}", dir.path().join("kc").display()),
        format!("--bootstrap-kubeconfig={}", missing.display()),
    ]);
    assert_eq!(code, Some(1));
    assert!(err.contains("bootstrap kubeconfig"), "{err}");
    assert!(!dir.path().join("kc").exists());
}

#[test]
fn node_config_is_a_valid_nodeconfig() {
    let api = StubApiServer::start();
    let root = tempfile::tempdir().unwrap();
    let d = |n: &str| Download {
        url: format!("http://127.0.0.1:1/{n}"),
        sha256: "a".repeat(64),
    };
    let served = Served {
        kubelet: d("kubelet"),
        containerd: d("containerd"),
        runc: d("runc"),
        cni_plugins: d("cni"),
    };
    let opts = NodeOptions::new(root.path(), "stub-node-1");
    let yaml = node_config(&ClusterInfo::of_stub(&api, "1.20.2"), &served, &opts);
    let c: nodeward_node_config::NodeConfig = serde_yaml_ng::from_str(&yaml).unwrap();
    c.validate().unwrap();
    assert_eq!(c.ca_cert_pem().unwrap(), api.ca_pem());
    assert_eq!(c.cluster.kubernetes_version, "1.20.2");
    assert_eq!(c.downloads.len(), 4);
    assert_eq!(c.downloads["cni-plugins"].url, "http://127.0.0.1:1/cni");
    assert!(c.network.bridge_name.starts_with("nwbr") && c.network.bridge_name.len() == 10);
    assert!(!c.network.ip_masq);
    assert!(
        c.network.pod_cidr.starts_with("10.2"),
        "{}",
        c.network.pod_cidr
    );
    assert_eq!(c.kubelet.flags, [format!("--node-ip={}", opts.node_ip)]);
    assert_eq!(c.kubelet.config["healthzPort"], opts.healthz_port);
    assert_eq!(c.kubelet.labels[TEST_LABEL.0], TEST_LABEL.1);
    assert_eq!(c.kubelet.register_with_taints[0].effect, "NoSchedule");
    assert_eq!(
        c.containerd.config["plugins"]["io.containerd.grpc.v1.cri"]["restrict_oom_score_adj"],
        true
    );
    assert_ne!(opts.node_ip, "127.0.0.1");
}

#[test]
fn tree_snapshot_records_modes_digests_links_and_skips_runtime_state() {
    let r = NodeRoot::new(RootKind::Plain);
    let w = |rel: &str, text: &str, mode: u32| {
        let p = r.root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, text).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
    };
    w("opt/nodeward/node/1.20.2-abc/bin/kubelet", "k", 0o755);
    std::os::unix::fs::symlink("1.20.2-abc", r.root.join("opt/nodeward/node/current")).unwrap();
    w("var/lib/kubelet/config.yaml", "c", 0o644);
    w(
        "var/lib/kubelet/kubeconfig",
        "written by the kubelet",
        0o600,
    );
    w("var/lib/kubelet/pods/x/y", "pod", 0o644);
    w("run/containerd/containerd.sock.ttrpc", "s", 0o644);
    w("var/lib/containerd/meta.db", "m", 0o644);
    w("var/log/pods/x.log", "l", 0o644);

    let t = r.tree();
    let keys: Vec<&str> = t.keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        [
            "opt",
            "opt/nodeward",
            "opt/nodeward/node",
            "opt/nodeward/node/1.20.2-abc",
            "opt/nodeward/node/1.20.2-abc/bin",
            "opt/nodeward/node/1.20.2-abc/bin/kubelet",
            "opt/nodeward/node/current",
            "var",
            "var/lib",
            "var/lib/kubelet",
            "var/lib/kubelet/config.yaml",
        ]
    );
    assert_eq!(
        t["opt/nodeward/node/1.20.2-abc/bin/kubelet"],
        Entry::File {
            mode: 0o755,
            sha256: sha(b"k")
        }
    );
    assert_eq!(
        t["opt/nodeward/node/current"],
        Entry::Symlink {
            target: "1.20.2-abc".into()
        }
    );
    assert!(matches!(t["var/lib/kubelet"], Entry::Dir { .. }));

    // A mode change and a content change both show.
    w("var/lib/kubelet/config.yaml", "c", 0o600);
    w("opt/nodeward/node/1.20.2-abc/bin/kubelet", "k2", 0o755);
    let t2 = r.tree();
    let changed: BTreeMap<_, _> = t2.iter().filter(|(k, v)| t.get(*k) != Some(v)).collect();
    assert_eq!(changed.len(), 2, "{changed:?}");
    assert!(
        r.tree_excluding(&["opt"])
            .keys()
            .all(|k| !k.starts_with("opt"))
    );

    let dir = r.dir.clone();
    assert!(r.teardown().is_empty());
    assert!(!dir.exists());
}

#[test]
fn teardown_kills_what_runs_from_the_root() {
    let r = NodeRoot::new(RootKind::Plain);
    let bin = r.root.join("opt/nodeward/node/v/bin/sleep");
    std::fs::create_dir_all(bin.parent().unwrap()).unwrap();
    std::fs::copy("/bin/sleep", &bin).unwrap();
    let mut child = Command::new(&bin).arg("300").spawn().unwrap();
    let t = Instant::now();
    while r.leftovers().is_empty() {
        assert!(t.elapsed() < Duration::from_secs(5));
        std::thread::sleep(Duration::from_millis(10));
    }
    let before = r.teardown();
    assert_eq!(before.len(), 1, "{before:?}");
    assert!(
        before[0].contains(&format!("process {}", child.id())),
        "{before:?}"
    );
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(child.wait().unwrap().signal(), Some(9));
}

// ---- inside the systemd harness ---------------------------------------------------------------

fn mountinfo_points() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(str::to_string))
        .collect();
    v.sort();
    v
}

fn systemctl(args: &[&str]) -> String {
    let out = Command::new("systemctl").args(args).output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
#[ignore = "needs the real systemd harness (scripts/test.sh)"]
fn root_binds_the_harness_unit_dir_and_teardown_leaves_nothing() {
    require_harness();
    let mounts_before = mountinfo_points();
    let r = NodeRoot::new(RootKind::Harness);
    let unit = format!("nodeward-fixture-{}.service", std::process::id());

    // A unit written beneath the root is the harness's.
    let sleep = r.root.join("opt/nodeward/node/v/bin/sleep");
    std::fs::create_dir_all(sleep.parent().unwrap()).unwrap();
    std::fs::copy("/bin/sleep", &sleep).unwrap();
    std::fs::write(
        r.root.join("etc/systemd/system").join(&unit),
        format!("[Service]\nExecStart={} 600\n", sleep.display()),
    )
    .unwrap();
    assert!(Path::new("/etc/systemd/system").join(&unit).is_file());
    systemctl(&["daemon-reload"]);
    let out = Command::new("systemctl")
        .args(["start", &unit])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let states = r.unit_states();
    assert_eq!(
        states[&unit],
        ("active".into(), "running".into()),
        "{states:?}"
    );
    assert_eq!(
        states["nodeward-kubelet.service"],
        ("inactive".into(), "dead".into())
    );
    assert!(r.tree().contains_key(&format!("etc/systemd/system/{unit}")));
    assert!(
        !r.tree().keys().any(|k| k.contains("test-harness.target")),
        "the harness's own units are not part of the tree"
    );

    let left = r.leftovers();
    assert!(
        left.iter().any(|l| l == &format!("unit loaded: {unit}")),
        "{left:?}"
    );
    assert!(left.iter().any(|l| l.starts_with("process ")), "{left:?}");

    // The teardown stops it, removes its file and checks.
    let dir = r.dir.clone();
    let before = r.teardown();
    assert!(!before.is_empty());
    assert!(!Path::new("/etc/systemd/system").join(&unit).exists());
    assert_eq!(
        systemctl(&["list-units", "--all", "--plain", "--no-legend", &unit]),
        ""
    );
    assert_eq!(mountinfo_points(), mounts_before);
    assert!(!dir.exists());
}

#[test]
#[ignore = "needs the real systemd harness (scripts/test.sh)"]
fn real_kubelet_root_binds_the_kubelet_paths_and_undoes_them() {
    require_harness();
    let mounts_before = mountinfo_points();
    let existed: Vec<bool> = KUBELET_HOST_PATHS
        .iter()
        .map(|p| Path::new(p).exists())
        .collect();
    let r = NodeRoot::new(RootKind::HarnessRealKubelet);
    let now = mountinfo_points();
    for p in KUBELET_HOST_PATHS {
        assert!(now.iter().any(|m| m == p), "{p} is not bound");
        std::fs::write(Path::new(p).join("probe"), p).unwrap();
        let scratch = r
            .dir
            .join("scratch")
            .join(p.replace('/', "_"))
            .join("probe");
        assert_eq!(std::fs::read_to_string(scratch).unwrap(), *p);
    }
    assert!(now.contains(&r.root.join("etc/systemd/system").display().to_string()));
    assert!(r.teardown().is_empty());
    assert_eq!(mountinfo_points(), mounts_before);
    for (p, e) in KUBELET_HOST_PATHS.iter().zip(existed) {
        assert_eq!(Path::new(p).exists(), e, "{p}");
        assert!(!Path::new(p).join("probe").exists());
    }
}

/// Unpacks a tar.gz into `dest`, dropping `strip` leading components (as nodeward places an
/// artifact; here only to run what the fixture serves).
fn unpack(tgz: &[u8], dest: &Path, strip: usize) {
    let mut a = tar::Archive::new(flate2::read::GzDecoder::new(tgz));
    for e in a.entries().unwrap() {
        let mut e = e.unwrap();
        let rel: std::path::PathBuf = e
            .path()
            .unwrap()
            .components()
            .filter(|c| matches!(c, std::path::Component::Normal(_)))
            .skip(strip)
            .collect();
        if rel.as_os_str().is_empty() || e.header().entry_type().is_dir() {
            continue;
        }
        std::fs::create_dir_all(dest.join(&rel).parent().unwrap()).unwrap();
        e.unpack(dest.join(&rel)).unwrap();
    }
}

#[test]
#[ignore = "needs the real systemd harness (scripts/test.sh)"]
fn served_containerd_runs_under_the_root_and_imports_an_image() {
    require_harness();
    let mounts_before = mountinfo_points();
    let r = NodeRoot::new(RootKind::Harness);
    let server = ArtifactServer::start_temp();
    let served = serve_artifacts(&server, &stub_kubelet());

    // Download as nodeward would: over HTTP, digest checked, unpacked with strip 1 into bin/.
    let body = client(None)
        .get(&served.containerd.url)
        .send()
        .unwrap()
        .bytes()
        .unwrap();
    assert_eq!(sha(&body), served.containerd.sha256);
    let version = r.root.join("opt/nodeward/node/fixture");
    unpack(&body, &version.join("bin"), 1);
    std::os::unix::fs::symlink("fixture", r.root.join("opt/nodeward/node/current")).unwrap();
    for b in ["containerd", "containerd-shim-runc-v2", "ctr"] {
        assert!(version.join("bin").join(b).is_file(), "{b}");
    }

    // A containerd confined to the root, as the unit nodeward writes.
    let cfg = r.root.join("etc/containerd/config.toml");
    std::fs::create_dir_all(cfg.parent().unwrap()).unwrap();
    let root = r.root.display();
    std::fs::write(
        &cfg,
        format!(
            "version = 2\nroot = \"{root}/var/lib/containerd\"\nstate = \"{root}/run/containerd\"\n\
             disabled_plugins = [\"io.containerd.grpc.v1.cri\", \"io.containerd.snapshotter.v1.devmapper\", \
             \"io.containerd.snapshotter.v1.zfs\", \"io.containerd.snapshotter.v1.btrfs\", \
             \"io.containerd.snapshotter.v1.aufs\"]\n\
             [grpc]\n  address = \"{root}/run/containerd/containerd.sock\"\n\
             [plugins.\"io.containerd.internal.v1.opt\"]\n  path = \"{root}/opt/containerd\"\n"
        ),
    )
    .unwrap();
    std::fs::write(
        r.root
            .join("etc/systemd/system/nodeward-containerd.service"),
        format!(
            "[Service]\nType=notify\nDelegate=yes\nExecStart={}/bin/containerd --config {}\n",
            r.root.join("opt/nodeward/node/current").display(),
            cfg.display()
        ),
    )
    .unwrap();
    systemctl(&["daemon-reload"]);
    let t = Instant::now();
    let out = Command::new("systemctl")
        .args(["start", "nodeward-containerd.service"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let image = r.dir.join("fixture-image.tar");
    docker_archive(&image, "localhost/nodeward-fixture:test", b"hello\n");
    import_images(&r.root, &[&image]);
    eprintln!(
        "containerd up and image imported in {} ms",
        t.elapsed().as_millis()
    );
    let images = Command::new(version.join("bin/ctr"))
        .arg("--address")
        .arg(containerd_socket(&r.root))
        .args(["-n", "k8s.io", "images", "ls", "-q"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&images.stdout).contains("localhost/nodeward-fixture:test"),
        "{}",
        String::from_utf8_lossy(&images.stderr)
    );
    assert_eq!(
        r.unit_states()["nodeward-containerd.service"],
        ("active".into(), "running".into())
    );
    let tree = r.tree();
    assert!(tree.contains_key("etc/containerd/config.toml"));
    assert!(tree.contains_key("opt/nodeward/node/fixture/bin/ctr"));
    assert!(
        !tree
            .keys()
            .any(|k| k.starts_with("run/") || k.starts_with("var/lib/containerd"))
    );

    let before = r.teardown();
    assert!(
        before
            .iter()
            .any(|l| l == "unit loaded: nodeward-containerd.service"),
        "{before:?}"
    );
    assert_eq!(mountinfo_points(), mounts_before);
}

#[test]
#[ignore = "needs the real systemd harness (scripts/test.sh)"]
fn stub_kubelet_runs_as_the_node_unit_against_the_stub_api_server() {
    require_harness();
    let r = NodeRoot::new(RootKind::Harness);
    let api = StubApiServer::start();
    let opts = NodeOptions::new(&r.root, "stub-node");
    api.set_node("stub-node", opts.stub_node("1.20.2"));

    // The files nodeward would write, reduced to what the stub reads.
    let kdir = r.root.join("var/lib/kubelet");
    std::fs::create_dir_all(&kdir).unwrap();
    let ca = r.root.join("etc/kubernetes/pki/ca.crt");
    std::fs::create_dir_all(ca.parent().unwrap()).unwrap();
    std::fs::write(&ca, api.ca_pem()).unwrap();
    let boot = r.root.join("etc/kubernetes/bootstrap-kubelet.conf");
    std::fs::write(
        &boot,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {}\n    \
             certificate-authority: {}\ncontexts:\n- name: x\n  context:\n    cluster: c\n    \
             user: u\ncurrent-context: x\nusers:\n- name: u\n  user:\n    token: {STUB_TOKEN}\n",
            api.url(),
            ca.display()
        ),
    )
    .unwrap();
    std::fs::write(
        kdir.join("config.yaml"),
        format!(
            "kind: KubeletConfiguration\nhealthzPort: {}\nhealthzBindAddress: 127.0.0.1\n",
            opts.healthz_port
        ),
    )
    .unwrap();
    let bin = r.root.join("opt/nodeward/node/v/bin/kubelet");
    std::fs::create_dir_all(bin.parent().unwrap()).unwrap();
    std::fs::copy(stub_kubelet(), &bin).unwrap();
    std::fs::write(
        r.root.join("etc/systemd/system/nodeward-kubelet.service"),
        format!(
            "[Service]\nExecStart={} --bootstrap-kubeconfig={} --kubeconfig={}/kubeconfig \
             --config={}/config.yaml --node-ip={} --container-runtime=remote\n",
            bin.display(),
            boot.display(),
            kdir.display(),
            kdir.display(),
            opts.node_ip
        ),
    )
    .unwrap();
    systemctl(&["daemon-reload"]);
    let t = Instant::now();
    let out = Command::new("systemctl")
        .args(["start", "nodeward-kubelet.service"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let healthz = format!("http://127.0.0.1:{}/healthz", opts.healthz_port);
    cluster::wait_for("stub healthz", Duration::from_secs(10), || {
        client(None)
            .get(&healthz)
            .send()
            .ok()
            .filter(|r| r.status().is_success())
    });
    eprintln!(
        "stub kubelet unit healthy in {} ms",
        t.elapsed().as_millis()
    );
    let kc = std::fs::read_to_string(kdir.join("kubeconfig")).unwrap();
    assert!(
        kc.contains("token: stub-kubelet") && kc.contains(&api.url()),
        "{kc}"
    );

    // What the host's Node Ready check would do with that kubeconfig.
    let node = client(Some(&api.ca_pem()))
        .get(format!("{}/api/v1/nodes/stub-node", api.url()))
        .bearer_auth("stub-kubelet")
        .send()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&node.bytes().unwrap()).unwrap();
    assert_eq!(v["metadata"]["labels"][TEST_LABEL.0], TEST_LABEL.1);
    assert_eq!(v["spec"]["taints"][0]["key"], TEST_TAINT.0);

    // systemd's stop (SIGTERM) leaves the unit inactive, not failed.
    systemctl(&["stop", "nodeward-kubelet.service"]);
    assert_eq!(
        r.unit_states()["nodeward-kubelet.service"],
        ("inactive".into(), "dead".into())
    );
    assert!(r.teardown().iter().all(|l| !l.starts_with("process")));
}
