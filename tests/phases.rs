//! One test per shipped phase (the build's `foreach_phase!` fails this file's compilation when
//! a phase has no test), each running the real component against a temporary root and checking
//! what it wrote.

mod common;

use common::*;
use nodeward::bundle::Bundle;
use nodeward::caps::RunContext;
use nodeward::plan::RunMode;
use nodeward::runtime::Limits;
use nodeward::session;
use nodeward_node_config::input::{Artifact, ArtifactKind, PhaseInput};
use serde_json::{Value, json};
use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;

macro_rules! assert_test_exists {
    ($name:ident) => {
        #[allow(unused_imports)]
        use self::$name as _;
    };
}
nodeward::foreach_phase!(assert_test_exists);

fn apply(f: &Fixture, phases: &[&str]) -> std::sync::Arc<nodeward::caps::RunContext> {
    let bundle = Bundle::embedded().expect("bundle");
    let config = nodeward::config::load(None).expect("config");
    let s = f.session(RunMode::Apply);
    let only: Vec<String> = phases.iter().map(|p| p.to_string()).collect();
    session::run(
        runtime(),
        &bundle,
        &s,
        &PhaseInput::new(config),
        &only,
        Limits::default(),
        |_| {},
    )
    .expect("phases run");
    s
}

fn read(f: &Fixture, rel: &str) -> String {
    std::fs::read_to_string(f.root.join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

const VERSION: &str = "1.34.1-0123456789ab";

/// An input as the none-mode pipelines build it: the example config, this fixture's root as
/// the layout root, a version directory name.
fn input(f: &Fixture) -> PhaseInput {
    let mut input = PhaseInput::new(nodeward::config::load(None).expect("config"));
    input.layout.root = f.root.display().to_string();
    input.version = VERSION.into();
    input.arch = "amd64".into();
    input
}

/// The config of a test input, to change.
fn cfg(input: &mut PhaseInput) -> &mut nodeward_node_config::NodeConfig {
    input
        .config
        .as_mut()
        .expect("a test input carries the config")
}

/// Runs one phase of the embedded bundle (its real grants) in `s`.
fn phase(
    s: &Arc<RunContext>,
    name: &str,
    input: &PhaseInput,
) -> Result<session::PhaseOutcome, session::RunError> {
    let bundle = Bundle::embedded().expect("bundle");
    session::run_phase(runtime(), &bundle, s, name, input, Limits::default())
}

/// Runs the `name` component with `grants` instead of the bundle's (its input still the parts
/// the bundle grants it, secrets as references, and no pinned artifacts).
fn phase_with_grants(
    s: &Arc<RunContext>,
    name: &str,
    grants: nodeward::grants::Grants,
    input: &PhaseInput,
) -> Result<nodeward::runtime::PhaseReport, nodeward::runtime::PhaseError> {
    let bundle = Bundle::embedded().expect("bundle");
    let p = bundle.phase(name).expect("phase in bundle");
    let loaded = runtime()
        .load(
            name,
            &p.world,
            bundle.component(name).expect("component"),
            &p.sha256,
        )
        .expect("load");
    runtime().run(
        &loaded,
        ctx(s, name, grants),
        &serde_json::to_string(&input.restricted_to(&p.grants.input)).expect("input json"),
        Limits::default(),
    )
}

/// The embedded bundle's grants of `name`.
fn bundle_grants(name: &str) -> nodeward::grants::Grants {
    Bundle::embedded()
        .expect("bundle")
        .phase(name)
        .expect("phase")
        .grants
        .clone()
}

fn changes_json(s: &RunContext) -> Vec<Value> {
    s.changes()
        .iter()
        .map(|c| serde_json::to_value(c).expect("change json"))
        .collect()
}

fn no_denials(s: &RunContext, what: &str) {
    let denied: Vec<_> = s.audit.records().into_iter().filter(|r| r.denied).collect();
    assert!(
        denied.is_empty(),
        "{what} stays within its grants: {denied:?}"
    );
}

/// A version directory as download-artifacts leaves it, with stand-in binaries.
fn put_version(f: &Fixture, version: &str, complete: bool) {
    let vdir = format!("opt/nodeward/node/{version}");
    for bin in ["containerd", "kubelet", "runc", "containerd-shim-runc-v2"] {
        f.put(&format!("{vdir}/bin/{bin}"), "#!/bin/sh\n");
    }
    f.put(&format!("{vdir}/libexec/cni/bridge"), "#!/bin/sh\n");
    if complete {
        f.put(&format!("{vdir}/.complete"), &format!("{version}\n"));
    }
}

mod preflight {
    use super::*;

    #[test]
    fn passes_on_a_fresh_root_and_changes_nothing() {
        let f = Fixture::new();
        let before = snapshot(&f.root);
        let s = f.session(RunMode::Apply);
        let out = phase(&s, "preflight", &input(&f)).expect("preflight passes");
        assert!(out.report.changed.is_empty(), "{:?}", out.report);
        assert_eq!(snapshot(&f.root), before);
        assert!(s.changes().is_empty());
        no_denials(&s, "preflight");
        let calls: Vec<_> = s.audit.records().into_iter().map(|r| r.call).collect();
        assert!(calls.contains(&"systemd.status".to_string()), "{calls:?}");
    }

    #[test]
    fn refuses_a_foreign_cni_directory_but_not_our_link_or_an_empty_one() {
        let f = Fixture::new();
        f.put("opt/cni/bin/bridge", "foreign plugin");
        let s = f.session(RunMode::Plan);
        let err = phase(&s, "preflight", &input(&f)).expect_err("foreign plugins");
        assert!(
            err.to_string()
                .contains("opt/cni/bin is a directory nodeward did not create"),
            "{err}"
        );
        assert!(err.to_string().contains("bridge"), "{err}");

        std::fs::remove_file(f.root.join("opt/cni/bin/bridge")).expect("rm");
        phase(&s, "preflight", &input(&f)).expect("an empty directory is fine");
        std::fs::remove_dir(f.root.join("opt/cni/bin")).expect("rmdir");
        std::os::unix::fs::symlink(
            nodeward_node_config::layout::CNI_BIN_LINK_TARGET,
            f.root.join("opt/cni/bin"),
        )
        .expect("link");
        phase(&s, "preflight", &input(&f)).expect("our link is fine");
    }

    #[test]
    fn needs_its_grants() {
        let f = Fixture::new();
        let s = f.session(RunMode::Plan);
        let mut g = bundle_grants("preflight");
        assert_eq!(
            g.systemd.status,
            ["kubelet.service", "containerd.service"],
            "exactly the foreign units"
        );
        g.fs.read.clear();
        let err = phase_with_grants(&s, "preflight", g, &input(&f)).expect_err("no fs grant");
        assert!(err.to_string().contains("denied"), "{err}");
        let err = phase_with_grants(&s, "preflight", Default::default(), &input(&f))
            .expect_err("no grants");
        assert!(
            err.to_string().contains("denied") && err.to_string().contains("kubelet.service"),
            "{err}"
        );
    }
}

#[test]
fn setup_host() {
    let f = Fixture::new();
    f.put(
        "proc/swaps",
        "Filename\tType\tSize\tUsed\tPriority\n/swapfile file 1024 0 -2\n",
    );
    let s = apply(&f, &["setup-host"]);
    for dir in [
        "etc/containerd",
        "etc/cni/net.d",
        "opt/cni",
        "etc/kubernetes/pki",
        "etc/kubernetes/manifests",
        "var/lib/kubelet",
        "opt/nodeward/node",
        "var/lib/nodeward/node",
        "var/lib/cni",
    ] {
        assert!(f.root.join(dir).is_dir(), "{dir}");
    }
    assert!(
        std::fs::symlink_metadata(f.root.join("opt/cni/bin")).is_err(),
        "opt/cni/bin is install's link, not a directory"
    );
    assert!(!f.root.join("etc/systemd/system/kubelet.service.d").exists());
    let sysctl = read(&f, "etc/sysctl.d/99-nodeward.conf");
    assert!(
        sysctl.contains("net.ipv4.ip_forward = 1")
            && sysctl.contains("net.bridge.bridge-nf-call-iptables = 1")
    );
    assert_eq!(
        read(&f, "etc/modules-load.d/nodeward.conf")
            .lines()
            .filter(|l| !l.starts_with('#'))
            .collect::<Vec<_>>(),
        ["overlay", "br_netfilter"]
    );
    assert_eq!(read(&f, "proc/sys/net/ipv4/ip_forward"), "1\n");
    assert!(read(&f, "proc/modules").starts_with("overlay "));
    assert_eq!(read(&f, "proc/swaps").lines().count(), 1, "swap turned off");
    let calls: Vec<String> = s.audit.records().iter().map(|r| r.call.clone()).collect();
    assert!(
        calls.contains(&"kernel.swap-off".to_string())
            && calls.contains(&"kernel.load-module".to_string())
    );
    no_denials(&s, "setup-host");
}

mod configure {
    use super::*;

    fn yaml(f: &Fixture, rel: &str) -> Value {
        serde_yaml_ng::from_str(&read(f, rel)).unwrap_or_else(|e| panic!("{rel} is YAML: {e}"))
    }

    fn toml_of(f: &Fixture, rel: &str) -> toml::Table {
        read(f, rel)
            .parse()
            .unwrap_or_else(|e| panic!("{rel} is TOML: {e}"))
    }

    /// The words of `KUBELET_ARGS="..."`, unescaped as systemd's env-file parser does.
    fn kubelet_args(f: &Fixture) -> Vec<String> {
        let text = read(f, "var/lib/kubelet/nodeward-flags.env");
        let line = text
            .lines()
            .find(|l| l.starts_with("KUBELET_ARGS="))
            .unwrap_or_else(|| panic!("no KUBELET_ARGS line: {text}"));
        let quoted = &line["KUBELET_ARGS=".len()..];
        assert!(quoted.starts_with('"') && quoted.ends_with('"'), "{line}");
        let mut value = String::new();
        let mut chars = quoted[1..quoted.len() - 1].chars();
        while let Some(c) = chars.next() {
            if c == '\\' {
                value.push(chars.next().expect("escaped char"));
            } else {
                assert_ne!(c, '"', "unescaped quote in {line}");
                value.push(c);
            }
        }
        value.split_whitespace().map(String::from).collect()
    }

    fn configured(f: &Fixture, input: &PhaseInput) -> (Arc<RunContext>, session::PhaseOutcome) {
        let s = f.session(RunMode::Apply);
        phase(&s, "setup-host", input).expect("setup-host");
        let out = phase(&s, "configure", input).expect("configure");
        no_denials(&s, "configure");
        (s, out)
    }

    #[test]
    fn renders_containerd_2_and_kubelet_1_34_with_root_prefixed_paths() {
        let f = Fixture::new();
        let input = input(&f);
        let root = f.root.display().to_string();
        let (s, out) = configured(&f, &input);
        assert_eq!(
            out.report.changed,
            ["containerd-config", "kubelet-config", "cni-config"]
        );

        let c = toml_of(&f, "etc/containerd/config.toml");
        assert_eq!(c["version"].as_integer(), Some(3));
        assert_eq!(
            c["root"].as_str(),
            Some(format!("{root}/var/lib/containerd").as_str())
        );
        assert_eq!(
            c["state"].as_str(),
            Some(format!("{root}/run/containerd").as_str())
        );
        assert_eq!(
            c["grpc"]["address"].as_str(),
            Some(format!("{root}/run/containerd/containerd.sock").as_str())
        );
        let rt = &c["plugins"]["io.containerd.cri.v1.runtime"];
        assert_eq!(
            rt["cni"]["bin_dirs"][0].as_str(),
            Some(format!("{root}/opt/cni/bin").as_str())
        );
        assert_eq!(
            rt["cni"]["conf_dir"].as_str(),
            Some(format!("{root}/etc/cni/net.d").as_str())
        );
        assert_eq!(
            rt["containerd"]["runtimes"]["runc"]["options"]["SystemdCgroup"].as_bool(),
            Some(true)
        );
        assert_eq!(
            c["plugins"]["io.containerd.cri.v1.images"]["pinned_images"]["sandbox"].as_str(),
            Some("registry.k8s.io/pause:3.10")
        );
        assert!(read(&f, "etc/containerd/config.toml").starts_with("# managed by nodeward"));

        let k = yaml(&f, "var/lib/kubelet/config.yaml");
        assert_eq!(k["kind"], "KubeletConfiguration");
        assert_eq!(k["cgroupDriver"], "systemd");
        assert_eq!(k["clusterDNS"][0], "10.96.0.10");
        assert_eq!(
            k["staticPodPath"],
            format!("{root}/etc/kubernetes/manifests")
        );
        assert_eq!(
            k["authentication"]["x509"]["clientCAFile"],
            format!("{root}/etc/kubernetes/pki/ca.crt")
        );
        assert_eq!(
            k["containerRuntimeEndpoint"],
            format!("unix://{root}/run/containerd/containerd.sock"),
            "1.27+: the endpoint is a config field"
        );

        let args = kubelet_args(&f);
        for want in [
            format!("--config={root}/var/lib/kubelet/config.yaml"),
            format!("--bootstrap-kubeconfig={root}/etc/kubernetes/bootstrap-kubelet.conf"),
            format!("--kubeconfig={root}/var/lib/kubelet/kubeconfig"),
            format!("--root-dir={root}/var/lib/kubelet"),
            format!("--cert-dir={root}/var/lib/kubelet/pki"),
            "--hostname-override=worker-01".to_string(),
            "--node-labels=topology.kubernetes.io/zone=edge-1".to_string(),
        ] {
            assert!(args.contains(&want), "{want} missing from {args:?}");
        }
        assert!(
            !args.iter().any(|a| a.starts_with("--container-runtime")),
            "1.34 takes neither runtime flag: {args:?}"
        );
        assert!(!args.iter().any(|a| a.starts_with("--register-with-taints")));
        let mode = |rel: &str| {
            std::fs::metadata(f.root.join(rel))
                .expect("meta")
                .permissions()
                .mode()
                & 0o777
        };
        assert_eq!(mode("var/lib/kubelet/nodeward-flags.env"), 0o644);

        let cni: Value =
            serde_json::from_str(&read(&f, "etc/cni/net.d/10-nodeward-bridge.conflist"))
                .expect("CNI JSON");
        assert_eq!(cni["cniVersion"], "0.4.0");
        let bridge = &cni["plugins"][0];
        assert_eq!(bridge["bridge"], "cni0");
        assert_eq!(bridge["ipMasq"], true);
        assert_eq!(bridge["ipam"]["ranges"][0][0]["subnet"], "10.244.0.0/24");
        assert_eq!(
            bridge["ipam"]["dataDir"],
            format!("{root}/var/lib/cni/networks")
        );
        assert_eq!(cni["plugins"][1]["type"], "portmap");

        let kc = yaml(&f, "etc/kubernetes/bootstrap-kubelet.conf");
        assert_eq!(
            kc["clusters"][0]["cluster"]["server"],
            "https://10.0.0.1:6443"
        );
        assert_eq!(
            kc["clusters"][0]["cluster"]["certificate-authority"],
            format!("{root}/etc/kubernetes/pki/ca.crt")
        );
        assert_eq!(kc["users"][0]["user"]["token"], TOKEN);
        assert_eq!(mode("etc/kubernetes/bootstrap-kubelet.conf"), 0o600);
        assert!(read(&f, "etc/kubernetes/pki/ca.crt").starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(!f.root.join("etc/systemd/system/kubelet.service.d").exists());

        let again = phase(&s, "configure", &input).expect("configure again");
        assert!(again.report.changed.is_empty(), "{:?}", again.report);
    }

    #[test]
    fn renders_containerd_1_and_kubelet_1_20_flags() {
        let f = Fixture::new();
        let mut input = input(&f);
        cfg(&mut input).components.containerd = "1.6.20".into();
        cfg(&mut input).cluster.kubernetes_version = "1.20.2".into();
        let root = f.root.display().to_string();
        configured(&f, &input);

        let c = toml_of(&f, "etc/containerd/config.toml");
        assert_eq!(c["version"].as_integer(), Some(2));
        let cri = &c["plugins"]["io.containerd.grpc.v1.cri"];
        assert_eq!(
            cri["sandbox_image"].as_str(),
            Some("registry.k8s.io/pause:3.10")
        );
        assert_eq!(
            cri["cni"]["bin_dir"].as_str(),
            Some(format!("{root}/opt/cni/bin").as_str())
        );
        assert_eq!(
            cri["containerd"]["runtimes"]["runc"]["runtime_type"].as_str(),
            Some("io.containerd.runc.v2")
        );
        assert_eq!(
            cri["containerd"]["runtimes"]["runc"]["options"]["SystemdCgroup"].as_bool(),
            Some(true)
        );
        assert_eq!(
            c["grpc"]["address"].as_str(),
            Some(format!("{root}/run/containerd/containerd.sock").as_str())
        );
        assert!(c["plugins"].get("io.containerd.cri.v1.runtime").is_none());

        let args = kubelet_args(&f);
        assert!(
            args.contains(&"--container-runtime=remote".to_string()),
            "{args:?}"
        );
        assert!(
            args.contains(&format!(
                "--container-runtime-endpoint=unix://{root}/run/containerd/containerd.sock"
            )),
            "{args:?}"
        );
        let k = yaml(&f, "var/lib/kubelet/config.yaml");
        assert!(k.get("containerRuntimeEndpoint").is_none(), "{k}");
    }

    #[test]
    fn version_boundaries_of_the_runtime_flags() {
        for (version, remote, endpoint_flag) in [
            ("1.23.9", true, true),
            ("1.24.0", false, true),
            ("1.26.3", false, true),
            ("1.27.0", false, false),
        ] {
            let f = Fixture::new();
            let mut input = input(&f);
            cfg(&mut input).cluster.kubernetes_version = version.into();
            configured(&f, &input);
            let args = kubelet_args(&f);
            assert_eq!(
                args.contains(&"--container-runtime=remote".to_string()),
                remote,
                "{version}: {args:?}"
            );
            assert_eq!(
                args.iter()
                    .any(|a| a.starts_with("--container-runtime-endpoint=")),
                endpoint_flag,
                "{version}: {args:?}"
            );
            let k = yaml(&f, "var/lib/kubelet/config.yaml");
            assert_eq!(k.get("containerRuntimeEndpoint").is_some(), !endpoint_flag);
        }
    }

    #[test]
    fn merges_patches_and_appends_flags() {
        let f = Fixture::new();
        let mut input = input(&f);
        let patch = |v: Value| v.as_object().expect("object").clone().into_iter().collect();
        cfg(&mut input).kubelet.config = patch(json!({
            "healthzPort": 10299,
            "authentication": { "webhook": { "cacheTTL": "1m0s" } },
            "evictionHard": { "memory.available": "200Mi" },
        }));
        cfg(&mut input).containerd.config = patch(json!({
            "plugins": { "io.containerd.cri.v1.runtime": {
                "enable_selinux": true,
                "cni": { "conf_dir": "/etc/other/net.d" },
            } },
        }));
        cfg(&mut input).kubelet.flags = vec!["--v=2".into(), "--node-ip=10.0.0.7".into()];
        cfg(&mut input).kubelet.register_with_taints = vec![nodeward_node_config::Taint {
            key: "dedicated".into(),
            value: "edge".into(),
            effect: "NoSchedule".into(),
        }];
        configured(&f, &input);

        let k = yaml(&f, "var/lib/kubelet/config.yaml");
        assert_eq!(k["healthzPort"], 10299);
        assert_eq!(k["authentication"]["webhook"]["cacheTTL"], "1m0s");
        assert_eq!(
            k["authentication"]["webhook"]["enabled"], true,
            "merged, not replaced"
        );
        assert_eq!(k["authentication"]["anonymous"]["enabled"], false);
        assert_eq!(k["evictionHard"]["memory.available"], "200Mi");

        let c = toml_of(&f, "etc/containerd/config.toml");
        let rt = &c["plugins"]["io.containerd.cri.v1.runtime"];
        assert_eq!(rt["enable_selinux"].as_bool(), Some(true));
        assert_eq!(rt["cni"]["conf_dir"].as_str(), Some("/etc/other/net.d"));
        assert!(rt["cni"]["bin_dirs"].as_array().is_some(), "siblings kept");

        let args = kubelet_args(&f);
        assert_eq!(
            &args[args.len() - 2..],
            ["--v=2", "--node-ip=10.0.0.7"],
            "flags last"
        );
        assert!(args.contains(&"--register-with-taints=dedicated=edge:NoSchedule".to_string()));
    }

    #[test]
    fn refuses_what_it_cannot_render() {
        let f = Fixture::new();
        let s = f.session(RunMode::Plan);
        phase(&s, "setup-host", &input(&f)).expect("setup-host");
        let mut bad = input(&f);
        cfg(&mut bad).kubelet.flags = vec!["--node-labels=a b".into()];
        let err = phase(&s, "configure", &bad).expect_err("whitespace");
        assert!(err.to_string().contains("kubelet.flags[0]"), "{err}");
        let mut bad = input(&f);
        cfg(&mut bad).components.containerd = "3.0.0".into();
        let err = phase(&s, "configure", &bad).expect_err("containerd 3");
        assert!(err.to_string().contains("components.containerd"), "{err}");
        let mut bad = input(&f);
        cfg(&mut bad).containerd.config = json!({"root": null})
            .as_object()
            .expect("object")
            .clone()
            .into_iter()
            .collect();
        let err = phase(&s, "configure", &bad).expect_err("null");
        assert!(err.to_string().contains("containerd.config"), "{err}");
    }
}

#[test]
fn configure_alone_on_a_bare_root_fails_naming_the_missing_directory() {
    let f = Fixture::new();
    let bundle = Bundle::embedded().expect("bundle");
    let config = nodeward::config::load(None).expect("config");
    let s = f.session(RunMode::Apply);
    let err = session::run(
        runtime(),
        &bundle,
        &s,
        &PhaseInput::new(config),
        &["configure".into()],
        Limits::default(),
        |_| {},
    )
    .expect_err("parents are missing");
    let msg = err.to_string();
    assert!(
        msg.contains("phase configure failed") && msg.contains("setup-host"),
        "{msg}"
    );
}

/// A minimal HTTP/1.1 server on 127.0.0.1 serving fixed bodies by path (404 otherwise), one
/// request per connection, counting requests.
struct FileServer {
    port: u16,
    hits: Arc<std::sync::atomic::AtomicUsize>,
}

impl FileServer {
    fn start(files: Vec<(&'static str, Vec<u8>)>) -> FileServer {
        use std::io::{BufRead, BufReader, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let hits = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = hits.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let mut reader = BufReader::new(conn.try_clone().expect("clone"));
                let mut line = String::new();
                let _ = reader.read_line(&mut line);
                let path = line.split_whitespace().nth(1).unwrap_or("/").to_string();
                loop {
                    let mut h = String::new();
                    match reader.read_line(&mut h) {
                        Ok(0) | Err(_) => break,
                        Ok(_) if h == "\r\n" || h == "\n" => break,
                        Ok(_) => {}
                    }
                }
                let (status, body) = match files.iter().find(|(p, _)| *p == path) {
                    Some((_, b)) => ("200 OK", b.clone()),
                    None => ("404 Not Found", b"not found\n".to_vec()),
                };
                let mut out = conn;
                let _ = write!(
                    out,
                    "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = out.write_all(&body);
                let _ = out.shutdown(std::net::Shutdown::Both);
            }
        });
        FileServer { port, hits }
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }
}

fn sha(bytes: &[u8]) -> String {
    nodeward::bundle::sha256_hex(bytes)
}

/// A tar.gz with `top/<name>` entries (mode 0755).
fn tarball(top: &str, files: &[(&str, &[u8])]) -> Vec<u8> {
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    let mut b = tar::Builder::new(gz);
    for (name, body) in files {
        let mut h = tar::Header::new_gnu();
        h.set_size(body.len() as u64);
        h.set_mode(0o755);
        h.set_cksum();
        b.append_data(&mut h, format!("{top}{name}"), *body)
            .expect("append");
    }
    b.into_inner().expect("tar").finish().expect("gz")
}

mod download_artifacts {
    use super::*;

    fn artifacts(server: &FileServer, kubelet: &[u8], tgz: &[u8]) -> Vec<Artifact> {
        vec![
            Artifact {
                name: "kubelet".into(),
                url: server.url("/kubelet"),
                sha256: Some(sha(kubelet)),
                kind: ArtifactKind::Binary {
                    dest: "bin/kubelet".into(),
                },
            },
            Artifact {
                name: "containerd".into(),
                url: server.url("/containerd.tar.gz"),
                sha256: Some(sha(tgz)),
                kind: ArtifactKind::Tarball {
                    dest: "bin".into(),
                    strip: 1,
                },
            },
        ]
    }

    #[test]
    fn fetches_verifies_marks_complete_and_then_short_circuits() {
        let f = Fixture::new();
        let kubelet = b"#!/bin/sh\necho kubelet\n".to_vec();
        let tgz = tarball(
            "bin/",
            &[
                ("containerd", b"containerd"),
                ("containerd-shim-runc-v2", b"shim"),
            ],
        );
        let server = FileServer::start(vec![
            ("/kubelet", kubelet.clone()),
            ("/containerd.tar.gz", tgz.clone()),
        ]);
        let mut input = input(&f);
        input.artifacts = artifacts(&server, &kubelet, &tgz);
        let s = f.session(RunMode::Apply);
        phase(&s, "setup-host", &input).expect("setup-host");
        let out = phase(&s, "download-artifacts", &input).expect("download");
        assert_eq!(out.report.changed, ["artifacts"]);
        no_denials(&s, "download-artifacts");
        let vdir = format!("opt/nodeward/node/{VERSION}");
        assert_eq!(read(&f, &format!("{vdir}/bin/kubelet")).as_bytes(), kubelet);
        let mode = std::fs::metadata(f.root.join(format!("{vdir}/bin/kubelet")))
            .expect("kubelet")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o755);
        assert_eq!(read(&f, &format!("{vdir}/bin/containerd")), "containerd");
        assert_eq!(
            read(&f, &format!("{vdir}/bin/containerd-shim-runc-v2")),
            "shim"
        );
        assert!(f.root.join(format!("{vdir}/libexec/cni")).is_dir());
        assert_eq!(
            read(&f, &format!("{vdir}/.complete")),
            format!("{VERSION}\n")
        );
        assert!(
            std::fs::symlink_metadata(f.root.join("opt/nodeward/node/current")).is_err(),
            "the link is install's"
        );

        let hits = server.hits.load(std::sync::atomic::Ordering::SeqCst);
        let before = snapshot(&f.root);
        let again = phase(&s, "download-artifacts", &input).expect("again");
        assert!(
            again.report.summary.contains("already installed"),
            "{:?}",
            again.report
        );
        assert!(again.report.changed.is_empty());
        assert_eq!(snapshot(&f.root), before);
        assert_eq!(server.hits.load(std::sync::atomic::Ordering::SeqCst), hits);
    }

    #[test]
    fn a_wrong_digest_names_the_artifact_and_leaves_no_marker() {
        let f = Fixture::new();
        let server = FileServer::start(vec![("/kubelet", b"evil".to_vec())]);
        let mut input = input(&f);
        input.artifacts = artifacts(&server, b"good", b"unused");
        input.artifacts.truncate(1);
        let s = f.session(RunMode::Apply);
        phase(&s, "setup-host", &input).expect("setup-host");
        let err = phase(&s, "download-artifacts", &input).expect_err("hash mismatch");
        let msg = err.to_string();
        assert!(
            msg.contains(&format!(
                "downloading kubelet from {}",
                server.url("/kubelet")
            )),
            "{msg}"
        );
        let vdir = f.root.join(format!("opt/nodeward/node/{VERSION}"));
        assert!(!vdir.join(".complete").exists());
        assert!(!vdir.join("bin/kubelet").exists());
    }

    #[test]
    fn plan_skips_unpinned_artifacts_and_plans_the_marker() {
        let f = Fixture::new();
        let mut input = input(&f);
        input.artifacts = nodeward_node_config::input::default_artifacts(
            input.config().expect("config"),
            &input.arch,
        );
        assert!(input.artifacts.iter().all(|a| a.sha256.is_none()));
        std::fs::create_dir_all(f.root.join("opt/nodeward/node")).expect("node dir");
        let before = snapshot(&f.root);
        let s = f.session(RunMode::Plan);
        let out = phase(&s, "download-artifacts", &input).expect("plan");
        assert!(
            out.report.summary.contains("plan only: skipped kubelet"),
            "{:?}",
            out.report
        );
        assert_eq!(snapshot(&f.root), before, "plan touches nothing");
        let changes = changes_json(&s);
        // Directories and the marker (so `install` can plan against it), no download.
        assert!(
            changes
                .iter()
                .all(|c| c["kind"] == "dir-create" || c["kind"] == "file-create"),
            "{changes:?}"
        );
        assert!(
            changes
                .iter()
                .any(|c| c["path"].as_str().is_some_and(|p| p.ends_with(".complete")))
        );
    }

    #[test]
    fn refuses_a_bad_version_name_and_urls_not_pinned_for_the_run() {
        let f = Fixture::new();
        let s = f.session(RunMode::Plan);
        let mut bad = input(&f);
        bad.version = "../etc".into();
        let err = phase(&s, "download-artifacts", &bad).expect_err("bad version");
        assert!(err.to_string().contains("input.version"), "{err}");

        let mut input = input(&f);
        input.artifacts = vec![Artifact {
            name: "kubelet".into(),
            url: "http://example.com/kubelet".into(),
            sha256: Some("0".repeat(64)),
            kind: ArtifactKind::Binary {
                dest: "bin/kubelet".into(),
            },
        }];
        std::fs::create_dir_all(f.root.join("opt/nodeward/node")).expect("node dir");
        // The operator's config pinned it, so the host admits exactly it (plain http too:
        // the sha256 pins the bytes).
        phase(&s, "download-artifacts", &input).expect("a pinned artifact is planned");
        assert!(
            changes_json(&s)
                .iter()
                .any(|c| c["kind"] == "download" && c["url"] == "http://example.com/kubelet"),
            "{:?}",
            changes_json(&s)
        );
        // The same request without the host having pinned it for this run is refused.
        let err = phase_with_grants(
            &f.session(RunMode::Plan),
            "download-artifacts",
            bundle_grants("download-artifacts"),
            &input,
        )
        .expect_err("not pinned for this run");
        let msg = err.to_string();
        assert!(
            msg.contains("downloading kubelet from http://example.com/kubelet")
                && msg.contains("denied")
                && msg.contains("download.pinned-artifacts"),
            "{msg}"
        );
    }
}

mod install {
    use super::*;

    fn link(f: &Fixture, rel: &str) -> String {
        std::fs::read_link(f.root.join(rel))
            .unwrap_or_else(|e| panic!("{rel}: {e}"))
            .display()
            .to_string()
    }

    #[test]
    fn switches_links_and_prunes() {
        let f = Fixture::new();
        put_version(&f, "1.33.0-aaaa", true);
        put_version(&f, "1.34.1-bbbb", true);
        std::fs::create_dir_all(f.root.join("opt/cni/bin")).expect("empty dir of an older setup");
        let s = f.session(RunMode::Apply);
        let mut input = input(&f);

        input.version = "1.33.0-aaaa".into();
        let out = phase(&s, "install", &input).expect("install v1");
        assert_eq!(out.report.changed, ["binaries", "cni-link"]);
        assert_eq!(link(&f, "opt/nodeward/node/current"), "1.33.0-aaaa");
        assert_eq!(
            link(&f, "opt/cni/bin"),
            "../nodeward/node/current/libexec/cni"
        );
        assert!(
            f.root.join("opt/cni/bin/bridge").is_file(),
            "the link resolves"
        );
        let again = phase(&s, "install", &input).expect("again");
        assert!(again.report.changed.is_empty(), "{:?}", again.report);

        input.version = "1.34.1-bbbb".into();
        let out = phase(&s, "install", &input).expect("install v2");
        assert_eq!(out.report.changed, ["binaries"]);
        assert_eq!(link(&f, "opt/nodeward/node/current"), "1.34.1-bbbb");
        assert!(
            f.root.join("opt/nodeward/node/1.33.0-aaaa").is_dir(),
            "kept until prune"
        );

        input.prune = true;
        let out = phase(&s, "install", &input).expect("prune");
        assert_eq!(out.report.changed, ["pruned"]);
        let mut left: Vec<String> = std::fs::read_dir(f.root.join("opt/nodeward/node"))
            .expect("node dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["1.34.1-bbbb", "current"]);
        let again = phase(&s, "install", &input).expect("prune again");
        assert!(again.report.changed.is_empty());
        no_denials(&s, "install");
    }

    #[test]
    fn refuses_an_incomplete_version_and_a_foreign_cni_dir() {
        let f = Fixture::new();
        put_version(&f, VERSION, false);
        let s = f.session(RunMode::Apply);
        let err = phase(&s, "install", &input(&f)).expect_err("incomplete");
        assert!(
            err.to_string()
                .contains(&format!("version {VERSION} is not fully downloaded")),
            "{err}"
        );
        assert!(std::fs::symlink_metadata(f.root.join("opt/nodeward/node/current")).is_err());

        f.put(&format!("opt/nodeward/node/{VERSION}/.complete"), "x\n");
        f.put("opt/cni/bin/foreign", "plugin");
        let err = phase(&s, "install", &input(&f)).expect_err("foreign dir");
        assert!(err.to_string().contains("opt/cni/bin"), "{err}");
        assert_eq!(read(&f, "opt/cni/bin/foreign"), "plugin");
    }

    #[test]
    fn plan_mode_touches_nothing() {
        let f = Fixture::new();
        put_version(&f, VERSION, true);
        std::fs::create_dir_all(f.root.join("opt/cni")).expect("opt/cni");
        let before = snapshot(&f.root);
        let s = f.session(RunMode::Plan);
        let out = phase(&s, "install", &input(&f)).expect("plan");
        assert_eq!(out.report.changed, ["binaries", "cni-link"]);
        assert_eq!(snapshot(&f.root), before);
        let kinds: Vec<_> = changes_json(&s).iter().map(|c| c["kind"].clone()).collect();
        assert_eq!(kinds, [json!("symlink"), json!("symlink")]);
    }
}

mod start_node {
    use super::*;

    fn ready(f: &Fixture) {
        put_version(f, VERSION, true);
        std::os::unix::fs::symlink(VERSION, f.root.join("opt/nodeward/node/current"))
            .expect("current");
        std::fs::create_dir_all(f.root.join("etc/systemd/system")).expect("unit dir");
    }

    /// The planned contents of a unit file, from its diff.
    fn planned_unit(changes: &[Value], unit: &str) -> String {
        let path = format!("etc/systemd/system/{unit}");
        let c = changes
            .iter()
            .find(|c| c["kind"] == "file-create" && c["path"] == path.as_str())
            .unwrap_or_else(|| panic!("no file-create of {path}: {changes:?}"));
        c["diff"]
            .as_str()
            .expect("diff")
            .lines()
            .filter(|l| l.starts_with('+') && !l.starts_with("+++"))
            .map(|l| format!("{}\n", &l[1..]))
            .collect()
    }

    #[test]
    fn plans_units_reload_enable_and_start_without_systemd() {
        let f = Fixture::new();
        ready(&f);
        let before = snapshot(&f.root);
        let s = f.session(RunMode::Plan);
        let root = f.root.display().to_string();
        let out = phase(&s, "start-node", &input(&f)).expect("plan");
        assert_eq!(
            out.report.changed,
            ["units", "containerd-started", "kubelet-started"]
        );
        assert_eq!(snapshot(&f.root), before);
        no_denials(&s, "start-node");
        let changes = changes_json(&s);
        let kinds: Vec<String> = changes
            .iter()
            .filter(|c| c["kind"] != "file-create")
            .map(|c| {
                format!(
                    "{} {}",
                    c["kind"].as_str().unwrap_or(""),
                    c["unit"].as_str().unwrap_or("")
                )
            })
            .collect();
        assert_eq!(
            kinds,
            [
                "unit-write nodeward-containerd.service",
                "unit-write nodeward-kubelet.service",
                "daemon-reload ",
                "unit-enable nodeward-containerd.service",
                "unit-enable nodeward-kubelet.service",
                "unit-start nodeward-containerd.service",
                "unit-start nodeward-kubelet.service",
            ]
        );
        let containerd = planned_unit(&changes, "nodeward-containerd.service");
        for want in [
            format!(
                "ExecStart={root}/opt/nodeward/node/current/bin/containerd --config {root}/etc/containerd/config.toml\n"
            ),
            format!(
                "Environment=PATH={root}/opt/nodeward/node/current/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n"
            ),
            "Type=notify\n".into(),
            "Delegate=yes\n".into(),
            "KillMode=mixed\n".into(),
            "Restart=always\n".into(),
            "RestartSec=2\n".into(),
            "LimitNOFILE=infinity\n".into(),
            "TimeoutStopSec=30\n".into(),
            "WantedBy=multi-user.target\n".into(),
        ] {
            assert!(containerd.contains(&want), "{want} missing:\n{containerd}");
        }
        let kubelet = planned_unit(&changes, "nodeward-kubelet.service");
        for want in [
            "After=nodeward-containerd.service\n".to_string(),
            "Wants=nodeward-containerd.service\n".into(),
            format!("EnvironmentFile={root}/var/lib/kubelet/nodeward-flags.env\n"),
            format!("ExecStart={root}/opt/nodeward/node/current/bin/kubelet $KUBELET_ARGS\n"),
            "KillMode=mixed\n".into(),
            "WantedBy=multi-user.target\n".into(),
        ] {
            assert!(kubelet.contains(&want), "{want} missing:\n{kubelet}");
        }
    }

    #[test]
    fn refuses_without_binaries_or_grants() {
        let f = Fixture::new();
        let s = f.session(RunMode::Plan);
        let err = phase(&s, "start-node", &input(&f)).expect_err("no binaries");
        assert!(err.to_string().contains("run install first"), "{err}");

        ready(&f);
        let g = bundle_grants("start-node");
        let units = ["nodeward-containerd.service", "nodeward-kubelet.service"];
        for list in [
            &g.systemd.write,
            &g.systemd.enable,
            &g.systemd.start,
            &g.systemd.status,
        ] {
            assert_eq!(list, &units, "exactly the node's units");
        }
        let mut no_reload = g.clone();
        no_reload.systemd.reload = false;
        let err = phase_with_grants(&s, "start-node", no_reload, &input(&f)).expect_err("reload");
        assert!(
            err.to_string().contains("daemon-reload") && err.to_string().contains("denied"),
            "{err}"
        );
        let mut no_enable = g;
        no_enable.systemd.enable.clear();
        let err = phase_with_grants(&s, "start-node", no_enable, &input(&f)).expect_err("enable");
        assert!(
            err.to_string()
                .contains("enabling nodeward-containerd.service"),
            "{err}"
        );
    }

    #[test]
    fn refuses_a_root_it_cannot_write_into_units() {
        let f = Fixture::new();
        ready(&f);
        let s = f.session(RunMode::Plan);
        let mut input = input(&f);
        input.layout.root = "/tmp/a root".into();
        let err = phase(&s, "start-node", &input).expect_err("space");
        assert!(err.to_string().contains("/tmp/a root"), "{err}");
    }
}

mod stop_node {
    use super::*;

    #[test]
    fn plans_stops_in_order_and_needs_each_unit_granted() {
        let f = Fixture::new();
        let s = f.session(RunMode::Plan);
        phase(&s, "stop-node", &input(&f)).expect("plan");
        let stops: Vec<_> = changes_json(&s)
            .iter()
            .map(|c| {
                format!(
                    "{} {}",
                    c["kind"].as_str().unwrap_or(""),
                    c["unit"].as_str().unwrap_or("")
                )
            })
            .collect();
        // Without a bus the plan lists every stop, in order; with one (inside the harness)
        // it asks systemd, and none of these units runs there, so nothing would stop.
        let expected: Vec<&str> = if s.systemd.bus().is_ok() {
            Vec::new()
        } else {
            vec![
                "unit-stop nodeward-kubelet.service",
                "unit-stop nodeward-containerd.service",
                "unit-stop kubepods.slice",
            ]
        };
        assert_eq!(stops, expected);
        no_denials(&s, "stop-node");

        let mut g = bundle_grants("stop-node");
        g.systemd.start.retain(|u| u != "kubepods.slice");
        let s = f.session(RunMode::Plan);
        let err = phase_with_grants(&s, "stop-node", g, &input(&f)).expect_err("slice");
        assert!(
            err.to_string().contains("stopping kubepods.slice")
                && err.to_string().contains("denied"),
            "{err}"
        );
    }
}

mod teardown {
    use super::*;

    /// A root as bootstrap leaves it (minus what needs systemd), plus runtime state.
    fn bootstrapped(f: &Fixture) -> PhaseInput {
        let input = input(f);
        let s = f.session(RunMode::Apply);
        put_version(f, VERSION, true);
        put_version(f, "1.33.0-old", true);
        for p in ["setup-host", "install", "configure"] {
            phase(&s, p, &input).unwrap_or_else(|e| panic!("{p}: {e}"));
        }
        f.put(
            "var/lib/kubelet/pods/uid/volumes/kubernetes.io~empty-dir/cache/x",
            "pod data",
        );
        f.put("var/lib/kubelet/pki/kubelet-client-current.pem", "cert");
        f.put(
            "var/lib/containerd/io.containerd.content.v1.content/blobs/x",
            "blob",
        );
        f.put("run/containerd/containerd.sock.ttrpc", "");
        f.put("var/lib/cni/networks/nodeward/10.244.0.2", "lease");
        f.put("etc/systemd/system/nodeward-kubelet.service", "[Service]\n");
        f.put("var/lib/nodeward/node/install.json", "{}");
        input
    }

    const GONE: &[&str] = &[
        "etc/containerd",
        "etc/kubernetes",
        "etc/cni/net.d",
        "etc/modules-load.d/nodeward.conf",
        "etc/sysctl.d/99-nodeward.conf",
        "opt/cni",
        "opt/nodeward/node",
        "var/lib/kubelet",
        "var/lib/containerd",
        "run/containerd",
        "var/lib/cni",
        "etc/systemd/system/nodeward-kubelet.service",
    ];

    #[test]
    fn removes_the_node_keeps_agent_state_and_is_idempotent() {
        let f = Fixture::new();
        let mut input = bootstrapped(&f);
        input.mounts =
            vec!["var/lib/kubelet/pods/uid/volumes/kubernetes.io~empty-dir/cache".into()];
        let outside = snapshot(&f.outside);
        let s = f.session(RunMode::Apply);
        let out = phase(&s, "teardown", &input).expect("teardown");
        assert_eq!(out.report.changed, ["node-removed"]);
        no_denials(&s, "teardown");
        for p in GONE {
            assert!(
                std::fs::symlink_metadata(f.root.join(p)).is_err(),
                "{p} is left: {:?}",
                snapshot(&f.root).keys().collect::<Vec<_>>()
            );
        }
        assert_eq!(read(&f, "var/lib/nodeward/node/install.json"), "{}");
        assert!(f.root.join("etc/systemd/system").is_dir());
        assert_eq!(snapshot(&f.outside), outside);

        let after = snapshot(&f.root);
        let s = f.session(RunMode::Apply);
        let again = phase(&s, "teardown", &input).expect("teardown again");
        assert!(again.report.changed.is_empty(), "{:?}", again.report);
        assert_eq!(snapshot(&f.root), after);
    }

    #[test]
    fn keeps_files_it_did_not_write_and_works_half_bootstrapped() {
        let f = Fixture::new();
        let input = input(&f);
        let s = f.session(RunMode::Apply);
        phase(&s, "setup-host", &input).expect("setup-host");
        f.put("etc/kubernetes/manifests/etcd.yaml", "kind: Pod\n");
        f.put("etc/cni/net.d/99-other.conflist", "{}");
        phase(&s, "teardown", &input).expect("teardown");
        assert_eq!(
            read(&f, "etc/kubernetes/manifests/etcd.yaml"),
            "kind: Pod\n"
        );
        assert_eq!(read(&f, "etc/cni/net.d/99-other.conflist"), "{}");
        assert!(!f.root.join("etc/kubernetes/pki").exists());
        assert!(!f.root.join("etc/containerd").exists());
        assert!(!f.root.join("var/lib/kubelet").exists());
        assert!(f.root.join("var/lib/nodeward/node").is_dir());
    }

    #[test]
    fn plan_mode_records_and_touches_nothing() {
        let f = Fixture::new();
        let input = bootstrapped(&f);
        let before = snapshot(&f.root);
        let s = f.session(RunMode::Plan);
        phase(&s, "teardown", &input).expect("plan");
        assert_eq!(snapshot(&f.root), before);
        let removed: Vec<String> = changes_json(&s)
            .iter()
            .filter(|c| c["kind"] == "remove")
            .map(|c| c["path"].as_str().unwrap_or("").to_string())
            .collect();
        for p in [
            "opt/nodeward/node",
            "var/lib/kubelet",
            "etc/kubernetes/pki/ca.crt",
            "opt/cni/bin",
            "opt/cni",
            "etc/kubernetes",
        ] {
            assert!(
                removed.iter().any(|r| r == p),
                "{p} not planned: {removed:?}"
            );
        }
        assert!(!removed.iter().any(|r| r.starts_with("var/lib/nodeward")));
    }
}
