//! A small rtnetlink client for the `network` capability: list links, routes and nexthop
//! objects, read one link by index, delete one link by index.
//!
//! # Background
//! The capability deletes the pods' bridge and its veths. Running `ip` would put a program and
//! its argument parsing between a grant check and the kernel; a general netlink crate would
//! bring far more than four requests need. So this module speaks the protocol itself over an
//! `AF_NETLINK` socket from rustix (`net` feature), with the byte layouts in [`wire`].
//!
//! # Guarantees
//! - A dump the kernel marks interrupted (`NLM_F_DUMP_INTR`: links or routes changed while it
//!   was read, so it may be inconsistent), or ends with `EINTR`, is read again from the start,
//!   at most [`NetlinkLimits::dump_attempts`] times in all, then [`NlError::Interrupted`].
//! - A dump is complete only when its `NLMSG_DONE` says so: that message carries the dump's
//!   own error (`-ENOBUFS`, `-EMSGSIZE`, ... when the kernel gave up part way), and any other
//!   error there is [`NlError::Errno`]; nothing is decided on a partial list.
//! - The link dump is kept whole and stops past [`NetlinkLimits::max_links`]
//!   ([`NlError::Limit`]). The route and nexthop dumps are streamed: each message is read,
//!   checked and dropped, keeping only the links of routes that carry a default route (and the
//!   nexthop objects they name), at most [`NetlinkLimits::max_default_links`] of each; so
//!   memory stays bounded however many routes the host has (a full BGP table is ~1M), and the
//!   time to read them is bounded by the deadline.
//! - Every receive waits until the deadline at most ([`NlError::Timeout`]), but a reply already
//!   queued on the socket when the deadline passes is read (without waiting), not dropped. No
//!   request is sent past the deadline, and a dump is not read on past it (each datagram of a
//!   dump read has the kernel queue the next: "what is queued" has no end there, and the
//!   deadline is what bounds the time to read ~1M routes). A datagram not sent by the kernel
//!   (port 0) or a reply whose sequence number is not the request's is skipped, a truncated
//!   datagram is an error.
//! - A delete whose reply does not come before the deadline is not taken as failed: the link
//!   is read again by its index, waiting [`CONFIRM_WAIT`] past the deadline at most; gone, it
//!   was deleted ([`Deleted::AfterTimeout`]); still there, or unreadable, the error says so
//!   ([`NlError::Unconfirmed`]).
//! - Links are read by listing them all, never by asking the kernel to resolve a name (which
//!   would match alternative names too); they are deleted by index.
//! - Errnos keep their names (`EPERM`, `ENODEV`, ...) in every error.
//!
//! # Caveats
//! An index names one device for its lifetime; between the last check of a link and its
//! deletion another process with `CAP_NET_ADMIN` could rename it. Such a process is root
//! already.

mod socket;
pub mod wire;

pub use socket::{Socket, Transport};

use rustix::io::Errno;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};
use wire::{Header, Link, WireError};

/// Bounds on what one call reads and keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NetlinkLimits {
    /// Most links one dump may list.
    pub max_links: usize,
    /// Most distinct links kept from the routes that carry a default route, and most nexthop
    /// objects kept for them; the routes themselves are not counted (they are not kept).
    pub max_default_links: usize,
    /// How often a dump is read in all before an interrupted one fails the call.
    pub dump_attempts: u32,
}

impl Default for NetlinkLimits {
    /// 4096 links, 4096 default-route links and nexthop objects kept, 5 attempts
    /// (`wit/network.wit`).
    fn default() -> Self {
        NetlinkLimits {
            max_links: 4096,
            max_default_links: 4096,
            dump_attempts: 5,
        }
    }
}

