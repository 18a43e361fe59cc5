//! `nodeward:host/systemd`: unit files and unit lifecycle.
//!
//! # Background
//! Unit files are files beneath the host root (in the run's unit directory, default
//! `etc/systemd/system`), written through [`crate::rootfs`] in both modes. The lifecycle verbs
//! (reload, enable, start, ...) talk to systemd over D-Bus.
//!
//! # Guarantees
//! - Name check, then grant check, before any file or bus access.
//! - Plan mode never touches the bus for a verb that changes something: it records the change
//!   and reports `changed`. Only `status` asks systemd in plan mode (reading is harmless), and
//!   reports `unavailable` when there is no bus.
//! - Apply mode connects on the first lifecycle call ([`SystemdContext::bus`]), so
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

pub mod dbus;
pub use dbus::SystemdBus;

/// Where unit files go unless configured otherwise.
pub const DEFAULT_UNIT_DIR: &str = "etc/systemd/system";

/// One run's systemd: the unit directory beneath the host root and the bus connection.
#[derive(Debug)]
pub struct SystemdContext {
    /// The systemd unit directory, beneath the root.
    pub unit_dir: HostPath,
    /// The D-Bus connection, made on first use (see [`SystemdContext::bus`]).
    bus: Mutex<Option<Arc<SystemdBus>>>,
}

impl Default for SystemdContext {
    fn default() -> Self {
        SystemdContext {
            unit_dir: HostPath::parse(DEFAULT_UNIT_DIR)
                .unwrap_or_else(|_| unreachable!("constant is a valid host path")),
            bus: Mutex::new(None),
        }
    }
}

impl SystemdContext {
    /// The connection to systemd, made on first use: plan runs and phases that never touch a
    /// unit's lifecycle must work on hosts without a system bus. A failed connect is not kept,
    /// so the next call tries again.
    pub fn bus(&self) -> Result<Arc<SystemdBus>, Error> {
        let mut slot = self.bus.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(bus) = slot.as_ref() {
            return Ok(bus.clone());
        }
        let bus = Arc::new(SystemdBus::connect()?);
        *slot = Some(bus.clone());
        Ok(bus)
    }
}

/// A unit name valid by systemd's rules: `prefix.type`, at most 255 bytes, characters
/// `[A-Za-z0-9:_.\-@]`, a known unit type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnitName(String);

const UNIT_TYPES: &[&str] = &[
    "service",
    "socket",
    "device",
    "mount",
    "automount",
    "swap",
    "target",
    "path",
    "timer",
    "slice",
    "scope",
];

impl TryFrom<&str> for UnitName {
    type Error = Error;

    fn try_from(s: &str) -> Result<Self, Error> {
        let bad = |why: &str| Err(Error::InvalidArgument(format!("unit name {s:?}: {why}")));
        if s.is_empty() || s.len() > 255 {
            return bad("must be 1 to 255 bytes");
        }
        if !s
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b":_.-@\\".contains(&b))
        {
            return bad("may only contain letters, digits and : _ . - @ \\");
        }
        let Some((prefix, ty)) = s.rsplit_once('.') else {
            return bad("has no .type suffix");
        };
        if prefix.is_empty() || prefix.starts_with('@') {
            return bad("has an empty name before the type");
        }
        if !UNIT_TYPES.contains(&ty) {
            return bad("has an unknown unit type");
        }
        if s.matches('@').count() > 1 {
            return bad("has more than one @");
        }
        Ok(UnitName(s.to_string()))
    }
}

