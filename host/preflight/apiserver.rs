//! The cluster, as the node will meet it: `APIServerReachable` (a TCP connect to
//! `cluster.apiServer`), `CACertMatch` (an HTTPS `GET /version` trusting only
//! `cluster.caCertData`: the served chain verifies against the config's CA), `ClockSanity`
//! (this host's clock against the API server's `Date` header).
//!
//! One probe answers all three, bounded: [`CONNECT_TIMEOUT`] per address, [`REQUEST_TIMEOUT`]
//! for the request. No credential is sent: `/version` needs none, and any HTTP status proves the
//! TLS handshake, which is what the CA check is about.

use super::{Check, Context, Outcome};
use nodeward_node_config::NodeConfig;
use std::net::ToSocketAddrs;
use std::time::{Duration, SystemTime};

/// How long one TCP connect may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the HTTPS request may take, connect included.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest clock difference allowed: the cluster's signer backdates the certificates it
/// issues by 5 minutes, so a node further behind sees its new kubelet certificate as not yet
/// valid (and one further ahead is as wrong the other way).
pub(super) const MAX_SKEW: Duration = Duration::from_secs(300);

/// What the API server answered.
pub(super) struct Probe {
    /// The address that accepted a connection, or why none did.
    reach: Result<String, String>,
    /// The HTTPS answer (`None`: not reachable, not asked).
    tls: Option<Result<Answer, String>>,
}

/// A response over a verified TLS connection.
struct Answer {
    status: u16,
    /// The `Date` header, and this host's clock halfway through the request.
    date: Option<(String, SystemTime)>,
}

pub(super) fn checks() -> Vec<Check> {
    vec![
        Check::new("APIServerReachable", reachable),
        Check::new("CACertMatch", ca_match),
        Check::new("ClockSanity", clock),
    ]
}

/// Asks the API server once (see the module docs).
pub(super) fn probe(config: &NodeConfig) -> Probe {
    let api = config.cluster.api_server.trim_end_matches('/');
    let reach = connect(api);
    let tls = reach.is_ok().then(|| get_version(config, api));
    Probe { reach, tls }
}

fn connect(api: &str) -> Result<String, String> {
    let url = url::Url::parse(api).map_err(|e| format!("cluster.apiServer {api}: {e}"))?;
    let host = url
        .host_str()
        .ok_or_else(|| format!("cluster.apiServer {api}: no host"))?;
    let port = url.port_or_known_default().unwrap_or(443);
    let addrs = (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("API server {api}: cannot resolve {host}: {e}"))?;
    let mut last = format!("API server {api}: {host} resolves to no address");
    for a in addrs {
        match std::net::TcpStream::connect_timeout(&a, CONNECT_TIMEOUT) {
            Ok(_) => return Ok(a.to_string()),
            Err(e) => last = format!("API server {api} unreachable at {a}: {e}"),
        }
    }
    Err(last)
}

fn get_version(config: &NodeConfig, api: &str) -> Result<Answer, String> {
    let pem = config.ca_cert_pem().map_err(|e| e.to_string())?;
    let ca = reqwest::Certificate::from_pem(pem.as_bytes())
        .map_err(|e| format!("cluster.caCertData: {}", crate::errors::chain(&e)))?;
    let client = reqwest::blocking::Client::builder()
        .connect_timeout(CONNECT_TIMEOUT)
        .timeout(REQUEST_TIMEOUT)
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(ca)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| format!("an HTTPS client: {}", crate::errors::chain(&e)))?;
    let url = format!("{api}/version");
    let sent = SystemTime::now();
    let resp = client
        .get(&url)
        .send()
        .map_err(|e| format!("GET {url}: {}", crate::errors::chain(&e)))?;
    let received = SystemTime::now();
    // A clock stepped back during the request: the send time is as good as any.
    let midway = match received.duration_since(sent) {
        Ok(took) => sent + took / 2,
        Err(_) => sent,
    };
    let date = resp
        .headers()
        .get(reqwest::header::DATE)
        .and_then(|v| v.to_str().ok())
        .map(|d| (d.to_string(), midway));
    Ok(Answer {
        status: resp.status().as_u16(),
        date,
    })
}

fn reachable(ctx: &Context<'_>) -> Outcome {
    let api = &ctx.config.cluster.api_server;
    match &ctx.api().reach {
        Ok(addr) => Outcome::pass(format!("API server {api} accepts connections ({addr})")),
        Err(e) => Outcome::fail(format!(
            "{e}: the kubelet could not join; check cluster.apiServer, routes and firewalls"
        )),
    }
}

