//! nodeward: a Kubernetes node agent whose every host change is a WebAssembly phase.
//!
//! # Background
//! A node agent changes a host in many small, dangerous ways. nodeward splits the work: this
//! crate is the small trusted host runtime. It implements typed capabilities (`wit/*.wit`),
//! checks every call a phase makes against the grants its bundle manifest gives it, records or
//! performs the change, and writes an audit record. The provisioning logic lives in phase
//! components (`guest-phases/`), built for wasm32-wasip2 by `build.rs` and embedded as the
//! default bundle.
//!
//! # Modules, in the order a run touches them
//! - [`cli`]: the `nodeward` command line: parses, calls the library, prints.
//! - [`config`]: loading the node configuration document.
//! - [`bundle`]: phase bundles: manifest, digests, archives, signatures, the installed store
//!   (current, last-good), install and rollback, selection, pack, diffs, the embedded default.
//! - [`daemon`]: `nodeward daemon` (first slice): the start decision (exit 69), backoff with
//!   jitter, and sd_notify; the Kubernetes client and reconcile loop come next.
//! - [`node`]: none mode: the phase input, the bootstrap/upgrade/recovery decisions, the
//!   pipelines that carry them out, node state and status.
//! - [`preflight`]: the read-only host checks `nodeward preflight` prints and `bootstrap` and
//!   `upgrade` run first (kubeadm-style names, `--ignore-preflight-errors`).
//! - [`offline`]: air-gapped installs: the offline archive (`nodeward offline pack`) and its
//!   use by `--offline FILE`.
//! - [`bootstrap_report`]: the bootstrap status reporter: `nodeward bootstrap` tells its
//!   Machine (`AgentBootstrapped`) with the bootstrap token, before the daemon can.
//! - [`runtime`]: the wasmtime engine, compiled-component cache, deadlines and memory caps.
//! - [`session`]: one plan or apply run over a bundle's phases against a host root.
//! - [`bootstrap_kubeconfig`]: the bootstrap kubeconfig the host renders from the node config
//!   before a phase that is told its path runs, so no phase decides where the token goes.
//! - [`caps`]: one module per WIT interface; each checks the grant first, then acts.
//! - [`fetch`]: the download engine behind the `download` capability (HTTP, cache, tarballs).
//! - [`plan`]: the typed change list both modes produce, and plan mode's overlay.
//! - [`grants`], [`hostpath`], [`audit`]: the pieces every capability uses.
//! - [`durable`]: the one way files and links are replaced (temp file, fsync, rename), the
//!   sweep of what a killed run left, and the lock of a mutating run.
//! - [`secrets`]: the run's secrets; the host substitutes them for references in granted
//!   files, so no phase ever holds one.

pub mod audit;
pub mod bootstrap_kubeconfig;
pub mod bootstrap_report;
pub mod bundle;
pub mod caps;
pub mod cli;
pub mod config;
pub mod daemon;
pub mod digest;
pub mod durable;
pub mod errors;
pub mod grants;
pub mod hostpath;
pub mod node;
pub mod offline;
pub mod plan;
pub mod preflight;
pub mod reserved;
pub mod rootfs;
pub mod runtime;
pub mod secrets;
pub mod session;
pub mod test_hooks;
pub mod wit;

/// What `build.rs` produced: the default bundle, the built components, the WIT worlds.
pub mod built {
    include!(concat!(env!("OUT_DIR"), "/built.rs"));
}

/// The WIT package every phase is built against.
pub const WIT_PACKAGE: &str = "nodeward:host@0.1.0";
