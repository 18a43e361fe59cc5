//! The byte layouts of [`super`] on hand-made messages, and the builders other tests use to
//! make kernel replies.

use super::*;

/// An attribute as the kernel lays it out.
pub fn attr(ty: u16, payload: &[u8]) -> Vec<u8> {
    let mut v = ((4 + payload.len()) as u16).to_ne_bytes().to_vec();
    v.extend_from_slice(&ty.to_ne_bytes());
    v.extend_from_slice(payload);
    v.resize(align4(v.len()), 0);
    v
}

/// A message as the kernel sends it.
pub fn message(ty: u16, flags: u16, seq: u32, payload: &[u8]) -> Vec<u8> {
    let mut v = ((NLMSG_HDRLEN + payload.len()) as u32)
        .to_ne_bytes()
        .to_vec();
    v.extend_from_slice(&ty.to_ne_bytes());
    v.extend_from_slice(&flags.to_ne_bytes());
    v.extend_from_slice(&seq.to_ne_bytes());
    v.extend_from_slice(&0u32.to_ne_bytes());
    v.extend_from_slice(payload);
    v.resize(align4(v.len()), 0);
    v
}

/// An `RTM_NEWLINK` payload.
pub fn link_payload(index: u32, name: &str, kind: &str, master: u32, peer: u32) -> Vec<u8> {
    let mut v = ifinfomsg(index).to_vec();
    let mut n = name.as_bytes().to_vec();
    n.push(0);
    v.extend(attr(IFLA_IFNAME, &n));
    if master != 0 {
        v.extend(attr(IFLA_MASTER, &master.to_ne_bytes()));
    }
    if peer != 0 {
        v.extend(attr(IFLA_LINK, &peer.to_ne_bytes()));
    }
    if !kind.is_empty() {
        let mut k = kind.as_bytes().to_vec();
        k.push(0);
        v.extend(attr(IFLA_LINKINFO | 0x8000, &attr(IFLA_INFO_KIND, &k)));
    }
    v
}

/// An `RTM_NEWROUTE` payload.
pub fn route_payload(family: u8, dst_len: u8, oif: u32, hops: &[u32], nh: u32) -> Vec<u8> {
    let mut v = vec![0u8; RTMSG_LEN];
    v[0] = family;
    v[1] = dst_len;
    if oif != 0 {
        v.extend(attr(RTA_OIF, &oif.to_ne_bytes()));
    }
    if !hops.is_empty() {
        let mut mp = Vec::new();
        for h in hops {
            mp.extend_from_slice(&(RTNH_LEN as u16).to_ne_bytes());
            mp.extend_from_slice(&[0, 0]);
            mp.extend_from_slice(&h.to_ne_bytes());
        }
        v.extend(attr(RTA_MULTIPATH | 0x8000, &mp));
    }
    if nh != 0 {
        v.extend(attr(RTA_NH_ID, &nh.to_ne_bytes()));
    }
    v
}

/// An `RTM_NEWNEXTHOP` payload.
pub fn nexthop_payload(id: u32, oif: u32, group: &[u32]) -> Vec<u8> {
    let mut v = vec![0u8; NHMSG_LEN];
    v.extend(attr(NHA_ID, &id.to_ne_bytes()));
    if oif != 0 {
        v.extend(attr(NHA_OIF, &oif.to_ne_bytes()));
    }
    if !group.is_empty() {
        let mut g = Vec::new();
        for m in group {
            g.extend_from_slice(&m.to_ne_bytes());
            g.extend_from_slice(&[1, 0, 0, 0]);
        }
        v.extend(attr(NHA_GROUP, &g));
    }
    v
}

#[test]
fn a_link_is_read_by_its_primary_name_only() {
    let mut p = link_payload(7, "veth1", "veth", 3, 9);
    // An altname list (IFLA_PROP_LIST, nested IFLA_ALT_IFNAME) naming "cni0".
    p.extend(attr(52 | 0x8000, &attr(53, b"cni0\0")));
    let l = link(&p).expect("link");
    assert_eq!(
        l,
        Link {
            index: 7,
            name: "veth1".into(),
            kind: "veth".into(),
            master: Some(3),
            iflink: Some(9),
            iflink_elsewhere: false,
            vxlan_link: None,
        }
    );
    assert_eq!(l.veth_peer_here(), Some(9));
    assert!(l.lowers_here().is_empty(), "a veth's IFLA_LINK is its peer");
    let mut elsewhere = link_payload(8, "veth2", "veth", 3, 2);
    elsewhere.extend(attr(IFLA_LINK_NETNSID, &0i32.to_ne_bytes()));
    let l = link(&elsewhere).expect("link");
    assert!(l.iflink_elsewhere && l.veth_peer_here().is_none());
}

