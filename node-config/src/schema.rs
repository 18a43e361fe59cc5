//! JSON Schema pieces for the config types (feature `schema`), used when the document is
//! embedded in the `Machine` resource of the `nodeward-api` crate.
//!
//! # Background
//! A Kubernetes API server accepts only *structural* schemas: every node names its `type`, and
//! an object whose keys are free (`kubelet.config`, `containerd.config`) must say so with
//! `x-kubernetes-preserve-unknown-fields` — otherwise the server prunes what it does not know,
//! and a kubelet setting an operator wrote would silently vanish. The derived schema of a map of
//! arbitrary JSON values (`additionalProperties: true`) does not carry that marker, hence the
//! function here.
//!
//! # Caveats
//! Only the parts of the schema the derive cannot express live here; the guests never build
//! this module (the feature is off for them), so it adds nothing to a phase.

use schemars::{Schema, SchemaGenerator, json_schema};

/// An `http://` or `https://` URL without spaces (what [`crate::NodeConfig::validate`]
/// accepts for a download, and the `Machine` resource for its agent and bundle URLs).
pub const HTTP_URL_PATTERN: &str = r"^https?://[^\s]+$";

/// An object with arbitrary keys and values that the API server keeps as written.
pub fn free_form_object(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
    })
}
