//! What the daemon reports in its Machine's status: the four conditions and the phase, computed
//! from what the daemon found on the node and decided in one reconcile pass.
//!
//! # Background
//! `docs/daemon.md` fixes each condition's reasons, and each reason fixes its condition's type
//! and status ([`Reason`]). This module turns the outcome of a pass ([`Outcome`]) into exactly
//! one [`ConditionUpdate`] per condition type and a [`MachinePhase`], and lays them over the
//! status read from the API server ([`apply`]) so that `lastTransitionTime` moves only on a
//! status change and a write that would change nothing is skipped.
//!
//! # Guarantees
//! - [`conditions`] returns the four condition types once each, in [`ConditionType::ALL`](nodeward_api::ConditionType::ALL)'s
//!   order, every message capped (through [`ConditionUpdate::new`]).
//! - The phase is `Failed` whenever a condition is `False` for a failure (`BootstrapFailed`,
//!   `ConfigUnreadable`, `ConfigInvalid`, `UpdateFailed`, or any `BundleApplied=False`), so
//!   `kubectl get machines` never shows `Ready` over a failure.
//! - Conditions of types this daemon does not know (a newer daemon's) are kept.
//!
//! # Caveats
//! The phase `Repaving` is reported only while a repave runs; a spec that needs one and has not
//! started it shows `RepavePending=True` with the phase of everything else.

use nodeward_api::machine::{ActiveBundle, AuditHead};
use nodeward_api::{ConditionUpdate, MachinePhase, MachineStatus, Reason, Time};

/// Where the node's bootstrap is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Bootstrap {
    /// Finished; the node joined.
    Done,
    /// Running (or cut short and not yet resumed), at this checkpoint.
    Running {
        /// The checkpoint the install record names.
        checkpoint: String,
    },
    /// Failed; the message names the phase.
    Failed(String),
}

/// Whether the node runs what the spec asks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Update {
    /// It does.
    UpToDate,
    /// The upgrade pipeline is applying a changed spec.
    Updating(String),
    /// The ConfigMap the spec names cannot be read.
    ConfigUnreadable(String),
    /// The config the spec resolves to is invalid; nothing changed.
    ConfigInvalid(String),
    /// The upgrade pipeline failed.
    Failed(String),
}

/// Whether the phase bundle the spec names is the current one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Bundle {
    /// It is, and this is it.
    Active(ActiveBundle),
    /// It is being downloaded, verified and precompiled.
    Installing(String),
    /// It could not be downloaded, or its sha256 differs.
    FetchFailed(String),
    /// It was refused.
    Rejected(String),
    /// It would widen grants without the spec's consent.
    GrantsWiden(String),
    /// It failed the node's health check as often as the roll-out allows; the previous one is
    /// current again.
    RolledBack(String),
}

/// What one reconcile pass found and did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// The Machine's `metadata.generation` the pass acted on.
    pub generation: Option<i64>,
    /// The bootstrap.
    pub bootstrap: Bootstrap,
    /// The node against the spec.
    pub update: Update,
    /// The phase bundle against the spec.
    pub bundle: Bundle,
    /// The bundle the node's phases run now, when [`Self::bundle`] is not `Active` (a
    /// roll-out that failed or runs leaves the previous one current): `status.activeBundle`.
    pub active_bundle: Option<ActiveBundle>,
    /// Why the spec needs a repave, when it does (e.g. another `mode`).
    pub repave: Option<String>,
    /// Why the spec's phase bundle should be rolled out now, when it should
    /// ([`crate::daemon::rollout::judge`]).
    pub roll_out: Option<String>,
    /// A repave is running.
    pub repaving: bool,
    /// The node's audit trail head (`docs/audit.md`), when there is one: copied into the
    /// status, so an auditor can tell later whether the node's log was cut or rewritten.
    pub audit_head: Option<AuditHead>,
}

