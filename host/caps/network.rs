//! `nodeward:host/network`: deletes the pods' bridge and its veths.
//!
//! # Background
//! The CNI bridge plugin makes one Linux bridge for the node (`network.bridgeName`, `cni0` by
//! default) and, per pod, a veth pair with the host side enslaved to it and the other side in
//! the pod's network namespace. A reset must take them away; nothing else on the host's
//! network may be touched. Links live in the agent's network namespace, not beneath the host
//! root, so `--root` does not change what this capability sees (as `systemd` acts on the
//! machine's systemd). [`super::netlink`] speaks rtnetlink; this module decides what to delete.
//!
//! # Guarantees
//! - Grant check first: the name's shape, then `network.bridges` or `network.node-bridge`
//!   (the bridge of the node's applied config, [`super::PhaseCtx::node_bridge`]); `lo` and
//!   host uplink names are refused whatever the grant says.
//! - The bridge is found by its primary name in a full link dump (an altname never matches),
//!   must be of kind `bridge`, and is deleted by index after the same checks are made again on
//!   that index. Its veth ports are deleted first, each re-checked by index (same name, still
//!   a veth, still enslaved to that bridge); ports of other kinds are released, not deleted.
//! - Nothing is deleted when the bridge, one of the veths to delete or a peer of one in this
//!   namespace carries a default route ([`super::netlink::Netlink::default_route_links`]).
//! - A veth whose peer in this namespace has another master is left: it links the bridge to
//!   something the node did not make.
//! - Every deleted link has its own audit record (`network.delete-link`, which past the
//!   record budget refuses the deletion) and a [`ChangeKind::LinkDelete`]; plan mode reads
//!   the same links and records the same changes without deleting.
//!
//! # Caveats
//! Between the route check and a deletion a process with `CAP_NET_ADMIN` could add a default
//! route through the bridge; such a process is root already.

use super::netlink::{Netlink, NetlinkLimits, NlError, Transport, wire::Link};
use super::{Error, Outcome, PhaseCtx, denied};
use crate::grants::{is_link_name, is_uplink_name};
use crate::plan::{ChangeKind, RunMode};
use crate::wit::network;
use serde_json::json;
use std::collections::BTreeSet;

/// What the `network` capability of a run is bounded by.
#[derive(Clone, Debug, Default)]
pub struct NetworkContext {
    /// Bounds on the dumps one call reads.
    pub limits: NetlinkLimits,
}

/// A veth to delete, and what goes with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VethPort {
    /// The host side, enslaved to the bridge.
    pub link: Link,
    /// Its peer's name when the peer is in this namespace too (it is deleted with it).
    pub peer_here: Option<String>,
}

/// What deleting one bridge takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deletion {
    /// The bridge.
    pub bridge: Link,
    /// Its veth ports to delete, in index order.
    pub veths: Vec<VethPort>,
    /// Ports released, not deleted (`name: why`).
    pub released: Vec<String>,
}

impl Deletion {
    /// Every link index that goes away (bridges, veths, same-namespace peers), with its name.
    fn doomed(&self, links: &[Link]) -> Vec<(u32, String)> {
        let mut out = vec![(self.bridge.index, self.bridge.name.clone())];
        for v in &self.veths {
            out.push((v.link.index, v.link.name.clone()));
            if let Some(peer) = v.link.peer.filter(|_| v.peer_here.is_some())
                && let Some(p) = links.iter().find(|l| l.index == peer)
            {
                out.push((p.index, p.name.clone()));
            }
        }
        out
    }
}

/// What deleting the bridge named `name` takes, from a full link dump: `Ok(None)` when no link
/// has that primary name; `failed` when the link of that name is not a bridge.
pub fn plan_deletion(name: &str, links: &[Link]) -> Result<Option<Deletion>, Error> {
    let Some(bridge) = links.iter().find(|l| l.name == name) else {
        return Ok(None);
    };
    if bridge.kind != "bridge" {
        let kind = if bridge.kind.is_empty() {
            "a device without a link kind (a NIC?)"
        } else {
            &bridge.kind
        };
        return Err(Error::Failed(format!(
            "link {name} (index {}) is {kind}, not a bridge: nothing deleted",
            bridge.index
        )));
    }
    let mut veths = Vec::new();
    let mut released = Vec::new();
    for port in links.iter().filter(|l| l.master == Some(bridge.index)) {
        if port.kind != "veth" {
            let kind = if port.kind.is_empty() {
                "device"
            } else {
                &port.kind
            };
            released.push(format!("{}: a {kind}, released from the bridge", port.name));
            continue;
        }
        let peer = port
            .peer
            .filter(|_| !port.peer_elsewhere)
            .and_then(|p| links.iter().find(|l| l.index == p));
        match peer {
            Some(p) if p.master.is_some_and(|m| m != bridge.index) => released.push(format!(
                "{}: its peer {} in this namespace is a port of another master; released \
                 from the bridge, not deleted",
                port.name, p.name
            )),
            _ => veths.push(VethPort {
                link: port.clone(),
                peer_here: peer.map(|p| p.name.clone()),
            }),
        }
    }
    Ok(Some(Deletion {
        bridge: bridge.clone(),
        veths,
        released,
    }))
}

