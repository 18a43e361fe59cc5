//! `nodeward:host/kernel`: kernel modules, sysctls and swap.
//!
//! # Background
//! The kernel's state is read from files beneath the host root (`proc/sys/...`,
//! `proc/modules`, `sys/module/...`, `proc/swaps`). With `--root /` those are the running
//! kernel's, and changes go to it (`/proc/sys` writes, `modprobe`, `swapoff`). With any other
//! root they are that root's equivalents, and changes are written there as files, which keeps
//! tests and dry environments contained. The phase cannot tell the difference.
//!
//! # Guarantees
//! - Grant check first: module names, sysctl keys (exact or prefix `*`), the swap-off flag.
//! - `modprobe` and `swapoff` run with fixed arguments (`--` then one validated name), so no
//!   other program or option can be reached, and within the phase deadline: past it the
//!   process is killed and the call returns `timeout`. Each is found in the system's own
//!   directories ([`SYSTEM_DIRS`]), never through the agent's `PATH`, and runs with an
//!   environment of only that fixed `PATH` and `LC_ALL=C`: whoever started the agent cannot
//!   put another `modprobe` (or variables it reads) in the way of a grant.
//! - Kernel writes do not need an `fs` grant; the `kernel` grant covers them.

use super::{Error, Outcome, PhaseCtx, denied};
use crate::grants::{is_module_name, is_sysctl_key};
use crate::hostpath::HostPath;
use crate::plan::ChangeKind;
use crate::wit::kernel;
use serde_json::json;
use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const PROC_MODULES: &str = "proc/modules";
const PROC_SWAPS: &str = "proc/swaps";
const SWAPS_HEADER: &str = "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n";

fn fixed_path(s: &str) -> Result<HostPath, Error> {
    HostPath::parse(s).map_err(|e| Error::Io(e.to_string()))
}

fn sysctl_path(key: &str) -> Result<HostPath, Error> {
    if !is_sysctl_key(key) {
        return Err(Error::InvalidArgument(format!(
            "sysctl key {key:?}: dotted parts of letters, digits, '_' and '-' only"
        )));
    }
    fixed_path(&format!("proc/sys/{}", key.replace('.', "/")))
}

