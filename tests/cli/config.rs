//! `nodeward config print-defaults` (what every command uses without `--config`) and
//! `nodeward config validate FILE` (the parser every command uses: exit 2 naming the field).

use super::*;

#[test]
fn print_defaults_is_the_embedded_config_and_validates() {
    let f = Fixture::new();
    let out = bare(&["config", "print-defaults"], &[]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(stdout(&out), nodeward::config::EMBEDDED);

    let path = f.tmp.path().join("node.yaml");
    std::fs::write(&path, &out.stdout).expect("write");
    let path = path.to_str().expect("utf8");
    let out = bare(&["config", "validate", path], &[]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let text = stdout(&out);
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(
        text.starts_with(path) && text.contains("valid") && text.contains("worker-01"),
        "{text}"
    );
    // The defaults are what `plan` uses without --config: the same plan either way.
    let plan = |extra: &[&str]| {
        let mut args = vec![
            "plan",
            "--phase",
            "setup-host",
            "--phase",
            "configure",
            "--output",
            "json",
        ];
        args.extend(extra);
        let out = nodeward(&f, &args);
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        let v: Value = serde_json::from_slice(&out.stdout).expect("json");
        v["changes"].clone()
    };
    assert_eq!(plan(&[]), plan(&["--config", path]));
}

#[test]
fn validate_refuses_what_every_command_refuses_naming_the_field() {
    let f = Fixture::new();
    let typo = f.tmp.path().join("typo.yaml");
    std::fs::write(
        &typo,
        nodeward::config::EMBEDDED.replace("machineName:", "machineNmae:"),
    )
    .expect("write");
    let typo = typo.to_str().expect("utf8");
    let out = bare(&["config", "validate", typo], &[]);
    let err = usage_error(&out, "machineNmae");
    assert!(err.contains(typo), "{err}");
    assert!(out.stdout.is_empty());
    // The same error as a command given that config.
    let plan = nodeward(&f, &["plan", "--config", typo]);
    let plan_err = usage_error(&plan, "machineNmae");
    assert_eq!(
        err.lines().last(),
        plan_err.lines().last(),
        "one parser, one message"
    );

    let invalid = f.tmp.path().join("invalid.json");
    let mut doc: Value = serde_yaml_ng::from_str(nodeward::config::EMBEDDED).expect("yaml");
    doc["machineName"] = Value::String("Worker_01".into());
    std::fs::write(&invalid, doc.to_string()).expect("write");
    usage_error(
        &bare(
            &["config", "validate", invalid.to_str().expect("utf8")],
            &[],
        ),
        "machineName",
    );
    usage_error(
        &bare(&["config", "validate", "/nonexistent/node.yaml"], &[]),
        "/nonexistent/node.yaml",
    );
    usage_error(&bare(&["config", "validate"], &[]), "<FILE>");
}
