//! Loading the node configuration: a file (YAML or JSON) or the embedded example.
//!
//! The embedded example (`host/default-config.yaml`) uses example values only, so `plan` and
//! `apply` against a temporary root work anywhere without a cluster or network.

use nodeward_node_config::NodeConfig;
use nodeward_node_config::secret::BOOTSTRAP_TOKEN_REF;
use std::path::Path;

/// The example configuration built into the binary.
pub const EMBEDDED: &str = include_str!("default-config.yaml");

/// Why a configuration was refused; names the file and the field.
#[derive(Debug, thiserror::Error)]
#[error("{source_desc}: {problem}")]
pub struct ConfigError {
    /// The file, or "embedded example config".
    pub source_desc: String,
    /// What is wrong (never a secret value).
    #[source]
    pub problem: ConfigProblem,
}

/// What is wrong with a configuration document.
#[derive(Debug, thiserror::Error)]
pub enum ConfigProblem {
    /// The file cannot be read.
    #[error("cannot read: {0}")]
    Read(#[source] std::io::Error),
    /// Not valid JSON for a `NodeConfig` (a document that is JSON is read as JSON).
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    /// Not valid YAML for a `NodeConfig`.
    #[error(transparent)]
    Yaml(#[from] serde_yaml_ng::Error),
    /// Parsed, but a field is invalid.
    #[error(transparent)]
    Invalid(#[from] nodeward_node_config::InvalidField),
}

/// Loads and validates the configuration at `path`, or the embedded example.
pub fn load(path: Option<&Path>) -> Result<NodeConfig, ConfigError> {
    let (text, source_desc) = match path {
        Some(p) => (
            std::fs::read_to_string(p).map_err(|e| ConfigError {
                source_desc: p.display().to_string(),
                problem: ConfigProblem::Read(e),
            })?,
            p.display().to_string(),
        ),
        None => (EMBEDDED.to_string(), "embedded example config".to_string()),
    };
    parse(&text, &source_desc)
}

/// Parses (YAML or JSON) and validates a configuration document.
///
/// A document that is JSON is read as JSON: the YAML parser refuses some valid JSON (a key
/// longer than 1024 characters, YAML's limit on implicit keys; found by `fuzz/`). A document
/// starting with `{` that is not JSON is read as YAML (a flow mapping).
pub fn parse(text: &str, source_desc: &str) -> Result<NodeConfig, ConfigError> {
    let config = deserialize(text, source_desc)?;
    config.validate().map_err(|e| ConfigError {
        source_desc: source_desc.to_string(),
        problem: e.into(),
    })?;
    Ok(config)
}

/// [`parse`] for a document that others can read (a ConfigMap every node reads): its
/// bootstrap token must be the reference `nodeward-secret:bootstrap-token`, never a value,
/// and the caller puts the node's own token in its place.
pub fn parse_shared(text: &str, source_desc: &str) -> Result<NodeConfig, ConfigError> {
    let config = deserialize(text, source_desc)?;
    if config.kubelet.auth.bootstrap_token.expose() != BOOTSTRAP_TOKEN_REF {
        return Err(ConfigError {
            source_desc: source_desc.to_string(),
            problem: ConfigProblem::Invalid(nodeward_node_config::InvalidField {
                field: "kubelet.auth.bootstrapToken".into(),
                reason: format!(
                    "must be the reference {BOOTSTRAP_TOKEN_REF:?}: every node can read this document (each node uses its own token)"
                ),
            }),
        });
    }
    config.validate_phase_view().map_err(|e| ConfigError {
        source_desc: source_desc.to_string(),
        problem: e.into(),
    })?;
    Ok(config)
}

/// The document read as YAML or JSON (see [`parse`]), not validated.
fn deserialize(text: &str, source_desc: &str) -> Result<NodeConfig, ConfigError> {
    let err = |problem: ConfigProblem| ConfigError {
        source_desc: source_desc.to_string(),
        problem,
    };
    let json = text
        .trim_start()
        .starts_with('{')
        .then(|| serde_json::from_str::<NodeConfig>(text))
        .filter(|r| r.as_ref().map_or_else(|e| e.is_data(), |_| true));
    let config: NodeConfig = match json {
        Some(parsed) => parsed.map_err(|e| err(e.into()))?,
        None => serde_yaml_ng::from_str(text).map_err(|e| err(e.into()))?,
    };
    Ok(config)
}

/// The agent's state directory beneath the host root, unless `--state-dir` names another:
/// the compiled component cache (`compiled/`) and the installed bundles (`bundles/`), beside
/// the node's state (`node/`) and the artifact cache (`artifacts/`).
pub const STATE_DIR: &str = "var/lib/nodeward";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_example_is_valid() {
        let c = load(None).expect("embedded config");
        assert_eq!(c.machine_name, "worker-01");
    }

    #[test]
    fn json_with_a_key_over_yaml_limit_is_accepted() {
        let mut doc: serde_json::Value =
            serde_json::to_value(load(None).expect("embedded config")).expect("to JSON");
        doc["kubelet"]["config"] = serde_json::json!({ "k".repeat(1100): 1 });
        let text = doc.to_string();
        assert!(
            serde_yaml_ng::from_str::<NodeConfig>(&text).is_err(),
            "the YAML parser refuses it"
        );
        let c = parse(&text, "node.json").expect("valid JSON config");
        assert!(c.kubelet.config.contains_key(&"k".repeat(1100)));
        // Not JSON, but a YAML flow mapping: still read as YAML.
        let flow = "{apiVersion: nodeward.io/v1alpha1, kind: NodeConfig}";
        let e = parse(flow, "node.yaml").expect_err("missing fields");
        assert!(e.problem.to_string().contains("machineName"), "{e}");
        // JSON with a typo: JSON's error, naming the field.
        let typo = text.replace("machineName", "machineNmae");
        let e = parse(&typo, "node.json").expect_err("typo");
        assert!(e.problem.to_string().contains("machineNmae"), "{e}");
    }

    #[test]
    fn unknown_field_names_file_and_field() {
        let text = EMBEDDED.replace("machineName:", "machineNmae:");
        let e = parse(&text, "node.yaml").expect_err("typo");
        let msg = e.to_string();
        assert!(
            msg.starts_with("node.yaml:") && msg.contains("machineNmae"),
            "{msg}"
        );
    }
}
