//! The wasmtime runtime: one engine, a compiled-component cache, per-world linkers, limits.
//!
//! # Background
//! Compiling a component takes tens of milliseconds; loading a precompiled one takes a tenth of
//! a millisecond (research/wasm-spike.md). So each component is compiled once, cached on disk
//! keyed by sha256(wasm) and the engine's compatibility hash, and loaded with
//! `Component::deserialize_file` afterwards; the resulting `InstancePre` is reused in-process.
//!
//! # Guarantees
//! - Nothing of a component runs before it is verified: the bundle checks its sha256, the
//!   compiler validates it, and [`Runtime::load`] refuses imports beyond its declared world
//!   (and any WASI filesystem or sockets import) before instantiation.
//! - Guests get only their world's `nodeward:host` interfaces plus WASI stdio, clocks, random
//!   and an empty environment: no preopened directories, no env vars, no args, no sockets.
//! - Each run has a deadline (epoch interruption, one ticker thread per runtime) and a memory
//!   cap; exceeding either is a typed [`PhaseError`] and the runtime stays usable.
//!
//! # Assumptions
//! `Component::deserialize_file` trusts its input. The cache directory is created 0700 and
//! refused when another user owns it or it is group/world-writable, and only this process
//! writes artifacts into it; artifacts are never accepted from a bundle.

use crate::caps::PhaseCtx;
use crate::caps::bindings::{self, PhaseComponentPre};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use wasmtime::component::{Component, HasSelf, Linker, ResourceTable};
use wasmtime::{Config, Engine, ResourceLimiter, Store, Trap};
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

/// How often the epoch ticker advances; the deadline's resolution.
const TICK: Duration = Duration::from_millis(10);
/// How much guest stdout/stderr is kept per run.
const STDIO_CAPACITY: usize = 256 * 1024;

/// WASI interfaces a guest may import (by name without version). Filesystem and sockets are
/// absent on purpose: files go through `nodeward:host/fs`, and phases have no network.
const WASI_ALLOWED: &[&str] = &[
    "wasi:io/error",
    "wasi:io/poll",
    "wasi:io/streams",
    "wasi:cli/environment",
    "wasi:cli/exit",
    "wasi:cli/stdin",
    "wasi:cli/stdout",
    "wasi:cli/stderr",
    "wasi:cli/terminal-input",
    "wasi:cli/terminal-output",
    "wasi:cli/terminal-stdin",
    "wasi:cli/terminal-stdout",
    "wasi:cli/terminal-stderr",
    "wasi:clocks/wall-clock",
    "wasi:clocks/monotonic-clock",
    "wasi:random/random",
    "wasi:random/insecure",
    "wasi:random/insecure-seed",
];

/// The interfaces `world` imports, from the WIT package (see `build.rs`).
fn world_imports(phase: &str, world: &str) -> Result<&'static [&'static str], LoadError> {
    crate::built::WORLDS
        .iter()
        .find(|(w, _)| *w == world)
        .map(|(_, i)| *i)
        .ok_or_else(|| LoadError::UnknownWorld {
            phase: phase.into(),
            world: world.into(),
        })
}

/// Checks a component's `imports` against its declared `world` (plus the WASI interfaces every
/// phase may import). Used before instantiation, and by `phases inspect` to flag a component.
pub fn check_imports(phase: &str, world: &str, imports: &[String]) -> Result<(), LoadError> {
    let world_imports = world_imports(phase, world)?;
    for name in imports {
        let allowed = if name.starts_with("wasi:") {
            let unversioned = name.split('@').next().unwrap_or(name);
            WASI_ALLOWED.contains(&unversioned)
        } else {
            world_imports.contains(&name.as_str())
        };
        if !allowed {
            return Err(LoadError::ImportsExceedWorld {
                phase: phase.into(),
                import: name.clone(),
                world: world.into(),
            });
        }
    }
    Ok(())
}

