//! `phases install` from an `https://` URL or an `oci://` registry whose certificate a private
//! CA signed ([`TestCa`]): trusted exactly as artifact downloads trust it, the system store
//! plus the node config's `downloadOptions.caFile` (`--config`, else the node's applied
//! config, as the daemon's roll-out runs it), and refused naming the certificate problem
//! without it. The registry is the tests' HTTPS server answering the two requests of an
//! anonymous pull (the manifest, the layer): Debian's `docker-registry` speaks plain HTTP on
//! 127.0.0.1, and a registry is spoken to over HTTPS only by name (`localhost`).

use super::common::http::{HttpServer, Reply};
use super::common::tls::TestCa;
use super::*;
use nodeward::bundle::oci::{ARTIFACT_TYPE, BUNDLE_MEDIA_TYPE};

/// `phases install`'s exit code for a bundle that could not be fetched.
const NOT_FETCHED: i32 = 3;
/// Where the configs of these tests name the CA (beneath the host root).
const CA_FILE: &str = "/etc/nodeward/mirror-ca.pem";

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(Sha256::digest(bytes))
}

/// A node config (the embedded example) naming [`CA_FILE`], written beside the root.
fn config_with_ca_file(env: &Env) -> PathBuf {
    let path = env.path("node.yaml");
    let text = format!(
        "{}downloadOptions:\n  caFile: {CA_FILE}\n",
        nodeward::config::EMBEDDED
    );
    std::fs::write(&path, text).expect("config");
    path
}

/// Puts `ca`'s certificate at [`CA_FILE`] beneath the root.
fn put_ca_file(env: &Env, ca: &TestCa) {
    let file = env.root.join(CA_FILE.trim_start_matches('/'));
    std::fs::create_dir_all(file.parent().expect("parent")).expect("mkdir");
    std::fs::write(file, ca.ca_pem()).expect("CA file");
}

/// Makes the config at `config` the node's applied config, as a bootstrap records it.
fn apply(env: &Env, config: &Path) {
    let loaded = nodeward::config::load(Some(config)).expect("config loads");
    let bytes = serde_json::to_vec(&loaded).expect("json");
    let dir = env.root.join(nodeward_node_config::layout::STATE_DIR);
    std::fs::create_dir_all(&dir).expect("state dir");
    std::fs::write(
        dir.join("applied-config.json.sha256"),
        format!("{}  applied-config.json\n", sha256_hex(&bytes)),
    )
    .expect("sidecar");
    std::fs::write(dir.join("applied-config.json"), bytes).expect("applied config");
}

/// `phases install SOURCE --sha256 PIN --allow-incomplete --accept-new-grants [extra]`.
fn install<'a>(source: &'a str, pin: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "phases",
        "install",
        source,
        "--sha256",
        pin,
        "--allow-incomplete",
        "--accept-new-grants",
    ];
    args.extend(extra);
    args
}

#[test]
fn a_url_bundle_from_a_private_ca_is_trusted_through_the_ca_file_only() {
    let env = Env::new();
    let ca = TestCa::new("mirror-ca");
    let v1 = env.bundle("v1.tar.gz", 1, &[setup_phase()], true);
    let v2 = env.bundle("v2.tar.gz", 2, &[setup_phase(), configure_phase()], true);
    let (d1, d2) = (env.digest(&v1), env.digest(&v2));
    let dir = env.tmp.path().to_path_buf();
    let server = HttpServer::start_tls(ca.server_config(), move |req| {
        let name = req.path().trim_start_matches('/');
        match name {
            "v1.tar.gz" | "v2.tar.gz" => Reply::file(dir.join(name)),
            _ => Reply::not_found(),
        }
    });
    let (url1, url2) = (server.url("/v1.tar.gz"), server.url("/v2.tar.gz"));
    let pin1 = sha256_hex(&std::fs::read(&v1).expect("v1"));
    let pin2 = sha256_hex(&std::fs::read(&v2).expect("v2"));

    // The system store only (no --config, no applied config): refused at the handshake,
    // saying why and where the CA belongs.
    let err = refused_with(
        &env,
        NOT_FETCHED,
        "no caFile",
        &install(&url1, &pin1, &[]),
        "is not trusted (UnknownIssuer)",
    );
    assert!(err.contains(&url1), "names the URL: {err}");
    assert!(err.contains("downloadOptions.caFile"), "says where: {err}");
    assert!(
        server.requests().is_empty(),
        "no request past the handshake"
    );
    assert_eq!(env.link("current"), None);

    // A config naming a caFile that is not there: a config error naming it as configured.
    let config = config_with_ca_file(&env);
    let with_config = ["--config", s(&config)];
    let err = refused_with(
        &env,
        2,
        "missing caFile",
        &install(&url1, &pin1, &with_config),
        &format!(
            "{}: downloadOptions.caFile {CA_FILE}: cannot read",
            config.display()
        ),
    );
    assert!(err.contains("No such file"), "{err}");
    // A local install needs no network: a broken caFile does not stop it.
    env.ok(&install(s(&v1), &pin1, &with_config));
    assert_eq!(env.link("current").as_deref(), Some(d1.as_str()));

    // The CA in the caFile of --config: trusted.
    put_ca_file(&env, &ca);
    env.ok(&install(&url2, &pin2, &with_config));
    assert_eq!(env.link("current").as_deref(), Some(d2.as_str()));
    assert_eq!(server.requests().len(), 1);

    // Without --config, the node's applied config's caFile (what the daemon's roll-out uses).
    apply(&env, &config);
    env.ok(&install(&url1, &pin1, &["--allow-downgrade"]));
    assert_eq!(env.link("current").as_deref(), Some(d1.as_str()));
    assert_eq!(server.requests().len(), 2);
}

