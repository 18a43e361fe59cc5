//! A bundle archive published as an OCI artifact: [`OciReference`] (what `oci://…` and a
//! Machine's `spec.phaseBundle.ociReference` name), the artifact layout ([`archive_layer`]),
//! and [`pull`], which fetches the archive's bytes pinned by their sha256.
//!
//! # Background
//! Platform teams already run registries for images; an OCI artifact lets them publish a
//! bundle there with `oras push` or any OCI client. The artifact is one image manifest with
//! exactly one layer: the signed archive exactly as `phases pack` and `phases sign` make it
//! (the signature is inside it, as for a URL), of mediaType [`BUNDLE_MEDIA_TYPE`]. The
//! pinned sha256 is that archive's, so the layer's digest must be `sha256:<pin>`: the registry
//! is trusted with nothing, exactly like a web server for a URL. The config blob and the
//! manifest's `artifactType` are not read. Format: docs/bundle-format.md.
//!
//! # Guarantees
//! - A reference names its registry (`host[:port]/…`, Docker's rule: a first component with a
//!   `.` or a `:`, or `localhost`) and a tag or a `sha256` digest; nothing defaults to Docker
//!   Hub or to `latest`.
//! - HTTPS, except to a registry written as an IPv4 loopback address (`127.0.0.0/8`), which
//!   is spoken to in plain HTTP (Docker's own default for such registries). The choice is
//!   made from the reference's text, never from DNS, before any connection; there is no way to
//!   ask for plain HTTP to any other registry. Every request of the pull (token service,
//!   manifest, layer) and every redirect stays on HTTPS or that loopback registry.
//! - Anonymous pulls only: a registry's token challenge is answered without credentials, by
//!   an HTTPS token service (or the loopback registry), never through a redirect, its answer
//!   read up to 64 KiB and never shown.
//! - The manifest is read up to [`MAX_MANIFEST_BYTES`]; a reference by digest must hash to
//!   it. A manifest that is not an OCI image manifest, has no layer or several of
//!   [`BUNDLE_MEDIA_TYPE`], any layer of another mediaType, or a layer with `urls` is
//!   refused ([`OciError::Layout`]) before the layer is requested.
//! - The layer's declared digest must be the pin, its declared size at most
//!   [`MAX_BUNDLE_BYTES`]; its bytes are counted and hashed as they stream, refused at the
//!   first byte past the declared size, and compared with the pin at the end.
//! - The whole pull (token, manifest, layer) ends by the timeout given; it is not retried
//!   (the daemon retries a failed roll-out later). Nothing is written to disk: the archive
//!   is kept in memory, as the URL path keeps it after its download.
//! - Every error names the reference (`oci://…`).

use crate::digest::Sha256Hex;
use oci_client::Reference;
use oci_client::manifest::{OCI_IMAGE_MEDIA_TYPE, OciDescriptor, OciImageManifest};

mod pull;

pub use super::fetch::MAX_BUNDLE_BYTES;
pub use pull::pull;

/// The prefix that makes a `phases install` source an OCI reference.
pub const SCHEME: &str = "oci://";
/// The mediaType of the one layer of a bundle artifact: the signed archive (tar, gzip).
pub const BUNDLE_MEDIA_TYPE: &str = "application/vnd.nodeward.bundle.v1.tar+gzip";
/// The `artifactType` platform teams are asked to push with (not checked: the layer is).
pub const ARTIFACT_TYPE: &str = "application/vnd.nodeward.bundle.v1";
/// The largest manifest read, in bytes (4 MiB, the size registries must at least accept and
/// containerd's own limit); a bundle's is under 1 KiB.
pub const MAX_MANIFEST_BYTES: u64 = 4 << 20;

/// An OCI reference with its registry and a tag or digest, as written (without `oci://`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OciReference {
    text: String,
    reference: Reference,
}

/// Why a text is not an [`OciReference`] (a usage error: nothing was requested).
#[derive(Debug, thiserror::Error)]
pub enum ReferenceError {
    /// The reference grammar refuses it.
    #[error(
        "{SCHEME}{text}: not an OCI reference (REGISTRY/REPOSITORY:TAG or @sha256:HEX): {source}"
    )]
    Invalid {
        /// The text.
        text: String,
        /// The parser's error.
        #[source]
        source: oci_client::ParseError,
    },
    /// No registry: Docker would default to Docker Hub; this agent does not guess.
    #[error("{SCHEME}{text}: name the registry (REGISTRY[:PORT]/REPOSITORY…)")]
    NoRegistry {
        /// The text.
        text: String,
    },
    /// Neither a tag nor a digest: Docker would default to `latest`.
    #[error("{SCHEME}{text}: name a tag (:TAG) or a digest (@sha256:HEX)")]
    NoTagOrDigest {
        /// The text.
        text: String,
    },
    /// A digest of another algorithm.
    #[error("{SCHEME}{text}: only sha256 digests are supported")]
    Digest {
        /// The text.
        text: String,
    },
}

