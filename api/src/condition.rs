//! The conditions of a `Machine`'s status: their types, their reasons, and how one is set.
//!
//! # Background
//! A condition is the Kubernetes way to report one aspect of an object's state so that tools
//! can wait on it (`kubectl wait --for=condition=NodeUpdated machine/worker-01`). The wire
//! shape is apimachinery's `metav1.Condition` ([`Condition`], from k8s-openapi), so every tool
//! that reads conditions reads these; this module adds the types and reasons nodeward writes.
//!
//! Each [`Reason`] belongs to exactly one condition type and implies its status
//! ([`Reason::condition_type`], [`Reason::status`]), so a writer names only the reason and
//! cannot report `NodeUpdated=True` with reason `UpdateFailed`.
//!
//! # Guarantees
//! - [`set_condition`] changes `lastTransitionTime` only when the status changes, as the
//!   Kubernetes API conventions ask (a new reason or message is not a transition).
//! - Every message written through [`ConditionUpdate`] is capped ([`crate::message`]).
//!
//! # Caveats
//! Conditions read back from the API server are plain strings: a condition type or reason a
//! newer daemon wrote is kept and shown, never refused, so two daemon versions can share a
//! cluster during a rollout.

use crate::message::cap_message;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// The aspects of a `Machine` the daemon reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ConditionType {
    /// The agent is installed on the node and the node has joined the cluster.
    AgentBootstrapped,
    /// The node runs what the spec (at the condition's `observedGeneration`) asks: Kubernetes
    /// version, artifacts, config, labels and taints.
    NodeUpdated,
    /// The phase bundle the spec names (the embedded one when it names none) is the current one.
    BundleApplied,
    /// The spec asks for a change that needs the node repaved (e.g. another `mode`), and the
    /// repave has not started.
    RepavePending,
}

impl ConditionType {
    /// Every condition type, in the order a status lists them.
    pub const ALL: [ConditionType; 4] = [
        ConditionType::AgentBootstrapped,
        ConditionType::NodeUpdated,
        ConditionType::BundleApplied,
        ConditionType::RepavePending,
    ];

    /// The type's name in a condition (`type`).
    pub fn as_str(self) -> &'static str {
        match self {
            ConditionType::AgentBootstrapped => "AgentBootstrapped",
            ConditionType::NodeUpdated => "NodeUpdated",
            ConditionType::BundleApplied => "BundleApplied",
            ConditionType::RepavePending => "RepavePending",
        }
    }
}

/// A condition's status.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ConditionStatus {
    /// The aspect holds.
    True,
    /// The aspect does not hold; the reason says why.
    False,
    /// The daemon is working on it and cannot tell yet.
    Unknown,
}

impl ConditionStatus {
    /// The status's spelling in a condition (`status`).
    pub fn as_str(self) -> &'static str {
        match self {
            ConditionStatus::True => "True",
            ConditionStatus::False => "False",
            ConditionStatus::Unknown => "Unknown",
        }
    }
}

/// Why a condition has its status. Each reason belongs to one condition type and implies its
/// status; `docs/daemon.md` lists them per condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reason {
    /// `AgentBootstrapped=True`: the bootstrap pipeline finished and the node joined.
    Bootstrapped,
    /// `AgentBootstrapped=Unknown`: the bootstrap pipeline is running.
    Bootstrapping,
    /// `AgentBootstrapped=False`: the bootstrap pipeline failed; the message names the phase.
    BootstrapFailed,
    /// `NodeUpdated=True`: the node runs what the spec at `observedGeneration` asks.
    UpToDate,
    /// `NodeUpdated=Unknown`: the upgrade pipeline is applying a changed spec.
    Updating,
    /// `NodeUpdated=False`: the ConfigMap `spec.config.configMapRef` names cannot be read
    /// (missing, forbidden, or without the key).
    ConfigUnreadable,
    /// `NodeUpdated=False`: the config the spec resolves to is invalid; the message names the
    /// field. Nothing on the node changed.
    ConfigInvalid,
    /// `NodeUpdated=False`: the upgrade pipeline failed; the message says which phase and
    /// whether the node was rolled back.
    UpdateFailed,
    /// `BundleApplied=True`: the bundle the spec names is current.
    BundleActive,
    /// `BundleApplied=Unknown`: the bundle is being downloaded, verified and precompiled.
    BundleInstalling,
    /// `BundleApplied=False`: the bundle could not be downloaded, or its sha256 differs.
    BundleFetchFailed,
    /// `BundleApplied=False`: the bundle was refused (untrusted signature, malformed, a
    /// downgrade, or missing phases the node pipelines run).
    BundleRejected,
    /// `BundleApplied=False`: the bundle may do more than the current one, and
    /// `spec.phaseBundle.acceptGrantsDigest` does not name it.
    GrantsWiden,
    /// `BundleApplied=False`: the bundle was installed, but the node failed its health check
    /// with it as many times as the roll-out allows; the previous bundle is current again.
    BundleRolledBack,
    /// `RepavePending=True`: the spec needs the node repaved and the repave has not started.
    RepaveRequired,
    /// `RepavePending=False`: nothing in the spec needs a repave.
    NoRepaveNeeded,
}

