//! Tests of the none-mode operator: the node measured from its state files.

use super::*;
use crate::audit::Redactor;
use crate::caps::RunContext;
use crate::hostpath::HostRoot;
use crate::node::state::{InstallRecord, SCHEMA};
use crate::plan::RunMode;

fn machine(version: &str) -> Machine {
    let mut m = crate::daemon::test_machine("worker-01", version);
    m.metadata.generation = Some(3);
    m
}

fn active() -> Bundle {
    Bundle::Active(ActiveBundle {
        name: "b".into(),
        version: 1,
        digest: "d".repeat(64),
    })
}

/// A root whose node finished its bootstrap at checkpoint `checkpoint` with the embedded
/// example config (its Kubernetes version is returned).
fn node(checkpoint: Checkpoint) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let session = RunContext::new(
        HostRoot::open(dir.path()).expect("root"),
        RunMode::Apply,
        Redactor::default(),
    );
    let config = crate::config::load(None).expect("the embedded config");
    let state = NodeState::new(dir.path());
    state
        .write_record(
            &session,
            &InstallRecord {
                schema: SCHEMA,
                machine_name: config.machine_name.clone(),
                config_fingerprint: "f".repeat(64),
                version: "v1".into(),
                checkpoint,
            },
        )
        .expect("record");
    state.write_applied(&session, &config).expect("applied");
    (dir, config.cluster.kubernetes_version)
}

/// [`measure`] with the spec resolved over the applied config (no `--config`).
fn outcome_of(state: &NodeState, m: &Machine, failed: Option<&(Option<i64>, String)>) -> Outcome {
    let wanted = |applied: &NodeConfig| resolve::resolve(m, applied.clone());
    measure(state, m, active(), wanted, failed, false)
}

#[test]
fn a_failed_repave_is_reported_for_its_generation_only() {
    let (dir, _) = node(Checkpoint::Complete);
    let state = NodeState::new(dir.path());
    let failed = (
        Some(3),
        "the upgrade was rolled back: kubelet unhealthy".to_string(),
    );
    let o = outcome_of(&state, &machine("1.99.0"), Some(&failed));
    assert_eq!(o.update, Update::Failed(failed.1.clone()));
    assert!(o.repave.is_some());
    let mut next = machine("1.99.1");
    next.metadata.generation = Some(4);
    let o = outcome_of(&state, &next, Some(&failed));
    assert_eq!(
        o.update,
        Update::UpToDate,
        "a new generation is tried again"
    );
}

#[test]
fn a_journal_is_an_upgrade_running_under_the_lock_and_a_cut_short_one_without_it() {
    let (dir, version) = node(Checkpoint::Complete);
    let state = NodeState::new(dir.path());
    let session = RunContext::new(
        HostRoot::open(dir.path()).expect("root"),
        RunMode::Apply,
        Redactor::default(),
    );
    let config = crate::config::load(None).expect("the embedded config");
    state
        .write_journal(
            &session,
            &crate::node::state::Journal {
                schema: SCHEMA,
                from_version: "v1".into(),
                to_version: "v2".into(),
                to_fingerprint: "f".repeat(64),
                previous_config: config,
            },
        )
        .expect("journal");
    let m = machine(&version);
    let wanted = |applied: &NodeConfig| resolve::resolve(&m, applied.clone());
    let running = measure(&state, &m, active(), wanted, None, true);
    assert!(
        matches!(&running.update, Update::Updating(u) if u.contains("v1 to v2")),
        "{running:?}"
    );
    let cut = measure(&state, &m, active(), wanted, None, false);
    assert!(
        matches!(&cut.update, Update::Failed(u) if u.contains("nodeward recover")),
        "{cut:?}"
    );
}

#[test]
fn a_host_without_a_node_is_reported_as_never_bootstrapped() {
    let dir = tempfile::tempdir().expect("tempdir");
    let o = outcome_of(&NodeState::new(dir.path()), &machine("1.34.1"), None);
    assert!(
        matches!(&o.bootstrap, Bootstrap::Failed(m) if m.contains("no install record")),
        "{o:?}"
    );
    assert_eq!(o.update, Update::UpToDate);
    assert_eq!(o.repave, None);
    assert_eq!(o.generation, Some(3));
}

#[test]
fn a_finished_node_on_the_spec_version_is_up_to_date_and_another_version_asks_a_repave() {
    let (dir, version) = node(Checkpoint::Complete);
    let state = NodeState::new(dir.path());
    let o = outcome_of(&state, &machine(&version), None);
    assert_eq!(o.bootstrap, Bootstrap::Done);
    assert_eq!(o.update, Update::UpToDate);
    assert_eq!(o.repave, None);
    assert_eq!(o.bundle, active());

    let o = outcome_of(&state, &machine("1.99.0"), None);
    let why = o.repave.expect("a repave");
    assert!(why.contains("1.99.0") && why.contains(&version), "{why}");
}

#[test]
fn an_unfinished_bootstrap_names_its_checkpoint_and_a_corrupt_state_file_fails_the_update() {
    let (dir, version) = node(Checkpoint::Install);
    let state = NodeState::new(dir.path());
    let o = outcome_of(&state, &machine(&version), None);
    assert!(
        matches!(&o.bootstrap, Bootstrap::Running { checkpoint } if checkpoint == Checkpoint::Install.name()),
        "{o:?}"
    );
    // An applied config changed by hand no longer matches its sidecar.
    let applied = dir
        .path()
        .join(nodeward_node_config::layout::STATE_DIR)
        .join("applied-config.json");
    std::fs::write(&applied, b"{}").expect("tamper");
    let o = outcome_of(&state, &machine(&version), None);
    assert!(
        matches!(&o.update, Update::Failed(m) if m.contains("applied-config.json")),
        "{o:?}"
    );
}

#[test]
fn a_long_error_is_capped_on_a_character_boundary() {
    let long = "é".repeat(crate::daemon::child::MAX_ERROR_BYTES);
    let capped = crate::daemon::child::cap(&long);
    assert!(capped.len() <= crate::daemon::child::MAX_ERROR_BYTES + '…'.len_utf8());
    assert!(capped.ends_with('…'));
    assert_eq!(crate::daemon::child::cap("short"), "short");
}
