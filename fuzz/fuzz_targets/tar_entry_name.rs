//! Tar entry names of downloaded archives (`nodeward::caps::download::entry_path`, the first check
//! `fetch-and-extract` makes on every entry, with the `strip-components` count).
//!
//! Input: one byte of `strip` (0 to 3, or a huge count), then the raw entry name.
//!
//! Invariants: an absolute name, a NUL, non-UTF-8 or a `..` component is refused; otherwise
//! the result is the name's components after `strip` (`.` and empty ones dropped), `None` when
//! nothing is left, and always a valid host path that re-parses to itself.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nodeward::caps::download::entry_path;
use nodeward::hostpath::HostPath;

fuzz_target!(|data: &[u8]| {
    let Some((&first, raw)) = data.split_first() else {
        return;
    };
    let strip = match first {
        0..=3 => u32::from(first),
        4 => u32::MAX,
        _ => u32::from(first % 4),
    };
    let result = entry_path(raw, strip);
    let Ok(name) = std::str::from_utf8(raw) else {
        assert!(result.is_err(), "non-UTF-8 accepted");
        return;
    };
    let parts: Vec<&str> = name
        .split('/')
        .filter(|c| !matches!(*c, "" | "."))
        .collect();
    let hostile = name.starts_with('/') || parts.iter().any(|c| *c == ".." || c.contains('\0'));
    match result {
        Err(_) => {
            let rest = parts.get(strip as usize..).unwrap_or_default().join("/");
            assert!(
                hostile || HostPath::parse(&rest).is_err(),
                "{name:?} (strip {strip}) refused"
            );
        }
        Ok(None) => {
            assert!(!hostile, "{name:?} accepted");
            assert!(parts.len() <= strip as usize);
        }
        Ok(Some(p)) => {
            assert!(!hostile, "{name:?} accepted");
            assert_eq!(p, parts[strip as usize..].join("/"));
            let hp = HostPath::parse(&p).expect("a valid host path");
            assert_eq!(hp.as_str(), p);
        }
    }
});
