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
//! - The bridge is found by its primary name in a full link dump (an altname never matches)
//!   and must be of kind `bridge`. Its veth ports are deleted first, each re-checked by index
//!   right before (same name, still a veth, still enslaved to that bridge, its peer still in
//!   another namespace). Before the bridge goes, the links are listed again and the decision
//!   below is made again on them ([`recheck_bridge`]): a change there is `failed`, the bridge
//!   left; then it is deleted by index after the same re-check by index.
//! - What the call deletes is the bridge and its pods' veths (a veth port whose peer is in
//!   another namespace: the CNI bridge plugin moves a pod's end into the pod's); nothing else
//!   goes with them, or nothing is deleted ([`plan_deletion`], the same in plan and apply):
//!   - a bridge that is itself a port of another link (a bond, team, bridge or VRF) is refused
//!     (`denied`): the CNI bridge plugin never enslaves its bridge, so its deletion would
//!     unplug someone else's networking;
//!   - a port that is not a veth (a NIC, a bond, a vlan, a tap) is refused (`denied`): the
//!     node's bridge has none, and its deletion would unplug host networking;
//!   - a link in this namespace stacked on a link to delete (its `IFLA_LINK`, or a vxlan's
//!     `IFLA_VXLAN_LINK`: a vlan, macvlan, macvtap, ipvlan, macsec, vxlan, ...), which the
//!     kernel would delete with it unchecked and unaudited, is refused (`denied`);
//!   - a veth port whose peer is in this namespace is released, not deleted, whatever the
//!     peer's master: a pod's peer is not here, so this pair is someone else's. The bridge's
//!     audit record and change name it.
//! - Nothing is deleted when the bridge or one of the veths to delete carries a default route
//!   (a /0 or a /1: [`super::netlink::Netlink::default_route_links`]).
//! - Every deleted link has its own audit record (`network.delete-link`, which past the
//!   record budget refuses the deletion) and a [`ChangeKind::LinkDelete`]; plan mode reads
//!   the same links, refuses what apply refuses and records the same changes without deleting.
//! - A delete whose reply did not come by the deadline is decided by reading the link again by
//!   index ([`Deleted::AfterTimeout`]): a link found gone has its change recorded (the note
//!   says how it was learnt); one still there, or not readable, is `timeout` and no change.
//!
//! # Caveats
//! Between the route check and a deletion a process with `CAP_NET_ADMIN` could add a default
//! route through the bridge; such a process is root already. Links of other namespaces
//! stacked on the bridge (a macvlan made on `cni0`, then moved into a pod's namespace) are not
//! seen: a dump lists one namespace, and the kernel deletes them with the bridge.

use super::netlink::{Deleted, Netlink, NetlinkLimits, NlError, Transport, wire::Link};
use super::{Error, Outcome, PhaseCtx, denied};
use crate::grants::{is_link_name, is_uplink_name};
use crate::plan::{ChangeKind, RunMode};
use crate::wit::network;
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};

/// What the `network` capability of a run is bounded by.
#[derive(Clone, Debug, Default)]
pub struct NetworkContext {
    /// Bounds on the dumps one call reads.
    pub limits: NetlinkLimits,
}

/// What deleting one bridge takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deletion {
    /// The bridge.
    pub bridge: Link,
    /// Its veth ports to delete, in index order: each a pod's, its peer in another namespace
    /// (which the kernel deletes with it), or a veth without a peer.
    pub veths: Vec<Link>,
    /// Ports released, not deleted (`name: why`).
    pub released: Vec<String>,
}

impl Deletion {
    /// Every link that goes away: the bridge and its veths (a veth's peer is in another
    /// namespace, whose links this call does not see).
    fn doomed(&self) -> impl Iterator<Item = &Link> {
        std::iter::once(&self.bridge).chain(&self.veths)
    }
}

/// `kind bond`, or what a link without a kind likely is.
fn kind_of(link: &Link) -> String {
    if link.kind.is_empty() {
        "no link kind: a NIC?".into()
    } else {
        format!("kind {}", link.kind)
    }
}

