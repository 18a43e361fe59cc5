//! The on-disk cache of compiled components, keyed by sha256(wasm) and the engine's
//! compatibility hash.
//!
//! # Assumptions
//! `Component::deserialize_file` trusts its input. The cache directory is created 0700 and
//! refused when another user owns it or it is group/world-writable, and only this process
//! writes artifacts into it; artifacts are never accepted from a bundle.
//!
//! # Guarantees
//! A compiled component is written like every durable file ([`durable::write_file`]: temp
//! file, fsync, rename, directory fsync), so a crash never leaves a torn `.cwasm` under its
//! final name; a temp file a killed run left (`.nodeward-tmp.compiled.…`) is swept by the next
//! run that holds the node lock.

use super::LoadError;
use crate::durable;
use std::path::{Path, PathBuf};
use wasmtime::Engine;
use wasmtime::component::Component;

/// The compiled-component cache of one engine.
pub(crate) struct Cache {
    dir: PathBuf,
    compat: String,
}

impl Cache {
    /// Opens (creating it 0700) the cache in `dir` for `engine`'s compiled artifacts.
    pub(crate) fn open(engine: &Engine, dir: &Path) -> Result<Self, LoadError> {
        prepare_cache_dir(dir)?;
        Ok(Cache {
            dir: dir.to_path_buf(),
            compat: super::engine_config::compat_key(engine),
        })
    }

    /// The cache file a component with digest `sha256` compiles to.
    pub(crate) fn path(&self, sha256: &str) -> PathBuf {
        self.dir.join(self.file_name(sha256))
    }

    fn file_name(&self, sha256: &str) -> String {
        format!("{sha256}-{}.cwasm", self.compat)
    }

    /// The cache directory (swept under the node lock, see `crate::node::sweep`).
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// Loads the compiled `wasm` (digest `sha256`) from the cache, or compiles it and stores
    /// it. Returns the component and whether it came from the cache.
    // `Component::deserialize_file` is unsafe: it trusts its input (see the SAFETY comments
    // and the module's assumptions).
    #[allow(unsafe_code)]
    pub(crate) fn compile(
        &self,
        engine: &Engine,
        phase: &str,
        wasm: &[u8],
        sha256: &str,
    ) -> Result<(Component, bool), LoadError> {
        let path = self.path(sha256);
        if path.is_file() {
            // SAFETY: the cache directory is checked to be writable only by this user, and only
            // this function writes into it, from `precompile_component` output.
            match unsafe { Component::deserialize_file(engine, &path) } {
                Ok(c) => return Ok((c, true)),
                Err(e) => {
                    tracing::warn!(path = %path.display(), "discarding unusable compiled component: {e:#}");
                    let _ = std::fs::remove_file(&path);
                }
            }
        }
        let compiled = engine
            .precompile_component(wasm)
            .map_err(|e| LoadError::Malformed {
                phase: phase.into(),
                message: format!("{e:#}"),
            })?;
        let cache_err = |e: std::io::Error| LoadError::Cache {
            path: path.clone(),
            message: e.to_string(),
        };
        let name = self.file_name(sha256);
        durable::open_dir(&self.dir)
            .and_then(|dir| durable::write_file(&dir, &name, &compiled, 0o600, "compiled"))
            .map_err(cache_err)?;
        // SAFETY: as above; the file was just written from `precompile_component` output.
        let component = unsafe { Component::deserialize_file(engine, &path) }.map_err(|e| {
            LoadError::Cache {
                path: path.clone(),
                message: format!("{e:#}"),
            }
        })?;
        Ok((component, false))
    }
}

/// Creates the cache directory 0700 and refuses one another user could write into.
fn prepare_cache_dir(dir: &Path) -> Result<(), LoadError> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    let err = |message: String| LoadError::Cache {
        path: dir.to_path_buf(),
        message,
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| {
            err(format!(
                "cannot create it: {e} (choose another with --state-dir)"
            ))
        })?;
    let meta = std::fs::metadata(dir).map_err(|e| err(e.to_string()))?;
    let uid = rustix::process::geteuid().as_raw();
    if meta.uid() != uid {
        return Err(err(format!(
            "owned by uid {}, not by this agent (uid {uid}); refusing to load code from it",
            meta.uid()
        )));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(err(format!(
            "mode {:04o} lets others write into it; refusing to load code from it",
            meta.mode() & 0o7777
        )));
    }
    Ok(())
}
