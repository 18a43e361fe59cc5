//! Air-gapped installs: the offline archive (`nodeward offline pack`) and its use by
//! `bootstrap --offline FILE`, `upgrade --offline FILE` and `apply --offline FILE`.
//!
//! # Background
//! A node config pins every artifact by URL and sha256, and a phase bundle pins every
//! component by its manifest (signed, or built into the binary). An offline archive carries
//! those bytes to a host without network: one tar holding
//!
//! ```text
//! offline.json            what the archive holds (OfflineManifest), always the first member
//! offline.json.sig        optional: a minisign signature of offline.json (`--key`)
//! bundle.tar              the phase bundle that would run (a bundle archive, docs/bundle-format.md)
//! artifacts/<sha256>      each pinned artifact, named by its digest
//! ```
//!
//! `pack` downloads through the download capability's own engine and artifact cache
//! ([`crate::caps::download::Fetcher`]); `open` ([`import`]) reads an archive, checks it and
//! adds its artifacts to the artifact cache, after which the run's downloads are set offline
//! (`DownloadContext::offline`): a cache hit works as always, a miss is refused at once,
//! naming the artifact and the archive, and no request is ever sent.
//!
//! # Guarantees
//! - **The config is the authority; the archive only carries bytes.** An artifact enters the
//!   cache only if its digest is one the config pins, and only after its bytes hashed to it
//!   while they were copied. Bytes that do not refuse the whole archive, naming the artifact.
//!   Artifacts the config does not pin are skipped.
//! - **The bundle is checked like `--bundle`.** The archive's bundle runs only when it is not
//!   the bundle that would run anyway; then a signed one is verified against the trusted keys,
//!   and an unsigned one is refused for a run that changes the host unless `--allow-unsigned`
//!   (`crate::bundle::select::from_files`). It is not installed: the store is left alone.
//! - **Bounded reading** ([`open`]): only the member names above, regular files only (no
//!   link, directory or device), at most [`MAX_MEMBERS`] members, `offline.json` at most
//!   [`MAX_MANIFEST_BYTES`], the signature [`MAX_SIGNATURE_BYTES`], the bundle
//!   [`crate::bundle::fetch::MAX_BUNDLE_BYTES`], an artifact the download size cap; every
//!   member's size is the one `offline.json` lists, every listed member is there (a truncated
//!   archive is refused), nothing appears twice.
//! - **The signature** (when there is one) is checked before `offline.json` is parsed, with
//!   the bundle signature code and the same trusted keys; a bad or untrusted one refuses the
//!   archive. What it adds is provenance (who packed the archive, checkable in an audit or
//!   before an archive is carried across an air gap): integrity does not depend on it, since
//!   every artifact is pinned by the config and the bundle is signed itself. So an unsigned
//!   archive is accepted.

use crate::bundle::signature::{KeysError, SignError, SignatureError};
use crate::caps::download::DownloadError;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

mod open;
mod pack;
pub use open::{Opened, import};
pub use pack::{PackRequest, Packed, pack};

/// The version of `offline.json` this agent writes and reads.
pub const SCHEMA: u32 = 1;
/// The archive's table of contents.
pub const MANIFEST: &str = "offline.json";
/// Its optional minisign signature.
pub const SIGNATURE: &str = "offline.json.sig";
/// The phase bundle's member.
pub const BUNDLE: &str = "bundle.tar";
/// The directory of the artifacts' members.
pub const ARTIFACTS_DIR: &str = "artifacts/";
/// The trusted comment of an offline archive's signature: not a bundle signature's, so
/// neither can be passed off as the other.
pub const SIGNATURE_COMMENT: &str = "nodeward-offline-signature v1";
/// Most members an archive may have: a node has a handful of artifacts.
pub const MAX_MEMBERS: usize = 64;
/// Largest `offline.json`.
pub const MAX_MANIFEST_BYTES: u64 = 1 << 20;
/// Largest `offline.json.sig` (a minisign signature is ~300 bytes).
pub const MAX_SIGNATURE_BYTES: u64 = 4096;

