//! Telling systemd how the daemon is: `READY=1`, `STATUS=` lines and `WATCHDOG=1`
//! (sd_notify(3)), sent as datagrams to the socket `NOTIFY_SOCKET` names.
//!
//! # Background
//! `deploy/nodeward.service` is `Type=notify` with `WatchdogSec=30s`: systemd counts the daemon
//! started when it says `READY=1` (once its watches run), and kills and restarts it when no
//! `WATCHDOG=1` arrived within the interval. The ping must come from the reconcile loop itself,
//! after each pass or wait, never from a timer of its own: a blind timer would keep a hung loop
//! alive forever. The protocol is one `KEY=value` line per state in a unix datagram, so it is
//! written here on std's `UnixDatagram` rather than through another dependency.
//!
//! # Guarantees
//! - Without `NOTIFY_SOCKET` (a daemon started by hand or in a test) every call is a no-op
//!   that succeeds.
//! - A socket name starting with `@` is the abstract socket of that name, as systemd means it.
//! - [`Notifier::watchdog_interval`] is half of `WATCHDOG_USEC` (systemd's advice), and only
//!   when `WATCHDOG_PID` is unset or names this process: a watchdog meant for a parent is not
//!   fed by its child.
//! - A `STATUS=` text is one line: newlines become spaces, so it cannot inject another state.
//!
//! # Caveats
//! `NotifyAccess=main` makes systemd drop datagrams from any process but the unit's main one:
//! the daemon must notify from its own process, never from a helper it runs.

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::path::PathBuf;
use std::time::Duration;

/// Why a notification could not be sent.
#[derive(Debug, thiserror::Error)]
pub enum NotifyError {
    /// `NOTIFY_SOCKET` names something that is not a socket address.
    #[error("NOTIFY_SOCKET {socket:?} is not a usable socket address: {source}")]
    Address {
        /// The socket as named.
        socket: String,
        /// Why it is unusable.
        #[source]
        source: io::Error,
    },
    /// The datagram could not be sent.
    #[error("sending {state:?} to NOTIFY_SOCKET {socket:?}: {source}")]
    Send {
        /// The first state of the datagram (e.g. `READY=1`).
        state: String,
        /// The socket as named.
        socket: String,
        /// Why it failed.
        #[source]
        source: io::Error,
    },
}

/// Where notifications go; see the module docs.
#[derive(Clone, Debug, Default)]
pub struct Notifier {
    /// The socket `NOTIFY_SOCKET` names; `None`: not run by systemd (every call a no-op).
    socket: Option<PathBuf>,
    /// Half of `WATCHDOG_USEC`, when the watchdog is meant for this process.
    watchdog: Option<Duration>,
}

impl Notifier {
    /// The notifier of this process's environment (`NOTIFY_SOCKET`, `WATCHDOG_USEC`,
    /// `WATCHDOG_PID`).
    pub fn from_env() -> Self {
        Notifier::from_values(
            std::env::var_os("NOTIFY_SOCKET").as_deref(),
            std::env::var("WATCHDOG_USEC").ok().as_deref(),
            std::env::var("WATCHDOG_PID").ok().as_deref(),
            std::process::id(),
        )
    }

    /// The notifier those environment values describe, for the process `pid`. An empty
    /// socket is no socket; an unparsable or zero `WATCHDOG_USEC` is no watchdog.
    pub fn from_values(
        socket: Option<&OsStr>,
        watchdog_usec: Option<&str>,
        watchdog_pid: Option<&str>,
        pid: u32,
    ) -> Self {
        let socket = socket.filter(|s| !s.is_empty()).map(PathBuf::from);
        let for_us = match watchdog_pid {
            None => true,
            Some(p) => p.trim().parse::<u32>().is_ok_and(|p| p == pid),
        };
        let watchdog = watchdog_usec
            .and_then(|u| u.trim().parse::<u64>().ok())
            .filter(|&u| u > 0 && for_us)
            .map(|u| Duration::from_micros(u) / 2);
        Notifier { socket, watchdog }
    }

    /// Whether notifications go anywhere (`NOTIFY_SOCKET` is set).
    pub fn enabled(&self) -> bool {
        self.socket.is_some()
    }

    /// How often the reconcile loop must ping the watchdog (half of `WATCHDOG_USEC`); `None`
    /// when systemd watches nothing.
    pub fn watchdog_interval(&self) -> Option<Duration> {
        self.watchdog
    }

    /// `READY=1` with a status line: the daemon's watches run.
    pub fn ready(&self, status: &str) -> Result<(), NotifyError> {
        self.send(&["READY=1".to_string(), status_line(status)])
    }

    /// A `STATUS=` line (`systemctl status` shows it).
    pub fn status(&self, status: &str) -> Result<(), NotifyError> {
        self.send(&[status_line(status)])
    }

    /// `WATCHDOG=1`: the reconcile loop is alive. Call it only from that loop.
    pub fn watchdog(&self) -> Result<(), NotifyError> {
        self.send(&["WATCHDOG=1".to_string()])
    }

    /// `STOPPING=1` with a status line: the daemon is on its way out.
    pub fn stopping(&self, status: &str) -> Result<(), NotifyError> {
        self.send(&["STOPPING=1".to_string(), status_line(status)])
    }

