//! What one run's capabilities share: [`RunContext`].
//!
//! # Background
//! A plan or apply run calls phase after phase; each phase run gets its own
//! [`super::PhaseCtx`] (name, grants, deadline, budget), and all of them act through one
//! `RunContext`: the files beneath the host root ([`RootFs`], which holds the run mode and plan
//! mode's overlay), systemd, downloads, the change log, the audit log and the secrets. Each
//! part is narrow and owned by the capability module that uses it, so a capability sees only
//! what it needs and the run (`crate::session`) only assembles them.

use super::download::DownloadContext;
use super::systemd::SystemdContext;
use crate::audit::{AuditLog, Redactor};
use crate::hostpath::HostRoot;
use crate::plan::{Change, ChangeLog, RunMode};
use crate::rootfs::RootFs;
use crate::secrets::Secrets;
use std::sync::Arc;

/// The state one plan or apply run's capabilities share.
#[derive(Debug)]
pub struct RunContext {
    /// The host root as this run sees it (mode, overlay, atomic writes).
    pub files: RootFs,
    /// The unit directory and the connection to systemd.
    pub systemd: SystemdContext,
    /// The artifact cache and the download policy.
    pub downloads: DownloadContext,
    /// Every change made (apply) or planned (plan), in order.
    pub changes: Arc<ChangeLog>,
    /// Every capability call.
    pub audit: AuditLog,
    /// Removes known secrets from everything logged or printed.
    pub redactor: Redactor,
    /// The run's secrets, substituted for their references in granted files
    /// ([`crate::secrets`]); none unless set (a run without secrets writes references as they
    /// are).
    pub secrets: Secrets,
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
            changes,
            audit: AuditLog::default(),
            redactor,
            secrets: Secrets::default(),
        }
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
