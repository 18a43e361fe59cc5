//! Test guest (world `pure`): misbehaves as its input asks, so the limit tests can check that
//! the host stops it with a typed error and stays healthy.
//! - `"loop"`: spins forever (stopped by the epoch deadline);
//! - `"hog:<MiB>"`: allocates and touches that much memory (stopped by the memory cap);
//! - `"recurse:<depth>"`: recurses that deep with small frames, on wasm's own stack (stopped
//!   by the host's wasm stack limit);
//! - `"recurse-big:<depth>"`: recurses with 4 KiB frames, which Rust keeps on its shadow stack
//!   in linear memory (the guest's own stack, inside its memory budget);
//! - `"hashmap"`: uses `std::collections::HashMap::new()`, which seeds itself from
//!   `wasi:random/insecure-seed` (so this guest always imports it);
//! - `"print:<KiB>"`: writes that many 1 KiB lines to stdout, and fails naming how many it
//!   wrote when a write fails (the host keeps 256 KiB per stream);
//! - `"random:<bytes>"`: asks `wasi:random/random.get-random-bytes` for that many bytes at
//!   once (the host bounds one call);
//! - `"sleep:<secs>"`: `std::thread::sleep` (a wait inside the host, on the monotonic clock);
//! - `"wait-forever"`: subscribes to the longest duration there is and blocks on it;
//! - `"pollables:<n>"`: holds `n` pollables at once (host resources);
//! - `"panic"`: panics;
//! - anything else: returns Ok with the input echoed, proving the guest itself works.

// The test world lives in the test package (tests/wit), which uses the shipped interfaces.
wit_bindgen::generate!({
    world: "nodeward:test/pure",
    path: ["../../../wit", "../../wit"],
    // The interfaces come from the shipped package `nodeward:host`: generate them here too.
    generate_all,
});

use exports::nodeward::host::phase::{Guest, Report};
use std::collections::HashMap;
use std::hint::black_box;
use std::io::Write;

/// Recurses `depth` times; the addition after the call keeps it from being a loop.
fn recurse(depth: u64) -> u64 {
    if depth == 0 {
        return 0;
    }
    recurse(black_box(depth - 1)).wrapping_add(1)
}

/// Recurses `depth` times with a 4 KiB buffer per frame whose address escapes, so each frame
/// lives on the shadow stack in linear memory.
fn recurse_big(depth: u64) -> u64 {
    let frame = black_box([depth as u8; 4096]);
    if depth == 0 {
        return u64::from(frame[0]);
    }
    recurse_big(black_box(depth - 1)).wrapping_add(u64::from(frame[4095]))
}

fn depth(input: &str, prefix: &str) -> Option<Result<u64, String>> {
    input
        .strip_prefix(prefix)
        .map(|d| d.parse().map_err(|_| format!("{prefix}<depth>")))
}

struct Misbehave;

impl Guest for Misbehave {
    fn run(input: String) -> Result<Report, String> {
        nodeward::host::log::log(
            nodeward::host::log::Level::Info,
            &format!("misbehave: {input}"),
        );
        if input == "loop" {
            let mut i: u64 = 0;
            loop {
                i = black_box(i.wrapping_add(1));
            }
        }
        if let Some(mib) = input.strip_prefix("hog:") {
            let mib: usize = mib.parse().map_err(|_| "hog:<MiB>".to_string())?;
            let mut chunks = Vec::new();
            for _ in 0..mib {
                // Touch every page so the memory is really used, and keep it alive.
                let chunk = black_box(vec![0xa5u8; 1 << 20]);
                chunks.push(chunk);
            }
            let touched: usize = chunks.iter().map(|c| c[c.len() - 1] as usize).sum();
            return Ok(Report {
                summary: format!("hogged {mib} MiB ({touched})"),
                changed: Vec::new(),
            });
        }
        if let Some(d) = depth(&input, "recurse:") {
            let reached = recurse(d?);
            return Ok(Report {
                summary: format!("recursed {reached} deep"),
                changed: Vec::new(),
            });
        }
        if let Some(d) = depth(&input, "recurse-big:") {
            let reached = recurse_big(d?);
            return Ok(Report {
                summary: format!("recursed big ({reached})"),
                changed: Vec::new(),
            });
        }
        if let Some(kib) = input.strip_prefix("print:") {
            let kib: usize = kib.parse().map_err(|_| "print:<KiB>".to_string())?;
            let line = "x".repeat(1023);
            let mut out = std::io::stdout().lock();
            for written in 0..kib {
                if let Err(e) = writeln!(out, "{line}").and_then(|()| out.flush()) {
                    return Err(format!("stdout failed after {written} KiB: {e}"));
                }
            }
            return Ok(Report {
                summary: format!("printed {kib} KiB"),
                changed: Vec::new(),
            });
        }
        if input == "hashmap" {
            let mut seen = HashMap::new();
            for word in ["a", "b", "a"] {
                *seen.entry(word).or_insert(0u32) += 1;
            }
            return Ok(Report {
                summary: format!("hashmap: a={} b={}", seen["a"], seen["b"]),
                changed: Vec::new(),
            });
        }
        if let Some(len) = input.strip_prefix("random:") {
            let len: u64 = len.parse().map_err(|_| "random:<bytes>".to_string())?;
            let bytes = wasip2::random::random::get_random_bytes(len);
            return Ok(Report {
                summary: format!("random: {} bytes", bytes.len()),
                changed: Vec::new(),
            });
        }
        if let Some(secs) = input.strip_prefix("sleep:") {
            let secs: u64 = secs.parse().map_err(|_| "sleep:<secs>".to_string())?;
            std::thread::sleep(std::time::Duration::from_secs(secs));
            return Ok(Report {
                summary: format!("slept {secs} s"),
                changed: Vec::new(),
            });
        }
        if input == "wait-forever" {
            wasip2::clocks::monotonic_clock::subscribe_duration(u64::MAX).block();
            return Ok(Report {
                summary: "the wait ended".to_string(),
                changed: Vec::new(),
            });
        }
        if let Some(n) = input.strip_prefix("pollables:") {
            let n: usize = n.parse().map_err(|_| "pollables:<n>".to_string())?;
            let held: Vec<_> = (0..n)
                .map(|_| wasip2::clocks::monotonic_clock::subscribe_duration(0))
                .collect();
            return Ok(Report {
                summary: format!("held {} pollables", held.len()),
                changed: Vec::new(),
            });
        }
        if input == "panic" {
            panic!("misbehave was asked to panic");
        }
        Ok(Report {
            summary: format!("ok: {input}"),
            changed: Vec::new(),
        })
    }
}

export!(Misbehave);
