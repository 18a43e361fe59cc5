//! The health waits against stand-ins: timestamps, the health URL, a kubelet wait reusing its
//! client, an unreachable API server named.

use super::*;

#[test]
fn kubernetes_timestamps_parse_to_unix_seconds() {
    assert_eq!(unix_seconds("1970-01-01T00:00:00Z"), Some(0));
    assert_eq!(unix_seconds("2000-03-01T00:00:00Z"), Some(951_868_800));
    assert_eq!(unix_seconds("2026-12-01T06:03:38Z"), Some(1_796_105_018));
    assert_eq!(unix_seconds("2026-12-01T06:03:38.5Z"), None);
    assert_eq!(unix_seconds("yesterday"), None);
}

#[test]
fn healthz_url_follows_the_kubelet_config_patch() {
    let mut c = crate::config::load(None).expect("config");
    assert_eq!(healthz_url(&c), "http://127.0.0.1:10248/healthz");
    c.kubelet.config.insert("healthzPort".into(), 4321.into());
    assert_eq!(healthz_url(&c), "http://127.0.0.1:4321/healthz");
}

/// A kubelet stand-in on loopback that answers `not yet` to the first `not_yet` requests
/// and `ok` after, keeping connections alive; returns its port and the number of
/// connections it accepted (counted when the wait is over).
fn keepalive_healthz(not_yet: usize) -> (u16, std::thread::JoinHandle<usize>) {
    use std::io::{BufRead as _, BufReader, Write as _};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let server = std::thread::spawn(move || {
        let (mut answered, mut connections) = (0, 0);
        while answered <= not_yet {
            let Ok((stream, _)) = listener.accept() else {
                break;
            };
            connections += 1;
            let mut reader = BufReader::new(stream);
            loop {
                // One request: its head up to the empty line (a GET has no body).
                let mut line = String::new();
                let mut ended = false;
                while reader.read_line(&mut line).unwrap_or(0) > 0 {
                    if line == "\r\n" {
                        ended = true;
                        break;
                    }
                    line.clear();
                }
                if !ended {
                    break;
                }
                let (status, body) = if answered < not_yet {
                    ("500 Internal Server Error", "not yet")
                } else {
                    ("200 OK", "ok")
                };
                answered += 1;
                let reply = format!(
                    "HTTP/1.1 {status}\r\ncontent-length: {}\r\n\r\n{body}",
                    body.len()
                );
                if reader.get_mut().write_all(reply.as_bytes()).is_err() || answered > not_yet {
                    break;
                }
            }
        }
        connections
    });
    (port, server)
}

#[test]
fn a_kubelet_wait_reuses_one_client_and_its_connection() {
    let (port, server) = keepalive_healthz(5);
    let mut c = crate::config::load(None).expect("config");
    c.kubelet.config.insert("healthzPort".into(), port.into());
    wait_kubelet(&c, Duration::from_secs(60)).expect("healthy after five looks");
    let connections = server.join().expect("server thread");
    // A client per look would open a connection per look (six); one client keeps one.
    assert_eq!(connections, 1, "six looks over one kept-alive connection");
}

#[test]
fn unreachable_api_server_is_named_in_the_timeout() {
    let mut c = crate::config::load(None).expect("config");
    // A port nothing listens on: bind one, then close it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a port");
    c.cluster.api_server = format!("https://127.0.0.1:{port}");
    let root = tempfile::tempdir().expect("root");
    let layout = Layout {
        root: root.path().display().to_string(),
        ..Layout::default()
    };
    let err = wait_tls_bootstrap(&c, &layout, Duration::from_millis(300)).expect_err("no kubelet");
    let msg = err.to_string();
    assert!(
        msg.contains("TLS bootstrap")
            && msg.contains(&format!("https://127.0.0.1:{port} unreachable")),
        "{msg}"
    );
}

/// Something else on the kubelet's health port answering with an endless 200 body: one look
/// reads at most [`HEALTH_BODY_MAX`] bytes of it and reports the (cut) answer as not `ok`.
#[test]
fn an_endless_health_body_is_read_only_up_to_its_cap() {
    use std::io::{BufRead as _, BufReader, Write as _};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let server = std::thread::spawn(move || {
        let Ok((stream, _)) = listener.accept() else {
            return 0u64;
        };
        let mut reader = BufReader::new(stream);
        let mut line = String::new();
        while reader.read_line(&mut line).unwrap_or(0) > 0 && line != "\r\n" {
            line.clear();
        }
        let out = reader.get_mut();
        let mut sent = 0u64;
        // `ok` and spaces first: a body judged on its first 4 KiB alone would pass.
        let head = format!("HTTP/1.1 200 OK\r\n\r\nok{}", " ".repeat(8192));
        if out.write_all(head.as_bytes()).is_ok() {
            // 1 GiB unless the reader hangs up first.
            let chunk = [b'x'; 64 << 10];
            while sent < 1 << 30 && out.write_all(&chunk).is_ok() {
                sent += chunk.len() as u64;
            }
        }
        sent
    });
    let url = format!("http://127.0.0.1:{port}/healthz");
    let client = health_client().expect("client");
    match kubelet_healthy_with(&client, &url) {
        Err(NotYet::Unhealthy { body, .. }) => {
            assert_eq!(body, "ok … (longer than 4096 bytes)", "the cut body")
        }
        other => panic!("expected a cut, unhealthy answer: {other:?}"),
    }
    drop(client);
    let sent = server.join().expect("server thread");
    assert!(
        sent < 1 << 30,
        "the agent hung up instead of reading 1 GiB ({sent} sent)"
    );
}
