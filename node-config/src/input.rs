//! What the host runtime hands a phase: the `input` argument of `phase.run`, one JSON document.
//!
//! # Background
//! The host decides *what* a run does (which version, which units to restart, which mounts to
//! undo); a phase decides *how* through its capabilities. The input carries the node
//! configuration plus what the host resolved for this run (the host root, the version
//! directory, the artifacts with their digests, per-phase instructions).
//!
//! # Guarantees
//! - Versioned: [`PhaseInput::schema_version`] is [`SCHEMA_VERSION`]; a phase refuses any other
//!   ([`PhaseInput::parse`]), so a host and a phase that disagree on the contract fail loudly
//!   instead of misreading a field.
//! - Least privilege: a phase receives only the parts its bundle grants name
//!   (`[phases.grants] input = [...]`, see [`InputPart`]); every other field is at its default
//!   ([`PhaseInput::restricted_to`]).
//! - No secrets: the config a phase receives has every secret replaced by its reference
//!   ([`crate::secret`]). The one file that holds the bootstrap token, the bootstrap
//!   kubeconfig, the host renders itself; a phase that needs it gets its path
//!   ([`PhaseInput::bootstrap_kubeconfig`]).
//!
//! The full field-by-field contract is the doc comment of `run` in `wit/phase.wit`.

use crate::NodeConfig;
use crate::layout::Layout;
use serde::{Deserialize, Serialize};

/// The phase-input schema version this crate reads and writes.
pub const SCHEMA_VERSION: u32 = 1;

/// The input of every phase.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PhaseInput {
    /// Always [`SCHEMA_VERSION`]; a phase refuses an input with another.
    pub schema_version: u32,
    /// The node configuration this run applies (secrets as references); `None` unless the
    /// phase's grants name [`InputPart::Config`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<NodeConfig>,
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
    /// `teardown`: the Linux bridge the node's applied config names (`network.bridgeName`),
    /// which a reset deletes; empty when the node has no applied config (the bridge is never
    /// taken from a config given on the command line). Not sent when empty, so a phase built
    /// before this field existed still reads the input of a phase not granted it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub bridge: String,
    /// The bootstrap kubeconfig (`layout::BOOTSTRAP_KUBECONFIG`) as an absolute path on the real
    /// host, for the kubelet's `--bootstrap-kubeconfig`. The host renders that file from the
    /// node config (server, CA, token) before a phase granted this part runs, so no phase
    /// decides where the token goes. Not sent when empty, as [`PhaseInput::bridge`].
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub bootstrap_kubeconfig: String,
}

/// A part of [`PhaseInput`] a bundle grants a phase (`[phases.grants] input = ["config", ...]`).
/// Each names the field of the same name; `schemaVersion` is always given.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum InputPart {
    /// [`PhaseInput::config`] (with secrets as references).
    Config,
    /// [`PhaseInput::layout`].
    Layout,
    /// [`PhaseInput::version`].
    Version,
    /// [`PhaseInput::arch`].
    Arch,
    /// [`PhaseInput::artifacts`].
    Artifacts,
    /// [`PhaseInput::restart`].
    Restart,
    /// [`PhaseInput::prune`].
    Prune,
    /// [`PhaseInput::mounts`].
    Mounts,
    /// [`PhaseInput::bridge`].
    Bridge,
    /// [`PhaseInput::bootstrap_kubeconfig`]; the host renders that file before the phase runs.
    BootstrapKubeconfig,
}

impl InputPart {
    /// The part's name in a manifest.
    pub fn as_str(self) -> &'static str {
        match self {
            InputPart::Config => "config",
            InputPart::Layout => "layout",
            InputPart::Version => "version",
            InputPart::Arch => "arch",
            InputPart::Artifacts => "artifacts",
            InputPart::Restart => "restart",
            InputPart::Prune => "prune",
            InputPart::Mounts => "mounts",
            InputPart::Bridge => "bridge",
            InputPart::BootstrapKubeconfig => "bootstrap-kubeconfig",
        }
    }
}