/// Per-run limits.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// How long one phase run may take, guest and host calls together.
    pub deadline: Duration,
    /// The most linear memory a phase may grow to, in bytes.
    pub memory: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            deadline: Duration::from_secs(300),
            memory: 256 << 20,
        }
    }
}

/// Why a component was not loaded. Nothing of it ran.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The bytes are not a valid component.
    #[error("phase {phase}: component is not valid WebAssembly: {message}")]
    Malformed {
        /// Phase name.
        phase: String,
        /// The validator's message.
        message: String,
    },
    /// The component imports an interface its declared world does not.
    #[error("phase {phase}: component imports {import}, which world {world} does not allow")]
    ImportsExceedWorld {
        /// Phase name.
        phase: String,
        /// The offending import.
        import: String,
        /// The declared world.
        world: String,
    },
    /// The declared world is not part of this agent's WIT package.
    #[error("phase {phase}: unknown world {world:?}")]
    UnknownWorld {
        /// Phase name.
        phase: String,
        /// The declared world.
        world: String,
    },
    /// The compiled-component cache cannot be used.
    #[error("compiled component cache {path}: {message}")]
    Cache {
        /// The cache directory or file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// Linking or pre-instantiation failed.
    #[error("phase {phase}: cannot link component: {message}")]
    Link {
        /// Phase name.
        phase: String,
        /// wasmtime's message.
        message: String,
    },
}

/// Why a phase run failed. The runtime stays usable after each.
#[derive(Debug, thiserror::Error)]
pub enum PhaseError {
    /// The deadline passed.
    #[error("phase {phase} timed out after {after:?}")]
    Timeout {
        /// Phase name.
        phase: String,
        /// The deadline.
        after: Duration,
    },
    /// The guest tried to grow its memory beyond the cap.
    #[error("phase {phase} exceeded its memory limit of {limit} bytes")]
    MemoryLimit {
        /// Phase name.
        phase: String,
        /// The cap.
        limit: usize,
    },
    /// The guest trapped (a panic, an abort, an out-of-bounds access).
    #[error("phase {phase} crashed: {message}")]
    Trapped {
        /// Phase name.
        phase: String,
        /// The trap and the tail of the guest's stderr.
        message: String,
    },
    /// The phase returned an error.
    #[error("phase {phase} failed: {message}")]
    Failed {
        /// Phase name.
        phase: String,
        /// The phase's message.
        message: String,
    },
}

/// A loaded phase, ready to instantiate.
#[derive(Clone)]
pub struct LoadedPhase {
    pre: PhaseComponentPre<StoreState>,
    /// The component's imports, as wasmtime reports them.
    pub imports: Vec<String>,
    /// Whether the compiled artifact came from the on-disk cache.
    pub from_cache: bool,
}

/// What a phase returned.
#[derive(Clone, Debug, serde::Serialize)]
pub struct PhaseReport {
    /// One line for the operator.
    pub summary: String,
    /// Names of things the run changed that later phases care about.
    pub changed: Vec<String>,
}

/// Store data for one phase run.
pub struct StoreState {
    wasi: WasiCtx,
    table: ResourceTable,
    limiter: PhaseLimiter,
    caps: PhaseCtx,
}

impl WasiView for StoreState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

fn caps(state: &mut StoreState) -> &mut PhaseCtx {
    &mut state.caps
}

/// The memory cap, remembering whether it was hit so the error can say so.
struct PhaseLimiter {
    memory: usize,
    exceeded: bool,
}

impl ResourceLimiter for PhaseLimiter {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.memory {
            self.exceeded = true;
            return Err(wasmtime::Error::msg(format!(
                "memory limit of {} bytes exceeded (wanted {desired})",
                self.memory
            )));
        }
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= 1 << 20)
    }
}

/// Advances the engine's epoch every [`TICK`] until dropped.
struct EpochTicker {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl EpochTicker {
    fn start(engine: Engine) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("nodeward-epoch".into())
            .spawn(move || {
                while !flag.load(Ordering::Relaxed) {
                    std::thread::sleep(TICK);
                    engine.increment_epoch();
                }
            })
            .ok();
        EpochTicker { stop, thread }
    }
}

