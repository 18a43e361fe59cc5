//! The host's half of `configure`: the bootstrap kubeconfig, which the host renders from the
//! node config before `configure` runs (the phase is told only its path, and no phase of the
//! default bundle but `teardown`, which removes it at a reset, may write it). Rendered 0600,
//! re-rendered when the config's server or token changes, left alone when identical, never
//! written through a link or in place, and planned without its token, size or digest.

use super::*;
use nodeward::bootstrap_kubeconfig;
use nodeward::hostpath::HostPath;
use std::os::unix::fs::MetadataExt;

const KUBECONFIG: &str = "etc/kubernetes/bootstrap-kubelet.conf";

fn mode(f: &Fixture, rel: &str) -> u32 {
    std::fs::symlink_metadata(f.root.join(rel))
        .expect("meta")
        .permissions()
        .mode()
        & 0o7777
}

fn inode(f: &Fixture, rel: &str) -> u64 {
    std::fs::symlink_metadata(f.root.join(rel))
        .expect("meta")
        .ino()
}

/// The change list's entries for the kubeconfig.
fn kubeconfig_changes(s: &RunContext) -> Vec<Value> {
    changes_json(s)
        .into_iter()
        .filter(|c| c["path"] == KUBECONFIG)
        .collect()
}

/// What the change list says of a host write of the kubeconfig: nothing but these keys.
fn secret_change(action: &str) -> Value {
    json!({
        "phase": "nodeward", "kind": "secret-file", "path": KUBECONFIG, "mode": "0600",
        "action": action
    })
}

/// What the host renders for `input`.
fn rendered(input: &PhaseInput) -> String {
    let config = input.config.as_ref().expect("config");
    bootstrap_kubeconfig::render(config).expect("render")
}

/// The sha256 of `bytes`, as the change list would spell it.
fn sha256(bytes: &[u8]) -> String {
    nodeward::digest::sha256_hex(bytes)
}

#[test]
fn rendered_0600_from_the_config_before_configure_left_alone_when_identical_replaced_when_not() {
    let f = Fixture::new();
    let mut input = input(&f);
    let s = f.session(RunMode::Apply);
    phase(&s, "setup-host", &input).expect("setup-host");
    let out = phase(&s, "configure", &input).expect("configure");
    let expected = rendered(&input);
    assert_eq!(read(&f, KUBECONFIG), expected);
    assert!(
        expected.contains("server: \"https://10.0.0.1:6443\""),
        "{expected}"
    );
    assert!(
        expected.contains(&format!("token: \"{TOKEN}\"")),
        "{expected}"
    );
    assert_eq!(mode(&f, KUBECONFIG), 0o600);
    assert_eq!(kubeconfig_changes(&s), [secret_change("create")]);
    assert!(out.report.changed.iter().any(|g| g == "kubelet-config"));
    let flags = read(&f, "var/lib/kubelet/nodeward-flags.env");
    let root = f.root.display();
    assert!(
        flags.contains(&format!("--bootstrap-kubeconfig={root}/{KUBECONFIG}")),
        "{flags}"
    );

    // Identical: not rewritten (same inode), no change, no restart group.
    let first = inode(&f, KUBECONFIG);
    let s = f.session(RunMode::Apply);
    let again = phase(&s, "configure", &input).expect("configure again");
    assert!(again.report.changed.is_empty(), "{:?}", again.report);
    assert_eq!(kubeconfig_changes(&s), Vec::<Value>::new());
    assert_eq!(inode(&f, KUBECONFIG), first);

    // A new server (an upgrade's config): re-rendered, by a new file, and the kubelet's group
    // named although configure's own files did not change.
    cfg(&mut input).cluster.api_server = "https://10.0.0.2:6443".into();
    let s = f.session(RunMode::Apply);
    let moved = phase(&s, "configure", &input).expect("configure, new server");
    assert_eq!(kubeconfig_changes(&s), [secret_change("replace")]);
    assert!(read(&f, KUBECONFIG).contains("server: \"https://10.0.0.2:6443\""));
    assert_ne!(
        inode(&f, KUBECONFIG),
        first,
        "replaced, never written in place"
    );
    assert_eq!(moved.report.changed, ["kubelet-config"]);

    // Its mode loosened by someone: replaced by a 0600 file again.
    std::fs::set_permissions(
        f.root.join(KUBECONFIG),
        std::fs::Permissions::from_mode(0o644),
    )
    .expect("chmod");
    let s = f.session(RunMode::Apply);
    phase(&s, "configure", &input).expect("configure, loosened mode");
    assert_eq!(kubeconfig_changes(&s), [secret_change("replace")]);
    assert_eq!(mode(&f, KUBECONFIG), 0o600);
}