/// Why a netlink exchange failed; each names what was being done.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NlError {
    /// The kernel (or the socket) refused.
    #[error("{what}: {}", describe_errno(*errno))]
    Errno {
        /// What was being done.
        what: String,
        /// The errno.
        errno: Errno,
    },
    /// The deadline passed while waiting for a reply, or before a request could be sent.
    #[error("{what}: no reply before the phase deadline")]
    Timeout {
        /// What was being done.
        what: String,
    },
    /// A delete had no reply before the deadline, and reading the link again by index did not
    /// show it gone.
    #[error("{what}: no reply before the phase deadline; {found}")]
    Unconfirmed {
        /// What was being done.
        what: String,
        /// What reading the link again found: still there, or why it could not be read.
        found: String,
    },
    /// A dump listed, or would have kept, more than its limit.
    #[error("{what}: more than {limit} entries; nothing was changed")]
    Limit {
        /// What was being done.
        what: String,
        /// The limit.
        limit: usize,
    },
    /// Every attempt at a dump was interrupted by concurrent changes.
    #[error("{what}: interrupted by concurrent changes {attempts} times; nothing was changed")]
    Interrupted {
        /// What was being done.
        what: String,
        /// Attempts made.
        attempts: u32,
    },
    /// The kernel sent something this client cannot read.
    #[error("{what}: {source}")]
    Malformed {
        /// What was being done.
        what: String,
        /// What was wrong.
        source: WireError,
    },
}

/// The symbolic name of the errnos a link deletion or cgroup removal meets, else
/// `errno <n>`.
pub fn errno_name(e: Errno) -> String {
    let name = match e {
        Errno::PERM => "EPERM",
        Errno::ACCESS => "EACCES",
        Errno::NODEV => "ENODEV",
        Errno::NOENT => "ENOENT",
        Errno::BUSY => "EBUSY",
        Errno::INVAL => "EINVAL",
        Errno::OPNOTSUPP => "EOPNOTSUPP",
        Errno::NOBUFS => "ENOBUFS",
        Errno::NOMEM => "ENOMEM",
        Errno::AGAIN => "EAGAIN",
        Errno::INTR => "EINTR",
        Errno::AFNOSUPPORT => "EAFNOSUPPORT",
        Errno::PROTONOSUPPORT => "EPROTONOSUPPORT",
        Errno::BADF => "EBADF",
        Errno::NOTDIR => "ENOTDIR",
        Errno::LOOP => "ELOOP",
        Errno::XDEV => "EXDEV",
        Errno::NOTEMPTY => "ENOTEMPTY",
        Errno::ROFS => "EROFS",
        Errno::MSGSIZE => "EMSGSIZE",
        Errno::IO => "EIO",
        _ => return format!("errno {}", e.raw_os_error()),
    };
    name.to_string()
}

/// `EPERM (Operation not permitted)`: the errno's name and the C library's words for it.
pub fn describe_errno(e: Errno) -> String {
    let words = std::io::Error::from_raw_os_error(e.raw_os_error()).to_string();
    let words = words
        .split(" (os error")
        .next()
        .unwrap_or(&words)
        .to_string();
    format!("{} ({words})", errno_name(e))
}

/// How long past the deadline the host waits, after a delete had no reply, for the answer to
/// reading that link again by index: long enough for the kernel to take the rtnl lock on a
/// busy host, short enough not to hold a phase past its deadline noticeably. Spent only when a
/// delete's reply did not come.
pub const CONFIRM_WAIT: Duration = Duration::from_secs(1);

/// How a delete by index ended, when the link is gone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Deleted {
    /// The kernel acknowledged the deletion.
    Acked,
    /// No link had that index (`ENODEV`): deleted before this request, by someone else or
    /// with an earlier link.
    AlreadyGone,
    /// No reply came before the deadline, and reading the link again by its index found none:
    /// the request deleted it (or the link went otherwise meanwhile).
    AfterTimeout,
}

/// One conversation with the kernel, bounded by a deadline and [`NetlinkLimits`].
pub struct Netlink<T: Transport> {
    transport: T,
    seq: u32,
    deadline: Instant,
    limits: NetlinkLimits,
}

/// A request: message type, fixed body, attributes.
type Request<'a> = (u16, &'a [u8], &'a [(u16, &'a [u8])]);

impl Netlink<Socket> {
    /// A route socket, used until `deadline`.
    pub fn open(deadline: Instant, limits: NetlinkLimits) -> Result<Self, NlError> {
        let transport = Socket::open().map_err(|errno| NlError::Errno {
            what: "opening a route netlink socket".into(),
            errno,
        })?;
        Ok(Netlink::new(transport, deadline, limits))
    }
}

