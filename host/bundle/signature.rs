//! Bundle signatures: a detached minisign signature over `manifest.toml`.
//!
//! # Background
//! The manifest pins every component's sha256, so a signature over the manifest's bytes signs
//! the whole bundle. minisign was chosen because it is a standard, small format that platform
//! teams can produce with the stock `minisign` tool (`minisign -S -t '…' -m manifest.toml`
//! writes exactly the `manifest.toml.minisig` this module checks), verifiers exist in many
//! languages, and it has no PKI or network dependency: a node trusts a short list of public
//! keys, and rotating a key means adding the new `.pub`, re-signing, then removing the old one.
//!
//! # The signature format's own version
//! wasmCloud's older signatures were silently ignored after a format change; here the format
//! is explicit and authenticated: minisign's *trusted comment* (covered by the signature) must
//! read `nodeward-bundle-signature v1 <bundle name> <bundle version>`. A comment that does not
//! start with `nodeward-bundle-signature` (for example minisign's default `timestamp:…`), or one
//! with any version other than `v1`, is refused; the name and version must be the manifest's.
//!
//! # Guarantees
//! - Fail closed: no signature, a malformed one, one by a key that is not trusted, one that
//!   does not match the manifest bytes, a legacy (non-prehashed) one, or one of an unknown
//!   format version is an error; there is no "warn and continue" path here.
//! - No trusted keys configured means nothing verifies.

use std::path::{Path, PathBuf};

/// The signature's file name, next to `manifest.toml`.
pub const SIGNATURE_FILE: &str = "manifest.toml.minisig";
/// The first word of the trusted comment.
pub const COMMENT_TAG: &str = "nodeward-bundle-signature";
/// The only signature format version this agent reads.
pub const SIGNATURE_VERSION: &str = "v1";
/// Where trusted public keys (`*.pub`, minisign format) are read from by default, beneath the
/// host root.
pub const TRUSTED_KEYS_DIR: &str = "etc/nodeward/trusted-keys";

/// The trusted comment a v1 signature of bundle `name` version `version` carries.
pub fn trusted_comment(name: &str, version: u64) -> String {
    format!("{COMMENT_TAG} {SIGNATURE_VERSION} {name} {version}")
}