fn ca_match(ctx: &Context<'_>) -> Outcome {
    let api = &ctx.config.cluster.api_server;
    match &ctx.api().tls {
        None => Outcome::skip(format!("API server {api} unreachable")),
        Some(Ok(a)) => Outcome::pass(format!(
            "{api} serves a certificate chain that verifies against cluster.caCertData (GET /version: HTTP {})",
            a.status
        )),
        Some(Err(e)) => Outcome::fail(format!(
            "{e}: with cluster.caCertData as the only trusted CA, the API server's certificate does not verify; is caCertData this cluster's CA?"
        )),
    }
}

fn clock(ctx: &Context<'_>) -> Outcome {
    let api = &ctx.config.cluster.api_server;
    let (date, local) = match &ctx.api().tls {
        Some(Ok(Answer { date: Some(d), .. })) => d,
        Some(Ok(_)) => return Outcome::skip(format!("{api} sent no Date header")),
        _ => return Outcome::skip(format!("API server {api} could not be asked")),
    };
    let Some(server) = http_date(date) else {
        return Outcome::skip(format!(
            "{api} sent a Date header that is no HTTP date: {date:?}"
        ));
    };
    skew_outcome(api, *local, server)
}

/// The verdict on this host's clock reading `local` when the API server's read `server`.
pub(super) fn skew_outcome(api: &str, local: SystemTime, server: SystemTime) -> Outcome {
    let (skew, way) = match local.duration_since(server) {
        Ok(ahead) => (ahead, "ahead of"),
        Err(e) => (e.duration(), "behind"),
    };
    // The Date header has one-second resolution.
    let secs = skew.as_secs();
    if skew <= MAX_SKEW {
        Outcome::pass(format!(
            "this host's clock is within {}s of {api}'s",
            secs + 1
        ))
    } else {
        Outcome::fail(format!(
            "this host's clock is {secs}s {way} {api}'s (Date header; at most {}s): certificates and tokens the cluster issues would not be valid here; fix time synchronisation (e.g. `timedatectl set-ntp true`)",
            MAX_SKEW.as_secs()
        ))
    }
}

/// An HTTP date (`Wed, 02 Dec 2026 12:37:10 GMT`, RFC 9110's IMF-fixdate, the only form a
/// server may send).
pub(super) fn http_date(s: &str) -> Option<SystemTime> {
    let parts: Vec<&str> = s.split_whitespace().collect();
    let [_, day, month, year, time, "GMT"] = parts.as_slice() else {
        return None;
    };
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let m = MONTHS.iter().position(|x| x == month)? + 1;
    let digits = |t: &str, n: usize| t.len() == n && t.bytes().all(|b| b.is_ascii_digit());
    if !digits(day, 2) || !digits(year, 4) || time.len() != 8 {
        return None;
    }
    humantime::parse_rfc3339(&format!("{year}-{m:02}-{day}T{time}Z")).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::preflight::Status;

    #[test]
    fn http_dates_parse_and_anything_else_does_not() {
        let t = http_date("Wed, 02 Dec 2026 12:37:10 GMT").expect("an HTTP date");
        assert_eq!(
            t,
            humantime::parse_rfc3339("2026-12-02T12:37:10Z").expect("t")
        );
        for bad in [
            "Wednesday, 02-Dec-26 12:37:10 GMT",
            "Wed, 02 Dec 2026 12:37:10 UTC",
            "Wed, 2 Dec 2026 12:37:10 GMT",
            "Wed, 02 Dek 2026 12:37:10 GMT",
            "",
        ] {
            assert_eq!(http_date(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_clock_off_by_more_than_five_minutes_fails_either_way() {
        let server = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let ok = skew_outcome("https://a", server + MAX_SKEW, server);
        assert_eq!(ok.status, Status::Pass);
        let ahead = skew_outcome(
            "https://a",
            server + MAX_SKEW + Duration::from_secs(1),
            server,
        );
        assert_eq!(ahead.status, Status::Fail);
        assert!(
            ahead.message.contains("301s ahead of https://a's"),
            "{}",
            ahead.message
        );
        let behind = skew_outcome("https://a", server - Duration::from_secs(3600), server);
        assert!(
            behind.message.contains("3600s behind"),
            "{}",
            behind.message
        );
    }
}
