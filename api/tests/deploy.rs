//! What `deploy/` hands a cluster and a host besides the CRDs: the daemon's systemd unit, the
//! RBAC of nodes, and the admission policy that keeps each node to its own Machine. Each file
//! is parsed (the RBAC and the policy into k8s-openapi's types, so a misspelt field fails) and
//! its promises are pinned, including what it must not grant or set.

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::Path;

fn read(file: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy")
        .join(file);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

// ---------------------------------------------------------------------------------------------
// The systemd unit.

/// A unit file's settings: section → key → values in order. A key may be given more than once
/// and list settings accumulate; an empty assignment resets the list, as systemd does.
type Unit = BTreeMap<String, BTreeMap<String, Vec<String>>>;

/// Parses a unit file the way systemd reads one: `#` and `;` comment lines, `[Section]`
/// headers, `Key=Value` with spaces around `=` ignored, and a trailing backslash joining the
/// next line with a space.
fn parse_unit(text: &str) -> Unit {
    let mut unit = Unit::new();
    let mut section: Option<String> = None;
    let mut pending = String::new();
    for raw in text.lines() {
        let line = raw.trim();
        if pending.is_empty() && (line.is_empty() || line.starts_with('#') || line.starts_with(';'))
        {
            continue;
        }
        if let Some(continued) = line.strip_suffix('\\') {
            pending.push_str(continued);
            pending.push(' ');
            continue;
        }
        let line = std::mem::take(&mut pending) + line;
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = Some(name.to_string());
            continue;
        }
        let section = section
            .as_ref()
            .unwrap_or_else(|| panic!("setting outside a section: {line}"));
        let (key, value) = line
            .split_once('=')
            .unwrap_or_else(|| panic!("not Key=Value: {line}"));
        let values = unit
            .entry(section.clone())
            .or_default()
            .entry(key.trim().to_string())
            .or_default();
        let value = value.trim();
        if value.is_empty() {
            values.clear();
        } else {
            values.push(value.to_string());
        }
    }
    assert!(pending.is_empty(), "the file ends in a continuation");
    unit
}

fn service() -> BTreeMap<String, Vec<String>> {
    let unit = parse_unit(&read("nodeward.service"));
    assert!(
        unit.contains_key("Unit") && unit.contains_key("Install"),
        "{unit:?}"
    );
    unit.get("Service").cloned().expect("a [Service] section")
}

/// The one value of a single-valued setting.
fn one(service: &BTreeMap<String, Vec<String>>, key: &str) -> String {
    match service.get(key).map(Vec::as_slice) {
        Some([value]) => value.clone(),
        other => panic!("{key}: expected one value, got {other:?}"),
    }
}

/// The exit statuses of a list setting, over all its assignments.
fn statuses(service: &BTreeMap<String, Vec<String>>, key: &str) -> Vec<String> {
    service
        .get(key)
        .into_iter()
        .flatten()
        .flat_map(|v| v.split_whitespace().map(str::to_string))
        .collect()
}

#[test]
fn unit_parser_reads_like_systemd() {
    let unit = parse_unit(
        "# comment\n[Service]\n; another\nSuccessExitStatus=1\nSuccessExitStatus=\nSuccessExitStatus = 2 \\\n  3\nType=notify\n",
    );
    let service = &unit["Service"];
    assert_eq!(
        statuses(service, "SuccessExitStatus"),
        ["2", "3"],
        "reset, then joined"
    );
    assert_eq!(one(service, "Type"), "notify");
}

#[test]
fn unit_is_a_notify_service_with_a_watchdog() {
    let service = service();
    assert_eq!(one(&service, "Type"), "notify");
    assert_eq!(one(&service, "NotifyAccess"), "main");
    assert_eq!(one(&service, "ExecStart"), "/usr/local/bin/nodeward daemon");
    let watchdog = one(&service, "WatchdogSec");
    assert!(
        !["0", "infinity"].contains(&watchdog.as_str()),
        "WatchdogSec={watchdog} disables the watchdog"
    );
    assert_eq!(one(&service, "Restart"), "on-failure");
    assert_eq!(one(&service, "RestartSec"), "5s");
}

