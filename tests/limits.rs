//! Limits: a guest that loops forever, hogs memory (in one memory or in many, or in tables),
//! is made of too many instances, memories or tables, recurses too deep or panics is stopped
//! with a typed error, one that prints too much sees its stdout closed, and the runtime runs
//! the next phase fine after each.
//!
//! The tests of this file run one at a time ([`serial`]): one of them asserts the peak RSS of
//! this process (the agent here) during a run, which other runs in parallel would inflate.

mod common;

use common::components;
use common::*;
use nodeward::plan::RunMode;
use nodeward::runtime::limits::{
    MAX_INSTANCES, MAX_MEMORIES, MAX_TABLES, MAX_WASM_STACK, TABLE_ELEMENT_BYTES,
};
use nodeward::runtime::{Limits, PhaseError};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

const LIMITS: Limits = Limits {
    deadline: Duration::from_secs(20),
    memory: 64 << 20,
};

/// Held by every test of this file, so that none runs beside another.
fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

fn healthy_after(s: &std::sync::Arc<nodeward::caps::RunContext>) {
    let report = misbehave(s, "still fine", LIMITS).expect("the next phase runs");
    assert_eq!(report.summary, "ok: still fine");
}

#[test]
fn an_endless_loop_is_stopped_by_the_deadline() {
    let _serial = serial();
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
    let _serial = serial();
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

/// The host makes random bytes before the guest's memory takes them: one call gets at most
/// `MAX_RANDOM_BYTES` (1 MiB), and asking for 64 MiB stops the run instead of making the
/// agent hold them.
#[test]
fn random_bytes_are_bounded_per_call() {
    let _serial = serial();
    let f = Fixture::new();
    let s = f.session(RunMode::Apply);
    let max = nodeward::runtime::limits::MAX_RANDOM_BYTES;
    let ok = misbehave(&s, &format!("random:{max}"), LIMITS).expect("1 MiB of random");
    assert_eq!(ok.summary, format!("random: {max} bytes"));
    let err = misbehave(&s, "random:67108864", LIMITS).expect_err("64 MiB is refused");
    assert!(matches!(err, PhaseError::Trapped { .. }), "{err:?}");
    assert!(err.to_string().contains("exceeds limit 1048576"), "{err}");
    healthy_after(&s);
}

/// Runs `misbehave` with `input` on its own thread and waits for it for at most `patience`:
/// a run that does not end then is a hang (the test fails instead of hanging with it).
fn misbehave_within(
    s: &std::sync::Arc<nodeward::caps::RunContext>,
    input: &str,
    limits: Limits,
    patience: Duration,
) -> Result<nodeward::runtime::PhaseReport, PhaseError> {
    let (tx, rx) = std::sync::mpsc::channel();
    let (s, input) = (s.clone(), input.to_string());
    std::thread::spawn(move || {
        let _ = tx.send(misbehave(&s, &input, limits));
    });
    rx.recv_timeout(patience)
        .unwrap_or_else(|_| panic!("the run did not end within {patience:?}: a hang"))
}

/// A wait inside the host (a sleep, a pollable blocked on) is no way around the deadline: the
/// monotonic clock's waits end at the phase's deadline, and the run times out.
#[test]
fn a_sleep_or_an_endless_wait_ends_at_the_deadline() {
    let _serial = serial();
    let f = Fixture::new();
    let s = f.session(RunMode::Apply);
    let limits = Limits {
        deadline: Duration::from_millis(500),
        ..LIMITS
    };
    for input in ["sleep:3600", "wait-forever"] {
        let err = misbehave_within(&s, input, limits, Duration::from_secs(120))
            .expect_err("must not finish");
        assert!(
            matches!(err, PhaseError::Timeout { ref phase, after } if phase == "misbehave" && after == limits.deadline),
            "{input}: {err:?}"
        );
    }
    // A short sleep within the deadline is a sleep.
    let ok = misbehave(&s, "sleep:0", LIMITS).expect("no wait");
    assert_eq!(ok.summary, "slept 0 s");
    healthy_after(&s);
}

/// Host resources a phase holds (pollables, streams) are capped per run: 100 are fine, 10,000
/// stop the run.
#[test]
fn host_resources_a_phase_holds_are_capped() {
    let _serial = serial();
    let f = Fixture::new();
    let s = f.session(RunMode::Apply);
    let ok = misbehave(&s, "pollables:100", LIMITS).expect("100 pollables");
    assert_eq!(ok.summary, "held 100 pollables");
    let err = misbehave(&s, "pollables:10000", LIMITS).expect_err("10,000 is past the cap");
    assert!(matches!(err, PhaseError::Trapped { .. }), "{err:?}");
    healthy_after(&s);
}

#[test]
fn a_panic_is_a_typed_crash_with_its_message() {
    let _serial = serial();
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

#[test]
fn memories_share_one_budget_each_within_it_alone() {
    let _serial = serial();
    let f = Fixture::new();
    let s = f.session(RunMode::Apply);
    // Three memories of 30 MiB: each fits in 64 MiB, together they do not.
    let err = components::run(&s, "memories", &components::many_memories(3, 30), LIMITS)
        .expect_err("90 MiB in three memories exceed a 64 MiB budget");
    assert!(
        matches!(&err, PhaseError::MemoryLimit { phase, limit } if phase == "memories" && *limit == 64 << 20),
        "{err:?}"
    );
    // The same component within the budget runs: the budget is what stopped it.
    let ok = components::run(&s, "memories", &components::many_memories(3, 16), LIMITS)
        .expect("48 MiB in three memories fit in 64");
    assert_eq!(ok.summary, "ok");
    healthy_after(&s);
}

#[test]
fn many_memories_keep_the_agent_within_the_budget() {
    let _serial = serial();
    let f = Fixture::new();
    let s = f.session(RunMode::Apply);
    // Issue 10's attack, within the memory count cap: memories of 60 MiB each, touched page by
    // page, under a 64 MiB budget. Per-memory caps let this reach 180 MiB.
    let wasm = components::many_memories(MAX_MEMORIES - 1, 60);
    // Compile (and cache) before measuring: compiling is not the guest's doing.
    runtime()
        .load("memories", "pure", &wasm, &components::digest(&wasm))
        .expect("loads");
    let before = reset_peak() * 1024;
    let err = components::run(&s, "memories", &wasm, LIMITS).expect_err("over the budget");
    let peak = status_kib("VmHWM") * 1024;
    assert!(
        matches!(err, PhaseError::MemoryLimit { limit, .. } if limit == 64 << 20),
        "{err:?}"
    );
    let ceiling = LIMITS.memory as u64 + (64 << 20);
    eprintln!(
        "agent RSS before the run {} MiB, peak during it {} MiB (ceiling {} MiB)",
        before >> 20,
        peak >> 20,
        ceiling >> 20
    );
    assert!(
        peak < ceiling,
        "peak RSS {peak} bytes is over the budget + 64 MiB ({ceiling})"
    );
    healthy_after(&s);
}

#[test]
fn tables_count_against_the_budget() {
    let _serial = serial();
    let f = Fixture::new();
    let s = f.session(RunMode::Apply);
    let over = (LIMITS.memory / TABLE_ELEMENT_BYTES) as u32 + 1;
    let err = components::run(&s, "tables", &components::growing_table(over), LIMITS)
        .expect_err("a table bigger than the budget");
    assert!(
        matches!(&err, PhaseError::MemoryLimit { phase, .. } if phase == "tables"),
        "{err:?}"
    );
    let ok = components::run(&s, "tables", &components::growing_table(1 << 20), LIMITS)
        .expect("8 MiB of table elements fit in 64 MiB");
    assert_eq!(ok.summary, "ok");
    healthy_after(&s);
}

#[test]
fn too_many_instances_memories_or_tables_are_stopped_at_instantiation() {
    let _serial = serial();
    let f = Fixture::new();
    let s = f.session(RunMode::Apply);
    // The main module is one instance with one memory and no table.
    let cases = [
        (
            components::many_instances(MAX_INSTANCES, 0, 0),
            "instances",
            MAX_INSTANCES,
        ),
        (
            components::many_instances(MAX_MEMORIES, 1, 0),
            "memories",
            MAX_MEMORIES,
        ),
        (
            components::many_instances(1, 0, MAX_TABLES + 1),
            "tables",
            MAX_TABLES,
        ),
    ];
    for (wasm, what, limit) in cases {
        let err = components::run(&s, "counts", &wasm, LIMITS).expect_err(what);
        assert!(
            matches!(&err, PhaseError::CountLimit { phase, what: w, limit: l } if phase == "counts" && *w == what && *l == limit),
            "{what}: {err:?}"
        );
        assert_eq!(
            err.to_string(),
            format!("phase counts needs more than {limit} {what} (the most one run may have)")
        );
    }
    // Exactly at each cap runs.
    let at_caps = components::many_instances(MAX_INSTANCES - 1, 0, 0);
    assert_eq!(
        components::run(&s, "counts", &at_caps, LIMITS)
            .expect("at the cap")
            .summary,
        "ok"
    );
    let at_caps = components::many_instances(1, MAX_MEMORIES - 1, MAX_TABLES);
    assert_eq!(
        components::run(&s, "counts", &at_caps, LIMITS)
            .expect("at the cap")
            .summary,
        "ok"
    );
    healthy_after(&s);
}

#[test]
fn a_stack_overflow_is_named_as_such() {
    let _serial = serial();
    let f = Fixture::new();
    let s = f.session(RunMode::Apply);
    let err = misbehave(&s, "recurse:100000000", LIMITS).expect_err("too deep");
    assert!(
        matches!(&err, PhaseError::StackOverflow { phase, limit } if phase == "misbehave" && *limit == MAX_WASM_STACK),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        format!(
            "phase misbehave overflowed its stack of {MAX_WASM_STACK} bytes (recursion too deep)"
        )
    );
    let ok = misbehave(&s, "recurse:1000", LIMITS).expect("1000 frames fit");
    assert_eq!(ok.summary, "recursed 1000 deep");

    // Large frames live on the guest's own stack in its linear memory: overflowing it is an
    // out-of-bounds access, which the message explains rather than leaving it bare.
    let err = misbehave(&s, "recurse-big:100000", LIMITS).expect_err("too deep");
    let PhaseError::Trapped { phase, message } = &err else {
        panic!("expected a trap, got {err:?}");
    };
    assert_eq!(phase, "misbehave");
    assert_eq!(
        message,
        "wasm trap: out of bounds memory access in test_guest_misbehave::recurse_big (a \
         function calling itself: most likely the guest overflowed its own stack, which it keeps \
         in its linear memory; recursion too deep)"
    );
    let ok = misbehave(&s, "recurse-big:100", LIMITS).expect("100 frames of 4 KiB fit");
    assert!(ok.summary.starts_with("recursed big"), "{}", ok.summary);
    healthy_after(&s);
}

#[test]
fn stdout_past_its_capacity_is_closed_to_the_guest() {
    let _serial = serial();
    let f = Fixture::new();
    let s = f.session(RunMode::Apply);
    let ok = misbehave(&s, "print:16", LIMITS).expect("16 KiB fit");
    assert_eq!(ok.summary, "printed 16 KiB");
    // 256 KiB are kept. Once they are full the stream reports itself closed, and the guest's
    // write that filled it (its flush waits for the stream to be ready again) already fails:
    // 255 lines of 1 KiB went through.
    let err = misbehave(&s, "print:300", LIMITS).expect_err("over 256 KiB");
    let PhaseError::Failed { phase, message } = &err else {
        panic!("expected the guest's own failure, got {err:?}");
    };
    assert_eq!(phase, "misbehave");
    assert!(
        message.starts_with("stdout failed after 255 KiB"),
        "{message}"
    );
    healthy_after(&s);
}