impl PhaseCtx {
    /// The file's contents, or `None` when it does not exist.
    fn read_optional(&self, path: &HostPath) -> Result<Option<String>, Error> {
        match self.run.files.read(path) {
            Ok(bytes) => Ok(Some(String::from_utf8_lossy(&bytes).into_owned())),
            Err(Error::NotFound(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn module_loaded(&self, name: &str) -> Result<bool, Error> {
        let modules = self
            .read_optional(&fixed_path(PROC_MODULES)?)?
            .unwrap_or_default();
        let listed = modules
            .lines()
            .any(|l| l.split_whitespace().next() == Some(name));
        // Built-in modules are not in /proc/modules but have /sys/module/<name>.
        Ok(listed
            || self
                .run
                .files
                .lstat(&fixed_path(&format!("sys/module/{name}"))?)?
                .is_some())
    }

    /// Runs `program -- arg` (fixed arguments) within the phase deadline, naming both in a
    /// failure.
    fn run_fixed(&self, program: &str, arg: &str) -> Result<(), Error> {
        run_bounded(program, arg, self.deadline)
    }
}

/// How often a running `modprobe`/`swapoff` is checked against the deadline.
const POLL: Duration = Duration::from_millis(10);

/// Most bytes of a program's stderr kept for its error message; the rest is read and dropped.
const MAX_STDERR: u64 = 16 * 1024;

/// How long the call waits for a killed program to be reaped: a `modprobe` inside the kernel's
/// module loader cannot die until the load returns, and the call must not wait for it.
const KILLED_WAIT: Duration = Duration::from_secs(1);

/// Reaps `child` within `wait`, or leaves a thread to reap it whenever it ends.
fn reap_within(mut child: std::process::Child, wait: Duration) {
    let until = Instant::now() + wait;
    while Instant::now() < until {
        match child.try_wait() {
            Ok(None) => std::thread::sleep(POLL),
            Ok(Some(_)) | Err(_) => return,
        }
    }
    std::thread::spawn(move || {
        let _ = child.wait();
    });
}

/// Where the programs the kernel capability runs are looked for, in order, and the only `PATH`
/// they see (a `modprobe.d` `install` command runs with it).
const SYSTEM_DIRS: [&str; 4] = ["/usr/sbin", "/usr/bin", "/sbin", "/bin"];

/// The first executable file `name` in [`SYSTEM_DIRS`]; `name` is a file name, never a path.
fn system_program(name: &str) -> Result<std::path::PathBuf, Error> {
    use std::os::unix::fs::PermissionsExt as _;
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        return Err(Error::Io(format!(
            "cannot run {name:?}: not a program name"
        )));
    }
    SYSTEM_DIRS
        .iter()
        .map(|dir| std::path::Path::new(dir).join(name))
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
        .ok_or_else(|| {
            Error::Io(format!(
                "cannot run {name}: not found in {}",
                SYSTEM_DIRS.join(", ")
            ))
        })
}

/// Runs `program -- arg` with no stdin or stdout, stopping it at `deadline`.
///
/// `modprobe` may run `install` commands from `modprobe.d` and `swapoff` may wait on a busy
/// device, so neither is trusted to return: past the deadline the process is killed and reaped
/// and the call returns `timeout`. Its stderr is read on a thread (a full pipe must not block
/// it) and waited for only until the deadline, since a child it started may hold the pipe open.
fn run_bounded(program: &str, arg: &str, deadline: Instant) -> Result<(), Error> {
    use std::os::unix::process::CommandExt as _;
    if Instant::now() >= deadline {
        return Err(Error::Timeout(format!(
            "{program} {arg}: not started, the phase deadline has passed"
        )));
    }
    let mut child = Command::new(system_program(program)?)
        // Its own process group, so that what it starts (a `modprobe.d` `install` command)
        // is killed with it at the deadline.
        .process_group(0)
        .env_clear()
        .env("PATH", SYSTEM_DIRS.join(":"))
        .env("LC_ALL", "C")
        .arg("--")
        .arg(arg)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| Error::Io(format!("cannot run {program}: {e}")))?;
    let (tx, rx) = mpsc::channel();
    if let Some(stderr) = child.stderr.take() {
        std::thread::spawn(move || {
            let mut stderr = stderr;
            let mut kept = Vec::new();
            let _ = (&mut stderr).take(MAX_STDERR).read_to_end(&mut kept);
            let _ = std::io::copy(&mut stderr, &mut std::io::sink());
            let _ = tx.send(kept);
        });
    }
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() >= deadline => {
                let group = rustix::process::Pid::from_child(&child);
                let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
                let _ = child.kill();
                reap_within(child, KILLED_WAIT);
                return Err(Error::Timeout(format!(
                    "{program} {arg}: still running at the phase deadline; killed"
                )));
            }
            Ok(None) => std::thread::sleep(POLL),
            Err(e) => return Err(Error::Io(format!("waiting for {program} {arg}: {e}"))),
        }
    };
    if status.success() {
        return Ok(());
    }
    let left = deadline.saturating_duration_since(Instant::now());
    let stderr = rx.recv_timeout(left.max(POLL)).unwrap_or_default();
    Err(Error::Failed(format!(
        "{program} {arg}: {} ({status})",
        String::from_utf8_lossy(&stderr).trim()
    )))
}

