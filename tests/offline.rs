//! Air-gapped installs (`host/offline/`): `nodeward offline pack` against the tests' HTTP
//! server on 127.0.0.1, then `nodeward apply --phase setup-host --phase download-artifacts
//! --offline FILE` inside a network namespace of its own (`unshare --net`: only a loopback
//! that is down, no route anywhere), where the artifact server cannot be reached. The
//! refusals: artifact bytes that are not the config's pin, a pin the archive lacks (refused at
//! the download, no request), a tampered `offline.json` under a signature, an untrusted key,
//! links, `..`, oversized and unexpected members, a truncated archive.
//!
//! Needs root for `unshare --net` (the whole suite runs as root); the test says so otherwise.

mod common;

use common::http::{HttpServer, Reply};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex, MutexGuard};

/// One at a time: the runs share a compiled-components state directory.
fn one_at_a_time() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn state_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("offline-state")
}

fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = fastrand::Rng::with_seed(seed);
    (0..len).map(|_| rng.u8(..)).collect()
}

fn tarball(top: &str, files: &[(&str, Vec<u8>)]) -> Vec<u8> {
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let mut b = tar::Builder::new(gz);
    for (name, body) in files {
        let mut h = tar::Header::new_gnu();
        h.set_size(body.len() as u64);
        h.set_mode(0o755);
        h.set_mtime(0);
        h.set_cksum();
        b.append_data(&mut h, format!("{top}{name}"), &body[..])
            .expect("append");
    }
    b.into_inner().expect("tar").finish().expect("gz")
}

/// The four artifacts on an HTTP server that can swap a path's bytes, and configs pinning them.
struct Artifacts {
    server: HttpServer,
    files: Arc<Mutex<BTreeMap<String, Vec<u8>>>>,
}

impl Artifacts {
    fn serve() -> Artifacts {
        let files: BTreeMap<String, Vec<u8>> = [
            ("/kubelet".to_string(), noise(1, 1 << 20)),
            (
                "/containerd.tar.gz".to_string(),
                tarball(
                    "bin/",
                    &[
                        ("containerd", noise(2, 4096)),
                        ("containerd-shim-runc-v2", noise(3, 4096)),
                        ("ctr", noise(4, 4096)),
                    ],
                ),
            ),
            ("/runc".to_string(), noise(5, 4096)),
            (
                "/cni-plugins.tgz".to_string(),
                tarball(
                    "./",
                    &[("bridge", noise(6, 8192)), ("loopback", noise(7, 4096))],
                ),
            ),
            ("/kubelet-2".to_string(), noise(8, 1 << 20)),
        ]
        .into_iter()
        .collect();
        let files = Arc::new(Mutex::new(files));
        let server = {
            let files = files.clone();
            HttpServer::start(move |req| {
                match files
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get(req.path())
                {
                    Some(body) => Reply::ok(body),
                    None => Reply::not_found(),
                }
            })
        };
        Artifacts { server, files }
    }

    /// The example config with the four artifacts pinned, the kubelet served at `kubelet`.
    fn config(&self, kubelet: &str) -> String {
        let mut config = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/host/default-config.yaml"
        ))
        .expect("example config");
        config.push_str("downloads:\n");
        let files = self.files.lock().unwrap_or_else(|e| e.into_inner());
        for (name, path) in [
            ("kubelet", kubelet),
            ("containerd", "/containerd.tar.gz"),
            ("runc", "/runc"),
            ("cni-plugins", "/cni-plugins.tgz"),
        ] {
            config.push_str(&format!(
                "  {name}:\n    url: {}\n    sha256: {}\n",
                self.server.url(path),
                nodeward::bundle::sha256_hex(&files[path])
            ));
        }
        config
    }

    fn sha256(&self, path: &str) -> String {
        nodeward::bundle::sha256_hex(&self.files.lock().unwrap_or_else(|e| e.into_inner())[path])
    }

    fn requests(&self) -> usize {
        self.server.requests().len()
    }
}

