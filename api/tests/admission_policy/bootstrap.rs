//! `nodeward-bootstrapper-condition-only`, and RBAC for bootstrap tokens: each rule the
//! manifests state, over the writes `nodeward bootstrap` makes and the ones a token holder
//! could try.

use crate::cluster::{Outcome, User, bootstrap_token, delete, deployed, read, write_status};
use crate::fixtures::{
    bootstrap_report, daemon_status, json_of, machine, operation, operation_status,
};
use crate::policy::Verdict;
use nodeward_api::operation::OperationPhase;
use nodeward_api::{ConditionType, MachineStatus, Reason};
use serde_json::{Value as Json, json};

const POLICY: &str = "nodeward-bootstrapper-condition-only";
const OTHER_CONDITIONS: &str = "a bootstrap token may write only the AgentBootstrapped condition";
const ONCE: &str =
    "a bootstrap token may set the AgentBootstrapped condition once, never remove it";
const REASONS: &str = "a bootstrap token may set AgentBootstrapped only to Bootstrapping, \
                       Bootstrapped or BootstrapFailed, with no observedGeneration";
const TRANSITION: &str = "a bootstrap token may move AgentBootstrapped's lastTransitionTime only when its status changes";
const BEYOND: &str = "a bootstrap token may not change a Machine's status beyond AgentBootstrapped";

/// The bootstrap's own reasons: those of the AgentBootstrapped condition.
fn bootstrap_reasons() -> Vec<Reason> {
    let reasons: Vec<Reason> = Reason::ALL
        .into_iter()
        .filter(|r| r.condition_type() == ConditionType::AgentBootstrapped)
        .collect();
    assert_eq!(reasons.len(), 3, "{reasons:?}");
    reasons
}

/// What a Machine's status can be when a bootstrap reports: none yet, the daemon's (a node
/// being repaved), or the bootstrap's own earlier report.
fn stored_statuses() -> Vec<Option<MachineStatus>> {
    let daemon = daemon_status(2, 1_750_000_000, 0);
    let mut earlier = bootstrap_report(None, Reason::Bootstrapping, 1_749_000_000);
    earlier.conditions[0].message = "running: containerd".to_string();
    vec![None, Some(daemon), Some(earlier)]
}

fn token() -> User {
    bootstrap_token("abcdef")
}

/// Refused by the bootstrapper policy with exactly `messages`.
fn refused(messages: &[&str]) -> Outcome {
    Outcome::Refused(
        POLICY.to_string(),
        Verdict::Violated(messages.iter().map(|m| m.to_string()).collect()),
    )
}

/// The answer to the token writing `status` over the Machine `worker-01` holding `stored`.
fn answer(stored: &MachineStatus, status: Json) -> Outcome {
    let call = write_status(
        "update",
        "machines",
        &machine("worker-01", Some(stored)),
        status,
    );
    deployed().answer(&token(), &call)
}

/// The AgentBootstrapped condition of a status in JSON.
fn bootstrapped(status: &mut Json) -> &mut Json {
    status["conditions"]
        .as_array_mut()
        .and_then(|c| c.iter_mut().find(|c| c["type"] == "AgentBootstrapped"))
        .expect("an AgentBootstrapped condition")
}

#[test]
fn a_bootstrap_token_reports_each_of_the_bootstraps_reasons() {
    let cluster = deployed();
    for who in [token(), bootstrap_token("0a1b2c")] {
        for stored in stored_statuses() {
            for reason in bootstrap_reasons() {
                let written = bootstrap_report(stored.as_ref(), reason, 1_750_000_600);
                let object = machine("worker-01", stored.as_ref());
                for verb in ["update", "patch"] {
                    let call = write_status(verb, "machines", &object, json_of(&written));
                    assert_eq!(
                        cluster.answer(&who, &call),
                        Outcome::Allowed,
                        "{reason:?} over {stored:?}"
                    );
                }
            }
        }
    }
}

#[test]
fn a_bootstrap_token_sets_no_other_status_or_reason() {
    // A status without the condition yet, so only the pair decides.
    let mut stored = daemon_status(2, 1_750_000_000, 0);
    stored.conditions.retain(|c| c.type_ != "AgentBootstrapped");
    let allowed: Vec<(String, String)> = bootstrap_reasons()
        .into_iter()
        .map(|r| (r.status().as_str().to_string(), r.as_str().to_string()))
        .collect();
    let reasons = Reason::ALL.map(|r| r.as_str().to_string());
    for status in ["True", "False", "Unknown"] {
        for reason in reasons
            .iter()
            .map(String::as_str)
            .chain(["Joined", "bootstrapped"])
        {
            if allowed.contains(&(status.to_string(), reason.to_string())) {
                continue;
            }
            let mut written = json_of(&bootstrap_report(Some(&stored), Reason::Bootstrapping, 9));
            let condition = bootstrapped(&mut written);
            condition["status"] = json!(status);
            condition["reason"] = json!(reason);
            assert_eq!(
                answer(&stored, written),
                refused(&[REASONS]),
                "{status}/{reason}"
            );
        }
    }
}

