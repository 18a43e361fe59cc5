//! Which certificate authorities an HTTPS download trusts: [`Trust`].
//!
//! # Background
//! reqwest built with rustls trusts the roots compiled into it (webpki-roots) unless told
//! otherwise, which is neither what the machine trusts nor something an operator can change.
//! nodeward trusts the **system trust store** instead, as curl, containerd and the kubelet do:
//! the bundle `rustls-native-certs` finds (`SSL_CERT_FILE` / `SSL_CERT_DIR` when set, else
//! OpenSSL's usual locations, `/etc/ssl/certs/ca-certificates.crt` on Debian). A CA removed from
//! the store is no longer trusted by nodeward either. A private mirror's CA is added with the
//! node config's `downloadOptions.caFile`, **in addition to** the system store, as containerd's
//! `hosts.toml` `ca` and Docker's `certs.d/<host>/ca.crt` add theirs: a mirror that redirects to
//! a public CDN keeps working, and nothing the system trusts is dropped by accident. Phase
//! bundles fetched by URL or pulled from an OCI registry (`phases install`, the daemon's
//! roll-out) trust the same roots: a bundle from a private mirror or registry needs nothing an
//! artifact from it does not.
//!
//! # Guarantees
//! - One TLS stack: rustls with ring, without reqwest's bundled roots (its
//!   `rustls-tls-manual-roots` feature) nor, for OCI pulls (reqwest 0.13), the platform
//!   verifier; every root is added here.
//! - The system store is read once per process, when the first HTTPS client is built (a cache
//!   hit reads nothing). Certificates rustls cannot use are skipped and counted, as reqwest's own
//!   native-roots loader does; a store with no usable certificate is a warning, not an error
//!   (the `caFile` may be all the node needs).
//! - `caFile` is read by the host, never by a phase, when the run starts: beneath the host
//!   root (cap-std: a link cannot lead out of it), a regular file only (never a FIFO or device
//!   that would block or never end), at most [`MAX_CA_FILE_BYTES`]. Every certificate in it must
//!   be a usable trust anchor, and it must hold at least one.
//! - A [`TrustError`] names the file and says what is wrong, but never quotes the file: the
//!   PEM parser's own errors (which quote the offending line) are not passed on, so a `caFile`
//!   pointed at a secret yields "holds no certificate", not the secret.

use crate::hostpath::{HostPath, HostRoot};
use cap_std::fs::{OpenOptions, OpenOptionsExt};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use std::io::{self, Read};
use std::sync::{Arc, OnceLock};

/// The largest `caFile` read (a full public bundle is about 200 KiB).
pub const MAX_CA_FILE_BYTES: u64 = 1 << 20;

/// Why `caFile` cannot be used; each names the file as configured.
#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    /// The path is not one the host resolves beneath its root.
    #[error("{path}: not a usable path (absolute, without `.`, `..` or empty components)")]
    Path {
        /// The file as configured.
        path: String,
    },
    /// Opening or reading it failed (missing, unreadable, a link leading out of the root).
    #[error("{path}: cannot read: {source}")]
    Read {
        /// The file as configured.
        path: String,
        /// The I/O error (never the file's contents).
        #[source]
        source: io::Error,
    },
    /// It is a directory, FIFO, device or socket.
    #[error("{path}: not a regular file")]
    NotAFile {
        /// The file as configured.
        path: String,
    },
    /// It is larger than [`MAX_CA_FILE_BYTES`].
    #[error("{path}: larger than {MAX_CA_FILE_BYTES} bytes; not a CA bundle")]
    TooLarge {
        /// The file as configured.
        path: String,
    },
    /// A PEM section is malformed.
    #[error("{path}: not a well-formed PEM file (a section is malformed)")]
    Malformed {
        /// The file as configured.
        path: String,
    },
    /// It holds no `CERTIFICATE` section.
    #[error("{path}: holds no certificate (no PEM `BEGIN CERTIFICATE` section)")]
    Empty {
        /// The file as configured.
        path: String,
    },
    /// A certificate in it cannot be a trust anchor.
    #[error("{path}: certificate {index} (of {count}) is not a usable CA certificate")]
    Unusable {
        /// The file as configured.
        path: String,
        /// Its position, 1-based.
        index: usize,
        /// Certificates in the file.
        count: usize,
    },
}

/// The CA certificates of one `caFile`, read and checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CaFile {
    path: String,
    certs: Vec<CertificateDer<'static>>,
}

