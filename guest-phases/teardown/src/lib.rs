//! The `teardown` phase: removes the node from the host (`nodeward reset`).
//!
//! # Expected flow
//! 1. Stop kubelet, containerd and `kubepods.slice`, as `stop-node` does.
//! 2. Unmount `input.mounts` (below the kubelet directory and containerd's state and root,
//!    deepest first): a plain unmount,
//!    then a lazy one when the mount is busy.
//! 3. Delete the pods' bridge `input.bridge` (the one the node's applied config names; none
//!    when the host gave none) and its veths (`network.delete-bridge`).
//! 4. Remove the empty `kubepods.slice` and `kubepods` cgroups the kubelet left in every
//!    hierarchy (`cgroups.remove-empty`); one that still has processes is named in a warning.
//! 5. Disable and remove both units, `daemon-reload`, `reset-failed` both.
//! 6. Remove the files nodeward wrote (containerd config, CA, bootstrap kubeconfig, CNI
//!    network, modules-load and sysctl drop-ins), the `opt/cni/bin` link, then recursively
//!    the version directories, the kubelet directory, containerd's root and state, and the CNI
//!    state. `fs.remove-all` never crosses into a mount, so a mount the host did not list stops
//!    the phase rather than losing what is mounted there.
//! 7. Remove the directories setup-host made when they are empty: `etc/kubernetes/manifests`,
//!    `etc/kubernetes/pki`, `etc/kubernetes`, `etc/containerd`, `etc/cni/net.d`, `opt/cni`.
//!    A static pod manifest or a CNI network someone else put there stays, with its directory.
//!
//! # Guarantees
//! Idempotent: on a clean root every step is `unchanged` and the phase succeeds; on a
//! half-bootstrapped root it removes whatever is there. `var/lib/nodeward` (the agent's state)
//! is never touched: the host removes the node's state files after this phase.
//!
//! # Caveats
//! When systemd is unavailable (a root without a system bus, e.g. a test root) the unit
//! lifecycle steps are skipped with a warning: nothing there can be running under systemd.
//! When no cgroup file system is mounted (`unavailable`) the cgroup step is skipped with a
//! warning. Runtime kernel settings (sysctls, loaded modules, swap) are left as they are; only
//! their boot-time drop-ins are removed.

wit_bindgen::generate!({ world: "teardown", path: "../../wit" });

use exports::nodeward::host::phase::{Guest, Report};
use nodeward::host::types::Error;
use nodeward::host::{cgroups, fs, mounts, network, systemd};
use nodeward_node_config::layout;

nodeward_guest_common::phase_helpers!();

const UNITS: &[&str] = &[layout::KUBELET_UNIT, layout::CONTAINERD_UNIT];
const STOP_ORDER: &[&str] = &[
    layout::KUBELET_UNIT,
    layout::CONTAINERD_UNIT,
    layout::PODS_SLICE,
];

/// The cgroups the kubelet makes in every hierarchy: `kubepods.slice` with the systemd cgroup
/// driver (what `configure` writes), `kubepods` with the cgroupfs one.
const POD_CGROUPS: &[&str] = &[layout::PODS_SLICE, "kubepods"];

/// Files nodeward wrote, removed one by one.
const FILES: &[&str] = &[
    layout::CONTAINERD_CONFIG,
    layout::CA_CERT,
    layout::BOOTSTRAP_KUBECONFIG,
    layout::CNI_CONFLIST,
    layout::MODULES_LOAD,
    layout::SYSCTL_CONF,
];

/// Trees nodeward owns, removed recursively.
const TREES: &[&str] = &[
    layout::NODE_DIR,
    layout::KUBELET_DIR,
    layout::CONTAINERD_ROOT,
    layout::CONTAINERD_OPT,
    layout::CONTAINERD_STATE,
    layout::CNI_STATE_DIR,
];

/// Directories setup-host created, removed only when empty; children before parents.
const EMPTY_DIRS: &[&str] = &[
    layout::MANIFESTS_DIR,
    "etc/kubernetes/pki",
    "etc/kubernetes",
    "etc/containerd",
    layout::CNI_CONF_DIR,
    "opt/cni",
];

/// What this run removed or stopped, for the report.
#[derive(Default)]
struct Done {
    items: Vec<String>,
    systemd_missing: bool,
}

impl Done {
    /// A systemd call's result: `unavailable` is remembered (and warned about once) instead
    /// of failing the phase.
    fn systemd<T>(&mut self, what: &str, r: Result<T, Error>) -> Result<Option<T>, String> {
        match r {
            Ok(v) => Ok(Some(v)),
            Err(Error::Unavailable(m)) => {
                if !self.systemd_missing {
                    warn(&format!(
                        "systemd unavailable ({m}); skipping unit stop, disable, reload and reset-failed"
                    ));
                }
                self.systemd_missing = true;
                Ok(None)
            }
            Err(e) => Err(format!("{what}: {}", describe(e))),
        }
    }
}

fn stop_units(done: &mut Done) -> Result<(), String> {
    for unit in STOP_ORDER {
        if done.systemd_missing {
            return Ok(());
        }
        let r = systemd::stop(unit);
        if let Some(o) = done.systemd(&format!("stopping {unit}"), r)?
            && touched(o)
        {
            done.items.push(format!("{unit} stopped"));
        }
    }
    Ok(())
}

fn unmount(done: &mut Done, mounts_in: &[String]) -> Result<(), String> {
    for target in mounts_in {
        let o = match mounts::unmount(target, false) {
            Ok(o) => o,
            Err(Error::Io(m)) => {
                warn(&format!("unmounting {target}: {m}; detaching it lazily"));
                mounts::unmount(target, true)
                    .map_err(|e| format!("unmounting {target} lazily: {}", describe(e)))?
            }
            Err(e) => return Err(format!("unmounting {target}: {}", describe(e))),
        };
        if touched(o) {
            done.items.push(format!("{target} unmounted"));
        }
    }
    Ok(())
}

