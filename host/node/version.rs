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

/// The first artifact without a pinned sha256, as the error an apply refuses with.
pub fn require_pinned(artifacts: &[Artifact], config_source: &str) -> Result<(), String> {
    match artifacts.iter().find(|a| a.sha256.is_none()) {
        None => Ok(()),
        Some(a) => Err(format!(
            "artifact {name} ({url}) has no pinned sha256: set downloads.{name}.url and \
             downloads.{name}.sha256 in {config_source}; nodeward installs nothing unpinned",
            name = a.name,
            url = a.url
        )),
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

/// The configuration's fingerprint: sha256 of its canonical JSON. The install record, the
/// applied config's sidecar and the upgrade journal all name a configuration by it.
pub fn fingerprint(config: &NodeConfig) -> String {
    sha256_hex(&serde_json::to_vec(config).unwrap_or_default())
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
        let err = require_pinned(&artifacts(&c, "amd64"), "node.yaml").expect_err("unpinned");
        assert!(
            err.contains("artifact kubelet") && err.contains("downloads.kubelet.sha256"),
            "{err}"
        );
    }

    #[test]
    fn fingerprint_follows_any_change() {
        let c = config();
        let mut d = c.clone();
        d.kubelet.max_pods += 1;
        assert_ne!(fingerprint(&c), fingerprint(&d));
        assert_eq!(fingerprint(&c), fingerprint(&c.clone()));
    }
}
