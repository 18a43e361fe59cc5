//! Crash safety of the agent's durable writes (`host/durable/`), without the systemd harness:
//! `nodeward apply --phase setup-host --phase download-artifacts` against a temporary root and
//! the tests' HTTP server, killed mid-download (SIGKILL while the server stalls a body) or
//! aborted right after a temp file got its name (the `test-hooks` points
//! `<purpose>:after-temp-write`), then run again: the tree must equal an uninterrupted run's,
//! with no `.nodeward-tmp.` entry anywhere beneath the root and no partial file in the artifact
//! cache. A node state write aborted mid-way is tested on the library (`NodeState`), since
//! every command that writes node state needs systemd; the whole bootstrap is in
//! `tests/none_stub.rs`. The download progress lines are tested here too, on a stalled body.

mod common;

use common::http::{HttpServer, Reply};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Where the stalled body pauses: well inside each stalled artifact.
const STALL_AT: u64 = 1 << 20;

/// The tests share one state directory (compiled components) and run one at a time: a run
/// sweeps the compiled cache, which a concurrent run of another root might be writing.
fn one_at_a_time() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn state_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("durable-state")
}

/// `len` bytes that do not compress, the same every run.
fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = fastrand::Rng::with_seed(seed);
    (0..len).map(|_| rng.u8(..)).collect()
}

/// A tar.gz of `files` (mode 0755) under `top`.
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

/// The four pinned artifacts on the tests' HTTP server, with a switch that makes one of them
/// stall after [`STALL_AT`] bytes, and the node config that pins them.
struct Artifacts {
    server: HttpServer,
    /// The paths that stall mid-body and for how long.
    stall: Arc<Mutex<(Vec<String>, Duration)>>,
    config: String,
}

impl Artifacts {
    fn serve() -> Artifacts {
        let files: BTreeMap<String, Vec<u8>> = [
            ("/kubelet".to_string(), noise(1, 2 << 20)),
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
                    &[("bridge", noise(6, 2 << 20)), ("loopback", noise(7, 4096))],
                ),
            ),
        ]
        .into_iter()
        .collect();
        let stall: Arc<Mutex<(Vec<String>, Duration)>> = Arc::default();
        let server = {
            let (files, stall) = (files.clone(), stall.clone());
            HttpServer::start(move |req| match files.get(req.path()) {
                Some(body) => {
                    let (paths, pause) = stall.lock().unwrap_or_else(|e| e.into_inner()).clone();
                    Reply {
                        stall: paths
                            .iter()
                            .any(|path| path == req.path())
                            .then_some((STALL_AT, pause)),
                        ..Reply::ok(body)
                    }
                }
                None => Reply::not_found(),
            })
        };
        let mut config = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/host/default-config.yaml"
        ))
        .expect("example config");
        config.push_str("downloads:\n");
        for (name, path) in [
            ("kubelet", "/kubelet"),
            ("containerd", "/containerd.tar.gz"),
            ("runc", "/runc"),
            ("cni-plugins", "/cni-plugins.tgz"),
        ] {
            config.push_str(&format!(
                "  {name}:\n    url: {}\n    sha256: {}\n",
                server.url(path),
                nodeward::bundle::sha256_hex(&files[path])
            ));
        }
        Artifacts {
            server,
            stall,
            config,
        }
    }

    /// From now on each of `paths` stalls mid-body for five minutes, and nothing else does
    /// (none: nothing stalls).
    fn stall_all(&self, paths: &[&str]) {
        *self.stall.lock().unwrap_or_else(|e| e.into_inner()) = (
            paths.iter().map(|p| p.to_string()).collect(),
            Duration::from_secs(300),
        );
    }

    /// From now on `path` stalls mid-body for `pause`.
    fn stall_for(&self, path: Option<&str>, pause: Duration) {
        *self.stall.lock().unwrap_or_else(|e| e.into_inner()) =
            (path.map(|p| p.to_string()).into_iter().collect(), pause);
    }
}

