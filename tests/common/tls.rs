//! [`TestCa`]: a throwaway CA and a server certificate for IP 127.0.0.1 (and the name
//! `localhost`, for an OCI registry, which is spoken to over HTTPS only by name) that it signed, made by
//! the `openssl` CLI in a temporary directory, and the rustls server configuration serving it
//! (for [`super::http::HttpServer::start_tls`]). What a test trusts is then a real CA, as on a
//! real cluster or a private artifact mirror.
//!
//! It is self-contained (no `super::`) so that both `tests/common` and the none-mode fixture
//! (`tests/node`, which includes this file by path) can use it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

/// A CA and one server certificate for IP 127.0.0.1 and `localhost`; the files live until it
/// is dropped.
pub struct TestCa {
    dir: tempfile::TempDir,
}

fn openssl(args: &[&str], dir: &Path) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl runs (apt-get install openssl)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl TestCa {
    /// A new CA (`CN=<name>`), and a server certificate it signed for IP 127.0.0.1 and
    /// `localhost`, both
    /// ECDSA P-256 and valid for two days.
    pub fn new(name: &str) -> TestCa {
        let dir = tempfile::Builder::new()
            .prefix("nodeward-test-ca-")
            .tempdir_in("/tmp")
            .expect("test CA dir");
        let d = dir.path();
        let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];
        let subject = format!("/CN={name}");
        let mut ca = vec!["req", "-x509", "-nodes"];
        ca.extend(ec);
        ca.extend([
            "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", &subject,
        ]);
        openssl(&ca, d);
        let mut csr = vec!["req", "-nodes"];
        csr.extend(ec);
        csr.extend([
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=127.0.0.1",
        ]);
        openssl(&csr, d);
        std::fs::write(
            d.join("server.ext"),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n\
             keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n",
        )
        .expect("ext file");
        openssl(
            &[
                "x509",
                "-req",
                "-in",
                "server.csr",
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                "server.crt",
                "-days",
                "2",
                "-extfile",
                "server.ext",
            ],
            d,
        );
        TestCa { dir }
    }

    /// The CA certificate's file (PEM).
    pub fn ca_path(&self) -> PathBuf {
        self.dir.path().join("ca.crt")
    }

    /// The CA certificate (PEM).
    pub fn ca_pem(&self) -> String {
        std::fs::read_to_string(self.ca_path()).expect("ca.crt")
    }

    /// A rustls server configuration presenting the server certificate.
    pub fn server_config(&self) -> Arc<rustls::ServerConfig> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let d = self.dir.path();
        let certs: Vec<CertificateDer<'static>> =
            CertificateDer::pem_file_iter(d.join("server.crt"))
                .expect("server.crt")
                .collect::<Result<_, _>>()
                .expect("server.crt PEM");
        let key = PrivateKeyDer::from_pem_file(d.join("server.key")).expect("server.key PEM");
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .expect("server certificate");
        Arc::new(config)
    }
}