impl CaFile {
    /// Reads the PEM bundle `path` (absolute, as the config names it) beneath `root`; see the
    /// module doc for what is refused.
    pub fn load(root: &HostRoot, path: &str) -> Result<CaFile, TrustError> {
        let named = || path.to_string();
        let rel = path
            .strip_prefix('/')
            .and_then(|p| HostPath::parse(p).ok())
            .ok_or_else(|| TrustError::Path { path: named() })?;
        let read = |source| TrustError::Read {
            path: named(),
            source,
        };
        let mut opts = OpenOptions::new();
        // Non-blocking: opening a FIFO must not wait for a writer (it is refused below).
        opts.read(true).custom_flags(
            (rustix::fs::OFlags::NONBLOCK | rustix::fs::OFlags::NOCTTY).bits() as i32,
        );
        let file = root.dir().open_with(rel.as_path(), &opts).map_err(read)?;
        let meta = file.metadata().map_err(read)?;
        if !meta.is_file() {
            return Err(TrustError::NotAFile { path: named() });
        }
        let mut bytes = Vec::new();
        file.take(MAX_CA_FILE_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(read)?;
        if bytes.len() as u64 > MAX_CA_FILE_BYTES {
            return Err(TrustError::TooLarge { path: named() });
        }
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&bytes)
            .collect::<Result<_, _>>()
            // The parser's error quotes the line it choked on: not passed on (module doc).
            .map_err(|_| TrustError::Malformed { path: named() })?;
        if certs.is_empty() {
            return Err(TrustError::Empty { path: named() });
        }
        let count = certs.len();
        for (i, cert) in certs.iter().enumerate() {
            if rustls::RootCertStore::empty().add(cert.clone()).is_err() {
                return Err(TrustError::Unusable {
                    path: named(),
                    index: i + 1,
                    count,
                });
            }
        }
        Ok(CaFile {
            path: path.to_string(),
            certs,
        })
    }

    /// The file as configured.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// How many certificates it holds.
    pub fn len(&self) -> usize {
        self.certs.len()
    }

    /// Whether it holds none (never, once loaded).
    pub fn is_empty(&self) -> bool {
        self.certs.is_empty()
    }
}

/// The system trust store as this process read it.
#[derive(Debug)]
pub struct SystemRoots {
    /// The usable certificates.
    pub certs: Vec<CertificateDer<'static>>,
    /// Certificates found but not usable as trust anchors (skipped).
    pub skipped: usize,
    /// Why some of the store could not be read (files, directories), for the log.
    pub errors: Vec<String>,
}

/// The system trust store, read on first use and kept for the process (see the module doc).
pub fn system_roots() -> &'static SystemRoots {
    static ROOTS: OnceLock<SystemRoots> = OnceLock::new();
    ROOTS.get_or_init(|| {
        let found = rustls_native_certs::load_native_certs();
        let mut certs = Vec::with_capacity(found.certs.len());
        let mut skipped = 0;
        for cert in found.certs {
            if rustls::RootCertStore::empty().add(cert.clone()).is_ok() {
                certs.push(cert);
            } else {
                skipped += 1;
            }
        }
        let errors: Vec<String> = found.errors.iter().map(ToString::to_string).collect();
        if certs.is_empty() {
            tracing::warn!(
                ?errors,
                skipped,
                "the system trust store has no usable CA certificate (install ca-certificates, \
                 or set downloadOptions.caFile): HTTPS downloads will fail"
            );
        } else {
            tracing::debug!(
                count = certs.len(),
                skipped,
                ?errors,
                "system trust store read"
            );
        }
        SystemRoots {
            certs,
            skipped,
            errors,
        }
    })
}

/// What HTTPS downloads trust: the system store, plus a `caFile` when the config names one.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Trust {
    ca_file: Option<Arc<CaFile>>,
}

impl Trust {
    /// What a run with the node config's `options` trusts: the system store, plus the
    /// certificates of `caFile` (read beneath `root`) when it names one.
    pub fn from_config(
        root: &HostRoot,
        options: &nodeward_node_config::DownloadOptions,
    ) -> Result<Trust, TrustError> {
        match &options.ca_file {
            None => Ok(Trust::default()),
            Some(path) => CaFile::load(root, path).map(Trust::with_ca_file),
        }
    }

