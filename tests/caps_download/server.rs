//! The scripted server the download tests talk to: each path has a queue of replies, popped one
//! per request, whose last reply repeats; unknown paths get 404; requests are counted per path.
//!
//! It is the tests' one HTTP server (`tests/common/http.rs`) with a scripting handler. That
//! server exists because the failure cases need one that misbehaves on cue: announce a
//! Content-Length and close after a shorter body ([`Reply::announced`]), stall past a deadline
//! ([`Reply::delay`]), answer 5xx a set number of times (a queue). Every connection is closed
//! after one answer.

pub use crate::common::http::Reply;
use crate::common::http::{HttpServer, Request};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

/// 200 with `body`.
pub fn ok(body: &[u8]) -> Reply {
    Reply::ok(body)
}

/// `code` with the body `status <code>\n`.
pub fn status(code: u16) -> Reply {
    Reply {
        body: crate::common::http::Body::Bytes(format!("status {code}\n").into_bytes()),
        ..Reply::empty(code)
    }
}

/// 302 to `to`.
pub fn redirect(to: &str) -> Reply {
    Reply::redirect(to)
}

type Routes = Arc<Mutex<HashMap<String, VecDeque<Reply>>>>;

/// Serves scripted replies (see the module doc).
pub struct Server {
    routes: Routes,
    http: HttpServer,
}

impl Server {
    pub fn start() -> Server {
        let routes: Routes = Arc::default();
        let http = {
            let routes = routes.clone();
            HttpServer::start(move |req| next_reply(req, &routes))
        };
        Server { routes, http }
    }

    /// The same over HTTPS with `tls` (a [`crate::common::tls::TestCa`]'s server).
    pub fn start_tls(tls: Arc<rustls::ServerConfig>) -> Server {
        let routes: Routes = Arc::default();
        let http = {
            let routes = routes.clone();
            HttpServer::start_tls(tls, move |req| next_reply(req, &routes))
        };
        Server { routes, http }
    }

    pub fn url(&self, path: &str) -> String {
        self.http.url(path)
    }

    /// From now on `path` answers with `replies` in order, the last one repeating.
    pub fn script(&self, path: &str, replies: Vec<Reply>) {
        self.routes
            .lock()
            .expect("routes")
            .insert(path.into(), replies.into());
    }

    /// Requests for `path` so far.
    pub fn hits(&self, path: &str) -> usize {
        self.http
            .requests()
            .iter()
            .filter(|r| r.target == path)
            .count()
    }

    /// Requests so far, any path.
    pub fn total_hits(&self) -> usize {
        self.http.requests().len()
    }
}

fn next_reply(req: &Request, routes: &Routes) -> Reply {
    let mut routes = routes.lock().expect("routes");
    match routes.get_mut(&req.target) {
        Some(q) if q.len() > 1 => q.pop_front().unwrap_or_default(),
        Some(q) => q.front().cloned().unwrap_or_default(),
        None => status(404),
    }
}
