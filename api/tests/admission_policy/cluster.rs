//! A cluster as far as deploy/ decides it: the users real clusters authenticate, RBAC from
//! deploy/rbac.yaml (plus the bindings every cluster has), and the admission policies from
//! deploy/admission-policy.yaml, over the requests the daemon and the bootstrap make.
//!
//! # Assumptions
//! - Authorization is RBAC's: the Node authorizer (`--authorization-mode=Node,RBAC`) has no
//!   opinion on `nodeward.io` resources, and `system:masters` is bound to `cluster-admin`
//!   (the API server's bootstrap policy; it also bypasses authorization). kubeadm's
//!   `kubeadm:cluster-admins` group (admin.conf, since 1.29) is bound to `cluster-admin` too.
//! - A status write reaches admission as the API server's status strategy leaves it: the
//!   stored object with the request's status (spec and metadata kept from the stored one).

use crate::policy::{Admission, Policy, Verdict};
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Subject};
use serde::Deserialize;
use serde_json::{Value as Json, json};
use std::path::Path;
use std::sync::LazyLock;

/// An authenticated user, as the API server's authenticators name it.
#[derive(Clone, Debug)]
pub struct User {
    /// The user name.
    pub name: String,
    /// The groups, `system:authenticated` included.
    pub groups: Vec<String>,
    /// The authenticator's uid of the user, if it sets one.
    pub uid: Option<String>,
    /// The authenticator's extra attributes.
    pub extra: Vec<(String, Vec<String>)>,
}

fn user(name: &str, groups: &[&str]) -> User {
    User {
        name: name.to_string(),
        groups: groups.iter().map(|g| g.to_string()).collect(),
        uid: None,
        extra: Vec::new(),
    }
}

/// A kubeadm node: the kubelet's client certificate, `system:node:<name>` in `system:nodes`.
pub fn kubeadm_node(name: &str) -> User {
    user(
        &format!("system:node:{name}"),
        &["system:nodes", "system:authenticated"],
    )
}

/// An EKS node: aws-iam-authenticator maps the node's IAM role to `system:node:<name>` in
/// both `system:bootstrappers` and `system:nodes`, with the role's session in `extra`.
pub fn eks_node(name: &str) -> User {
    let arn = "arn:aws:sts::111122223333:assumed-role/eks-node-role/i-0123456789abcdef0";
    User {
        uid: Some("aws-iam-authenticator:111122223333:AROAEXAMPLEROLEID".to_string()),
        extra: vec![
            (
                "accessKeyId".to_string(),
                vec!["ASIAEXAMPLEKEYID".to_string()],
            ),
            ("arn".to_string(), vec![arn.to_string()]),
            (
                "canonicalArn".to_string(),
                vec!["arn:aws:iam::111122223333:role/eks-node-role".to_string()],
            ),
            (
                "sessionName".to_string(),
                vec!["i-0123456789abcdef0".to_string()],
            ),
        ],
        ..user(
            &format!("system:node:{name}"),
            &[
                "system:bootstrappers",
                "system:nodes",
                "system:authenticated",
            ],
        )
    }
}

/// A kubeadm bootstrap token `<id>.<secret>`: `system:bootstrap:<id>` in
/// `system:bootstrappers` and the token's extra group.
pub fn bootstrap_token(id: &str) -> User {
    user(
        &format!("system:bootstrap:{id}"),
        &[
            "system:bootstrappers",
            "system:bootstrappers:kubeadm:default-node-token",
            "system:authenticated",
        ],
    )
}

/// A user who is not a node but is in `system:nodes` (a mis-mapped IAM role, an OIDC group
/// claim), so RBAC grants it what nodes may do.
pub fn nodes_group_member(name: &str) -> User {
    User {
        uid: Some("3f1c2b9e-0d4a-4c55-9c1e-6a7d8e9f0a1b".to_string()),
        ..user(name, &["system:nodes", "system:authenticated"])
    }
}