impl<T: Transport> Netlink<T> {
    /// A conversation over `transport`.
    pub fn new(transport: T, deadline: Instant, limits: NetlinkLimits) -> Self {
        Netlink {
            transport,
            seq: 0,
            deadline,
            limits,
        }
    }

    /// The transport, to see what was sent (tests of the callers).
    #[cfg(test)]
    pub(crate) fn into_transport(self) -> T {
        self.transport
    }

    fn send(
        &mut self,
        what: &str,
        ty: u16,
        flags: u16,
        body: &[u8],
        attrs: &[(u16, &[u8])],
    ) -> Result<u32, NlError> {
        // Nothing new starts past the deadline: the kernel answers most requests inside
        // `sendto`, so a reply read without waiting would let calls go on unbounded.
        if Instant::now() >= self.deadline {
            return Err(NlError::Timeout { what: what.into() });
        }
        self.seq = self.seq.wrapping_add(1);
        let msg = wire::request(ty, flags, self.seq, body, attrs);
        self.transport.send(&msg).map_err(|errno| NlError::Errno {
            what: what.into(),
            errno,
        })?;
        Ok(self.seq)
    }

    /// The messages of the next datagram that answer `seq`.
    fn replies(&mut self, what: &str, seq: u32) -> Result<Vec<(Header, Vec<u8>)>, NlError> {
        loop {
            let datagram = self
                .transport
                .recv(self.deadline)
                .map_err(|errno| NlError::Errno {
                    what: what.into(),
                    errno,
                })?
                .ok_or_else(|| NlError::Timeout { what: what.into() })?;
            let msgs = wire::messages(&datagram).map_err(|source| NlError::Malformed {
                what: what.into(),
                source,
            })?;
            let ours: Vec<(Header, Vec<u8>)> = msgs
                .into_iter()
                .filter(|(h, _)| h.seq == seq)
                .map(|(h, p)| (h, p.to_vec()))
                .collect();
            if !ours.is_empty() {
                return Ok(ours);
            }
        }
    }

