//! `phases install URL --sha256 HEX` against a real HTTP server on 127.0.0.1 (the tests' own,
//! `tests/common/http.rs`), and consent to wider grants by digest: what the daemon runs to roll
//! out a Machine's `spec.phaseBundle`, and the exit codes it acts on.

use super::common::http::{HttpServer, Reply};
use super::*;

/// `phases install`'s exit code for a bundle that could not be fetched.
const NOT_FETCHED: i32 = 3;

/// sha256 of `path`'s bytes.
fn sha256_of(path: &Path) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(Sha256::digest(std::fs::read(path).expect("read")))
}

/// A server answering `/<name>` with the file `dir/<name>` when it exists, 404 otherwise.
fn serve(dir: &Path) -> HttpServer {
    let dir = dir.to_path_buf();
    HttpServer::start(move |req| {
        let name = req.path().trim_start_matches('/');
        let path = dir.join(name);
        if !name.is_empty() && !name.contains('/') && path.is_file() {
            Reply::file(path)
        } else {
            Reply::not_found()
        }
    })
}

/// What is left in the downloads directory (its lock aside).
fn downloads_left(env: &Env) -> Vec<String> {
    let dir = env.state.join("downloads");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut left: Vec<String> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != ".lock")
        .collect();
    left.sort();
    left
}

/// Runs `args`, asserts exit `code` with `needle` in stderr, that nothing was installed and that
/// no download is left behind; returns stderr.
fn fails(env: &Env, code: i32, what: &str, args: &[&str], needle: &str) -> String {
    let err = refused_with(env, code, what, args, needle);
    assert_eq!(env.link("current"), None, "{what}: nothing installed");
    assert_eq!(
        downloads_left(env),
        Vec::<String>::new(),
        "{what}: left behind"
    );
    err
}

/// The bundle records of the audit trail: (action, current digest, from).
fn bundle_records(env: &Env) -> Vec<(String, Value, Value)> {
    let show = env.ok(&["audit", "show", "--output", "json"]);
    let show: Value = serde_json::from_slice(&show.stdout).expect("audit show");
    show["records"]
        .as_array()
        .expect("records")
        .iter()
        .filter(|r| r["kind"] == "bundle")
        .map(|r| {
            (
                r["action"].as_str().unwrap_or_default().to_string(),
                r["current"]["digest"].clone(),
                r["from"].clone(),
            )
        })
        .collect()
}

#[test]
fn install_by_url_installs_the_pinned_bundle_and_is_audited_like_a_path_install() {
    let env = Env::new();
    let v1 = env.bundle("v1.tar.gz", 1, &[setup_phase()], true);
    let v2 = env.bundle("v2.tar.gz", 2, &[setup_phase(), configure_phase()], true);
    let (d1, d2) = (env.digest(&v1), env.digest(&v2));
    let server = serve(env.tmp.path());
    let url = server.url("/v1.tar.gz");
    let pin = sha256_of(&v1);
    let args: &[&str] = &[
        "phases",
        "install",
        &url,
        "--sha256",
        &pin,
        "--allow-incomplete",
        "--accept-new-grants",
        "--output",
        "json",
    ];
    let out = env.ok(args);
    let installed: Value = serde_json::from_slice(&out.stdout).expect("install json");
    // The shape of a path install, carrying the manifest digest `phases inspect` prints.
    assert_eq!(installed["installed"]["digest"], d1.as_str(), "{installed}");
    assert_eq!(
        installed["installed"]["source"],
        format!("bundle archive {url}").as_str()
    );
    assert!(
        installed["installed"]["signedBy"].is_string(),
        "{installed}"
    );
    assert_eq!(installed["alreadyCurrent"], false);
    assert_eq!(installed["lastGood"], Value::Null);
    assert_eq!(installed["widened"], true);
    let inspected = env.ok(&["phases", "inspect", "--output", "json"]);
    let inspected: Value = serde_json::from_slice(&inspected.stdout).expect("inspect json");
    assert_eq!(inspected["bundle"]["digest"], d1.as_str());
    assert_eq!(env.link("current").as_deref(), Some(d1.as_str()));
    assert_eq!(downloads_left(&env), Vec::<String>::new());
    let requests = server.requests();
    assert_eq!(requests.len(), 1, "{requests:?}");
    assert_eq!(
        (requests[0].method.as_str(), requests[0].path()),
        ("GET", "/v1.tar.gz")
    );

    // Again: downloaded again (nothing is cached), and already current.
    let again = env.ok(args);
    let again: Value = serde_json::from_slice(&again.stdout).expect("install json");
    assert_eq!(again["alreadyCurrent"], true);
    assert_eq!(server.requests().len(), 2);

    // A path install of v2, then v1's own path pinned by its sha256 (allowed downgrade): the
    // trail records the URL install exactly as it records those.
    env.ok(&[
        "phases",
        "install",
        s(&v2),
        "--allow-incomplete",
        "--accept-new-grants",
    ]);
    env.ok(&[
        "phases",
        "install",
        s(&v1),
        "--sha256",
        &pin,
        "--allow-incomplete",
        "--allow-downgrade",
    ]);
    assert_eq!(
        bundle_records(&env),
        [
            ("install".to_string(), json!(d1), Value::Null),
            ("install".to_string(), json!(d2), json!(d1)),
            ("install".to_string(), json!(d1), json!(d2)),
        ]
    );
    env.ok(&["audit", "verify"]);
}