    /// Sends `states` as one datagram, one per line; nothing without a socket.
    fn send(&self, states: &[String]) -> Result<(), NotifyError> {
        let Some(socket) = &self.socket else {
            return Ok(());
        };
        let named = socket.display().to_string();
        let address = address(socket.as_os_str()).map_err(|source| NotifyError::Address {
            socket: named.clone(),
            source,
        })?;
        let mut message = states.join("\n");
        message.push('\n');
        let send = || -> io::Result<()> {
            let sender = UnixDatagram::unbound()?;
            sender.send_to_addr(message.as_bytes(), &address)?;
            Ok(())
        };
        send().map_err(|source| NotifyError::Send {
            state: states.first().cloned().unwrap_or_default(),
            socket: named,
            source,
        })
    }
}

/// The address `NOTIFY_SOCKET` names: a path, or with a leading `@` an abstract name.
fn address(socket: &OsStr) -> io::Result<SocketAddr> {
    match socket.as_bytes().strip_prefix(b"@") {
        Some(name) => {
            use std::os::linux::net::SocketAddrExt as _;
            SocketAddr::from_abstract_name(name)
        }
        None => SocketAddr::from_pathname(socket),
    }
}

/// `STATUS=` and `text` on one line.
fn status_line(text: &str) -> String {
    let one_line: String = text
        .chars()
        .map(|c| if c == '\n' || c == '\r' { ' ' } else { c })
        .collect();
    format!("STATUS={one_line}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A datagram socket the test binds, and the notifier that sends to it.
    fn listener() -> (tempfile::TempDir, UnixDatagram, Notifier) {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("notify.sock");
        let sock = UnixDatagram::bind(&path).expect("bind");
        sock.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        let n = Notifier::from_values(Some(path.as_os_str()), None, None, 1);
        (dir, sock, n)
    }

    fn recv(sock: &UnixDatagram) -> String {
        let mut buf = [0u8; 4096];
        let n = sock.recv(&mut buf).expect("a datagram");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }

    #[test]
    fn without_a_socket_everything_is_a_no_op() {
        let n = Notifier::from_values(None, Some("30000000"), None, 1);
        assert!(!n.enabled());
        n.ready("watching").expect("no-op");
        n.status("x").expect("no-op");
        n.watchdog().expect("no-op");
        let empty = Notifier::from_values(Some(OsStr::new("")), None, None, 1);
        assert!(!empty.enabled());
        empty.watchdog().expect("no-op");
    }

    #[test]
    fn ready_status_and_watchdog_reach_the_socket() {
        let (_dir, sock, n) = listener();
        assert!(n.enabled());
        n.ready("watching Machine worker-01").expect("ready");
        assert_eq!(recv(&sock), "READY=1\nSTATUS=watching Machine worker-01\n");
        n.watchdog().expect("watchdog");
        assert_eq!(recv(&sock), "WATCHDOG=1\n");
        n.status("reconciled").expect("status");
        assert_eq!(recv(&sock), "STATUS=reconciled\n");
        n.stopping("AgentReset done").expect("stopping");
        assert_eq!(recv(&sock), "STOPPING=1\nSTATUS=AgentReset done\n");
    }

    #[test]
    fn a_status_cannot_inject_another_state() {
        let (_dir, sock, n) = listener();
        n.status("fine\nREADY=1\r\nWATCHDOG=1").expect("status");
        assert_eq!(recv(&sock), "STATUS=fine READY=1  WATCHDOG=1\n");
    }

    #[test]
    fn an_abstract_socket_is_reached_by_its_name() {
        let name = format!("nodeward-notify-test-{}-{}", std::process::id(), line!());
        let addr = {
            use std::os::linux::net::SocketAddrExt as _;
            SocketAddr::from_abstract_name(name.as_bytes()).expect("abstract address")
        };
        let sock = UnixDatagram::bind_addr(&addr).expect("bind abstract");
        sock.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        let at = format!("@{name}");
        let n = Notifier::from_values(Some(OsStr::new(&at)), None, None, 1);
        n.watchdog().expect("watchdog");
        assert_eq!(recv(&sock), "WATCHDOG=1\n");
    }

    #[test]
    fn a_missing_socket_is_an_error_naming_it() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("nobody-listens.sock");
        let n = Notifier::from_values(Some(path.as_os_str()), None, None, 1);
        let e = n.ready("x").expect_err("nobody listens");
        let text = e.to_string();
        assert!(text.contains("READY=1"), "{text}");
        assert!(text.contains("nobody-listens.sock"), "{text}");
    }

    #[test]
    fn the_watchdog_interval_is_half_and_only_for_this_process() {
        let n = Notifier::from_values(None, Some("30000000"), None, 42);
        assert_eq!(n.watchdog_interval(), Some(Duration::from_secs(15)));
        let n = Notifier::from_values(None, Some("30000000"), Some("42"), 42);
        assert_eq!(n.watchdog_interval(), Some(Duration::from_secs(15)));
        let n = Notifier::from_values(None, Some("30000000"), Some("41"), 42);
        assert_eq!(n.watchdog_interval(), None, "meant for another process");
        for bad in ["0", "", "soon", "-5"] {
            let n = Notifier::from_values(None, Some(bad), None, 42);
            assert_eq!(n.watchdog_interval(), None, "{bad:?}");
        }
        assert_eq!(
            Notifier::from_values(None, None, None, 42).watchdog_interval(),
            None
        );
    }
}
