//! An in-memory [`UnitManager`] that records every call: [`RecordingManager`].
//!
//! # Background
//! The capability's plan/apply logic (which verb is called in which mode, which change is
//! recorded, what reaches the phase when systemd fails) is tested against this manager, in
//! this crate's unit tests and in anyone's integration tests (hence public). It keeps a unit
//! table (unit file present, enabled, masked, active) that the verbs change as systemd would,
//! records each call in order, and can be told to fail a given call.
//!
//! # Caveats
//! It models systemd only as far as the capability's logic needs: no jobs, no dependencies,
//! no deadlines (an injected [`Error::Timeout`] stands for a job that outlives the phase), no
//! link to the unit files on disk. A test against it proves our logic, never our assumptions
//! about systemd: those are tested against a real systemd (`tests/caps_systemd.rs`).

use super::manager::{UnitManager, UnitName, UnitState};
use crate::wit::Error;
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Instant;

/// One [`UnitManager`] method.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// [`UnitManager::reload`].
    Reload,
    /// [`UnitManager::enable`].
    Enable,
    /// [`UnitManager::would_enable`].
    WouldEnable,
    /// [`UnitManager::disable`].
    Disable,
    /// [`UnitManager::would_disable`].
    WouldDisable,
    /// [`UnitManager::mask`].
    Mask,
    /// [`UnitManager::unmask`].
    Unmask,
    /// [`UnitManager::reset_failed`].
    ResetFailed,
    /// [`UnitManager::start`].
    Start,
    /// [`UnitManager::would_start`].
    WouldStart,
    /// [`UnitManager::stop`].
    Stop,
    /// [`UnitManager::would_stop`].
    WouldStop,
    /// [`UnitManager::restart`].
    Restart,
    /// [`UnitManager::status`].
    Status,
}

impl Op {
    /// Whether the method may change systemd's state: the verbs, not the plan probes
    /// (`would_*`) nor `status`. Plan mode must never call one.
    pub fn is_mutating(self) -> bool {
        !matches!(
            self,
            Op::WouldEnable | Op::WouldDisable | Op::WouldStart | Op::WouldStop | Op::Status
        )
    }
}

/// One recorded call: the method and its unit (none for [`Op::Reload`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Call {
    /// The method.
    pub op: Op,
    /// The unit it was called for.
    pub unit: Option<String>,
}

impl Call {
    /// A call of `op` for `unit`.
    pub fn new(op: Op, unit: &str) -> Self {
        Call {
            op,
            unit: Some(unit.to_string()),
        }
    }
}

/// Whether a unit runs, as far as the capability cares.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Activity {
    /// `active/running`.
    Active,
    /// `inactive/dead`.
    #[default]
    Inactive,
    /// `failed/failed`.
    Failed,
}

/// One unit in the table. The default is a unit file with an `[Install]` section, disabled,
/// not masked and inactive.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnitEntry {
    /// Whether a unit file exists (a masked unit may have none).
    pub file: bool,
    /// Whether the file has an `[Install]` section (else it is `static`: nothing to enable).
    pub installable: bool,
    /// Whether its install links exist.
    pub enabled: bool,
    /// Whether it is linked to `/dev/null`.
    pub masked: bool,
    /// Whether it runs.
    pub activity: Activity,
    /// The main process reported while it is active.
    pub main_pid: u32,
}

impl Default for UnitEntry {
    fn default() -> Self {
        UnitEntry {
            file: true,
            installable: true,
            enabled: false,
            masked: false,
            activity: Activity::Inactive,
            main_pid: 0,
        }
    }
}

impl UnitEntry {
    /// An enabled and running unit, as on a node that was bootstrapped.
    pub fn running() -> Self {
        UnitEntry {
            enabled: true,
            activity: Activity::Active,
            main_pid: 4242,
            ..UnitEntry::default()
        }
    }
}

/// A failure to return from the next matching call.
#[derive(Debug)]
struct Failure {
    op: Op,
    unit: Option<String>,
    error: Error,
}

#[derive(Debug, Default)]
struct Table {
    units: BTreeMap<String, UnitEntry>,
    calls: Vec<Call>,
    failures: Vec<Failure>,
}

