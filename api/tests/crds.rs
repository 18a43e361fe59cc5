//! The CustomResourceDefinitions in `deploy/crds/`: the checked-in files are what the types
//! generate, their schemas are structural (what `apiextensions.k8s.io/v1` requires, within what
//! the v1.20 CI API server understands), and they enforce what the types promise: the objects
//! in `deploy/examples/` pass, and malformed ones are refused.
//!
//! The schemas are checked here with a JSON Schema validator, which reads the OpenAPI subset a
//! CRD uses the same way for the keywords involved (`type`, `enum`, `pattern`, `maxLength`,
//! `minimum`, `required`, `oneOf`); the real API server's acceptance is tested with the daemon.

use nodeward_api::condition::ConditionUpdate;
use nodeward_api::crd::{self, CrdFile};
use nodeward_api::message::MAX_MESSAGE_BYTES;
use nodeward_api::{Machine, MachineOperation, MachineStatus, Reason, Time};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};

const REGENERATE: &str =
    "run `cargo run -p nodeward-api --example crds` to regenerate deploy/crds/";

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

fn crd_named(name: &str) -> CrdFile {
    crd::all()
        .into_iter()
        .find(|f| f.file_name == format!("{name}.yaml"))
        .unwrap_or_else(|| panic!("no CRD {name}"))
}

/// The `openAPIV3Schema` of the one version of a CRD, as JSON.
fn schema_of(name: &str) -> Value {
    let crd = serde_json::to_value(crd_named(name).crd).expect("CRD serializes");
    let versions = crd["spec"]["versions"].as_array().expect("versions");
    assert_eq!(versions.len(), 1, "{name}: one version");
    versions[0]["schema"]["openAPIV3Schema"].clone()
}

fn validator(name: &str) -> jsonschema::Validator {
    jsonschema::validator_for(&schema_of(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn errors(validator: &jsonschema::Validator, object: &Value) -> Vec<String> {
    validator
        .iter_errors(object)
        .map(|e| format!("{e} at {}", e.instance_path()))
        .collect()
}

fn example(file: &str) -> Value {
    let path = deploy_dir().join("examples").join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn checked_in_crds_are_the_generated_ones() {
    let dir = deploy_dir().join("crds");
    let generated = crd::all();
    assert_eq!(generated.len(), 2, "Machine and MachineOperation");
    for file in &generated {
        let path = dir.join(&file.file_name);
        let checked_in = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e}; {REGENERATE}", path.display()));
        let expected = file.render().expect("renders");
        assert!(
            checked_in == expected,
            "{} differs from what the types in api/src generate; {REGENERATE}",
            path.display()
        );
    }
    // Nothing else lives there: a CRD for a type that no longer exists would still be applied.
    for entry in std::fs::read_dir(&dir).expect("deploy/crds") {
        let name = entry.expect("entry").file_name();
        let name = name.to_string_lossy();
        assert!(
            generated.iter().any(|f| f.file_name == name),
            "deploy/crds/{name} is not generated from the types; remove it or {REGENERATE}"
        );
    }
}

#[test]
fn crds_have_the_expected_names_scope_and_subresources() {
    for (name, kind, short) in [
        ("machines.nodeward.io", "Machine", "nwm"),
        ("machineoperations.nodeward.io", "MachineOperation", "nwop"),
    ] {
        let crd = serde_json::to_value(crd_named(name).crd).expect("serializes");
        assert_eq!(crd["apiVersion"], "apiextensions.k8s.io/v1");
        assert_eq!(crd["spec"]["group"], "nodeward.io");
        assert_eq!(crd["spec"]["scope"], "Cluster", "{name}");
        assert_eq!(crd["spec"]["names"]["kind"], kind);
        assert_eq!(crd["spec"]["names"]["shortNames"], json!([short]));
        let version = &crd["spec"]["versions"][0];
        assert_eq!(version["name"], "v1alpha1");
        assert_eq!(version["served"], true);
        assert_eq!(version["storage"], true);
        assert_eq!(version["subresources"]["status"], json!({}), "{name}");
    }
    let machine = serde_json::to_value(crd_named("machines.nodeward.io").crd).expect("serializes");
    let columns: Vec<&str> = machine["spec"]["versions"][0]["additionalPrinterColumns"]
        .as_array()
        .expect("columns")
        .iter()
        .map(|c| c["name"].as_str().expect("name"))
        .collect();
    for wanted in ["Phase", "Bundle", "Age"] {
        assert!(columns.contains(&wanted), "{columns:?}");
    }
}

/// The rules of a structural schema (Kubernetes' "Specifying a structural schema") that a
/// generator can break, plus what the v1.20 API server lacks (CEL).
fn structural_violations(schema: &Value, at: &str, out: &mut Vec<String>) {
    let Some(obj) = schema.as_object() else {
        out.push(format!("{at}: a schema must be an object, not {schema}"));
        return;
    };
    for banned in [
        "$ref",
        "$defs",
        "definitions",
        "$schema",
        "x-kubernetes-validations",
    ] {
        if obj.contains_key(banned) {
            out.push(format!("{at}: has {banned}"));
        }
    }
    if obj.get("uniqueItems") == Some(&Value::Bool(true)) {
        out.push(format!("{at}: uniqueItems: true"));
    }
    let free = obj.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true))
        || obj.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true));
    if !obj.contains_key("type") && !free {
        out.push(format!("{at}: no type"));
    }
    if obj.contains_key("properties") && obj.contains_key("additionalProperties") {
        out.push(format!("{at}: both properties and additionalProperties"));
    }
    if let Some(properties) = obj.get("properties") {
        for (name, property) in properties.as_object().into_iter().flatten() {
            structural_violations(property, &format!("{at}.{name}"), out);
        }
    }
    match obj.get("additionalProperties") {
        Some(Value::Object(_)) => {
            structural_violations(&obj["additionalProperties"], &format!("{at}.*"), out)
        }
        Some(other) => out.push(format!("{at}: additionalProperties: {other}")),
        None => {}
    }
    if let Some(items) = obj.get("items") {
        structural_violations(items, &format!("{at}[]"), out);
    }
    for junctor in ["oneOf", "anyOf", "allOf", "not"] {
        let Some(branches) = obj.get(junctor) else {
            continue;
        };
        let branches = match branches {
            Value::Array(b) => b.clone(),
            other => vec![other.clone()],
        };
        for (i, branch) in branches.iter().enumerate() {
            for structural in [
                "type",
                "properties",
                "additionalProperties",
                "items",
                "description",
                "default",
                "nullable",
            ] {
                if branch.get(structural).is_some() {
                    out.push(format!(
                        "{at}.{junctor}[{i}]: sets {structural} (value validation only)"
                    ));
                }
            }
        }
    }
    if obj.get("x-kubernetes-list-type") == Some(&json!("map")) {
        let required = obj["items"]["required"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for key in obj["x-kubernetes-list-map-keys"]
            .as_array()
            .into_iter()
            .flatten()
        {
            if !required.contains(key) {
                out.push(format!("{at}: list-map key {key} is not required in items"));
            }
        }
    }
}

