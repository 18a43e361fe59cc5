//! Whether the daemon may start reconciling on this host, must wait, or must step aside with
//! exit status [`DEFERRED_EXIT_CODE`] (69).
//!
//! # Background
//! The daemon keeps a node that exists. While an installation owns the host (a `nodeward
//! bootstrap`, `upgrade` or `reset` run by hand holds the node lock, or a bootstrap has not
//! finished, as at first boot when the unit starts beside the bootstrap) the daemon waits,
//! saying so to systemd, and starts once the node is there (`nodeward daemon` polls every
//! 5 s). When there is no node at all (never bootstrapped, or an `AgentReset` removed it) the
//! daemon has nothing it may do, and that is not a fault. It exits 69 (`EX_UNAVAILABLE`,
//! sysexits.h), which `deploy/nodeward.service` names in both `SuccessExitStatus` and
//! `RestartPreventExitStatus`: systemd leaves the unit inactive instead of restarting it until
//! the start limit trips and recording a failure. The test below pins that the unit and this
//! constant agree.
//!
//! # Guarantees
//! - [`decide`] is a pure function of the host's facts ([`HostFacts`]), so each case is tested
//!   without a host; the daemon reads the facts under no lock of its own.
//! - An upgrade journal does not defer: a journaled upgrade that a crash cut short is the
//!   daemon's to finish or roll back ([`Start::Reconcile::resume_journal`]), as every command's
//!   recovery does.

/// The exit status of a daemon that has nothing to keep on this host: 69, `EX_UNAVAILABLE`.
pub const DEFERRED_EXIT_CODE: u8 = 69;

/// What the daemon knows about the host when it starts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostFacts {
    /// Another run holds the node lock (`run/nodeward/node.lock`).
    pub lock_held: bool,
    /// An install record exists.
    pub record: bool,
    /// The install record's checkpoint is `complete` (the bootstrap finished).
    pub bootstrap_complete: bool,
    /// An upgrade journal exists (an upgrade was cut short).
    pub journal: bool,
}

/// Why the daemon steps aside.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Deferred {
    /// Another nodeward run holds the node lock.
    #[error("another nodeward run holds the node lock: the installation owns the host")]
    InstallationRunning,
    /// A bootstrap started and has not finished: `nodeward bootstrap` resumes it.
    #[error(
        "a bootstrap has not finished on this host: `nodeward bootstrap` resumes it, then the daemon keeps the node"
    )]
    BootstrapUnfinished,
    /// No node on this host (never bootstrapped, or reset).
    #[error("no node on this host (never bootstrapped, or reset): nothing to keep")]
    NoNode,
}

/// What the daemon does at start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Start {
    /// Reconcile the node.
    Reconcile {
        /// Finish or roll back a cut-short upgrade first.
        resume_journal: bool,
    },
    /// Exit [`DEFERRED_EXIT_CODE`], saying why.
    Deferred(Deferred),
}

/// What the daemon does at start, given the host's facts.
pub fn decide(facts: HostFacts) -> Start {
    if facts.lock_held {
        return Start::Deferred(Deferred::InstallationRunning);
    }
    if !facts.record {
        return Start::Deferred(Deferred::NoNode);
    }
    if !facts.bootstrap_complete {
        return Start::Deferred(Deferred::BootstrapUnfinished);
    }
    Start::Reconcile {
        resume_journal: facts.journal,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UNIT: &str = crate::daemon::UNIT_FILE;

    /// The values of `key=` lines in the unit (space-separated lists flattened).
    fn unit_values(key: &str) -> Vec<String> {
        UNIT.lines()
            .filter_map(|l| l.trim().strip_prefix(key)?.strip_prefix('='))
            .flat_map(|v| v.split_whitespace().map(str::to_string))
            .collect()
    }

    #[test]
    fn the_unit_treats_the_deferred_exit_as_a_clean_stop() {
        let code = DEFERRED_EXIT_CODE.to_string();
        assert!(
            unit_values("SuccessExitStatus").contains(&code),
            "SuccessExitStatus lacks {code}"
        );
        assert!(
            unit_values("RestartPreventExitStatus").contains(&code),
            "RestartPreventExitStatus lacks {code}"
        );
        assert_eq!(unit_values("Type"), ["notify"]);
    }

    fn installed() -> HostFacts {
        HostFacts {
            lock_held: false,
            record: true,
            bootstrap_complete: true,
            journal: false,
        }
    }

    #[test]
    fn a_finished_node_is_reconciled() {
        assert_eq!(
            decide(installed()),
            Start::Reconcile {
                resume_journal: false
            }
        );
    }

    #[test]
    fn a_cut_short_upgrade_is_resumed_not_deferred() {
        let facts = HostFacts {
            journal: true,
            ..installed()
        };
        assert_eq!(
            decide(facts),
            Start::Reconcile {
                resume_journal: true
            }
        );
    }

    #[test]
    fn a_running_installation_defers_whatever_else_holds() {
        for record in [false, true] {
            for bootstrap_complete in [false, true] {
                for journal in [false, true] {
                    let facts = HostFacts {
                        lock_held: true,
                        record,
                        bootstrap_complete,
                        journal,
                    };
                    assert_eq!(
                        decide(facts),
                        Start::Deferred(Deferred::InstallationRunning),
                        "{facts:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn no_node_and_an_unfinished_bootstrap_defer() {
        assert_eq!(
            decide(HostFacts::default()),
            Start::Deferred(Deferred::NoNode)
        );
        let unfinished = HostFacts {
            bootstrap_complete: false,
            ..installed()
        };
        assert_eq!(
            decide(unfinished),
            Start::Deferred(Deferred::BootstrapUnfinished)
        );
    }

    #[test]
    fn every_deferral_says_why() {
        for d in [
            Deferred::InstallationRunning,
            Deferred::BootstrapUnfinished,
            Deferred::NoNode,
        ] {
            assert!(!d.to_string().is_empty());
        }
    }
}
