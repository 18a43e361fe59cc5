//! The `install` phase: switches the `current` link to a complete version directory and
//! prunes old ones; refuses an incomplete version and a foreign CNI directory.

use super::*;

fn link(f: &Fixture, rel: &str) -> String {
    std::fs::read_link(f.root.join(rel))
        .unwrap_or_else(|e| panic!("{rel}: {e}"))
        .display()
        .to_string()
}

#[test]
fn switches_links_and_prunes() {
    let f = Fixture::new();
    put_version(&f, "1.33.0-aaaa", true);
    put_version(&f, "1.34.1-bbbb", true);
    std::fs::create_dir_all(f.root.join("opt/cni/bin")).expect("empty dir of an older setup");
    let s = f.session(RunMode::Apply);
    let mut input = input(&f);

    input.version = "1.33.0-aaaa".into();
    let out = phase(&s, "install", &input).expect("install v1");
    assert_eq!(out.report.changed, ["binaries", "cni-link"]);
    assert_eq!(link(&f, "opt/nodeward/node/current"), "1.33.0-aaaa");
    assert_eq!(
        link(&f, "opt/cni/bin"),
        "../nodeward/node/current/libexec/cni"
    );
    assert!(
        f.root.join("opt/cni/bin/bridge").is_file(),
        "the link resolves"
    );
    let again = phase(&s, "install", &input).expect("again");
    assert!(again.report.changed.is_empty(), "{:?}", again.report);

    input.version = "1.34.1-bbbb".into();
    let out = phase(&s, "install", &input).expect("install v2");
    assert_eq!(out.report.changed, ["binaries"]);
    assert_eq!(link(&f, "opt/nodeward/node/current"), "1.34.1-bbbb");
    assert!(
        f.root.join("opt/nodeward/node/1.33.0-aaaa").is_dir(),
        "kept until prune"
    );

    input.prune = true;
    let out = phase(&s, "install", &input).expect("prune");
    assert_eq!(out.report.changed, ["pruned"]);
    let mut left: Vec<String> = std::fs::read_dir(f.root.join("opt/nodeward/node"))
        .expect("node dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, ["1.34.1-bbbb", "current"]);
    let again = phase(&s, "install", &input).expect("prune again");
    assert!(again.report.changed.is_empty());
    no_denials(&s, "install");
}

#[test]
fn refuses_an_incomplete_version_and_a_foreign_cni_dir() {
    let f = Fixture::new();
    put_version(&f, VERSION, false);
    let s = f.session(RunMode::Apply);
    let err = phase(&s, "install", &input(&f)).expect_err("incomplete");
    assert!(
        err.to_string()
            .contains(&format!("version {VERSION} is not fully downloaded")),
        "{err}"
    );
    assert!(std::fs::symlink_metadata(f.root.join("opt/nodeward/node/current")).is_err());

    f.put(&format!("opt/nodeward/node/{VERSION}/.complete"), "x\n");
    f.put("opt/cni/bin/foreign", "plugin");
    let err = phase(&s, "install", &input(&f)).expect_err("foreign dir");
    assert!(err.to_string().contains("opt/cni/bin"), "{err}");
    assert_eq!(read(&f, "opt/cni/bin/foreign"), "plugin");
}

#[test]
fn plan_mode_touches_nothing() {
    let f = Fixture::new();
    put_version(&f, VERSION, true);
    std::fs::create_dir_all(f.root.join("opt/cni")).expect("opt/cni");
    let before = snapshot(&f.root);
    let s = f.session(RunMode::Plan);
    let out = phase(&s, "install", &input(&f)).expect("plan");
    assert_eq!(out.report.changed, ["binaries", "cni-link"]);
    assert_eq!(snapshot(&f.root), before);
    let kinds: Vec<_> = changes_json(&s).iter().map(|c| c["kind"].clone()).collect();
    assert_eq!(kinds, [json!("symlink"), json!("symlink")]);
}