impl OciReference {
    /// `text` (without `oci://`) as a reference: see the module's guarantees.
    pub fn parse(text: &str) -> Result<Self, ReferenceError> {
        let text = text.to_string();
        let reference =
            Reference::try_from(text.as_str()).map_err(|source| ReferenceError::Invalid {
                text: text.clone(),
                source,
            })?;
        let first = text.split('/').next().unwrap_or_default();
        let names_registry = text.contains('/')
            && (first.contains('.') || first.contains(':') || first == "localhost");
        if !names_registry {
            return Err(ReferenceError::NoRegistry { text });
        }
        let last = text.rsplit('/').next().unwrap_or_default();
        if !last.contains(':') && !last.contains('@') {
            return Err(ReferenceError::NoTagOrDigest { text });
        }
        if reference
            .digest()
            .is_some_and(|d| !d.starts_with("sha256:"))
        {
            return Err(ReferenceError::Digest { text });
        }
        Ok(OciReference { text, reference })
    }

    /// The reference as written, without `oci://`.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The parsed reference.
    pub fn reference(&self) -> &Reference {
        &self.reference
    }

    /// Whether the registry is spoken to in plain HTTP: only a loopback one.
    pub fn plain_http(&self) -> bool {
        is_loopback_registry(self.reference.registry())
    }
}

impl std::fmt::Display for OciReference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{SCHEME}{}", self.text)
    }
}

/// Whether `registry` (`host[:port]`, as written) is on a loopback address: an IPv4 address
/// in `127.0.0.0/8` written as one. Decided on the text alone, so a name (even `localhost`,
/// which the resolver may send elsewhere) is spoken to over HTTPS.
pub fn is_loopback_registry(registry: &str) -> bool {
    let host = registry.split(':').next().unwrap_or_default();
    host.parse::<std::net::Ipv4Addr>()
        .is_ok_and(|ip| ip.is_loopback())
}

/// Why an OCI artifact could not be had as pinned. Nothing was installed.
#[derive(Debug, thiserror::Error)]
pub enum OciError {
    /// The registry cannot be reached, or a request or its body failed.
    #[error("{reference}: {what}: {causes}")]
    Request {
        /// The reference.
        reference: String,
        /// What was being requested.
        what: &'static str,
        /// The source and its own sources, `: `-joined (a client's error alone says only
        /// "error sending request", its causes say why).
        causes: String,
        /// The client's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The registry answered with an error status.
    #[error("{reference}: the registry answered {status} for {what}")]
    Status {
        /// The reference.
        reference: String,
        /// What was requested.
        what: &'static str,
        /// The HTTP status.
        status: u16,
    },
    /// The whole pull did not end in time.
    #[error("{reference}: not pulled in time (--timeout {secs} s)")]
    TimedOut {
        /// The reference.
        reference: String,
        /// The timeout.
        secs: u64,
    },
    /// The manifest is larger than [`MAX_MANIFEST_BYTES`].
    #[error("{reference}: the manifest is larger than the {MAX_MANIFEST_BYTES} byte limit")]
    ManifestTooLarge {
        /// The reference.
        reference: String,
    },
    /// A reference by digest whose manifest hashes to something else.
    #[error("{reference}: the registry's manifest has digest {actual}")]
    ManifestDigest {
        /// The reference.
        reference: String,
        /// The manifest's digest.
        actual: String,
    },
    /// The archive layer's declared digest is not the pinned sha256.
    #[error("{reference}: the archive layer is {declared}, but sha256:{pinned} is pinned")]
    NotPinned {
        /// The reference.
        reference: String,
        /// The layer's declared digest.
        declared: String,
        /// The pin.
        pinned: String,
    },
    /// The archive layer declares a size past [`MAX_BUNDLE_BYTES`] (or a negative one).
    #[error(
        "{reference}: the archive layer declares {size} bytes, not within the {MAX_BUNDLE_BYTES} byte limit"
    )]
    LayerTooLarge {
        /// The reference.
        reference: String,
        /// The declared size.
        size: i64,
    },
    /// The layer's bytes are not as many as declared.
    #[error(
        "{reference}: the archive layer's body is not the {declared} bytes its manifest declares ({actual} sent)"
    )]
    LayerLength {
        /// The reference.
        reference: String,
        /// The declared size.
        declared: u64,
        /// How many were sent (or announced, past the declared size).
        actual: u64,
    },
    /// The layer's bytes do not hash to the pin: discarded.
    #[error(
        "{reference}: the archive layer's bytes are not the pinned ones: sha256 mismatch: expected {expected}, got {actual}"
    )]
    LayerBytes {
        /// The reference.
        reference: String,
        /// The pin.
        expected: String,
        /// What they hash to.
        actual: String,
    },
    /// The artifact is not a bundle artifact (see the module docs).
    #[error("{reference}: not a nodeward bundle artifact: {problem}")]
    Layout {
        /// The reference.
        reference: String,
        /// What is wrong with it.
        problem: String,
    },
    /// The registry's token challenge was refused or its token service did not give one
    /// (`problem` is ours: a token service's body is never shown).
    #[error("{reference}: the registry's token challenge: {problem}")]
    Token {
        /// The reference.
        reference: String,
        /// What is wrong.
        problem: String,
    },
    /// The HTTP client or its runtime cannot be made (nothing was requested).
    #[error("{reference}: cannot make the registry client: {source}")]
    Client {
        /// The reference.
        reference: String,
        /// Why.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl OciError {
    /// Whether the archive could not be had as pinned (`phases install` exits 3): the
    /// registry, the timeout, a size, a digest. Not a layout refusal, nor a local failure.
    pub fn not_fetched(&self) -> bool {
        !matches!(self, OciError::Layout { .. } | OciError::Client { .. })
    }

    /// Whether the artifact was refused as not a bundle artifact (`phases install` exits 4).
    pub fn refuses_bundle(&self) -> bool {
        matches!(self, OciError::Layout { .. })
    }
}

