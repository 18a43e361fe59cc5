//! What another installation leaves where nodeward writes (kubeadm's `DirAvailable--…` and
//! `FileAvailable--…`), and room for a version directory (`DiskSpace`).

use super::read::Entry;
use super::{Check, Context, Outcome};
use nodeward_node_config::layout::{
    BOOTSTRAP_KUBECONFIG, CA_CERT, CNI_BIN_DIR, MANIFESTS_DIR, NODE_DIR,
};

/// The least free space for a version directory: one version's binaries extracted (kubelet,
/// containerd, runc, CNI plugins: about 310 MB for Kubernetes 1.34 and containerd 2.1, an
/// estimate from the upstream release sizes) plus
/// the artifacts they came from, kept in the artifact cache (about 180 MB, usually on the same
/// filesystem), with room to spare: about twice that.
pub(super) const MIN_FREE_BYTES: u64 = 1 << 30;

/// What nodeward writes first in the files it owns: `configure`'s (`(configure)`), and the
/// bootstrap kubeconfig the agent renders (`(agent)`; `configure` wrote it before).
const MANAGED_HEADER: &str = "# managed by nodeward (";

pub(super) fn checks() -> Vec<Check> {
    vec![
        Check::new("DirAvailable--etc-kubernetes-manifests", manifests),
        Check::new("FileAvailable--etc-kubernetes-pki-ca.crt", ca_file),
        Check::new(
            "FileAvailable--etc-kubernetes-bootstrap-kubelet.conf",
            bootstrap_kubeconfig,
        ),
        Check::new("DirAvailable--opt-cni-bin", cni_bin),
        Check::new("DiskSpace", disk_space),
    ]
}

/// Static pods another installation left: nodeward's kubelet would run them.
fn manifests(ctx: &Context<'_>) -> Outcome {
    match ctx.host().list(MANIFESTS_DIR) {
        Ok(None) => Outcome::pass(format!("{MANIFESTS_DIR} does not exist yet")),
        Ok(Some(e)) if e.is_empty() => Outcome::pass(format!("{MANIFESTS_DIR} is empty")),
        Ok(Some(e)) if ctx.own_node => Outcome::pass(format!(
            "{MANIFESTS_DIR} holds {} static pod manifest(s) of the installed node",
            e.len()
        )),
        Ok(Some(e)) => Outcome::fail(format!(
            "{MANIFESTS_DIR} is not empty ({}): static pods another installation left, which nodeward's kubelet would run; move them away",
            first(&e)
        )),
        Err(e) => Outcome::fail(e),
    }
}

/// The first few names of `entries`.
fn first(entries: &[String]) -> String {
    let mut s = entries
        .iter()
        .take(5)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if entries.len() > 5 {
        s.push_str(", ...");
    }
    s
}

/// A CA other than the config's: another cluster's node is here, and `configure` would
/// replace its CA.
fn ca_file(ctx: &Context<'_>) -> Outcome {
    let host = ctx.host();
    match host.entry(CA_CERT) {
        Ok(Entry::Missing) => return Outcome::pass(format!("{CA_CERT} does not exist yet")),
        Ok(Entry::File) => {}
        Ok(Entry::Link(to)) => {
            return Outcome::fail(format!(
                "{CA_CERT} is a symlink to {to}; configure writes a file there"
            ));
        }
        Ok(_) => return Outcome::fail(format!("{CA_CERT} is not a regular file")),
        Err(e) => return Outcome::fail(e),
    }
    let on_disk = match host.read(CA_CERT) {
        Ok(Some(t)) => t,
        Ok(None) => return Outcome::pass(format!("{CA_CERT} does not exist (any more)")),
        Err(e) => return Outcome::fail(e),
    };
    let same = ctx
        .config
        .ca_cert_pem()
        .is_ok_and(|pem| pem.trim() == on_disk.trim());
    if same {
        Outcome::pass(format!(
            "{CA_CERT} holds this cluster's CA (cluster.caCertData)"
        ))
    } else if ctx.own_node {
        Outcome::pass(format!(
            "{CA_CERT} is the installed node's; configure writes cluster.caCertData there"
        ))
    } else {
        Outcome::fail(format!(
            "{CA_CERT} holds another CA than cluster.caCertData and no nodeward node is installed: another installation's node is here (e.g. `kubeadm join`); reset it, or move the file away"
        ))
    }
}