/// `name`, or `index N` for an index the dump did not list.
fn name_of(index: u32, links: &[Link]) -> String {
    links
        .iter()
        .find(|l| l.index == index)
        .map_or_else(|| format!("index {index}"), |l| l.name.clone())
}

/// What deleting the bridge named `name` takes, from a full link dump: `Ok(None)` when no link
/// has that primary name; `failed` when the link of that name is not a bridge; `denied`,
/// nothing deleted, when deleting it would take or unplug something the node did not make.
/// The same for plan and apply: the refusal comes before anything is deleted.
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
    match deletion_of(bridge, links) {
        Ok(d) => Ok(Some(d)),
        Err(why) => Err(Error::Denied(format!(
            "deleting bridge {name} would {why}: nothing deleted"
        ))),
    }
}

/// The ports of `bridge` to delete and to release, or why the bridge may not go (what it
/// would take with it, or what it would unplug).
fn deletion_of(bridge: &Link, links: &[Link]) -> Result<Deletion, String> {
    if let Some(m) = bridge.master {
        // The CNI bridge plugin never enslaves its bridge: one that is a port of a bond, a
        // team or another bridge carries someone else's networking.
        let upper = match links.iter().find(|l| l.index == m) {
            Some(u) => format!("{} (index {m}, {})", u.name, kind_of(u)),
            None => format!("its master, index {m}, which the dump did not list"),
        };
        return Err(format!(
            "unplug it from {upper}, whose port it is: the node's bridge is no other link's \
             port"
        ));
    }
    let mut veths = Vec::new();
    let mut released = Vec::new();
    for port in links.iter().filter(|l| l.master == Some(bridge.index)) {
        if port.kind != "veth" {
            // The CNI bridge plugin adds only veths: this is host networking (a NIC, a bond,
            // a vlan, a tap) that the bridge's deletion would unplug.
            return Err(format!(
                "release {} ({}), a port that is not a veth: the node's bridge has only veth \
                 ports",
                port.name,
                kind_of(port)
            ));
        }
        match port.veth_peer_here() {
            // The CNI plugin moves a pod's peer into the pod's namespace: a peer here makes
            // this pair something else (an operator's), left as it is.
            Some(peer) => {
                let peer_master = links
                    .iter()
                    .find(|l| l.index == peer)
                    .and_then(|p| p.master);
                let master = match peer_master {
                    Some(m) => format!(", a port of {}", name_of(m, links)),
                    None => String::new(),
                };
                released.push(format!(
                    "{}: its peer {} is in this namespace{master}, not in a pod's; released \
                     from the bridge, not deleted",
                    port.name,
                    name_of(peer, links)
                ));
            }
            None => veths.push(port.clone()),
        }
    }
    let d = Deletion {
        bridge: bridge.clone(),
        veths,
        released,
    };
    // The kernel deletes an upper link (vlan, macvlan, ipvlan, macsec, vxlan, ...) with the
    // link it is stacked on, and a veth with its peer: neither would be checked or audited.
    let doomed: BTreeMap<u32, &Link> = d.doomed().map(|l| (l.index, l)).collect();
    for l in links.iter().filter(|l| !doomed.contains_key(&l.index)) {
        if let Some(lower) = l.lowers_here().iter().find_map(|i| doomed.get(i)) {
            return Err(format!(
                "delete {} ({}), stacked on {} (index {}): the kernel deletes an upper link \
                 with its lower one",
                l.name,
                kind_of(l),
                lower.name,
                lower.index
            ));
        }
        // Not stacked: a pair. A doomed veth's peer is in another namespace, so this is only
        // met when the dump contradicts itself; refused all the same.
        if let Some(peer) = l.veth_peer_here().and_then(|i| doomed.get(&i)) {
            return Err(format!(
                "delete {} (index {}), the veth peer in this namespace of {} (index {})",
                l.name, l.index, peer.name, peer.index
            ));
        }
    }
    Ok(d)
}

/// `denied` when a link `deletion` takes carries a default route.
pub fn check_default_routes(
    deletion: &Deletion,
    default_route_links: &BTreeSet<u32>,
) -> Result<(), Error> {
    for link in deletion.doomed() {
        if default_route_links.contains(&link.index) {
            return Err(Error::Denied(format!(
                "deleting bridge {} would delete {} (index {}), which carries a default route: \
                 nothing deleted",
                deletion.bridge.name, link.name, link.index
            )));
        }
    }
    Ok(())
}

