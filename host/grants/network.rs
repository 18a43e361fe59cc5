//! `network` grants: which bridges a phase may delete (`wit/network.wit`).
//!
//! # Guarantees
//! - An entry is a link name (`cni0`) or a prefix ending in `*` (`cni0*`) with at least two
//!   characters before it; names are at most [`IFNAME_MAX`] bytes of letters, digits, `_`,
//!   `-` and `.`, so no entry can be empty, `*`, or name what the kernel would refuse.
//! - No entry names or, as a pattern, could match a host uplink ([`UPLINK_PREFIXES`], `lo`):
//!   a grant a reviewer approves cannot reach the machine's own network by a typo. The
//!   capability also refuses, at run time, any link that carries a default route, whatever
//!   its name.
//! - No entry names or, as a pattern, could match a bridge of another tool on the host
//!   ([`FOREIGN_BRIDGE_PREFIXES`]: Podman, Docker, nerdctl, libvirt, LXC, LXD, Incus,
//!   Proxmox VE, systemd-nspawn, Weave Net):
//!   `cni*` is refused because it could match Podman's `cni-podman0`, `br*` because it could
//!   match a Docker network's `br-<id>`. The capability's run-time checks cannot tell such a
//!   bridge from the node's (its ports are veths too), so the grant must not reach it.
//! - `node-bridge` admits exactly the bridge the host took from the node's applied config for
//!   the run (`PhaseCtx::node_bridge`), so the phase chooses no byte of the name.

use serde::{Deserialize, Serialize};

/// The longest interface name the kernel takes (IFNAMSIZ - 1).
pub const IFNAME_MAX: usize = 15;

/// Name prefixes of the links a host reaches its network through (kernel and systemd
/// predictable names: `eth0`, `enp0s3`, `wlan0`, `wwan0`, `ib0`, `bond0`). No grant may name
/// one or be a pattern that could match one.
pub const UPLINK_PREFIXES: &[&str] = &["eth", "en", "wl", "ww", "ib", "bond"];

/// Name prefixes of the bridges other tools make on a host, with the tool (kept with the node
/// config, which refuses them as `network.bridgeName` too).
pub use nodeward_node_config::FOREIGN_BRIDGE_PREFIXES;

/// Bridges the phase may delete (with their veth ports).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct NetworkGrant {
    /// Bridge names, exact or ending in `*` (a prefix).
    pub bridges: Vec<String>,
    /// Whether the phase may delete the bridge the host took from the node's applied config
    /// for this run (and no other by this grant).
    pub node_bridge: bool,
}

/// Whether `s` is a link name the capability takes: 1 to [`IFNAME_MAX`] bytes of letters,
/// digits, `_`, `-` and `.`, not `.` or `..`.
pub fn is_link_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= IFNAME_MAX
        && s != "."
        && s != ".."
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

/// Whether `name` is `lo` or starts with a host uplink's prefix ([`UPLINK_PREFIXES`]): a link
/// the capability never deletes, whatever the grant.
pub fn is_uplink_name(name: &str) -> bool {
    name == "lo" || UPLINK_PREFIXES.iter().any(|u| name.starts_with(u))
}

/// Why a `network.bridges` entry is refused, or `None` when it is well formed.
pub fn invalid_bridge_entry(entry: &str) -> Option<String> {
    let (name, pattern) = match entry.strip_suffix('*') {
        Some(prefix) => (prefix, true),
        None => (entry, false),
    };
    if pattern && name.len() < 2 {
        return Some("a pattern needs at least two characters before its '*'".into());
    }
    if !is_link_name(name) {
        return Some(format!(
            "a link name of 1 to {IFNAME_MAX} letters, digits, '_', '-' or '.', optionally \
             ending in '*'"
        ));
    }
    if name == "lo" {
        return Some("names the loopback interface".into());
    }
    // An exact name starting with a family's prefix is one of the family; a pattern is
    // refused when it and the prefix could both start some name.
    let clash = |family: &str| name.starts_with(family) || (pattern && family.starts_with(name));
    if let Some(uplink) = UPLINK_PREFIXES.iter().find(|u| clash(u)) {
        return Some(format!(
            "could name a host uplink ({uplink}*); such links are never deleted"
        ));
    }
    if let Some((family, tool)) = FOREIGN_BRIDGE_PREFIXES.iter().find(|(f, _)| clash(f)) {
        return Some(format!(
            "could name a bridge of {tool} ({family}*), not the node's; another tool's \
             bridges are never granted"
        ));
    }
    None
}

