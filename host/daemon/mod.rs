//! `nodeward daemon` (issue 14, part 2): keeps this node as its `Machine` says and carries out
//! the `MachineOperation`s that name it (`docs/daemon.md`).
//!
//! # Background
//! The daemon is a systemd service (`deploy/nodeward.service`, `Type=notify`, watchdog, exit 69
//! a clean stop) that watches its own Machine on the API server and reconciles it one pass at a
//! time. This first slice holds the parts that need no Kubernetes client and decide how the
//! daemon behaves as a service; the client, the reconcile loop, status and operations come
//! next (CHANGELOG).
//!
//! # Modules
//! - [`start`]: whether the daemon may start on this host, or steps aside with exit 69.
//! - [`backoff`]: exponential backoff with full jitter when the API server is unreachable,
//!   and the jittered resync period.
//! - [`notify`]: `READY=1`, `STATUS=` and `WATCHDOG=1` to systemd (sd_notify(3)).

pub mod backoff;
pub mod notify;
pub mod start;

pub use start::DEFERRED_EXIT_CODE;
