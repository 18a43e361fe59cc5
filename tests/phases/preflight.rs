//! The `preflight` phase: checks the host before anything is written (a foreign CNI
//! directory is refused, nodeward's own link or an empty one is not) and changes nothing.

use super::*;

#[test]
fn passes_on_a_fresh_root_and_changes_nothing() {
    let f = Fixture::new();
    let before = snapshot(&f.root);
    let s = f.session(RunMode::Apply);
    let out = phase(&s, "preflight", &input(&f)).expect("preflight passes");
    assert!(out.report.changed.is_empty(), "{:?}", out.report);
    assert_eq!(snapshot(&f.root), before);
    assert!(s.changes().is_empty());
    no_denials(&s, "preflight");
    let calls: Vec<_> = s.audit.records().into_iter().map(|r| r.call).collect();
    assert!(calls.contains(&"systemd.status".to_string()), "{calls:?}");
}

#[test]
fn refuses_a_foreign_cni_directory_but_not_our_link_or_an_empty_one() {
    let f = Fixture::new();
    f.put("opt/cni/bin/bridge", "foreign plugin");
    let s = f.session(RunMode::Plan);
    let err = phase(&s, "preflight", &input(&f)).expect_err("foreign plugins");
    assert!(
        err.to_string()
            .contains("opt/cni/bin is a directory nodeward did not create"),
        "{err}"
    );
    assert!(err.to_string().contains("bridge"), "{err}");

    std::fs::remove_file(f.root.join("opt/cni/bin/bridge")).expect("rm");
    phase(&s, "preflight", &input(&f)).expect("an empty directory is fine");
    std::fs::remove_dir(f.root.join("opt/cni/bin")).expect("rmdir");
    std::os::unix::fs::symlink(
        nodeward_node_config::layout::CNI_BIN_LINK_TARGET,
        f.root.join("opt/cni/bin"),
    )
    .expect("link");
    phase(&s, "preflight", &input(&f)).expect("our link is fine");
}

#[test]
fn needs_its_grants() {
    let f = Fixture::new();
    let s = f.session(RunMode::Plan);
    let mut g = bundle_grants("preflight");
    assert_eq!(
        g.systemd.status,
        ["kubelet.service", "containerd.service"],
        "exactly the foreign units"
    );
    g.fs.read.clear();
    let err = phase_with_grants(&s, "preflight", g, &input(&f)).expect_err("no fs grant");
    assert!(err.to_string().contains("denied"), "{err}");
    let err =
        phase_with_grants(&s, "preflight", Default::default(), &input(&f)).expect_err("no grants");
    assert!(
        err.to_string().contains("denied") && err.to_string().contains("kubelet.service"),
        "{err}"
    );
}
