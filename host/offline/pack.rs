//! `nodeward offline pack`: every pinned artifact of a config, downloaded through the
//! download engine and its artifact cache, and the phase bundle, in one archive.
//!
//! # Guarantees
//! - Only pinned artifacts are packed: a config with an unpinned one is refused before any
//!   request (the same rule as an apply).
//! - The downloads are the capability's own ([`Fetcher::cached`]): the same cache beneath the
//!   given root, the same trust, retries and size cap; nothing else on the host is written.
//! - Each artifact is hashed again while it is copied into the archive, so bytes changed in
//!   the cache since they were verified are never packed.
//! - The archive is written to a temp file beside `out` and renamed over it when complete:
//!   a failed pack leaves no partial archive.

use super::{
    ARTIFACTS_DIR, BUNDLE, MANIFEST, OfflineArtifact, OfflineBundle, OfflineError, OfflineManifest,
    SCHEMA, SIGNATURE, SIGNATURE_COMMENT,
};
use crate::bundle::{Bundle, BundleFiles, BundleSource};
use crate::caps::download::Fetcher;
use crate::node::version;
use nodeward_node_config::NodeConfig;
use serde::Serialize;
use sha2::{Digest, Sha256};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

/// What to pack.
pub struct PackRequest<'a> {
    /// The node config whose artifacts are packed.
    pub config: &'a NodeConfig,
    /// How errors name the config.
    pub config_source: &'a str,
    /// The bundle the node would run (`crate::bundle::select`).
    pub bundle: &'a Bundle,
    /// The minisign secret key to sign `offline.json` with, and its password.
    pub key: Option<(&'a Path, Option<String>)>,
    /// The archive to write.
    pub out: &'a Path,
}

/// What was packed.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Packed {
    /// The archive written.
    pub archive: PathBuf,
    /// Its `offline.json`.
    pub manifest: OfflineManifest,
    /// The key ID of the signature, when signed.
    pub signed_by: Option<String>,
    /// How many artifacts were served by the artifact cache (the rest were downloaded).
    pub from_cache: usize,
}

/// A tar header as bundle archives have them: mode 0644, owner 0, mtime 0.
fn header(size: u64) -> tar::Header {
    let mut h = tar::Header::new_ustar();
    h.set_size(size);
    h.set_mode(0o644);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    h.set_entry_type(tar::EntryType::Regular);
    h.set_cksum();
    h
}

/// The bundle's files as a bundle archive (manifest, signature when signed, components).
fn bundle_archive(bundle: &Bundle, archive: &Path) -> Result<(Vec<u8>, bool), OfflineError> {
    let refused = |source: crate::bundle::BundleError| OfflineError::Bundle {
        archive: archive.to_path_buf(),
        source: Box::new(source.into()),
    };
    let (manifest, signature) = match &bundle.source {
        BundleSource::Embedded => (
            crate::built::DEFAULT_BUNDLE_MANIFEST.as_bytes().to_vec(),
            None,
        ),
        BundleSource::Dir(p) | BundleSource::Archive(p) | BundleSource::Installed(p) => {
            let files = BundleFiles::open(p).map_err(refused)?;
            (files.manifest, files.signature)
        }
        BundleSource::Url(_) | BundleSource::Oci(_) => {
            return Err(OfflineError::Refused {
                archive: archive.to_path_buf(),
                reason: format!("{}: cannot be read again to pack it", bundle.source),
            });
        }
    };
    if crate::digest::sha256_hex(&manifest) != bundle.digest {
        return Err(OfflineError::Refused {
            archive: archive.to_path_buf(),
            reason: format!("{}: its manifest changed while packing", bundle.source),
        });
    }
    let mut files: Vec<(&str, &[u8])> = vec![(crate::bundle::MANIFEST_FILE, &manifest)];
    if let Some(sig) = &signature {
        files.push((crate::bundle::SIGNATURE_FILE, sig));
    }
    for p in &bundle.manifest.phases {
        files.push((
            p.component.as_str(),
            bundle.verified_component(&p.name).map_err(refused)?,
        ));
    }
    let io = |source| OfflineError::Io {
        archive: archive.to_path_buf(),
        source,
    };
    let mut b = tar::Builder::new(Vec::new());
    for (name, bytes) in files {
        b.append_data(&mut header(bytes.len() as u64), name, bytes)
            .map_err(io)?;
    }
    Ok((b.into_inner().map_err(io)?, signature.is_some()))
}

/// A reader that hashes what passes through it.
struct Hashing<R> {
    inner: R,
    hasher: Sha256,
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}

