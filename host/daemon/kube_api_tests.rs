//! The unit tests of [`super`]: what an answer means, the watch jitter, and each request
//! against a real HTTP server on loopback (one attempt, bounded as a whole).

use super::*;

fn status(code: u16, reason: &str) -> kube::Error {
    kube::Error::Api(Box::new(kube::core::Status {
        code,
        reason: reason.into(),
        message: format!("{reason} happened"),
        ..Default::default()
    }))
}

#[test]
fn a_conflict_is_retried_and_other_answers_are_refusals_naming_the_server_message() {
    assert_eq!(classify(status(409, "Conflict")), ApiError::Conflict);
    assert!(matches!(
        classify(status(401, "Unauthorized")),
        ApiError::Unauthorized(_)
    ));
    assert_eq!(
        classify(status(403, "Forbidden")),
        ApiError::Refused("403 Forbidden: Forbidden happened".into())
    );
    // The server asking for time is backed off from, never dropped as a refusal.
    for (code, reason) in [
        (429, "TooManyRequests"),
        (503, "ServiceUnavailable"),
        (504, "GatewayTimeout"),
    ] {
        assert_eq!(
            classify(status(code, reason)),
            ApiError::Unreachable(format!("{code} {reason}: {reason} happened"))
        );
    }
}

const WATCH: &str = "/apis/nodeward.io/v1alpha1/machines?&watch=true&timeoutSeconds=290&fieldSelector=metadata.name%3Dw1&allowWatchBookmarks=true&resourceVersion=17";

fn uri(s: &str) -> http::Uri {
    s.parse().expect("a URI")
}

#[test]
fn a_watch_timeout_is_shortened_to_between_three_quarters_and_all_of_itself() {
    let at = |unit: f64| {
        jittered_watch_uri(&uri(WATCH), unit)
            .map(|u| u.to_string())
            .unwrap_or_default()
    };
    let with = |t: u32| WATCH.replace("timeoutSeconds=290", &format!("timeoutSeconds={t}"));
    assert_eq!(at(0.0), with(290));
    assert_eq!(at(0.5), with(254));
    assert_eq!(at(0.9999), with(219));
    // Out-of-range draws are clamped: never above T, never below T − T/4.
    assert_eq!(at(f64::NAN), with(290));
    assert_eq!(at(-3.0), with(290));
    assert_eq!(at(7.0), with(218));
    // The scheme and authority (when the URI has them) stay.
    let absolute = format!("https://127.0.0.1:6443{WATCH}");
    let stretched = jittered_watch_uri(&uri(&absolute), 0.5).map(|u| u.to_string());
    assert_eq!(
        stretched,
        Some(format!("https://127.0.0.1:6443{}", with(254)))
    );
}

#[test]
fn requests_that_are_not_watches_with_a_timeout_go_out_as_they_are() {
    for other in [
        "/apis/nodeward.io/v1alpha1/machines?&fieldSelector=metadata.name%3Dw1",
        "/apis/nodeward.io/v1alpha1/machines/w1",
        "/apis/nodeward.io/v1alpha1/machines?&watch=true&resourceVersion=17",
        "/apis/nodeward.io/v1alpha1/machines?&watch=false&timeoutSeconds=290",
        "/apis/nodeward.io/v1alpha1/machines?&watch=true&timeoutSeconds=soon",
    ] {
        assert_eq!(jittered_watch_uri(&uri(other), 0.5), None, "{other}");
    }
}

