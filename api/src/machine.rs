//! The `Machine` resource: one node's desired state, and what its daemon reports.
//!
//! # Background
//! A `Machine` is named like the Node it keeps (`metadata.name` is the node name), and is
//! cluster-scoped like a Node. The spec says what the node should run; the node's daemon reads
//! it with the node's own credentials and writes only the status.
//!
//! # Assumptions
//! The spec is laid over the node config (inline, from a ConfigMap, or the one the daemon was
//! started with): `kubernetesVersion`, `mode`, `artifacts`, `labels` and `taints` win over the
//! config's `cluster.kubernetesVersion`, `mode`, `downloads`, `kubelet.labels` and
//! `kubelet.registerWithTaints`. Maps are merged key by key; `taints`, when given, replaces the
//! config's list (so an empty list clears it).
//!
//! # Caveats
//! Rules across fields (the inline config's `machineName` equal to `metadata.name`, artifact
//! names the agent knows) need CEL, which the v1.20 CI cluster lacks: the daemon refuses them
//! with `NodeUpdated=False`, reason `ConfigInvalid`, before changing anything.

use crate::condition::{self, ConditionUpdate};
use crate::operation::{OperationKind, OperationPhase};
use crate::schema::KUBERNETES_VERSION_PATTERN;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use nodeward_node_config::schema::HTTP_URL_PATTERN;
use nodeward_node_config::{DownloadOverride, Mode, NodeConfig, SHA256_PATTERN, Taint};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// What the node should run. Every field is applied by the daemon through the same pipelines
/// as `nodeward node` (bootstrap, upgrade, repave), so a Machine can ask for nothing the
/// command line could not do.
// Each `printcolumn(...)` repeats `type_ = ...`, which clippy takes for a duplicated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "nodeward.io",
    version = "v1alpha1",
    kind = "Machine",
    status = "MachineStatus",
    shortname = "nwm",
    derive = "PartialEq",
    doc = "A node nodeward keeps: the desired state its daemon applies (spec) and what the daemon reports (status). Named like the Node.",
    printcolumn(
        name = "Phase",
        type_ = "string",
        json_path = ".status.phase",
        description = "Where the daemon is with this Machine"
    ),
    printcolumn(
        name = "Bundle",
        type_ = "string",
        json_path = ".status.activeBundle.name",
        description = "The phase bundle the node runs"
    ),
    printcolumn(
        name = "Bundle-Version",
        type_ = "integer",
        json_path = ".status.activeBundle.version",
        description = "The active bundle's version",
        priority = "1"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::schema::no_defaults)]
pub struct MachineSpec {
    /// The kubelet's Kubernetes version, e.g. `1.34.1`. Wins over the config's
    /// `cluster.kubernetesVersion`; changing it upgrades the node.
    #[schemars(pattern(KUBERNETES_VERSION_PATTERN))]
    pub kubernetes_version: String,
    /// How the node runs on the host: `none` (host-native) or `nspawn` (blue/green machines).
    /// Wins over the config's `mode`; absent, the config's applies. Changing it repaves the
    /// node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<Mode>,
    /// Where the node config comes from. Absent: the config the daemon was started with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<ConfigSource>,
    /// Artifact pins, by artifact name (`kubelet`, `containerd`, `runc`, `cni-plugins`): where
    /// each is fetched from and the sha256 it must have. The shape of the config's `downloads`,
    /// and wins over it key by key.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub artifacts: BTreeMap<String, DownloadOverride>,
    /// Labels the node registers with; win over the config's `kubelet.labels` key by key.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Taints the node registers with. Given (even empty), they replace the config's
    /// `kubelet.registerWithTaints`; absent, the config's stay.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub taints: Option<Vec<Taint>>,
    /// The agent binary the node should run (self-upgrade). Absent: the daemon keeps the
    /// binary it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<AgentPin>,
    /// The phase bundle the node should run. Absent: the bundle embedded in the agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase_bundle: Option<PhaseBundleRef>,
}

/// Where a Machine's node config comes from: exactly one of `inline` and `configMapRef`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum ConfigSource {
    /// The node config document itself (`apiVersion: nodeward.io/v1alpha1`, `kind:
    /// NodeConfig`), with the bootstrap token as its reference `nodeward-secret:bootstrap-token`.
    Inline(#[schemars(schema_with = "crate::schema::inline_node_config")] Box<NodeConfig>),
    /// A ConfigMap key holding the node config document (YAML or JSON). The daemon reads it
    /// with the node's credentials: `deploy/rbac.yaml` lets nodes read ConfigMaps in
    /// `nodeward-system` only.
    ConfigMapRef(ConfigMapKeyRef),
}

/// One key of one ConfigMap.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConfigMapKeyRef {
    /// The ConfigMap's name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// The ConfigMap's namespace.
    #[schemars(length(min = 1, max = 63))]
    pub namespace: String,
    /// The key whose value is the node config document.
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
}

/// An agent binary: where to fetch it and the sha256 it must have.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentPin {
    /// The binary's `http://` or `https://` URL.
    #[schemars(pattern(HTTP_URL_PATTERN))]
    pub url: String,
    /// The sha256 of its bytes, 64 lowercase hex digits.
    #[schemars(pattern(SHA256_PATTERN))]
    pub sha256: String,
}

