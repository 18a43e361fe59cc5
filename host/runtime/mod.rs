//! The wasmtime runtime: one engine, a compiled-component cache, per-world linkers, limits.
//!
//! # Background
//! Compiling a component takes tens of milliseconds; loading a precompiled one takes a tenth of
//! a millisecond (research/wasm-spike.md). So the embedded bundle's components come
//! precompiled in the binary ([`embedded`]), any other component is compiled once, cached on
//! disk keyed by sha256(wasm) and the engine's compatibility hash, and loaded with
//! `Component::deserialize_file` afterwards; the resulting `InstancePre` is reused in-process.
//!
//! # Modules
//! - this one: the engine, loading (compile, check, link) and running a phase;
//! - [`engine_config`]: the engine's configuration, shared with build.rs;
//! - [`clock`]: the monotonic clock phases see, whose waits end at the phase's deadline;
//! - [`encoding`]: the check that a component passes its strings as UTF-8;
//! - [`embedded`]: the embedded bundle's components, precompiled at build time;
//! - [`worlds`]: which worlds a runtime admits, the import check, the `phase` export's type;
//! - [`limits`]: the deadline, the one memory budget per run, the count and stack caps;
//! - [`cache`]: the on-disk cache of compiled components;
//! - [`error`]: [`LoadError`] and [`PhaseError`].
//!
//! # Guarantees
//! - Nothing of a component runs before it is verified: the bundle checks its sha256, the
//!   compiler validates it, and [`Runtime::load`] refuses a world it does not admit, imports
//!   beyond the declared world (and any WASI filesystem or sockets import) and a `phase` export
//!   of the wrong type, all before instantiation.
//! - A runtime made with [`Runtime::new`] (the CLI's) admits only the shipped phase worlds;
//!   only [`Runtime::new_admitting_test_worlds`] (tests, benchmarks) admits the test worlds.
//! - Guests get only their world's `nodeward:host` interfaces plus WASI stdio, clocks, random
//!   and an empty environment: no preopened directories, no env vars, no args, no sockets.
//!   Every WASI interface the import check admits is linked.
//! - Each run has a deadline (epoch interruption, one ticker thread per runtime), one memory
//!   budget for all its memories and tables, caps on its instances, memories and tables, and
//!   a wasm stack limit; exceeding any is a typed [`PhaseError`] and the runtime stays usable.

pub mod cache;
mod clock;
mod embedded;
mod encoding;
mod engine_config;
pub mod error;
pub mod limits;
pub mod worlds;

pub use error::{LoadError, PhaseError};
pub use limits::Limits;
pub use worlds::{AdmittedWorlds, check_imports, is_production_world};

use crate::caps::PhaseCtx;
use crate::wit::{self, PhaseComponentPre};
use cache::Cache;
use embedded::Embedded;
use limits::{EpochTicker, PhaseLimiter};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Instant;
use wasmtime::component::{HasSelf, Linker, ResourceTable};
use wasmtime::{Engine, Store};
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

/// How much guest stdout/stderr is kept per run.
const STDIO_CAPACITY: usize = 256 * 1024;

/// A loaded phase, ready to instantiate.
#[derive(Clone)]
pub struct LoadedPhase {
    pre: PhaseComponentPre<StoreState>,
    /// The component's imports, as wasmtime reports them.
    pub imports: Vec<String>,
    /// Where its compiled code came from.
    pub origin: Origin,
}

/// Where a loaded component's compiled code came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// Precompiled at build time, embedded in the binary (the embedded bundle).
    Embedded,
    /// The on-disk cache of compiled components.
    Cache,
    /// Compiled now (and written to the on-disk cache).
    Compiled,
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

/// The engine, its cache and its linkers. One per process.
pub struct Runtime {
    engine: Engine,
    cache: Cache,
    embedded: Embedded,
    worlds: AdmittedWorlds,
    linkers: Mutex<HashMap<String, Linker<StoreState>>>,
    loaded: Mutex<HashMap<(String, String), LoadedPhase>>,
    _ticker: EpochTicker,
}

impl Runtime {
    /// A runtime whose compiled components are cached in `cache_dir` (created 0700). It loads
    /// components for the shipped phase worlds only: this is the CLI's runtime.
    pub fn new(cache_dir: &Path) -> Result<Self, LoadError> {
        Self::with_worlds(cache_dir, AdmittedWorlds::Production)
    }