/// kubeadm's admin.conf (since 1.29): `kubernetes-admin` in `kubeadm:cluster-admins`.
pub fn kubeadm_admin() -> User {
    user(
        "kubernetes-admin",
        &["kubeadm:cluster-admins", "system:authenticated"],
    )
}

/// A superuser: `system:masters` (kubeadm's super-admin.conf, most installers' admin).
pub fn super_admin() -> User {
    user(
        "kubernetes-super-admin",
        &["system:masters", "system:authenticated"],
    )
}

/// A call to the API server: an HTTP verb's RBAC verb on a resource, and for writes the
/// admission request it becomes.
pub struct Call {
    /// The RBAC verb (`get`, `update`, `patch`, `delete`, ...).
    pub verb: &'static str,
    /// The resource's plural (`machines`, `machineoperations`, `configmaps`).
    pub resource: &'static str,
    /// The subresource, or "".
    pub subresource: &'static str,
    /// The API group.
    pub group: &'static str,
    /// The object's name, or "" for a collection.
    pub name: String,
    /// The namespace, or "" for a cluster-scoped resource.
    pub namespace: &'static str,
    /// For a write: the stored object, and the object after the write (`null` for DELETE).
    pub write: Option<(Json, Json)>,
}

fn kind_of(resource: &str) -> &'static str {
    match resource {
        "machines" => "Machine",
        "machineoperations" => "MachineOperation",
        other => panic!("no kind for {other}"),
    }
}

fn name_of(object: &Json) -> String {
    object["metadata"]["name"]
        .as_str()
        .expect("a named object")
        .to_string()
}

/// A read of `resource` (`get` of `name`, or `list`/`watch` with an empty name).
pub fn read(verb: &'static str, group: &'static str, resource: &'static str, name: &str) -> Call {
    Call {
        verb,
        resource,
        subresource: "",
        group,
        name: name.to_string(),
        namespace: "",
        write: None,
    }
}

/// A PUT (`update`) or PATCH (`patch`) of `stored`'s status subresource with `status`. The
/// API server keeps spec and metadata from the stored object, so `object` is `stored` with
/// the new status.
pub fn write_status(
    verb: &'static str,
    resource: &'static str,
    stored: &Json,
    status: Json,
) -> Call {
    assert!(verb == "update" || verb == "patch", "{verb}");
    let mut object = stored.clone();
    match status {
        Json::Null => {
            object.as_object_mut().expect("an object").remove("status");
        }
        status => object["status"] = status,
    }
    Call {
        verb,
        resource,
        subresource: "status",
        group: nodeward_api::GROUP,
        name: name_of(stored),
        namespace: "",
        write: Some((stored.clone(), object)),
    }
}

/// A PUT of `stored`'s main resource (its spec) as `object`.
pub fn update(resource: &'static str, stored: &Json, object: Json) -> Call {
    Call {
        verb: "update",
        resource,
        subresource: "",
        group: nodeward_api::GROUP,
        name: name_of(stored),
        namespace: "",
        write: Some((stored.clone(), object)),
    }
}

/// A DELETE of `stored`.
pub fn delete(resource: &'static str, stored: &Json) -> Call {
    Call {
        verb: "delete",
        resource,
        subresource: "",
        group: nodeward_api::GROUP,
        name: name_of(stored),
        namespace: "",
        write: Some((stored.clone(), Json::Null)),
    }
}

