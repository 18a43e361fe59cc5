//! References, the transport choice and the artifact layout, on fixtures. Pulls are tested
//! through the binary against a real registry on 127.0.0.1 (`tests/bundles/oci.rs`).

use super::*;
use serde_json::{Value, json};

const PIN: &str = "1111111111111111111111111111111111111111111111111111111111111111";

fn pin() -> Sha256Hex {
    PIN.parse().expect("pin")
}

fn reference(text: &str) -> OciReference {
    OciReference::parse(text).expect(text)
}

fn layer(media_type: &str, digest: &str, size: i64) -> Value {
    json!({"mediaType": media_type, "digest": digest, "size": size})
}

fn manifest(layers: Vec<Value>) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": OCI_IMAGE_MEDIA_TYPE,
        "artifactType": ARTIFACT_TYPE,
        "config": {
            "mediaType": "application/vnd.oci.empty.v1+json",
            "digest": "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a",
            "size": 2
        },
        "layers": layers,
    }))
    .expect("json")
}

fn archive() -> Value {
    layer(BUNDLE_MEDIA_TYPE, &format!("sha256:{PIN}"), 1234)
}

#[test]
fn references_name_a_registry_and_a_tag_or_a_sha256_digest() {
    let digest = format!("sha256:{PIN}");
    for (text, registry, repository, tag, dig) in [
        (
            "registry.example/bundles/acme:7",
            "registry.example",
            "bundles/acme",
            Some("7"),
            None,
        ),
        (
            "127.0.0.1:5000/acme:v1",
            "127.0.0.1:5000",
            "acme",
            Some("v1"),
            None,
        ),
        ("localhost/acme:v1", "localhost", "acme", Some("v1"), None),
        (
            &format!("r.example:443/a/b@{digest}"),
            "r.example:443",
            "a/b",
            None,
            Some(digest.as_str()),
        ),
    ] {
        let r = reference(text);
        assert_eq!(r.as_str(), text);
        assert_eq!(r.to_string(), format!("oci://{text}"));
        assert_eq!(r.reference().registry(), registry, "{text}");
        assert_eq!(r.reference().repository(), repository, "{text}");
        assert_eq!(r.reference().tag(), tag, "{text}");
        assert_eq!(r.reference().digest(), dig, "{text}");
    }
    for (text, needle) in [
        ("acme:7", "name the registry"),
        ("bundles/acme:7", "name the registry"),
        ("registry.example/acme", "name a tag"),
        ("registry.example/Acme:7", "not an OCI reference"),
        ("registry.example/acme@sha256:abc", "not an OCI reference"),
        ("https://registry.example/acme:7", "not an OCI reference"),
        ("user:pw@registry.example/acme:7", "not an OCI reference"),
        ("", "not an OCI reference"),
        (
            &format!("r.example/a@sha512:{PIN}{PIN}"),
            "only sha256 digests",
        ),
    ] {
        let e = OciReference::parse(text).expect_err(text).to_string();
        assert!(e.contains(needle), "{text}: {e}");
        assert!(e.starts_with(&format!("oci://{text}")), "{text}: {e}");
    }
}

#[test]
fn only_a_loopback_registry_is_spoken_to_in_plain_http() {
    for registry in ["127.0.0.1:5000", "127.9.8.7"] {
        assert!(is_loopback_registry(registry), "{registry}");
    }
    for registry in [
        "registry.example",
        "registry.example:5000",
        "10.0.0.1:5000",
        "0.0.0.0:5000",
        "128.0.0.1",
        "127.0.0.1.example",
        "localhost.example",
        // A name is resolved, and the resolver may send it elsewhere: HTTPS.
        "localhost:5000",
        "LOCALHOST",
        "[::1]:5000",
        "[::2]:5000",
        "",
    ] {
        assert!(!is_loopback_registry(registry), "{registry}");
    }
    assert!(reference("127.0.0.1:5000/acme:1").plain_http());
    assert!(!reference("registry.example/acme:1").plain_http());
}

