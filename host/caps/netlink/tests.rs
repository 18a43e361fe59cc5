//! The dump loop, against queued kernel replies: interrupted dumps are read again and then
//! refused, limits stop a dump, errors keep their errno names, replies to other requests are
//! skipped.

use super::wire::tests::{link_payload, message, nexthop_payload, route_payload};
use super::wire::*;
use super::*;
use std::collections::VecDeque;

/// One message of a queued reply: type, flags, payload.
type Msg = (u16, u16, Vec<u8>);
/// The datagrams answering one request.
type Reply = Vec<Vec<Msg>>;

/// Replies queued per request: each request pops the next list of datagrams, with the
/// request's sequence number filled in.
#[derive(Default)]
struct Queued {
    /// Per request: datagrams of `(type, flags, payload)` messages.
    replies: VecDeque<Reply>,
    pending: VecDeque<Vec<u8>>,
    sent: Vec<u16>,
    /// How long each receive takes before it looks at what is queued (a slow kernel).
    delay: Duration,
    /// Whether a receive with nothing queued waits out the deadline, as a socket does.
    wait_out: bool,
}

impl Transport for Queued {
    fn send(&mut self, msg: &[u8]) -> Result<(), Errno> {
        let (h, _) = messages(msg).expect("request")[0];
        self.sent.push(h.ty);
        let datagrams = self.replies.pop_front().unwrap_or_default();
        for d in datagrams {
            let mut bytes = Vec::new();
            for (ty, flags, p) in d {
                bytes.extend(message(ty, flags, h.seq, &p));
            }
            self.pending.push_back(bytes);
        }
        Ok(())
    }

    fn recv(&mut self, deadline: Instant) -> Result<Option<Vec<u8>>, Errno> {
        std::thread::sleep(self.delay);
        if self.pending.is_empty() && self.wait_out {
            std::thread::sleep(deadline.saturating_duration_since(Instant::now()));
        }
        Ok(self.pending.pop_front())
    }
}

fn nl(replies: Vec<Reply>, limits: NetlinkLimits) -> Netlink<Queued> {
    Netlink::new(
        Queued {
            replies: replies.into(),
            ..Default::default()
        },
        Instant::now() + Duration::from_secs(5),
        limits,
    )
}

fn done() -> Msg {
    (NLMSG_DONE, 0, 0i32.to_ne_bytes().to_vec())
}

fn link_msg(flags: u16, index: u32, name: &str) -> Msg {
    (
        RTM_NEWLINK,
        flags,
        link_payload(index, name, "bridge", 0, 0),
    )
}

#[test]
fn an_interrupted_dump_is_read_again() {
    let mut n = nl(
        vec![
            vec![vec![link_msg(NLM_F_DUMP_INTR, 1, "stale")], vec![done()]],
            vec![
                vec![link_msg(0, 1, "lo"), link_msg(0, 2, "cni0")],
                vec![done()],
            ],
        ],
        NetlinkLimits::default(),
    );
    let links = n.links().expect("second dump");
    let names: Vec<&str> = links.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(names, ["lo", "cni0"]);
    assert_eq!(n.transport.sent, [RTM_GETLINK, RTM_GETLINK]);
}

#[test]
fn a_dump_interrupted_every_time_is_refused() {
    let intr = || {
        vec![
            vec![link_msg(0, 1, "a")],
            vec![(NLMSG_DONE, NLM_F_DUMP_INTR, vec![0; 4])],
        ]
    };
    let limits = NetlinkLimits {
        dump_attempts: 3,
        ..Default::default()
    };
    let mut n = nl(vec![intr(), intr(), intr(), intr()], limits);
    let e = n.links().expect_err("interrupted");
    assert!(matches!(e, NlError::Interrupted { attempts: 3, .. }), "{e}");
    assert_eq!(n.transport.sent.len(), 3);
}

#[test]
fn a_dump_over_its_limit_is_refused() {
    let many: Vec<_> = (1..=5).map(|i| link_msg(0, i, &format!("l{i}"))).collect();
    let limits = NetlinkLimits {
        max_links: 4,
        ..Default::default()
    };
    let mut n = nl(vec![vec![many, vec![done()]]], limits);
    let e = n.links().expect_err("limit");
    assert!(matches!(e, NlError::Limit { limit: 4, .. }), "{e}");
    assert!(e.to_string().contains("more than 4"), "{e}");
}

