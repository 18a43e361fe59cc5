//! The decision tables, one row per case.

use super::*;

const FP: &str = "1111111111111111111111111111111111111111111111111111111111111111";
const OTHER_FP: &str = "2222222222222222222222222222222222222222222222222222222222222222";
const UNFINISHED: [Checkpoint; 7] = [
    Checkpoint::SetupHost,
    Checkpoint::DownloadArtifacts,
    Checkpoint::Install,
    Checkpoint::Configure,
    Checkpoint::StartNode,
    Checkpoint::WaitHealthy,
    Checkpoint::Persist,
];

fn record(machine: &str, fingerprint: &str, checkpoint: Checkpoint) -> InstallRecord {
    InstallRecord {
        schema: crate::node::state::SCHEMA,
        machine_name: machine.into(),
        config_fingerprint: fingerprint.into(),
        version: "1.34.1-aaaaaaaaaaaa".into(),
        checkpoint,
    }
}

#[test]
fn bootstrap_table() {
    use Bootstrap::*;
    let done = Checkpoint::Complete;
    // (record, --force, expected)
    let mut rows: Vec<(Option<InstallRecord>, bool, Result<Bootstrap, &str>)> = vec![
        // A fresh host.
        (None, false, Ok(Fresh)),
        (None, true, Ok(Fresh)),
        // The record names this config: repair a finished node, whether forced or not.
        (Some(record("worker-01", FP, done)), false, Ok(Repair)),
        (Some(record("worker-01", FP, done)), true, Ok(Repair)),
        // Another config, not forced: refused, with the hint for the record's state.
        (
            Some(record("worker-01", OTHER_FP, done)),
            false,
            Err(
                "config fingerprint 222222222222, this config's is 111111111111: use `nodeward upgrade`",
            ),
        ),
        (
            Some(record("worker-01", OTHER_FP, Checkpoint::Install)),
            false,
            Err(
                "config fingerprint 222222222222, this config's is 111111111111: re-run with the config that started it",
            ),
        ),
        // Another machine: the name is what the refusal names, even when the config differs too.
        (
            Some(record("worker-02", FP, done)),
            false,
            Err("machine \"worker-02\", this config is for \"worker-01\": use `nodeward upgrade`"),
        ),
        (
            Some(record("worker-02", OTHER_FP, Checkpoint::Configure)),
            false,
            Err("machine \"worker-02\", this config is for \"worker-01\": re-run"),
        ),
        // --force: a finished node is upgraded, an unfinished bootstrap restarts.
        (Some(record("worker-01", OTHER_FP, done)), true, Ok(Upgrade)),
        (Some(record("worker-02", FP, done)), true, Ok(Upgrade)),
        (
            Some(record("worker-01", OTHER_FP, Checkpoint::StartNode)),
            true,
            Ok(Restart),
        ),
        (
            Some(record("worker-02", OTHER_FP, Checkpoint::SetupHost)),
            true,
            Ok(Restart),
        ),
    ];
    // The record names this config, unfinished: resume at its checkpoint, forced or not.
    for c in UNFINISHED {
        for force in [false, true] {
            rows.push((Some(record("worker-01", FP, c)), force, Ok(Resume(c))));
        }
    }
    for (i, (rec, force, want)) in rows.iter().enumerate() {
        let got = bootstrap(rec.as_ref(), "worker-01", FP, *force);
        match (want, got) {
            (Ok(w), Ok(g)) => assert_eq!(*w, g, "row {i}"),
            (Err(needle), Err(e)) => {
                let msg = e.to_string();
                assert!(msg.contains(needle), "row {i}: {msg}");
                assert!(
                    msg.starts_with("this host has a nodeward install record (checkpoint "),
                    "row {i}: {msg}"
                );
            }
            (w, g) => panic!("row {i}: want {w:?}, got {g:?}"),
        }
    }
}

#[test]
fn bootstrap_refusal_text_is_what_the_cli_prints() {
    let r = record("worker-01", OTHER_FP, Checkpoint::Complete);
    let e = bootstrap(Some(&r), "worker-01", FP, false).expect_err("refused");
    assert_eq!(
        e.to_string(),
        "this host has a nodeward install record (checkpoint complete) for config fingerprint \
         222222222222, this config's is 111111111111: use `nodeward upgrade` to change a \
         bootstrapped node, `nodeward reset` to remove it, or --force"
    );
    let r = record("worker-02", FP, Checkpoint::Install);
    let e = bootstrap(Some(&r), "worker-01", FP, false).expect_err("refused");
    assert_eq!(
        e.to_string(),
        "this host has a nodeward install record (checkpoint install) for machine \"worker-02\", \
         this config is for \"worker-01\": re-run with the config that started it, `nodeward \
         reset` first, or --force to restart it with this config"
    );
    // A damaged record's fingerprint is shown whole rather than cut mid-character.
    let r = record("worker-01", "aéééééé", Checkpoint::Install);
    let e = bootstrap(Some(&r), "worker-01", FP, false).expect_err("refused");
    assert!(e.to_string().contains("fingerprint aéééééé,"), "{e}");
}

#[test]
fn bootstrap_steps_table() {
    use Checkpoint::*;
    let rows = [
        (Bootstrap::Fresh, Some((SetupHost, SetupHost))),
        (Bootstrap::Restart, Some((SetupHost, SetupHost))),
        (Bootstrap::Repair, Some((SetupHost, Complete))),
        (Bootstrap::Resume(Configure), Some((Configure, Configure))),
        (Bootstrap::Resume(Persist), Some((Persist, Persist))),
        (Bootstrap::Upgrade, None),
    ];
    for (action, want) in rows {
        let got = action.steps().map(|s| (s.start, s.record));
        assert_eq!(got, want, "{action:?}");
    }
}

