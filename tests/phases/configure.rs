//! The `configure` phase: renders containerd's and the kubelet's configuration, flags and
//! units from the node config (patches merged, runtime flags by Kubernetes version), and refuses
//! what it cannot render.

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
    // Status computed every second, posted on change or every 5 minutes: the report frequency
    // is written too, or the kubelet would post every second.
    assert_eq!(k["nodeStatusUpdateFrequency"], "1s");
    assert_eq!(k["nodeStatusReportFrequency"], "5m");
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

    let cni: Value = serde_json::from_str(&read(&f, "etc/cni/net.d/10-nodeward-bridge.conflist"))
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

    // The bootstrap kubeconfig the flags name is the host's, rendered before the phase ran
    // (the phase cannot write it: tests/bootstrap_kubeconfig.rs); the phase wrote none of it.
    let writers: Vec<Value> = changes_json(&s)
        .into_iter()
        .filter(|c| c["path"] == "etc/kubernetes/bootstrap-kubelet.conf")
        .map(|c| c["phase"].clone())
        .collect();
    assert_eq!(writers, ["nodeward"]);
    let kc = yaml(&f, "etc/kubernetes/bootstrap-kubelet.conf");
    assert_eq!(
        kc["clusters"][0]["cluster"]["server"],
        "https://10.0.0.1:6443"
    );
    // The config's CA, embedded: not the CA file the phase writes (a phase's CA would let
    // another server at that address take the token).
    assert!(kc["clusters"][0]["cluster"]["certificate-authority"].is_null());
    let ca = kc["clusters"][0]["cluster"]["certificate-authority-data"]
        .as_str()
        .expect("CA data");
    assert_eq!(
        base64::Engine::decode(&base64::engine::general_purpose::STANDARD, ca)
            .ok()
            .and_then(|b| String::from_utf8(b).ok())
            .as_deref(),
        Some(read(&f, "etc/kubernetes/pki/ca.crt").as_str())
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
    cfg(&mut input).kubelet.node_status_update_frequency = "2s".into();
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
    assert_eq!(k["nodeStatusUpdateFrequency"], "2s");
    assert_eq!(
        k["nodeStatusReportFrequency"], "5m",
        "pinned whatever the update frequency"
    );

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
