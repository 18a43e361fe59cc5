//! [`AuditRecord`]: one capability call as the run keeps it in memory and emits it, and
//! [`AuditLog`], the run's bounded list of them.

use super::limits;
use super::redact::{Redactor, bound_json, bound_text};
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

/// One capability call, as logged.
#[derive(Clone, Debug, Serialize)]
pub struct AuditRecord {
    /// The phase that made the call.
    pub phase: String,
    /// sha256 of the bundle manifest the phase came from.
    pub bundle: String,
    /// `interface.function`, e.g. `fs.write-file`.
    pub call: String,
    /// The arguments, redacted, then bounded, contents summarised.
    pub args: serde_json::Value,
    /// `ok:<outcome>`, or `<error-kind>: <message>`, redacted, then bounded.
    pub outcome: String,
    /// Whether the call was refused by the grant.
    pub denied: bool,
    /// How long the call took, in microseconds.
    pub duration_us: u64,
}

impl AuditRecord {
    /// A record of `call`, with `args` and `outcome` redacted by `redactor` and then bounded
    /// (in that order, so no secret survives as a prefix).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        redactor: &Redactor,
        phase: &str,
        bundle: &str,
        call: &str,
        mut args: serde_json::Value,
        outcome: &str,
        denied: bool,
        duration: Duration,
    ) -> Self {
        redactor.redact_json(&mut args);
        bound_json(&mut args, limits::MAX_ARG_BYTES, limits::MAX_ARG_ITEMS);
        let outcome = redactor.redact_cow(outcome);
        AuditRecord {
            phase: phase.to_string(),
            bundle: bundle.to_string(),
            call: call.to_string(),
            args,
            outcome: bound_text(&outcome, limits::MAX_OUTCOME_BYTES).into_owned(),
            denied,
            duration_us: micros(duration),
        }
    }

    /// About how many bytes the record holds in memory: its strings and its arguments' JSON
    /// text, plus the record itself.
    pub fn size(&self) -> usize {
        struct Count(usize);
        impl std::io::Write for Count {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0 += buf.len();
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let mut args = Count(0);
        // Writing to a counter cannot fail; a value that could not be written counts as none.
        let _ = serde_json::to_writer(&mut args, &self.args);
        std::mem::size_of::<Self>()
            + self.phase.len()
            + self.bundle.len()
            + self.call.len()
            + self.outcome.len()
            + args.0
    }

    /// Emits the record as one tracing event on `nodeward::audit`: an allowed call at `debug`, a
    /// denied one at `warn`. `args` is JSON text; JSON logs carry it as a JSON value.
    pub fn emit(&self) {
        let args = self.args.to_string();
        if self.denied {
            tracing::warn!(
                target: "nodeward::audit",
                phase = %self.phase, bundle = %self.bundle, call = %self.call,
                args = %args, outcome = %self.outcome, denied = true,
                duration_us = self.duration_us,
                "capability call denied"
            );
        } else {
            // One line per allowed call is an auditor's record, not an operator's progress:
            // `debug` (a denied call stays a warning).
            tracing::debug!(
                target: "nodeward::audit",
                phase = %self.phase, bundle = %self.bundle, call = %self.call,
                args = %args, outcome = %self.outcome, denied = false,
                duration_us = self.duration_us,
                "capability call"
            );
        }
    }
}

/// Calls over the in-memory limit: how many of one kind were counted and not kept.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AuditOverflow {
    /// `interface.function`.
    pub call: String,
    /// Whether these calls were refused by the grant.
    pub denied: bool,
    /// How many.
    pub count: u64,
}

#[derive(Debug, Default)]
struct Kept {
    records: Vec<AuditRecord>,
    bytes: usize,
    overflow: BTreeMap<(String, bool), u64>,
    total: u64,
    denied: u64,
    duration_us: u64,
}

/// The run's audit records: the first `max_records` kept while they take at most `max_bytes`
/// ([`AuditRecord::size`]), the rest counted.
#[derive(Debug)]
pub struct AuditLog {
    kept: Mutex<Kept>,
    max_records: usize,
    max_bytes: usize,
}

impl Default for AuditLog {
    fn default() -> Self {
        AuditLog::with_limits(limits::MAX_RECORDS, limits::MAX_RECORD_MEMORY)
    }
}

impl AuditLog {
    /// A log that keeps at most `max_records` records in memory (and
    /// [`limits::MAX_RECORD_MEMORY`] bytes of them).
    pub fn new(max_records: usize) -> Self {
        AuditLog::with_limits(max_records, limits::MAX_RECORD_MEMORY)
    }

    /// A log that keeps at most `max_records` records and `max_bytes` of them in memory.
    pub fn with_limits(max_records: usize, max_bytes: usize) -> Self {
        AuditLog {
            kept: Mutex::new(Kept::default()),
            max_records,
            max_bytes,
        }
    }

