//! The audit trail: one structured record per capability call, in memory, on stderr, on disk
//! and in the journal.
//!
//! # Background
//! Auditors need to know every host change a phase made or tried to make, long after the
//! terminal that ran it is gone, and whether anyone removed or edited that account since.
//! Each capability call becomes an [`AuditRecord`]: the phase, the bundle digest, the call
//! (`interface.function`), its arguments, its outcome and its duration. It goes to
//! - the run's memory ([`AuditLog`]), so the CLI can summarise and tests can assert;
//! - stderr, as a `tracing` event on target `nodeward::audit`: at `debug` for an allowed call
//!   (`--verbose` shows them), at `warn` for a denied one; each phase ends with one summary line;
//! - the persistent trail ([`trail::AuditTrail`]): JSON lines beneath the host root
//!   (`var/log/nodeward/audit/audit.jsonl`), hash-chained ([`chain`]), with one record per
//!   run start and end, per phase end and per bundle install, rollback, rollforward and
//!   uninstall besides the calls; `nodeward audit verify|show|summary` read it ([`query`]);
//! - the journal, when the agent runs under systemd: the same records as `NODEWARD_*` fields
//!   ([`trail::JOURNAL_TARGET`]).
//!
//! A guest decides how many calls it makes and how large their arguments are, so neither may
//! decide how much memory the agent uses or how much it writes. Every record is therefore
//! bounded, and so is their number (see [`limits`]).
//!
//! # Guarantees
//! - File contents are never logged, only their length and sha256.
//! - Every secret the [`Redactor`] knows (the bootstrap token, its secret half) is replaced by
//!   `<redacted>` in arguments, outcomes and guest log lines before they are emitted or
//!   written.
//! - Redaction happens before truncation ([`AuditRecord::new`] does both, in that order), so a
//!   secret never survives as a prefix and the sha256 of a truncated value is the redacted
//!   value's.
//! - A record holds at most [`limits::MAX_ARG_ITEMS`] list items and strings of at most
//!   [`limits::MAX_ARG_BYTES`] (arguments) and [`limits::MAX_OUTCOME_BYTES`] (the outcome);
//!   a longer string keeps its prefix plus its length and sha256 (see [`bound_text`]).
//! - The run keeps the first [`limits::MAX_RECORDS`] records; later ones are counted per call
//!   and denial ([`AuditLog::overflow`]), not kept. [`AuditLog::total`] and
//!   [`AuditLog::total_duration_us`] cover every call.
//! - A phase run emits and persists its first [`limits::MAX_EMITTED_PER_PHASE`] call records;
//!   the rest are counted and written as one `call-overflow` record when the phase ends.
//! - The trail takes at most `(1 + ROTATED_FILES) × MAX_FILE_BYTES` on disk.
//!
//! The record schema, the chain, retention and an auditor's walkthrough: `docs/audit.md`.

pub mod chain;
pub mod entry;
mod files;
pub mod journal;
pub mod query;
mod record;
mod redact;
pub mod trail;

#[cfg(test)]
mod tests;

pub use record::{AuditLog, AuditOverflow, AuditRecord, micros};
pub use redact::{REDACTED, Redactor, bound_json, bound_text};

/// The bounds of the audit trail. Documented in `wit/types.wit` (the guest-facing contract)
/// and `docs/capabilities.md`.
pub mod limits {
    /// Longest argument string kept or logged, in bytes (then prefix, length and sha256).
    pub const MAX_ARG_BYTES: usize = 256;
    /// Longest outcome (`ok:…` or `<error-kind>: <message>`) kept or logged, in bytes.
    pub const MAX_OUTCOME_BYTES: usize = 1024;
    /// Most items of one list argument kept (e.g. overlay lower directories); the rest are
    /// replaced by one `"… N more"` item.
    pub const MAX_ARG_ITEMS: usize = 32;
    /// Records kept in memory per run; the rest are counted, not kept.
    pub const MAX_RECORDS: usize = 10_000;
    /// Records emitted one by one per phase run; the rest are counted and summarised in one
    /// line when the phase ends.
    pub const MAX_EMITTED_PER_PHASE: usize = 1_000;
    /// Size at which the persistent trail's active file (`audit.jsonl`) is rotated, in bytes.
    pub const MAX_FILE_BYTES: u64 = 8 << 20;
    /// Rotated files kept (`audit.jsonl.1` … `.7`); with the active one, at most
    /// 8 × [`MAX_FILE_BYTES`] (64 MiB) on disk. The oldest is dropped: the retention boundary.
    pub const ROTATED_FILES: usize = 7;
    /// Longest line the trail's writer reads back (its own last record); every record is far
    /// shorter (its strings and lists are bounded above).
    pub const MAX_LINE_BYTES: usize = 256 << 10;
}
