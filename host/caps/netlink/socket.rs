//! The kernel's side of a [`super::Netlink`] conversation: a route socket that sends requests
//! and receives datagrams within a deadline ([`Transport`], which unit tests replace with
//! queued replies).
//!
//! # Guarantees
//! - A receive waits until the deadline at most; past it, a datagram already queued is still
//!   read (without waiting), so a reply the kernel queued while this thread was descheduled
//!   is not taken for a timeout.
//! - Only datagrams from the kernel (port 0) are returned; a truncated one is `EMSGSIZE`.

use rustix::fd::OwnedFd;
use rustix::io::Errno;
use rustix::net::{
    AddressFamily, RecvFlags, SendFlags, SocketFlags, SocketType, netlink::SocketAddrNetlink,
};
use std::time::{Duration, Instant};

/// Sends requests and receives datagrams. [`Socket`] is the kernel; unit tests queue replies.
pub trait Transport {
    /// Sends one request.
    fn send(&mut self, msg: &[u8]) -> Result<(), Errno>;
    /// Receives one datagram, waiting until `deadline` at most; past it, one already queued
    /// is still returned (read without waiting), and `Ok(None)` means none came.
    fn recv(&mut self, deadline: Instant) -> Result<Option<Vec<u8>>, Errno>;
}

/// Biggest datagram read; the kernel's dump datagrams are at most 32 KiB.
const RECV_BUF: usize = 64 * 1024;

/// An `AF_NETLINK`/`NETLINK_ROUTE` socket.
pub struct Socket {
    fd: OwnedFd,
}

impl Socket {
    /// Opens a route socket in the agent's network namespace.
    pub fn open() -> Result<Socket, Errno> {
        let fd = rustix::net::socket_with(
            AddressFamily::NETLINK,
            SocketType::RAW,
            SocketFlags::CLOEXEC,
            None,
        )?;
        rustix::net::bind(&fd, &SocketAddrNetlink::new(0, 0))?;
        Ok(Socket { fd })
    }
}

impl Transport for Socket {
    fn send(&mut self, msg: &[u8]) -> Result<(), Errno> {
        let kernel = SocketAddrNetlink::new(0, 0);
        let sent = rustix::net::sendto(&self.fd, msg, SendFlags::empty(), &kernel)?;
        if sent != msg.len() {
            return Err(Errno::MSGSIZE);
        }
        Ok(())
    }

    fn recv(&mut self, deadline: Instant) -> Result<Option<Vec<u8>>, Errno> {
        let mut buf = vec![0u8; RECV_BUF];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            // Past the deadline, what is already queued is still read (without waiting): a
            // reply the kernel queued while this thread was descheduled, or while `sendto`
            // waited for the rtnl lock, answers the request all the same.
            let flags = if left.is_zero() {
                RecvFlags::TRUNC | RecvFlags::DONTWAIT
            } else {
                // SO_RCVTIMEO of zero means "forever": wait at least a millisecond.
                rustix::net::sockopt::set_socket_timeout(
                    &self.fd,
                    rustix::net::sockopt::Timeout::Recv,
                    Some(left.max(Duration::from_millis(1))),
                )?;
                RecvFlags::TRUNC
            };
            match rustix::net::recvfrom(&self.fd, &mut buf[..], flags) {
                Ok((_, real, from)) => {
                    // Only the kernel (port 0) answers; a datagram from another process (root
                    // may send one to this port) is dropped, never read as a reply.
                    let kernel = from
                        .and_then(|a| SocketAddrNetlink::try_from(a).ok())
                        .is_some_and(|a| a.pid() == 0);
                    if !kernel {
                        continue;
                    }
                    if real > RECV_BUF {
                        return Err(Errno::MSGSIZE);
                    }
                    buf.truncate(real);
                    return Ok(Some(buf));
                }
                // Nothing queued at or past the deadline: a timeout.
                Err(Errno::AGAIN) if left.is_zero() => return Ok(None),
                // SO_RCVTIMEO ran out (about at the deadline): look once more, without
                // waiting, at what is queued.
                Err(Errno::AGAIN) => continue,
                Err(e) => return Err(e),
            }
        }
    }
}