    /// One dump, read again while the kernel marks it interrupted: each `reply_ty` message's
    /// payload goes to `visit` with the attempt's state, which starts as `fresh()` on every
    /// attempt; the state of the first complete, uninterrupted attempt is returned.
    fn dump<S>(
        &mut self,
        what: &str,
        request: Request<'_>,
        reply_ty: u16,
        fresh: impl Fn() -> S,
        mut visit: impl FnMut(&mut S, &[u8]) -> Result<(), NlError>,
    ) -> Result<S, NlError> {
        let attempts = self.limits.dump_attempts.max(1);
        let malformed = |source| NlError::Malformed {
            what: what.into(),
            source,
        };
        for _ in 0..attempts {
            let (ty, body, attrs) = request;
            let seq = self.send(what, ty, wire::NLM_F_DUMP, body, attrs)?;
            let mut state = fresh();
            let mut interrupted = false;
            'read: loop {
                // Not read on past the deadline, queued or not (see the module docs).
                if Instant::now() >= self.deadline {
                    return Err(NlError::Timeout { what: what.into() });
                }
                for (h, p) in self.replies(what, seq)? {
                    interrupted |= h.flags & wire::NLM_F_DUMP_INTR != 0;
                    match h.ty {
                        wire::NLMSG_DONE => {
                            // The dump's own result: 0, or the errno it stopped on.
                            match wire::done_code(&p).map_err(malformed)? {
                                0 => {}
                                code if code == Errno::INTR.raw_os_error() => interrupted = true,
                                code => {
                                    return Err(NlError::Errno {
                                        what: format!("{what} (the dump ended early)"),
                                        errno: Errno::from_raw_os_error(code),
                                    });
                                }
                            }
                            break 'read;
                        }
                        wire::NLMSG_ERROR => {
                            let code = wire::error_code(&p).map_err(malformed)?;
                            return Err(NlError::Errno {
                                what: what.into(),
                                errno: Errno::from_raw_os_error(code),
                            });
                        }
                        // An error returned leaves the rest of the dump unread: the caller
                        // drops this socket with the call.
                        t if t == reply_ty => visit(&mut state, &p)?,
                        _ => {}
                    }
                }
            }
            if !interrupted {
                return Ok(state);
            }
        }
        Err(NlError::Interrupted {
            what: what.into(),
            attempts,
        })
    }

    /// Every link of the namespace.
    pub fn links(&mut self) -> Result<Vec<Link>, NlError> {
        let mask = wire::RTEXT_FILTER_SKIP_STATS.to_ne_bytes();
        let limit = self.limits.max_links;
        let what = "listing network links";
        self.dump(
            what,
            (
                wire::RTM_GETLINK,
                &wire::ifinfomsg(0),
                &[(wire::IFLA_EXT_MASK, &mask)],
            ),
            wire::RTM_NEWLINK,
            Vec::new,
            |links, p| {
                if links.len() >= limit {
                    return Err(NlError::Limit {
                        what: what.into(),
                        limit,
                    });
                }
                let l = wire::link(p).map_err(|source| NlError::Malformed {
                    what: what.into(),
                    source,
                })?;
                links.push(l);
                Ok(())
            },
        )
    }

    /// The link with index `index`, or `None` when there is none (`ENODEV`).
    pub fn link(&mut self, index: u32) -> Result<Option<Link>, NlError> {
        let what = format!("reading link {index}");
        let seq = self.send(&what, wire::RTM_GETLINK, 0, &wire::ifinfomsg(index), &[])?;
        for (h, p) in self.replies(&what, seq)? {
            match h.ty {
                wire::RTM_NEWLINK => {
                    return wire::link(&p)
                        .map(Some)
                        .map_err(|source| NlError::Malformed { what, source });
                }
                wire::NLMSG_ERROR => {
                    let code = wire::error_code(&p).map_err(|source| NlError::Malformed {
                        what: what.clone(),
                        source,
                    })?;
                    return match Errno::from_raw_os_error(code) {
                        Errno::NODEV => Ok(None),
                        errno => Err(NlError::Errno { what, errno }),
                    };
                }
                _ => {}
            }
        }
        Err(NlError::Malformed {
            what,
            source: WireError("no link and no error in the reply"),
        })
    }

    /// Deletes the link with index `index`: how it went when the link is gone (see
    /// [`Deleted`]). Without a reply before the deadline the link is read again by index,
    /// [`CONFIRM_WAIT`] past the deadline at most: gone, [`Deleted::AfterTimeout`]; else
    /// [`NlError::Unconfirmed`], saying whether it is still there.
    pub fn delete_link(&mut self, index: u32, name: &str) -> Result<Deleted, NlError> {
        let what = format!("deleting link {name} (index {index})");
        let seq = self.send(
            &what,
            wire::RTM_DELLINK,
            wire::NLM_F_ACK,
            &wire::ifinfomsg(index),
            &[],
        )?;
        let replies = match self.replies(&what, seq) {
            Ok(r) => r,
            Err(NlError::Timeout { .. }) => return self.confirm_deleted(index, what),
            Err(e) => return Err(e),
        };
        for (h, p) in replies {
            if h.ty == wire::NLMSG_ERROR {
                let code = wire::error_code(&p).map_err(|source| NlError::Malformed {
                    what: what.clone(),
                    source,
                })?;
                return match code {
                    0 => Ok(Deleted::Acked),
                    c => match Errno::from_raw_os_error(c) {
                        Errno::NODEV => Ok(Deleted::AlreadyGone),
                        errno => Err(NlError::Errno { what, errno }),
                    },
                };
            }
        }
        Err(NlError::Malformed {
            what,
            source: WireError("no acknowledgement in the reply"),
        })
    }

    /// After the delete `what` of link `index` had no reply: whether the link is gone, read
    /// by index with [`CONFIRM_WAIT`] more at most. The delete's late acknowledgement, if it
    /// comes first, has the delete's sequence number and is skipped.
    fn confirm_deleted(&mut self, index: u32, what: String) -> Result<Deleted, NlError> {
        let deadline = self.deadline;
        self.deadline = deadline.max(Instant::now() + CONFIRM_WAIT);
        let now = self.link(index);
        self.deadline = deadline;
        let found = match now {
            Ok(None) => return Ok(Deleted::AfterTimeout),
            Ok(Some(l)) => format!(
                "read again by index, it is still there (now {:?}, kind {:?}): not deleted",
                l.name, l.kind
            ),
            Err(e) => {
                format!("reading it again by index failed ({e}): whether it was deleted is unknown")
            }
        };
        Err(NlError::Unconfirmed { what, found })
    }

    /// The indexes of every link a route that carries a default route
    /// ([`wire::Route::carries_default`]) leaves through, IPv4 or IPv6, in any routing table: its
    /// output interface, each multipath next hop, and the links of its nexthop object (a
    /// group's members included). Streamed: see the module docs.
    pub fn default_route_links(&mut self) -> Result<BTreeSet<u32>, NlError> {
        let what = "listing routes";
        let limit = self.limits.max_default_links;
        // AF_UNSPEC: every family, every table.
        let (mut out, objects) = self.dump(
            what,
            (wire::RTM_GETROUTE, &[0u8; 12], &[]),
            wire::RTM_NEWROUTE,
            || (BTreeSet::new(), BTreeSet::new()),
            |(links, objects): &mut (BTreeSet<u32>, BTreeSet<u32>), p| {
                let r = wire::route(p).map_err(|source| NlError::Malformed {
                    what: what.into(),
                    source,
                })?;
                if r.carries_default() {
                    links.extend(r.oif);
                    links.extend(r.multipath.iter().copied());
                    objects.extend(r.nh_id);
                    if links.len() > limit || objects.len() > limit {
                        return Err(NlError::Limit {
                            what: format!("{what}: links and nexthop objects of default routes"),
                            limit,
                        });
                    }
                }
                Ok(())
            },
        )?;
        if objects.is_empty() {
            return Ok(out);
        }
        // Nexthop objects (Linux 5.3+): a default route through one counts its links. The
        // first dump keeps the named objects' links and groups' members, the second (only
        // when a member was listed before its group) the members' links.
        let mut wanted = objects;
        for pass in 0..2 {
            let found = self.nexthop_links(&wanted)?;
            out.extend(found.links.iter().copied());
            let missing: BTreeSet<u32> = found.members.difference(&found.seen).copied().collect();
            if missing.is_empty() || pass == 1 {
                break;
            }
            wanted = missing;
        }
        Ok(out)
    }

    /// One streamed nexthop dump: the links of the objects in `wanted`, and the members of
    /// those that are groups (a group's members are single nexthops: Linux nests no groups).
    fn nexthop_links(&mut self, wanted: &BTreeSet<u32>) -> Result<NexthopLinks, NlError> {
        let what = "listing nexthop objects";
        let limit = self.limits.max_default_links;
        self.dump(
            what,
            (wire::RTM_GETNEXTHOP, &[0u8; wire::NHMSG_LEN], &[]),
            wire::RTM_NEWNEXTHOP,
            NexthopLinks::default,
            |found, p| {
                let n = wire::nexthop(p).map_err(|source| NlError::Malformed {
                    what: what.into(),
                    source,
                })?;
                if !wanted.contains(&n.id) && !found.members.contains(&n.id) {
                    return Ok(());
                }
                found.seen.insert(n.id);
                found.links.extend(n.oif);
                found.members.extend(n.group.iter().copied());
                if found.links.len() > limit || found.members.len() > limit {
                    return Err(NlError::Limit {
                        what: format!("{what}: links and members of default routes' nexthops"),
                        limit,
                    });
                }
                Ok(())
            },
        )
    }
}

/// What one nexthop dump kept.
#[derive(Default)]
struct NexthopLinks {
    /// The output links of the wanted objects (and of members met after their group).
    links: BTreeSet<u32>,
    /// The members of the wanted groups.
    members: BTreeSet<u32>,
    /// The ids whose links were read.
    seen: BTreeSet<u32>,
}

#[cfg(test)]
mod tests;