/// One update per condition type, in [`ConditionType::ALL`](nodeward_api::ConditionType::ALL)'s order.
pub fn conditions(outcome: &Outcome) -> [ConditionUpdate; 4] {
    let g = outcome.generation;
    let bootstrap = match &outcome.bootstrap {
        Bootstrap::Done => ConditionUpdate::new(Reason::Bootstrapped, "", g),
        Bootstrap::Running { checkpoint } => ConditionUpdate::new(
            Reason::Bootstrapping,
            &format!("the bootstrap is at its checkpoint {checkpoint}"),
            g,
        ),
        Bootstrap::Failed(m) => ConditionUpdate::new(Reason::BootstrapFailed, m, g),
    };
    let update = match &outcome.update {
        Update::UpToDate => ConditionUpdate::new(Reason::UpToDate, "", g),
        Update::Updating(m) => ConditionUpdate::new(Reason::Updating, m, g),
        Update::ConfigUnreadable(m) => ConditionUpdate::new(Reason::ConfigUnreadable, m, g),
        Update::ConfigInvalid(m) => ConditionUpdate::new(Reason::ConfigInvalid, m, g),
        Update::Failed(m) => ConditionUpdate::new(Reason::UpdateFailed, m, g),
    };
    let bundle = match &outcome.bundle {
        Bundle::Active(b) => ConditionUpdate::new(
            Reason::BundleActive,
            &format!("{} v{} (sha256 {})", b.name, b.version, b.digest),
            g,
        ),
        Bundle::Installing(m) => ConditionUpdate::new(Reason::BundleInstalling, m, g),
        Bundle::FetchFailed(m) => ConditionUpdate::new(Reason::BundleFetchFailed, m, g),
        Bundle::Rejected(m) => ConditionUpdate::new(Reason::BundleRejected, m, g),
        Bundle::GrantsWiden(m) => ConditionUpdate::new(Reason::GrantsWiden, m, g),
        Bundle::RolledBack(m) => ConditionUpdate::new(Reason::BundleRolledBack, m, g),
    };
    let repave = match &outcome.repave {
        Some(why) => ConditionUpdate::new(Reason::RepaveRequired, why, g),
        None => ConditionUpdate::new(Reason::NoRepaveNeeded, "", g),
    };
    [bootstrap, update, bundle, repave]
}

/// The phase `outcome` puts the Machine in; see the module's guarantees.
pub fn phase(outcome: &Outcome) -> MachinePhase {
    let failed = matches!(outcome.bootstrap, Bootstrap::Failed(_))
        || matches!(
            outcome.update,
            Update::ConfigUnreadable(_) | Update::ConfigInvalid(_) | Update::Failed(_)
        )
        || matches!(
            outcome.bundle,
            Bundle::FetchFailed(_)
                | Bundle::Rejected(_)
                | Bundle::GrantsWiden(_)
                | Bundle::RolledBack(_)
        );
    if failed {
        MachinePhase::Failed
    } else if matches!(outcome.bootstrap, Bootstrap::Running { .. }) {
        MachinePhase::Bootstrapping
    } else if outcome.repaving {
        MachinePhase::Repaving
    } else if matches!(outcome.update, Update::Updating(_))
        || matches!(outcome.bundle, Bundle::Installing(_))
    {
        MachinePhase::Updating
    } else {
        MachinePhase::Ready
    }
}

