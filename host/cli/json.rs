//! The JSON the command line prints with `--output json`: one typed shape per kind of output,
//! each documented by a JSON Schema under `docs/schemas/` (`tests/json_output.rs` validates the
//! binary's output against them).
//!
//! # Guarantees
//! - Every key is camelCase, like Kubernetes objects. Values that name things keep their own
//!   spelling: change kinds (`file-create`), run modes (`plan`), unit states (`active`), and
//!   the grants tables of `phases inspect` and `phases diff`, which are manifest tables and so
//!   keep the manifest's keys (`swap-off`, `pinned-artifacts`, `bootstrap-token`).
//! - A field is always present; an absent value is `null` (or an empty list), never a missing
//!   key, so tools can read every field without checking for it first. The one exception is
//!   the optional keys of change objects (`diff`, a symlink's `previous`, a sysctl's `from`).
//!
//! Conventions and examples: `docs/json-output.md`.

use crate::bundle::BundleId;
use crate::caps::RunContext;
use crate::grants::Grants;
use crate::plan::{Change, RunMode};
use crate::session::Step;
use serde::Serialize;
use std::collections::BTreeSet;

/// `plan`, `apply`, `bootstrap`, `upgrade` and `reset`: one shape, with or without `--phase`,
/// finished or failed (`run.schema.json`).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct RunOutput {
    /// `plan` or `apply`.
    pub mode: RunMode,
    /// `bootstrap`, `upgrade` or `reset` (what the none-mode pipeline did: a `bootstrap --force`
    /// of a finished node is an `upgrade`), or `phases` for `plan`/`apply --phase`.
    pub operation: String,
    /// The host root.
    pub root: String,
    /// The bundle that ran.
    pub bundle: BundleId,
    /// The active version directory afterwards (none-mode operations that finished).
    pub version: Option<String>,
    /// The kubelet version the Node reported once Ready.
    pub kubelet_version: Option<String>,
    /// What a recovery at the start did, if anything.
    pub recovered: Option<String>,
    /// Every step that ran, in order; a failed one last, with its error.
    pub steps: Vec<Step>,
    /// The changes made (apply) or planned (plan), in order, from the run's change log.
    pub changes: Vec<Change>,
    /// Changes made beyond the listed ones (the change log's bound), counted only.
    pub changes_dropped: usize,
    /// Every change made or planned: `changes` plus `changesDropped`.
    pub mutations: usize,
    /// Why the run failed; `null` when it finished.
    pub error: Option<String>,
    /// The run's ID in the audit trail (`nodeward audit show --run ID`); `null` when the run
    /// had no trail (a plan that could not write it).
    pub run_id: Option<String>,
}

impl RunOutput {
    /// The report of a run over `session` that is not a none-mode operation (no version,
    /// kubelet version or recovery): root, changes and counts come from the run itself.
    pub fn new(
        mode: RunMode,
        operation: String,
        session: &RunContext,
        bundle: BundleId,
        steps: Vec<Step>,
        error: Option<String>,
    ) -> Self {
        let changes = session.changes();
        let dropped = session.changes_dropped();
        RunOutput {
            mode,
            operation,
            root: session.root().path().display().to_string(),
            bundle,
            version: None,
            kubelet_version: None,
            recovered: None,
            steps,
            mutations: changes.len() + dropped,
            changes,
            changes_dropped: dropped,
            run_id: session.trail().map(|t| t.run_id().to_string()),
            error,
        }
    }
}

/// `phases list` (`phases-list.schema.json`).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ListOutput<'a> {
    /// The bundle.
    pub bundle: BundleId,
    /// Its phases, in run order.
    pub phases: Vec<ListedPhase<'a>>,
}

/// One phase of `phases list`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ListedPhase<'a> {
    /// Phase name.
    pub name: &'a str,
    /// WIT world.
    pub world: &'a str,
    /// Component sha256.
    pub sha256: &'a str,
}

/// `phases inspect` (`phases-inspect.schema.json`).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct InspectOutput {
    /// The bundle.
    pub bundle: BundleId,
    /// Whether and how its signature was checked.
    pub signature: Signature,
    /// Each phase as an auditor sees it.
    pub phases: Vec<InspectedPhase>,
}

/// The signature part of `phases inspect`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Signature {
    /// Whether it verifies against the trusted keys.
    pub verified: bool,
    /// `now` (checked for this command), `install` (checked when it was installed) or
    /// `embedded` (built into the binary).
    pub checked: &'static str,
    /// The trusted key that signed it, when `checked` is `now` and it verified.
    pub key_id: Option<String>,
    /// Why it does not verify.
    pub problem: Option<String>,
}

