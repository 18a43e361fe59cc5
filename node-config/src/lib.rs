//! The node configuration document, `apiVersion: nodeward.io/v1alpha1`, `kind: NodeConfig`.
//!
//! # Background
//! One versioned document describes the node nodeward keeps, like kubeadm's
//! `JoinConfiguration` or nodeadm's `NodeConfig`. The host runtime parses it strictly (unknown
//! fields are an error naming the field), validates it, fills in defaults and hands it to every
//! phase as JSON; the phase guests deserialize the same types, so there is one definition.
//!
//! # Guarantees
//! - Every default lives in [`defaults`], and only there.
//! - [`NodeConfig::validate`] names the field at fault in its error.
//! - The bootstrap token is a [`Secret`]: its `Debug` is redacted, and
//!   [`NodeConfig::secrets`] lists it so the host can redact it from plans and logs.
//!
//! # Caveats
//! This crate does no I/O and knows no file format; the host parses YAML or JSON into it.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

pub mod downloads;
mod foreign;
pub mod input;
pub mod layout;
#[cfg(feature = "schema")]
pub mod schema;
pub mod secret;

/// A free-form configuration tree merged over a rendered file (see [`merge`]).
pub type Patch = BTreeMap<String, serde_json::Value>;

pub use downloads::{DownloadOptions, DownloadOverride};
pub use foreign::FOREIGN_BRIDGE_PREFIXES;

/// The only `apiVersion` this agent reads.
pub const API_VERSION: &str = "nodeward.io/v1alpha1";
/// The only `kind` this agent reads.
pub const KIND: &str = "NodeConfig";

/// Defaults, in one place. The README's config reference points here.
pub mod defaults {
    /// Cluster DNS service address.
    pub const CLUSTER_DNS: &str = "10.96.0.10";
    /// Cluster DNS domain.
    pub const CLUSTER_DOMAIN: &str = "cluster.local";
    /// Pod CIDR the node's bridge CNI config hands out addresses from.
    pub const POD_CIDR: &str = "10.244.0.0/24";
    /// Maximum pods per node (the kubelet's own default).
    pub const MAX_PODS: u32 = 110;
    /// How often the kubelet computes its node status (`kubelet.nodeStatusUpdateFrequency`):
    /// 1 s instead of the kubelet's 10 s. Ready waits for the first status computed after the
    /// runtime is up, so this is what a bootstrap waits for at worst after the TLS bootstrap;
    /// posts stay at change-or-5m (see docs/none-mode.md for the cost at fleet scale).
    pub const NODE_STATUS_UPDATE_FREQUENCY: &str = "1s";
    /// How often the kubelet posts an unchanged node status (`nodeStatusReportFrequency`,
    /// the kubelet's own default). Always rendered: a kubelet given only
    /// `nodeStatusUpdateFrequency` would otherwise post at that frequency too (its
    /// backward-compatible defaulting).
    pub const NODE_STATUS_REPORT_FREQUENCY: &str = "5m";
    /// containerd version installed in none mode.
    pub const CONTAINERD: &str = "2.1.8";
    /// runc version installed in none mode.
    pub const RUNC: &str = "1.5.0";
    /// CNI plugins version installed in none mode.
    pub const CNI_PLUGINS: &str = "1.5.1";
    /// The sandbox (pause) image containerd uses.
    pub const SANDBOX_IMAGE: &str = "registry.k8s.io/pause:3.10";
    /// The bridge pods attach to.
    pub const BRIDGE_NAME: &str = "cni0";
    /// Kernel modules the node needs.
    pub const KERNEL_MODULES: &[&str] = &["overlay", "br_netfilter"];
    /// Sysctls the node needs (`setup-host` sets them; the host's preflight checks them): pods
    /// are routed (forwarding on), and bridged pod traffic passes through iptables so that
    /// kube-proxy's rules see it.
    pub const SYSCTLS: &[(&str, &str)] = &[
        ("net.ipv4.ip_forward", "1"),
        ("net.bridge.bridge-nf-call-iptables", "1"),
        ("net.bridge.bridge-nf-call-ip6tables", "1"),
    ];
    /// The artifact cache's size cap (`downloadOptions.cacheMaxBytes`): 2 GiB, room for a few
    /// versions' artifacts (one is about 200 MB).
    pub const CACHE_MAX_BYTES: u64 = 2 << 30;
}

