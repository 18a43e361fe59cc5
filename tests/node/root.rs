//! [`NodeRoot`]: a temporary host root for `nodeward bootstrap --root`, and the cleanup that
//! proves the node left nothing on the shared host.
//!
//! The none-mode tests run real containerd and kubelets inside the systemd harness, which other
//! tests share; a node below a temporary root must not leak units, processes, mounts, cgroups,
//! bridges or host paths. The fixture records the host's state before the node starts
//! ([`super::host`]), binds the harness's unit directory (and, for a real kubelet, scratch
//! directories over its hard-coded paths) into the root, and its teardown removes what is new
//! and then asserts that nothing is left.

use super::host::{
    files_below, kubepods_cgroups, loaded_nodeward_units, mount_points, node_processes, run,
};
use super::tree::{Entry, KUBELET_DIR_KEPT, TREE_EXCLUDES, snapshot};
use super::{lock, require_harness};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

/// What a [`NodeRoot`] sets up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RootKind {
    /// A temporary root only: plan-mode and tree tests, anywhere.
    Plain,
    /// Inside the systemd harness: the harness's unit directory bound at
    /// `<root>/etc/systemd/system`.
    Harness,
    /// [`RootKind::Harness`] plus scratch directories over `/var/lib/kubelet`, `/var/log/pods`
    /// and `/var/log/containers` (a real kubelet hard-codes them), as
    /// `scripts/kube-node-start.sh` does; also records `net.ipv4.ip_forward`, which the CNI
    /// bridge plugin turns on, to restore it.
    HarnessRealKubelet,
}

/// The unit directory of the harness (its scratch `$STATE/units`).
pub const HARNESS_UNIT_DIR: &str = "/etc/systemd/system";
/// The paths a real kubelet hard-codes.
pub const KUBELET_HOST_PATHS: &[&str] =
    &["/var/lib/kubelet", "/var/log/pods", "/var/log/containers"];
/// The units nodeward writes in none mode (`node_config::layout`).
pub const NODE_UNITS: &[&str] = &["nodeward-containerd.service", "nodeward-kubelet.service"];

/// Host paths a node's components use by default; a none node below a temporary root must not
/// create any of them on the shared host ([`NodeRoot::leftovers`] reports a new one). E.g.
/// containerd's `io.containerd.internal.v1.opt` plugin makes `/opt/containerd` unless its `path`
/// is set, and the kubelet makes `/usr/libexec/kubernetes/...` unless `volumePluginDir` is.
pub const HOST_PATHS_WATCHED: &[&str] = &[
    "/opt/containerd",
    "/var/lib/containerd",
    "/etc/containerd",
    "/run/containerd",
    "/opt/cni",
    "/etc/cni",
    "/var/lib/cni",
    "/usr/libexec/kubernetes",
    "/etc/kubernetes",
    "/var/lib/nodeward",
];

/// Where containerd 1.6's shims put their sockets (`/run/containerd/s`), hard-coded: a node
/// beneath a temporary root still makes it, in the harness's private /run. A reset of a root
/// other than `/` cannot remove it (it is outside the root); the fixture does.
pub const SHIM_SOCKET_PARENT: &str = "/run/containerd";

/// libcni's cache of each pod network's result (`/var/lib/cni/results/<net>-<id>-<if>`),
/// hard-coded in containerd 1.6's CRI plugin (no config moves it): a node beneath a temporary
/// root writes it on the shared host, where its reset cannot reach. With the root `/` it is
/// the node's CNI state directory, which reset removes. The fixture removes what the node
/// added.
pub const CNI_CACHE_DIR: &str = "/var/lib/cni";

/// What a reset of a temporary root legitimately leaves on the shared host, as
/// [`NodeRoot::leftovers`] words it: the two hard-coded directories above, outside the root.
pub fn outside_the_root(leftover: &str) -> bool {
    [SHIM_SOCKET_PARENT, CNI_CACHE_DIR]
        .iter()
        .any(|d| leftover.starts_with(&format!("created on the host: {d} ")))
        || leftover.starts_with(&format!("file added on the host: {CNI_CACHE_DIR}/"))
}

