//! What one phase run may use: a deadline, one memory budget, and caps on what it is made of.
//!
//! # Background
//! wasmtime asks a store's [`ResourceLimiter`] before it creates or grows any linear memory or
//! table, and reads from it how many core instances, memories and tables the store may hold.
//! Each phase run has a store of its own, so a `PhaseLimiter` there is a budget per run.
//!
//! # Guarantees
//! - One budget per run: the bytes of every linear memory of every core instance, plus
//!   [`TABLE_ELEMENT_BYTES`] per element of every table, stay within [`Limits::memory`]. A
//!   component cannot multiply the budget by holding many memories (issue 10: 8 memories of
//!   60 MiB each ran under a 64 MiB cap that was applied per memory).
//! - At most [`MAX_INSTANCES`] core instances, [`MAX_MEMORIES`] memories and [`MAX_TABLES`]
//!   tables per run: bounds the host's bookkeeping and the virtual address space reserved per
//!   run (each memory reserves its `Config::memory_reservation` of address space, not of RAM).
//! - Wasm frames get at most [`MAX_WASM_STACK`] bytes of the calling thread's stack.
//! - What one capability call's arguments make the host allocate as it lifts them from guest
//!   memory (its strings and lists, as the host holds them) is at most
//!   [`Limits::hostcall_bytes`]: the run's memory budget, and never more than
//!   [`MAX_HOSTCALL_BYTES`] (20 MiB). Without this, the bound is wasmtime's default hostcall
//!   fuel (128 MiB) whatever the budget, and a guest can name one region of its memory many
//!   times (a list of requests whose strings all point at one buffer), so what the host
//!   copies is not bounded by the guest's memory (a 1 MiB guest could make the host copy
//!   128 MiB per call); the resource limiter sees only guest memory. With it, the agent's
//!   memory under a guest is at most the guest's limit, one call's 20 MiB, the audit record's
//!   copy of its string arguments (as much again, before the record bounds them) and the
//!   agent's own (about 15 MiB): within the budget of the limit + 64 MiB. Past it the call is not made and the run
//!   stops (a trap).
//! - Going past the budget, a cap or the stack stops the run with a typed `PhaseError`; the
//!   runtime stays usable.
//!
//! # Caveats
//! The budget counts what the guest can make wasmtime allocate for it; host-side memory that
//! capability calls use is bounded by each capability. Each shipped phase (a Rust
//! wasm32-wasip2 component) has 3 core instances, 1 memory and 2 tables, far below the caps.
//!
//! Address space is not RAM: wasmtime's default `Config::memory_reservation` (4 GiB plus a
//! 32 MiB guard per memory on x86_64) is reserved inaccessible and costs no memory until the
//! budget lets the guest grow into it, so the defaults stay (explicit bounds checks would slow
//! every access); the memory count cap bounds the reservations of one run (about 16 GiB). Runs
//! are synchronous, on the calling thread's stack (no async fiber stacks), which is why the
//! wasm stack limit must stay well below the agent's thread stack (8 MiB on the main thread).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;
use wasmtime::{Engine, ResourceLimiter};

/// How often the epoch ticker advances; the deadline's resolution.
pub(crate) const TICK: Duration = Duration::from_millis(10);

/// Bytes one table element counts for in the memory budget: wasmtime keeps a `funcref` or
/// `externref` element as one pointer, 8 bytes on the 64-bit hosts nodeward runs on.
pub const TABLE_ELEMENT_BYTES: usize = 8;
/// The most core module instances one run may create (a Rust wasm32-wasip2 component has a
/// handful: the program, the WASI adapter and its shims).
pub const MAX_INSTANCES: usize = 32;
/// The most linear memories one run may define (a Rust component has one).
pub const MAX_MEMORIES: usize = 4;
/// The most tables one run may define.
pub const MAX_TABLES: usize = 16;
/// The most of the calling thread's stack wasm frames may use (part of the engine's
/// configuration, shared with build.rs).
pub use super::engine_config::MAX_WASM_STACK;

