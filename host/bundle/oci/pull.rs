//! The network half of [`super`]: the token, the manifest and the archive layer, on one
//! current-thread runtime, within one deadline.
//!
//! oci-client answers the registry's token challenge and streams the layer (its client follows
//! the registry's redirects, as blob downloads need: the bytes are pinned). The manifest is
//! requested here, with the same reqwest and the token oci-client obtained, because
//! oci-client reads a manifest body whole, without a limit, and a registry is not trusted
//! with this process's memory.

use super::{MAX_BUNDLE_BYTES, MAX_MANIFEST_BYTES, OciError, OciReference, archive_layer};
use crate::digest::Sha256Hex;
use futures_lite::StreamExt as _;
use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::manifest::{OCI_IMAGE_MEDIA_TYPE, OciDescriptor};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, RegistryOperation};
use oci_reqwest as http;
use sha2::{Digest as _, Sha256};
use std::time::Duration;

/// What the registry is told it is talking to.
const USER_AGENT: &str = concat!("nodeward/", env!("CARGO_PKG_VERSION"));

/// Pulls the archive layer of `reference`, pinned by `pin`, within `timeout`: its bytes, which
/// hash to the pin (see the module docs of [`super`]).
pub fn pull(
    reference: &OciReference,
    pin: &Sha256Hex,
    timeout: Duration,
) -> Result<Vec<u8>, OciError> {
    let client_err = |source: Box<dyn std::error::Error + Send + Sync>| OciError::Client {
        reference: reference.to_string(),
        source,
    };
    // reqwest is built without a crypto provider of its own: ring, as the rest of the agent.
    // Already installed is fine (the same one, or the process chose one before).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| client_err(e.into()))?;
    runtime.block_on(async {
        match tokio::time::timeout(timeout, pull_async(reference, pin, timeout)).await {
            Ok(result) => result,
            Err(_) => Err(OciError::TimedOut {
                reference: reference.to_string(),
                secs: timeout.as_secs(),
            }),
        }
    })
}

async fn pull_async(
    reference: &OciReference,
    pin: &Sha256Hex,
    timeout: Duration,
) -> Result<Vec<u8>, OciError> {
    let r = reference.reference();
    let registry = r.resolve_registry().to_string();
    let plain_http = reference.plain_http();
    let client = Client::try_from(ClientConfig {
        protocol: if plain_http {
            ClientProtocol::HttpsExcept(vec![registry.clone()])
        } else {
            ClientProtocol::Https
        },
        // An image index is refused by the layout check, never resolved to a platform.
        platform_resolver: None,
        connect_timeout: Some(timeout),
        user_agent: USER_AGENT,
        ..ClientConfig::default()
    })
    .map_err(|e| OciError::Client {
        reference: reference.to_string(),
        source: e.into(),
    })?;
    let token = client
        .auth(r, &RegistryAuth::Anonymous, RegistryOperation::Pull)
        .await
        .map_err(|e| request_err(reference, "the registry (or its token service)", e))?;
    let bytes = manifest(reference, &registry, plain_http, token.as_deref(), timeout).await?;
    let layer = archive_layer(reference, &bytes, pin)?;
    archive(&client, reference, &layer, pin).await
}

fn request_err(
    reference: &OciReference,
    what: &'static str,
    e: impl std::error::Error + Send + Sync + 'static,
) -> OciError {
    let mut causes = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        causes.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    OciError::Request {
        reference: reference.to_string(),
        what,
        causes,
        source: Box::new(e),
    }
}

/// The manifest's bytes, read up to [`MAX_MANIFEST_BYTES`]; redirects only to HTTPS (or back
/// to a loopback registry).
async fn manifest(
    reference: &OciReference,
    registry: &str,
    plain_http: bool,
    token: Option<&str>,
    timeout: Duration,
) -> Result<Vec<u8>, OciError> {
    let r = reference.reference();
    let url = format!(
        "{scheme}://{registry}/v2/{repository}/manifests/{tag_or_digest}",
        scheme = if plain_http { "http" } else { "https" },
        repository = r.repository(),
        tag_or_digest = r.digest().or(r.tag()).unwrap_or_default(),
    );
    let policy = http::redirect::Policy::custom(|attempt| {
        let url = attempt.url();
        let allowed =
            url.scheme() == "https" || url.host_str().is_some_and(super::is_loopback_registry);
        if attempt.previous().len() >= 5 {
            attempt.error("more than 5 redirects")
        } else if allowed {
            attempt.follow()
        } else {
            attempt.error("a redirect to plain HTTP off this host is refused")
        }
    });
    let client = http::Client::builder()
        .user_agent(USER_AGENT)
        .connect_timeout(timeout)
        .redirect(policy)
        .build()
        .map_err(|e| OciError::Client {
            reference: reference.to_string(),
            source: e.into(),
        })?;
    let mut request = client
        .get(&url)
        .header(http::header::ACCEPT, OCI_IMAGE_MEDIA_TYPE);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let what = "the manifest";
    let mut response = request
        .send()
        .await
        .map_err(|e| request_err(reference, what, e))?;
    if !response.status().is_success() {
        return Err(OciError::Status {
            reference: reference.to_string(),
            what,
            status: response.status().as_u16(),
        });
    }
    let too_large = || OciError::ManifestTooLarge {
        reference: reference.to_string(),
    };
    if response
        .content_length()
        .is_some_and(|n| n > MAX_MANIFEST_BYTES)
    {
        return Err(too_large());
    }
    let mut bytes = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| request_err(reference, what, e))?
    {
        if (bytes.len() + chunk.len()) as u64 > MAX_MANIFEST_BYTES {
            return Err(too_large());
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(bytes)
}

/// The archive layer's bytes: counted against its declared size (at most
/// [`MAX_BUNDLE_BYTES`], checked by [`archive_layer`]) and hashed as they stream.
async fn archive(
    client: &Client,
    reference: &OciReference,
    layer: &OciDescriptor,
    pin: &Sha256Hex,
) -> Result<Vec<u8>, OciError> {
    let what = "the archive layer";
    let declared = u64::try_from(layer.size)
        .unwrap_or(u64::MAX)
        .min(MAX_BUNDLE_BYTES);
    let length_err = |actual: u64| OciError::LayerLength {
        reference: reference.to_string(),
        declared,
        actual,
    };
    let mut stream = client
        .pull_blob_stream(reference.reference(), layer)
        .await
        .map_err(|e| request_err(reference, what, e))?;
    if let Some(n) = stream.content_length.filter(|n| *n > declared) {
        return Err(length_err(n));
    }
    // `declared` is at most MAX_BUNDLE_BYTES (64 MiB), so this fits.
    let mut bytes = Vec::with_capacity(declared as usize);
    let mut hasher = Sha256::new();
    while let Some(chunk) = stream.next().await {
        let chunk = match chunk {
            Ok(chunk) => chunk,
            // oci-client's own check of the digest fails at the end of the stream: report
            // the pin's, which says the same with the sha256s.
            Err(_) if bytes.len() as u64 == declared => break,
            Err(e) => return Err(request_err(reference, what, e)),
        };
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
