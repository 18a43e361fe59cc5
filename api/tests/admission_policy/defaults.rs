//! deploy/admission-policy.yaml re-applies unchanged: every field the API server defaults is
//! stated, with its default, so what `kubectl apply` (client- or server-side) sends equals
//! what the server stores.
//!
//! Without it, each rule of `matchConstraints.resourceRules` (an atomic list) came back with
//! `scope: "*"`: client-side apply saw the list differ on every run and reported
//! `configured`, and a server-side apply by another field manager conflicted over it.

use crate::cluster::documents;
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use serde_json::{Value as Json, json};

/// Every field Kubernetes defaults in admissionregistration.k8s.io/v1
/// ValidatingAdmissionPolicy and ValidatingAdmissionPolicyBinding: (kind, path, default).
///
/// From kubernetes/kubernetes `pkg/apis/admissionregistration/v1/zz_generated.defaults.go`
/// (which defaulting functions run, and on what) and `defaults.go` (what each sets):
/// - `SetObjectDefaults_ValidatingAdmissionPolicy` runs `SetDefaults_ValidatingAdmissionPolicySpec`
///   (`failurePolicy: Fail`), then, when `matchConstraints` is set, `SetDefaults_MatchResources`
///   (`matchPolicy: Equivalent`, `namespaceSelector: {}`, `objectSelector: {}`) and
///   `SetDefaults_Rule` (`scope: "*"`) on each of its `resourceRules` and
///   `excludeResourceRules`.
/// - `SetObjectDefaults_ValidatingAdmissionPolicyBinding` runs the same `SetDefaults_MatchResources`
///   and `SetDefaults_Rule` on `matchResources` when it is set; nothing else of a binding is
///   defaulted in v1 (`validationActions` is required; `paramRef.parameterNotFoundAction`
///   is required when `paramRef` is set, and defaulted only in v1alpha1).
///
/// `[]` in a path is every item of a list. A default applies only where its parent is set.
pub const DEFAULTED: &[(&str, &str, &str)] = &[
    (
        "ValidatingAdmissionPolicy",
        "spec.failurePolicy",
        r#""Fail""#,
    ),
    (
        "ValidatingAdmissionPolicy",
        "spec.matchConstraints.matchPolicy",
        r#""Equivalent""#,
    ),
    (
        "ValidatingAdmissionPolicy",
        "spec.matchConstraints.namespaceSelector",
        "{}",
    ),
    (
        "ValidatingAdmissionPolicy",
        "spec.matchConstraints.objectSelector",
        "{}",
    ),
    (
        "ValidatingAdmissionPolicy",
        "spec.matchConstraints.resourceRules[].scope",
        r#""*""#,
    ),
    (
        "ValidatingAdmissionPolicy",
        "spec.matchConstraints.excludeResourceRules[].scope",
        r#""*""#,
    ),
    (
        "ValidatingAdmissionPolicyBinding",
        "spec.matchResources.matchPolicy",
        r#""Equivalent""#,
    ),
    (
        "ValidatingAdmissionPolicyBinding",
        "spec.matchResources.namespaceSelector",
        "{}",
    ),
    (
        "ValidatingAdmissionPolicyBinding",
        "spec.matchResources.objectSelector",
        "{}",
    ),
    (
        "ValidatingAdmissionPolicyBinding",
        "spec.matchResources.resourceRules[].scope",
        r#""*""#,
    ),
    (
        "ValidatingAdmissionPolicyBinding",
        "spec.matchResources.excludeResourceRules[].scope",
        r#""*""#,
    ),
];

