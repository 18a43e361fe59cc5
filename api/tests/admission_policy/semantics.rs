//! The `cel` crate evaluates what the policies write as cel-go (the API server's CEL) does.
//!
//! The policies call only functions of CEL's standard library and of its optional types
//! (`KUBERNETES_SHARED` below): the Kubernetes extension libraries (`url`, `authorizer`,
//! `isSorted`, quantities, ...) are not used, so the crate need not model them. Where a
//! result depends on a choice cel-go made (a missing key is an error, not null; lists compare
//! in order; an absent optional equals another), the table below pins it, with cel-go's value.

use crate::cluster::deployed;
use crate::policy::{Admission, Expression, Inputs, to_cel};
use cel::{Context, Value};
use serde_json::json;
use std::collections::BTreeSet;
use std::sync::Arc;

/// The functions and operators the policies may call: each has the same meaning in cel-go's
/// standard library (and its optional-types library, `object.?field`, on by default in the
/// API server since Kubernetes 1.29) as in the `cel` crate. A policy calling anything else
/// fails `only_shared_functions_are_called` until the function is checked and added here.
const KUBERNETES_SHARED: &[&str] = &[
    // Logic, comparison and the conditional.
    "!_",
    "_&&_",
    "_||_",
    "_==_",
    "_!=_",
    "_?_:_",
    "@not_strictly_false",
    // Arithmetic and indexing (string concatenation, list and map access), membership.
    "_+_",
    "_[_]",
    "@in",
    // Strings and sizes.
    "startsWith",
    "size",
    // Optional types: `a.?b` (the crate's `_?._`), `orValue`.
    "_?._",
    "orValue",
];

#[test]
fn only_shared_functions_are_called() {
    let cluster = deployed();
    let mut called = BTreeSet::new();
    let mut expressions = 0;
    for policy in &cluster.policies {
        for expression in policy.expressions() {
            expressions += 1;
            called.extend(expression.functions());
        }
    }
    assert!(expressions > 10, "{expressions} expressions");
    let unknown: Vec<&String> = called
        .iter()
        .filter(|f| !KUBERNETES_SHARED.contains(&f.as_str()))
        .collect();
    assert!(
        unknown.is_empty(),
        "not checked against cel-go: {unknown:?}"
    );
    // And the policies do use what the table below pins.
    for needed in ["_?._", "orValue", "startsWith", "@in", "size"] {
        assert!(called.contains(needed), "{needed}: {called:?}");
    }
}

/// Evaluates `source` with `m` bound to a small unstructured object.
fn eval(source: &str) -> Result<Value, String> {
    let env = crate::policy::environment();
    let program = env.compile(source).map_err(|e| format!("{e:?}"))?;
    let mut context = Context::with_env(Arc::clone(&env));
    let m = json!({"a": {"b": 1}, "l": ["x", "y"], "n": null, "s": "system:node:w"});
    context.add_variable_from_value("m", to_cel(&m));
    program.execute(&context).map_err(|e| e.to_string())
}

#[test]
fn the_crate_agrees_with_cel_go_where_the_policies_rely_on_it() {
    // (expression, cel-go's result: Some(true) / Some(false), or None for an error)
    let table: &[(&str, Option<bool>)] = &[
        // Selecting a missing field of an unstructured object is an error, not null; has()
        // tests presence.
        ("m.missing == null", None),
        ("has(m.missing)", Some(false)),
        ("has(m.a)", Some(true)),
        ("has(m.a.c)", Some(false)),
        // Optional selection: absent is optional.none(), present is optional.of(value).
        ("m.?missing.orValue(7) == 7", Some(true)),
        ("m.?a.?b.orValue(0) == 1", Some(true)),
        ("m.?a.?missing.orValue([]) == []", Some(true)),
        ("m.?missing == m.?other", Some(true)),
        ("m.?a == m.?a", Some(true)),
        ("m.?a.?b == m.?a.?c", Some(false)),
        ("m.?n.orValue(1) == null", Some(true)),
        // JSON integers are ints.
        ("m.a.b == 1", Some(true)),
        ("m.a['b'] == 1", Some(true)),
        // Lists compare element by element, in order; maps by their entries.
        ("[{'a': 1}] == [{'a': 1}]", Some(true)),
        ("['x', 'y'] == ['y', 'x']", Some(false)),
        ("m.l.filter(x, x != 'x') == ['y']", Some(true)),
        ("[].filter(x, true) == []", Some(true)),
        ("{'a': {'b': 1}} == {'a': {'b': 1}}", Some(true)),
        ("{'a': {'b': 1}} == {'a': {'b': 2}}", Some(false)),
        // Values of different types are unequal, not an error (heterogeneous equality).
        ("m.n == 'x'", Some(false)),
        ("m.a == 'x'", Some(false)),
        ("m.l == m.a", Some(false)),
        // Macros over lists, and over a map's keys.
        ("[].all(x, false)", Some(true)),
        ("{'a': 1, 'b': 2}.all(k, k in ['a', 'b'])", Some(true)),
        ("{'a': 1}.all(k, k == 'b')", Some(false)),
        ("m.n.all(x, true)", None),
        // Membership, strings, sizes, the conditional.
        ("'x' in m.l", Some(true)),
        ("'z' in m.l", Some(false)),
        ("'a' in m", Some(true)),
        ("m.s.startsWith('system:node:')", Some(true)),
        ("'system:node:' + 'w' == m.s", Some(true)),
        ("size(m.l) == 2", Some(true)),
        ("(has(m.l) ? m.l : []) == m.l", Some(true)),
        ("(has(m.missing) ? m.missing : []) == []", Some(true)),
    ];
    for (source, expected) in table {
        let got = eval(source);
        match expected {
            Some(b) => assert_eq!(got, Ok(Value::Bool(*b)), "{source}"),
            None => assert!(got.is_err(), "{source}: {got:?}"),
        }
    }
}

#[test]
fn a_variable_that_fails_fails_whoever_reads_it() {
    // The server evaluates variables lazily; the harness leaves a failed one out of
    // `variables`, so reading it is an error in both.
    let env = crate::policy::environment();
    let admission = Admission {
        request: json!({}),
        object: json!(null),
        old_object: json!(null),
    };
    let compile = |source: &str| Expression::compile(&env, format!("test: {source}"), source);
    let broken = compile("object.status");
    assert!(
        broken
            .evaluate(&Inputs::new(&env, &admission), &Default::default())
            .is_err()
    );
    let reader = compile("variables.broken == 1");
    assert!(
        reader
            .evaluate(&Inputs::new(&env, &admission), &Default::default())
            .is_err()
    );
}
