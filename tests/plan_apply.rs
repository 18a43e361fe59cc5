//! `nodeward plan --phase` and `nodeward apply --phase` (the built binary) on the embedded bundle
//! and config, for the two phases that only write files and kernel settings (`setup-host`,
//! `configure`): plan leaves the root byte-identical; apply makes exactly the planned changes;
//! a second plan is empty; the bootstrap token never reaches output or logs and its file is
//! 0600. The whole bootstrap (which needs systemd) is tested in `tests/none_stub.rs`.

mod common;

use common::*;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::PermissionsExt;

fn json_run(f: &Fixture, verb: &str) -> (Value, String) {
    let out = nodeward(
        f,
        &[
            verb,
            "--phase",
            "setup-host",
            "--phase",
            "configure",
            "--output",
            "json",
            "--log-format",
            "json",
            "--log-level",
            "debug",
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{verb} failed: {stderr}");
    (
        serde_json::from_str(&stdout).expect("stdout is one JSON object"),
        format!("{stdout}{stderr}"),
    )
}

/// Paths a change list says will differ in the tree.
fn paths_of(changes: &[Value]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for c in changes {
        match c["kind"].as_str().unwrap_or_default() {
            "file-create" | "file-replace" | "dir-create" | "mode-change" | "remove"
            | "symlink" | "secret-file" => {
                out.insert(c["path"].as_str().unwrap_or_default().to_string());
            }
            "sysctl" => {
                let key = c["key"].as_str().unwrap_or_default().replace('.', "/");
                out.insert(format!("proc/sys/{key}"));
            }
            "module-load" => {
                out.insert("proc/modules".into());
            }
            other => panic!("unexpected change kind {other} in the default bundle"),
        }
    }
    out
}

/// The node lock `apply` holds (and its directories), which is no change of the host's.
const NODE_LOCK: [&str; 3] = ["run", "run/nodeward", "run/nodeward/node.lock"];

/// The audit trail every run writes beneath the root (`var/log/nodeward/audit`, and the
/// directories it made), which records changes and is none.
fn audit_trail(path: &str) -> bool {
    path == "var" || path == "var/log" || path.starts_with("var/log/nodeward")
}

/// `tree` without the audit trail.
fn without_trail(
    mut tree: BTreeMap<String, (char, u32, Vec<u8>)>,
) -> BTreeMap<String, (char, u32, Vec<u8>)> {
    tree.retain(|p, _| !audit_trail(p));
    tree
}

#[test]
fn plan_is_read_only_apply_does_exactly_the_plan_and_converges() {
    let f = Fixture::new();
    // A host with an older containerd config, to exercise replace + diff.
    f.put("etc/containerd/config.toml", "version = 2\n");
    let before = snapshot(&f.root);

    let (plan, plan_text) = json_run(&f, "plan");
    assert_eq!(
        without_trail(snapshot(&f.root)),
        before,
        "plan changed the host"
    );
    assert!(
        f.root.join("var/log/nodeward/audit/audit.jsonl").is_file(),
        "plan wrote its audit trail"
    );
    assert_eq!(plan["mode"], "plan");
    let planned = plan["changes"].as_array().expect("changes").clone();
    assert!(planned.len() > 20, "{planned:?}");
    assert!(
        planned
            .iter()
            .all(|c| c["phase"].is_string() && c["kind"].is_string())
    );
    let replace = planned
        .iter()
        .find(|c| c["kind"] == "file-replace" && c["path"] == "etc/containerd/config.toml")
        .expect("containerd config is replaced");
    assert!(
        replace["diff"]
            .as_str()
            .unwrap_or_default()
            .contains("-version = 2")
    );

    let (apply, apply_text) = json_run(&f, "apply");
    assert_eq!(
        apply["changes"], plan["changes"],
        "apply made exactly the planned changes"
    );
    let after = snapshot(&f.root);
    // The tree differs from before in exactly the planned paths (plus parents of proc/ files,
    // which the kernel capability creates beneath a non-/ root, and the node lock apply holds,
    // `run/nodeward/node.lock`, on /run's tmpfs in production).
    let changed: BTreeSet<String> = after
        .iter()
        .filter(|(p, v)| before.get(*p) != Some(v))
        .map(|(p, _)| p.clone())
        .filter(|p| !(p.starts_with("proc") && after[p].0 == 'd'))
        .filter(|p| !NODE_LOCK.contains(&p.as_str()))
        .filter(|p| !audit_trail(p) || paths_of(&planned).contains(p))
        .collect();
    assert_eq!(changed, paths_of(&planned));
    for c in &planned {
        if let Some(mode) = c["mode"].as_str() {
            let path = f.root.join(c["path"].as_str().unwrap_or_default());
            let actual = std::fs::metadata(&path)
                .expect("planned path exists")
                .permissions()
                .mode()
                & 0o7777;
            assert_eq!(format!("{actual:04o}"), mode, "{}", path.display());
        }
        if let Some(sha) = c["sha256"].as_str() {
            let bytes =
                std::fs::read(f.root.join(c["path"].as_str().unwrap_or_default())).expect("file");
            assert_eq!(
                hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&bytes)),
                sha
            );
        }
    }

    let (again, again_text) = json_run(&f, "plan");
    assert_eq!(
        again["changes"],
        Value::Array(vec![]),
        "a second plan after apply is empty"
    );
    let (reapply, _) = json_run(&f, "apply");
    assert_eq!(reapply["changes"], Value::Array(vec![]));
    // The lock file names its last holder's PID, which differs.
    let without_lock = |mut tree: BTreeMap<String, (char, u32, Vec<u8>)>| {
        tree.retain(|p, _| !NODE_LOCK.contains(&p.as_str()));
        tree
    };
    assert_eq!(
        without_trail(without_lock(snapshot(&f.root))),
        without_trail(without_lock(after)),
        "a second apply changes nothing"
    );

    // Secrets: the token is only in its 0600 file, never in output or logs.
    for text in [&plan_text, &apply_text, &again_text] {
        assert!(!text.contains(TOKEN_SECRET), "the bootstrap token leaked");
        assert!(
            text.contains("nodeward::audit"),
            "the audit log is on stderr"
        );
    }
    let kubeconfig = f.root.join("etc/kubernetes/bootstrap-kubelet.conf");
    assert!(
        std::fs::read_to_string(&kubeconfig)
            .expect("kubeconfig")
            .contains(TOKEN)
    );
    assert_eq!(
        std::fs::metadata(&kubeconfig)
            .expect("meta")
            .permissions()
            .mode()
            & 0o777,
        0o600
    );
    // The host renders it (before configure) and lists it by path, mode and action only:
    // no digest, size or diff of a file whose every other byte is in the config.
    let planned_kubeconfig = planned
        .iter()
        .find(|c| c["path"] == "etc/kubernetes/bootstrap-kubelet.conf")
        .expect("kubeconfig planned");
    assert_eq!(
        planned_kubeconfig,
        &serde_json::json!({
            "phase": "nodeward", "kind": "secret-file",
            "path": "etc/kubernetes/bootstrap-kubelet.conf", "mode": "0600", "action": "create"
        })
    );
    let digest = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(
        std::fs::read(&kubeconfig).expect("kubeconfig"),
    ));
    for text in [&plan_text, &apply_text, &again_text] {
        assert!(
            !text.contains(&digest),
            "the kubeconfig's sha256 was printed"
        );
    }
}

