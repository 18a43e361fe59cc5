//! A grant covering `proc` never reaches the agent's own process (issue 26, item 4).
//!
//! The capabilities run in the test process, so it is the agent here. Each test takes the
//! machine's `/` as the host root (what `--root /` gives) with a read grant on `proc` and on
//! a temp dir, and has the probe guest try every spelling of the agent's process: `self`,
//! `thread-self`, its pid, the id of the thread making the call, `task/<tid>` beneath them,
//! the links procfs makes into `self` (`proc/net`, `proc/mounts`), the magic link back to `/`
//! (`proc/<pid>/root` of a child), and links planted in the granted temp dir. Every one is
//! `denied`; so is another process of the agent's binary (the test binary started again).
//! Other processes (PID 1, a child the agent started) stay readable, as the grant says.
//! Nothing is written: the grants are read grants, and the mount is only planned.

mod common;

use common::*;
use nodeward::audit::Redactor;
use nodeward::caps::RunContext;
use nodeward::hostpath::HostRoot;
use nodeward::plan::RunMode;
use serde_json::{Value, json};
use std::os::unix::fs::symlink;
use std::path::Path;
use std::sync::Arc;

/// A run over the machine's `/`, as `--root /` makes it.
fn system_root(mode: RunMode) -> Arc<RunContext> {
    let root = HostRoot::open(Path::new("/")).expect("open /");
    assert!(root.is_system_root());
    Arc::new(RunContext::new(root, mode, Redactor::default()))
}

/// This process's id and the id of the calling thread, as `/proc/thread-self` names them.
fn pid_and_tid() -> (String, String) {
    let own = std::fs::read_link("/proc/thread-self").expect("/proc/thread-self");
    let own = own.to_str().expect("utf-8").to_string();
    let (pid, tid) = own.split_once("/task/").expect("<pid>/task/<tid>");
    assert_eq!(pid, std::process::id().to_string());
    (pid.to_string(), tid.to_string())
}

/// A temp dir under `/` and its host path (no leading `/`).
fn granted_dir() -> (tempfile::TempDir, String) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let real = tmp.path().canonicalize().expect("canonical tempdir");
    let rel = real
        .strip_prefix("/")
        .expect("absolute")
        .to_str()
        .expect("utf-8")
        .to_string();
    (tmp, rel)
}

/// A child of the agent (as `modprobe` is one), killed and reaped when dropped.
struct Sleeper(std::process::Child);

