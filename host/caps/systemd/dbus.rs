//! A small blocking systemd client over D-Bus (zbus), for the `systemd` capability.
//!
//! # Background
//! The capability must not shell out to `systemctl`: its output is for people, its exit codes
//! are coarse, and it needs `sd_booted()` to be true, which it is not inside containers or the
//! test harness. systemd's D-Bus API (`org.freedesktop.systemd1`) gives typed answers, the job
//! of every start/stop, and that job's result.
//!
//! # Guarantees
//! - Calls that queue a job (start, stop, restart) subscribe to `JobRemoved` *before* queuing,
//!   so a job that finishes at once is not missed, then wait for their own job's signal until
//!   the caller's deadline.
//! - Every zbus error is mapped to the WIT [`Error`] in one place ([`map_err`]).
//! - Unit files are changed with `runtime = false`; enable uses `force = true` (replacing stale
//!   links, as an agent owning the unit wants), mask uses `force = false` so a unit file of the
//!   same name in `/etc/systemd/system` is never silently replaced by the `/dev/null` link.
//!
//! # Assumptions
//! Unit names were validated ([`UnitName`]) and granted before any call here.
//!
//! # Caveats
//! None of these calls reload systemd: enable, mask and written unit files take effect on the
//! next `daemon-reload`, which phases call explicitly (it needs its own grant).

use super::manager::{UnitManager, UnitName, UnitState};
use crate::wit::Error;
use futures_lite::StreamExt as _;
use std::time::Instant;
use zbus::DBusError as _;
use zbus::proxy::CacheProperties;
use zbus::zvariant::OwnedObjectPath;

/// The unit-file changes systemd reports: (`symlink` or `unlink`, link path, target).
type FileChanges = Vec<(String, String, String)>;

/// `org.freedesktop.systemd1.Manager`, the calls the capability needs.
#[zbus::proxy(
    interface = "org.freedesktop.systemd1.Manager",
    default_service = "org.freedesktop.systemd1",
    default_path = "/org/freedesktop/systemd1",
    gen_blocking = true,
    gen_async = true
)]
trait Manager {
    /// Asks systemd to emit job and unit signals to this client (JobRemoved included).
    fn subscribe(&self) -> zbus::Result<()>;
    /// `systemctl daemon-reload`; returns when the reload is done.
    fn reload(&self) -> zbus::Result<()>;
    /// The loaded unit's object; `NoSuchUnit` when it is not loaded.
    fn get_unit(&self, name: &str) -> zbus::Result<OwnedObjectPath>;
    /// The unit's object, loading the unit (possibly as `not-found`) when needed.
    fn load_unit(&self, name: &str) -> zbus::Result<OwnedObjectPath>;
    /// Queues a start job; returns the job's object.
    fn start_unit(&self, name: &str, mode: &str) -> zbus::Result<OwnedObjectPath>;
    /// Queues a stop job.
    fn stop_unit(&self, name: &str, mode: &str) -> zbus::Result<OwnedObjectPath>;
    /// Queues a restart job (starts the unit when stopped).
    fn restart_unit(&self, name: &str, mode: &str) -> zbus::Result<OwnedObjectPath>;
    /// `systemctl reset-failed UNIT`.
    fn reset_failed_unit(&self, name: &str) -> zbus::Result<()>;
    /// `enabled`, `disabled`, `static`, `masked`, ...; an error for a unit without a file.
    fn get_unit_file_state(&self, file: &str) -> zbus::Result<String>;
    /// Creates the install links; returns (has \[Install\] info, link changes).
    fn enable_unit_files(
        &self,
        files: &[&str],
        runtime: bool,
        force: bool,
    ) -> zbus::Result<(bool, FileChanges)>;
    /// Removes the install links; returns the link changes.
    fn disable_unit_files(&self, files: &[&str], runtime: bool) -> zbus::Result<FileChanges>;
    /// Links the units to /dev/null; returns the link changes.
    fn mask_unit_files(
        &self,
        files: &[&str],
        runtime: bool,
        force: bool,
    ) -> zbus::Result<FileChanges>;
    /// Removes /dev/null links; returns the link changes.
    fn unmask_unit_files(&self, files: &[&str], runtime: bool) -> zbus::Result<FileChanges>;
    /// A job finished: its id, object, unit and result (`done`, `failed`, `timeout`, ...).
    #[zbus(signal)]
    fn job_removed(
        &self,
        id: u32,
        job: zbus::zvariant::ObjectPath<'_>,
        unit: &str,
        result: &str,
    ) -> zbus::Result<()>;
}

