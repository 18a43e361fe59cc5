//! [`KubeApi`]: the daemon's [`MachineApi`] over kube's client, with the node's credentials.
//!
//! # Background
//! The daemon talks to the API server with whatever identity its kubeconfig carries: on a
//! node, the kubelet's own rotated client certificate (`system:node:<name>`, which
//! `deploy/rbac.yaml` lets read Machines and write their status); in tests, the admin's.
//! Every request is bounded by [`REQUEST_TIMEOUT`], so a silent API server is an error the
//! loop backs off from, never a reconcile that hangs (and stops feeding the watchdog). Watches
//! are silent while nothing changes, so they have a client of their own whose bound is the
//! watch's own length ([`WATCH_READ_TIMEOUT`]).
//!
//! # Guarantees
//! - 409 is [`ApiError::Conflict`] (the caller re-reads), 401 [`ApiError::Unauthorized`]
//!   (the daemon restarts with the current credentials), 404 on a read is `None`, a transport
//!   failure or timeout is [`ApiError::Unreachable`] (back off), every other answer
//!   [`ApiError::Refused`] with the server's message; nothing is retried here.
//! - A kubeconfig that cannot be read or used is a [`ClientError`] naming its path.

use crate::daemon::reconcile::{ApiError, MachineApi};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{DeleteParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use nodeward_api::{Machine, MachineOperation};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The longest one request (not a watch) may take, connecting included.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(20);
/// How long the API server keeps one watch open before the watcher starts the next from the
/// last `resourceVersion` (kube's usual 290 s): two requests per watch per ~5 min when idle.
pub const WATCH_SECONDS: u32 = 290;
/// The longest a watch connection may stay silent: the server ends it after
/// [`WATCH_SECONDS`], so a longer silence is a dead connection (a NAT or proxy dropped it).
pub const WATCH_READ_TIMEOUT: Duration = Duration::from_secs(WATCH_SECONDS as u64 + 30);

/// Why the client could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The kubeconfig could not be read or parsed.
    #[error("kubeconfig {path}: {source}")]
    Kubeconfig {
        /// The kubeconfig.
        path: PathBuf,
        /// Why.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// The client could not be built from it (a bad certificate, say).
    #[error("kubeconfig {path}: cannot make a client: {source}")]
    Client {
        /// The kubeconfig.
        path: PathBuf,
        /// Why.
        #[source]
        source: kube::Error,
    },
}

/// Two clients of the API server from the kubeconfig at `path` (its current context): one
/// for requests (each bounded by [`REQUEST_TIMEOUT`]) and one for watches (silent for at most
/// [`WATCH_READ_TIMEOUT`]).
pub async fn clients(path: &Path) -> Result<(Client, Client), ClientError> {
    let kubeconfig_error = |source| ClientError::Kubeconfig {
        path: path.to_path_buf(),
        source,
    };
    let kubeconfig = Kubeconfig::read_from(path).map_err(kubeconfig_error)?;
    let mut config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(kubeconfig_error)?;
    config.connect_timeout = Some(REQUEST_TIMEOUT);
    config.read_timeout = Some(REQUEST_TIMEOUT);
    config.write_timeout = Some(REQUEST_TIMEOUT);
    let mut watch_config = config.clone();
    watch_config.read_timeout = Some(WATCH_READ_TIMEOUT);
    let client_error = |source| ClientError::Client {
        path: path.to_path_buf(),
        source,
    };
    Ok((
        Client::try_from(config).map_err(client_error)?,
        Client::try_from(watch_config).map_err(client_error)?,
    ))
}

/// The Machine and MachineOperation APIs, for requests and for watches.
#[derive(Clone)]
pub struct KubeApi {
    machines: Api<Machine>,
    operations: Api<MachineOperation>,
    requests: Client,
    watches: Client,
}

impl KubeApi {
    /// Both resources are cluster-scoped; `requests` and `watches` as [`clients`] makes them.
    pub fn new(requests: Client, watches: Client) -> Self {
        KubeApi {
            machines: Api::all(requests.clone()),
            operations: Api::all(requests.clone()),
            requests,
            watches,
        }
    }

    /// The Machines, for the watch.
    pub fn watch_machines(&self) -> Api<Machine> {
        Api::all(self.watches.clone())
    }

    /// The MachineOperations, for the watch.
    pub fn watch_operations(&self) -> Api<MachineOperation> {
        Api::all(self.watches.clone())
    }
}

/// What `e` means to the daemon (see the module's guarantees).
pub fn classify(e: kube::Error) -> ApiError {
    match e {
        kube::Error::Api(status) if status.is_conflict() => ApiError::Conflict,
        kube::Error::Api(status) if status.code == 401 => ApiError::Unauthorized(status.message),
        kube::Error::Api(status) => ApiError::Refused(format!(
            "{} {}: {}",
            status.code, status.reason, status.message
        )),
        e @ (kube::Error::HyperError(_) | kube::Error::Service(_)) => {
            ApiError::Unreachable(error_chain(&e))
        }
        e => ApiError::Refused(error_chain(&e)),
    }
}

/// `e` and its sources, `: `-joined (hyper's own message alone says only "client error").
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let s_text = s.to_string();
        if !text.contains(&s_text) {
            text = format!("{text}: {s_text}");
        }
        source = s.source();
    }
    text
}

