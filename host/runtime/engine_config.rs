//! The wasmtime configuration of nodeward's one engine, in a file of its own so that
//! `build.rs` (which precompiles the embedded bundle) and the runtime (which loads it) build
//! their engines from the same code: a precompiled component loads only into an engine whose
//! compilation settings hash the same (`Engine::precompile_compatibility_hash`).
//!
//! The target is named explicitly (the triple cargo built for), so the compiler uses that
//! architecture's baseline features rather than those it would detect on the machine at
//! hand: a component precompiled on the build machine then matches on every node of the
//! architecture, whatever its CPU. Phases render files and call the host; they have no loop
//! that the CPU's newer vector extensions would speed up.

/// The most of the calling thread's stack wasm frames may use, bytes (wasmtime's default,
/// stated here because it is a limit a guest can hit).
pub const MAX_WASM_STACK: usize = 512 << 10;

/// The engine configuration for components compiled for `target` (a target triple).
pub fn engine_config(target: &str) -> wasmtime::Result<wasmtime::Config> {
    let mut config = wasmtime::Config::new();
    config
        .wasm_component_model(true)
        .epoch_interruption(true)
        .max_wasm_stack(MAX_WASM_STACK)
        .target(target)?;
    Ok(config)
}

/// The engine's compatibility hash as a short, stable key (16 hex digits of a sha256 over
/// what `Engine::precompile_compatibility_hash` hashes): the on-disk cache names its files
/// with it, and build.rs records it next to the components it precompiled.
pub fn compat_key(engine: &wasmtime::Engine) -> String {
    use sha2::Digest as _;
    use std::hash::{Hash as _, Hasher};

    /// A [`Hasher`] feeding sha256, so the key does not depend on std's unstable hashers.
    struct Sha256Hasher(sha2::Sha256);

    impl Hasher for Sha256Hasher {
        fn finish(&self) -> u64 {
            0
        }
        fn write(&mut self, bytes: &[u8]) {
            self.0.update(bytes);
        }
    }

    let mut hasher = Sha256Hasher(sha2::Sha256::new());
    engine.precompile_compatibility_hash().hash(&mut hasher);
    hex::encode(&hasher.0.finalize()[..8])
}
