//! The node config: YAML or JSON through the host's own loader
//! (`nodeward::config::parse`: strict serde + `NodeConfig::validate`), and JSON straight into
//! the shared type (what a phase deserializes).
//!
//! Invariants: the loader accepts exactly what deserializes (JSON as JSON, else YAML) and
//! validates; an accepted config re-serializes (YAML and JSON) and re-parses through the loader
//! to an equal config; a refusal names its source; the bootstrap token is never in the config's
//! `Debug` nor in a validation error.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nodeward::config;
use nodeward_node_config::NodeConfig;

fuzz_target!(|data: &[u8]| {
    let Some(text) = nodeward_fuzz::text(data) else {
        return;
    };
    // The loader's rule: a JSON document is read as JSON, anything else (a `{` flow mapping
    // that is not JSON included) as YAML.
    let is_json_object = text.trim_start().starts_with('{');
    let typed: Option<NodeConfig> = match serde_json::from_str::<NodeConfig>(text) {
        Ok(c) if is_json_object => Some(c),
        Err(e) if is_json_object && e.is_data() => None,
        _ => serde_yaml_ng::from_str(text).ok(),
    };
    match (config::parse(text, "fuzz.yaml"), typed) {
        (Ok(c), Some(t)) => {
            assert_eq!(c, t);
            accepted(&c);
        }
        (Ok(_), None) => panic!("the loader accepted a document serde refuses"),
        (Err(e), Some(t)) => {
            assert_eq!(e.source_desc, "fuzz.yaml");
            assert!(t.validate().is_err(), "refused a valid config: {e}");
            assert_no_token(&e.to_string(), &t);
        }
        (Err(e), None) => assert_eq!(e.source_desc, "fuzz.yaml"),
    }
    if let Ok(c) = serde_json::from_str::<NodeConfig>(text) {
        match c.validate() {
            Ok(()) => accepted(&c),
            Err(e) => assert_no_token(&e.to_string(), &c),
        }
    }
});

fn accepted(c: &NodeConfig) {
    c.validate().expect("an accepted config validates");
    let json = serde_json::to_string(c).expect("serializes as JSON");
    let again = config::parse(&json, "again.json").expect("its JSON is accepted");
    assert_eq!(&again, c, "JSON round trip");
    let yaml = serde_yaml_ng::to_string(c).expect("serializes as YAML");
    let again = config::parse(&yaml, "again.yaml").expect("its YAML is accepted");
    assert_eq!(&again, c, "YAML round trip");
    assert_no_token(&format!("{c:?}"), c);
    let token = c.kubelet.auth.bootstrap_token.expose();
    assert_eq!(c.secrets().first().map(String::as_str), Some(token));
}

/// `shown` (an error or a `Debug`) must not hold the token, when the token is well-formed and
/// no other field of the document holds the same text.
fn assert_no_token(shown: &str, c: &NodeConfig) {
    let token = c.kubelet.auth.bootstrap_token.expose();
    let well_formed = token.len() == 23
        && token
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.');
    let unique = serde_json::to_string(c).is_ok_and(|j| j.matches(token).count() == 1);
    if well_formed && unique {
        assert!(!shown.contains(token), "the token leaked into {shown:?}");
    }
}
