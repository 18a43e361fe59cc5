//! Bundle archives: a tar file (optionally gzip) holding a bundle directory's files.
//!
//! # Background
//! Platform teams publish one file; the agent reads it whole into memory (bundles are a few
//! MiB, capped by [`MAX_ARCHIVE_BYTES`]) and never extracts it onto the disk, so an archive
//! cannot write anywhere. What is installed is written by the store from the verified bytes.
//!
//! # Guarantees
//! Refused, each with an error naming the member: a truncated archive (a short member, a
//! missing end-of-archive marker, a truncated gzip stream), an absolute path or a `..`
//! component, a symlink, hard link or any member that is neither a regular file nor a
//! directory, a nested path, a duplicate member, and an archive larger than the cap.
//! Members may sit at the top (`manifest.toml`, `./manifest.toml`) or in one top directory
//! (`my-bundle/manifest.toml`, as `tar czf b.tgz my-bundle` makes).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Component, Path};

/// Why an archive was refused or could not be written; names the member at fault.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    /// The archive file cannot be read.
    #[error("cannot read: {0}")]
    Read(#[source] std::io::Error),
    /// The gzip layer does not decode.
    #[error("gzip stream is truncated or corrupt: {0}")]
    Gzip(#[source] std::io::Error),
    /// More than [`MAX_ARCHIVE_BYTES`] unpacked.
    #[error("archive is larger than {MAX_ARCHIVE_BYTES} bytes unpacked")]
    TooLarge,
    /// Not a tar archive at all.
    #[error("not a tar archive: {0}")]
    NotTar(#[source] std::io::Error),
    /// A header does not parse.
    #[error("archive is truncated or corrupt: {0}")]
    Corrupt(#[source] std::io::Error),
    /// An absolute path or a `..` component.
    #[error("member {name:?}: absolute paths and '..' are not allowed in a bundle")]
    UnsafePath {
        /// The member's name as stored.
        name: String,
    },
    /// A link, device, FIFO or anything else that is not a regular file or directory.
    #[error("member {name:?}: links and special files are not allowed in a bundle (type {kind:?})")]
    NotAFile {
        /// The member's name as stored.
        name: String,
        /// Its tar entry type.
        kind: tar::EntryType,
    },
    /// A member's data ends early.
    #[error("member {name:?}: archive is truncated: {source}")]
    TruncatedMember {
        /// The member's name as stored.
        name: String,
        /// The read error.
        source: std::io::Error,
    },
    /// A member has fewer bytes than its header says.
    #[error("member {name:?}: archive is truncated ({got} of {size} bytes)")]
    ShortMember {
        /// The member's name as stored.
        name: String,
        /// Bytes read.
        got: usize,
        /// Bytes the header declares.
        size: u64,
    },
    /// A member whose path names no file.
    #[error("member {name:?} has no file name")]
    NoFileName {
        /// The member's name as stored.
        name: String,
    },
    /// The archive ends at a member boundary without the end-of-archive marker.
    #[error("archive is truncated: no end-of-archive marker")]
    NoEndMarker,
    /// A member below a subdirectory (other than one top directory holding everything).
    #[error(
        "member {name:?}: bundle files must sit at the top of the archive or in one top directory"
    )]
    Nested {
        /// The member's path with the top directory stripped.
        name: String,
    },
    /// Two members with the same file name.
    #[error("member {name:?} appears twice")]
    Duplicate {
        /// The file name.
        name: String,
    },
    /// Writing the archive failed.
    #[error("{}: {source}", path.display())]
    Write {
        /// The archive being written.
        path: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// The most bytes an archive may unpack to.
pub const MAX_ARCHIVE_BYTES: u64 = 512 << 20;
const BLOCK: usize = 512;

/// Whether `path` names an archive (by extension) rather than a directory.
pub fn is_archive_name(path: &Path) -> bool {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    name.ends_with(".tar") || name.ends_with(".tar.gz") || name.ends_with(".tgz")
}

/// Reads the archive at `path` into (member file name → bytes).
pub fn read(path: &Path) -> Result<BTreeMap<String, Vec<u8>>, ArchiveError> {
    let file = std::fs::File::open(path).map_err(ArchiveError::Read)?;
    read_from(file)
}

/// Reads an archive from `reader` into (member file name → bytes), with the same checks and
/// caps as [`read`]. The seam the fuzzer (`fuzz/`) feeds bytes through without a file.
pub fn read_from(reader: impl Read) -> Result<BTreeMap<String, Vec<u8>>, ArchiveError> {
    let mut raw = Vec::new();
    reader
        .take(MAX_ARCHIVE_BYTES + 1)
        .read_to_end(&mut raw)
        .map_err(ArchiveError::Read)?;
    let tar = if raw.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(raw.as_slice())
            .take(MAX_ARCHIVE_BYTES + 1)
            .read_to_end(&mut out)
            .map_err(ArchiveError::Gzip)?;
        out
    } else {
        raw
    };
    if tar.len() as u64 > MAX_ARCHIVE_BYTES {
        return Err(ArchiveError::TooLarge);
    }
    parse(&tar)
}

fn parse(tar_bytes: &[u8]) -> Result<BTreeMap<String, Vec<u8>>, ArchiveError> {
    let mut archive = tar::Archive::new(tar_bytes);
    let mut files: Vec<(Vec<String>, Vec<u8>)> = Vec::new();
    let mut end = 0usize;
    let entries = archive.entries().map_err(ArchiveError::NotTar)?;
    for entry in entries {
        let mut entry = entry.map_err(ArchiveError::Corrupt)?;
        let name = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        let kind = entry.header().entry_type();
        let mut parts = Vec::new();
        for c in Path::new(&name).components() {
            match c {
                Component::Normal(p) => parts.push(p.to_string_lossy().into_owned()),
                Component::CurDir => {}
                Component::ParentDir | Component::RootDir | Component::Prefix(_) => {
                    return Err(ArchiveError::UnsafePath { name });
                }
            }
        }
        if kind.is_dir() {
            continue;
        }
        if !kind.is_file() {
            return Err(ArchiveError::NotAFile { name, kind });
        }
        let size = entry.size();
        let mut bytes = Vec::new();
        if let Err(source) = entry.read_to_end(&mut bytes) {
            return Err(ArchiveError::TruncatedMember { name, source });
        }
        if bytes.len() as u64 != size {
            return Err(ArchiveError::ShortMember {
                name,
                got: bytes.len(),
                size,
            });
        }
        let start = usize::try_from(entry.raw_file_position()).unwrap_or(usize::MAX);
        end = start.saturating_add(bytes.len().div_ceil(BLOCK) * BLOCK);
        if parts.is_empty() {
            return Err(ArchiveError::NoFileName { name });
        }
        files.push((parts, bytes));
    }
    // tar stops at end of input as quietly as at the end-of-archive marker; a missing marker
    // means the archive was cut at a member boundary.
    let marker = tar_bytes.get(end..end.saturating_add(2 * BLOCK));
    if !marker.is_some_and(|m| m.iter().all(|b| *b == 0)) {
        return Err(ArchiveError::NoEndMarker);
    }
    // One top directory holding everything is stripped.
    let strip = !files.is_empty()
        && files
            .iter()
            .all(|(p, _)| p.len() == 2 && p[0] == files[0].0[0]);
    let mut out = BTreeMap::new();
    for (parts, bytes) in files {
        let parts = if strip { &parts[1..] } else { &parts[..] };
        if parts.len() != 1 {
            return Err(ArchiveError::Nested {
                name: parts.join("/"),
            });
        }
        let name = parts[0].clone();
        if out.insert(name.clone(), bytes).is_some() {
            return Err(ArchiveError::Duplicate { name });
        }
    }
    Ok(out)
}

/// Writes `files` (name → bytes, in order) as a tar archive at `path`, gzip-compressed when
/// the name ends in `.gz` or `.tgz`. Headers are normalized (mode 0644, owner 0, mtime 0) so
/// the same files always make the same archive. Written to a temporary file, then renamed;
/// mode 0644.
pub fn write(path: &Path, files: &[(&str, &[u8])]) -> Result<(), ArchiveError> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let err = |source: std::io::Error| ArchiveError::Write {
        path: path.to_path_buf(),
        source,
    };
    let tmp = tempfile::NamedTempFile::new_in(dir).map_err(err)?;
    let gzip = path
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.ends_with(".gz") || n.ends_with(".tgz"));
    let mut builder = tar::Builder::new(Vec::new());
    for (name, bytes) in files {
        let mut header = tar::Header::new_ustar();
        header.set_size(bytes.len() as u64);
        header.set_mode(0o644);
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(0);
        header.set_entry_type(tar::EntryType::Regular);
        builder
            .append_data(&mut header, name, *bytes)
            .map_err(err)?;
    }
    let mut tar_bytes = builder.into_inner().map_err(err)?;
    if gzip {
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        enc.write_all(&tar_bytes).map_err(err)?;
        tar_bytes = enc.finish().map_err(err)?;
    }
    tmp.as_file().write_all(&tar_bytes).map_err(err)?;
    // Archives are published, not secret: readable by all, like the files inside them.
    {
        use std::os::unix::fs::PermissionsExt;
        tmp.as_file()
            .set_permissions(std::fs::Permissions::from_mode(0o644))
            .map_err(err)?;
    }
    tmp.as_file().sync_all().map_err(err)?;
    tmp.persist(path).map_err(|e| err(e.error))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tar with one member whose raw name and type are set directly (the builder refuses
    /// unsafe names, which is exactly what a hostile archive would carry).
    fn raw_tar(name: &str, kind: tar::EntryType, data: &[u8]) -> Vec<u8> {
        let mut header = tar::Header::new_ustar();
        header.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
        header.set_size(data.len() as u64);
        header.set_entry_type(kind);
        if kind == tar::EntryType::Symlink {
            header.set_link_name("/etc/shadow").expect("link name");
        }
        header.set_cksum();
        let mut out = header.as_bytes().to_vec();
        out.extend_from_slice(data);
        out.resize(out.len().div_ceil(BLOCK) * BLOCK, 0);
        out.extend_from_slice(&[0; 2 * BLOCK]);
        out
    }

    #[test]
    fn unsafe_members_are_refused() {
        let regular = tar::EntryType::Regular;
        for (name, kind, needle) in [
            ("../manifest.toml", regular, "'..'"),
            ("/manifest.toml", regular, "absolute"),
            ("manifest.toml", tar::EntryType::Symlink, "links"),
            ("manifest.toml", tar::EntryType::Link, "links"),
            ("a/b/manifest.toml", regular, "top of the archive"),
        ] {
            let err = parse(&raw_tar(name, kind, b"x"))
                .expect_err(name)
                .to_string();
            assert!(err.contains(needle), "{name}: {err}");
        }
        let ok = parse(&raw_tar("./manifest.toml", regular, b"x")).expect("plain member");
        assert_eq!(ok.get("manifest.toml").map(Vec::as_slice), Some(&b"x"[..]));
    }

    #[test]
    fn read_from_bytes_equals_read_from_the_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        for name in ["b.tar", "b.tgz"] {
            let path = dir.path().join(name);
            write(&path, &[("manifest.toml", b"m"), ("a.wasm", &[1, 2, 3])]).expect("write");
            let bytes = std::fs::read(&path).expect("read back");
            let from_file = read(&path).expect("read");
            assert_eq!(read_from(bytes.as_slice()).expect("read_from"), from_file);
            assert_eq!(
                from_file.get("a.wasm").map(Vec::as_slice),
                Some(&[1, 2, 3][..])
            );
            let err = read_from(&bytes[..bytes.len() - 1])
                .expect_err("truncated")
                .to_string();
            assert!(err.contains("truncated"), "{name}: {err}");
        }
    }

    #[test]
    fn truncation_is_refused() {
        let tar = raw_tar("manifest.toml", tar::EntryType::Regular, &[7; 2000]);
        for cut in [100, 600, 2000, tar.len() - 2 * BLOCK] {
            let err = parse(&tar[..cut]).expect_err("truncated").to_string();
            assert!(err.contains("truncated"), "cut at {cut}: {err}");
        }
        assert!(parse(&tar).is_ok());
    }
}