    /// The system store and the certificates of `ca_file`.
    pub fn with_ca_file(ca_file: CaFile) -> Trust {
        Trust {
            ca_file: Some(Arc::new(ca_file)),
        }
    }

    /// The `caFile` trusted besides the system store, if any.
    pub fn ca_file(&self) -> Option<&CaFile> {
        self.ca_file.as_deref()
    }

    /// Every root a client trusts: the system store's, then the `caFile`'s.
    pub(super) fn roots(&self) -> impl Iterator<Item = &CertificateDer<'static>> {
        let extra = self.ca_file.iter().flat_map(|f| f.certs.iter());
        system_roots().certs.iter().chain(extra)
    }

    /// `builder` trusting exactly [`Trust::roots`] (no built-in roots).
    pub(super) fn configure(
        &self,
        builder: reqwest::blocking::ClientBuilder,
    ) -> Result<reqwest::blocking::ClientBuilder, reqwest::Error> {
        let mut builder = builder.use_rustls_tls().tls_built_in_root_certs(false);
        for der in self.roots() {
            builder = builder.add_root_certificate(reqwest::Certificate::from_der(der)?);
        }
        Ok(builder)
    }

    /// `builder` (reqwest 0.13's async client, which OCI pulls use: `host/bundle/oci/pull.rs`)
    /// trusting exactly [`Trust::roots`], as [`Trust::configure`] does for downloads: a bundle
    /// from a private registry is trusted exactly as an artifact from a private mirror.
    /// `tls_certs_only`, not `tls_certs_merge`: merging would hand the roots to the platform
    /// verifier, which reads the system store again by its own rules.
    pub fn configure_registry(
        &self,
        builder: oci_reqwest::ClientBuilder,
    ) -> Result<oci_reqwest::ClientBuilder, oci_reqwest::Error> {
        let certs = self
            .roots()
            .map(|der| oci_reqwest::Certificate::from_der(der))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(builder.tls_certs_only(certs))
    }
}

/// rustls's verdict when `e` (or an error it wraps) is the refusal of a server's certificate
/// (an unknown issuer, a name mismatch, an expired certificate...): the same on every attempt.
/// Works for both reqwest versions: they wrap the same rustls error.
pub(crate) fn certificate_refused(e: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = next {
        // An `io::Error`'s `source()` skips the error it wraps (hyper-rustls wraps tokio-rustls's
        // `io::Error`, which wraps rustls's error, in another): look inside, wrapper by wrapper.
        let mut inner = err;
        loop {
            if let Some(rustls::Error::InvalidCertificate(why)) = inner.downcast_ref() {
                return Some(format!("{why:?}"));
            }
            match inner
                .downcast_ref::<io::Error>()
                .and_then(io::Error::get_ref)
            {
                Some(wrapped) => inner = wrapped,
                None => break,
            }
        }
        next = err.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_system_store_of_this_host_is_loaded() {
        // The development and CI hosts are Debian with ca-certificates.
        let roots = system_roots();
        eprintln!(
            "system trust store: {} usable certificates, {} skipped",
            roots.certs.len(),
            roots.skipped
        );
        assert!(
            roots.certs.len() > 10,
            "{} usable, {} skipped, errors {:?}",
            roots.certs.len(),
            roots.skipped,
            roots.errors
        );
        let trust = Trust::default();
        assert_eq!(trust.roots().count(), roots.certs.len());
        trust
            .configure(reqwest::blocking::Client::builder())
            .expect("every root is accepted")
            .build()
            .expect("client");
        let _ = rustls::crypto::ring::default_provider().install_default();
        trust
            .configure_registry(oci_reqwest::Client::builder())
            .expect("every root is accepted by the registry client")
            .build()
            .expect("registry client");
    }

    #[test]
    fn the_registry_client_gets_the_ca_file_besides_the_system_store() {
        let system = system_roots();
        let extra = system.certs.first().expect("a system root").clone();
        let trust = Trust::with_ca_file(CaFile {
            path: "/etc/nodeward/mirror-ca.pem".into(),
            certs: vec![extra.clone()],
        });
        let roots: Vec<_> = trust.roots().cloned().collect();
        assert_eq!(roots.len(), system.certs.len() + 1);
        assert_eq!(roots.last(), Some(&extra));
        let _ = rustls::crypto::ring::default_provider().install_default();
        trust
            .configure_registry(oci_reqwest::Client::builder())
            .expect("roots")
            .build()
            .expect("registry client");
    }
}
