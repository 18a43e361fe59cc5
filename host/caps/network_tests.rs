//! What [`super::plan_deletion`], [`super::check_default_routes`] and
//! [`super::recheck_bridge`] decide, on constructed link dumps.

use super::*;

/// A link of this namespace; `iflink` its `IFLA_LINK` here.
fn link(index: u32, name: &str, kind: &str, master: Option<u32>, iflink: Option<u32>) -> Link {
    Link {
        index,
        name: name.into(),
        kind: kind.into(),
        master,
        iflink,
        iflink_elsewhere: false,
        vxlan_link: None,
    }
}

/// A pod's veth on `master`: its peer is index 2 of the pod's namespace.
fn pod_veth(index: u32, name: &str, master: u32) -> Link {
    Link {
        iflink_elsewhere: true,
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
        link(8, "dummy0", "dummy", None, None),
        link(9, "other", "bridge", None, None),
    ];
    let d = plan_deletion("cni0", &links).expect("ok").expect("found");
    assert_eq!(d.bridge.index, 5);
    assert_eq!(d.veths.len(), 1);
    assert_eq!(d.veths[0].name, "veth1");
    assert!(d.released.is_empty(), "{:?}", d.released);
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
fn a_veth_whose_peer_is_here_is_never_deleted_whatever_its_master() {
    let links = vec![
        link(5, "cni0", "bridge", None, None),
        link(6, "va", "veth", Some(5), Some(7)),
        link(7, "vb", "veth", None, Some(6)),
        link(8, "vc", "veth", Some(5), Some(9)),
        link(9, "vd", "veth", Some(10), Some(8)),
        link(10, "docker0", "bridge", None, None),
        pod_veth(11, "veth1", 5),
        // A veth without a peer (its other half torn down): deleting it takes only it.
        link(12, "vz", "veth", Some(5), None),
    ];
    let d = plan_deletion("cni0", &links).expect("ok").expect("found");
    let veths: Vec<&str> = d.veths.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(veths, ["veth1", "vz"]);
    assert_eq!(
        d.released,
        [
            "va: its peer vb is in this namespace, not in a pod's; released from the \
             bridge, not deleted",
            "vc: its peer vd is in this namespace, a port of docker0, not in a pod's; \
             released from the bridge, not deleted"
        ]
    );
    let doomed: Vec<u32> = d.doomed().map(|l| l.index).collect();
    assert_eq!(doomed, [5, 11, 12]);
}

#[test]
fn a_default_route_through_anything_doomed_refuses_the_whole_call() {
    let links = vec![
        link(5, "cni0", "bridge", None, None),
        pod_veth(6, "veth1", 5),
        link(7, "va", "veth", Some(5), Some(8)),
        link(8, "vb", "veth", None, Some(7)),
    ];
    let d = plan_deletion("cni0", &links).expect("ok").expect("found");
    // Through a link that stays (a released pair among them): no matter.
    for elsewhere in [2, 7, 8] {
        assert!(check_default_routes(&d, &BTreeSet::from([elsewhere])).is_ok());
    }
    for through in [5, 6] {
        let e = check_default_routes(&d, &BTreeSet::from([through])).expect_err("default route");
        assert!(
            matches!(&e, Error::Denied(m) if m.contains("default route")),
            "{e:?}"
        );
    }
}

#[test]
fn a_port_that_is_not_a_veth_refuses_the_call() {
    for (port, kind, says) in [
        (
            link(2, "eth0", "", Some(5), None),
            "",
            "eth0 (no link kind: a NIC?)",
        ),
        (
            link(3, "bond0", "bond", Some(5), None),
            "bond",
            "bond0 (kind bond)",
        ),
        (
            link(4, "eth0.7", "vlan", Some(5), Some(2)),
            "vlan",
            "eth0.7 (kind vlan)",
        ),
    ] {
        let links = vec![
            link(5, "cni0", "bridge", None, None),
            pod_veth(6, "veth1", 5),
            port,
        ];
        let e = plan_deletion("cni0", &links).expect_err(kind);
        assert!(
            matches!(&e, Error::Denied(m) if m.contains(says) && m.contains("nothing deleted")),
            "{e:?}"
        );
    }
}

#[test]
fn a_link_stacked_on_a_doomed_link_refuses_the_call() {
    let base = vec![
        link(2, "eth0", "", None, None),
        link(5, "cni0", "bridge", None, None),
        pod_veth(6, "veth1", 5),
        // A pod's veth whose peer index, in the pod's namespace, happens to be 5.
        Link {
            iflink_elsewhere: true,
            ..link(7, "veth2", "veth", Some(5), Some(5))
        },
        // Stacked on eth0 (not doomed), and on 6 in another namespace.
        link(8, "eth0.7", "vlan", None, Some(2)),
        Link {
            iflink_elsewhere: true,
            ..link(9, "mv0", "macvlan", None, Some(6))
        },
    ];
    let d = plan_deletion("cni0", &base)
        .expect("nothing stacked")
        .expect("found");
    assert_eq!(d.veths.len(), 2);
    for (upper, says) in [
        (
            link(10, "cni0.10", "vlan", None, Some(5)),
            "cni0.10 (kind vlan), stacked on cni0",
        ),
        (
            link(11, "mvt0", "macvtap", None, Some(6)),
            "mvt0 (kind macvtap), stacked on veth1",
        ),
        (
            link(12, "ipv0", "ipvlan", None, Some(5)),
            "ipv0 (kind ipvlan), stacked on cni0",
        ),
    ] {
        let mut links = base.clone();
        links.push(upper);
        let e = plan_deletion("cni0", &links).expect_err(says);
        assert!(
            matches!(&e, Error::Denied(m) if m.contains(says) && m.contains("nothing deleted")),
            "{e:?}"
        );
    }
}

#[test]
fn the_bridge_is_decided_again_before_it_goes() {
    let listed = vec![
        link(5, "cni0", "bridge", None, None),
        pod_veth(6, "veth1", 5),
        link(7, "va", "veth", Some(5), Some(8)),
        link(8, "vb", "veth", None, Some(7)),
    ];
    let d = plan_deletion("cni0", &listed).expect("ok").expect("found");
    // Its veths gone, the released pair still there: as planned.
    let now: Vec<Link> = listed.iter().filter(|l| l.index != 6).cloned().collect();
    assert!(recheck_bridge(&d, &now).is_ok());
    assert!(
        recheck_bridge(&d, &[]).is_ok(),
        "gone: nothing left to check"
    );
    let changed = [
        (
            link(20, "mv0", "macvlan", None, Some(5)),
            "mv0 (kind macvlan), stacked on",
        ),
        (
            link(21, "tap0", "tun", Some(5), None),
            "tap0 (kind tun), a port that is not",
        ),
        (
            pod_veth(22, "veth9", 5),
            "a veth port veth9 that was not listed",
        ),
    ];
    for (new, says) in changed {
        let mut links = now.clone();
        links.push(new);
        let e = recheck_bridge(&d, &links).expect_err(says);
        assert!(
            matches!(&e, Error::Failed(m) if m.contains(says) && m.contains("not deleted")),
            "{e:?}"
        );
    }
    let mut renamed = now.clone();
    renamed[0].name = "cni9".into();
    assert!(matches!(
        recheck_bridge(&d, &renamed),
        Err(Error::Failed(_))
    ));
}

#[test]
fn a_veth_whose_peer_is_here_is_released_not_deleted() {
    // An operator's pair (both ends here, the peer without a master): not a pod's veth.
    let links = vec![
        link(5, "cni0", "bridge", None, None),
        pod_veth(6, "veth1", 5),
        link(7, "va", "veth", Some(5), Some(8)),
        link(8, "vb", "veth", None, Some(7)),
    ];
    let d = plan_deletion("cni0", &links).expect("ok").expect("found");
    assert_eq!(d.veths.len(), 1, "{d:?}");
    assert_eq!(d.released.len(), 1, "{d:?}");
    assert!(
        d.released[0].starts_with("va: its peer vb is in this namespace"),
        "{:?}",
        d.released
    );
}

#[test]
fn a_bridge_that_is_itself_a_port_is_refused_not_deleted() {
    for (master, says) in [
        (
            link(3, "bond0", "bond", None, None),
            "unplug it from bond0 (index 3, kind bond)",
        ),
        (
            link(3, "br0", "bridge", None, None),
            "unplug it from br0 (index 3, kind bridge)",
        ),
        (
            link(3, "vrf-blue", "vrf", None, None),
            "unplug it from vrf-blue (index 3, kind vrf)",
        ),
    ] {
        let links = vec![
            master,
            link(5, "cni0", "bridge", Some(3), None),
            pod_veth(6, "veth1", 5),
        ];
        let e = plan_deletion("cni0", &links).expect_err(says);
        assert!(
            matches!(&e, Error::Denied(m) if m.contains(says) && m.contains("nothing deleted")),
            "{e:?}"
        );
    }
    // A master the dump did not list is refused all the same.
    let links = vec![link(5, "cni0", "bridge", Some(40), None)];
    let e = plan_deletion("cni0", &links).expect_err("unlisted master");
    assert!(
        matches!(&e, Error::Denied(m) if m.contains("unplug it from its master, index 40, which")),
        "{e:?}"
    );
    // Enslaved after it was listed, while its veths went: the bridge stays.
    let listed = vec![
        link(5, "cni0", "bridge", None, None),
        pod_veth(6, "veth1", 5),
    ];
    let d = plan_deletion("cni0", &listed).expect("ok").expect("found");
    let now = vec![
        link(3, "bond0", "bond", None, None),
        link(5, "cni0", "bridge", Some(3), None),
    ];
    let e = recheck_bridge(&d, &now).expect_err("enslaved since");
    assert!(
        matches!(&e, Error::Failed(m) if m.contains("unplug it from bond0") && m.contains("not deleted")),
        "{e:?}"
    );
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

/// The whole call over a scripted kernel: each request pops the next reply, a list of
/// `(type, payload)` messages in one datagram, with the request's sequence number.
mod over_a_scripted_kernel {
    use super::*;
    use crate::audit::Redactor;
    use crate::caps::RunContext;
    use crate::caps::netlink::wire::tests::{attr, link_payload, message};
    use crate::caps::netlink::wire::{
        NLMSG_DONE, NLMSG_ERROR, RTM_DELLINK, RTM_GETLINK, RTM_GETROUTE, RTM_NEWLINK, messages,
    };
    use rustix::io::Errno;
    use std::collections::VecDeque;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    #[derive(Default)]
    struct Scripted {
        replies: VecDeque<Vec<(u16, Vec<u8>)>>,
        pending: VecDeque<Vec<u8>>,
        sent: Vec<u16>,
    }

    impl Transport for Scripted {
        fn send(&mut self, msg: &[u8]) -> Result<(), Errno> {
            let (h, _) = messages(msg).expect("request")[0];
            self.sent.push(h.ty);
            let reply = self
                .replies
                .pop_front()
                .expect("a reply scripted for each request");
            let mut bytes = Vec::new();
            for (ty, p) in reply {
                bytes.extend(message(ty, 0, h.seq, &p));
            }
            self.pending.push_back(bytes);
            Ok(())
        }

        fn recv(&mut self, _deadline: Instant) -> Result<Option<Vec<u8>>, Errno> {
            Ok(self.pending.pop_front())
        }
    }

    /// `IFLA_LINK_NETNSID`: the link's peer is in another namespace.
    fn elsewhere(mut payload: Vec<u8>) -> Vec<u8> {
        payload.extend(attr(37, &0i32.to_ne_bytes()));
        payload
    }

    fn bridge() -> (u16, Vec<u8>) {
        (RTM_NEWLINK, link_payload(5, "cni0", "bridge", 0, 0))
    }

    fn pod_veth() -> (u16, Vec<u8>) {
        (
            RTM_NEWLINK,
            elsewhere(link_payload(6, "veth1", "veth", 5, 2)),
        )
    }

    fn done() -> (u16, Vec<u8>) {
        (NLMSG_DONE, 0i32.to_ne_bytes().to_vec())
    }

    fn ack() -> Vec<(u16, Vec<u8>)> {
        vec![(NLMSG_ERROR, 0i32.to_ne_bytes().to_vec())]
    }

    /// Runs `delete-bridge cni0` (apply) over `replies`: the result and the requests sent.
    fn delete_cni0(replies: Vec<Vec<(u16, Vec<u8>)>>) -> (Result<Outcome, Error>, Vec<u16>) {
        let (r, sent, _) = delete_cni0_changes(replies);
        (r, sent)
    }

    /// [`delete_cni0`], with the changes recorded.
    fn delete_cni0_changes(
        replies: Vec<Vec<(u16, Vec<u8>)>>,
    ) -> (Result<Outcome, Error>, Vec<u16>, Vec<crate::plan::Change>) {
        let tmp = tempfile::tempdir().expect("tempdir");
        let run = RunContext::new(
            crate::hostpath::HostRoot::open(tmp.path()).expect("root"),
            RunMode::Apply,
            Redactor::default(),
        );
        let mut ctx = PhaseCtx {
            phase: "teardown".into(),
            bundle_digest: "test".into(),
            grants: Arc::default(),
            run: Arc::new(run),
            deadline: Instant::now() + Duration::from_secs(5),
            budget: Default::default(),
            pinned_artifacts: Default::default(),
            node_bridge: None,
        };
        let transport = Scripted {
            replies: replies.into(),
            ..Default::default()
        };
        let mut nl = Netlink::new(transport, ctx.deadline, NetlinkLimits::default());
        let r = ctx.delete_bridge_with(&mut nl, "cni0");
        (r, nl.into_transport().sent, ctx.run.changes())
    }

    /// No reply at all to a request: the kernel's answer was lost, or came too late.
    fn silence() -> Vec<(u16, Vec<u8>)> {
        Vec::new()
    }

    fn enodev() -> Vec<(u16, Vec<u8>)> {
        vec![(NLMSG_ERROR, (-19i32).to_ne_bytes().to_vec())]
    }

    #[test]
    fn a_delete_without_a_reply_is_read_again_and_recorded_when_the_link_is_gone() {
        let (r, sent, changes) = delete_cni0_changes(vec![
            vec![bridge(), pod_veth(), done()],
            vec![done()],
            vec![pod_veth()],
            silence(),
            // Read again by index: gone, so the delete took.
            enodev(),
            vec![bridge(), done()],
            vec![bridge()],
            ack(),
        ]);
        assert!(matches!(r, Ok(Outcome::Removed)), "{r:?}");
        assert_eq!(
            sent,
            [
                RTM_GETLINK,
                RTM_GETROUTE,
                RTM_GETLINK,
                RTM_DELLINK,
                RTM_GETLINK,
                RTM_GETLINK,
                RTM_GETLINK,
                RTM_DELLINK
            ]
        );
        let deleted: Vec<(String, Option<String>)> = changes
            .into_iter()
            .filter_map(|c| match c.kind {
                ChangeKind::LinkDelete { link, note, .. } => Some((link, note)),
                _ => None,
            })
            .collect();
        assert_eq!(deleted.len(), 2, "{deleted:?}");
        assert_eq!(deleted[0].0, "veth1");
        let note = deleted[0].1.as_deref().expect("a note");
        assert!(
            note.contains("no reply to the delete before the phase deadline")
                && note.contains("the link was gone"),
            "{note}"
        );
        assert_eq!(deleted[1].0, "cni0");
    }

    #[test]
    fn a_delete_without_a_reply_whose_link_is_still_there_is_a_timeout_and_no_change() {
        let (r, sent, changes) = delete_cni0_changes(vec![
            vec![bridge(), pod_veth(), done()],
            vec![done()],
            vec![pod_veth()],
            silence(),
            vec![pod_veth()],
        ]);
        let e = r.expect_err("not deleted");
        assert!(
            matches!(&e, Error::Timeout(m) if m.contains("deleting link veth1 (index 6)")
                && m.contains("still there") && m.contains("not deleted")),
            "{e:?}"
        );
        assert_eq!(
            sent,
            [
                RTM_GETLINK,
                RTM_GETROUTE,
                RTM_GETLINK,
                RTM_DELLINK,
                RTM_GETLINK
            ],
            "the bridge is not touched"
        );
        assert!(changes.is_empty(), "{changes:?}");
        // Unreadable again too: unknown, said so; no change recorded.
        let (r, _, changes) = delete_cni0_changes(vec![
            vec![bridge(), pod_veth(), done()],
            vec![done()],
            vec![pod_veth()],
            silence(),
            silence(),
        ]);
        let e = r.expect_err("unknown");
        assert!(
            matches!(&e, Error::Timeout(m) if m.contains("whether it was deleted is unknown")),
            "{e:?}"
        );
        assert!(changes.is_empty(), "{changes:?}");
    }

    #[test]
    fn a_pod_veth_whose_peer_came_here_since_the_listing_is_not_deleted() {
        let (r, sent) = delete_cni0(vec![
            vec![bridge(), pod_veth(), done()],
            vec![done()],
            // Read again by index: same name, kind and master, but its peer is here now.
            vec![(RTM_NEWLINK, link_payload(6, "veth1", "veth", 5, 2))],
        ]);
        let e = r.expect_err("changed");
        assert!(
            matches!(&e, Error::Failed(m) if m.contains("veth1 (index 6) changed")),
            "{e:?}"
        );
        assert_eq!(
            sent,
            [RTM_GETLINK, RTM_GETROUTE, RTM_GETLINK],
            "nothing deleted"
        );
    }

    #[test]
    fn a_port_added_while_the_veths_went_keeps_the_bridge() {
        let tap = (RTM_NEWLINK, link_payload(9, "tap0", "tun", 5, 0));
        let (r, sent) = delete_cni0(vec![
            vec![bridge(), pod_veth(), done()],
            vec![done()],
            vec![pod_veth()],
            ack(),
            vec![bridge(), tap, done()],
        ]);
        let e = r.expect_err("changed");
        assert!(
            matches!(&e, Error::Failed(m) if m.contains("tap0 (kind tun)") && m.contains("not deleted")),
            "{e:?}"
        );
        assert_eq!(
            sent,
            [
                RTM_GETLINK,
                RTM_GETROUTE,
                RTM_GETLINK,
                RTM_DELLINK,
                RTM_GETLINK
            ],
            "the veth deleted, the bridge not"
        );
        // Unchanged: the bridge goes, after the same re-check by index.
        let (r, sent) = delete_cni0(vec![
            vec![bridge(), pod_veth(), done()],
            vec![done()],
            vec![pod_veth()],
            ack(),
            vec![bridge(), done()],
            vec![bridge()],
            ack(),
        ]);
        assert!(matches!(r, Ok(Outcome::Removed)), "{r:?}");
        assert_eq!(sent.iter().filter(|t| **t == RTM_DELLINK).count(), 2);
    }
}
