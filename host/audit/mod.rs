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
//!   (`var/log/nodeward/audit/audit.jsonl`), hash-chained ([`chain`]), its ends vouched for by
//!   the head in the state directory ([`head`]), with one record per run start and end, per
//!   phase end and per bundle install, rollback, rollforward and uninstall besides the calls;
//!   `nodeward audit verify` checks it ([`verify`]), `show|summary` read it ([`query`]);
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
//! - The run keeps the first [`limits::MAX_RECORDS`] records, and at most
//!   [`limits::MAX_RECORD_MEMORY`] bytes of them; later ones are counted per call and denial
//!   ([`AuditLog::overflow`]), not kept. [`AuditLog::total`] and
//!   [`AuditLog::total_duration_us`] cover every call.
//! - A phase run emits and persists its first [`limits::MAX_EMITTED_PER_PHASE`] call records,
//!   while its run has written less than [`limits::MAX_CALL_BYTES_PER_RUN`] of call records;
//!   later calls are counted and written as one `call-overflow` record when the phase ends.
//!   In apply mode a call past either budget that could change the host is refused instead
//!   (`crate::caps::READ_ONLY_CALLS` are the others), so every host change has its record.
//! - A persisted line is at most [`limits::MAX_RECORD_LINE_BYTES`] long, measured after JSON
//!   escaping ([`fit`]).
//! - The trail takes at most `(1 + ROTATED_FILES) × MAX_FILE_BYTES` on disk (plus one record).
//! - Nothing the trail reads can hang or flood the agent: its directories and files are opened
//!   without following links and must be regular files ([`dir`]); lines are read with a cap
//!   ([`limits::MAX_LINE_BYTES`]); the log lock is waited for at most [`limits::LOCK_WAIT`].
//!
//! The record schema, the chain, retention and an auditor's walkthrough: `docs/audit.md`.

pub mod chain;
pub mod close;
pub(crate) mod dir;
pub mod entry;
mod files;
mod fit;
pub mod head;
pub mod journal;
mod lines;
mod lock;
pub mod query;
mod record;
mod redact;
mod repair;
pub mod trail;
pub mod verify;

#[cfg(test)]
mod close_tests;
#[cfg(test)]
mod tamper_tests;
#[cfg(test)]
mod tests;

pub use close::close_interrupted_runs;
pub use record::{AuditLog, AuditOverflow, AuditRecord, micros};
pub use redact::{REDACTED, Redactor, SecretScan, bound_json, bound_text};

/// The bounds of the audit trail. Documented in `wit/types.wit` (the guest-facing contract)
/// and `docs/capabilities.md`.
pub mod limits {
    use std::time::Duration;

    /// Longest argument string kept or logged, in bytes (then prefix, length and sha256).
    pub const MAX_ARG_BYTES: usize = 256;
    /// Longest outcome (`ok:…` or `<error-kind>: <message>`) kept or logged, in bytes.
    pub const MAX_OUTCOME_BYTES: usize = 1024;
    /// Most items of one list argument kept (e.g. overlay lower directories); the rest are
    /// replaced by one `"… N more"` item.
    pub const MAX_ARG_ITEMS: usize = 32;
    /// Records kept in memory per run; the rest are counted, not kept.
    pub const MAX_RECORDS: usize = 10_000;
    /// Bytes of records kept in memory per run ([`super::AuditRecord::size`]); the rest are
    /// counted, not kept.
    pub const MAX_RECORD_MEMORY: usize = 16 << 20;
    /// Records emitted and persisted one by one per phase run; the rest are counted and
    /// summarised in one line and one `call-overflow` record when the phase ends (and, in
    /// apply mode, refused unless read-only).
    pub const MAX_EMITTED_PER_PHASE: usize = 1_000;
    /// Bytes of call records one run writes to the trail; past them, calls are counted as past
    /// [`MAX_EMITTED_PER_PHASE`] (and, in apply mode, refused unless read-only).
    pub const MAX_CALL_BYTES_PER_RUN: u64 = 4 << 20;
    /// Longest line the trail writes, in bytes, measured after JSON escaping (a record's
    /// guest-controlled text is bounded harder until it fits: `fit`).
    pub const MAX_RECORD_LINE_BYTES: usize = 6 << 10;
    /// Size at which the persistent trail's active file (`audit.jsonl`) is rotated, in bytes.
    pub const MAX_FILE_BYTES: u64 = 8 << 20;
    /// Rotated files kept (`audit.jsonl.1` … `.7`); with the active one, at most
    /// 8 × [`MAX_FILE_BYTES`] (64 MiB) on disk. The oldest is dropped: the retention boundary.
    pub const ROTATED_FILES: usize = 7;
    /// Longest line the trail's readers (`audit verify|show|summary`, the writer reading its
    /// last record back) hold; a longer one is reported, not read. Every record is far
    /// shorter ([`MAX_RECORD_LINE_BYTES`]).
    pub const MAX_LINE_BYTES: usize = 64 << 10;
    /// Most bytes of a torn last line (one without its newline) the writer removes; a longer
    /// "torn" tail is no record cut off mid-write, and the writer refuses to open the trail.
    pub const MAX_TORN_BYTES: usize = 256 << 10;
    /// Longest wait for the log lock (another run appends under it for one record); then
    /// the write fails naming the lock file.
    pub const LOCK_WAIT: Duration = Duration::from_secs(30);
}