#[test]
fn text_output_shows_diffs_without_the_token() {
    let f = Fixture::new();
    let out = nodeward(&f, &["plan"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("phase setup-host:") && text.contains("phase configure:"),
        "{text}"
    );
    assert!(text.contains("+net.ipv4.ip_forward = 1"), "{text}");
    assert!(
        text.contains("create file etc/kubernetes/bootstrap-kubelet.conf (0600"),
        "{text}"
    );
    assert!(!text.contains(TOKEN_SECRET));
    assert!(text.trim_end().ends_with("change(s) planned."));
    let by_phase: BTreeMap<&str, usize> = text
        .lines()
        .filter_map(|l| l.strip_prefix("phase "))
        .map(|l| (l.split(':').next().unwrap_or(""), 1))
        .collect();
    // `plan` without --phase plans a whole bootstrap (everything but the health wait).
    assert_eq!(
        by_phase.keys().copied().collect::<Vec<_>>(),
        [
            "configure",
            "download-artifacts",
            "install",
            "preflight",
            "setup-host",
            "start-node"
        ],
        "{text}"
    );
    assert!(
        text.contains("unit nodeward-kubelet.service") || text.contains("nodeward-kubelet.service"),
        "{text}"
    );
}

#[test]
fn phase_selection_runs_only_the_named_phases() {
    let f = Fixture::new();
    let out = nodeward(&f, &["apply", "--phase", "setup-host", "--output", "json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("json");
    let phases: Vec<&str> = v["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .filter_map(|p| p["name"].as_str())
        .collect();
    assert_eq!(phases, ["setup-host"]);
    assert!(
        v["changes"]
            .as_array()
            .expect("changes")
            .iter()
            .all(|c| c["phase"] == "setup-host")
    );
    assert!(f.root.join("etc/containerd").is_dir());
    assert!(
        !f.root.join("etc/containerd/config.toml").exists(),
        "configure did not run"
    );
}
