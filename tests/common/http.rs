//! The one HTTP server of the tests: HTTP/1.1 (or HTTPS, with rustls) on 127.0.0.1, answering
//! each request with whatever the test's handler returns, and recording every request.
//!
//! It is a few lines over `std::net` rather than a server crate on purpose: the download
//! refusals need a server that misbehaves on cue — announce a Content-Length and close after a
//! shorter body ([`Reply::announced`]), stall past a phase deadline ([`Reply::delay`]) or in the
//! middle of a body ([`Reply::stall`]) — which
//! tiny_http and the like do not do (tiny_http keeps the connection alive after a short body, so
//! the client would wait for a timeout instead of seeing a cut-short body). The client under
//! test is always the agent's own reqwest, over a real socket.
//!
//! Every connection carries one request and is closed after the answer (`Connection: close`);
//! each runs on its own thread, so a stalled answer holds up nothing else. The server binds a
//! random port directly (no pick-then-bind race) and stops when dropped.
//!
//! It is self-contained (no `super::`) so that both `tests/common` and the none-mode fixture
//! (`tests/node`, which includes this file by path) can use it.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

/// A request head as the server read it (request bodies are not read: the tests only GET).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub method: String,
    /// The request target, query included.
    pub target: String,
    pub headers: Vec<(String, String)>,
}

impl Request {
    /// The target without its query.
    pub fn path(&self) -> &str {
        self.target.split('?').next().unwrap_or("")
    }

    /// The first header called `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// What an answer carries.
#[derive(Clone, Debug, Default)]
pub enum Body {
    #[default]
    Empty,
    Bytes(Vec<u8>),
    /// A file streamed from disk (large artifacts are not read into memory). If it cannot be
    /// opened when the answer is written, the connection is closed without an answer.
    File(PathBuf),
}

/// One answer.
#[derive(Clone, Debug, Default)]
pub struct Reply {
    pub status: u16,
    /// Sent after `Content-Length` and `Connection: close`.
    pub headers: Vec<(String, String)>,
    pub body: Body,
    /// Content-Length to announce when it should differ from the body (a cut-short body).
    pub announced: Option<u64>,
    /// Wait this long before answering.
    pub delay: Duration,
    /// After this many body bytes, wait this long before the rest: a body that stalls
    /// mid-way (a client killed meanwhile holds a partial body).
    pub stall: Option<(u64, Duration)>,
}

impl Reply {
    /// 200 with `body`.
    pub fn ok(body: &[u8]) -> Reply {
        Reply {
            status: 200,
            body: Body::Bytes(body.to_vec()),
            ..Reply::default()
        }
    }

    /// 200 with the contents of the file at `path`, streamed.
    pub fn file(path: impl Into<PathBuf>) -> Reply {
        Reply {
            status: 200,
            body: Body::File(path.into()),
            ..Reply::default()
        }
    }

    /// `code` with no body.
    pub fn empty(code: u16) -> Reply {
        Reply {
            status: code,
            ..Reply::default()
        }
    }

    /// 404 with `not found\n`.
    pub fn not_found() -> Reply {
        Reply {
            status: 404,
            body: Body::Bytes(b"not found\n".to_vec()),
            ..Reply::default()
        }
    }

    /// 302 to `location`.
    pub fn redirect(location: &str) -> Reply {
        Reply::empty(302).with_header("Location", location)
    }

    /// `code` with `value` as an `application/json` body.
    pub fn json(code: u16, value: &serde_json::Value) -> Reply {
        Reply {
            status: code,
            body: Body::Bytes(value.to_string().into_bytes()),
            ..Reply::default()
        }
        .with_header("Content-Type", "application/json")
    }