    fn kept(&self) -> std::sync::MutexGuard<'_, Kept> {
        self.kept.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Emits `record` as a tracing event when `emit` (the caller's per-phase emission limit
    /// decides), then keeps it, or counts it when the run already keeps `max_records` or
    /// keeping it would pass `max_bytes`.
    pub fn record(&self, record: AuditRecord, emit: bool) {
        if emit {
            record.emit();
        }
        let mut kept = self.kept();
        kept.total += 1;
        kept.denied += u64::from(record.denied);
        kept.duration_us = kept.duration_us.saturating_add(record.duration_us);
        let size = (kept.records.len() < self.max_records).then(|| record.size());
        if let Some(size) = size.filter(|s| kept.bytes.saturating_add(*s) <= self.max_bytes) {
            kept.bytes += size;
            kept.records.push(record);
        } else {
            *kept
                .overflow
                .entry((record.call, record.denied))
                .or_default() += 1;
        }
    }

    /// A copy of every record kept (the first `max_records` of the run).
    pub fn records(&self) -> Vec<AuditRecord> {
        self.kept().records.clone()
    }

    /// The calls made after the in-memory limit was reached, counted per call and denial.
    pub fn overflow(&self) -> Vec<AuditOverflow> {
        self.kept()
            .overflow
            .iter()
            .map(|((call, denied), count)| AuditOverflow {
                call: call.clone(),
                denied: *denied,
                count: *count,
            })
            .collect()
    }

    /// Every call of the run, kept or counted.
    pub fn total(&self) -> u64 {
        self.kept().total
    }

    /// Every call of the run the grants refused, kept or counted.
    pub fn denied(&self) -> u64 {
        self.kept().denied
    }

    /// The time every call of the run took, in microseconds.
    pub fn total_duration_us(&self) -> u64 {
        self.kept().duration_us
    }
}

/// Microseconds in `d`, saturating.
pub fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_never_survives_as_a_prefix() {
        let secret = "s3cr3t-token-value";
        let r = Redactor::new(vec![secret.into()]);
        // The cut falls inside the secret: redaction first means it is gone whole.
        let path = format!(
            "{}{secret}{}",
            "a".repeat(limits::MAX_ARG_BYTES - 5),
            "b".repeat(4096)
        );
        let rec = AuditRecord::new(
            &r,
            "p",
            "b",
            "fs.stat",
            serde_json::json!({"path": path}),
            &format!("denied: {path}"),
            true,
            Duration::ZERO,
        );
        let shown = rec.args.to_string() + &rec.outcome;
        assert!(!shown.contains("s3cr"), "{shown}");
        assert!(
            rec.args["path"]
                .as_str()
                .is_some_and(|p| p.len() < limits::MAX_ARG_BYTES + 100)
        );
        assert!(rec.outcome.len() < limits::MAX_OUTCOME_BYTES + 100);
    }

    #[test]
    fn records_over_the_byte_budget_are_counted_not_kept() {
        let r = Redactor::default();
        let rec = |path: &str| {
            AuditRecord::new(
                &r,
                "p",
                "b",
                "fs.stat",
                serde_json::json!({ "path": path }),
                "ok:absent",
                false,
                Duration::ZERO,
            )
        };
        let one = rec(&"x".repeat(200)).size();
        let log = AuditLog::with_limits(100, one * 3);
        for _ in 0..5 {
            log.record(rec(&"x".repeat(200)), false);
        }
        assert_eq!(log.records().len(), 3);
        assert_eq!(log.total(), 5);
        assert_eq!(
            log.overflow(),
            [AuditOverflow {
                call: "fs.stat".into(),
                denied: false,
                count: 2
            }]
        );
    }

    #[test]
    fn records_over_the_limit_are_counted_not_kept() {
        let log = AuditLog::new(2);
        let r = Redactor::default();
        for (call, denied) in [
            ("fs.stat", false),
            ("fs.stat", true),
            ("fs.stat", false),
            ("fs.stat", true),
            ("fs.read-file", false),
        ] {
            let rec = AuditRecord::new(
                &r,
                "p",
                "b",
                call,
                serde_json::json!({}),
                "ok",
                denied,
                Duration::from_micros(3),
            );
            log.record(rec, false);
        }
        assert_eq!(log.records().len(), 2);
        assert_eq!(log.total(), 5);
        assert_eq!(log.total_duration_us(), 15);
        let over: Vec<(String, bool, u64)> = log
            .overflow()
            .into_iter()
            .map(|o| (o.call, o.denied, o.count))
            .collect();
        assert_eq!(
            over,
            [
                ("fs.read-file".to_string(), false, 1),
                ("fs.stat".into(), false, 1),
                ("fs.stat".into(), true, 1)
            ]
        );
    }
}
