//! The command line's JSON, through the built binary: every `--output json` validates against
//! its schema under `docs/schemas/` (with the `jsonschema` crate, draft 2020-12), every key is
//! camelCase, `plan` has one shape with and without `--phase`, a failed operation still lists
//! its steps and changes, and `status` keeps values and errors apart and lists a partial
//! node's traces; `preflight`, passed or not. The audit trail's records and the `audit` commands' outputs validate too.

use jsonschema::{Registry, Validator};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

/// Where the schemas' `$id`s live; each file is registered under its own.
const SCHEMA_BASE: &str = "https://nodeward.io/schemas/";

fn schema_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/schemas")
}

/// Every schema file, by file stem (`run`, `status`, ...).
fn schemas() -> &'static Vec<(String, Value)> {
    static SCHEMAS: OnceLock<Vec<(String, Value)>> = OnceLock::new();
    SCHEMAS.get_or_init(|| {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(schema_dir()).expect("docs/schemas") {
            let path = entry.expect("entry").path();
            let name = path.file_name().and_then(|n| n.to_str()).expect("name");
            let Some(stem) = name.strip_suffix(".schema.json") else {
                continue;
            };
            let text = std::fs::read_to_string(&path).expect("schema");
            let schema: Value = serde_json::from_str(&text).expect("schema is JSON");
            out.push((stem.to_string(), schema));
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    })
}

/// The schemas, each under its `$id`, so `"$ref": "bundle.schema.json"` resolves offline.
fn registry() -> &'static Registry<'static> {
    static REGISTRY: OnceLock<Registry<'static>> = OnceLock::new();
    REGISTRY.get_or_init(|| {
        let pairs: Vec<(String, Value)> = schemas()
            .iter()
            .map(|(stem, schema)| (format!("{SCHEMA_BASE}{stem}.schema.json"), schema.clone()))
            .collect();
        Registry::new()
            .extend(pairs)
            .expect("schema URIs")
            .prepare()
            .expect("registry")
    })
}

fn validator(kind: &str) -> Validator {
    let (_, schema) = schemas()
        .iter()
        .find(|(stem, _)| stem == kind)
        .unwrap_or_else(|| panic!("docs/schemas/{kind}.schema.json"));
    jsonschema::options()
        .with_registry(registry())
        .build(schema)
        .unwrap_or_else(|e| panic!("{kind}.schema.json: {e}"))
}

/// Checks `v` against `docs/schemas/<kind>.schema.json` and that every key is camelCase
/// (outside the grants tables, which keep the manifest's own keys).
fn check(kind: &str, v: &Value) {
    let validator = validator(kind);
    let errors: Vec<String> = validator
        .iter_errors(v)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect();
    assert!(errors.is_empty(), "{kind}: {errors:#?}\n{v:#}");
    camel_case_keys(v, "");
}

fn camel_case_keys(v: &Value, at: &str) {
    match v {
        Value::Object(map) => {
            for (k, child) in map {
                let camel = k.chars().next().is_some_and(|c| c.is_ascii_lowercase())
                    && k.chars().all(|c| c.is_ascii_alphanumeric());
                assert!(camel, "{at}/{k}: not camelCase");
                // Grants tables keep the manifest's keys; an audit record's `args` the WIT
                // parameter names (`read-only`, `dest-dir`).
                if k != "grants" && k != "args" {
                    camel_case_keys(child, &format!("{at}/{k}"));
                }
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                camel_case_keys(item, &format!("{at}/{i}"));
            }
        }
        _ => {}
    }
}

/// A host root, a node config, and where the agent keeps its state.
struct Env {
    tmp: tempfile::TempDir,
    root: PathBuf,
    state: PathBuf,
}

impl Env {
    /// A fresh root sharing the compiled-component cache of the CLI tests (each component is
    /// compiled once per test run); `own_state` gives it a state directory of its own (for the
    /// bundle store).
    fn new(own_state: bool) -> Self {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path().join("root");
        std::fs::create_dir_all(&root).expect("root");
        let state = if own_state {
            tmp.path().join("state")
        } else {
            Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli-state")
        };
        Env { tmp, root, state }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.tmp.path().join(name)
    }