impl NetworkGrant {
    /// Whether the bridge `name` may be deleted, `node_bridge` being the run's node bridge.
    pub fn may_delete_bridge(&self, name: &str, node_bridge: Option<&str>) -> bool {
        if self.node_bridge && node_bridge == Some(name) {
            return true;
        }
        self.bridges
            .iter()
            .filter(|g| invalid_bridge_entry(g).is_none())
            .any(|g| match g.strip_suffix('*') {
                Some(prefix) => name.starts_with(prefix),
                None => g == name,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_names_or_prefixes_and_never_uplinks() {
        for ok in ["cni0", "cni0*", "kube-bridge", "nw.0", "nwbr*", "cni-x*"] {
            assert_eq!(invalid_bridge_entry(ok), None, "{ok}");
        }
        for bad in [
            "",
            "*",
            "c*",
            "**",
            "lo",
            "eth0",
            "eth*",
            "e*",
            "en*",
            "enp0s3",
            "wlan0",
            "w*",
            "bond0",
            "ib0",
            "a/b",
            "a b",
            "..",
            ".",
            "cni0\n",
            "abcdefghijklmnop",
            "abcdefghijklmno*x",
            "cni0:1",
            "cn*0",
        ] {
            assert!(
                invalid_bridge_entry(bad).is_some(),
                "{bad:?} must be refused"
            );
        }
        assert!(is_link_name("abcdefghijklmno"), "15 bytes is IFNAMSIZ - 1");
    }

    #[test]
    fn entries_that_could_name_another_tools_bridge_are_refused() {
        for (bad, family) in [
            ("cni*", "cni-podman*"),
            ("cni-*", "cni-podman*"),
            ("cni-podman0", "cni-podman*"),
            ("po*", "podman*"),
            ("podman1", "podman*"),
            ("do*", "docker*"),
            ("docker0", "docker*"),
            ("br*", "br-*"),
            ("br-*", "br-*"),
            ("br-1a2b3c4d5e6f", "br-*"),
            ("br-pods", "br-*"),
            ("vi*", "virbr*"),
            ("virbr0", "virbr*"),
            ("lx*", "lxcbr*"),
            ("lxcbr0", "lxcbr*"),
            ("lxd*", "lxdbr*"),
            ("lxdbr0", "lxdbr*"),
            ("in*", "incusbr*"),
            ("incusbr0", "incusbr*"),
            ("vm*", "vmbr*"),
            ("vmbr0", "vmbr*"),
        ] {
            let why = invalid_bridge_entry(bad).unwrap_or_else(|| panic!("{bad} must be refused"));
            assert!(
                why.contains(&format!("({family})")) && why.contains("never granted"),
                "{bad}: {why}"
            );
        }
        for ok in [
            "cni0*", "cni0", "nwbr*", "bridge0", "brx*", "cni-x*", "kube-*", "vmx*",
        ] {
            assert_eq!(invalid_bridge_entry(ok), None, "{ok}");
        }
        let g = NetworkGrant {
            bridges: vec!["cni*".into(), "cni0".into()],
            node_bridge: false,
        };
        assert!(
            !g.may_delete_bridge("cni-podman0", None),
            "a refused entry matches nothing"
        );
        assert!(!g.may_delete_bridge("cni1", None));
        assert!(g.may_delete_bridge("cni0", None));
    }

    #[test]
    fn matches_exact_names_prefixes_and_only_the_node_bridge() {
        let g = NetworkGrant {
            bridges: vec!["cni0".into(), "kube-*".into(), "lo".into()],
            node_bridge: false,
        };
        assert!(g.may_delete_bridge("cni0", None));
        assert!(!g.may_delete_bridge("cni00", None));
        assert!(g.may_delete_bridge("kube-br", None));
        assert!(
            !g.may_delete_bridge("lo", None),
            "an invalid entry matches nothing"
        );
        assert!(!g.may_delete_bridge("br-pods", Some("br-pods")));
        let node = NetworkGrant {
            node_bridge: true,
            ..Default::default()
        };
        assert!(node.may_delete_bridge("br-pods", Some("br-pods")));
        assert!(!node.may_delete_bridge("cni0", Some("br-pods")));
        assert!(!node.may_delete_bridge("cni0", None));
    }
}
