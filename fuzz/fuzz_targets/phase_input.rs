//! The phase input: the JSON document every phase deserializes (`PhaseInput`, in
//! `node-config/src/input.rs`), the way `guest-phases/common` does (`serde_json::from_str`).
//!
//! Invariants: an accepted input re-serializes and re-parses to an equal value, and its JSON
//! is no larger than a small multiple of the input (no amplification a guest could be handed).
#![no_main]

use libfuzzer_sys::fuzz_target;
use nodeward_node_config::input::PhaseInput;

fuzz_target!(|data: &[u8]| {
    let Some(text) = nodeward_fuzz::text(data) else {
        return;
    };
    let Ok(input) = serde_json::from_str::<PhaseInput>(text) else {
        return;
    };
    let json = serde_json::to_string(&input).expect("serializes");
    let again: PhaseInput = serde_json::from_str(&json).expect("its JSON parses");
    assert_eq!(again, input, "round trip");
    // Defaults fill in a bounded amount; escapes at most 6x (`\u0001`); numbers grow a little.
    assert!(
        json.len() <= 8 * text.len() + 4096,
        "{} bytes of JSON from {} bytes",
        json.len(),
        text.len()
    );
});