    /// This reply with one more header.
    pub fn with_header(mut self, name: &str, value: &str) -> Reply {
        self.headers.push((name.to_string(), value.to_string()));
        self
    }
}

type Handler = dyn Fn(&Request) -> Reply + Send + Sync;

/// A running server; see the module doc.
pub struct HttpServer {
    addr: SocketAddr,
    scheme: &'static str,
    requests: Arc<Mutex<Vec<Request>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl HttpServer {
    /// Plain HTTP on 127.0.0.1, answering with `handler`.
    pub fn start(handler: impl Fn(&Request) -> Reply + Send + Sync + 'static) -> HttpServer {
        Self::start_inner(None, Arc::new(handler))
    }

    /// HTTPS on 127.0.0.1 with `tls` (its certificate must name IP 127.0.0.1), answering with
    /// `handler`.
    pub fn start_tls(
        tls: Arc<rustls::ServerConfig>,
        handler: impl Fn(&Request) -> Reply + Send + Sync + 'static,
    ) -> HttpServer {
        Self::start_inner(Some(tls), Arc::new(handler))
    }

    fn start_inner(tls: Option<Arc<rustls::ServerConfig>>, handler: Arc<Handler>) -> HttpServer {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("local addr");
        let scheme = if tls.is_some() { "https" } else { "http" };
        let requests: Arc<Mutex<Vec<Request>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (requests, stop) = (requests.clone(), stop.clone());
            std::thread::spawn(move || {
                for conn in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(tcp) = conn else { continue };
                    let (tls, handler, requests) = (tls.clone(), handler.clone(), requests.clone());
                    std::thread::spawn(move || {
                        // The client may hang up early (a refused download); that is its
                        // business, so write errors are not reported.
                        let _ = connection(tcp, tls, &*handler, &requests);
                    });
                }
            })
        };
        HttpServer {
            addr,
            scheme,
            requests,
            stop,
            thread: Some(thread),
        }
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// `http://127.0.0.1:<port>` (or `https://`), no trailing slash.
    pub fn base_url(&self) -> String {
        format!("{}://{}", self.scheme, self.addr)
    }

    /// The URL of `path` (which starts with `/`).
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base_url())
    }

    /// Every request so far, in the order they were read.
    pub fn requests(&self) -> Vec<Request> {
        lock(&self.requests).clone()
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accept loop so it sees the flag.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn connection(
    tcp: TcpStream,
    tls: Option<Arc<rustls::ServerConfig>>,
    handler: &Handler,
    requests: &Mutex<Vec<Request>>,
) -> std::io::Result<()> {
    tcp.set_read_timeout(Some(Duration::from_secs(10)))?;
    match tls {
        None => {
            let mut stream = &tcp;
            let result = exchange(&mut stream, handler, requests);
            let _ = tcp.shutdown(Shutdown::Both);
            result
        }
        Some(config) => {
            let conn = rustls::ServerConnection::new(config).map_err(std::io::Error::other)?;
            let mut stream = rustls::StreamOwned::new(conn, tcp);
            exchange(&mut stream, handler, requests)?;
            stream.conn.send_close_notify();
            stream.flush()
        }
    }
}

/// Reads one request head, records it, and writes the handler's answer.
fn exchange(
    stream: &mut (impl Read + Write),
    handler: &Handler,
    requests: &Mutex<Vec<Request>>,
) -> std::io::Result<()> {
    let Some(request) = read_head(stream)? else {
        return Ok(());
    };
    lock(requests).push(request.clone());
    let reply = handler(&request);
    std::thread::sleep(reply.delay);
    let mut file = None;
    let len = match &reply.body {
        Body::Empty => 0,
        Body::Bytes(b) => b.len() as u64,
        Body::File(p) => {
            let f = std::fs::File::open(p)?;
            let len = f.metadata()?.len();
            file = Some(f);
            len
        }
    };
    let mut head = format!(
        "HTTP/1.1 {} {}\r\nContent-Length: {}\r\nConnection: close\r\n",
        reply.status,
        reason(reply.status),
        reply.announced.unwrap_or(len)
    );
    for (k, v) in &reply.headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes())?;
    if request.method != "HEAD" {
        let mut body: Box<dyn Read> = match (&reply.body, file) {
            (Body::Bytes(b), _) => Box::new(&b[..]),
            (_, Some(f)) => Box::new(f),
            _ => Box::new(std::io::empty()),
        };
        if let Some((first, pause)) = reply.stall {
            std::io::copy(&mut (&mut body).take(first), stream)?;
            stream.flush()?;
            std::thread::sleep(pause);
        }
        std::io::copy(&mut body, stream)?;
    }
    stream.flush()
}

/// The request head up to its blank line, or `None` when the client closed first.
fn read_head(stream: &mut impl Read) -> std::io::Result<Option<Request>> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        if buf.len() > 64 * 1024 {
            return Err(std::io::Error::other("request head over 64 KiB"));
        }
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    let mut lines = head.split("\r\n");
    let mut first = lines.next().unwrap_or("").split_whitespace();
    let method = first.next().unwrap_or("").to_string();
    let target = first.next().unwrap_or("/").to_string();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    Ok(Some(Request {
        method,
        target,
        headers,
    }))
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        206 => "Partial Content",
        301 => "Moved Permanently",
        302 => "Found",
        307 => "Temporary Redirect",
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        _ => "Scripted",
    }
}