/// `denied` when a link `deletion` takes carries a default route.
pub fn check_default_routes(
    deletion: &Deletion,
    links: &[Link],
    default_route_links: &BTreeSet<u32>,
) -> Result<(), Error> {
    for (index, link) in deletion.doomed(links) {
        if default_route_links.contains(&index) {
            return Err(Error::Denied(format!(
                "deleting bridge {} would delete {link} (index {index}), which carries a \
                 default route: nothing deleted",
                deletion.bridge.name
            )));
        }
    }
    Ok(())
}

/// A netlink failure as the WIT error: `timeout`, `failed` for limits and interrupted or
/// unreadable dumps, `io` for what the kernel refused.
fn nl_error(e: NlError) -> Error {
    match e {
        NlError::Timeout { .. } => Error::Timeout(e.to_string()),
        NlError::Limit { .. } | NlError::Interrupted { .. } | NlError::Malformed { .. } => {
            Error::Failed(e.to_string())
        }
        NlError::Errno { errno, .. } if errno == rustix::io::Errno::PERM => Error::Io(format!(
            "{e} (the agent needs CAP_NET_ADMIN in its network namespace)"
        )),
        NlError::Errno { .. } => Error::Io(e.to_string()),
    }
}

impl PhaseCtx {
    /// The checks and deletions of `delete-bridge` over `nl` (see the module docs).
    fn delete_bridge_with<T: Transport>(
        &mut self,
        nl: &mut Netlink<T>,
        name: &str,
    ) -> Result<Outcome, Error> {
        let links = nl.links().map_err(nl_error)?;
        let Some(deletion) = plan_deletion(name, &links)? else {
            return Ok(Outcome::Unchanged);
        };
        let routes = nl.default_route_links().map_err(nl_error)?;
        check_default_routes(&deletion, &links, &routes)?;
        let bridge = deletion.bridge.clone();
        for port in &deletion.veths {
            let note = match &port.peer_here {
                Some(p) => format!("port of {name}; its peer {p} in this namespace went with it"),
                None => format!("port of {name}; its peer in the pod's namespace went with it"),
            };
            self.delete_link(nl, &port.link, Some(bridge.index), note)?;
        }
        let note = (!deletion.released.is_empty())
            .then(|| format!("released: {}", deletion.released.join("; ")));
        self.delete_link(nl, &bridge, bridge.master, note.unwrap_or_default())?;
        Ok(Outcome::Removed)
    }

    /// Deletes one link (apply) after checking its index still names it (same name and kind,
    /// `master` as listed), with its own audit record; records the change in both modes.
    fn delete_link<T: Transport>(
        &mut self,
        nl: &mut Netlink<T>,
        link: &Link,
        master: Option<u32>,
        note: String,
    ) -> Result<(), Error> {
        let args = json!({
            "link": link.name, "index": link.index, "kind": link.kind, "note": note,
        });
        self.audited("network.delete-link", args, |ctx| {
            if ctx.run.mode() == RunMode::Apply {
                let now = nl.link(link.index).map_err(nl_error)?;
                let Some(now) = now else {
                    // Gone already: a peer deleted with an earlier veth, or someone else.
                    return Ok(Outcome::Unchanged);
                };
                if now.name != link.name || now.kind != link.kind || now.master != master {
                    return Err(Error::Failed(format!(
                        "link {} (index {}) changed since it was listed (now {:?}, kind {:?}, \
                         master {:?}): not deleted",
                        link.name, link.index, now.name, now.kind, now.master
                    )));
                }
                if !nl.delete_link(link.index, &link.name).map_err(nl_error)? {
                    return Ok(Outcome::Unchanged);
                }
            }
            ctx.changed(ChangeKind::LinkDelete {
                link: link.name.clone(),
                link_kind: link.kind.clone(),
                note: (!note.is_empty()).then(|| note.clone()),
            });
            Ok(Outcome::Removed)
        })?;
        Ok(())
    }
}

