//! `phases install oci://REGISTRY/REPOSITORY:TAG --sha256 HEX` (and `@sha256:…`) against a real
//! registry on 127.0.0.1 (Debian's `docker-registry`, [`Registry`]), the artifacts pushed with
//! oci-client as a platform team's client would: what the daemon runs for a Machine's
//! `spec.phaseBundle.ociReference`, and the exit codes it acts on.

use super::common::http::{HttpServer, Reply};
use super::registry::Registry;
use super::*;
use nodeward::bundle::oci::{ARTIFACT_TYPE, BUNDLE_MEDIA_TYPE};
use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::manifest::OCI_IMAGE_MEDIA_TYPE;
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};

/// `phases install`'s exit code for a bundle that could not be fetched.
const NOT_FETCHED: i32 = 3;
/// The empty config blob (`{}`) of an OCI 1.1 artifact.
const EMPTY_CONFIG: &[u8] = b"{}";

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(Sha256::digest(bytes))
}

/// One layer to push: its bytes and mediaType.
struct Layer {
    bytes: Vec<u8>,
    media_type: &'static str,
}

fn archive_layer(path: &Path) -> Layer {
    Layer {
        bytes: std::fs::read(path).expect("archive"),
        media_type: BUNDLE_MEDIA_TYPE,
    }
}

/// Pushes `layers` (and the empty config) as `reference` on `registry`, with the manifest made
/// by `edit` from the honest one; returns the manifest's digest (`sha256:…`).
fn push(
    registry: &Registry,
    reference: &str,
    layers: &[Layer],
    edit: impl FnOnce(&mut Value),
) -> String {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = Client::try_from(ClientConfig {
        protocol: ClientProtocol::Http,
        ..ClientConfig::default()
    })
    .expect("client");
    let r: Reference = format!("{}/{reference}", registry.addr)
        .parse()
        .expect("reference");
    let descriptor = |bytes: &[u8], media_type: &str| {
        json!({
            "mediaType": media_type,
            "digest": format!("sha256:{}", sha256_hex(bytes)),
            "size": bytes.len(),
        })
    };
    let mut manifest = json!({
        "schemaVersion": 2,
        "mediaType": OCI_IMAGE_MEDIA_TYPE,
        "artifactType": ARTIFACT_TYPE,
        "config": descriptor(EMPTY_CONFIG, "application/vnd.oci.empty.v1+json"),
        "layers": layers.iter().map(|l| descriptor(&l.bytes, l.media_type)).collect::<Vec<_>>(),
    });
    edit(&mut manifest);
    let body = serde_json::to_vec(&manifest).expect("manifest json");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        client
            .store_auth_if_needed(r.resolve_registry(), &RegistryAuth::Anonymous)
            .await;
        for blob in std::iter::once(EMPTY_CONFIG).chain(layers.iter().map(|l| &l.bytes[..])) {
            let digest = format!("sha256:{}", sha256_hex(blob));
            client
                .push_blob(&r, blob.to_vec(), &digest)
                .await
                .expect("push blob");
        }
        let content_type = oci_reqwest::header::HeaderValue::from_static(OCI_IMAGE_MEDIA_TYPE);
        client
            .push_manifest_raw(&r, body.clone(), content_type)
            .await
            .unwrap_or_else(|e| panic!("push manifest {manifest}: {e}"));
    });
    format!("sha256:{}", sha256_hex(&body))
}

/// `phases install SOURCE --sha256 PIN --allow-incomplete --accept-new-grants`.
fn install_args<'a>(source: &'a str, pin: &'a str) -> Vec<&'a str> {
    vec![
        "phases",
        "install",
        source,
        "--sha256",
        pin,
        "--allow-incomplete",
        "--accept-new-grants",
    ]
}

