//! Small real bundles for the unit tests of this module tree: one phase (the embedded
//! `preflight` component, the real thing the runtime compiles), a version and grants the test
//! chooses.

use crate::bundle::{Bundle, BundleFiles, MANIFEST_FILE, pack};
use std::path::{Path, PathBuf};

/// The one phase's component file.
pub const COMPONENT: &str = "preflight.wasm";

/// The one `[[phases]]` table of a manifest table.
pub fn phase_table(t: &mut toml::Table) -> &mut toml::Table {
    t.get_mut("phases")
        .and_then(toml::Value::as_array_mut)
        .and_then(|a| a.first_mut())
        .and_then(toml::Value::as_table_mut)
        .expect("a phase")
}

/// A directory `parent/name` holding a manifest (version `version`, the embedded `preflight`
/// phase only, then `tweak`) and the component: what `phases pack` reads.
pub fn source_dir(
    parent: &Path,
    name: &str,
    version: u64,
    tweak: impl FnOnce(&mut toml::Table),
) -> PathBuf {
    let mut t: toml::Table = crate::built::DEFAULT_BUNDLE_MANIFEST
        .parse()
        .expect("embedded manifest");
    let phases = t
        .get_mut("phases")
        .and_then(toml::Value::as_array_mut)
        .expect("phases");
    phases.retain(|p| p.get("name").and_then(toml::Value::as_str) == Some("preflight"));
    t.get_mut("bundle")
        .and_then(toml::Value::as_table_mut)
        .expect("bundle")
        .insert(
            "version".into(),
            toml::Value::Integer(i64::try_from(version).expect("version")),
        );
    tweak(&mut t);
    let dir = parent.join(name);
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::fs::write(
        dir.join(MANIFEST_FILE),
        toml::to_string(&t).expect("manifest"),
    )
    .expect("write manifest");
    let wasm = crate::built::DEFAULT_BUNDLE_COMPONENTS
        .iter()
        .find(|(n, _)| *n == COMPONENT)
        .map(|(_, b)| *b)
        .expect("embedded preflight");
    std::fs::write(dir.join(COMPONENT), wasm).expect("write component");
    dir
}

/// A packed, loaded (unsigned) bundle directory `parent/name`; see [`source_dir`].
pub fn bundle(
    parent: &Path,
    name: &str,
    version: u64,
    tweak: impl FnOnce(&mut toml::Table),
) -> (Bundle, BundleFiles) {
    let dir = source_dir(parent, name, version, tweak);
    let packed = pack::fill_digests(&dir).expect("pack");
    std::fs::write(dir.join(MANIFEST_FILE), &packed.manifest).expect("write manifest");
    let files = BundleFiles::open(&dir).expect("open");
    let bundle = Bundle::from_files(&files).expect("load");
    (bundle, files)
}
