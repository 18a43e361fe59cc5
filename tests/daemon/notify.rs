//! A notify socket (`NOTIFY_SOCKET`) a daemon test binds: it keeps every datagram the daemon
//! sends (`READY=1`, `STATUS=…`, `WATCHDOG=1`), for the tests to count and wait on.

use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// The socket `dir/notify.sock` and what it received.
pub struct NotifySocket {
    pub path: PathBuf,
    received: Arc<Mutex<Vec<String>>>,
}

impl NotifySocket {
    pub fn bind(dir: &Path) -> NotifySocket {
        let path = dir.join("notify.sock");
        let socket = UnixDatagram::bind(&path).expect("bind the notify socket");
        let received = Arc::new(Mutex::new(Vec::new()));
        let sink = received.clone();
        // Ends with the test binary; the socket file goes with its directory.
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 4096];
            while let Ok(n) = socket.recv(&mut buf) {
                let text = String::from_utf8_lossy(&buf[..n]).into_owned();
                sink.lock().expect("notify lock").push(text);
            }
        });
        NotifySocket { path, received }
    }

    /// Every line received so far, in order.
    pub fn lines(&self) -> Vec<String> {
        let got = self.received.lock().expect("notify lock");
        got.iter()
            .flat_map(|d| d.lines().map(str::to_string))
            .collect()
    }

    /// How many lines are `line`.
    pub fn count(&self, line: &str) -> usize {
        self.lines().iter().filter(|l| *l == line).count()
    }

    /// Whether a line starts with `prefix`.
    pub fn has_line_starting(&self, prefix: &str) -> bool {
        self.lines().iter().any(|l| l.starts_with(prefix))
    }
}