fn delete_bridge(done: &mut Done, bridge: &str) -> Result<(), String> {
    if bridge.is_empty() {
        return Ok(());
    }
    let o = network::delete_bridge(bridge)
        .map_err(|e| format!("deleting bridge {bridge}: {}", describe(e)))?;
    if touched(o) {
        done.items.push(format!("bridge {bridge} deleted"));
    }
    Ok(())
}

fn remove_cgroups(done: &mut Done) -> Result<(), String> {
    for path in POD_CGROUPS {
        let r = match cgroups::remove_empty(path) {
            Ok(r) => r,
            Err(Error::Unavailable(m)) => {
                warn(&format!("cgroups unavailable ({m}); skipping {path}"));
                continue;
            }
            Err(e) => return Err(format!("removing cgroups {path}: {}", describe(e))),
        };
        if r.removed > 0 {
            done.items
                .push(format!("{} {path} cgroups removed", r.removed));
        }
        if !r.kept.is_empty() {
            warn(&format!("{path} cgroups kept: {}", r.kept.join(", ")));
        }
    }
    Ok(())
}

fn remove_units(done: &mut Done, unit_dir: &str) -> Result<(), String> {
    let mut removed_units = false;
    for unit in UNITS {
        let file = format!("{unit_dir}/{unit}");
        let exists = fs::stat(&file)
            .map_err(|e| format!("stat {file}: {}", describe(e)))?
            .is_some();
        if exists && !done.systemd_missing {
            // `not-found`: systemd does not know the file (it is not in its unit path), so
            // nothing of it is enabled.
            let r = match systemd::disable(unit) {
                Err(Error::NotFound(_)) => Ok(nodeward::host::types::Outcome::Unchanged),
                r => r,
            };
            if let Some(o) = done.systemd(&format!("disabling {unit}"), r)?
                && touched(o)
            {
                done.items.push(format!("{unit} disabled"));
            }
        }
        let o =
            systemd::remove_unit(unit).map_err(|e| format!("removing {unit}: {}", describe(e)))?;
        if touched(o) {
            done.items.push(format!("{unit} removed"));
            removed_units = true;
        }
    }
    // Reload only when a unit file went away: a second reset changes nothing.
    if removed_units && !done.systemd_missing {
        let r = systemd::daemon_reload();
        done.systemd("daemon-reload", r)?;
    }
    for unit in UNITS {
        if done.systemd_missing {
            break;
        }
        match systemd::reset_failed(unit) {
            Ok(()) | Err(Error::NotFound(_)) => {}
            Err(e) => {
                done.systemd(&format!("reset-failed {unit}"), Err::<(), _>(e))?;
            }
        }
    }
    Ok(())
}

fn remove_files(done: &mut Done) -> Result<(), String> {
    for path in FILES {
        let o = fs::remove(path).map_err(|e| format!("removing {path}: {}", describe(e)))?;
        if touched(o) {
            done.items.push(format!("{path} removed"));
        }
    }
    // The CNI link is ours; a directory there is not (preflight refuses it), unless empty.
    let link = layout::CNI_BIN_DIR;
    match fs::stat(link).map_err(|e| format!("stat {link}: {}", describe(e)))? {
        Some(st) if st.kind == fs::FileKind::Directory => remove_if_empty(done, link)?,
        Some(_) => {
            fs::remove(link).map_err(|e| format!("removing {link}: {}", describe(e)))?;
            done.items.push(format!("{link} removed"));
        }
        None => {}
    }
    for tree in TREES {
        let o = fs::remove_all(tree).map_err(|e| format!("removing {tree}: {}", describe(e)))?;
        if touched(o) {
            done.items.push(format!("{tree} removed"));
        }
    }
    for dir in EMPTY_DIRS {
        remove_if_empty(done, dir)?;
    }
    Ok(())
}

fn remove_if_empty(done: &mut Done, dir: &str) -> Result<(), String> {
    let Some(st) = fs::stat(dir).map_err(|e| format!("stat {dir}: {}", describe(e)))? else {
        return Ok(());
    };
    if st.kind != fs::FileKind::Directory {
        return Ok(());
    }
    let entries = fs::list_dir(dir).map_err(|e| format!("list {dir}: {}", describe(e)))?;
    if !entries.is_empty() {
        info(&format!(
            "{dir} kept: it holds files nodeward did not write"
        ));
        return Ok(());
    }
    fs::remove(dir).map_err(|e| format!("removing {dir}: {}", describe(e)))?;
    done.items.push(format!("{dir} removed"));
    Ok(())
}

struct Teardown;

impl Guest for Teardown {
    fn run(input: String) -> Result<Report, String> {
        let input = nodeward_guest_common::parse_input(&input)?;
        let mut done = Done::default();
        stop_units(&mut done)?;
        unmount(&mut done, &input.mounts)?;
        delete_bridge(&mut done, &input.bridge)?;
        remove_cgroups(&mut done)?;
        remove_units(&mut done, &input.layout.unit_dir)?;
        remove_files(&mut done)?;
        let summary = if done.items.is_empty() {
            "nothing of the node left to remove".to_string()
        } else {
            done.items.join(", ")
        };
        Ok(Report {
            summary,
            changed: if done.items.is_empty() {
                Vec::new()
            } else {
                vec!["node-removed".to_string()]
            },
        })
    }
}

export!(Teardown);
