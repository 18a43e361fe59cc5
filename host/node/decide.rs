//! The none-mode decisions, as pure functions over plain values.
//!
//! # Background
//! What a bootstrap, an upgrade or a recovery does depends on a handful of facts read from the
//! host: the install record, the fingerprint of the config being applied, `--force`, the upgrade
//! journal, the applied config and the `current` link. [`pipeline`](super::pipeline) reads those
//! facts (and holds the lock while it does) and acts; the choice itself is made here, where
//! each row of the decision table has a unit test and no systemd, root or phase is needed.
//!
//! # Guarantees
//! - Nothing here reads or changes the host: every input is a value, every output an action
//!   (or a [`Refusal`]) the pipeline carries out.
//! - A refusal says what the host holds and what the operator can do about it; its text is
//!   what `nodeward` prints.

use crate::node::state::{Checkpoint, InstallRecord, Journal};
use crate::node::version::Unpinned;
use nodeward_node_config::NodeConfig;

/// Why an operation refused to act on this host. Nothing was changed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// An artifact the config names has no pinned digest.
    #[error(transparent)]
    Unpinned(#[from] Unpinned),
    /// The install record is for another machine or configuration, and `--force` was not
    /// given.
    #[error(
        "this host has a nodeward install record (checkpoint {}) for {mismatch}: {}",
        checkpoint.name(),
        other_config_hint(*checkpoint)
    )]
    OtherConfig {
        /// The record's checkpoint.
        checkpoint: Checkpoint,
        /// What differs.
        mismatch: Mismatch,
    },
    /// An upgrade needs a finished bootstrap.
    #[error(
        "no finished bootstrap on this host: run `nodeward bootstrap` (an unfinished one resumes there)"
    )]
    NoFinishedBootstrap,
    /// An upgrade may not rename the node.
    #[error(
        "this node is {node:?}, the config is for {config:?}: a new machine name is a new node; `nodeward reset` first"
    )]
    NewMachine {
        /// The machine name the install record names.
        node: String,
        /// The machine name of the config.
        config: String,
    },
    /// An upgrade needs the applied config it would roll back to.
    #[error("no applied config: run `nodeward bootstrap` to finish the node first")]
    NoAppliedConfig,
}

/// How an install record differs from the config being applied.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Mismatch {
    /// Another machine name (which wins over a different fingerprint in the message).
    #[error("machine {recorded:?}, this config is for {config:?}")]
    Machine {
        /// The record's machine name.
        recorded: String,
        /// The config's.
        config: String,
    },
    /// The same machine with another configuration.
    #[error(
        "config fingerprint {}, this config's is {}",
        short(recorded),
        short(config)
    )]
    Fingerprint {
        /// The record's config fingerprint.
        recorded: String,
        /// This config's.
        config: String,
    },
}

/// The first 12 characters of a fingerprint (all of it when shorter, or when a record from
/// disk holds something that is not hex).
fn short(fingerprint: &str) -> &str {
    fingerprint.get(..12).unwrap_or(fingerprint)
}

fn other_config_hint(checkpoint: Checkpoint) -> &'static str {
    if checkpoint == Checkpoint::Complete {
        "use `nodeward upgrade` to change a bootstrapped node, `nodeward reset` to remove it, or --force"
    } else {
        "re-run with the config that started it, `nodeward reset` first, or --force to restart it with this config"
    }
}

/// What a bootstrap does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bootstrap {
    /// No install record: a fresh host. Every step runs; the record is written (checkpoint
    /// `setup-host`) before the first change.
    Fresh,
    /// The record names this config and an unfinished bootstrap: the steps from its checkpoint
    /// run.
    Resume(Checkpoint),
    /// The record names this config and a finished bootstrap: every step runs again (each is
    /// idempotent, so drift is repaired and an intact node changes nothing); the record stays
    /// `complete`.
    Repair,
    /// `--force` on an unfinished bootstrap of another config: it restarts from the beginning
    /// with this one.
    Restart,
    /// `--force` on a finished node of another config: changing its configuration is an
    /// upgrade.
    Upgrade,
}

/// Which steps a bootstrap runs and the checkpoint its record holds before the first change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Steps {
    /// The first step that runs; every later one runs too.
    pub start: Checkpoint,
    /// The checkpoint the record is written with. `complete` (a repair) is never moved back,
    /// so a repair cut short is still a finished node.
    pub record: Checkpoint,
}

impl Bootstrap {
    /// The steps this bootstrap runs; `None` when it is an upgrade instead.
    pub fn steps(self) -> Option<Steps> {
        let (start, record) = match self {
            Bootstrap::Fresh | Bootstrap::Restart => (Checkpoint::SetupHost, Checkpoint::SetupHost),
            Bootstrap::Resume(at) => (at, at),
            Bootstrap::Repair => (Checkpoint::SetupHost, Checkpoint::Complete),
            Bootstrap::Upgrade => return None,
        };
        Some(Steps { start, record })
    }
}