#[test]
fn exit_69_is_a_clean_stop_that_is_never_restarted() {
    let service = service();
    for key in ["SuccessExitStatus", "RestartPreventExitStatus"] {
        assert!(
            statuses(&service, key).iter().any(|s| s == "69"),
            "{key} lacks 69: {:?}",
            service.get(key)
        );
    }
}

#[test]
fn unit_leaves_the_agent_able_to_do_its_job() {
    let service = service();
    // Each of these would run the daemon in its own mount namespace (its mounts unseen by the
    // host), forbid what its phases do (modules, sysctls, writing /etc), or stop the
    // WebAssembly runtime from compiling phases.
    for key in [
        "ProtectSystem",
        "ProtectHome",
        "PrivateTmp",
        "PrivateDevices",
        "PrivateMounts",
        "ProtectControlGroups",
        "ProtectKernelLogs",
        "ProtectKernelModules",
        "ProtectKernelTunables",
        "ReadOnlyPaths",
        "InaccessiblePaths",
        "TemporaryFileSystem",
        "MemoryDenyWriteExecute",
        "RootDirectory",
        "DynamicUser",
        "User",
    ] {
        assert!(!service.contains_key(key), "{key} breaks a node agent");
    }
    assert_eq!(one(&service, "NoNewPrivileges"), "yes");
}

// ---------------------------------------------------------------------------------------------
// RBAC and admission.

/// Every document of a multi-document YAML file, by kind.
fn documents(file: &str) -> Vec<(String, serde_json::Value)> {
    serde_yaml_ng::Deserializer::from_str(&read(file))
        .map(|doc| {
            let value =
                serde_json::Value::deserialize(doc).unwrap_or_else(|e| panic!("{file}: {e}"));
            let kind = value["kind"]
                .as_str()
                .unwrap_or_else(|| panic!("{file}: a document without kind"))
                .to_string();
            (kind, value)
        })
        .collect()
}

fn the<T: serde::de::DeserializeOwned>(docs: &[(String, serde_json::Value)], kind: &str) -> T {
    let mut found = docs.iter().filter(|(k, _)| k == kind);
    let (_, value) = found.next().unwrap_or_else(|| panic!("no {kind}"));
    assert!(found.next().is_none(), "more than one {kind}");
    serde_json::from_value(value.clone()).unwrap_or_else(|e| panic!("{kind}: {e}"))
}

/// The one document of `kind` named `name`.
fn named<T: serde::de::DeserializeOwned>(
    docs: &[(String, serde_json::Value)],
    kind: &str,
    name: &str,
) -> T {
    let mut found = docs
        .iter()
        .filter(|(k, v)| k == kind && v["metadata"]["name"] == name);
    let (_, value) = found.next().unwrap_or_else(|| panic!("no {kind} {name}"));
    assert!(found.next().is_none(), "more than one {kind} {name}");
    serde_json::from_value(value.clone()).unwrap_or_else(|e| panic!("{kind} {name}: {e}"))
}

/// How many documents of `kind` there are.
fn count(docs: &[(String, serde_json::Value)], kind: &str) -> usize {
    docs.iter().filter(|(k, _)| k == kind).count()
}

/// A rule as (resources, verbs), after checking it names only the nodeward.io group and no
/// resource names.
fn rule(r: &PolicyRule, group: &str) -> (Vec<String>, Vec<String>) {
    assert_eq!(
        r.api_groups.as_deref(),
        Some(&[group.to_string()][..]),
        "{r:?}"
    );
    assert!(
        r.resource_names.is_none() && r.non_resource_urls.is_none(),
        "{r:?}"
    );
    (r.resources.clone().unwrap_or_default(), r.verbs.clone())
}

