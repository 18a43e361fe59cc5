use super::*;

fn spec(sha: char, accept: Option<char>) -> PhaseBundleRef {
    PhaseBundleRef {
        url: Some("https://bundles.example/b.tar.gz".into()),
        oci_reference: None,
        sha256: sha.to_string().repeat(64),
        accept_grants_digest: accept.map(|c| c.to_string().repeat(64)),
    }
}

fn record(sha: char, stage: Stage, failure: Option<FailureKind>) -> RolloutRecord {
    RolloutRecord {
        sha256: sha.to_string().repeat(64),
        accept_grants_digest: None,
        stage,
        failure,
        message: "why".into(),
        digest: Some("d".repeat(64)),
        previous: None,
        attempts: 0,
        failed_at: 1_000,
    }
}

const D: &str = "dddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd";

#[test]
fn no_spec_reports_the_current_bundle_and_a_new_one_is_due() {
    assert_eq!(judge(None, None, None, 0).due, None);
    assert_eq!(judge(None, None, None, 0).report, None);
    let j = judge(Some(&spec('a', None)), None, None, 0);
    assert!(j.due.is_some());
    assert!(matches!(j.report, Some(Report::Installing(_))));
    // A record for another archive, or for the same one with other consent, starts anew.
    let r = record('b', Stage::Active, None);
    assert!(
        judge(Some(&spec('a', None)), Some(&r), Some(D), 0)
            .due
            .is_some()
    );
    let r = record('a', Stage::Failed, Some(FailureKind::GrantsWiden));
    assert!(
        judge(Some(&spec('a', Some('e'))), Some(&r), None, 0)
            .due
            .is_some()
    );
}

#[test]
fn an_active_roll_out_stays_unless_the_current_bundle_moved() {
    let r = record('a', Stage::Active, None);
    let j = judge(Some(&spec('a', None)), Some(&r), Some(D), 0);
    assert_eq!(
        j,
        Judgement {
            report: None,
            due: None
        }
    );
    let j = judge(Some(&spec('a', None)), Some(&r), None, 0);
    assert!(j.due.is_some(), "rolled back by hand: rolled out again");
}

#[test]
fn a_cut_short_roll_out_runs_again() {
    for stage in [Stage::Installing, Stage::Checking] {
        let r = record('a', stage, None);
        assert!(
            judge(Some(&spec('a', None)), Some(&r), Some(D), 0)
                .due
                .is_some()
        );
    }
}

#[test]
fn refusals_are_final_and_fetch_failures_wait_before_a_retry() {
    let s = spec('a', None);
    let r = record('a', Stage::Failed, Some(FailureKind::Rejected));
    let j = judge(Some(&s), Some(&r), None, u64::MAX);
    assert_eq!(j.due, None);
    assert_eq!(j.report, Some(Report::Rejected("why".into())));
    let r = record('a', Stage::Failed, Some(FailureKind::GrantsWiden));
    assert_eq!(
        judge(Some(&s), Some(&r), None, u64::MAX).report,
        Some(Report::GrantsWiden("why".into()))
    );
    let r = record('a', Stage::Failed, Some(FailureKind::FetchFailed));
    let soon = judge(Some(&s), Some(&r), None, 1_000 + RETRY_AFTER.as_secs() - 1);
    assert_eq!(soon.due, None);
    assert_eq!(soon.report, Some(Report::FetchFailed("why".into())));
    let later = judge(Some(&s), Some(&r), None, 1_000 + RETRY_AFTER.as_secs());
    assert!(later.due.is_some());
}

