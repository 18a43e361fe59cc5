//! rtnetlink messages as bytes: the requests the `network` capability sends and the parts of
//! the kernel's replies it reads. Pure functions over byte slices, so every bound is checked
//! here once and unit-tested on hand-made messages.
//!
//! # Guarantees
//! - Every length read from a message is checked against the bytes that are there: a short or
//!   overlong header or attribute is [`WireError`], never a panic or a read past the buffer.
//! - Only the primary interface name (`IFLA_IFNAME`) is read as a link's name; alternative
//!   names (`IFLA_PROP_LIST`/`IFLA_ALT_IFNAME`) are ignored, so a link cannot pass for another
//!   by an altname.
//! - A link's `IFLA_LINK` is read as what it is, a reference whose meaning depends on the
//!   kind: a veth's peer ([`Link::veth_peer_here`]), or the lower link an upper (vlan,
//!   macvlan, ipvlan, macsec, ...) is stacked on ([`Link::lowers_here`]), which the kernel
//!   deletes with its lower. A vxlan names its lower in `IFLA_VXLAN_LINK` instead, read too.
//!
//! Layouts are those of `linux/netlink.h`, `linux/rtnetlink.h`, `linux/if_link.h` and
//! `linux/nexthop.h`, in host byte order.

/// `struct nlmsghdr` size.
pub const NLMSG_HDRLEN: usize = 16;
/// `NLMSG_ERROR`.
pub const NLMSG_ERROR: u16 = 2;
/// `NLMSG_DONE`.
pub const NLMSG_DONE: u16 = 3;
/// `NLM_F_REQUEST`.
pub const NLM_F_REQUEST: u16 = 0x1;
/// `NLM_F_ACK`.
pub const NLM_F_ACK: u16 = 0x4;
/// `NLM_F_DUMP_INTR`: the dump was interrupted by a change; its contents may be inconsistent.
pub const NLM_F_DUMP_INTR: u16 = 0x10;
/// `NLM_F_DUMP` (`NLM_F_ROOT | NLM_F_MATCH`).
pub const NLM_F_DUMP: u16 = 0x300;
/// `RTM_NEWLINK`.
pub const RTM_NEWLINK: u16 = 16;
/// `RTM_DELLINK`.
pub const RTM_DELLINK: u16 = 17;
/// `RTM_GETLINK`.
pub const RTM_GETLINK: u16 = 18;
/// `RTM_NEWROUTE`.
pub const RTM_NEWROUTE: u16 = 24;
/// `RTM_GETROUTE`.
pub const RTM_GETROUTE: u16 = 26;
/// `RTM_NEWNEXTHOP`.
pub const RTM_NEWNEXTHOP: u16 = 104;
/// `RTM_GETNEXTHOP`.
pub const RTM_GETNEXTHOP: u16 = 106;

const IFLA_IFNAME: u16 = 3;
const IFLA_LINK: u16 = 5;
const IFLA_MASTER: u16 = 10;
const IFLA_LINKINFO: u16 = 18;
const IFLA_INFO_KIND: u16 = 1;
const IFLA_INFO_DATA: u16 = 2;
/// `IFLA_VXLAN_LINK`, in a vxlan's `IFLA_INFO_DATA`: the device its packets leave through.
const IFLA_VXLAN_LINK: u16 = 3;
/// `IFLA_EXT_MASK`, sent with a link dump to leave out statistics.
pub const IFLA_EXT_MASK: u16 = 29;
/// `RTEXT_FILTER_SKIP_STATS`.
pub const RTEXT_FILTER_SKIP_STATS: u32 = 1 << 3;
const IFLA_LINK_NETNSID: u16 = 37;
const RTA_OIF: u16 = 4;
const RTA_MULTIPATH: u16 = 9;
const RTA_NH_ID: u16 = 30;
const NHA_ID: u16 = 1;
const NHA_GROUP: u16 = 2;
const NHA_OIF: u16 = 5;
/// `AF_INET`.
pub const AF_INET: u8 = 2;
/// `AF_INET6`.
pub const AF_INET6: u8 = 10;
/// `NLA_TYPE_MASK`: the attribute type without the nested and byte-order flags.
const NLA_TYPE_MASK: u16 = 0x3fff;
/// `struct ifinfomsg` size.
pub const IFINFOMSG_LEN: usize = 16;
/// `struct rtmsg` size.
const RTMSG_LEN: usize = 12;
/// `struct nhmsg` size.
pub const NHMSG_LEN: usize = 8;
/// `struct rtnexthop` size.
const RTNH_LEN: usize = 8;
/// `struct nexthop_grp` size.
const NH_GRP_LEN: usize = 8;