/// The most bytes one capability call's arguments may make the host allocate when they are
/// lifted from guest memory (wasmtime's hostcall fuel, per call): the largest argument any
/// call acts on (`fs.write-file`'s 16 MiB of contents) and room for the rest, so a call
/// passing somewhat more than it acts on is still answered (a 16 MB log line is cut to its
/// prefix, length and sha256; a 16 MiB + 1 `fs.write-file` is `invalid-argument`). Not
/// wasmtime's default 128 MiB: the agent's memory under a guest must stay within the guest's
/// limit + 64 MiB, and one call's arguments are copied on top of the guest's own memory, then
/// their strings once more into the call's audit arguments.
pub const MAX_HOSTCALL_BYTES: usize = 20 << 20;

/// The most bytes one `wasi:random` call (`get-random-bytes`, `get-insecure-random-bytes`)
/// may ask for; a larger request stops the run (a trap). The host makes the bytes before the
/// guest's memory takes them, so wasmtime's default (64 MiB) would let any phase push the
/// agent 64 MiB past its memory limit per call; a phase needs a few keys' worth at most.
pub const MAX_RANDOM_BYTES: u64 = 1 << 20;

/// The most WASI resources (streams, pollables, terminal handles) one run holds in the host's
/// table at once; creating one more fails the call (a trap). Each costs the host memory
/// beside the guest's; a phase needs a handful (wasmtime-wasi allows 1,000,000).
pub const MAX_WASI_RESOURCES: usize = 4096;

/// The most component-model handles one run holds live at once (wasmtime's default 100,000):
/// each is host memory the guest's budget does not see. Past it the allocation traps.
pub const MAX_COMPONENT_HANDLES: usize = 4096;

/// Per-run limits.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// How long one phase run may take, guest and host calls together.
    pub deadline: Duration,
    /// The run's memory budget in bytes: all linear memories plus all tables (at
    /// [`TABLE_ELEMENT_BYTES`] per element) of the run together.
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

impl Limits {
    /// The most bytes one capability call's arguments may make the host allocate as it lifts
    /// them: the memory budget, at most [`MAX_HOSTCALL_BYTES`] (a guest's own arguments lie in
    /// its memory, so only a guest naming one region many times needs more).
    pub fn hostcall_bytes(&self) -> usize {
        self.memory.min(MAX_HOSTCALL_BYTES)
    }

    /// The deadline in epoch ticks, with one tick of slack so a run is never cut short.
    pub(crate) fn deadline_ticks(&self) -> u64 {
        u64::try_from(self.deadline.as_millis().div_ceil(TICK.as_millis()))
            .unwrap_or(u64::MAX)
            .saturating_add(1)
    }
}

/// One run's memory budget, shared by all its memories and tables, and its count caps.
/// Remembers whether the budget stopped the run so the error can say so.
pub(crate) struct PhaseLimiter {
    budget: usize,
    /// Bytes granted so far: memories plus tables.
    used: usize,
    /// The bytes of the last grant, given back when wasmtime then fails the growth itself.
    last_grant: usize,
    /// Whether a request went over the budget.
    pub(crate) exceeded: bool,
}

impl PhaseLimiter {
    pub(crate) fn new(budget: usize) -> Self {
        PhaseLimiter {
            budget,
            used: 0,
            last_grant: 0,
            exceeded: false,
        }
    }

    /// Grants `more` bytes from the budget, or refuses the request (which stops the run).
    fn grant(&mut self, more: usize, what: &str) -> wasmtime::Result<bool> {
        let total = self.used.saturating_add(more);
        if total > self.budget {
            self.exceeded = true;
            return Err(wasmtime::Error::msg(format!(
                "memory limit of {} bytes exceeded: {what} wanted {more} more bytes with {} \
                 already in use",
                self.budget, self.used
            )));
        }
        self.used = total;
        self.last_grant = more;
        Ok(true)
    }

    fn give_back_last(&mut self) {
        self.used = self.used.saturating_sub(self.last_grant);
        self.last_grant = 0;
    }
}