impl Drop for EpochTicker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The engine, its cache and its linkers. One per process.
pub struct Runtime {
    engine: Engine,
    cache_dir: PathBuf,
    compat: String,
    linkers: Mutex<HashMap<String, Linker<StoreState>>>,
    loaded: Mutex<HashMap<(String, String), LoadedPhase>>,
    _ticker: EpochTicker,
}

/// A [`Hasher`] feeding sha256, to turn the engine's compatibility hash into a stable key.
struct Sha256Hasher(Sha256);

impl Hasher for Sha256Hasher {
    fn finish(&self) -> u64 {
        0
    }
    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }
}

impl Runtime {
    /// A runtime whose compiled components are cached in `cache_dir` (created 0700).
    pub fn new(cache_dir: &Path) -> Result<Self, LoadError> {
        let mut config = Config::new();
        config.wasm_component_model(true).epoch_interruption(true);
        let engine = Engine::new(&config).map_err(|e| LoadError::Cache {
            path: cache_dir.to_path_buf(),
            message: format!("cannot create the wasmtime engine: {e:#}"),
        })?;
        prepare_cache_dir(cache_dir)?;
        let mut hasher = Sha256Hasher(Sha256::new());
        engine.precompile_compatibility_hash().hash(&mut hasher);
        let compat = hex::encode(&hasher.0.finalize()[..8]);
        Ok(Runtime {
            _ticker: EpochTicker::start(engine.clone()),
            engine,
            cache_dir: cache_dir.to_path_buf(),
            compat,
            linkers: Mutex::new(HashMap::new()),
            loaded: Mutex::new(HashMap::new()),
        })
    }

    /// The engine (for benchmarks and tests).
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The cache file a component with digest `sha256` compiles to.
    pub fn cache_path(&self, sha256: &str) -> PathBuf {
        self.cache_dir
            .join(format!("{sha256}-{}.cwasm", self.compat))
    }

