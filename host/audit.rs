//! The audit log: one structured record per capability call.
//!
//! # Background
//! Auditors need to know every host change a phase made or tried to make. Each capability call
//! becomes one `tracing` event on target `nodeward::audit` (JSON with `--log-format json`,
//! journald when under systemd) with the phase, the bundle digest, the call
//! (`interface.function`), its arguments, its outcome and its duration. The run also keeps the
//! records in memory ([`AuditLog::records`]) so the CLI can summarise and tests can assert.
//!
//! # Guarantees
//! - File contents are never logged, only their length and sha256.
//! - Every secret the [`Redactor`] knows (the bootstrap token, its secret half) is replaced by
//!   `<redacted>` in arguments, outcomes and guest log lines before they are emitted.

use serde::Serialize;
use std::sync::Mutex;
use std::time::Duration;

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

/// One capability call, as logged.
#[derive(Clone, Debug, Serialize)]
pub struct AuditRecord {
    /// The phase that made the call.
    pub phase: String,
    /// sha256 of the bundle manifest the phase came from.
    pub bundle: String,
    /// `interface.function`, e.g. `fs.write-file`.
    pub call: String,
    /// The arguments, redacted, contents summarised.
    pub args: serde_json::Value,
    /// `ok:<outcome>`, or `<error-kind>: <message>`.
    pub outcome: String,
    /// Whether the call was refused by the grant.
    pub denied: bool,
    /// How long the call took, in microseconds.
    pub duration_us: u64,
}

/// The run's audit records.
#[derive(Debug, Default)]
pub struct AuditLog {
    records: Mutex<Vec<AuditRecord>>,
}

impl AuditLog {
    /// Emits `record` as a tracing event and keeps it.
    pub fn record(&self, record: AuditRecord) {
        let args = record.args.to_string();
        if record.denied {
            tracing::warn!(
                target: "nodeward::audit",
                phase = %record.phase, bundle = %record.bundle, call = %record.call,
                args = %args, outcome = %record.outcome, denied = true,
                duration_us = record.duration_us,
                "capability call denied"
            );
        } else {
            tracing::info!(
                target: "nodeward::audit",
                phase = %record.phase, bundle = %record.bundle, call = %record.call,
                args = %args, outcome = %record.outcome, denied = false,
                duration_us = record.duration_us,
                "capability call"
            );
        }
        if let Ok(mut records) = self.records.lock() {
            records.push(record);
        }
    }

    /// A copy of every record so far.
    pub fn records(&self) -> Vec<AuditRecord> {
        self.records.lock().map(|r| r.clone()).unwrap_or_default()
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
}
