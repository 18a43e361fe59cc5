//! Phase bundles: a manifest, its components, their digests and grants.
//!
//! # Background
//! A bundle is what platform teams publish and auditors review: a `manifest.toml` naming each
//! phase's component file, its sha256, its WIT world and its grants, next to the component
//! files, and a detached minisign signature over the manifest (`manifest.toml.minisig`). A
//! bundle is a directory or a single tar archive (optionally gzip) holding those files. The
//! default bundle is built by `build.rs` from `guest-phases/` and embedded in the binary;
//! `phases install` makes another one current. Format: docs/bundle-format.md.
//!
//! # Modules
//! - this one: the manifest, strict parsing, digest checks, the embedded default;
//! - `files`: a bundle's files as read, before any check ([`BundleFiles`]);
//! - [`archive`]: reading and writing bundle archives, refusing anything unsafe or truncated;
//! - [`fetch`]: a bundle archive named by an `http(s)` URL and its pinned sha256, downloaded;
//! - [`oci`]: a bundle archive published as an OCI artifact (`oci://…`), pulled, pinned alike;
//! - [`signature`]: trusted keys, verifying and making signatures;
//! - [`store`]: the installed bundles, `current` and `last-good` (the durable layout);
//! - [`install`]: the install and rollback policy (version, widening consent, precompile);
//! - [`select`]: which bundle a run uses (explicit, installed current, embedded);
//! - [`pack`]: making a bundle from a directory, and signing one;
//! - [`inspect`]: what an auditor sees of each phase, and the signature status;
//! - [`diff`]: what a bundle's phases may do, and what changed between two bundles.
//!
//! # Guarantees
//! - Strict parsing: unknown fields, an unknown format version, a duplicate or malformed phase
//!   name, a world that is not a shipped phase world (the test suite's worlds are not), a
//!   component path that is not a plain file name, or a malformed grant refuse the whole bundle.
//! - Every component's sha256 is checked against the manifest when the bundle is loaded, before
//!   anything is compiled or run.
//! - The bundle digest is the sha256 of the manifest's bytes; since the manifest pins every
//!   component's digest, it identifies the whole bundle, and signing the manifest signs it.
//! - [`open_verified`] checks the signature against the trusted keys *before* the manifest is
//!   parsed, so an untrusted manifest never reaches the parser or the compiler.

pub mod archive;
pub mod diff;
pub mod fetch;
mod files;
pub mod history;
pub mod inspect;
pub mod install;
pub mod intent;
pub mod oci;
pub mod pack;
pub mod select;
pub mod signature;
pub mod store;
#[cfg(test)]
mod testing;

use crate::grants::Grants;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub use files::{BundleFiles, FileError};
pub use signature::SIGNATURE_FILE;

/// The manifest format version this agent reads.
pub const FORMAT: u32 = 1;
/// The manifest's file name inside a bundle directory.
pub const MANIFEST_FILE: &str = "manifest.toml";
/// The most bytes one bundle file may have: far above any real component, low enough that a
/// hostile bundle cannot exhaust memory.
pub const MAX_FILE_BYTES: u64 = 256 << 20;

/// A bundle manifest.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// Must be [`FORMAT`].
    pub format: u32,
    /// Name and version.
    pub bundle: BundleMeta,
    /// Phases in the order they run.
    pub phases: Vec<PhaseEntry>,
}

/// A bundle's identity.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BundleMeta {
    /// The bundle's name.
    pub name: String,
    /// Increases with every published bundle.
    pub version: u64,
}

/// One phase of a bundle.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PhaseEntry {
    /// `[a-z0-9-]+`, unique in the bundle.
    pub name: String,
    /// The component's file name in the bundle directory.
    pub component: String,
    /// sha256 of the component, 64 lowercase hex digits.
    pub sha256: String,
    /// The WIT world the component is built for.
    pub world: String,
    /// What the phase may do; nothing when absent.
    #[serde(default)]
    pub grants: Grants,
}

/// Where a bundle came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BundleSource {
    /// Built into this binary.
    Embedded,
    /// A bundle directory.
    Dir(PathBuf),
    /// A bundle archive (tar, optionally gzip).
    Archive(PathBuf),
    /// The installed bundle in this directory of the agent's store (`phases install`).
    Installed(PathBuf),
    /// A bundle archive downloaded from this URL ([`fetch`]); read from memory, kept nowhere.
    Url(Box<url::Url>),
    /// A bundle archive pulled from an OCI registry ([`oci`]): `oci://…`; kept nowhere.
    Oci(String),
}

