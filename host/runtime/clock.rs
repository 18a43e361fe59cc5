//! `wasi:clocks/monotonic-clock` for phases: wasmtime-wasi's, with every wait a phase asks for
//! ended by the phase's deadline.
//!
//! # Background
//! The epoch deadline stops a phase only while its wasm code runs. A guest that subscribes to
//! a long duration and blocks on it (`std::thread::sleep`, or `subscribe-duration(u64::MAX)`
//! then `pollable.block`, which wasmtime-wasi turns into a wait that never ends) waits inside
//! a host call, on the run's thread: the deadline would never fire, and the run (with the node
//! lock it holds) would hang for as long as the guest asked.
//!
//! # Guarantees
//! - `subscribe-duration` and `subscribe-instant` wait at most until 20 ms past the run's
//!   deadline ([`crate::caps::PhaseCtx::deadline`], which the runtime sets no later than the
//!   run's own limit); the guest returns to wasm then, and the epoch deadline stops it (a
//!   timeout). Shorter waits are unchanged.
//! - `now` and `resolution` are wasmtime-wasi's own.

use super::StoreState;
use std::time::Instant;
use wasmtime::component::{HasData, Linker, Resource};
use wasmtime_wasi::clocks::{WasiClocksCtxView, WasiClocksView as _};
use wasmtime_wasi::p2::DynPollable;
use wasmtime_wasi::p2::bindings::clocks::monotonic_clock;

/// The monotonic clock a phase sees: wasmtime-wasi's, with waits bounded by `deadline`.
pub struct PhaseClock<'a> {
    clocks: WasiClocksCtxView<'a>,
    deadline: Instant,
}

impl PhaseClock<'_> {
    /// `nanos`, at most what is left until just past the deadline: two epoch ticks past it, so
    /// that the epoch deadline has fired when the guest is back in wasm.
    fn bounded(&self, nanos: u64) -> u64 {
        let end = self
            .deadline
            .checked_add(2 * super::limits::TICK)
            .unwrap_or(self.deadline);
        let left = end.saturating_duration_since(Instant::now());
        nanos.min(u64::try_from(left.as_nanos()).unwrap_or(u64::MAX))
    }
}

impl monotonic_clock::Host for PhaseClock<'_> {
    fn now(&mut self) -> wasmtime::Result<monotonic_clock::Instant> {
        monotonic_clock::Host::now(&mut self.clocks)
    }

    fn resolution(&mut self) -> wasmtime::Result<monotonic_clock::Duration> {
        monotonic_clock::Host::resolution(&mut self.clocks)
    }

    fn subscribe_instant(
        &mut self,
        when: monotonic_clock::Instant,
    ) -> wasmtime::Result<Resource<DynPollable>> {
        let now = monotonic_clock::Host::now(&mut self.clocks)?;
        let nanos = self.bounded(when.saturating_sub(now));
        monotonic_clock::Host::subscribe_duration(&mut self.clocks, nanos)
    }

    fn subscribe_duration(
        &mut self,
        duration: monotonic_clock::Duration,
    ) -> wasmtime::Result<Resource<DynPollable>> {
        let nanos = self.bounded(duration);
        monotonic_clock::Host::subscribe_duration(&mut self.clocks, nanos)
    }
}

/// [`HasData`] for [`PhaseClock`].
struct PhaseClocks;

impl HasData for PhaseClocks {
    type Data<'a> = PhaseClock<'a>;
}

fn phase_clock(state: &mut StoreState) -> PhaseClock<'_> {
    let deadline = state.caps.deadline;
    PhaseClock {
        clocks: state.clocks(),
        deadline,
    }
}

/// Links [`PhaseClock`] as `wasi:clocks/monotonic-clock`, in place of the one
/// `add_to_linker_proxy_interfaces_sync` linked.
pub fn link(linker: &mut Linker<StoreState>) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    let linked = monotonic_clock::add_to_linker::<_, PhaseClocks>(linker, phase_clock);
    linker.allow_shadowing(false);
    linked
}