/// The trusted keys could not be loaded; names the file or directory.
#[derive(Debug, thiserror::Error)]
pub enum KeysError {
    /// The keys directory exists but cannot be opened.
    #[error("trusted keys directory {}: {source}", dir.display())]
    OpenDir {
        /// The directory.
        dir: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The keys directory cannot be listed.
    #[error("{}: {source}", dir.display())]
    ListDir {
        /// The directory.
        dir: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A key file cannot be read.
    #[error("trusted key {}: {source}", file.display())]
    Read {
        /// The key file.
        file: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A key file is not a minisign public key.
    #[error("trusted key {}: not a minisign public key: {source}", file.display())]
    NotAKey {
        /// The key file.
        file: PathBuf,
        /// What the decoder said.
        source: minisign_verify::Error,
    },
    /// A key file's key ID cannot be read.
    #[error("trusted key {}: cannot read its key ID", file.display())]
    NoKeyId {
        /// The key file.
        file: PathBuf,
    },
    /// A key file, or the keys directory, could be changed by someone other than root (or
    /// this agent's user): whoever can write it could make the agent trust their bundles.
    #[error("{what} {}: {problem}; refusing to trust it (chown root and chmod go-w)", path.display())]
    Unsafe {
        /// "trusted key" or "trusted keys directory".
        what: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// Its owner or mode, and why that is refused.
        problem: String,
    },
}

/// Refuses `path` unless root (or this process's effective user) owns it and neither its
/// group nor others may write it.
fn check_owner_and_mode(what: &'static str, path: &Path) -> Result<(), KeysError> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).map_err(|source| KeysError::Read {
        file: path.to_path_buf(),
        source,
    })?;
    let uid = rustix::process::geteuid().as_raw();
    let problem = if meta.uid() != 0 && meta.uid() != uid {
        format!(
            "owned by uid {}, not by root (or uid {uid}, this agent)",
            meta.uid()
        )
    } else if meta.mode() & 0o022 != 0 {
        format!(
            "mode {:04o} lets its group or others write it",
            meta.mode() & 0o7777
        )
    } else {
        return Ok(());
    };
    Err(KeysError::Unsafe {
        what,
        path: path.to_path_buf(),
        problem,
    })
}

/// One trusted public key.
pub struct TrustedKey {
    /// The file it was read from.
    pub file: PathBuf,
    /// Its minisign key ID, as `minisign` prints it (16 uppercase hex digits).
    pub key_id: String,
    key: minisign_verify::PublicKey,
}

/// The public keys whose signatures this agent accepts.
#[derive(Default)]
pub struct TrustedKeys {
    keys: Vec<TrustedKey>,
    /// Where they were looked for, for error messages.
    pub origin: String,
}

impl TrustedKeys {
    /// The keys in `files`, if any are given; otherwise every `*.pub` in `dir` (a missing
    /// directory means no keys). A file that is not a minisign public key is an error naming it,
    /// and so is a key file (or the directory) that someone other than root, or this agent's
    /// user, owns or may write.
    pub fn load(files: &[PathBuf], dir: &Path) -> Result<Self, KeysError> {
        let (paths, origin) = if files.is_empty() {
            let mut paths = Vec::new();
            match std::fs::read_dir(dir) {
                Ok(entries) => {
                    check_owner_and_mode("trusted keys directory", dir)?;
                    for e in entries {
                        let p = e
                            .map_err(|source| KeysError::ListDir {
                                dir: dir.to_path_buf(),
                                source,
                            })?
                            .path();
                        if p.extension().is_some_and(|x| x == "pub") {
                            paths.push(p);
                        }
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(source) => {
                    return Err(KeysError::OpenDir {
                        dir: dir.to_path_buf(),
                        source,
                    });
                }
            }
            paths.sort();
            (paths, format!("trusted keys directory {}", dir.display()))
        } else {
            (files.to_vec(), "--trusted-key".to_string())
        };
        let mut keys = Vec::new();
        for file in paths {
            check_owner_and_mode("trusted key", &file)?;
            let text = match std::fs::read_to_string(&file) {
                Ok(text) => text,
                Err(source) => return Err(KeysError::Read { file, source }),
            };
            let key = match minisign_verify::PublicKey::decode(&text) {
                Ok(key) => key,
                Err(source) => return Err(KeysError::NotAKey { file, source }),
            };
            let Some(key_id) = text.lines().nth(1).and_then(|b64| key_id_of(b64, 42)) else {
                return Err(KeysError::NoKeyId { file });
            };
            keys.push(TrustedKey { file, key_id, key });
        }
        Ok(TrustedKeys { keys, origin })
    }

    /// The keys, in load order.
    pub fn keys(&self) -> &[TrustedKey] {
        &self.keys
    }
}

/// The key ID in a minisign public key or signature line (`len` decoded bytes; the ID is
/// bytes 2..10, little-endian, printed as minisign prints it).
fn key_id_of(b64: &str, len: usize) -> Option<String> {
    use ct_codecs::{Base64, Decoder};
    let bytes = Base64::decode_to_vec(b64.trim(), None).ok()?;
    if bytes.len() != len {
        return None;
    }
    let id: [u8; 8] = bytes.get(2..10)?.try_into().ok()?;
    Some(format!("{:016X}", u64::from_le_bytes(id)))
}

/// The key ID of a minisign signature file's text (as `minisign` prints it), if it has one.
pub fn signature_key_id(text: &str) -> Option<String> {
    text.lines().nth(1).and_then(|b64| key_id_of(b64, 74))
}

/// What a valid signature says.
#[derive(Clone, Debug)]
pub struct Verified {
    /// The key ID that signed.
    pub key_id: String,
    /// The bundle name in the trusted comment.
    pub name: String,
    /// The bundle version in the trusted comment.
    pub version: u64,
}

/// Why a signature was refused.
#[derive(Debug, thiserror::Error)]
pub enum SignatureError {
    /// There is no signature.
    #[error(
        "unsigned: there is no {SIGNATURE_FILE} (sign it with `nodeward phases sign` or `minisign`)"
    )]
    Unsigned,
    /// The signature file is not text.
    #[error("{SIGNATURE_FILE} is not a minisign signature (not UTF-8)")]
    NotUtf8,
    /// The signature file is not a minisign signature.
    #[error("{SIGNATURE_FILE} is not a minisign signature: {0}")]
    Malformed(#[source] minisign_verify::Error),
    /// The signature's key ID cannot be read.
    #[error("{SIGNATURE_FILE}: cannot read its key ID")]
    NoKeyId,
    /// No key is trusted.
    #[error(
        "{SIGNATURE_FILE} is signed by key {key_id}, but no trusted keys are configured ({origin} holds no *.pub)"
    )]
    NoTrustedKeys {
        /// The signing key.
        key_id: String,
        /// Where keys were looked for.
        origin: String,
    },
    /// The signing key is not a trusted one.
    #[error(
        "{SIGNATURE_FILE} is signed by key {key_id}, which is not trusted (trusted: {trusted} from {origin})"
    )]
    Untrusted {
        /// The signing key.
        key_id: String,
        /// The trusted key IDs, comma-separated.
        trusted: String,
        /// Where they were loaded from.
        origin: String,
    },
    /// The signature does not verify over the manifest.
    #[error(
        "{SIGNATURE_FILE} does not verify with trusted key {key_id} ({}): {source}; {} was changed after signing, or the signature is for another manifest",
        file.display(),
        crate::bundle::MANIFEST_FILE
    )]
    Mismatch {
        /// The signing key.
        key_id: String,
        /// Its file.
        file: PathBuf,
        /// What the verifier said.
        source: minisign_verify::Error,
    },
    /// The trusted comment is not a nodeward signature's.
    #[error(
        "{SIGNATURE_FILE}: trusted comment {comment:?} is not a nodeward bundle signature (expected \"{COMMENT_TAG} {SIGNATURE_VERSION} <name> <version>\")"
    )]
    NotNodeward {
        /// The trusted comment.
        comment: String,
    },
    /// A signature format version this agent does not read.
    #[error(
        "{SIGNATURE_FILE}: signature format {version:?} is not supported (this agent reads {SIGNATURE_VERSION} only)"
    )]
    UnsupportedVersion {
        /// The version word.
        version: String,
    },
    /// The trusted comment does not have the v1 shape.
    #[error(
        "{SIGNATURE_FILE}: trusted comment {comment:?} must be \"{COMMENT_TAG} {SIGNATURE_VERSION} <name> <version>\""
    )]
    BadComment {
        /// The trusted comment.
        comment: String,
    },
    /// The bundle version in the trusted comment is not a number.
    #[error("{SIGNATURE_FILE}: trusted comment {comment:?}: version {version:?} is not a number")]
    BadVersion {
        /// The trusted comment.
        comment: String,
        /// The version word.
        version: String,
        /// What the parser said.
        source: std::num::ParseIntError,
    },
    /// The signature is for another bundle name or version than the manifest's.
    #[error(
        "{SIGNATURE_FILE} signs bundle {signed_name} version {signed_version}, but {} is {name} version {version}",
        crate::bundle::MANIFEST_FILE
    )]
    OtherBundle {
        /// The name the signature covers.
        signed_name: String,
        /// The version it covers.
        signed_version: u64,
        /// The manifest's name.
        name: String,
        /// The manifest's version.
        version: u64,
    },
}