/// Runs `args`, asserts exit `code` with `needle` in stderr, the reference named and that
/// nothing was installed; returns stderr.
fn fails(env: &Env, code: i32, what: &str, args: &[&str], needle: &str) -> String {
    let err = refused_with(env, code, what, args, needle);
    assert!(
        err.contains(args[2]),
        "{what}: the reference is named: {err}"
    );
    assert_eq!(env.link("current"), None, "{what}: nothing installed");
    err
}

#[test]
fn install_by_tag_and_by_digest_installs_the_pinned_bundle() {
    let env = Env::new();
    let registry = Registry::start();
    let v1 = env.bundle("v1.tar.gz", 1, &[setup_phase()], true);
    let v2 = env.bundle("v2.tar.gz", 2, &[setup_phase(), configure_phase()], true);
    let (d1, d2) = (env.digest(&v1), env.digest(&v2));
    let (pin1, pin2) = (sha256_of_file(&v1), sha256_of_file(&v2));
    push(&registry, "bundles/acme:1", &[archive_layer(&v1)], |_| {});
    let manifest2 = push(&registry, "bundles/acme:2", &[archive_layer(&v2)], |_| {});

    let by_tag = format!("oci://{}/bundles/acme:1", registry.addr);
    let mut args = install_args(&by_tag, &pin1);
    args.extend(["--output", "json"]);
    let out = env.ok(&args);
    let installed: Value = serde_json::from_slice(&out.stdout).expect("install json");
    assert_eq!(installed["installed"]["digest"], d1.as_str(), "{installed}");
    assert_eq!(
        installed["installed"]["source"],
        format!("bundle archive {by_tag}").as_str()
    );
    assert!(
        installed["installed"]["signedBy"].is_string(),
        "{installed}"
    );
    assert_eq!(env.link("current").as_deref(), Some(d1.as_str()));
    // Again: pulled again (nothing is kept), already current.
    let again = env.ok(&args);
    let again: Value = serde_json::from_slice(&again.stdout).expect("install json");
    assert_eq!(again["alreadyCurrent"], true);

    // By digest: the manifest of tag 2, whatever the tag names later.
    let by_digest = format!("oci://{}/bundles/acme@{manifest2}", registry.addr);
    push(&registry, "bundles/acme:2", &[archive_layer(&v1)], |_| {});
    env.ok(&install_args(&by_digest, &pin2));
    assert_eq!(env.link("current").as_deref(), Some(d2.as_str()));
    let inspected = env.ok(&["phases", "inspect", "--output", "json"]);
    let inspected: Value = serde_json::from_slice(&inspected.stdout).expect("inspect json");
    assert_eq!(inspected["bundle"]["digest"], d2.as_str());
    env.ok(&["audit", "verify"]);
    // Anonymous pulls over plain HTTP to the loopback registry: the manifest by tag and by
    // digest, and the layers, were asked for.
    let log = registry.log();
    for path in [
        "/v2/bundles/acme/manifests/1".to_string(),
        format!("/v2/bundles/acme/manifests/{manifest2}"),
        format!("/v2/bundles/acme/blobs/sha256:{pin1}"),
        format!("/v2/bundles/acme/blobs/sha256:{pin2}"),
    ] {
        assert!(log.contains(&format!("GET {path}")), "{path} in {log}");
    }
}

fn sha256_of_file(path: &Path) -> String {
    sha256_hex(&std::fs::read(path).expect("read"))
}

