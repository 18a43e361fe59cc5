//! The network half of [`super`]: the token, the manifest and the archive layer, on one
//! current-thread runtime, within one deadline.
//!
//! Every request is made here with one reqwest client, not by oci-client: oci-client follows
//! a token service's realm wherever it points (plain HTTP, any host, through redirects),
//! echoes error bodies into its errors and reads them without a limit, and its blob client
//! follows any redirect. A registry (or whoever writes a Machine's spec) is not trusted with
//! this process's memory, with requests to other addresses, or with what the status shows:
//! - every request and redirect stays on HTTPS, or on the loopback registry itself when the
//!   reference names one ([`allowed`]);
//! - the token service is asked without redirects and read up to [`MAX_TOKEN_BYTES`];
//! - an answer that is not a success is reported by its status only, never its body, and
//!   errors carry no URL (a redirect's query string may be a signed token);
//! - HTTPS trusts what artifact downloads trust ([`Trust`]: the system store, plus the node
//!   config's `downloadOptions.caFile`), never reqwest's or the platform verifier's own roots;
//!   a refused certificate is said to be one, with where its CA must be.

use super::{MAX_BUNDLE_BYTES, MAX_MANIFEST_BYTES, OciError, OciReference, archive_layer};
use crate::caps::download::Trust;
use crate::digest::Sha256Hex;
use oci_client::manifest::{OCI_IMAGE_MEDIA_TYPE, OciDescriptor};
use oci_reqwest as http;
use sha2::{Digest as _, Sha256};
use std::time::Duration;

/// What the registry is told it is talking to.
const USER_AGENT: &str = concat!("nodeward/", env!("CARGO_PKG_VERSION"));
/// The most of a token service's answer read.
pub const MAX_TOKEN_BYTES: u64 = 64 * 1024;
/// The most redirects one request follows.
const MAX_REDIRECTS: usize = 5;

/// Pulls the archive layer of `reference`, pinned by `pin`, within `timeout`, over HTTPS
/// trusting `trust`: its bytes, which hash to the pin (see the module docs of [`super`]).
pub fn pull(
    reference: &OciReference,
    pin: &Sha256Hex,
    timeout: Duration,
    trust: &Trust,
) -> Result<Vec<u8>, OciError> {
    // reqwest is built without a crypto provider of its own: ring, as the rest of the agent.
    // Already installed is fine (the same one, or the process chose one before).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| client_err(reference, e.into()))?;
    let result = runtime.block_on(async {
        match tokio::time::timeout(timeout, pull_async(reference, pin, timeout, trust)).await {
            Ok(result) => result,
            Err(_) => Err(OciError::TimedOut {
                reference: reference.to_string(),
                secs: timeout.as_secs(),
            }),
        }
    });
    // A resolver thread still blocked must not hold the timeout up.
    runtime.shutdown_timeout(Duration::ZERO);
    result
}

fn client_err(
    reference: &OciReference,
    source: Box<dyn std::error::Error + Send + Sync>,
) -> OciError {
    OciError::Client {
        reference: reference.to_string(),
        source,
    }
}

/// A client with `redirect` that trusts `trust` (see the module doc).
fn client(
    reference: &OciReference,
    trust: &Trust,
    timeout: Duration,
    redirect: http::redirect::Policy,
) -> Result<http::Client, OciError> {
    let builder = http::Client::builder()
        .user_agent(USER_AGENT)
        .connect_timeout(timeout)
        .redirect(redirect);
    trust
        .configure_registry(builder)
        .and_then(http::ClientBuilder::build)
        .map_err(|e| client_err(reference, e.into()))
}

/// Where one registry's requests may go: `scheme`, and `registry` (`host[:port]`) for plain HTTP.
#[derive(Clone)]
struct Registry {
    /// `host[:port]` as the reference names it.
    host_port: String,
    /// Plain HTTP to it (a loopback registry).
    plain_http: bool,
}

impl Registry {
    fn base(&self) -> String {
        let scheme = if self.plain_http { "http" } else { "https" };
        format!("{scheme}://{}", self.host_port)
    }
}