impl PhaseInput {
    /// An input with only the configuration (every host-resolved field at its default).
    pub fn new(config: NodeConfig) -> Self {
        PhaseInput {
            schema_version: SCHEMA_VERSION,
            config: Some(config),
            layout: Layout::default(),
            version: String::new(),
            arch: String::new(),
            artifacts: Vec::new(),
            restart: Vec::new(),
            prune: false,
            mounts: Vec::new(),
            bridge: String::new(),
            bootstrap_kubeconfig: String::new(),
        }
    }

    /// What a phase granted `parts` receives: those fields, every other one at its default,
    /// and the config's secrets replaced by their references.
    pub fn restricted_to(&self, parts: &[InputPart]) -> PhaseInput {
        let has = |p: InputPart| parts.contains(&p);
        PhaseInput {
            schema_version: SCHEMA_VERSION,
            config: self
                .config
                .as_ref()
                .filter(|_| has(InputPart::Config))
                .map(NodeConfig::with_secret_references),
            layout: if has(InputPart::Layout) {
                self.layout.clone()
            } else {
                Layout::default()
            },
            version: if has(InputPart::Version) {
                self.version.clone()
            } else {
                String::new()
            },
            arch: if has(InputPart::Arch) {
                self.arch.clone()
            } else {
                String::new()
            },
            artifacts: if has(InputPart::Artifacts) {
                self.artifacts.clone()
            } else {
                Vec::new()
            },
            restart: if has(InputPart::Restart) {
                self.restart.clone()
            } else {
                Vec::new()
            },
            prune: has(InputPart::Prune) && self.prune,
            mounts: if has(InputPart::Mounts) {
                self.mounts.clone()
            } else {
                Vec::new()
            },
            bridge: if has(InputPart::Bridge) {
                self.bridge.clone()
            } else {
                String::new()
            },
            bootstrap_kubeconfig: if has(InputPart::BootstrapKubeconfig) {
                self.bootstrap_kubeconfig.clone()
            } else {
                String::new()
            },
        }
    }

    /// Parses a phase's input: refuses an unknown [`PhaseInput::schema_version`] before
    /// anything else (naming both versions), then the document strictly, then validates the
    /// config as a phase sees it (secrets as references).
    pub fn parse(input: &str) -> Result<PhaseInput, String> {
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Version {
            schema_version: Option<u32>,
        }
        let v: Version =
            serde_json::from_str(input).map_err(|e| format!("input is not a phase input: {e}"))?;
        match v.schema_version {
            Some(SCHEMA_VERSION) => {}
            Some(other) => {
                return Err(format!(
                    "input schemaVersion {other} is not {SCHEMA_VERSION}, the one this phase reads (the agent and the bundle disagree: install a bundle built for this agent)"
                ));
            }
            None => return Err("input has no schemaVersion".into()),
        }
        let input: PhaseInput =
            serde_json::from_str(input).map_err(|e| format!("input is not a phase input: {e}"))?;
        if let Some(c) = &input.config {
            c.validate_phase_view()
                .map_err(|e| format!("invalid node config: {e}"))?;
        }
        Ok(input)
    }

    /// The config, or an error saying the phase's grants do not name it.
    pub fn config(&self) -> Result<&NodeConfig, String> {
        self.config.as_ref().ok_or_else(|| {
            "input.config is absent: the bundle's grants for this phase do not name the \"config\" input part".to_string()
        })
    }

