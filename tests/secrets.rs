//! Least privilege for secrets, and a phase cannot choose where bytes go (issue 10, section 4).
//!
//! A hostile phase, the `snoop` test guest (built for the production world
//! `download-artifacts`), runs through the real CLI with every input part granted, a write
//! grant on the bootstrap token's secret file and `download.pinned-artifacts`. It tries to get
//! the token out every way it has: stdout, stderr, the log, a plain file (as is, reversed,
//! spaced), a path, a URL, its report, its error. Each run's stdout and stderr (the audit log
//! included), every file of the root but the secret file, and every request the loopback
//! server saw must be free of the token in any of those forms; the secret file must hold it,
//! 0600. The probe guest checks the secret grant call by call.

mod common;

use common::http::{HttpServer, Reply};
use common::{Fixture, err_kind, nodeward, ok, probe, snapshot};
use nodeward::caps::RunContext;
use nodeward::grants::Grants;
use nodeward::hostpath::HostPath;
use nodeward::hostpath::HostRoot;
use nodeward::plan::RunMode;
use nodeward_node_config::input::InputPart;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The token of this test's config: unlike the embedded example's, it appears nowhere else.
const TOKEN: &str = "q7x2mz.k4p9w1r8t3v6y0ub";
/// Its secret half, which alone identifies it.
const SECRET_HALF: &str = "k4p9w1r8t3v6y0ub";
/// What phases get instead.
const REFERENCE: &str = nodeward_node_config::secret::BOOTSTRAP_TOKEN_REF;
/// The secret file of the snoop's bundle (the path of the bootstrap kubeconfig).
const SECRET_FILE: &str = "etc/kubernetes/bootstrap-kubelet.conf";

/// Where in `text` the token's secret half appears, as is, reversed or spaced out (the snoop
/// writes all three, against redaction that matches only the exact string).
fn leak(text: &[u8]) -> Option<&'static str> {
    let text = String::from_utf8_lossy(text);
    let reversed: String = SECRET_HALF.chars().rev().collect();
    let spaced: String = SECRET_HALF
        .chars()
        .map(String::from)
        .collect::<Vec<_>>()
        .join(" ");
    if text.contains(SECRET_HALF) {
        Some("as is")
    } else if text.contains(&reversed) {
        Some("reversed")
    } else if text.contains(&spaced) {
        Some("spaced")
    } else {
        None
    }
}

/// A loopback HTTP server: `/kubelet` redirects to `/blob/kubelet`, which serves `body`;
/// everything else is 404. It keeps every request target it saw.
struct Server {
    http: HttpServer,
}

impl Server {
    fn start(body: Vec<u8>) -> Server {
        let http = HttpServer::start(move |req| match req.target.as_str() {
            "/kubelet" => Reply::redirect("/blob/kubelet"),
            "/blob/kubelet" => Reply::ok(&body),
            _ => Reply::not_found(),
        });
        Server { http }
    }

    fn url(&self, path: &str) -> String {
        self.http.url(path)
    }

    fn requests(&self) -> Vec<String> {
        self.http.requests().into_iter().map(|r| r.target).collect()
    }
}

/// A bundle directory with the snoop as its one phase, granted every input part.
fn snoop_bundle(dir: &Path) -> PathBuf {
    let bundle = dir.join("snoop-bundle");
    std::fs::create_dir_all(&bundle).expect("bundle dir");
    let wasm =
        std::fs::read(nodeward::built::TEST_GUEST_SNOOP_COMPONENT).expect("built snoop guest");
    std::fs::write(bundle.join("snoop.wasm"), &wasm).expect("component");
    let manifest = format!(
        r#"format = 1
[bundle]
name = "snoop"
version = 1

[[phases]]
name = "snoop"
component = "snoop.wasm"
sha256 = "{}"
world = "download-artifacts"

[phases.grants]
input = ["config", "layout", "version", "arch", "artifacts", "restart", "prune", "mounts", "bridge"]

[phases.grants.fs]
write = ["snoop", "{SECRET_FILE}"]

[phases.grants.secrets]
bootstrap-token = ["{SECRET_FILE}"]

[phases.grants.download]
pinned-artifacts = true
"#,
        nodeward::bundle::sha256_hex(&wasm)
    );
    std::fs::write(bundle.join("manifest.toml"), manifest).expect("manifest");
    bundle
}