/// Whether a request (or a redirect) to `url` is allowed: HTTPS anywhere, or plain HTTP to the
/// loopback registry itself (same host and port), and nothing else.
fn allowed(url: &http::Url, registry: &Registry) -> bool {
    match url.scheme() {
        "https" => true,
        "http" if registry.plain_http => {
            let host_port = match (url.host_str(), url.port()) {
                (Some(h), Some(p)) => format!("{h}:{p}"),
                (Some(h), None) => h.to_string(),
                (None, _) => return false,
            };
            host_port == registry.host_port
        }
        _ => false,
    }
}

async fn pull_async(
    reference: &OciReference,
    pin: &Sha256Hex,
    timeout: Duration,
    trust: &Trust,
) -> Result<Vec<u8>, OciError> {
    let r = reference.reference();
    let registry = Registry {
        host_port: r.resolve_registry().to_string(),
        plain_http: reference.plain_http(),
    };
    let policy_registry = registry.clone();
    let policy = http::redirect::Policy::custom(move |attempt| {
        if attempt.previous().len() >= MAX_REDIRECTS {
            attempt.error("more than 5 redirects")
        } else if allowed(attempt.url(), &policy_registry) {
            attempt.follow()
        } else {
            attempt.error("a redirect off HTTPS (other than back to the loopback registry)")
        }
    });
    let client = client(reference, trust, timeout, policy)?;
    let manifest_url = format!(
        "{}/v2/{}/manifests/{}",
        registry.base(),
        r.repository(),
        r.digest().or(r.tag()).unwrap_or_default(),
    );
    let what = "the manifest";
    let first = send(reference, what, client.get(&manifest_url), None).await?;
    let (response, token) = if first.status() == http::StatusCode::UNAUTHORIZED {
        let token = token(reference, &registry, &first, timeout, trust).await?;
        let again = send(reference, what, client.get(&manifest_url), Some(&token)).await?;
        (again, Some(token))
    } else {
        (first, None)
    };
    let bytes = read_capped(reference, what, response, MAX_MANIFEST_BYTES)
        .await?
        .ok_or_else(|| OciError::ManifestTooLarge {
            reference: reference.to_string(),
        })?;
    let layer = archive_layer(reference, &bytes, pin)?;
    let blob_url = format!(
        "{}/v2/{}/blobs/{}",
        registry.base(),
        r.repository(),
        layer.digest
    );
    let response = send(
        reference,
        "the archive layer",
        client.get(&blob_url),
        token.as_deref(),
    )
    .await?;
    archive(reference, &layer, pin, response).await
}

/// Sends `request` (with `token` as a bearer token); a transport error without its URL.
/// Statuses are the caller's: a 401 may be a token challenge.
async fn send(
    reference: &OciReference,
    what: &'static str,
    request: http::RequestBuilder,
    token: Option<&str>,
) -> Result<http::Response, OciError> {
    let request = match token {
        Some(t) => request.bearer_auth(t),
        None => request,
    };
    let request = request.header(http::header::ACCEPT, OCI_IMAGE_MEDIA_TYPE);
    request
        .send()
        .await
        .map_err(|e| request_err(reference, what, e))
}

/// `url` without its query and fragment: what an error may show of a URL.
fn shown(url: &http::Url) -> String {
    let mut url = url.clone();
    url.set_query(None);
    url.set_fragment(None);
    url.to_string()
}

/// `e` and its causes, without the URL (a redirect's may hold a signed token).
fn request_err(reference: &OciReference, what: &'static str, e: http::Error) -> OciError {
    // The URL first asked for, which is ours (no query); never where a redirect went.
    let first = e.url().map(shown);
    let e = e.without_url();
    let prefix = first.map(|url| format!("{url}: ")).unwrap_or_default();
    // A refused certificate is said plainly, with where its CA goes (as a download's is); the
    // server may be the registry or one it redirected to, whose URL is not shown.
    let causes = match crate::caps::download::certificate_refused(&e) {
        Some(reason) => format!(
            "{prefix}the server's TLS certificate is not trusted ({reason}); its CA must be in \
             the system trust store or in the node config's downloadOptions.caFile"
        ),
        None => {
            let mut causes = format!("{prefix}{e}");
            let mut source = std::error::Error::source(&e);
            while let Some(cause) = source {
                causes.push_str(&format!(": {cause}"));
                source = cause.source();
            }
            causes
        }
    };
    OciError::Request {
        reference: reference.to_string(),
        what,
        causes,
        source: Box::new(e),
    }
}

