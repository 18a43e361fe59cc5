//! Secrets a run knows, and the one place a secret is written: substitution of references.
//!
//! # Background
//! No phase ever receives a secret value: the config in its input carries references
//! (`nodeward-secret:bootstrap-token`, see `nodeward_node_config::secret`). A phase that must
//! put the bootstrap token into a file writes the reference there with `fs.write-file`; the
//! host replaces it with the value on its way to disk, when the phase's `secrets` grant names
//! that exact file and the mode has no group/other bits. In the other direction,
//! `fs.read-file` gives a phase the file with each value replaced by its reference again, so a
//! phase with read access to a secret file still never holds the value.
//!
//! # Guarantees
//! - [`Secrets::substitute`] is the only code that puts a value into guest-provided bytes, and
//!   `caps::fs` (`PhaseCtx::with_secrets`) calls it only after both checks pass; a refused write touches
//!   nothing (`denied` for a file outside the grant, `invalid-argument` for a mode with
//!   group/other bits).
//! - Idempotence holds: the substituted bytes are what is compared with the disk, so a second
//!   run is `unchanged`.
//! - A part of a secret that identifies it alone (the bootstrap token's secret half,
//!   [`secret_parts`]) is a secret too: masked wherever the whole is, under its own reference
//!   (`nodeward-secret:bootstrap-token.secret`), which is substituted back like the whole's
//!   (under the whole's `secrets` grant). The redactor (`crate::audit::Redactor`) knows the same
//!   strings, for audit records, logs, diffs and errors.
//! - No answer tells a right guess from a wrong one: contents a phase sends that hold a value
//!   or a part ([`Secrets::holds_value`]) are written as a replacement and answered `changed`
//!   even when the file holds those bytes (`caps::fs`); a download or an extraction never
//!   counts a file holding a secret as already in place (`caps::download`). Errors a phase
//!   gets are not masked by value: they quote its own arguments (a path, a unit), and one
//!   that came back with a reference where the phase sent a guess would confirm it; what
//!   the host records or prints of them is redacted (`crate::audit::Redactor`).
//! - Plan mode never shows the value, nor a digest of it: the change records the substituted
//!   file's size only (no sha256), and its diff is withheld (see `plan::file_diff`).
//!
//! # Caveats
//! The plan overlay holds the substituted bytes (host memory, never printed); a later planned
//! `fs.read-file` of that path goes through [`Secrets::mask`] like any read.
//!
//! Masking is by value: a phase that writes bytes and reads them back learns whether they held
//! a secret (they come back as its reference). No masking can hide from a phase that it holds
//! what it guessed; the guess itself is the cost: the secret half is 16 characters of
//! `[a-z0-9]` (about 2^82 tries, one call each).

use nodeward_node_config::NodeConfig;
use nodeward_node_config::secret::BOOTSTRAP_TOKEN;

/// Group and other permission bits: a file holding a secret has none.
pub const GROUP_OTHER: u32 = 0o077;

/// One secret of the run.
#[derive(Clone)]
struct Entry {
    /// Its name in a bundle's `secrets` grant, e.g. `bootstrap-token`.
    name: &'static str,
    /// What a phase writes in its place, e.g. `nodeward-secret:bootstrap-token`.
    reference: &'static str,
    /// The value; never logged (`Debug` prints the name only).
    value: String,
    /// The parts of the value that are secret on their own ([`secret_parts`]).
    parts: Vec<Part>,
}

/// A part of a secret that identifies it on its own: masked and substituted like the whole,
/// under its own reference.
#[derive(Clone)]
struct Part {
    /// The whole's reference and the part's name: `nodeward-secret:bootstrap-token.secret`.
    reference: String,
    /// The part's value.
    value: String,
}

/// The parts of the secret `name` that are secret on their own, by part name: the bootstrap
/// token `<id>.<secret>`'s secret half (`secret`), which alone lets its holder join the
/// cluster (its id is public: it names the token, e.g. in the Secret `bootstrap-token-<id>`).
/// `NodeConfig::secrets`, which the redactor is made from, lists the same strings
/// (`tests::every_string_the_redactor_knows_is_masked`).
fn secret_parts(name: &str, value: &str) -> Vec<(&'static str, String)> {
    match name {
        BOOTSTRAP_TOKEN => value
            .split_once('.')
            .map(|(_, secret)| secret)
            .filter(|s| !s.is_empty())
            .map(|s| vec![("secret", s.to_string())])
            .unwrap_or_default(),
        _ => Vec::new(),
    }
}

/// The secrets of one run, by name, reference and value.
#[derive(Clone, Default)]
pub struct Secrets {
    entries: Vec<Entry>,
}

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.entries.iter().map(|e| e.name))
            .finish()
    }
}

impl Secrets {
    /// The secrets of `config` (empty values are skipped: nothing to substitute or hide).
    pub fn from_config(config: &NodeConfig) -> Self {
        Secrets {
            entries: config
                .secret_values()
                .into_iter()
                .filter(|(_, _, value)| !value.is_empty())
                .map(|(name, reference, value)| Entry {
                    name,
                    reference,
                    parts: secret_parts(name, &value)
                        .into_iter()
                        .map(|(part, value)| Part {
                            reference: format!("{reference}.{part}"),
                            value,
                        })
                        .collect(),
                    value,
                })
                .collect(),
        }
    }

    /// Every (reference, value) pair: each secret whole, and each of its parts.
    fn pairs(&self) -> impl Iterator<Item = (&str, &str)> {
        self.entries.iter().flat_map(|e| {
            std::iter::once((e.reference, e.value.as_str())).chain(
                e.parts
                    .iter()
                    .map(|p| (p.reference.as_str(), p.value.as_str())),
            )
        })
    }

