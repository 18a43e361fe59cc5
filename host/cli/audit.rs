//! The audit trail on the command line: opening it for the commands that run phases or change
//! the bundle store ([`start`], [`bundle_trail`]), and `nodeward audit verify|show|summary`.
//!
//! # Failure policy
//! An apply (and a bundle-store change) does not start when its trail cannot be written: the
//! error names the path (exit 1). A plan warns and runs without a trail: a read-only view of a
//! host must stay plannable.

use super::flags::{AuditArgs, OutputArgs, RootArgs, StateArgs};
use super::output::print_json;
use super::{Failure, failed, usage};
use crate::audit::entry::{BundleAction, BundleRef, Entry, Event, Mode};
use crate::audit::query::{self, Filter, RunSummary, Summaries, printable};
use crate::audit::trail::{AuditTrail, RunInfo, TrailConfig};
use crate::audit::verify::Verdict;
use crate::bundle::Bundle;
use crate::caps::RunContext;
use crate::plan::RunMode;
use clap::{Args, Subcommand};
use serde::Serialize;
use std::path::Path;
use std::sync::Arc;

use crate::audit::head::HEADS_DIR;

/// Where one host root's trail is: the log directory and the head.
#[derive(Debug, Args)]
pub(super) struct TrailArgs {
    #[command(flatten)]
    pub(super) root: RootArgs,
    #[command(flatten)]
    pub(super) state: StateArgs,
    #[command(flatten)]
    audit: AuditArgs,
}

/// `nodeward audit …`.
#[derive(Debug, Subcommand)]
#[command(disable_help_subcommand = true)]
pub(super) enum AuditCommand {
    /// Check the trail's hash chain and that it reaches the recorded head; exit 1 naming the
    /// first bad record when it does not.
    Verify {
        #[command(flatten)]
        trail: TrailArgs,
        #[command(flatten)]
        output: OutputArgs,
    },
    /// The records, oldest first, that match every filter given.
    Show {
        /// Records of this run only.
        #[arg(long, value_name = "ID")]
        run: Option<String>,
        /// Records of this phase only.
        #[arg(long, value_name = "NAME")]
        phase: Option<String>,
        /// Records of the bundle with this digest (or digest prefix) only.
        #[arg(long, value_name = "DIGEST")]
        bundle: Option<String>,
        /// Records written since TIME: RFC 3339 (2026-12-01T17:00:00Z) or an age (2h, 3days).
        #[arg(long, value_name = "TIME")]
        since: Option<String>,
        /// Refused capability calls only.
        #[arg(long)]
        denied: bool,
        #[command(flatten)]
        trail: TrailArgs,
        #[command(flatten)]
        output: OutputArgs,
    },
    /// One line per run: command, plan or apply, start and end, outcome (`interrupted` when the
    /// agent died), phases, changes by kind, denials.
    Summary {
        #[command(flatten)]
        trail: TrailArgs,
        #[command(flatten)]
        output: OutputArgs,
    },
}

impl AuditCommand {
    /// Where the command's trail is (for a leading `--root` or `--state-dir`).
    pub(super) fn trail_mut(&mut self) -> &mut TrailArgs {
        match self {
            AuditCommand::Verify { trail, .. }
            | AuditCommand::Show { trail, .. }
            | AuditCommand::Summary { trail, .. } => trail,
        }
    }
}

impl AuditCommand {
    /// The command's output flags.
    pub(super) fn output(&self) -> &OutputArgs {
        match self {
            AuditCommand::Verify { output, .. }
            | AuditCommand::Show { output, .. }
            | AuditCommand::Summary { output, .. } => output,
        }
    }

    /// Runs the command.
    pub(super) fn run(self) -> Result<(), Failure> {
        match self {
            AuditCommand::Verify { trail, output } => verify(&trail, &output),
            AuditCommand::Show {
                run,
                phase,
                bundle,
                since,
                denied,
                trail,
                output,
            } => {
                let since = since
                    .map(|s| query::parse_since(&s, std::time::SystemTime::now()))
                    .transpose()
                    .map_err(usage)?;
                let filter = Filter {
                    run,
                    phase,
                    bundle,
                    since,
                    denied,
                };
                show(&trail, &output, &filter)
            }
            AuditCommand::Summary { trail, output } => summary(&trail, &output),
        }
    }
}

