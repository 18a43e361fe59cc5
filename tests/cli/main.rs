//! The command line: exit codes (0 ok, 1 failed, 2 usage or config error), `phases`,
//! `version`, and errors that name the file or field at fault (here); flags, limits, help,
//! completions and man pages (`usage`); logs on stderr (`logging`); `config print-defaults`
//! and `config validate` (`config`). One test binary: each costs a long link.

#[path = "../common/mod.rs"]
mod common;

mod config;
mod logging;
mod usage;

use common::*;
use serde_json::Value;
use std::process::Output;

fn code(o: &Output) -> i32 {
    o.status.code().unwrap_or(-1)
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Asserts `o` exited 2 with `needle` in its stderr; returns the stderr.
fn usage_error(o: &Output, needle: &str) -> String {
    let err = stderr(o);
    assert_eq!(code(o), 2, "{err}");
    assert!(err.contains(needle), "expected {needle:?} in: {err}");
    err
}

/// Runs the built binary with exactly `args` and `env` (no root or state dir added).
fn bare(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_nodeward"));
    cmd.args(args)
        .env_remove("NODEWARD_LOG")
        .env_remove("NODEWARD_ROOT")
        .env_remove("NODEWARD_STATE_DIR")
        .env_remove("NODEWARD_CONFIG")
        .env_remove("NODEWARD_BUNDLE")
        .env_remove("NO_COLOR");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run nodeward")
}

#[test]
fn phases_inspect_lists_digests_imports_and_grants() {
    let f = Fixture::new();
    let out = nodeward(&f, &["phases", "inspect", "--output", "json"]);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).expect("json");
    let phases = v["phases"].as_array().expect("phases");
    let names: Vec<&str> = phases.iter().filter_map(|p| p["name"].as_str()).collect();
    assert_eq!(
        names,
        [
            "preflight",
            "setup-host",
            "download-artifacts",
            "install",
            "configure",
            "start-node",
            "stop-node",
            "teardown"
        ]
    );
    let by_name = |n: &str| {
        phases
            .iter()
            .find(|p| p["name"] == n)
            .unwrap_or_else(|| panic!("phase {n}"))
    };
    for p in phases {
        assert_eq!(p["world"], p["name"], "each phase has its own world");
    }
    let setup = by_name("setup-host");
    assert_eq!(setup["world"], "setup-host");
    assert_eq!(setup["sha256"].as_str().map(str::len), Some(64));
    let imports: Vec<&str> = setup["imports"]
        .as_array()
        .expect("imports")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        imports.contains(&"nodeward:host/kernel@0.1.0"),
        "{imports:?}"
    );
    assert!(
        !imports
            .iter()
            .any(|i| i.contains("systemd") || i.contains("download")),
        "{imports:?}"
    );
    assert_eq!(
        setup["grants"]["kernel"]["modules"],
        serde_json::json!(["overlay", "br_netfilter"])
    );
    // The host renders the bootstrap kubeconfig; configure is told its path, cannot write it.
    let configure = by_name("configure");
    assert!(
        !configure["grants"]["fs"]["write"]
            .as_array()
            .expect("write")
            .iter()
            .any(|p| p == "etc/kubernetes/bootstrap-kubelet.conf"),
        "{configure}"
    );
    assert!(
        configure["grants"]["input"]
            .as_array()
            .expect("input")
            .iter()
            .any(|p| p == "bootstrap-kubeconfig"),
        "{configure}"
    );
    assert_eq!(v["bundle"]["digest"].as_str().map(str::len), Some(64));

    let list = nodeward(&f, &["phases", "list"]);
    assert_eq!(code(&list), 0);
    let text = String::from_utf8_lossy(&list.stdout);
    assert!(
        text.contains("setup-host") && text.contains("configure"),
        "{text}"
    );
}

#[test]
fn version_names_wasmtime_wit_and_the_bundle() {
    let f = Fixture::new();
    let out = nodeward(&f, &["version", "--output", "json"]);
    assert_eq!(code(&out), 0);
    let v: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["wasmtime"], "48.0.8");
    assert_eq!(v["wit"], "nodeward:host@0.1.0");
    assert_eq!(v["bundle"]["name"], "nodeward-default");
}

#[test]
fn a_bad_config_is_a_usage_error_naming_file_and_field() {
    let f = Fixture::new();
    let path = f.tmp.path().join("node.yaml");
    let text =
        nodeward::config::EMBEDDED.replace("machineName: worker-01", "machineName: Worker_01");
    std::fs::write(&path, text).expect("write");
    let out = nodeward(&f, &["plan", "--config", path.to_str().expect("utf8")]);
    assert_eq!(code(&out), 2);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("node.yaml") && err.contains("machineName"),
        "{err}"
    );

    let missing = nodeward(&f, &["plan", "--config", "/nonexistent/node.yaml"]);
    assert_eq!(code(&missing), 2);
    assert!(String::from_utf8_lossy(&missing.stderr).contains("/nonexistent/node.yaml"));

    let unknown = nodeward(&f, &["plan", "--phase", "no-such-phase"]);
    assert_eq!(code(&unknown), 2);
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("no-such-phase"));

    let flag = nodeward(&f, &["plan", "--no-such-flag"]);
    assert_eq!(code(&flag), 2);
}

