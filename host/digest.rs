//! sha256 digests as nodeward writes them: lowercase hex.
//!
//! Bundles, components, artifacts, planned files and the applied config are all named by
//! their sha256; one function spells it so that every digest compares equal to every other.

use sha2::{Digest, Sha256};

/// sha256 of `bytes`, lowercase hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}