#[test]
fn schemas_are_structural() {
    for file in crd::all() {
        let name = file.file_name.trim_end_matches(".yaml").to_string();
        let schema = schema_of(&name);
        let mut violations = Vec::new();
        structural_violations(&schema, &name, &mut violations);
        assert!(violations.is_empty(), "{violations:#?}");
        assert_eq!(schema["type"], "object");
        assert!(schema["properties"]["spec"].is_object(), "{name}");
        assert!(schema["properties"]["status"].is_object(), "{name}");
    }
}

#[test]
fn the_checker_catches_what_is_not_structural() {
    let mut violations = Vec::new();
    structural_violations(
        &json!({
            "type": "object",
            "properties": {
                "a": {"$ref": "#/definitions/A"},
                "b": {"type": "object", "properties": {"c": {"type": "string"}}, "additionalProperties": false},
                "d": {"type": "string", "oneOf": [{"type": "string"}]},
            },
        }),
        "t",
        &mut violations,
    );
    assert_eq!(violations.len(), 5, "{violations:#?}");
}

#[test]
fn machine_schema_sets_no_defaults() {
    // Defaults would be written into stored objects, freezing today's agent defaults.
    let text = serde_json::to_string(&schema_of("machines.nodeward.io")).expect("json");
    assert!(
        !text.contains("\"default\""),
        "the Machine schema has a default"
    );
}

#[test]
fn examples_pass_and_deserialize() {
    let machines = validator("machines.nodeward.io");
    for file in ["machine.yaml", "machine-inline-config.yaml"] {
        let object = example(file);
        assert_eq!(errors(&machines, &object), Vec::<String>::new(), "{file}");
        let machine: Machine =
            serde_json::from_value(object).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert_eq!(machine.spec.kubernetes_version, "1.34.1");
    }
    let operations = validator("machineoperations.nodeward.io");
    let object = example("operation-reboot.yaml");
    assert_eq!(errors(&operations, &object), Vec::<String>::new());
    let op: MachineOperation = serde_json::from_value(object).expect("operation");
    assert_eq!(op.spec.machine_ref.name, "worker-01");
}

/// `example` with the value at `pointer` replaced (or removed, for `None`).
fn with(mut object: Value, pointer: &str, value: Option<Value>) -> Value {
    let (parent, key) = pointer.rsplit_once('/').expect("pointer");
    let parent = object
        .pointer_mut(parent)
        .unwrap_or_else(|| panic!("no {parent}"))
        .as_object_mut()
        .expect("object");
    match value {
        Some(v) => parent.insert(key.to_string(), v),
        None => parent.remove(key),
    };
    object
}

