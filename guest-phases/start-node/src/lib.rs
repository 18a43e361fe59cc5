//! The `start-node` phase: writes the node's two units, enables them, and starts (or restarts)
//! what must run on the current binaries and configuration.
//!
//! # Expected flow
//! 1. `opt/nodeward/node/current/bin/{containerd,kubelet}` must exist (`install` made them).
//! 2. Write `nodeward-containerd.service` and `nodeward-kubelet.service`; their contents depend
//!    only on the layout. `daemon-reload` when either changed.
//! 3. Enable both (`WantedBy=multi-user.target`: the node comes back after a reboot).
//! 4. containerd: start when not running; restart when running and its unit, its config
//!    (`containerd-config` in `input.restart`) or the binaries (`binaries`) changed.
//! 5. kubelet: likewise, on its unit, `kubelet-config`, `binaries`, or a containerd restart.
//!    `cni-config` restarts nothing: CNI configuration is read per pod sandbox.
//!
//! # Caveats
//! When `status` is `unavailable` (a plan on a machine without systemd) the units count as
//! stopped, so the plan shows the starts; an apply there fails at the start with `unavailable`.

wit_bindgen::generate!({ world: "start-node", path: "../../wit" });

use exports::nodeward::host::phase::{Guest, Report};
use nodeward::host::types::Error;
use nodeward::host::{fs, systemd};
use nodeward_guest_common::check_plain_path;
use nodeward_node_config::layout::{self, Layout};

nodeward_guest_common::phase_helpers!();

const HEADER: &str = "# managed by nodeward (start-node); local edits are overwritten\n";

/// containerd's unit. `KillMode=mixed`: stopping sends SIGTERM to containerd alone, then
/// SIGKILL to everything left in the unit's cgroup, the shims included, so stopping (or
/// resetting) the node ends its shims; containers themselves live in `kubepods.slice`, which
/// `stop-node` stops next. (containerd's upstream unit says `KillMode=process` to keep shims
/// across containerd restarts; a restart here restarts the containers too, and the kubelet
/// restarts them.)
fn containerd_unit(l: &Layout) -> String {
    let current = l.abs(layout::CURRENT_LINK);
    format!(
        "{HEADER}[Unit]
Description=containerd container runtime (nodeward node)
Documentation=https://containerd.io
After=network.target local-fs.target

[Service]
Type=notify
# containerd finds containerd-shim-runc-v2 and runc on PATH: the active version's first.
Environment=PATH={current}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
ExecStart={current}/bin/containerd --config {config}
Delegate=yes
# mixed: SIGTERM to containerd, then SIGKILL to what is left in this cgroup (its shims), so
# stopping this unit ends the shims; reset relies on it.
KillMode=mixed
Restart=always
RestartSec=2
LimitNOFILE=infinity
LimitNPROC=infinity
LimitCORE=infinity
TasksMax=infinity
OOMScoreAdjust=-999
TimeoutStopSec=30

[Install]
WantedBy=multi-user.target
",
        config = l.abs(layout::CONTAINERD_CONFIG),
    )
}

/// The kubelet's unit: its flags come from `configure`'s EnvironmentFile, so a flag change
/// is a file change (`kubelet-config`), not a unit change.
fn kubelet_unit(l: &Layout) -> String {
    format!(
        "{HEADER}[Unit]
Description=kubelet (nodeward node)
Documentation=https://kubernetes.io/docs/reference/command-line-tools-reference/kubelet/
After={containerd}
Wants={containerd}

[Service]
EnvironmentFile={flags}
ExecStart={current}/bin/kubelet $KUBELET_ARGS
Restart=always
RestartSec=2
KillMode=mixed
TimeoutStopSec=30

[Install]
WantedBy=multi-user.target
",
        containerd = layout::CONTAINERD_UNIT,
        flags = l.abs(layout::KUBELET_FLAGS),
        current = l.abs(layout::CURRENT_LINK),
    )
}