impl std::fmt::Display for BundleSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BundleSource::Embedded => f.write_str("embedded default bundle"),
            BundleSource::Dir(d) => write!(f, "bundle {}", d.display()),
            BundleSource::Archive(a) => write!(f, "bundle archive {}", a.display()),
            BundleSource::Installed(d) => write!(f, "installed bundle {}", d.display()),
            BundleSource::Url(u) => write!(f, "bundle archive {u}"),
            BundleSource::Oci(r) => write!(f, "bundle archive {r}"),
        }
    }
}

/// Why a bundle was refused. Nothing from it was compiled or run.
#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    /// A file of the bundle could not be read.
    #[error("{source_desc}: cannot read {file}: {source}")]
    Read {
        /// The bundle.
        source_desc: String,
        /// The file.
        file: String,
        /// Why.
        source: FileError,
    },
    /// A component is not a component that can be inspected (its imports cannot be read).
    #[error("{source_desc}: cannot read {file}: phase {phase}: {source}")]
    Component {
        /// The bundle.
        source_desc: String,
        /// The component file.
        file: String,
        /// The phase.
        phase: String,
        /// What the parser said.
        source: diff::ComponentError,
    },
    /// The manifest is not valid.
    #[error("{source_desc}: invalid {MANIFEST_FILE}: {message}")]
    Manifest {
        /// The bundle.
        source_desc: String,
        /// What is wrong.
        message: String,
        /// The parser's or the grant check's error, when one is behind the message.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// A phase declares a world that is not one of the shipped phase worlds
    /// (`wit/worlds.wit`); the test suite's worlds (`probe`, `pure`) are not among them.
    #[error(
        "{source_desc}: invalid {MANIFEST_FILE}: phase {phase}: unknown world {world:?} (not a \
         phase world of this agent's WIT package)"
    )]
    UnknownWorld {
        /// The bundle.
        source_desc: String,
        /// Phase name.
        phase: String,
        /// The declared world.
        world: String,
    },
    /// A component's bytes do not have the manifest's digest.
    #[error(
        "{source_desc}: phase {phase}: {file} has sha256 {actual}, the manifest pins {expected}"
    )]
    DigestMismatch {
        /// The bundle.
        source_desc: String,
        /// Phase name.
        phase: String,
        /// Component file.
        file: String,
        /// sha256 in the manifest.
        expected: String,
        /// sha256 of the bytes.
        actual: String,
    },
    /// An archive is malformed, truncated or holds something a bundle may not.
    #[error("{source_desc}: {source}")]
    Archive {
        /// The bundle.
        source_desc: String,
        /// What is wrong.
        source: archive::ArchiveError,
    },
    /// The signature is missing, invalid, by an untrusted key or of an unknown format.
    #[error("{source_desc}: {source}")]
    Signature {
        /// The bundle.
        source_desc: String,
        /// What is wrong.
        source: signature::SignatureError,
    },
    /// A phase of a loaded bundle has no component bytes (a host bug: loading checks every
    /// phase's component). Never read as empty bytes: they would be staged or compiled.
    #[error("{source_desc}: phase {phase} has no verified component")]
    MissingComponent {
        /// The bundle.
        source_desc: String,
        /// The phase.
        phase: String,
    },
    /// The agent's bundle store cannot be read or written.
    #[error("bundle store {path}: {message}")]
    Store {
        /// The file or directory at fault.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
}

impl BundleError {
    /// Whether the bundle itself is at fault — its signature, manifest, digests, archive or
    /// components — so that the same bytes will never load: `false` for an I/O error while
    /// reading it (a missing path included), the agent's store, and host bugs. `phases install`
    /// tells a refused bundle (exit 4) from a failed install (exit 1) by it.
    pub fn refuses_bundle(&self) -> bool {
        match self {
            BundleError::Read { source, .. } => !matches!(source, FileError::Io(_)),
            BundleError::Archive { source, .. } => !matches!(
                source,
                archive::ArchiveError::Read(_) | archive::ArchiveError::Write { .. }
            ),
            BundleError::Component { .. }
            | BundleError::Manifest { .. }
            | BundleError::UnknownWorld { .. }
            | BundleError::DigestMismatch { .. }
            | BundleError::Signature { .. } => true,
            BundleError::MissingComponent { .. } | BundleError::Store { .. } => false,
        }
    }
}

