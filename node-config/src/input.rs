//! What the host runtime hands a phase: the node configuration plus what the host resolved
//! for this run (the host root, the version directory, the artifacts with their digests, and
//! per-phase instructions). One JSON document, the `input` argument of `phase.run`.
//!
//! The host decides *what* a run does (which version, which units to restart, which mounts to
//! undo); a phase decides *how* through its capabilities. Every field but `config` has a
//! default, so a phase can also be run alone (`nodeward apply --phase NAME`).

use crate::NodeConfig;
use crate::layout::Layout;
use serde::{Deserialize, Serialize};

/// The input of every phase.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PhaseInput {
    /// The node configuration this run applies.
    pub config: NodeConfig,
    /// The host root and unit directory, for paths written into files.
    #[serde(default)]
    pub layout: Layout,
    /// The version directory name this run installs, links or runs
    /// (`<kubernetesVersion>-<digest>`, see `nodeward::node::version`).
    #[serde(default)]
    pub version: String,
    /// The CPU architecture in Kubernetes' spelling (`amd64`, `arm64`).
    #[serde(default)]
    pub arch: String,
    /// The artifacts of [`PhaseInput::version`], resolved from the config (`download-artifacts`).
    #[serde(default)]
    pub artifacts: Vec<Artifact>,
    /// Report groups whose files changed in this run (`containerd-config`, `kubelet-config`,
    /// `cni-config`, `binaries`): `start-node` restarts the units that read them, if running.
    #[serde(default)]
    pub restart: Vec<String>,
    /// `install`: remove every version directory except [`PhaseInput::version`].
    #[serde(default)]
    pub prune: bool,
    /// `teardown`: mount points below the kubelet directory and containerd's state and root
    /// (pod volumes, container root filesystems), root-relative, deepest first.
    #[serde(default)]
    pub mounts: Vec<String>,
}

impl PhaseInput {
    /// An input with only the configuration (every host-resolved field at its default).
    pub fn new(config: NodeConfig) -> Self {
        PhaseInput {
            config,
            layout: Layout::default(),
            version: String::new(),
            arch: String::new(),
            artifacts: Vec::new(),
            restart: Vec::new(),
            prune: false,
            mounts: Vec::new(),
        }
    }
}

/// One artifact to place in a version directory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Artifact {
    /// Its name in the config's `downloads` map: `kubelet`, `containerd`, `runc`, `cni-plugins`.
    pub name: String,
    /// Where it is fetched from.
    pub url: String,
    /// Its pinned sha256 (64 lowercase hex digits). `None` only in a plan whose config does not
    /// pin it; an apply refuses such a config before any change.
    pub sha256: Option<String>,
    /// How it is placed.
    pub kind: ArtifactKind,
}

/// How an artifact is placed in the version directory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "type")]
pub enum ArtifactKind {
    /// A single executable at `dest` (relative to the version directory), mode 0755.
    Binary {
        /// e.g. `bin/kubelet`.
        dest: String,
    },
    /// A tar.gz unpacked into `dest` (relative to the version directory).
    Tarball {
        /// e.g. `bin`.
        dest: String,
        /// Leading path components dropped from each entry.
        strip: u32,
    },
}

/// The artifacts a none node needs, with their upstream URLs for `version` of each component.
/// `downloads` overrides in the config replace URL and digest (see the host's resolver).
pub fn default_artifacts(config: &NodeConfig, arch: &str) -> Vec<Artifact> {
    let k8s = &config.cluster.kubernetes_version;
    let c = &config.components;
    let art = |name: &str, url: String, kind| Artifact {
        name: name.into(),
        url,
        sha256: None,
        kind,
    };
    vec![
        art(
            "kubelet",
            format!("https://dl.k8s.io/release/v{k8s}/bin/linux/{arch}/kubelet"),
            ArtifactKind::Binary {
                dest: "bin/kubelet".into(),
            },
        ),
        art(
            "containerd",
            format!(
                "https://github.com/containerd/containerd/releases/download/v{v}/containerd-{v}-linux-{arch}.tar.gz",
                v = c.containerd
            ),
            ArtifactKind::Tarball {
                dest: "bin".into(),
                strip: 1,
            },
        ),
        art(
            "runc",
            format!(
                "https://github.com/opencontainers/runc/releases/download/v{v}/runc.{arch}",
                v = c.runc
            ),
            ArtifactKind::Binary {
                dest: "bin/runc".into(),
            },
        ),
        art(
            "cni-plugins",
            format!(
                "https://github.com/containernetworking/plugins/releases/download/v{v}/cni-plugins-linux-{arch}-v{v}.tgz",
                v = c.cni_plugins
            ),
            ArtifactKind::Tarball {
                dest: "libexec/cni".into(),
                strip: 0,
            },
        ),
    ]
}

/// The artifact names [`default_artifacts`] knows; a `downloads` key outside this list is an
/// error naming it.
pub const ARTIFACT_NAMES: &[&str] = &["kubelet", "containerd", "runc", "cni-plugins"];
