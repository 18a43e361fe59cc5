//! The API server's side of a ValidatingAdmissionPolicy (admissionregistration.k8s.io/v1), over
//! the `cel` crate: which requests a policy and its binding match, and what its `variables`,
//! `matchConditions` and `validations` decide.
//!
//! # Background
//! Kubernetes (k8s.io/apiserver, `admission/plugin/policy/validating`) compiles a policy's
//! variables, match conditions and validations in one composited environment, so match
//! conditions and validations may read `variables.<name>`, and each variable may read the
//! variables before it. A request the policy's `matchConstraints` (and the binding's
//! `matchResources`, if any) match is then decided in this order:
//! 1. If any match condition is false, the policy does not apply.
//! 2. Otherwise, if any match condition failed to evaluate, `failurePolicy` decides.
//! 3. Otherwise every validation is evaluated: a false one is a violation with its message, an
//!    error is `failurePolicy`'s to decide. With `validationActions: [Deny]`, a violation
//!    refuses the request.
//!
//! # Assumptions
//! - Variables are evaluated here once each, in order, before anything reads them; the server
//!   evaluates each lazily on first read. The results are the same: a variable whose
//!   evaluation fails is left out of `variables`, so reading it fails here as it fails there,
//!   and a failure nobody reads is ignored by both.
//! - The policies use no `params`, `authorizer` or `namespaceObject`: [`Policy::load`] refuses
//!   expressions that name a variable this harness does not model, and every function an
//!   expression calls must be one whose semantics the `cel` crate shares with cel-go
//!   (`semantics.rs` checks both), so an unmodelled feature fails the test instead of
//!   evaluating to an error that would look like a refusal.
//! - Resources are cluster-scoped (Machines and MachineOperations), so `namespaceSelector`
//!   has nothing to select; a non-empty `objectSelector` is not modelled and refused at load.

use cel::objects::{Key, Map};
use cel::{Context, Env, Program, Value};
use k8s_openapi::api::admissionregistration::v1::{
    MatchResources, NamedRuleWithOperations, ValidatingAdmissionPolicy,
    ValidatingAdmissionPolicyBinding,
};
use serde_json::Value as Json;
use std::collections::HashMap;
use std::sync::Arc;

/// The variables an expression may read: those the API server declares for a policy without
/// `paramKind`, less `authorizer` and `namespaceObject`, which these policies do not use.
pub const MODELLED_VARIABLES: [&str; 4] = ["object", "oldObject", "request", "variables"];

/// One CEL expression of a policy, compiled.
pub struct Expression {
    /// Where it is: `variables[groups]`, `matchConditions[node-identity]`, `validations[0]`.
    pub at: String,
    program: Program,
}

/// A validation: the expression and the message of its refusal.
pub struct Validation {
    /// The expression, true when the request is valid.
    pub expression: Expression,
    /// The message a refusal carries.
    pub message: String,
}

/// A policy joined with its binding, ready to decide requests.
pub struct Policy {
    /// The policy's `metadata.name`.
    pub name: String,
    env: Arc<Env>,
    fail_closed: bool,
    deny: bool,
    match_constraints: MatchResources,
    binding_match: Option<MatchResources>,
    /// `spec.variables`, in order.
    pub variables: Vec<(String, Expression)>,
    /// `spec.matchConditions`.
    pub match_conditions: Vec<Expression>,
    /// `spec.validations`.
    pub validations: Vec<Validation>,
}

/// What one policy decided about one request.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// The policy's rules or match conditions do not select the request.
    NotMatched,
    /// Every validation holds.
    Admitted,
    /// These validations were false: their messages.
    Violated(Vec<String>),
    /// An expression failed to evaluate (`failurePolicy: Fail` refuses): where, and why.
    Failed(String),
}

/// An admission request as the API server hands it to CEL.
pub struct Admission {
    /// `request`: the AdmissionRequest, as JSON with the API's `omitempty` rules.
    pub request: Json,
    /// `object`: the object as it would be stored (`null` for DELETE).
    pub object: Json,
    /// `oldObject`: the stored object (`null` for CREATE).
    pub old_object: Json,
}

/// An [`Admission`] bound as CEL's `object`, `oldObject` and `request`, once for all of a
/// policy's expressions.
pub struct Inputs {
    context: Context<'static, 'static>,
}

impl Inputs {
    /// `admission` in `env`.
    pub fn new(env: &Arc<Env>, admission: &Admission) -> Inputs {
        let mut context = Context::with_env(Arc::clone(env));
        context.add_variable_from_value("object", to_cel(&admission.object));
        context.add_variable_from_value("oldObject", to_cel(&admission.old_object));
        context.add_variable_from_value("request", to_cel(&admission.request));
        Inputs { context }
    }
}