/// A temporary host root for `nodeward bootstrap --root`, in `/tmp/nodeward-noneroot-*/`:
/// `root/` (the host root), `state/` (the agent's state directory, `--state-dir`; its
/// `compiled/` is shared by every root of this build, so each phase is compiled once),
/// `audit/` (the audit trail, `--audit-dir`: the agent's own record, kept out of the root so
/// tree comparisons see only what the phases did), `config.yaml`, `scratch/` (what is bound
/// over the kubelet's host paths).
///
/// Only one lives at a time per test binary (it holds a lock): the units have fixed names.
/// [`NodeRoot::teardown`] (or drop) stops the node's units, kills what is left of its processes
/// (by PID), unmounts, undoes the binds, removes the unit files the node wrote into the harness,
/// deletes the bridge and restores `ip_forward` (real kubelet), removes the directory, and then
/// **asserts** that nothing is left ([`NodeRoot::leftovers`] is the same check, without the
/// cleanup, for tests of nodeward's own teardown).
pub struct NodeRoot {
    pub kind: RootKind,
    /// The temporary directory holding everything.
    pub dir: PathBuf,
    /// The host root.
    pub root: PathBuf,
    /// `--state-dir`.
    pub state_dir: PathBuf,
    /// `--audit-dir`.
    pub audit_dir: PathBuf,
    /// Where [`NodeRoot::write_config`] writes.
    pub config_path: PathBuf,
    /// Mount points this fixture bound, in order.
    binds: Vec<PathBuf>,
    /// Of those, the recursive (and private) ones: what is mounted beneath them is theirs.
    rbinds: Vec<PathBuf>,
    /// Mount points this fixture created (did not exist), to remove again.
    created: Vec<PathBuf>,
    /// Mount points before the fixture started.
    mounts_before: BTreeSet<String>,
    /// Entries of the harness unit dir before (relative paths).
    units_before: BTreeSet<PathBuf>,
    /// `nodeward-*` units loaded before.
    loaded_before: BTreeSet<String>,
    ip_forward_before: Option<String>,
    /// Which of [`HOST_PATHS_WATCHED`] existed before.
    host_paths_before: BTreeSet<&'static str>,
    /// Files beneath [`CNI_CACHE_DIR`] before, when it existed.
    cni_cache_before: BTreeSet<PathBuf>,
    /// The network links before (names).
    links_before: BTreeSet<String>,
    /// The bridge of the written config (deleted at teardown).
    bridge: Option<String>,
    done: bool,
    _guard: MutexGuard<'static, ()>,
}

impl NodeRoot {
    pub fn new(kind: RootKind) -> NodeRoot {
        static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
        let guard = lock(&ONE_AT_A_TIME);
        if kind != RootKind::Plain {
            require_harness();
        }
        let dir = tempfile::Builder::new()
            .prefix("nodeward-noneroot-")
            .tempdir_in("/tmp")
            .expect("temp root")
            .keep();
        let root = dir.join("root");
        let state_dir = dir.join("state");
        let audit_dir = dir.join("audit");
        std::fs::create_dir_all(&root).expect("root");
        std::fs::create_dir_all(&state_dir).expect("state");
        let shared_compiled = Path::new(env!("CARGO_TARGET_TMPDIR")).join("none-compiled-cache");
        std::fs::create_dir_all(&shared_compiled).expect("compiled cache");
        std::os::unix::fs::symlink(&shared_compiled, state_dir.join("compiled"))
            .expect("compiled link");
        let mut me = NodeRoot {
            kind,
            config_path: dir.join("config.yaml"),
            dir,
            root,
            state_dir,
            audit_dir,
            binds: Vec::new(),
            rbinds: Vec::new(),
            created: Vec::new(),
            mounts_before: BTreeSet::new(),
            units_before: BTreeSet::new(),
            loaded_before: BTreeSet::new(),
            ip_forward_before: None,
            host_paths_before: BTreeSet::new(),
            cni_cache_before: BTreeSet::new(),
            links_before: BTreeSet::new(),
            bridge: None,
            done: false,
            _guard: guard,
        };
        if kind == RootKind::Plain {
            return me;
        }
        me.mounts_before = mount_points();
        me.host_paths_before = HOST_PATHS_WATCHED
            .iter()
            .copied()
            .filter(|p| Path::new(p).exists())
            .collect();
        me.cni_cache_before = files_below(Path::new(CNI_CACHE_DIR));
        me.links_before = links();
        me.units_before = files_below(Path::new(HARNESS_UNIT_DIR));
        me.loaded_before = loaded_nodeward_units();
        for u in NODE_UNITS {
            assert!(
                !me.loaded_before.contains(*u),
                "{u} is already loaded in the harness: another node is running"
            );
        }
        let unit_dir = me.root.join("etc/systemd/system");
        std::fs::create_dir_all(&unit_dir).expect("unit dir");
        me.bind(Path::new(HARNESS_UNIT_DIR), &unit_dir);
        if kind == RootKind::HarnessRealKubelet {
            me.ip_forward_before = std::fs::read_to_string("/proc/sys/net/ipv4/ip_forward").ok();
            for p in KUBELET_HOST_PATHS {
                let scratch = me.dir.join("scratch").join(p.replace('/', "_"));
                std::fs::create_dir_all(&scratch).expect("scratch dir");
                let target = Path::new(p);
                if !target.is_dir() {
                    std::fs::create_dir(target)
                        .unwrap_or_else(|e| panic!("mkdir {}: {e}", target.display()));
                    me.created.push(target.to_path_buf());
                }
                me.bind(&scratch, target);
            }
            // The machine's cgroup tree where a reset of this root looks for it
            // (`sys/fs/cgroup` beneath the root): the kubelet makes its cgroups in the real one.
            let cgroups = me.root.join("sys/fs/cgroup");
            std::fs::create_dir_all(&cgroups).expect("mkdir sys/fs/cgroup");
            me.rbind(Path::new("/sys/fs/cgroup"), &cgroups);
        }
        me
    }

