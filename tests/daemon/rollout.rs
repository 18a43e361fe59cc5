//! Signed phase bundles for the daemon's roll-out: the embedded bundle exported, tweaked (a
//! version, a grant), packed into an archive and signed with a key the node trusts, then served
//! by the test's artifact server.

use crate::node::{ArtifactServer, NodeRoot};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// A platform team's signing key, trusted by the node under test.
pub struct Publisher {
    dir: PathBuf,
    secret: PathBuf,
    public: PathBuf,
}

/// A published bundle: where it is served, its archive's sha256, its manifest digest.
pub struct Published {
    pub url: String,
    pub sha256: String,
    pub digest: String,
}

impl Publisher {
    /// A fresh key pair in `dir`, its public key installed as trusted beneath `root`'s root
    /// (`etc/nodeward/trusted-keys`, which the daemon's children read by default).
    pub fn new(root: &NodeRoot, dir: &Path) -> Publisher {
        let kp = minisign::KeyPair::generate_unencrypted_keypair().expect("keypair");
        let dir = dir.join("publisher");
        std::fs::create_dir_all(&dir).expect("publisher dir");
        let public = dir.join("platform.pub");
        let secret = dir.join("platform.key");
        std::fs::write(&public, kp.pk.to_box().expect("pk").to_string()).expect("pub");
        std::fs::write(&secret, kp.sk.to_box(None).expect("sk").to_string()).expect("key");
        let trusted = root.root.join("etc/nodeward/trusted-keys");
        std::fs::create_dir_all(&trusted).expect("trusted keys dir");
        std::fs::copy(&public, trusted.join("platform.pub")).expect("trust the key");
        use std::os::unix::fs::PermissionsExt;
        for f in [&public, &trusted.join("platform.pub")] {
            std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        }
        Publisher {
            dir,
            secret,
            public,
        }
    }

    /// The embedded bundle as version `version` with `tweak` applied to its manifest, packed,
    /// signed and served as `name`.
    pub fn publish(
        &self,
        root: &NodeRoot,
        server: &ArtifactServer,
        name: &str,
        version: i64,
        tweak: impl FnOnce(&mut toml::Table),
    ) -> Published {
        let src = self.dir.join(format!("{name}-src"));
        run(root, &["phases", "export", s(&src)]);
        let manifest = src.join("manifest.toml");
        let mut t: toml::Table = std::fs::read_to_string(&manifest)
            .expect("exported manifest")
            .parse()
            .expect("manifest TOML");
        t["bundle"]
            .as_table_mut()
            .expect("[bundle]")
            .insert("version".into(), toml::Value::Integer(version));
        tweak(&mut t);
        std::fs::write(&manifest, toml::to_string(&t).expect("manifest")).expect("write");
        let archive = self.dir.join(format!("{name}.tar.gz"));
        run(root, &["phases", "pack", s(&src), "-o", s(&archive)]);
        run(
            root,
            &["phases", "sign", s(&archive), "--key", s(&self.secret)],
        );
        let verified = run(
            root,
            &[
                "phases",
                "verify",
                s(&archive),
                "--trusted-key",
                s(&self.public),
                "--output",
                "json",
            ],
        );
        let digest = verified["bundle"]["digest"]
            .as_str()
            .expect("digest")
            .to_string();
        let (url, sha256) = server.serve_file(&format!("{name}.tar.gz"), &archive);
        Published {
            url,
            sha256,
            digest,
        }
    }
}

/// The `[[phases]]` table named `name`.
pub fn phase<'a>(t: &'a mut toml::Table, name: &str) -> &'a mut toml::Table {
    t["phases"]
        .as_array_mut()
        .expect("phases")
        .iter_mut()
        .filter_map(toml::Value::as_table_mut)
        .find(|p| p.get("name").and_then(toml::Value::as_str) == Some(name))
        .expect("the phase")
}

/// `nodeward ARGS` with the node's flags; its JSON output when it printed any.
fn run(root: &NodeRoot, args: &[&str]) -> Value {
    let out = root.nodeward(args);
    assert!(
        out.status.success(),
        "nodeward {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}