/// `offline.json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OfflineManifest {
    /// [`SCHEMA`].
    pub schema: u32,
    /// The config's `machineName` when it was packed (information only).
    pub machine_name: String,
    /// The config's `kubernetesVersion` (information only).
    pub kubernetes_version: String,
    /// The architecture the artifacts are for (`amd64`, ...).
    pub arch: String,
    /// Every artifact, in the config's order.
    pub artifacts: Vec<OfflineArtifact>,
    /// The phase bundle.
    pub bundle: OfflineBundle,
}

/// One artifact of an offline archive.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OfflineArtifact {
    /// Its name in the config (`kubelet`, ...).
    pub name: String,
    /// The URL it was downloaded from.
    pub url: String,
    /// Its sha256.
    pub sha256: String,
    /// Its size in bytes.
    pub size: u64,
    /// Its member: `artifacts/<sha256>`.
    pub file: String,
}

/// The phase bundle of an offline archive.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OfflineBundle {
    /// Its member: [`BUNDLE`].
    pub file: String,
    /// The sha256 of the member's bytes.
    pub sha256: String,
    /// Its size in bytes.
    pub size: u64,
    /// The bundle's digest (its manifest's sha256).
    pub digest: String,
    /// Its name and version.
    pub name: String,
    /// Its version.
    pub version: u64,
    /// Whether it is signed.
    pub signed: bool,
}

/// Why an offline archive could not be packed or used; each names the archive and what in it
/// is at fault.
#[derive(Debug, thiserror::Error)]
pub enum OfflineError {
    /// Reading or writing the archive failed.
    #[error("offline archive {}: {source}", archive.display())]
    Io {
        /// The archive.
        archive: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The archive is malformed or breaks a bound (see [`open`]).
    #[error("offline archive {}: {reason}", archive.display())]
    Refused {
        /// The archive.
        archive: PathBuf,
        /// What is wrong, naming the member.
        reason: String,
    },
    /// An artifact's bytes are not the ones the config pins.
    #[error(
        "offline archive {}: artifact {name} ({member}) has sha256 {actual}, but the config pins \
         {expected}; refused (nothing of it was added to the artifact cache)",
        archive.display()
    )]
    Mismatch {
        /// The archive.
        archive: PathBuf,
        /// The artifact's name in the config.
        name: String,
        /// Its member.
        member: String,
        /// The config's sha256.
        expected: String,
        /// The bytes' sha256.
        actual: String,
    },
    /// The signature does not verify (its message names `offline.json.sig`).
    #[error("offline archive {}: {}", archive.display(), signature_message(source))]
    Signature {
        /// The archive.
        archive: PathBuf,
        /// Why (boxed: it is large).
        source: Box<SignatureError>,
    },
    /// The trusted keys do not load.
    #[error(transparent)]
    Keys(#[from] KeysError),
    /// Signing failed.
    #[error("offline archive {}: {source}", archive.display())]
    Sign {
        /// The archive.
        archive: PathBuf,
        /// Why.
        source: SignError,
    },
    /// A download (pack) or the artifact cache (open) failed.
    #[error("offline archive {}: artifact {name}: {source}", archive.display())]
    Download {
        /// The archive.
        archive: PathBuf,
        /// The artifact's name.
        name: String,
        /// Why (boxed: a download error is large).
        source: Box<DownloadError>,
    },
    /// The bundle in the archive (or the one to pack) is refused.
    #[error("offline archive {}: {BUNDLE}: {source}", archive.display())]
    Bundle {
        /// The archive.
        archive: PathBuf,
        /// Why (boxed: a bundle error is large).
        source: Box<crate::bundle::select::SelectError>,
    },
    /// The config does not pin an artifact (pack refuses to carry unpinned bytes).
    #[error(transparent)]
    Unpinned(#[from] crate::node::version::Unpinned),
}

/// A signature error's text with the offline archive's file names: the shared verifier
/// names the bundle's files (`manifest.toml.minisig` over `manifest.toml`).
fn signature_message(e: &SignatureError) -> String {
    e.to_string()
        .replace(crate::bundle::SIGNATURE_FILE, SIGNATURE)
        .replace(crate::bundle::MANIFEST_FILE, MANIFEST)
}

/// Whether `name` is an artifact member (`artifacts/<64 lowercase hex>`); its digest.
fn artifact_digest(name: &str) -> Option<&str> {
    name.strip_prefix(ARTIFACTS_DIR)
        .filter(|d| nodeward_node_config::is_sha256(d))
}
