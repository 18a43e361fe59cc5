//! A bundle roll-out whose phases all succeed but whose node then fails the health gate. The
//! bundle's `configure` is a test stand-in (`tests/guests/bad-kubelet-config`, under the real
//! phase's grants) that writes a kubelet config the kubelet refuses: the phase succeeds, the
//! kubelet exits at every start, its health endpoint never answers. The daemon rolls the bundle
//! back (`phases rollback --expect`, then the previous bundle's `configure` and the restart),
//! reports `BundleRolledBack`, and stops trying once the attempt budget is spent.

use crate::cluster::Cluster;
use crate::node::{ArtifactServer, NODE_UNITS, NodeRoot};
use crate::rollout::{Published, Publisher, bundle_state, phase, scrape_metrics};
use crate::{condition, kubelet_invocation, ok, wait_logged};
use nodeward::daemon::rollout::{MAX_ATTEMPTS, RETRY_AFTER, RecordFile, Stage};
use nodeward_node_config::layout::KUBELET_CONFIG;
use serde_json::{Value, json};
use std::path::Path;
use std::time::{Duration, Instant};

/// The stand-in's component file in the bundle: named for what it is.
const STAND_IN: &str = "configure-stand-in.wasm";
/// How the stand-in's kubelet config starts.
const STAND_IN_MARK: &str = "# written by the test stand-in for configure";

/// The node, the daemon and the Machine the roll-out runs on.
#[derive(Clone, Copy)]
pub struct Node<'a> {
    pub cluster: &'a Cluster,
    pub root: &'a NodeRoot,
    pub name: &'a str,
    pub log_path: &'a Path,
}

/// Publishes v4 (the stand-in as `configure`) with consent while the node runs `previous`; the
/// daemon (whose `--health-timeout` is short) installs it, the node fails the gate, and the
/// bundle is rolled back, twice (the second attempt once [`RETRY_AFTER`] has passed), then no
/// more.
pub fn roll_out_a_bundle_the_node_fails(
    node: &Node,
    server: &ArtifactServer,
    publisher: &Publisher,
    previous: &Published,
) {
    let Node {
        cluster,
        root,
        name,
        ..
    } = *node;
    let config_path = root.root.join(KUBELET_CONFIG);
    let good_config = std::fs::read(&config_path).expect("the kubelet config");
    let v4 = publisher.publish_dir(root, server, "bundle-v4", 4, |t, src| {
        let bytes = std::fs::read(nodeward::built::TEST_GUEST_BAD_KUBELET_CONFIG_COMPONENT)
            .expect("the built stand-in");
        let configure = phase(t, "configure");
        let real = configure["component"]
            .as_str()
            .expect("component")
            .to_string();
        std::fs::remove_file(src.join(real)).expect("the real configure's component");
        std::fs::write(src.join(STAND_IN), &bytes).expect("the stand-in's component");
        configure.insert("component".into(), STAND_IN.into());
        configure.insert("sha256".into(), nodeward::digest::sha256_hex(&bytes).into());
    });
    let (mut started, mut before) = (Instant::now(), kubelet_invocation());
    cluster.patch_machine(
        name,
        &json!({"spec": {"phaseBundle": {
            "url": v4.url, "sha256": v4.sha256, "acceptGrantsDigest": v4.digest,
        }}}),
    );
    for attempt in 1..=MAX_ATTEMPTS {
        if attempt > 1 {
            // Nothing before RETRY_AFTER: a pass now leaves the bundle rolled back.
            let installed = installs(root, &v4.digest);
            pass_now(node);
            assert_rolled_back(node, &v4, previous, attempt - 1);
            assert_eq!(installs(root, &v4.digest), installed, "retried early");
            // Then as if RETRY_AFTER had passed (the record's failure moved back by as much):
            // the next pass tries again.
            age_the_failure(root);
            (started, before) = (Instant::now(), kubelet_invocation());
            pass_now_or_rolling_out(node);
        }
        let seen = watch_attempt(node, &v4, previous, &config_path, started);
        eprintln!(
            "daemon: gate attempt {attempt} of {MAX_ATTEMPTS}: v4 current {} ms after the {}; \
             the gate failed (rollback began) after {} ms, the kubelet restarted {} times by \
             systemd meanwhile; gate failure -> rollback complete (previous bundle current, node \
             healthy, BundleRolledBack written) in {} ms",
            seen.installed.as_millis(),
            if attempt == 1 { "patch" } else { "poke" },
            seen.gate_failed.as_millis(),
            seen.crash_restarts,
            (seen.rolled_back - seen.gate_failed).as_millis(),
        );
        // The phases succeeded and left the kubelet's config refused: it exited at each start.
        assert!(
            seen.refused_config_seen,
            "the stand-in's config was never on disk while v4 was current"
        );
        assert!(
            seen.crash_restarts.parse::<u32>().is_ok_and(|n| n > 0),
            "the kubelet crash-looped with it: NRestarts={}",
            seen.crash_restarts
        );
        assert_rolled_back(node, &v4, previous, attempt);
        // The kubelet runs again, started afresh with the previous bundle's config.
        assert_eq!(
            std::fs::read(&config_path).expect("the kubelet config"),
            good_config,
            "the previous configure's kubelet config"
        );
        let after = kubelet_invocation();
        assert!(
            !after.is_empty() && after != before,
            "restarted: {before} -> {after}"
        );
        assert_eq!(unit_property("ActiveState"), "active");
        assert_eq!(installs(root, &v4.digest), attempt as usize);
    }
    // The budget spent: even once RETRY_AFTER has passed, a pass leaves it rolled back.
    let before = kubelet_invocation();
    age_the_failure(root);
    pass_now(node);
    assert_rolled_back(node, &v4, previous, MAX_ATTEMPTS);
    assert_eq!(installs(root, &v4.digest), MAX_ATTEMPTS as usize);
    assert_eq!(
        kubelet_invocation(),
        before,
        "no third attempt restarted it"
    );
}