/// A temporary directory with a host root, configs, archives and keys.
struct Host {
    tmp: tempfile::TempDir,
    root: PathBuf,
}

impl Host {
    fn new() -> Host {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path().join("root");
        std::fs::create_dir_all(&root).expect("root");
        let root = root.canonicalize().expect("canonical root");
        Host { tmp, root }
    }

    fn file(&self, name: &str, contents: &str) -> PathBuf {
        let p = self.tmp.path().join(name);
        std::fs::write(&p, contents).expect("write");
        p
    }

    fn path(&self, name: &str) -> PathBuf {
        self.tmp.path().join(name)
    }

    /// `nodeward ARGS --root ROOT --state-dir STATE`.
    fn nodeward(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_nodeward"));
        c.args(args)
            .arg("--root")
            .arg(&self.root)
            .arg("--state-dir")
            .arg(state_dir())
            .env_remove("NODEWARD_LOG");
        c
    }

    /// `apply --phase setup-host --phase download-artifacts --offline ARCHIVE`, in a network
    /// namespace of its own when `no_network`.
    fn apply_offline(&self, config: &Path, archive: &Path, no_network: bool) -> Output {
        let mut inner = self.nodeward(&[
            "apply",
            "--phase",
            "setup-host",
            "--phase",
            "download-artifacts",
            "--output",
            "json",
        ]);
        inner
            .arg("--config")
            .arg(config)
            .arg("--offline")
            .arg(archive);
        if !no_network {
            return inner.output().expect("nodeward runs");
        }
        let mut c = Command::new("unshare");
        c.arg("--net").arg("--").arg(inner.get_program());
        c.args(inner.get_args()).env_remove("NODEWARD_LOG");
        c.output().expect("unshare runs")
    }

    fn cache_entries(&self) -> Vec<String> {
        let dir = self.root.join("var/lib/nodeward/artifacts/sha256");
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| !n.starts_with('.'))
            .collect();
        v.sort();
        v
    }
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[track_caller]
fn refused(out: &Output, needles: &[&str]) {
    assert!(!out.status.success(), "accepted: {}", stderr(out));
    let err = stderr(out);
    for n in needles {
        assert!(err.contains(n), "{n:?} not in: {err}");
    }
}

/// Packs `config` on a fresh root of its own (a connected machine's); the archive's path.
fn pack(host: &Host, config: &Path, name: &str, extra: &[&str]) -> PathBuf {
    let packer = Host::new();
    let out = host.path(name);
    let mut args = vec!["offline", "pack", "--output", "json"];
    args.extend_from_slice(extra);
    let o = packer
        .nodeward(&args)
        .arg("--config")
        .arg(config)
        .arg("-o")
        .arg(&out)
        .output()
        .expect("pack runs");
    assert!(o.status.success(), "pack failed: {}", stderr(&o));
    let json: serde_json::Value = serde_json::from_slice(&o.stdout).expect("pack json");
    let schema: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/docs/schemas/offline-pack.schema.json"
        ))
        .expect("schema"),
    )
    .expect("schema json");
    let errors: Vec<String> = jsonschema::validator_for(&schema)
        .expect("schema")
        .iter_errors(&json)
        .map(|e| format!("{e} at {}", e.instance_path()))
        .collect();
    assert!(errors.is_empty(), "{errors:#?}\n{json:#}");
    assert_eq!(
        json["manifest"]["artifacts"].as_array().map(Vec::len),
        Some(4)
    );
    out
}

/// The members of a tar: (name, bytes).
fn members(archive: &Path) -> Vec<(String, Vec<u8>)> {
    let mut a = tar::Archive::new(std::fs::File::open(archive).expect("open"));
    a.entries()
        .expect("entries")
        .map(|e| {
            let mut e = e.expect("entry");
            let name = String::from_utf8(e.path_bytes().into_owned()).expect("utf8");
            let mut bytes = Vec::new();
            std::io::Read::read_to_end(&mut e, &mut bytes).expect("read");
            (name, bytes)
        })
        .collect()
}