#[test]
fn errors_keep_their_errno_names_and_enodev_means_gone() {
    let err = |errno: i32| vec![vec![(NLMSG_ERROR, 0, (-errno).to_ne_bytes().to_vec())]];
    let mut n = nl(
        vec![
            err(1),
            err(19),
            err(19),
            vec![vec![(NLMSG_ERROR, 0, 0i32.to_ne_bytes().to_vec())]],
        ],
        NetlinkLimits::default(),
    );
    let e = n.delete_link(7, "cni0").expect_err("EPERM");
    assert_eq!(
        e.to_string(),
        "deleting link cni0 (index 7): EPERM (Operation not permitted)"
    );
    assert_eq!(
        n.delete_link(7, "cni0"),
        Ok(Deleted::AlreadyGone),
        "ENODEV: already gone"
    );
    assert_eq!(n.link(7), Ok(None));
    assert_eq!(n.delete_link(8, "veth1"), Ok(Deleted::Acked));
}

/// A conversation whose deadline is `left` away, over a transport that waits out the
/// deadline when nothing is queued.
fn nl_until(replies: Vec<Reply>, left: Duration) -> Netlink<Queued> {
    Netlink::new(
        Queued {
            replies: replies.into(),
            wait_out: true,
            ..Default::default()
        },
        Instant::now() + left,
        NetlinkLimits::default(),
    )
}

#[test]
fn a_delete_without_a_reply_before_the_deadline_is_read_again_by_index() {
    let enodev = vec![vec![(NLMSG_ERROR, 0, (-19i32).to_ne_bytes().to_vec())]];
    // No reply; the deadline passes; reading the link again (past the deadline, within
    // CONFIRM_WAIT) finds none: it was deleted.
    let mut n = nl_until(vec![vec![], enodev], Duration::from_millis(50));
    assert_eq!(n.delete_link(7, "veth1"), Ok(Deleted::AfterTimeout));
    assert_eq!(n.transport.sent, [RTM_DELLINK, RTM_GETLINK]);
    // The deadline is the phase's again: nothing new is sent.
    let e = n.link(8).expect_err("past the deadline");
    assert!(matches!(e, NlError::Timeout { .. }), "{e}");
    assert_eq!(n.transport.sent.len(), 2, "no request past the deadline");
    // Still there: not deleted, and said so.
    let still = vec![vec![link_msg(0, 7, "veth1")]];
    let mut n = nl_until(vec![vec![], still], Duration::from_millis(50));
    let e = n.delete_link(7, "veth1").expect_err("still there");
    assert!(matches!(e, NlError::Unconfirmed { .. }), "{e}");
    assert_eq!(
        e.to_string(),
        "deleting link veth1 (index 7): no reply before the phase deadline; read again by \
         index, it is still there (now \"veth1\", kind \"bridge\"): not deleted"
    );
    // Not answered either: unknown, and said so.
    let mut n = nl_until(vec![vec![], vec![]], Duration::from_millis(50));
    let e = n.delete_link(7, "veth1").expect_err("unknown");
    assert!(
        e.to_string()
            .contains("reading it again by index failed (reading link 7: no reply"),
        "{e}"
    );
    assert!(
        e.to_string().contains("whether it was deleted is unknown"),
        "{e}"
    );
}

#[test]
fn a_dump_is_not_read_on_past_the_deadline() {
    // Each datagram takes 60 ms to come; the deadline is 100 ms away: the dump of three stops
    // with a timeout, however much the kernel would still queue.
    let datagrams = vec![
        vec![link_msg(0, 1, "lo")],
        vec![link_msg(0, 2, "cni0")],
        vec![done()],
    ];
    let mut n = Netlink::new(
        Queued {
            replies: vec![datagrams].into(),
            delay: Duration::from_millis(60),
            ..Default::default()
        },
        Instant::now() + Duration::from_millis(100),
        NetlinkLimits::default(),
    );
    let e = n.links().expect_err("past the deadline");
    assert!(matches!(e, NlError::Timeout { .. }), "{e}");
    assert!(!n.transport.pending.is_empty(), "the rest was not read");
}

