//! What a source argument is, and a local archive checked against its pin. Downloads are
//! tested through the binary against a real HTTP server (`tests/bundles/url.rs`).

use super::*;
use crate::bundle::{Bundle, pack, testing};

fn source(arg: &str) -> Result<Source, SourceError> {
    Source::parse(Path::new(arg))
}

#[test]
fn http_and_https_urls_are_urls_and_everything_else_without_a_scheme_is_a_path() {
    for url in [
        "http://127.0.0.1:8080/b.tar.gz",
        "https://bundles.example/acme/7.tgz?x=1",
        "HTTPS://bundles.example/b.tar",
    ] {
        let Ok(Source::Url(u)) = source(url) else {
            panic!("{url} is a URL");
        };
        assert!(matches!(u.scheme(), "http" | "https"), "{u}");
    }
    for path in [
        "b.tar.gz",
        "/srv/bundles/b",
        "./http:/x",
        "dir/with://inside",
    ] {
        assert_eq!(
            source(path).expect("a path"),
            Source::Path(PathBuf::from(path))
        );
    }
}

#[test]
fn other_schemes_bad_urls_and_credentials_are_refused() {
    let e = source("ftp://bundles.example/b.tar").expect_err("ftp");
    assert!(matches!(e, SourceError::Scheme { .. }), "{e}");
    let e = source("file:///srv/b.tar").expect_err("file");
    assert!(matches!(e, SourceError::Scheme { .. }), "{e}");
    let e = source("https://[::1/b.tar").expect_err("bad host");
    assert!(matches!(e, SourceError::Invalid { .. }), "{e}");
    let e = source("https://ops:hunter2@bundles.example/b.tar").expect_err("credentials");
    assert!(matches!(e, SourceError::Credentials { .. }), "{e}");
    let text = e.to_string();
    assert!(
        !text.contains("hunter2") && !text.contains("ops"),
        "the message keeps no credentials: {text}"
    );
    let e = source("http://token@bundles.example/b.tar").expect_err("user only");
    assert!(matches!(e, SourceError::Credentials { .. }), "{e}");
}

#[test]
fn oci_sources_are_references_with_a_registry() {
    for arg in [
        "oci://registry.example/acme:7",
        "OCI://127.0.0.1:5000/acme:7",
    ] {
        let Ok(Source::Oci(r)) = source(arg) else {
            panic!("{arg} is an OCI reference");
        };
        assert_eq!(r.as_str(), &arg[6..]);
    }
    for arg in ["oci://acme:7", "oci://registry.example/acme", "oci://"] {
        let e = source(arg).expect_err(arg);
        assert!(matches!(e, SourceError::Oci(_)), "{arg}: {e}");
    }
}

/// The error of `r`, which must be one.
fn refused(r: Result<BundleFiles, FetchError>, what: &str) -> FetchError {
    match r {
        Ok(_) => panic!("{what}: accepted"),
        Err(e) => e,
    }
}

/// A packed archive of the one-phase test bundle, and its sha256.
fn archive(dir: &Path) -> (PathBuf, Sha256Hex) {
    let src = testing::source_dir(dir, "src", 3, |_| {});
    let out = dir.join("b.tar.gz");
    pack::pack(&src, &out).expect("pack");
    let bytes = std::fs::read(&out).expect("read");
    (out, sha256_hex(&bytes).parse().expect("sha256"))
}

#[test]
fn a_local_archive_is_read_only_when_its_bytes_are_the_pinned_ones() {
    let tmp = tempfile::tempdir().expect("tmp");
    let (path, pin) = archive(tmp.path());
    let files = open_pinned(&path, &pin).expect("pinned");
    assert_eq!(files.source, BundleSource::Archive(path.clone()));
    Bundle::from_files(&files).expect("loads");

    let other: Sha256Hex = sha256_hex(b"other").parse().expect("sha256");
    let e = refused(open_pinned(&path, &other), "mismatch");
    assert!(e.not_fetched(), "{e}");
    assert!(
        e.to_string()
            .contains(&format!("sha256 {pin}, but {other} is pinned")),
        "{e}"
    );

    let e = refused(open_pinned(tmp.path(), &pin), "a directory");
    assert!(matches!(e, FetchError::NotAnArchive { .. }), "{e}");
    assert!(!e.not_fetched());

    let e = refused(
        open_pinned(&tmp.path().join("missing.tgz"), &pin),
        "missing",
    );
    assert!(matches!(e, FetchError::Read { .. }), "{e}");
    assert!(!e.not_fetched());
}

#[test]
fn pinned_bytes_that_are_no_bundle_archive_are_refused_as_a_bundle() {
    let tmp = tempfile::tempdir().expect("tmp");
    let path = tmp.path().join("junk.tgz");
    std::fs::write(&path, b"not a tar archive at all").expect("write");
    let pin: Sha256Hex = sha256_hex(b"not a tar archive at all")
        .parse()
        .expect("sha256");
    let e = refused(open_pinned(&path, &pin), "junk");
    let FetchError::Bundle(b) = &e else {
        panic!("a refused archive: {e}");
    };
    assert!(b.refuses_bundle(), "{b}");
    assert!(!e.not_fetched());
}