    /// `mount --rbind`, then `--make-rprivate` so that undoing it never propagates back.
    fn rbind(&mut self, src: &Path, target: &Path) {
        for args in [&["-n", "--rbind"][..], &["-n", "--make-rprivate"][..]] {
            let mut c = Command::new("mount");
            c.args(args);
            if args[1] == "--rbind" {
                c.arg(src);
            }
            let out = c.arg(target).output().expect("mount");
            assert!(
                out.status.success(),
                "mount {args:?} {}: {}",
                target.display(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        self.binds.push(target.to_path_buf());
        self.rbinds.push(target.to_path_buf());
    }

    /// Whether mount point `m` is, or lies beneath, one of this fixture's recursive binds.
    fn under_rbind(&self, m: &str) -> bool {
        self.rbinds.iter().any(|b| Path::new(m).starts_with(b))
    }

    fn bind(&mut self, src: &Path, target: &Path) {
        let out = Command::new("mount")
            .args(["-n", "--bind"])
            .arg(src)
            .arg(target)
            .output()
            .expect("mount");
        assert!(
            out.status.success(),
            "mount --bind {} {}: {}",
            src.display(),
            target.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        self.binds.push(target.to_path_buf());
    }

    /// Writes the node config; remembers its `network.bridgeName` for the teardown.
    pub fn write_config(&mut self, yaml: &str) -> PathBuf {
        std::fs::write(&self.config_path, yaml).expect("write config");
        let doc: Value = serde_yaml_ng::from_str(yaml).unwrap_or(Value::Null);
        self.bridge = doc["network"]["bridgeName"].as_str().map(str::to_string);
        self.config_path.clone()
    }

    /// The `network.bridgeName` of the written config, if it names one.
    pub fn bridge(&self) -> Option<&str> {
        self.bridge.as_deref()
    }

    /// A `nodeward` command with `--root`, `--state-dir`, `--audit-dir` and (once written)
    /// `--config` set through their environment variables, so `args` may still override them.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_nodeward"));
        c.args(args)
            .env("NODEWARD_ROOT", &self.root)
            .env("NODEWARD_STATE_DIR", &self.state_dir)
            .env("NODEWARD_AUDIT_DIR", &self.audit_dir)
            .env_remove("NODEWARD_CONFIG")
            .env_remove("NODEWARD_BUNDLE");
        if self.config_path.exists() {
            c.env("NODEWARD_CONFIG", &self.config_path);
        }
        c
    }

    /// Runs `nodeward ARGS` (see [`NodeRoot::command`]) to completion.
    pub fn nodeward(&self, args: &[&str]) -> Output {
        self.command(args).output().expect("nodeward runs")
    }

    /// A snapshot of the root: root-relative path → entry, without [`TREE_EXCLUDES`], the
    /// kubelet's own files in `var/lib/kubelet` (see [`KUBELET_DIR_KEPT`]) and what the
    /// harness's unit directory held before this root existed.
    pub fn tree(&self) -> BTreeMap<String, Entry> {
        self.tree_excluding(&[])
    }

    /// [`NodeRoot::tree`] leaving out `extra` root-relative paths too.
    pub fn tree_excluding(&self, extra: &[&str]) -> BTreeMap<String, Entry> {
        let units_before: BTreeSet<String> = self
            .units_before
            .iter()
            .map(|p| format!("etc/systemd/system/{}", p.display()))
            .collect();
        let skip = |rel: &str| {
            let below = |e: &&str| rel == *e || rel.starts_with(&format!("{e}/"));
            TREE_EXCLUDES.iter().any(below)
                || extra.iter().any(below)
                || units_before.contains(rel)
                || rel.strip_prefix("var/lib/kubelet/").is_some_and(|k| {
                    !KUBELET_DIR_KEPT
                        .iter()
                        .any(|keep| k == *keep || k.starts_with(&format!("{keep}/")))
                })
        };
        snapshot(&self.root, skip)
    }

    /// `(ActiveState, SubState)` of the node's units and of any other `nodeward-*` unit loaded
    /// since this root was made.
    pub fn unit_states(&self) -> BTreeMap<String, (String, String)> {
        let mut names: BTreeSet<String> = NODE_UNITS.iter().map(|s| s.to_string()).collect();
        names.extend(
            loaded_nodeward_units()
                .into_iter()
                .filter(|u| !self.loaded_before.contains(u)),
        );
        names
            .into_iter()
            .map(|u| {
                let out = run(
                    "systemctl",
                    &["show", "-p", "ActiveState", "-p", "SubState", &u],
                );
                let text = String::from_utf8_lossy(&out.stdout).into_owned();
                let get = |k: &str| {
                    text.lines()
                        .find_map(|l| l.strip_prefix(&format!("{k}=")))
                        .unwrap_or("")
                        .to_string()
                };
                let states = (get("ActiveState"), get("SubState"));
                (u, states)
            })
            .collect()
    }

    /// What the node left on the shared host, as readable problems: new `nodeward-*` units
    /// loaded, processes of the node, mounts that were not there before (beyond this fixture's
    /// binds), kubepods cgroups, the bridge and any other new link, host paths the node made
    /// (beyond the root), files it added to libcni's cache. Empty when nodeward's own teardown
    /// was complete (but for [`outside_the_root`] beneath a temporary root).
    pub fn leftovers(&self) -> Vec<String> {
        let mut p = Vec::new();
        for (pid, what) in node_processes(&self.root, self.kind != RootKind::Plain) {
            p.push(format!("process {pid}: {what}"));
        }
        if self.kind == RootKind::Plain {
            return p;
        }
        for u in loaded_nodeward_units() {
            if !self.loaded_before.contains(&u) {
                p.push(format!("unit loaded: {u}"));
            }
        }
        let binds: BTreeSet<String> = self
            .binds
            .iter()
            .map(|b| b.to_string_lossy().into_owned())
            .collect();
        for m in mount_points() {
            if !self.mounts_before.contains(&m) && !binds.contains(&m) && !self.under_rbind(&m) {
                p.push(format!("mounted: {m}"));
            }
        }
        for c in kubepods_cgroups() {
            p.push(format!("cgroup: {}", c.display()));
        }
        if let Some(b) = &self.bridge
            && Path::new("/sys/class/net").join(b).exists()
        {
            p.push(format!("bridge: {b}"));
        }
        for l in links().difference(&self.links_before) {
            if self.bridge.as_ref() != Some(l) {
                p.push(format!("link: {l}"));
            }
        }
        if self.host_paths_before.contains(CNI_CACHE_DIR) {
            for f in files_below(Path::new(CNI_CACHE_DIR)).difference(&self.cni_cache_before) {
                p.push(format!(
                    "file added on the host: {CNI_CACHE_DIR}/{}",
                    f.display()
                ));
            }
        }
        for h in HOST_PATHS_WATCHED {
            if !self.host_paths_before.contains(h) && Path::new(h).exists() {
                p.push(format!(
                    "created on the host: {h} (not removed by the fixture)"
                ));
            }
        }
        p
    }

    /// Cleans up (see the type's doc) and asserts that nothing is left; returns what the node
    /// had left before the cleanup (empty when nodeward tore it down itself).
    #[track_caller]
    pub fn teardown(mut self) -> Vec<String> {
        let before = self.leftovers();
        let problems = self.cleanup();
        assert!(
            problems.is_empty(),
            "the node root's teardown left things behind:\n  {}",
            problems.join("\n  ")
        );
        before
    }

    /// The cleanup; returns what is still left afterwards.
    fn cleanup(&mut self) -> Vec<String> {
        if self.done {
            return Vec::new();
        }
        self.done = true;
        let mut problems = Vec::new();
        if self.kind != RootKind::Plain {
            // Units: the node's, any new nodeward-* one, and the kubelet's pod slices.
            let mut units: BTreeSet<String> = NODE_UNITS.iter().map(|s| s.to_string()).collect();
            units.extend(
                loaded_nodeward_units()
                    .into_iter()
                    .filter(|u| !self.loaded_before.contains(u)),
            );
            // One by one (a failed stop of one must not keep the others running), the kubelet
            // before containerd (reverse order of the names).
            for u in units.iter().rev() {
                let _ = run("systemctl", &["stop", u]);
            }
            let pods = run(
                "systemctl",
                &[
                    "list-units",
                    "--all",
                    "--plain",
                    "--no-legend",
                    "--full",
                    "kubepods*",
                ],
            );
            for u in String::from_utf8_lossy(&pods.stdout)
                .lines()
                .filter_map(|l| l.split_whitespace().next())
            {
                let _ = run("systemctl", &["stop", u]);
            }
        }
        // Whatever still runs from the root: SIGKILL by PID.
        for _ in 0..20 {
            let procs = node_processes(&self.root, self.kind != RootKind::Plain);
            if procs.is_empty() {
                break;
            }
            for (pid, _) in procs {
                let _ = rustix::process::kill_process(
                    rustix::process::Pid::from_raw(pid as i32).expect("pid"),
                    rustix::process::Signal::KILL,
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        if self.kind != RootKind::Plain {
            // Mounts new since the start (containerd's, pods' volumes, netns), deepest first,
            // then this fixture's binds in reverse.
            for b in self.rbinds.iter().rev() {
                let ok = Command::new("umount")
                    .args(["-n", "-R"])
                    .arg(b)
                    .output()
                    .is_ok_and(|o| o.status.success());
                if !ok {
                    let _ = Command::new("umount")
                        .args(["-n", "-R", "-l"])
                        .arg(b)
                        .output();
                }
            }
            let binds: BTreeSet<String> = self
                .binds
                .iter()
                .map(|b| b.to_string_lossy().into_owned())
                .collect();
            let mut new: Vec<String> = mount_points()
                .into_iter()
                .filter(|m| !self.mounts_before.contains(m) && !binds.contains(m))
                .collect();
            new.sort_by_key(|m| std::cmp::Reverse(m.len()));
            for m in new.iter().chain(binds.iter().rev()) {
                umount(m);
            }
            for c in &self.created {
                if let Err(e) = std::fs::remove_dir(c) {
                    problems.push(format!("cannot remove {} (created here): {e}", c.display()));
                }
            }
            // Unit files the node wrote into the harness's unit directory.
            let now = files_below(Path::new(HARNESS_UNIT_DIR));
            let mut new_units: Vec<&PathBuf> = now.difference(&self.units_before).collect();
            new_units.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
            for rel in new_units {
                let p = Path::new(HARNESS_UNIT_DIR).join(rel);
                let _ = if p.is_dir() && !p.is_symlink() {
                    std::fs::remove_dir_all(&p)
                } else {
                    std::fs::remove_file(&p)
                };
            }
            // containerd 1.6's shims keep their sockets in /run/containerd/s whatever the
            // configured state directory is (hard-coded there); beneath a temporary root that
            // is the harness's private /run. Remove it when this root's node made it.
            if !self.host_paths_before.contains(SHIM_SOCKET_PARENT)
                && Path::new(SHIM_SOCKET_PARENT).exists()
            {
                let _ = std::fs::remove_dir_all(SHIM_SOCKET_PARENT);
            }
            // libcni's result cache, also hard-coded on the host (see `CNI_CACHE_DIR`).
            if !self.host_paths_before.contains(CNI_CACHE_DIR) {
                let _ = std::fs::remove_dir_all(CNI_CACHE_DIR);
            } else {
                let mut added: Vec<PathBuf> = files_below(Path::new(CNI_CACHE_DIR))
                    .difference(&self.cni_cache_before)
                    .cloned()
                    .collect();
                added.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
                for rel in added {
                    let p = Path::new(CNI_CACHE_DIR).join(rel);
                    let _ = std::fs::remove_file(&p).or_else(|_| std::fs::remove_dir(&p));
                }
            }
            let _ = run("systemctl", &["daemon-reload"]);
            let units: Vec<String> = loaded_nodeward_units()
                .into_iter()
                .filter(|u| !self.loaded_before.contains(u))
                .collect();
            for u in &units {
                let _ = run("systemctl", &["reset-failed", u]);
            }
            // kubepods cgroups in the hierarchies systemd does not manage: remove once empty.
            for _ in 0..10 {
                let left = kubepods_cgroups();
                if left.is_empty() {
                    break;
                }
                let mut all: Vec<PathBuf> = Vec::new();
                for c in left {
                    let mut below: Vec<PathBuf> = files_below(&c)
                        .into_iter()
                        .map(|r| c.join(r))
                        .filter(|p| p.is_dir())
                        .collect();
                    all.append(&mut below);
                    all.push(c);
                }
                all.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
                for d in all {
                    let _ = std::fs::remove_dir(d);
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            if let Some(b) = &self.bridge {
                delete_bridge(b);
            }
            // Veths the node made and nothing deleted (their pod's namespace outlived it).
            for l in links().difference(&self.links_before) {
                if l.starts_with("veth") {
                    let _ = run("ip", &["link", "del", l]);
                }
            }
            if let Some(v) = &self.ip_forward_before {
                let _ = std::fs::write("/proc/sys/net/ipv4/ip_forward", v);
            }
        }
        problems.extend(self.leftovers());
        if self.kind != RootKind::Plain {
            let unit_files = files_below(Path::new(HARNESS_UNIT_DIR));
            for f in unit_files.difference(&self.units_before) {
                problems.push(format!(
                    "unit file left: {HARNESS_UNIT_DIR}/{}",
                    f.display()
                ));
            }
            for b in &self.binds {
                let s = b.to_string_lossy().into_owned();
                if !self.mounts_before.contains(&s) && mount_points().contains(&s) {
                    problems.push(format!("still bound: {s}"));
                }
            }
            if let Some(v) = &self.ip_forward_before
                && std::fs::read_to_string("/proc/sys/net/ipv4/ip_forward")
                    .ok()
                    .as_ref()
                    != Some(v)
            {
                problems.push("net.ipv4.ip_forward not restored".into());
            }
        }
        if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            problems.push(format!("cannot remove {}: {e}", self.dir.display()));
        }
        problems
    }
}

/// The names of the links of the harness's network namespace (the machine's).
fn links() -> BTreeSet<String> {
    std::fs::read_dir("/sys/class/net")
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

fn umount(m: &str) {
    let ok = Command::new("umount")
        .args(["-n", m])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        let _ = Command::new("umount").args(["-n", "-l", m]).output();
    }
}

fn delete_bridge(bridge: &str) {
    let out = run("ip", &["-o", "link", "show", "master", bridge]);
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        if let Some(name) = line.split(": ").nth(1) {
            let name = name.split('@').next().unwrap_or(name);
            let _ = run("ip", &["link", "del", name]);
        }
    }
    if Path::new("/sys/class/net").join(bridge).exists() {
        let _ = run("ip", &["link", "del", bridge]);
    }
}

impl Drop for NodeRoot {
    fn drop(&mut self) {
        let problems = self.cleanup();
        if !problems.is_empty() {
            let msg = format!(
                "the node root's teardown left things behind:\n  {}",
                problems.join("\n  ")
            );
            if std::thread::panicking() {
                eprintln!("{msg}");
            } else {
                panic!("{msg}");
            }
        }
    }
}