#[test]
fn nodes_read_machines_and_write_only_their_status() {
    let docs = documents("rbac.yaml");
    assert_eq!(count(&docs, "ClusterRole"), 2, "nodes and bootstrappers");
    assert_eq!(
        count(&docs, "ClusterRoleBinding"),
        2,
        "nodes and bootstrappers"
    );
    let role: ClusterRole = named(&docs, "ClusterRole", "nodeward:node");
    assert_eq!(role.metadata.name.as_deref(), Some("nodeward:node"));
    let rules: Vec<(Vec<String>, Vec<String>)> = role
        .rules
        .iter()
        .flatten()
        .map(|r| rule(r, "nodeward.io"))
        .collect();
    let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(
        rules,
        vec![
            (strings(&["machines"]), strings(&["get", "list", "watch"])),
            (
                strings(&["machines/status"]),
                strings(&["get", "update", "patch"])
            ),
            (
                strings(&["machineoperations"]),
                strings(&["get", "list", "watch", "delete"])
            ),
            (
                strings(&["machineoperations/status"]),
                strings(&["update", "patch"])
            ),
        ]
    );
    // The resources are the CRDs' plurals, so the RBAC cannot drift from the types.
    let plurals: Vec<String> = nodeward_api::crd::all()
        .iter()
        .map(|f| f.crd.spec.names.plural.clone())
        .collect();
    assert_eq!(plurals, ["machines", "machineoperations"]);

    let binding: ClusterRoleBinding = named(&docs, "ClusterRoleBinding", "nodeward:node");
    assert_eq!(binding.role_ref.kind, "ClusterRole");
    assert_eq!(binding.role_ref.name, "nodeward:node");
    let subjects = binding.subjects.unwrap_or_default();
    assert_eq!(subjects.len(), 1, "{subjects:?}");
    assert_eq!(
        (subjects[0].kind.as_str(), subjects[0].name.as_str()),
        ("Group", "system:nodes")
    );
}

#[test]
fn bootstrap_tokens_read_a_machine_and_write_only_its_status() {
    let docs = documents("rbac.yaml");
    let role: ClusterRole = named(&docs, "ClusterRole", "nodeward:bootstrapper");
    let rules: Vec<(Vec<String>, Vec<String>)> = role
        .rules
        .iter()
        .flatten()
        .map(|r| rule(r, "nodeward.io"))
        .collect();
    let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    // Its one Machine by name: no list or watch (every Machine's spec), no operations.
    assert_eq!(
        rules,
        vec![
            (strings(&["machines"]), strings(&["get"])),
            (strings(&["machines/status"]), strings(&["update", "patch"])),
        ]
    );
    let binding: ClusterRoleBinding = named(&docs, "ClusterRoleBinding", "nodeward:bootstrapper");
    assert_eq!(binding.role_ref.kind, "ClusterRole");
    assert_eq!(binding.role_ref.name, "nodeward:bootstrapper");
    let subjects = binding.subjects.unwrap_or_default();
    assert_eq!(subjects.len(), 1, "{subjects:?}");
    assert_eq!(
        (subjects[0].kind.as_str(), subjects[0].name.as_str()),
        ("Group", "system:bootstrappers")
    );
}

#[test]
fn nodes_read_configmaps_only_in_the_nodeward_namespace() {
    let docs = documents("rbac.yaml");
    let role: Role = the(&docs, "Role");
    assert_eq!(role.metadata.namespace.as_deref(), Some("nodeward-system"));
    let rules: Vec<_> = role.rules.iter().flatten().map(|r| rule(r, "")).collect();
    assert_eq!(
        rules,
        vec![(vec!["configmaps".to_string()], vec!["get".to_string()])]
    );
    let binding: RoleBinding = the(&docs, "RoleBinding");
    assert_eq!(
        binding.metadata.namespace.as_deref(),
        Some("nodeward-system")
    );
    assert_eq!(
        binding.role_ref.name,
        role.metadata.name.clone().unwrap_or_default()
    );
    let subjects = binding.subjects.unwrap_or_default();
    assert_eq!(subjects.len(), 1, "{subjects:?}");
    assert_eq!(subjects[0].name, "system:nodes");
}

