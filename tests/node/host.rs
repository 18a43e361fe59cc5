//! What a node leaves on the shared host, as the harness sees it: `nodeward-*` units systemd has
//! loaded, `kubepods*` cgroups, processes belonging to a node root, mount points.
//!
//! [`super::NodeRoot`] records these before a node starts and compares afterwards (its
//! teardown asserts nothing new is left); the tests use them directly to check nodeward's own
//! teardown (`reset`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub(super) fn run(cmd: &str, args: &[&str]) -> Output {
    Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{cmd}: {e}"))
}

pub(super) fn mount_points() -> BTreeSet<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .expect("mountinfo")
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        // mountinfo escapes spaces and such as \040; our paths have none.
        .map(str::to_string)
        .collect()
}

pub(super) fn files_below(dir: &Path) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if let Ok(rel) = p.strip_prefix(dir) {
                out.insert(rel.to_path_buf());
            }
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(p);
            }
        }
    }
    out
}

/// `nodeward-*` units systemd has loaded (any state).
pub fn loaded_nodeward_units() -> BTreeSet<String> {
    let out = run(
        "systemctl",
        &[
            "list-units",
            "--all",
            "--plain",
            "--no-legend",
            "--full",
            "nodeward-*",
        ],
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

/// `kubepods*` cgroup directories under /sys/fs/cgroup (the harness's own hierarchy).
pub fn kubepods_cgroups() -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![PathBuf::from("/sys/fs/cgroup")];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            if !e.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let p = e.path();
            if e.file_name().to_string_lossy().starts_with("kubepods") {
                found.push(p);
            } else if p.components().count() < 8 {
                stack.push(p);
            }
        }
    }
    found.sort();
    found
}

/// Processes that belong to the node under `root`: their executable is below it, their
/// command line names it (containerd's shims), or (with `kubepods`, inside the harness) they
/// are in a kubepods cgroup (containers, whose executables are in their own mount namespace).
pub fn node_processes(root: &Path, kubepods: bool) -> Vec<(u32, String)> {
    let me = std::process::id();
    let root_s = root.to_string_lossy().into_owned();
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if pid == me {
            continue;
        }
        let exe = std::fs::read_link(e.path().join("exe")).unwrap_or_default();
        let cmdline = std::fs::read(e.path().join("cmdline"))
            .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
            .unwrap_or_default();
        let cgroup = std::fs::read_to_string(e.path().join("cgroup")).unwrap_or_default();
        if exe.starts_with(root)
            || cmdline.contains(&root_s)
            || (kubepods && cgroup.contains("kubepods"))
        {
            found.push((pid, format!("{} ({})", cmdline.trim(), exe.display())));
        }
    }
    found
}