    /// [`PhaseInput::bootstrap_kubeconfig`], or an error saying the phase's grants do not name
    /// it.
    pub fn bootstrap_kubeconfig(&self) -> Result<&str, String> {
        match self.bootstrap_kubeconfig.as_str() {
            "" => Err("input.bootstrapKubeconfig is absent: the bundle's grants for this phase do not name the \"bootstrap-kubeconfig\" input part".to_string()),
            path => Ok(path),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn full() -> PhaseInput {
        let config: NodeConfig = serde_json::from_str(
            r#"{"apiVersion":"nodeward.io/v1alpha1","kind":"NodeConfig","machineName":"w",
            "cluster":{"apiServer":"https://10.0.0.1:6443",
              "caCertData":"LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCk1JSUIKLS0tLS1FTkQgQ0VSVElGSUNBVEUtLS0tLQo=",
              "kubernetesVersion":"1.34.1"},
            "kubelet":{"auth":{"bootstrapToken":"abcdef.0123456789abcdef"}}}"#,
        )
        .expect("sample config");
        let mut input = PhaseInput::new(config);
        input.layout.root = "/r".into();
        input.version = "1.34.1-x".into();
        input.arch = "amd64".into();
        input.artifacts = default_artifacts(input.config.as_ref().expect("config"), "amd64");
        input.restart = vec!["binaries".into()];
        input.prune = true;
        input.mounts = vec!["var/lib/kubelet/pods/x".into()];
        input.bridge = "cni0".into();
        input.bootstrap_kubeconfig = "/r/etc/kubernetes/bootstrap-kubelet.conf".into();
        input
    }

    #[test]
    fn a_phase_gets_only_its_parts_and_never_a_secret() {
        let input = full();
        let none = input.restricted_to(&[]);
        assert_eq!(
            serde_json::to_value(&none).expect("json"),
            serde_json::json!({
                "schemaVersion": 1, "layout": {"root": "/", "unitDir": "etc/systemd/system"},
                "version": "", "arch": "", "artifacts": [], "restart": [], "prune": false,
                "mounts": []
            }),
            "default-deny: only the schema version"
        );
        let configured = input.restricted_to(&[InputPart::Config, InputPart::Layout]);
        let text = serde_json::to_string(&configured).expect("json");
        assert!(!text.contains("0123456789abcdef"), "{text}");
        assert!(text.contains(crate::secret::BOOTSTRAP_TOKEN_REF));
        assert_eq!(configured.layout.root, "/r");
        assert!(configured.artifacts.is_empty() && !configured.prune);
        let all = [
            InputPart::Config,
            InputPart::Layout,
            InputPart::Version,
            InputPart::Arch,
            InputPart::Artifacts,
            InputPart::Restart,
            InputPart::Prune,
            InputPart::Mounts,
            InputPart::Bridge,
            InputPart::BootstrapKubeconfig,
        ];
        let mut expected = input.clone();
        expected.config = expected.config.map(|c| c.with_secret_references());
        assert_eq!(input.restricted_to(&all), expected);
        assert_eq!(PhaseInput::parse(&text), Ok(configured));
        let bridge = input.restricted_to(&[InputPart::Bridge]);
        assert_eq!(bridge.bridge, "cni0");
        assert_eq!(
            serde_json::to_value(&bridge).expect("json")["bridge"],
            "cni0",
            "sent when granted and set"
        );
        let kubeconfig = input.restricted_to(&[InputPart::BootstrapKubeconfig]);
        assert_eq!(
            kubeconfig.bootstrap_kubeconfig(),
            Ok("/r/etc/kubernetes/bootstrap-kubelet.conf")
        );
        assert!(
            serde_json::to_string(&kubeconfig)
                .expect("json")
                .contains(r#""bootstrapKubeconfig":"/r/etc/kubernetes/bootstrap-kubelet.conf""#)
        );
        assert!(
            none.bootstrap_kubeconfig()
                .is_err_and(|e| e.contains("\"bootstrap-kubeconfig\"")),
            "not granted: absent, and the error names the part"
        );
    }

    #[test]
    fn parse_refuses_another_schema_version_and_a_real_token() {
        let input = full();
        let mut v = serde_json::to_value(input.restricted_to(&[InputPart::Config])).expect("json");
        v["schemaVersion"] = serde_json::json!(2);
        v["fieldOfVersion2"] = serde_json::json!(true);
        let err = PhaseInput::parse(&v.to_string()).expect_err("version 2");
        assert!(err.contains("schemaVersion 2"), "{err}");
        v.as_object_mut().map(|o| o.remove("schemaVersion"));
        let err = PhaseInput::parse(&v.to_string()).expect_err("no version");
        assert!(err.contains("no schemaVersion"), "{err}");
        let leaked = serde_json::to_string(&input).expect("json");
        let err = PhaseInput::parse(&leaked).expect_err("a token in a phase's input");
        assert!(
            err.contains("kubelet.auth.bootstrapToken") && !err.contains("0123456789abcdef"),
            "{err}"
        );
        let bare = PhaseInput::parse(r#"{"schemaVersion": 1}"#).expect("all defaults");
        assert!(bare.config().is_err_and(|e| e.contains("\"config\"")));
    }
}
