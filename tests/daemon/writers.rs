//! Another writer of the Machine's status beside the daemon, on the real API server: the test
//! sets a condition of its own (a type the daemon does not know) and drops one of the daemon's
//! (`RepavePending`), over and over. Each of its writes is an event the daemon answers with a
//! pass that writes `RepavePending` back, both writing at the `resourceVersion` they read, so
//! each meets 409 Conflicts and retries. In the end neither has lost the other's condition.

use crate::cluster::Cluster;
use kube::api::{Api, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use nodeward_api::{Condition, Machine, Time};
use std::time::Duration;

/// The test's own condition type.
pub const FOREIGN: &str = "ExampleObserved";

/// Writes [`FOREIGN`] `writes` times (its message `write <i>`), dropping the daemon's
/// `RepavePending` each time; the 409s the test's writes met.
pub fn write_concurrently(cluster: &Cluster, name: &str, writes: usize) -> usize {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let kubeconfig =
            Kubeconfig::read_from(&cluster.admin_kubeconfig).expect("admin kubeconfig");
        let config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .expect("client config");
        let client = kube::Client::try_from(config).expect("client");
        let api: Api<Machine> = Api::all(client);
        let mut conflicts = 0;
        for i in 0..writes {
            loop {
                let mut m = api.get_status(name).await.expect("get the Machine");
                let status = m.status.get_or_insert_with(Default::default);
                status
                    .conditions
                    .retain(|c| c.type_ != FOREIGN && c.type_ != "RepavePending");
                status.conditions.push(Condition {
                    type_: FOREIGN.into(),
                    status: "True".into(),
                    reason: "Example".into(),
                    message: format!("write {i}"),
                    last_transition_time: Time(k8s_openapi::jiff::Timestamp::now()),
                    observed_generation: None,
                });
                match api.replace_status(name, &PostParams::default(), &m).await {
                    Ok(_) => break,
                    Err(kube::Error::Api(e)) if e.code == 409 => conflicts += 1,
                    Err(e) => panic!("writing the Machine's status: {e}"),
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        conflicts
    })
}