impl UnitName {
    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl PhaseCtx {
    fn unit(&self, unit: &str, verb: UnitVerb) -> Result<UnitName, Error> {
        let name = UnitName::try_from(unit)?;
        if !self.grants.may_unit(verb, name.as_str()) {
            return Err(denied(
                format!("{} {}", verb.as_str(), name.as_str()),
                &format!("systemd.{}", verb.as_str()),
            ));
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

    /// A lifecycle verb: plan mode records `kind` and reports `changed` without touching the
    /// bus; apply mode runs `act` on the systemd connection and records `kind` when it reports
    /// that something changed.
    fn lifecycle(
        &self,
        kind: ChangeKind,
        act: impl FnOnce(&SystemdBus) -> Result<bool, Error>,
    ) -> Result<Outcome, Error> {
        if self.run.files.mode == RunMode::Apply {
            let bus = self.run.systemd.bus()?;
            if !act(&bus)? {
                return Ok(Outcome::Unchanged);
            }
        }
        self.record(kind);
        Ok(Outcome::Changed)
    }
}

impl PhaseCtx {
    /// [`PhaseCtx::lifecycle`] whose plan asks systemd, when it is reachable, whether the verb
    /// would change anything (`probe`), so a plan against a running node is empty. Without a
    /// bus the plan lists the verb, as it cannot know.
    fn lifecycle_probed(
        &self,
        kind: ChangeKind,
        probe: impl FnOnce(&SystemdBus) -> bool,
        act: impl FnOnce(&SystemdBus) -> Result<bool, Error>,
    ) -> Result<Outcome, Error> {
        if self.run.files.mode == RunMode::Plan
            && let Ok(bus) = self.run.systemd.bus()
            && !probe(&bus)
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
            let outcome = ctx.run.files.write_file(
                &ctx.phase,
                &path,
                contents.as_bytes(),
                0o644,
                ctx.deadline,
            )?;
            if outcome != Outcome::Unchanged {
                ctx.record(ChangeKind::UnitWrite {
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
            let outcome = ctx.run.files.write_file(
                &ctx.phase,
                &path,
                contents.as_bytes(),
                0o644,
                ctx.deadline,
            )?;
            if outcome != Outcome::Unchanged {
                ctx.record(ChangeKind::UnitWrite {
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
                ctx.record(ChangeKind::UnitRemove { unit: unit.clone() });
            }
            Ok(outcome)
        })
    }

    fn daemon_reload(&mut self) -> Result<(), Error> {
        self.audited("systemd.daemon-reload", json!({}), |ctx| {
            if !ctx.grants.systemd.reload {
                return Err(denied("daemon-reload", "systemd.reload"));
            }
            ctx.lifecycle(ChangeKind::DaemonReload, |bus| bus.reload().map(|()| true))
                .map(|_| ())
        })
    }

    fn enable(&mut self, unit: String) -> Result<Outcome, Error> {
        self.audited("systemd.enable", json!({ "unit": unit }), |ctx| {
            let name = ctx.unit(&unit, UnitVerb::Enable)?;
            ctx.lifecycle_probed(
                ChangeKind::UnitEnable { unit: unit.clone() },
                |bus| bus.would_enable(&name),
                |bus| bus.enable(&name),
            )
        })
    }

    fn disable(&mut self, unit: String) -> Result<Outcome, Error> {
        self.audited("systemd.disable", json!({ "unit": unit }), |ctx| {
            let name = ctx.unit(&unit, UnitVerb::Enable)?;
            ctx.lifecycle_probed(
                ChangeKind::UnitDisable { unit: unit.clone() },
                |bus| bus.would_disable(&name),
                |bus| bus.disable(&name),
            )
        })
    }

    fn start(&mut self, unit: String) -> Result<Outcome, Error> {
        self.audited("systemd.start", json!({ "unit": unit }), |ctx| {
            let name = ctx.unit(&unit, UnitVerb::Start)?;
            let deadline = ctx.deadline;
            ctx.lifecycle_probed(
                ChangeKind::UnitStart { unit: unit.clone() },
                |bus| bus.would_start(&name),
                |bus| bus.start(&name, deadline),
            )
        })
    }

    fn stop(&mut self, unit: String) -> Result<Outcome, Error> {
        self.audited("systemd.stop", json!({ "unit": unit }), |ctx| {
            let name = ctx.unit(&unit, UnitVerb::Start)?;
            let deadline = ctx.deadline;
            ctx.lifecycle_probed(
                ChangeKind::UnitStop { unit: unit.clone() },
                |bus| bus.would_stop(&name),
                |bus| bus.stop(&name, deadline),
            )
        })
    }

    fn restart(&mut self, unit: String) -> Result<Outcome, Error> {
        self.audited("systemd.restart", json!({ "unit": unit }), |ctx| {
            let name = ctx.unit(&unit, UnitVerb::Start)?;
            let deadline = ctx.deadline;
            ctx.lifecycle(ChangeKind::UnitRestart { unit: unit.clone() }, |bus| {
                bus.restart(&name, deadline).map(|()| true)
            })
        })
    }

    fn reset_failed(&mut self, unit: String) -> Result<(), Error> {
        self.audited("systemd.reset-failed", json!({ "unit": unit }), |ctx| {
            let name = ctx.unit(&unit, UnitVerb::Start)?;
            ctx.lifecycle(ChangeKind::UnitResetFailed { unit: unit.clone() }, |bus| {
                bus.reset_failed(&name)
            })
            .map(|_| ())
        })
    }

    fn mask(&mut self, unit: String) -> Result<Outcome, Error> {
        self.audited("systemd.mask", json!({ "unit": unit }), |ctx| {
            let name = ctx.unit(&unit, UnitVerb::Mask)?;
            ctx.lifecycle(ChangeKind::UnitMask { unit: unit.clone() }, |bus| {
                bus.mask(&name)
            })
        })
    }

    fn unmask(&mut self, unit: String) -> Result<Outcome, Error> {
        self.audited("systemd.unmask", json!({ "unit": unit }), |ctx| {
            let name = ctx.unit(&unit, UnitVerb::Mask)?;
            ctx.lifecycle(ChangeKind::UnitUnmask { unit: unit.clone() }, |bus| {
                bus.unmask(&name)
            })
        })
    }

    fn status(&mut self, unit: String) -> Result<UnitStatus, Error> {
        self.audited("systemd.status", json!({ "unit": unit }), |ctx| {
            let name = ctx.unit(&unit, UnitVerb::Status)?;
            let state = ctx.run.systemd.bus()?.status(&name)?;
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
mod test_valid_unit_name {
    use super::*;

    #[test]
    fn accepts_systemd_names() {
        for ok in [
            "kubelet.service",
            "containerd.service",
            "getty@tty1.service",
            "kube-pods.slice",
            "a:b_c.mount",
        ] {
            assert!(UnitName::try_from(ok).is_ok(), "{ok}");
        }
    }

    #[test]
    fn refuses_bad_names() {
        for bad in [
            "",
            "kubelet",
            "kubelet.exe",
            ".service",
            "../x.service",
            "a/b.service",
            "a b.service",
            "a@b@c.service",
        ] {
            assert!(UnitName::try_from(bad).is_err(), "{bad:?}");
        }
        assert!(UnitName::try_from(format!("{}.service", "a".repeat(300)).as_str()).is_err());
    }
}
