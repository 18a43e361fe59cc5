//! Flags: limits out of range and flags a command does not take are usage errors naming the
//! flag (nothing runs); each command's help lists only its flags; `help`, `completions` and
//! `man` come from the same definition.

use super::*;

#[test]
fn limits_out_of_range_are_usage_errors_naming_the_flag() {
    let f = Fixture::new();
    let before = snapshot(&f.root);
    for (args, flag) in [
        (&["plan", "--phase-timeout", "0"][..], "--phase-timeout"),
        (
            &["apply", "--phase", "setup-host", "--phase-timeout", "0"],
            "--phase-timeout",
        ),
        (&["plan", "--phase-timeout", "99999999"], "--phase-timeout"),
        (&["plan", "--memory-limit", "0"], "--memory-limit"),
        (
            &["plan", "--memory-limit", "99999999999999999999999"],
            "--memory-limit",
        ),
        (
            &["plan", "--memory-limit", "17592186044416"],
            "--memory-limit",
        ),
        (&["bootstrap", "--wait-timeout", "0"], "--wait-timeout"),
        (&["upgrade", "--wait-timeout", "-1"], "--wait-timeout"),
    ] {
        let out = nodeward(&f, args);
        usage_error(&out, flag);
        assert!(out.stdout.is_empty(), "{args:?} ran: {}", stdout(&out));
    }
    assert_eq!(
        snapshot(&f.root),
        before,
        "a refused command changed the host"
    );
    // In range: accepted.
    let ok = nodeward(
        &f,
        &[
            "plan",
            "--phase",
            "setup-host",
            "--phase-timeout",
            "1",
            "--memory-limit",
            "128",
        ],
    );
    assert_eq!(code(&ok), 0, "{}", stderr(&ok));
}

#[test]
fn flags_a_command_does_not_take_are_usage_errors_naming_them() {
    let f = Fixture::new();
    let before = snapshot(&f.root);
    for (args, flag) in [
        (&["status", "--phase", "x"][..], "--phase"),
        (&["status", "--config", "node.yaml"], "--config"),
        (
            &["apply", "--phase", "setup-host", "--mode", "nspawn"],
            "--mode",
        ),
        (
            &["apply", "--phase", "setup-host", "--wait-timeout", "5"],
            "--wait-timeout",
        ),
        (&["reset", "--wait-timeout", "5"], "--wait-timeout"),
        (
            &["plan", "--phase", "setup-host", "--mode", "none"],
            "--mode",
        ),
        (&["version", "--phase", "setup-host"], "--phase"),
        (&["phases", "list", "--config", "node.yaml"], "--config"),
        (
            &["phases", "pack", "dir", "-o", "out", "--root", "/"],
            "--root",
        ),
        (
            &["phases", "sign", "b", "--key", "k", "--state-dir", "/s"],
            "--state-dir",
        ),
        (
            &["phases", "rollback", "--trusted-key", "k.pub"],
            "--trusted-key",
        ),
        (
            &["config", "validate", "node.yaml", "--root", "/"],
            "--root",
        ),
        (&["completions", "bash", "--output", "json"], "--output"),
        (
            &["plan", "--ignore-preflight-errors", "Swap"],
            "--ignore-preflight-errors",
        ),
        (&["preflight", "--state-dir", "/s"], "--state-dir"),
    ] {
        let out = bare(args, &[]);
        usage_error(&out, flag);
        assert!(out.stdout.is_empty(), "{args:?} ran");
    }
    // Before the command, --root and --state-dir apply to a command that takes them only.
    let out = bare(&["--root", "/", "phases", "pack", "d", "-o", "o"], &[]);
    let err = usage_error(&out, "--root does not apply to `nodeward phases pack`");
    assert!(err.contains("nodeward phases pack --help"), "{err}");
    let out = bare(&["--state-dir", "/s", "status"], &[]);
    usage_error(&out, "--state-dir does not apply to `nodeward status`");
    assert_eq!(snapshot(&f.root), before);
}

#[test]
fn root_and_state_dir_before_the_command_apply_to_it() {
    let f = Fixture::new();
    let root = f.root.to_str().expect("utf8");
    let state = cli_state_dir();
    let state = state.to_str().expect("utf8");
    // As scripts/quickstart.sh writes it.
    let out = bare(
        &[
            "--root",
            root,
            "--state-dir",
            state,
            "plan",
            "--phase",
            "setup-host",
            "--output",
            "json",
        ],
        &[],
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["root"], root);
    // After the command wins over before it; before it wins over the environment.
    let other = f.tmp.path().join("other-root");
    std::fs::create_dir_all(&other).expect("dir");
    let other = other.to_str().expect("utf8");
    let args = [
        "--root",
        other,
        "plan",
        "--root",
        root,
        "--phase",
        "setup-host",
        "--output",
        "json",
    ];
    let out = bare(&args, &[("NODEWARD_STATE_DIR", state)]);
    let v: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["root"], root, "{}", stderr(&out));
    let args = [
        "--root",
        root,
        "plan",
        "--phase",
        "setup-host",
        "--output",
        "json",
    ];
    let out = bare(
        &args,
        &[("NODEWARD_STATE_DIR", state), ("NODEWARD_ROOT", other)],
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["root"], root, "{}", stderr(&out));
    // The commands that take the root alone (their state beneath it) take it before them too.
    for cmd in [
        &["version"][..],
        &["phases", "list"],
        &["phases", "history"],
        &["audit", "verify"],
    ] {
        let mut args = vec!["--root", root];
        args.extend_from_slice(cmd);
        let out = bare(&args, &[("NODEWARD_STATE_DIR", state)]);
        assert_eq!(code(&out), 0, "{args:?}: {}", stderr(&out));
    }
}