#[test]
fn a_plan_names_the_file_and_what_happens_to_it_but_not_its_token_size_or_digest() {
    let f = Fixture::new();
    let input = input(&f);
    let before = snapshot(&f.root);
    let s = f.session(RunMode::Plan);
    phase(&s, "setup-host", &input).expect("setup-host");
    phase(&s, "configure", &input).expect("configure");
    assert_eq!(snapshot(&f.root), before, "a plan writes nothing");
    assert_eq!(kubeconfig_changes(&s), [secret_change("create")]);
    let rendered = rendered(&input);
    let listed = serde_json::to_string(&changes_json(&s)).expect("json")
        + &s.changes()
            .iter()
            .map(|c| c.kind.describe())
            .collect::<Vec<_>>()
            .join("\n");
    assert!(!listed.contains(TOKEN_SECRET), "{listed}");
    assert!(!listed.contains(&sha256(rendered.as_bytes())), "{listed}");
    let line = s
        .changes()
        .iter()
        .find(|c| c.phase == "nodeward")
        .map(|c| c.kind.describe())
        .expect("the host's change");
    assert_eq!(
        line,
        format!("create file {KUBECONFIG} (0600; the agent's, holds a secret: contents withheld)")
    );

    // Over an older file: `replace`, still nothing of either version.
    let old = rendered.replace("10.0.0.1", "10.9.9.9");
    f.put(KUBECONFIG, &old);
    let s = f.session(RunMode::Plan);
    phase(&s, "setup-host", &input).expect("setup-host");
    phase(&s, "configure", &input).expect("configure");
    assert_eq!(kubeconfig_changes(&s), [secret_change("replace")]);
    let listed = serde_json::to_string(&changes_json(&s)).expect("json");
    for digest in [sha256(rendered.as_bytes()), sha256(old.as_bytes())] {
        assert!(!listed.contains(&digest), "{listed}");
    }
    assert_eq!(read(&f, KUBECONFIG), old, "a plan writes nothing");
}

/// The grants that matter: `configure`'s, after the host rendered the file. A phase holding
/// them cannot replace the file (with another server, or the token's reference), link over it,
/// remove it or read it; of the default bundle only `teardown` may write it (to remove it).
#[test]
fn configure_is_refused_the_file_whatever_it_tries() {
    let f = Fixture::new();
    let input = input(&f);
    let s = f.session(RunMode::Apply);
    phase(&s, "setup-host", &input).expect("setup-host");
    phase(&s, "configure", &input).expect("configure");
    let rendered = read(&f, KUBECONFIG);
    let evil = rendered.replace("https://10.0.0.1:6443", "https://203.0.113.7:6443");
    let with_reference = rendered.replace(TOKEN, nodeward_node_config::secret::BOOTSTRAP_TOKEN_REF);
    let r = probe(
        &s,
        bundle_grants("configure"),
        json!([
            {"op": "fs.write-file", "path": KUBECONFIG, "contents": evil, "mode": 0o600},
            {"op": "fs.write-file", "path": KUBECONFIG, "contents": with_reference, "mode": 0o600},
            {"op": "fs.remove", "path": KUBECONFIG},
            {"op": "fs.symlink", "target": "pki/ca.crt", "path": KUBECONFIG},
            {"op": "fs.read-file", "path": KUBECONFIG},
        ]),
    );
    for (i, result) in r.iter().enumerate() {
        assert_eq!(err_kind(result), "denied", "call {i}: {result}");
    }
    assert_eq!(
        read(&f, KUBECONFIG),
        rendered,
        "the host's file is untouched"
    );

    let path = HostPath::parse(KUBECONFIG).expect("path");
    let bundle = Bundle::embedded().expect("bundle");
    let writers: Vec<&str> = bundle
        .manifest
        .phases
        .iter()
        .filter(|p| p.grants.may_write(&path))
        .map(|p| p.name.as_str())
        .collect();
    assert_eq!(writers, ["teardown"]);
    for p in &bundle.manifest.phases {
        assert!(p.grants.secrets.bootstrap_token.is_empty(), "{}", p.name);
        assert_eq!(
            bootstrap_kubeconfig::needed_by(&p.grants),
            p.name == "configure",
            "{}",
            p.name
        );
    }
}

/// A link planted where the file goes, or in its directory's place, is refused; a file
/// hard-linked to one outside the root is replaced, the outside one untouched. (A missing
/// directory stops the run before `configure`: `configure_alone_on_a_bare_root_fails_...`.)
#[test]
fn never_written_through_a_link_or_in_place() {
    let f = Fixture::new();
    let input = input(&f);
    let outside = snapshot(&f.outside);
    let target = f.outside.join("secret.txt");
    let config = input.config.clone().expect("config");

    let s = f.session(RunMode::Apply);

    // `etc/kubernetes` a link out of the root.
    std::fs::create_dir_all(f.root.join("etc")).expect("etc");
    std::os::unix::fs::symlink(&f.outside, f.root.join("etc/kubernetes")).expect("link");
    let err = bootstrap_kubeconfig::write(&s, &config).expect_err("linked dir");
    assert!(err.to_string().contains(KUBECONFIG), "{err}");
    std::fs::remove_file(f.root.join("etc/kubernetes")).expect("unlink");

    // The file itself a link out of the root.
    std::fs::create_dir_all(f.root.join("etc/kubernetes")).expect("dir");
    std::os::unix::fs::symlink(&target, f.root.join(KUBECONFIG)).expect("link");
    let err = bootstrap_kubeconfig::write(&s, &config).expect_err("linked file");
    assert!(err.to_string().contains("in the way"), "{err}");
    assert!(
        std::fs::symlink_metadata(f.root.join(KUBECONFIG))
            .expect("link")
            .file_type()
            .is_symlink()
    );
    std::fs::remove_file(f.root.join(KUBECONFIG)).expect("unlink");

    // A hard link to a file outside the root: replaced by a new file, the outside one as it was.
    std::fs::hard_link(&target, f.root.join(KUBECONFIG)).expect("hard link");
    bootstrap_kubeconfig::write(&s, &config).expect("written");
    assert_eq!(mode(&f, KUBECONFIG), 0o600);
    assert!(read(&f, KUBECONFIG).contains(TOKEN));
    assert_ne!(
        inode(&f, KUBECONFIG),
        std::fs::metadata(&target).expect("outside").ino()
    );
    assert_eq!(
        snapshot(&f.outside),
        outside,
        "nothing outside the root changed"
    );
}