/// A read that may find nothing: 404 is `None`.
fn found<K>(r: Result<Option<K>, kube::Error>) -> Result<Option<K>, ApiError> {
    r.map_err(classify)
}

fn name_of(meta: &kube::api::ObjectMeta) -> Result<&str, ApiError> {
    meta.name
        .as_deref()
        .ok_or_else(|| ApiError::Refused("the object has no metadata.name".into()))
}

impl MachineApi for KubeApi {
    async fn machine(&self, name: &str) -> Result<Option<Machine>, ApiError> {
        found(self.machines.get_opt(name).await)
    }

    async fn replace_machine_status(&self, machine: &Machine) -> Result<Machine, ApiError> {
        let name = name_of(&machine.metadata)?;
        self.machines
            .replace_status(name, &PostParams::default(), machine)
            .await
            .map_err(classify)
    }

    async fn operation(&self, name: &str) -> Result<Option<MachineOperation>, ApiError> {
        found(self.operations.get_opt(name).await)
    }

    async fn replace_operation_status(
        &self,
        op: &MachineOperation,
    ) -> Result<MachineOperation, ApiError> {
        let name = name_of(&op.metadata)?;
        self.operations
            .replace_status(name, &PostParams::default(), op)
            .await
            .map_err(classify)
    }

    async fn delete_operation(&self, name: &str) -> Result<(), ApiError> {
        match self.operations.delete(name, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.is_not_found() => Ok(()),
            Err(e) => Err(classify(e)),
        }
    }

    async fn config_map(&self, namespace: &str, name: &str) -> Result<Option<ConfigMap>, ApiError> {
        let api: Api<ConfigMap> = Api::namespaced(self.requests.clone(), namespace);
        found(api.get_opt(name).await)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: u16, reason: &str) -> kube::Error {
        kube::Error::Api(Box::new(kube::core::Status {
            code,
            reason: reason.into(),
            message: format!("{reason} happened"),
            ..Default::default()
        }))
    }

    #[test]
    fn a_conflict_is_retried_and_other_answers_are_refusals_naming_the_server_message() {
        assert_eq!(classify(status(409, "Conflict")), ApiError::Conflict);
        assert!(matches!(
            classify(status(401, "Unauthorized")),
            ApiError::Unauthorized(_)
        ));
        assert_eq!(
            classify(status(403, "Forbidden")),
            ApiError::Refused("403 Forbidden: Forbidden happened".into())
        );
    }

    #[tokio::test]
    async fn a_missing_kubeconfig_is_an_error_naming_its_path() {
        let e = clients(Path::new("/nonexistent/nodeward/kubeconfig"))
            .await
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("/nonexistent/nodeward/kubeconfig"), "{e}");
    }
}
