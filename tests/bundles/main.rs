//! Signed, digest-pinned, swappable bundles, through the built binary: pack, sign, verify,
//! install, rollback, inspect and diff; every refusal leaves the current bundle in place
//! (exit 4, or 5 for wider grants not accepted); install survives a crash between precompile
//! and switch. `url`: install from an http(s) URL pinned by sha256, against a real HTTP server
//! on 127.0.0.1, and consent by digest. `oci`: install from an `oci://` reference pinned by
//! sha256, against a real registry on 127.0.0.1 (`registry`: Debian's `docker-registry`).
//! `tls`: both over HTTPS from a private CA, trusted through the node config's
//! `downloadOptions.caFile` only. `crash`: `phases install` killed at every write of the audit
//! trail, its head and the history, and by SIGKILL at random moments, leaves true records.
//!
//! Keys are generated here with the `minisign` crate; no secret key is committed. Each test
//! has its own state directory, trusted key and host root under a temporary directory.

#[path = "../common/mod.rs"]
mod common;

mod crash;
mod oci;
mod registry;
mod tls;
mod url;

use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Generous grants for the shipped setup-host phase, so its plan succeeds.
const SETUP_GRANTS: &str = r#"
[phases.grants.fs]
write = ["etc", "opt", "var"]
[phases.grants.kernel]
modules = ["overlay", "br_netfilter"]
sysctls = ["net.*"]
swap-off = true
"#;

/// Grants for the shipped configure phase: its input (the path of the bootstrap kubeconfig the
/// host renders among it) and its files.
const CONFIGURE_GRANTS: &str = r#"
[phases.grants]
input = ["config", "layout", "bootstrap-kubeconfig"]
[phases.grants.fs]
write = ["etc", "var"]
"#;

/// One phase of a source directory: (name, component path, world, grants TOML).
type Phase<'a> = (&'a str, &'a str, &'a str, &'a str);

/// A temporary workspace: host root, state directory, one trusted key pair.
struct Env {
    tmp: tempfile::TempDir,
    root: PathBuf,
    state: PathBuf,
    public: PathBuf,
    secret: PathBuf,
}

/// Writes a minisign key pair as `<stem>.pub` and `<stem>.key` in `dir`.
fn keypair(dir: &Path, stem: &str) -> (PathBuf, PathBuf) {
    let kp = minisign::KeyPair::generate_unencrypted_keypair().expect("keypair");
    let public = dir.join(format!("{stem}.pub"));
    let secret = dir.join(format!("{stem}.key"));
    std::fs::write(&public, kp.pk.to_box().expect("pk box").to_string()).expect("write pub");
    std::fs::write(&secret, kp.sk.to_box(None).expect("sk box").to_string()).expect("write key");
    // Trusted keys must not be writable by group or others, whatever the umask.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&public, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    (public, secret)
}

