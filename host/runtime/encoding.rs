//! Components must pass their strings as UTF-8.
//!
//! # Background
//! What one call's arguments make the host copy is bounded by wasmtime's hostcall fuel, which
//! counts the guest's bytes (`Limits::hostcall_bytes`). A component may declare, per lowered
//! or lifted function, that its strings are UTF-16 or latin1+UTF-16 (`string-encoding=` in its
//! canonical options); the host then transcodes each into a Rust `String`, which can be up to
//! twice the guest's bytes (latin1 bytes ≥ 0x80 become two), so the bound would no longer be
//! what the WIT says. Every phase built with wit-bindgen for Rust uses UTF-8.
//!
//! # Guarantees
//! - A component any of whose canonical functions (in it or in a component nested in it)
//!   names an encoding other than UTF-8 is refused when it is loaded, before it is compiled.

use super::LoadError;
use wasmparser::{CanonicalFunction, CanonicalOption, Parser, Payload};

/// Refuses `wasm` when one of its canonical functions passes strings other than as UTF-8, or
/// when its bytes do not parse.
pub fn check_utf8_only(phase: &str, wasm: &[u8]) -> Result<(), LoadError> {
    // Bytes this parser cannot read are refused here rather than skipped: a check that
    // skipped what it could not read would pass whatever a newer format hid in it.
    let malformed = |e: wasmparser::BinaryReaderError| LoadError::Malformed {
        phase: phase.into(),
        message: e.to_string(),
    };
    for payload in Parser::new(0).parse_all(wasm) {
        let Payload::ComponentCanonicalSection(reader) = payload.map_err(malformed)? else {
            continue;
        };
        for function in reader {
            let function = function.map_err(malformed)?;
            // Every canonical function that carries options (the async ones included, should
            // an engine ever validate them): any of them may move strings.
            let options = match &function {
                CanonicalFunction::Lift { options, .. }
                | CanonicalFunction::Lower { options, .. }
                | CanonicalFunction::TaskReturn { options, .. }
                | CanonicalFunction::StreamRead { options, .. }
                | CanonicalFunction::StreamWrite { options, .. }
                | CanonicalFunction::FutureRead { options, .. }
                | CanonicalFunction::FutureWrite { options, .. }
                | CanonicalFunction::ErrorContextNew { options, .. }
                | CanonicalFunction::ErrorContextDebugMessage { options, .. } => options,
                _ => continue,
            };
            for option in options.iter() {
                let encoding = match option {
                    CanonicalOption::UTF16 => "utf16",
                    CanonicalOption::CompactUTF16 => "latin1+utf16",
                    _ => continue,
                };
                return Err(LoadError::StringEncoding {
                    phase: phase.into(),
                    encoding,
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn component(encoding: &str) -> Vec<u8> {
        wat::parse_str(format!(
            r#"(component
                 (import "f" (func $f (param "m" string)))
                 (core module $m
                   (memory (export "mem") 1)
                   (func (export "realloc") (param i32 i32 i32 i32) (result i32) i32.const 0))
                 (core instance $i (instantiate $m))
                 (core func (canon lower (func $f) (memory $i "mem") string-encoding={encoding}))
               )"#
        ))
        .expect("the test component parses")
    }

    #[test]
    fn only_utf8_strings_are_accepted() {
        assert!(check_utf8_only("p", &component("utf8")).is_ok());
        let mut cut = component("utf8");
        cut.truncate(cut.len() - 3);
        assert!(matches!(
            check_utf8_only("p", &cut),
            Err(LoadError::Malformed { .. })
        ));
        for (encoding, named) in [("utf16", "utf16"), ("latin1+utf16", "latin1+utf16")] {
            let err = check_utf8_only("p", &component(encoding)).expect_err(encoding);
            assert!(
                matches!(&err, LoadError::StringEncoding { phase, encoding } if phase == "p" && *encoding == named),
                "{err:?}"
            );
            assert!(err.to_string().contains("only UTF-8"), "{err}");
        }
    }

    #[test]
    fn the_shipped_and_test_components_are_utf8() {
        for (name, wasm) in [
            ("probe", crate::built::TEST_GUEST_PROBE_COMPONENT),
            ("misbehave", crate::built::TEST_GUEST_MISBEHAVE_COMPONENT),
        ] {
            let bytes = std::fs::read(wasm).expect("built component");
            assert!(check_utf8_only(name, &bytes).is_ok(), "{name}");
        }
        for (name, bytes) in crate::built::DEFAULT_BUNDLE_COMPONENTS {
            assert!(check_utf8_only(name, bytes).is_ok(), "{name}");
        }
    }
}
