//! A loopback TCP proxy in front of the API server that the test can cut and restore: while it
//! is cut, every open connection is closed and every new one is accepted and closed at once
//! (counted), as a flapping API server or a dropped NAT mapping looks to a client.

use std::io;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

#[derive(Default)]
struct State {
    cut: AtomicBool,
    accepted: AtomicUsize,
    open: Mutex<Vec<TcpStream>>,
}

/// The proxy; its threads end with the test binary.
pub struct Proxy {
    pub addr: SocketAddr,
    state: Arc<State>,
}

impl Proxy {
    /// Listens on a free loopback port and forwards each connection to `upstream`.
    pub fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let addr = listener.local_addr().expect("proxy address");
        let state = Arc::new(State::default());
        let s = state.clone();
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                s.accepted.fetch_add(1, Ordering::SeqCst);
                if s.cut.load(Ordering::SeqCst) {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                }
                let Ok(server) = TcpStream::connect(upstream) else {
                    continue;
                };
                if let (Ok(c), Ok(v)) = (client.try_clone(), server.try_clone()) {
                    let mut open = s.open.lock().expect("proxy lock");
                    open.push(c);
                    open.push(v);
                }
                pipe(&client, &server);
                pipe(&server, &client);
            }
        });
        Proxy { addr, state }
    }

    /// Closes every open connection; new ones are closed at once until [`Proxy::restore`].
    pub fn cut(&self) {
        self.state.cut.store(true, Ordering::SeqCst);
        for c in self.state.open.lock().expect("proxy lock").drain(..) {
            let _ = c.shutdown(Shutdown::Both);
        }
    }

    /// Forwards new connections again.
    pub fn restore(&self) {
        self.state.cut.store(false, Ordering::SeqCst);
    }

    /// Connections accepted so far (forwarded or not).
    pub fn accepted(&self) -> usize {
        self.state.accepted.load(Ordering::SeqCst)
    }
}

/// Copies `from` to `to` on a thread until either side closes.
fn pipe(from: &TcpStream, to: &TcpStream) {
    let (Ok(mut from), Ok(mut to)) = (from.try_clone(), to.try_clone()) else {
        return;
    };
    std::thread::spawn(move || {
        let _: io::Result<u64> = io::copy(&mut from, &mut to);
        let _ = to.shutdown(Shutdown::Write);
    });
}