/// `org.freedesktop.systemd1.Unit`, the states `status` reports.
#[zbus::proxy(
    interface = "org.freedesktop.systemd1.Unit",
    default_service = "org.freedesktop.systemd1",
    gen_blocking = true,
    gen_async = false,
    blocking_name = "UnitProxyBlocking"
)]
trait Unit {
    /// `loaded`, `not-found`, `masked`, ...
    #[zbus(property)]
    fn load_state(&self) -> zbus::Result<String>;
    /// `active`, `inactive`, `failed`, ...
    #[zbus(property)]
    fn active_state(&self) -> zbus::Result<String>;
    /// Type specific: `running`, `dead`, `exited`, ...
    #[zbus(property)]
    fn sub_state(&self) -> zbus::Result<String>;
}

/// `org.freedesktop.systemd1.Service`: the main PID and the last run's result.
#[zbus::proxy(
    interface = "org.freedesktop.systemd1.Service",
    default_service = "org.freedesktop.systemd1",
    gen_blocking = true,
    gen_async = false,
    blocking_name = "ServiceProxyBlocking"
)]
trait Service {
    /// The main process, 0 when there is none.
    #[zbus(property, name = "ExecMainPID")]
    fn exec_main_pid(&self) -> zbus::Result<u32>;
}

/// A connection to systemd on the system bus.
pub struct SystemdBus {
    conn: zbus::blocking::Connection,
    manager: ManagerProxyBlocking<'static>,
}

impl std::fmt::Debug for SystemdBus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SystemdBus")
            .field("unique_name", &self.conn.unique_name())
            .finish_non_exhaustive()
    }
}

/// Where the system bus is: `DBUS_SYSTEM_BUS_ADDRESS`, else the standard socket.
pub fn system_bus_address() -> String {
    std::env::var("DBUS_SYSTEM_BUS_ADDRESS")
        .unwrap_or_else(|_| "unix:path=/var/run/dbus/system_bus_socket".into())
}

/// Unit object paths name the unit's type interface; `Result` lives there, not on `Unit`.
fn type_interface(unit: &UnitName) -> Option<&'static str> {
    let ty = unit.as_str().rsplit_once('.').map(|(_, t)| t)?;
    Some(match ty {
        "service" => "org.freedesktop.systemd1.Service",
        "socket" => "org.freedesktop.systemd1.Socket",
        "mount" => "org.freedesktop.systemd1.Mount",
        "automount" => "org.freedesktop.systemd1.Automount",
        "swap" => "org.freedesktop.systemd1.Swap",
        "path" => "org.freedesktop.systemd1.Path",
        "timer" => "org.freedesktop.systemd1.Timer",
        "scope" => "org.freedesktop.systemd1.Scope",
        _ => return None,
    })
}

/// D-Bus error names that mean "no such unit (file)".
const NOT_FOUND: &[&str] = &[
    "org.freedesktop.systemd1.NoSuchUnit",
    "org.freedesktop.DBus.Error.FileNotFound",
];

/// D-Bus error names that mean "this unit cannot come up": masked, or its file does not load.
const FAILED: &[&str] = &[
    "org.freedesktop.systemd1.UnitMasked",
    "org.freedesktop.systemd1.LoadFailed",
];

/// Maps a zbus error of `what` (e.g. `start kubelet.service`) to the WIT error: unit-not-found
/// errors become `not-found`, a masked or unloadable unit `failed`, everything else `io` with
/// the D-Bus error name and message.
pub fn map_err(what: &str, e: zbus::Error) -> Error {
    let (name, message) = match &e {
        zbus::Error::MethodError(name, detail, _) => {
            (name.to_string(), detail.clone().unwrap_or_default())
        }
        zbus::Error::FDO(fdo) => (
            fdo.name().to_string(),
            fdo.description().unwrap_or_default().to_string(),
        ),
        other => return Error::Io(format!("{what}: D-Bus: {other}")),
    };
    if NOT_FOUND.contains(&name.as_str()) {
        Error::NotFound(format!("{what}: {message}"))
    } else if FAILED.contains(&name.as_str()) {
        Error::Failed(format!("{what}: {message}"))
    } else {
        Error::Io(format!("{what}: {name}: {message}"))
    }
}

