//! `scripts/install.sh`, the first-boot install (issue 15, item 5; docs/first-boot.md): the
//! binary, the config and the daemon's unit installed beneath a root, checked before anything
//! is written, a second run changing nothing; and, inside the real systemd harness, the whole
//! first boot (install, enable, `nodeward bootstrap`) of a none node with the **stub kubelet**
//! and **stub API server** of `tests/none_stub.rs` standing in for the real ones.

mod cluster;
mod node;

use node::*;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/install.sh")
}

fn binary() -> &'static str {
    env!("CARGO_BIN_EXE_nodeward")
}

/// `install.sh --root ROOT ARGS`, with the node root's state and audit directories when given.
fn install(root: &Path, node: Option<&NodeRoot>, args: &[&str]) -> Output {
    let mut c = Command::new(script());
    c.arg("--root").arg(root).args(args);
    for v in ["NODEWARD_CONFIG", "NODEWARD_ROOT", "NODEWARD_BUNDLE"] {
        c.env_remove(v);
    }
    if let Some(n) = node {
        c.env("NODEWARD_STATE_DIR", &n.state_dir)
            .env("NODEWARD_AUDIT_DIR", &n.audit_dir);
    }
    c.output().expect("install.sh runs")
}

fn text(out: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[track_caller]
fn refused(root: &Path, args: &[&str], says: &str) {
    let out = install(root, None, args);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(1), "{all}");
    assert!(all.contains(says), "expected {says:?} in:\n{all}");
    let left: Vec<_> = std::fs::read_dir(root)
        .expect("root")
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(left.is_empty(), "a refused install wrote {left:?}");
}

/// The embedded example config, as a file.
fn example_config(dir: &Path) -> PathBuf {
    let out = Command::new(binary())
        .args(["config", "print-defaults"])
        .output()
        .expect("nodeward runs");
    assert!(out.status.success());
    let path = dir.join("node.yaml");
    std::fs::write(&path, &out.stdout).expect("config");
    path
}

#[test]
fn install_refuses_bad_input_and_installs_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("root");
    std::fs::create_dir(&root).expect("root");
    let config = example_config(dir.path());
    let config = config.to_str().expect("utf-8");
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "machineName: [unterminated\n").expect("bad config");
    let bad = bad.to_str().expect("utf-8");
    let zeros = "0".repeat(64);

    refused(
        &root,
        &["--binary", binary(), "--sha256", &zeros, "--config", config],
        "not the pinned",
    );
    refused(
        &root,
        &["--url", "http://127.0.0.1:9/nodeward", "--config", config],
        "needs --sha256",
    );
    refused(
        &root,
        &["--binary", binary(), "--sha256", "ABC", "--config", config],
        "not 64 lower-case hex digits",
    );
    refused(&root, &["--binary", binary(), "--config", bad], bad);
    refused(&root, &["--binary", binary()], "--config FILE is required");
    refused(
        &root,
        &["--binary", "/nonexistent/nodeward", "--config", config],
        "--binary /nonexistent/nodeward: no such file",
    );
    refused(
        &root,
        &["--binary", "/bin/false", "--config", config],
        "does not run here",
    );
    refused(&root, &["--frobnicate"], "unknown argument: --frobnicate");
}