    fn run<S: AsRef<str>>(&self, args: &[S]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_nodeward"))
            .args(args.iter().map(AsRef::as_ref))
            .args(["--log-level", "error"])
            // Through the environment: a command that does not take them ignores them (a
            // flag it does not take is a usage error).
            .env("NODEWARD_ROOT", &self.root)
            .env("NODEWARD_STATE_DIR", &self.state)
            .env_remove("NODEWARD_LOG")
            .env_remove("NODEWARD_CONFIG")
            .env_remove("NODEWARD_UNIT_DIR")
            .env_remove("NODEWARD_TRUSTED_KEYS_DIR")
            .env_remove("NODEWARD_TEST_ABORT")
            .env_remove("NODEWARD_BUNDLE")
            .output()
            .expect("run nodeward")
    }

    /// Runs with `--output json`, requires exit code `code`, and returns stdout as JSON.
    fn json<S: AsRef<str>>(&self, args: &[S], code: i32) -> Value {
        let args: Vec<&str> = args.iter().map(AsRef::as_ref).collect();
        let mut all = args.clone();
        all.extend(["--output", "json"]);
        let out = self.run(&all);
        assert_eq!(
            out.status.code(),
            Some(code),
            "nodeward {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "nodeward {args:?}: stdout is not JSON ({e}): {}",
                String::from_utf8_lossy(&out.stdout)
            )
        })
    }

    /// `status --output json`, checked against its schema.
    fn status(&self) -> Value {
        let v = self.json(&["status"], 0);
        check("status", &v);
        v
    }

    /// A node config pinning every artifact to a port nothing listens on: a bootstrap passes
    /// preflight and setup-host, then fails in download-artifacts.
    fn unreachable_artifacts_config(&self) -> String {
        let mut config = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("host/default-config.yaml"),
        )
        .expect("example config");
        config.push_str("downloads:\n");
        for (i, artifact) in ["kubelet", "containerd", "runc", "cni-plugins"]
            .iter()
            .enumerate()
        {
            config.push_str(&format!(
                "  {artifact}: {{url: \"http://127.0.0.1:9/{artifact}\", sha256: \"{}\"}}\n",
                i.to_string().repeat(64)
            ));
        }
        let path = self.path("node.yaml");
        std::fs::write(&path, config).expect("config");
        path.display().to_string()
    }
}

/// The preflight checks of the example config's API server, which is no cluster of these
/// tests' (it may not even answer): ignored where a test bootstraps with it.
const API_CHECKS: &str = "APIServerReachable,CACertMatch,ClockSanity";

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

fn names(steps: &Value) -> Vec<&str> {
    steps
        .as_array()
        .expect("steps")
        .iter()
        .filter_map(|s| s["name"].as_str())
        .collect()
}

#[test]
fn every_schema_is_a_valid_draft_2020_12_schema() {
    assert!(schemas().len() >= 14, "{:?}", schemas().len());
    for (stem, schema) in schemas() {
        assert_eq!(
            schema["$id"],
            format!("{SCHEMA_BASE}{stem}.schema.json"),
            "{stem}: $id names the file"
        );
        if let Err(e) = jsonschema::meta::validate(schema) {
            panic!("{stem}.schema.json: {e}");
        }
        validator(stem);
    }
    // The schemas do reject other casings and follow their references.
    let error = validator("error");
    assert!(!error.is_valid(&serde_json::json!({"error": "x", "exit-code": 2})));
    assert!(error.is_valid(&serde_json::json!({"error": "x", "exitCode": 2})));
    let bundle = serde_json::json!({
        "name": "b", "version": 1, "digest": "0".repeat(64), "source": "embedded",
        "signed-by": null,
    });
    let version =
        serde_json::json!({"nodeward": "0", "wasmtime": "0", "wit": "w", "bundle": bundle});
    assert!(!validator("version").is_valid(&version));
}