    /// The names of the secrets whose reference (or a part's) occurs in `bytes`.
    pub fn referenced(&self, bytes: &[u8]) -> Vec<&'static str> {
        self.entries
            .iter()
            .filter(|e| {
                find(bytes, e.reference.as_bytes()).is_some()
                    || e.parts
                        .iter()
                        .any(|p| find(bytes, p.reference.as_bytes()).is_some())
            })
            .map(|e| e.name)
            .collect()
    }

    /// Whether `bytes` hold a secret value or a part of one. Contents a phase sends that do
    /// hold one are bytes it guessed: `fs.write-file` then never answers `unchanged`, so that
    /// a right guess looks like a wrong one (`caps::fs`).
    pub fn holds_value(&self, bytes: &[u8]) -> bool {
        self.pairs()
            .any(|(_, value)| find(bytes, value.as_bytes()).is_some())
    }

    /// `bytes` with every reference replaced by its value (the longest reference first, so a
    /// part's, which begins with the whole's, is replaced whole).
    pub fn substitute(&self, bytes: &[u8]) -> Vec<u8> {
        let mut pairs: Vec<(&str, &str)> = self.pairs().collect();
        pairs.sort_by_key(|(reference, _)| std::cmp::Reverse(reference.len()));
        pairs
            .into_iter()
            .fold(bytes.to_vec(), |b, (reference, value)| {
                replace(&b, reference.as_bytes(), value.as_bytes())
            })
    }

    /// `bytes` with every value replaced by its reference, the whole before its parts: what a
    /// phase reads.
    pub fn mask(&self, bytes: Vec<u8>) -> Vec<u8> {
        let mut pairs: Vec<(&str, &str)> = self.pairs().collect();
        pairs.sort_by_key(|(_, value)| std::cmp::Reverse(value.len()));
        pairs.into_iter().fold(bytes, |b, (reference, value)| {
            if find(&b, value.as_bytes()).is_some() {
                replace(&b, value.as_bytes(), reference.as_bytes())
            } else {
                b
            }
        })
    }
}

/// The first index of `needle` in `hay`.
fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() {
        return None;
    }
    hay.windows(needle.len()).position(|w| w == needle)
}

/// `hay` with every non-overlapping `from` replaced by `to`, left to right.
fn replace(hay: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(hay.len());
    let mut rest = hay;
    while let Some(i) = find(rest, from) {
        out.extend_from_slice(&rest[..i]);
        out.extend_from_slice(to);
        rest = &rest[i + from.len()..];
    }
    out.extend_from_slice(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "abcdef.0123456789abcdef";

    fn config() -> NodeConfig {
        let mut c = crate::config::load(None).expect("embedded config");
        c.kubelet.auth.bootstrap_token = nodeward_node_config::Secret::new(TOKEN);
        c
    }

    #[test]
    fn substitutes_and_masks_every_occurrence() {
        let s = Secrets::from_config(&config());
        let text = b"a: nodeward-secret:bootstrap-token\nb: \"nodeward-secret:bootstrap-token\"\n"
            .to_vec();
        assert_eq!(s.referenced(&text), ["bootstrap-token"]);
        let real = s.substitute(&text);
        assert_eq!(
            real,
            b"a: abcdef.0123456789abcdef\nb: \"abcdef.0123456789abcdef\"\n"
        );
        assert_eq!(s.mask(real), text);
        assert!(s.referenced(b"nodeward-secret:bootstrap-toke").is_empty());
        assert_eq!(s.substitute(b"plain"), b"plain");
        assert!(!format!("{s:?}").contains("0123456789abcdef"));
        assert!(Secrets::default().referenced(&text).is_empty());
    }

    #[test]
    fn the_secret_half_is_masked_and_substituted_under_its_own_reference() {
        let s = Secrets::from_config(&config());
        // The half alone, and next to the whole: the whole is masked whole.
        let disk =
            b"token-id: abcdef\ntoken-secret: 0123456789abcdef\nt: abcdef.0123456789abcdef\n";
        let read = s.mask(disk.to_vec());
        assert_eq!(
            String::from_utf8_lossy(&read),
            "token-id: abcdef\ntoken-secret: nodeward-secret:bootstrap-token.secret\n\
             t: nodeward-secret:bootstrap-token\n"
        );
        assert_eq!(s.referenced(&read), ["bootstrap-token"]);
        assert_eq!(
            s.substitute(&read),
            disk,
            "what a phase read writes back as it was"
        );
        assert!(s.holds_value(b"x0123456789abcdefx"));
        assert!(!s.holds_value(b"abcdef nodeward-secret:bootstrap-token.secret"));
    }

    #[test]
    fn every_string_the_redactor_knows_is_masked() {
        let c = config();
        let s = Secrets::from_config(&c);
        let known: Vec<String> = c.secrets();
        assert_eq!(
            known.len(),
            2,
            "the token and its secret half: {}",
            known.len()
        );
        for secret in &known {
            let masked = s.mask(format!("<{secret}>").into_bytes());
            assert!(!s.holds_value(&masked), "masked whole");
            assert!(s.holds_value(secret.as_bytes()));
        }
        let values: Vec<&str> = s.pairs().map(|(_, v)| v).collect();
        assert_eq!(values.len(), known.len());
        assert!(values.iter().all(|v| known.iter().any(|k| k == v)));
    }
}
