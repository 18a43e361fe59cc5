//! Making and signing bundles (`phases pack`, `phases sign`).
//!
//! # Background
//! A platform team writes a `manifest.toml` (phases, worlds, grants) next to the component
//! files. [`pack`] fills in each phase's sha256 from its file, checks the result exactly as the
//! agent will load it, and writes a bundle directory or archive. [`sign`] adds the detached
//! signature to an existing bundle.
//!
//! # Guarantees
//! - Nothing is written unless the packed manifest loads: a manifest the agent would refuse is
//!   never packed, and never signed.
//! - Only the `sha256` fields change; everything else in the manifest is kept (re-serialised,
//!   so comments and layout are not).
//! - An existing output directory is never overwritten; an archive is replaced atomically.

use crate::bundle::archive::{self, ArchiveError};
use crate::bundle::signature::{self, SignError};
use crate::bundle::{self, Bundle, BundleError, BundleFiles, BundleSource, FileError};
use std::path::{Path, PathBuf};

/// Why a bundle could not be packed or signed; names the file at fault.
#[derive(Debug, thiserror::Error)]
pub enum PackError {
    /// A file cannot be read.
    #[error("{}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The manifest is not TOML.
    #[error("{}: {source}", path.display())]
    Parse {
        /// The manifest.
        path: PathBuf,
        /// What the parser said.
        source: toml::de::Error,
    },
    /// The manifest has no `[[phases]]` array.
    #[error("{}: no [[phases]]", path.display())]
    NoPhases {
        /// The manifest.
        path: PathBuf,
    },
    /// A `[[phases]]` entry is not a table.
    #[error("{}: phases[{index}] is not a table", path.display())]
    NotATable {
        /// The manifest.
        path: PathBuf,
        /// The entry.
        index: usize,
    },
    /// A phase's component is not a plain file name in the directory.
    #[error("{}: phases[{index}].component must be a plain file name", path.display())]
    BadComponent {
        /// The manifest.
        path: PathBuf,
        /// The entry.
        index: usize,
    },
    /// The rewritten manifest cannot be encoded.
    #[error(transparent)]
    Encode(#[from] toml::ser::Error),
    /// The packed bundle would not load.
    #[error(transparent)]
    Bundle(#[from] BundleError),
    /// The archive cannot be written.
    #[error(transparent)]
    Archive(#[from] ArchiveError),
    /// The output directory exists.
    #[error("{}: already exists", path.display())]
    Exists {
        /// The output.
        path: PathBuf,
    },
    /// A file of the output cannot be written.
    #[error("{}: {source}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The signature cannot be made.
    #[error(transparent)]
    Sign(#[from] SignError),
}

/// A manifest with its digests filled in, and the component files it names, in order.
#[derive(Clone, Debug)]
pub struct Packed {
    /// The rewritten `manifest.toml`.
    pub manifest: Vec<u8>,
    /// (file name, bytes) of each phase's component.
    pub components: Vec<(String, Vec<u8>)>,
}

impl Packed {
    /// sha256 of the manifest: the bundle's digest.
    pub fn digest(&self) -> String {
        bundle::sha256_hex(&self.manifest)
    }

    /// Every file of the bundle, the manifest first.
    pub fn files(&self) -> Vec<(&str, &[u8])> {
        let mut all: Vec<(&str, &[u8])> = vec![(bundle::MANIFEST_FILE, &self.manifest)];
        all.extend(
            self.components
                .iter()
                .map(|(n, b)| (n.as_str(), b.as_slice())),
        );
        all
    }
}

/// Reads `dir/manifest.toml` and each component file it names, and sets every phase's
/// `sha256` to its file's. Checks the result as the agent loads it.
pub fn fill_digests(dir: &Path) -> Result<Packed, PackError> {
    let path = dir.join(bundle::MANIFEST_FILE);
    let text = std::fs::read_to_string(&path).map_err(|source| PackError::Read {
        path: path.clone(),
        source,
    })?;
    let mut table: toml::Table = text.parse().map_err(|source| PackError::Parse {
        path: path.clone(),
        source,
    })?;
    let mut components: Vec<(String, Vec<u8>)> = Vec::new();
    let Some(phases) = table.get_mut("phases").and_then(toml::Value::as_array_mut) else {
        return Err(PackError::NoPhases { path });
    };
    for (index, entry) in phases.iter_mut().enumerate() {
        let Some(t) = entry.as_table_mut() else {
            return Err(PackError::NotATable { path, index });
        };
        let Some(component) = t
            .get("component")
            .and_then(toml::Value::as_str)
            .filter(|c| !c.is_empty() && !c.contains('/') && !c.starts_with('.'))
            .map(str::to_string)
        else {
            return Err(PackError::BadComponent { path, index });
        };
        let file = dir.join(&component);
        let bytes =
            std::fs::read(&file).map_err(|source| PackError::Read { path: file, source })?;
        t.insert(
            "sha256".into(),
            toml::Value::String(bundle::sha256_hex(&bytes)),
        );
        components.push((component, bytes));
    }
    let packed = Packed {
        manifest: toml::to_string(&table)?.into_bytes(),
        components,
    };
    // Check the result exactly as the agent will, before anything is written.
    Bundle::from_parts(
        &packed.manifest,
        BundleSource::Dir(dir.to_path_buf()),
        |f| {
            packed
                .components
                .iter()
                .find(|(n, _)| n == f)
                .map(|(_, b)| b.clone())
                .ok_or(FileError::NoMember)
        },
    )?;
    Ok(packed)
}

/// Packs `dir` (see [`fill_digests`]) into `out`: an archive when its name says so
/// ([`archive::is_archive_name`]), else a new directory.
pub fn pack(dir: &Path, out: &Path) -> Result<Packed, PackError> {
    let packed = fill_digests(dir)?;
    let all = packed.files();
    if archive::is_archive_name(out) {
        archive::write(out, &all)?;
    } else {
        if out.exists() {
            return Err(PackError::Exists {
                path: out.to_path_buf(),
            });
        }
        let write_err = |path: &Path| {
            let path = path.to_path_buf();
            move |source| PackError::Write { path, source }
        };
        std::fs::create_dir_all(out).map_err(write_err(out))?;
        for (name, bytes) in &all {
            let p = out.join(name);
            std::fs::write(&p, bytes).map_err(write_err(&p))?;
        }
    }
    Ok(packed)
}

/// Writes the bundle embedded in this binary (manifest with digests, components; unsigned)
/// to `out`, the starting point of a platform team's own bundle: an archive when its name says
/// so, else a directory that must not exist or be empty (nothing is overwritten).
pub fn export_embedded(out: &Path) -> Result<Bundle, PackError> {
    let bundle = Bundle::embedded()?;
    let mut files: Vec<(&str, &[u8])> = vec![(
        bundle::MANIFEST_FILE,
        crate::built::DEFAULT_BUNDLE_MANIFEST.as_bytes(),
    )];
    for p in &bundle.manifest.phases {
        files.push((p.component.as_str(), bundle.verified_component(&p.name)?));
    }
    if archive::is_archive_name(out) {
        archive::write(out, &files)?;
        return Ok(bundle);
    }
    let write_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| PackError::Write { path, source }
    };
    let empty = match std::fs::read_dir(out) {
        Ok(mut entries) => entries.next().is_none(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
        Err(e) => return Err(write_err(out)(e)),
    };
    if !empty {
        return Err(PackError::Exists {
            path: out.to_path_buf(),
        });
    }
    std::fs::create_dir_all(out).map_err(write_err(out))?;
    for (name, bytes) in &files {
        let p = out.join(name);
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&p)
            .and_then(|mut f| std::io::Write::write_all(&mut f, bytes))
            .map_err(write_err(&p))?;
    }
    Ok(bundle)
}

/// Signs the bundle at `path` (directory or archive) with the minisign secret key `key`,
/// whose password, if it has one, is the first line of `password_file` (or asked on a
/// terminal). A directory gets `manifest.toml.minisig`; an archive is rewritten with it.
/// Returns the bundle signed.
pub fn sign(path: &Path, key: &Path, password_file: Option<&Path>) -> Result<Bundle, PackError> {
    let files = BundleFiles::open(path)?;
    // Parse and digest-check first: never sign a manifest the agent would refuse.
    let bundle = Bundle::from_files(&files)?;
    let password = match password_file {
        Some(p) => Some(
            std::fs::read_to_string(p)
                .map_err(|source| PackError::Read {
                    path: p.to_path_buf(),
                    source,
                })?
                .trim_end_matches(['\n', '\r'])
                .to_string(),
        ),
        None => None,
    };
    let meta = &bundle.manifest.bundle;
    let sig = signature::sign(&files.manifest, key, password, &meta.name, meta.version)?;
    if path.is_dir() {
        let p = path.join(bundle::SIGNATURE_FILE);
        std::fs::write(&p, &sig).map_err(|source| PackError::Write { path: p, source })?;
    } else {
        let mut all: Vec<(&str, &[u8])> = vec![
            (bundle::MANIFEST_FILE, &files.manifest),
            (bundle::SIGNATURE_FILE, sig.as_bytes()),
        ];
        for p in &bundle.manifest.phases {
            all.push((p.component.as_str(), bundle.verified_component(&p.name)?));
        }
        archive::write(path, &all)?;
    }
    Ok(bundle)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bundle::testing;

    #[test]
    fn pack_fills_every_digest_and_loads_as_the_agent_loads_it() {
        let tmp = tempfile::tempdir().expect("tmp");
        let src = testing::source_dir(tmp.path(), "src", 3, |t| {
            // A wrong digest is replaced, not trusted.
            testing::phase_table(t).insert("sha256".into(), "0".repeat(64).into());
        });
        for out in ["out", "out.tar", "out.tgz"] {
            let out = tmp.path().join(out);
            let packed = pack(&src, &out).expect("pack");
            assert_eq!(packed.components.len(), 1);
            let files = BundleFiles::open(&out).expect("open");
            let b = Bundle::from_files(&files).expect("loads");
            assert_eq!(b.digest, packed.digest());
            assert_eq!(b.manifest.bundle.version, 3);
            let bytes = std::fs::read(src.join(testing::COMPONENT)).expect("component");
            assert_eq!(b.manifest.phases[0].sha256, bundle::sha256_hex(&bytes));
        }
        // The same inputs make the same archive.
        let again = tmp.path().join("again.tgz");
        pack(&src, &again).expect("pack again");
        assert_eq!(
            std::fs::read(&again).expect("again"),
            std::fs::read(tmp.path().join("out.tgz")).expect("first")
        );
    }

    #[test]
    fn pack_refuses_what_the_agent_would_refuse_and_writes_nothing() {
        let tmp = tempfile::tempdir().expect("tmp");
        type Tweak = fn(&mut toml::Table);
        let cases: [(&str, Tweak, &str); 4] = [
            ("no-phases", |t| drop(t.remove("phases")), "no [[phases]]"),
            (
                "nested",
                |t| drop(testing::phase_table(t).insert("component".into(), "a/b.wasm".into())),
                "phases[0].component must be a plain file name",
            ),
            (
                "missing",
                |t| drop(testing::phase_table(t).insert("component".into(), "gone.wasm".into())),
                "gone.wasm: No such file",
            ),
            (
                "bad-world",
                |t| drop(testing::phase_table(t).insert("world".into(), "probe".into())),
                "unknown world \"probe\"",
            ),
        ];
        for (name, tweak, needle) in cases {
            let src = testing::source_dir(tmp.path(), name, 1, tweak);
            let out = tmp.path().join(format!("{name}.tar"));
            let e = pack(&src, &out).expect_err(name).to_string();
            assert!(e.contains(needle), "{name}: {e}");
            assert!(!out.exists(), "{name}: nothing written");
        }
        let src = testing::source_dir(tmp.path(), "ok", 1, |_| {});
        let out = tmp.path().join("exists");
        std::fs::create_dir(&out).expect("mkdir");
        let e = pack(&src, &out).expect_err("exists");
        assert!(matches!(e, PackError::Exists { .. }), "{e}");
    }
}