/// The trail's configuration: the log beneath `root` (or `--audit-dir`), its head in the agent
/// state directory: `audit-heads/<16 hex digits>.json`, one name per log directory however it
/// is spelled ([`crate::audit::head::head_path`]), so that two roots sharing a state directory
/// (a chroot, the tests) never mix their heads, and no spelling of a root finds no head.
pub(super) fn config(root: &Path, state: &StateArgs, audit: &AuditArgs) -> TrailConfig {
    let dir = audit.dir(root);
    let head = crate::audit::head::head_path(&state.dir(root).join(HEADS_DIR), &dir);
    TrailConfig::new(dir, head)
}

fn mode(mode: RunMode) -> Mode {
    match mode {
        RunMode::Plan => Mode::Plan,
        RunMode::Apply => Mode::Apply,
    }
}

/// A run's trail: writes the run's end when [`RunAudit::end`] is called, or, when the command
/// returns early without calling it, a failed end when dropped.
pub(super) struct RunAudit {
    session: Arc<RunContext>,
    ended: bool,
}

/// Opens the trail of a run of `command` over `session` and hands it to the session (see
/// the module doc for what happens when it cannot be written).
pub(super) fn start(
    root: &Path,
    state: &StateArgs,
    audit: &AuditArgs,
    command: &str,
    session: &Arc<RunContext>,
) -> Result<RunAudit, Failure> {
    let info = RunInfo {
        command: command.to_string(),
        mode: mode(session.mode()),
        root: session.root().path().display().to_string(),
    };
    if session.mode() == RunMode::Apply {
        sweep_state(root, state);
    }
    let config = config(root, state, audit);
    match AuditTrail::open(config, info) {
        Ok(trail) => {
            tracing::info!(target: "nodeward::audit", run = trail.run_id(), "audit run {}", trail.run_id());
            // A fresh session: nothing set the trail before.
            let _ = session.trail.set(Arc::new(trail));
        }
        Err(e) if session.mode() == RunMode::Plan => {
            tracing::warn!("planning without an audit trail: {e}");
        }
        Err(e) => {
            return Err(failed(format!(
                "refusing to apply without an audit trail: {e}"
            )));
        }
    }
    Ok(RunAudit {
        session: session.clone(),
        ended: false,
    })
}

impl RunAudit {
    /// Writes the run's end with `error` (the run's own, redacted); the error the command
    /// ends with: the run's, or, when an apply's end could not be written, that.
    pub(super) fn end(mut self, error: Option<String>) -> Option<String> {
        self.ended = true;
        self.write_end(error.as_deref())
            .map_or(error.clone(), |e| error.or(Some(e)))
    }

    /// Writes the end; an error an apply must report.
    fn write_end(&self, error: Option<&str>) -> Option<String> {
        let trail = self.session.trail()?;
        let s = &self.session;
        let changes = s.changes.total() as u64;
        match trail.end(error, s.audit.total(), s.audit.denied(), changes) {
            Ok(()) => trail.failure().filter(|_| s.mode() == RunMode::Apply),
            Err(e) if s.mode() == RunMode::Apply => Some(format!("audit log: {e}")),
            Err(e) => {
                tracing::warn!("audit log: {e}");
                None
            }
        }
    }
}

impl Drop for RunAudit {
    fn drop(&mut self) {
        if !self.ended {
            let _ = self.write_end(Some("the command stopped before the run ended"));
        }
    }
}

/// Where a bundle-store command's trail is: the host root and `--audit-dir`.
#[derive(Clone, Copy)]
pub(super) struct StoreTrail<'a> {
    /// The host root.
    pub root: &'a Path,
    /// `--audit-dir`.
    pub audit: &'a AuditArgs,
}

/// Opens the trail for a bundle-store change (`command`), failing closed.
pub(super) fn bundle_trail(
    at: StoreTrail<'_>,
    state: &StateArgs,
    command: &str,
) -> Result<AuditTrail, Failure> {
    let StoreTrail { root, audit } = at;
    sweep_state(root, state);
    let info = RunInfo {
        command: command.to_string(),
        mode: Mode::Apply,
        root: root.display().to_string(),
    };
    AuditTrail::open(config(root, state, audit), info).map_err(|e| {
        failed(format!(
            "refusing to change the bundle store without an audit trail: {e}"
        ))
    })
}