impl Sleeper {
    fn start() -> Sleeper {
        Sleeper(
            std::process::Command::new("sleep")
                .arg("30")
                .spawn()
                .expect("spawn sleep"),
        )
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Sleeper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn read_grants(dir: &str) -> nodeward::grants::Grants {
    grants(&format!("[fs]\nread = [\"proc\", \"{dir}\"]\n"))
}

fn read(path: &str) -> Value {
    json!({"op": "fs.read-file", "path": path})
}

/// Asserts each result is `denied` naming the agent's process, and that none holds what the
/// agent's environment holds.
fn assert_all_denied(results: &[Value], calls: &[Value]) {
    let marker = std::env::var("PATH").unwrap_or_default();
    for (r, c) in results.iter().zip(calls) {
        assert_eq!(kind(r), "denied", "{c} gave {r}");
        let m = r
            .pointer("/err/message")
            .and_then(Value::as_str)
            .unwrap_or("");
        assert!(m.contains("the agent's own process"), "{c}: {m}");
        assert!(
            marker.is_empty() || !r.to_string().contains(&marker),
            "{c}: {r}"
        );
    }
}

/// The spellings of the issue and the links procfs makes into `self`.
#[test]
fn every_spelling_of_the_agents_own_process_is_denied() {
    let (pid, tid) = pid_and_tid();
    let (_tmp, dir) = granted_dir();
    // A child's `root` is a magic link back to `/` that the agent may read (PID 1's needs
    // more than a container's root has).
    let child = Sleeper::start();
    let child_root = format!("proc/{}/root", child.pid());
    for mode in [RunMode::Apply, RunMode::Plan] {
        let calls = vec![
            read("proc/self/environ"),
            read("proc/self/cmdline"),
            read("proc/thread-self/environ"),
            read(&format!("proc/{pid}/environ")),
            read(&format!("proc/{pid}/cmdline")),
            read(&format!("proc/{tid}/environ")),
            read(&format!("proc/{pid}/task/{tid}/environ")),
            read(&format!("proc/{tid}/task/{tid}/environ")),
            read(&format!("proc/{pid}/task/{pid}/environ")),
            read("proc/net/dev"),
            read("proc/mounts"),
            read(&format!("{child_root}/proc/self/environ")),
            read(&format!("{child_root}/proc/{pid}/environ")),
            json!({"op": "fs.stat", "path": "proc/self"}),
            json!({"op": "fs.stat", "path": format!("proc/{pid}")}),
            json!({"op": "fs.list-dir", "path": "proc/self/fd"}),
            json!({"op": "fs.list-dir", "path": format!("proc/{tid}/task")}),
        ];
        let r = probe(
            &system_root(mode),
            read_grants(&dir),
            Value::Array(calls.clone()),
        );
        assert_all_denied(&r, &calls);
    }
    drop(child);
}

/// Links in a granted directory, absolute (the machine's `/` is the root) and relative, to
/// the agent's process and into it: each is followed and refused.
#[test]
fn links_planted_in_a_granted_dir_do_not_reach_the_agent() {
    let (pid, _) = pid_and_tid();
    let (tmp, dir) = granted_dir();
    let up = "../".repeat(dir.split('/').count());
    symlink("/proc/self", tmp.path().join("abs")).expect("abs");
    symlink(format!("{up}proc/thread-self"), tmp.path().join("rel")).expect("rel");
    symlink(format!("/proc/{pid}/environ"), tmp.path().join("env")).expect("env");
    symlink("/proc", tmp.path().join("p")).expect("p");
    let calls = vec![
        read(&format!("{dir}/abs/environ")),
        read(&format!("{dir}/rel/environ")),
        read(&format!("{dir}/env")),
        read(&format!("{dir}/p/self/cmdline")),
        read(&format!("{dir}/p/net/dev")),
        json!({"op": "fs.list-dir", "path": format!("{dir}/abs/fd")}),
    ];
    let r = probe(
        &system_root(RunMode::Apply),
        read_grants(&dir),
        Value::Array(calls.clone()),
    );
    assert_all_denied(&r, &calls);
}

/// `.` and empty components never make a host path (`invalid-argument`), so they cannot
/// smuggle `self` past a check either.
#[test]
fn dot_and_empty_components_are_refused_before_any_check() {
    let (_tmp, dir) = granted_dir();
    let r = probe(
        &system_root(RunMode::Apply),
        read_grants(&dir),
        json!([read("proc//self/environ"), read("proc/./self/environ")]),
    );
    let kinds: Vec<String> = r.iter().map(kind).collect();
    assert_eq!(kinds, ["invalid-argument", "invalid-argument"], "{r:?}");
}

/// The grant still means what it says for everything else: procfs's own files, PID 1, and a
/// child the agent started (as it starts `modprobe`) are readable; the agent's thread id under
/// another process is what the kernel says it is there (nothing).
#[test]
fn other_processes_stay_readable() {
    let (_, tid) = pid_and_tid();
    let (_tmp, dir) = granted_dir();
    let child = Sleeper::start();
    let child_pid = child.pid();
    let r = probe(
        &system_root(RunMode::Apply),
        read_grants(&dir),
        json!([
            read("proc/uptime"),
            read("proc/1/stat"),
            read(&format!("proc/{child_pid}/stat")),
            read(&format!("proc/1/task/{tid}/environ")),
            {"op": "fs.list-dir", "path": "proc"},
        ]),
    );
    drop(child);
    let kinds: Vec<String> = r.iter().map(kind).collect();
    assert_eq!(kinds, ["ok", "ok", "ok", "not-found", "ok"], "{r:?}");
    // Its `stat` (its command line may still be empty: spawning returns while the child's
    // exec sets it up).
    let stat = ok(&r[2]).as_str().unwrap_or_default();
    assert!(stat.starts_with(&format!("{} (", child_pid)), "{stat}");
}

/// A mount's source is resolved through its descriptor, not the resolution above: a bind of
/// `proc/self` (planned here, so nothing is mounted) is refused too.
#[test]
fn a_bind_of_the_agents_process_is_denied() {
    let (_tmp, dir) = granted_dir();
    std::fs::create_dir(Path::new("/").join(&dir).join("m")).expect("mount point");
    let g = grants(&format!(
        "[fs]\nread = [\"proc\", \"{dir}\"]\n[mounts]\ntargets = [\"{dir}\"]\n"
    ));
    let r = probe(
        &system_root(RunMode::Plan),
        g,
        json!([
            {"op": "mounts.bind", "source": "proc/self", "target": format!("{dir}/m"), "read-only": true},
            {"op": "mounts.bind", "source": "proc/thread-self", "target": format!("{dir}/m"), "read-only": true},
        ]),
    );
    let kinds: Vec<String> = r.iter().map(kind).collect();
    assert_eq!(kinds, ["denied", "denied"], "{r:?}");
}

/// What a process of the agent's binary started by [`Sibling`] does: waits, with a marker in
/// its environment, until its stdin closes. Run alone only there (it does nothing otherwise).
#[test]
#[ignore = "run by `Sibling` as a second process of the agent's binary"]
fn sibling_of_the_agent_waits() {
    if std::env::var_os("NW_SIBLING_MARKER").is_none() {
        return;
    }
    println!("sibling ready");
    let mut rest = Vec::new();
    let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut rest);
}

/// A second process running the agent's own binary (as the daemon is to the
/// `nodeward upgrade` it starts), waiting until dropped. Its stdout stays open (the reader
/// is kept) so that it is killed, not broken by a closed pipe.
struct Sibling {
    child: std::process::Child,
    _stdout: std::io::BufReader<std::process::ChildStdout>,
}

impl Sibling {
    const MARKER: &'static str = "nw-sibling-environ-marker";

