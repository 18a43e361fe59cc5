//! A bundle's files as read from a directory or an archive, before anything is checked:
//! [`BundleFiles`], and why one file could not be read ([`FileError`]).

use super::{BundleError, BundleSource, MANIFEST_FILE, MAX_FILE_BYTES, SIGNATURE_FILE, archive};
use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;

/// Why one file of a bundle could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// The file system said no.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// A symlink, directory or special file where a bundle file should be.
    #[error("not a regular file")]
    NotRegular,
    /// Over [`MAX_FILE_BYTES`].
    #[error("larger than {MAX_FILE_BYTES} bytes")]
    TooLarge,
    /// The archive has no member of that name.
    #[error("the archive has no such member")]
    NoMember,
    /// The embedded bundle has no file of that name (a build bug).
    #[error("{0} is not in the embedded bundle")]
    NotEmbedded(String),
}

/// A bundle's files, read but not yet checked: the manifest, the signature if there is one,
/// and a way to read each component file.
pub struct BundleFiles {
    /// Where they came from.
    pub source: BundleSource,
    /// `manifest.toml`'s bytes.
    pub manifest: Vec<u8>,
    /// `manifest.toml.minisig`'s bytes, if present.
    pub signature: Option<Vec<u8>>,
    /// Archive members (an archive is read whole); empty for a directory.
    members: BTreeMap<String, Vec<u8>>,
}

impl BundleFiles {
    /// Reads the bundle at `path`: a directory, or a tar archive (optionally gzip).
    pub fn open(path: &Path) -> Result<Self, BundleError> {
        let meta = std::fs::metadata(path).map_err(|e| BundleError::Read {
            source_desc: format!("bundle {}", path.display()),
            file: path.display().to_string(),
            source: e.into(),
        })?;
        if meta.is_dir() {
            let source = BundleSource::Dir(path.to_path_buf());
            let manifest =
                read_limited(&path.join(MANIFEST_FILE)).map_err(|e| BundleError::Read {
                    source_desc: source.to_string(),
                    file: MANIFEST_FILE.into(),
                    source: e,
                })?;
            let sig_path = path.join(SIGNATURE_FILE);
            let signature = match std::fs::symlink_metadata(&sig_path) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                _ => Some(read_limited(&sig_path).map_err(|e| BundleError::Read {
                    source_desc: source.to_string(),
                    file: SIGNATURE_FILE.into(),
                    source: e,
                })?),
            };
            Ok(BundleFiles {
                source,
                manifest,
                signature,
                members: BTreeMap::new(),
            })
        } else {
            let source = BundleSource::Archive(path.to_path_buf());
            let members = archive::read(path).map_err(|e| BundleError::Archive {
                source_desc: source.to_string(),
                source: e,
            })?;
            Self::from_members(source, members)
        }
    }

    /// Reads a bundle archive (tar, optionally gzip) from `reader`, with the checks and caps of
    /// [`archive::read_from`]: a downloaded archive is read from its open temp file, which
    /// may have no name at all. `source` says where it came from.
    pub fn from_archive(source: BundleSource, reader: impl Read) -> Result<Self, BundleError> {
        let members = archive::read_from(reader).map_err(|e| BundleError::Archive {
            source_desc: source.to_string(),
            source: e,
        })?;
        Self::from_members(source, members)
    }

    /// An archive's members as a bundle's files: the manifest (which must be there), the
    /// signature if it is, the rest as components.
    fn from_members(
        source: BundleSource,
        mut members: BTreeMap<String, Vec<u8>>,
    ) -> Result<Self, BundleError> {
        let manifest = members
            .remove(MANIFEST_FILE)
            .ok_or_else(|| BundleError::Read {
                source_desc: source.to_string(),
                file: MANIFEST_FILE.into(),
                source: FileError::NoMember,
            })?;
        let signature = members.remove(SIGNATURE_FILE);
        Ok(BundleFiles {
            source,
            manifest,
            signature,
            members,
        })
    }

    /// The bytes of component file `name` (a plain file name, checked by the manifest parser).
    pub fn read(&self, name: &str) -> Result<Vec<u8>, FileError> {
        match &self.source {
            BundleSource::Dir(dir) | BundleSource::Installed(dir) => read_limited(&dir.join(name)),
            _ => self.members.get(name).cloned().ok_or(FileError::NoMember),
        }
    }
}

/// Reads a regular file (not through a symlink: a bundle's files are plain files) of at most
/// [`MAX_FILE_BYTES`].
fn read_limited(path: &Path) -> Result<Vec<u8>, FileError> {
    let meta = std::fs::symlink_metadata(path)?;
    if !meta.file_type().is_file() {
        return Err(FileError::NotRegular);
    }
    if meta.len() > MAX_FILE_BYTES {
        return Err(FileError::TooLarge);
    }
    let mut bytes = Vec::new();
    std::fs::File::open(path).and_then(|f| f.take(MAX_FILE_BYTES + 1).read_to_end(&mut bytes))?;
    Ok(bytes)
}
