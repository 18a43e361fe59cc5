//! The audit log: one structured record per capability call.
//!
//! # Background
//! Auditors need to know every host change a phase made or tried to make. Each capability call
//! becomes one `tracing` event on target `nodeward::audit` (JSON with `--log-format json`,
//! journald when under systemd) with the phase, the bundle digest, the call
//! (`interface.function`), its arguments, its outcome and its duration: at `debug` for an
//! allowed call (`--verbose` shows them; the default `info` does not print a line per call), at
//! `warn` for a denied one. The run also keeps the
//! records in memory ([`AuditLog::records`]) so the CLI can summarise and tests can assert.
//!
//! A guest decides how many calls it makes and how large their arguments are, so neither may
//! decide how much memory the agent uses or how much it writes to its log. Every record is
//! therefore bounded, and so is their number (see [`limits`]).
//!
//! # Guarantees
//! - File contents are never logged, only their length and sha256.
//! - Every secret the [`Redactor`] knows (the bootstrap token, its secret half) is replaced by
//!   `<redacted>` in arguments, outcomes and guest log lines before they are emitted.
//! - Redaction happens before truncation ([`AuditRecord::new`] does both, in that order), so a
//!   secret never survives as a prefix and the sha256 of a truncated value is the redacted
//!   value's.
//! - A record holds at most [`limits::MAX_ARG_ITEMS`] list items and strings of at most
//!   [`limits::MAX_ARG_BYTES`] (arguments) and [`limits::MAX_OUTCOME_BYTES`] (the outcome);
//!   a longer string keeps its prefix plus its length and sha256 (see [`bound_text`]).
//! - The run keeps the first [`limits::MAX_RECORDS`] records; later ones are emitted (subject
//!   to the per-phase emission limit) and counted per call and denial ([`AuditLog::overflow`]),
//!   not kept. [`AuditLog::total`] and [`AuditLog::total_duration_us`] cover every call.

use serde::Serialize;
use sha2::{Digest, Sha256};
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

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
}

/// Replaces known secret values in text.
#[derive(Clone, Debug, Default)]
pub struct Redactor {
    secrets: Vec<String>,
}

/// What replaces a secret.
pub const REDACTED: &str = "<redacted>";

impl Redactor {
    /// A redactor for `secrets` (empty strings are ignored).
    pub fn new(secrets: Vec<String>) -> Self {
        let mut secrets: Vec<String> = secrets.into_iter().filter(|s| !s.is_empty()).collect();
        // Longest first, so a secret containing another is replaced whole.
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        Redactor { secrets }
    }

    /// `text` with every known secret replaced.
    pub fn redact(&self, text: &str) -> String {
        let mut out = text.to_string();
        for s in &self.secrets {
            if out.contains(s.as_str()) {
                out = out.replace(s.as_str(), REDACTED);
            }
        }
        out
    }

    /// `text` with every known secret replaced, borrowed when it holds none (a large guest
    /// string is then not copied).
    pub fn redact_cow<'t>(&self, text: &'t str) -> Cow<'t, str> {
        if self.secrets.iter().any(|s| text.contains(s.as_str())) {
            Cow::Owned(self.redact(text))
        } else {
            Cow::Borrowed(text)
        }
    }

    /// Redacts every string inside `value` in place (keys are names we chose, never secrets).
    pub fn redact_json(&self, value: &mut serde_json::Value) {
        match value {
            serde_json::Value::String(s) if self.secrets.iter().any(|x| s.contains(x.as_str())) => {
                *s = self.redact(s);
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(|v| self.redact_json(v)),
            serde_json::Value::Object(map) => map.values_mut().for_each(|v| self.redact_json(v)),
            _ => {}
        }
    }

    /// Whether `bytes` contain a known secret.
    pub fn contains_secret(&self, bytes: &[u8]) -> bool {
        self.secrets
            .iter()
            .any(|s| bytes.windows(s.len()).any(|w| w == s.as_bytes()))
    }
}

/// `text` when it has at most `max` bytes; otherwise its longest prefix of at most `max` bytes
/// that ends on a character boundary, then `… (<len> bytes, sha256 <hex>)` describing the
/// whole value, so two long values can still be told apart and matched against a file.
///
/// Callers redact first: the prefix and the digest are of the text as given.
pub fn bound_text(text: &str, max: usize) -> Cow<'_, str> {
    if text.len() <= max {
        return Cow::Borrowed(text);
    }
    let cut = text.floor_char_boundary(max);
    Cow::Owned(format!(
        "{}… ({} bytes, sha256 {})",
        &text[..cut],
        text.len(),
        hex::encode(Sha256::digest(text.as_bytes()))
    ))
}

