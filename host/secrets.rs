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
//! - Plan mode never shows the value: the change records the substituted file's sha256 and
//!   size, and its diff is withheld (the file is 0600 and holds a secret, see `plan::file_diff`).
//!
//! # Caveats
//! The plan overlay holds the substituted bytes (host memory, never printed); a later planned
//! `fs.read-file` of that path goes through [`Secrets::mask`] like any read.

use nodeward_node_config::NodeConfig;

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
                    value,
                })
                .collect(),
        }
    }

    /// The names of the secrets whose reference occurs in `bytes`.
    pub fn referenced(&self, bytes: &[u8]) -> Vec<&'static str> {
        self.entries
            .iter()
            .filter(|e| find(bytes, e.reference.as_bytes()).is_some())
            .map(|e| e.name)
            .collect()
    }

    /// `bytes` with every reference replaced by its value.
    pub fn substitute(&self, bytes: &[u8]) -> Vec<u8> {
        self.entries.iter().fold(bytes.to_vec(), |b, e| {
            replace(&b, e.reference.as_bytes(), e.value.as_bytes())
        })
    }

    /// `bytes` with every value replaced by its reference: what a phase reads.
    pub fn mask(&self, bytes: Vec<u8>) -> Vec<u8> {
        self.entries.iter().fold(bytes, |b, e| {
            if find(&b, e.value.as_bytes()).is_some() {
                replace(&b, e.value.as_bytes(), e.reference.as_bytes())
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

    fn secrets() -> Secrets {
        Secrets {
            entries: vec![Entry {
                name: "bootstrap-token",
                reference: "nodeward-secret:bootstrap-token",
                value: "abcdef.0123456789abcdef".into(),
            }],
        }
    }

    #[test]
    fn substitutes_and_masks_every_occurrence() {
        let s = secrets();
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
}
