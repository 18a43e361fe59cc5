//! Who runs the agent, and what else runs containers or a kubelet here: `IsPrivilegedUser`,
//! `CRISocket`, `Service-Kubelet`, `Service-Containerd`.

use super::read::Entry;
use super::{Check, Context, Outcome};
use crate::caps::systemd::UnitName;
use crate::wit::Error;
use nodeward_node_config::layout::{CONTAINERD_SOCKET, FOREIGN_UNITS};

/// The sockets of other container runtimes (kubeadm's list, `var/run` spelt `run`: the link
/// `var/run -> /run` is not followed).
const OTHER_RUNTIMES: &[&str] = &["run/crio/crio.sock", "run/cri-dockerd.sock"];

/// Active states in which a unit is (or is about to be) running, as the preflight phase has them.
const RUNNING: &[&str] = &["active", "activating", "reloading"];

/// `IsPrivilegedUser`: bootstrap changes units, kernel settings and root-owned files.
pub(super) fn privileged() -> Check {
    Check::new("IsPrivilegedUser", |_| {
        let uid = rustix::process::geteuid();
        if uid.is_root() {
            Outcome::pass("running as root")
        } else {
            Outcome::fail(format!(
                "running as uid {}: a node is made as root (units, kernel settings, files beneath /)",
                uid.as_raw()
            ))
        }
    })
}

pub(super) fn checks() -> Vec<Check> {
    let mut all = vec![Check::new("CRISocket", cri_socket)];
    for unit in FOREIGN_UNITS {
        // kubeadm's spelling: `Service-Kubelet`.
        let short = unit.trim_end_matches(".service");
        let mut chars = short.chars();
        let name: String = chars
            .next()
            .map(|c| c.to_ascii_uppercase())
            .into_iter()
            .chain(chars)
            .collect();
        all.push(Check::new(format!("Service-{name}"), move |ctx| {
            service(ctx, unit)
        }));
    }
    all
}

/// Another containerd on nodeward's socket path is a conflict nodeward cannot resolve (both
/// would use `run/containerd`); another runtime's socket is worth a warning.
fn cri_socket(ctx: &Context<'_>) -> Outcome {
    let host = ctx.host();
    match host.entry(CONTAINERD_SOCKET) {
        Ok(Entry::Missing) => {}
        Ok(Entry::Link(to)) => {
            return Outcome::fail(format!(
                "{CONTAINERD_SOCKET} is a symlink to {to}: not a socket nodeward's containerd made"
            ));
        }
        Ok(_) if ctx.own_node => {}
        Ok(_) => {
            return Outcome::fail(format!(
                "{CONTAINERD_SOCKET} exists and no nodeward node is installed: another containerd runs (or ran) here, on the socket and state directory nodeward's containerd uses; stop and disable it (`systemctl disable --now containerd`), or remove the stale socket"
            ));
        }
        Err(e) => return Outcome::fail(e),
    }
    let mut others = Vec::new();
    for path in OTHER_RUNTIMES {
        match host.entry(path) {
            Ok(Entry::Missing) => {}
            Ok(_) => others.push(*path),
            Err(e) => return Outcome::fail(e),
        }
    }
    if !others.is_empty() {
        return Outcome::warn(format!(
            "another container runtime's socket is here ({}): the kubelet uses only nodeward's containerd, but both runtimes' containers share this host",
            others.join(", ")
        ));
    }
    if ctx.own_node && host.entry(CONTAINERD_SOCKET) != Ok(Entry::Missing) {
        Outcome::pass(format!(
            "{CONTAINERD_SOCKET} is the installed node's containerd; no other runtime's socket"
        ))
    } else {
        Outcome::pass("no container runtime socket is here yet")
    }
}

/// A foreign `kubelet.service` or `containerd.service`: running fails (the `preflight` phase
/// refuses it too, whatever is ignored here); installed but stopped is a warning, since it may
/// start at boot.
fn service(ctx: &Context<'_>, unit: &str) -> Outcome {
    let state = ctx
        .session
        .systemd
        .manager()
        .and_then(|m| m.status(&UnitName::try_from(unit)?));
    match state {
        Ok(s) if s.load_state == "not-found" => Outcome::pass(format!("no {unit}")),
        Ok(s) if s.load_state == "masked" => Outcome::pass(format!("{unit} is masked")),
        Ok(s) if RUNNING.contains(&s.active_state.as_str()) => Outcome::fail(format!(
            "{unit} is {} ({}): the host runs its own; the preflight phase refuses it too; stop and disable it (`systemctl disable --now {unit}`), or reset that node first",
            s.active_state, s.sub_state
        )),
        Ok(s) => Outcome::warn(format!(
            "{unit} is installed ({}, {}): if enabled it starts at boot beside nodeward's units; disable or mask it",
            s.load_state, s.active_state
        )),
        Err(Error::Unavailable(m)) => Outcome::skip(format!("systemd unavailable: {m}")),
        Err(e) => Outcome::fail(format!(
            "status of {unit}: {}",
            crate::caps::describe_error(&e)
        )),
    }
}
