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
//!
//! Wasmtime's compatibility hash covers its version and its compilation settings, but not its
//! cargo features, and build.rs links the wasmtime of `[build-dependencies]`, the binary that
//! of `[dependencies]`: two entries of `Cargo.toml` that could drift apart. So the key the
//! embedded precompiled components are recorded and looked up under ([`precompiled_key`])
//! also hashes the wasmtime entry each side was built with ([`wasmtime_dependency`]): when
//! the entries differ, the keys differ and the runtime compiles instead. A unit test keeps
//! the two entries equal.

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

/// The `wasmtime` entry of `section` (`dependencies` or `build-dependencies`) of the
/// `Cargo.toml` text `manifest`, as one canonical line: its version, `default-features` and
/// sorted features (`=48.0.8 default-features=false features=async,cranelift,...`). An error
/// names what is missing.
// build.rs reads both entries with it (and the runtime's tests); the binary has the result.
#[cfg_attr(not(test), allow(dead_code))]
pub fn wasmtime_dependency(manifest: &str, section: &str) -> Result<String, String> {
    let table: toml::Table = manifest
        .parse()
        .map_err(|e| format!("Cargo.toml does not parse: {e}"))?;
    let dep = table
        .get(section)
        .and_then(|s| s.get("wasmtime"))
        .ok_or_else(|| format!("Cargo.toml has no [{section}] wasmtime"))?;
    let version = dep
        .get("version")
        .and_then(toml::Value::as_str)
        .ok_or_else(|| format!("Cargo.toml [{section}] wasmtime has no version"))?;
    let default_features = dep
        .get("default-features")
        .and_then(toml::Value::as_bool)
        .unwrap_or(true);
    let mut features = Vec::new();
    for f in dep
        .get("features")
        .and_then(toml::Value::as_array)
        .map_or(&[][..], Vec::as_slice)
    {
        let f = f
            .as_str()
            .ok_or_else(|| format!("Cargo.toml [{section}] wasmtime: a feature is not a string"))?;
        features.push(f);
    }
    features.sort_unstable();
    features.dedup();
    Ok(format!(
        "{version} default-features={default_features} features={}",
        features.join(",")
    ))
}

/// The key of precompiled components: the engine's [`compat_key`] and 8 hex digits of a
/// sha256 of the wasmtime dependency entry the engine was built with
/// ([`wasmtime_dependency`]), so that components precompiled by a wasmtime with other cargo
/// features than the runtime's are not used.
pub fn precompiled_key(engine: &wasmtime::Engine, wasmtime_dependency: &str) -> String {
    use sha2::Digest as _;
    let dep = sha2::Sha256::digest(wasmtime_dependency.as_bytes());
    format!("{}-{}", compat_key(engine), hex::encode(&dep[..4]))
}
