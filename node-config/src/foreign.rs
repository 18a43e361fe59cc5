//! Names other tools give the bridges they make on a host.

/// Name prefixes of the bridges other tools make on a host, with the tool. A node's own bridge
/// (`network.bridgeName`) must not start with one, and no bundle grant may name one or be a
/// pattern that could match one (`host/grants/network.rs`): reset deletes the node's bridge
/// with its veth ports, and these bridges' ports are veths with peers in other namespaces
/// too, so a deletion of one would pass every run-time check and cut off that tool's
/// containers or VMs.
pub const FOREIGN_BRIDGE_PREFIXES: &[(&str, &str)] = &[
    ("cni-podman", "Podman's CNI networks"),
    ("podman", "Podman"),
    ("docker", "Docker"),
    ("br-", "Docker's user-defined networks"),
    ("nerdctl", "nerdctl"),
    ("virbr", "libvirt"),
    ("lxcbr", "LXC"),
    ("lxdbr", "LXD"),
    ("incusbr", "Incus"),
    ("vmbr", "Proxmox VE"),
    ("vz-", "systemd-nspawn's network zones"),
    ("weave", "Weave Net"),
];