    /// Compiles (or loads from the cache) the component `wasm` with digest `sha256`, checks its
    /// imports against `world`, and pre-instantiates it. The digest MUST already be verified.
    pub fn load(
        &self,
        phase: &str,
        world: &str,
        wasm: &[u8],
        sha256: &str,
    ) -> Result<LoadedPhase, LoadError> {
        let key = (sha256.to_string(), world.to_string());
        if let Some(l) = self
            .loaded
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
        {
            return Ok(l.clone());
        }
        let world_imports = world_imports(phase, world)?;
        let (component, from_cache) = self.compile(phase, wasm, sha256)?;

        let imports: Vec<String> = component
            .component_type()
            .imports(&self.engine)
            .map(|(name, _)| name.to_string())
            .collect();
        check_imports(phase, world, &imports)?;

        let mut linkers = self.linkers.lock().unwrap_or_else(|p| p.into_inner());
        if !linkers.contains_key(world) {
            let linker = self.linker(world_imports).map_err(|e| LoadError::Link {
                phase: phase.into(),
                message: format!("{e:#}"),
            })?;
            linkers.insert(world.to_string(), linker);
        }
        let linker = &linkers[world];
        let pre = linker
            .instantiate_pre(&component)
            .and_then(PhaseComponentPre::new)
            .map_err(|e| LoadError::Link {
                phase: phase.into(),
                message: format!("{e:#}"),
            })?;
        let loaded = LoadedPhase {
            pre,
            imports,
            from_cache,
        };
        self.loaded
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, loaded.clone());
        Ok(loaded)
    }

    fn compile(
        &self,
        phase: &str,
        wasm: &[u8],
        sha256: &str,
    ) -> Result<(Component, bool), LoadError> {
        let path = self.cache_path(sha256);
        if path.is_file() {
            // SAFETY: the cache directory is checked to be writable only by this user, and only
            // this function writes into it, from `precompile_component` output.
            match unsafe { Component::deserialize_file(&self.engine, &path) } {
                Ok(c) => return Ok((c, true)),
                Err(e) => {
                    tracing::warn!(path = %path.display(), "discarding unusable compiled component: {e:#}");
                    let _ = std::fs::remove_file(&path);
                }
            }
        }
        let compiled =
            self.engine
                .precompile_component(wasm)
                .map_err(|e| LoadError::Malformed {
                    phase: phase.into(),
                    message: format!("{e:#}"),
                })?;
        let cache_err = |e: std::io::Error| LoadError::Cache {
            path: path.clone(),
            message: e.to_string(),
        };
        let mut tmp = tempfile::NamedTempFile::new_in(&self.cache_dir).map_err(cache_err)?;
        tmp.write_all(&compiled).map_err(cache_err)?;
        tmp.as_file().sync_all().map_err(cache_err)?;
        tmp.persist(&path).map_err(|e| cache_err(e.error))?;
        // SAFETY: as above; the file was just written from `precompile_component` output.
        let component =
            unsafe { Component::deserialize_file(&self.engine, &path) }.map_err(|e| {
                LoadError::Cache {
                    path: path.clone(),
                    message: format!("{e:#}"),
                }
            })?;
        Ok((component, false))
    }

    /// A linker with WASI's stdio/clocks/random and exactly the world's interfaces.
    fn linker(&self, world_imports: &[&str]) -> wasmtime::Result<Linker<StoreState>> {
        use wasmtime_wasi::cli::{WasiCli, WasiCliView};
        use wasmtime_wasi::p2::bindings::cli;
        let mut l = Linker::new(&self.engine);
        wasmtime_wasi::p2::add_to_linker_proxy_interfaces_sync(&mut l)?;
        cli::exit::add_to_linker::<_, WasiCli>(&mut l, StoreState::cli)?;
        cli::environment::add_to_linker::<_, WasiCli>(&mut l, StoreState::cli)?;
        cli::terminal_input::add_to_linker::<_, WasiCli>(&mut l, StoreState::cli)?;
        cli::terminal_output::add_to_linker::<_, WasiCli>(&mut l, StoreState::cli)?;
        cli::terminal_stdin::add_to_linker::<_, WasiCli>(&mut l, StoreState::cli)?;
        cli::terminal_stdout::add_to_linker::<_, WasiCli>(&mut l, StoreState::cli)?;
        cli::terminal_stderr::add_to_linker::<_, WasiCli>(&mut l, StoreState::cli)?;
        for import in world_imports {
            let name = import.split('@').next().unwrap_or(import);
            match name {
                "nodeward:host/types" => {
                    bindings::types::add_to_linker::<_, HasSelf<PhaseCtx>>(&mut l, caps)?
                }
                "nodeward:host/fs" => {
                    bindings::fs::add_to_linker::<_, HasSelf<PhaseCtx>>(&mut l, caps)?
                }
                "nodeward:host/kernel" => {
                    bindings::kernel::add_to_linker::<_, HasSelf<PhaseCtx>>(&mut l, caps)?
                }
                "nodeward:host/systemd" => {
                    bindings::systemd::add_to_linker::<_, HasSelf<PhaseCtx>>(&mut l, caps)?
                }
                "nodeward:host/mounts" => {
                    bindings::mounts::add_to_linker::<_, HasSelf<PhaseCtx>>(&mut l, caps)?
                }
                "nodeward:host/download" => {
                    bindings::download::add_to_linker::<_, HasSelf<PhaseCtx>>(&mut l, caps)?
                }
                "nodeward:host/log" => {
                    bindings::log::add_to_linker::<_, HasSelf<PhaseCtx>>(&mut l, caps)?
                }
                other => {
                    wasmtime::bail!("world imports {other}, which this host does not implement")
                }
            }
        }
        Ok(l)
    }

    /// Instantiates `loaded` in a fresh store and drops it, without calling it: what every
    /// phase run pays before its code starts (benchmarks use this).
    pub fn instantiate(
        &self,
        loaded: &LoadedPhase,
        caps: PhaseCtx,
        limits: Limits,
    ) -> wasmtime::Result<()> {
        let wasi = WasiCtxBuilder::new().build();
        let mut store = Store::new(
            &self.engine,
            StoreState {
                wasi,
                table: ResourceTable::new(),
                limiter: PhaseLimiter {
                    memory: limits.memory,
                    exceeded: false,
                },
                caps,
            },
        );
        store.limiter(|s| &mut s.limiter);
        store.set_epoch_deadline(limits.deadline.as_millis().div_ceil(TICK.as_millis()) as u64 + 1);
        loaded.pre.instantiate(&mut store).map(|_| ())
    }

    /// Runs `loaded` once with `caps` as its capability state and `input` as its input.
    pub fn run(
        &self,
        loaded: &LoadedPhase,
        caps: PhaseCtx,
        input: &str,
        limits: Limits,
    ) -> Result<PhaseReport, PhaseError> {
        let phase = caps.phase.clone();
        let redactor = caps.session.redactor.clone();
        let stdout = MemoryOutputPipe::new(STDIO_CAPACITY);
        let stderr = MemoryOutputPipe::new(STDIO_CAPACITY);
        let wasi = WasiCtxBuilder::new()
            .stdout(stdout.clone())
            .stderr(stderr.clone())
            .build();
        let mut store = Store::new(
            &self.engine,
            StoreState {
                wasi,
                table: ResourceTable::new(),
                limiter: PhaseLimiter {
                    memory: limits.memory,
                    exceeded: false,
                },
                caps,
            },
        );
        store.limiter(|s| &mut s.limiter);
        let ticks = limits.deadline.as_millis().div_ceil(TICK.as_millis()) as u64 + 1;
        store.set_epoch_deadline(ticks);
        store.epoch_deadline_trap();

        let started = Instant::now();
        let result = loaded
            .pre
            .instantiate(&mut store)
            .and_then(|p| p.nodeward_host_phase().call_run(&mut store, input));
        let elapsed = started.elapsed();

        let stderr_text = redactor.redact(&String::from_utf8_lossy(&stderr.contents()));
        for (stream, text) in [
            (
                "stdout",
                redactor.redact(&String::from_utf8_lossy(&stdout.contents())),
            ),
            ("stderr", stderr_text.clone()),
        ] {
            // Through the phase's log budget: each line bounded, the run's lines capped.
            for line in text.lines().filter(|l| !l.trim().is_empty()) {
                store
                    .data_mut()
                    .caps
                    .guest_line(bindings::log::Level::Info, Some(stream), line);
            }
        }
        tracing::debug!(phase = %phase, elapsed_ms = elapsed.as_millis() as u64, "phase run finished");

        match result {
            Ok(Ok(bindings::Report { summary, changed })) => Ok(PhaseReport {
                summary: redactor.redact(&summary),
                changed,
            }),
            Ok(Err(message)) => Err(PhaseError::Failed {
                phase,
                message: redactor.redact(&message),
            }),
            Err(e) => {
                if store.data().limiter.exceeded {
                    return Err(PhaseError::MemoryLimit {
                        phase,
                        limit: limits.memory,
                    });
                }
                if matches!(e.downcast_ref::<Trap>(), Some(Trap::Interrupt)) {
                    return Err(PhaseError::Timeout {
                        phase,
                        after: limits.deadline,
                    });
                }
                let tail: Vec<&str> = stderr_text.lines().rev().take(5).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                let mut message = redactor.redact(&format!("{e:#}"));
                if !tail.is_empty() {
                    message = format!(
                        "{}; guest stderr: {}",
                        message.lines().next().unwrap_or_default(),
                        tail.join(" | ")
                    );
                }
                Err(PhaseError::Trapped { phase, message })
            }
        }
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