/// Writes `members` as a tar at `path`; a name is written raw (so `..` is possible) and an
/// entry may be a symlink (`Some(target)`).
fn write_tar(path: &Path, members: &[(String, Vec<u8>, Option<&str>)]) {
    let mut b = tar::Builder::new(std::fs::File::create(path).expect("create"));
    for (name, bytes, link) in members {
        let mut h = tar::Header::new_ustar();
        h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
        h.set_mode(0o644);
        match link {
            Some(target) => {
                h.set_entry_type(tar::EntryType::Symlink);
                h.set_link_name(target).expect("link name");
                h.set_size(0);
                h.set_cksum();
                b.append(&h, std::io::empty()).expect("append");
            }
            None => {
                h.set_size(bytes.len() as u64);
                h.set_cksum();
                b.append(&h, &bytes[..]).expect("append");
            }
        }
    }
    b.finish().expect("finish");
}

fn plain(m: Vec<(String, Vec<u8>)>) -> Vec<(String, Vec<u8>, Option<&'static str>)> {
    m.into_iter().map(|(n, b)| (n, b, None)).collect()
}

#[test]
fn an_offline_apply_needs_no_network_and_refuses_what_the_archive_lacks() {
    let _one = one_at_a_time();
    assert!(
        Command::new("unshare")
            .args(["--net", "true"])
            .status()
            .is_ok_and(|s| s.success()),
        "`unshare --net` must work (run as root)"
    );
    let artifacts = Artifacts::serve();
    let host = Host::new();
    let config = host.file("node.yaml", &artifacts.config("/kubelet"));
    let archive = pack(&host, &config, "node-offline.tar", &[]);
    assert_eq!(
        artifacts.requests(),
        4,
        "pack downloaded each artifact once"
    );

    // The namespace really has no network: without --offline the same apply cannot download.
    let mut inner = host.nodeward(&[
        "apply",
        "--phase",
        "setup-host",
        "--phase",
        "download-artifacts",
    ]);
    inner.arg("--config").arg(&config);
    let o = Command::new("unshare")
        .arg("--net")
        .arg("--")
        .arg(inner.get_program())
        .args(inner.get_args())
        .output()
        .expect("unshare");
    refused(&o, &["download"]);
    assert!(!stderr(&o).contains("offline archive"), "{}", stderr(&o));
    assert_eq!(artifacts.requests(), 4, "no request left the namespace");

    let o = host.apply_offline(&config, &archive, true);
    assert!(o.status.success(), "offline apply failed: {}", stderr(&o));
    let json: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert!(json["error"].is_null(), "{json}");
    assert_eq!(artifacts.requests(), 4, "the offline apply sent no request");
    let mut pins: Vec<String> = [
        "/kubelet",
        "/containerd.tar.gz",
        "/runc",
        "/cni-plugins.tgz",
    ]
    .iter()
    .map(|p| artifacts.sha256(p))
    .collect();
    pins.sort();
    assert_eq!(host.cache_entries(), pins);
    let kubelets: Vec<PathBuf> = walk(&host.root)
        .into_iter()
        .filter(|p| p.ends_with("bin/kubelet"))
        .collect();
    assert!(!kubelets.is_empty(), "the kubelet was installed");
    for k in kubelets {
        assert_eq!(
            nodeward::bundle::sha256_hex(&std::fs::read(&k).expect("kubelet")),
            artifacts.sha256("/kubelet")
        );
    }

    // A config that pins a kubelet the archive does not carry: refused at the download,
    // naming it and the archive, with no request (even on a host with network).
    let other = Host::new();
    let config2 = other.file("node.yaml", &artifacts.config("/kubelet-2"));
    let o = other.apply_offline(&config2, &archive, false);
    refused(
        &o,
        &[
            &artifacts.server.url("/kubelet-2"),
            "not in the offline archive",
            &archive.display().to_string(),
        ],
    );
    assert_eq!(artifacts.requests(), 4, "a miss sends no request");
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[test]
fn bytes_that_are_not_the_configs_pin_are_refused_naming_the_artifact() {
    let _one = one_at_a_time();
    let artifacts = Artifacts::serve();
    let host = Host::new();
    let config = host.file("node.yaml", &artifacts.config("/kubelet"));
    let archive = pack(&host, &config, "a.tar", &[]);
    let kubelet = artifacts.sha256("/kubelet");
    let mut m = members(&archive);
    for (name, bytes) in &mut m {
        if name.ends_with(&kubelet) {
            bytes[100] ^= 0xff;
        }
    }
    let bad = host.path("bad.tar");
    write_tar(&bad, &plain(m));
    let o = host.apply_offline(&config, &bad, false);
    refused(&o, &["artifact kubelet", &format!("config pins {kubelet}")]);
    assert!(!host.cache_entries().contains(&kubelet), "nothing cached");
    assert_eq!(artifacts.requests(), 4);
}

#[test]
fn a_signed_archive_is_verified_against_the_trusted_keys() {
    let _one = one_at_a_time();
    let artifacts = Artifacts::serve();
    let host = Host::new();
    let config = host.file("node.yaml", &artifacts.config("/kubelet"));
    let kp = minisign::KeyPair::generate_unencrypted_keypair().expect("keypair");
    let key = host.file("k.key", &kp.sk.to_box(None).expect("sk").to_string());
    let keys = host.root.join("etc/nodeward/trusted-keys");
    std::fs::create_dir_all(&keys).expect("keys dir");
    let archive = pack(
        &host,
        &config,
        "signed.tar",
        &["--key", key.to_str().expect("utf8")],
    );
    let m = members(&archive);
    assert_eq!(m[1].0, "offline.json.sig");

    // No trusted key on the host: a signature that cannot be checked refuses the archive.
    let o = host.apply_offline(&config, &archive, false);
    refused(&o, &["offline.json.sig", "no trusted keys"]);

    use std::os::unix::fs::PermissionsExt;
    let public = keys.join("packer.pub");
    std::fs::write(&public, kp.pk.to_box().expect("pk").to_string()).expect("pub");
    std::fs::set_permissions(&public, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let o = host.apply_offline(&config, &archive, true);
    assert!(o.status.success(), "signed archive refused: {}", stderr(&o));

    // offline.json changed after signing.
    let mut t = m.clone();
    t[0].1 = String::from_utf8(t[0].1.clone())
        .expect("json")
        .replacen("\"arch\"", "\"arch\" ", 1)
        .into_bytes();
    let tampered = host.path("tampered.tar");
    write_tar(&tampered, &plain(t));
    let o = host.apply_offline(&config, &tampered, false);
    refused(
        &o,
        &[
            "offline.json.sig does not verify",
            "offline.json was changed",
        ],
    );
    assert_eq!(artifacts.requests(), 4);
}

#[test]
fn hostile_and_broken_archives_are_refused_before_anything_runs() {
    let _one = one_at_a_time();
    let artifacts = Artifacts::serve();
    let host = Host::new();
    let config = host.file("node.yaml", &artifacts.config("/kubelet"));
    let archive = pack(&host, &config, "a.tar", &[]);
    let m = members(&archive);
    let case = |name: &str, members: Vec<(String, Vec<u8>, Option<&str>)>, needles: &[&str]| {
        let p = host.path(name);
        write_tar(&p, &members);
        let o = host.apply_offline(&config, &p, false);
        refused(&o, needles);
        assert!(
            !stderr(&o).contains("phase setup-host"),
            "{name}: a phase ran: {}",
            stderr(&o)
        );
    };
    let mut with_link = plain(m.clone());
    with_link.insert(1, ("artifacts/x".into(), Vec::new(), Some("/etc/passwd")));
    case(
        "link.tar",
        with_link,
        &["artifacts/x", "not a regular file (Symlink)"],
    );
    let mut dotdot = plain(m.clone());
    dotdot.push(("artifacts/../../etc/x".into(), b"x".to_vec(), None));
    case(
        "dotdot.tar",
        dotdot,
        &["unexpected member", "artifacts/../../etc/x"],
    );
    let mut first = plain(m.clone());
    first.swap(0, 1);
    case("order.tar", first, &["not offline.json"]);
    let mut huge = plain(m.clone());
    huge[0].1 = vec![b' '; (1 << 20) + 1];
    case(
        "huge.tar",
        huge,
        &["offline.json: 1048577 bytes, over its cap"],
    );
    let mut twice = plain(m.clone());
    twice.push(twice[1].clone());
    case("twice.tar", twice, &["appears twice"]);

    // Truncated: cut inside the last member, and at a member boundary (members missing).
    let bytes = std::fs::read(&archive).expect("archive");
    let cut = host.path("cut.tar");
    std::fs::write(&cut, &bytes[..bytes.len() - 3000]).expect("cut");
    let o = host.apply_offline(&config, &cut, false);
    refused(&o, &["offline archive", "cut.tar"]);
    let mut short = plain(m.clone());
    short.pop();
    case(
        "short.tar",
        short,
        &["that the archive does not hold (truncated?)"],
    );
    let o = host.apply_offline(&config, &host.file("empty.tar", ""), false);
    refused(&o, &["empty: it has no offline.json"]);
    assert_eq!(artifacts.requests(), 4, "no refusal sent a request");
}

#[test]
fn an_unsigned_bundle_other_than_the_one_that_runs_is_refused_for_an_apply() {
    let _one = one_at_a_time();
    let artifacts = Artifacts::serve();
    let host = Host::new();
    let config = host.file("node.yaml", &artifacts.config("/kubelet"));
    let archive = pack(&host, &config, "a.tar", &[]);
    let mut m = members(&archive);
    // Another bundle: the embedded one with its version raised (so another digest), unsigned.
    let bundle_at = m
        .iter()
        .position(|(n, _)| n == "bundle.tar")
        .expect("bundle");
    let inner = host.path("inner.tar");
    std::fs::write(&inner, &m[bundle_at].1).expect("inner");
    let mut files = members(&inner);
    let manifest = String::from_utf8(files[0].1.clone()).expect("manifest");
    assert_eq!(files[0].0, "manifest.toml");
    let line = manifest
        .lines()
        .find(|l| l.starts_with("version = "))
        .expect("version line")
        .to_string();
    let raised = format!(
        "version = {}",
        line["version = ".len()..].parse::<u64>().expect("version") + 1
    );
    files[0].1 = manifest.replacen(&line, &raised, 1).into_bytes();
    let digest = nodeward::bundle::sha256_hex(&files[0].1);
    write_tar(&inner, &plain(files));
    let bytes = std::fs::read(&inner).expect("inner");
    let mut json: serde_json::Value = serde_json::from_slice(&m[0].1).expect("offline.json");
    json["bundle"]["sha256"] = nodeward::bundle::sha256_hex(&bytes).into();
    json["bundle"]["size"] = bytes.len().into();
    json["bundle"]["digest"] = digest.into();
    m[0].1 = serde_json::to_vec_pretty(&json).expect("json");
    m[bundle_at].1 = bytes;
    let other = host.path("other-bundle.tar");
    write_tar(&other, &plain(m));
    let o = host.apply_offline(&config, &other, false);
    refused(
        &o,
        &["bundle.tar", "unsigned; apply runs only signed bundles"],
    );
    assert!(!stderr(&o).contains("phase setup-host"), "{}", stderr(&o));
}