#[test]
fn an_artifact_that_cannot_be_had_as_pinned_exits_3_and_installs_nothing() {
    let env = Env::new();
    let registry = Registry::start();
    let b = env.bundle("b.tar.gz", 1, &[setup_phase()], true);
    let pin = sha256_of_file(&b);
    let reference = |tag: &str| format!("oci://{}/bundles/b:{tag}", registry.addr);

    // Another archive pinned: the manifest's layer digest is not the pin; nothing pulled.
    push(&registry, "bundles/b:ok", &[archive_layer(&b)], |_| {});
    let wrong = sha256_of_file(&env.public);
    let err = fails(
        &env,
        NOT_FETCHED,
        "wrong sha256",
        &install_args(&reference("ok"), &wrong),
        "is pinned",
    );
    assert!(
        err.contains(&format!("the archive layer is sha256:{pin}")),
        "{err}"
    );

    // No such tag.
    fails(
        &env,
        NOT_FETCHED,
        "404",
        &install_args(&reference("missing"), &pin),
        "the registry answered 404 for the manifest",
    );

    // A layer declared larger than the 64 MiB cap: refused before it is requested.
    push(&registry, "bundles/b:huge", &[archive_layer(&b)], |m| {
        m["layers"][0]["size"] = json!((64u64 << 20) + 1);
    });
    fails(
        &env,
        NOT_FETCHED,
        "declared too large",
        &install_args(&reference("huge"), &pin),
        "declares 67108865 bytes, not within the 67108864 byte limit",
    );

    // The registry serves other bytes than its manifest declares (its storage tampered
    // with): the same length, then longer.
    let stored = registry.blob_file(&pin);
    let mut swapped = std::fs::read(&stored).expect("stored blob");
    swapped[100] ^= 0xff;
    std::fs::write(&stored, &swapped).expect("swap blob");
    let err = fails(
        &env,
        NOT_FETCHED,
        "swapped bytes",
        &install_args(&reference("ok"), &pin),
        "sha256 mismatch",
    );
    assert!(
        err.contains(&format!("expected {pin}, got {}", sha256_hex(&swapped))),
        "{err}"
    );
    swapped.extend_from_slice(b"trailing");
    std::fs::write(&stored, &swapped).expect("swap blob");
    fails(
        &env,
        NOT_FETCHED,
        "longer bytes",
        &install_args(&reference("ok"), &pin),
        "bytes its manifest declares",
    );

    // A reference by a digest the registry does not have.
    let unknown = format!("oci://{}/bundles/b@sha256:{wrong}", registry.addr);
    fails(
        &env,
        NOT_FETCHED,
        "unknown digest",
        &install_args(&unknown, &pin),
        "404",
    );

    // A manifest over the 4 MiB cap (an HTTP server answering as a registry would).
    let server = HttpServer::start(|req| match req.path() {
        "/v2/" => Reply::ok(b"{}"),
        _ => Reply::ok(&vec![b' '; (4 << 20) + 1]),
    });
    let big = format!("oci://127.0.0.1:{}/bundles/b:big", server.port());
    fails(
        &env,
        NOT_FETCHED,
        "manifest too large",
        &install_args(&big, &pin),
        "the manifest is larger than the 4194304 byte limit",
    );

    // A registry that does not answer within --timeout.
    let slow = HttpServer::start(|_| Reply {
        delay: std::time::Duration::from_secs(5),
        ..Reply::ok(b"{}")
    });
    let slow_ref = format!("oci://127.0.0.1:{}/bundles/b:1", slow.port());
    let mut args = install_args(&slow_ref, &pin);
    args.extend(["--timeout", "1"]);
    fails(&env, NOT_FETCHED, "timeout", &args, "not pulled in time");

    // A registry that is down.
    let down = {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        format!("oci://127.0.0.1:{port}/bundles/b:1")
    };
    fails(
        &env,
        NOT_FETCHED,
        "registry down",
        &install_args(&down, &pin),
        "Connection refused",
    );

    // With --output json the error line carries the exit code.
    let mut args = install_args(&down, &pin);
    args.extend(["--output", "json"]);
    let out = env.run(&args);
    let line = stderr(&out);
    let err: Value = serde_json::from_str(line.lines().last().expect("a line")).expect("json");
    assert_eq!(err["exitCode"], NOT_FETCHED, "{err}");
}