/// Where `path` is missing from `doc` though its parent is set: the places the server would
/// add a default. Returns the places checked as well.
fn unstated(doc: &Json, path: &str, default: &Json) -> (Vec<String>, Vec<String>) {
    let (mut missing, mut checked) = (Vec::new(), Vec::new());
    let mut at: Vec<(String, &Json)> = vec![(String::new(), doc)];
    let segments: Vec<&str> = path.split('.').collect();
    for (i, segment) in segments.iter().enumerate() {
        let last = i + 1 == segments.len();
        let (name, each) = match segment.strip_suffix("[]") {
            Some(name) => (name, true),
            None => (*segment, false),
        };
        let mut next = Vec::new();
        for (where_, value) in at {
            let here = format!("{where_}.{name}");
            match value.get(name) {
                None if last => missing.push(here),
                None => {}
                Some(found) if last => {
                    checked.push(here.clone());
                    if found != default {
                        missing.push(format!("{here} is {found}, not the default {default}"));
                    }
                }
                Some(Json::Array(items)) if each => next.extend(
                    items
                        .iter()
                        .enumerate()
                        .map(|(j, item)| (format!("{here}[{j}]"), item)),
                ),
                Some(found) => next.push((here, found)),
            }
        }
        at = next;
    }
    (missing, checked)
}

#[test]
fn every_field_the_server_defaults_is_stated_with_its_default() {
    let docs = documents("admission-policy.yaml");
    let mut checked = Vec::new();
    for doc in &docs {
        let kind = doc["kind"].as_str().expect("a kind");
        let name = &doc["metadata"]["name"];
        for (_, path, default) in DEFAULTED.iter().filter(|(k, _, _)| *k == kind) {
            let default: Json = serde_json::from_str(default).expect("a JSON default");
            let (missing, seen) = unstated(doc, path, &default);
            assert!(
                missing.is_empty(),
                "{kind} {name}: the server would default {missing:?}"
            );
            checked.extend(seen.into_iter().map(|s| format!("{kind} {name}{s}")));
        }
    }
    // Not vacuous: each policy's defaulted fields were found, rule by rule.
    for policy in [
        "nodeward-node-own-machine",
        "nodeward-bootstrapper-condition-only",
    ] {
        let of = |field: &str| {
            checked
                .iter()
                .filter(|c| c.starts_with(&format!("ValidatingAdmissionPolicy {policy:?}")))
                .filter(|c| c.ends_with(field))
                .count()
        };
        for field in [
            "failurePolicy",
            "matchPolicy",
            "namespaceSelector",
            "objectSelector",
        ] {
            assert_eq!(of(field), 1, "{policy} {field}: {checked:#?}");
        }
        assert!(of(".scope") >= 1, "{policy}: {checked:#?}");
    }
}

#[test]
fn the_defaults_check_finds_what_is_missing() {
    let doc = json!({"spec": {"matchConstraints": {"resourceRules": [{"scope": "*"}, {}]}}});
    let (missing, checked) = unstated(
        &doc,
        "spec.matchConstraints.resourceRules[].scope",
        &json!("*"),
    );
    assert_eq!(missing, [".spec.matchConstraints.resourceRules[1].scope"]);
    assert_eq!(checked, [".spec.matchConstraints.resourceRules[0].scope"]);
    // No default where the parent is not set.
    let (missing, _) = unstated(
        &doc,
        "spec.matchResources.matchPolicy",
        &json!("Equivalent"),
    );
    assert!(missing.is_empty());
    let (missing, _) = unstated(&json!({"spec": {}}), "spec.failurePolicy", &json!("Fail"));
    assert_eq!(missing, [".spec.failurePolicy"]);
}

#[test]
fn every_stated_field_is_a_v1_field() {
    // k8s-openapi's v1 types keep only the API's fields: a document that comes back the same
    // through them names no field the server would drop or refuse (a misspelt default would
    // be left unstated).
    for doc in documents("admission-policy.yaml") {
        let back = match doc["kind"].as_str() {
            Some("ValidatingAdmissionPolicy") => serde_json::to_value(
                serde_json::from_value::<ValidatingAdmissionPolicy>(doc.clone()).expect("a policy"),
            ),
            Some("ValidatingAdmissionPolicyBinding") => serde_json::to_value(
                serde_json::from_value::<ValidatingAdmissionPolicyBinding>(doc.clone())
                    .expect("a binding"),
            ),
            other => panic!("unexpected kind {other:?}"),
        }
        .expect("serialises");
        assert_eq!(back, doc);
    }
}