#[test]
fn a_ca_file_that_is_missing_or_holds_no_certificate_is_a_config_error_naming_it() {
    let f = Fixture::new();
    let config = f.tmp.path().join("node.yaml");
    let with_ca = |path: &str| {
        let text = format!(
            "{}downloadOptions:\n  caFile: {path}\n",
            nodeward::config::EMBEDDED
        );
        std::fs::write(&config, text).expect("write config");
    };
    let plan = || nodeward(&f, &["plan", "--config", config.to_str().expect("utf8")]);

    with_ca("/etc/nodeward/mirror-ca.pem");
    let err = usage_error(
        &plan(),
        "node.yaml: downloadOptions.caFile /etc/nodeward/mirror-ca.pem: cannot read",
    );
    assert!(err.contains("No such file"), "{err}");

    // Aimed at a file holding the bootstrap token (a copy of the config beneath the root):
    // refused without a word of its content.
    f.put("etc/nodeward/node.yaml", nodeward::config::EMBEDDED);
    with_ca("/etc/nodeward/node.yaml");
    let err = usage_error(
        &plan(),
        "downloadOptions.caFile /etc/nodeward/node.yaml: holds no certificate",
    );
    assert!(!err.contains(TOKEN_SECRET), "{err}");

    // Not absolute: refused by the config's own validation.
    with_ca("etc/nodeward/mirror-ca.pem");
    usage_error(&plan(), "downloadOptions.caFile: must be an absolute path");

    // A real CA: the plan runs.
    let ca = common::tls::TestCa::new("mirror-ca");
    f.put("etc/nodeward/mirror-ca.pem", &ca.ca_pem());
    with_ca("/etc/nodeward/mirror-ca.pem");
    let out = plan();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
}

#[test]
fn a_refused_bundle_fails_with_exit_code_1_and_changes_nothing() {
    let f = Fixture::new();
    let dir = f.tmp.path().join("bundle");
    std::fs::create_dir_all(&dir).expect("dir");
    let manifest = nodeward::built::DEFAULT_BUNDLE_MANIFEST;
    std::fs::write(dir.join("manifest.toml"), manifest).expect("manifest");
    for (name, bytes) in nodeward::built::DEFAULT_BUNDLE_COMPONENTS {
        std::fs::write(dir.join(name), bytes).expect("component");
    }
    let ok = nodeward(
        &f,
        &[
            "plan",
            "--bundle",
            dir.to_str().expect("utf8"),
            "--output",
            "json",
        ],
    );
    assert_eq!(
        code(&ok),
        0,
        "an exact copy of the default bundle runs: {}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let v: Value = serde_json::from_slice(&ok.stdout).expect("json");
    assert!(
        v["bundle"]["source"]
            .as_str()
            .unwrap_or_default()
            .contains(dir.to_str().unwrap_or_default())
    );

    // Tamper with one component.
    let mut bytes = std::fs::read(dir.join("configure.wasm")).expect("read");
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(dir.join("configure.wasm"), bytes).expect("tamper");
    let before = snapshot(&f.root);
    // The bundle is unsigned: apply refuses it outright unless --allow-unsigned, and even then
    // the digest check refuses the tampered component.
    let unsigned = nodeward(
        &f,
        &[
            "apply",
            "--phase",
            "configure",
            "--bundle",
            dir.to_str().expect("utf8"),
        ],
    );
    assert_eq!(code(&unsigned), 1);
    assert!(String::from_utf8_lossy(&unsigned.stderr).contains("--allow-unsigned"));
    let out = nodeward(
        &f,
        &[
            "apply",
            "--phase",
            "configure",
            "--allow-unsigned",
            "--bundle",
            dir.to_str().expect("utf8"),
        ],
    );
    assert_eq!(code(&out), 1);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("configure.wasm") && err.contains("sha256"),
        "{err}"
    );
    assert_eq!(snapshot(&f.root), before);
}

#[test]
fn apply_without_a_phase_and_an_unimplemented_mode_are_usage_errors() {
    let f = Fixture::new();
    let before = snapshot(&f.root);
    let out = nodeward(&f, &["apply"]);
    assert_eq!(code(&out), 2);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("nodeward bootstrap"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = nodeward(&f, &["bootstrap", "--mode", "nspawn"]);
    assert_eq!(code(&out), 2);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("nspawn is not implemented"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The embedded example config pins no artifact: bootstrap refuses before any change,
    // naming the first artifact and the config field.
    let out = nodeward(&f, &["bootstrap"]);
    assert_eq!(code(&out), 1);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("artifact kubelet") && err.contains("downloads.kubelet.sha256"),
        "{err}"
    );
    let after: Vec<String> = snapshot(&f.root)
        .into_keys()
        .filter(|p| !before.contains_key(p) && !p.starts_with("run"))
        // The audit trail records the refused run; it is no change of the host's.
        .filter(|p| p != "var" && p != "var/log" && !p.starts_with("var/log/nodeward"))
        .collect();
    assert!(after.is_empty(), "bootstrap changed {after:?}");
}