impl Reason {
    /// Every reason (`docs/daemon.md` documents each; `api/tests/docs.rs` checks it does).
    pub const ALL: [Reason; 16] = [
        Reason::Bootstrapped,
        Reason::Bootstrapping,
        Reason::BootstrapFailed,
        Reason::UpToDate,
        Reason::Updating,
        Reason::ConfigUnreadable,
        Reason::ConfigInvalid,
        Reason::UpdateFailed,
        Reason::BundleActive,
        Reason::BundleInstalling,
        Reason::BundleFetchFailed,
        Reason::BundleRejected,
        Reason::GrantsWiden,
        Reason::BundleRolledBack,
        Reason::RepaveRequired,
        Reason::NoRepaveNeeded,
    ];

    /// The reason's spelling in a condition (`reason`): CamelCase, as the API conventions ask.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Bootstrapped => "Bootstrapped",
            Reason::Bootstrapping => "Bootstrapping",
            Reason::BootstrapFailed => "BootstrapFailed",
            Reason::UpToDate => "UpToDate",
            Reason::Updating => "Updating",
            Reason::ConfigUnreadable => "ConfigUnreadable",
            Reason::ConfigInvalid => "ConfigInvalid",
            Reason::UpdateFailed => "UpdateFailed",
            Reason::BundleActive => "BundleActive",
            Reason::BundleInstalling => "BundleInstalling",
            Reason::BundleFetchFailed => "BundleFetchFailed",
            Reason::BundleRejected => "BundleRejected",
            Reason::GrantsWiden => "GrantsWiden",
            Reason::BundleRolledBack => "BundleRolledBack",
            Reason::RepaveRequired => "RepaveRequired",
            Reason::NoRepaveNeeded => "NoRepaveNeeded",
        }
    }

    /// The condition this reason reports on.
    pub fn condition_type(self) -> ConditionType {
        match self {
            Reason::Bootstrapped | Reason::Bootstrapping | Reason::BootstrapFailed => {
                ConditionType::AgentBootstrapped
            }
            Reason::UpToDate
            | Reason::Updating
            | Reason::ConfigUnreadable
            | Reason::ConfigInvalid
            | Reason::UpdateFailed => ConditionType::NodeUpdated,
            Reason::BundleActive
            | Reason::BundleInstalling
            | Reason::BundleFetchFailed
            | Reason::BundleRejected
            | Reason::GrantsWiden
            | Reason::BundleRolledBack => ConditionType::BundleApplied,
            Reason::RepaveRequired | Reason::NoRepaveNeeded => ConditionType::RepavePending,
        }
    }

    /// The status this reason gives its condition.
    pub fn status(self) -> ConditionStatus {
        match self {
            Reason::Bootstrapped
            | Reason::UpToDate
            | Reason::BundleActive
            | Reason::RepaveRequired => ConditionStatus::True,
            Reason::Bootstrapping | Reason::Updating | Reason::BundleInstalling => {
                ConditionStatus::Unknown
            }
            Reason::BootstrapFailed
            | Reason::ConfigUnreadable
            | Reason::ConfigInvalid
            | Reason::UpdateFailed
            | Reason::BundleFetchFailed
            | Reason::BundleRejected
            | Reason::GrantsWiden
            | Reason::BundleRolledBack
            | Reason::NoRepaveNeeded => ConditionStatus::False,
        }
    }
}