#[test]
fn plan_and_apply_have_one_shape_with_and_without_phase() {
    let env = Env::new(false);
    let whole = env.json(&["plan"], 0);
    check("run", &whole);
    assert_eq!(whole["mode"], "plan");
    assert_eq!(whole["operation"], "bootstrap");
    assert_eq!(
        names(&whole["steps"]),
        [
            "preflight",
            "setup-host",
            "download-artifacts",
            "install",
            "configure",
            "start-node"
        ]
    );
    assert!(whole["version"].is_string(), "{whole}");

    let one = env.json(&["plan", "--phase", "setup-host"], 0);
    check("run", &one);
    assert_eq!(one["operation"], "phases");
    assert_eq!(names(&one["steps"]), ["setup-host"]);
    let keys = |v: &Value| -> Vec<String> {
        v.as_object()
            .expect("object")
            .keys()
            .cloned()
            .collect::<Vec<_>>()
    };
    assert_eq!(keys(&whole), keys(&one), "one top-level shape");

    let applied = env.json(&["apply", "--phase", "setup-host"], 0);
    check("run", &applied);
    assert_eq!(applied["mode"], "apply");
    assert_eq!(keys(&applied), keys(&one));
    assert_eq!(
        applied["changes"], one["changes"],
        "apply made what plan showed"
    );
    let n = applied["changes"].as_array().expect("changes").len();
    assert_eq!(applied["mutations"], n);
    assert_eq!(applied["changesDropped"], 0);
    assert_eq!(applied["steps"][0]["error"], Value::Null);
}

