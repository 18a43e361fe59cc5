//! The embedded bundle's components, precompiled by `build.rs` for the engine this binary
//! carries, so that a fresh node's first bootstrap compiles nothing.
//!
//! # Background
//! Compiling a phase component takes 129–212 ms in a release build (eight of them on a fresh
//! node: over a second before and during its first bootstrap); loading a precompiled one takes
//! a fraction of a millisecond. `build.rs` builds its engine from the same configuration
//! ([`super::engine_config`]), precompiles each component of the default bundle with
//! `Engine::precompile_component`, and embeds the results next to the engine's compatibility
//! key, all in one zstd frame (about 6 MB of compiled code, most of it shared by all eight,
//! in well under 1 MB: the binary's size budget allows that, not 6 MB). The first load
//! decompresses the frame (milliseconds). The components themselves stay embedded too: their
//! digests name the bundle, and `phases inspect` reads them.
//!
//! # Guarantees
//! - A precompiled component is used only for the component it was compiled from: it is looked
//!   up by that component's sha256, which the bundle has already verified.
//! - It is used only when this engine's key equals the one build.rs recorded (same wasmtime
//!   version, compilation settings and target, and the same wasmtime entry in Cargo.toml, cargo
//!   features included: [`super::engine_config::precompiled_key`]), and wasmtime checks its
//!   part again when it deserializes; otherwise, or if deserializing fails, the component is
//!   compiled (and cached on disk) as any other.
//!
//! # Assumptions
//! `Component::deserialize` trusts its input: it maps the bytes as executable code. These bytes
//! are part of this binary, written by its own build from its own components, so they are as
//! trusted as the binary's own code; nothing from a bundle, the network or the state
//! directory is ever deserialized here.

use super::engine_config::precompiled_key;
use crate::built;
use std::sync::OnceLock;
use wasmtime::Engine;
use wasmtime::component::Component;

/// The precompiled components this binary carries, if its engine can load them.
pub(crate) struct Embedded {
    /// (component sha256, offset, length) in the decompressed frame; empty when the engine's
    /// key does not match.
    usable: &'static [(&'static str, usize, usize)],
    /// The frame, decompressed at the first load (a few MB, kept for this runtime's life).
    decompressed: OnceLock<Option<Vec<u8>>>,
}

impl Embedded {
    /// The embedded precompiled components, usable by `engine` or none.
    pub(crate) fn for_engine(engine: &Engine) -> Self {
        Self::for_key(&precompiled_key(engine, built::WASMTIME_DEPENDENCY))
    }

    /// The embedded precompiled components if `key` (the runtime engine's) is the one build.rs
    /// recorded, else none.
    fn for_key(key: &str) -> Self {
        let usable = if built::PRECOMPILED_COMPAT == key {
            built::DEFAULT_BUNDLE_PRECOMPILED
        } else {
            if !built::DEFAULT_BUNDLE_PRECOMPILED.is_empty() {
                tracing::debug!(
                    built = built::PRECOMPILED_COMPAT,
                    engine = %key,
                    "the embedded precompiled components are for another engine; compiling instead"
                );
            }
            &[]
        };
        Embedded {
            usable,
            decompressed: OnceLock::new(),
        }
    }

    /// None: every component is compiled (or loaded from the on-disk cache).
    pub(crate) fn none() -> Self {
        Embedded {
            usable: &[],
            decompressed: OnceLock::new(),
        }
    }

    /// How many precompiled components this engine can use.
    pub(crate) fn len(&self) -> usize {
        self.usable.len()
    }

    /// The decompressed frame; `None` (with a warning, once) when it does not decompress.
    fn frame(&self) -> Option<&[u8]> {
        self.decompressed
            .get_or_init(|| {
                match zstd::bulk::decompress(
                    built::DEFAULT_BUNDLE_PRECOMPILED_ZSTD,
                    built::DEFAULT_BUNDLE_PRECOMPILED_LEN,
                ) {
                    Ok(bytes) if bytes.len() == built::DEFAULT_BUNDLE_PRECOMPILED_LEN => Some(bytes),
                    Ok(bytes) => {
                        tracing::warn!(
                            len = bytes.len(),
                            expected = built::DEFAULT_BUNDLE_PRECOMPILED_LEN,
                            "the embedded precompiled components decompress to the wrong length; compiling instead"
                        );
                        None
                    }
                    Err(e) => {
                        tracing::warn!(
                            "the embedded precompiled components do not decompress; compiling instead: {e}"
                        );
                        None
                    }
                }
            })
            .as_deref()
    }

