//! Limits: a guest that loops forever, hogs memory or panics is stopped with a typed error,
//! and the runtime runs the next phase fine after each.

mod common;

use common::*;
use nodeward::plan::RunMode;
use nodeward::runtime::{Limits, PhaseError};
use std::time::Duration;

const LIMITS: Limits = Limits {
    deadline: Duration::from_secs(2),
    memory: 64 << 20,
};

fn healthy_after(s: &std::sync::Arc<nodeward::session::Session>) {
    let report = misbehave(s, "still fine", LIMITS).expect("the next phase runs");
    assert_eq!(report.summary, "ok: still fine");
}

#[test]
fn an_endless_loop_is_stopped_by_the_deadline() {
    let f = Fixture::new();
    let s = f.session(RunMode::Apply);
    let limits = Limits {
        deadline: Duration::from_millis(500),
        ..LIMITS
    };
    let err = misbehave(&s, "loop", limits).expect_err("must not finish");
    assert!(
        matches!(err, PhaseError::Timeout { ref phase, after } if phase == "misbehave" && after == limits.deadline),
        "{err:?}"
    );
    assert_eq!(err.to_string(), "phase misbehave timed out after 500ms");
    healthy_after(&s);
}

#[test]
fn a_memory_hog_hits_its_cap() {
    let f = Fixture::new();
    let s = f.session(RunMode::Apply);
    // 256 MiB touched, 64 MiB allowed.
    let err = misbehave(&s, "hog:256", LIMITS).expect_err("must not get the memory");
    assert!(
        matches!(err, PhaseError::MemoryLimit { limit, .. } if limit == 64 << 20),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "phase misbehave exceeded its memory limit of 67108864 bytes"
    );
    // The same guest within its cap succeeds, so the cap is what stopped it.
    let ok = misbehave(&s, "hog:16", LIMITS).expect("16 MiB fits in 64");
    assert!(ok.summary.starts_with("hogged 16 MiB"), "{}", ok.summary);
    healthy_after(&s);
}

#[test]
fn a_panic_is_a_typed_crash_with_its_message() {
    let f = Fixture::new();
    let s = f.session(RunMode::Apply);
    let err = misbehave(&s, "panic", LIMITS).expect_err("panics");
    let PhaseError::Trapped { phase, message } = &err else {
        panic!("expected a trap, got {err:?}");
    };
    assert_eq!(phase, "misbehave");
    assert!(
        message.contains("misbehave was asked to panic"),
        "{message}"
    );
    healthy_after(&s);
}