    fn start() -> Sibling {
        use std::io::{BufRead, Read};
        use std::process::{Command, Stdio};
        let exe = std::env::current_exe().expect("the test binary");
        let mut child = Command::new(exe)
            .args([
                "--exact",
                "sibling_of_the_agent_waits",
                "--ignored",
                "--nocapture",
            ])
            .env("NW_SIBLING_MARKER", Self::MARKER)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn the sibling");
        let out = child.stdout.take().expect("sibling stdout");
        let mut out = std::io::BufReader::new(out);
        let ready = out
            .by_ref()
            .lines()
            .map_while(Result::ok)
            .any(|l| l.contains("sibling ready"));
        assert!(ready, "the sibling never got ready");
        Sibling {
            child,
            _stdout: out,
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Sibling {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Another process of the agent's binary (the daemon while its child runs the phase) is the
/// agent too: its environment, command line, open files and directory are denied, and a
/// bind of it as well; a process of another binary (`sleep`) stays readable.
#[test]
fn another_process_of_the_agents_binary_is_denied() {
    let (_tmp, dir) = granted_dir();
    std::fs::create_dir(Path::new("/").join(&dir).join("m")).expect("mount point");
    let sibling = Sibling::start();
    let sib = sibling.pid();
    let sleeper = Sleeper::start();
    let calls = vec![
        read(&format!("proc/{sib}/environ")),
        read(&format!("proc/{sib}/cmdline")),
        read(&format!("proc/{sib}/maps")),
        read(&format!("proc/{sib}/task/{sib}/environ")),
        json!({"op": "fs.stat", "path": format!("proc/{sib}")}),
        json!({"op": "fs.list-dir", "path": format!("proc/{sib}/fd")}),
    ];
    let g = format!("[fs]\nread = [\"proc\", \"{dir}\"]\n[mounts]\ntargets = [\"{dir}\"]\n");
    let r = probe(
        &system_root(RunMode::Apply),
        grants(&g),
        Value::Array(calls.clone()),
    );
    assert_all_denied(&r, &calls);
    assert!(!format!("{r:?}").contains(Sibling::MARKER), "{r:?}");
    let r = probe(
        &system_root(RunMode::Plan),
        grants(&g),
        json!([
            {"op": "mounts.bind", "source": format!("proc/{sib}"), "target": format!("{dir}/m"), "read-only": true},
            read(&format!("proc/{}/cmdline", sleeper.pid())),
        ]),
    );
    drop(sibling);
    drop(sleeper);
    let kinds: Vec<String> = r.iter().map(kind).collect();
    assert_eq!(kinds, ["denied", "ok"], "{r:?}");
}
