//! Redaction and bounds: what every audit record, log line and report goes through before it
//! leaves the agent (see the module doc of [`crate::audit`]).

use sha2::{Digest, Sha256};
use std::borrow::Cow;

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

    /// A scan for known secrets in bytes fed in chunks.
    pub fn scan(&self) -> SecretScan<'_> {
        SecretScan {
            redactor: self,
            carry: Vec::new(),
            found: false,
        }
    }

    /// Whether `bytes` contain a known secret.
    pub fn contains_secret(&self, bytes: &[u8]) -> bool {
        self.secrets
            .iter()
            .any(|s| bytes.windows(s.len()).any(|w| w == s.as_bytes()))
    }
}

/// Looks for the secrets a [`Redactor`] knows in bytes that come in chunks (a file read piece
/// by piece), across the chunks' boundaries too: [`Redactor::scan`].
#[derive(Debug)]
pub struct SecretScan<'r> {
    redactor: &'r Redactor,
    /// The end of the bytes fed so far: a secret may begin in it and end in the next chunk.
    carry: Vec<u8>,
    found: bool,
}

impl SecretScan<'_> {
    /// Looks at the next chunk.
    pub fn feed(&mut self, chunk: &[u8]) {
        if self.found || self.redactor.secrets.is_empty() {
            return;
        }
        let longest = self.redactor.secrets.first().map_or(0, String::len);
        let keep = longest.saturating_sub(1);
        let head = &chunk[..chunk.len().min(keep)];
        self.carry.extend_from_slice(head);
        self.found =
            self.redactor.contains_secret(&self.carry) || self.redactor.contains_secret(chunk);
        let tail = if chunk.len() >= keep {
            chunk[chunk.len() - keep..].to_vec()
        } else {
            let all = std::mem::take(&mut self.carry);
            all[all.len().saturating_sub(keep)..].to_vec()
        };
        self.carry = tail;
    }

    /// Whether a secret was in the bytes fed.
    pub fn found(&self) -> bool {
        self.found
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
    fn a_scan_finds_a_secret_split_across_chunks_anywhere() {
        let r = Redactor::new(vec![
            "abcdef.0123456789abcdef".into(),
            "0123456789abcdef".into(),
        ]);
        let text = b"xx token abcdef.0123456789abcdef yy";
        for size in 1..text.len() {
            let mut scan = r.scan();
            text.chunks(size).for_each(|c| scan.feed(c));
            assert!(scan.found(), "chunks of {size}");
        }
        let mut clean = r.scan();
        b"0123456789abcde 123456789abcdef"
            .chunks(3)
            .for_each(|c| clean.feed(c));
        assert!(!clean.found());
        let nothing = Redactor::default();
        let mut none = nothing.scan();
        none.feed(text);
        assert!(!none.found());
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
}
