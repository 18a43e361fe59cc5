//! No answer tells a right guess of a secret from a wrong one, a secret's parts are masked
//! wherever the whole is, and a plan shows no digest of a secret-bearing file (issue 26;
//! `host/secrets.rs`).
//!
//! The attacker is a phase (the probe guest) granted the bootstrap token's secret file and a
//! file someone else left holding the token (as cloud-init leaves its user data), with a
//! download grant on a loopback server it controls. It sends its guesses every way a call can
//! compare them with the disk: written as they are over the secret file or a unit file, as the
//! sha256 of a download over a file holding the token, as an archive entry extracted over it.
//! Each probe runs twice on fresh roots, once with the right guess and once with a wrong one,
//! and every answer must be the same. What stays observable (a guess written and then read
//! back comes back masked) is stated in `host/secrets.rs`.

mod common;

use common::http::{HttpServer, Reply};
use common::*;
use flate2::{Compression, write::GzEncoder};
use nodeward::plan::{ChangeKind, RunMode};
use serde_json::{Value, json};
use std::io::Write;
use std::os::unix::fs::PermissionsExt;

/// What a phase writes where the token belongs.
const REF: &str = nodeward_node_config::secret::BOOTSTRAP_TOKEN_REF;
/// The secret file of the grants below.
const CONF: &str = "etc/kubernetes/bootstrap-kubelet.conf";
/// Files someone else left holding the token, that the phase may write (as cloud-init leaves
/// its user data): one for each way of guessing, so each guess meets the token first.
const LEFT_WRITE: &str = "etc/kubernetes/left/write";
const LEFT_FETCH: &str = "etc/kubernetes/left/fetch";
const LEFT_EXTRACT: &str = "etc/kubernetes/extract/user-data";
/// A wrong guess, of the token's shape.
const WRONG: &str = "abcdef.0000000000000000";

fn grants_for_guessing() -> nodeward::grants::Grants {
    grants(&format!(
        "[fs]\nwrite = [\"etc/kubernetes\"]\n[secrets]\nbootstrap-token = [\"{CONF}\"]\n\
         [systemd]\nwrite = [\"guess.service\"]\n[download]\nurls = [\"http://127.0.0.1:*/\"]\n"
    ))
}

/// `text` gzip-tarred as the entry `user-data` (mode 0600).
fn archive(text: &str) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_size(text.len() as u64);
    h.set_mode(0o600);
    h.set_entry_type(tar::EntryType::Regular);
    h.set_mtime(0);
    b.append_data(&mut h, "user-data", text.as_bytes())
        .expect("entry");
    let tar = b.into_inner().expect("tar");
    let mut gz = GzEncoder::new(Vec::new(), Compression::default());
    gz.write_all(&tar).expect("gz");
    gz.finish().expect("gz")
}

/// Every answer the probe gets for `guess`, on a fresh root in `mode`: the secret file written
/// with the reference first (the host substitutes the token), then the guess sent every way,
/// each against a file that holds the token as the host or someone else left it.
fn answers(mode: RunMode, guess: &str) -> Vec<String> {
    let f = Fixture::new();
    let holding = |guess: &str| format!("token: {guess}\n");
    for left in [LEFT_WRITE, LEFT_FETCH, LEFT_EXTRACT] {
        f.put(left, &holding(TOKEN));
        std::fs::set_permissions(f.root.join(left), std::fs::Permissions::from_mode(0o600))
            .expect("chmod");
    }
    let unit = |guess: &str| format!("[Service]\nEnvironment=T={guess}\n");
    f.put("etc/systemd/system/guess.service", &unit(TOKEN));
    let file = holding(guess);
    let tarball = archive(&file);
    let (served_file, served_tarball) = (file.clone().into_bytes(), tarball.clone());
    let server = HttpServer::start(move |req| match req.path() {
        "/file" => Reply::ok(&served_file),
        _ => Reply::ok(&served_tarball),
    });
    let s = f.session(mode);
    let r = probe(
        &s,
        grants_for_guessing(),
        json!([
            {"op": "fs.write-file", "path": CONF, "contents": holding(REF), "mode": 0o600},
            // The guess written over the secret file and over a file holding the token, with
            // its mode and with another.
            {"op": "fs.write-file", "path": CONF, "contents": file, "mode": 0o600},
            {"op": "fs.write-file", "path": LEFT_WRITE, "contents": file, "mode": 0o640},
            {"op": "systemd.write-unit", "unit": "guess.service", "contents": unit(guess)},
            // The guess as the digest of a download over a file holding the token.
            {"op": "download.fetch", "url": server.url("/file"), "sha256": nodeward::bundle::sha256_hex(file.as_bytes()), "dest": LEFT_FETCH, "mode": 0o600},
            // The guess as an archive entry extracted over one.
            {"op": "download.fetch-and-extract", "url": server.url("/a.tgz"), "sha256": nodeward::bundle::sha256_hex(&tarball), "dest-dir": "etc/kubernetes/extract", "strip-components": 0},
        ]),
    );
    let text = serde_json::to_string(&r).expect("json");
    assert!(!text.contains(TOKEN_SECRET), "{mode:?}: {text}");
    r.iter()
        .map(|v| match v.get("ok") {
            Some(ok) => format!("ok:{ok}"),
            None => format!("err:{}", kind(v)),
        })
        .collect()
}