/// Lays `outcome` over `status` at `now`: the conditions, the phase, `observedGeneration` and
/// the active bundle. Returns whether anything changed (no write needed otherwise).
pub fn apply(status: &mut MachineStatus, outcome: &Outcome, now: &Time) -> bool {
    let mut changed = false;
    for update in conditions(outcome) {
        changed |= status.set_condition(&update, now);
    }
    let phase = Some(phase(outcome));
    if status.phase != phase {
        status.phase = phase;
        changed = true;
    }
    if status.observed_generation != outcome.generation {
        status.observed_generation = outcome.generation;
        changed = true;
    }
    let active = match &outcome.bundle {
        Bundle::Active(b) => Some(b),
        _ => outcome.active_bundle.as_ref(),
    };
    if let Some(b) = active
        && status.active_bundle.as_ref() != Some(b)
    {
        status.active_bundle = Some(b.clone());
        changed = true;
    }
    if outcome.audit_head.is_some() && status.audit_head != outcome.audit_head {
        status.audit_head.clone_from(&outcome.audit_head);
        changed = true;
    }
    changed
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodeward_api::condition::find_condition;
    use nodeward_api::message::MAX_MESSAGE_BYTES;
    use nodeward_api::{Condition, ConditionType};

    fn at(rfc3339: &str) -> Time {
        serde_json::from_value(serde_json::Value::String(rfc3339.into())).expect("a time")
    }

    fn bundle() -> ActiveBundle {
        ActiveBundle {
            name: "default".into(),
            version: 3,
            digest: "a".repeat(64),
        }
    }

    fn ready() -> Outcome {
        Outcome {
            generation: Some(2),
            bootstrap: Bootstrap::Done,
            update: Update::UpToDate,
            bundle: Bundle::Active(bundle()),
            repave: None,
            roll_out: None,
            repaving: false,
            active_bundle: None,
            audit_head: None,
        }
    }

    /// (type, status, reason) of each condition, in order.
    fn triples(conditions: &[Condition]) -> Vec<(String, String, String)> {
        conditions
            .iter()
            .map(|c| (c.type_.clone(), c.status.clone(), c.reason.clone()))
            .collect()
    }

    fn t(ty: &str, status: &str, reason: &str) -> (String, String, String) {
        (ty.into(), status.into(), reason.into())
    }

    #[test]
    fn a_ready_node_has_exactly_these_conditions() {
        let mut status = MachineStatus::default();
        let now = at("2026-12-01T10:00:00Z");
        assert!(apply(&mut status, &ready(), &now));
        assert_eq!(
            triples(&status.conditions),
            [
                t("AgentBootstrapped", "True", "Bootstrapped"),
                t("NodeUpdated", "True", "UpToDate"),
                t("BundleApplied", "True", "BundleActive"),
                t("RepavePending", "False", "NoRepaveNeeded"),
            ]
        );
        for c in &status.conditions {
            assert_eq!(c.observed_generation, Some(2), "{}", c.type_);
            assert_eq!(c.last_transition_time, now, "{}", c.type_);
        }
        assert_eq!(status.phase, Some(MachinePhase::Ready));
        assert_eq!(status.observed_generation, Some(2));
        assert_eq!(status.active_bundle, Some(bundle()));
        let b = find_condition(&status.conditions, ConditionType::BundleApplied).expect("set");
        assert_eq!(b.message, format!("default v3 (sha256 {})", "a".repeat(64)));
    }

    #[test]
    fn the_same_outcome_again_changes_nothing() {
        let mut status = MachineStatus::default();
        apply(&mut status, &ready(), &at("2026-12-01T10:00:00Z"));
        let before = status.clone();
        assert!(!apply(&mut status, &ready(), &at("2026-12-01T11:00:00Z")));
        assert_eq!(status, before);
    }

    #[test]
    fn a_new_generation_is_a_change_but_not_a_transition() {
        let mut status = MachineStatus::default();
        let first = at("2026-12-01T10:00:00Z");
        apply(&mut status, &ready(), &first);
        let next = Outcome {
            generation: Some(3),
            ..ready()
        };
        assert!(apply(&mut status, &next, &at("2026-12-01T11:00:00Z")));
        assert_eq!(status.observed_generation, Some(3));
        for c in &status.conditions {
            assert_eq!(c.observed_generation, Some(3));
            assert_eq!(
                c.last_transition_time, first,
                "{}: status unchanged",
                c.type_
            );
        }
    }

    #[test]
    fn every_failure_makes_the_phase_failed() {
        let failures = [
            Outcome {
                bootstrap: Bootstrap::Failed("phase install failed".into()),
                ..ready()
            },
            Outcome {
                update: Update::ConfigUnreadable("configmap nodeward-system/x: 404".into()),
                ..ready()
            },
            Outcome {
                update: Update::ConfigInvalid("cluster.apiServer: not a URL".into()),
                ..ready()
            },
            Outcome {
                update: Update::Failed("rolled back".into()),
                ..ready()
            },
            Outcome {
                bundle: Bundle::FetchFailed("sha256 differs".into()),
                ..ready()
            },
            Outcome {
                bundle: Bundle::Rejected("untrusted signature".into()),
                ..ready()
            },
            Outcome {
                bundle: Bundle::GrantsWiden("b".repeat(64)),
                ..ready()
            },
        ];
        for o in failures {
            assert_eq!(phase(&o), MachinePhase::Failed, "{o:?}");
            // Every failure is a False condition.
            let falses = conditions(&o)
                .iter()
                .filter(|u| u.reason().status() == nodeward_api::ConditionStatus::False)
                .filter(|u| u.reason() != Reason::NoRepaveNeeded)
                .count();
            assert_eq!(falses, 1, "{o:?}");
        }
    }

    #[test]
    fn work_in_progress_phases() {
        let bootstrapping = Outcome {
            bootstrap: Bootstrap::Running {
                checkpoint: "install".into(),
            },
            update: Update::Updating("bootstrapping".into()),
            ..ready()
        };
        assert_eq!(phase(&bootstrapping), MachinePhase::Bootstrapping);
        let [b, ..] = conditions(&bootstrapping);
        assert_eq!(b.reason(), Reason::Bootstrapping);
        assert_eq!(b.message(), "the bootstrap is at its checkpoint install");
        let updating = Outcome {
            update: Update::Updating("1.34.1 → 1.34.2".into()),
            ..ready()
        };
        assert_eq!(phase(&updating), MachinePhase::Updating);
        let installing = Outcome {
            bundle: Bundle::Installing("downloading".into()),
            ..ready()
        };
        assert_eq!(phase(&installing), MachinePhase::Updating);
        let repaving = Outcome {
            repaving: true,
            audit_head: None,
            ..ready()
        };
        assert_eq!(phase(&repaving), MachinePhase::Repaving);
    }

    #[test]
    fn a_pending_repave_is_reported_without_changing_the_phase() {
        let o = Outcome {
            repave: Some("spec.mode nspawn, the node runs none".into()),
            ..ready()
        };
        let [.., r] = conditions(&o);
        assert_eq!(r.reason(), Reason::RepaveRequired);
        assert_eq!(r.reason().status(), nodeward_api::ConditionStatus::True);
        assert_eq!(phase(&o), MachinePhase::Ready);
    }

    #[test]
    fn long_messages_are_capped() {
        let o = Outcome {
            update: Update::Failed("x".repeat(100_000)),
            ..ready()
        };
        for u in conditions(&o) {
            assert!(u.message().len() <= MAX_MESSAGE_BYTES);
        }
    }

    #[test]
    fn conditions_come_in_the_documented_order() {
        let types: Vec<ConditionType> = conditions(&ready())
            .iter()
            .map(|u| u.reason().condition_type())
            .collect();
        assert_eq!(types, ConditionType::ALL);
    }

    #[test]
    fn unknown_conditions_are_kept() {
        let mut status = MachineStatus::default();
        status.conditions.push(Condition {
            type_: "FromANewerDaemon".into(),
            status: "True".into(),
            reason: "Whatever".into(),
            message: String::new(),
            observed_generation: None,
            last_transition_time: at("2026-01-01T00:00:00Z"),
        });
        apply(&mut status, &ready(), &at("2026-12-01T10:00:00Z"));
        assert_eq!(status.conditions.len(), 5);
        assert_eq!(status.conditions[0].type_, "FromANewerDaemon");
    }
}