/// A phase bundle to install: from a URL or an OCI reference (exactly one), with the sha256 of
/// the archive, and optionally the consent to grants wider than the current bundle's.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("oneOf" = [{"required": ["url"]}, {"required": ["ociReference"]}]))]
pub struct PhaseBundleRef {
    /// The bundle archive's `http://` or `https://` URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(HTTP_URL_PATTERN))]
    pub url: Option<String>,
    /// The bundle archive as an OCI artifact: `registry[:port]/repository:tag` or
    /// `registry[:port]/repository@sha256:…` (the registry named, a tag or a digest given),
    /// pulled anonymously over HTTPS (plain HTTP only to a loopback registry) as `nodeward phases
    /// install oci://…`. The artifact's one layer is the signed archive, of mediaType
    /// `application/vnd.nodeward.bundle.v1.tar+gzip` (docs/bundle-format.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024))]
    pub oci_reference: Option<String>,
    /// The sha256 of the archive's bytes, 64 lowercase hex digits; checked while it downloads.
    #[schemars(pattern(SHA256_PATTERN))]
    pub sha256: String,
    /// Consent to a bundle whose capabilities or grants are wider than the current bundle's:
    /// the bundle's digest (the sha256 of its manifest, as `nodeward phases inspect` and
    /// `phases diff` print it). Any other value, or none, leaves a widening bundle uninstalled
    /// with `BundleApplied=False`, reason `GrantsWiden`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(SHA256_PATTERN))]
    pub accept_grants_digest: Option<String>,
}

/// Which of its two sources a [`PhaseBundleRef`] names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BundleLocation<'a> {
    /// An `http://` or `https://` URL.
    Url(&'a str),
    /// An OCI reference.
    OciReference(&'a str),
}

/// A [`PhaseBundleRef`] that names both sources or neither (the schema refuses it; an object
/// written before the CRD was installed may still have it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("spec.phaseBundle must name exactly one of url and ociReference")]
pub struct AmbiguousBundleLocation;

impl PhaseBundleRef {
    /// Where the bundle is fetched from.
    pub fn location(&self) -> Result<BundleLocation<'_>, AmbiguousBundleLocation> {
        match (&self.url, &self.oci_reference) {
            (Some(url), None) => Ok(BundleLocation::Url(url)),
            (None, Some(reference)) => Ok(BundleLocation::OciReference(reference)),
            _ => Err(AmbiguousBundleLocation),
        }
    }

    /// Whether the spec consents to the wider grants of the bundle whose manifest digest is
    /// `bundle_digest`.
    pub fn accepts_grants_of(&self, bundle_digest: &str) -> bool {
        self.accept_grants_digest.as_deref() == Some(bundle_digest)
    }
}

/// Where the daemon is with a Machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum MachinePhase {
    /// The daemon has not acted on this Machine yet.
    Pending,
    /// The node is being bootstrapped (the agent installed, the node joined).
    Bootstrapping,
    /// The node runs what the spec at `observedGeneration` asks.
    Ready,
    /// The node is being brought to a changed spec in place (version, artifacts, config,
    /// bundle, agent).
    Updating,
    /// The node is being rebuilt (another mode, or a change that cannot be made in place).
    Repaving,
    /// The last attempt failed and the daemon is waiting to retry or for a new spec; the
    /// conditions say what failed.
    Failed,
}

/// What the daemon reports about its node. Only the node's daemon writes it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineStatus {
    /// Where the daemon is with this Machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<MachinePhase>,
    /// One condition per aspect: AgentBootstrapped, NodeUpdated, BundleApplied, RepavePending.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::schema::conditions")]
    pub conditions: Vec<Condition>,
    /// The `metadata.generation` of the spec the daemon last acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub observed_generation: Option<i64>,
    /// The sha256 of the node config the node last applied (the resolved document, secrets
    /// as references), as in the node's applied-config sidecar.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(SHA256_PATTERN))]
    pub applied_config_digest: Option<String>,
    /// The phase bundle the node runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_bundle: Option<ActiveBundle>,
    /// The version of the agent binary that runs (`nodeward version`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128))]
    pub agent_version: Option<String>,
    /// The MachineOperation the daemon handled last.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_operation: Option<LastOperation>,
    /// The head of the node's hash-chained audit trail when the status was written: an
    /// auditor holding it can tell whether the node's log was cut or rewritten since.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audit_head: Option<AuditHead>,
}

impl MachineStatus {
    /// Sets one condition (see [`condition::set_condition`]); returns whether it changed.
    pub fn set_condition(&mut self, update: &ConditionUpdate, now: &Time) -> bool {
        condition::set_condition(&mut self.conditions, update, now)
    }
}

/// A phase bundle's identity.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ActiveBundle {
    /// The bundle's name (its manifest's `bundle.name`).
    pub name: String,
    /// The bundle's version (its manifest's `bundle.version`).
    #[schemars(range(min = 0))]
    pub version: i64,
    /// The bundle's digest: the sha256 of its manifest.
    #[schemars(pattern(SHA256_PATTERN))]
    pub digest: String,
}

/// The MachineOperation a daemon handled last, and how it ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LastOperation {
    /// The MachineOperation's name.
    pub name: String,
    /// What it asked for.
    pub kind: OperationKind,
    /// Where it got to.
    pub phase: OperationPhase,
}

/// The head of a node's audit trail: its last record's sequence number and hash.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AuditHead {
    /// The last record's sequence number.
    #[schemars(range(min = 0))]
    pub seq: i64,
    /// The last record's chained sha256.
    #[schemars(pattern(SHA256_PATTERN))]
    pub sha256: String,
}