#[test]
fn malformed_machines_are_refused() {
    let machines = validator("machines.nodeward.io");
    let base = example("machine.yaml");
    let inline = example("machine-inline-config.yaml");
    let cases = [
        (
            "uppercase sha256",
            with(
                base.clone(),
                "/spec/phaseBundle/sha256",
                Some(json!("A".repeat(64))),
            ),
        ),
        (
            "short sha256",
            with(
                base.clone(),
                "/spec/artifacts/kubelet/sha256",
                Some(json!("abc")),
            ),
        ),
        (
            "both bundle sources",
            with(
                base.clone(),
                "/spec/phaseBundle/ociReference",
                Some(json!("registry.example/b:7")),
            ),
        ),
        (
            "no bundle source",
            with(base.clone(), "/spec/phaseBundle/url", None),
        ),
        (
            "ftp bundle",
            with(
                base.clone(),
                "/spec/phaseBundle/url",
                Some(json!("ftp://x/b.tar")),
            ),
        ),
        (
            "unknown mode",
            with(base.clone(), "/spec/mode", Some(json!("docker"))),
        ),
        (
            "bad version",
            with(
                base.clone(),
                "/spec/kubernetesVersion",
                Some(json!("latest")),
            ),
        ),
        (
            "no version",
            with(base.clone(), "/spec/kubernetesVersion", None),
        ),
        (
            "bad taint effect",
            with(base.clone(), "/spec/taints/0/effect", Some(json!("NoWay"))),
        ),
        (
            "empty configmap name",
            with(
                base.clone(),
                "/spec/config/configMapRef/name",
                Some(json!("")),
            ),
        ),
        (
            "both config sources",
            with(
                base.clone(),
                "/spec/config/inline",
                Some(inline["spec"]["config"]["inline"].clone()),
            ),
        ),
        (
            "a real bootstrap token inline",
            with(
                inline.clone(),
                "/spec/config/inline/kubelet/auth/bootstrapToken",
                Some(json!("abcdef.0123456789abcdef")),
            ),
        ),
        (
            "another kind inline",
            with(
                inline.clone(),
                "/spec/config/inline/kind",
                Some(json!("JoinConfiguration")),
            ),
        ),
        (
            "bad status phase",
            with(base.clone(), "/status", Some(json!({"phase": "Sleeping"}))),
        ),
        (
            "long condition message",
            with(
                base.clone(),
                "/status",
                Some(json!({"conditions": [{
                    "type": "NodeUpdated", "status": "False", "reason": "UpdateFailed",
                    "message": "x".repeat(MAX_MESSAGE_BYTES + 1),
                    "lastTransitionTime": "2026-12-01T00:00:00Z",
                }]})),
            ),
        ),
        (
            "condition status not True/False/Unknown",
            with(
                base.clone(),
                "/status",
                Some(json!({"conditions": [{
                    "type": "NodeUpdated", "status": "Maybe", "reason": "Updating",
                    "message": "", "lastTransitionTime": "2026-12-01T00:00:00Z",
                }]})),
            ),
        ),
        (
            "negative audit seq",
            with(
                base.clone(),
                "/status",
                Some(json!({"auditHead": {"seq": -1, "sha256": "a".repeat(64)}})),
            ),
        ),
    ];
    for (what, object) in cases {
        assert!(
            !errors(&machines, &object).is_empty(),
            "{what}: accepted\n{object:#}"
        );
    }
}

#[test]
fn malformed_operations_are_refused() {
    let operations = validator("machineoperations.nodeward.io");
    let base = example("operation-reboot.yaml");
    let cases = [
        (
            "unknown kind",
            with(base.clone(), "/spec/kind", Some(json!("NodeExplode"))),
        ),
        (
            "negative ttl",
            with(
                base.clone(),
                "/spec/ttlSecondsAfterFinished",
                Some(json!(-1)),
            ),
        ),
        ("no machine", with(base.clone(), "/spec/machineRef", None)),
        (
            "empty machine name",
            with(base.clone(), "/spec/machineRef/name", Some(json!(""))),
        ),
        (
            "bad phase",
            with(base.clone(), "/status", Some(json!({"phase": "Done"}))),
        ),
        (
            "long message",
            with(
                base.clone(),
                "/status",
                Some(json!({"message": "m".repeat(MAX_MESSAGE_BYTES + 1)})),
            ),
        ),
    ];
    for (what, object) in cases {
        assert!(
            !errors(&operations, &object).is_empty(),
            "{what}: accepted\n{object:#}"
        );
    }
}

#[test]
fn statuses_the_helpers_write_pass_the_schema() {
    let machines = validator("machines.nodeward.io");
    let mut machine: Machine = serde_json::from_value(example("machine.yaml")).expect("machine");
    let mut status = MachineStatus::default();
    let now = Time(k8s_openapi::jiff::Timestamp::from_second(1_700_000_000).expect("time"));
    // A message far over the cap, of multi-byte characters: the cap keeps it within maxLength.
    let long = "é".repeat(4 * MAX_MESSAGE_BYTES);
    for reason in Reason::ALL {
        status.set_condition(&ConditionUpdate::new(reason, &long, Some(1)), &now);
    }
    machine.status = Some(status);
    let object = serde_json::to_value(&machine).expect("serializes");
    assert_eq!(errors(&machines, &object), Vec::<String>::new());
    assert_eq!(
        object["status"]["conditions"].as_array().map(Vec::len),
        Some(4)
    );
}
