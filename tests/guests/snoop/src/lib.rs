//! Test guest: a hostile phase that tries to get the bootstrap token out (tests/secrets.rs).
//!
//! Built for the production world `download-artifacts` (fs, download, log). It takes what it
//! can reach (its whole input, the bootstrap token field, the secret file read back after
//! writing it) and tries every way out its grants allow: stdout, stderr, the log, a file
//! outside the secret file (also reversed and spaced, against exact-match redaction; as is and
//! with the reference scrubbed, since a reference outside a secret file is refused), a path,
//! a URL, its report and, when `snoop/fail` exists, its error. Each attempt's result is in
//! the report summary as JSON, so the test can assert which were refused and how.
//!
//! Grants it expects: every input part, `fs.write` on `snoop` and on [`SECRET_FILE`],
//! `secrets.bootstrap-token` on [`SECRET_FILE`], `download.pinned-artifacts`.

wit_bindgen::generate!({ world: "download-artifacts", path: "../../../wit" });

use nodeward::host::types::{Error, Outcome};
use nodeward::host::{download, fs, log};
use serde_json::{Map, Value, json};

/// The file the bundle grants as the bootstrap token's secret file.
const SECRET_FILE: &str = "etc/kubernetes/bootstrap-kubelet.conf";
/// What the host hands a phase in place of the token.
const REFERENCE: &str = "nodeward-secret:bootstrap-token";

fn outcome(r: Result<Outcome, Error>) -> Value {
    match r {
        Ok(o) => json!(match o {
            Outcome::Created => "created",
            Outcome::Changed => "changed",
            Outcome::Unchanged => "unchanged",
            Outcome::Removed => "removed",
        }),
        Err(e) => json!(match e {
            Error::Denied(_) => "denied",
            Error::InvalidArgument(_) => "invalid-argument",
            Error::NotFound(_) => "not-found",
            Error::Escape(_) => "escape",
            Error::Io(_) => "io",
            Error::Failed(_) => "failed",
            Error::Timeout(_) => "timeout",
            Error::Unavailable(_) => "unavailable",
        }),
    }
}

struct Snoop;

impl exports::nodeward::host::phase::Guest for Snoop {
    fn run(input: String) -> Result<exports::nodeward::host::phase::Report, String> {
        let parsed: Value = serde_json::from_str(&input).map_err(|e| e.to_string())?;
        let token = parsed
            .pointer("/config/kubelet/auth/bootstrapToken")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let mut r = Map::new();

        // Print and log everything it was given.
        println!("stdout: {input}");
        eprintln!("stderr: {input}");
        log::log(
            log::Level::Warn,
            &format!("log: token {token} input {input}"),
        );

        // The secret file: the reference with group/other bits is refused, 0600 is written.
        let kubeconfig = format!("token: \"{REFERENCE}\"\n");
        r.insert(
            "secret-0644".into(),
            outcome(fs::write_file(SECRET_FILE, kubeconfig.as_bytes(), 0o644)),
        );
        r.insert(
            "secret-0600".into(),
            outcome(fs::write_file(SECRET_FILE, kubeconfig.as_bytes(), 0o600)),
        );
        // Read it back: what a phase sees of a secret file.
        let back = fs::read_file(SECRET_FILE)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_else(|_| "unreadable".into());
        r.insert("read-back".into(), json!(back));
        // The reference into a file the secrets grant does not name.
        r.insert(
            "reference-elsewhere".into(),
            outcome(fs::write_file(
                "snoop/ref.conf",
                kubeconfig.as_bytes(),
                0o600,
            )),
        );

        // Everything it holds into a plain file, as is, reversed and spaced out.
        let loot = format!("{input}\n{token}\n{back}\n");
        let reversed: String = loot.chars().rev().collect();
        let spaced: String = loot.chars().flat_map(|c| [c, ' ']).collect();
        let all = format!("{loot}{reversed}\n{spaced}\n");
        r.insert(
            "loot-file".into(),
            outcome(fs::write_file("snoop/loot", all.as_bytes(), 0o644)),
        );
        // A reference is refused outside a secret file, so also without it.
        let scrubbed = all.replace(REFERENCE, "REF");
        r.insert(
            "scrubbed-loot-file".into(),
            outcome(fs::write_file(
                "snoop/loot-scrubbed",
                scrubbed.as_bytes(),
                0o644,
            )),
        );
        r.insert(
            "loot-path".into(),
            outcome(fs::write_file(&format!("snoop/t={token}"), b"x", 0o644)),
        );

        // Downloads: each pinned artifact as pinned (allowed), with data in its URL, and
        // with another digest (both refused).
        let mut fetches = Vec::new();
        let artifacts = parsed["artifacts"].as_array().cloned().unwrap_or_default();
        for (i, a) in artifacts.iter().enumerate() {
            let url = a["url"].as_str().unwrap_or_default();
            let Some(sha) = a["sha256"].as_str() else {
                let other = "0".repeat(64);
                fetches.push(json!({ "unpinned": outcome(download::fetch(url, &other, &format!("snoop/u{i}"), 0o644)) }));
                continue;
            };
            let leak = format!("{url}?t={token}&all={}", input.len());
            let other = if sha.starts_with('0') { "1" } else { "0" }.repeat(64);
            fetches.push(json!({
                "pinned": outcome(download::fetch(url, sha, &format!("snoop/a{i}"), 0o644)),
                "leaky-url": outcome(download::fetch(&leak, sha, &format!("snoop/b{i}"), 0o644)),
                "other-sha": outcome(download::fetch(url, &other, &format!("snoop/c{i}"), 0o644)),
            }));
        }
        r.insert("fetches".into(), Value::Array(fetches));

        let results = Value::Object(r).to_string();
        if matches!(fs::stat("snoop/fail"), Ok(Some(_))) {
            return Err(format!("snoop fails with {token}: {all}"));
        }
        Ok(exports::nodeward::host::phase::Report {
            summary: format!("{results}\n{token}"),
            changed: vec![token, back],
        })
    }
}

export!(Snoop);
