//! `nodeward:host/systemd`: unit files and unit lifecycle.
//!
//! # Background
//! Unit files are files beneath the host root (in the run's unit directory, default
//! `etc/systemd/system`), written through [`crate::rootfs::RootFs`] in both modes. The
//! lifecycle verbs (reload, enable, start, ...) go to systemd through the narrow
//! [`UnitManager`] trait: over D-Bus ([`SystemdBus`]) in a real run, or to the in-memory
//! [`RecordingManager`] in tests of this module's plan/apply logic.
//!
//! # Guarantees
//! - Name check, then grant check, before any file or systemd access; then, for every verb
//!   but `status`, the check that the unit is no reserved unit under another name (`aliases`:
//!   a link to one in a unit directory, an `[Install]` section naming one), which reads the
//!   unit directories but not systemd.
//! - Plan mode never calls a verb that changes something: it records the change and reports
//!   `changed`. Only `status` and the plan probes (`would_*`) ask systemd in plan mode (reading
//!   is harmless); `status` reports `unavailable` when systemd cannot be reached.
//! - Apply mode connects on the first lifecycle call ([`SystemdContext::manager`]), so
//!   phases that only write unit files need no bus. Verbs record a change only when systemd
//!   reports one.
//! - Waiting verbs (start, stop, restart) wait at most until the phase deadline.

use super::{Error, Outcome, PhaseCtx, denied};
use crate::grants::UnitVerb;
use crate::hostpath::HostPath;
use crate::plan::{ChangeKind, RunMode};
use crate::wit::systemd::{self, UnitStatus};
use serde_json::json;
use std::sync::{Arc, Mutex};

mod aliases;
pub mod dbus;
pub mod manager;
pub mod recording;
pub use dbus::SystemdBus;
pub use manager::{UnitManager, UnitName, UnitState};
pub use recording::RecordingManager;

/// Where unit files go unless configured otherwise.
pub const DEFAULT_UNIT_DIR: &str = "etc/systemd/system";

/// Makes the connection to systemd the first time a run needs it.
pub type Connector = Box<dyn Fn() -> Result<Arc<dyn UnitManager>, Error> + Send + Sync>;

/// One run's systemd: the unit directory beneath the host root and the connection to systemd.
pub struct SystemdContext {
    /// The systemd unit directory, beneath the root.
    pub unit_dir: HostPath,
    /// Makes the connection (D-Bus by default).
    connect: Connector,
    /// The connection, made on first use (see [`SystemdContext::manager`]).
    manager: Mutex<Option<Arc<dyn UnitManager>>>,
}

impl std::fmt::Debug for SystemdContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SystemdContext")
            .field("unit_dir", &self.unit_dir)
            .field("manager", &self.manager)
            .finish_non_exhaustive()
    }
}

impl Default for SystemdContext {
    /// The default unit directory; systemd over D-Bus ([`SystemdBus::connect`]).
    fn default() -> Self {
        let unit_dir = HostPath::parse(DEFAULT_UNIT_DIR)
            .unwrap_or_else(|_| unreachable!("constant is a valid host path"));
        SystemdContext::with_connector(unit_dir, || {
            Ok(Arc::new(SystemdBus::connect()?) as Arc<dyn UnitManager>)
        })
    }
}

impl SystemdContext {
    /// Units in `unit_dir`, systemd reached through `connect` on first use. Each failed
    /// connect is returned to the caller and tried again on the next call.
    pub fn with_connector(
        unit_dir: HostPath,
        connect: impl Fn() -> Result<Arc<dyn UnitManager>, Error> + Send + Sync + 'static,
    ) -> Self {
        SystemdContext {
            unit_dir,
            connect: Box::new(connect),
            manager: Mutex::new(None),
        }
    }

    /// Units in `unit_dir`, systemd being `manager` (e.g. a [`RecordingManager`] in tests).
    pub fn with_manager(unit_dir: HostPath, manager: Arc<dyn UnitManager>) -> Self {
        let connected = manager.clone();
        let context = SystemdContext::with_connector(unit_dir, move || Ok(connected.clone()));
        *context.manager.lock().unwrap_or_else(|p| p.into_inner()) = Some(manager);
        context
    }

    /// The connection to systemd, made on first use: plan runs and phases that never touch a
    /// unit's lifecycle must work on hosts without a system bus. A failed connect is not kept,
    /// so the next call tries again.
    pub fn manager(&self) -> Result<Arc<dyn UnitManager>, Error> {
        let mut slot = self.manager.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(manager) = slot.as_ref() {
            return Ok(manager.clone());
        }
        let manager = (self.connect)()?;
        *slot = Some(manager.clone());
        Ok(manager)
    }
}

impl PhaseCtx {
    fn unit(&self, unit: &str, verb: UnitVerb) -> Result<UnitName, Error> {
        let name = UnitName::try_from(unit)?;
        if verb != UnitVerb::Status && crate::reserved::is_reserved_unit(name.as_str()) {
            return Err(Error::Denied(format!(
                "{} {}: the agent's own unit is reserved to it (no grant covers it)",
                verb.as_str(),
                name.as_str()
            )));
        }
        if !self.grants.may_unit(verb, name.as_str()) {
            return Err(denied(
                format!("{} {}", verb.as_str(), name.as_str()),
                &format!("systemd.{}", verb.as_str()),
            ));
        }
        if verb != UnitVerb::Status {
            self.not_a_reserved_unit_by_another_name(&name, verb == UnitVerb::Enable)?;
        }
        Ok(name)
    }

