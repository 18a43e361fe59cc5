//! Reading an offline archive: its bounds and order checked member by member, its signature
//! (when signed) before its table of contents is parsed, its artifacts hashed into the
//! artifact cache when the config pins them, its bundle read for the caller to select.
//!
//! # Guarantees
//! See the module doc of [`super`]: regular members with the known names only, each within
//! its cap and of the size `offline.json` lists, `offline.json` first and its signature
//! second, nothing twice, nothing listed missing. A refusal may leave artifacts it had
//! already verified in the cache: they are content-addressed and hashed at every use, so
//! that is only a download saved.

use super::{
    BUNDLE, MANIFEST, MAX_MANIFEST_BYTES, MAX_MEMBERS, MAX_SIGNATURE_BYTES, OfflineError,
    OfflineManifest, SCHEMA, SIGNATURE, SIGNATURE_COMMENT, artifact_digest,
};
use crate::bundle::fetch::MAX_BUNDLE_BYTES;
use crate::bundle::signature::{KeysError, TrustedKeys, verify_detached};
use crate::bundle::{BundleFiles, BundleSource};
use crate::caps::download::{FetchPolicy, Fetcher, Imported};
use nodeward_node_config::NodeConfig;
use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::{Path, PathBuf};

/// An offline archive, checked, with its artifacts in the cache.
pub struct Opened {
    /// Its `offline.json`.
    pub manifest: OfflineManifest,
    /// The key ID of its signature, when signed.
    pub signed_by: Option<String>,
    /// Its bundle's files (not yet selected: `crate::bundle::select::from_files`).
    pub bundle: BundleFiles,
    /// What became of each artifact the config pins and the archive carries, by name.
    pub imported: BTreeMap<String, Imported>,
    /// The artifacts of the archive the config does not pin (skipped), by name.
    pub skipped: Vec<String>,
}

/// Reads `member`'s bytes, at most `max`.
fn read_capped(
    archive: &Path,
    member: &str,
    r: &mut impl Read,
    size: u64,
    max: u64,
) -> Result<Vec<u8>, OfflineError> {
    if size > max {
        return Err(refused(
            archive,
            format!("{member}: {size} bytes, over its cap of {max}"),
        ));
    }
    let mut bytes = Vec::new();
    r.take(max + 1).read_to_end(&mut bytes).map_err(|e| {
        refused(
            archive,
            format!("{member}: cannot be read (truncated?): {e}"),
        )
    })?;
    if bytes.len() as u64 != size {
        return Err(refused(
            archive,
            format!("{member}: {} bytes, not {size} (truncated?)", bytes.len()),
        ));
    }
    Ok(bytes)
}

fn refused(archive: &Path, reason: String) -> OfflineError {
    OfflineError::Refused {
        archive: archive.to_path_buf(),
        reason,
    }
}

/// Checks the signature (when there is one) and parses `offline.json`.
fn accept(
    archive: &Path,
    json: &[u8],
    signature: Option<&[u8]>,
    keys: impl FnOnce() -> Result<TrustedKeys, KeysError>,
) -> Result<(OfflineManifest, Option<String>), OfflineError> {
    let signed_by = match signature {
        Some(sig) => {
            let sig_err = |source| OfflineError::Signature {
                archive: archive.to_path_buf(),
                source: Box::new(source),
            };
            let (key_id, comment) = verify_detached(json, sig, &keys()?).map_err(sig_err)?;
            if comment != SIGNATURE_COMMENT {
                return Err(refused(
                    archive,
                    format!(
                        "{SIGNATURE}: trusted comment {comment:?} is not an offline archive's \
                         ({SIGNATURE_COMMENT:?})"
                    ),
                ));
            }
            Some(key_id)
        }
        None => None,
    };
    let manifest: OfflineManifest =
        serde_json::from_slice(json).map_err(|e| refused(archive, format!("{MANIFEST}: {e}")))?;
    let bad_file = manifest.bundle.file != BUNDLE
        || manifest
            .artifacts
            .iter()
            .any(|a| artifact_digest(&a.file) != Some(a.sha256.as_str()));
    if bad_file {
        return Err(refused(
            archive,
            format!("{MANIFEST}: a member is not named {BUNDLE} or artifacts/<its sha256>"),
        ));
    }
    if manifest.schema != SCHEMA {
        return Err(refused(
            archive,
            format!(
                "{MANIFEST}: schema {} is not {SCHEMA}, the one this agent reads",
                manifest.schema
            ),
        ));
    }
    Ok((manifest, signed_by))
}