#[test]
fn a_failed_bootstrap_lists_its_steps_and_the_changes_it_made() {
    let env = Env::new(false);
    let config = env.unreachable_artifacts_config();
    // A short deadline: the phase gives up on the unreachable server in seconds. The example
    // config's API server is no cluster of this test's.
    let args = [
        "bootstrap",
        "--config",
        &config,
        "--phase-timeout",
        "3",
        "--ignore-preflight-errors",
        API_CHECKS,
    ];
    let v = env.json(&args, 1);
    check("run", &v);
    assert_eq!(v["operation"], "bootstrap");
    assert_eq!(
        names(&v["steps"]),
        [
            "preflight-checks",
            "preflight",
            "setup-host",
            "download-artifacts"
        ]
    );
    let steps = v["steps"].as_array().expect("steps");
    assert!(steps[..3].iter().all(|s| s["error"].is_null()), "{v:#}");
    assert_eq!(steps[0]["phase"], false);
    let failed = &steps[3];
    assert_eq!(failed["summary"], "failed");
    // Every artifact fails; the first in the batch's order (tarballs first) is named.
    assert!(
        failed["error"]
            .as_str()
            .is_some_and(|e| e.contains("downloading containerd from http://127.0.0.1:9/")),
        "{failed}"
    );
    assert!(
        v["error"]
            .as_str()
            .is_some_and(|e| e.starts_with("step download-artifacts:")),
        "{v:#}"
    );
    let changes = v["changes"].as_array().expect("changes");
    assert!(
        changes
            .iter()
            .any(|c| c["kind"] == "file-create" && c["path"] == "etc/sysctl.d/99-nodeward.conf"),
        "what setup-host wrote is listed: {v:#}"
    );
    assert!(
        changes.iter().any(|c| c["kind"] == "node-state"),
        "the install record is listed: {v:#}"
    );
    assert_eq!(v["mutations"], changes.len());
    // The stderr error line is JSON too.
    let out = env.run(&[&args[..], &["--output", "json"]].concat());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last = stderr.lines().last().expect("an error line");
    let err: Value = serde_json::from_str(last).expect("error JSON");
    check("error", &err);
    assert_eq!(err["exitCode"], 1);

    // status: a bootstrap that has not finished, with its traces.
    let st = env.status();
    assert_eq!(st["presence"], "bootstrapping");
    assert_eq!(st["installed"], false);
    assert_eq!(st["checkpoint"], "download-artifacts");
    let traces: Vec<(&str, &str)> = st["traces"]
        .as_array()
        .expect("traces")
        .iter()
        .map(|t| {
            (
                t["kind"].as_str().unwrap_or(""),
                t["path"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert!(
        traces.contains(&("state-file", "var/lib/nodeward/node/install-record.json")),
        "{traces:?}"
    );
    assert!(traces.iter().any(|(k, _)| *k == "version"), "{traces:?}");

    // reset: the same report shape; afterwards no trace is left.
    let reset = env.json(&["reset", "--config", &config], 0);
    check("run", &reset);
    assert_eq!(reset["operation"], "reset");
    let st = env.status();
    assert_eq!(st["presence"], "absent", "{st:#}");
    assert_eq!(st["traces"], Value::Array(vec![]));
}

#[test]
fn a_failed_bootstrap_prints_its_failed_step_and_changes_as_text() {
    let env = Env::new(false);
    let config = env.unreachable_artifacts_config();
    let out = env.run(&[
        "bootstrap",
        "--config",
        &config,
        "--phase-timeout",
        "3",
        "--ignore-preflight-errors",
        API_CHECKS,
    ]);
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("step preflight-checks: 22 checks: "),
        "{text}"
    );
    let failed = text
        .find("phase download-artifacts: failed (")
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        text[failed..].contains("create dir opt/nodeward/node/"),
        "what the failed step changed is printed: {text}"
    );
    assert!(text.contains("change(s) made."), "{text}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("error: step download-artifacts:"),
        "{stderr}"
    );
}

#[test]
fn preflight_matches_its_schema_passed_or_not() {
    let env = Env::new(false);
    let v = env.json(&["preflight", "--ignore-preflight-errors", API_CHECKS], 0);
    check("preflight", &v);
    assert_eq!(v["passed"], true, "{v:#}");
    assert_eq!(v["ownNode"], false);
    let checks = v["checks"].as_array().expect("checks");
    assert_eq!(checks[0]["name"], "IsPrivilegedUser");
    // An empty root has no proc: the kernel's checks are skipped, not passed.
    let swap = checks.iter().find(|c| c["name"] == "Swap").expect("Swap");
    assert_eq!(swap["status"], "skip", "{swap}");
    // A failing check: the same shape, exit 1, and the error line on stderr is JSON too.
    std::fs::create_dir_all(env.root.join("etc/kubernetes/manifests")).expect("manifests");
    std::fs::write(
        env.root.join("etc/kubernetes/manifests/pod.yaml"),
        "kind: Pod\n",
    )
    .expect("pod");
    let args = [
        "preflight",
        "--ignore-preflight-errors",
        API_CHECKS,
        "--output",
        "json",
    ];
    let out = env.run(&args);
    assert_eq!(out.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    check("preflight", &v);
    assert_eq!(v["passed"], false);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let err: Value = serde_json::from_str(stderr.lines().last().expect("a line")).expect("JSON");
    check("error", &err);
    assert!(
        err["error"]
            .as_str()
            .is_some_and(|e| e.contains("DirAvailable--etc-kubernetes-manifests")),
        "{err}"
    );
}

#[test]
fn status_keeps_values_and_errors_apart_and_lists_a_partial_node() {
    let env = Env::new(false);
    let st = env.status();
    assert_eq!(st["presence"], "absent");
    assert_eq!(st["installed"], false);
    assert_eq!(st["traces"], Value::Array(vec![]));
    assert_eq!(st["kubeletHealth"], "unknown");
    assert!(st["kubeletHealthError"].is_string());
    for u in st["units"].as_array().expect("units") {
        // Either systemd answered (a state, no error) or it did not (an error, no state).
        assert_eq!(u["activeState"].is_null(), u["error"].is_string(), "{u}");
        assert_eq!(u["activeState"].is_null(), u["subState"].is_null(), "{u}");
    }
    let text = st.to_string();
    assert!(
        !text.contains("Error::") && !text.contains("Unavailable("),
        "no Rust debug text: {text}"
    );

    // setup-host and configure by hand: no install record, but a node's traces.
    env.json(
        &["apply", "--phase", "setup-host", "--phase", "configure"],
        0,
    );
    let st = env.status();
    assert_eq!(st["presence"], "partial", "{st:#}");
    assert_eq!(st["installed"], false);
    let traces: Vec<(&str, &str)> = st["traces"]
        .as_array()
        .expect("traces")
        .iter()
        .map(|t| {
            (
                t["kind"].as_str().unwrap_or(""),
                t["path"].as_str().unwrap_or(""),
            )
        })
        .collect();
    for expected in [
        ("config", "etc/sysctl.d/99-nodeward.conf"),
        ("config", "etc/containerd/config.toml"),
        ("config", "var/lib/kubelet/config.yaml"),
        ("directory", "var/lib/kubelet"),
    ] {
        assert!(traces.contains(&expected), "{expected:?} in {traces:?}");
    }
    let out = env.run(&["status"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("PARTIAL") && text.contains("etc/containerd/config.toml"),
        "{text}"
    );
    assert!(!text.contains("Error::"), "{text}");
}

/// Writes a minisign key pair as `<stem>.pub` and `<stem>.key` in `dir`.
fn keypair(dir: &Path, stem: &str) -> (PathBuf, PathBuf) {
    let kp = minisign::KeyPair::generate_unencrypted_keypair().expect("keypair");
    let public = dir.join(format!("{stem}.pub"));
    let secret = dir.join(format!("{stem}.key"));
    std::fs::write(&public, kp.pk.to_box().expect("pk box").to_string()).expect("write pub");
    std::fs::write(&secret, kp.sk.to_box(None).expect("sk box").to_string()).expect("write key");
    (public, secret)
}

/// A bundle source directory: the embedded manifest's `preflight` phase only, at `version`.
fn preflight_source(dir: &Path, version: u64) {
    let mut manifest: toml::Table = nodeward::built::DEFAULT_BUNDLE_MANIFEST
        .parse()
        .expect("embedded manifest");
    if let Some(phases) = manifest
        .get_mut("phases")
        .and_then(toml::Value::as_array_mut)
    {
        phases.retain(|p| p.get("name").and_then(toml::Value::as_str) == Some("preflight"));
    }
    if let Some(bundle) = manifest
        .get_mut("bundle")
        .and_then(toml::Value::as_table_mut)
    {
        bundle.insert(
            "version".into(),
            toml::Value::Integer(i64::try_from(version).expect("version")),
        );
    }
    std::fs::create_dir_all(dir).expect("source dir");
    std::fs::write(
        dir.join("manifest.toml"),
        toml::to_string(&manifest).expect("manifest"),
    )
    .expect("manifest");
    let (file, wasm) = nodeward::built::DEFAULT_BUNDLE_COMPONENTS
        .iter()
        .find(|(n, _)| *n == "preflight.wasm")
        .expect("embedded preflight");
    std::fs::write(dir.join(file), wasm).expect("component");
}

#[test]
fn bundle_commands_and_errors_match_their_schemas() {
    let env = Env::new(true);
    let (public, secret) = keypair(env.tmp.path(), "platform");
    let public = s(&public).to_string();
    let with_key = |args: &[&str]| -> Vec<String> {
        let mut all: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        all.extend(["--trusted-key".to_string(), public.clone()]);
        all
    };

    let v = env.json(&["version"], 0);
    check("version", &v);
    assert_eq!(v["bundle"]["signedBy"], Value::Null);
    let list = env.json(&["phases", "list"], 0);
    check("phases-list", &list);
    let inspect = env.json(&["phases", "inspect"], 0);
    check("phases-inspect", &inspect);
    assert_eq!(inspect["signature"]["checked"], "embedded");
    assert_eq!(inspect["phases"][1]["withinWorld"], true);

    let src = env.path("src");
    preflight_source(&src, 2);
    let bundle = env.path("bundle");
    let packed = env.json(&["phases", "pack", s(&src), "-o", s(&bundle)], 0);
    check("phases-pack", &packed);
    assert_eq!(packed["phases"], 1);
    let signed = env.json(&["phases", "sign", s(&bundle), "--key", s(&secret)], 0);
    check("phases-sign", &signed);
    let verified = env.json(&with_key(&["phases", "verify", s(&bundle)]), 0);
    check("phases-verify", &verified);
    assert!(verified["bundle"]["signedBy"].is_string(), "{verified}");
    let inspected = env.json(&with_key(&["phases", "inspect", s(&bundle)]), 0);
    check("phases-inspect", &inspected);
    assert_eq!(inspected["signature"]["checked"], "now");
    assert_eq!(inspected["signature"]["verified"], true);

    let diff = env.json(&["phases", "diff", "@current", s(&bundle)], 0);
    check("phases-diff", &diff);

    let installed = env.json(
        &with_key(&["phases", "install", s(&bundle), "--allow-incomplete"]),
        0,
    );
    check("phases-install", &installed);
    assert_eq!(installed["alreadyCurrent"], false);
    assert_eq!(
        installed["lastGood"],
        Value::Null,
        "the embedded bundle ran"
    );
    let again = env.json(
        &with_key(&["phases", "install", s(&bundle), "--allow-incomplete"]),
        0,
    );
    check("phases-install", &again);
    assert_eq!(again["alreadyCurrent"], true);

    // A second bundle, so there is a last-good to roll back to.
    let src2 = env.path("src2");
    preflight_source(&src2, 3);
    let bundle2 = env.path("bundle2");
    env.json(&["phases", "pack", s(&src2), "-o", s(&bundle2)], 0);
    env.json(&["phases", "sign", s(&bundle2), "--key", s(&secret)], 0);
    let installed2 = env.json(
        &with_key(&["phases", "install", s(&bundle2), "--allow-incomplete"]),
        0,
    );
    check("phases-install", &installed2);
    assert_eq!(installed2["lastGood"], installed["installed"]["digest"]);
    let rolled = env.json(&["phases", "rollback"], 0);
    check("phases-rollback", &rolled);
    assert_eq!(
        rolled["current"]["digest"],
        installed["installed"]["digest"]
    );
    assert_eq!(rolled["rolledBackFrom"], installed2["installed"]["digest"]);
    let forward = env.json(&["phases", "rollforward"], 0);
    check("phases-rollforward", &forward);
    assert_eq!(
        forward["current"]["digest"],
        installed2["installed"]["digest"]
    );
    assert_eq!(
        forward["rolledForwardFrom"],
        installed["installed"]["digest"]
    );
    env.json(&["phases", "rollback"], 0);
    let history = env.json(&["phases", "history"], 0);
    check("phases-history", &history);
    assert_eq!(history["entries"].as_array().map(Vec::len), Some(2));
    assert_eq!(history["current"], installed["installed"]["digest"]);
    // The text form says when, as a time an operator reads (UTC), not unix seconds.
    let at = history["entries"][0]["installedAt"]
        .as_u64()
        .expect("installedAt");
    let text = String::from_utf8_lossy(&env.run(&["phases", "history"]).stdout).into_owned();
    let when = humantime::format_rfc3339_seconds(
        std::time::UNIX_EPOCH + std::time::Duration::from_secs(at),
    );
    assert!(text.contains(&format!("installed at {when}")), "{text}");
    let uninstalled = env.json(&["phases", "uninstall"], 0);
    check("phases-uninstall", &uninstalled);
    assert_eq!(uninstalled["uninstalled"], installed["installed"]["digest"]);
    assert_eq!(env.json(&["phases", "history"], 0)["embeddedCurrent"], true);

    // Errors: one JSON line on stderr, with the exit code.
    for (args, code) in [
        (
            vec!["plan".to_string(), "--phase".into(), "no-such-phase".into()],
            2,
        ),
        (with_key(&["phases", "verify", "/nonexistent"]), 1),
        // phases install: a URL without --sha256, --sha256 with a directory (usage), an
        // unsigned bundle (refused).
        (
            with_key(&["phases", "install", "http://127.0.0.1:9/b.tgz"]),
            2,
        ),
        (
            with_key(&["phases", "install", s(&bundle), "--sha256", &"0".repeat(64)]),
            2,
        ),
        (with_key(&["phases", "install", s(&src)]), 4),
    ] {
        let mut args = args;
        args.extend(["--output".to_string(), "json".to_string()]);
        let out = env.run(&args);
        assert_eq!(out.status.code(), Some(code), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        let err: Value = serde_json::from_str(stderr.lines().last().expect("a line"))
            .unwrap_or_else(|e| panic!("{args:?}: {e}: {stderr}"));
        check("error", &err);
        assert_eq!(err["exitCode"], code);
    }
}

/// Gives `state` the shared compiled-component cache (a link), so a test with a state
/// directory of its own (and so an audit head of its own) compiles nothing twice.
fn share_compiled(state: &Path) {
    let shared = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli-state/compiled");
    std::fs::create_dir_all(&shared).expect("shared cache");
    std::fs::set_permissions(&shared, std::os::unix::fs::PermissionsExt::from_mode(0o700))
        .expect("cache mode");
    std::fs::create_dir_all(state).expect("state");
    std::os::unix::fs::symlink(&shared, state.join("compiled")).expect("link the cache");
}

#[test]
fn audit_records_and_outputs_match_their_schemas() {
    let env = Env::new(true);
    share_compiled(&env.state);
    let plan = env.json(&["plan", "--phase", "setup-host"], 0);
    check("run", &plan);
    let run_id = plan["runId"]
        .as_str()
        .expect("a plan has a run ID")
        .to_string();
    let applied = env.json(&["apply", "--phase", "setup-host"], 0);
    check("run", &applied);

    let log = env.root.join("var/log/nodeward/audit/audit.jsonl");
    let text = std::fs::read_to_string(&log).expect("audit log");
    let mut kinds = std::collections::BTreeSet::new();
    for line in text.lines() {
        let record: Value = serde_json::from_str(line).expect("a record is JSON");
        check("audit-record", &record);
        kinds.insert(record["kind"].as_str().unwrap_or_default().to_string());
    }
    assert_eq!(
        kinds.into_iter().collect::<Vec<_>>(),
        ["call", "phase-end", "run-end", "run-start"]
    );

    let verify = env.json(&["audit", "verify"], 0);
    check("audit-verify", &verify);
    assert_eq!(verify["ok"], true, "{verify:#}");
    let show = env.json(&["audit", "show", "--run", &run_id], 0);
    check("audit-show", &show);
    let records = show["records"].as_array().expect("records");
    assert!(records.len() > 3, "{show:#}");
    assert!(records.iter().all(|r| r["runId"] == run_id.as_str()));
    let summary = env.json(&["audit", "summary"], 0);
    check("audit-summary", &summary);
    assert_eq!(
        summary["runs"].as_array().map(Vec::len),
        Some(2),
        "{summary:#}"
    );

    // A broken trail: exit 1, the same shape, naming the record.
    let mut lines: Vec<&str> = text.lines().collect();
    lines.remove(2);
    std::fs::write(&log, lines.join("\n") + "\n").expect("tamper");
    let broken = env.json(&["audit", "verify"], 1);
    check("audit-verify", &broken);
    assert_eq!(broken["ok"], false);
    assert_eq!(broken["problem"]["line"], 3, "{broken:#}");
}