    fn unit_file(&self, unit: &UnitName) -> Result<HostPath, Error> {
        self.run
            .systemd
            .unit_dir
            .join(unit.as_str())
            .map_err(|e| Error::InvalidArgument(e.to_string()))
    }

    /// A lifecycle verb: plan mode records `kind` and reports `changed` without asking
    /// systemd; apply mode runs `act` on the connection to systemd and records `kind` when it
    /// reports that something changed.
    fn lifecycle(
        &self,
        kind: ChangeKind,
        act: impl FnOnce(&dyn UnitManager) -> Result<bool, Error>,
    ) -> Result<Outcome, Error> {
        if self.run.files.mode == RunMode::Apply {
            let manager = self.run.systemd.manager()?;
            if !act(manager.as_ref())? {
                return Ok(Outcome::Unchanged);
            }
        }
        self.changed(kind);
        Ok(Outcome::Changed)
    }
}

impl PhaseCtx {
    /// [`PhaseCtx::lifecycle`] whose plan asks systemd, when it is reachable, whether the verb
    /// would change anything (`probe`), so a plan against a running node is empty. When
    /// systemd cannot be reached the plan lists the verb, as it cannot know.
    fn lifecycle_probed(
        &self,
        kind: ChangeKind,
        probe: impl FnOnce(&dyn UnitManager) -> bool,
        act: impl FnOnce(&dyn UnitManager) -> Result<bool, Error>,
    ) -> Result<Outcome, Error> {
        if self.run.files.mode == RunMode::Plan
            && let Ok(manager) = self.run.systemd.manager()
            && !probe(manager.as_ref())
        {
            return Ok(Outcome::Unchanged);
        }
        self.lifecycle(kind, act)
    }
}

impl systemd::Host for PhaseCtx {
    fn write_unit(&mut self, unit: String, contents: String) -> Result<Outcome, Error> {
        let args = json!({ "unit": unit, "bytes": contents.len() });
        self.audited("systemd.write-unit", args, |ctx| {
            let name = ctx.unit(&unit, UnitVerb::Write)?;
            let path = ctx.unit_file(&name)?;
            // The unit directory belongs to this capability: made (0755, with its parents)
            // when a fresh root lacks it, as systemd itself would.
            let unit_dir = ctx.run.systemd.unit_dir.clone();
            ctx.run.files.create_dir(&ctx.phase, &unit_dir, 0o755)?;
            // As `fs.write-file`: a guessed secret in it is answered as a wrong guess.
            let outcome = ctx.write_sent(&path, contents.as_bytes(), contents.as_bytes(), 0o644)?;
            if outcome != Outcome::Unchanged {
                ctx.changed(ChangeKind::UnitWrite {
                    unit: unit.clone(),
                    path: path.to_string(),
                });
            }
            Ok(outcome)
        })
    }

    fn write_drop_in(
        &mut self,
        unit: String,
        name: String,
        contents: String,
    ) -> Result<Outcome, Error> {
        let args = json!({ "unit": unit, "name": name, "bytes": contents.len() });
        self.audited("systemd.write-drop-in", args, |ctx| {
            let unit_name = ctx.unit(&unit, UnitVerb::Write)?;
            if name.is_empty()
                || !name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            {
                return Err(Error::InvalidArgument(format!(
                    "drop-in name {name:?}: letters, digits, '-' and '_' only"
                )));
            }
            let dir = ctx
                .run
                .systemd
                .unit_dir
                .join(&format!("{}.d", unit_name.as_str()))
                .map_err(|e| Error::InvalidArgument(e.to_string()))?;
            let path = dir
                .join(&format!("{name}.conf"))
                .map_err(|e| Error::InvalidArgument(e.to_string()))?;
            ctx.run.files.create_dir(&ctx.phase, &dir, 0o755)?;
            // As `fs.write-file`: a guessed secret in it is answered as a wrong guess.
            let outcome = ctx.write_sent(&path, contents.as_bytes(), contents.as_bytes(), 0o644)?;
            if outcome != Outcome::Unchanged {
                ctx.changed(ChangeKind::UnitWrite {
                    unit: unit.clone(),
                    path: path.to_string(),
                });
            }
            Ok(outcome)
        })
    }