/// Reads the offline archive at `path`: checks it, imports into the artifact cache (through
/// `fetcher`) every artifact whose digest `config` pins, and returns its bundle's files.
/// `keys` is called only when the archive is signed.
pub fn import(
    path: &Path,
    config: &NodeConfig,
    fetcher: &Fetcher<'_>,
    keys: impl FnOnce() -> Result<TrustedKeys, KeysError>,
) -> Result<Opened, OfflineError> {
    let io = |source| OfflineError::Io {
        archive: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    if !file.metadata().map_err(io)?.is_file() {
        return Err(refused(path, "not a regular file".into()));
    }
    // The config's pins: the only digests that may enter the cache.
    let pins: BTreeMap<String, String> =
        crate::node::version::artifacts(config, crate::node::version::arch())
            .into_iter()
            .filter_map(|a| Some((a.sha256?, a.name)))
            .collect();
    let mut tar = tar::Archive::new(std::io::BufReader::new(file));
    let entries = tar
        .entries()
        .map_err(|e| refused(path, format!("not a tar archive: {e}")))?;
    let mut keys = Some(keys);
    let mut json: Option<Vec<u8>> = None;
    let mut accepted: Option<(OfflineManifest, Option<String>)> = None;
    let mut bundle = None;
    let mut seen = BTreeSet::new();
    let mut imported = BTreeMap::new();
    let mut skipped = Vec::new();
    for (index, entry) in entries.enumerate() {
        let mut entry =
            entry.map_err(|e| refused(path, format!("truncated or not a tar archive: {e}")))?;
        if index >= MAX_MEMBERS {
            return Err(refused(path, format!("more than {MAX_MEMBERS} members")));
        }
        let name = String::from_utf8(entry.path_bytes().into_owned())
            .map_err(|_| refused(path, "a member name that is not UTF-8".into()))?;
        if entry.header().entry_type() != tar::EntryType::Regular {
            return Err(refused(
                path,
                format!(
                    "{name:?}: not a regular file ({:?}); links, directories and devices are refused",
                    entry.header().entry_type()
                ),
            ));
        }
        if !seen.insert(name.clone()) {
            return Err(refused(path, format!("{name:?} appears twice")));
        }
        let size = entry.size();
        if index == 0 {
            if name != MANIFEST {
                return Err(refused(
                    path,
                    format!("its first member is {name:?}, not {MANIFEST}"),
                ));
            }
            json = Some(read_capped(
                path,
                MANIFEST,
                &mut entry,
                size,
                MAX_MANIFEST_BYTES,
            )?);
            continue;
        }
        if index == 1 && name == SIGNATURE {
            let sig = read_capped(path, SIGNATURE, &mut entry, size, MAX_SIGNATURE_BYTES)?;
            let keys = keys
                .take()
                .ok_or_else(|| refused(path, "keys used twice".into()))?;
            accepted = Some(accept(
                path,
                json.as_deref().unwrap_or_default(),
                Some(&sig),
                keys,
            )?);
            continue;
        }
        if accepted.is_none() {
            accepted = Some(accept(
                path,
                json.as_deref().unwrap_or_default(),
                None,
                || Ok(TrustedKeys::default()),
            )?);
        }
        let Some((manifest, _)) = &accepted else {
            return Err(refused(path, format!("{MANIFEST} could not be read")));
        };
        if name == BUNDLE {
            let want = &manifest.bundle;
            let max = MAX_BUNDLE_BYTES.min(want.size);
            let bytes = read_capped(path, BUNDLE, &mut entry, size, max)?;
            let actual = crate::digest::sha256_hex(&bytes);
            if actual != want.sha256 {
                return Err(refused(
                    path,
                    format!(
                        "{BUNDLE}: sha256 {actual}, but {MANIFEST} lists {}",
                        want.sha256
                    ),
                ));
            }
            let source =
                BundleSource::Archive(PathBuf::from(format!("{}:{BUNDLE}", path.display())));
            let files = BundleFiles::from_archive(source, &bytes[..]).map_err(|e| {
                OfflineError::Bundle {
                    archive: path.to_path_buf(),
                    source: Box::new(e.into()),
                }
            })?;
            let digest = crate::digest::sha256_hex(&files.manifest);
            if digest != want.digest {
                return Err(refused(
                    path,
                    format!(
                        "{BUNDLE}: digest {digest}, but {MANIFEST} lists {}",
                        want.digest
                    ),
                ));
            }
            bundle = Some(files);
            continue;
        }
        let Some(digest) = artifact_digest(&name).map(str::to_string) else {
            return Err(refused(
                path,
                format!(
                    "unexpected member {name:?} (an offline archive holds {MANIFEST}, {SIGNATURE}, \
                     {BUNDLE} and artifacts/<sha256> only)"
                ),
            ));
        };
        let Some(listed) = manifest.artifacts.iter().find(|a| a.file == name) else {
            return Err(refused(path, format!("{name}: not listed in {MANIFEST}")));
        };
        if size != listed.size || size > FetchPolicy::default().max_bytes {
            return Err(refused(
                path,
                format!(
                    "{name}: {size} bytes, but {MANIFEST} lists {} (or over the download cap)",
                    listed.size
                ),
            ));
        }
        let Some(pinned_name) = pins.get(&digest) else {
            skipped.push(listed.name.clone());
            continue;
        };
        let outcome =
            fetcher
                .import(&digest, &mut entry)
                .map_err(|source| OfflineError::Download {
                    archive: path.to_path_buf(),
                    name: pinned_name.clone(),
                    source: Box::new(source),
                })?;
        if let Imported::Mismatch { actual } = outcome {
            return Err(OfflineError::Mismatch {
                archive: path.to_path_buf(),
                name: pinned_name.clone(),
                member: name,
                expected: digest,
                actual,
            });
        }
        imported.insert(pinned_name.clone(), outcome);
    }
    let Some(json) = json else {
        return Err(refused(path, format!("empty: it has no {MANIFEST}")));
    };
    let (manifest, signed_by) = match accepted {
        Some(a) => a,
        None => accept(path, &json, None, || Ok(TrustedKeys::default()))?,
    };
    let missing: Vec<&str> = std::iter::once(manifest.bundle.file.as_str())
        .chain(manifest.artifacts.iter().map(|a| a.file.as_str()))
        .filter(|f| !seen.contains(*f))
        .collect();
    let Some(bundle) = bundle.filter(|_| missing.is_empty()) else {
        return Err(refused(
            path,
            format!(
                "{MANIFEST} lists {} that the archive does not hold (truncated?)",
                missing.join(", ")
            ),
        ));
    };
    Ok(Opened {
        manifest,
        signed_by,
        bundle,
        imported,
        skipped,
    })
}