/// The archive layer of the manifest `bytes` of `reference`, checked against the layout and
/// the pin (see the module's guarantees). Pure: the size of `bytes` is the caller's.
pub fn archive_layer(
    reference: &OciReference,
    bytes: &[u8],
    pin: &Sha256Hex,
) -> Result<OciDescriptor, OciError> {
    let layout = |problem: String| OciError::Layout {
        reference: reference.to_string(),
        problem,
    };
    if let Some(expected) = reference.reference.digest() {
        let actual = format!("sha256:{}", crate::digest::sha256_hex(bytes));
        if actual != expected {
            return Err(OciError::ManifestDigest {
                reference: reference.to_string(),
                actual,
            });
        }
    }
    let manifest: OciImageManifest = serde_json::from_slice(bytes)
        .map_err(|e| layout(format!("its manifest is not an OCI image manifest: {e}")))?;
    if manifest.schema_version != 2 || manifest.media_type.as_deref() != Some(OCI_IMAGE_MEDIA_TYPE)
    {
        return Err(layout(format!(
            "its manifest has schemaVersion {} and mediaType {:?}; an OCI image manifest \
             (schemaVersion 2, {OCI_IMAGE_MEDIA_TYPE}) is required",
            manifest.schema_version,
            manifest.media_type.as_deref().unwrap_or("none")
        )));
    }
    if let Some(other) = manifest
        .layers
        .iter()
        .find(|l| l.media_type != BUNDLE_MEDIA_TYPE)
    {
        return Err(layout(format!(
            "a layer has the unknown mediaType {:?}; the only layer is the archive, \
             {BUNDLE_MEDIA_TYPE}",
            other.media_type
        )));
    }
    let [layer] = manifest.layers.as_slice() else {
        return Err(layout(format!(
            "it has {} layers of {BUNDLE_MEDIA_TYPE}; exactly one is the archive",
            manifest.layers.len()
        )));
    };
    if layer.urls.is_some() {
        return Err(layout(
            "its archive layer lists urls: the archive is pulled from the registry only".into(),
        ));
    }
    let pinned = format!("sha256:{pin}");
    if layer.digest != pinned {
        return Err(OciError::NotPinned {
            reference: reference.to_string(),
            declared: layer.digest.clone(),
            pinned: pin.to_string(),
        });
    }
    if !(0..=MAX_BUNDLE_BYTES as i64).contains(&layer.size) {
        return Err(OciError::LayerTooLarge {
            reference: reference.to_string(),
            size: layer.size,
        });
    }
    Ok(layer.clone())
}

#[cfg(test)]
mod tests;
