//! The `stop-node` phase: stops the node, kubelet first (so it does not restart pods), then
//! containerd (`KillMode=mixed` ends its shims), then `kubepods.slice` (the pods' containers).
//! Each unit that is stopped already or not loaded is `unchanged`, so the phase is idempotent.
//! The units stay enabled: an upgrade starts them again with `start-node`.

wit_bindgen::generate!({ world: "stop-node", path: "../../wit" });

use exports::nodeward::host::phase::{Guest, Report};
use nodeward::host::systemd;
use nodeward_node_config::layout;

nodeward_guest_common::phase_helpers!();

/// In stop order.
const UNITS: &[&str] = &[
    layout::KUBELET_UNIT,
    layout::CONTAINERD_UNIT,
    layout::PODS_SLICE,
];

struct StopNode;

impl Guest for StopNode {
    fn run(input: String) -> Result<Report, String> {
        nodeward_guest_common::parse_input(&input)?;
        let mut stopped = Vec::new();
        for unit in UNITS {
            let o = systemd::stop(unit).map_err(|e| format!("stopping {unit}: {}", describe(e)))?;
            if touched(o) {
                info(&format!("{unit} stopped"));
                stopped.push(unit.to_string());
            }
        }
        let summary = if stopped.is_empty() {
            "node already stopped".to_string()
        } else {
            format!("stopped {}", stopped.join(", "))
        };
        Ok(Report {
            summary,
            changed: stopped.iter().map(|u| format!("{u}-stopped")).collect(),
        })
    }
}

export!(StopNode);