/// The embedded example config with this test's token and the kubelet pinned on `server`.
fn config(dir: &Path, server: &Server, kubelet: &[u8]) -> PathBuf {
    let text = nodeward::config::EMBEDDED.replace("abcdef.0123456789abcdef", TOKEN);
    assert!(text.contains(TOKEN));
    let text = format!(
        "{text}downloads:\n  kubelet:\n    url: {}\n    sha256: {}\n",
        server.url("/kubelet"),
        nodeward::bundle::sha256_hex(kubelet)
    );
    let path = dir.join("node.yaml");
    std::fs::write(&path, text).expect("config");
    path
}

/// Runs nodeward, requiring exit code `code`; returns stdout and stderr together.
fn run(f: &Fixture, args: &[&str], code: i32) -> Vec<u8> {
    let out = nodeward(f, args);
    let mut all = out.stdout.clone();
    all.extend_from_slice(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(code),
        "{args:?}: {}",
        String::from_utf8_lossy(&all)
    );
    all
}

/// The snoop's results: the first line of its summary in a `--output json` run.
fn results(output: &[u8]) -> Value {
    let text = String::from_utf8_lossy(output);
    let start = text.find('{').expect("json report");
    let report: Value = serde_json::Deserializer::from_str(&text[start..])
        .into_iter()
        .next()
        .expect("one report")
        .expect("report json");
    let summary = report["steps"][0]["summary"].as_str().expect("summary");
    serde_json::from_str(summary.lines().next().unwrap_or_default()).expect("results json")
}

