//! The only `bindgen!` call: host-side bindings for the `nodeward:host` WIT package.
//!
//! Generated from world `probe`, the union of every capability interface, so one set of `Host`
//! traits covers every phase world; which interfaces a given phase can reach is decided when
//! its linker is built (see `runtime`), not here. Imports are plain (non-trappable): every
//! capability failure is a typed WIT `error` returned to the guest.

mod generated {
    wasmtime::component::bindgen!({
        path: "wit",
        world: "probe",
    });
}

pub use generated::Probe as PhaseComponent;
pub use generated::ProbePre as PhaseComponentPre;
pub use generated::exports::nodeward::host::phase::Report;
pub use generated::nodeward::host::types::{Error, Outcome};
pub use generated::nodeward::host::{download, fs, kernel, log, mounts, systemd, types};
