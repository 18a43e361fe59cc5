//! In-memory fakes of the API server and the mode for the unit tests of a reconcile pass
//! (`reconcile_tests.rs`, `config_map_tests.rs`). The real API server is exercised by the
//! cluster tests.

use super::*;
use crate::daemon::ledger::LedgerError;
use crate::daemon::status::{Bootstrap, Bundle, Update};
use k8s_openapi::api::core::v1::ConfigMap;
use nodeward_api::machine::ActiveBundle;
use nodeward_api::machine::ConfigSource;
use nodeward_api::operation::{MachineOperationSpec, MachineRef, OperationKind};
use nodeward_node_config::NodeConfig;
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;

pub(super) fn at(rfc3339: &str) -> Time {
    serde_json::from_value(serde_json::Value::String(rfc3339.into())).expect("a time")
}

pub(super) const NOW: &str = "2026-12-01T10:00:00Z";

/// An API server in memory: objects by name, a resourceVersion per write, and a number of
/// writes to refuse with 409 (as a concurrent writer would cause).
#[derive(Default)]
pub(super) struct FakeApi {
    pub(super) machines: RefCell<BTreeMap<String, Machine>>,
    pub(super) operations: RefCell<BTreeMap<String, MachineOperation>>,
    pub(super) conflicts_to_inject: Cell<u32>,
    pub(super) writes: Cell<u32>,
    pub(super) unreachable: Cell<bool>,
    /// ConfigMaps by `namespace/name`.
    pub(super) config_maps: RefCell<BTreeMap<String, ConfigMap>>,
}

/// The next resourceVersion, as the API server moves an object on at each write.
pub(super) fn bump(resource_version: &mut Option<String>) {
    let v: u64 = resource_version
        .as_deref()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    *resource_version = Some((v + 1).to_string());
}

impl FakeApi {
    fn check(&self) -> Result<(), ApiError> {
        if self.unreachable.get() {
            return Err(ApiError::Unreachable("connection refused".into()));
        }
        Ok(())
    }

    /// Refuses the write with 409 while conflicts are to be injected (and moves the stored
    /// object on, as the concurrent writer did).
    fn conflict(&self) -> bool {
        let n = self.conflicts_to_inject.get();
        if n > 0 {
            self.conflicts_to_inject.set(n - 1);
            return true;
        }
        false
    }
}

impl MachineApi for FakeApi {
    async fn machine(&self, name: &str) -> Result<Option<Machine>, ApiError> {
        self.check()?;
        Ok(self.machines.borrow().get(name).cloned())
    }
    async fn replace_machine_status(&self, machine: &Machine) -> Result<Machine, ApiError> {
        self.check()?;
        let mut all = self.machines.borrow_mut();
        let name = machine.metadata.name.clone().expect("named");
        let stored = all.get_mut(&name).ok_or(ApiError::Refused("404".into()))?;
        if self.conflict() {
            bump(&mut stored.metadata.resource_version);
        }
        if stored.metadata.resource_version != machine.metadata.resource_version {
            return Err(ApiError::Conflict);
        }
        stored.status = machine.status.clone();
        bump(&mut stored.metadata.resource_version);
        self.writes.set(self.writes.get() + 1);
        Ok(stored.clone())
    }
    async fn operation(&self, name: &str) -> Result<Option<MachineOperation>, ApiError> {
        self.check()?;
        Ok(self.operations.borrow().get(name).cloned())
    }
    async fn replace_operation_status(
        &self,
        op: &MachineOperation,
    ) -> Result<MachineOperation, ApiError> {
        self.check()?;
        let mut all = self.operations.borrow_mut();
        let name = op.metadata.name.clone().expect("named");
        let stored = all.get_mut(&name).ok_or(ApiError::Refused("404".into()))?;
        if self.conflict() {
            bump(&mut stored.metadata.resource_version);
        }
        if stored.metadata.resource_version != op.metadata.resource_version {
            return Err(ApiError::Conflict);
        }
        stored.status = op.status.clone();
        bump(&mut stored.metadata.resource_version);
        self.writes.set(self.writes.get() + 1);
        Ok(stored.clone())
    }
    async fn delete_operation(&self, name: &str) -> Result<(), ApiError> {
        self.check()?;
        self.operations.borrow_mut().remove(name);
        Ok(())
    }
    async fn config_map(&self, ns: &str, name: &str) -> Result<Option<ConfigMap>, ApiError> {
        self.check()?;
        Ok(self
            .config_maps
            .borrow()
            .get(&format!("{ns}/{name}"))
            .cloned())
    }
}