impl Call {
    /// The admission request of this write by `who`, shaped as the API server's
    /// `CreateAdmissionRequest` makes it and converted to JSON with the API's `omitempty`
    /// rules: an empty subresource, uid, group list or extra map is left out.
    pub fn admission(&self, who: &User) -> Admission {
        let (old_object, object) = self.write.clone().expect("a write");
        let operation = match self.verb {
            "update" | "patch" => "UPDATE",
            "delete" => "DELETE",
            other => panic!("{other} is not modelled as a write"),
        };
        let kind = json!({"group": self.group, "version": nodeward_api::VERSION,
            "kind": kind_of(self.resource)});
        let resource = json!({"group": self.group, "version": nodeward_api::VERSION,
            "resource": self.resource});
        let mut user_info = json!({"username": who.name});
        if let Some(uid) = &who.uid {
            user_info["uid"] = json!(uid);
        }
        if !who.groups.is_empty() {
            user_info["groups"] = json!(who.groups);
        }
        if !who.extra.is_empty() {
            user_info["extra"] = who
                .extra
                .iter()
                .map(|(k, v)| (k.clone(), json!(v)))
                .collect();
        }
        let options_kind = if operation == "DELETE" {
            "DeleteOptions"
        } else {
            "UpdateOptions"
        };
        let mut request = json!({
            "uid": "6e6f6465-7761-7264-2d61-646d69737369",
            "kind": kind,
            "resource": resource,
            "requestKind": kind,
            "requestResource": resource,
            "name": self.name,
            "operation": operation,
            "userInfo": user_info,
            "dryRun": false,
            "options": {"kind": options_kind, "apiVersion": "meta.k8s.io/v1"},
        });
        if !self.subresource.is_empty() {
            request["subResource"] = json!(self.subresource);
            request["requestSubResource"] = json!(self.subresource);
        }
        Admission {
            request,
            object,
            old_object,
        }
    }
}

/// What the cluster answers.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// Authorized and admitted.
    Allowed,
    /// RBAC grants it nothing of the kind (403 before admission).
    Unauthorized,
    /// A policy refused it: the policy's name and its verdict.
    Refused(String, Verdict),
}

/// RBAC and the admission policies of deploy/.
pub struct Cluster {
    roles: Vec<ClusterRole>,
    bindings: Vec<ClusterRoleBinding>,
    namespaced: Vec<(String, Vec<PolicyRule>, Vec<Subject>)>,
    /// The policies, each joined with its binding.
    pub policies: Vec<Policy>,
}

/// Every document of a multi-document YAML file in deploy/, as JSON.
pub fn documents(file: &str) -> Vec<Json> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy")
        .join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|doc| Json::deserialize(doc).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        .collect()
}

fn of_kind<T: serde::de::DeserializeOwned>(docs: &[Json], kind: &str) -> Vec<T> {
    docs.iter()
        .filter(|d| d["kind"] == kind)
        .map(|d| serde_json::from_value(d.clone()).unwrap_or_else(|e| panic!("{kind}: {e}")))
        .collect()
}

/// The cluster deploy/ makes, read once for every test.
pub fn deployed() -> &'static Cluster {
    static CLUSTER: LazyLock<Cluster> = LazyLock::new(Cluster::from_deploy);
    &CLUSTER
}