#[test]
fn install_places_binary_config_and_unit_and_a_second_run_changes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("root");
    std::fs::create_dir(&root).expect("root");
    let config = example_config(dir.path());
    let args = [
        "--binary",
        binary(),
        "--config",
        config.to_str().expect("utf-8"),
        "--no-bootstrap",
    ];
    let out = install(&root, None, &args);
    assert!(out.status.success(), "{}", text(&out));

    let bin = root.join("usr/local/bin/nodeward");
    assert_eq!(
        sha256_file(&bin),
        sha256_file(Path::new(binary())),
        "the binary"
    );
    let mode = |p: &Path| {
        std::fs::metadata(p)
            .expect("installed")
            .permissions()
            .mode()
            & 0o7777
    };
    assert_eq!(mode(&bin), 0o755);
    let installed_config = root.join("etc/nodeward/node.yaml");
    assert_eq!(
        std::fs::read(&installed_config).expect("config"),
        std::fs::read(&config).expect("config")
    );
    assert_eq!(
        mode(&installed_config),
        0o600,
        "the config may name secrets"
    );
    let unit = root.join("etc/systemd/system/nodeward.service");
    let printed = Command::new(binary())
        .arg("unit")
        .output()
        .expect("nodeward unit");
    assert_eq!(std::fs::read(&unit).expect("unit"), printed.stdout);
    assert_eq!(
        std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/nodeward.service"))
            .expect("deploy/nodeward.service"),
        printed.stdout,
        "`nodeward unit` is deploy/nodeward.service"
    );
    // Enabled the offline way (`systemctl --root`): the unit's WantedBy link.
    let wants = root.join("etc/systemd/system/multi-user.target.wants/nodeward.service");
    assert_eq!(
        std::fs::read_link(&wants).expect("enabled"),
        Path::new("/etc/systemd/system/nodeward.service")
    );
    // Not a leftover temporary anywhere.
    let temps: Vec<_> = walk(&root)
        .into_iter()
        .filter(|p| p.to_string_lossy().contains(".install-"))
        .collect();
    assert!(temps.is_empty(), "{temps:?}");

    // Again, and again without --config (the installed one): nothing changes.
    let before = snapshot(&root, |_| false);
    let again = install(&root, None, &args);
    assert!(again.status.success(), "{}", text(&again));
    assert!(
        text(&again).contains(&format!("{} unchanged", bin.display())),
        "{}",
        text(&again)
    );
    let no_config = install(&root, None, &["--binary", binary(), "--no-bootstrap"]);
    assert!(no_config.status.success(), "{}", text(&no_config));
    assert_eq!(
        snapshot(&root, |_| false),
        before,
        "a second run changed the root"
    );
}

/// Every path beneath `dir`.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                todo.push(p.clone());
            }
            out.push(p);
        }
    }
    out
}

#[test]
#[ignore = "needs the real systemd harness (scripts/test.sh)"]
fn install_bootstraps_a_node_on_the_real_systemd_and_a_second_run_repairs_nothing() {
    let root = NodeRoot::new(RootKind::Harness);
    let api = StubApiServer::start();
    let server = ArtifactServer::start_temp();
    let served = serve_artifacts(&server, &stub_kubelet());
    let opts = NodeOptions::new(&root.root, "first-boot");
    api.set_node(&opts.machine_name, opts.stub_node("1.20.2"));
    let config = root.dir.join("first-boot.yaml");
    std::fs::write(
        &config,
        node_config(&ClusterInfo::of_stub(&api, "1.20.2"), &served, &opts),
    )
    .expect("config");
    let args = [
        "--binary",
        binary(),
        "--config",
        config.to_str().expect("utf-8"),
    ];

    let out = install(&root.root, Some(&root), &args);
    let all = text(&out);
    assert!(out.status.success(), "{all}");
    assert!(all.contains("enabled there, not started"), "{all}");
    // The node, as the installed binary made it: bootstrapped, its units running.
    let status = root.nodeward(&["status", "--output", "json"]);
    let st: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap_or_default();
    assert_eq!(st["checkpoint"], "complete", "{st}");
    for unit in NODE_UNITS {
        let active = Command::new("systemctl")
            .args(["is-active", unit])
            .output()
            .expect("systemctl");
        assert_eq!(
            String::from_utf8_lossy(&active.stdout).trim(),
            "active",
            "{unit}"
        );
    }
    // The harness's systemd sees the daemon's unit (its unit directory is the root's).
    let loaded = Command::new("systemctl")
        .args(["show", "-p", "LoadState", "--value", "nodeward.service"])
        .output()
        .expect("systemctl");
    assert_eq!(String::from_utf8_lossy(&loaded.stdout).trim(), "loaded");

    // First boot runs again (cloud-init's runcmd on a reboot): nothing installed again, the
    // bootstrap finds its node complete.
    let again = install(&root.root, Some(&root), &args);
    let all = text(&again);
    assert!(again.status.success(), "{all}");
    for p in [
        "usr/local/bin/nodeward",
        "etc/nodeward/node.yaml",
        "etc/systemd/system/nodeward.service",
    ] {
        let shown = format!("{} unchanged", root.root.join(p).display());
        assert!(all.contains(&shown), "expected {shown:?} in:\n{all}");
    }

    let reset = root.nodeward(&["reset"]);
    assert!(reset.status.success(), "{}", text(&reset));
    // What install.sh placed and reset keeps (the agent): removed by hand, as an operator
    // uninstalling the agent would.
    for p in [
        "usr/local/bin/nodeward",
        "etc/nodeward/node.yaml",
        "etc/systemd/system/multi-user.target.wants/nodeward.service",
        "etc/systemd/system/nodeward.service",
    ] {
        std::fs::remove_file(root.root.join(p)).expect(p);
    }
    let left = root.teardown();
    assert!(left.is_empty(), "{left:?}");
}