#[test]
fn a_bootstrap_token_never_removes_agent_bootstrapped() {
    for stored in stored_statuses().into_iter().flatten() {
        let mut written = json_of(&stored);
        written["conditions"]
            .as_array_mut()
            .expect("conditions")
            .retain(|c| c["type"] != "AgentBootstrapped");
        assert_eq!(answer(&stored, written), refused(&[ONCE]), "{stored:?}");
    }
    // Clearing the whole status removes it with everything else.
    let stored = daemon_status(2, 1_750_000_000, 0);
    assert_eq!(
        answer(&stored, json!(null)),
        refused(&[OTHER_CONDITIONS, ONCE, BEYOND])
    );
    assert_eq!(
        answer(&stored, json!({})),
        refused(&[OTHER_CONDITIONS, ONCE, BEYOND])
    );
}

#[test]
fn a_bootstrap_token_writes_agent_bootstrapped_once() {
    let stored = daemon_status(2, 1_750_000_000, 0);
    let mut written = json_of(&bootstrap_report(Some(&stored), Reason::Bootstrapped, 9));
    let twice = bootstrapped(&mut written).clone();
    written["conditions"]
        .as_array_mut()
        .expect("conditions")
        .push(twice);
    assert_eq!(answer(&stored, written), refused(&[ONCE]));
}

#[test]
fn a_bootstrap_token_claims_no_observed_generation() {
    for stored in stored_statuses().into_iter().flatten() {
        let mut written = json_of(&bootstrap_report(Some(&stored), Reason::BootstrapFailed, 9));
        bootstrapped(&mut written)["observedGeneration"] = json!(3);
        assert_eq!(answer(&stored, written), refused(&[REASONS]), "{stored:?}");
    }
}

#[test]
fn a_bootstrap_token_moves_last_transition_time_only_with_the_status() {
    let stored = bootstrap_report(None, Reason::Bootstrapping, 1_749_000_000);
    // The same status with a new message keeps the time (as set_condition does) ...
    let mut written = json_of(&stored);
    bootstrapped(&mut written)["message"] = json!("running: containerd");
    assert_eq!(answer(&stored, written.clone()), Outcome::Allowed);
    // ... and may not move it.
    bootstrapped(&mut written)["lastTransitionTime"] = json!("2025-06-20T12:00:00Z");
    assert_eq!(answer(&stored, written), refused(&[TRANSITION]));
}

#[test]
fn a_bootstrap_token_changes_no_other_condition() {
    let stored = daemon_status(2, 1_750_000_000, 0);
    let base = json_of(&bootstrap_report(Some(&stored), Reason::Bootstrapping, 9));
    let count = base["conditions"].as_array().expect("conditions").len();
    assert_eq!(count, ConditionType::ALL.len());
    for i in (0..count).filter(|i| base["conditions"][*i]["type"] != "AgentBootstrapped") {
        let kind = &base["conditions"][i]["type"];
        let flipped = if base["conditions"][i]["status"] == "True" {
            "False"
        } else {
            "True"
        };
        for (field, value) in [
            ("status", json!(flipped)),
            ("reason", json!("UpdateFailed")),
            ("message", json!("faked")),
            ("lastTransitionTime", json!("2020-01-01T00:00:00Z")),
            ("observedGeneration", json!(9)),
            ("type", json!("FromANewerDaemon")),
        ] {
            let mut written = base.clone();
            written["conditions"][i][field] = value;
            assert_eq!(
                answer(&stored, written),
                refused(&[OTHER_CONDITIONS]),
                "{kind} {field}"
            );
        }
        let mut removed = base.clone();
        removed["conditions"]
            .as_array_mut()
            .expect("conditions")
            .remove(i);
        assert_eq!(answer(&stored, removed), refused(&[OTHER_CONDITIONS]));
    }
    let mut added = base.clone();
    let mut newer = base["conditions"][0].clone();
    newer["type"] = json!("FromANewerDaemon");
    added["conditions"]
        .as_array_mut()
        .expect("conditions")
        .push(newer);
    assert_eq!(answer(&stored, added), refused(&[OTHER_CONDITIONS]));
}

/// The fields of a Machine's status in the CRD's schema, conditions aside.
fn status_fields() -> Vec<String> {
    let machines = nodeward_api::crd::all()
        .into_iter()
        .find(|f| f.crd.spec.names.plural == "machines")
        .expect("the Machine CRD");
    let schema = machines.crd.spec.versions[0]
        .schema
        .as_ref()
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .and_then(|s| s.properties.as_ref())
        .and_then(|p| p.get("status"))
        .and_then(|s| s.properties.clone())
        .expect("the status schema");
    schema.into_keys().filter(|f| f != "conditions").collect()
}