impl Cluster {
    /// The cluster deploy/ makes.
    pub fn from_deploy() -> Cluster {
        let rbac = documents("rbac.yaml");
        let mut roles: Vec<ClusterRole> = of_kind(&rbac, "ClusterRole");
        let mut bindings: Vec<ClusterRoleBinding> = of_kind(&rbac, "ClusterRoleBinding");
        roles.push(
            serde_json::from_value(json!({"metadata": {"name": "cluster-admin"},
            "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]}))
            .expect("role"),
        );
        for group in ["system:masters", "kubeadm:cluster-admins"] {
            bindings.push(
                serde_json::from_value(json!({"metadata": {"name": group},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "cluster-admin"},
                "subjects": [{"kind": "Group", "name": group}]}))
                .expect("binding"),
            );
        }
        let namespaced_roles: Vec<k8s_openapi::api::rbac::v1::Role> = of_kind(&rbac, "Role");
        let role_bindings: Vec<k8s_openapi::api::rbac::v1::RoleBinding> =
            of_kind(&rbac, "RoleBinding");
        let namespaced = role_bindings
            .iter()
            .map(|b| {
                let role = namespaced_roles
                    .iter()
                    .find(|r| r.metadata.name == Some(b.role_ref.name.clone()))
                    .expect("the RoleBinding's Role");
                (
                    b.metadata.namespace.clone().expect("a namespace"),
                    role.rules.clone().unwrap_or_default(),
                    b.subjects.clone().unwrap_or_default(),
                )
            })
            .collect();
        let docs = documents("admission-policy.yaml");
        let policies: Vec<ValidatingAdmissionPolicy> = of_kind(&docs, "ValidatingAdmissionPolicy");
        let policy_bindings: Vec<ValidatingAdmissionPolicyBinding> =
            of_kind(&docs, "ValidatingAdmissionPolicyBinding");
        assert_eq!(
            policies.len(),
            policy_bindings.len(),
            "one binding per policy"
        );
        let policies = policies
            .iter()
            .map(|p| {
                let binding = policy_bindings
                    .iter()
                    .find(|b| {
                        b.spec.as_ref().and_then(|s| s.policy_name.as_ref())
                            == p.metadata.name.as_ref()
                    })
                    .unwrap_or_else(|| panic!("no binding for {:?}", p.metadata.name));
                Policy::load(p, binding)
            })
            .collect();
        Cluster {
            roles,
            bindings,
            namespaced,
            policies,
        }
    }

    /// Whether RBAC lets `who` make `call`.
    pub fn authorizes(&self, who: &User, call: &Call) -> bool {
        let resource = if call.subresource.is_empty() {
            call.resource.to_string()
        } else {
            format!("{}/{}", call.resource, call.subresource)
        };
        let grants = |rule: &PolicyRule| {
            let any = |list: &Option<Vec<String>>, v: &str| {
                list.iter().flatten().any(|x| x == "*" || x == v)
            };
            any(&rule.api_groups, call.group)
                && any(&rule.resources, &resource)
                && rule.verbs.iter().any(|v| v == "*" || v == call.verb)
                && rule
                    .resource_names
                    .as_ref()
                    .is_none_or(|names| names.is_empty() || names.contains(&call.name))
        };
        let subject_is = |s: &Subject| match s.kind.as_str() {
            "User" => s.name == who.name,
            "Group" => who.groups.contains(&s.name),
            _ => false,
        };
        let cluster_wide = self.bindings.iter().any(|b| {
            b.subjects.iter().flatten().any(subject_is)
                && self
                    .roles
                    .iter()
                    .filter(|r| r.metadata.name.as_deref() == Some(b.role_ref.name.as_str()))
                    .flat_map(|r| r.rules.iter().flatten())
                    .any(grants)
        });
        let in_namespace = self.namespaced.iter().any(|(ns, rules, subjects)| {
            ns == call.namespace && subjects.iter().any(subject_is) && rules.iter().any(grants)
        });
        cluster_wide || in_namespace
    }

    /// Asserts that the cluster answers `who` making `call` with `expected`.
    #[track_caller]
    pub fn expect(&self, who: &User, call: &Call, expected: Outcome) {
        let what = format!(
            "{} {} {}/{}",
            call.verb, call.resource, call.name, call.subresource
        );
        assert_eq!(self.answer(who, call), expected, "{} {what}", who.name);
    }

    /// Every policy's verdict on `call` by `who`.
    pub fn verdicts(&self, who: &User, call: &Call) -> Vec<(String, Verdict)> {
        let admission = call.admission(who);
        self.policies
            .iter()
            .map(|p| (p.name.clone(), p.decide(&admission)))
            .collect()
    }

    /// What the cluster answers `who` making `call`: RBAC first, then (for a write) every
    /// policy; the first refusal is the answer.
    pub fn answer(&self, who: &User, call: &Call) -> Outcome {
        if !self.authorizes(who, call) {
            return Outcome::Unauthorized;
        }
        if call.write.is_none() {
            return Outcome::Allowed;
        }
        let admission = call.admission(who);
        for policy in &self.policies {
            let verdict = policy.decide(&admission);
            if policy.refuses(&verdict) {
                return Outcome::Refused(policy.name.clone(), verdict);
            }
        }
        Outcome::Allowed
    }
}