#[test]
fn a_rolled_back_bundle_is_tried_again_until_the_attempt_budget_is_spent() {
    let s = spec('a', None);
    let mut r = record('a', Stage::Failed, Some(FailureKind::RolledBack));
    r.attempts = 1;
    let waited = 1_000 + RETRY_AFTER.as_secs();
    assert!(judge(Some(&s), Some(&r), None, waited).due.is_some());
    assert!(matches!(
        judge(Some(&s), Some(&r), None, 1_001).report,
        Some(Report::RolledBack(_))
    ));
    r.attempts = MAX_ATTEMPTS;
    let j = judge(Some(&s), Some(&r), None, u64::MAX);
    assert_eq!(j.due, None);
    match j.report {
        Some(Report::RolledBack(m)) => assert!(m.contains("attempt 2 of 2"), "{m}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn an_oci_reference_is_installed_as_oci_and_a_bad_or_ambiguous_location_is_refused() {
    let mut s = spec('a', None);
    s.url = None;
    s.oci_reference = Some("registry.example/bundles/b:1".into());
    assert_eq!(
        install_source(&s).as_deref(),
        Ok("oci://registry.example/bundles/b:1")
    );
    let j = judge(Some(&s), None, None, 0);
    assert!(j.due.is_some(), "{j:?}");
    assert!(matches!(j.report, Some(Report::Installing(_))), "{j:?}");
    assert_eq!(
        install_source(&spec('a', None)).as_deref(),
        Ok("https://bundles.example/b.tar.gz")
    );

    // Refused before any child: what the CLI could not pull (no registry, no tag, not a
    // reference at all, the CLI's own form), and both or neither location.
    for bad in [
        "bundles/b:1",
        "registry.example/bundles/b",
        "oci://registry.example/bundles/b:1",
        "--root=/",
    ] {
        s.oci_reference = Some(bad.into());
        let j = judge(Some(&s), None, None, 0);
        assert_eq!(j.due, None, "{bad}");
        let Some(Report::Rejected(why)) = j.report else {
            panic!("{bad}: {j:?}");
        };
        assert!(why.starts_with("spec.phaseBundle.ociReference: "), "{why}");
    }
    s.oci_reference = Some("registry.example/bundles/b:1".into());
    s.url = Some("https://x/".into());
    assert!(matches!(
        judge(Some(&s), None, None, 0).report,
        Some(Report::Rejected(_))
    ));
    s.url = None;
    s.oci_reference = None;
    assert!(matches!(
        judge(Some(&s), None, None, 0).report,
        Some(Report::Rejected(_))
    ));
}

#[test]
fn the_record_round_trips_and_an_unreadable_one_names_its_file() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let file = RecordFile::new(tmp.path());
    assert_eq!(file.read().expect("none"), None);
    let r = record('a', Stage::Checking, None);
    file.write(&r).expect("write");
    assert_eq!(file.read().expect("read"), Some(r));
    std::fs::write(tmp.path().join(RECORD_FILE), "{").expect("garble");
    let e = file.read().expect_err("unreadable");
    assert!(e.contains(RECORD_FILE), "{e}");
}

#[test]
fn changed_phases_are_the_rerunnable_ones_that_differ() {
    let old = Bundle::embedded().expect("embedded");
    let mut new = old.clone();
    assert_eq!(changed_phases(&old, &new), (vec![], false));
    for p in &mut new.manifest.phases {
        if p.name == "configure" {
            p.grants.fs.read.push("etc/hosts".into());
        }
        if p.name == "teardown" {
            p.sha256 = "0".repeat(64);
        }
    }
    assert_eq!(
        changed_phases(&old, &new),
        (vec!["configure".to_string()], true)
    );
    let mut start_only = old.clone();
    for p in &mut start_only.manifest.phases {
        if p.name == "start-node" {
            p.sha256 = "0".repeat(64);
        }
    }
    assert_eq!(changed_phases(&old, &start_only), (vec![], true));
}

#[test]
fn a_spec_the_cli_could_not_use_is_refused_before_any_child_runs() {
    let mut s = spec('a', None);
    s.url = Some("file:///etc/passwd".into());
    assert!(matches!(
        judge(Some(&s), None, None, 0).report,
        Some(Report::Rejected(_))
    ));
    let mut s = spec('a', None);
    s.url = Some("--root=/".into());
    assert!(matches!(
        judge(Some(&s), None, None, 0).report,
        Some(Report::Rejected(_))
    ));
    let mut s = spec('a', None);
    s.sha256 = "A".repeat(64);
    assert!(matches!(
        judge(Some(&s), None, None, 0).report,
        Some(Report::Rejected(_))
    ));
}