/// What the test saw of one attempt, timed from the patch (or poke) that started it.
struct Seen {
    /// v4 became current.
    installed: Duration,
    /// The previous bundle became current again: the gate had failed.
    gate_failed: Duration,
    /// `BundleRolledBack` written, for this attempt.
    rolled_back: Duration,
    /// The stand-in's kubelet config was on disk while v4 was current.
    refused_config_seen: bool,
    /// The kubelet's automatic restarts (`NRestarts`) when the gate had failed.
    crash_restarts: String,
}

/// Follows one attempt, started at `t`, until the daemon reports it rolled back.
fn watch_attempt(
    node: &Node,
    v4: &Published,
    previous: &Published,
    config: &Path,
    t: Instant,
) -> Seen {
    let attempt = RecordFile::new(&node.root.state_dir)
        .read()
        .ok()
        .flatten()
        .filter(|r| r.sha256 == v4.sha256)
        .map_or(1, |r| r.attempts + 1);
    let current = node.root.state_dir.join("bundles/current");
    let (mut installed, mut gate_failed) = (None, None);
    let (mut refused_config_seen, mut crash_restarts) = (false, String::new());
    let rolled_back = wait_logged(
        &format!("attempt {attempt} of v4 rolled back"),
        Duration::from_secs(400),
        node.log_path,
        || {
            let link = std::fs::read_link(&current)
                .map(|p| p.display().to_string())
                .unwrap_or_default();
            let refused =
                || std::fs::read_to_string(config).is_ok_and(|c| c.starts_with(STAND_IN_MARK));
            match (installed, gate_failed) {
                // Current, or (when the test looked too late for the link) already run.
                (None, _) if link.contains(&v4.digest) || refused() => {
                    installed = Some(t.elapsed());
                    refused_config_seen |= refused();
                }
                (Some(_), None) if link.contains(&previous.digest) => {
                    gate_failed = Some(t.elapsed());
                    crash_restarts = unit_property("NRestarts");
                }
                (Some(_), None) => refused_config_seen |= refused(),
                _ => {}
            }
            gate_failed?;
            let record = RecordFile::new(&node.root.state_dir).read().ok()??;
            let done = record.sha256 == v4.sha256
                && record.stage == Stage::Failed
                && record.attempts == attempt;
            let m = machine(node)?;
            (done && rolled_back_message(&m).contains(&format!("(attempt {attempt} of")))
                .then(|| t.elapsed())
        },
    );
    Seen {
        installed: installed.expect("seen installed"),
        gate_failed: gate_failed.expect("seen the gate fail"),
        rolled_back,
        refused_config_seen,
        crash_restarts,
    }
}