/// Whether `unit` runs; `false` (with a warning) when systemd is unavailable.
fn running(unit: &str) -> Result<bool, String> {
    match systemd::status(unit) {
        Ok(st) => Ok(matches!(
            st.active_state.as_str(),
            "active" | "activating" | "reloading"
        )),
        Err(Error::Unavailable(m)) => {
            warn(&format!(
                "status of {unit}: systemd unavailable ({m}); assuming it is stopped"
            ));
            Ok(false)
        }
        Err(e) => Err(format!("status of {unit}: {}", describe(e))),
    }
}

/// Starts `unit`, or restarts it when it runs and `restart` says so. Returns the report tag.
fn converge(unit: &str, name: &str, restart: bool) -> Result<Option<String>, String> {
    if !running(unit)? {
        let o = systemd::start(unit).map_err(|e| format!("starting {unit}: {}", describe(e)))?;
        if touched(o) {
            info(&format!("{unit} started"));
            return Ok(Some(format!("{name}-started")));
        }
        return Ok(None);
    }
    if restart {
        systemd::restart(unit).map_err(|e| format!("restarting {unit}: {}", describe(e)))?;
        info(&format!("{unit} restarted"));
        return Ok(Some(format!("{name}-restarted")));
    }
    Ok(None)
}

struct StartNode;

impl Guest for StartNode {
    fn run(input: String) -> Result<Report, String> {
        let input = nodeward_guest_common::parse_input(&input)?;
        let l = &input.layout;
        check_plain_path(&l.abs(""))?;
        // A version must be linked: `install` links only a complete one. The link itself is
        // checked, not what is behind it, so a plan (whose link exists only in its overlay)
        // plans the units too.
        {
            let path = layout::CURRENT_LINK;
            let linked = fs::stat(path)
                .map_err(|e| format!("stat {path}: {}", describe(e)))?
                .is_some_and(|st| matches!(st.kind, fs::FileKind::Symlink));
            if !linked {
                return Err(format!(
                    "{path} is not a link to a version: run install first"
                ));
            }
        }

        let mut changed = Vec::new();
        let mut unit_changed = [false; 2];
        for (i, (unit, contents)) in [
            (layout::CONTAINERD_UNIT, containerd_unit(l)),
            (layout::KUBELET_UNIT, kubelet_unit(l)),
        ]
        .into_iter()
        .enumerate()
        {
            let o = systemd::write_unit(unit, &contents)
                .map_err(|e| format!("writing {unit}: {}", describe(e)))?;
            if touched(o) {
                info(&format!("unit {unit} {}", verb(o)));
                unit_changed[i] = true;
                changed.push(format!("{unit} {}", verb(o)));
            }
        }
        if unit_changed.iter().any(|c| *c) {
            systemd::daemon_reload().map_err(|e| format!("daemon-reload: {}", describe(e)))?;
        }
        for unit in [layout::CONTAINERD_UNIT, layout::KUBELET_UNIT] {
            let o =
                systemd::enable(unit).map_err(|e| format!("enabling {unit}: {}", describe(e)))?;
            if touched(o) {
                changed.push(format!("{unit} enabled"));
            }
        }

        let asked = |group: &str| input.restart.iter().any(|g| g == group);
        let mut tags: Vec<String> = Vec::new();
        let containerd = converge(
            layout::CONTAINERD_UNIT,
            "containerd",
            unit_changed[0] || asked("containerd-config") || asked("binaries"),
        )?;
        let containerd_restarted = containerd.as_deref() == Some("containerd-restarted");
        tags.extend(containerd);
        let kubelet = converge(
            layout::KUBELET_UNIT,
            "kubelet",
            unit_changed[1] || asked("kubelet-config") || asked("binaries") || containerd_restarted,
        )?;
        tags.extend(kubelet);
        if unit_changed.iter().any(|c| *c) {
            tags.insert(0, "units".to_string());
        }
        changed.extend(tags.iter().filter(|t| *t != "units").cloned());
        let summary = if changed.is_empty() {
            "node running, nothing to restart".to_string()
        } else {
            changed.join(", ")
        };
        Ok(Report {
            summary,
            changed: tags,
        })
    }
}

export!(StartNode);