/// A plain-HTTP server on loopback that sends each request line to the test and answers
/// with `answer`, on a thread of its own per connection.
fn server(
    answer: fn(&std::net::TcpStream),
) -> (std::net::SocketAddr, std::sync::mpsc::Receiver<String>) {
    use std::io::BufRead as _;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("address");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let tx = tx.clone();
            std::thread::spawn(move || {
                let mut reader = std::io::BufReader::new(&conn);
                let mut head = Vec::new();
                loop {
                    let mut line = String::new();
                    match reader.read_line(&mut line) {
                        Ok(0) | Err(_) => break,
                        Ok(_) if line == "\r\n" => break,
                        Ok(_) => head.push(line),
                    }
                }
                if let Some(first) = head.first() {
                    let _ = tx.send(first.trim_end().to_string());
                }
                answer(&conn);
            });
        }
    });
    (addr, rx)
}

/// Writes `bytes` to `conn`, ignoring a client that has gone.
fn say(mut conn: &std::net::TcpStream, bytes: &[u8]) {
    use std::io::Write as _;
    let _ = conn.write_all(bytes);
}

/// A server that answers every request with an empty 200.
fn recording_server() -> (std::net::SocketAddr, std::sync::mpsc::Receiver<String>) {
    server(|conn| {
        say(
            conn,
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
        )
    })
}

/// A kubeconfig in `dir` naming the plain-HTTP server at `addr`, without credentials.
fn kubeconfig_for(dir: &Path, addr: std::net::SocketAddr) -> PathBuf {
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://{addr}\nusers:\n- name: u\n  user: {{}}\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n"
        ),
    )
    .expect("kubeconfig");
    kubeconfig
}

/// The daemon's API over the server at `addr`, as `watch::run` makes it.
async fn api_on(dir: &Path, addr: std::net::SocketAddr) -> KubeApi {
    let (requests, watches) = clients(&kubeconfig_for(dir, addr)).await.expect("clients");
    KubeApi::new(requests, watches)
}