/// The Machine says v4 is rolled back after `attempts` failed gates, the node runs `previous`
/// (status, store, `phases list`) and is Ready.
#[track_caller]
fn assert_rolled_back(node: &Node, v4: &Published, previous: &Published, attempts: u32) {
    let m = machine(node).expect("the Machine");
    let (status, reason, active) = bundle_state(&m);
    assert_eq!(
        (status.as_str(), reason.as_str(), active.as_str()),
        ("False", "BundleRolledBack", previous.digest.as_str()),
        "{m}"
    );
    let message = rolled_back_message(&m);
    // The gate failed (the kubelet's health never answered), not a phase; the restore worked.
    for part in [
        "did not pass the roll-out",
        "timed out",
        "kubelet health",
        "rolled back to",
        &previous.digest[..16],
        &format!("(attempt {attempts} of {MAX_ATTEMPTS})"),
    ] {
        assert!(message.contains(part), "{part:?} in {message}");
    }
    assert!(
        !message.contains("restoring the previous bundle failed"),
        "{message}"
    );
    let record = RecordFile::new(&node.root.state_dir)
        .read()
        .expect("the roll-out record")
        .expect("a roll-out record");
    assert_eq!(
        (record.stage, record.attempts, record.digest.as_deref()),
        (Stage::Failed, attempts, Some(v4.digest.as_str())),
        "{record:?}"
    );
    let current = std::fs::read_link(node.root.state_dir.join("bundles/current")).expect("current");
    assert!(
        current.to_string_lossy().contains(&previous.digest),
        "{}",
        current.display()
    );
    let list = ok(node.root, &["phases", "list"]);
    assert_eq!(list["bundle"]["digest"], previous.digest.as_str(), "{list}");
    let n = node
        .cluster
        .get_json(&["get", "node", node.name])
        .expect("the Node");
    let ready = n["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["status"] == "True");
    assert!(ready, "the node is Ready again: {n}");
}

fn machine(node: &Node) -> Option<Value> {
    node.cluster
        .get_json(&["get", "machines.nodeward.io", node.name])
}

/// The `BundleApplied` message when the condition says `BundleRolledBack`, else "".
fn rolled_back_message(m: &Value) -> String {
    condition(m, "BundleApplied")
        .filter(|c| c["reason"] == "BundleRolledBack")
        .and_then(|c| c["message"].as_str())
        .unwrap_or_default()
        .to_string()
}

/// How many times the store installed `digest` (`phases history`: one entry per install).
fn installs(root: &NodeRoot, digest: &str) -> usize {
    let history = ok(root, &["phases", "history"]);
    history["entries"]
        .as_array()
        .expect("history entries")
        .iter()
        .filter(|e| e["digest"] == digest)
        .count()
}

/// Moves the roll-out record's last failure back by [`RETRY_AFTER`]: what waiting that long
/// would do, without the wait (the daemon reads the record at every pass).
fn age_the_failure(root: &NodeRoot) {
    let file = RecordFile::new(&root.state_dir);
    let mut record = file.read().expect("the record").expect("a record");
    record.failed_at = record.failed_at.saturating_sub(RETRY_AFTER.as_secs());
    file.write(&record).expect("write the record");
}

/// The daemon's passes so far, by its metrics.
fn passes(log_path: &Path) -> u64 {
    scrape_metrics(log_path)
        .lines()
        .filter(|l| l.starts_with("nodeward_daemon_reconciles_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// Annotates the Machine (any event on it makes the daemon run a pass) once no pass has
/// run for 2 s; the number of passes before.
fn poke(node: &Node) -> u64 {
    let mut last = (passes(node.log_path), Instant::now());
    let quiet = wait_logged(
        "the daemon idle",
        Duration::from_secs(60),
        node.log_path,
        || {
            let now = passes(node.log_path);
            if now != last.0 {
                last = (now, Instant::now());
            }
            (last.1.elapsed() >= Duration::from_secs(2)).then_some(now)
        },
    );
    node.cluster.kubectl_ok(&[
        "annotate",
        "--overwrite",
        "machines.nodeward.io",
        node.name,
        &format!("nodeward.test/poke={}", fastrand::u32(..)),
    ]);
    quiet
}

/// [`poke`], then waits until a pass has ended: with no pass running before the poke, that
/// is the pass the poke asked for (or a later one).
fn pass_now(node: &Node) {
    let before = poke(node);
    wait_logged(
        "a pass after the poke",
        Duration::from_secs(60),
        node.log_path,
        || (passes(node.log_path) > before).then_some(()),
    );
}

/// [`poke`], then waits until the daemon reports the roll-out it starts.
fn pass_now_or_rolling_out(node: &Node) {
    poke(node);
    wait_logged(
        "the next attempt started",
        Duration::from_secs(60),
        node.log_path,
        || {
            let m = machine(node)?;
            (bundle_state(&m).1 == "BundleInstalling").then_some(())
        },
    );
}

/// A property of the kubelet's unit in the harness.
fn unit_property(property: &str) -> String {
    let out = std::process::Command::new("systemctl")
        .args(["show", "-p", property, "--value", NODE_UNITS[1]])
        .output()
        .expect("systemctl");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}
