//! HTTPS downloads (`host/caps/download/trust.rs`): the system trust store by default, the node
//! config's `downloadOptions.caFile` for a private mirror, against a real TLS server on
//! 127.0.0.1 whose CA this test makes ([`TestCa`]). No test talks to the internet: the system
//! store is checked by a unit test that it is loaded, and here by a mirror it does not know.

use super::*;
use crate::common::tls::TestCa;
use nodeward::caps::download::{CaFile, MAX_CA_FILE_BYTES, Trust, TrustError};
use nodeward_node_config::DownloadOptions;

const CA_FILE: &str = "/etc/nodeward/mirror-ca.pem";

fn options(path: &str) -> DownloadOptions {
    DownloadOptions {
        ca_file: Some(path.into()),
        ..DownloadOptions::default()
    }
}

/// A host whose runs trust the system store plus `pem` written at [`CA_FILE`].
fn host_trusting(pem: &str) -> Host {
    host_with(RunMode::Apply, |root, session| {
        let file = root.join(CA_FILE.trim_start_matches('/'));
        std::fs::create_dir_all(file.parent().expect("parent")).expect("mkdir");
        std::fs::write(&file, pem).expect("CA file");
        session.downloads.trust =
            Trust::from_config(session.root(), &options(CA_FILE)).expect("CA file loads");
    })
}

#[test]
fn a_mirror_whose_ca_is_in_the_ca_file_is_trusted() {
    let ca = TestCa::new("mirror-ca");
    let server = Server::start_tls(ca.server_config());
    let body = b"kubelet from a private mirror\n".repeat(100);
    server.script("/ok/kubelet", vec![ok(&body)]);
    assert!(server.url("/ok/kubelet").starts_with("https://127.0.0.1:"));

    let h = host_trusting(&ca.ca_pem());
    let trust = &h.session.downloads.trust;
    assert_eq!(trust.ca_file().map(CaFile::len), Some(1));
    let mut c = ctx(&h, grants(&server), Duration::from_secs(30));
    let got = c
        .fetch(
            server.url("/ok/kubelet"),
            sha(&body),
            "opt/bin/kubelet".into(),
            0o755,
        )
        .expect("trusted through the CA file");
    assert_eq!(got, Outcome::Created);
    assert_eq!(
        std::fs::read(h.root.join("opt/bin/kubelet")).expect("dest"),
        body
    );
    assert_eq!(server.hits("/ok/kubelet"), 1);
}

#[test]
fn without_the_ca_file_the_mirror_is_not_trusted_and_not_retried() {
    let ca = TestCa::new("mirror-ca");
    let server = Server::start_tls(ca.server_config());
    let body = b"kubelet from a private mirror\n";
    server.script("/ok/kubelet", vec![ok(body)]);
    // The system trust store only: it does not know this test's CA.
    let h = host(RunMode::Apply);
    assert_eq!(h.session.downloads.trust, Trust::default());
    let mut c = ctx(&h, grants(&server), Duration::from_secs(30));
    let url = server.url("/ok/kubelet");
    let e = c
        .fetch(url.clone(), sha(body), "opt/bin/kubelet".into(), 0o755)
        .expect_err("an unknown CA");
    assert_eq!(err_kind(&e), "failed", "{e:?}");
    let msg = message(&e);
    assert!(msg.contains(&url), "names the URL: {msg}");
    assert!(
        msg.contains("TLS certificate of") && msg.contains("is not trusted (UnknownIssuer)"),
        "says why: {msg}"
    );
    assert!(
        msg.contains("downloadOptions.caFile"),
        "says what to do: {msg}"
    );
    assert!(
        !msg.contains("gave up"),
        "a refused certificate is not retried: {msg}"
    );
    assert_eq!(server.total_hits(), 0, "no request got past the handshake");
    assert!(tree(&h.root.join("opt/bin")).is_empty(), "nothing written");
}

#[test]
fn a_ca_file_with_several_certificates_trusts_each() {
    let mirror = TestCa::new("mirror-ca");
    let other = TestCa::new("other-ca");
    let server = Server::start_tls(mirror.server_config());
    server.script("/ok/runc", vec![ok(b"runc")]);
    let h = host_trusting(&format!("{}{}", other.ca_pem(), mirror.ca_pem()));
    assert_eq!(
        h.session.downloads.trust.ca_file().map(CaFile::len),
        Some(2)
    );
    let mut c = ctx(&h, grants(&server), Duration::from_secs(30));
    c.fetch(
        server.url("/ok/runc"),
        sha(b"runc"),
        "opt/bin/runc".into(),
        0,
    )
    .expect("the second certificate is the mirror's CA");
}