/// Opens the bundle at `path`, checks its signature against `keys` (before the manifest is
/// parsed), then parses the manifest, checks every digest, and checks that the signature's
/// bundle name and version are the manifest's.
pub fn open_verified(
    path: &Path,
    keys: &signature::TrustedKeys,
) -> Result<(Bundle, BundleFiles), BundleError> {
    let files = BundleFiles::open(path)?;
    let bundle = verify_files(&files, keys)?;
    Ok((bundle, files))
}

/// [`open_verified`] on files already read.
pub fn verify_files(
    files: &BundleFiles,
    keys: &signature::TrustedKeys,
) -> Result<Bundle, BundleError> {
    let sig_err = |source: signature::SignatureError| BundleError::Signature {
        source_desc: files.source.to_string(),
        source,
    };
    let verified =
        signature::verify(&files.manifest, files.signature.as_deref(), keys).map_err(sig_err)?;
    let mut bundle = Bundle::from_files(files)?;
    let meta = &bundle.manifest.bundle;
    if verified.name != meta.name || verified.version != meta.version {
        return Err(sig_err(signature::SignatureError::OtherBundle {
            signed_name: verified.name,
            signed_version: verified.version,
            name: meta.name.clone(),
            version: meta.version,
        }));
    }
    bundle.signed_by = Some(verified.key_id);
    Ok(bundle)
}

/// A loaded, digest-verified bundle.
#[derive(Clone, Debug)]
pub struct Bundle {
    /// The parsed manifest.
    pub manifest: Manifest,
    /// sha256 of the manifest bytes.
    pub digest: String,
    /// Where it came from.
    pub source: BundleSource,
    /// The minisign key ID whose signature was verified, when it was.
    pub signed_by: Option<String>,
    components: BTreeMap<String, Vec<u8>>,
}

pub use crate::digest::sha256_hex;

fn is_phase_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

impl Bundle {
    /// The default bundle built into this binary.
    pub fn embedded() -> Result<Self, BundleError> {
        Self::from_parts(
            crate::built::DEFAULT_BUNDLE_MANIFEST.as_bytes(),
            BundleSource::Embedded,
            |file| {
                crate::built::DEFAULT_BUNDLE_COMPONENTS
                    .iter()
                    .find(|(name, _)| *name == file)
                    .map(|(_, bytes)| bytes.to_vec())
                    .ok_or_else(|| FileError::NotEmbedded(file.to_string()))
            },
        )
    }

    /// Parses the manifest of `files` and checks every component's digest. Does NOT check the
    /// signature: see [`verify_files`].
    pub fn from_files(files: &BundleFiles) -> Result<Self, BundleError> {
        Self::from_parts(&files.manifest, files.source.clone(), |f| files.read(f))
    }

    /// A bundle directory holding `manifest.toml` and the component files. Does NOT check the
    /// signature: see [`open_verified`].
    pub fn load_dir(dir: &Path) -> Result<Self, BundleError> {
        let source = BundleSource::Dir(dir.to_path_buf());
        let manifest = std::fs::read(dir.join(MANIFEST_FILE)).map_err(|e| BundleError::Read {
            source_desc: source.to_string(),
            file: MANIFEST_FILE.into(),
            source: e.into(),
        })?;
        Self::from_parts(&manifest, source, |file| {
            std::fs::read(dir.join(file)).map_err(FileError::from)
        })
    }

