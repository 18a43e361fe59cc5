//! None mode end to end on the real systemd of the test harness, with a **stub kubelet**
//! (`examples/stub_kubelet.rs`) and a **stub API server** (`tests/node/api_server.rs`) standing in for
//! the real ones so that the crash loops stay fast. Everything else is real: the `nodeward`
//! binary, wasmtime and the shipped phases, Debian's containerd and runc run as units, the CNI
//! plugins, and downloads from an HTTP server on 127.0.0.1. The same flows against the real
//! kube-apiserver and kubelet are in `tests/none_cluster.rs`.
//!
//! All tests are `#[ignore]`d: they need the harness, where `scripts/test.sh` runs them.

mod cluster;
mod node;

use node::*;
use serde_json::Value;
use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
#[cfg(feature = "test-hooks")]
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Output;

/// The kubelet versions the stub setup bootstraps and upgrades to.
const V1: &str = "1.20.2";
const V2: &str = "1.20.3";

/// Everything a stub node needs besides its root.
struct Stub {
    api: StubApiServer,
    server: ArtifactServer,
    opts: NodeOptions,
    /// The config of V1, and of V2 (a different kubelet build: new version directory).
    config_v1: String,
    config_v2: String,
    /// What `config_v2` was made from, to derive variants.
    served_v2: Served,
}

fn stub(root: &NodeRoot) -> Stub {
    let api = StubApiServer::start();
    let server = ArtifactServer::start_temp();
    let kubelet = stub_kubelet();
    let served = serve_artifacts(&server, &kubelet);
    // A second "build": the same executable with trailing bytes, so another sha256.
    let mut bytes = std::fs::read(&kubelet).expect("stub kubelet");
    bytes.extend_from_slice(b"\nnodeward-test-upgrade-build\n");
    let (url, sha256) = server.serve("kubelet-upgrade", &bytes);
    let served_v2 = Served {
        kubelet: Download { url, sha256 },
        ..served.clone()
    };
    let opts = NodeOptions::new(&root.root, "stub-node");
    api.set_node(&opts.machine_name, opts.stub_node(V1));
    let config_v1 = node_config(&ClusterInfo::of_stub(&api, V1), &served, &opts);
    let config_v2 = node_config(&ClusterInfo::of_stub(&api, V2), &served_v2, &opts);
    Stub {
        api,
        server,
        opts,
        config_v1,
        config_v2,
        served_v2,
    }
}

/// `nodeward ARGS --output json` with extra environment; the parsed report. Bootstrap and
/// upgrade (the commands with health waits) wait at most 20 s unless `args` say otherwise.
fn json_run(root: &NodeRoot, args: &[&str], env: &[(&str, String)]) -> (Output, Value) {
    let mut all: Vec<&str> = args.to_vec();
    all.extend(["--output", "json"]);
    if matches!(args.first(), Some(&"bootstrap" | &"upgrade")) && !args.contains(&"--wait-timeout")
    {
        all.extend(["--wait-timeout", "20"]);
    }
    let mut cmd = root.command(&all);
    for (k, v) in env {
        cmd.env(k, v);
    }
    // SAFETY: setrlimit is async-signal-safe; nothing else runs between fork and exec.
    #[allow(unsafe_code)]
    unsafe {
        cmd.pre_exec(|| {
            // The crash tests abort on purpose: no core files in the working directory.
            let _ = rustix::process::setrlimit(
                rustix::process::Resource::Core,
                rustix::process::Rlimit {
                    current: Some(0),
                    maximum: Some(0),
                },
            );
            Ok(())
        });
    }
    let out = cmd.output().expect("nodeward runs");
    let v = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (out, v)
}