/// A `Status` answer with `code`, `reason` and `extra` header lines.
fn status_answer(code: u16, reason: &str, extra: &str) -> Vec<u8> {
    let body = format!(
        r#"{{"kind":"Status","apiVersion":"v1","metadata":{{}},"status":"Failure","message":"{reason} (test server)","reason":"{reason}","code":{code}}}"#
    );
    format!(
        "HTTP/1.1 {code} {reason}\r\ncontent-type: application/json\r\n{extra}content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Every request line the server received so far.
fn received(requests: &std::sync::mpsc::Receiver<String>) -> Vec<String> {
    requests.try_iter().collect()
}

#[tokio::test]
async fn a_throttling_server_is_asked_once_per_request_and_backed_off_from() {
    // kube's client would retry each of these up to 15 times, as long as `Retry-After` says.
    let answers: [fn(&std::net::TcpStream); 3] = [
        |c| {
            say(
                c,
                &status_answer(429, "TooManyRequests", "retry-after: 30\r\n"),
            )
        },
        |c| {
            say(
                c,
                &status_answer(503, "ServiceUnavailable", "retry-after: 30\r\n"),
            )
        },
        |c| say(c, &status_answer(504, "GatewayTimeout", "")),
    ];
    for (answer, code) in answers.into_iter().zip(["429", "503", "504"]) {
        let (addr, requests) = server(answer);
        let dir = tempfile::tempdir().expect("tempdir");
        let api = api_on(dir.path(), addr).await;
        let e = api.operation("op-1").await.expect_err("throttled");
        let ApiError::Unreachable(message) = &e else {
            panic!("{code}: not backed off from: {e:?}");
        };
        assert!(
            message.starts_with("get MachineOperation op-1: ") && message.contains(code),
            "{message}"
        );
        let mut op = MachineOperation::new(
            "op-1",
            nodeward_api::operation::MachineOperationSpec {
                machine_ref: nodeward_api::operation::MachineRef { name: "w1".into() },
                kind: nodeward_api::operation::OperationKind::NodeReboot,
                ttl_seconds_after_finished: None,
            },
        );
        op.metadata.resource_version = Some("1".into());
        let e = api
            .replace_operation_status(&op)
            .await
            .expect_err("throttled");
        assert!(
            e.to_string()
                .contains("replace the status of MachineOperation op-1: "),
            "{e}"
        );
        // One attempt each: the server saw the GET and the PUT, nothing more.
        let seen = received(&requests);
        assert_eq!(seen.len(), 2, "{code}: {seen:?}");
        assert!(seen[0].starts_with("GET /apis/nodeward.io/v1alpha1/machineoperations/op-1"));
        assert!(
            seen[1].starts_with("PUT /apis/nodeward.io/v1alpha1/machineoperations/op-1/status")
        );
    }
}

#[tokio::test]
async fn a_request_is_bounded_as_a_whole_even_when_the_server_trickles() {
    // Headers at once, then one byte of the body every 100 ms, forever: no read ever waits
    // long, so only a bound on the whole request ends it.
    let (addr, requests) = server(|conn| {
        say(
            conn,
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n",
        );
        loop {
            say(conn, b"1\r\n \r\n");
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    });
    let dir = tempfile::tempdir().expect("tempdir");
    let mut api = api_on(dir.path(), addr).await;
    api.bound = Duration::from_millis(500);
    let e = api.machine("w1").await.expect_err("never answered");
    assert_eq!(
        e,
        ApiError::Unreachable("get Machine w1: no answer within 0.5 s".into())
    );
    assert_eq!(received(&requests).len(), 1);
}

#[tokio::test]
async fn other_refusals_name_the_request_and_the_server_message() {
    let (addr, _requests) = server(|c| say(c, &status_answer(403, "Forbidden", "")));
    let dir = tempfile::tempdir().expect("tempdir");
    let api = api_on(dir.path(), addr).await;
    let e = api
        .config_map("nodeward-system", "cfg")
        .await
        .expect_err("refused");
    assert_eq!(
        e,
        ApiError::Refused(
            "get ConfigMap nodeward-system/cfg: 403 Forbidden: Forbidden (test server)".into()
        )
    );
}

#[tokio::test]
async fn the_watch_client_gives_each_watch_its_own_drawn_timeout() {
    let (addr, requests) = recording_server();
    let dir = tempfile::tempdir().expect("tempdir");
    let (plain, watches) = clients(&kubeconfig_for(dir.path(), addr))
        .await
        .expect("clients");
    let api = KubeApi::new(plain.clone(), watches);
    let params = kube::api::WatchParams::default().timeout(WATCH_SECONDS);
    let timeout_of = |line: String| -> u32 {
        let t = line
            .split(['?', '&', ' '])
            .find_map(|pair| pair.strip_prefix("timeoutSeconds="))
            .and_then(|t| t.parse().ok());
        t.unwrap_or_else(|| panic!("no timeoutSeconds in {line}"))
    };
    let mut drawn = Vec::new();
    for _ in 0..12 {
        let watch = api.watch_machines().watch(&params, "0").await;
        assert!(watch.is_ok(), "the watch request failed");
        drawn.push(timeout_of(requests.recv().expect("a request line")));
    }
    assert!(
        drawn
            .iter()
            .all(|t| (WATCH_SECONDS - WATCH_SECONDS / 4..=WATCH_SECONDS).contains(t)),
        "{drawn:?}"
    );
    // Drawn anew per watch: twelve equal draws of 73 values would be a fixed timeout.
    assert!(drawn.iter().any(|t| *t != drawn[0]), "{drawn:?}");
    // The request client leaves a watch's timeout as asked.
    let plain: Api<Machine> = Api::all(plain);
    assert!(plain.watch(&params, "0").await.is_ok());
    assert_eq!(
        timeout_of(requests.recv().expect("a request line")),
        WATCH_SECONDS
    );
}

#[tokio::test]
async fn a_missing_kubeconfig_is_an_error_naming_its_path() {
    let e = clients(Path::new("/nonexistent/nodeward/kubeconfig"))
        .await
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(e.contains("/nonexistent/nodeward/kubeconfig"), "{e}");
}
