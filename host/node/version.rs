//! Naming what a configuration installs: the version directory, the artifacts with their pinned
//! digests, and the configuration's fingerprint.
//!
//! The version directory is `<kubernetesVersion>-<digest>`, the digest covering everything else
//! that decides which binaries are installed (containerd, runc and CNI versions, architecture,
//! each artifact's URL and sha256). Changing only the containerd version or a download override
//! yields a new directory; an unchanged configuration reuses the installed one, so a re-run
//! downloads nothing.

use crate::bundle::sha256_hex;
use nodeward_node_config::NodeConfig;
use nodeward_node_config::input::{Artifact, default_artifacts};

/// The CPU architecture in Kubernetes' spelling.
pub fn arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "powerpc64" => "ppc64le",
        other => other,
    }
}

/// The artifacts of `config` on `arch`: the upstream defaults with the config's `downloads`
/// overrides applied. An artifact without an override has no pinned sha256.
pub fn artifacts(config: &NodeConfig, arch: &str) -> Vec<Artifact> {
    let mut out = default_artifacts(config, arch);
    for a in &mut out {
        if let Some(o) = config.downloads.get(&a.name) {
            a.url = o.url.clone();
            a.sha256 = Some(o.sha256.clone());
        }
    }
    out
}

/// An artifact without a pinned sha256: nodeward installs nothing unpinned.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "artifact {name} ({url}) has no pinned sha256: set downloads.{name}.url and \
     downloads.{name}.sha256 in {config_source}; nodeward installs nothing unpinned"
)]
pub struct Unpinned {
    /// The artifact.
    pub name: String,
    /// Where it would be downloaded from.
    pub url: String,
    /// How the config is named to the operator: its path, or the embedded example.
    pub config_source: String,
}

/// Refuses the first artifact without a pinned sha256; `config_source` names the config in
/// the error.
pub fn require_pinned(artifacts: &[Artifact], config_source: &str) -> Result<(), Unpinned> {
    match artifacts.iter().find(|a| a.sha256.is_none()) {
        None => Ok(()),
        Some(a) => Err(Unpinned {
            name: a.name.clone(),
            url: a.url.clone(),
            config_source: config_source.to_string(),
        }),
    }
}

/// The version directory name for `config` with `artifacts`.
pub fn version_name(config: &NodeConfig, arch: &str, artifacts: &[Artifact]) -> String {
    let c = &config.components;
    let mut key = format!(
        "containerd={}\nrunc={}\ncni-plugins={}\narch={arch}\n",
        c.containerd, c.runc, c.cni_plugins
    );
    for a in artifacts {
        key.push_str(&format!(
            "artifact={} {} {}\n",
            a.name,
            a.url,
            a.sha256.as_deref().unwrap_or("-")
        ));
    }
    let digest = sha256_hex(key.as_bytes());
    format!("{}-{}", config.cluster.kubernetes_version, &digest[..12])
}

/// A configuration that could not be encoded to be fingerprinted (a host bug: the config
/// types are plain data). Never fingerprinted as empty bytes: every config would then match.
#[derive(Debug, thiserror::Error)]
#[error("encoding the node config to fingerprint it: {0}")]
pub struct FingerprintError(#[source] pub serde_json::Error);

/// The configuration's fingerprint: sha256 of its canonical JSON. The install record, the
/// applied config's sidecar and the upgrade journal all name a configuration by it.
pub fn fingerprint(config: &NodeConfig) -> Result<String, FingerprintError> {
    let json = serde_json::to_vec(config).map_err(FingerprintError)?;
    Ok(sha256_hex(&json))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> NodeConfig {
        crate::config::load(None).expect("embedded config")
    }

    #[test]
    fn version_changes_with_what_decides_the_binaries_only() {
        let c = config();
        let v1 = version_name(&c, "amd64", &artifacts(&c, "amd64"));
        assert!(v1.starts_with("1.34.1-"), "{v1}");
        assert_eq!(v1, version_name(&c, "amd64", &artifacts(&c, "amd64")));

        let mut labels = c.clone();
        labels.kubelet.labels.insert("a".into(), "b".into());
        assert_eq!(
            v1,
            version_name(&labels, "amd64", &artifacts(&labels, "amd64"))
        );
        assert_ne!(v1, version_name(&c, "arm64", &artifacts(&c, "arm64")));

        let mut runc = c.clone();
        runc.components.runc = "9.9.9".into();
        assert_ne!(v1, version_name(&runc, "amd64", &artifacts(&runc, "amd64")));

        let mut over = c.clone();
        over.downloads.insert(
            "kubelet".into(),
            nodeward_node_config::DownloadOverride {
                url: "http://127.0.0.1:1/kubelet".into(),
                sha256: "a".repeat(64),
            },
        );
        assert_ne!(v1, version_name(&over, "amd64", &artifacts(&over, "amd64")));
    }

    #[test]
    fn unpinned_artifact_is_refused_by_name() {
        let c = config();
        let err = require_pinned(&artifacts(&c, "amd64"), "node.yaml")
            .expect_err("unpinned")
            .to_string();
        assert!(
            err.contains("artifact kubelet")
                && err.contains("downloads.kubelet.sha256 in node.yaml;"),
            "{err}"
        );
    }

    #[test]
    fn fingerprint_follows_any_change() {
        let c = config();
        let mut d = c.clone();
        d.kubelet.max_pods += 1;
        let fp = |c: &NodeConfig| fingerprint(c).expect("fingerprint");
        assert_ne!(fp(&c), fp(&d));
        assert_eq!(fp(&c), fp(&c.clone()));
        assert_eq!(fp(&c).len(), 64);
    }
}
