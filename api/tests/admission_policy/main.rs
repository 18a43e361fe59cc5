//! deploy/admission-policy.yaml on the clusters it is for (Kubernetes >= 1.30), without one:
//! the policies' own CEL expressions, read from the manifest, evaluated with the `cel` crate
//! over admission requests shaped as the API server sends them, for the users real clusters
//! authenticate, behind the RBAC of deploy/rbac.yaml.
//!
//! # Background
//! No API server that serves ValidatingAdmissionPolicy builds here (the test cluster is
//! v1.20), and a policy that was never evaluated refused an EKS node its own Machine, let a
//! non-node member of `system:nodes` through, and let a bootstrap token delete a condition
//! (issue 26). So this test does the API server's part ([`policy`]): it matches each request
//! against the policy's rules, evaluates `variables`, `matchConditions` and `validations` in
//! the server's order, and applies `failurePolicy` and the binding's `validationActions`.
//!
//! # Modules
//! - [`policy`]: the API server's evaluation of a policy and its binding.
//! - [`cluster`]: users (kubeadm and EKS nodes, bootstrap tokens, a non-node in
//!   `system:nodes`, operators), RBAC, and the calls the daemon and the bootstrap make.
//! - [`fixtures`]: stored objects and the statuses the daemon and the bootstrap write.
//! - `nodes`, `bootstrap`: one test per rule the manifest's comments state.
//! - `semantics`: the CEL the policies use behaves in the `cel` crate as in cel-go.
//! - `defaults`: every field the server defaults is stated, so a re-apply changes nothing.
//!
//! # Caveats
//! The server also type-checks expressions against the CRD schemas (warnings in the policy's
//! status) and bounds their cost; neither is modelled. The expressions here are small and
//! iterate over a Machine's few conditions and status fields.

mod bootstrap;
mod cluster;
mod defaults;
mod fixtures;
mod nodes;
mod policy;
mod semantics;