/// A mode that reports a ready node and records the acts asked of it.
#[derive(Default)]
pub(super) struct FakeMode {
    pub(super) acts: RefCell<Vec<&'static str>>,
    pub(super) fail: Cell<bool>,
    /// The spec differs from the node (a repave is asked for).
    pub(super) drift: Cell<bool>,
    /// The last repave failed with this (reported until the test clears it).
    pub(super) repave_failed: RefCell<Option<String>>,
    /// The spec names a bundle not rolled out yet.
    pub(super) bundle_due: Cell<bool>,
    /// The last roll-out was rolled back with this.
    pub(super) rolled_back: RefCell<Option<String>>,
    /// The node config the last outcome was measured against, when inline.
    pub(super) seen_inline: RefCell<Option<NodeConfig>>,
}

impl ModeOperator for FakeMode {
    async fn outcome(&self, machine: &Machine) -> Outcome {
        if let Some(ConfigSource::Inline(c)) = &machine.spec.config {
            *self.seen_inline.borrow_mut() = Some((**c).clone());
        }
        Outcome {
            generation: machine.metadata.generation,
            bootstrap: Bootstrap::Done,
            update: match (&*self.repave_failed.borrow(), &machine.spec.config) {
                (Some(e), _) => Update::Failed(e.clone()),
                // As `resolve::base`: a reference the pass left is one it could not read.
                (None, Some(ConfigSource::ConfigMapRef(_))) => {
                    Update::ConfigUnreadable("not read".into())
                }
                (None, _) => Update::UpToDate,
            },
            bundle: match (&*self.rolled_back.borrow(), self.bundle_due.get()) {
                (Some(e), _) => Bundle::RolledBack(e.clone()),
                (None, true) => Bundle::Installing("queued".into()),
                (None, false) => Bundle::Active(ActiveBundle {
                    name: "default".into(),
                    version: 1,
                    digest: "c".repeat(64),
                }),
            },
            repave: self.drift.get().then(|| "kubernetesVersion 1.35.0".into()),
            roll_out: (self.bundle_due.get() && self.rolled_back.borrow().is_none())
                .then(|| "the spec names bundle archive sha256 ee…".into()),
            repaving: false,
            active_bundle: None,
            audit_head: None,
        }
    }
    async fn roll_out(&self, _machine: &Machine) -> Result<String, OperatorError> {
        self.acts.borrow_mut().push("roll-out");
        if self.fail.get() {
            *self.rolled_back.borrow_mut() = Some("kubelet not healthy; rolled back".into());
            return Err(OperatorError("kubelet not healthy; rolled back".into()));
        }
        self.bundle_due.set(false);
        Ok("bundle current; node healthy".into())
    }
    async fn repave(&self, _machine: &Machine) -> Result<String, OperatorError> {
        self.acts.borrow_mut().push("repave");
        if self.fail.get() {
            *self.repave_failed.borrow_mut() = Some("the upgrade was rolled back".into());
            return Err(OperatorError("the upgrade was rolled back".into()));
        }
        self.drift.set(false);
        Ok("upgraded".into())
    }
    async fn recover(&self) -> Result<String, OperatorError> {
        self.acts.borrow_mut().push("recover");
        Ok("nothing to recover".into())
    }
    async fn restart_node(&self) -> Result<String, OperatorError> {
        self.acts.borrow_mut().push("restart");
        if self.fail.get() {
            return Err(OperatorError("containerd did not start".into()));
        }
        Ok("containerd and kubelet restarted; Node Ready".into())
    }
    async fn reset_node(&self) -> Result<String, OperatorError> {
        self.acts.borrow_mut().push("reset");
        Ok("node removed".into())
    }
}

pub(super) fn with_machine(name: &str) -> FakeApi {
    let api = FakeApi::default();
    let mut m = crate::daemon::test_machine(name, "1.34.1");
    m.metadata.generation = Some(4);
    m.metadata.resource_version = Some("1".into());
    api.machines.borrow_mut().insert(name.into(), m);
    api
}

/// The ledger in memory.
#[derive(Default)]
pub(super) struct MemLedger(pub(super) RefCell<BTreeMap<String, Mark>>);

impl Ledger for MemLedger {
    fn mark_of(&self, uid: &str) -> Result<Option<Mark>, LedgerError> {
        Ok(self.0.borrow().get(uid).cloned())
    }
    fn record(&self, uid: &str, _name: &str, mark: &Mark) -> Result<(), LedgerError> {
        self.0.borrow_mut().insert(uid.into(), mark.clone());
        Ok(())
    }
}

pub(super) fn add_op(api: &FakeApi, name: &str, machine: &str, kind: OperationKind) {
    let mut op = MachineOperation::new(
        name,
        MachineOperationSpec {
            machine_ref: MachineRef {
                name: machine.into(),
            },
            kind,
            ttl_seconds_after_finished: Some(0),
        },
    );
    op.metadata.resource_version = Some("1".into());
    op.metadata.uid = Some(format!("uid-{name}"));
    api.operations.borrow_mut().insert(name.into(), op);
}

pub(super) fn op_status(api: &FakeApi, name: &str) -> MachineOperationStatus {
    api.operations.borrow()[name]
        .status
        .clone()
        .expect("a status")
}