/// Removes the temp files killed runs (and a killed daemon) left in the agent state directory
/// beneath `root` (or `--state-dir`): its own files, the audit heads, the compiled components
/// and the downloads ([`crate::durable::sweep_state_dir`], never a live writer's), and in the
/// bundle store when no store operation holds it. What cannot be removed is a warning naming
/// it: a leftover must not stop the agent.
fn sweep_state(root: &Path, state: &StateArgs) {
    let dir = state.dir(root);
    let store = crate::bundle::store::Store::new(&dir);
    let removed = crate::durable::sweep_state_dir(&dir)
        .map_err(|e| e.to_string())
        .and_then(|mut r| {
            r.extend(store.sweep_if_idle().map_err(|e| e.to_string())?);
            Ok(r)
        });
    match removed {
        Ok(r) if r.is_empty() => {}
        Ok(r) => tracing::warn!(removed = ?r, "removed the temp files a killed run left"),
        Err(e) => tracing::warn!("cannot remove the temp files a killed run left: {e}"),
    }
}

/// Closes the runs of dead processes in the trail beneath `at` (`phases install` finding its
/// bundle current already, which opens no trail of its own): see
/// [`crate::audit::close_interrupted_runs`]. A failure is a warning: nothing changed.
pub(super) fn close_interrupted(at: StoreTrail<'_>, state: &StateArgs, command: &str) {
    sweep_state(at.root, state);
    let info = RunInfo {
        command: command.to_string(),
        mode: Mode::Apply,
        root: at.root.display().to_string(),
    };
    match crate::audit::close_interrupted_runs(config(at.root, state, at.audit), info) {
        Ok(closed) if closed.is_empty() => {}
        Ok(closed) => tracing::info!(?closed, "closed the runs of agents that died"),
        Err(e) => tracing::warn!("audit log: cannot close the runs of agents that died: {e}"),
    }
}

/// Records in `trail` the install a killed run made current (`intent`) unless the trail's
/// newest `bundle` record names it already (the run died after recording it). A trail that
/// cannot be read is taken for one without the record: twice recorded beats never.
pub(super) fn record_unrecorded_install(
    at: StoreTrail<'_>,
    state: &StateArgs,
    trail: &AuditTrail,
    intent: &crate::bundle::intent::InstallIntent,
) -> Result<(), Failure> {
    let dir = config(at.root, state, at.audit).dir;
    let mut newest = None;
    let read = query::for_each(&dir, |e| {
        if let Event::Bundle { current, .. } = e.event {
            newest = Some(current.map(|b| b.digest));
        }
    });
    if read.is_ok() && newest == Some(Some(intent.digest.clone())) {
        return Ok(());
    }
    tracing::warn!(
        "an install of {} (sha256 {}) was killed after making it current, before recording \
         it: recording it now",
        intent.name,
        intent.digest
    );
    trail.bundle(Event::Bundle {
        action: BundleAction::Install,
        current: Some(BundleRef {
            name: intent.name.clone(),
            version: intent.version,
            digest: intent.digest.clone(),
        }),
        from: intent.from.clone(),
    });
    match trail.failure() {
        Some(e) => Err(failed(format!(
            "audit log: cannot record the install a killed run made: {e}"
        ))),
        None => Ok(()),
    }
}

/// The bundle a record names.
pub(super) fn bundle_ref(bundle: &Bundle) -> Option<BundleRef> {
    (bundle.source != crate::bundle::BundleSource::Embedded).then(|| BundleRef {
        name: bundle.manifest.bundle.name.clone(),
        version: bundle.manifest.bundle.version,
        digest: bundle.digest.clone(),
    })
}

