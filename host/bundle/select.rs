//! Which bundle a run uses: an explicitly named one (checked as its signature allows), else
//! the installed current bundle, else the one embedded in the binary.
//!
//! # Guarantees
//! - A signed bundle named explicitly is verified against the trusted keys, and any failure
//!   refuses it: a bad signature never degrades to "unsigned".
//! - An unsigned bundle named explicitly runs only after the caller has been told (so it can
//!   warn), and never for a run that changes the host unless unsigned bundles were allowed.
//! - An installed current bundle that does not load (damaged store) is an error that says how
//!   to get back to last-good; it never falls back to the embedded bundle silently.

use crate::bundle::signature::{KeysError, TrustedKeys};
use crate::bundle::store::Store;
use crate::bundle::{self, Bundle, BundleError, BundleFiles, BundleSource};
use crate::plan::RunMode;
use std::path::Path;

/// The installed current bundle exists but cannot be used.
#[derive(Debug, thiserror::Error)]
#[error(
    "{0} (the installed current bundle is unusable; `nodeward phases rollback` returns to last-good)"
)]
pub struct UnusableCurrent(#[source] pub BundleError);

/// Why no bundle was selected.
#[derive(Debug, thiserror::Error)]
pub enum SelectError {
    /// The installed current bundle does not load.
    #[error(transparent)]
    UnusableCurrent(#[from] UnusableCurrent),
    /// The bundle does not load, or its signature does not verify.
    #[error(transparent)]
    Bundle(#[from] BundleError),
    /// The trusted keys do not load (a configuration error).
    #[error(transparent)]
    Keys(#[from] KeysError),
    /// An unsigned bundle for a run that changes the host, without `allow_unsigned`.
    #[error(
        "{bundle}: unsigned; apply runs only signed bundles (sign and install it, or pass --allow-unsigned for development)"
    )]
    UnsignedApply {
        /// The bundle.
        bundle: BundleSource,
    },
}

/// The installed current bundle of `store`, else the embedded one.
pub fn effective(store: &Store) -> Result<Bundle, SelectError> {
    match store.current().map_err(UnusableCurrent)? {
        Some(b) => Ok(b),
        None => Ok(Bundle::embedded()?),
    }
}

/// The bundle at `path`, named explicitly for a run in `mode`. A signed one is verified with
/// the keys `keys` loads (loaded only then). An unsigned one is refused for an apply unless
/// `allow_unsigned`; otherwise `on_unsigned` is called with its source before it is loaded
/// (to warn loudly), and it runs.
pub fn explicit(
    path: &Path,
    mode: RunMode,
    allow_unsigned: bool,
    keys: impl FnOnce() -> Result<TrustedKeys, KeysError>,
    on_unsigned: impl FnOnce(&BundleSource),
) -> Result<Bundle, SelectError> {
    from_files(
        BundleFiles::open(path)?,
        mode,
        allow_unsigned,
        keys,
        on_unsigned,
    )
}

/// [`explicit`] for a bundle's files already read (the bundle of an offline archive,
/// `crate::offline`).
pub fn from_files(
    files: BundleFiles,
    mode: RunMode,
    allow_unsigned: bool,
    keys: impl FnOnce() -> Result<TrustedKeys, KeysError>,
    on_unsigned: impl FnOnce(&BundleSource),
) -> Result<Bundle, SelectError> {
    if files.signature.is_some() {
        let keys = keys()?;
        return Ok(bundle::verify_files(&files, &keys)?);
    }
    if mode == RunMode::Apply && !allow_unsigned {
        return Err(SelectError::UnsignedApply {
            bundle: files.source,
        });
    }
    on_unsigned(&files.source);
    Ok(Bundle::from_files(&files)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bundle::testing;

    fn no_keys() -> Result<TrustedKeys, KeysError> {
        Ok(TrustedKeys::default())
    }

    #[test]
    fn effective_is_the_installed_current_else_the_embedded() {
        let state = tempfile::tempdir().expect("state");
        let store = Store::new(state.path());
        let b = effective(&store).expect("embedded");
        assert_eq!(b.source, BundleSource::Embedded);

        let (bundle, files) = testing::bundle(state.path(), "v7", 7, |_| {});
        let _lock = store.lock().expect("lock");
        store.stage(&bundle, &files).expect("stage");
        store
            .set_link(crate::bundle::store::CURRENT, &bundle.digest)
            .expect("link");
        let b = effective(&store).expect("installed");
        assert_eq!(b.digest, bundle.digest);
        assert!(matches!(b.source, BundleSource::Installed(_)));

        // A damaged current bundle is an error naming the way back, not the embedded one.
        let dir = store.dir().join(&bundle.digest);
        std::fs::write(dir.join(testing::COMPONENT), b"damaged").expect("damage");
        let e = effective(&store).expect_err("damaged");
        assert!(matches!(e, SelectError::UnusableCurrent(_)));
        assert!(
            e.to_string().ends_with(
                "(the installed current bundle is unusable; `nodeward phases rollback` returns to last-good)"
            ),
            "{e}"
        );
    }

    #[test]
    fn an_unsigned_bundle_warns_and_runs_except_for_apply() {
        let tmp = tempfile::tempdir().expect("tmp");
        let (bundle, _) = testing::bundle(tmp.path(), "b", 1, |_| {});
        let path = tmp.path().join("b");
        let mut warned = None;
        let b = explicit(&path, RunMode::Plan, false, no_keys, |s| {
            warned = Some(s.clone())
        })
        .expect("plan runs it");
        assert_eq!(b.digest, bundle.digest);
        assert_eq!(warned, Some(BundleSource::Dir(path.clone())));

        let e = explicit(&path, RunMode::Apply, false, no_keys, |_| {
            panic!("refused before any warning")
        })
        .expect_err("apply refuses it");
        assert!(matches!(e, SelectError::UnsignedApply { .. }));
        assert!(
            e.to_string()
                .contains(": unsigned; apply runs only signed bundles")
        );

        let mut warned = false;
        explicit(&path, RunMode::Apply, true, no_keys, |_| warned = true).expect("allowed");
        assert!(warned);
    }

    #[test]
    fn a_signed_bundle_is_verified_and_never_runs_as_unsigned() {
        let tmp = tempfile::tempdir().expect("tmp");
        testing::bundle(tmp.path(), "b", 1, |_| {});
        let path = tmp.path().join("b");
        std::fs::write(path.join(bundle::SIGNATURE_FILE), b"not a signature").expect("sig");
        let e = explicit(&path, RunMode::Plan, true, no_keys, |_| {
            panic!("a signed bundle is not unsigned")
        })
        .expect_err("bad signature");
        assert!(
            matches!(e, SelectError::Bundle(BundleError::Signature { .. })),
            "{e}"
        );
        // The keys are loaded only for a signed bundle, and their error is kept apart.
        let e = explicit(
            &path,
            RunMode::Plan,
            true,
            || {
                Err(KeysError::NoKeyId {
                    file: "k.pub".into(),
                })
            },
            |_| {},
        )
        .expect_err("keys");
        assert!(matches!(e, SelectError::Keys(_)), "{e}");
    }
}