#[test]
fn a_bootstrap_token_changes_no_other_status_field() {
    let fields = status_fields();
    let (before, after) = (
        json_of(&daemon_status(2, 1_750_000_000, 0)),
        json_of(&daemon_status(3, 1_750_000_600, 1)),
    );
    // The fixtures set every field of the schema, so a field added to the status is tried
    // here as soon as the fixture sets it.
    let mut set: Vec<String> = before
        .as_object()
        .expect("a status")
        .keys()
        .cloned()
        .collect();
    set.retain(|f| f != "conditions");
    set.sort();
    assert_eq!(set, fields);
    let stored = daemon_status(2, 1_750_000_000, 0);
    let report = json_of(&bootstrap_report(Some(&stored), Reason::Bootstrapped, 9));
    for field in &fields {
        assert_ne!(before[field], after[field], "{field}: the fixtures differ");
        let mut changed = report.clone();
        changed[field] = after[field].clone();
        assert_eq!(
            answer(&stored, changed),
            refused(&[BEYOND]),
            "{field} changed"
        );
        let mut removed = report.clone();
        removed.as_object_mut().expect("a status").remove(field);
        assert_eq!(
            answer(&stored, removed),
            refused(&[BEYOND]),
            "{field} removed"
        );
        let mut nulled = report.clone();
        nulled[field] = Json::Null;
        assert_eq!(answer(&stored, nulled), refused(&[BEYOND]), "{field} null");
        // Added to a status that lacks it.
        let mut lacking: MachineStatus = stored.clone();
        let mut lacking_json = json_of(&lacking);
        lacking_json
            .as_object_mut()
            .expect("a status")
            .remove(field);
        lacking = serde_json::from_value(lacking_json).expect("a status");
        let mut added = json_of(&bootstrap_report(Some(&lacking), Reason::Bootstrapped, 9));
        added[field] = after[field].clone();
        assert_eq!(answer(&lacking, added), refused(&[BEYOND]), "{field} added");
    }
}

#[test]
fn who_the_bootstrapper_policy_holds() {
    let cluster = deployed();
    let stored = machine("worker-01", Some(&daemon_status(2, 1, 0)));
    let call = write_status(
        "update",
        "machines",
        &stored,
        json_of(&daemon_status(3, 2, 1)),
    );
    let verdict_for = |who: &User| {
        let verdicts = cluster.verdicts(who, &call);
        verdicts
            .into_iter()
            .find(|(p, _)| p == POLICY)
            .expect("the policy")
            .1
    };
    // The daemon's write (other conditions, its generation on each, a new time with the same
    // status, every field) breaks every rule but one.
    let daemon_write = Verdict::Violated(
        [OTHER_CONDITIONS, REASONS, TRANSITION, BEYOND]
            .map(String::from)
            .to_vec(),
    );
    // A token by its user alone (the server leaves an empty group list out of the request),
    // and any member of system:bootstrappers by its group.
    let mut name_only = token();
    name_only.groups.clear();
    let mut group_only = token();
    group_only.name = "eks:bootstrap-role".to_string();
    // A user named like a node but not in system:nodes is no node.
    let mut named_like_a_node = token();
    named_like_a_node.name = "system:node:worker-01".to_string();
    for who in [token(), name_only, group_only, named_like_a_node.clone()] {
        assert_eq!(verdict_for(&who), daemon_write, "{who:?}");
    }
    // Named like a node, it is held to that node's Machine as well.
    let other = machine("worker-02", Some(&daemon_status(2, 1, 0)));
    let written = json_of(&bootstrap_report(
        Some(&daemon_status(2, 1, 0)),
        Reason::Bootstrapped,
        9,
    ));
    let call = write_status("update", "machines", &other, written.clone());
    let outcome = cluster.answer(&named_like_a_node, &call);
    assert!(
        matches!(&outcome, Outcome::Refused(p, _) if p == "nodeward-node-own-machine"),
        "{outcome:?}"
    );
    let call = write_status("update", "machines", &stored, written);
    assert_eq!(cluster.answer(&named_like_a_node, &call), Outcome::Allowed);
}

#[test]
fn rbac_lets_a_token_read_its_machine_and_write_nothing_else() {
    // host/bootstrap_report.rs: get the Machine by name, then replace its status.
    let cluster = deployed();
    let who = token();
    assert!(cluster.authorizes(
        &who,
        &read("get", nodeward_api::GROUP, "machines", "worker-01")
    ));
    for verb in ["list", "watch"] {
        assert!(!cluster.authorizes(&who, &read(verb, nodeward_api::GROUP, "machines", "")));
    }
    for verb in ["get", "list", "watch"] {
        let call = read(verb, nodeward_api::GROUP, "machineoperations", "");
        assert!(!cluster.authorizes(&who, &call), "{verb}");
    }
    let op = operation("reboot", "worker-01");
    let status = operation_status(OperationPhase::Failed);
    let call = write_status("update", "machineoperations", &op, status);
    assert_eq!(cluster.answer(&who, &call), Outcome::Unauthorized);
    assert_eq!(
        cluster.answer(&who, &delete("machineoperations", &op)),
        Outcome::Unauthorized
    );
}
