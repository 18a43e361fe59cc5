//! The `preflight` phase: refuses a host nodeward must not install a node on. Changes nothing.
//!
//! # Checks
//! 1. No unit of [`layout::FOREIGN_UNITS`] (`kubelet.service`, `containerd.service`) is
//!    active, activating or reloading: the host runs a node of its own, and a second kubelet
//!    or containerd would fight it over ports, sockets and cgroups. When systemd cannot be
//!    reached (`unavailable`: a plan on a machine without a system bus) the check is skipped
//!    with a warning; apply runs where systemd is.
//! 2. `opt/cni/bin` is not a real directory with entries: `install` makes it a link into the
//!    active version, and would otherwise have to replace plugins someone else installed.
//!    An empty directory is fine (`install` replaces it); a link is fine (ours, or re-pointed).

wit_bindgen::generate!({ world: "preflight", path: "../../wit" });

use exports::nodeward::host::phase::{Guest, Report};
use nodeward::host::types::Error;
use nodeward::host::{fs, systemd};
use nodeward_node_config::layout;

nodeward_guest_common::phase_helpers!();

/// Active states in which a foreign unit is (or is about to be) running.
const RUNNING: &[&str] = &["active", "activating", "reloading"];

/// `Err` naming the first foreign unit that runs; `Ok(false)` when systemd is unreachable.
fn check_foreign_units() -> Result<bool, String> {
    for unit in layout::FOREIGN_UNITS {
        match systemd::status(unit) {
            Ok(st) if RUNNING.contains(&st.active_state.as_str()) => {
                return Err(format!(
                    "the host runs its own {unit} ({}); nodeward refuses to install over it: stop and disable it, or reset that node first",
                    st.active_state
                ));
            }
            Ok(_) => {}
            Err(Error::Unavailable(m)) => {
                warn(&format!(
                    "systemd is unavailable ({m}); not checking for a kubelet.service or containerd.service of the host's own"
                ));
                return Ok(false);
            }
            Err(e) => return Err(format!("status of {unit}: {}", describe(e))),
        }
    }
    Ok(true)
}

fn check_cni_bin() -> Result<(), String> {
    let path = layout::CNI_BIN_DIR;
    let st = fs::stat(path).map_err(|e| format!("stat {path}: {}", describe(e)))?;
    if let Some(st) = st
        && st.kind == fs::FileKind::Directory
    {
        let entries = fs::list_dir(path).map_err(|e| format!("list {path}: {}", describe(e)))?;
        if !entries.is_empty() {
            let names: Vec<&str> = entries.iter().take(5).map(|e| e.name.as_str()).collect();
            return Err(format!(
                "{path} is a directory nodeward did not create (it holds {}{}); nodeward links {path} to its own CNI plugins: move it away first",
                names.join(", "),
                if entries.len() > names.len() {
                    ", ..."
                } else {
                    ""
                }
            ));
        }
    }
    Ok(())
}

struct Preflight;

impl Guest for Preflight {
    fn run(input: String) -> Result<Report, String> {
        nodeward_guest_common::parse_input(&input)?;
        let systemd_checked = check_foreign_units()?;
        check_cni_bin()?;
        let summary = if systemd_checked {
            "host is fit for a node: no kubelet.service or containerd.service runs, opt/cni/bin is free"
        } else {
            "opt/cni/bin is free; systemd unavailable, foreign units not checked"
        };
        Ok(Report {
            summary: summary.to_string(),
            changed: Vec::new(),
        })
    }
}

export!(Preflight);