/// The node configuration document.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct NodeConfig {
    /// Must be `nodeward.io/v1alpha1` ([`API_VERSION`]).
    pub api_version: String,
    /// Must be `NodeConfig` ([`KIND`]).
    pub kind: String,
    /// The node's name; a DNS-1123 subdomain.
    pub machine_name: String,
    /// How the node runs on the host.
    #[serde(default)]
    pub mode: Mode,
    /// The cluster the node joins.
    pub cluster: Cluster,
    /// Kubelet settings.
    pub kubelet: Kubelet,
    /// Pod networking on this node.
    #[serde(default)]
    pub network: Network,
    /// Versions of the node's runtime components.
    #[serde(default)]
    pub components: Components,
    /// containerd settings.
    #[serde(default)]
    pub containerd: Containerd,
    /// Per-artifact download overrides, keyed by artifact name (`kubelet`, `containerd`, ...).
    #[serde(default)]
    pub downloads: BTreeMap<String, DownloadOverride>,
    /// How the host fetches and keeps artifacts: the CA file of a private mirror, the
    /// artifact cache's size cap.
    #[serde(default, skip_serializing_if = "DownloadOptions::is_empty")]
    pub download_options: DownloadOptions,
}

/// How the node runs on the host.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum Mode {
    /// Host-native: binaries in versioned directories, units on the host.
    #[default]
    None,
    /// Blue/green systemd-nspawn machines.
    Nspawn,
}

/// The cluster the node joins.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Cluster {
    /// The API server URL, `https://host:port`.
    pub api_server: String,
    /// The cluster CA certificate, base64 of its PEM.
    pub ca_cert_data: String,
    /// Cluster DNS service address.
    #[serde(default = "d_cluster_dns", rename = "clusterDNS")]
    pub cluster_dns: String,
    /// Cluster DNS domain.
    #[serde(default = "d_cluster_domain")]
    pub cluster_domain: String,
    /// The Kubernetes version of the kubelet, e.g. `1.34.1`.
    pub kubernetes_version: String,
}

/// Kubelet settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Kubelet {
    /// How the kubelet authenticates its first request.
    pub auth: KubeletAuth,
    /// Labels the node registers with.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Taints the node registers with.
    #[serde(default)]
    pub register_with_taints: Vec<Taint>,
    /// Maximum pods on this node.
    #[serde(default = "d_max_pods")]
    pub max_pods: u32,
    /// How often the kubelet computes its node status (`nodeStatusUpdateFrequency`, a
    /// duration: `<n>ms`, `<n>s` or `<n>m`, from 100ms to 5m). It posts the status only when it
    /// changed or every `nodeStatusReportFrequency` (pinned to 5m next to it), so a short
    /// interval is local work, not API load; and a node not Ready at its first status is Ready
    /// one interval later instead of the kubelet's default 10 s (docs/none-mode.md).
    /// At its default it serializes to nothing, so a config that does not set it keeps the
    /// fingerprint it had before the field existed (a node is not upgraded for it).
    #[serde(
        default = "d_node_status_update_frequency",
        skip_serializing_if = "is_default_node_status_update_frequency"
    )]
    pub node_status_update_frequency: String,
    /// Merged over the rendered `KubeletConfiguration` (objects key by key, anything else
    /// replaces), like nodeadm's `kubelet.config`: e.g. `healthzPort`, `evictionHard`.
    #[serde(default)]
    #[cfg_attr(
        feature = "schema",
        schemars(schema_with = "crate::schema::free_form_object")
    )]
    pub config: Patch,
    /// Extra kubelet command-line flags, appended after nodeward's own (e.g. `--node-ip=...`).
    #[serde(default)]
    pub flags: Vec<String>,
}

/// containerd settings.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Containerd {
    /// Merged over the rendered containerd `config.toml` (tables key by key, anything else
    /// replaces), e.g. `plugins: {"io.containerd.grpc.v1.cri": {restrict_oom_score_adj: true}}`.
    #[serde(default)]
    #[cfg_attr(
        feature = "schema",
        schemars(schema_with = "crate::schema::free_form_object")
    )]
    pub config: Patch,
}

