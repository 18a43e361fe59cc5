//! The CustomResourceDefinitions of both resources, rendered as the YAML in `deploy/crds/`.
//!
//! # Background
//! The CRDs are generated from the Rust types, never written by hand, so the schema the API
//! server enforces is the one the daemon deserializes. `cargo run -p nodeward-api --example
//! crds` writes them; `api/tests/crds.rs` fails when the checked-in files differ from what the
//! types generate, and checks that the schemas are structural.

use crate::machine::Machine;
use crate::operation::MachineOperation;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

/// What opens every generated file.
pub const HEADER: &str = "# Generated from the Rust types in api/src by `cargo run -p nodeward-api --example crds`.\n# Do not edit: change the types and regenerate (api/tests/crds.rs checks the two agree).\n";

/// One generated CRD file.
#[derive(Clone, Debug)]
pub struct CrdFile {
    /// Its file name under `deploy/crds/` (the CRD's own name, `<plural>.<group>.yaml`).
    pub file_name: String,
    /// The definition.
    pub crd: CustomResourceDefinition,
}

impl CrdFile {
    /// The file's content: [`HEADER`], then the definition as YAML.
    pub fn render(&self) -> Result<String, serde_yaml_ng::Error> {
        Ok(format!("{HEADER}{}", serde_yaml_ng::to_string(&self.crd)?))
    }
}

/// Every CRD of the API, in a fixed order.
pub fn all() -> Vec<CrdFile> {
    [Machine::crd(), MachineOperation::crd()]
        .into_iter()
        .map(|crd| CrdFile {
            file_name: format!("{}.yaml", crd.metadata.name.as_deref().unwrap_or("unnamed")),
            crd,
        })
        .collect()
}