    /// Parses `manifest_bytes` and reads and digest-checks each component with `read`.
    /// Public (hidden) only so the fuzzer (`fuzz/`) can drive the manifest checks without files.
    #[doc(hidden)]
    pub fn from_parts(
        manifest_bytes: &[u8],
        source: BundleSource,
        read: impl Fn(&str) -> Result<Vec<u8>, FileError>,
    ) -> Result<Self, BundleError> {
        let source_desc = source.to_string();
        let bad = |message: String| BundleError::Manifest {
            source_desc: source_desc.clone(),
            message,
            source: None,
        };
        let text = std::str::from_utf8(manifest_bytes).map_err(|e| BundleError::Manifest {
            source_desc: source_desc.clone(),
            message: "is not UTF-8".into(),
            source: Some(Box::new(e)),
        })?;
        let manifest: Manifest = toml::from_str(text).map_err(|e| BundleError::Manifest {
            source_desc: source_desc.clone(),
            message: e.to_string(),
            source: Some(Box::new(e)),
        })?;
        if manifest.format != FORMAT {
            return Err(bad(format!(
                "format {} is not supported (this agent reads format {FORMAT})",
                manifest.format
            )));
        }
        if manifest.phases.is_empty() {
            return Err(bad("lists no phases".into()));
        }
        let mut components = BTreeMap::new();
        for (i, phase) in manifest.phases.iter().enumerate() {
            if !is_phase_name(&phase.name) {
                return Err(bad(format!(
                    "phases[{i}].name {:?}: lowercase letters, digits and '-' only",
                    phase.name
                )));
            }
            if manifest.phases[..i].iter().any(|p| p.name == phase.name) {
                return Err(bad(format!("phase {} is listed twice", phase.name)));
            }
            if !crate::runtime::is_production_world(&phase.world) {
                return Err(BundleError::UnknownWorld {
                    source_desc: source_desc.clone(),
                    phase: phase.name.clone(),
                    world: phase.world.clone(),
                });
            }
            if phase.component.is_empty()
                || phase.component.contains('/')
                || phase.component.starts_with('.')
            {
                return Err(bad(format!(
                    "phase {}: component {:?} must be a plain file name",
                    phase.name, phase.component
                )));
            }
            if !nodeward_node_config::is_sha256(&phase.sha256) {
                return Err(bad(format!(
                    "phase {}: sha256 must be 64 lowercase hex digits",
                    phase.name
                )));
            }
            phase.grants.validate().map_err(|e| BundleError::Manifest {
                source_desc: source_desc.clone(),
                message: format!("phase {}: {e}", phase.name),
                source: Some(Box::new(e)),
            })?;
            // `phases install` refuses these; a bundle installed before the path was reserved
            // (or run by `--bundle`) still loads, so an agent upgrade never strands a node, and
            // each call there is denied (`crate::reserved`).
            for entry in phase.grants.reserved_entries() {
                tracing::warn!(
                    bundle = %source_desc, phase = %phase.name,
                    "{entry}: every call there is denied"
                );
            }
            let bytes = read(&phase.component).map_err(|e| BundleError::Read {
                source_desc: source_desc.clone(),
                file: phase.component.clone(),
                source: e,
            })?;
            let actual = sha256_hex(&bytes);
            if actual != phase.sha256 {
                return Err(BundleError::DigestMismatch {
                    source_desc: source_desc.clone(),
                    phase: phase.name.clone(),
                    file: phase.component.clone(),
                    expected: phase.sha256.clone(),
                    actual,
                });
            }
            components.insert(phase.name.clone(), bytes);
        }
        Ok(Bundle {
            digest: sha256_hex(manifest_bytes),
            manifest,
            source,
            signed_by: None,
            components,
        })
    }

    /// The phase called `name`.
    pub fn phase(&self, name: &str) -> Option<&PhaseEntry> {
        self.manifest.phases.iter().find(|p| p.name == name)
    }

    /// The verified component bytes of phase `name`.
    pub fn component(&self, name: &str) -> Option<&[u8]> {
        self.components.get(name).map(Vec::as_slice)
    }

    /// The verified component bytes of phase `name`, which the bundle must have: an error,
    /// never empty bytes, when it does not.
    pub fn verified_component(&self, name: &str) -> Result<&[u8], BundleError> {
        self.component(name)
            .ok_or_else(|| BundleError::MissingComponent {
                source_desc: self.source.to_string(),
                phase: name.to_string(),
            })
    }
}

/// A bundle's identity as every `--output json` shows it (`docs/schemas/bundle.schema.json`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BundleId {
    /// The manifest's bundle name.
    pub name: String,
    /// The manifest's bundle version.
    pub version: u64,
    /// sha256 of the manifest.
    pub digest: String,
    /// Where it came from (`embedded`, a path, `installed …`).
    pub source: String,
    /// The trusted key that signed it, when its signature was checked.
    pub signed_by: Option<String>,
}

impl Bundle {
    /// Name, version, digest, source and signing key (for `--output json`).
    pub fn id(&self) -> BundleId {
        BundleId {
            name: self.manifest.bundle.name.clone(),
            version: self.manifest.bundle.version,
            digest: self.digest.clone(),
            source: self.source.to_string(),
            signed_by: self.signed_by.clone(),
        }
    }

    /// `name vVERSION (sha256 DIGEST)`, for people.
    pub fn id_text(&self) -> String {
        format!(
            "{} v{} (sha256 {})",
            self.manifest.bundle.name, self.manifest.bundle.version, self.digest
        )
    }
}