#[test]
fn a_reply_queued_on_the_socket_is_read_even_past_the_deadline() {
    // A real route socket (reading a link needs no privilege). The kernel answers inside
    // `sendto`, so the reply is queued before `recv` is called with a deadline already passed.
    let mut s = Socket::open().expect("a route netlink socket");
    let req = request(RTM_GETLINK, 0, 1, &ifinfomsg(1), &[]);
    s.send(&req).expect("send");
    let passed = Instant::now();
    let datagram = s
        .recv(passed)
        .expect("recv")
        .expect("the queued reply, read without waiting");
    let msgs = messages(&datagram).expect("messages");
    assert_eq!((msgs[0].0.ty, msgs[0].0.seq), (RTM_NEWLINK, 1));
    assert_eq!(link(msgs[0].1).expect("link").index, 1, "lo");
    // Nothing more queued: none, at once.
    let start = Instant::now();
    assert_eq!(s.recv(passed), Ok(None));
    assert!(start.elapsed() < Duration::from_secs(1));
    // Within the deadline, a reply is waited for as before.
    s.send(&request(RTM_GETLINK, 0, 2, &ifinfomsg(1), &[]))
        .expect("send");
    let datagram = s.recv(Instant::now() + Duration::from_secs(5));
    assert!(matches!(datagram, Ok(Some(_))), "{datagram:?}");
}

#[test]
fn default_routes_count_oif_multipath_and_nexthop_objects() {
    let routes = vec![
        (RTM_NEWROUTE, 0, route_payload(AF_INET, 0, 2, &[], 0)),
        (RTM_NEWROUTE, 0, route_payload(AF_INET, 24, 9, &[], 0)),
        (RTM_NEWROUTE, 0, route_payload(AF_INET6, 0, 0, &[3, 4], 0)),
        (RTM_NEWROUTE, 0, route_payload(AF_INET, 0, 0, &[], 20)),
    ];
    let nexthops = vec![
        (RTM_NEWNEXTHOP, 0, nexthop_payload(20, 0, &[21, 22])),
        (RTM_NEWNEXTHOP, 0, nexthop_payload(21, 5, &[])),
        (RTM_NEWNEXTHOP, 0, nexthop_payload(22, 6, &[])),
        (RTM_NEWNEXTHOP, 0, nexthop_payload(23, 7, &[])),
    ];
    let mut n = nl(
        vec![vec![routes, vec![done()]], vec![nexthops, vec![done()]]],
        NetlinkLimits::default(),
    );
    let links = n.default_route_links().expect("routes");
    assert_eq!(links.into_iter().collect::<Vec<_>>(), [2, 3, 4, 5, 6]);
    assert_eq!(n.transport.sent, [RTM_GETROUTE, RTM_GETNEXTHOP]);
}

#[test]
fn no_reply_before_the_deadline_is_a_timeout() {
    let mut n = nl(vec![vec![]], NetlinkLimits::default());
    let e = n.link(3).expect_err("timeout");
    assert!(matches!(e, NlError::Timeout { .. }), "{e}");
}

fn route_msg(family: u8, dst_len: u8, oif: u32) -> Msg {
    (RTM_NEWROUTE, 0, route_payload(family, dst_len, oif, &[], 0))
}

/// `NLMSG_DONE` carrying `-errno`: the dump failed part way.
fn done_with(errno: i32) -> Msg {
    (NLMSG_DONE, 0, (-errno).to_ne_bytes().to_vec())
}