/// A message that does not have the shape its header or type promises.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed netlink message: {0}")]
pub struct WireError(pub &'static str);

/// `struct nlmsghdr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Whole message length, header included.
    pub len: u32,
    /// Message type.
    pub ty: u16,
    /// `NLM_F_*`.
    pub flags: u16,
    /// Sequence number.
    pub seq: u32,
}

fn align4(n: usize) -> usize {
    (n + 3) & !3
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// One request: header, `body` (a fixed struct), then `attrs` as `(type, payload)`.
pub fn request(ty: u16, flags: u16, seq: u32, body: &[u8], attrs: &[(u16, &[u8])]) -> Vec<u8> {
    let mut out = vec![0u8; NLMSG_HDRLEN];
    out.extend_from_slice(body);
    out.resize(align4(out.len()), 0);
    for (aty, payload) in attrs {
        let len = 4 + payload.len();
        out.extend_from_slice(&(len as u16).to_ne_bytes());
        out.extend_from_slice(&aty.to_ne_bytes());
        out.extend_from_slice(payload);
        out.resize(align4(out.len()), 0);
    }
    let total = out.len() as u32;
    out[0..4].copy_from_slice(&total.to_ne_bytes());
    out[4..6].copy_from_slice(&ty.to_ne_bytes());
    out[6..8].copy_from_slice(&(flags | NLM_F_REQUEST).to_ne_bytes());
    out[8..12].copy_from_slice(&seq.to_ne_bytes());
    // nlmsg_pid 0: the kernel fills in the sender.
    out
}

/// `struct ifinfomsg` naming interface `index` (0: none), family unspecified.
pub fn ifinfomsg(index: u32) -> [u8; IFINFOMSG_LEN] {
    let mut b = [0u8; IFINFOMSG_LEN];
    b[4..8].copy_from_slice(&index.to_ne_bytes());
    b
}

/// Splits one datagram into its messages: `(header, payload after the header)`.
pub fn messages(buf: &[u8]) -> Result<Vec<(Header, &[u8])>, WireError> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < buf.len() {
        let rest = &buf[at..];
        let (Some(len), Some(ty), Some(flags), Some(seq)) = (
            u32_at(rest, 0),
            u16_at(rest, 4),
            u16_at(rest, 6),
            u32_at(rest, 8),
        ) else {
            return Err(WireError("a header shorter than 16 bytes"));
        };
        let l = len as usize;
        if l < NLMSG_HDRLEN || l > rest.len() {
            return Err(WireError("a message length outside the datagram"));
        }
        out.push((
            Header {
                len,
                ty,
                flags,
                seq,
            },
            &rest[NLMSG_HDRLEN..l],
        ));
        at += align4(l).min(rest.len());
    }
    Ok(out)
}

/// The errno of an `NLMSG_ERROR` payload: 0 for an acknowledgement, else positive.
pub fn error_code(payload: &[u8]) -> Result<i32, WireError> {
    let code = u32_at(payload, 0).ok_or(WireError("an error message without its code"))? as i32;
    Ok(code.saturating_neg())
}

/// The result an `NLMSG_DONE` payload carries (the `int` the kernel always puts there): 0 for a
/// complete dump, else the positive errno the dump stopped on part way.
pub fn done_code(payload: &[u8]) -> Result<i32, WireError> {
    let code = u32_at(payload, 0).ok_or(WireError("a dump's end without its result"))? as i32;
    Ok(code.saturating_neg().max(0))
}