/// Records a bundle-store change and ends the trail's run; an error when either failed (the
/// change is made: the error says it is unrecorded).
pub(super) fn bundle_done(
    trail: &AuditTrail,
    action: BundleAction,
    current: Option<BundleRef>,
    from: Option<String>,
) -> Result<(), Failure> {
    trail.bundle(Event::Bundle {
        action,
        current,
        from,
    });
    let failure = trail.failure();
    trail.end(failure.as_deref(), 0, 0, 0).map_err(|e| {
        failed(format!(
            "the bundle store changed, but its audit record: {e}"
        ))
    })?;
    match failure {
        Some(e) => Err(failed(format!(
            "the bundle store changed, but its audit record could not be written: {e}"
        ))),
        None => Ok(()),
    }
}

/// A bundle-store change that failed after its trail was opened: the run's end records the
/// error (so the run is not taken for one the agent died in); the command's failure.
pub(super) fn bundle_failed(trail: &AuditTrail, error: impl std::fmt::Display) -> Failure {
    let message = error.to_string();
    if let Err(e) = trail.end(Some(&message), 0, 0, 0) {
        tracing::warn!("audit log: {e}");
    }
    failed(message)
}

/// `audit verify`'s JSON (`audit-verify.schema.json`).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct VerifyOutput<'a> {
    dir: String,
    head_file: String,
    #[serde(flatten)]
    verdict: &'a Verdict,
}

fn verify(trail: &TrailArgs, output: &OutputArgs) -> Result<(), Failure> {
    let config = config(&trail.root.dir, &trail.state, &trail.audit);
    let verdict = crate::audit::verify::verify(&config.dir, &config.head).map_err(failed)?;
    if !output.text() {
        print_json(&VerifyOutput {
            dir: config.dir.display().to_string(),
            head_file: config.head.display().to_string(),
            verdict: &verdict,
        })?;
    } else {
        let line = format!(
            "audit trail {}: {} record(s){}{}, head {}",
            config.dir.display(),
            verdict.records,
            verdict
                .retained_from
                .map(|s| format!(" from seq {s} (older ones rotated away)"))
                .unwrap_or_default(),
            verdict
                .last_seq
                .map(|s| format!(" to seq {s}"))
                .unwrap_or_default(),
            verdict
                .head
                .as_ref()
                .map_or("none".to_string(), |h| format!(
                    "seq {} (floor seq {})",
                    h.seq, h.floor
                ))
        );
        println!("{}", printable(&line));
        for w in &verdict.warnings {
            println!("warning: {}", printable(w));
        }
    }
    match &verdict.problem {
        None => {
            if output.text() {
                println!("ok: the chain is whole and reaches the head");
            }
            Ok(())
        }
        Some(p) => Err(failed(
            printable(&format!(
                "audit trail broken at {}:{} (seq {}): {}: {}",
                p.file,
                p.line,
                p.seq.map_or("-".to_string(), |s| s.to_string()),
                p.reason,
                p.detail
            ))
            .into_owned(),
        )),
    }
}

/// `audit show`'s JSON (`audit-show.schema.json`).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ShowOutput {
    dir: String,
    records: Vec<Entry>,
}

/// Text is printed record by record as the trail is read; JSON holds the matching records.
fn show(trail: &TrailArgs, output: &OutputArgs, filter: &Filter) -> Result<(), Failure> {
    let dir = trail.audit.dir(&trail.root.dir);
    let text = output.text();
    let mut records = Vec::new();
    query::for_each(&dir, |e| {
        if filter.matches(&e) {
            if text {
                println!("{}", query::describe(&e));
            } else {
                records.push(e);
            }
        }
    })
    .map_err(failed)?;
    if !text {
        return print_json(&ShowOutput {
            dir: dir.display().to_string(),
            records,
        });
    }
    Ok(())
}

/// `audit summary`'s JSON (`audit-summary.schema.json`).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct SummaryOutput {
    dir: String,
    runs: Vec<RunSummary>,
}

fn summary(trail: &TrailArgs, output: &OutputArgs) -> Result<(), Failure> {
    let dir = trail.audit.dir(&trail.root.dir);
    let mut fold = Summaries::default();
    query::for_each(&dir, |e| fold.add(&e)).map_err(failed)?;
    let runs = fold.finish();
    if !output.text() {
        return print_json(&SummaryOutput {
            dir: dir.display().to_string(),
            runs,
        });
    }
    for r in &runs {
        println!("{}", query::describe_run(r));
    }
    Ok(())
}
