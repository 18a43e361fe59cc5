//! sha256 digests as nodeward writes them: lowercase hex.
//!
//! Bundles, components, artifacts, planned files and the applied config are all named by
//! their sha256; one function spells it so that every digest compares equal to every other.

use sha2::{Digest, Sha256};

/// sha256 of `bytes`, lowercase hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// A sha256 as a person or a resource gives one (`phases install --sha256`,
/// `--accept-grants-digest`, a Machine's `phaseBundle`): 64 lowercase hex digits, checked when
/// it is made ([`std::str::FromStr`]), so a malformed one is refused before anything runs and
/// never compares unequal by case.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Sha256Hex(String);

/// A string that is not 64 lowercase hex digits.
#[derive(Debug, thiserror::Error)]
#[error("{0:?} is not a sha256 (64 lowercase hex digits)")]
pub struct InvalidSha256(String);

impl std::str::FromStr for Sha256Hex {
    type Err = InvalidSha256;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if nodeward_node_config::is_sha256(s) {
            Ok(Sha256Hex(s.to_string()))
        } else {
            Err(InvalidSha256(s.chars().take(80).collect()))
        }
    }
}

impl Sha256Hex {
    /// The 64 hex digits.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Sha256Hex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod test_valid_sha256_hex {
    use super::*;

    #[test]
    fn only_64_lowercase_hex_digits_parse() {
        let good = sha256_hex(b"x");
        assert_eq!(good.parse::<Sha256Hex>().expect("valid").as_str(), good);
        for bad in [
            String::new(),
            good[1..].to_string(),
            format!("{good}0"),
            good.to_uppercase(),
            format!("{}g", &good[1..]),
            format!("sha256:{good}"),
        ] {
            let e = bad.parse::<Sha256Hex>().expect_err("invalid");
            assert!(e.to_string().contains("64 lowercase hex digits"), "{e}");
        }
    }
}
