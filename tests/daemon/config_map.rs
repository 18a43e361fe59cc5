//! `spec.config.configMapRef` on the real API server, read with the node's own credentials
//! under `deploy/rbac.yaml` (nodes may `get` ConfigMaps in `nodeward-system`): missing →
//! `ConfigUnreadable` naming it; a document holding a real token → `ConfigInvalid`, the token
//! never in the status; the node's own config, shared (the token as its reference) → the node
//! is up to date, nothing repaved. A ConfigMap is not watched: the test pokes the Machine (an
//! annotation) for the next pass, as docs/daemon.md tells operators.

use crate::cluster::Cluster;
use crate::{apply, condition, wait_logged};
use serde_json::{Value, json};
use std::path::Path;
use std::time::Duration;

const NAMESPACE: &str = "nodeward-system";

/// Points Machine `name` at a ConfigMap holding `node_config` (the document the node was
/// bootstrapped with, real token included) and walks it through the cases above; leaves the
/// Machine without `spec.config` again.
pub fn walk(cluster: &Cluster, dir: &Path, log: &Path, name: &str, node_config: &str) {
    let cm = format!("{name}-config");
    let patch = json!({"spec": {"config": {"configMapRef":
        {"name": cm, "namespace": NAMESPACE, "key": "config.yaml"}}}});
    cluster.patch_machine(name, &patch);
    let m = updated_with(cluster, log, name, "ConfigUnreadable");
    let message = condition(&m, "NodeUpdated").expect("NodeUpdated")["message"].clone();
    let message = message.as_str().unwrap_or_default();
    assert!(
        message.contains(&format!("ConfigMap {NAMESPACE}/{cm} key config.yaml"))
            && message.contains("no such ConfigMap"),
        "{m}"
    );
    // The Machine is Failed (it asks for what cannot be read); the node is not touched.
    assert_eq!(m["status"]["phase"], "Failed", "{m}");
    let repave = condition(&m, "RepavePending").expect("RepavePending");
    assert_eq!(repave["status"], "False", "nothing acted on: {m}");

    let mut doc: Value = serde_yaml_ng::from_str(node_config).expect("the node config");
    let token = doc["kubelet"]["auth"]["bootstrapToken"]
        .as_str()
        .expect("a token")
        .to_string();
    put_config_map(cluster, dir, &cm, &doc.to_string());
    poke(cluster, name, "real-token");
    let m = updated_with(cluster, log, name, "ConfigInvalid");
    let text = m.to_string();
    assert!(text.contains("kubelet.auth.bootstrapToken"), "{m}");
    assert!(
        !text.contains(&token),
        "the bootstrap token is in the status: {m}"
    );

    doc["kubelet"]["auth"]["bootstrapToken"] = json!("nodeward-secret:bootstrap-token");
    put_config_map(cluster, dir, &cm, &doc.to_string());
    poke(cluster, name, "shared");
    let m = updated_with(cluster, log, name, "UpToDate");
    let repave = condition(&m, "RepavePending").expect("RepavePending");
    assert_eq!(repave["status"], "False", "the same config: no repave: {m}");
    assert_eq!(m["status"]["phase"], "Ready", "{m}");

    cluster.patch_machine(name, &json!({"spec": {"config": null}}));
    cluster.kubectl_ok(&["delete", "configmap", "-n", NAMESPACE, &cm]);
}

/// A change to the Machine that is not a spec change: the next pass reads the ConfigMap again.
fn poke(cluster: &Cluster, name: &str, value: &str) {
    cluster.kubectl_ok(&[
        "annotate",
        "--overwrite",
        "machines.nodeward.io",
        name,
        &format!("test.nodeward.io/poke={value}"),
    ]);
}

fn put_config_map(cluster: &Cluster, dir: &Path, cm: &str, document: &str) {
    apply(
        cluster,
        dir,
        &json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": cm, "namespace": NAMESPACE},
            "data": {"config.yaml": document},
        }),
    );
}

/// Waits until the Machine's `NodeUpdated` reason is `reason` at its current generation.
fn updated_with(cluster: &Cluster, log: &Path, name: &str, reason: &str) -> Value {
    wait_logged(
        &format!("NodeUpdated {reason}"),
        Duration::from_secs(30),
        log,
        || {
            let m = cluster.get_json(&["get", "machines.nodeward.io", name])?;
            let c = condition(&m, "NodeUpdated")?;
            (c["reason"] == reason
                && m["status"]["observedGeneration"] == m["metadata"]["generation"])
                .then_some(m)
        },
    )
}