impl network::Host for PhaseCtx {
    fn delete_bridge(&mut self, name: String) -> Result<Outcome, Error> {
        self.audited("network.delete-bridge", json!({ "name": name }), |ctx| {
            if !is_link_name(&name) || name == "lo" {
                return Err(Error::InvalidArgument(format!(
                    "bridge name {name:?}: 1 to 15 letters, digits, '_', '-' or '.', not lo"
                )));
            }
            let granted = ctx
                .grants
                .network
                .may_delete_bridge(&name, ctx.node_bridge.as_deref());
            if !granted {
                return Err(denied(
                    format!("delete bridge {name}"),
                    "network.bridges or network.node-bridge",
                ));
            }
            if is_uplink_name(&name) {
                return Err(Error::Denied(format!(
                    "delete bridge {name}: the name of a host uplink; never deleted"
                )));
            }
            let limits = ctx.run.network.limits;
            let mut nl = Netlink::open(ctx.deadline, limits).map_err(nl_error)?;
            ctx.delete_bridge_with(&mut nl, &name)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(index: u32, name: &str, kind: &str, master: Option<u32>, peer: Option<u32>) -> Link {
        Link {
            index,
            name: name.into(),
            kind: kind.into(),
            master,
            peer,
            peer_elsewhere: false,
        }
    }

    fn pod_veth(index: u32, name: &str, master: u32) -> Link {
        Link {
            peer_elsewhere: true,
            ..link(index, name, "veth", Some(master), Some(2))
        }
    }

    #[test]
    fn the_bridge_and_only_its_veths_are_taken() {
        let links = vec![
            link(1, "lo", "", None, None),
            link(2, "eth0", "", None, None),
            link(5, "cni0", "bridge", None, None),
            pod_veth(6, "veth1", 5),
            pod_veth(7, "veth2", 9),
            link(8, "dummy0", "dummy", Some(5), None),
            link(9, "other", "bridge", None, None),
        ];
        let d = plan_deletion("cni0", &links).expect("ok").expect("found");
        assert_eq!(d.bridge.index, 5);
        assert_eq!(d.veths.len(), 1);
        assert_eq!(d.veths[0].link.name, "veth1");
        assert_eq!(d.veths[0].peer_here, None);
        assert_eq!(d.released, ["dummy0: a dummy, released from the bridge"]);
        assert!(matches!(plan_deletion("cni1", &links), Ok(None)));
        let e = plan_deletion("eth0", &links).expect_err("a NIC");
        assert!(
            matches!(&e, Error::Failed(m) if m.contains("not a bridge")),
            "{e:?}"
        );
        let e = plan_deletion("veth1", &links).expect_err("a veth");
        assert!(
            matches!(&e, Error::Failed(m) if m.contains("veth, not a bridge")),
            "{e:?}"
        );
    }

    #[test]
    fn a_peer_in_this_namespace_is_named_or_protects_its_pair() {
        let links = vec![
            link(5, "cni0", "bridge", None, None),
            link(6, "va", "veth", Some(5), Some(7)),
            link(7, "vb", "veth", None, Some(6)),
            link(8, "vc", "veth", Some(5), Some(9)),
            link(9, "vd", "veth", Some(10), Some(8)),
            link(10, "docker0", "bridge", None, None),
        ];
        let d = plan_deletion("cni0", &links).expect("ok").expect("found");
        assert_eq!(d.veths.len(), 1);
        assert_eq!(d.veths[0].peer_here.as_deref(), Some("vb"));
        assert_eq!(d.released.len(), 1);
        assert!(
            d.released[0].starts_with("vc: its peer vd"),
            "{:?}",
            d.released
        );
        let doomed: Vec<u32> = d.doomed(&links).into_iter().map(|(i, _)| i).collect();
        assert_eq!(doomed, [5, 6, 7]);
    }

    #[test]
    fn a_default_route_through_anything_doomed_refuses_the_whole_call() {
        let links = vec![
            link(5, "cni0", "bridge", None, None),
            link(6, "va", "veth", Some(5), Some(7)),
            link(7, "vb", "veth", None, Some(6)),
        ];
        let d = plan_deletion("cni0", &links).expect("ok").expect("found");
        assert!(check_default_routes(&d, &links, &BTreeSet::from([2])).is_ok());
        for through in [5, 6, 7] {
            let e = check_default_routes(&d, &links, &BTreeSet::from([through]))
                .expect_err("default route");
            assert!(
                matches!(&e, Error::Denied(m) if m.contains("default route")),
                "{e:?}"
            );
        }
    }

    #[test]
    fn uplink_names_are_never_deleted() {
        for n in ["lo", "eth0", "enp0s3", "wlan0", "bond0"] {
            assert!(is_uplink_name(n), "{n}");
        }
        for n in ["cni0", "br-pods", "kube-bridge"] {
            assert!(!is_uplink_name(n), "{n}");
        }
    }
}