/// One phase of `phases inspect`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct InspectedPhase {
    /// Phase name.
    pub name: String,
    /// Declared world.
    pub world: String,
    /// Component file.
    pub component: String,
    /// Component sha256.
    pub sha256: String,
    /// Every import of the component.
    pub imports: Vec<String>,
    /// The `nodeward:host` capabilities among them.
    pub capabilities: BTreeSet<String>,
    /// Whether the imports stay within the declared world.
    pub within_world: bool,
    /// Why they do not.
    pub problem: Option<String>,
    /// The phase's grants: the manifest's table, with the manifest's keys.
    pub grants: Grants,
}

/// `version` (`version.schema.json`).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct VersionOutput {
    /// This agent's version.
    pub nodeward: &'static str,
    /// The wasmtime it embeds.
    pub wasmtime: &'static str,
    /// The WIT package it implements.
    pub wit: &'static str,
    /// The bundle that runs.
    pub bundle: BundleId,
}

/// `phases verify` (`phases-verify.schema.json`).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct VerifyOutput {
    /// Always true: a bundle that does not verify is an error.
    pub verified: bool,
    /// The bundle.
    pub bundle: BundleId,
}

/// `phases install` (`phases-install.schema.json`).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct InstallOutput {
    /// The bundle now current.
    pub installed: BundleId,
    /// Whether it was current already (nothing changed).
    pub already_current: bool,
    /// The digest of the bundle now last-good (the one current before); `null` when that was
    /// the embedded bundle, or when nothing changed.
    pub last_good: Option<String>,
    /// Whether its authority is wider than the previous bundle's (accepted).
    pub widened: bool,
}

/// `phases rollback` (`phases-rollback.schema.json`).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct RollbackOutput {
    /// The bundle current again.
    pub current: BundleId,
    /// The digest of the bundle rolled back from.
    pub rolled_back_from: Option<String>,
}

/// `phases rollforward` (`phases-rollforward.schema.json`).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct RollforwardOutput {
    /// The bundle current again.
    pub current: BundleId,
    /// The digest of the bundle rolled forward from; `None`: the embedded bundle.
    pub rolled_forward_from: Option<String>,
}

/// `phases history` (`phases-history.schema.json`).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct HistoryOutput {
    /// Every install, oldest first.
    pub entries: Vec<HistoryEntry>,
    /// The digest of the bundle that runs; `None` when the embedded one does.
    pub current: Option<String>,
    /// Whether the embedded bundle runs.
    pub embedded_current: bool,
    /// The digest the next rollback returns to; `None` when that is the embedded bundle.
    pub last_good: Option<String>,
}

/// One install in `phases history`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct HistoryEntry {
    /// The bundle's digest.
    pub digest: String,
    /// Its name.
    pub name: String,
    /// Its version.
    pub version: u64,
    /// When it was installed, in Unix seconds.
    pub installed_at: u64,
    /// Whether a rollback left it (a later rollback never returns to it).
    pub rolled_back: bool,
    /// Whether it runs.
    pub current: bool,
}

/// `phases uninstall` (`phases-uninstall.schema.json`).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct UninstallOutput {
    /// The embedded bundle, current now.
    pub current: BundleId,
    /// The digest of the bundle uninstalled; `None` when the embedded one ran already.
    pub uninstalled: Option<String>,
}

/// `phases pack` (`phases-pack.schema.json`).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct PackOutput {
    /// The bundle written.
    pub path: String,
    /// sha256 of its manifest.
    pub digest: String,
    /// How many phases it holds.
    pub phases: usize,
    /// Always false: a packed bundle is signed next (`phases sign`).
    pub signed: bool,
}

/// `phases sign` (`phases-sign.schema.json`).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct SignOutput {
    /// The bundle signed.
    pub path: String,
    /// Its identity.
    pub bundle: BundleId,
    /// The secret key file used.
    pub key: String,
}

/// The error a command stops with, on stderr (`error.schema.json`).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ErrorOutput<'a> {
    /// What went wrong.
    pub error: &'a str,
    /// The process exit code (1 the run failed, 2 usage or configuration).
    pub exit_code: u8,
}

/// `preflight` (`preflight.schema.json`).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct PreflightOutput {
    /// The host root checked.
    pub root: String,
    /// Whether a node of nodeward's is installed there already (its ports, socket and files
    /// then count as its own).
    pub own_node: bool,
    /// Whether no failure stops a bootstrap (every failure passed or was ignored).
    pub passed: bool,
    /// Every check, in run order.
    pub checks: Vec<crate::preflight::CheckResult>,
}