/// Checks `signature` (the bytes of `manifest.toml.minisig`) over `manifest` against `keys`.
/// The caller must still check that the returned name and version are the manifest's.
pub fn verify(
    manifest: &[u8],
    signature: Option<&[u8]>,
    keys: &TrustedKeys,
) -> Result<Verified, SignatureError> {
    let signature = signature.ok_or(SignatureError::Unsigned)?;
    let (key_id, comment) = verify_detached(manifest, signature, keys)?;
    let mut words = comment.split(' ');
    if words.next() != Some(COMMENT_TAG) {
        return Err(SignatureError::NotNodeward { comment });
    }
    let version = words.next().unwrap_or_default();
    if version != SIGNATURE_VERSION {
        return Err(SignatureError::UnsupportedVersion {
            version: version.to_string(),
        });
    }
    let (Some(name), Some(bundle_version), None) = (words.next(), words.next(), words.next())
    else {
        return Err(SignatureError::BadComment {
            comment: comment.to_string(),
        });
    };
    let bundle_version = bundle_version
        .parse()
        .map_err(|source| SignatureError::BadVersion {
            comment: comment.to_string(),
            version: bundle_version.to_string(),
            source,
        })?;
    Ok(Verified {
        key_id,
        name: name.to_string(),
        version: bundle_version,
    })
}