    fn remove_unit(&mut self, unit: String) -> Result<Outcome, Error> {
        self.audited("systemd.remove-unit", json!({ "unit": unit }), |ctx| {
            let name = ctx.unit(&unit, UnitVerb::Write)?;
            let file = ctx.unit_file(&name)?;
            let dropins = ctx
                .run
                .systemd
                .unit_dir
                .join(&format!("{}.d", name.as_str()))
                .map_err(|e| Error::InvalidArgument(e.to_string()))?;
            let mut outcome = ctx.run.files.remove(&ctx.phase, &file)?;
            if ctx.run.files.is_dir(&dropins)? {
                for (entry, _) in ctx.run.files.list(&dropins)? {
                    let p = dropins
                        .join(&entry)
                        .map_err(|e| Error::InvalidArgument(e.to_string()))?;
                    ctx.run.files.remove(&ctx.phase, &p)?;
                }
                ctx.run.files.remove(&ctx.phase, &dropins)?;
                outcome = Outcome::Removed;
            }
            if outcome == Outcome::Removed {
                ctx.changed(ChangeKind::UnitRemove { unit: unit.clone() });
            }
            Ok(outcome)
        })
    }

    fn daemon_reload(&mut self) -> Result<(), Error> {
        self.audited("systemd.daemon-reload", json!({}), |ctx| {
            if !ctx.grants.systemd.reload {
                return Err(denied("daemon-reload", "systemd.reload"));
            }
            ctx.lifecycle(ChangeKind::DaemonReload, |systemd| {
                systemd.reload().map(|()| true)
            })
            .map(|_| ())
        })
    }

    fn enable(&mut self, unit: String) -> Result<Outcome, Error> {
        self.audited("systemd.enable", json!({ "unit": unit }), |ctx| {
            let name = ctx.unit(&unit, UnitVerb::Enable)?;
            ctx.lifecycle_probed(
                ChangeKind::UnitEnable { unit: unit.clone() },
                |systemd| systemd.would_enable(&name),
                |systemd| systemd.enable(&name),
            )
        })
    }

    fn disable(&mut self, unit: String) -> Result<Outcome, Error> {
        self.audited("systemd.disable", json!({ "unit": unit }), |ctx| {
            let name = ctx.unit(&unit, UnitVerb::Enable)?;
            ctx.lifecycle_probed(
                ChangeKind::UnitDisable { unit: unit.clone() },
                |systemd| systemd.would_disable(&name),
                |systemd| systemd.disable(&name),
            )
        })
    }

    fn start(&mut self, unit: String) -> Result<Outcome, Error> {
        self.audited("systemd.start", json!({ "unit": unit }), |ctx| {
            let name = ctx.unit(&unit, UnitVerb::Start)?;
            let deadline = ctx.deadline;
            ctx.lifecycle_probed(
                ChangeKind::UnitStart { unit: unit.clone() },
                |systemd| systemd.would_start(&name),
                |systemd| systemd.start(&name, deadline),
            )
        })
    }

    fn stop(&mut self, unit: String) -> Result<Outcome, Error> {
        self.audited("systemd.stop", json!({ "unit": unit }), |ctx| {
            let name = ctx.unit(&unit, UnitVerb::Start)?;
            let deadline = ctx.deadline;
            ctx.lifecycle_probed(
                ChangeKind::UnitStop { unit: unit.clone() },
                |systemd| systemd.would_stop(&name),
                |systemd| systemd.stop(&name, deadline),
            )
        })
    }

    fn restart(&mut self, unit: String) -> Result<Outcome, Error> {
        self.audited("systemd.restart", json!({ "unit": unit }), |ctx| {
            let name = ctx.unit(&unit, UnitVerb::Start)?;
            let deadline = ctx.deadline;
            ctx.lifecycle(ChangeKind::UnitRestart { unit: unit.clone() }, |systemd| {
                systemd.restart(&name, deadline).map(|()| true)
            })
        })
    }

    fn reset_failed(&mut self, unit: String) -> Result<(), Error> {
        self.audited("systemd.reset-failed", json!({ "unit": unit }), |ctx| {
            let name = ctx.unit(&unit, UnitVerb::Start)?;
            ctx.lifecycle(
                ChangeKind::UnitResetFailed { unit: unit.clone() },
                |systemd| systemd.reset_failed(&name),
            )
            .map(|_| ())
        })
    }

    fn mask(&mut self, unit: String) -> Result<Outcome, Error> {
        self.audited("systemd.mask", json!({ "unit": unit }), |ctx| {
            let name = ctx.unit(&unit, UnitVerb::Mask)?;
            ctx.lifecycle(ChangeKind::UnitMask { unit: unit.clone() }, |systemd| {
                systemd.mask(&name)
            })
        })
    }

    fn unmask(&mut self, unit: String) -> Result<Outcome, Error> {
        self.audited("systemd.unmask", json!({ "unit": unit }), |ctx| {
            let name = ctx.unit(&unit, UnitVerb::Mask)?;
            ctx.lifecycle(ChangeKind::UnitUnmask { unit: unit.clone() }, |systemd| {
                systemd.unmask(&name)
            })
        })
    }

    fn status(&mut self, unit: String) -> Result<UnitStatus, Error> {
        self.audited("systemd.status", json!({ "unit": unit }), |ctx| {
            let name = ctx.unit(&unit, UnitVerb::Status)?;
            let state = ctx.run.systemd.manager()?.status(&name)?;
            Ok(UnitStatus {
                load_state: state.load_state,
                active_state: state.active_state,
                sub_state: state.sub_state,
                main_pid: state.main_pid,
            })
        })
    }
}

#[cfg(test)]
mod tests;
