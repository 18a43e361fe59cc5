//! The narrow interface between the `systemd` capability and systemd itself: [`UnitManager`],
//! and the types it speaks ([`UnitName`], [`UnitState`]).
//!
//! # Background
//! The capability's plan/apply logic (grant checks, plan probes, which change is recorded when)
//! is ours; what systemd does with a verb is systemd's. Putting systemd behind this trait lets
//! the logic be unit-tested against [`super::recording::RecordingManager`], while
//! [`super::dbus::SystemdBus`] stays the one implementation that talks to a real systemd (and is
//! tested against one, `tests/caps_systemd.rs`). `node::status` reads unit states through it
//! too.
//!
//! # Assumptions
//! Every method receives a [`UnitName`] that was validated and granted before the call: an
//! implementation never sees a name the phase may not use.

use crate::wit::Error;
use std::fmt::Debug;
use std::time::Instant;

/// What the capability asks of systemd: the lifecycle verbs, their plan probes and `status`.
///
/// Verbs that change something return whether they did (`true`: something changed), so apply
/// mode records a change only when there was one. The `would_*` probes answer, for plans,
/// whether the verb would change anything; they never change anything themselves, and answer
/// `true` when they cannot tell (a plan then lists the verb).
///
/// # Errors
/// The WIT error kinds `wit/systemd.wit` documents per function, each message naming the verb
/// and the unit (`start kubelet.service: ...`).
pub trait UnitManager: Send + Sync + Debug {
    /// Makes systemd re-read unit files; returns when it has (`systemctl daemon-reload`).
    fn reload(&self) -> Result<(), Error>;

    /// Enables `unit` (creates its install links); whether any link changed. A unit without
    /// an `[Install]` section has nothing to enable: `false`.
    fn enable(&self, unit: &UnitName) -> Result<bool, Error>;

    /// Whether [`UnitManager::enable`] would change anything.
    fn would_enable(&self, unit: &UnitName) -> bool;

    /// Disables `unit`; whether any install link was removed.
    fn disable(&self, unit: &UnitName) -> Result<bool, Error>;

    /// Whether [`UnitManager::disable`] would change anything.
    fn would_disable(&self, unit: &UnitName) -> bool;

    /// Masks `unit` (links it to `/dev/null`); whether the link was created.
    fn mask(&self, unit: &UnitName) -> Result<bool, Error>;

    /// Unmasks `unit`; whether a `/dev/null` link was removed.
    fn unmask(&self, unit: &UnitName) -> Result<bool, Error>;

    /// Clears the failed state of `unit`; whether it was failed.
    fn reset_failed(&self, unit: &UnitName) -> Result<bool, Error>;

    /// Starts `unit` and waits for the job until `deadline`; `false` when it already is
    /// active.
    fn start(&self, unit: &UnitName, deadline: Instant) -> Result<bool, Error>;

    /// Whether [`UnitManager::start`] would start anything.
    fn would_start(&self, unit: &UnitName) -> bool;

    /// Stops `unit` and waits for the job until `deadline`; `false` when it already is
    /// inactive (or not loaded).
    fn stop(&self, unit: &UnitName, deadline: Instant) -> Result<bool, Error>;

    /// Whether [`UnitManager::stop`] would stop anything.
    fn would_stop(&self, unit: &UnitName) -> bool;

    /// Restarts (or starts) `unit` and waits for the job until `deadline`.
    fn restart(&self, unit: &UnitName, deadline: Instant) -> Result<(), Error>;

    /// The unit's states; a unit without a file reports `not-found`.
    fn status(&self, unit: &UnitName) -> Result<UnitState, Error>;
}

/// What systemd reports about one unit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnitState {
    /// `loaded`, `not-found`, `masked`, ...
    pub load_state: String,
    /// `active`, `inactive`, `failed`, ...
    pub active_state: String,
    /// `running`, `dead`, `exited`, ...
    pub sub_state: String,
    /// The main process (services only), 0 when there is none.
    pub main_pid: u32,
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

impl std::fmt::Display for UnitName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
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