#[test]
fn the_archive_layer_is_the_one_layer_of_the_bundle_media_type_pinned_by_digest() {
    let r = reference("registry.example/acme:7");
    let got = archive_layer(&r, &manifest(vec![archive()]), &pin()).expect("bundle artifact");
    assert_eq!(got.digest, format!("sha256:{PIN}"));
    assert_eq!(got.size, 1234);

    let other = layer(
        "application/vnd.oci.image.layer.v1.tar",
        &format!("sha256:{PIN}"),
        1,
    );
    let refused: [(&str, Vec<u8>, &str); 7] = [
        ("no layer", manifest(vec![]), "it has 0 layers"),
        (
            "two archives",
            manifest(vec![archive(), archive()]),
            "it has 2 layers",
        ),
        (
            "another layer",
            manifest(vec![archive(), other]),
            "unknown mediaType",
        ),
        ("not json", b"<html>".to_vec(), "not an OCI image manifest"),
        (
            "an index",
            serde_json::to_vec(&json!({
                "schemaVersion": 2,
                "mediaType": "application/vnd.oci.image.index.v1+json",
                "manifests": []
            }))
            .expect("json"),
            "not an OCI image manifest",
        ),
        (
            "a docker manifest",
            String::from_utf8(manifest(vec![archive()]))
                .expect("utf-8")
                .replace(
                    OCI_IMAGE_MEDIA_TYPE,
                    "application/vnd.docker.distribution.manifest.v2+json",
                )
                .into_bytes(),
            "an OCI image manifest (schemaVersion 2",
        ),
        (
            "foreign urls",
            manifest(vec![{
                let mut l = archive();
                l["urls"] = json!(["http://cdn.example/b.tar.gz"]);
                l
            }]),
            "lists urls",
        ),
    ];
    for (what, bytes, needle) in refused {
        let e = archive_layer(&r, &bytes, &pin()).expect_err(what);
        assert!(e.refuses_bundle() && !e.not_fetched(), "{what}: {e}");
        let e = e.to_string();
        assert!(e.contains(needle), "{what}: {e}");
        assert!(
            e.starts_with("oci://registry.example/acme:7: "),
            "{what}: {e}"
        );
    }

    // Not the pinned archive, or too large to be one: not fetched as pinned (exit 3).
    let other_digest = format!("sha256:{}", "2".repeat(64));
    for (what, l, needle) in [
        (
            "another digest",
            layer(BUNDLE_MEDIA_TYPE, &other_digest, 1),
            "but sha256:1111",
        ),
        (
            "too large",
            layer(BUNDLE_MEDIA_TYPE, &format!("sha256:{PIN}"), (64 << 20) + 1),
            "declares 67108865 bytes",
        ),
        (
            "negative",
            layer(BUNDLE_MEDIA_TYPE, &format!("sha256:{PIN}"), -1),
            "declares -1 bytes",
        ),
    ] {
        let e = archive_layer(&r, &manifest(vec![l]), &pin()).expect_err(what);
        assert!(e.not_fetched() && !e.refuses_bundle(), "{what}: {e}");
        assert!(e.to_string().contains(needle), "{what}: {e}");
    }
}

#[test]
fn a_reference_by_digest_must_be_the_manifests_digest() {
    let bytes = manifest(vec![archive()]);
    let good = format!("sha256:{}", crate::digest::sha256_hex(&bytes));
    let r = reference(&format!("registry.example/acme@{good}"));
    archive_layer(&r, &bytes, &pin()).expect("its own digest");
    let r = reference(&format!("registry.example/acme:7@sha256:{PIN}"));
    let e = archive_layer(&r, &bytes, &pin()).expect_err("another digest");
    assert!(e.not_fetched(), "{e}");
    assert!(e.to_string().contains(&good), "{e}");
}