/// A temporary host root and the config file `apply` reads.
struct Host {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    config: PathBuf,
}

impl Host {
    fn new(artifacts: &Artifacts) -> Host {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path().join("root");
        std::fs::create_dir_all(&root).expect("root");
        let root = root.canonicalize().expect("canonical root");
        let config = tmp.path().join("node.yaml");
        std::fs::write(&config, &artifacts.config).expect("config");
        Host {
            _tmp: tmp,
            root,
            config,
        }
    }

    /// `nodeward apply --phase setup-host --phase download-artifacts` on this root.
    fn apply(&self) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_nodeward"));
        c.args([
            "apply",
            "--phase",
            "setup-host",
            "--phase",
            "download-artifacts",
            "--output",
            "json",
        ])
        .arg("--root")
        .arg(&self.root)
        .arg("--state-dir")
        .arg(state_dir())
        .arg("--config")
        .arg(&self.config)
        .env_remove("NODEWARD_LOG")
        .env_remove("NODEWARD_TEST_ABORT");
        c
    }

    #[track_caller]
    fn apply_ok(&self) {
        let out = self.apply().output().expect("nodeward runs");
        assert!(out.status.success(), "apply failed: {}", stderr(&out));
    }

    /// The tree beneath the root, without the node lock (`run/`, which names its last holder)
    /// and the audit trail (`var/log/nodeward`, which records each run, interrupted ones too).
    fn tree(&self) -> BTreeMap<String, (char, u32, Vec<u8>)> {
        let mut tree = common::snapshot(&self.root);
        tree.retain(|p, _| {
            p != "run" && !p.starts_with("run/") && !p.starts_with("var/log/nodeward")
        });
        tree
    }

    /// Every path beneath the root with an entry of the temp-name scheme in it.
    fn temp_entries(&self) -> Vec<String> {
        common::snapshot(&self.root)
            .into_keys()
            .filter(|p| p.split('/').any(nodeward::durable::is_temp_name))
            .collect()
    }
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The tree of an uninterrupted apply on a fresh root (which also fills the compiled cache).
fn reference(artifacts: &Artifacts) -> BTreeMap<String, (char, u32, Vec<u8>)> {
    let host = Host::new(artifacts);
    host.apply_ok();
    assert!(host.temp_entries().is_empty(), "{:?}", host.temp_entries());
    let tree = host.tree();
    assert!(
        tree.keys()
            .any(|p| p.starts_with("var/lib/nodeward/artifacts/sha256/")),
        "the reference run cached its tarballs: {:?}",
        tree.keys()
    );
    tree
}