/// The attributes in `buf`: `(type without flags, payload)`.
fn attrs(mut buf: &[u8]) -> Result<Vec<(u16, &[u8])>, WireError> {
    let mut out = Vec::new();
    while buf.len() >= 4 {
        let (Some(len), Some(ty)) = (u16_at(buf, 0), u16_at(buf, 2)) else {
            break;
        };
        let l = len as usize;
        if l < 4 || l > buf.len() {
            return Err(WireError("an attribute length outside its message"));
        }
        out.push((ty & NLA_TYPE_MASK, &buf[4..l]));
        buf = &buf[align4(l).min(buf.len())..];
    }
    Ok(out)
}

fn c_string(payload: &[u8]) -> String {
    let end = payload
        .iter()
        .position(|b| *b == 0)
        .unwrap_or(payload.len());
    String::from_utf8_lossy(&payload[..end]).into_owned()
}

fn u32_attr(payload: &[u8]) -> Result<u32, WireError> {
    u32_at(payload, 0).ok_or(WireError("a 32-bit attribute shorter than 4 bytes"))
}

/// What the capability reads of a link (`RTM_NEWLINK`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    /// Interface index.
    pub index: u32,
    /// Primary name (`IFLA_IFNAME`); empty when the kernel sent none.
    pub name: String,
    /// `IFLA_INFO_KIND` (`bridge`, `veth`, ...); empty for a link without one (a NIC).
    pub kind: String,
    /// The index of its master (a bridge it is a port of).
    pub master: Option<u32>,
    /// `IFLA_LINK`, when not 0: for a veth its peer, for a vlan, macvlan, ipvlan, ... the link
    /// it is stacked on; in this namespace unless `iflink_elsewhere`.
    pub iflink: Option<u32>,
    /// `IFLA_LINK_NETNSID` was sent: the link's other side (`iflink`, a vxlan's `vxlan_link`)
    /// is in another namespace, where its index means another link.
    pub iflink_elsewhere: bool,
    /// A vxlan's `IFLA_VXLAN_LINK`, when not 0: the lower link it is deleted with.
    pub vxlan_link: Option<u32>,
}

impl Link {
    /// A veth's peer, when it is in this namespace.
    pub fn veth_peer_here(&self) -> Option<u32> {
        self.iflink
            .filter(|_| self.kind == "veth" && !self.iflink_elsewhere)
    }

    /// The links in this namespace this one is stacked on (the kernel deletes it when one of
    /// them goes): `IFLA_LINK` and a vxlan's `IFLA_VXLAN_LINK`; never a veth's peer, and never
    /// the link itself (a NIC's `IFLA_LINK` may be its own index).
    pub fn lowers_here(&self) -> Vec<u32> {
        if self.kind == "veth" || self.iflink_elsewhere {
            return Vec::new();
        }
        let mut out: Vec<u32> = [self.iflink, self.vxlan_link]
            .into_iter()
            .flatten()
            .filter(|i| *i != self.index)
            .collect();
        out.dedup();
        out
    }
}