/// What a bootstrap of the config (`machine_name`, `fingerprint`) does on a host whose install
/// record is `record` (after any interrupted upgrade was recovered).
pub fn bootstrap(
    record: Option<&InstallRecord>,
    machine_name: &str,
    fingerprint: &str,
    force: bool,
) -> Result<Bootstrap, Refusal> {
    let Some(r) = record else {
        return Ok(Bootstrap::Fresh);
    };
    let finished = r.checkpoint == Checkpoint::Complete;
    let same = r.machine_name == machine_name && r.config_fingerprint == fingerprint;
    match (same, finished, force) {
        (true, true, _) => Ok(Bootstrap::Repair),
        (true, false, _) => Ok(Bootstrap::Resume(r.checkpoint)),
        (false, true, true) => Ok(Bootstrap::Upgrade),
        (false, false, true) => Ok(Bootstrap::Restart),
        (false, _, false) => Err(Refusal::OtherConfig {
            checkpoint: r.checkpoint,
            mismatch: if r.machine_name != machine_name {
                Mismatch::Machine {
                    recorded: r.machine_name.clone(),
                    config: machine_name.to_string(),
                }
            } else {
                Mismatch::Fingerprint {
                    recorded: r.config_fingerprint.clone(),
                    config: fingerprint.to_string(),
                }
            },
        }),
    }
}

/// Whether the node with install record `record` may be upgraded to a config for
/// `machine_name`: only a finished node, and never under a new name. Returns the record.
pub fn upgradable<'a>(
    record: Option<&'a InstallRecord>,
    machine_name: &str,
) -> Result<&'a InstallRecord, Refusal> {
    let record = record
        .filter(|r| r.checkpoint == Checkpoint::Complete)
        .ok_or(Refusal::NoFinishedBootstrap)?;
    if record.machine_name != machine_name {
        return Err(Refusal::NewMachine {
            node: record.machine_name.clone(),
            config: machine_name.to_string(),
        });
    }
    Ok(record)
}

/// What an upgrade of an [`upgradable`] node does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Upgrade {
    /// The node already runs this config on this version: nothing to do.
    Unchanged,
    /// Provision `to`, journal, switch from `from`.
    Switch {
        /// The version the node runs now.
        from: String,
    },
}

/// What an upgrade to the config `fingerprint` on version `to` does, given the applied
/// config's fingerprint, the `current` link and the version the install record names (what
/// runs when the link is missing).
pub fn upgrade(
    applied_fingerprint: Option<&str>,
    fingerprint: &str,
    current_link: Option<&str>,
    record_version: &str,
    to: &str,
) -> Result<Upgrade, Refusal> {
    let applied = applied_fingerprint.ok_or(Refusal::NoAppliedConfig)?;
    let from = current_link.unwrap_or(record_version);
    if applied == fingerprint && from == to {
        return Ok(Upgrade::Unchanged);
    }
    Ok(Upgrade::Switch {
        from: from.to_string(),
    })
}

/// What the recovery at the start of every mutating run does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recovery {
    /// No upgrade was interrupted.
    Nothing,
    /// The interrupted upgrade had finished but for its commit: start the node, prune, drop the
    /// journal.
    Finish,
    /// The interrupted upgrade did not finish: return to the journal's version and config.
    RollBack,
}

/// What to do about the upgrade journal `journal`, given the applied config's fingerprint
/// (`None` when it is missing or unreadable) and the `current` link.
///
/// Only an applied config with the journal's fingerprint, on the journal's target version, is
/// a finished upgrade: the version alone is not enough, since an upgrade that changes only
/// configuration keeps it, and the config alone is not enough, since it is persisted before
/// the link would be checked.
pub fn recovery(
    journal: Option<&Journal>,
    applied_fingerprint: Option<&str>,
    current_link: Option<&str>,
) -> Recovery {
    let Some(j) = journal else {
        return Recovery::Nothing;
    };
    if applied_fingerprint == Some(j.to_fingerprint.as_str())
        && current_link == Some(j.to_version.as_str())
    {
        Recovery::Finish
    } else {
        Recovery::RollBack
    }
}

/// Whether the applied config must be written: unless the one on disk (`None` when missing or
/// unreadable) already has this fingerprint.
pub fn persist_needed(applied_fingerprint: Option<&str>, fingerprint: &str) -> bool {
    applied_fingerprint != Some(fingerprint)
}

/// The config a reset tears down with: the applied one, else the one an interrupted upgrade
/// started from (its journal), else the one given.
pub fn reset_config<'a>(
    applied: Option<&'a NodeConfig>,
    journal: Option<&'a Journal>,
    given: &'a NodeConfig,
) -> &'a NodeConfig {
    applied
        .or(journal.map(|j| &j.previous_config))
        .unwrap_or(given)
}

#[cfg(test)]
mod tests;
