//! `docs/daemon.md` is the API reference: every field of both resources (outside the inline
//! node config, which the README documents), every enum value, every condition type and every
//! reason appears in it, so a new field or reason cannot ship undocumented.

use nodeward_api::condition::{ConditionType, Reason};
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::Path;

fn reference() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/daemon.md");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every property name and enum value in `schema`, except beneath `config.inline`.
fn names(schema: &Value, at: &str, out: &mut BTreeSet<String>) {
    if at.ends_with(".inline") {
        return;
    }
    for (name, property) in schema["properties"].as_object().into_iter().flatten() {
        out.insert(name.clone());
        names(property, &format!("{at}.{name}"), out);
    }
    for value in schema["enum"].as_array().into_iter().flatten() {
        if let Some(v) = value.as_str() {
            out.insert(v.to_string());
        }
    }
    if schema["additionalProperties"].is_object() {
        names(&schema["additionalProperties"], &format!("{at}.*"), out);
    }
    if schema["items"].is_object() {
        names(&schema["items"], &format!("{at}[]"), out);
    }
}

/// Every identifier inside a backtick span of `doc` (`{name, namespace, key}` gives three).
fn code_words(doc: &str) -> BTreeSet<String> {
    doc.split('`')
        .skip(1)
        .step_by(2)
        .flat_map(|span| span.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_')))
        .filter(|w| !w.is_empty())
        .map(str::to_string)
        .collect()
}

#[test]
fn every_field_and_value_is_documented() {
    let doc = reference();
    let words = code_words(&doc);
    let mut missing = Vec::new();
    for file in nodeward_api::crd::all() {
        let crd = serde_json::to_value(&file.crd).expect("serializes");
        let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
        let mut all = BTreeSet::new();
        for part in ["spec", "status"] {
            names(&schema["properties"][part], part, &mut all);
        }
        // A condition's status is one of Kubernetes' own three words, in the conditions table.
        for name in all.difference(&code_words("`True False Unknown`")) {
            if !words.contains(name) {
                missing.push(format!("{}: {name}", file.file_name));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "not in a code span of docs/daemon.md: {missing:#?}"
    );
}

#[test]
fn every_condition_and_reason_is_documented() {
    let doc = reference();
    for t in ConditionType::ALL {
        assert!(doc.contains(&format!("| `{}` |", t.as_str())), "{t:?}");
    }
    for r in Reason::ALL {
        let status = r.status().as_str();
        assert!(
            doc.contains(&format!("| {status} | `{}` |", r.as_str())),
            "docs/daemon.md has no row `| {status} | `{}` |`",
            r.as_str()
        );
    }
}
