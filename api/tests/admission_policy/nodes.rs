//! `nodeward-node-own-machine`, and RBAC for nodes: each rule the manifests state, for
//! kubeadm and EKS nodes, a non-node member of `system:nodes`, and operators.

use crate::cluster::{
    Outcome, User, bootstrap_token, delete, deployed, eks_node, kubeadm_admin, kubeadm_node,
    nodes_group_member, read, super_admin, update, write_status,
};
use crate::fixtures::{daemon_status, json_of, machine, operation, operation_status};
use crate::policy::Verdict;
use nodeward_api::operation::OperationPhase;
use serde_json::json;

const NODE_POLICY: &str = "nodeward-node-own-machine";
const ONLY_ITS_MACHINE: &str = "a node may write only the status of the Machine named like itself";
const ONLY_ITS_OPERATIONS: &str =
    "a node may write the status of (or delete) only MachineOperations naming its own Machine";
const ONLY_AS_A_NODE: &str =
    "a member of system:nodes may write a Machine's status only as a node, system:node:<name>";

/// The node names of the users below: a kubeadm node's and an EKS node's (its private DNS
/// name, which EKS makes the Node's name).
const KUBEADM: &str = "worker-01";
const EKS: &str = "ip-10-0-1-23.ec2.internal";

fn nodes() -> [(User, &'static str); 2] {
    [(kubeadm_node(KUBEADM), KUBEADM), (eks_node(EKS), EKS)]
}

/// Refused by the node policy with exactly `messages`.
fn refused(messages: &[&str]) -> Outcome {
    Outcome::Refused(
        NODE_POLICY.to_string(),
        Verdict::Violated(messages.iter().map(|m| m.to_string()).collect()),
    )
}

#[test]
fn a_node_writes_its_own_machines_whole_status() {
    let cluster = deployed();
    for (node, name) in nodes() {
        let stored = machine(name, Some(&daemon_status(2, 1_750_000_000, 0)));
        let fresh = machine(name, None);
        for verb in ["update", "patch"] {
            // The daemon's pass: every field changes (conditions, phase, bundle, audit head…).
            let next = json_of(&daemon_status(3, 1_750_000_600, 1));
            let call = write_status(verb, "machines", &stored, next.clone());
            cluster.expect(&node, &call, Outcome::Allowed);
            let call = write_status(verb, "machines", &fresh, next);
            cluster.expect(&node, &call, Outcome::Allowed);
            // Clearing it is the node's to do as well.
            let call = write_status(verb, "machines", &stored, json!(null));
            cluster.expect(&node, &call, Outcome::Allowed);
        }
    }
}

#[test]
fn no_node_writes_another_machines_status() {
    let cluster = deployed();
    for (node, _) in nodes() {
        for other in [
            "worker-02",
            "worker-0",
            "worker-011",
            "ip-10-0-1-24.ec2.internal",
            "",
        ] {
            let stored = machine(other, Some(&daemon_status(2, 1_750_000_000, 0)));
            let next = json_of(&daemon_status(3, 1_750_000_600, 1));
            let call = write_status("update", "machines", &stored, next);
            cluster.expect(&node, &call, refused(&[ONLY_ITS_MACHINE]));
        }
    }
}

#[test]
fn a_node_writes_and_deletes_only_the_operations_naming_its_machine() {
    let cluster = deployed();
    for (node, name) in nodes() {
        let own = operation("reboot-own", name);
        let others = operation("reboot-other", "worker-02");
        for verb in ["update", "patch"] {
            let status = operation_status(OperationPhase::InProgress);
            let call = write_status(verb, "machineoperations", &own, status.clone());
            cluster.expect(&node, &call, Outcome::Allowed);
            let call = write_status(verb, "machineoperations", &others, status);
            cluster.expect(&node, &call, refused(&[ONLY_ITS_OPERATIONS]));
        }
        let call = delete("machineoperations", &own);
        cluster.expect(&node, &call, Outcome::Allowed);
        let call = delete("machineoperations", &others);
        cluster.expect(&node, &call, refused(&[ONLY_ITS_OPERATIONS]));
    }
}

#[test]
fn a_member_of_system_nodes_not_named_as_a_node_writes_nothing() {
    let cluster = deployed();
    // RBAC grants the group; the policy refuses every write, also to a Machine or an operation
    // named like the user.
    for name in [
        "mallory",
        "worker-01",
        "system:node",
        "system:nodeworker-01",
        "node:worker-01",
    ] {
        let who = nodes_group_member(name);
        let stored = machine("worker-01", Some(&daemon_status(2, 1, 0)));
        let next = json_of(&daemon_status(3, 2, 1));
        let call = write_status("update", "machines", &stored, next);
        assert!(cluster.authorizes(&who, &call), "RBAC grants the group");
        cluster.expect(&who, &call, refused(&[ONLY_AS_A_NODE, ONLY_ITS_MACHINE]));
        let own = operation("reboot", "worker-01");
        let status = operation_status(OperationPhase::Failed);
        let call = write_status("update", "machineoperations", &own, status);
        cluster.expect(&who, &call, refused(&[ONLY_AS_A_NODE, ONLY_ITS_OPERATIONS]));
        let call = delete("machineoperations", &own);
        cluster.expect(&who, &call, refused(&[ONLY_AS_A_NODE, ONLY_ITS_OPERATIONS]));
    }
}

#[test]
fn an_eks_node_is_not_held_to_the_bootstrap_tokens_rules() {
    // It is in system:bootstrappers too, but it is a node: the bootstrapper policy leaves it to
    // the node policy (the first flaw of issue 26, item 6).
    let cluster = deployed();
    let node = eks_node(EKS);
    let stored = machine(EKS, Some(&daemon_status(2, 1, 0)));
    let call = write_status(
        "update",
        "machines",
        &stored,
        json_of(&daemon_status(3, 2, 1)),
    );
    let verdicts = cluster.verdicts(&node, &call);
    assert_eq!(
        verdicts,
        [
            (NODE_POLICY.to_string(), Verdict::Admitted),
            (
                "nodeward-bootstrapper-condition-only".to_string(),
                Verdict::NotMatched
            ),
        ]
    );
}

#[test]
fn operators_are_not_limited() {
    let cluster = deployed();
    for who in [kubeadm_admin(), super_admin()] {
        let stored = machine("worker-02", Some(&daemon_status(2, 1, 0)));
        let call = write_status(
            "update",
            "machines",
            &stored,
            json_of(&daemon_status(3, 2, 1)),
        );
        cluster.expect(&who, &call, Outcome::Allowed);
        let call = write_status("patch", "machines", &stored, json!({"phase": "Failed"}));
        cluster.expect(&who, &call, Outcome::Allowed);
        let op = operation("reboot", "worker-02");
        let call = delete("machineoperations", &op);
        cluster.expect(&who, &call, Outcome::Allowed);
        let mut spec = stored.clone();
        spec["spec"]["kubernetesVersion"] = json!("1.35.0");
        let call = update("machines", &stored, spec);
        cluster.expect(&who, &call, Outcome::Allowed);
        for (_, verdict) in cluster.verdicts(
            &who,
            &write_status("update", "machines", &stored, json!({})),
        ) {
            assert_eq!(verdict, Verdict::NotMatched, "{}", who.name);
        }
    }
}

#[test]
fn rbac_lets_nodes_make_every_call_the_daemon_makes() {
    // host/daemon/kube_api.rs: get and watch (list, then watch) Machines and MachineOperations,
    // replace_status of both, delete of an operation, get of the config's ConfigMap in
    // nodeward-system.
    let cluster = deployed();
    for (node, name) in nodes() {
        for resource in ["machines", "machineoperations"] {
            for verb in ["get", "list", "watch"] {
                let call = read(verb, nodeward_api::GROUP, resource, "");
                assert!(
                    cluster.authorizes(&node, &call),
                    "{} {verb} {resource}",
                    node.name
                );
            }
        }
        let stored = machine(name, None);
        let call = write_status(
            "update",
            "machines",
            &stored,
            json_of(&daemon_status(1, 1, 0)),
        );
        assert!(cluster.authorizes(&node, &call), "{}", node.name);
        let op = operation("reboot", name);
        let status = operation_status(OperationPhase::Complete);
        assert!(cluster.authorizes(
            &node,
            &write_status("update", "machineoperations", &op, status)
        ));
        assert!(cluster.authorizes(&node, &delete("machineoperations", &op)));
        let mut get_config = read("get", "", "configmaps", "node-config");
        get_config.namespace = "nodeward-system";
        assert!(cluster.authorizes(&node, &get_config), "{}", node.name);
        get_config.namespace = "kube-system";
        assert!(!cluster.authorizes(&node, &get_config), "{}", node.name);
    }
}

#[test]
fn rbac_lets_no_node_or_token_write_a_spec_or_delete_a_machine() {
    let cluster = deployed();
    let users = [
        kubeadm_node(KUBEADM),
        eks_node(EKS),
        bootstrap_token("abcdef"),
    ];
    for who in users {
        let stored = machine(KUBEADM, None);
        let mut changed = stored.clone();
        changed["spec"]["kubernetesVersion"] = json!("1.35.0");
        let call = update("machines", &stored, changed);
        cluster.expect(&who, &call, Outcome::Unauthorized);
        let call = delete("machines", &stored);
        cluster.expect(&who, &call, Outcome::Unauthorized);
        let op = operation("reboot", KUBEADM);
        let mut changed = op.clone();
        changed["spec"]["kind"] = json!("AgentReset");
        let call = update("machineoperations", &op, changed);
        cluster.expect(&who, &call, Outcome::Unauthorized);
    }
}