#[test]
fn a_hostile_phase_gets_no_token_out_of_a_run() {
    let f = Fixture::new();
    for dir in ["etc/kubernetes", "snoop"] {
        std::fs::create_dir_all(f.root.join(dir)).expect("dir");
    }
    let kubelet = b"#!/bin/sh\necho kubelet\n".to_vec();
    let server = Server::start(kubelet.clone());
    let bundle = snoop_bundle(f.tmp.path());
    let cfg = config(f.tmp.path(), &server, &kubelet);
    let (bundle, cfg) = (bundle.to_str().expect("utf8"), cfg.to_str().expect("utf8"));
    let outside = snapshot(&f.outside);
    let common = [
        "--phase",
        "snoop",
        "--bundle",
        bundle,
        "--allow-unsigned",
        "--config",
        cfg,
        "--log-level",
        "debug",
    ];
    let args = |mode: &'static str, json: bool| {
        let mut a = vec![mode];
        a.extend(common);
        a.extend(["--log-format", if json { "json" } else { "text" }]);
        if json {
            a.extend(["--output", "json"]);
        }
        a
    };

    // Plan: nothing written; the change list names the secret file, withholds its contents.
    let before = snapshot(&f.root);
    let plan = run(&f, &args("plan", true), 0);
    assert_eq!(
        without_trail(snapshot(&f.root)),
        before,
        "plan touches nothing (but its audit trail)"
    );
    let planned = results(&plan);
    assert_eq!(planned["secret-0644"], "invalid-argument", "{planned}");
    assert_eq!(planned["secret-0600"], "created", "{planned}");
    let text = String::from_utf8_lossy(&plan);
    assert!(
        text.contains(&format!("\"path\": \"{SECRET_FILE}\"")) && text.contains("withheld"),
        "{text}"
    );
    // Nor a digest of it, which could be checked against guesses (issue 26).
    let report: Value = serde_json::Deserializer::from_str(&text[text.find('{').unwrap_or(0)..])
        .into_iter()
        .next()
        .expect("one report")
        .expect("report json");
    let secret_change = report["changes"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["path"] == SECRET_FILE))
        .expect("the secret file's change");
    assert!(secret_change.get("sha256").is_none(), "{secret_change}");

    // Apply, as text and as JSON; then fail on purpose (its error carries what it holds).
    let apply_text = run(&f, &args("apply", false), 0);
    let apply_json = run(&f, &args("apply", true), 0);
    let r = results(&apply_json);
    std::fs::write(f.root.join("snoop/fail"), b"").expect("fail marker");
    let failed = run(&f, &args("apply", false), 1);
    std::fs::remove_file(f.root.join("snoop/fail")).expect("fail marker");

    // Nothing printed or logged holds the token, in any form.
    for (what, out) in [
        ("plan", &plan),
        ("apply (text)", &apply_text),
        ("apply (json)", &apply_json),
        ("failed apply", &failed),
    ] {
        assert_eq!(leak(out), None, "{what} leaked the token");
        let text = String::from_utf8_lossy(out);
        assert!(
            text.contains(REFERENCE),
            "{what}: the snoop printed what it had (the reference), so the check is not vacuous"
        );
        assert!(text.contains("nodeward::audit"), "{what}: audit on stderr");
    }
    assert!(String::from_utf8_lossy(&failed).contains("snoop fails with"));

    // Each way out was refused with a typed error, or carried only the reference.
    assert_eq!(r["secret-0644"], "invalid-argument", "{r}");
    assert_eq!(
        r["secret-0600"], "unchanged",
        "second apply: the substituted bytes equal the disk ({r})"
    );
    let read_back = r["read-back"].as_str().unwrap_or_default();
    assert_eq!(read_back, format!("token: \"{REFERENCE}\"\n"));
    assert_eq!(r["reference-elsewhere"], "denied", "{r}");
    assert_eq!(r["loot-path"], "unchanged", "{r}");
    let fetches = r["fetches"].as_array().expect("fetches");
    let pinned: Vec<&Value> = fetches
        .iter()
        .filter(|f| f.get("pinned").is_some())
        .collect();
    assert_eq!(pinned.len(), 1, "one pinned artifact: {r}");
    assert_eq!(
        pinned[0]["pinned"], "unchanged",
        "fetched on the first apply"
    );
    assert_eq!(pinned[0]["leaky-url"], "denied", "{r}");
    assert_eq!(pinned[0]["other-sha"], "denied", "{r}");
    assert!(
        fetches
            .iter()
            .filter_map(|f| f.get("unpinned"))
            .all(|u| u == "denied"),
        "an artifact without a pinned sha256 is no pinned artifact: {r}"
    );
    assert_eq!(
        server.requests(),
        ["/kubelet", "/blob/kubelet"],
        "only the pinned URL (and where its server redirected it) was requested"
    );

    // No audit record holds it either, in any form; and the records are there (the check is
    // not vacuous): the snoop's write of the secret file, in each mode.
    let trail_dir = f.root.join("var/log/nodeward/audit");
    let mut trail = Vec::new();
    for entry in std::fs::read_dir(&trail_dir).expect("audit trail") {
        let path = entry.expect("entry").path();
        if path.is_file() {
            trail.extend(std::fs::read(&path).expect("audit file"));
        }
    }
    assert_eq!(leak(&trail), None, "the audit trail leaked the token");
    let trail = String::from_utf8_lossy(&trail);
    for mode in ["plan", "apply"] {
        assert!(
            trail
                .lines()
                .any(|l| l.contains("\"call\":\"fs.write-file\"")
                    && l.contains(SECRET_FILE)
                    && l.contains(&format!("\"mode\":\"{mode}\""))),
            "{mode}: the secret file's write is recorded"
        );
    }

    // The secret file holds the token, 0600; no other file holds it in any form.
    let secret = std::fs::read_to_string(f.root.join(SECRET_FILE)).expect("secret file");
    assert_eq!(secret, format!("token: \"{TOKEN}\"\n"));
    let mode = std::fs::metadata(f.root.join(SECRET_FILE))
        .expect("secret file")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    assert_eq!(
        r["loot-file"], "denied",
        "a reference outside its secret file is refused"
    );
    assert!(!f.root.join("snoop/loot").exists());
    assert_eq!(r["scrubbed-loot-file"], "unchanged", "{r}");
    let loot = std::fs::read(f.root.join("snoop/loot-scrubbed")).expect("loot file");
    let loot = String::from_utf8_lossy(&loot);
    assert!(
        loot.contains("\"bootstrapToken\":\"REF\"") && loot.contains("schemaVersion"),
        "the snoop wrote what it held: {loot}"
    );
    assert!(
        f.root.join(format!("snoop/t={REFERENCE}")).exists(),
        "the path the snoop made carries the reference"
    );
    assert!(!f.root.join("snoop/ref.conf").exists());
    for (path, (_, _, contents)) in snapshot(&f.root) {
        if path != SECRET_FILE {
            assert_eq!(leak(&contents), None, "{path} holds the token");
            assert_eq!(leak(path.as_bytes()), None, "a path holds the token");
        }
    }
    assert_eq!(snapshot(&f.outside), outside);
}