    /// The component with digest `sha256`, deserialized from its embedded precompiled form;
    /// `None` when there is none or it does not load (the caller compiles it).
    // `Component::deserialize` is unsafe: it trusts its input (see the SAFETY comment and the
    // module's assumptions).
    #[allow(unsafe_code)]
    pub(crate) fn load(&self, engine: &Engine, sha256: &str) -> Option<Component> {
        let &(_, offset, len) = self.usable.iter().find(|(digest, ..)| *digest == sha256)?;
        let bytes = self.frame()?.get(offset..offset.checked_add(len)?)?;
        // SAFETY: the bytes are `Engine::precompile_component` output that build.rs embedded in
        // this binary (in a zstd frame whose checksum the decoder verified), for the component
        // whose (already verified) digest is `sha256`, made by an engine whose compatibility
        // key equals this one's.
        match unsafe { Component::deserialize(engine, bytes) } {
            Ok(c) => Some(c),
            Err(e) => {
                tracing::warn!(
                    sha256,
                    "the embedded precompiled component does not load; compiling it: {e:#}"
                );
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::engine_config::{compat_key, wasmtime_dependency};
    use super::*;
    use crate::bundle::Bundle;
    use crate::runtime::{Origin, Runtime};

    /// Cargo.toml's two wasmtime entries are one: the binary's and build.rs's wasmtime have the
    /// same cargo features, so the code build.rs precompiled is code this binary's wasmtime
    /// would have compiled. (Were they to differ, the keys would too, and the runtime would
    /// compile: the test below.)
    #[test]
    fn cargo_tomls_two_wasmtime_entries_are_the_same() {
        let manifest = include_str!("../../Cargo.toml");
        let build = wasmtime_dependency(manifest, "build-dependencies").expect("build entry");
        let runtime = wasmtime_dependency(manifest, "dependencies").expect("runtime entry");
        assert_eq!(
            build, runtime,
            "Cargo.toml: [build-dependencies] wasmtime must equal [dependencies] wasmtime"
        );
        assert_eq!(
            runtime,
            built::WASMTIME_DEPENDENCY,
            "build.rs read the same"
        );
        assert!(
            wasmtime_dependency("[dependencies]\nserde = \"1\"\n", "dependencies").is_err(),
            "no entry is an error, not an empty key"
        );
    }

    /// A key recorded for another wasmtime entry (a cargo feature more) or without one (the
    /// engine's compatibility hash alone) makes the runtime compile the embedded bundle's
    /// components: none is deserialized, each loads compiled.
    #[test]
    fn a_precompiled_key_that_differs_falls_back_to_compiling() {
        let tmp = tempfile::tempdir().expect("tmp");
        let mut rt = Runtime::new(tmp.path()).expect("runtime");
        assert!(rt.embedded_precompiled() > 0, "this build precompiled");
        let other_features = precompiled_key(
            rt.engine(),
            &format!("{},wmemcheck", built::WASMTIME_DEPENDENCY),
        );
        assert_ne!(other_features, built::PRECOMPILED_COMPAT);
        assert_eq!(Embedded::for_key(&compat_key(rt.engine())).len(), 0);
        rt.embedded = Embedded::for_key(&other_features);
        assert_eq!(rt.embedded_precompiled(), 0);
        let bundle = Bundle::embedded().expect("embedded bundle");
        let p = &bundle.manifest.phases[0];
        assert!(
            rt.embedded.load(rt.engine(), &p.sha256).is_none(),
            "no precompiled form"
        );
        let wasm = bundle.component(&p.name).expect("bytes");
        let loaded = rt
            .load(&p.name, &p.world, wasm, &p.sha256)
            .expect("compiles");
        assert_eq!(loaded.origin, Origin::Compiled);
    }
}