    /// A runtime that also loads components for the test package's worlds (`tests/wit`:
    /// `probe`, `pure`), so the test suite and the benchmarks can drive their guests through
    /// the real boundary. The CLI never makes one, and no bundle can declare a test world (its
    /// manifest is refused), so a test world never runs in production. An explicit
    /// constructor rather than a cargo feature: features unify across one build, and would
    /// reach the `nodeward` binary the CLI tests run.
    pub fn new_admitting_test_worlds(cache_dir: &Path) -> Result<Self, LoadError> {
        Self::with_worlds(cache_dir, AdmittedWorlds::WithTestWorlds)
    }

    fn with_worlds(cache_dir: &Path, worlds: AdmittedWorlds) -> Result<Self, LoadError> {
        let engine = engine_config::engine_config(env!("NODEWARD_TARGET"))
            .and_then(|config| Engine::new(&config))
            .map_err(|e| LoadError::Cache {
                path: cache_dir.to_path_buf(),
                message: format!("cannot create the wasmtime engine: {e:#}"),
            })?;
        let cache = Cache::open(&engine, cache_dir)?;
        Ok(Runtime {
            _ticker: EpochTicker::start(engine.clone()),
            embedded: Embedded::for_engine(&engine),
            engine,
            cache,
            worlds,
            linkers: Mutex::new(HashMap::new()),
            loaded: Mutex::new(HashMap::new()),
        })
    }

    /// This runtime, compiling (or loading from the on-disk cache) the embedded bundle's
    /// components too instead of using their precompiled forms: for benchmarks of compiling,
    /// and tests of the fallback.
    pub fn without_embedded_precompiled(mut self) -> Self {
        self.embedded = Embedded::none();
        self
    }

    /// How many precompiled components of the embedded bundle this runtime's engine can use
    /// (0 when build.rs precompiled for another engine, or precompiled nothing).
    pub fn embedded_precompiled(&self) -> usize {
        self.embedded.len()
    }

    /// The engine (for benchmarks and tests).
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Which worlds this runtime loads components for.
    pub fn admitted_worlds(&self) -> AdmittedWorlds {
        self.worlds
    }

    /// The cache file a component with digest `sha256` compiles to.
    pub fn cache_path(&self, sha256: &str) -> PathBuf {
        self.cache.path(sha256)
    }

    /// The compiled-component cache directory.
    pub fn cache_dir(&self) -> &Path {
        self.cache.dir()
    }

    /// Compiles (or loads from the cache) the component `wasm` with digest `sha256`, checks its
    /// imports against `world` and the type of its `phase` export, and pre-instantiates it.
    /// The digest MUST already be verified.
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
        let world_imports = self.worlds.imports(phase, world)?;
        encoding::check_utf8_only(phase, wasm)?;
        let (component, origin) = match self.embedded.load(&self.engine, sha256) {
            Some(c) => (c, Origin::Embedded),
            None => match self.cache.compile(&self.engine, phase, wasm, sha256)? {
                (c, true) => (c, Origin::Cache),
                (c, false) => (c, Origin::Compiled),
            },
        };