/// A JSON value as CEL sees an unstructured object: integers are `int`, as the API server's
/// JSON decoding makes them int64.
pub fn to_cel(json: &Json) -> Value {
    match json {
        Json::Null => Value::Null,
        Json::Bool(b) => Value::Bool(*b),
        Json::Number(n) => match n.as_i64() {
            Some(i) => Value::Int(i),
            None => Value::Float(n.as_f64().expect("a JSON number")),
        },
        Json::String(s) => Value::String(Arc::new(s.clone())),
        Json::Array(items) => Value::List(Arc::new(items.iter().map(to_cel).collect())),
        Json::Object(fields) => {
            let map: HashMap<Key, Value> = fields
                .iter()
                .map(|(k, v)| (Key::String(Arc::new(k.clone())), to_cel(v)))
                .collect();
            Value::Map(Map { map: Arc::new(map) })
        }
    }
}

/// The CEL environment of the policies: CEL's standard library with its optional types, the
/// part of the API server's environment these policies use.
pub fn environment() -> Arc<Env> {
    Arc::new(Env::stdlib())
}

/// The names the comprehension macros of `source` bind (`c` in `l.all(c, ...)`): the crate
/// lists them among an expression's variables.
fn macro_bound_names(source: &str) -> Vec<String> {
    let mut names = Vec::new();
    for keyword in [".all(", ".exists(", ".exists_one(", ".filter(", ".map("] {
        for (i, _) in source.match_indices(keyword) {
            let rest = &source[i + keyword.len()..];
            if let Some((name, _)) = rest.split_once(',') {
                names.push(name.trim().to_string());
            }
        }
    }
    names
}

impl Expression {
    pub fn compile(env: &Env, at: String, source: &str) -> Expression {
        let program = env
            .compile(source)
            .unwrap_or_else(|e| panic!("{at}: `{source}` does not compile: {e:?}"));
        let bound = macro_bound_names(source);
        for variable in program.references().variables() {
            assert!(
                MODELLED_VARIABLES.contains(&variable) || bound.iter().any(|b| b == variable),
                "{at}: `{source}` reads `{variable}`, which this harness does not model"
            );
        }
        Expression { at, program }
    }

    /// The functions and operators the expression calls.
    pub fn functions(&self) -> Vec<String> {
        let references = self.program.references();
        references
            .functions()
            .into_iter()
            .map(str::to_string)
            .collect()
    }

    /// Evaluates the expression over `admission` and the variables evaluated so far.
    pub fn evaluate(
        &self,
        inputs: &Inputs,
        variables: &HashMap<Key, Value>,
    ) -> Result<Value, String> {
        let mut context = inputs.context.new_inner_scope();
        context.add_variable_from_value(
            "variables",
            Value::Map(Map {
                map: Arc::new(variables.clone()),
            }),
        );
        self.program
            .execute(&context)
            .map_err(|e| format!("{}: {e}", self.at))
    }
}

impl Policy {
    /// Joins `policy` with `binding` (which must name it) and compiles its expressions.
    pub fn load(
        policy: &ValidatingAdmissionPolicy,
        binding: &ValidatingAdmissionPolicyBinding,
    ) -> Policy {
        let name = policy.metadata.name.clone().expect("a named policy");
        let spec = policy.spec.clone().expect("a policy spec");
        let binding = binding.spec.clone().expect("a binding spec");
        assert_eq!(binding.policy_name.as_deref(), Some(name.as_str()));
        assert!(
            spec.param_kind.is_none() && binding.param_ref.is_none(),
            "{name}: params are not modelled"
        );
        let actions = binding.validation_actions.unwrap_or_default();
        assert!(
            actions
                .iter()
                .all(|a| ["Deny", "Warn", "Audit"].contains(&a.as_str())),
            "{name}: {actions:?}"
        );
        let env = environment();
        let variables = spec
            .variables
            .unwrap_or_default()
            .iter()
            .map(|v| {
                let at = format!("{name}: variables[{}]", v.name);
                (v.name.clone(), Expression::compile(&env, at, &v.expression))
            })
            .collect();
        let match_conditions = spec
            .match_conditions
            .unwrap_or_default()
            .iter()
            .map(|c| {
                let at = format!("{name}: matchConditions[{}]", c.name);
                Expression::compile(&env, at, &c.expression)
            })
            .collect();
        let validations = spec
            .validations
            .unwrap_or_default()
            .iter()
            .enumerate()
            .map(|(i, v)| {
                assert!(
                    v.message_expression.is_none(),
                    "{name}: messageExpression is not modelled"
                );
                Validation {
                    expression: Expression::compile(
                        &env,
                        format!("{name}: validations[{i}]"),
                        &v.expression,
                    ),
                    message: v.message.clone().expect("every validation has a message"),
                }
            })
            .collect();
        let match_constraints = spec.match_constraints.expect("matchConstraints");
        for m in std::iter::once(&match_constraints).chain(binding.match_resources.as_ref()) {
            let selects_objects = m
                .object_selector
                .as_ref()
                .is_some_and(|s| s.match_labels.is_some() || s.match_expressions.is_some());
            assert!(!selects_objects, "{name}: objectSelector is not modelled");
        }
        Policy {
            name: name.clone(),
            env,
            fail_closed: spec.failure_policy.as_deref().unwrap_or("Fail") == "Fail",
            deny: actions.iter().any(|a| a == "Deny"),
            match_constraints,
            binding_match: binding.match_resources,
            variables,
            match_conditions,
            validations,
        }
    }