/// Parses an `RTM_NEWLINK` payload.
pub fn link(payload: &[u8]) -> Result<Link, WireError> {
    let index = u32_at(payload, 4).ok_or(WireError("an ifinfomsg shorter than 16 bytes"))?;
    if payload.len() < IFINFOMSG_LEN {
        return Err(WireError("an ifinfomsg shorter than 16 bytes"));
    }
    let mut l = Link {
        index,
        name: String::new(),
        kind: String::new(),
        master: None,
        iflink: None,
        iflink_elsewhere: false,
        vxlan_link: None,
    };
    let mut info_data = None;
    for (ty, p) in attrs(&payload[IFINFOMSG_LEN..])? {
        match ty {
            IFLA_IFNAME => l.name = c_string(p),
            IFLA_MASTER => l.master = Some(u32_attr(p)?).filter(|m| *m != 0),
            IFLA_LINK => l.iflink = Some(u32_attr(p)?).filter(|m| *m != 0),
            IFLA_LINK_NETNSID => l.iflink_elsewhere = true,
            IFLA_LINKINFO => {
                for (ity, ip) in attrs(p)? {
                    match ity {
                        IFLA_INFO_KIND => l.kind = c_string(ip),
                        IFLA_INFO_DATA => info_data = Some(ip),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    // The layout of IFLA_INFO_DATA depends on the kind, known only once all is read.
    if l.kind == "vxlan"
        && let Some(data) = info_data
    {
        for (ty, p) in attrs(data)? {
            if ty == IFLA_VXLAN_LINK {
                l.vxlan_link = Some(u32_attr(p)?).filter(|m| *m != 0);
            }
        }
    }
    Ok(l)
}

/// What the capability reads of a route (`RTM_NEWROUTE`): whether it carries a default route
/// and which links it leaves through.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Route {
    /// `AF_INET`, `AF_INET6`, ...
    pub family: u8,
    /// Destination prefix length: 0 for a default route, 1 for half the address space.
    pub dst_len: u8,
    /// `RTA_OIF`.
    pub oif: Option<u32>,
    /// The `rtnh_ifindex` of each `RTA_MULTIPATH` next hop.
    pub multipath: Vec<u32>,
    /// `RTA_NH_ID`: a nexthop object.
    pub nh_id: Option<u32>,
}

impl Route {
    /// An IPv4 or IPv6 route that acts as a default: a prefix length of 0 (`0.0.0.0/0`,
    /// `::/0`) or 1. Two /1 routes (`0.0.0.0/1` + `128.0.0.0/1`, `::/1` + `8000::/1`) cover
    /// every address and win over the /0 as longer prefixes: how VPN clients take the default
    /// without replacing it. Either half is counted alone (half the addresses is the host's
    /// traffic all the same).
    pub fn carries_default(&self) -> bool {
        self.dst_len <= 1 && matches!(self.family, AF_INET | AF_INET6)
    }
}

/// Parses an `RTM_NEWROUTE` payload.
pub fn route(payload: &[u8]) -> Result<Route, WireError> {
    if payload.len() < RTMSG_LEN {
        return Err(WireError("an rtmsg shorter than 12 bytes"));
    }
    let mut r = Route {
        family: payload[0],
        dst_len: payload[1],
        ..Route::default()
    };
    for (ty, p) in attrs(&payload[RTMSG_LEN..])? {
        match ty {
            RTA_OIF => r.oif = Some(u32_attr(p)?),
            RTA_NH_ID => r.nh_id = Some(u32_attr(p)?),
            RTA_MULTIPATH => {
                let mut rest = p;
                while rest.len() >= RTNH_LEN {
                    let (Some(len), Some(ifindex)) = (u16_at(rest, 0), u32_at(rest, 4)) else {
                        break;
                    };
                    let l = len as usize;
                    if l < RTNH_LEN || l > rest.len() {
                        return Err(WireError("a multipath next hop outside its route"));
                    }
                    r.multipath.push(ifindex);
                    rest = &rest[align4(l).min(rest.len())..];
                }
            }
            _ => {}
        }
    }
    Ok(r)
}

/// What the capability reads of a nexthop object (`RTM_NEWNEXTHOP`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Nexthop {
    /// `NHA_ID`.
    pub id: u32,
    /// `NHA_OIF`.
    pub oif: Option<u32>,
    /// `NHA_GROUP`: the member nexthops' ids.
    pub group: Vec<u32>,
}

/// Parses an `RTM_NEWNEXTHOP` payload.
pub fn nexthop(payload: &[u8]) -> Result<Nexthop, WireError> {
    if payload.len() < NHMSG_LEN {
        return Err(WireError("an nhmsg shorter than 8 bytes"));
    }
    let mut n = Nexthop::default();
    for (ty, p) in attrs(&payload[NHMSG_LEN..])? {
        match ty {
            NHA_ID => n.id = u32_attr(p)?,
            NHA_OIF => n.oif = Some(u32_attr(p)?),
            NHA_GROUP => {
                if p.len() % NH_GRP_LEN != 0 {
                    return Err(WireError("a nexthop group of partial entries"));
                }
                n.group = p
                    .chunks_exact(NH_GRP_LEN)
                    .filter_map(|c| u32_at(c, 0))
                    .collect();
            }
            _ => {}
        }
    }
    Ok(n)
}

#[cfg(test)]
#[path = "wire_tests.rs"]
pub(crate) mod tests;