/// The flags `install.sh --help` lists.
fn install_flags() -> Vec<String> {
    let out = Command::new(script()).arg("--help").output().expect("help");
    String::from_utf8_lossy(&out.stdout)
        .split(|c: char| c.is_whitespace() || "()|[]".contains(c))
        .filter(|w| w.starts_with("--"))
        .map(str::to_string)
        .collect()
}

/// The arguments of each call of install.sh in `text` (shell lines continued with `\` joined).
fn install_calls(text: &str) -> Vec<Vec<String>> {
    let joined = text.replace("\\\n", " ");
    joined
        .lines()
        .filter_map(|l| {
            let (_, args) = l.split_once("install.sh ")?;
            // A download of the script is not a call.
            (!l.contains("curl") && !l.contains("sha256sum"))
                .then(|| args.split_whitespace().map(str::to_string).collect())
        })
        .collect()
}

#[test]
fn first_boot_snippets_parse_and_call_install_sh_with_flags_it_has() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/first-boot");
    let flags = install_flags();
    assert!(flags.contains(&"--config".to_string()), "{flags:?}");
    for (file, config_path) in [
        ("cloud-init.yaml", "/etc/nodeward/node.yaml"),
        ("butane.yaml", "/etc/nodeward/node.yaml"),
    ] {
        let text = std::fs::read_to_string(dir.join(file)).expect(file);
        let doc: serde_json::Value =
            serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{file} is not YAML: {e}"));
        let calls = install_calls(&text);
        assert_eq!(calls.len(), 1, "{file}: one call of install.sh: {calls:?}");
        let args = &calls[0];
        for a in args.iter().filter(|a| a.starts_with("--")) {
            assert!(
                flags.contains(a),
                "{file}: install.sh has no {a} ({flags:?})"
            );
        }
        let value = |flag: &str| {
            args.iter()
                .position(|a| a == flag)
                .and_then(|i| args.get(i + 1))
                .cloned()
        };
        assert_eq!(value("--config").as_deref(), Some(config_path), "{file}");
        // The binary is pinned: by --sha256, or by Ignition's verification of the file given.
        match file {
            "cloud-init.yaml" => {
                assert!(text.starts_with("#cloud-config\n"), "{file}");
                assert!(value("--url").is_some() && value("--sha256").is_some());
                let written = doc["write_files"][0]["path"].as_str();
                assert_eq!(written, Some(config_path), "{file}: the config it writes");
                assert_eq!(doc["write_files"][0]["permissions"], "0600", "{file}");
            }
            _ => {
                let files = doc["storage"]["files"].as_array().expect("storage.files");
                let file_at = |p: &str| files.iter().find(|f| f["path"] == p);
                let binary = value("--binary").expect("--binary");
                let placed = file_at(&binary).expect("the binary placed by Ignition");
                assert!(
                    placed["contents"]["verification"]["hash"]
                        .as_str()
                        .is_some_and(|h| h.starts_with("sha256-")),
                    "{file}: the binary is pinned"
                );
                // Butane reads YAML 1.1, where 0600 is octal; YAML 1.2 parsers keep the text.
                let mode = &file_at(config_path).expect("config")["mode"];
                assert!(
                    mode == "0600" || mode == 0o600,
                    "{file}: config mode {mode}"
                );
                let unit = doc["systemd"]["units"][0]["contents"]
                    .as_str()
                    .expect("unit");
                let script = unit
                    .lines()
                    .find_map(|l| l.strip_prefix("ExecStart="))
                    .and_then(|l| l.split_whitespace().next())
                    .expect("ExecStart");
                assert!(file_at(script).is_some(), "{file}: {script} placed");
                assert!(unit.contains("ConditionPathExists=!"), "{file}: once");
            }
        }
    }
}