#[test]
fn an_artifact_that_is_not_a_bundle_artifact_is_refused_with_exit_4() {
    let env = Env::new();
    let registry = Registry::start();
    let b = env.bundle("b.tar.gz", 1, &[setup_phase()], true);
    let pin = sha256_of_file(&b);
    let other = Layer {
        bytes: b"not a bundle".to_vec(),
        media_type: "application/vnd.oci.image.layer.v1.tar",
    };
    let twice = Layer {
        bytes: b"another archive".to_vec(),
        media_type: BUNDLE_MEDIA_TYPE,
    };
    for (tag, layers, needle) in [
        ("two", vec![archive_layer(&b), twice], "it has 2 layers"),
        ("none", vec![], "it has 0 layers"),
        ("other", vec![archive_layer(&b), other], "unknown mediaType"),
    ] {
        push(&registry, &format!("bundles/b:{tag}"), &layers, |_| {});
        let source = format!("oci://{}/bundles/b:{tag}", registry.addr);
        let err = fails(&env, REFUSED, tag, &install_args(&source, &pin), needle);
        assert!(
            err.contains("not a nodeward bundle artifact"),
            "{tag}: {err}"
        );
    }
    // The right layer, but the layout was refused before any layer was requested.
    assert!(
        !registry
            .log()
            .contains(&format!("GET /v2/bundles/b/blobs/sha256:{pin}")),
        "{}",
        registry.log()
    );
}

#[test]
fn an_unsigned_or_untrusted_bundle_is_refused_with_exit_4() {
    let env = Env::new();
    let registry = Registry::start();
    let unsigned = env.bundle("unsigned.tar.gz", 1, &[setup_phase()], false);
    let (_, other_secret) = keypair(env.tmp.path(), "other");
    let untrusted = env.bundle("untrusted.tar.gz", 1, &[setup_phase()], false);
    env.ok(&["phases", "sign", s(&untrusted), "--key", s(&other_secret)]);
    for (tag, archive, needle) in [
        ("unsigned", &unsigned, "manifest.toml.minisig"),
        ("untrusted", &untrusted, "which is not trusted"),
    ] {
        push(
            &registry,
            &format!("bundles/b:{tag}"),
            &[archive_layer(archive)],
            |_| {},
        );
        let source = format!("oci://{}/bundles/b:{tag}", registry.addr);
        let pin = sha256_of_file(archive);
        fails(&env, REFUSED, tag, &install_args(&source, &pin), needle);
    }
}

#[test]
fn plain_http_is_spoken_only_to_a_loopback_registry() {
    let env = Env::new();
    let pin = sha256_hex(b"x");
    // A plain-HTTP server on 127.0.0.1, named by an address that is not a loopback one
    // (0.0.0.0 reaches the same socket on Linux): the agent speaks TLS to it, so the server
    // never sees an HTTP request, and the pull fails (exit 3) naming the reference.
    let server = HttpServer::start(|_| Reply::ok(b"{}"));
    let source = format!("oci://0.0.0.0:{}/bundles/b:1", server.port());
    fails(
        &env,
        NOT_FETCHED,
        "https to 0.0.0.0",
        &install_args(&source, &pin),
        &format!("https://0.0.0.0:{}/v2/", server.port()),
    );
    assert_eq!(
        server.requests(),
        Vec::new(),
        "no plain HTTP request was made"
    );
    // The same server by its loopback address: spoken to in plain HTTP.
    let source = format!("oci://127.0.0.1:{}/bundles/b:1", server.port());
    env.run(&install_args(&source, &pin));
    assert!(
        server
            .requests()
            .iter()
            .any(|r| r.path().starts_with("/v2/bundles/b/manifests/")),
        "plain HTTP to the loopback registry"
    );
}

