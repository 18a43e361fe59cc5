//! Phase bundles: a manifest, its components, their digests and grants.
//!
//! # Background
//! A bundle is what platform teams publish and auditors review: a `manifest.toml` naming each
//! phase's component file, its sha256, its WIT world and its grants, next to the component
//! files. The default bundle is built by `build.rs` from `guest-phases/` and embedded in the
//! binary; `--bundle DIR` runs another one. Format: docs/bundle-format.md.
//!
//! # Guarantees
//! - Strict parsing: unknown fields, an unknown format version, a duplicate or malformed phase
//!   name, an unknown world, a component path that is not a plain file name, or a malformed
//!   grant refuse the whole bundle.
//! - Every component's sha256 is checked against the manifest when the bundle is loaded, before
//!   anything is compiled or run.
//! - The bundle digest is the sha256 of the manifest's bytes; since the manifest pins every
//!   component's digest, it identifies the whole bundle.
//!
//! # Current limitations
//! Signatures are not verified yet: a detached signature over `manifest.toml` will sit next to
//! it (`manifest.toml.sig`), checked before the manifest is parsed.

use crate::grants::Grants;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The manifest format version this agent reads.
pub const FORMAT: u32 = 1;
/// The manifest's file name inside a bundle directory.
pub const MANIFEST_FILE: &str = "manifest.toml";

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
    /// A directory given with `--bundle`.
    Dir(PathBuf),
}

impl std::fmt::Display for BundleSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BundleSource::Embedded => f.write_str("embedded default bundle"),
            BundleSource::Dir(d) => write!(f, "bundle {}", d.display()),
        }
    }
}

/// Why a bundle was refused. Nothing from it was compiled or run.
#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    /// A file of the bundle could not be read.
    #[error("{source_desc}: cannot read {file}: {message}")]
    Read {
        /// The bundle.
        source_desc: String,
        /// The file.
        file: String,
        /// The I/O error.
        message: String,
    },
    /// The manifest is not valid.
    #[error("{source_desc}: invalid {MANIFEST_FILE}: {message}")]
    Manifest {
        /// The bundle.
        source_desc: String,
        /// What is wrong.
        message: String,
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
    components: BTreeMap<String, Vec<u8>>,
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

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
                    .ok_or_else(|| format!("{file} is not in the embedded bundle"))
            },
        )
    }

    /// A bundle directory holding `manifest.toml` and the component files.
    pub fn load_dir(dir: &Path) -> Result<Self, BundleError> {
        let source = BundleSource::Dir(dir.to_path_buf());
        let manifest = std::fs::read(dir.join(MANIFEST_FILE)).map_err(|e| BundleError::Read {
            source_desc: source.to_string(),
            file: MANIFEST_FILE.into(),
            message: e.to_string(),
        })?;
        Self::from_parts(&manifest, source, |file| {
            std::fs::read(dir.join(file)).map_err(|e| e.to_string())
        })
    }

    fn from_parts(
        manifest_bytes: &[u8],
        source: BundleSource,
        read: impl Fn(&str) -> Result<Vec<u8>, String>,
    ) -> Result<Self, BundleError> {
        let source_desc = source.to_string();
        let bad = |message: String| BundleError::Manifest {
            source_desc: source_desc.clone(),
            message,
        };
        let text = std::str::from_utf8(manifest_bytes).map_err(|_| bad("is not UTF-8".into()))?;
        let manifest: Manifest = toml::from_str(text).map_err(|e| bad(e.to_string()))?;
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
            if !crate::built::WORLDS.iter().any(|(w, _)| *w == phase.world) {
                return Err(bad(format!(
                    "phase {}: unknown world {:?}",
                    phase.name, phase.world
                )));
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
            phase
                .grants
                .validate()
                .map_err(|e| bad(format!("phase {}: {e}", phase.name)))?;
            let bytes = read(&phase.component).map_err(|message| BundleError::Read {
                source_desc: source_desc.clone(),
                file: phase.component.clone(),
                message,
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
}