/// Loads `CA_FILE` beneath a root where `prepare` made it; the error's text.
fn load_error(prepare: impl FnOnce(&Path)) -> (TrustError, String) {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("root");
    std::fs::create_dir_all(root.join("etc/nodeward")).expect("mkdir");
    prepare(&root);
    let host_root = HostRoot::open(&root).expect("root");
    let e = Trust::from_config(&host_root, &options(CA_FILE)).expect_err("refused");
    let text = e.to_string();
    assert!(text.starts_with(CA_FILE), "names the file first: {text}");
    (e, text)
}

#[test]
fn a_ca_file_that_is_missing_empty_or_not_a_ca_is_refused_naming_it() {
    let file = |root: &Path| root.join(CA_FILE.trim_start_matches('/'));

    let (e, text) = load_error(|_| {});
    assert!(matches!(e, TrustError::Read { .. }), "{e:?}");
    assert!(
        text.contains("cannot read") && text.contains("No such file"),
        "{text}"
    );

    let (e, _) = load_error(|r| std::fs::write(file(r), "").expect("write"));
    assert!(matches!(e, TrustError::Empty { .. }), "{e:?}");

    let (e, _) = load_error(|r| std::fs::create_dir(file(r)).expect("mkdir"));
    assert!(matches!(e, TrustError::NotAFile { .. }), "{e:?}");

    // A FIFO is refused without waiting for a writer.
    let (e, _) = load_error(|r| {
        rustix::fs::mknodat(
            rustix::fs::CWD,
            file(r),
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .expect("mkfifo")
    });
    assert!(matches!(e, TrustError::NotAFile { .. }), "{e:?}");

    let (e, _) = load_error(|r| {
        std::fs::write(file(r), vec![b'A'; (MAX_CA_FILE_BYTES + 1) as usize]).expect("write")
    });
    assert!(matches!(e, TrustError::TooLarge { .. }), "{e:?}");

    // A CERTIFICATE section whose bytes are no certificate.
    let (e, text) = load_error(|r| {
        std::fs::write(
            file(r),
            "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n",
        )
        .expect("write")
    });
    assert!(
        matches!(
            e,
            TrustError::Unusable {
                index: 1,
                count: 1,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(text.contains("certificate 1 (of 1)"), "{text}");

    // A link that leads out of the root is not followed there.
    let (e, _) = load_error(|r| {
        let outside = r.parent().expect("tmp").join("outside-ca.pem");
        std::fs::write(&outside, TestCa::new("outside").ca_pem()).expect("write");
        std::os::unix::fs::symlink(&outside, file(r)).expect("link");
    });
    assert!(matches!(e, TrustError::Read { .. }), "{e:?}");
}

#[test]
fn a_ca_file_pointed_at_a_secret_does_not_echo_it() {
    // What a config could aim caFile at: the applied config (with the bootstrap token), a key.
    let secret = "bootstrapToken: abcdef.0123456789abcdef\n";
    let (e, text) = load_error(|r| {
        std::fs::write(r.join(CA_FILE.trim_start_matches('/')), secret).expect("write")
    });
    assert!(matches!(e, TrustError::Empty { .. }), "{e:?}");
    assert!(!text.contains("0123456789abcdef"), "{text}");

    // A malformed PEM section: the parser's own error quotes the line; ours does not.
    let pem = "-----BEGIN CERTIFICATE 0123456789abcdef-----\nx\n";
    let (e, text) = load_error(|r| {
        std::fs::write(r.join(CA_FILE.trim_start_matches('/')), pem).expect("write")
    });
    assert!(
        matches!(e, TrustError::Malformed { .. } | TrustError::Empty { .. }),
        "{e:?}"
    );
    assert!(!text.contains("0123456789abcdef"), "{text}");
    let chain = nodeward::errors::chain(&e);
    assert!(!chain.contains("0123456789abcdef"), "{chain}");
}
