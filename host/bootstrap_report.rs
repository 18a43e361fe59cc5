//! The bootstrap status reporter (issue 14, part 4): while `nodeward bootstrap` runs, the
//! node's Machine says so in its `AgentBootstrapped` condition.
//!
//! # Background
//! The daemon reports a node in its Machine's status with the kubelet's client certificate,
//! which the kubelet only gets at the end of a bootstrap (TLS bootstrapping). Until then the
//! one credential on the node is the node config's bootstrap token, so the bootstrap reports
//! itself with that token, to the API server and cluster CA of the node config (the values
//! the host renders into the bootstrap kubeconfig): `AgentBootstrapped=Unknown`
//! (`Bootstrapping`, `running: <checkpoint>`) when it starts, `True` (`Bootstrapped`) when it
//! has finished, `False` (`BootstrapFailed`, the error) when it failed. An operator watching
//! `kubectl get machines` sees a node being made, and why one failed, before any daemon runs on
//! it. The Machine is the one named like the node (the config's `machineName`).
//!
//! # Guarantees
//! - Best effort: a report never fails the bootstrap or changes its outcome. Every request is
//!   bounded by [`REQUEST_TIMEOUT`] (connecting and each read) and each report by
//!   [`REPORT_DEADLINE`]; an API server that could not be reached (or did not answer in time)
//!   is not asked again in the same run, so an unreachable server costs a bootstrap one bound,
//!   not two. A missing Machine or CRD (404), a refusal (401, 403, …) or an unreachable server
//!   is one warning line.
//! - Only the `AgentBootstrapped` condition is written ([`report`]): the Machine is read, the
//!   condition set on its status ([`MachineStatus::set_condition`]) and the status replaced at
//!   the `resourceVersion` read; on 409 Conflict it is read again and the same condition laid
//!   over the newer status, at most [`MAX_CONFLICTS`] times. Other conditions (also those of
//!   types this agent does not know), `phase` and `observedGeneration` keep what the daemon
//!   (or anyone) wrote. A report that would change nothing writes nothing.
//! - No `observedGeneration`, neither the status's nor the condition's: a bootstrap acts on the
//!   node config, not on the Machine's spec (`docs/daemon.md`, status), so it has observed no
//!   generation; the daemon sets them when it takes the node over.
//! - The token is never printed: it is only in the client's credentials, and every line this
//!   module logs goes through the run's [`Redactor`] first.
//!
//! # Caveats
//! - RBAC cannot limit a bootstrap token to one Machine: `deploy/rbac.yaml` lets any holder
//!   of a bootstrap token write any Machine's status, and `deploy/admission-policy.yaml` can
//!   only narrow that to the `AgentBootstrapped` condition (`docs/daemon.md`, Identity).
//! - The Machine's `phase` is the daemon's to write; the reporter leaves it alone.
//! - A Machine created while the bootstrap runs gets the end of it only, never the start.

use crate::audit::Redactor;
use crate::daemon::kube_api::KubeApi;
use crate::daemon::reconcile::{ApiError, MAX_CONFLICTS, MachineApi};
use crate::node::decide;
use crate::node::state::{InstallRecord, NodeState};
use crate::node::version;
use kube::config::{
    AuthInfo, Cluster, Context, KubeConfigOptions, Kubeconfig, KubeconfigError, NamedAuthInfo,
    NamedCluster, NamedContext,
};
use nodeward_api::machine::MachineStatus;
use nodeward_api::{ConditionUpdate, Reason, Time};
use nodeward_node_config::NodeConfig;
use std::path::Path;
use std::time::Duration;

/// The longest one request may take, connecting included (and each read of its answer).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest one report may take: its read, its write and the re-reads after conflicts.
pub const REPORT_DEADLINE: Duration = Duration::from_secs(10);

/// Where the bootstrap is, as the Machine is told.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Progress {
    /// It runs, from this checkpoint ([`starting_checkpoint`]).
    Running {
        /// The checkpoint's name, as in the install record and `nodeward status`, or
        /// `preflight` for a bootstrap that may stop before its first checkpoint.
        checkpoint: &'static str,
    },
    /// It finished: the node joined.
    Done,
    /// It failed with this error (already redacted, as the command prints it).
    Failed(String),
}

impl Progress {
    /// The condition this progress is: type, status and reason fixed by the reason, the
    /// message capped at 1 KiB on a character boundary, no `observedGeneration`.
    pub fn condition(&self) -> ConditionUpdate {
        match self {
            Progress::Running { checkpoint } => ConditionUpdate::new(
                Reason::Bootstrapping,
                &format!("running: {checkpoint}"),
                None,
            ),
            Progress::Done => ConditionUpdate::new(Reason::Bootstrapped, "", None),
            Progress::Failed(error) => ConditionUpdate::new(Reason::BootstrapFailed, error, None),
        }
    }
}