/// The manifest of a bundle artifact whose one layer is `archive`.
fn manifest(archive: &[u8]) -> Vec<u8> {
    let config = b"{}";
    json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "artifactType": ARTIFACT_TYPE,
        "config": {
            "mediaType": "application/vnd.oci.empty.v1+json",
            "digest": format!("sha256:{}", sha256_hex(config)),
            "size": config.len(),
        },
        "layers": [{
            "mediaType": BUNDLE_MEDIA_TYPE,
            "digest": format!("sha256:{}", sha256_hex(archive)),
            "size": archive.len(),
        }],
    })
    .to_string()
    .into_bytes()
}

#[test]
fn an_oci_bundle_from_a_registry_with_a_private_ca_is_trusted_through_the_ca_file_only() {
    let env = Env::new();
    let ca = TestCa::new("registry-ca");
    let b = env.bundle("b.tar.gz", 1, &[setup_phase()], true);
    let archive = std::fs::read(&b).expect("archive");
    let pin = sha256_hex(&archive);
    let manifest = manifest(&archive);
    let blob = format!("/v2/bundles/acme/blobs/sha256:{pin}");
    let server = HttpServer::start_tls(ca.server_config(), move |req| match req.path() {
        "/v2/bundles/acme/manifests/1" => Reply::ok(&manifest)
            .with_header("Content-Type", "application/vnd.oci.image.manifest.v1+json"),
        p if p == blob => Reply::ok(&archive),
        _ => Reply::not_found(),
    });
    // By name: a registry written as a loopback address would be spoken to in plain HTTP.
    let reference = format!("oci://localhost:{}/bundles/acme:1", server.port());

    let err = refused_with(
        &env,
        NOT_FETCHED,
        "no caFile",
        &install(&reference, &pin, &[]),
        "is not trusted (UnknownIssuer)",
    );
    assert!(err.contains(&reference), "names the reference: {err}");
    assert!(err.contains("downloadOptions.caFile"), "says where: {err}");
    assert!(
        server.requests().is_empty(),
        "no request past the handshake"
    );

    let config = config_with_ca_file(&env);
    let with_config = ["--config", s(&config)];
    refused_with(
        &env,
        2,
        "missing caFile",
        &install(&reference, &pin, &with_config),
        &format!("downloadOptions.caFile {CA_FILE}: cannot read"),
    );
    assert!(server.requests().is_empty(), "nothing requested");

    put_ca_file(&env, &ca);
    env.ok(&install(&reference, &pin, &with_config));
    assert_eq!(
        env.link("current").as_deref(),
        Some(env.digest(&b).as_str())
    );
    let paths: Vec<String> = server
        .requests()
        .iter()
        .map(|r| r.path().to_string())
        .collect();
    assert_eq!(
        paths,
        [
            "/v2/bundles/acme/manifests/1".to_string(),
            format!("/v2/bundles/acme/blobs/sha256:{pin}")
        ]
    );

    // Without --config, the node's applied config's caFile.
    apply(&env, &config);
    let out = env.ok(&install(&reference, &pin, &["--output", "json"]));
    let again: Value = serde_json::from_slice(&out.stdout).expect("install json");
    assert_eq!(again["alreadyCurrent"], true, "{again}");
    assert_eq!(server.requests().len(), 4);
}