impl Reason {
    /// The message of a condition for this reason when nothing more specific is known.
    pub fn default_message(self) -> &'static str {
        match self {
            Reason::Bootstrapped => "the bootstrap finished and the node joined",
            Reason::Bootstrapping => "the bootstrap is running",
            Reason::BootstrapFailed => "the bootstrap failed",
            Reason::UpToDate => "the node runs what the spec asks",
            Reason::Updating => "the node is being updated to the spec",
            Reason::ConfigUnreadable => "the node config the spec names cannot be read",
            Reason::ConfigInvalid => "the node config the spec resolves to is invalid",
            Reason::UpdateFailed => "the update failed",
            Reason::BundleActive => "the phase bundle the spec names is current",
            Reason::BundleInstalling => "the phase bundle is being installed",
            Reason::BundleFetchFailed => "the phase bundle could not be downloaded",
            Reason::BundleRejected => "the phase bundle was refused",
            Reason::GrantsWiden => "the phase bundle widens grants without the spec's consent",
            Reason::BundleRolledBack => {
                "the node failed its health check with the phase bundle; the previous one is current again"
            }
            Reason::RepaveRequired => "the spec needs the node repaved",
            Reason::NoRepaveNeeded => "nothing in the spec needs a repave",
        }
    }
}

/// What a condition is to become: a reason (which fixes type and status), a capped message and
/// the generation of the spec it was decided on. Built only by [`ConditionUpdate::new`], so the
/// message is always within [`crate::message::MAX_MESSAGE_BYTES`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConditionUpdate {
    reason: Reason,
    message: String,
    observed_generation: Option<i64>,
}

impl ConditionUpdate {
    /// A condition for `reason`, with `message` capped, decided on the spec at
    /// `observed_generation` (`metadata.generation` of the `Machine` read).
    ///
    /// An empty `message` becomes the reason's own ([`Reason::default_message`]): a condition's
    /// `message` is required, and the v1.20 API server refuses an empty one as `null` (422).
    pub fn new(reason: Reason, message: &str, observed_generation: Option<i64>) -> Self {
        let message = match message.trim() {
            "" => reason.default_message(),
            _ => message,
        };
        ConditionUpdate {
            reason,
            message: cap_message(message),
            observed_generation,
        }
    }

    /// The reason.
    pub fn reason(&self) -> Reason {
        self.reason
    }

    /// The capped message.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The generation the condition was decided on.
    pub fn observed_generation(&self) -> Option<i64> {
        self.observed_generation
    }
}

/// The condition of type `condition_type` in `conditions`, if there is one.
pub fn find_condition(
    conditions: &[Condition],
    condition_type: ConditionType,
) -> Option<&Condition> {
    conditions
        .iter()
        .find(|c| c.type_ == condition_type.as_str())
}