/// `response`'s body, at most `cap` bytes (`None` past it); a status that is not a success is
/// an error naming the status only.
async fn read_capped(
    reference: &OciReference,
    what: &'static str,
    mut response: http::Response,
    cap: u64,
) -> Result<Option<Vec<u8>>, OciError> {
    if !response.status().is_success() {
        return Err(OciError::Status {
            reference: reference.to_string(),
            what,
            status: response.status().as_u16(),
        });
    }
    if response.content_length().is_some_and(|n| n > cap) {
        return Ok(None);
    }
    let mut bytes = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| request_err(reference, what, e))?
    {
        if (bytes.len() + chunk.len()) as u64 > cap {
            return Ok(None);
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(Some(bytes))
}

/// The anonymous token the registry's challenge in `unauthorized` asks for: from an HTTPS
/// token service (or the loopback registry), without redirects, its answer read up to
/// [`MAX_TOKEN_BYTES`] and never shown.
async fn token(
    reference: &OciReference,
    registry: &Registry,
    unauthorized: &http::Response,
    timeout: Duration,
    trust: &Trust,
) -> Result<String, OciError> {
    let refuse = |problem: String| OciError::Token {
        reference: reference.to_string(),
        problem,
    };
    let header = unauthorized
        .headers()
        .get(http::header::WWW_AUTHENTICATE)
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| {
            refuse("401 without a Bearer challenge (credentials are not supported)".into())
        })?;
    let challenge = Challenge::parse(header).ok_or_else(|| {
        refuse("401 without a Bearer challenge (credentials are not supported)".into())
    })?;
    let mut realm =
        http::Url::parse(&challenge.realm).map_err(|_| refuse("its realm is not a URL".into()))?;
    if !allowed(&realm, registry) {
        return Err(refuse(format!(
            "its token service must be HTTPS (or the loopback registry itself), not {}://{}",
            realm.scheme(),
            realm.host_str().unwrap_or("?")
        )));
    }
    let scope = challenge
        .scope
        .unwrap_or_else(|| format!("repository:{}:pull", reference.reference().repository()));
    {
        let mut query = realm.query_pairs_mut();
        if let Some(service) = &challenge.service {
            query.append_pair("service", service);
        }
        query.append_pair("scope", &scope);
    }
    let client = client(reference, trust, timeout, http::redirect::Policy::none())?;
    let what = "the token service";
    let response = client
        .get(realm)
        .send()
        .await
        .map_err(|e| request_err(reference, what, e))?;
    let body = read_capped(reference, what, response, MAX_TOKEN_BYTES)
        .await?
        .ok_or_else(|| refuse(format!("its answer is larger than {MAX_TOKEN_BYTES} bytes")))?;
    #[derive(serde::Deserialize)]
    struct Answer {
        token: Option<String>,
        access_token: Option<String>,
    }
    let answer: Answer = serde_json::from_slice(&body)
        .map_err(|_| refuse("its answer is not a token document".into()))?;
    answer
        .token
        .or(answer.access_token)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| refuse("its answer holds no token".into()))
}

/// A `Bearer` challenge's parameters (RFC 6750 §3; Docker's token authentication).
#[derive(Debug, PartialEq, Eq)]
struct Challenge {
    realm: String,
    service: Option<String>,
    scope: Option<String>,
}

impl Challenge {
    /// `Bearer realm="…",service="…",scope="…"`; `None` for another scheme or no realm.
    fn parse(header: &str) -> Option<Challenge> {
        let (scheme, params) = header.trim().split_once(' ')?;
        if !scheme.eq_ignore_ascii_case("bearer") {
            return None;
        }
        let (mut realm, mut service, mut scope) = (None, None, None);
        let mut rest = params.trim();
        while !rest.is_empty() {
            let (key, after) = rest.split_once('=')?;
            let after = after.trim_start();
            let (value, next) = match after.strip_prefix('"') {
                Some(quoted) => {
                    let end = quoted.find('"')?;
                    (&quoted[..end], &quoted[end + 1..])
                }
                None => match after.find(',') {
                    Some(end) => (&after[..end], &after[end..]),
                    None => (after, ""),
                },
            };
            match key.trim().to_ascii_lowercase().as_str() {
                "realm" => realm = Some(value.to_string()),
                "service" => service = Some(value.to_string()),
                "scope" => scope = Some(value.to_string()),
                _ => {}
            }
            rest = next.trim_start().trim_start_matches(',').trim_start();
        }
        Some(Challenge {
            realm: realm?,
            service,
            scope,
        })
    }
}