/// A bootstrap kubeconfig nodeward did not write: another installation's.
fn bootstrap_kubeconfig(ctx: &Context<'_>) -> Outcome {
    let host = ctx.host();
    let path = BOOTSTRAP_KUBECONFIG;
    match host.entry(path) {
        Ok(Entry::Missing) => return Outcome::pass(format!("{path} does not exist yet")),
        Ok(Entry::File) => {}
        Ok(Entry::Link(to)) => {
            return Outcome::fail(format!(
                "{path} is a symlink to {to}; nodeward writes a file there"
            ));
        }
        Ok(_) => return Outcome::fail(format!("{path} is not a regular file")),
        Err(e) => return Outcome::fail(e),
    }
    // It holds a token: only its first line is looked at, and never printed.
    match host.read(path) {
        Ok(Some(t)) if t.starts_with(MANAGED_HEADER) => {
            Outcome::pass(format!("{path} was written by nodeward"))
        }
        Ok(_) if ctx.own_node => Outcome::pass(format!("{path} is the installed node's")),
        Ok(_) => Outcome::fail(format!(
            "{path} exists and nodeward did not write it: another installation's node is here; reset it, or move the file away"
        )),
        Err(e) => Outcome::fail(e),
    }
}

/// A real `opt/cni/bin` with plugins: `install` links it into the active version (the
/// `preflight` phase refuses it too).
fn cni_bin(ctx: &Context<'_>) -> Outcome {
    let host = ctx.host();
    match host.entry(CNI_BIN_DIR) {
        Ok(Entry::Missing) => Outcome::pass(format!("{CNI_BIN_DIR} does not exist yet")),
        Ok(Entry::Link(to)) => Outcome::pass(format!(
            "{CNI_BIN_DIR} is a link (to {to}); install points it at the active version"
        )),
        Ok(Entry::Dir) => match host.list(CNI_BIN_DIR) {
            Ok(Some(e)) if !e.is_empty() => Outcome::fail(format!(
                "{CNI_BIN_DIR} is a directory nodeward did not create ({}); nodeward links it to its own CNI plugins: move it away (the preflight phase refuses it too)",
                first(&e)
            )),
            Ok(_) => Outcome::pass(format!("{CNI_BIN_DIR} is empty; install replaces it")),
            Err(e) => Outcome::fail(e),
        },
        Ok(_) => Outcome::fail(format!("{CNI_BIN_DIR} is not a directory or link")),
        Err(e) => Outcome::fail(e),
    }
}

fn disk_space(ctx: &Context<'_>) -> Outcome {
    match ctx.host().available_bytes(NODE_DIR) {
        Ok((at, free)) => disk_outcome(&at, free),
        Err(e) => Outcome::fail(e),
    }
}

/// The verdict on `free` bytes at `at` (the version directory, or its nearest existing parent).
pub(super) fn disk_outcome(at: &str, free: u64) -> Outcome {
    let mib = |b: u64| b >> 20;
    if free >= MIN_FREE_BYTES {
        Outcome::pass(format!("{} MiB free at {at}", mib(free)))
    } else {
        Outcome::fail(format!(
            "only {} MiB free at {at}: a version directory and its cached artifacts need {} MiB; free some space",
            mib(free),
            mib(MIN_FREE_BYTES)
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::preflight::Status;

    #[test]
    fn disk_space_fails_below_the_threshold_naming_the_path() {
        assert_eq!(disk_outcome("opt", MIN_FREE_BYTES).status, Status::Pass);
        let low = disk_outcome("opt/nodeward", MIN_FREE_BYTES - 1);
        assert_eq!(low.status, Status::Fail);
        assert!(
            low.message.contains("1023 MiB free at opt/nodeward")
                && low.message.contains("1024 MiB"),
            "{}",
            low.message
        );
    }
}