#[test]
fn usage_errors_exit_2_before_anything_is_requested() {
    let env = Env::new();
    let server = HttpServer::start(|_| Reply::ok(b"{}"));
    let pin = sha256_hex(b"x");
    let base = format!("127.0.0.1:{}", server.port());
    let no_registry = "oci://bundles/b:1".to_string();
    let no_tag = format!("oci://{base}/bundles/b");
    let bad = format!("oci://{base}/Bundles/b:1");
    let sha512 = format!("oci://{base}/bundles/b@sha512:{}", "a".repeat(128));
    let no_pin = format!("oci://{base}/bundles/b:1");
    for (what, args, needle) in [
        (
            "no registry",
            install_args(&no_registry, &pin),
            "name the registry",
        ),
        ("no tag", install_args(&no_tag, &pin), "name a tag"),
        (
            "not a reference",
            install_args(&bad, &pin),
            "not an OCI reference",
        ),
        ("sha512", install_args(&sha512, &pin), "only sha256 digests"),
        (
            "no --sha256",
            vec!["phases", "install", no_pin.as_str()],
            "needs --sha256",
        ),
    ] {
        fails(&env, 2, what, &args, needle);
    }
    assert_eq!(server.requests(), Vec::new(), "nothing was requested");
}

#[test]
fn a_token_challenge_or_redirect_off_https_is_refused_and_no_body_is_shown() {
    let env = Env::new();
    let pin = sha256_hex(b"x");
    // A registry whose token service is plain HTTP elsewhere (a node-local or metadata
    // address): refused before it is asked; nothing of it is requested.
    let elsewhere = HttpServer::start(|_| Reply::json(200, &json!({"token": "stolen"})));
    let realm = format!("http://0.0.0.0:{}/internal/secret", elsewhere.port());
    let registry = HttpServer::start(move |_| {
        Reply::empty(401).with_header("WWW-Authenticate", &format!("Bearer realm=\"{realm}\""))
    });
    let source = format!("oci://127.0.0.1:{}/bundles/b:1", registry.port());
    let out = fails(
        &env,
        NOT_FETCHED,
        "plain-HTTP token service",
        &install_args(&source, &pin),
        "token service must be HTTPS",
    );
    assert!(!out.contains("stolen"), "{out}");
    assert_eq!(elsewhere.requests(), Vec::new(), "the realm was not asked");

    // A token service on the loopback registry itself is asked (anonymously), its token used
    // for the manifest; an error page is shown by its status, never its body.
    let registry = HttpServer::start(|r| {
        if r.path().starts_with("/token") {
            Reply::json(200, &json!({"token": "t0ken"}))
        } else if r.header("authorization") == Some("Bearer t0ken") {
            Reply::json(403, &json!({"internal": "do-not-show"}))
        } else {
            let realm = format!("http://{}/token", r.header("host").unwrap_or_default());
            Reply::empty(401).with_header("WWW-Authenticate", &format!("Bearer realm=\"{realm}\""))
        }
    });
    let source = format!("oci://127.0.0.1:{}/bundles/b:1", registry.port());
    let out = fails(
        &env,
        NOT_FETCHED,
        "token, then 403",
        &install_args(&source, &pin),
        "answered 403",
    );
    assert!(
        !out.contains("do-not-show") && !out.contains("t0ken"),
        "{out}"
    );
    let token_requests: Vec<_> = registry
        .requests()
        .into_iter()
        .filter(|r| r.path().starts_with("/token"))
        .collect();
    assert_eq!(token_requests.len(), 1, "the token service asked once");
    assert!(
        token_requests[0]
            .target
            .contains("scope=repository%3Abundles%2Fb%3Apull"),
        "{}",
        token_requests[0].target
    );

    // A manifest redirected to plain HTTP on another port of this host: refused, not followed.
    let target = HttpServer::start(|_| Reply::json(200, &json!({"internal": "do-not-show"})));
    let location = format!("http://127.0.0.1:{}/pods?X-Signature=SIG", target.port());
    let registry = HttpServer::start(move |_| Reply::redirect(&location));
    let source = format!("oci://127.0.0.1:{}/bundles/b:1", registry.port());
    let out = fails(
        &env,
        NOT_FETCHED,
        "redirect off the registry",
        &install_args(&source, &pin),
        "the manifest",
    );
    assert!(
        !out.contains("SIG") && !out.contains("do-not-show"),
        "{out}"
    );
    assert_eq!(
        target.requests(),
        Vec::new(),
        "the redirect was not followed"
    );
}