/// The checkpoint a bootstrap of `config` (with `--force` or not) starts from on a host whose
/// install record is `record`: where it resumes, `setup-host` for a fresh host or a repair,
/// `preflight` when it will refuse or turn into an upgrade (it stops or goes on from there).
/// The same decision as the bootstrap's own ([`decide::bootstrap`]).
pub fn checkpoint_for(
    record: Option<&InstallRecord>,
    config: &NodeConfig,
    force: bool,
) -> &'static str {
    let Ok(fingerprint) = version::fingerprint(config) else {
        return "preflight";
    };
    decide::bootstrap(record, &config.machine_name, &fingerprint, force)
        .ok()
        .and_then(|action| action.steps())
        .map_or("preflight", |steps| steps.start.name())
}

/// [`checkpoint_for`] the install record beneath `root`, read without the node lock (the
/// message is a hint; the bootstrap decides again under the lock). An unreadable record is
/// the bootstrap's to report: `preflight`.
pub fn starting_checkpoint(root: &Path, config: &NodeConfig, force: bool) -> &'static str {
    match NodeState::new(root).record() {
        Ok(record) => checkpoint_for(record.as_ref(), config, force),
        Err(_) => "preflight",
    }
}

/// What a report did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reported {
    /// The condition was written, after this many 409 Conflicts.
    Written {
        /// Conflicts met and retried.
        conflicts: u32,
    },
    /// The Machine already said so; nothing was written.
    Unchanged,
    /// There is no such Machine (or no Machine CRD): nothing to report to.
    NoMachine,
}

/// Sets `update` (an `AgentBootstrapped` condition) on the Machine `name` at `now` and writes
/// its status, re-reading and retrying on each 409 up to [`MAX_CONFLICTS`] times. Nothing but
/// that one condition changes (see the module's guarantees).
pub async fn report(
    api: &impl MachineApi,
    name: &str,
    update: &ConditionUpdate,
    now: &Time,
) -> Result<Reported, ApiError> {
    let mut conflicts = 0;
    loop {
        let Some(mut machine) = api.machine(name).await? else {
            return Ok(Reported::NoMachine);
        };
        let status: &mut MachineStatus = machine.status.get_or_insert_default();
        if !status.set_condition(update, now) {
            return Ok(Reported::Unchanged);
        }
        match api.replace_machine_status(&machine).await {
            Ok(_) => return Ok(Reported::Written { conflicts }),
            Err(ApiError::Conflict) if conflicts < MAX_CONFLICTS => conflicts += 1,
            Err(e) => return Err(e),
        }
    }
}