#[test]
fn no_rule_lets_a_node_or_a_bootstrap_token_write_a_spec() {
    let docs = documents("rbac.yaml");
    let roles = ["nodeward:node", "nodeward:bootstrapper"]
        .map(|name| named::<ClusterRole>(&docs, "ClusterRole", name));
    for r in roles.iter().flat_map(|role| role.rules.iter().flatten()) {
        let resources = r.resources.clone().unwrap_or_default();
        for verb in &r.verbs {
            assert!(
                !["create", "deletecollection", "*"].contains(&verb.as_str()),
                "{r:?}"
            );
            // The one delete: finished MachineOperations past their TTL (never a Machine).
            assert!(
                verb != "delete" || resources == ["machineoperations"],
                "{r:?} deletes"
            );
        }
        for resource in r.resources.iter().flatten() {
            let writes = r.verbs.iter().any(|v| v == "update" || v == "patch");
            assert!(
                !writes || resource.ends_with("/status"),
                "{r:?} writes {resource}"
            );
        }
    }
}

#[test]
fn admission_policy_keeps_each_node_to_its_own_machine() {
    let docs = documents("admission-policy.yaml");
    assert_eq!(count(&docs, "ValidatingAdmissionPolicy"), 2);
    assert_eq!(count(&docs, "ValidatingAdmissionPolicyBinding"), 2);
    let policy: ValidatingAdmissionPolicy = named(
        &docs,
        "ValidatingAdmissionPolicy",
        "nodeward-node-own-machine",
    );
    let spec = policy.spec.expect("spec");
    assert_eq!(spec.failure_policy.as_deref(), Some("Fail"));
    let rules = spec
        .match_constraints
        .and_then(|m| m.resource_rules)
        .expect("resource rules");
    let resources: Vec<String> = rules
        .iter()
        .flat_map(|r| r.resources.clone().unwrap_or_default())
        .collect();
    assert_eq!(
        resources,
        [
            "machines/status",
            "machineoperations/status",
            "machineoperations"
        ]
    );
    let deletes: Vec<String> = rules
        .iter()
        .filter(|r| r.operations.iter().flatten().any(|o| o == "DELETE"))
        .flat_map(|r| r.resources.clone().unwrap_or_default())
        .collect();
    assert_eq!(
        deletes,
        ["machineoperations"],
        "RBAC's one delete is covered"
    );
    // What the expressions decide, for each user real clusters have: api/tests/admission_policy/.

    let binding: ValidatingAdmissionPolicyBinding = named(
        &docs,
        "ValidatingAdmissionPolicyBinding",
        "nodeward-node-own-machine",
    );
    let binding = binding.spec.expect("spec");
    assert_eq!(
        binding.policy_name.as_deref(),
        policy.metadata.name.as_deref()
    );
    assert_eq!(
        binding.validation_actions.as_deref(),
        Some(&["Deny".to_string()][..])
    );
}

#[test]
fn admission_policy_keeps_bootstrap_tokens_to_agent_bootstrapped() {
    let docs = documents("admission-policy.yaml");
    let policy: ValidatingAdmissionPolicy = named(
        &docs,
        "ValidatingAdmissionPolicy",
        "nodeward-bootstrapper-condition-only",
    );
    let spec = policy.spec.expect("spec");
    assert_eq!(spec.failure_policy.as_deref(), Some("Fail"));
    let rules = spec
        .match_constraints
        .and_then(|m| m.resource_rules)
        .expect("resource rules");
    // All RBAC lets a bootstrap token write (deploy/rbac.yaml, nodeward:bootstrapper).
    assert_eq!(rules.len(), 1, "{rules:?}");
    assert_eq!(
        rules[0].resources.as_deref(),
        Some(&["machines/status".to_string()][..])
    );
    assert_eq!(
        rules[0].operations.as_deref(),
        Some(&["UPDATE".to_string()][..])
    );
    // What the expressions decide, for each user real clusters have: api/tests/admission_policy/.

    let binding: ValidatingAdmissionPolicyBinding = named(
        &docs,
        "ValidatingAdmissionPolicyBinding",
        "nodeward-bootstrapper-condition-only",
    );
    let binding = binding.spec.expect("spec");
    assert_eq!(
        binding.policy_name.as_deref(),
        policy.metadata.name.as_deref()
    );
    assert_eq!(
        binding.validation_actions.as_deref(),
        Some(&["Deny".to_string()][..])
    );
}