/// Right before the bridge itself is deleted (apply, its veths gone): the bridge as a fresh
/// dump `links` shows it must still be the one listed, with no port to delete left and
/// nothing new that its deletion would take or unplug. `failed` otherwise: the veths are
/// gone, the bridge stays.
pub fn recheck_bridge(planned: &Deletion, links: &[Link]) -> Result<(), Error> {
    let name = &planned.bridge.name;
    let changed = |why: String| {
        Error::Failed(format!(
            "bridge {name} (index {}) changed after its veths were deleted: {why}; the bridge \
             was not deleted",
            planned.bridge.index
        ))
    };
    let Some(now) = links.iter().find(|l| l.index == planned.bridge.index) else {
        return Ok(());
    };
    if now.name != *name || now.kind != planned.bridge.kind {
        return Err(changed(format!("now {:?}, kind {:?}", now.name, now.kind)));
    }
    let d = deletion_of(now, links).map_err(|why| changed(format!("deleting it would {why}")))?;
    if let Some(v) = d.veths.first() {
        return Err(changed(format!(
            "it has a veth port {} that was not listed",
            v.name
        )));
    }
    Ok(())
}

/// A netlink failure as the WIT error: `timeout` (a delete whose outcome is not known among
/// them), `failed` for limits and interrupted or
/// unreadable dumps, `io` for what the kernel refused.
fn nl_error(e: NlError) -> Error {
    match e {
        NlError::Timeout { .. } | NlError::Unconfirmed { .. } => Error::Timeout(e.to_string()),
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
        check_default_routes(&deletion, &routes)?;
        let bridge = &deletion.bridge;
        for port in &deletion.veths {
            let note = match port.iflink {
                Some(_) => format!("port of {name}; its peer in the pod's namespace went with it"),
                None => format!("port of {name}; a veth without a peer"),
            };
            self.delete_link(nl, port, Some(bridge.index), note)?;
        }
        if self.run.mode() == RunMode::Apply {
            // What the bridge's deletion takes is decided again on the links as they are now.
            let now = nl.links().map_err(nl_error)?;
            recheck_bridge(&deletion, &now)?;
        }
        let note = if deletion.released.is_empty() {
            String::new()
        } else {
            format!("released: {}", deletion.released.join("; "))
        };
        self.delete_link(nl, bridge, bridge.master, note)?;
        Ok(Outcome::Removed)
    }

    /// Deletes one link (apply) after checking its index still names it (same name and kind,
    /// `master` as listed, its `IFLA_LINK` still in the namespace it was: a pod's veth whose
    /// peer came here is no longer one), with its own audit record; records the change in both
    /// modes.
    fn delete_link<T: Transport>(
        &mut self,
        nl: &mut Netlink<T>,
        link: &Link,
        master: Option<u32>,
        mut note: String,
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
                if now.name != link.name
                    || now.kind != link.kind
                    || now.master != master
                    || now.iflink_elsewhere != link.iflink_elsewhere
                {
                    return Err(Error::Failed(format!(
                        "link {} (index {}) changed since it was listed (now {:?}, kind {:?}, \
                         master {:?}, peer in another namespace: {}): not deleted",
                        link.name, link.index, now.name, now.kind, now.master, now.iflink_elsewhere
                    )));
                }
                match nl.delete_link(link.index, &link.name).map_err(nl_error)? {
                    Deleted::Acked => {}
                    Deleted::AlreadyGone => return Ok(Outcome::Unchanged),
                    // The link is gone: the change happened, whatever became of the reply.
                    Deleted::AfterTimeout => {
                        note = join_note(
                            &note,
                            "no reply to the delete before the phase deadline; read again by \
                             index, the link was gone",
                        );
                    }
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

/// `a; b`, or `b` when `a` is empty.
fn join_note(a: &str, b: &str) -> String {
    if a.is_empty() {
        b.to_string()
    } else {
        format!("{a}; {b}")
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
#[path = "network_tests.rs"]
mod tests;