/// Checks the minisign `signature` over `data` against `keys`, before anything reads `data`:
/// the key ID that signed and the trusted comment (which the signature covers), for the
/// caller to check. Shared by bundles ([`verify`]) and offline archives (`crate::offline`),
/// which bind their signatures with different comments.
pub fn verify_detached(
    data: &[u8],
    signature: &[u8],
    keys: &TrustedKeys,
) -> Result<(String, String), SignatureError> {
    let text = std::str::from_utf8(signature).map_err(|_| SignatureError::NotUtf8)?;
    let sig = minisign_verify::Signature::decode(text).map_err(SignatureError::Malformed)?;
    let key_id = text
        .lines()
        .nth(1)
        .and_then(|b64| key_id_of(b64, 74))
        .ok_or(SignatureError::NoKeyId)?;
    if keys.keys.is_empty() {
        return Err(SignatureError::NoTrustedKeys {
            key_id,
            origin: keys.origin.clone(),
        });
    }
    let Some(key) = keys.keys.iter().find(|k| k.key_id == key_id) else {
        return Err(SignatureError::Untrusted {
            key_id,
            trusted: keys
                .keys
                .iter()
                .map(|k| k.key_id.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            origin: keys.origin.clone(),
        });
    };
    if let Err(source) = key.key.verify(data, &sig, false) {
        return Err(SignatureError::Mismatch {
            key_id,
            file: key.file.clone(),
            source,
        });
    }
    Ok((key_id, sig.trusted_comment().to_string()))
}

/// Why a signature could not be made; names the key file.
#[derive(Debug, thiserror::Error)]
pub enum SignError {
    /// The key file cannot be read.
    #[error("signing key {}: {source}", file.display())]
    Read {
        /// The key file.
        file: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The key file holds a minisign public key.
    #[error(
        "signing key {}: this is a public key; sign with the secret key (minisign's .key file)",
        file.display()
    )]
    PublicKey {
        /// The key file.
        file: PathBuf,
    },
    /// The key file does not hold a minisign secret key.
    #[error("signing key {}: not a minisign secret key", file.display())]
    NotASecretKey {
        /// The key file.
        file: PathBuf,
    },
    /// The key is encrypted and there is no password and no terminal to ask on.
    #[error(
        "signing key {} is encrypted: pass --password-file FILE (or run on a terminal to be asked)",
        file.display()
    )]
    Encrypted {
        /// The key file.
        file: PathBuf,
    },
    /// minisign refused the key (a wrong password, a damaged key) or the signing.
    #[error("signing key {}: {source}", file.display())]
    Minisign {
        /// The key file.
        file: PathBuf,
        /// What minisign said.
        source: minisign::PError,
    },
}

/// Signs `manifest` (of bundle `name` version `version`) with the minisign secret key in
/// `key_file`; returns the contents of `manifest.toml.minisig`. An encrypted key needs
/// `password`, or a terminal to prompt on.
pub fn sign(
    manifest: &[u8],
    key_file: &Path,
    password: Option<String>,
    name: &str,
    version: u64,
) -> Result<String, SignError> {
    sign_detached(
        manifest,
        key_file,
        password,
        &trusted_comment(name, version),
        &format!("nodeward bundle {name} version {version}"),
    )
}

/// Signs `data` with the minisign secret key in `key_file`, the signature carrying
/// `trusted` (covered by it) and `untrusted` comments; returns the signature file's text.
/// Shared by bundles ([`sign`]) and offline archives (`crate::offline`).
pub fn sign_detached(
    data: &[u8],
    key_file: &Path,
    password: Option<String>,
    trusted: &str,
    untrusted: &str,
) -> Result<String, SignError> {
    use std::io::IsTerminal;
    let file = || key_file.to_path_buf();
    let text = std::fs::read_to_string(key_file).map_err(|source| SignError::Read {
        file: file(),
        source,
    })?;
    let bad = |source: minisign::PError| SignError::Minisign {
        file: file(),
        source,
    };
    if minisign_verify::PublicKey::decode(&text).is_ok() {
        return Err(SignError::PublicKey { file: file() });
    }
    use ct_codecs::{Base64, Decoder};
    let raw = text
        .lines()
        .nth(1)
        .and_then(|l| Base64::decode_to_vec(l.trim(), None).ok())
        .ok_or_else(|| SignError::NotASecretKey { file: file() })?;
    // Bytes 2..4 of a minisign secret key are its KDF algorithm; zero means not encrypted.
    // Unencrypted keys are read directly: `minisign -W` (C, 0.11) writes a checksum the Rust
    // crate does not accept; the signature is checked against the derived public key instead.
    let sk = if raw.get(2..4) == Some(&[0, 0][..]) {
        minisign::SecretKey::from_bytes(&raw).map_err(bad)?
    } else if password.is_some() || std::io::stdin().is_terminal() {
        let boxed = minisign::SecretKeyBox::from_string(&text).map_err(bad)?;
        minisign::SecretKey::from_box(boxed, password).map_err(bad)?
    } else {
        return Err(SignError::Encrypted { file: file() });
    };
    let pk = minisign::PublicKey::from_secret_key(&sk).map_err(bad)?;
    let sig = minisign::sign(Some(&pk), &sk, data, Some(trusted), Some(untrusted)).map_err(bad)?;
    Ok(sig.into_string())
}