#[test]
fn a_bundle_that_cannot_be_fetched_as_pinned_exits_3_and_leaves_nothing() {
    let env = Env::new();
    let b = env.bundle("b.tar.gz", 1, &[setup_phase()], true);
    let pin = sha256_of(&b);
    let server = serve(env.tmp.path());
    let url = server.url("/b.tar.gz");
    let install = |url: &str, sha256: &str, extra: &[&str]| -> Vec<String> {
        let mut args: Vec<String> = [
            "phases",
            "install",
            url,
            "--sha256",
            sha256,
            "--allow-incomplete",
            "--accept-new-grants",
        ]
        .iter()
        .map(|a| a.to_string())
        .collect();
        args.extend(extra.iter().map(|a| a.to_string()));
        args
    };
    let run = |what: &str, args: &[String], needle: &str| -> String {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        fails(&env, NOT_FETCHED, what, &args, needle)
    };

    // Bytes that are not the pinned ones: discarded, no temp file left.
    let wrong = sha256_of(&env.public);
    let err = run(
        "wrong sha256",
        &install(&url, &wrong, &[]),
        "sha256 mismatch",
    );
    assert!(
        err.contains(&format!("expected {wrong}, got {pin}")),
        "{err}"
    );

    // The server has no such file.
    run(
        "404",
        &install(&server.url("/missing.tgz"), &pin, &[]),
        "answered 404",
    );

    // A body over the 64 MiB cap (a sparse file, streamed): refused, nothing kept.
    let big = env.path("big.tar.gz");
    std::fs::File::create(&big)
        .and_then(|f| f.set_len((64 << 20) + 1))
        .expect("sparse file");
    run(
        "over the cap",
        &install(&server.url("/big.tar.gz"), &pin, &[]),
        "larger than the 67108864 byte limit",
    );

    // A server that does not answer within --timeout.
    let slow = HttpServer::start(|_| Reply {
        delay: std::time::Duration::from_secs(5),
        ..Reply::ok(b"too late")
    });
    run(
        "timeout",
        &install(&slow.url("/b.tar.gz"), &pin, &["--timeout", "1"]),
        "in time",
    );

    // A local archive whose bytes are not the pinned ones.
    let err = run("local mismatch", &install(s(&b), &wrong, &[]), "is pinned");
    assert!(err.contains(&format!("sha256 {pin}, but {wrong}")), "{err}");

    // With --output json the error line carries the exit code.
    let mut args = install(&url, &wrong, &[]);
    args.extend(["--output".to_string(), "json".to_string()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = env.run(&args);
    assert_eq!(out.status.code(), Some(NOT_FETCHED));
    let line = stderr(&out);
    let err: Value = serde_json::from_str(line.lines().last().expect("a line")).expect("json");
    assert_eq!(err["exitCode"], NOT_FETCHED, "{err}");

    // And the right pin installs it.
    env.ok(&[
        "phases",
        "install",
        &url,
        "--sha256",
        &pin,
        "--allow-incomplete",
        "--accept-new-grants",
    ]);
    assert_eq!(env.link("current"), Some(env.digest(&b)));
}

#[test]
fn a_bundle_signed_by_an_untrusted_key_is_refused_with_exit_4() {
    let env = Env::new();
    let (_, other_secret) = keypair(env.tmp.path(), "other");
    let b = env.bundle("untrusted.tar.gz", 1, &[setup_phase()], false);
    env.ok(&["phases", "sign", s(&b), "--key", s(&other_secret)]);
    let server = serve(env.tmp.path());
    fails(
        &env,
        REFUSED,
        "untrusted key",
        &[
            "phases",
            "install",
            &server.url("/untrusted.tar.gz"),
            "--sha256",
            &sha256_of(&b),
            "--allow-incomplete",
            "--accept-new-grants",
        ],
        "which is not trusted",
    );
}

#[test]
fn wider_grants_are_accepted_only_by_the_bundles_own_digest() {
    let env = Env::new();
    // Wider than the embedded bundle (the setup-host grants above are broader).
    let b = env.bundle("wide.tar.gz", 1, &[setup_phase()], true);
    let digest = env.digest(&b);
    let server = serve(env.tmp.path());
    let url = server.url("/wide.tar.gz");
    let pin = sha256_of(&b);
    let args = |consent: &[&'static str]| -> Vec<String> {
        let mut args: Vec<String> = [
            "phases",
            "install",
            url.as_str(),
            "--sha256",
            pin.as_str(),
            "--allow-incomplete",
        ]
        .iter()
        .map(|a| a.to_string())
        .collect();
        args.extend(consent.iter().map(|a| a.to_string()));
        args
    };
    let run = |what: &str, args: Vec<String>, needle: &str| -> String {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        fails(&env, NOT_ACCEPTED, what, &args, needle)
    };

    // No consent (stdin is not a terminal): the widening is shown, the digest to accept named.
    let err = run(
        "no consent",
        args(&[]),
        "are wider than the current bundle's",
    );
    assert!(err.contains("+ grant fs.write"), "{err}");
    assert!(
        err.contains(&format!("pass --accept-grants-digest {digest}")),
        "{err}"
    );

    // Another bundle's digest.
    let other = sha256_of(&env.public);
    let mut wrong = args(&[]);
    wrong.extend(["--accept-grants-digest".to_string(), other.clone()]);
    let err = run("wrong digest", wrong, "is not its digest");
    assert!(
        err.contains(&format!("--accept-grants-digest {other} is not its digest")),
        "{err}"
    );

    // The archive's sha256 is not the bundle's digest either: the digest is the manifest's.
    let mut archive_digest = args(&[]);
    archive_digest.extend(["--accept-grants-digest".to_string(), pin.clone()]);
    run(
        "archive sha256 as digest",
        archive_digest,
        "is not its digest",
    );

    // Its own digest: installed, widened.
    let mut right = args(&["--output", "json"]);
    right.extend(["--accept-grants-digest".to_string(), digest.clone()]);
    let right: Vec<&str> = right.iter().map(String::as_str).collect();
    let out = env.ok(&right);
    let installed: Value = serde_json::from_slice(&out.stdout).expect("install json");
    assert_eq!(installed["installed"]["digest"], digest.as_str());
    assert_eq!(installed["widened"], true);
    assert_eq!(env.link("current").as_deref(), Some(digest.as_str()));
}

#[test]
fn usage_errors_exit_2_before_anything_is_requested() {
    let env = Env::new();
    let server = serve(env.tmp.path());
    let url = server.url("/b.tar.gz");
    let pin = sha256_of(&env.public);
    let (pin, upper) = (pin.as_str(), pin.to_uppercase());
    let dir = env.path("a-dir");
    std::fs::create_dir_all(&dir).expect("dir");
    let ftp = url.replacen("http://", "ftp://", 1);
    let with_credentials = url.replacen("http://", "http://ops:hunter2@", 1);
    for (what, args, needle) in [
        (
            "URL without --sha256",
            vec!["phases", "install", url.as_str()],
            "needs --sha256",
        ),
        (
            "malformed sha256",
            vec!["phases", "install", url.as_str(), "--sha256", "ABC"],
            "64 lowercase hex digits",
        ),
        (
            "uppercase sha256",
            vec!["phases", "install", url.as_str(), "--sha256", &upper],
            "64 lowercase hex digits",
        ),
        (
            "other scheme",
            vec!["phases", "install", ftp.as_str(), "--sha256", pin],
            "only http://, https:// and oci://",
        ),
        (
            "credentials",
            vec![
                "phases",
                "install",
                with_credentials.as_str(),
                "--sha256",
                pin,
            ],
            "a URL with credentials is refused",
        ),
        (
            "malformed digest",
            vec![
                "phases",
                "install",
                url.as_str(),
                "--sha256",
                pin,
                "--accept-grants-digest",
                "xyz",
            ],
            "64 lowercase hex digits",
        ),
        (
            "both consents",
            vec![
                "phases",
                "install",
                url.as_str(),
                "--sha256",
                pin,
                "--accept-grants-digest",
                pin,
                "--accept-new-grants",
            ],
            "cannot be used with",
        ),
        (
            "a directory with --sha256",
            vec!["phases", "install", s(&dir), "--sha256", pin],
            "is a directory",
        ),
    ] {
        let err = fails(&env, 2, what, &args, needle);
        assert!(!err.contains("hunter2"), "{what}: {err}");
    }
    assert_eq!(server.requests(), Vec::new(), "nothing was requested");
}