#[test]
fn upgradable_table() {
    let done = Checkpoint::Complete;
    let ok = record("worker-01", FP, done);
    assert_eq!(upgradable(Some(&ok), "worker-01"), Ok(&ok));
    // Only the name matters: a finished node of another config is what an upgrade is for.
    let other = record("worker-01", OTHER_FP, done);
    assert_eq!(upgradable(Some(&other), "worker-01"), Ok(&other));
    assert_eq!(
        upgradable(None, "worker-01"),
        Err(Refusal::NoFinishedBootstrap)
    );
    for c in UNFINISHED {
        let r = record("worker-01", FP, c);
        assert_eq!(
            upgradable(Some(&r), "worker-01"),
            Err(Refusal::NoFinishedBootstrap),
            "{c:?}"
        );
    }
    let renamed = record("worker-02", FP, done);
    let e = upgradable(Some(&renamed), "worker-01").expect_err("new name");
    assert_eq!(
        e.to_string(),
        "this node is \"worker-02\", the config is for \"worker-01\": a new machine name is a new \
         node; `nodeward reset` first"
    );
    // An unfinished bootstrap under another name: the unfinished bootstrap is what is named.
    let r = record("worker-02", FP, Checkpoint::Install);
    assert_eq!(
        upgradable(Some(&r), "worker-01"),
        Err(Refusal::NoFinishedBootstrap)
    );
}

#[test]
fn upgrade_table() {
    let (v1, v2) = ("1.34.1-aaaaaaaaaaaa", "1.35.0-bbbbbbbbbbbb");
    let switch = |from: &str| Ok(Upgrade::Switch { from: from.into() });
    // (applied fingerprint, current link, record's version, target version, expected)
    type Row<'a> = (
        Option<&'a str>,
        Option<&'a str>,
        &'a str,
        Result<Upgrade, Refusal>,
    );
    let rows: Vec<Row> = vec![
        // No applied config: refused, whatever else holds.
        (None, Some(v1), v2, Err(Refusal::NoAppliedConfig)),
        (None, Some(v2), v2, Err(Refusal::NoAppliedConfig)),
        // Same config on the same version: nothing to do.
        (Some(FP), Some(v2), v2, Ok(Upgrade::Unchanged)),
        // Same config, another version running (e.g. after a rollback): switch.
        (Some(FP), Some(v1), v2, switch(v1)),
        // Another config on the same version (a configuration-only change): switch.
        (Some(OTHER_FP), Some(v2), v2, switch(v2)),
        (Some(OTHER_FP), Some(v1), v2, switch(v1)),
        // No `current` link: the record's version is what runs.
        (Some(FP), None, v2, switch(v1)),
        (Some(FP), None, v1, Ok(Upgrade::Unchanged)),
    ];
    for (i, (applied, link, to, want)) in rows.into_iter().enumerate() {
        assert_eq!(upgrade(applied, FP, link, v1, to), want, "row {i}");
    }
    assert_eq!(
        Refusal::NoAppliedConfig.to_string(),
        "no applied config: run `nodeward bootstrap` to finish the node first"
    );
}

fn journal(from: &str, to: &str) -> Journal {
    Journal {
        schema: crate::node::state::SCHEMA,
        from_version: from.into(),
        to_version: to.into(),
        to_fingerprint: OTHER_FP.into(),
        previous_config: crate::config::load(None).expect("embedded config"),
    }
}

#[test]
fn recovery_table() {
    let (v1, v2) = ("1.34.1-aaaaaaaaaaaa", "1.35.0-bbbbbbbbbbbb");
    // The journal's target is (OTHER_FP on v2); the node ran FP on v1 before.
    let applied_states = [None, Some(FP), Some(OTHER_FP)];
    let link_states = [None, Some(v1), Some(v2), Some("1.33.0-cccccccccccc")];
    for applied in applied_states {
        for link in link_states {
            // No journal: nothing to recover, whatever the applied config and the link.
            assert_eq!(
                recovery(None, applied, link),
                Recovery::Nothing,
                "{applied:?} {link:?}"
            );
            // A journal: finished only with the target's config on the target's version.
            let want = if applied == Some(OTHER_FP) && link == Some(v2) {
                Recovery::Finish
            } else {
                Recovery::RollBack
            };
            let j = journal(v1, v2);
            assert_eq!(
                recovery(Some(&j), applied, link),
                want,
                "{applied:?} {link:?}"
            );
        }
    }
    // A configuration-only upgrade keeps the version: the config decides.
    let j = journal(v1, v1);
    assert_eq!(
        recovery(Some(&j), Some(OTHER_FP), Some(v1)),
        Recovery::Finish
    );
    assert_eq!(recovery(Some(&j), Some(FP), Some(v1)), Recovery::RollBack);
    assert_eq!(recovery(Some(&j), None, Some(v1)), Recovery::RollBack);
}

#[test]
fn persist_table() {
    assert!(persist_needed(None, FP), "no applied config");
    assert!(persist_needed(Some(OTHER_FP), FP), "another config");
    assert!(!persist_needed(Some(FP), FP), "already this config");
}

#[test]
fn reset_config_table() {
    let given = crate::config::load(None).expect("embedded config");
    let mut applied = given.clone();
    applied.machine_name = "applied".into();
    let mut j = journal("a", "b");
    j.previous_config.machine_name = "journal".into();
    let name = |c: &NodeConfig| c.machine_name.clone();
    assert_eq!(
        name(reset_config(Some(&applied), Some(&j), &given)),
        "applied"
    );
    assert_eq!(name(reset_config(Some(&applied), None, &given)), "applied");
    assert_eq!(name(reset_config(None, Some(&j), &given)), "journal");
    assert_eq!(name(reset_config(None, None, &given)), "worker-01");
}