impl Env {
    fn new() -> Self {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path().join("root");
        let state = tmp.path().join("state");
        std::fs::create_dir_all(&root).expect("root");
        let (public, secret) = keypair(tmp.path(), "platform");
        Env {
            tmp,
            root,
            state,
            public,
            secret,
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.tmp.path().join(name)
    }

    /// Runs nodeward with this env's state dir, root and trusted key, plus `extra_env`. The
    /// root and state dir go through the environment and the key only to the commands that
    /// check signatures: nodeward refuses a flag that does not apply to the command.
    fn run_env(&self, args: &[&str], extra_env: &[(&str, &str)]) -> Output {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_nodeward"));
        cmd.args(args);
        if !matches!(
            args,
            [
                "phases",
                "pack"
                    | "export"
                    | "sign"
                    | "rollback"
                    | "rollforward"
                    | "history"
                    | "uninstall"
                    | "diff",
                ..
            ] | ["audit", ..]
        ) {
            cmd.arg("--trusted-key").arg(&self.public);
        }
        cmd.env("NODEWARD_ROOT", &self.root)
            .env("NODEWARD_STATE_DIR", &self.state)
            .env_remove("NODEWARD_LOG")
            .env_remove("NODEWARD_TEST_ABORT")
            .env_remove("NODEWARD_BUNDLE");
        for (k, v) in extra_env {
            cmd.env(k, v);
        }
        cmd.output().expect("run nodeward")
    }

    fn run(&self, args: &[&str]) -> Output {
        self.run_env(args, &[])
    }

    /// Runs and requires exit code 0.
    fn ok(&self, args: &[&str]) -> Output {
        let out = self.run(args);
        assert_eq!(
            out.status.code(),
            Some(0),
            "nodeward {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    /// Writes a source directory `name` (manifest without digests, components), packs it into
    /// `out_name` and, when `sign`, signs it with the trusted key. Returns the bundle path.
    fn bundle(&self, out_name: &str, version: u64, phases: &[Phase<'_>], sign: bool) -> PathBuf {
        let src = self.path(&format!("{out_name}-src"));
        std::fs::create_dir_all(&src).expect("src dir");
        let mut manifest = format!("format = 1\n[bundle]\nname = \"test\"\nversion = {version}\n");
        for (name, component, world, grants) in phases {
            let file = format!("{name}.wasm");
            std::fs::copy(component, src.join(&file)).expect("copy component");
            manifest.push_str(&format!(
                "\n[[phases]]\nname = \"{name}\"\ncomponent = \"{file}\"\nworld = \"{world}\"\n{grants}"
            ));
        }
        std::fs::write(src.join("manifest.toml"), manifest).expect("manifest");
        let out = self.path(out_name);
        self.ok(&["phases", "pack", s(&src), "-o", s(&out)]);
        if sign {
            self.ok(&["phases", "sign", s(&out), "--key", s(&self.secret)]);
        }
        out
    }

    /// Where `current` (or `last-good`) points, if anywhere.
    fn link(&self, name: &str) -> Option<String> {
        std::fs::read_link(self.state.join("bundles").join(name))
            .ok()
            .map(|t| t.to_string_lossy().into_owned())
    }

    /// The digest `phases verify` reports.
    fn digest(&self, bundle: &Path) -> String {
        let out = self.ok(&["phases", "verify", s(bundle), "--output", "json"]);
        let v: Value = serde_json::from_slice(&out.stdout).expect("verify json");
        v["bundle"]["digest"].as_str().expect("digest").to_string()
    }

    /// `plan --phase P... --output json`.
    fn plan_phases(&self, phases: &[&str]) -> Value {
        let mut args = vec!["plan", "--output", "json"];
        for p in phases {
            args.extend(["--phase", p]);
        }
        let out = self.ok(&args);
        serde_json::from_slice(&out.stdout).expect("plan json")
    }
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn setup_phase() -> Phase<'static> {
    (
        "setup-host",
        nodeward::built::PHASE_SETUP_HOST_COMPONENT,
        "setup-host",
        SETUP_GRANTS,
    )
}

fn configure_phase() -> Phase<'static> {
    (
        "configure",
        nodeward::built::PHASE_CONFIGURE_COMPONENT,
        "configure",
        CONFIGURE_GRANTS,
    )
}

fn phase_names(plan: &Value) -> Vec<String> {
    plan["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .map(|p| p["name"].as_str().unwrap_or_default().to_string())
        .collect()
}

#[test]
fn pack_sign_verify_install_run_upgrade_rollback() {
    let env = Env::new();
    // Nothing installed: the embedded bundle runs, and plan says so.
    let before = env.plan_phases(&["setup-host"]);
    assert_eq!(before["bundle"]["source"], "embedded default bundle");

    let v1 = env.bundle("v1.tar.gz", 1, &[setup_phase()], true);
    let d1 = env.digest(&v1);
    let out = env.ok(&[
        "phases",
        "install",
        s(&v1),
        "--allow-incomplete",
        "--accept-new-grants",
    ]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("installed test v1"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(env.link("current").as_deref(), Some(d1.as_str()));
    assert_eq!(env.link("last-good"), None);

    // plan runs the installed bundle's phase and names it.
    let plan = env.plan_phases(&["setup-host"]);
    assert_eq!(plan["bundle"]["name"], "test");
    assert_eq!(plan["bundle"]["version"], 1);
    assert_eq!(plan["bundle"]["digest"], d1.as_str());
    assert!(
        plan["bundle"]["source"]
            .as_str()
            .unwrap_or_default()
            .starts_with("installed bundle "),
        "{}",
        plan["bundle"]
    );
    assert_eq!(phase_names(&plan), ["setup-host"]);
    assert_eq!(plan["error"], Value::Null);
    let text = env.ok(&["plan", "--phase", "setup-host"]);
    let first = String::from_utf8_lossy(&text.stdout)
        .lines()
        .next()
        .unwrap_or_default()
        .to_string();
    assert!(
        first.contains("installed bundle")
            && first.contains("test v1")
            && first.contains(&d1[..16]),
        "{first}"
    );

    // A second, higher version with one more phase (wider: needs --accept-new-grants).
    let v2 = env.bundle("v2", 2, &[setup_phase(), configure_phase()], true);
    let d2 = env.digest(&v2);
    env.ok(&[
        "phases",
        "install",
        s(&v2),
        "--allow-incomplete",
        "--accept-new-grants",
    ]);
    assert_eq!(env.link("current").as_deref(), Some(d2.as_str()));
    assert_eq!(env.link("last-good").as_deref(), Some(d1.as_str()));
    let plan = env.plan_phases(&["setup-host", "configure"]);
    assert_eq!(plan["bundle"]["digest"], d2.as_str());
    assert_eq!(phase_names(&plan), ["setup-host", "configure"]);

    // Installing the current bundle again changes nothing.
    env.ok(&["phases", "install", s(&v2), "--allow-incomplete"]);
    assert_eq!(env.link("last-good").as_deref(), Some(d1.as_str()));

    // A rollback that must land on another bundle than it would changes nothing.
    for wrong in [d2.as_str(), "embedded"] {
        let refused = env.run(&["phases", "rollback", "--expect", wrong]);
        assert_eq!(refused.status.code(), Some(1), "{}", stderr(&refused));
        assert!(stderr(&refused).contains("not "), "{}", stderr(&refused));
        assert_eq!(env.link("current").as_deref(), Some(d2.as_str()));
    }
    // Rollback: the first bundle's phase runs again.
    env.ok(&["phases", "rollback", "--expect", &d1]);
    assert_eq!(env.link("current").as_deref(), Some(d1.as_str()));
    let plan = env.plan_phases(&["setup-host"]);
    assert_eq!(plan["bundle"]["digest"], d1.as_str());
    assert_eq!(phase_names(&plan), ["setup-host"]);
    assert_eq!(plan["error"], Value::Null);

    // The second rollback goes to the embedded bundle, which plan then runs.
    let out = env.ok(&["phases", "rollback"]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("rolled back to the embedded bundle"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(env.link("current"), None);
    assert_eq!(env.link("last-good"), None);
    let plan = env.plan_phases(&["setup-host"]);
    assert_eq!(plan["bundle"]["source"], "embedded default bundle");

    // Then there is nothing to roll back to.
    let again = env.run(&["phases", "rollback"]);
    assert_eq!(again.status.code(), Some(1));
    assert!(
        stderr(&again)
            .contains("the embedded bundle runs already; there is nothing to roll back to"),
        "{}",
        stderr(&again)
    );
    assert_eq!(env.link("current"), None);

    // The audit trail holds each change of the store, in order, and every plan of the
    // installed bundles' phases, named by their digest; the trail verifies.
    let show = env.ok(&["audit", "show", "--output", "json"]);
    let show: Value = serde_json::from_slice(&show.stdout).expect("audit show");
    let records = show["records"].as_array().expect("records");
    let changes: Vec<(String, Value, Value)> = records
        .iter()
        .filter(|r| r["kind"] == "bundle")
        .map(|r| {
            (
                r["action"].as_str().unwrap_or_default().to_string(),
                r["current"]["digest"].clone(),
                r["from"].clone(),
            )
        })
        .collect();
    assert_eq!(
        changes,
        [
            ("install".to_string(), json!(d1), Value::Null),
            ("install".to_string(), json!(d2), json!(d1)),
            ("rollback".to_string(), json!(d1), json!(d2)),
            ("rollback".to_string(), Value::Null, json!(d1)),
        ]
    );
    let of_v2 = env.ok(&["audit", "show", "--bundle", &d2[..12], "--output", "json"]);
    let of_v2: Value = serde_json::from_slice(&of_v2.stdout).expect("audit show");
    assert!(
        of_v2["records"]
            .as_array()
            .is_some_and(|r| r.iter().any(|r| r["phase"] == "configure")),
        "{of_v2:#}"
    );
    env.ok(&["audit", "verify"]);
}

/// `phases history --output json`.
fn history(env: &Env) -> Value {
    let out = env.ok(&["phases", "history", "--output", "json"]);
    serde_json::from_slice(&out.stdout).expect("history json")
}

#[test]
fn history_rollback_walks_back_and_uninstall_keeps_the_history() {
    let env = Env::new();
    let h = history(&env);
    assert_eq!(h["entries"], json!([]));
    assert_eq!(h["embeddedCurrent"], true);
    let text = env.ok(&["phases", "history"]);
    assert!(
        String::from_utf8_lossy(&text.stdout).contains("no installs: the embedded bundle runs")
    );

    let mut digests = Vec::new();
    for v in 1..=3 {
        let b = env.bundle(&format!("v{v}"), v, &[setup_phase()], true);
        digests.push(env.digest(&b));
        let out = env.ok(&[
            "phases",
            "install",
            s(&b),
            "--allow-incomplete",
            "--accept-new-grants",
        ]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if v == 1 {
            assert!(
                text.contains("last-good: none (the embedded bundle)"),
                "{text}"
            );
        } else {
            assert!(text.contains(&digests[v as usize - 2]), "{text}");
        }
    }
    let h = history(&env);
    let entries = h["entries"].as_array().expect("entries");
    assert_eq!(entries.len(), 3);
    for (e, d) in entries.iter().zip(&digests) {
        assert_eq!(e["digest"], d.as_str());
        assert_eq!(e["name"], "test");
        assert_eq!(e["rolledBack"], false);
        assert!(e["installedAt"].as_u64().is_some_and(|t| t > 0), "{e}");
    }
    assert_eq!(entries[2]["current"], true);
    assert_eq!(h["current"], digests[2].as_str());
    assert_eq!(h["lastGood"], digests[1].as_str());

    // Rollback walks back one entry at a time; last-good follows.
    env.ok(&["phases", "rollback"]);
    assert_eq!(env.link("current").as_deref(), Some(digests[1].as_str()));
    assert_eq!(env.link("last-good").as_deref(), Some(digests[0].as_str()));
    env.ok(&["phases", "rollback"]);
    assert_eq!(env.link("current").as_deref(), Some(digests[0].as_str()));
    assert_eq!(env.link("last-good"), None);
    let h = history(&env);
    assert_eq!(h["entries"][2]["rolledBack"], true);
    assert_eq!(h["entries"][1]["rolledBack"], true);
    assert_eq!(h["entries"][0]["current"], true);
    assert_eq!(h["lastGood"], Value::Null);

    // Roll forward undoes the rollbacks one at a time (their bundles were kept for it), then
    // has nowhere to go.
    let out = env.ok(&["phases", "rollforward", "--output", "json"]);
    let v: Value = serde_json::from_slice(&out.stdout).expect("rollforward json");
    assert_eq!(v["current"]["digest"], digests[1].as_str());
    assert_eq!(v["rolledForwardFrom"], digests[0].as_str());
    let out = env.ok(&["phases", "rollforward"]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("rolled forward to test v3"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(env.link("current").as_deref(), Some(digests[2].as_str()));
    assert_eq!(env.link("last-good").as_deref(), Some(digests[1].as_str()));
    assert_eq!(history(&env)["entries"][2]["rolledBack"], false);
    let rf = env.run(&["phases", "rollforward"]);
    assert_eq!(rf.status.code(), Some(1), "{}", stderr(&rf));
    assert!(
        stderr(&rf).contains("nothing to roll forward to"),
        "{}",
        stderr(&rf)
    );
    env.ok(&["phases", "rollback"]);
    env.ok(&["phases", "rollback"]);
    assert_eq!(env.link("current").as_deref(), Some(digests[0].as_str()));

    // A new install after rollbacks: its previous entry is the one that ran, not a rolled-back one.
    let v4 = env.bundle("v4", 4, &[setup_phase()], true);
    let d4 = env.digest(&v4);
    env.ok(&["phases", "install", s(&v4), "--allow-incomplete"]);
    assert_eq!(env.link("last-good").as_deref(), Some(digests[0].as_str()));
    let text = env.ok(&["phases", "history"]);
    let text = String::from_utf8_lossy(&text.stdout).into_owned();
    assert!(
        text.contains("rolled back") && text.contains("current"),
        "{text}"
    );

    // Uninstall: the embedded bundle runs, the history stays, and rollback has nowhere to go.
    let out = env.ok(&["phases", "uninstall"]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&format!("uninstalled {d4}")),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(env.link("current"), None);
    assert_eq!(env.link("last-good"), None);
    assert_eq!(
        env.plan_phases(&["setup-host"])["bundle"]["source"],
        "embedded default bundle"
    );
    let h = history(&env);
    assert_eq!(h["entries"].as_array().map(Vec::len), Some(4));
    assert_eq!(h["embeddedCurrent"], true);
    let again = env.ok(&["phases", "uninstall"]);
    assert!(String::from_utf8_lossy(&again.stdout).contains("runs already"));
    let rb = env.run(&["phases", "rollback"]);
    assert_eq!(rb.status.code(), Some(1), "{}", stderr(&rb));
    // Roll forward after an uninstall: back to what ran.
    env.ok(&["phases", "rollforward"]);
    assert_eq!(env.link("current").as_deref(), Some(d4.as_str()));
    assert_eq!(env.link("last-good").as_deref(), Some(digests[0].as_str()));
}

#[test]
fn install_refuses_a_bundle_missing_pipeline_phases_unless_allowed() {
    let env = Env::new();
    let one = env.bundle("one.tgz", 1, &[setup_phase()], true);
    let err = refused(
        &env,
        "incomplete",
        &["phases", "install", s(&one), "--accept-new-grants"],
        "lacks phases the node pipelines need",
    );
    for needle in [
        "bootstrap needs preflight, download-artifacts, install, configure, start-node",
        "upgrade needs download-artifacts, stop-node, install, configure, start-node",
        "reset needs teardown",
        "--allow-incomplete",
    ] {
        assert!(err.contains(needle), "{needle:?} in {err}");
    }
    assert_eq!(env.link("current"), None);
    env.ok(&[
        "phases",
        "install",
        s(&one),
        "--allow-incomplete",
        "--accept-new-grants",
    ]);
    assert!(env.link("current").is_some());
}

/// `phases install`'s exit code for a refused bundle.
const REFUSED: i32 = 4;
/// `phases install`'s exit code for wider grants that were not accepted.
const NOT_ACCEPTED: i32 = 5;

/// Asserts `args` exits [`REFUSED`] with `needle` in stderr and leaves `current` and
/// `last-good` as they were.
fn refused(env: &Env, what: &str, args: &[&str], needle: &str) -> String {
    refused_with(env, REFUSED, what, args, needle)
}

/// Asserts `args` exits `code` with `needle` in stderr and leaves `current` and `last-good`
/// as they were.
fn refused_with(env: &Env, code: i32, what: &str, args: &[&str], needle: &str) -> String {
    let (current, last_good) = (env.link("current"), env.link("last-good"));
    let out = env.run(args);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(code), "{what}: {err}");
    assert!(
        err.contains(needle),
        "{what}: expected {needle:?} in: {err}"
    );
    assert_eq!(env.link("current"), current, "{what}: current changed");
    assert_eq!(
        env.link("last-good"),
        last_good,
        "{what}: last-good changed"
    );
    err
}

#[test]
fn every_refusal_leaves_the_current_bundle_in_place() {
    let env = Env::new();
    let base = env.bundle("base", 5, &[setup_phase()], true);
    env.ok(&[
        "phases",
        "install",
        s(&base),
        "--allow-incomplete",
        "--accept-new-grants",
    ]);
    let current = env.link("current").expect("installed");

    // Unsigned.
    let unsigned = env.bundle("unsigned", 6, &[setup_phase()], false);
    refused(
        &env,
        "unsigned",
        &["phases", "install", s(&unsigned), "--allow-incomplete"],
        "unsigned",
    );

    // Signed by a key that is not trusted.
    let (_, other_secret) = keypair(env.tmp.path(), "other");
    let untrusted = env.bundle("untrusted", 6, &[setup_phase()], false);
    env.ok(&["phases", "sign", s(&untrusted), "--key", s(&other_secret)]);
    refused(
        &env,
        "untrusted key",
        &["phases", "install", s(&untrusted), "--allow-incomplete"],
        "which is not trusted",
    );

    // A component changed after signing.
    let tampered = env.bundle("tampered", 6, &[setup_phase()], true);
    let wasm = tampered.join("setup-host.wasm");
    let mut bytes = std::fs::read(&wasm).expect("read");
    bytes.extend_from_slice(&[0, 4, 3, b'n', b'w', b'x']);
    std::fs::write(&wasm, bytes).expect("tamper");
    let err = refused(
        &env,
        "digest mismatch",
        &["phases", "install", s(&tampered), "--allow-incomplete"],
        "setup-host.wasm has sha256",
    );
    assert!(err.contains("the manifest pins"), "{err}");

    // The manifest changed after signing.
    let edited = env.bundle("edited", 6, &[setup_phase()], true);
    let m = edited.join("manifest.toml");
    let text = std::fs::read_to_string(&m).expect("manifest");
    std::fs::write(&m, text.replace("\"var\"]", "\"var\", \"usr\"]")).expect("edit");
    refused(
        &env,
        "edited manifest",
        &["phases", "install", s(&edited), "--allow-incomplete"],
        "does not verify",
    );

    // Truncated archives, plain and gzip.
    for name in ["trunc.tar", "trunc.tar.gz"] {
        let archive = env.bundle(name, 6, &[setup_phase()], true);
        let bytes = std::fs::read(&archive).expect("archive");
        for cut in [bytes.len() / 2, bytes.len() - 1024] {
            std::fs::write(&archive, &bytes[..cut]).expect("truncate");
            refused(
                &env,
                name,
                &["phases", "install", s(&archive), "--allow-incomplete"],
                "truncated",
            );
        }
    }

    // A component whose imports exceed its declared world (the probe, declared configure).
    let sneaky = env.bundle(
        "sneaky",
        6,
        &[
            setup_phase(),
            (
                "sneaky",
                nodeward::built::TEST_GUEST_PROBE_COMPONENT,
                "configure",
                "",
            ),
        ],
        true,
    );
    let err = refused(
        &env,
        "imports beyond world",
        &[
            "phases",
            "install",
            s(&sneaky),
            "--allow-incomplete",
            "--accept-new-grants",
        ],
        "which world configure does not allow",
    );
    assert!(err.contains("phase sneaky"), "{err}");

    // A lower version, without --allow-downgrade.
    let lower = env.bundle("lower", 4, &[setup_phase()], true);
    refused(
        &env,
        "lower version",
        &["phases", "install", s(&lower), "--allow-incomplete"],
        "--allow-downgrade",
    );

    // Wider grants without --accept-new-grants (stdin is not a terminal): the widening is shown.
    let wider_grants = SETUP_GRANTS.replace("\"var\"]", "\"var\", \"usr/local\"]");
    let wider = env.bundle(
        "wider",
        6,
        &[(
            "setup-host",
            nodeward::built::PHASE_SETUP_HOST_COMPONENT,
            "setup-host",
            &wider_grants,
        )],
        true,
    );
    let err = refused_with(
        &env,
        NOT_ACCEPTED,
        "wider grants",
        &["phases", "install", s(&wider), "--allow-incomplete"],
        "--accept-new-grants",
    );
    assert!(err.contains("+ grant fs.write usr/local"), "{err}");

    // A signature of an unknown format version, by the trusted key.
    let v2sig = env.bundle("v2sig", 6, &[setup_phase()], false);
    let manifest = std::fs::read(v2sig.join("manifest.toml")).expect("manifest");
    let sk = minisign::SecretKey::from_unencrypted_box(
        minisign::SecretKeyBox::from_string(&std::fs::read_to_string(&env.secret).expect("secret"))
            .expect("box"),
    )
    .expect("secret key");
    let sig = minisign::sign(
        None,
        &sk,
        manifest.as_slice(),
        Some("nodeward-bundle-signature v2 test 6"),
        None,
    )
    .expect("sign");
    std::fs::write(v2sig.join("manifest.toml.minisig"), sig.to_string()).expect("sig");
    refused(
        &env,
        "unknown signature version",
        &["phases", "install", s(&v2sig), "--allow-incomplete"],
        "signature format \"v2\" is not supported",
    );
    // minisign's default trusted comment is not a nodeward signature either.
    let sig = minisign::sign(None, &sk, manifest.as_slice(), None, None).expect("sign");
    std::fs::write(v2sig.join("manifest.toml.minisig"), sig.to_string()).expect("sig");
    refused(
        &env,
        "plain minisign comment",
        &["phases", "install", s(&v2sig), "--allow-incomplete"],
        "is not a nodeward bundle signature",
    );
    // A signature for another name or version of the bundle.
    let sig = minisign::sign(
        None,
        &sk,
        manifest.as_slice(),
        Some("nodeward-bundle-signature v1 test 7"),
        None,
    )
    .expect("sign");
    std::fs::write(v2sig.join("manifest.toml.minisig"), sig.to_string()).expect("sig");
    refused(
        &env,
        "comment mismatch",
        &["phases", "install", s(&v2sig), "--allow-incomplete"],
        "signs bundle test version 7",
    );

    // After all that, the original bundle is still what runs.
    assert_eq!(env.link("current").as_deref(), Some(current.as_str()));
    let plan = env.plan_phases(&["setup-host"]);
    assert_eq!(plan["bundle"]["digest"], current.as_str());

    // And --allow-downgrade does install the lower version.
    env.ok(&[
        "phases",
        "install",
        s(&lower),
        "--allow-incomplete",
        "--allow-downgrade",
    ]);
    assert_eq!(env.link("last-good").as_deref(), Some(current.as_str()));
}

/// Issue 26: a signed bundle granted the agent's own unit under any of its unit-directory
/// spellings (the unit in `etc` or `run`, its drop-in directory, the link that starts it at
/// boot, another case) is refused by `phases install`, naming the entry; run by `--bundle`, it
/// loads with a warning naming it, and its calls there are denied (`tests/reserved_units.rs`).
#[test]
fn install_refuses_a_grant_on_the_agents_unit_in_any_unit_directory() {
    let env = Env::new();
    for (i, entry) in [
        "etc/systemd/system/nodeward.service",
        "etc/systemd/system/nodeward.service.d",
        "run/systemd/system/nodeward.service",
        "usr/lib/systemd/system/NodeWard.service",
        "etc/systemd/system/multi-user.target.wants/nodeward.service",
    ]
    .iter()
    .enumerate()
    {
        let grants = SETUP_GRANTS.replace("\"var\"]", &format!("\"var\", \"{entry}\"]"));
        let phase = (
            "setup-host",
            nodeward::built::PHASE_SETUP_HOST_COMPONENT,
            "setup-host",
            grants.as_str(),
        );
        let bundle = env.bundle(&format!("units-{i}"), 1, &[phase], true);
        let err = refused(
            &env,
            entry,
            &[
                "phases",
                "install",
                s(&bundle),
                "--allow-incomplete",
                "--accept-new-grants",
            ],
            "reserved to the agent",
        );
        assert!(err.contains(entry), "{entry}: {err}");
        assert_eq!(env.link("current"), None, "{entry}: nothing installed");
        if i == 0 {
            let out = env.ok(&["plan", "--phase", "setup-host", "--bundle", s(&bundle)]);
            let warned = stderr(&out);
            assert!(
                warned.contains(entry) && warned.contains("every call there is denied"),
                "{warned}"
            );
        }
    }
}

#[test]
fn an_unsigned_explicit_bundle_plans_with_a_warning_and_applies_only_when_allowed() {
    let env = Env::new();
    let unsigned = env.bundle("unsigned", 1, &[setup_phase()], false);
    let out = env.ok(&["plan", "--phase", "setup-host", "--bundle", s(&unsigned)]);
    assert!(stderr(&out).contains("WARNING") && stderr(&out).contains("UNSIGNED"));
    refused_with(
        &env,
        1,
        "apply unsigned",
        &["apply", "--phase", "setup-host", "--bundle", s(&unsigned)],
        "--allow-unsigned",
    );
    // The plan's audit trail (`var/log/nodeward`, and the directories it made) is all there is.
    let mut tree = common::snapshot(&env.root);
    tree.retain(|p, _| p != "var" && p != "var/log" && !p.starts_with("var/log/nodeward"));
    assert!(tree.is_empty(), "apply changed nothing: {:?}", tree.keys());
    let signed = env.bundle("signed", 1, &[setup_phase()], true);
    let out = env.ok(&["plan", "--phase", "setup-host", "--bundle", s(&signed)]);
    assert!(!stderr(&out).contains("UNSIGNED"), "{}", stderr(&out));
}

/// Appends a custom section: a different digest, the same component.
fn with_custom_section(src: &str, dest: &Path) {
    let mut bytes = std::fs::read(src).expect("component");
    bytes.extend_from_slice(&[0, 5, 4, b'n', b'o', b't', b'e']);
    std::fs::write(dest, bytes).expect("write");
}

#[test]
fn diff_shows_exactly_the_added_path_verb_and_phase() {
    let env = Env::new();
    let old_grants = r#"
[phases.grants.fs]
write = ["etc/containerd"]
[phases.grants.systemd]
start = ["containerd.service"]
"#;
    let new_grants = r#"
[phases.grants.fs]
write = ["etc/containerd", "etc/cni/net.d"]
[phases.grants.systemd]
start = ["containerd.service"]
enable = ["containerd.service"]
"#;
    let setup = nodeward::built::PHASE_SETUP_HOST_COMPONENT;
    let teardown = nodeward::built::PHASE_TEARDOWN_COMPONENT;
    let old = env.bundle(
        "old",
        1,
        &[("setup-host", setup, "setup-host", old_grants)],
        false,
    );
    let new = env.bundle(
        "new",
        2,
        &[
            ("setup-host", setup, "setup-host", new_grants),
            ("teardown", teardown, "teardown", ""),
        ],
        false,
    );
    let out = env.ok(&["phases", "diff", s(&old), s(&new), "--output", "json"]);
    let v: Value = serde_json::from_slice(&out.stdout).expect("json");
    let digest = |b: &Path| {
        nodeward::bundle::sha256_hex(&std::fs::read(b.join("manifest.toml")).expect("manifest"))
    };
    let teardown_sha = nodeward::bundle::sha256_hex(&std::fs::read(teardown).expect("teardown"));
    assert_eq!(
        v,
        json!({
            "old": {
                "name": "test", "version": 1, "digest": digest(&old),
                "source": format!("bundle {}", old.display()), "signedBy": null,
            },
            "new": {
                "name": "test", "version": 2, "digest": digest(&new),
                "source": format!("bundle {}", new.display()), "signedBy": null,
            },
            "widens": true,
            "phases": [
                {
                    "name": "setup-host",
                    "change": "changed",
                    "widens": true,
                    "world": null,
                    "sha256": null,
                    "capabilities": { "added": [], "removed": [] },
                    "grants": {
                        "added": {
                            "fs": { "write": ["etc/cni/net.d"] },
                            "systemd": { "enable": ["containerd.service"] }
                        },
                        "removed": {}
                    }
                },
                {
                    "name": "teardown",
                    "change": "added",
                    "widens": true,
                    "world": { "old": null, "new": "teardown" },
                    "sha256": { "old": null, "new": teardown_sha },
                    "capabilities": {
                        "added": [
                            "nodeward:host/cgroups@0.1.0",
                            "nodeward:host/fs@0.1.0",
                            "nodeward:host/log@0.1.0",
                            "nodeward:host/mounts@0.1.0",
                            "nodeward:host/network@0.1.0",
                            "nodeward:host/systemd@0.1.0"
                        ],
                        "removed": []
                    },
                    "grants": { "added": {}, "removed": {} }
                }
            ],
            "unchanged": []
        })
    );
    let text =
        String::from_utf8_lossy(&env.ok(&["phases", "diff", s(&old), s(&new)]).stdout).into_owned();
    for line in [
        "phase setup-host: changed  [WIDENS]",
        "  + grant fs.write etc/cni/net.d",
        "  + grant systemd.enable containerd.service",
        "phase teardown: added (world teardown)  [WIDENS]",
        "  + capability nodeward:host/systemd@0.1.0",
        "the new bundle's authority is WIDER",
    ] {
        assert!(text.lines().any(|l| l == line), "{line:?} in:\n{text}");
    }

    // A new component with the same grants: a changed digest, nothing wider; a removed phase.
    let src = env.path("rebuilt.wasm");
    with_custom_section(setup, &src);
    let rebuilt = env.bundle(
        "rebuilt",
        3,
        &[("setup-host", s(&src), "setup-host", new_grants)],
        false,
    );
    let out = env.ok(&["phases", "diff", s(&new), s(&rebuilt), "--output", "json"]);
    let v: Value = serde_json::from_slice(&out.stdout).expect("json");
    let setup_sha = nodeward::bundle::sha256_hex(&std::fs::read(setup).expect("setup"));
    let rebuilt_sha = nodeward::bundle::sha256_hex(&std::fs::read(&src).expect("rebuilt"));
    assert_eq!(v["widens"], false);
    assert_eq!(
        v["phases"],
        json!([
            {
                "name": "setup-host",
                "change": "changed",
                "widens": false,
                "world": null,
                "sha256": { "old": setup_sha, "new": rebuilt_sha },
                "capabilities": { "added": [], "removed": [] },
                "grants": { "added": {}, "removed": {} }
            },
            {
                "name": "teardown",
                "change": "removed",
                "widens": false,
                "world": { "old": "teardown", "new": null },
                "sha256": { "old": teardown_sha, "new": null },
                "capabilities": {
                    "added": [],
                    "removed": [
                        "nodeward:host/cgroups@0.1.0",
                        "nodeward:host/fs@0.1.0",
                        "nodeward:host/log@0.1.0",
                        "nodeward:host/mounts@0.1.0",
                        "nodeward:host/network@0.1.0",
                        "nodeward:host/systemd@0.1.0"
                    ]
                },
                "grants": { "added": {}, "removed": {} }
            }
        ])
    );
    let text = String::from_utf8_lossy(&env.ok(&["phases", "diff", s(&new), s(&rebuilt)]).stdout)
        .into_owned();
    assert!(text.contains("capabilities and grants unchanged"), "{text}");
}

#[test]
fn inspect_shows_digests_imports_grants_and_the_signature() {
    let env = Env::new();
    let b = env.bundle("b.tgz", 1, &[setup_phase()], true);
    let out = env.ok(&["phases", "inspect", s(&b), "--output", "json"]);
    let v: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["signature"]["verified"], true);
    assert_eq!(v["bundle"]["name"], "test");
    let p = &v["phases"][0];
    assert_eq!(p["name"], "setup-host");
    assert_eq!(p["withinWorld"], true);
    assert_eq!(p["grants"]["fs"]["write"], json!(["etc", "opt", "var"]));
    assert_eq!(
        p["capabilities"],
        json!([
            "nodeward:host/fs@0.1.0",
            "nodeward:host/kernel@0.1.0",
            "nodeward:host/log@0.1.0"
        ])
    );
}

#[cfg(feature = "test-hooks")]
#[test]
fn install_is_crash_safe() {
    let env = Env::new();
    let v1 = env.bundle("v1", 1, &[setup_phase()], true);
    env.ok(&[
        "phases",
        "install",
        s(&v1),
        "--allow-incomplete",
        "--accept-new-grants",
    ]);
    let d1 = env.link("current").expect("current");
    let v2 = env.bundle("v2.tar", 2, &[setup_phase(), configure_phase()], true);
    for point in [
        "install:after-precompile",
        "install:after-stage",
        "install:after-last-good",
    ] {
        let out = env.run_env(
            &[
                "phases",
                "install",
                s(&v2),
                "--allow-incomplete",
                "--accept-new-grants",
            ],
            &[("NODEWARD_TEST_ABORT", point)],
        );
        assert_eq!(out.status.code(), None, "{point}: killed by SIGABRT");
        assert!(stderr(&out).contains(point), "{}", stderr(&out));
        assert_eq!(env.link("current").as_deref(), Some(d1.as_str()), "{point}");
        // The old bundle still runs.
        assert_eq!(
            env.plan_phases(&["setup-host"])["bundle"]["digest"],
            d1.as_str(),
            "{point}"
        );
    }
    env.ok(&[
        "phases",
        "install",
        s(&v2),
        "--allow-incomplete",
        "--accept-new-grants",
    ]);
    let d2 = env.digest(&v2);
    assert_eq!(env.link("current").as_deref(), Some(d2.as_str()));
    assert_eq!(env.link("last-good").as_deref(), Some(d1.as_str()));
    // Leftovers of the aborted runs are gone; only the two linked bundles remain.
    let mut kept: Vec<String> = std::fs::read_dir(env.state.join("bundles"))
        .expect("store")
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    kept.sort();
    let mut want = vec![d1, d2];
    want.sort();
    assert_eq!(kept, want);
}

#[test]
fn trusted_keys_others_may_write_are_refused_and_a_public_signing_key_is_named() {
    use std::os::unix::fs::PermissionsExt;
    let env = Env::new();
    let b = env.bundle("b.tgz", 1, &[setup_phase()], true);
    // Packed (and signed) archives are published: 0644.
    let mode = std::fs::metadata(&b).expect("archive").permissions().mode() & 0o7777;
    assert_eq!(mode, 0o644, "archive mode {mode:o}");
    env.ok(&["phases", "verify", s(&b)]);

    // A key file others may write.
    std::fs::set_permissions(&env.public, std::fs::Permissions::from_mode(0o666)).expect("chmod");
    // A configuration error, like an unreadable key: exit 2.
    let out = env.run(&["phases", "verify", s(&b)]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains(&format!("trusted key {}", env.public.display()))
            && err.contains("mode 0666 lets its group or others write it"),
        "{err}"
    );
    std::fs::set_permissions(&env.public, std::fs::Permissions::from_mode(0o644)).expect("chmod");

    // A keys directory others may write (keys found there are refused too).
    let dir = env.path("keys");
    std::fs::create_dir(&dir).expect("keys dir");
    std::fs::copy(&env.public, dir.join("platform.pub")).expect("copy key");
    let verify_with_dir = || {
        Command::new(env!("CARGO_BIN_EXE_nodeward"))
            .args(["phases", "verify", s(&b), "--trusted-keys-dir", s(&dir)])
            .env_remove("NODEWARD_LOG")
            .output()
            .expect("run nodeward")
    };
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let out = verify_with_dir();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let out = verify_with_dir();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(&format!("trusted keys directory {}", dir.display())),
        "{}",
        stderr(&out)
    );

    // A public key given as the signing key.
    let out = env.run(&["phases", "sign", s(&b), "--key", s(&env.public)]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("this is a public key; sign with the secret key"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn export_writes_the_embedded_bundle_which_packs_signs_and_installs() {
    let env = Env::new();
    let dir = env.path("exported");
    let out = env.ok(&["phases", "export", s(&dir)]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("exported the embedded bundle"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    // The same manifest digest as the embedded bundle, every component in place.
    let embedded = env.ok(&["phases", "list", "--output", "json"]);
    let embedded: Value = serde_json::from_slice(&embedded.stdout).expect("list json");
    let inspected = env.ok(&["phases", "inspect", s(&dir), "--output", "json"]);
    let inspected: Value = serde_json::from_slice(&inspected.stdout).expect("inspect json");
    assert_eq!(inspected["bundle"]["digest"], embedded["bundle"]["digest"]);
    assert_eq!(
        inspected["phases"].as_array().map(Vec::len),
        embedded["phases"].as_array().map(Vec::len)
    );
    // Never over an existing, non-empty directory.
    let again = env.run(&["phases", "export", s(&dir)]);
    assert_eq!(again.status.code(), Some(1));
    assert!(
        stderr(&again).contains("already exists"),
        "{}",
        stderr(&again)
    );

    // A platform team's path: raise the version, pack, sign, install (complete: no flag).
    let manifest = std::fs::read_to_string(dir.join("manifest.toml")).expect("manifest");
    let manifest = manifest.replacen("version = 1\n", "version = 2\n", 1);
    assert!(manifest.contains("version = 2"), "{manifest}");
    std::fs::write(dir.join("manifest.toml"), manifest).expect("edit");
    let packed = env.path("mine.tgz");
    env.ok(&["phases", "pack", s(&dir), "-o", s(&packed)]);
    env.ok(&["phases", "sign", s(&packed), "--key", s(&env.secret)]);
    env.ok(&["phases", "install", s(&packed)]);
    assert!(env.link("current").is_some());
}