        let component_type = component.component_type();
        let imports: Vec<String> = component_type
            .imports(&self.engine)
            .map(|(name, _)| name.to_string())
            .collect();
        self.worlds.check_imports(phase, world, &imports)?;
        worlds::check_phase_export(&self.engine, &component_type, phase)?;

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
            origin,
        };
        self.loaded
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, loaded.clone());
        Ok(loaded)
    }

    /// A linker with every WASI interface of [`worlds::WASI_ALLOWED`] and exactly the world's
    /// `nodeward:host` interfaces.
    fn linker(&self, world_imports: &[&str]) -> wasmtime::Result<Linker<StoreState>> {
        use wasmtime_wasi::cli::{WasiCli, WasiCliView};
        use wasmtime_wasi::p2::bindings::{cli, random};
        use wasmtime_wasi::random::WasiRandom;
        let mut l = Linker::new(&self.engine);
        // wasi:io, wall and monotonic clocks, random/random, cli stdin/stdout/stderr.
        wasmtime_wasi::p2::add_to_linker_proxy_interfaces_sync(&mut l)?;
        // ... except the monotonic clock, whose waits must end at the phase's deadline.
        clock::link(&mut l)?;
        // std's `HashMap::new()` seeds itself from random/insecure-seed.
        random::insecure::add_to_linker::<_, WasiRandom>(&mut l, |s: &mut StoreState| {
            s.wasi.random()
        })?;
        random::insecure_seed::add_to_linker::<_, WasiRandom>(&mut l, |s: &mut StoreState| {
            s.wasi.random()
        })?;
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
                    wit::types::add_to_linker::<_, HasSelf<PhaseCtx>>(&mut l, caps)?
                }
                "nodeward:host/fs" => wit::fs::add_to_linker::<_, HasSelf<PhaseCtx>>(&mut l, caps)?,
                "nodeward:host/kernel" => {
                    wit::kernel::add_to_linker::<_, HasSelf<PhaseCtx>>(&mut l, caps)?
                }
                "nodeward:host/systemd" => {
                    wit::systemd::add_to_linker::<_, HasSelf<PhaseCtx>>(&mut l, caps)?
                }
                "nodeward:host/mounts" => {
                    wit::mounts::add_to_linker::<_, HasSelf<PhaseCtx>>(&mut l, caps)?
                }
                "nodeward:host/download" => {
                    wit::download::add_to_linker::<_, HasSelf<PhaseCtx>>(&mut l, caps)?
                }
                "nodeward:host/network" => {
                    wit::network::add_to_linker::<_, HasSelf<PhaseCtx>>(&mut l, caps)?
                }
                "nodeward:host/cgroups" => {
                    wit::cgroups::add_to_linker::<_, HasSelf<PhaseCtx>>(&mut l, caps)?
                }
                "nodeward:host/log" => {
                    wit::log::add_to_linker::<_, HasSelf<PhaseCtx>>(&mut l, caps)?
                }
                other => {
                    wasmtime::bail!("world imports {other}, which this host does not implement")
                }
            }
        }
        Ok(l)
    }

    /// A fresh store for one run: its own WASI context, budget and deadline.
    fn store(&self, wasi: WasiCtx, mut caps: PhaseCtx, limits: Limits) -> Store<StoreState> {
        // The run ends at its limit if the caller's deadline is later: capability calls and
        // the clock's waits (`clock`) end there too, not only the guest's own code.
        // (A limit too far off to be an instant leaves the caller's deadline, itself one.)
        if let Some(end) = Instant::now().checked_add(limits.deadline) {
            caps.deadline = caps.deadline.min(end);
        }
        let mut table = ResourceTable::new();
        table.set_max_capacity(limits::MAX_WASI_RESOURCES);
        let mut store = Store::new(
            &self.engine,
            StoreState {
                wasi,
                table,
                limiter: PhaseLimiter::new(limits.memory),
                caps,
            },
        );
        store.limiter(|s| &mut s.limiter);
        store.set_hostcall_fuel(limits.hostcall_bytes());
        store.set_max_component_handles(limits::MAX_COMPONENT_HANDLES);
        store.set_epoch_deadline(limits.deadline_ticks());
        store
    }

    /// Instantiates `loaded` in a fresh store and drops it, without calling it: what every
    /// phase run pays before its code starts (benchmarks use this).
    pub fn instantiate(
        &self,
        loaded: &LoadedPhase,
        caps: PhaseCtx,
        limits: Limits,
    ) -> wasmtime::Result<()> {
        let wasi = WasiCtxBuilder::new()
            .max_random_size(limits::MAX_RANDOM_BYTES)
            .build();
        let mut store = self.store(wasi, caps, limits);
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
        let redactor = caps.run.redactor.clone();
        let stdout = MemoryOutputPipe::new(STDIO_CAPACITY);
        let stderr = MemoryOutputPipe::new(STDIO_CAPACITY);
        let wasi = WasiCtxBuilder::new()
            .max_random_size(limits::MAX_RANDOM_BYTES)
            .stdout(stdout.clone())
            .stderr(stderr.clone())
            .build();
        let mut store = self.store(wasi, caps, limits);
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
                    .guest_line(wit::log::Level::Info, Some(stream), line);
            }
        }
        tracing::debug!(phase = %phase, elapsed_ms = elapsed.as_millis() as u64, "phase run finished");

        // A run whose guest answered after its own limit (a wait the clock ended at the
        // deadline, then a return with no epoch check on the way) timed out all the same. Only
        // the run's own limit: a caller's earlier deadline ends the capability calls and the
        // clock's waits, which the phase is told of (`timeout`) and may report itself.
        if result.is_ok() && elapsed > limits.deadline {
            return Err(PhaseError::Timeout {
                phase,
                after: limits.deadline,
            });
        }
        match result {
            Ok(Ok(wit::Report { summary, changed })) => Ok(PhaseReport {
                summary: redactor.redact(&summary),
                changed,
            }),
            Ok(Err(message)) => Err(PhaseError::Failed {
                phase,
                message: redactor.redact(&message),
            }),
            Err(e) => Err(error::run_error(
                phase,
                &e,
                store.data().limiter.exceeded,
                limits,
                &stderr_text,
                |m| redactor.redact(m),
            )),
        }
    }
}
