//! The host-native ("none") mode: a Kubernetes node whose binaries live in versioned
//! directories beneath `opt/nodeward/node` and whose units run on the host's own systemd.
//!
//! - [`version`]: which version directory and artifacts a configuration means;
//! - [`cache`]: what the artifact cache keeps (current and previous version) and its eviction
//!   after a successful bootstrap or upgrade;
//! - [`state`]: the install record, upgrade journal and applied config, and the run lock;
//! - [`health`]: waiting for the kubelet, its TLS bootstrap and the Node Ready;
//! - [`input`]: the phase input every phase of a run is given;
//! - [`decide`]: what bootstrap, upgrade and recovery do, as pure functions of the host's
//!   state (install record, journal, applied config, `current` link);
//! - [`pipeline`]: bootstrap, upgrade, recovery and reset as sequences of phases;
//! - [`preflight`]: the host checks bootstrap and upgrade start with, and `nodeward preflight`;
//! - [`sweep`]: removing what a killed run left, under the lock, before a run writes;
//! - [`status`]: what `nodeward status` reports;
//! - [`traces`]: what a node (or part of one) leaves on a host.
//!
//! The layout itself (every path) is shared with the phases: `nodeward_node_config::layout`.

pub mod cache;
pub mod decide;
pub mod health;
pub mod input;
pub mod pipeline;
pub mod preflight;
pub mod state;
pub mod status;
pub mod sweep;
pub mod traces;
pub mod version;
