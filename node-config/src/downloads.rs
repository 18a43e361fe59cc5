//! The config's two download sections: `downloads`, which pins each artifact's URL and sha256
//! ([`DownloadOverride`]), and `downloadOptions`, how the host fetches and keeps artifacts
//! ([`DownloadOptions`]).
//!
//! # Background
//! `downloads` is a map keyed by artifact name (`downloads.kubelet.url`), and the `Machine`
//! resource's `artifacts` has its shape; a fixed key beside the artifact names (`caFile`) would
//! make it an object with both `properties` and `additionalProperties`, which a Kubernetes
//! structural schema refuses. So the settings of the download engine itself live in their own
//! section.
//!
//! # Guarantees
//! - An absent section, or one with every field absent, serializes to nothing: the
//!   fingerprint of a config written before the section existed does not change.
//! - [`DownloadOptions::validate`] checks the shape only (this crate does no I/O); the host
//!   reads `caFile` and reports a missing, unreadable or empty file naming it.

use crate::{InvalidField, invalid};
use serde::{Deserialize, Serialize};

/// Where to fetch one artifact, and the sha256 it must have.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct DownloadOverride {
    /// The artifact's `http://` or `https://` URL.
    #[cfg_attr(feature = "schema", schemars(pattern(crate::schema::HTTP_URL_PATTERN)))]
    pub url: String,
    /// The sha256 of its bytes, 64 lowercase hex digits.
    #[cfg_attr(feature = "schema", schemars(pattern(crate::SHA256_PATTERN)))]
    pub sha256: String,
}

/// What the schema says of `caFile` (the rest of [`DownloadOptions::validate`] needs more
/// than a pattern): an absolute path on one line.
pub const CA_FILE_PATTERN: &str = r"^/[^\n]*$";

/// How the host fetches and keeps artifacts.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct DownloadOptions {
    /// A PEM file of CA certificates trusted for HTTPS downloads **in addition to** the
    /// system trust store (a private mirror's CA). An absolute path on the node, read by the
    /// host agent (never by a phase) when a run starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(pattern(CA_FILE_PATTERN)))]
    pub ca_file: Option<String>,
    /// The artifact cache's size cap in bytes: after a successful bootstrap or upgrade the
    /// least recently used entries are evicted until the cache is under it, never an artifact
    /// of the current or the previous version. Default 2 GiB (`defaults::CACHE_MAX_BYTES`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_max_bytes: Option<u64>,
}

impl DownloadOptions {
    /// Whether no field is set (the section is then left out of the serialized config).
    pub fn is_empty(&self) -> bool {
        self == &DownloadOptions::default()
    }

    /// The cache cap in force: the field, else the default.
    pub fn cache_max_bytes(&self) -> u64 {
        self.cache_max_bytes
            .unwrap_or(crate::defaults::CACHE_MAX_BYTES)
    }

    /// Checks the fields' shape; the error names the field.
    pub fn validate(&self) -> Result<(), InvalidField> {
        if let Some(path) = &self.ca_file {
            let field = "downloadOptions.caFile";
            if !path.starts_with('/') {
                return Err(invalid(field, "must be an absolute path"));
            }
            if path.contains(['\0', '\n']) {
                return Err(invalid(field, "may not contain NUL or newline characters"));
            }
            // The host resolves it beneath its root as a relative host path: one name per
            // component, no `.`, `..` or empty ones.
            let rest = &path[1..];
            if rest.is_empty() || rest.split('/').any(|c| matches!(c, "" | "." | "..")) {
                return Err(invalid(
                    field,
                    "must name a file: no `.`, `..` or empty components, no trailing /",
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_ca(path: &str) -> DownloadOptions {
        DownloadOptions {
            ca_file: Some(path.into()),
            ..DownloadOptions::default()
        }
    }

    #[test]
    fn an_empty_section_serializes_to_nothing() {
        let o = DownloadOptions::default();
        assert!(o.is_empty());
        assert_eq!(serde_json::to_string(&o).expect("json"), "{}");
        assert_eq!(o.cache_max_bytes(), crate::defaults::CACHE_MAX_BYTES);
    }

    #[test]
    fn ca_file_must_be_an_absolute_file_path() {
        assert_eq!(with_ca("/etc/nodeward/mirror-ca.pem").validate(), Ok(()));
        for bad in [
            "etc/ca.pem",
            "/etc/../ca.pem",
            "/",
            "/etc/",
            "/a\nb",
            "",
            "/a//b",
            "/./a",
        ] {
            let e = with_ca(bad).validate().expect_err(bad);
            assert_eq!(e.field, "downloadOptions.caFile", "{bad:?}");
        }
    }

    #[test]
    fn unknown_fields_are_refused() {
        let e = serde_json::from_str::<DownloadOptions>(r#"{"cafile": "/x"}"#)
            .expect_err("unknown field");
        assert!(e.to_string().contains("cafile"), "{e}");
    }
}