/// How the kubelet authenticates its first request.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct KubeletAuth {
    /// A bootstrap token `[a-z0-9]{6}.[a-z0-9]{16}` for the TLS-bootstrap flow.
    pub bootstrap_token: Secret,
}

/// A node taint.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Taint {
    /// Taint key.
    pub key: String,
    /// Taint value (may be empty).
    #[serde(default)]
    pub value: String,
    /// `NoSchedule`, `PreferNoSchedule` or `NoExecute`.
    #[cfg_attr(
        feature = "schema",
        schemars(extend("enum" = ["NoSchedule", "PreferNoSchedule", "NoExecute"]))
    )]
    pub effect: String,
}

/// Pod networking on this node.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Network {
    /// The pod CIDR the node's bridge CNI hands out addresses from.
    #[serde(default = "d_pod_cidr", rename = "podCIDR")]
    pub pod_cidr: String,
    /// The Linux bridge the pods attach to.
    #[serde(default = "d_bridge_name")]
    pub bridge_name: String,
    /// Masquerade pod traffic leaving the node.
    #[serde(default = "d_ip_masq")]
    pub ip_masq: bool,
}

impl Default for Network {
    fn default() -> Self {
        Network {
            pod_cidr: d_pod_cidr(),
            bridge_name: d_bridge_name(),
            ip_masq: true,
        }
    }
}

/// Versions of the node's runtime components.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Components {
    /// containerd version.
    #[serde(default = "d_containerd")]
    pub containerd: String,
    /// runc version.
    #[serde(default = "d_runc")]
    pub runc: String,
    /// CNI plugins version.
    #[serde(default = "d_cni_plugins")]
    pub cni_plugins: String,
    /// The sandbox (pause) image.
    #[serde(default = "d_sandbox_image")]
    pub sandbox_image: String,
}

impl Default for Components {
    fn default() -> Self {
        Components {
            containerd: d_containerd(),
            runc: d_runc(),
            cni_plugins: d_cni_plugins(),
            sandbox_image: d_sandbox_image(),
        }
    }
}

/// A secret string. `Debug` and `Display` print `<redacted>`; only [`Secret::expose`] gives
/// the value, so it cannot reach a log by accident.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }
    /// The secret value, for the one place that must write it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

fn d_cluster_dns() -> String {
    defaults::CLUSTER_DNS.into()
}
fn d_cluster_domain() -> String {
    defaults::CLUSTER_DOMAIN.into()
}
fn d_max_pods() -> u32 {
    defaults::MAX_PODS
}
fn d_node_status_update_frequency() -> String {
    defaults::NODE_STATUS_UPDATE_FREQUENCY.into()
}
fn is_default_node_status_update_frequency(f: &str) -> bool {
    f == defaults::NODE_STATUS_UPDATE_FREQUENCY
}
fn d_pod_cidr() -> String {
    defaults::POD_CIDR.into()
}
fn d_bridge_name() -> String {
    defaults::BRIDGE_NAME.into()
}
fn d_ip_masq() -> bool {
    true
}
fn d_containerd() -> String {
    defaults::CONTAINERD.into()
}
fn d_runc() -> String {
    defaults::RUNC.into()
}
fn d_cni_plugins() -> String {
    defaults::CNI_PLUGINS.into()
}
fn d_sandbox_image() -> String {
    defaults::SANDBOX_IMAGE.into()
}

/// A configuration value that failed validation; `field` is its path in the document.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvalidField {
    /// The field's path, e.g. `kubelet.auth.bootstrapToken`.
    pub field: String,
    /// What is wrong with it (never the secret value itself).
    pub reason: String,
}

impl fmt::Display for InvalidField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.reason)
    }
}

impl std::error::Error for InvalidField {}

pub(crate) fn invalid(field: &str, reason: impl Into<String>) -> InvalidField {
    InvalidField {
        field: field.to_string(),
        reason: reason.into(),
    }
}

impl NodeConfig {
    /// Checks every field whose shape the phases rely on. Returns the first field at fault.
    /// The bootstrap token must be a real token: this is the check of the operator's document
    /// (a phase's view is checked by [`NodeConfig::validate_phase_view`]).
    pub fn validate(&self) -> Result<(), InvalidField> {
        self.validate_with(secret::SecretForm::Value)
    }

