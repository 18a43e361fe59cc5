//! Logs on stderr: quiet by default (no line per capability call), `--log-level` for
//! nodeward's own targets only, invalid filters refused, colour only when asked or on a
//! terminal, and under `--log-format json` every line JSON with typed fields, the final error
//! included.

use super::*;

const APPLY: [&str; 5] = ["apply", "--phase", "setup-host", "--phase", "configure"];

/// `APPLY` and `extra` against a fresh root of `f`.
fn apply(f: &Fixture, extra: &[&str], env: &[(&str, &str)]) -> Output {
    let root = f.tmp.path().join(format!("root-{}", next_id()));
    std::fs::create_dir_all(&root).expect("root");
    let state = cli_state_dir();
    let mut args: Vec<&str> = APPLY.to_vec();
    args.extend(extra);
    let mut env = env.to_vec();
    env.push(("NODEWARD_ROOT", root.to_str().expect("utf8")));
    env.push(("NODEWARD_STATE_DIR", state.to_str().expect("utf8")));
    let out = bare(&args, &env);
    assert_eq!(code(&out), 0, "{args:?}: {}", stderr(&out));
    out
}

/// A name no other call in this process used.
fn next_id() -> usize {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Every stderr line parsed as JSON (panics on one that is not).
fn json_lines(out: &Output) -> Vec<Value> {
    stderr(out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

#[test]
fn the_default_level_prints_no_line_per_capability_call() {
    let f = Fixture::new();
    let out = apply(&f, &[], &[]);
    let err = stderr(&out);
    assert!(!err.contains("capability call"), "{err}");
    assert!(
        err.contains("running phase"),
        "info still says what runs: {err}"
    );
    // --verbose and --log-level show the audit records; --quiet only warnings.
    let verbose = stderr(&apply(&f, &["--verbose"], &[]));
    assert!(verbose.contains("nodeward::audit") && verbose.contains("capability call"));
    let audit = stderr(&apply(
        &f,
        &["--log-level", "warn,nodeward::audit=debug"],
        &[],
    ));
    assert!(audit.contains("capability call") && !audit.contains("running phase"));
    let from_env = stderr(&apply(&f, &[], &[("NODEWARD_LOG", "debug")]));
    assert!(from_env.contains("capability call"));
    let quiet = stderr(&apply(&f, &["--quiet"], &[("NODEWARD_LOG", "debug")]));
    assert!(
        !quiet.contains(" INFO ") && !quiet.contains("DEBUG"),
        "{quiet}"
    );
    usage_error(&bare(&["plan", "--quiet", "--verbose"], &[]), "--verbose");
    usage_error(
        &bare(&["plan", "--quiet", "--log-level", "info"], &[]),
        "--quiet",
    );
}

#[test]
fn log_level_applies_to_nodeward_and_dependencies_stay_at_warn() {
    let f = Fixture::new();
    // A fresh state dir: the component is compiled in this run, which is when wasmtime and
    // cranelift log (megabytes at debug).
    let state = f.tmp.path().join("fresh-state");
    let args = [
        "plan",
        "--phase",
        "setup-host",
        "--log-level",
        "trace",
        "--log-format",
        "json",
    ];
    let env = [
        ("NODEWARD_ROOT", f.root.to_str().expect("utf8")),
        ("NODEWARD_STATE_DIR", state.to_str().expect("utf8")),
    ];
    let out = bare(&args, &env);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let lines = json_lines(&out);
    assert!(!lines.is_empty());
    for l in &lines {
        let target = l["target"].as_str().unwrap_or_default();
        assert!(
            target.starts_with("nodeward") || l["level"] == "WARN" || l["level"] == "ERROR",
            "{l}"
        );
    }
    assert!(out.stderr.len() < 256 << 10, "{} bytes", out.stderr.len());
}

#[test]
fn an_invalid_filter_is_a_usage_error_naming_it() {
    let f = Fixture::new();
    for filter in ["verbose", "bogus=[", "nodeward=loud"] {
        let out = nodeward(
            &f,
            &["plan", "--phase", "setup-host", "--log-level", filter],
        );
        let err = usage_error(&out, filter);
        assert!(err.contains("--log-level"), "{err}");
        assert!(out.stdout.is_empty(), "nothing ran");
    }
    let out = bare(&["version"], &[("NODEWARD_LOG", "verbose")]);
    let err = usage_error(&out, "verbose");
    assert!(err.contains("NODEWARD_LOG"), "{err}");
}

#[test]
fn colour_only_when_asked_or_on_a_terminal() {
    let f = Fixture::new();
    // stderr is a pipe here: no escape codes unless --color always.
    let auto = apply(&f, &[], &[]);
    assert!(!stderr(&auto).contains('\u{1b}'));
    let always = apply(&f, &["--color", "always"], &[]);
    assert!(stderr(&always).contains('\u{1b}'));
    let never = apply(&f, &["--color", "never"], &[("TERM", "xterm-256color")]);
    assert!(!stderr(&never).contains('\u{1b}'));
    usage_error(&bare(&["version", "--color", "sometimes"], &[]), "--color");
}

#[test]
fn json_logs_are_json_on_every_line_with_typed_fields() {
    let f = Fixture::new();
    let out = apply(&f, &["--log-format", "json", "--verbose"], &[]);
    let lines = json_lines(&out);
    let running: Vec<&Value> = lines
        .iter()
        .filter(|l| l["message"] == "running phase")
        .collect();
    assert_eq!(running.len(), 2, "{lines:?}");
    assert!(running.iter().all(|l| l["mode"] == "apply"), "{running:?}");
    let calls: Vec<&Value> = lines
        .iter()
        .filter(|l| l["target"] == "nodeward::audit" && l["message"] == "capability call")
        .collect();
    assert!(!calls.is_empty(), "{lines:?}");
    for c in &calls {
        assert!(c["args"].is_object(), "args is a JSON value: {c}");
        assert!(c["duration_us"].is_u64() && c["denied"] == false, "{c}");
        assert_eq!(c["level"], "DEBUG");
    }

    // The final error of a failed command is a JSON line too …
    let out = nodeward(
        &f,
        &["plan", "--phase", "no-such-phase", "--log-format", "json"],
    );
    assert_eq!(code(&out), 2);
    let lines = json_lines(&out);
    let last = lines.last().expect("an error line");
    assert_eq!(last["level"], "ERROR");
    assert_eq!(last["exit_code"], 2);
    assert!(
        last["message"]
            .as_str()
            .unwrap_or_default()
            .contains("no-such-phase")
    );
    // … as is a usage error found while parsing, and an invalid filter.
    for args in [
        &["status", "--phase", "x", "--log-format", "json"][..],
        &["--log-format=json", "plan", "--memory-limit", "0"],
        &["plan", "--log-format", "json", "--log-level", "bogus=["],
    ] {
        let out = bare(args, &[]);
        assert_eq!(code(&out), 2, "{args:?}");
        let lines = json_lines(&out);
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert_eq!(lines[0]["exit_code"], 2);
    }
    // With text logs, `--output json` keeps its error object.
    let out = nodeward(
        &f,
        &["plan", "--phase", "no-such-phase", "--output", "json"],
    );
    let v: Value = serde_json::from_str(stderr(&out).trim()).expect("error object");
    assert_eq!(v["exitCode"], 2);
    // With JSON logs, the error is a log line whatever the output format.
    let out = nodeward(
        &f,
        &[
            "plan",
            "--phase",
            "no-such-phase",
            "--output",
            "json",
            "--log-format",
            "json",
        ],
    );
    assert_eq!(code(&out), 2);
    let lines = json_lines(&out);
    let last = lines.last().expect("an error line");
    assert_eq!(last["level"], "ERROR");
    assert_eq!(last["exit_code"], 2);
    assert!(last.get("exitCode").is_none(), "{last}");
}