/// An in-memory [`UnitManager`]: a unit table, every call recorded in order, failures on
/// request. Units not in the table behave as units without a file.
#[derive(Debug, Default)]
pub struct RecordingManager {
    table: Mutex<Table>,
}

impl RecordingManager {
    /// An empty table: every unit is one without a file.
    pub fn new() -> Self {
        RecordingManager::default()
    }

    /// The manager with `unit` in the table as `entry`.
    pub fn with_unit(self, unit: &str, entry: UnitEntry) -> Self {
        self.set_unit(unit, entry);
        self
    }

    /// Puts `unit` in the table as `entry` (replacing what was there).
    pub fn set_unit(&self, unit: &str, entry: UnitEntry) {
        self.lock().units.insert(unit.to_string(), entry);
    }

    /// The table's entry for `unit`, if it has one.
    pub fn unit(&self, unit: &str) -> Option<UnitEntry> {
        self.lock().units.get(unit).cloned()
    }

    /// Makes the next call of `op` (for `unit`, or for any unit when `None`) return `error`
    /// without changing the table. Each failure is returned once; the plan probes
    /// (`would_*`) cannot fail, so a failure queued for one is never returned.
    pub fn fail(&self, op: Op, unit: Option<&str>, error: Error) {
        self.lock().failures.push(Failure {
            op,
            unit: unit.map(str::to_string),
            error,
        });
    }

    /// Every call so far, in order (failed ones included).
    pub fn calls(&self) -> Vec<Call> {
        self.lock().calls.clone()
    }

    /// The calls so far that may change systemd's state ([`Op::is_mutating`]), in order.
    pub fn mutations(&self) -> Vec<Call> {
        self.calls()
            .into_iter()
            .filter(|c| c.op.is_mutating())
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records the call, then returns the queued failure for it, if any, or runs `f` on the
    /// table (`f` gets the unit's entry, `None` when the table has none).
    fn call<T>(
        &self,
        op: Op,
        unit: Option<&UnitName>,
        f: impl FnOnce(&mut BTreeMap<String, UnitEntry>) -> Result<T, Error>,
    ) -> Result<T, Error> {
        let mut table = self.lock();
        let unit = unit.map(|u| u.as_str().to_string());
        table.calls.push(Call {
            op,
            unit: unit.clone(),
        });
        let queued = table
            .failures
            .iter()
            .position(|f| f.op == op && (f.unit.is_none() || f.unit == unit));
        if let Some(i) = queued {
            return Err(table.failures.remove(i).error);
        }
        f(&mut table.units)
    }

    /// A probe: recorded, answered from the unit's entry.
    fn probe(&self, op: Op, unit: &UnitName, f: impl FnOnce(Option<&UnitEntry>) -> bool) -> bool {
        let mut table = self.lock();
        table.calls.push(Call::new(op, unit.as_str()));
        f(table.units.get(unit.as_str()))
    }

    /// A verb on a unit that must have a file: `not-found` without one, `failed` when masked
    /// (as systemd's `NoSuchUnit` and `UnitMasked` map), else `f` on its entry.
    fn verb<T>(
        &self,
        op: Op,
        verb: &str,
        unit: &UnitName,
        f: impl FnOnce(&mut UnitEntry) -> T,
    ) -> Result<T, Error> {
        self.call(op, Some(unit), |units| match units.get_mut(unit.as_str()) {
            Some(e) if e.masked => Err(Error::Failed(format!(
                "{verb} {unit}: Unit {unit} is masked."
            ))),
            Some(e) if e.file => Ok(f(e)),
            _ => Err(Error::NotFound(format!(
                "{verb} {unit}: Unit file {unit} does not exist."
            ))),
        })
    }
}

impl UnitManager for RecordingManager {
    fn reload(&self) -> Result<(), Error> {
        self.call(Op::Reload, None, |_| Ok(()))
    }

    fn enable(&self, unit: &UnitName) -> Result<bool, Error> {
        self.verb(Op::Enable, "enable", unit, |e| {
            let changed = e.installable && !e.enabled;
            e.enabled |= e.installable;
            changed
        })
    }