/// The archive layer's bytes from `response`: counted against its declared size (at most
/// [`MAX_BUNDLE_BYTES`], checked by [`archive_layer`]) and hashed as they stream.
async fn archive(
    reference: &OciReference,
    layer: &OciDescriptor,
    pin: &Sha256Hex,
    mut response: http::Response,
) -> Result<Vec<u8>, OciError> {
    let what = "the archive layer";
    if !response.status().is_success() {
        return Err(OciError::Status {
            reference: reference.to_string(),
            what,
            status: response.status().as_u16(),
        });
    }
    let declared = u64::try_from(layer.size)
        .unwrap_or(u64::MAX)
        .min(MAX_BUNDLE_BYTES);
    let length_err = |actual: u64| OciError::LayerLength {
        reference: reference.to_string(),
        declared,
        actual,
    };
    if let Some(n) = response.content_length().filter(|n| *n > declared) {
        return Err(length_err(n));
    }
    // `declared` is at most MAX_BUNDLE_BYTES (64 MiB), so this fits.
    let mut bytes = Vec::with_capacity(declared as usize);
    let mut hasher = Sha256::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| request_err(reference, what, e))?
    {
        let read = (bytes.len() + chunk.len()) as u64;
        if read > declared {
            return Err(length_err(read));
        }
        hasher.update(&chunk);
        bytes.extend_from_slice(&chunk);
    }
    if bytes.len() as u64 != declared {
        return Err(length_err(bytes.len() as u64));
    }
    let actual = hex::encode(hasher.finalize());
    if actual != pin.as_str() {
        return Err(OciError::LayerBytes {
            reference: reference.to_string(),
            expected: pin.to_string(),
            actual,
        });
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bearer_challenge_is_parsed_and_other_schemes_are_not() {
        assert_eq!(
            Challenge::parse(
                r#"Bearer realm="https://auth.example/token",service="registry.example",scope="repository:acme/b:pull""#
            ),
            Some(Challenge {
                realm: "https://auth.example/token".into(),
                service: Some("registry.example".into()),
                scope: Some("repository:acme/b:pull".into()),
            })
        );
        assert_eq!(
            Challenge::parse(r#"bearer realm="https://r.example/t""#).map(|c| c.realm),
            Some("https://r.example/t".into())
        );
        assert_eq!(Challenge::parse(r#"Basic realm="registry""#), None);
        assert_eq!(Challenge::parse(r#"Bearer service="x""#), None);
        assert_eq!(Challenge::parse(r#"Bearer realm="unterminated"#), None);
    }

    #[test]
    fn requests_stay_on_https_or_the_loopback_registry_itself() {
        let remote = Registry {
            host_port: "registry.example".into(),
            plain_http: false,
        };
        let local = Registry {
            host_port: "127.0.0.1:5000".into(),
            plain_http: true,
        };
        let url = |s: &str| http::Url::parse(s).expect("url");
        assert!(allowed(&url("https://auth.example/token"), &remote));
        assert!(allowed(&url("https://10.0.0.1/internal"), &local));
        assert!(!allowed(&url("http://registry.example/v2/"), &remote));
        assert!(!allowed(&url("http://127.0.0.1:5000/token"), &remote));
        assert!(!allowed(&url("http://169.254.169.254/latest"), &local));
        assert!(!allowed(&url("http://127.0.0.1:10255/pods"), &local));
        assert!(!allowed(&url("http://localhost:5000/token"), &local));
        assert!(allowed(&url("http://127.0.0.1:5000/token"), &local));
        assert!(!allowed(&url("ftp://127.0.0.1:5000/x"), &local));
    }
}