/// Packs `req` with `fetcher` (the run's download engine over the root's artifact cache).
pub fn pack(req: &PackRequest<'_>, fetcher: &Fetcher<'_>) -> Result<Packed, OfflineError> {
    let out = req.out;
    let io = |source| OfflineError::Io {
        archive: out.to_path_buf(),
        source,
    };
    let arch = version::arch();
    let artifacts = version::artifacts(req.config, arch);
    version::require_pinned(&artifacts, req.config_source)?;
    // Every artifact in the cache (downloaded when missing), verified, before anything is
    // written: a download that fails leaves no archive.
    let mut opened = Vec::new();
    let mut from_cache = 0;
    for a in &artifacts {
        let sha256 = a.sha256.clone().unwrap_or_default();
        let dl = |source| OfflineError::Download {
            archive: out.to_path_buf(),
            name: a.name.clone(),
            source: Box::new(source),
        };
        let url = url::Url::parse(&a.url).map_err(|e| OfflineError::Refused {
            archive: out.to_path_buf(),
            reason: format!("artifact {}: URL {:?}: {e}", a.name, a.url),
        })?;
        if fetcher.open_cached(&sha256).map_err(dl)?.is_some() {
            from_cache += 1;
        }
        let file = fetcher.cached(&url, &sha256).map_err(dl)?;
        let size = file.metadata().map_err(io)?.len();
        opened.push((
            OfflineArtifact {
                name: a.name.clone(),
                url: a.url.clone(),
                file: format!("{ARTIFACTS_DIR}{sha256}"),
                sha256,
                size,
            },
            file,
        ));
    }
    let (bundle_bytes, bundle_signed) = bundle_archive(req.bundle, out)?;
    let manifest = OfflineManifest {
        schema: SCHEMA,
        machine_name: req.config.machine_name.clone(),
        kubernetes_version: req.config.cluster.kubernetes_version.clone(),
        arch: arch.to_string(),
        artifacts: opened.iter().map(|(a, _)| a.clone()).collect(),
        bundle: OfflineBundle {
            file: BUNDLE.to_string(),
            sha256: crate::digest::sha256_hex(&bundle_bytes),
            size: bundle_bytes.len() as u64,
            digest: req.bundle.digest.clone(),
            name: req.bundle.manifest.bundle.name.clone(),
            version: req.bundle.manifest.bundle.version,
            signed: bundle_signed,
        },
    };
    let mut json = serde_json::to_vec_pretty(&manifest).map_err(|e| io(io::Error::other(e)))?;
    json.push(b'\n');
    let signature = match &req.key {
        Some((key, password)) => Some(
            crate::bundle::signature::sign_detached(
                &json,
                key,
                password.clone(),
                SIGNATURE_COMMENT,
                &format!(
                    "nodeward offline archive for {} (Kubernetes {})",
                    manifest.machine_name, manifest.kubernetes_version
                ),
            )
            .map_err(|source| OfflineError::Sign {
                archive: out.to_path_buf(),
                source,
            })?,
        ),
        None => None,
    };
    let dir = out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let tmp = tempfile::Builder::new()
        .prefix(".nodeward-tmp.offline.")
        .tempfile_in(dir)
        .map_err(io)?;
    let mut b = tar::Builder::new(io::BufWriter::new(tmp.as_file()));
    b.append_data(&mut header(json.len() as u64), MANIFEST, &json[..])
        .map_err(io)?;
    if let Some(sig) = &signature {
        b.append_data(&mut header(sig.len() as u64), SIGNATURE, sig.as_bytes())
            .map_err(io)?;
    }
    b.append_data(
        &mut header(bundle_bytes.len() as u64),
        BUNDLE,
        &bundle_bytes[..],
    )
    .map_err(io)?;
    for (a, file) in opened {
        let mut r = Hashing {
            inner: file.take(a.size),
            hasher: Sha256::new(),
        };
        b.append_data(&mut header(a.size), &a.file, &mut r)
            .map_err(io)?;
        let actual = hex::encode(r.hasher.finalize());
        if actual != a.sha256 {
            return Err(OfflineError::Refused {
                archive: out.to_path_buf(),
                reason: format!(
                    "artifact {}: its cache entry changed while it was packed (sha256 {actual}, \
                     expected {}); pack again",
                    a.name, a.sha256
                ),
            });
        }
    }
    let mut w = b.into_inner().map_err(io)?;
    w.flush().map_err(io)?;
    drop(w);
    tmp.as_file().sync_all().map_err(io)?;
    std::fs::set_permissions(
        tmp.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )
    .map_err(io)?;
    tmp.persist(out).map_err(|e| io(e.error))?;
    let signed_by = signature
        .as_deref()
        .and_then(crate::bundle::signature::signature_key_id);
    Ok(Packed {
        archive: out.to_path_buf(),
        manifest,
        signed_by,
        from_cache,
    })
}