    fn would_enable(&self, unit: &UnitName) -> bool {
        self.probe(Op::WouldEnable, unit, |e| {
            e.is_none_or(|e| !e.masked && e.installable && !e.enabled)
        })
    }

    fn disable(&self, unit: &UnitName) -> Result<bool, Error> {
        self.call(Op::Disable, Some(unit), |units| {
            match units.get_mut(unit.as_str()) {
                Some(e) if e.file => Ok(std::mem::replace(&mut e.enabled, false)),
                _ => Err(Error::NotFound(format!(
                    "disable {unit}: Unit file {unit} does not exist."
                ))),
            }
        })
    }

    fn would_disable(&self, unit: &UnitName) -> bool {
        self.probe(Op::WouldDisable, unit, |e| {
            e.is_some_and(|e| e.enabled && !e.masked)
        })
    }

    fn mask(&self, unit: &UnitName) -> Result<bool, Error> {
        self.call(Op::Mask, Some(unit), |units| {
            let e = units.entry(unit.as_str().to_string()).or_insert(UnitEntry {
                file: false,
                ..UnitEntry::default()
            });
            Ok(!std::mem::replace(&mut e.masked, true))
        })
    }

    fn unmask(&self, unit: &UnitName) -> Result<bool, Error> {
        self.call(Op::Unmask, Some(unit), |units| {
            Ok(units
                .get_mut(unit.as_str())
                .is_some_and(|e| std::mem::replace(&mut e.masked, false)))
        })
    }

    fn reset_failed(&self, unit: &UnitName) -> Result<bool, Error> {
        self.call(Op::ResetFailed, Some(unit), |units| {
            Ok(match units.get_mut(unit.as_str()) {
                Some(e) if e.activity == Activity::Failed => {
                    e.activity = Activity::Inactive;
                    true
                }
                _ => false,
            })
        })
    }

    fn start(&self, unit: &UnitName, _deadline: Instant) -> Result<bool, Error> {
        self.verb(Op::Start, "start", unit, |e| {
            let started = e.activity != Activity::Active;
            e.activity = Activity::Active;
            started
        })
    }

    fn would_start(&self, unit: &UnitName) -> bool {
        self.probe(Op::WouldStart, unit, |e| {
            e.is_none_or(|e| e.activity != Activity::Active)
        })
    }

    fn stop(&self, unit: &UnitName, _deadline: Instant) -> Result<bool, Error> {
        self.call(Op::Stop, Some(unit), |units| {
            Ok(match units.get_mut(unit.as_str()) {
                Some(e) if e.activity != Activity::Inactive => {
                    e.activity = Activity::Inactive;
                    true
                }
                _ => false,
            })
        })
    }

    fn would_stop(&self, unit: &UnitName) -> bool {
        self.probe(Op::WouldStop, unit, |e| {
            e.is_some_and(|e| e.activity != Activity::Inactive)
        })
    }

    fn restart(&self, unit: &UnitName, _deadline: Instant) -> Result<(), Error> {
        self.verb(Op::Restart, "restart", unit, |e| {
            e.activity = Activity::Active
        })
    }

    fn status(&self, unit: &UnitName) -> Result<UnitState, Error> {
        self.call(Op::Status, Some(unit), |units| {
            let entry = units.get(unit.as_str());
            let load_state = match entry {
                Some(e) if e.masked => "masked",
                Some(e) if e.file => "loaded",
                _ => "not-found",
            };
            let activity = entry.map_or(Activity::Inactive, |e| e.activity);
            let (active_state, sub_state) = match activity {
                Activity::Active => ("active", "running"),
                Activity::Inactive => ("inactive", "dead"),
                Activity::Failed => ("failed", "failed"),
            };
            let main_pid = match entry {
                Some(e) if activity == Activity::Active => e.main_pid,
                _ => 0,
            };
            Ok(UnitState {
                load_state: load_state.to_string(),
                active_state: active_state.to_string(),
                sub_state: sub_state.to_string(),
                main_pid,
            })
        })
    }
}
