//! The `nodeward.io/v1alpha1` Kubernetes API: the `Machine` and `MachineOperation` resources.
//!
//! # Background
//! `nodeward daemon` (issue 14, part 2) runs on every node and keeps the node as its `Machine`
//! says: the Kubernetes version, the artifact pins, the node configuration, labels and taints,
//! the isolation mode, the agent binary and the phase bundle. It reports what it did in the
//! `Machine`'s status (a phase, conditions, the applied config's digest, the active bundle, the
//! audit trail's chain head). One-off actions that are not a desired state (reboot the node,
//! upgrade or reset the agent) are `MachineOperation`s naming the `Machine`.
//!
//! Both resources are cluster-scoped: a `Machine` is named like the Node it keeps, and the
//! node's own credentials (`system:node:<name>`) are what the daemon uses to read it and write
//! its status. The API reference, the install steps and the identity rules are in
//! `docs/daemon.md`; the CustomResourceDefinitions in `deploy/crds/` are generated from these
//! types ([`crd`], `cargo run -p nodeward-api --example crds`).
//!
//! # Modules
//! - [`machine`]: the `Machine` resource, its spec and status.
//! - [`operation`]: the `MachineOperation` resource and its TTL.
//! - [`condition`]: the condition types and reasons, and how a condition is set.
//! - [`message`]: the bound on every human-readable message written to a status.
//! - [`crd`]: the CustomResourceDefinitions, rendered as the YAML in `deploy/crds/`.
//!
//! # Guarantees
//! - Every constraint the API server can enforce without CEL (enums, the sha256 pattern,
//!   minimums, bounded messages) is in the schema, so a malformed object is refused at
//!   `kubectl apply` rather than by the daemon later. The CI cluster's API server is v1.20, so
//!   nothing here needs a newer server.
//! - The generated schemas are structural (no `$ref`, every node typed), as
//!   `apiextensions.k8s.io/v1` requires; `api/tests/crds.rs` checks it.
//!
//! # Caveats
//! Cross-field rules the schema cannot express without CEL (a `Machine`'s inline config naming
//! another machine, a `MachineOperation` changed after it started) are the daemon's to refuse,
//! with a condition or a failed operation that says why.

pub mod condition;
pub mod crd;
pub mod machine;
pub mod message;
pub mod operation;
mod schema;

pub use condition::{ConditionStatus, ConditionType, ConditionUpdate, Reason};
pub use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
pub use machine::{Machine, MachinePhase, MachineSpec, MachineStatus};
pub use operation::{MachineOperation, MachineOperationSpec, MachineOperationStatus};

/// The API group of both resources.
pub const GROUP: &str = "nodeward.io";
/// The only version of the API so far.
pub const VERSION: &str = "v1alpha1";