/// Bounds every string in `value` to `max_bytes` and every list to `max_items` (the rest
/// replaced by one `"… N more"` string), in place.
pub fn bound_json(value: &mut serde_json::Value, max_bytes: usize, max_items: usize) {
    match value {
        serde_json::Value::String(s) => {
            if let Cow::Owned(b) = bound_text(s, max_bytes) {
                *s = b;
            }
        }
        serde_json::Value::Array(items) => {
            if items.len() > max_items {
                let more = items.len() - max_items;
                items.truncate(max_items);
                items.push(serde_json::Value::String(format!("… {more} more")));
            }
            items
                .iter_mut()
                .for_each(|v| bound_json(v, max_bytes, max_items));
        }
        serde_json::Value::Object(map) => map
            .values_mut()
            .for_each(|v| bound_json(v, max_bytes, max_items)),
        _ => {}
    }
}

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
    overflow: BTreeMap<(String, bool), u64>,
    total: u64,
    duration_us: u64,
}

/// The run's audit records: the first `max_records` kept, the rest counted.
#[derive(Debug)]
pub struct AuditLog {
    kept: Mutex<Kept>,
    max_records: usize,
}

impl Default for AuditLog {
    fn default() -> Self {
        AuditLog::new(limits::MAX_RECORDS)
    }
}

impl AuditLog {
    /// A log that keeps at most `max_records` records in memory.
    pub fn new(max_records: usize) -> Self {
        AuditLog {
            kept: Mutex::new(Kept::default()),
            max_records,
        }
    }

    fn kept(&self) -> std::sync::MutexGuard<'_, Kept> {
        self.kept.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Emits `record` as a tracing event when `emit` (the caller's per-phase emission limit
    /// decides), then keeps it, or counts it when the run already keeps `max_records`.
    pub fn record(&self, record: AuditRecord, emit: bool) {
        if emit {
            record.emit();
        }
        let mut kept = self.kept();
        kept.total += 1;
        kept.duration_us = kept.duration_us.saturating_add(record.duration_us);
        if kept.records.len() < self.max_records {
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
    fn redacts_every_secret() {
        let r = Redactor::new(vec![
            "abcdef.0123456789abcdef".into(),
            "0123456789abcdef".into(),
            String::new(),
        ]);
        assert_eq!(
            r.redact("token: abcdef.0123456789abcdef"),
            "token: <redacted>"
        );
        assert_eq!(r.redact("secret 0123456789abcdef!"), "secret <redacted>!");
        assert_eq!(r.redact("nothing here"), "nothing here");
        assert!(r.contains_secret(b"x 0123456789abcdef y"));
        let mut v = serde_json::json!({"path": "etc/x", "value": "t=abcdef.0123456789abcdef", "list": ["0123456789abcdef"]});
        r.redact_json(&mut v);
        assert_eq!(
            v,
            serde_json::json!({"path": "etc/x", "value": "t=<redacted>", "list": ["<redacted>"]})
        );
        assert!(!r.contains_secret(b"x y"));
    }

    #[test]
    fn long_values_keep_a_prefix_their_length_and_digest() {
        assert_eq!(bound_text("short", 8), "short");
        let long = "é".repeat(200);
        let b = bound_text(&long, 5);
        assert!(b.starts_with("éé… (400 bytes, sha256 "), "{b}");
        assert!(b.ends_with(&format!(
            "{})",
            hex::encode(Sha256::digest(long.as_bytes()))
        )));
        let mut v = serde_json::json!({"lower": (0..40).map(|i| format!("d{i}")).collect::<Vec<_>>(), "path": "x".repeat(300)});
        bound_json(&mut v, 16, 3);
        assert_eq!(
            v["lower"],
            serde_json::json!(["d0", "d1", "d2", "… 37 more"])
        );
        assert!(
            v["path"]
                .as_str()
                .is_some_and(|p| p.starts_with(&"x".repeat(16)) && p.contains("300 bytes"))
        );
    }

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