/// `tree` without the audit trail every run writes beneath the root (`var/log/nodeward`, and
/// the directories it made).
fn without_trail(
    mut tree: BTreeMap<String, (char, u32, Vec<u8>)>,
) -> BTreeMap<String, (char, u32, Vec<u8>)> {
    tree.retain(|p, _| p != "var" && p != "var/log" && !p.starts_with("var/log/nodeward"));
    tree
}

/// A session that knows [`TOKEN`] as the CLI's would.
fn session(root: &Path, mode: RunMode) -> Arc<RunContext> {
    let mut config = nodeward::config::load(None).expect("config");
    config.kubelet.auth.bootstrap_token = nodeward_node_config::Secret::new(TOKEN);
    let mut s = RunContext::new(
        HostRoot::open(root).expect("root"),
        mode,
        nodeward::audit::Redactor::new(config.secrets()),
    );
    s.secrets = nodeward::secrets::Secrets::from_config(&config);
    Arc::new(s)
}

fn secret_grants() -> Grants {
    common::grants(&format!(
        r#"
        [fs]
        write = ["etc/kubernetes", "snoop"]
        [secrets]
        bootstrap-token = ["{SECRET_FILE}"]
        "#
    ))
}

fn write(path: &str, contents: &str, mode: u32) -> Value {
    json!({ "op": "fs.write-file", "path": path, "contents": contents, "mode": mode })
}

#[test]
fn the_host_writes_a_secret_only_into_a_granted_0600_file() {
    let f = Fixture::new();
    for dir in ["etc/kubernetes", "snoop"] {
        std::fs::create_dir_all(f.root.join(dir)).expect("dir");
    }
    let kubeconfig = format!("token: {REFERENCE}\n");
    let s = session(&f.root, RunMode::Apply);
    let before = snapshot(&f.root);
    let refused = probe(
        &s,
        secret_grants(),
        json!([
            write(SECRET_FILE, &kubeconfig, 0o644),
            write(SECRET_FILE, &kubeconfig, 0o640),
            write("snoop/kubeconfig", &kubeconfig, 0o600),
            write("etc/kubernetes/kubelet.conf", &kubeconfig, 0o600),
        ]),
    );
    let kinds: Vec<&str> = refused.iter().map(err_kind).collect();
    assert_eq!(
        kinds,
        ["invalid-argument", "invalid-argument", "denied", "denied"]
    );
    assert_eq!(snapshot(&f.root), before, "a refused write touches nothing");
    let without_grant = probe(
        &s,
        common::grants("[fs]\nwrite = [\"etc/kubernetes\"]"),
        json!([write(SECRET_FILE, &kubeconfig, 0o600)]),
    );
    assert_eq!(err_kind(&without_grant[0]), "denied");
    assert!(
        without_grant[0]["err"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("secrets.bootstrap-token")),
        "{without_grant:?}"
    );
    assert_eq!(snapshot(&f.root), before);

    let done = probe(
        &s,
        secret_grants(),
        json!([
            write(SECRET_FILE, &kubeconfig, 0o600),
            write(SECRET_FILE, &kubeconfig, 0o600),
            { "op": "fs.read-file", "path": SECRET_FILE },
            write("snoop/plain", "no secret here", 0o644),
        ]),
    );
    assert_eq!(ok(&done[0]), "created");
    assert_eq!(
        ok(&done[1]),
        "unchanged",
        "idempotent: compared after substitution"
    );
    assert_eq!(
        ok(&done[2]),
        kubeconfig.as_str(),
        "read back as the reference"
    );
    assert_eq!(ok(&done[3]), "created");
    assert_eq!(
        std::fs::read_to_string(f.root.join(SECRET_FILE)).expect("file"),
        format!("token: {TOKEN}\n")
    );
    let audit: Vec<_> = s
        .audit
        .records()
        .into_iter()
        .filter(|r| r.call == "fs.write-file" && r.args.get("secrets").is_some())
        .collect();
    assert_eq!(audit.len(), 7, "each write of a reference names the secret");
    assert!(
        audit
            .iter()
            .all(|r| r.args["secrets"] == json!(["bootstrap-token"]))
    );

    // Plan: the change is recorded, its contents withheld, nothing written.
    let g = Fixture::new();
    std::fs::create_dir_all(g.root.join("etc/kubernetes")).expect("dir");
    let plan = session(&g.root, RunMode::Plan);
    let before = snapshot(&g.root);
    let planned = probe(
        &plan,
        secret_grants(),
        json!([write(SECRET_FILE, &kubeconfig, 0o600), { "op": "fs.read-file", "path": SECRET_FILE }]),
    );
    assert_eq!(ok(&planned[0]), "created");
    assert_eq!(
        ok(&planned[1]),
        kubeconfig.as_str(),
        "the overlay reads back masked"
    );
    assert_eq!(snapshot(&g.root), before);
    let changes = serde_json::to_string(&plan.changes()).expect("changes");
    assert!(
        changes.contains("withheld") && leak(changes.as_bytes()).is_none(),
        "{changes}"
    );
}

