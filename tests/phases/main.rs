//! One test per shipped phase (the build's `foreach_phase!` fails this file's compilation when
//! a phase has no test), each running the real component against a temporary root and checking
//! what it wrote.
//!
//! One module per phase that has more than one test (`configure.rs`, `download_artifacts.rs`,
//! ...; the module is the phase's test as far as `foreach_phase!` is concerned); this file
//! keeps the helpers they share, the single `setup_host` test, and the test of running phases
//! out of order. One test binary (`cargo test --test phases`): each binary costs a long link.
//! `bootstrap_kubeconfig.rs` tests the file the host renders before `configure` runs.

#[path = "../common/mod.rs"]
mod common;

mod bootstrap_kubeconfig;
mod configure;
mod download_artifacts;
mod install;
mod preflight;
mod start_node;
mod stop_node;
mod teardown;

use common::*;
use nodeward::bundle::Bundle;
use nodeward::caps::RunContext;
use nodeward::plan::RunMode;
use nodeward::runtime::Limits;
use nodeward::session;
use nodeward_node_config::input::{Artifact, ArtifactKind, PhaseInput};
use serde_json::{Value, json};
use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;

macro_rules! assert_test_exists {
    ($name:ident) => {
        #[allow(unused_imports)]
        use self::$name as _;
    };
}
nodeward::foreach_phase!(assert_test_exists);

fn apply(f: &Fixture, phases: &[&str]) -> std::sync::Arc<nodeward::caps::RunContext> {
    let bundle = Bundle::embedded().expect("bundle");
    let config = nodeward::config::load(None).expect("config");
    let s = f.session(RunMode::Apply);
    let only: Vec<String> = phases.iter().map(|p| p.to_string()).collect();
    session::run(
        runtime(),
        &bundle,
        &s,
        &PhaseInput::new(config),
        &only,
        Limits::default(),
        |_| {},
    )
    .expect("phases run");
    s
}