fn is_no_such_unit(e: &zbus::Error) -> bool {
    matches!(e, zbus::Error::MethodError(name, _, _)
        if name.as_str() == "org.freedesktop.systemd1.NoSuchUnit")
}

impl SystemdBus {
    /// Connects to the system bus ([`system_bus_address`]) and subscribes to systemd's
    /// signals. `unavailable` when there is no bus or no systemd on it, so a host without
    /// systemd fails clearly.
    pub fn connect() -> Result<Self, Error> {
        let unavailable = |e: zbus::Error| {
            Error::Unavailable(format!(
                "systemd: cannot reach systemd on the system bus at {}: {e}",
                system_bus_address()
            ))
        };
        let conn = zbus::blocking::Connection::system().map_err(unavailable)?;
        let manager = ManagerProxyBlocking::builder(&conn)
            .cache_properties(CacheProperties::No)
            .build()
            .map_err(unavailable)?;
        manager.subscribe().map_err(unavailable)?;
        Ok(SystemdBus { conn, manager })
    }

    /// The loaded unit's `ActiveState`; `inactive` for a unit systemd has not loaded.
    fn active_state(&self, unit: &UnitName) -> Result<String, Error> {
        let what = format!("status {}", unit.as_str());
        let path = match self.manager.get_unit(unit.as_str()) {
            Ok(p) => p,
            Err(e) if is_no_such_unit(&e) => return Ok("inactive".into()),
            Err(e) => return Err(map_err(&what, e)),
        };
        UnitProxyBlocking::builder(&self.conn)
            .path(path)
            .and_then(|b| b.cache_properties(CacheProperties::No).build())
            .and_then(|u| u.active_state())
            .map_err(|e| map_err(&what, e))
    }

    /// The `Result` property of the unit's type (`exit-code`, `timeout`, ...), if it has one.
    fn unit_result(&self, unit: &UnitName) -> Option<String> {
        let iface = type_interface(unit)?;
        let path = self.manager.get_unit(unit.as_str()).ok()?;
        let proxy = zbus::blocking::proxy::Builder::<zbus::blocking::Proxy<'_>>::new(&self.conn)
            .destination("org.freedesktop.systemd1")
            .and_then(|b| b.path(path))
            .and_then(|b| b.interface(iface))
            .and_then(|b| b.cache_properties(CacheProperties::No).build())
            .ok()?;
        proxy.get_property::<String>("Result").ok()
    }

    /// Queues a job with `queue` and waits for its `JobRemoved` until `deadline`.
    ///
    /// # Errors
    /// `timeout` naming the unit when the deadline passes first; `failed` naming the unit, the
    /// job result and the unit's `Result` when the job did not end `done` (or `skipped`, which
    /// systemd uses for jobs that had nothing to do); the mapped D-Bus error otherwise.
    fn run_job(
        &self,
        verb: &str,
        unit: &UnitName,
        deadline: Instant,
        queue: impl FnOnce(&ManagerProxyBlocking<'static>) -> zbus::Result<OwnedObjectPath>,
    ) -> Result<(), Error> {
        let what = format!("{verb} {}", unit.as_str());
        // A job queued after the deadline could only time out, but would still run.
        if Instant::now() >= deadline {
            return Err(Error::Timeout(format!(
                "{what}: the phase deadline passed before the job was queued"
            )));
        }
        // Subscribe first: the job may finish before the call returns.
        let mut removed = async_io::block_on(async {
            ManagerProxy::builder(self.conn.inner())
                .cache_properties(CacheProperties::No)
                .build()
                .await?
                .receive_job_removed()
                .await
        })
        .map_err(|e| map_err(&what, e))?;
        let job = queue(&self.manager).map_err(|e| map_err(&what, e))?;
        let wait = async {
            while let Some(signal) = removed.next().await {
                match signal.args() {
                    Ok(args) if args.job.as_str() == job.as_str() => {
                        return Ok(args.result.to_string());
                    }
                    _ => {}
                }
            }
            Err(Error::Io(format!(
                "{what}: the D-Bus connection closed while waiting for job {}",
                job.as_str()
            )))
        };
        let timeout = async {
            async_io::Timer::at(deadline).await;
            Err(Error::Timeout(format!(
                "{what}: job {} did not finish before the phase deadline",
                job.as_str()
            )))
        };
        let result = async_io::block_on(futures_lite::future::or(wait, timeout))?;
        match result.as_str() {
            "done" | "skipped" => Ok(()),
            other => {
                let unit_result = self
                    .unit_result(unit)
                    .unwrap_or_else(|| "unknown".to_string());
                Err(Error::Failed(format!(
                    "{what}: job {other} (unit result: {unit_result})"
                )))
            }
        }
    }
}

impl UnitManager for SystemdBus {
    /// `Manager.Reload`: systemd re-reads unit files; returns when done.
    fn reload(&self) -> Result<(), Error> {
        self.manager
            .reload()
            .map_err(|e| map_err("daemon-reload", e))
    }

