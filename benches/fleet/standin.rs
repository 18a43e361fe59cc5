//! The fleet bench's node: a **stand-in** [`ModeOperator`] that makes no host change.
//!
//! Everything else in the bench is the daemon's own code (the loop of
//! `host/daemon/watch.rs`, `KubeApi`, the status it writes); only the node behind it is a
//! stand-in, since 200 real nodes do not fit on one VM and a fleet's load on the API server
//! does not depend on what the node does between requests. It reports what a healthy none-mode
//! node reports (bootstrapped, up to date, its bundle active), so each pass reads the Machine
//! and writes its status as a real daemon would, and it records when a pass asked about each
//! generation of each Machine: the spec change → reconcile latency.
//!
//! # Guarantees
//! - No node operation runs: repave, roll-out, recovery, restart and reset are refused (the
//!   outcome never asks for the first two, and the bench creates no MachineOperation).

use nodeward::daemon::reconcile::{ModeOperator, OperatorError};
use nodeward::daemon::status::{Bootstrap, Bundle, Outcome, Update};
use nodeward_api::Machine;
use nodeward_api::machine::ActiveBundle;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

/// One pass of one agent: the generation it measured, and when.
struct Seen {
    agent: usize,
    generation: i64,
    at: Instant,
}

/// Every pass of every agent, shared with the bench's main thread.
#[derive(Clone, Default)]
pub struct Passes(Arc<Mutex<Vec<Seen>>>);

impl Passes {
    fn push(&self, seen: Seen) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(seen);
    }

    /// When `agent` first measured `generation` or a later one, if it did.
    pub fn first_at_least(&self, agent: usize, generation: i64) -> Option<Instant> {
        let all = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        all.iter()
            .filter(|s| s.agent == agent && s.generation >= generation)
            .map(|s| s.at)
            .min()
    }

    /// Passes so far, all agents.
    pub fn count(&self) -> usize {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).len()
    }
}

/// The stand-in node of agent `agent` (see the module docs).
pub struct StandIn {
    /// The agent's index (its Machine is `fleet-<index>`).
    pub agent: usize,
    /// Where its passes are recorded.
    pub passes: Passes,
}

const REFUSED: &str = "the fleet bench's stand-in node makes no host change";

impl ModeOperator for StandIn {
    async fn outcome(&self, machine: &Machine) -> Outcome {
        let generation = machine.metadata.generation;
        self.passes.push(Seen {
            agent: self.agent,
            generation: generation.unwrap_or(0),
            at: Instant::now(),
        });
        Outcome {
            generation,
            bootstrap: Bootstrap::Done,
            update: Update::UpToDate,
            bundle: Bundle::Active(ActiveBundle {
                name: "fleet-stand-in".into(),
                version: 1,
                digest: "0".repeat(64),
            }),
            active_bundle: None,
            repave: None,
            roll_out: None,
            repaving: false,
            audit_head: None,
        }
    }

    async fn repave(&self, _: &Machine) -> Result<String, OperatorError> {
        Err(OperatorError(REFUSED.into()))
    }

    async fn roll_out(&self, _: &Machine) -> Result<String, OperatorError> {
        Err(OperatorError(REFUSED.into()))
    }

    async fn recover(&self) -> Result<String, OperatorError> {
        Err(OperatorError(REFUSED.into()))
    }

    async fn restart_node(&self) -> Result<String, OperatorError> {
        Err(OperatorError(REFUSED.into()))
    }

    async fn reset_node(&self) -> Result<String, OperatorError> {
        Err(OperatorError(REFUSED.into()))
    }
}