impl kernel::Host for PhaseCtx {
    fn load_module(&mut self, name: String) -> Result<Outcome, Error> {
        self.audited("kernel.load-module", json!({ "name": name }), |ctx| {
            if !is_module_name(&name) {
                return Err(Error::InvalidArgument(format!(
                    "module name {name:?}: letters, digits, '_' and '-' only"
                )));
            }
            if !ctx.grants.may_load_module(&name) {
                return Err(denied(format!("load module {name}"), "kernel.modules"));
            }
            if ctx.module_loaded(&name)? {
                return Ok(Outcome::Unchanged);
            }
            let path = fixed_path(PROC_MODULES)?;
            if ctx.run.files.mode == crate::plan::RunMode::Apply
                && ctx.run.files.root.is_system_root()
            {
                ctx.run_fixed("modprobe", &name)?;
            } else {
                // Plan mode, or a root that is not `/`: record the module as loaded in the root's
                // proc/modules, in the kernel's own line format.
                let mut modules = ctx.read_optional(&path)?.unwrap_or_default();
                modules.push_str(&format!("{name} 0 0 - Live 0x0000000000000000\n"));
                ctx.run.files.write_kernel_file(&path, modules.as_bytes())?;
            }
            ctx.changed(ChangeKind::ModuleLoad { name: name.clone() });
            Ok(Outcome::Created)
        })
    }

    fn set_sysctl(&mut self, key: String, value: String) -> Result<Outcome, Error> {
        self.audited(
            "kernel.set-sysctl",
            json!({ "key": key, "value": value }),
            |ctx| {
                let path = sysctl_path(&key)?;
                if value.contains(['\n', '\0']) {
                    return Err(Error::InvalidArgument(format!(
                        "sysctl {key}: value has a newline or NUL"
                    )));
                }
                if !ctx.grants.may_sysctl(&key) {
                    return Err(denied(format!("set sysctl {key}"), "kernel.sysctls"));
                }
                let current = ctx.read_optional(&path)?;
                if current.is_none() && ctx.run.files.root.is_system_root() {
                    return Err(Error::NotFound(format!(
                        "sysctl {key}: no such key in this kernel"
                    )));
                }
                if current.as_deref().map(str::trim_end) == Some(value.trim_end()) {
                    return Ok(Outcome::Unchanged);
                }
                ctx.run
                    .files
                    .write_kernel_file(&path, format!("{}\n", value.trim_end()).as_bytes())?;
                let outcome = if current.is_some() {
                    Outcome::Changed
                } else {
                    Outcome::Created
                };
                ctx.changed(ChangeKind::Sysctl {
                    key: key.clone(),
                    from: current.map(|c| c.trim_end().to_string()),
                    to: value.trim_end().to_string(),
                });
                Ok(outcome)
            },
        )
    }

    fn get_sysctl(&mut self, key: String) -> Result<Option<String>, Error> {
        self.audited("kernel.get-sysctl", json!({ "key": key }), |ctx| {
            let path = sysctl_path(&key)?;
            if !ctx.grants.may_sysctl(&key) {
                return Err(denied(format!("read sysctl {key}"), "kernel.sysctls"));
            }
            Ok(ctx.read_optional(&path)?.map(|v| v.trim_end().to_string()))
        })
    }