    /// Enables `unit`; whether any install link changed. A unit without an `[Install]`
    /// section has nothing to enable and reports no change, as `systemctl enable` does.
    fn enable(&self, unit: &UnitName) -> Result<bool, Error> {
        let (_, changes) = self
            .manager
            .enable_unit_files(&[unit.as_str()], false, true)
            .map_err(|e| map_err(&format!("enable {}", unit.as_str()), e))?;
        Ok(!changes.is_empty())
    }

    /// Whether [`UnitManager::enable`] would change anything (for plans): not when the unit
    /// file is already enabled, or has nothing to enable (`static`, `generated`, ...).
    fn would_enable(&self, unit: &UnitName) -> bool {
        match self.manager.get_unit_file_state(unit.as_str()) {
            Ok(state) => state == "disabled",
            Err(_) => true,
        }
    }

    /// Whether [`UnitManager::disable`] would change anything (for plans).
    fn would_disable(&self, unit: &UnitName) -> bool {
        matches!(
            self.manager.get_unit_file_state(unit.as_str()).as_deref(),
            Ok("enabled")
        )
    }

    /// Whether [`UnitManager::start`] would start anything (for plans).
    fn would_start(&self, unit: &UnitName) -> bool {
        !matches!(
            self.active_state(unit).as_deref(),
            Ok("active" | "reloading")
        )
    }

    /// Whether [`UnitManager::stop`] would stop anything (for plans).
    fn would_stop(&self, unit: &UnitName) -> bool {
        !matches!(self.active_state(unit).as_deref(), Ok("inactive"))
    }

    /// Disables `unit`; whether any install link was removed.
    fn disable(&self, unit: &UnitName) -> Result<bool, Error> {
        let changes = self
            .manager
            .disable_unit_files(&[unit.as_str()], false)
            .map_err(|e| map_err(&format!("disable {}", unit.as_str()), e))?;
        Ok(!changes.is_empty())
    }

    /// Masks `unit`; whether the /dev/null link was created.
    fn mask(&self, unit: &UnitName) -> Result<bool, Error> {
        let changes = self
            .manager
            .mask_unit_files(&[unit.as_str()], false, false)
            .map_err(|e| map_err(&format!("mask {}", unit.as_str()), e))?;
        Ok(!changes.is_empty())
    }

    /// Unmasks `unit`; whether a /dev/null link was removed.
    fn unmask(&self, unit: &UnitName) -> Result<bool, Error> {
        let changes = self
            .manager
            .unmask_unit_files(&[unit.as_str()], false)
            .map_err(|e| map_err(&format!("unmask {}", unit.as_str()), e))?;
        Ok(!changes.is_empty())
    }

    /// `Manager.ResetFailedUnit`; whether the unit was `failed`. A unit that is not loaded,
    /// or not failed, has nothing to reset.
    fn reset_failed(&self, unit: &UnitName) -> Result<bool, Error> {
        if self.active_state(unit)? != "failed" {
            return Ok(false);
        }
        match self.manager.reset_failed_unit(unit.as_str()) {
            Err(e) if is_no_such_unit(&e) => Ok(false),
            r => r
                .map(|()| true)
                .map_err(|e| map_err(&format!("reset-failed {}", unit.as_str()), e)),
        }
    }