    /// Every expression of the policy.
    pub fn expressions(&self) -> impl Iterator<Item = &Expression> {
        self.variables
            .iter()
            .map(|(_, e)| e)
            .chain(&self.match_conditions)
            .chain(self.validations.iter().map(|v| &v.expression))
    }

    /// Whether a verdict of this policy refuses the request: a violation under `Deny`, or a
    /// failure under `failurePolicy: Fail`.
    pub fn refuses(&self, verdict: &Verdict) -> bool {
        match verdict {
            Verdict::Violated(_) => self.deny,
            Verdict::Failed(_) => self.fail_closed,
            Verdict::NotMatched | Verdict::Admitted => false,
        }
    }

    /// Decides `admission` as the API server does (see the module doc).
    pub fn decide(&self, admission: &Admission) -> Verdict {
        let matched = matches(&self.match_constraints, &admission.request)
            && self
                .binding_match
                .as_ref()
                .is_none_or(|m| matches(m, &admission.request));
        if !matched {
            return Verdict::NotMatched;
        }
        let inputs = Inputs::new(&self.env, admission);
        let mut variables = HashMap::new();
        for (name, expression) in &self.variables {
            if let Ok(value) = expression.evaluate(&inputs, &variables) {
                variables.insert(Key::String(Arc::new(name.clone())), value);
            }
        }
        let mut failure = None;
        for condition in &self.match_conditions {
            match condition.evaluate(&inputs, &variables) {
                Ok(Value::Bool(true)) => {}
                Ok(Value::Bool(false)) => return Verdict::NotMatched,
                Ok(other) => failure = Some(format!("{}: not a bool: {other:?}", condition.at)),
                Err(e) => failure = Some(e),
            }
        }
        if let Some(e) = failure {
            return Verdict::Failed(e);
        }
        let mut violated = Vec::new();
        for validation in &self.validations {
            match validation.expression.evaluate(&inputs, &variables) {
                Ok(Value::Bool(true)) => {}
                Ok(Value::Bool(false)) => violated.push(validation.message.clone()),
                Ok(other) => {
                    let at = &validation.expression.at;
                    return Verdict::Failed(format!("{at}: not a bool: {other:?}"));
                }
                Err(e) => return Verdict::Failed(e),
            }
        }
        if violated.is_empty() {
            Verdict::Admitted
        } else {
            Verdict::Violated(violated)
        }
    }
}

/// Whether `rules` select `request` (its resource, subresource and operation), as the API
/// server's rule matcher does for a cluster-scoped resource: exclusions win over inclusions.
pub fn matches(rules: &MatchResources, request: &Json) -> bool {
    let hit = |list: &Option<Vec<NamedRuleWithOperations>>| {
        list.iter()
            .flatten()
            .any(|rule| rule_matches(rule, request))
    };
    assert!(
        ["Equivalent", "Exact"].contains(&rules.match_policy.as_deref().unwrap_or("Equivalent")),
        "{rules:?}"
    );
    hit(&rules.resource_rules) && !hit(&rules.exclude_resource_rules)
}

fn rule_matches(rule: &NamedRuleWithOperations, request: &Json) -> bool {
    let field = |path: &[&str]| {
        path.iter()
            .fold(request, |v, k| &v[*k])
            .as_str()
            .unwrap_or("")
            .to_string()
    };
    let (group, version) = (
        field(&["resource", "group"]),
        field(&["resource", "version"]),
    );
    let (resource, subresource) = (field(&["resource", "resource"]), field(&["subResource"]));
    let operation = field(&["operation"]);
    let names = |list: &Option<Vec<String>>, value: &str| {
        list.iter().flatten().any(|x| x == "*" || x == value)
    };
    // As the rule matcher (admission/plugin/webhook/predicates/rules) splits `res/sub`: `*`
    // alone is every resource without a subresource, `x/*` every subresource of x and x.
    let resource_matches = rule.resources.iter().flatten().any(|r| {
        let (r_res, r_sub) = r.split_once('/').unwrap_or((r, ""));
        (r_res == "*" || r_res == resource) && (r_sub == "*" || r_sub == subresource)
    });
    let name_matches = rule
        .resource_names
        .as_ref()
        .is_none_or(|n| n.is_empty() || n.iter().any(|x| *x == field(&["name"])));
    let scope = rule.scope.as_deref().unwrap_or("*");
    names(&rule.api_groups, &group)
        && names(&rule.api_versions, &version)
        && names(&rule.operations, &operation)
        && resource_matches
        && name_matches
        && (scope == "*" || scope == "Cluster")
}
