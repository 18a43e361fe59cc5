//! Schema pieces the derive cannot express: the conditions list and the inline node config.
//!
//! # Background
//! The API server enforces a CRD's OpenAPI schema on every write, so whatever is said here is
//! refused at `kubectl apply` instead of by the daemon later. Only what the CI cluster's v1.20
//! API server understands is used: `enum`, `pattern`, `maxLength`, `minimum`,
//! `x-kubernetes-list-type` (no CEL).

use crate::message::MAX_MESSAGE_BYTES;
use nodeward_node_config::secret::BOOTSTRAP_TOKEN_REF;
use nodeward_node_config::{API_VERSION, KIND, NodeConfig};
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};

/// The pattern of a Kubernetes version as the node config accepts it (`1.34`, `1.34.1`,
/// `1.34.1-rc.0`).
pub(crate) const KUBERNETES_VERSION_PATTERN: &str =
    r"^[0-9]+\.[0-9]+(\.[0-9]+)?(-[0-9A-Za-z.+-]*)?$";

/// `metav1.Condition`'s schema with the validation its Go type declares (type and reason
/// patterns, the status enum), messages capped at [`MAX_MESSAGE_BYTES`], and the list keyed
/// by `type`, so server-side apply merges one condition at a time.
pub(crate) fn conditions(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "description": "The aspects of the Machine the daemon reports, one per type (AgentBootstrapped, NodeUpdated, BundleApplied, RepavePending). docs/daemon.md lists each reason.",
        "type": "array",
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["type"],
        "items": {
            "type": "object",
            "required": ["type", "status", "reason", "message", "lastTransitionTime"],
            "properties": {
                "type": {
                    "description": "The aspect this condition reports, CamelCase.",
                    "type": "string",
                    "maxLength": 316,
                    "pattern": r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$",
                },
                "status": {
                    "description": "True, False or Unknown.",
                    "type": "string",
                    "enum": ["True", "False", "Unknown"],
                },
                "reason": {
                    "description": "Why the condition has its status, CamelCase.",
                    "type": "string",
                    "minLength": 1,
                    "maxLength": 1024,
                    "pattern": r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$",
                },
                "message": {
                    "description": "What happened, for a human; at most 1 KiB, cut with an ellipsis.",
                    "type": "string",
                    "maxLength": MAX_MESSAGE_BYTES,
                },
                "lastTransitionTime": {
                    "description": "When the status last changed.",
                    "type": "string",
                    "format": "date-time",
                },
                "observedGeneration": {
                    "description": "The Machine's metadata.generation the condition was decided on.",
                    "type": "integer",
                    "format": "int64",
                    "minimum": 0,
                },
            },
        },
    })
}

/// The node config document's own schema, narrowed: `apiVersion` and `kind` are the only
/// values the agent reads, and the bootstrap token may only be the reference
/// [`BOOTSTRAP_TOKEN_REF`]. Every node can read every `Machine` (the daemon lists and watches
/// them), so a real token written here would be readable cluster-wide; the daemon keeps the
/// token the node was bootstrapped with.
pub(crate) fn inline_node_config(generator: &mut SchemaGenerator) -> Schema {
    let mut schema = NodeConfig::json_schema(generator);
    only(&mut schema, &["apiVersion"], API_VERSION, None);
    only(&mut schema, &["kind"], KIND, None);
    only(
        &mut schema,
        &["kubelet", "auth", "bootstrapToken"],
        BOOTSTRAP_TOKEN_REF,
        Some(format!(
            "Always {BOOTSTRAP_TOKEN_REF:?}: a Machine is readable by every node, so it never holds a token; the daemon uses the token the node was bootstrapped with."
        )),
    );
    schema
}

/// Restricts the property at `path` (nested `properties`) to the one `value`, and replaces its
/// description when one is given. The path is the node config's own, so a miss is a bug in
/// this crate that the first `Machine::crd()` call (and `api/tests/crds.rs`) reveals.
fn only(schema: &mut Schema, path: &[&str], value: &str, description: Option<String>) {
    let property = path
        .iter()
        .try_fold(schema, |s, field| {
            s.get_mut("properties")?
                .get_mut(*field)
                .and_then(|v| <&mut Schema>::try_from(v).ok())
        })
        .unwrap_or_else(|| panic!("NodeConfig's schema has no property {}", path.join(".")));
    property.insert("enum".into(), serde_json::json!([value]));
    if let Some(description) = description {
        property.insert("description".into(), description.into());
    }
}

/// Removes every `default` from a schema. The API server would write a schema's defaults into
/// each stored object, freezing this agent's defaults (a containerd version, say) into
/// Machines written today; left out, the defaults of whichever agent reads the object apply,
/// as they do for a config file.
pub(crate) fn no_defaults(schema: &mut Schema) {
    schema.remove("default");
    schemars::transform::transform_subschemas(&mut no_defaults, schema);
}