#[test]
fn an_upper_names_its_lower_by_iflink_or_vxlan_link() {
    let l = link(&link_payload(9, "mv0", "macvlan", 0, 5)).expect("link");
    assert_eq!((l.lowers_here(), l.veth_peer_here()), (vec![5], None));
    // A NIC may report itself as its IFLA_LINK.
    assert!(
        link(&link_payload(2, "eth0", "", 0, 2))
            .expect("link")
            .lowers_here()
            .is_empty()
    );
    // A vxlan sends no IFLA_LINK; its lower is in IFLA_INFO_DATA.
    let mut p = ifinfomsg(10).to_vec();
    p.extend(attr(IFLA_IFNAME, b"vx0\0"));
    let mut info = attr(IFLA_INFO_KIND, b"vxlan\0");
    info.extend(attr(
        IFLA_INFO_DATA | 0x8000,
        &attr(IFLA_VXLAN_LINK, &6u32.to_ne_bytes()),
    ));
    p.extend(attr(IFLA_LINKINFO | 0x8000, &info));
    let l = link(&p).expect("vxlan");
    assert_eq!((l.vxlan_link, l.lowers_here()), (Some(6), vec![6]));
    // Moved to another namespace: its lower is not one of ours.
    p.extend(attr(IFLA_LINK_NETNSID, &0i32.to_ne_bytes()));
    assert!(link(&p).expect("vxlan").lowers_here().is_empty());
    // Another kind's INFO_DATA attribute 3 means something else.
    let mut q = ifinfomsg(11).to_vec();
    let mut info = attr(IFLA_INFO_KIND, b"bridge\0");
    info.extend(attr(
        IFLA_INFO_DATA | 0x8000,
        &attr(IFLA_VXLAN_LINK, &6u32.to_ne_bytes()),
    ));
    q.extend(attr(IFLA_LINKINFO | 0x8000, &info));
    assert!(link(&q).expect("bridge").lowers_here().is_empty());
}

#[test]
fn routes_name_their_links_by_oif_multipath_and_nexthop() {
    let r = route(&route_payload(AF_INET, 0, 2, &[], 0)).expect("route");
    assert!(r.carries_default() && r.oif == Some(2));
    let r = route(&route_payload(AF_INET6, 0, 0, &[4, 5], 0)).expect("route");
    assert_eq!(r.multipath, [4, 5]);
    let r = route(&route_payload(AF_INET, 24, 0, &[], 11)).expect("route");
    assert!(!r.carries_default() && r.nh_id == Some(11));
    let n = nexthop(&nexthop_payload(11, 0, &[12, 13])).expect("nexthop");
    assert_eq!((n.id, n.group.as_slice()), (11, &[12, 13][..]));
}

#[test]
fn lengths_outside_the_buffer_are_errors_not_panics() {
    let m = message(RTM_NEWLINK, 0, 1, &link_payload(1, "a", "", 0, 0));
    assert_eq!(messages(&m).expect("one").len(), 1);
    for cut in 0..m.len() {
        let _ = messages(&m[..cut]).map(|ms| {
            for (_, p) in ms {
                let _ = link(p);
            }
        });
    }
    let mut bad = m.clone();
    bad[0..4].copy_from_slice(&1000u32.to_ne_bytes());
    assert!(messages(&bad).is_err());
    let mut p = link_payload(1, "a", "", 0, 0);
    p.extend_from_slice(&200u16.to_ne_bytes());
    p.extend_from_slice(&3u16.to_ne_bytes());
    assert!(link(&p).is_err(), "an attribute longer than its message");
    assert!(route(&[0; 4]).is_err() && nexthop(&[0; 2]).is_err() && link(&[0; 8]).is_err());
    let mut g = vec![0u8; NHMSG_LEN];
    g.extend(attr(NHA_GROUP, &[1, 2, 3]));
    assert!(nexthop(&g).is_err());
}

#[test]
fn requests_carry_their_type_flags_and_attributes() {
    let r = request(
        RTM_GETLINK,
        NLM_F_DUMP,
        7,
        &ifinfomsg(0),
        &[(IFLA_EXT_MASK, &8u32.to_ne_bytes())],
    );
    let ms = messages(&r).expect("request parses");
    assert_eq!(ms.len(), 1);
    let (h, p) = ms[0];
    assert_eq!(
        (h.ty, h.flags, h.seq),
        (RTM_GETLINK, NLM_F_DUMP | NLM_F_REQUEST, 7)
    );
    assert_eq!(p.len(), IFINFOMSG_LEN + 8);
    assert_eq!(error_code(&(-19i32).to_ne_bytes()), Ok(19));
    assert_eq!(done_code(&(-105i32).to_ne_bytes()), Ok(105));
    assert_eq!(done_code(&0i32.to_ne_bytes()), Ok(0));
    assert!(
        done_code(&[]).is_err(),
        "the kernel always sends the result"
    );
}
