//! The WIT boundary as Rust: the only `bindgen!` call (host-side bindings for the
//! `nodeward:host` WIT package) and the constructors of its typed errors.
//!
//! Generated from `all-capabilities`, a world declared inline here (not in `wit/`), that
//! imports every capability interface and exports `phase`: one set of `Host` traits covers
//! every phase world, and which interfaces a given phase can reach is decided when its linker
//! is built (see `runtime`), not here. Being outside `wit/`, this world is not a phase world:
//! no bundle can declare it. Imports are plain (non-trappable): every capability failure is a
//! typed WIT `error` returned to the guest.

mod generated {
    wasmtime::component::bindgen!({
        path: "wit",
        inline: "
            package nodeward:host-bindings;

            world all-capabilities {
                import nodeward:host/types@0.1.0;
                import nodeward:host/fs@0.1.0;
                import nodeward:host/kernel@0.1.0;
                import nodeward:host/systemd@0.1.0;
                import nodeward:host/mounts@0.1.0;
                import nodeward:host/download@0.1.0;
                import nodeward:host/network@0.1.0;
                import nodeward:host/cgroups@0.1.0;
                import nodeward:host/log@0.1.0;
                export nodeward:host/phase@0.1.0;
            }
        ",
        world: "all-capabilities",
    });
}

pub use generated::AllCapabilities as PhaseComponent;
pub use generated::AllCapabilitiesPre as PhaseComponentPre;
pub use generated::exports::nodeward::host::phase::Report;
pub use generated::nodeward::host::types::{Error, Outcome};
pub use generated::nodeward::host::{
    cgroups, download, fs, kernel, log, mounts, network, systemd, types,
};

/// `denied` naming what was asked and which grant is missing.
pub fn denied(what: impl std::fmt::Display, grant: &str) -> Error {
    Error::Denied(format!("{what}: not covered by the phase's {grant} grant"))
}

/// `denied` for a call on `what` that reaches `reserved`, a path reserved to the agent
/// ([`crate::reserved`]): no grant covers it.
pub fn reserved_denied(
    what: impl std::fmt::Display,
    reserved: &crate::hostpath::HostPath,
) -> Error {
    Error::Denied(format!(
        "{what}: reaches {reserved}, which is reserved to the agent (no grant covers it)"
    ))
}

/// A validated host path or `invalid-argument`.
pub fn host_path(s: &str) -> Result<crate::hostpath::HostPath, Error> {
    crate::hostpath::HostPath::parse(s).map_err(|e| Error::InvalidArgument(e.to_string()))
}