/// Waits until process `pid` holds a file open beneath `root` in a directory whose path
/// contains `within`, with at least `bytes` in it: a body is being written there, part of it
/// already in. Returns that file's path as /proc names it.
fn wait_mid_body(pid: u32, root: &Path, within: &str, bytes: u64) -> String {
    let deadline = Instant::now() + Duration::from_secs(120);
    let root = root.display().to_string();
    loop {
        let fds = PathBuf::from(format!("/proc/{pid}/fd"));
        for fd in std::fs::read_dir(&fds).into_iter().flatten().flatten() {
            let Ok(target) = std::fs::read_link(fd.path()) else {
                continue;
            };
            let target = target.display().to_string();
            if target.starts_with(&root)
                && target.contains(within)
                && std::fs::metadata(fd.path()).is_ok_and(|m| m.is_file() && m.len() >= bytes)
            {
                return target;
            }
        }
        assert!(
            Instant::now() < deadline,
            "nodeward (pid {pid}) never held a partial body in {root}/…{within}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_download_killed_mid_body_then_rerun_equals_an_uninterrupted_apply() {
    let _serial = one_at_a_time();
    let artifacts = Artifacts::serve();
    let want = reference(&artifacts);

    let host = Host::new(&artifacts);
    // A binary streaming into the version directory, then a tarball streaming into the
    // artifact cache: each killed mid-body. The tarball stalls in the first run too: a
    // phase's downloads run at once, and a tarball the first run finished would be cached
    // and never fetched by the second.
    for (stalled, into) in [
        (&["/kubelet", "/cni-plugins.tgz"][..], "/bin/"),
        (
            &["/cni-plugins.tgz"][..],
            "/var/lib/nodeward/artifacts/sha256/",
        ),
    ] {
        artifacts.stall_all(stalled);
        let mut child = host.apply().spawn().expect("nodeward starts");
        wait_mid_body(child.id(), &host.root, into, STALL_AT);
        child.kill().expect("SIGKILL");
        child.wait().expect("reaped");
    }
    artifacts.stall_all(&[]);
    host.apply_ok();
    assert_eq!(host.temp_entries(), Vec::<String>::new());
    assert_eq!(
        host.tree(),
        want,
        "the re-run's tree differs from an uninterrupted one"
    );
    // Each stalled artifact was asked for again after its kill (a partial body is never
    // kept); the others once at least (a phase's downloads run at once, so how many a killed
    // run finished first varies).
    let requests = artifacts.server.requests();
    for stalled in ["/kubelet", "/cni-plugins.tgz"] {
        let n = requests
            .iter()
            .filter(|r| r.target.ends_with(stalled))
            .count();
        assert!(n >= 2, "{stalled} requested {n} times");
    }
    assert!(requests.len() >= 4 + 2, "{} requests", requests.len());
}

/// A download longer than the progress interval prints plain progress lines (stderr is not a
/// terminal here) and a closing line; `--quiet` prints none.
#[test]
fn a_long_download_prints_progress_lines_unless_quiet() {
    let _serial = one_at_a_time();
    let artifacts = Artifacts::serve();
    for quiet in [false, true] {
        let host = Host::new(&artifacts);
        artifacts.stall_for(Some("/kubelet"), Duration::from_secs(6));
        let mut apply = host.apply();
        if quiet {
            apply.arg("--quiet");
        }
        let out = apply.output().expect("nodeward runs");
        assert!(out.status.success(), "apply failed: {}", stderr(&out));
        let err = stderr(&out);
        let lines: Vec<&str> = err
            .lines()
            .filter(|l| l.contains("downloading kubelet: ") || l.contains("downloaded kubelet: "))
            .collect();
        if quiet {
            assert_eq!(lines, Vec::<&str>::new(), "--quiet: {err}");
        } else {
            assert!(
                lines.iter().any(|l| l.contains("downloading kubelet: ")
                    && l.contains("of 2.00 MiB (")
                    && l.contains("/s")),
                "a progress line: {err}"
            );
            assert!(
                lines
                    .iter()
                    .any(|l| l.contains("downloaded kubelet: 2.00 MiB in ")),
                "a closing line: {err}"
            );
            // The short downloads print none.
            assert!(!err.contains("downloading runc"), "{err}");
        }
    }
    artifacts.stall_all(&[]);
}

#[cfg(feature = "test-hooks")]
#[test]
fn a_run_aborted_between_naming_and_renaming_a_temp_file_is_swept_by_the_next() {
    use std::os::unix::process::ExitStatusExt;
    let _serial = one_at_a_time();
    let artifacts = Artifacts::serve();
    let want = reference(&artifacts);
    // setup-host's first file, the kubelet's download, its cache entry, containerd's first
    // extracted binary: each leaves a complete, named temp file when the agent dies there.
    for purpose in ["write", "download", "cache", "extract"] {
        let host = Host::new(&artifacts);
        let point = format!("{purpose}:after-temp-write");
        let out = host
            .apply()
            .env("NODEWARD_TEST_ABORT", &point)
            .output()
            .expect("nodeward runs");
        assert_eq!(
            out.status.signal(),
            Some(6),
            "{point}: expected an abort: {}",
            stderr(&out)
        );
        let left = host.temp_entries();
        assert!(
            left.iter()
                .any(|p| p.contains(&format!(".nodeward-tmp.{purpose}."))),
            "{point}: the abort left no named temp file: {left:?}"
        );
        host.apply_ok();
        assert_eq!(host.temp_entries(), Vec::<String>::new(), "{point}");
        assert_eq!(host.tree(), want, "{point}: the re-run's tree differs");
    }
}

/// The child half of the node state test: writes the applied config beneath the root named in
/// `NODEWARD_DURABLE_TEST_ROOT` (with the abort hook set, it dies mid-write); nothing when the
/// variable is not set.
#[cfg(feature = "test-hooks")]
#[test]
fn state_write_child() {
    let Ok(root) = std::env::var("NODEWARD_DURABLE_TEST_ROOT") else {
        return;
    };
    let (run, state) = node_state(Path::new(&root));
    let config = nodeward::config::load(None).expect("config");
    state.write_applied(&run, &config).expect("write");
}

#[cfg(feature = "test-hooks")]
fn node_state(root: &Path) -> (nodeward::caps::RunContext, nodeward::node::state::NodeState) {
    let run = nodeward::caps::RunContext::new(
        nodeward::hostpath::HostRoot::open(root).expect("root"),
        nodeward::plan::RunMode::Apply,
        nodeward::audit::Redactor::default(),
    );
    (run, nodeward::node::state::NodeState::new(root))
}

#[cfg(feature = "test-hooks")]
#[test]
fn a_state_write_aborted_mid_way_is_swept_by_the_next_run_and_never_survives_reset() {
    use nodeward::node::state::NodeLock;
    use nodeward::node::sweep::sweep;
    use nodeward_node_config::layout::STATE_DIR;
    use std::os::unix::process::ExitStatusExt;
    let config = nodeward::config::load(None).expect("config");
    let runtime = common::runtime();

    // Reference: the applied config written once, uninterrupted.
    let reference = tempfile::tempdir().expect("tempdir");
    let (run, state) = node_state(reference.path());
    state.write_applied(&run, &config).expect("write");
    let want = common::snapshot(reference.path());

    for then_reset in [false, true] {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path();
        let out = Command::new(std::env::current_exe().expect("test binary"))
            .args([
                "--exact",
                "state_write_child",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("NODEWARD_DURABLE_TEST_ROOT", root)
            .env("NODEWARD_TEST_ABORT", "state:after-temp-write")
            .output()
            .expect("child runs");
        assert_eq!(out.status.signal(), Some(6), "{}", stderr(&out));
        // What the abort left: the whole applied config, token included, under a temp name.
        let dir = root.join(STATE_DIR);
        let left: Vec<PathBuf> = std::fs::read_dir(&dir)
            .expect("state dir")
            .map(|e| e.expect("entry").path())
            .collect();
        assert_eq!(left.len(), 1, "{left:?}");
        let name = left[0].file_name().expect("name").to_string_lossy();
        assert!(name.starts_with(".nodeward-tmp.state."), "{name}");
        let leaked = std::fs::read_to_string(&left[0]).expect("temp file");
        assert!(
            leaked.contains(common::TOKEN_SECRET),
            "the temp file holds the token"
        );

        let (run, state) = node_state(root);
        if then_reset {
            // `reset` removes the node state, the temp file included, and the directory.
            state.remove_all(&run).expect("remove all");
            assert!(!dir.exists(), "{:?}", common::snapshot(root));
        } else {
            // The next run: the lock, the sweep, the same write.
            let _lock = NodeLock::acquire(root).expect("lock");
            let removed = sweep(&run, runtime).expect("sweep");
            assert!(
                removed.contains(&format!("{STATE_DIR}/{name}")),
                "{removed:?}"
            );
            state.write_applied(&run, &config).expect("write");
            let mut got = common::snapshot(root);
            got.retain(|p, _| p != "run" && !p.starts_with("run/"));
            assert_eq!(got, want);
        }
    }
}
