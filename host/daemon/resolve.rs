//! The node config a Machine's spec asks for: a base config with the spec's fields laid over it.
//!
//! # Background
//! A Machine names its node's config in three ways (`docs/daemon.md`): inline, by ConfigMap
//! (read by the pass before the mode resolves it: `crate::daemon::config_map`), or not at all (then the daemon's `--config`, else the config the node already runs). Over
//! that base the spec's own fields win: `kubernetesVersion`, `artifacts` and `labels` key by
//! key, `taints` as a whole when given. The result is compared with the applied config by
//! fingerprint: a difference is spec drift, which the mode repaves.
//!
//! # Guarantees
//! - [`resolve`] is pure: a base and a spec in, a validated config or the reason out.
//! - An inline config carries the bootstrap token only as its reference
//!   (`nodeward-secret:bootstrap-token`, the Machine is readable by every node); [`resolve`]
//!   puts the node's own token (from its base) in its place, so a spec never needs the secret.
//! - A spec asking for a mode this agent does not run (`nspawn`) is refused as invalid, never
//!   silently run in another mode.

use nodeward_api::Machine;
use nodeward_api::machine::ConfigSource;
use nodeward_node_config::secret::BOOTSTRAP_TOKEN_REF;
use nodeward_node_config::{Mode, NodeConfig};

/// Why a spec does not resolve to a config.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Unresolved {
    /// The config the spec names cannot be read (`NodeUpdated=False`, `ConfigUnreadable`).
    #[error("{0}")]
    Unreadable(String),
    /// The config the spec resolves to is invalid (`NodeUpdated=False`, `ConfigInvalid`).
    #[error("{0}")]
    Invalid(String),
}

/// The base config of `machine`'s spec: its inline config (the token from `fallback`), else
/// `fallback` (the daemon's `--config`, else the node's applied config).
pub fn base(machine: &Machine, fallback: &NodeConfig) -> Result<NodeConfig, Unresolved> {
    match &machine.spec.config {
        None => Ok(fallback.clone()),
        Some(ConfigSource::Inline(inline)) => {
            let mut config = (**inline).clone();
            if config.kubelet.auth.bootstrap_token.expose() == BOOTSTRAP_TOKEN_REF {
                config.kubelet.auth.bootstrap_token = fallback.kubelet.auth.bootstrap_token.clone();
            }
            Ok(config)
        }
        // The pass reads the ConfigMap first and hands over the Machine with its document
        // inline (`crate::daemon::config_map::read`); a reference left is one it could not
        // read, and the pass puts why in place of this.
        Some(ConfigSource::ConfigMapRef(r)) => Err(Unresolved::Unreadable(format!(
            "{}: not read",
            crate::daemon::config_map::describe(r)
        ))),
    }
}

/// `base` with `machine`'s spec laid over it, validated.
pub fn resolve(machine: &Machine, base: NodeConfig) -> Result<NodeConfig, Unresolved> {
    let spec = &machine.spec;
    let mut config = base;
    if let Some(mode) = spec.mode {
        config.mode = mode;
    }
    if config.mode == Mode::Nspawn {
        return Err(Unresolved::Invalid(
            "mode nspawn is not implemented by this agent; use mode none".into(),
        ));
    }
    config
        .cluster
        .kubernetes_version
        .clone_from(&spec.kubernetes_version);
    for (name, pin) in &spec.artifacts {
        config.downloads.insert(name.clone(), pin.clone());
    }
    for (key, value) in &spec.labels {
        config.kubelet.labels.insert(key.clone(), value.clone());
    }
    if let Some(taints) = &spec.taints {
        config.kubelet.register_with_taints.clone_from(taints);
    }
    config
        .validate()
        .map_err(|e| Unresolved::Invalid(format!("the node config the spec resolves to: {e}")))?;
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodeward_node_config::{DownloadOverride, Taint};

    fn embedded() -> NodeConfig {
        crate::config::load(None).expect("the embedded config")
    }

    fn machine(version: &str) -> Machine {
        crate::daemon::test_machine("worker-01", version)
    }

    #[test]
    fn the_spec_wins_key_by_key_and_taints_as_a_whole() {
        let base = embedded();
        let mut m = machine("1.35.0");
        let pin = DownloadOverride {
            url: "https://mirror.example/kubelet".into(),
            sha256: "a".repeat(64),
        };
        m.spec.artifacts.insert("kubelet".into(), pin.clone());
        m.spec.labels.insert("zone".into(), "edge-1".into());
        m.spec.taints = Some(vec![Taint {
            key: "edge".into(),
            value: String::new(),
            effect: "NoSchedule".into(),
        }]);
        let r = resolve(&m, base.clone()).expect("resolves");
        assert_eq!(r.cluster.kubernetes_version, "1.35.0");
        assert_eq!(r.downloads.get("kubelet"), Some(&pin));
        for (k, v) in &base.downloads {
            if k != "kubelet" {
                assert_eq!(r.downloads.get(k), Some(v), "{k} kept");
            }
        }
        assert_eq!(
            r.kubelet.labels.get("zone").map(String::as_str),
            Some("edge-1")
        );
        for (k, v) in &base.kubelet.labels {
            assert_eq!(r.kubelet.labels.get(k), Some(v), "{k} kept");
        }
        assert_eq!(r.kubelet.register_with_taints.len(), 1);
        // The same spec again resolves to the same config (no drift from resolving).
        assert_eq!(resolve(&m, base).expect("resolves"), r);
    }

    #[test]
    fn a_spec_on_the_base_version_resolves_to_the_base() {
        let base = embedded();
        let m = machine(&base.cluster.kubernetes_version);
        assert_eq!(resolve(&m, base.clone()).expect("resolves"), base);
    }

    #[test]
    fn nspawn_and_an_invalid_result_are_refused_as_invalid() {
        let mut m = machine("1.35.0");
        m.spec.mode = Some(Mode::Nspawn);
        assert!(
            matches!(resolve(&m, embedded()), Err(Unresolved::Invalid(e)) if e.contains("nspawn"))
        );
        let mut m = machine("1.35.0");
        m.spec.taints = Some(vec![Taint {
            key: "edge".into(),
            value: String::new(),
            effect: "Sometimes".into(),
        }]);
        assert!(matches!(
            resolve(&m, embedded()),
            Err(Unresolved::Invalid(_))
        ));
    }

    #[test]
    fn an_inline_config_gets_the_nodes_own_token_and_an_unread_configmap_is_unreadable() {
        let fallback = embedded();
        let mut inline = embedded();
        inline.machine_name = "from-the-spec".into();
        inline.kubelet.auth.bootstrap_token =
            serde_json::from_value(serde_json::json!(BOOTSTRAP_TOKEN_REF)).expect("secret");
        let mut m = machine("1.35.0");
        m.spec.config = Some(ConfigSource::Inline(Box::new(inline)));
        let b = base(&m, &fallback).expect("inline");
        assert_eq!(b.machine_name, "from-the-spec");
        assert_eq!(
            b.kubelet.auth.bootstrap_token.expose(),
            fallback.kubelet.auth.bootstrap_token.expose()
        );
        m.spec.config = Some(ConfigSource::ConfigMapRef(
            nodeward_api::machine::ConfigMapKeyRef {
                name: "node-config".into(),
                namespace: "nodeward-system".into(),
                key: "config.yaml".into(),
            },
        ));
        assert!(
            matches!(base(&m, &fallback), Err(Unresolved::Unreadable(e)) if e.contains("node-config"))
        );
    }
}
