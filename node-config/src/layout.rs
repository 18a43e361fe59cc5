//! Where a host-native ("none" mode) node lives on the host, shared by the host runtime and the
//! phases so both name every path the same way.
//!
//! Every path here is relative to the host root (`--root`, `/` in production): the phases pass
//! them to capabilities, which resolve them beneath the root. Paths written *into* files (a
//! unit's `ExecStart=`, a kubeconfig's CA path) must be absolute on the real host, so they go
//! through [`Layout::abs`], which prefixes the root.
//!
//! The agent owns [`NODE_DIR`]: one directory per installed version, each holding `bin/` and
//! `libexec/cni/`, and a relative `current` link selecting the active one. Configuration lives
//! at the usual host paths, so nothing outside the version directories changes per version.

use serde::{Deserialize, Serialize};

/// The agent-owned directory of installed versions.
pub const NODE_DIR: &str = "opt/nodeward/node";
/// The link naming the active version directory (a relative link: `current -> <version>`).
pub const CURRENT_LINK: &str = "opt/nodeward/node/current";
/// The file a version directory gets last, once every artifact is in place.
pub const VERSION_COMPLETE_MARKER: &str = ".complete";
/// The agent's own state for the node: install record, upgrade journal, applied config.
pub const STATE_DIR: &str = "var/lib/nodeward/node";

/// containerd's configuration.
pub const CONTAINERD_CONFIG: &str = "etc/containerd/config.toml";
/// containerd's persistent root (images, snapshots).
pub const CONTAINERD_ROOT: &str = "var/lib/containerd";
/// containerd's `opt` plugin directory (it installs nothing there for us, but creates it).
pub const CONTAINERD_OPT: &str = "opt/containerd";
/// containerd's state directory (sockets); below the root so a test keeps the host's /run.
pub const CONTAINERD_STATE: &str = "run/containerd";
/// containerd's CRI socket (`[grpc] address`), in its state directory; the kubelet's runtime
/// endpoint.
pub const CONTAINERD_SOCKET: &str = "run/containerd/containerd.sock";

/// The kubelet's root directory (`--root-dir`).
pub const KUBELET_DIR: &str = "var/lib/kubelet";
/// The kubelet's configuration file.
pub const KUBELET_CONFIG: &str = "var/lib/kubelet/config.yaml";
/// The kubelet's command-line flags, as `KUBELET_ARGS=...` read by its unit.
pub const KUBELET_FLAGS: &str = "var/lib/kubelet/nodeward-flags.env";
/// The kubeconfig the kubelet writes once its TLS bootstrap is done.
pub const KUBELET_KUBECONFIG: &str = "var/lib/kubelet/kubeconfig";
/// Where the kubelet keeps its client and serving certificates.
pub const KUBELET_PKI: &str = "var/lib/kubelet/pki";
/// The bootstrap kubeconfig (holds the bootstrap token; 0600).
pub const BOOTSTRAP_KUBECONFIG: &str = "etc/kubernetes/bootstrap-kubelet.conf";
/// The cluster CA certificate.
pub const CA_CERT: &str = "etc/kubernetes/pki/ca.crt";
/// Static pod manifests.
pub const MANIFESTS_DIR: &str = "etc/kubernetes/manifests";

/// The CNI plugin directory: a relative link into the active version's `libexec/cni`.
pub const CNI_BIN_DIR: &str = "opt/cni/bin";
/// The link's target, relative to `opt/cni`.
pub const CNI_BIN_LINK_TARGET: &str = "../nodeward/node/current/libexec/cni";
/// The CNI configuration directory.
pub const CNI_CONF_DIR: &str = "etc/cni/net.d";
/// The node's CNI network.
pub const CNI_CONFLIST: &str = "etc/cni/net.d/10-nodeward-bridge.conflist";
/// CNI plugin state (host-local IPAM leases).
pub const CNI_STATE_DIR: &str = "var/lib/cni";

/// Kernel modules listed for boot.
pub const MODULES_LOAD: &str = "etc/modules-load.d/nodeward.conf";
/// Sysctls applied at boot.
pub const SYSCTL_CONF: &str = "etc/sysctl.d/99-nodeward.conf";

/// The node's containerd unit. Named for the agent so it never collides with a distro unit.
pub const CONTAINERD_UNIT: &str = "nodeward-containerd.service";
/// The node's kubelet unit.
pub const KUBELET_UNIT: &str = "nodeward-kubelet.service";
/// The slice the kubelet (systemd cgroup driver) puts pods in.
pub const PODS_SLICE: &str = "kubepods.slice";
/// Units a host runs when it has a Kubernetes node of its own; bootstrap refuses such a host.
pub const FOREIGN_UNITS: &[&str] = &["kubelet.service", "containerd.service"];

/// The kubelet's default health endpoint port.
pub const KUBELET_HEALTHZ_PORT: u16 = 10248;

/// The host root, for paths written into files.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Layout {
    /// The host root as an absolute path on the real host (`/` in production).
    pub root: String,
    /// The systemd unit directory, relative to the root (`etc/systemd/system` by default).
    pub unit_dir: String,
}

impl Default for Layout {
    fn default() -> Self {
        Layout {
            root: "/".into(),
            unit_dir: "etc/systemd/system".into(),
        }
    }
}

impl Layout {
    /// `rel` (a root-relative path from this module) as an absolute host path.
    pub fn abs(&self, rel: &str) -> String {
        let root = self.root.trim_end_matches('/');
        let rel = rel.trim_start_matches('/');
        format!("{root}/{rel}")
    }

    /// A version directory, relative to the root.
    pub fn version_dir(version: &str) -> String {
        format!("{NODE_DIR}/{version}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn abs_joins_root_and_relative_path() {
        assert_eq!(Layout::default().abs(KUBELET_DIR), "/var/lib/kubelet");
        let l = Layout {
            root: "/tmp/r/".into(),
            ..Layout::default()
        };
        assert_eq!(l.abs(CA_CERT), "/tmp/r/etc/kubernetes/pki/ca.crt");
    }
}