fn read(f: &Fixture, rel: &str) -> String {
    std::fs::read_to_string(f.root.join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

const VERSION: &str = "1.34.1-0123456789ab";

/// An input as the none-mode pipelines build it: the example config, this fixture's root as
/// the layout root, a version directory name.
fn input(f: &Fixture) -> PhaseInput {
    let mut input = PhaseInput::new(nodeward::config::load(None).expect("config"));
    input.layout.root = f.root.display().to_string();
    input.version = VERSION.into();
    input.arch = "amd64".into();
    input
}

/// The config of a test input, to change.
fn cfg(input: &mut PhaseInput) -> &mut nodeward_node_config::NodeConfig {
    input
        .config
        .as_mut()
        .expect("a test input carries the config")
}

/// Runs one phase of the embedded bundle (its real grants) in `s`.
fn phase(
    s: &Arc<RunContext>,
    name: &str,
    input: &PhaseInput,
) -> Result<session::PhaseOutcome, session::RunError> {
    let bundle = Bundle::embedded().expect("bundle");
    session::run_phase(runtime(), &bundle, s, name, input, Limits::default())
}

/// Runs the `name` component with `grants` instead of the bundle's (its input still the parts
/// the bundle grants it, secrets as references, and no pinned artifacts).
fn phase_with_grants(
    s: &Arc<RunContext>,
    name: &str,
    grants: nodeward::grants::Grants,
    input: &PhaseInput,
) -> Result<nodeward::runtime::PhaseReport, nodeward::runtime::PhaseError> {
    let bundle = Bundle::embedded().expect("bundle");
    let p = bundle.phase(name).expect("phase in bundle");
    let loaded = runtime()
        .load(
            name,
            &p.world,
            bundle.component(name).expect("component"),
            &p.sha256,
        )
        .expect("load");
    runtime().run(
        &loaded,
        ctx(s, name, grants),
        &serde_json::to_string(&input.restricted_to(&p.grants.input)).expect("input json"),
        Limits::default(),
    )
}

/// The embedded bundle's grants of `name`.
fn bundle_grants(name: &str) -> nodeward::grants::Grants {
    Bundle::embedded()
        .expect("bundle")
        .phase(name)
        .expect("phase")
        .grants
        .clone()
}

fn changes_json(s: &RunContext) -> Vec<Value> {
    s.changes()
        .iter()
        .map(|c| serde_json::to_value(c).expect("change json"))
        .collect()
}

fn no_denials(s: &RunContext, what: &str) {
    let denied: Vec<_> = s.audit.records().into_iter().filter(|r| r.denied).collect();
    assert!(
        denied.is_empty(),
        "{what} stays within its grants: {denied:?}"
    );
}

/// A version directory as download-artifacts leaves it, with stand-in binaries.
fn put_version(f: &Fixture, version: &str, complete: bool) {
    let vdir = format!("opt/nodeward/node/{version}");
    for bin in ["containerd", "kubelet", "runc", "containerd-shim-runc-v2"] {
        f.put(&format!("{vdir}/bin/{bin}"), "#!/bin/sh\n");
    }
    f.put(&format!("{vdir}/libexec/cni/bridge"), "#!/bin/sh\n");
    if complete {
        f.put(&format!("{vdir}/.complete"), &format!("{version}\n"));
    }
}

#[test]
fn setup_host() {
    let f = Fixture::new();
    f.put(
        "proc/swaps",
        "Filename\tType\tSize\tUsed\tPriority\n/swapfile file 1024 0 -2\n",
    );
    let s = apply(&f, &["setup-host"]);
    for dir in [
        "etc/containerd",
        "etc/cni/net.d",
        "opt/cni",
        "etc/kubernetes/pki",
        "etc/kubernetes/manifests",
        "var/lib/kubelet",
        "opt/nodeward/node",
        "var/lib/cni",
    ] {
        assert!(f.root.join(dir).is_dir(), "{dir}");
    }
    assert!(
        !f.root.join("var/lib/nodeward").exists(),
        "the agent's state directory is reserved to the host, which makes it itself"
    );
    assert!(
        std::fs::symlink_metadata(f.root.join("opt/cni/bin")).is_err(),
        "opt/cni/bin is install's link, not a directory"
    );
    assert!(!f.root.join("etc/systemd/system/kubelet.service.d").exists());
    let sysctl = read(&f, "etc/sysctl.d/99-nodeward.conf");
    assert!(
        sysctl.contains("net.ipv4.ip_forward = 1")
            && sysctl.contains("net.bridge.bridge-nf-call-iptables = 1")
    );
    assert_eq!(
        read(&f, "etc/modules-load.d/nodeward.conf")
            .lines()
            .filter(|l| !l.starts_with('#'))
            .collect::<Vec<_>>(),
        ["overlay", "br_netfilter"]
    );
    assert_eq!(read(&f, "proc/sys/net/ipv4/ip_forward"), "1\n");
    assert!(read(&f, "proc/modules").starts_with("overlay "));
    assert_eq!(read(&f, "proc/swaps").lines().count(), 1, "swap turned off");
    let calls: Vec<String> = s.audit.records().iter().map(|r| r.call.clone()).collect();
    assert!(
        calls.contains(&"kernel.swap-off".to_string())
            && calls.contains(&"kernel.load-module".to_string())
    );
    no_denials(&s, "setup-host");
}

#[test]
fn configure_alone_on_a_bare_root_fails_naming_the_missing_directory() {
    let f = Fixture::new();
    let bundle = Bundle::embedded().expect("bundle");
    let config = nodeward::config::load(None).expect("config");
    let s = f.session(RunMode::Apply);
    let err = session::run(
        runtime(),
        &bundle,
        &s,
        &PhaseInput::new(config),
        &["configure".into()],
        Limits::default(),
        |_| {},
    )
    .expect_err("parents are missing");
    // The host's bootstrap kubeconfig comes first, and stops the run before the phase runs.
    assert!(
        matches!(&err, session::RunError::BootstrapKubeconfig { phase, .. } if phase == "configure"),
        "{err}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("etc/kubernetes/bootstrap-kubelet.conf") && msg.contains("setup-host"),
        "{msg}"
    );
    assert!(
        !f.root.join("var/lib/kubelet").exists(),
        "configure did not run"
    );
}
