//! What an auditor sees of a bundle (`phases inspect`): each phase's component imports, the
//! capabilities they amount to, whether they stay within the phase's world, and its grants;
//! and whether the bundle's signature verifies.
//!
//! # Guarantees
//! - Inspecting never refuses a bundle for what it may do: imports beyond a world and a bad
//!   signature are reported, not errors. Only a component that cannot be read at all is.
//! - Nothing is compiled: imports are read from the binary.

use crate::bundle::diff::{self, ComponentError};
use crate::bundle::signature::{KeysError, TrustedKeys};
use crate::bundle::{self, Bundle, BundleError, BundleFiles, BundleSource};
use crate::grants::Grants;
use crate::runtime::LoadError;
use std::collections::BTreeSet;

/// One phase as an auditor sees it.
#[derive(Debug)]
pub struct PhaseInspection {
    /// Phase name.
    pub name: String,
    /// Declared world.
    pub world: String,
    /// Component file.
    pub component: String,
    /// Component sha256.
    pub sha256: String,
    /// Every import of the component, as named in it.
    pub imports: Vec<String>,
    /// The `nodeward:host` capabilities among them ([`diff::capabilities`]).
    pub capabilities: BTreeSet<String>,
    /// Why the imports go beyond the declared world (the runtime would refuse to load it).
    pub beyond_world: Option<LoadError>,
    /// The phase's grants.
    pub grants: Grants,
}

/// A component whose imports cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    /// The component does not parse.
    #[error("{bundle}: phase {phase}: {file}: {source}")]
    Component {
        /// The bundle.
        bundle: BundleSource,
        /// The phase.
        phase: String,
        /// The component file.
        file: String,
        /// What the parser said.
        source: ComponentError,
    },
    /// The bundle lacks a component it should have.
    #[error(transparent)]
    Bundle(#[from] BundleError),
}

/// Every phase of `bundle`, in run order.
pub fn phases(bundle: &Bundle) -> Result<Vec<PhaseInspection>, InspectError> {
    let mut out = Vec::new();
    for p in &bundle.manifest.phases {
        let imports =
            diff::component_imports(bundle.verified_component(&p.name)?).map_err(|source| {
                InspectError::Component {
                    bundle: bundle.source.clone(),
                    phase: p.name.clone(),
                    file: p.component.clone(),
                    source,
                }
            })?;
        out.push(PhaseInspection {
            name: p.name.clone(),
            world: p.world.clone(),
            component: p.component.clone(),
            sha256: p.sha256.clone(),
            capabilities: diff::capabilities(&imports),
            beyond_world: crate::runtime::check_imports(&p.name, &p.world, &imports).err(),
            imports,
            grants: p.grants.clone(),
        });
    }
    Ok(out)
}

/// Whether a bundle's signature verifies, for auditors.
#[derive(Debug)]
pub enum SignatureStatus {
    /// Verified by this trusted key.
    Verified {
        /// The key ID.
        key_id: Option<String>,
    },
    /// The trusted keys do not load.
    Keys(KeysError),
    /// The signature is missing or does not verify (or the bundle does not load).
    Refused(BundleError),
}

/// Checks the signature of `files` with the trusted keys `keys` loaded; never refuses.
pub fn signature_status(
    files: &BundleFiles,
    keys: Result<TrustedKeys, KeysError>,
) -> SignatureStatus {
    let keys = match keys {
        Ok(k) => k,
        Err(e) => return SignatureStatus::Keys(e),
    };
    match bundle::verify_files(files, &keys) {
        Ok(b) => SignatureStatus::Verified {
            key_id: b.signed_by,
        },
        Err(e) => SignatureStatus::Refused(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bundle::testing;

    #[test]
    fn imports_within_and_beyond_the_world_are_reported_not_refused() {
        let tmp = tempfile::tempdir().expect("tmp");
        let (b, files) = testing::bundle(tmp.path(), "b", 1, |_| {});
        let p = phases(&b).expect("inspect");
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].name, "preflight");
        assert!(p[0].beyond_world.is_none());
        assert!(
            p[0].capabilities
                .iter()
                .all(|c| c.starts_with("nodeward:host/"))
                && !p[0].capabilities.is_empty(),
            "{:?}",
            p[0].capabilities
        );
        assert!(p[0].imports.len() >= p[0].capabilities.len());

        // The preflight component under the stop-node world imports what that world lacks (fs).
        let (other, _) = testing::bundle(tmp.path(), "other", 1, |t| {
            testing::phase_table(t).insert("world".into(), "stop-node".into());
        });
        let p = phases(&other).expect("inspect");
        assert!(p[0].beyond_world.is_some(), "{p:?}");

        assert!(matches!(
            signature_status(&files, Ok(TrustedKeys::default())),
            SignatureStatus::Refused(BundleError::Signature { .. })
        ));
        let keys = Err(KeysError::NoKeyId {
            file: "k.pub".into(),
        });
        assert!(matches!(
            signature_status(&files, keys),
            SignatureStatus::Keys(_)
        ));
    }
}