    fn validate_with(&self, secrets: secret::SecretForm) -> Result<(), InvalidField> {
        if self.api_version != API_VERSION {
            return Err(invalid(
                "apiVersion",
                format!(
                    "is {:?}, this agent reads {API_VERSION:?}",
                    self.api_version
                ),
            ));
        }
        if self.kind != KIND {
            return Err(invalid(
                "kind",
                format!("is {:?}, expected {KIND:?}", self.kind),
            ));
        }
        if !is_dns_subdomain(&self.machine_name) {
            return Err(invalid(
                "machineName",
                "must be a DNS-1123 subdomain (lowercase letters, digits, '-' and '.')",
            ));
        }
        let api = &self.cluster.api_server;
        let Some(rest) = api.strip_prefix("https://") else {
            return Err(invalid("cluster.apiServer", "must be an https:// URL"));
        };
        if rest.is_empty() || rest.chars().any(|c| c.is_whitespace()) {
            return Err(invalid(
                "cluster.apiServer",
                "has no host or contains spaces",
            ));
        }
        self.ca_cert_pem()?;
        if !is_version(&self.cluster.kubernetes_version) {
            return Err(invalid(
                "cluster.kubernetesVersion",
                "must look like 1.34.1 (digits and dots, optional -suffix)",
            ));
        }
        secret::check_token(secrets, self.kubelet.auth.bootstrap_token.expose())?;
        for (i, t) in self.kubelet.register_with_taints.iter().enumerate() {
            if !matches!(
                t.effect.as_str(),
                "NoSchedule" | "PreferNoSchedule" | "NoExecute"
            ) {
                return Err(invalid(
                    &format!("kubelet.registerWithTaints[{i}].effect"),
                    "must be NoSchedule, PreferNoSchedule or NoExecute",
                ));
            }
            if t.key.is_empty() || t.key.contains([',', '=', ':', ' ']) {
                return Err(invalid(
                    &format!("kubelet.registerWithTaints[{i}].key"),
                    "must be non-empty without ',', '=', ':' or spaces",
                ));
            }
        }
        if duration_ms(&self.kubelet.node_status_update_frequency)
            .is_none_or(|ms| !(100..=300_000).contains(&ms))
        {
            return Err(invalid(
                "kubelet.nodeStatusUpdateFrequency",
                "must be a duration from 100ms to 5m: digits and one unit, ms, s or m (e.g. 1s)",
            ));
        }
        for (k, v) in &self.kubelet.labels {
            if k.is_empty() || k.contains([',', '=', ' ']) || v.contains([',', '=', ' ']) {
                return Err(invalid(
                    &format!("kubelet.labels.{k}"),
                    "label keys and values may not contain ',', '=' or spaces",
                ));
            }
        }
        if self.network.bridge_name.is_empty()
            || self.network.bridge_name.len() > 15
            || !self
                .network
                .bridge_name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(invalid(
                "network.bridgeName",
                "must be 1-15 characters of letters, digits, '-' and '_' (a Linux interface name)",
            ));
        }
        if let Some((prefix, tool)) = FOREIGN_BRIDGE_PREFIXES
            .iter()
            .find(|(p, _)| self.network.bridge_name.starts_with(p))
        {
            return Err(invalid(
                "network.bridgeName",
                format!(
                    "{:?} is a name {tool} gives its bridges ({prefix}…): reset deletes the \
                     node's bridge, so it must not be another tool's",
                    self.network.bridge_name
                ),
            ));
        }
        for (i, f) in self.kubelet.flags.iter().enumerate() {
            if !f.starts_with("--") || f.contains('\n') {
                return Err(invalid(
                    &format!("kubelet.flags[{i}]"),
                    "must be one --flag or --flag=value, without newlines",
                ));
            }
        }
        for (name, d) in &self.downloads {
            if !input::ARTIFACT_NAMES.contains(&name.as_str()) {
                return Err(invalid(
                    &format!("downloads.{name}"),
                    format!(
                        "is not an artifact; known: {}",
                        input::ARTIFACT_NAMES.join(", ")
                    ),
                ));
            }
            if !is_sha256(&d.sha256) {
                return Err(invalid(
                    &format!("downloads.{name}.sha256"),
                    "must be 64 lowercase hex digits",
                ));
            }
            if !(d.url.starts_with("https://") || d.url.starts_with("http://")) {
                return Err(invalid(
                    &format!("downloads.{name}.url"),
                    "must be an http:// or https:// URL",
                ));
            }
        }
        self.download_options.validate()?;
        Ok(())
    }

    /// The cluster CA certificate as PEM text.
    pub fn ca_cert_pem(&self) -> Result<String, InvalidField> {
        use base64::Engine as _;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(self.cluster.ca_cert_data.trim())
            .map_err(|e| invalid("cluster.caCertData", format!("is not base64: {e}")))?;
        let pem = String::from_utf8(bytes)
            .map_err(|_| invalid("cluster.caCertData", "does not decode to PEM text"))?;
        if !pem.contains("-----BEGIN CERTIFICATE-----") {
            return Err(invalid(
                "cluster.caCertData",
                "does not decode to a PEM certificate",
            ));
        }
        Ok(pem)
    }

    /// Every secret value in this document, so the host can redact it wherever it appears.
    pub fn secrets(&self) -> Vec<String> {
        let token = self.kubelet.auth.bootstrap_token.expose();
        let mut out = vec![token.to_string()];
        // The secret half alone also identifies the token.
        if let Some((_, secret)) = token.split_once('.')
            && !secret.is_empty()
        {
            out.push(secret.to_string());
        }
        out
    }
}

fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// A duration as the kubelet writes the simple ones (`500ms`, `1s`, `5m`): digits and one
/// unit. `None` for anything else, or beyond u64 milliseconds.
pub fn duration_ms(s: &str) -> Option<u64> {
    let (digits, unit_ms) = if let Some(d) = s.strip_suffix("ms") {
        (d, 1)
    } else if let Some(d) = s.strip_suffix('s') {
        (d, 1000)
    } else if let Some(d) = s.strip_suffix('m') {
        (d, 60_000)
    } else {
        return None;
    };
    if digits.is_empty() || digits.len() > 9 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse::<u64>().ok()?.checked_mul(unit_ms)
}

fn is_version(s: &str) -> bool {
    let core = s.split_once('-').map_or(s, |(c, _)| c);
    let parts: Vec<&str> = core.split('.').collect();
    (2..=3).contains(&parts.len())
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-' || b == b'+')
}

pub(crate) fn is_bootstrap_token(s: &str) -> bool {
    let ok = |p: &str, n: usize| {
        p.len() == n
            && p.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    };
    matches!(s.split_once('.'), Some((id, secret)) if ok(id, 6) && ok(secret, 16))
}

/// [`is_sha256`] as a regular expression, for schemas (the Kubernetes API server enforces it
/// on the `Machine` resource).
pub const SHA256_PATTERN: &str = "^[0-9a-f]{64}$";

