//! Unit tests of `spec.config.configMapRef` in a reconcile pass ([`crate::daemon::config_map`]),
//! over the in-memory fakes; the real API server and RBAC are exercised by the cluster test.

use super::fakes::*;
use super::*;
use futures_lite::future::block_on;
use k8s_openapi::api::core::v1::ConfigMap;
use nodeward_api::machine::ConfigSource;
use std::collections::BTreeMap;

/// A Machine whose config is the ConfigMap `nodeward-system/node-config` key `config.yaml`.
fn with_config_map_ref(name: &str) -> FakeApi {
    let api = with_machine(name);
    api.machines
        .borrow_mut()
        .get_mut(name)
        .expect("machine")
        .spec
        .config = Some(ConfigSource::ConfigMapRef(
        nodeward_api::machine::ConfigMapKeyRef {
            name: "node-config".into(),
            namespace: "nodeward-system".into(),
            key: "config.yaml".into(),
        },
    ));
    api
}

fn put_config_map(api: &FakeApi, key: &str, document: &str) {
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some("node-config".into());
    cm.data = Some(BTreeMap::from([(key.to_string(), document.to_string())]));
    api.config_maps
        .borrow_mut()
        .insert("nodeward-system/node-config".into(), cm);
}

fn node_updated(api: &FakeApi, name: &str) -> (String, String) {
    let m = &api.machines.borrow()[name];
    let c = m
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "NodeUpdated"))
        .expect("NodeUpdated");
    (c.reason.clone(), c.message.clone())
}

/// The embedded example config as a shared document: the token as its reference.
fn shared_document() -> String {
    let c = crate::config::load(None)
        .expect("embedded")
        .with_secret_references();
    serde_yaml_ng::to_string(&c).expect("YAML")
}

#[test]
fn a_configmap_ref_is_read_and_handed_to_the_mode_inline() {
    let api = with_config_map_ref("w1");
    put_config_map(&api, "config.yaml", &shared_document());
    let mode = FakeMode::default();
    block_on(reconcile_machine(&api, &mode, "w1", || at(NOW))).expect("pass");
    assert_eq!(node_updated(&api, "w1").0, "UpToDate");
    let seen = mode.seen_inline.borrow().clone().expect("inline");
    assert_eq!(seen.machine_name, "worker-01");
    // The Machine on the server still names the ConfigMap: the pass changes only the status.
    assert!(matches!(
        api.machines.borrow()["w1"].spec.config,
        Some(ConfigSource::ConfigMapRef(_))
    ));
}

#[test]
fn a_missing_configmap_or_key_is_unreadable_naming_it_and_nothing_is_acted_on() {
    let api = with_config_map_ref("w1");
    let mode = FakeMode::default();
    mode.drift.set(true);
    block_on(reconcile_machine(&api, &mode, "w1", || at(NOW))).expect("pass");
    let (reason, message) = node_updated(&api, "w1");
    assert_eq!(reason, "ConfigUnreadable");
    assert!(
        message.contains("ConfigMap nodeward-system/node-config key config.yaml")
            && message.contains("no such ConfigMap"),
        "{message}"
    );
    put_config_map(&api, "other.yaml", &shared_document());
    block_on(reconcile_machine(&api, &mode, "w1", || at(NOW))).expect("pass");
    let (reason, message) = node_updated(&api, "w1");
    assert_eq!(reason, "ConfigUnreadable");
    assert!(message.contains("no key \"config.yaml\""), "{message}");
    assert!(mode.acts.borrow().is_empty(), "no repave: {:?}", mode.acts);
}

#[test]
fn a_configmap_holding_a_real_token_or_garbage_is_invalid_and_the_token_never_shown() {
    let api = with_config_map_ref("w1");
    let real = crate::config::load(None).expect("embedded");
    let token = real.kubelet.auth.bootstrap_token.expose().to_string();
    put_config_map(
        &api,
        "config.yaml",
        &serde_yaml_ng::to_string(&real).expect("YAML"),
    );
    let mode = FakeMode::default();
    block_on(reconcile_machine(&api, &mode, "w1", || at(NOW))).expect("pass");
    let (reason, message) = node_updated(&api, "w1");
    assert_eq!(reason, "ConfigInvalid");
    assert!(message.contains("kubelet.auth.bootstrapToken"), "{message}");
    assert!(!message.contains(&token), "the token leaked: {message}");
    assert!(mode.seen_inline.borrow().is_none());
    put_config_map(&api, "config.yaml", "kind: [unclosed");
    block_on(reconcile_machine(&api, &mode, "w1", || at(NOW))).expect("pass");
    assert_eq!(node_updated(&api, "w1").0, "ConfigInvalid");
}

#[test]
fn an_unreachable_server_while_reading_the_configmap_fails_the_pass() {
    struct Flaky(FakeApi);
    impl MachineApi for Flaky {
        async fn machine(&self, name: &str) -> Result<Option<Machine>, ApiError> {
            self.0.machine(name).await
        }
        async fn replace_machine_status(&self, m: &Machine) -> Result<Machine, ApiError> {
            self.0.replace_machine_status(m).await
        }
        async fn operation(&self, name: &str) -> Result<Option<MachineOperation>, ApiError> {
            self.0.operation(name).await
        }
        async fn replace_operation_status(
            &self,
            op: &MachineOperation,
        ) -> Result<MachineOperation, ApiError> {
            self.0.replace_operation_status(op).await
        }
        async fn delete_operation(&self, name: &str) -> Result<(), ApiError> {
            self.0.delete_operation(name).await
        }
        async fn config_map(&self, _: &str, _: &str) -> Result<Option<ConfigMap>, ApiError> {
            Err(ApiError::Unreachable("connection refused".into()))
        }
    }
    let api = Flaky(with_config_map_ref("w1"));
    let mode = FakeMode::default();
    let r = block_on(reconcile_machine(&api, &mode, "w1", || at(NOW)));
    assert!(matches!(r, Err(ApiError::Unreachable(_))), "{r:?}");
    assert_eq!(api.0.writes.get(), 0, "no status written from a guess");
}

#[test]
fn a_read_configmap_resolves_with_the_nodes_own_token() {
    let api = with_config_map_ref("w1");
    put_config_map(&api, "config.yaml", &shared_document());
    let m = api.machines.borrow()["w1"].clone();
    let (view, unread) = block_on(crate::daemon::config_map::read(&api, m)).expect("read");
    assert!(unread.is_none(), "{unread:?}");
    let node = crate::config::load(None).expect("embedded");
    let base = crate::daemon::resolve::base(&view, &node).expect("base");
    assert_eq!(
        base.kubelet.auth.bootstrap_token.expose(),
        node.kubelet.auth.bootstrap_token.expose()
    );
    assert_eq!(
        base, node,
        "the shared document of the node's own config is its config"
    );
}