/// Why a report did not reach the Machine.
#[derive(Debug, thiserror::Error)]
enum ReportError {
    /// The client could not be made from the node config.
    #[error("cannot make a client: {0}")]
    Client(#[source] kube::Error),
    /// The API server answered otherwise, or could not be reached.
    #[error(transparent)]
    Api(#[from] ApiError),
    /// The report did not finish within [`REPORT_DEADLINE`].
    #[error("no answer within {}s", REPORT_DEADLINE.as_secs())]
    Deadline,
}

impl ReportError {
    /// Whether the server should not be asked again in this run: it could not be reached or
    /// did not answer in time (asking again would only cost the bootstrap another bound).
    fn gives_up(&self) -> bool {
        matches!(
            self,
            ReportError::Api(ApiError::Unreachable(_)) | ReportError::Deadline
        )
    }
}

/// Reports one bootstrap's progress to its Machine, on a small current-thread runtime of its
/// own (the bootstrap itself is synchronous).
pub struct Reporter {
    machine: String,
    server: String,
    redactor: Redactor,
    /// `None` once the reporter has given up (or could not start): reports do nothing.
    target: Option<(tokio::runtime::Runtime, kube::Config)>,
}

impl Reporter {
    /// A reporter to the Machine named like `config`'s node, on `config`'s API server, with its
    /// bootstrap token and cluster CA. Never fails: one that cannot be made says why in a
    /// warning and reports nothing.
    pub fn new(config: &NodeConfig, redactor: Redactor) -> Reporter {
        let mut reporter = Reporter {
            machine: config.machine_name.clone(),
            server: config.cluster.api_server.clone(),
            redactor,
            target: None,
        };
        let runtime = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(r) => r,
            Err(e) => {
                reporter.warn(&format!("cannot start its runtime: {e}"));
                return reporter;
            }
        };
        match runtime.block_on(client_config(config)) {
            Ok(client_config) => reporter.target = Some((runtime, client_config)),
            Err(e) => reporter.warn(&format!("the node config gives no client: {e}")),
        }
        reporter
    }

    /// Whether later reports will still be sent (false once the server could not be reached).
    pub fn active(&self) -> bool {
        self.target.is_some()
    }

    /// Tells the Machine `progress`, best effort: what happened is a log line, never an error.
    pub fn report(&mut self, progress: &Progress) {
        let Some((runtime, client_config)) = &self.target else {
            return;
        };
        let update = progress.condition();
        let name = self.machine.as_str();
        // Without a subscriber meanwhile: kube's client logs every failed request at error
        // level itself, which for a best-effort report would be an alarming second line
        // saying what the one warning below says (its error chain holds the same text).
        let quiet = tracing::Dispatch::none();
        let result = tracing::dispatcher::with_default(&quiet, || {
            runtime.block_on(send(client_config, name, &update))
        });
        let condition = format!(
            "AgentBootstrapped={} ({})",
            update.reason().status().as_str(),
            update.reason().as_str()
        );
        match result {
            Ok(Reported::Written { conflicts }) => tracing::info!(
                machine = name,
                conflicts,
                "reported {condition} to Machine {name}"
            ),
            Ok(Reported::Unchanged) => {
                tracing::info!(machine = name, "Machine {name} already says {condition}")
            }
            Ok(Reported::NoMachine) => self.warn(&format!(
                "no Machine {name} on {} (or no Machine CRD): not reported",
                self.server
            )),
            Err(e) => {
                let gives_up = e.gives_up();
                let mut line = format!("{condition} not reported: {e}");
                if gives_up {
                    line.push_str("; not asked again in this run");
                    self.target = None;
                }
                self.warn(&line);
            }
        }
    }

    /// The text of a warning about `what` happened to a report: named, and redacted (an
    /// error can carry what the server echoed, the token included).
    fn warning(&self, what: &str) -> String {
        self.redactor.redact(&format!(
            "bootstrap status for Machine {}: {what}",
            self.machine
        ))
    }

    /// Logs [`Self::warning`] as one warning line.
    fn warn(&self, what: &str) {
        tracing::warn!(machine = self.machine.as_str(), "{}", self.warning(what));
    }
}

/// One report over a client of its own (a pooled connection would have sat idle through the
/// bootstrap, and may have been closed by the server meanwhile), within [`REPORT_DEADLINE`].
async fn send(
    client_config: &kube::Config,
    name: &str,
    update: &ConditionUpdate,
) -> Result<Reported, ReportError> {
    let client = kube::Client::try_from(client_config.clone()).map_err(ReportError::Client)?;
    let api = KubeApi::new(client.clone(), client);
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    match tokio::time::timeout(REPORT_DEADLINE, report(&api, name, update, &now)).await {
        Ok(reported) => Ok(reported?),
        Err(_) => Err(ReportError::Deadline),
    }
}

/// The client configuration of `config`'s API server: its URL, the cluster CA
/// (`cluster.caCertData`, base64 of the PEM, as a kubeconfig's `certificate-authority-data`)
/// and the bootstrap token as the bearer; every request bounded by [`REQUEST_TIMEOUT`] and
/// not retried by the client itself (a report is best effort).
async fn client_config(config: &NodeConfig) -> Result<kube::Config, KubeconfigError> {
    const NAME: &str = "nodeward-bootstrap";
    let kubeconfig = Kubeconfig {
        clusters: vec![NamedCluster {
            name: NAME.into(),
            cluster: Some(Cluster {
                server: Some(config.cluster.api_server.clone()),
                certificate_authority_data: Some(config.cluster.ca_cert_data.trim().to_string()),
                ..Cluster::default()
            }),
            ..NamedCluster::default()
        }],
        auth_infos: vec![NamedAuthInfo {
            name: NAME.into(),
            auth_info: Some(AuthInfo {
                token: Some(config.kubelet.auth.bootstrap_token.expose().into()),
                ..AuthInfo::default()
            }),
            ..NamedAuthInfo::default()
        }],
        contexts: vec![NamedContext {
            name: NAME.into(),
            context: Some(Context {
                cluster: NAME.into(),
                user: Some(NAME.into()),
                ..Context::default()
            }),
            ..NamedContext::default()
        }],
        current_context: Some(NAME.into()),
        ..Kubeconfig::default()
    };
    let mut client_config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    client_config.connect_timeout = Some(REQUEST_TIMEOUT);
    client_config.read_timeout = Some(REQUEST_TIMEOUT);
    client_config.write_timeout = Some(REQUEST_TIMEOUT);
    client_config.default_retry = false;
    Ok(client_config)
}

#[cfg(test)]
#[path = "bootstrap_report_tests.rs"]
mod tests;