impl ResourceLimiter for PhaseLimiter {
    /// Called with `current == 0` when a memory is created, and on every `memory.grow`.
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        self.grant(desired.saturating_sub(current), "a linear memory")
    }

    fn memory_grow_failed(&mut self, _error: wasmtime::Error) -> wasmtime::Result<()> {
        self.give_back_last();
        Ok(())
    }

    /// Called with `current == 0` when a table is created, and on every `table.grow`; sizes
    /// are in elements.
    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let elements = desired.saturating_sub(current);
        self.grant(elements.saturating_mul(TABLE_ELEMENT_BYTES), "a table")
    }

    fn table_grow_failed(&mut self, _error: wasmtime::Error) -> wasmtime::Result<()> {
        self.give_back_last();
        Ok(())
    }

    fn instances(&self) -> usize {
        MAX_INSTANCES
    }

    fn memories(&self) -> usize {
        MAX_MEMORIES
    }

    fn tables(&self) -> usize {
        MAX_TABLES
    }
}

/// Which count cap an instantiation error reports, if any. wasmtime (pinned at 48.0.8)
/// reports a count over [`ResourceLimiter::instances`] and its siblings only as the message
/// "resource limit exceeded: {instance|memory|table} count too high at N";
/// `tests/limits.rs` fails when that changes.
pub(crate) fn count_limit(error: &wasmtime::Error) -> Option<(&'static str, usize)> {
    let message = format!("{error:#}");
    let rest = message.split("resource limit exceeded: ").nth(1)?;
    [
        ("instance", "instances", MAX_INSTANCES),
        ("memory", "memories", MAX_MEMORIES),
        ("table", "tables", MAX_TABLES),
    ]
    .into_iter()
    .find(|(desc, _, _)| rest.starts_with(&format!("{desc} count too high")))
    .map(|(_, what, limit)| (what, limit))
}

/// Advances the engine's epoch once per [`TICK`] of real time until dropped: the epoch counts
/// elapsed ticks, not the ticker's rounds, so a ticker thread that oversleeps (a loaded host)
/// catches up instead of letting every deadline drift later.
pub(crate) struct EpochTicker {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl EpochTicker {
    pub(crate) fn start(engine: Engine) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("nodeward-epoch".into())
            .spawn(move || {
                let start = std::time::Instant::now();
                let mut ticks: u128 = 0;
                while !flag.load(Ordering::Relaxed) {
                    std::thread::sleep(TICK);
                    let due = start.elapsed().as_millis() / TICK.as_millis();
                    while ticks < due {
                        engine.increment_epoch();
                        ticks += 1;
                    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memories_and_tables_share_one_budget() {
        let mut l = PhaseLimiter::new(10 << 20);
        assert!(
            l.memory_growing(0, 4 << 20, None)
                .expect("first memory fits")
        );
        assert!(
            l.memory_growing(0, 4 << 20, None)
                .expect("second memory fits")
        );
        // 1 MiB of table elements: 131072 elements of 8 bytes.
        assert!(l.table_growing(0, 1 << 17, None).expect("table fits"));
        let err = l
            .memory_growing(4 << 20, 6 << 20, None)
            .expect_err("9 MiB used, 2 more exceed 10");
        assert!(l.exceeded);
        assert!(err.to_string().contains("10485760 bytes exceeded"), "{err}");
    }

    #[test]
    fn a_failed_growth_gives_its_bytes_back() {
        let mut l = PhaseLimiter::new(8 << 20);
        assert!(l.memory_growing(0, 6 << 20, None).expect("fits"));
        l.memory_grow_failed(wasmtime::Error::msg("mmap failed"))
            .expect("not fatal");
        assert!(
            l.memory_growing(0, 8 << 20, None)
                .expect("the 6 MiB came back")
        );
        assert!(!l.exceeded);
    }

    #[test]
    fn count_errors_are_named() {
        let e = wasmtime::Error::msg("resource limit exceeded: memory count too high at 5");
        assert_eq!(count_limit(&e), Some(("memories", MAX_MEMORIES)));
        let e = wasmtime::Error::msg("resource limit exceeded: instance count too high at 33");
        assert_eq!(count_limit(&e), Some(("instances", MAX_INSTANCES)));
        assert_eq!(count_limit(&wasmtime::Error::msg("out of bounds")), None);
    }
}
