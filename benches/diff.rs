//! Plan-diff benchmark (`cargo bench --bench diff`): prints how long `plan::file_diff` takes
//! for files whose every line changed, and what it returned; asserts nothing about time.
//!
//! Before diffs were bounded, 10,000 changed lines took 0.6 s, 40,000 took 7.7 s and 80,000
//! took 28.6 s (the line diff is roughly quadratic in the changed lines), against a 3 s phase
//! deadline. Now a side above `diff_limits::MAX_LINES` gets a summary without diffing, and a
//! diff stops at `diff_limits::MAX_TIME` or the deadline, whichever comes first.

use nodeward::hostpath::HostPath;
use nodeward::plan::{diff_limits, file_diff};
use std::time::{Duration, Instant};

fn lines(n: usize, seed: &str) -> String {
    (0..n).map(|i| format!("{seed} {i}\n")).collect()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = HostPath::parse("etc/big.conf")?;
    println!(
        "plan diff benchmark (release build: {}); limits: {} lines, {} bytes, {:?}; phase deadline 3 s",
        !cfg!(debug_assertions),
        diff_limits::MAX_LINES,
        diff_limits::MAX_BYTES,
        diff_limits::MAX_TIME
    );
    for n in [1_000, 5_000, 10_000, 40_000, 80_000] {
        let (old, new) = (lines(n, "old"), lines(n, "new"));
        let deadline = Instant::now() + Duration::from_secs(3);
        let started = Instant::now();
        let diff = file_diff(
            &path,
            Some(old.as_bytes()),
            new.as_bytes(),
            0o644,
            false,
            deadline,
        )
        .unwrap_or_default();
        let took = started.elapsed();
        let what = if diff.starts_with("(no line diff: ") {
            diff.lines()
                .next()
                .unwrap_or_default()
                .chars()
                .take(60)
                .collect::<String>()
        } else {
            format!("line diff, {} lines", diff.lines().count())
        };
        println!(
            "{n:>6} changed lines: {:>8.1} ms  {what}",
            took.as_secs_f64() * 1e3
        );
    }
    Ok(())
}
