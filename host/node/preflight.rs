//! The preflight checks ([`crate::preflight`]) of a none node: what `nodeward preflight`
//! prints and the `preflight-checks` step `bootstrap` and `upgrade` start with.
//!
//! The one fact the checks take from the node's own state: whether a node of nodeward's is
//! installed here already (an install record, or the `current` link), so that its kubelet's
//! ports, its containerd's socket and the files `configure` wrote count as its own, not as
//! another installation's. A repair (`bootstrap` of a finished node) and an `upgrade` then pass
//! where a fresh host with those traces fails.

use crate::caps::RunContext;
use crate::hostpath::HostPath;
use crate::preflight::{self, Context, Ignore, Report};
use crate::rootfs::EntryKind;
use nodeward_node_config::NodeConfig;
use nodeward_node_config::layout::{CURRENT_LINK, STATE_DIR};

/// Whether a node of nodeward's is installed beneath the run's root (see the module docs):
/// the install record exists (readable or not) or `current` is a link. Both are looked at
/// without following a link on the way; a path that cannot be looked at counts as no node, so
/// the checks treat what they find as another installation's (the stricter reading).
pub fn own_node(session: &RunContext) -> bool {
    let is = |path: &str, want: Option<EntryKind>| {
        HostPath::parse(path)
            .ok()
            .and_then(|p| session.files.lstat(&p).ok().flatten())
            .is_some_and(|st| want.is_none_or(|k| st.kind == k))
    };
    is(&format!("{STATE_DIR}/install-record.json"), None)
        || is(CURRENT_LINK, Some(EntryKind::Symlink))
}

/// Runs every check against the run's root and `config`, marking what `ignore` covers.
pub fn check(session: &RunContext, config: &NodeConfig, ignore: &Ignore) -> Report {
    preflight::run(&Context::new(session, config, own_node(session)), ignore)
}