    /// The unit's states; loads it when needed, so a unit without a file reports `not-found`.
    fn status(&self, unit: &UnitName) -> Result<UnitState, Error> {
        let what = format!("status {}", unit.as_str());
        let path = match self.manager.get_unit(unit.as_str()) {
            Err(e) if is_no_such_unit(&e) => self.manager.load_unit(unit.as_str()),
            r => r,
        }
        .map_err(|e| map_err(&what, e))?;
        let u = UnitProxyBlocking::builder(&self.conn)
            .path(path.clone())
            .and_then(|b| b.cache_properties(CacheProperties::No).build())
            .map_err(|e| map_err(&what, e))?;
        let mut state = UnitState {
            load_state: u.load_state().map_err(|e| map_err(&what, e))?,
            active_state: u.active_state().map_err(|e| map_err(&what, e))?,
            sub_state: u.sub_state().map_err(|e| map_err(&what, e))?,
            main_pid: 0,
        };
        // Only a loaded service has a main process to ask about.
        if state.load_state == "loaded" && unit.as_str().ends_with(".service") {
            state.main_pid = ServiceProxyBlocking::builder(&self.conn)
                .path(path)
                .and_then(|b| b.cache_properties(CacheProperties::No).build())
                .and_then(|s| s.exec_main_pid())
                .map_err(|e| map_err(&what, e))?;
        }
        Ok(state)
    }

    /// Starts `unit` and waits for the job; `false` (nothing done) when it already is active.
    fn start(&self, unit: &UnitName, deadline: Instant) -> Result<bool, Error> {
        if matches!(self.active_state(unit)?.as_str(), "active" | "reloading") {
            return Ok(false);
        }
        self.run_job("start", unit, deadline, |m| {
            m.start_unit(unit.as_str(), "replace")
        })?;
        Ok(true)
    }

    /// Stops `unit` and waits for the job; `false` when it already is inactive (or not loaded).
    fn stop(&self, unit: &UnitName, deadline: Instant) -> Result<bool, Error> {
        if self.active_state(unit)? == "inactive" {
            return Ok(false);
        }
        self.run_job("stop", unit, deadline, |m| {
            m.stop_unit(unit.as_str(), "replace")
        })?;
        Ok(true)
    }

    /// Restarts (or starts) `unit` and waits for the job.
    fn restart(&self, unit: &UnitName, deadline: Instant) -> Result<(), Error> {
        self.run_job("restart", unit, deadline, |m| {
            m.restart_unit(unit.as_str(), "replace")
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn method_error(name: &str, detail: &str) -> zbus::Error {
        let msg = zbus::message::Message::method_call("/", "Ping")
            .and_then(|b| b.build(&()))
            .expect("a message");
        zbus::Error::MethodError(
            zbus::names::OwnedErrorName::try_from(name).expect("error name"),
            Some(detail.into()),
            msg,
        )
    }

    #[test]
    fn errors_map_to_wit_kinds() {
        let e = map_err(
            "start x.service",
            method_error(
                "org.freedesktop.systemd1.NoSuchUnit",
                "Unit x.service not found.",
            ),
        );
        assert!(
            matches!(&e, Error::NotFound(m) if m == "start x.service: Unit x.service not found."),
            "{e:?}"
        );
        let e = map_err(
            "start x.service",
            method_error("org.freedesktop.systemd1.UnitMasked", "Unit x is masked."),
        );
        assert!(matches!(e, Error::Failed(m) if m.contains("masked")));
        let e = map_err(
            "enable x.service",
            method_error("org.freedesktop.DBus.Error.AccessDenied", "no"),
        );
        assert!(
            matches!(&e, Error::Io(m) if m == "enable x.service: org.freedesktop.DBus.Error.AccessDenied: no"),
            "{e:?}"
        );
        let e = map_err("reload", zbus::Error::InvalidReply);
        assert!(matches!(e, Error::Io(m) if m.starts_with("reload: D-Bus:")));
    }

    #[test]
    fn result_lives_on_the_type_interface() {
        let u = |s| UnitName::try_from(s).expect("unit");
        assert_eq!(
            type_interface(&u("a.service")),
            Some("org.freedesktop.systemd1.Service")
        );
        assert_eq!(
            type_interface(&u("a.mount")),
            Some("org.freedesktop.systemd1.Mount")
        );
        assert_eq!(type_interface(&u("a.target")), None);
    }
}
