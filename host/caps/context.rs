//! What one run's capabilities share: [`RunContext`].
//!
//! # Background
//! A plan or apply run calls phase after phase; each phase run gets its own
//! [`super::PhaseCtx`] (name, grants, deadline, budget), and all of them act through one
//! `RunContext`: the files beneath the host root ([`RootFs`], which holds the run mode and plan
//! mode's overlay), systemd, downloads, the change log, the audit log (and, for a run of the
//! command line, its persistent trail) and the secrets; and the bounds of the `network` and
//! `cgroups` capabilities, which act on the agent's own namespaces rather than the root. Each
//! part is narrow and owned by the capability module that uses it, so a capability sees only
//! what it needs and the run (`crate::session`) only assembles them.

use super::cgroups::CgroupContext;
use super::download::DownloadContext;
use super::network::NetworkContext;
use super::systemd::SystemdContext;
use crate::audit::trail::AuditTrail;
use crate::audit::{AuditLog, Redactor};
use crate::hostpath::HostRoot;
use crate::plan::{Change, ChangeLog, RunMode};
use crate::reserved::Reserved;
use crate::rootfs::RootFs;
use crate::secrets::Secrets;
use std::sync::{Arc, OnceLock};

/// The state one plan or apply run's capabilities share.
#[derive(Debug)]
pub struct RunContext {
    /// The host root as this run sees it (mode, overlay, atomic writes).
    pub files: RootFs,
    /// The unit directory and the connection to systemd.
    pub systemd: SystemdContext,
    /// The artifact cache and the download policy.
    pub downloads: DownloadContext,
    /// The bounds of the `network` capability's netlink dumps.
    pub network: NetworkContext,
    /// Where the cgroup file systems are, and the bounds of one `cgroups` call.
    pub cgroups: CgroupContext,
    /// Every change made (apply) or planned (plan), in order.
    pub changes: Arc<ChangeLog>,
    /// Every capability call.
    pub audit: AuditLog,
    /// The persistent audit trail the calls are also written to, once the command line opened
    /// it (set once; a library caller or a plan that cannot write it has none).
    pub trail: OnceLock<Arc<AuditTrail>>,
    /// Removes known secrets from everything logged or printed.
    pub redactor: Redactor,
    /// The run's secrets, substituted for their references in granted files
    /// ([`crate::secrets`]); none unless set (a run without secrets writes references as they
    /// are).
    pub secrets: Secrets,
    /// The paths no phase may touch whatever its grants ([`crate::reserved`]): the defaults,
    /// plus the agent directories this run was given.
    pub reserved: Reserved,
}

impl RunContext {
    /// A run over `root` in `mode`, with the default unit directory, artifact cache and
    /// download policy (each a public field to set before the run starts).
    pub fn new(root: HostRoot, mode: RunMode, redactor: Redactor) -> Self {
        let changes = Arc::new(ChangeLog::new(mode));
        RunContext {
            files: RootFs::new(root, mode, redactor.clone(), changes.clone()),
            systemd: SystemdContext::default(),
            downloads: DownloadContext::default(),
            network: NetworkContext::default(),
            cgroups: CgroupContext::default(),
            changes,
            audit: AuditLog::default(),
            trail: OnceLock::new(),
            redactor,
            secrets: Secrets::default(),
            reserved: Reserved::default(),
        }
    }

    /// The persistent audit trail, if the run has one.
    pub fn trail(&self) -> Option<&Arc<AuditTrail>> {
        self.trail.get()
    }

    /// Why an apply must not act any more: its audit trail could not be written, and an apply
    /// fails closed rather than change the host without a record. `None` in plan mode and
    /// while the trail is whole.
    pub fn audit_refusal(&self) -> Option<super::Error> {
        if self.mode() != RunMode::Apply {
            return None;
        }
        let failure = self.trail()?.failure()?;
        Some(super::Error::Unavailable(format!(
            "the audit log cannot be written ({failure}): no further host changes in this run"
        )))
    }

    /// Plan or apply.
    pub fn mode(&self) -> RunMode {
        self.files.mode
    }

    /// The host root.
    pub fn root(&self) -> &HostRoot {
        &self.files.root
    }

    /// Every change listed so far, in order.
    pub fn changes(&self) -> Vec<Change> {
        self.changes.changes()
    }

    /// How many changes were made (or planned) beyond [`crate::plan::MAX_CHANGES`] and not
    /// listed.
    pub fn changes_dropped(&self) -> usize {
        self.changes.dropped()
    }
}