#[test]
fn a_right_guess_gets_the_answers_a_wrong_one_gets() {
    for mode in [RunMode::Plan, RunMode::Apply] {
        let right = answers(mode, TOKEN);
        let wrong = answers(mode, WRONG);
        assert_eq!(right, wrong, "{mode:?}");
        assert_eq!(right[0], "ok:\"created\"", "{mode:?}: {right:?}");
        assert!(
            right[1..].iter().all(|a| a == "ok:\"changed\""),
            "{mode:?}: every guess replaces what is there: {right:?}"
        );
    }
}

#[test]
fn the_secret_half_is_masked_and_written_back_like_the_whole() {
    let half_file = "etc/kubernetes/token.yaml";
    let half_text = format!("token-id: abcdef\ntoken-secret: {TOKEN_SECRET}\n");
    for mode in [RunMode::Plan, RunMode::Apply] {
        let f = Fixture::new();
        f.put(half_file, &half_text);
        std::fs::set_permissions(
            f.root.join(half_file),
            std::fs::Permissions::from_mode(0o600),
        )
        .expect("chmod");
        let s = f.session(mode);
        let g = grants(&format!(
            "[fs]\nwrite = [\"etc/kubernetes\"]\n[secrets]\nbootstrap-token = [\"{half_file}\"]\n"
        ));
        let masked = format!("token-id: abcdef\ntoken-secret: {REF}.secret\n");
        let r = probe(
            &s,
            g,
            json!([
                {"op": "fs.read-file", "path": half_file},
                {"op": "fs.write-file", "path": half_file, "contents": masked, "mode": 0o600},
                {"op": "fs.write-file", "path": "etc/kubernetes/copy", "contents": masked, "mode": 0o600},
            ]),
        );
        assert_eq!(ok(&r[0]), masked.as_str(), "{mode:?}: read masks the half");
        assert_eq!(
            ok(&r[1]),
            "unchanged",
            "{mode:?}: what was read writes back as it was"
        );
        assert_eq!(err_kind(&r[2]), "denied", "{mode:?}: {r:?}");
        assert_eq!(
            std::fs::read_to_string(f.root.join(half_file)).expect("file"),
            half_text
        );
        let seen = format!("{r:?}{:?}{:?}", s.audit.records(), s.changes());
        assert!(!seen.contains(TOKEN_SECRET), "{mode:?}: {seen}");
    }
}

#[test]
fn a_plan_shows_no_digest_of_a_file_holding_a_secret() {
    let f = Fixture::new();
    std::fs::create_dir_all(f.root.join("etc/kubernetes")).expect("dir");
    let s = f.session(RunMode::Plan);
    let r = probe(
        &s,
        grants_for_guessing(),
        json!([
            {"op": "fs.write-file", "path": CONF, "contents": format!("token: {REF}\n"), "mode": 0o600},
            {"op": "fs.write-file", "path": CONF, "contents": format!("token: {REF} \n"), "mode": 0o600},
            {"op": "fs.write-file", "path": "etc/kubernetes/half", "contents": format!("{TOKEN_SECRET}\n"), "mode": 0o600},
            {"op": "fs.write-file", "path": "etc/kubernetes/plain", "contents": "no secret\n", "mode": 0o644},
        ]),
    );
    assert!(r.iter().all(|v| kind(v) == "ok"), "{r:?}");
    let changes = s.changes();
    let digests: Vec<(String, Option<String>)> = changes
        .iter()
        .filter_map(|c| match &c.kind {
            ChangeKind::FileCreate { path, sha256, .. }
            | ChangeKind::FileReplace { path, sha256, .. } => Some((path.clone(), sha256.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(digests.len(), 4, "{digests:?}");
    for (path, sha256) in &digests[..3] {
        assert_eq!(sha256, &None, "{path}: no digest of a secret-bearing file");
    }
    assert_eq!(
        digests[3].1.as_deref(),
        Some(nodeward::bundle::sha256_hex(b"no secret\n").as_str())
    );
    // As the plan's JSON shows them: no sha256 key, the size and a withheld diff.
    let json: Vec<Value> = changes
        .iter()
        .map(|c| serde_json::to_value(c).expect("json"))
        .collect();
    assert!(
        json[0].get("sha256").is_none() && json[0]["size"].is_u64(),
        "{}",
        json[0]
    );
    assert!(json[3]["sha256"].is_string(), "{}", json[3]);
    let text = serde_json::to_string(&json).expect("json");
    assert!(!text.contains(TOKEN_SECRET), "{text}");
}
