//! `nodeward daemon` (issue 14, part 2): keeps this node as its `Machine` says and carries out
//! the `MachineOperation`s that name it (`docs/daemon.md`).
//!
//! # Background
//! The daemon is a systemd service (`deploy/nodeward.service`, `Type=notify`, watchdog, exit 69
//! a clean stop) that watches its own Machine on the API server and reconciles it one pass at a
//! time: one reconcile pass over two traits (the API server, the node's mode), the kube client
//! behind the first, the none mode behind the second, and the loop that drives passes from
//! watch events; repaves and bundle roll-outs are child runs. Self-upgrade comes next
//! (`docs/daemon.md`).
//!
//! # Modules
//! - [`child`]: the `nodeward` child runs the daemon makes every change with, bounded, with
//!   the watchdog fed meanwhile, dying with the daemon.
//! - [`start`]: whether the daemon may start on this host, or steps aside with exit 69.
//! - [`backoff`]: exponential backoff with full jitter when the API server is unreachable,
//!   and the jittered resync period.
//! - [`notify`]: `READY=1`, `STATUS=` and `WATCHDOG=1` to systemd (sd_notify(3)).
//! - [`status`]: the Machine's conditions and phase from the outcome of a reconcile pass.
//! - [`operation`]: what the daemon does with a MachineOperation, and its status.
//! - [`reconcile`]: one pass (status written with 409s retried, one operation carried out) over
//!   the API server ([`reconcile::MachineApi`]) and the node's mode
//!   ([`reconcile::ModeOperator`], seed 002's per-mode operator).
//! - [`metrics`]: Prometheus metrics (reconciles by result, duration, last success, the
//!   active bundle) on a loopback endpoint.
//! - [`ledger`]: the operations this node started and finished, by uid, and how each ended,
//!   in its own state: an operation runs at most once whatever its status on the API server
//!   says, and reaches its final status whatever point a kill cut the daemon at.
//! - [`kube_api`]: [`reconcile::MachineApi`] over kube's client, every request bounded.
//! - [`none_mode`]: [`reconcile::ModeOperator`] for none mode: the node measured from its
//!   state files, changed by `nodeward restart|reset` child runs.
//! - [`rollout`]: the phase bundle roll-out (`spec.phaseBundle`): its record, when it is due,
//!   which phases changed; `none_rollout` carries it out with child runs.
//! - [`run_metrics`]: the phase durations and capability calls of the child runs, read from
//!   the audit trail they wrote, for the metrics.
//! - [`resolve`]: the node config a Machine's spec asks for (base config, spec fields over
//!   it), compared with the applied config to find drift.
//! - [`schedule`]: when the next pass runs (events, resync, a failed pass's backoff) and
//!   when a failing watch is polled again.
//! - [`watch`]: the loop: the start decision, both watches, serialized passes, resync,
//!   backoff, signals, `READY=1` and `WATCHDOG=1`.

pub mod backoff;
pub mod child;
pub mod config_map;
pub mod kube_api;
pub mod ledger;
pub mod metrics;
pub mod none_mode;
mod none_rollout;
pub mod notify;
pub mod operation;
pub mod reconcile;
pub mod resolve;
pub mod rollout;
pub mod run_metrics;
pub mod schedule;
pub mod start;
pub mod status;
pub mod watch;

pub use start::DEFERRED_EXIT_CODE;

/// The systemd unit that runs the daemon (`deploy/nodeward.service`), built into the binary so
/// that a first-boot install (`scripts/install.sh`, cloud-init, Ignition) needs nothing but the
/// binary: `nodeward unit` prints it. Its exit-status lines are pinned to
/// [`DEFERRED_EXIT_CODE`] by `start`'s tests.
pub const UNIT_FILE: &str = include_str!("../../deploy/nodeward.service");

/// A Machine `name` whose spec asks only for Kubernetes `version` (the unit tests' Machine).
#[cfg(test)]
pub(crate) fn test_machine(name: &str, version: &str) -> nodeward_api::Machine {
    nodeward_api::Machine::new(
        name,
        nodeward_api::MachineSpec {
            kubernetes_version: version.into(),
            mode: None,
            config: None,
            artifacts: Default::default(),
            labels: Default::default(),
            taints: None,
            agent: None,
            phase_bundle: None,
        },
    )
}