#[track_caller]
fn ok(root: &NodeRoot, args: &[&str]) -> Value {
    let (out, v) = json_run(root, args, &[]);
    assert!(
        out.status.success(),
        "nodeward {args:?} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    v
}

#[track_caller]
fn refused(root: &NodeRoot, args: &[&str]) -> String {
    let (out, _) = json_run(root, args, &[]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "nodeward {args:?} should fail: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn status(root: &NodeRoot) -> Value {
    ok(root, &["status"])
}

/// What a bootstrap of `root` leaves behind after a reset, besides the empty root: the
/// artifact cache (so a re-bootstrap downloads nothing) and the directories above it.
fn allowed_after_reset(path: &str) -> bool {
    stays_after_reset(path)
}

/// Resets, asserting the tree is back to `pristine` (up to what may stay) and every unit
/// is gone.
#[track_caller]
fn reset_to(root: &NodeRoot, pristine: &BTreeMap<String, Entry>) {
    ok(root, &["reset"]);
    let after = root.tree();
    let extra: Vec<&String> = after
        .keys()
        .filter(|p| !pristine.contains_key(*p) && !allowed_after_reset(p))
        .collect();
    assert!(extra.is_empty(), "reset left {extra:?}");
    let missing: Vec<&String> = pristine
        .keys()
        .filter(|p| !after.contains_key(*p))
        .collect();
    assert!(missing.is_empty(), "reset removed {missing:?}");
    for (unit, (active, _)) in root.unit_states() {
        assert_eq!(active, "inactive", "{unit} after reset");
    }
    assert!(
        root.leftovers().is_empty(),
        "after reset: {:?}",
        root.leftovers()
    );
}

#[test]
#[ignore = "needs the real systemd harness (scripts/test.sh)"]
fn bootstrap_status_second_bootstrap_and_reset_on_real_systemd() {
    let mut root = NodeRoot::new(RootKind::Harness);
    let s = stub(&root);
    root.write_config(&s.config_v1);
    let pristine = root.tree();

    let plan = ok(&root, &["plan"]);
    assert_eq!(root.tree(), pristine, "plan changed the host");
    assert!(
        plan["changes"].as_array().is_some_and(|c| c.len() > 20),
        "{plan}"
    );
    // The bootstrap kubeconfig is the host's, planned without contents, size or digest.
    let kubeconfig = serde_json::json!({
        "phase": "nodeward", "kind": "secret-file",
        "path": "etc/kubernetes/bootstrap-kubelet.conf", "mode": "0600", "action": "create"
    });
    let lists_kubeconfig = |report: &Value| {
        report["changes"]
            .as_array()
            .is_some_and(|c| c.contains(&kubeconfig))
    };
    assert!(lists_kubeconfig(&plan), "{plan}");

    let boot = ok(&root, &["bootstrap"]);
    assert!(lists_kubeconfig(&boot), "{boot}");
    let version = boot["version"].as_str().expect("version");
    assert!(version.starts_with("1.20.2-"), "{version}");
    assert_eq!(boot["kubeletVersion"], "v1.20.2");
    let steps: Vec<&str> = boot["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .filter_map(|s| s["name"].as_str())
        .collect();
    assert_eq!(
        steps,
        [
            "preflight-checks",
            "preflight",
            "setup-host",
            "download-artifacts",
            "install",
            "configure",
            "start-node",
            "wait-healthy",
            "persist",
            "evict-cache"
        ]
    );
    // The node asked the API server about itself with the credentials the kubelet wrote.
    assert!(
        s.api.requests().iter().any(|r| r.method == "GET"
            && r.path == format!("/api/v1/nodes/{}", s.opts.machine_name)
            && r.authorization.is_some()),
        "{:?}",
        s.api.requests()
    );

    let st = status(&root);
    assert_eq!(st["mode"], "none");
    assert_eq!(st["activeVersion"], version);
    assert_eq!(st["checkpoint"], "complete");
    assert_eq!(st["appliedConfig"]["verified"], true);
    assert_eq!(st["kubeletHealth"], "ok");
    assert_eq!(st["upgradeInProgress"], Value::Null);
    for u in st["units"].as_array().expect("units") {
        assert_eq!(u["activeState"], "active", "{u}");
    }
    assert_eq!(
        std::fs::read_link(root.root.join("opt/nodeward/node/current"))
            .expect("current link")
            .to_string_lossy(),
        version
    );

    // A second bootstrap changes nothing: its plan is empty, and so is the run itself.
    let tree = root.tree();
    let again = ok(&root, &["plan"]);
    assert_eq!(again["changes"], Value::Array(vec![]), "{again}");
    let again = ok(&root, &["bootstrap"]);
    assert_eq!(again["mutations"], 0, "{}", again["changes"]);
    assert_eq!(root.tree(), tree);

    // The pods' bridge of the applied config (the stub kubelet makes none: made here, with a
    // veth pair on it whose peer is in a "pod's" network namespace, as the CNI plugin leaves
    // it) goes with the reset (`reset_to` also asserts no new link is left).
    let bridge = s.opts.bridge.clone();
    let (veth, peer) = (format!("{bridge}v"), format!("{bridge}p"));
    let link = |name: &str| Path::new("/sys/class/net").join(name).exists();
    let pod = PodNetns::new();
    for args in [
        format!("link add {bridge} type bridge"),
        format!(
            "link add {veth} type veth peer name {peer} netns {}",
            pod.pid()
        ),
        format!("link set {veth} master {bridge}"),
    ] {
        ip(&args);
    }
    assert!(pod.has_link(&peer), "the peer is in the pod's namespace");

    // Reset, twice: the second is a no-op.
    reset_to(&root, &pristine);
    assert!(
        !link(&bridge) && !link(&veth) && !pod.has_link(&peer),
        "the node's links are gone, the pod's side with its veth"
    );
    drop(pod);
    let second = ok(&root, &["reset"]);
    assert_eq!(second["mutations"], 0, "{}", second["changes"]);
    assert_eq!(status(&root)["installed"], false);
    // Without an applied config no bridge is deleted, whatever `--config` names.
    ip(&format!("link add {bridge} type bridge"));
    ok(&root, &["reset"]);
    assert!(
        link(&bridge),
        "a reset never takes the bridge from a given config"
    );
    ip(&format!("link del {bridge}"));
    let left = root.teardown();
    assert!(left.is_empty(), "{left:?}");
}

/// A process in a network namespace of its own, standing for a pod's: it lives until dropped,
/// and its namespace with it.
struct PodNetns(std::process::Child);

impl PodNetns {
    /// Starts `unshare --net sleep 600` and waits until it is in its own namespace.
    fn new() -> PodNetns {
        let child = std::process::Command::new("unshare")
            .args(["--net", "sleep", "600"])
            .spawn()
            .expect("unshare --net sleep");
        let pod = PodNetns(child);
        let ours = std::fs::read_link("/proc/self/ns/net").expect("our netns");
        let theirs = format!("/proc/{}/ns/net", pod.pid());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::fs::read_link(&theirs).ok().as_ref() == Some(&ours) {
            assert!(
                std::time::Instant::now() < deadline,
                "unshare --net never left our namespace"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        pod
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }

    /// Whether a link named `name` is in the pod's namespace.
    fn has_link(&self, name: &str) -> bool {
        std::process::Command::new("nsenter")
            .args([
                "-t",
                &self.pid().to_string(),
                "-n",
                "ip",
                "link",
                "show",
                name,
            ])
            .output()
            .expect("nsenter")
            .status
            .success()
    }
}

impl Drop for PodNetns {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `ip ARGS`, which must succeed.
fn ip(args: &str) {
    let out = std::process::Command::new("ip")
        .args(args.split_whitespace())
        .output()
        .expect("ip");
    assert!(
        out.status.success(),
        "ip {args}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs `op` uninterrupted for reference, then once per host mutation k with an abort right
/// after the k-th, followed by the same command again; the tree and unit states must equal
/// the reference every time. `prepare` brings a fresh root to the operation's start.
#[cfg(feature = "test-hooks")]
fn crash_loop(
    name: &str,
    root: &NodeRoot,
    pristine: &BTreeMap<String, Entry>,
    prepare: &dyn Fn(&NodeRoot),
    op: &[&str],
) -> usize {
    // Warm-up: the first run also fills the artifact cache (its directories are mutations
    // a later run does not make), so the reference is the second uninterrupted run.
    prepare(root);
    ok(root, op);
    reset_to(root, pristine);
    prepare(root);
    let reference = ok(root, op);
    let points = reference["mutations"].as_u64().expect("mutations") as usize;
    assert!(points > 10, "{name}: only {points} mutations? {reference}");
    let tree = root.tree();
    let units = root.unit_states();
    reset_to(root, pristine);

    for k in 1..=points {
        prepare(root);
        let (out, _) = json_run(
            root,
            op,
            &[("NODEWARD_TEST_ABORT", format!("mutation:{k}"))],
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.signal(),
            Some(6),
            "{name}: expected an abort after mutation {k}: {stderr}"
        );
        let cut = stderr
            .lines()
            .find(|l| l.contains("aborting after host mutation"))
            .unwrap_or_default()
            .to_string();
        let (out, _) = json_run(root, op, &[]);
        assert!(
            out.status.success(),
            "{name}: the run after an abort at {cut} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            root.tree(),
            tree,
            "{name}: tree differs after an abort at {cut} and a re-run"
        );
        assert_eq!(
            root.unit_states(),
            units,
            "{name}: units differ after an abort at {cut} and a re-run"
        );
        reset_to(root, pristine);
    }
    eprintln!("{name}: {points} crash points, each aborted, re-run and compared");
    points
}

#[test]
#[cfg(feature = "test-hooks")]
#[ignore = "needs the real systemd harness (scripts/test.sh)"]
fn crash_at_every_mutation_of_a_bootstrap_then_rerun_equals_an_uninterrupted_one() {
    let mut root = NodeRoot::new(RootKind::Harness);
    let s = stub(&root);
    root.write_config(&s.config_v1);
    let pristine = root.tree();
    let points = crash_loop("bootstrap", &root, &pristine, &|_| {}, &["bootstrap"]);
    assert!(points > 0);
    let left = root.teardown();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
#[cfg(feature = "test-hooks")]
#[ignore = "needs the real systemd harness (scripts/test.sh)"]
fn crash_at_every_mutation_of_an_upgrade_then_rerun_equals_an_uninterrupted_one() {
    let mut root = NodeRoot::new(RootKind::Harness);
    let s = stub(&root);
    let v1 = root.dir.join("v1.yaml");
    let v2 = root.dir.join("v2.yaml");
    std::fs::write(&v1, &s.config_v1).expect("v1");
    std::fs::write(&v2, &s.config_v2).expect("v2");
    root.write_config(&s.config_v1);
    let pristine = root.tree();
    let v1s = v1.display().to_string();
    let v2s = v2.display().to_string();
    let prepare = |r: &NodeRoot| {
        ok(r, &["bootstrap", "--config", &v1s]);
    };
    let points = crash_loop(
        "upgrade",
        &root,
        &pristine,
        &prepare,
        &["upgrade", "--config", &v2s],
    );
    assert!(points > 0);

    // And the upgrade itself: new directory, link switched, old one pruned, journal gone.
    prepare(&root);
    let before = status(&root);
    let up = ok(&root, &["upgrade", "--config", &v2s]);
    let new = up["version"].as_str().expect("version");
    assert_ne!(Some(new), before["activeVersion"].as_str());
    let after = status(&root);
    assert_eq!(after["activeVersion"], new);
    assert_eq!(after["versions"], serde_json::json!([new]), "old pruned");
    assert_eq!(after["upgradeInProgress"], Value::Null);
    assert_eq!(after["appliedConfig"]["kubernetesVersion"], V2);
    // The version it ran before is recorded, so the artifact cache keeps its artifacts.
    let previous: Value = serde_json::from_slice(
        &std::fs::read(
            root.root
                .join("var/lib/nodeward/node/previous-version.json"),
        )
        .expect("previous-version.json"),
    )
    .expect("JSON");
    assert_eq!(previous["version"], before["activeVersion"], "{previous}");
    let steps: Vec<&str> = up["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .filter_map(|s| s["name"].as_str())
        .collect();
    assert_eq!(steps.last(), Some(&"evict-cache"), "{steps:?}");
    // Upgrading to the same config again changes nothing.
    let again = ok(&root, &["upgrade", "--config", &v2s]);
    assert_eq!(again["mutations"], 0, "{}", again["changes"]);
    reset_to(&root, &pristine);
    let left = root.teardown();
    assert!(left.is_empty(), "{left:?}");
}

/// Every path beneath the root with an entry of the durable temp-name scheme
/// (`.nodeward-tmp.…`) in it, outside the runtime state of [`TREE_EXCLUDES`].
#[cfg(feature = "test-hooks")]
fn temp_entries(root: &NodeRoot) -> Vec<String> {
    let skip = |rel: &str| {
        TREE_EXCLUDES
            .iter()
            .any(|e| rel == *e || rel.starts_with(&format!("{e}/")))
    };
    snapshot(&root.root, skip)
        .into_keys()
        .filter(|p| p.split('/').any(nodeward::durable::is_temp_name))
        .collect()
}

/// Aborts a bootstrap right after a temp file got its name, for each writer a bootstrap with a
/// warm artifact cache reaches (node state, a phase's file, the host's bootstrap kubeconfig
/// (with the token in it), a download placed from the cache,
/// an extracted binary, a link), where a killed agent leaves a complete, named temp file; runs
/// it again and resets. The re-run's tree and units equal an uninterrupted run's, and no
/// `.nodeward-tmp.` entry survives the re-run or the reset, nor one a killed daemon or head
/// update left in the agent state directory. Last, a bootstrap killed while
/// writing node state is reset at once: the temp file (it could hold the bootstrap token) is
/// gone with the state directory.
#[test]
#[cfg(feature = "test-hooks")]
#[ignore = "needs the real systemd harness (scripts/test.sh)"]
fn a_bootstrap_aborted_after_each_temp_write_then_rerun_and_reset_leave_no_temp_file() {
    let mut root = NodeRoot::new(RootKind::Harness);
    let s = stub(&root);
    root.write_config(&s.config_v1);
    let pristine = root.tree();
    // Warm-up (fills the artifact cache), then the reference run.
    ok(&root, &["bootstrap"]);
    reset_to(&root, &pristine);
    ok(&root, &["bootstrap"]);
    let tree = root.tree();
    let units = root.unit_states();
    reset_to(&root, &pristine);

    let abort = |point: &str| {
        let (out, _) = json_run(
            &root,
            &["bootstrap"],
            &[("NODEWARD_TEST_ABORT", point.into())],
        );
        assert_eq!(
            out.status.signal(),
            Some(6),
            "expected an abort at {point}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let left = temp_entries(&root);
        assert!(!left.is_empty(), "{point}: no named temp file left");
    };
    // What a killed daemon (its ledger, its repave config) and head update leave in the agent
    // state directory: swept by the next run, and by a reset.
    let plant = || {
        for rel in [
            ".nodeward-tmp.repave.00000000000000a1",
            "audit-heads/.nodeward-tmp.audit.00000000000000a2",
        ] {
            let path = root.state_dir.join(rel);
            std::fs::create_dir_all(path.parent().expect("dir")).expect("mkdir");
            std::fs::write(path, "a bootstrap token").expect("leftover");
        }
    };
    let state_leftovers = || {
        ["", "audit-heads"]
            .iter()
            .flat_map(|d| std::fs::read_dir(root.state_dir.join(d)).expect("state dir"))
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .filter(|n| nodeward::durable::is_temp_name(n))
            .collect::<Vec<_>>()
    };
    for purpose in ["state", "write", "secret", "download", "extract", "link"] {
        let point = format!("{purpose}:after-temp-write");
        abort(&point);
        plant();
        ok(&root, &["bootstrap"]);
        assert_eq!(temp_entries(&root), Vec::<String>::new(), "{point}: re-run");
        assert_eq!(state_leftovers(), Vec::<String>::new(), "{point}: re-run");
        plant();
        assert_eq!(root.tree(), tree, "{point}: the re-run's tree differs");
        assert_eq!(
            root.unit_states(),
            units,
            "{point}: the re-run's units differ"
        );
        reset_to(&root, &pristine);
        assert_eq!(temp_entries(&root), Vec::<String>::new(), "{point}: reset");
        assert_eq!(state_leftovers(), Vec::<String>::new(), "{point}: reset");
    }

    abort("state:after-temp-write");
    reset_to(&root, &pristine);
    assert_eq!(temp_entries(&root), Vec::<String>::new());
    assert!(!root.root.join("var/lib/nodeward/node").exists());
    let left = root.teardown();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
#[ignore = "needs the real systemd harness (scripts/test.sh)"]
fn a_failed_upgrade_rolls_back_to_the_running_version() {
    let mut root = NodeRoot::new(RootKind::Harness);
    let s = stub(&root);
    root.write_config(&s.config_v1);
    let pristine = root.tree();
    let boot = ok(&root, &["bootstrap"]);
    let v1 = boot["version"].as_str().expect("v1").to_string();
    // The new version's "kubelet" runs but never serves its health endpoint.
    let (url, sha256) = s
        .server
        .serve("kubelet-broken", b"#!/bin/sh\nexec sleep 600\n");
    let broken = node_config(
        &ClusterInfo::of_stub(&s.api, V2),
        &Served {
            kubelet: Download { url, sha256 },
            ..s.served_v2.clone()
        },
        &s.opts,
    );
    assert_ne!(broken, s.config_v2);
    let v2 = root.dir.join("v2.yaml");
    std::fs::write(&v2, &broken).expect("v2");
    let (out, _) = json_run(
        &root,
        &[
            "upgrade",
            "--config",
            &v2.display().to_string(),
            "--wait-timeout",
            "4",
        ],
        &[],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("rolled back to {v1}")) && stderr.contains("kubelet health"),
        "{stderr}"
    );
    let st = status(&root);
    assert_eq!(st["activeVersion"], v1.as_str());
    assert_eq!(st["upgradeInProgress"], Value::Null, "journal dropped");
    assert_eq!(st["appliedConfig"]["kubernetesVersion"], V1);
    assert_eq!(st["kubeletHealth"], "ok");
    for u in st["units"].as_array().expect("units") {
        assert_eq!(u["activeState"], "active", "{u}");
    }
    reset_to(&root, &pristine);
    let left = root.teardown();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
#[ignore = "needs the real systemd harness (scripts/test.sh)"]
fn refuses_a_changed_config_without_force_and_a_download_with_the_wrong_sha256() {
    let mut root = NodeRoot::new(RootKind::Harness);
    let s = stub(&root);
    root.write_config(&s.config_v1);
    let pristine = root.tree();

    // containerd's tarball is served with other bytes: nothing is installed, the error names
    // the artifact and its URL.
    let containerd = packed()
        .containerd_tgz
        .file_name()
        .and_then(|n| n.to_str())
        .expect("name")
        .to_string();
    s.server
        .serve_wrong_bytes(&containerd, b"not a containerd tarball");
    let err = refused(&root, &["bootstrap"]);
    assert!(
        err.contains("containerd") && err.contains(&s.server.url(&containerd)),
        "{err}"
    );
    assert!(err.contains("sha256"), "{err}");
    assert!(!root.root.join("opt/nodeward/node/current").exists());
    assert!(
        !root
            .root
            .join("etc/systemd/system/nodeward-kubelet.service")
            .exists()
    );
    let st = status(&root);
    assert_eq!(st["checkpoint"], "download-artifacts", "{st}");

    // A different config while that bootstrap is unfinished: refused, naming the fingerprints.
    let changed = s.config_v1.replace("stub-node", "stub-node-2");
    let other = root.dir.join("other.yaml");
    std::fs::write(&other, &changed).expect("other");
    let err = refused(
        &root,
        &["bootstrap", "--config", &other.display().to_string()],
    );
    assert!(
        err.contains("stub-node-2") && err.contains("--force"),
        "{err}"
    );

    // Served right again: the same bootstrap resumes at its checkpoint and finishes.
    s.server.serve_right_bytes(&containerd);
    let boot = ok(&root, &["bootstrap"]);
    assert_eq!(boot["steps"][0]["name"], "preflight-checks");
    assert_eq!(boot["steps"][1]["name"], "preflight");
    assert_eq!(
        boot["steps"][2]["name"], "download-artifacts",
        "resumed at its checkpoint"
    );

    // A finished node with another config: refused without --force, upgraded with it.
    let relabelled = s.config_v1.replace(
        "node.nodeward.io/test: 'true'",
        "node.nodeward.io/test: 'yes'",
    );
    assert_ne!(relabelled, s.config_v1, "the label is in the config");
    std::fs::write(&other, &relabelled).expect("other");
    let other_s = other.display().to_string();
    let err = refused(&root, &["bootstrap", "--config", &other_s]);
    assert!(
        err.contains("fingerprint") && err.contains("nodeward upgrade"),
        "{err}"
    );
    let forced = ok(&root, &["bootstrap", "--force", "--config", &other_s]);
    assert_eq!(forced["operation"], "upgrade");
    reset_to(&root, &pristine);
    let left = root.teardown();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
#[ignore = "needs the real systemd harness (scripts/test.sh)"]
fn refuses_a_host_that_runs_its_own_kubelet() {
    let mut root = NodeRoot::new(RootKind::Harness);
    let s = stub(&root);
    root.write_config(&s.config_v1);
    let unit = Path::new(HARNESS_UNIT_DIR).join("kubelet.service");
    std::fs::write(
        &unit,
        "[Unit]\nDescription=someone else's kubelet (test)\n[Service]\nExecStart=/bin/sleep infinity\n",
    )
    .expect("unit");
    let systemctl = |args: &[&str]| {
        let out = std::process::Command::new("systemctl")
            .args(args)
            .output()
            .expect("systemctl");
        assert!(out.status.success(), "systemctl {args:?}: {out:?}");
    };
    systemctl(&["daemon-reload"]);
    systemctl(&["start", "kubelet.service"]);
    let pristine = root.tree();
    let err = refused(&root, &["bootstrap"]);
    let service_kubelet = |v: &Value| {
        v["checks"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["name"] == "Service-Kubelet").cloned())
            .unwrap_or(Value::Null)
    };
    let (_, running) = json_run(&root, &["preflight"], &[]);
    let after = root.tree();
    systemctl(&["stop", "kubelet.service"]);
    // Stopped but installed: it may start at boot, a warning.
    let (_, stopped) = json_run(&root, &["preflight"], &[]);
    std::fs::remove_file(&unit).expect("remove unit");
    systemctl(&["daemon-reload"]);
    let (_, gone) = json_run(&root, &["preflight"], &[]);
    assert!(
        err.contains("Service-Kubelet: kubelet.service is active") && err.contains("refuses"),
        "{err}"
    );
    assert_eq!(service_kubelet(&running)["status"], "fail", "{running:#}");
    assert_eq!(
        service_kubelet(&stopped)["status"],
        "warning",
        "{stopped:#}"
    );
    assert_eq!(service_kubelet(&gone)["status"], "pass", "{gone:#}");
    assert_eq!(after, pristine, "nothing was written");
    let left = root.teardown();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
#[ignore = "needs the real systemd harness (scripts/test.sh)"]
fn names_an_unreachable_api_server_in_a_typed_timeout() {
    let mut root = NodeRoot::new(RootKind::Harness);
    let s = stub(&root);
    // An API server URL nothing listens on: bound, then closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("port");
    let dead = format!("https://127.0.0.1:{port}");
    let config = s.config_v1.replace(&s.api.url(), &dead);
    assert_ne!(config, s.config_v1);
    root.write_config(&config);
    let pristine = root.tree();
    // The preflight checks refuse it first, naming it, before anything is written.
    let err = refused(&root, &["bootstrap", "--wait-timeout", "3"]);
    assert!(
        err.contains("APIServerReachable") && err.contains(&dead) && err.contains("unreachable"),
        "{err}"
    );
    assert_eq!(root.tree(), pristine, "a refused bootstrap wrote something");
    // Let through, the bootstrap runs until its health wait times out, naming it again.
    let (out, _) = json_run(
        &root,
        &[
            "bootstrap",
            "--wait-timeout",
            "3",
            "--ignore-preflight-errors=APIServerReachable",
        ],
        &[],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("timed out") && err.contains(&dead) && err.contains("unreachable"),
        "{err}"
    );
    assert_eq!(status(&root)["checkpoint"], "wait-healthy");
    reset_to(&root, &pristine);
    let left = root.teardown();
    assert!(left.is_empty(), "{left:?}");
}

/// Packs `config` with `nodeward offline pack` on a root of its own (a connected machine's,
/// with its own artifact cache), into `out`.
fn pack_offline(config: &Path, out: &Path) {
    let packer = tempfile::tempdir().expect("packer root");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_nodeward"))
        .args(["offline", "pack", "--config"])
        .arg(config)
        .arg("-o")
        .arg(out)
        .arg("--root")
        .arg(packer.path())
        .env_remove("NODEWARD_ROOT")
        .env_remove("NODEWARD_STATE_DIR")
        .env_remove("NODEWARD_CONFIG")
        .output()
        .expect("pack runs");
    assert!(
        o.status.success(),
        "offline pack: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
#[ignore = "needs the real systemd harness (scripts/test.sh)"]
fn bootstrap_and_upgrade_offline_send_no_download_request() {
    let mut root = NodeRoot::new(RootKind::Harness);
    let s = stub(&root);
    let config_v1 = root.write_config(&s.config_v1);
    let pristine = root.tree();
    let v1_archive = root.dir.join("v1-offline.tar");
    pack_offline(&config_v1, &v1_archive);
    let config_v2 = root.dir.join("v2.yaml");
    std::fs::write(&config_v2, &s.config_v2).expect("v2");
    let v2_archive = root.dir.join("v2-offline.tar");
    pack_offline(&config_v2, &v2_archive);
    let packed = s.server.requests().len();
    assert!(
        packed >= 5,
        "both packs downloaded: {:?}",
        s.server.requests()
    );

    let boot = ok(
        &root,
        &["bootstrap", "--offline", &v1_archive.display().to_string()],
    );
    assert!(
        boot["version"]
            .as_str()
            .is_some_and(|v| v.starts_with("1.20.2-")),
        "{boot}"
    );
    assert_eq!(status(&root)["kubeletHealth"], "ok");
    let up = ok(
        &root,
        &[
            "upgrade",
            "--config",
            &config_v2.display().to_string(),
            "--offline",
            &v2_archive.display().to_string(),
        ],
    );
    assert!(
        up["version"]
            .as_str()
            .is_some_and(|v| v.starts_with("1.20.3-")),
        "{up}"
    );
    assert_eq!(
        s.server.requests().len(),
        packed,
        "the offline bootstrap and upgrade sent no download request: {:?}",
        &s.server.requests()[packed..]
    );
    // The node's own record is the config; a reset removes it as any other.
    root.write_config(&s.config_v2);
    reset_to(&root, &pristine);
    let left = root.teardown();
    assert!(left.is_empty(), "{left:?}");
}