/// Sets the condition `update` describes in `conditions`, adding it if absent. Its
/// `lastTransitionTime` becomes `now` when it is added or its status changes, and is kept
/// otherwise. Returns whether anything changed, so a caller can skip a status write that
/// would change nothing.
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    update: &ConditionUpdate,
    now: &Time,
) -> bool {
    let condition_type = update.reason.condition_type();
    let status = update.reason.status().as_str();
    let reason = update.reason.as_str();
    let Some(existing) = conditions
        .iter_mut()
        .find(|c| c.type_ == condition_type.as_str())
    else {
        conditions.push(Condition {
            type_: condition_type.as_str().to_string(),
            status: status.to_string(),
            reason: reason.to_string(),
            message: update.message.clone(),
            observed_generation: update.observed_generation,
            last_transition_time: now.clone(),
        });
        return true;
    };
    let mut changed = false;
    if existing.status != status {
        existing.status = status.to_string();
        existing.last_transition_time = now.clone();
        changed = true;
    }
    if existing.reason != reason {
        existing.reason = reason.to_string();
        changed = true;
    }
    if existing.message != update.message {
        existing.message.clone_from(&update.message);
        changed = true;
    }
    if existing.observed_generation != update.observed_generation {
        existing.observed_generation = update.observed_generation;
        changed = true;
    }
    changed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{MAX_MESSAGE_BYTES, TRUNCATION_MARKER};
    use k8s_openapi::jiff::Timestamp;

    fn at(seconds: i64) -> Time {
        Time(Timestamp::from_second(seconds).expect("in range"))
    }

    #[test]
    fn adding_a_condition_stamps_the_transition() {
        let mut conditions = Vec::new();
        let update = ConditionUpdate::new(Reason::Updating, "installing 1.34.1", Some(3));
        assert!(set_condition(&mut conditions, &update, &at(100)));
        assert_eq!(conditions.len(), 1);
        let c = &conditions[0];
        assert_eq!(c.type_, "NodeUpdated");
        assert_eq!(c.status, "Unknown");
        assert_eq!(c.reason, "Updating");
        assert_eq!(c.message, "installing 1.34.1");
        assert_eq!(c.observed_generation, Some(3));
        assert_eq!(c.last_transition_time, at(100));
    }

    #[test]
    fn same_status_keeps_the_transition_time() {
        let mut conditions = Vec::new();
        let first = ConditionUpdate::new(Reason::ConfigInvalid, "cluster.apiServer: …", Some(3));
        set_condition(&mut conditions, &first, &at(100));
        // Another reason with the same status is not a transition.
        let second = ConditionUpdate::new(Reason::UpdateFailed, "phase install failed", Some(4));
        assert!(set_condition(&mut conditions, &second, &at(200)));
        let c = &conditions[0];
        assert_eq!(c.status, "False");
        assert_eq!(c.reason, "UpdateFailed");
        assert_eq!(c.message, "phase install failed");
        assert_eq!(c.observed_generation, Some(4));
        assert_eq!(c.last_transition_time, at(100), "status did not change");
    }

    #[test]
    fn status_change_moves_the_transition_time() {
        let mut conditions = Vec::new();
        set_condition(
            &mut conditions,
            &ConditionUpdate::new(Reason::Updating, "", Some(3)),
            &at(100),
        );
        assert!(set_condition(
            &mut conditions,
            &ConditionUpdate::new(Reason::UpToDate, "", Some(3)),
            &at(200),
        ));
        assert_eq!(conditions[0].status, "True");
        assert_eq!(conditions[0].last_transition_time, at(200));
    }

    #[test]
    fn identical_update_changes_nothing() {
        let mut conditions = Vec::new();
        let update = ConditionUpdate::new(Reason::BundleActive, "default v3", Some(1));
        set_condition(&mut conditions, &update, &at(100));
        let before = conditions.clone();
        assert!(!set_condition(&mut conditions, &update, &at(300)));
        assert_eq!(conditions, before);
    }

    #[test]
    fn conditions_of_other_types_are_kept() {
        let mut conditions = vec![Condition {
            type_: "SomethingANewerDaemonWrites".into(),
            status: "True".into(),
            reason: "Whatever".into(),
            message: String::new(),
            observed_generation: None,
            last_transition_time: at(1),
        }];
        set_condition(
            &mut conditions,
            &ConditionUpdate::new(Reason::Bootstrapped, "", Some(1)),
            &at(100),
        );
        set_condition(
            &mut conditions,
            &ConditionUpdate::new(Reason::NoRepaveNeeded, "", Some(1)),
            &at(100),
        );
        assert_eq!(conditions.len(), 3);
        assert_eq!(conditions[0].type_, "SomethingANewerDaemonWrites");
        assert!(find_condition(&conditions, ConditionType::AgentBootstrapped).is_some());
        assert!(find_condition(&conditions, ConditionType::RepavePending).is_some());
        assert!(find_condition(&conditions, ConditionType::NodeUpdated).is_none());
    }

    #[test]
    fn an_empty_message_becomes_the_reasons_own() {
        for reason in Reason::ALL {
            let update = ConditionUpdate::new(reason, " ", None);
            assert_eq!(update.message(), reason.default_message());
            assert!(!update.message().is_empty(), "{reason:?}");
        }
    }

    #[test]
    fn update_message_is_capped() {
        let long = "e".repeat(10 * MAX_MESSAGE_BYTES);
        let update = ConditionUpdate::new(Reason::BundleFetchFailed, &long, None);
        assert!(update.message().len() <= MAX_MESSAGE_BYTES);
        assert!(update.message().ends_with(TRUNCATION_MARKER));
    }

    #[test]
    fn every_condition_type_has_reasons_for_its_outcomes() {
        for t in ConditionType::ALL {
            let statuses: Vec<ConditionStatus> = Reason::ALL
                .iter()
                .filter(|r| r.condition_type() == t)
                .map(|r| r.status())
                .collect();
            assert!(statuses.contains(&ConditionStatus::True), "{t:?}");
            assert!(statuses.contains(&ConditionStatus::False), "{t:?}");
        }
    }

    #[test]
    fn reason_spellings_follow_the_api_conventions() {
        let mut seen = std::collections::HashSet::new();
        for r in Reason::ALL {
            let s = r.as_str();
            assert!(seen.insert(s), "duplicate {s}");
            assert_eq!(s, format!("{r:?}"), "spelling is the variant name");
            assert!(s.starts_with(|c: char| c.is_ascii_uppercase()), "{s}");
            assert!(s.chars().all(|c| c.is_ascii_alphanumeric()), "{s}");
        }
    }
}