/// The long flags `nodeward ARGS --help` lists.
fn flags_in_help(args: &[&str]) -> Vec<String> {
    let mut all = args.to_vec();
    all.push("--help");
    let out = bare(&all, &[]);
    assert_eq!(code(&out), 0, "{all:?}: {}", stderr(&out));
    let text = stdout(&out);
    let mut flags: Vec<String> = text
        .lines()
        .map(str::trim_start)
        .filter(|l| l.starts_with('-'))
        .filter_map(|l| {
            // `-q, --quiet`, `--root <DIR>`
            let l = l.split_once(", ").map_or(l, |(_, long)| long);
            l.strip_prefix("--")
                .map(|f| f.split([' ', '=']).next().unwrap_or_default().to_string())
        })
        .collect();
    flags.sort();
    flags.dedup();
    flags
}

#[test]
fn each_commands_help_lists_only_the_flags_it_takes() {
    const LOGGING: [&str; 5] = ["color", "log-format", "log-level", "quiet", "verbose"];
    let expect = |args: &[&str], own: &[&str]| {
        let mut want: Vec<String> = own
            .iter()
            .chain(LOGGING.iter())
            .chain(["help"].iter())
            .map(|s| s.to_string())
            .collect();
        want.sort();
        assert_eq!(flags_in_help(args), want, "nodeward {args:?} --help");
    };
    let run = [
        "root",
        "unit-dir",
        "state-dir",
        "config",
        "bundle",
        "trusted-key",
        "trusted-keys-dir",
        "allow-unsigned",
        "phase-timeout",
        "memory-limit",
        "audit-dir",
        "output",
    ];
    let with = |extra: &[&'static str]| -> Vec<&'static str> {
        run.iter().chain(extra.iter()).copied().collect()
    };
    expect(&["plan"], &with(&["phase", "mode"]));
    expect(&["apply"], &with(&["phase", "offline"]));
    expect(
        &["bootstrap"],
        &with(&[
            "force",
            "mode",
            "wait-timeout",
            "ignore-preflight-errors",
            "offline",
        ]),
    );
    expect(
        &["upgrade"],
        &with(&["mode", "wait-timeout", "ignore-preflight-errors", "offline"]),
    );
    expect(
        &["preflight"],
        &["root", "config", "ignore-preflight-errors", "output"],
    );
    expect(&["reset"], &with(&["mode"]));
    expect(&["status"], &["root", "unit-dir", "output"]);
    expect(&["phases", "pack"], &["output-bundle", "output"]);
    expect(&["phases", "sign"], &["key", "password-file", "output"]);
    expect(
        &["phases", "verify"],
        &["root", "trusted-key", "trusted-keys-dir", "output"],
    );
    expect(
        &["phases", "install"],
        &[
            "sha256",
            "timeout",
            "allow-downgrade",
            "allow-incomplete",
            "accept-new-grants",
            "accept-grants-digest",
            "config",
            "trusted-key",
            "trusted-keys-dir",
            "root",
            "state-dir",
            "audit-dir",
            "output",
        ],
    );
    expect(
        &["phases", "rollback"],
        &["expect", "root", "state-dir", "audit-dir", "output"],
    );
    expect(
        &["phases", "rollforward"],
        &["root", "state-dir", "audit-dir", "output"],
    );
    expect(&["restart"], &with(&["phase", "wait-timeout"]));
    for audit in ["verify", "summary"] {
        expect(
            &["audit", audit],
            &["root", "state-dir", "audit-dir", "output"],
        );
    }
    expect(
        &["audit", "show"],
        &[
            "run",
            "phase",
            "bundle",
            "since",
            "denied",
            "root",
            "state-dir",
            "audit-dir",
            "output",
        ],
    );
    expect(
        &["offline", "pack"],
        &[
            "output-archive",
            "key",
            "password-file",
            "timeout",
            "config",
            "root",
            "state-dir",
            "bundle",
            "trusted-key",
            "trusted-keys-dir",
            "output",
        ],
    );
    expect(&["config", "validate"], &[]);
    expect(&["completions"], &[]);
    // `help` is a command with its own help (clap's built-in one exits 2 on `help --help`).
    expect(&["help"], &[]);
    let out = bare(&["help", "phases", "install"], &[]);
    assert_eq!(code(&out), 0);
    assert!(
        stdout(&out).contains("--allow-downgrade"),
        "{}",
        stdout(&out)
    );
    // Its exit codes, for the scripts (and the daemon) that act on them.
    for line in [
        "  3  the bundle could not be fetched",
        "  4  the bundle was refused",
        "  5  its capabilities or grants are wider",
    ] {
        assert!(stdout(&out).contains(line), "{line:?}: {}", stdout(&out));
    }
    usage_error(&bare(&["help", "no-such-command"], &[]), "no-such-command");
}

#[test]
fn completions_and_man_pages_are_generated_from_the_definition() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let out = bare(&["completions", shell], &[]);
        assert_eq!(code(&out), 0, "{shell}: {}", stderr(&out));
        let script = stdout(&out);
        assert!(
            script.contains("nodeward") && script.contains("phase-timeout"),
            "{shell}: {script}"
        );
    }
    usage_error(&bare(&["completions", "tcsh"], &[]), "tcsh");

    let out = bare(&["man"], &[]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let page = stdout(&out);
    assert!(page.contains(".TH nodeward 1"), "{page}");
    for command in ["bootstrap", "phases", "config", "completions"] {
        assert!(page.contains(command), "the man page names {command}");
    }
    let out = bare(&["man", "phases", "install"], &[]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let page = stdout(&out);
    assert!(
        page.contains(".TH nodeward-phases-install 1") && page.contains("allow\\-downgrade"),
        "{page}"
    );
    usage_error(&bare(&["man", "nope"], &[]), "nope");
}