    fn swap_off(&mut self) -> Result<Outcome, Error> {
        self.audited("kernel.swap-off", json!({}), |ctx| {
            if !ctx.grants.kernel.swap_off {
                return Err(denied("turn swap off", "kernel.swap-off"));
            }
            let path = fixed_path(PROC_SWAPS)?;
            let swaps = ctx.read_optional(&path)?.unwrap_or_default();
            let areas: Vec<String> = swaps
                .lines()
                .skip(1)
                .filter_map(|l| l.split_whitespace().next().map(str::to_string))
                .collect();
            if areas.is_empty() {
                return Ok(Outcome::Unchanged);
            }
            if ctx.run.files.mode == crate::plan::RunMode::Apply
                && ctx.run.files.root.is_system_root()
            {
                for area in &areas {
                    ctx.run_fixed("swapoff", area)?;
                }
            } else {
                ctx.run
                    .files
                    .write_kernel_file(&path, SWAPS_HEADER.as_bytes())?;
            }
            ctx.changed(ChangeKind::SwapOff { areas });
            Ok(Outcome::Changed)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_program_past_the_deadline_is_killed() {
        let r = run_bounded("sleep", "30", Instant::now() + Duration::from_millis(200));
        assert!(
            matches!(&r, Err(Error::Timeout(m)) if m.contains("sleep 30")),
            "{r:?}"
        );
    }

    #[test]
    fn a_failing_program_is_named_with_its_stderr() {
        let deadline = Instant::now() + Duration::from_secs(30);
        let r = run_bounded("ls", "/nonexistent-nodeward-test", deadline);
        assert!(
            matches!(&r, Err(Error::Failed(m)) if m.starts_with("ls /nonexistent-nodeward-test: ")
                // ls's own stderr names the path again.
                && m.matches("/nonexistent-nodeward-test").count() == 2),
            "{r:?}"
        );
        assert!(run_bounded("true", "x", deadline).is_ok());
    }

    #[test]
    fn nothing_starts_past_the_deadline() {
        let r = run_bounded("true", "x", Instant::now());
        assert!(
            matches!(&r, Err(Error::Timeout(m)) if m.contains("not started")),
            "{r:?}"
        );
    }

    /// What the program started dies with it: a shell that starts a long sleep of its own.
    #[test]
    fn what_a_killed_program_started_is_killed_too() {
        let dir = tempfile::tempdir().expect("tmp");
        let script = dir.path().join("spawn");
        let pid_file = dir.path().join("pid");
        std::fs::write(
            &script,
            format!("sleep 600 & echo $! > {}\nwait\n", pid_file.display()),
        )
        .expect("script");
        let script = script.to_str().expect("utf-8 temp path");
        let r = run_bounded("sh", script, Instant::now() + Duration::from_millis(500));
        assert!(matches!(&r, Err(Error::Timeout(_))), "{r:?}");
        let pid: i32 = std::fs::read_to_string(&pid_file)
            .expect("pid file")
            .trim()
            .parse()
            .expect("pid");
        // Killed (and, its parent gone, reaped by init or a subreaper): no such process, or a
        // zombie.
        let deadline = Instant::now() + Duration::from_secs(10);
        let gone = loop {
            let state = std::fs::read_to_string(format!("/proc/{pid}/stat"));
            let dead = match &state {
                Err(_) => true,
                Ok(s) => s
                    .rsplit(')')
                    .next()
                    .is_some_and(|rest| rest.trim_start().starts_with('Z')),
            };
            if dead || Instant::now() > deadline {
                break dead;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(gone, "the sleep the program started (pid {pid}) still runs");
    }

    #[test]
    fn programs_come_from_the_system_directories_only() {
        let found = system_program("true").expect("true is installed");
        assert!(
            SYSTEM_DIRS.iter().any(|d| found.starts_with(d)),
            "{}",
            found.display()
        );
        let r = system_program("nodeward-no-such-program");
        assert!(
            matches!(&r, Err(Error::Io(m)) if m.contains("not found in /usr/sbin, /usr/bin")),
            "{r:?}"
        );
        // A name is a name, not a path: nothing outside the system directories is reached.
        for name in ["../../bin/true", "/bin/true", "..", ""] {
            let r = system_program(name);
            assert!(
                matches!(&r, Err(Error::Io(m)) if m.contains("not a program name")),
                "{name}: {r:?}"
            );
        }
    }

    #[test]
    fn a_program_sees_only_the_fixed_environment() {
        // `sh -- FILE` runs FILE: a script that fails, printing its environment, unless that is
        // exactly the fixed PATH and LC_ALL (the test process has HOME, CARGO_* and more).
        let dir = tempfile::tempdir().expect("tmp");
        let script = dir.path().join("check-env");
        std::fs::write(
            &script,
            r#"got=$(env | grep -v -e '^PWD=' -e '^SHLVL=' -e '^_=' | sort | tr '\n' ' ')
[ "$got" = 'LC_ALL=C PATH=/usr/sbin:/usr/bin:/sbin:/bin ' ] || { echo "$got" >&2; exit 1; }
"#,
        )
        .expect("script");
        let deadline = Instant::now() + Duration::from_secs(30);
        let script = script.to_str().expect("utf-8 temp path");
        let r = run_bounded("sh", script, deadline);
        assert!(r.is_ok(), "{r:?}");
    }
}