#[test]
fn a_dump_that_failed_part_way_is_an_error_not_a_short_list() {
    // ENOBUFS (105) in NLMSG_DONE: the default route through link 2 may be in the part that
    // was never sent.
    let mut n = nl(
        vec![vec![vec![route_msg(AF_INET, 24, 3)], vec![done_with(105)]]],
        NetlinkLimits::default(),
    );
    let e = n.default_route_links().expect_err("a partial route dump");
    assert!(
        matches!(
            e,
            NlError::Errno {
                errno: Errno::NOBUFS,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("ENOBUFS"), "{e}");
    let mut n = nl(
        vec![vec![vec![link_msg(0, 1, "lo")], vec![done_with(12)]]],
        NetlinkLimits::default(),
    );
    let e = n.links().expect_err("a partial link dump");
    assert!(
        matches!(
            e,
            NlError::Errno {
                errno: Errno::NOMEM,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn a_dump_ended_by_eintr_is_read_again() {
    let mut n = nl(
        vec![
            vec![vec![route_msg(AF_INET, 24, 3)], vec![done_with(4)]],
            vec![
                vec![route_msg(AF_INET, 24, 3), route_msg(AF_INET, 0, 2)],
                vec![done()],
            ],
        ],
        NetlinkLimits::default(),
    );
    let links = n.default_route_links().expect("second dump");
    assert_eq!(links.into_iter().collect::<Vec<_>>(), [2]);
    assert_eq!(n.transport.sent, [RTM_GETROUTE, RTM_GETROUTE]);
    let intr = || vec![vec![link_msg(0, 1, "a")], vec![done_with(4)]];
    let limits = NetlinkLimits {
        dump_attempts: 2,
        ..Default::default()
    };
    let mut n = nl(vec![intr(), intr(), intr()], limits);
    let e = n.links().expect_err("EINTR every time");
    assert!(matches!(e, NlError::Interrupted { attempts: 2, .. }), "{e}");
}

#[test]
fn half_of_the_address_space_counts_as_a_default_route() {
    // The VPN trick: 0.0.0.0/1 + 128.0.0.0/1 (and ::/1 + 8000::/1) cover everything without
    // a /0; a /2 does not.
    let routes = vec![
        route_msg(AF_INET, 1, 2),
        route_msg(AF_INET6, 1, 3),
        route_msg(AF_INET, 2, 4),
        route_msg(AF_INET6, 2, 5),
    ];
    let mut n = nl(vec![vec![routes, vec![done()]]], NetlinkLimits::default());
    let links = n.default_route_links().expect("routes");
    assert_eq!(links.into_iter().collect::<Vec<_>>(), [2, 3]);
}

#[test]
fn a_full_routing_table_is_streamed_not_refused() {
    // More routes than any count limit (a BGP table is ~1M); only the default route's link is
    // kept.
    let mut datagrams: Vec<Vec<Msg>> = (0..100u32)
        .map(|d| {
            (0..1000u32)
                .map(|i| route_msg(AF_INET, 24, 100 + (d * 1000 + i) % 50))
                .collect()
        })
        .collect();
    datagrams[57].push(route_msg(AF_INET, 0, 7));
    datagrams.push(vec![done()]);
    let mut n = nl(vec![datagrams], NetlinkLimits::default());
    let links = n.default_route_links().expect("100001 routes");
    assert_eq!(links.into_iter().collect::<Vec<_>>(), [7]);
}

#[test]
fn the_links_kept_from_default_routes_are_bounded() {
    // 4097 distinct output links of default routes (one per table): past the bound, refused.
    let routes: Vec<Msg> = (1..=4097u32).map(|i| route_msg(AF_INET, 0, i)).collect();
    let mut n = nl(vec![vec![routes, vec![done()]]], NetlinkLimits::default());
    let e = n.default_route_links().expect_err("over the bound");
    assert!(matches!(e, NlError::Limit { limit: 4096, .. }), "{e}");
}

#[test]
fn a_group_listed_after_its_members_is_read_in_a_second_nexthop_dump() {
    // The kernel lists nexthops by id: members (21, 22) come before their group (30). The
    // first dump learns the members, the second reads their links; the others are dropped.
    let routes = vec![(RTM_NEWROUTE, 0, route_payload(AF_INET, 0, 0, &[], 30))];
    let nexthops = || {
        vec![
            (RTM_NEWNEXTHOP, 0, nexthop_payload(21, 5, &[])),
            (RTM_NEWNEXTHOP, 0, nexthop_payload(22, 6, &[])),
            (RTM_NEWNEXTHOP, 0, nexthop_payload(23, 7, &[])),
            (RTM_NEWNEXTHOP, 0, nexthop_payload(30, 0, &[21, 22])),
        ]
    };
    let mut n = nl(
        vec![
            vec![routes, vec![done()]],
            vec![nexthops(), vec![done()]],
            vec![nexthops(), vec![done()]],
        ],
        NetlinkLimits::default(),
    );
    let links = n.default_route_links().expect("routes");
    assert_eq!(links.into_iter().collect::<Vec<_>>(), [5, 6]);
    assert_eq!(
        n.transport.sent,
        [RTM_GETROUTE, RTM_GETNEXTHOP, RTM_GETNEXTHOP]
    );
}

#[test]
fn the_members_kept_of_default_routes_nexthop_groups_are_bounded() {
    let routes = vec![(RTM_NEWROUTE, 0, route_payload(AF_INET, 0, 0, &[], 9000))];
    let members: Vec<u32> = (1..=5).collect();
    let nexthops = vec![(RTM_NEWNEXTHOP, 0, nexthop_payload(9000, 0, &members))];
    let limits = NetlinkLimits {
        max_default_links: 4,
        ..Default::default()
    };
    let mut n = nl(
        vec![vec![routes, vec![done()]], vec![nexthops, vec![done()]]],
        limits,
    );
    let e = n.default_route_links().expect_err("over the bound");
    assert!(matches!(e, NlError::Limit { limit: 4, .. }), "{e}");
}
