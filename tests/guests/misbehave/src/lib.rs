//! Test guest (world `pure`): misbehaves as its input asks, so the limit tests can check that
//! the host stops it with a typed error and stays healthy.
//! - `"loop"`: spins forever (stopped by the epoch deadline);
//! - `"hog:<MiB>"`: allocates and touches that much memory (stopped by the memory cap);
//! - `"panic"`: panics;
//! - anything else: returns Ok with the input echoed, proving the guest itself works.

wit_bindgen::generate!({ world: "pure", path: "../../../wit" });

use exports::nodeward::host::phase::{Guest, Report};
use std::hint::black_box;

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