/// Whether `s` is a sha256 digest in the form nodeward uses: 64 lowercase hex digits.
pub fn is_sha256(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Merges `patch` into `base`: objects merge key by key (recursively), anything else in the
/// patch replaces what is in the base. Used for `kubelet.config` and `containerd.config`.
pub fn merge(base: &mut serde_json::Value, patch: &serde_json::Value) {
    match (base, patch) {
        (serde_json::Value::Object(b), serde_json::Value::Object(p)) => {
            for (k, v) in p {
                match b.get_mut(k) {
                    Some(slot) => merge(slot, v),
                    None => {
                        b.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (b, p) => *b = p.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> NodeConfig {
        serde_json::from_str(
            r#"{"apiVersion":"nodeward.io/v1alpha1","kind":"NodeConfig","machineName":"worker-01",
            "cluster":{"apiServer":"https://10.0.0.1:6443",
              "caCertData":"LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCk1JSUIKLS0tLS1FTkQgQ0VSVElGSUNBVEUtLS0tLQo=",
              "kubernetesVersion":"1.34.1"},
            "kubelet":{"auth":{"bootstrapToken":"abcdef.0123456789abcdef"}}}"#,
        )
        .expect("sample parses")
    }

    #[test]
    fn defaults_fill_in_and_validate() {
        let c = sample();
        assert_eq!(c.cluster.cluster_dns, defaults::CLUSTER_DNS);
        assert_eq!(c.components.containerd, defaults::CONTAINERD);
        assert_eq!(c.network.pod_cidr, defaults::POD_CIDR);
        assert_eq!(c.validate(), Ok(()));
    }

    #[test]
    fn unknown_field_is_named() {
        let mut doc = serde_json::to_value(sample()).expect("serialize");
        doc["bogus"] = serde_json::json!(1);
        let err = serde_json::from_value::<NodeConfig>(doc).expect_err("unknown field must fail");
        assert!(err.to_string().contains("bogus"), "{err}");
    }

    #[test]
    fn secret_debug_is_redacted() {
        let c = sample();
        let dbg = format!("{c:?}");
        assert!(!dbg.contains("0123456789abcdef"), "{dbg}");
        assert!(dbg.contains("<redacted>"));
        assert_eq!(
            c.secrets(),
            vec!["abcdef.0123456789abcdef", "0123456789abcdef"]
        );
    }

    #[test]
    fn bad_fields_are_named() {
        let mut c = sample();
        c.kubelet.auth.bootstrap_token = Secret::new("nope");
        let e = c.validate().expect_err("bad token");
        assert_eq!(e.field, "kubelet.auth.bootstrapToken");
        assert!(!e.to_string().contains("nope"));

        let mut c = sample();
        c.cluster.api_server = "http://x".into();
        assert_eq!(c.validate().expect_err("http").field, "cluster.apiServer");

        let mut c = sample();
        c.machine_name = "Worker_01".into();
        assert_eq!(c.validate().expect_err("name").field, "machineName");

        let mut c = sample();
        c.cluster.ca_cert_data = "bm90IGEgY2VydA==".into();
        assert_eq!(c.validate().expect_err("ca").field, "cluster.caCertData");

        let mut c = sample();
        c.api_version = "nodeward.io/v2".into();
        assert_eq!(c.validate().expect_err("version").field, "apiVersion");
    }

    #[test]
    fn another_tools_bridge_is_no_node_bridge() {
        for bad in [
            "docker0",
            "virbr0",
            "cni-podman0",
            "br-0123456789ab",
            "nerdctl0",
            "vz-x",
        ] {
            let mut c = sample();
            c.network.bridge_name = bad.into();
            let e = c.validate().expect_err(bad);
            assert_eq!(e.field, "network.bridgeName", "{bad}");
            assert!(e.to_string().contains(bad), "{e}");
        }
        for ok in ["cni0", "nwbr0", "k8sbr0"] {
            let mut c = sample();
            c.network.bridge_name = ok.into();
            assert_eq!(c.validate(), Ok(()), "{ok}");
        }
    }

    #[test]
    fn node_status_update_frequency_is_a_bounded_duration() {
        assert_eq!(
            sample().kubelet.node_status_update_frequency,
            defaults::NODE_STATUS_UPDATE_FREQUENCY
        );
        for ok in ["100ms", "1s", "2s", "10s", "5m"] {
            let mut c = sample();
            c.kubelet.node_status_update_frequency = ok.into();
            assert_eq!(c.validate(), Ok(()), "{ok}");
        }
        for bad in [
            "", "1", "s", "0s", "99ms", "6m", "1h", "1.5s", "1s500ms", " 1s", "-1s",
        ] {
            let mut c = sample();
            c.kubelet.node_status_update_frequency = bad.into();
            assert_eq!(
                c.validate().expect_err(bad).field,
                "kubelet.nodeStatusUpdateFrequency",
                "{bad:?}"
            );
        }
        // The default serializes to nothing (existing configs keep their fingerprint).
        let json = serde_json::to_string(&sample()).expect("serialize");
        assert!(!json.contains("nodeStatusUpdateFrequency"), "{json}");
        let mut c = sample();
        c.kubelet.node_status_update_frequency = "2s".into();
        let json = serde_json::to_string(&c).expect("serialize");
        assert!(
            json.contains(r#""nodeStatusUpdateFrequency":"2s""#),
            "{json}"
        );
        assert_eq!(duration_ms("1500ms"), Some(1500));
        assert_eq!(duration_ms("2m"), Some(120_000));
        assert_eq!(duration_ms("999999999999s"), None);
    }

    #[test]
    fn sha256_shape() {
        assert!(is_sha256(&"a".repeat(64)));
        assert!(!is_sha256(&"A".repeat(64)));
        assert!(!is_sha256(&"a".repeat(63)));
    }
}