#[test]
fn the_default_bundle_gives_the_config_to_configure_only_and_pins_downloads() {
    let bundle = nodeward::bundle::Bundle::embedded().expect("bundle");
    let mut inputs = BTreeMap::new();
    for p in &bundle.manifest.phases {
        inputs.insert(p.name.as_str(), p.grants.input.clone());
        // The host renders the bootstrap kubeconfig itself (tests/bootstrap_kubeconfig.rs).
        assert!(
            p.grants.secrets.bootstrap_token.is_empty(),
            "{}: no secret file",
            p.name
        );
        assert!(
            p.grants.download.urls.is_empty(),
            "{}: no phase-chosen URL",
            p.name
        );
        assert_eq!(
            p.grants.download.pinned_artifacts,
            p.name == "download-artifacts",
            "{}",
            p.name
        );
    }
    use InputPart::*;
    let expected: BTreeMap<&str, Vec<InputPart>> = [
        ("preflight", vec![]),
        ("setup-host", vec![]),
        ("download-artifacts", vec![Version, Artifacts]),
        ("install", vec![Version, Prune]),
        ("configure", vec![Config, Layout, BootstrapKubeconfig]),
        ("start-node", vec![Layout, Restart]),
        ("stop-node", vec![]),
        ("teardown", vec![Layout, Mounts, Bridge]),
    ]
    .into_iter()
    .collect();
    assert_eq!(inputs, expected);
}

/// Grants parsed and validated as a manifest's are.
fn parse_grants(text: &str) -> Result<Grants, String> {
    let g: Grants = toml::from_str(text).map_err(|e| e.to_string())?;
    g.validate().map_err(|e| e.to_string())?;
    Ok(g)
}

#[test]
fn a_secret_file_is_exact_and_writable() {
    let g = parse_grants(
        r#"
        input = ["config", "layout"]
        [fs]
        write = ["etc/kubernetes"]
        [secrets]
        bootstrap-token = ["etc/kubernetes/bootstrap-kubelet.conf"]
        "#,
    )
    .expect("valid");
    assert_eq!(g.input, [InputPart::Config, InputPart::Layout]);
    let p = |s| HostPath::parse(s).expect("path");
    assert!(g.may_receive_secret(
        "bootstrap-token",
        &p("etc/kubernetes/bootstrap-kubelet.conf")
    ));
    assert!(
        !g.may_receive_secret("bootstrap-token", &p("etc/kubernetes")),
        "exact files, not prefixes"
    );
    assert!(!g.may_receive_secret("bootstrap-token", &p("etc/kubernetes/other.conf")));
    assert!(!g.may_receive_secret("other", &p("etc/kubernetes/bootstrap-kubelet.conf")));
    assert!(!Grants::default().may_receive_secret("bootstrap-token", &p("etc/x")));

    let outside = parse_grants(
        r#"
        [secrets]
        bootstrap-token = ["etc/kubernetes/bootstrap-kubelet.conf"]
        "#,
    )
    .expect_err("a secret file the phase cannot write");
    assert!(outside.contains("secrets.bootstrap-token"), "{outside}");
    for bad in [
        "[secrets]\nssh-key = [\"etc/x\"]",
        "input = [\"token\"]",
        "[download]\npinned-artifacts = \"yes\"",
    ] {
        assert!(parse_grants(bad).is_err(), "{bad} must refuse the bundle");
    }
    assert!(
        parse_grants("[download]\npinned-artifacts = true")
            .expect("flag")
            .download
            .pinned_artifacts
    );
}
