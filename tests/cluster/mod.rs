//! A real Kubernetes control plane (and, on request, a real node) for the cluster tests.
//!
//! The fixture is a thin typed layer over the scripts, which do the work and are usable by hand:
//! - `scripts/kube-cluster-start.sh` / `-stop.sh`: etcd, kube-apiserver and
//!   kube-controller-manager on 127.0.0.1 (free random ports), with the certificates, RBAC and
//!   bootstrap token of kubeadm's TLS-bootstrap flow;
//! - `scripts/kube-node-start.sh` / `-stop.sh`: containerd and a kubelet as transient units of the
//!   harness's systemd, joined with the bootstrap token only.
//!
//! The tests run inside the hybrid systemd harness (`NODEWARD_TEST_CLUSTER=1 scripts/test.sh`),
//! so the control plane is in the harness's pid namespace too and cannot outlive it.
//!
//! [`Cluster::shared`] starts one cluster per test binary on first use; an `atexit` hook stops
//! it when the binary exits (also after failed tests: libtest exits through `exit`).
//! [`Cluster::start`] gives a private one that stops on [`Cluster::stop`] or drop;
//! [`Cluster::start_audited`] one whose API server also writes an audit log, and which
//! [`Cluster::restart_apiserver`] can restart (`scripts/kube-apiserver-restart.sh`).
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant, SystemTime};

/// The env var that opts in; the tests fail with a clear message without it.
pub const OPT_IN: &str = "NODEWARD_TEST_CLUSTER";

fn scripts() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts")
}

/// Fails the test unless the cluster tests were asked for and run inside a hybrid harness.
#[track_caller]
pub fn require_cluster_env() {
    assert_eq!(
        std::env::var(OPT_IN).as_deref(),
        Ok("1"),
        "the cluster tests need the hybrid systemd harness and the kube builds: \
         run them with `NODEWARD_TEST_CLUSTER=1 scripts/test.sh` (README, Testing)"
    );
}

/// One cluster test at a time per binary: each runs real processes on two cores.
pub fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// A fresh, empty, uniquely named directory under /tmp (the scripts accept an empty one). Not
/// named by PID: test binaries in two harnesses can have the same PID in their namespaces.
fn unique_dir(kind: &str) -> PathBuf {
    tempfile::Builder::new()
        .prefix(&format!("nodeward-{kind}-"))
        .tempdir_in("/tmp")
        .expect("a state directory in /tmp")
        .keep()
}

/// Reads a file of `KEY=value` lines.
fn read_env(path: &Path) -> HashMap<String, String> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn take(env: &HashMap<String, String>, key: &str) -> String {
    env.get(key)
        .unwrap_or_else(|| panic!("{key} missing from the env file"))
        .clone()
}

/// Runs a script, returning the last line of its stdout; panics with its stderr on failure.
fn run_script(name: &str, envs: &[(&str, &Path)]) -> String {
    let mut cmd = Command::new(scripts().join(name));
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap_or_else(|e| panic!("{name}: {e}"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprint!("{stderr}");
    assert!(
        out.status.success(),
        "{name} failed ({}):\n{stderr}",
        out.status
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .unwrap_or_default()
        .to_string()
}

/// The bootstrap token, `<id>.<secret>`.
#[derive(Clone, Debug)]
pub struct BootstrapToken {
    pub id: String,
    pub secret: String,
}

impl BootstrapToken {
    pub fn token(&self) -> String {
        format!("{}.{}", self.id, self.secret)
    }
}

/// A running control plane.
#[derive(Debug)]
pub struct Cluster {
    pub state: PathBuf,
    /// The cluster.env file (what the node scripts take).
    pub env_file: PathBuf,
    pub api_url: String,
    pub ca_cert: PathBuf,
    pub ca_key: PathBuf,
    pub admin_kubeconfig: PathBuf,
    pub bootstrap_kubeconfig: PathBuf,
    pub bootstrap_token: BootstrapToken,
    pub kubectl: PathBuf,
    /// The kubelet stamped with [`Cluster::kube_version`], and the one stamped with
    /// [`Cluster::upgrade_version`].
    pub kubelet: PathBuf,
    pub kubelet_upgrade: PathBuf,
    pub kube_version: String,
    pub upgrade_version: String,
    pub pause_image: String,
    pub workload_image: String,
    pub pause_image_tar: PathBuf,
    pub workload_image_tar: PathBuf,
    /// Milliseconds from start to a ready control plane.
    pub start_ms: u128,
    /// The API server's audit log (JSON lines, Metadata level), when started by
    /// [`Cluster::start_audited`].
    pub audit_log: Option<PathBuf>,
    stopped: AtomicBool,
}

/// When [`Cluster::restart_apiserver`]'s API server went and came back (wall clock, as the
/// audit log's timestamps).
#[derive(Clone, Copy, Debug)]
pub struct ApiServerRestart {
    /// SIGTERM was sent: the old process stopped listening.
    pub stopped: SystemTime,
    /// The old process had exited.
    pub exited: SystemTime,
    /// The new one was started.
    pub started: SystemTime,
    /// Its `/readyz` first answered ok.
    pub ready: SystemTime,
}

impl Cluster {
    /// Starts a private cluster in a fresh state directory.
    pub fn start() -> Cluster {
        Cluster::start_with(false)
    }

    /// Starts a private cluster whose API server logs every request made of it (but its own
    /// loopback ones) to [`Cluster::audit_log`]: `NODEWARD_CLUSTER_AUDIT=1` of
    /// `scripts/kube-cluster-start.sh`.
    pub fn start_audited() -> Cluster {
        Cluster::start_with(true)
    }

    fn start_with(audit: bool) -> Cluster {
        require_cluster_env();
        let state = unique_dir("cluster");
        let t = Instant::now();
        let audit_flag = Path::new(if audit { "1" } else { "0" });
        let env_file = PathBuf::from(run_script(
            "kube-cluster-start.sh",
            &[
                ("NODEWARD_CLUSTER_STATE", &state),
                ("NODEWARD_CLUSTER_AUDIT", audit_flag),
            ],
        ));
        let start_ms = t.elapsed().as_millis();
        let env = read_env(&env_file);
        let token = take(&env, "BOOTSTRAP_TOKEN");
        let (id, secret) = token.split_once('.').expect("token is <id>.<secret>");
        let p = |k: &str| PathBuf::from(take(&env, k));
        Cluster {
            api_url: take(&env, "API_URL"),
            ca_cert: p("CA_CERT"),
            ca_key: p("CA_KEY"),
            admin_kubeconfig: p("ADMIN_KUBECONFIG"),
            bootstrap_kubeconfig: p("BOOTSTRAP_KUBECONFIG"),
            bootstrap_token: BootstrapToken {
                id: id.into(),
                secret: secret.into(),
            },
            kubectl: p("KUBECTL"),
            kubelet: p("KUBELET"),
            kubelet_upgrade: p("KUBELET_UPGRADE"),
            kube_version: take(&env, "KUBE_VERSION"),
            upgrade_version: take(&env, "KUBE_UPGRADE_VERSION"),
            pause_image: take(&env, "PAUSE_IMAGE"),
            workload_image: take(&env, "WORKLOAD_IMAGE"),
            pause_image_tar: p("PAUSE_IMAGE_TAR"),
            workload_image_tar: p("WORKLOAD_IMAGE_TAR"),
            start_ms,
            audit_log: env
                .get("AUDIT_LOG")
                .filter(|p| !p.is_empty())
                .map(PathBuf::from),
            env_file,
            state,
            stopped: AtomicBool::new(false),
        }
    }

    /// Stops the API server (SIGTERM, then SIGKILL after 10 s), starts it again with the same
    /// flags `down` after the SIGTERM and waits for its `/readyz`
    /// (`scripts/kube-apiserver-restart.sh`); etcd and the controller-manager keep running.
    /// Must run in the pid namespace the cluster started in.
    pub fn restart_apiserver(&self, down: Duration) -> ApiServerRestart {
        let secs = down.as_secs().to_string();
        let mut cmd = Command::new(scripts().join("kube-apiserver-restart.sh"));
        cmd.arg(&secs).env("NODEWARD_CLUSTER_STATE", &self.state);
        let out = cmd.output().expect("kube-apiserver-restart.sh runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        eprint!("{stderr}");
        assert!(
            out.status.success(),
            "kube-apiserver-restart.sh failed ({}):\n{stderr}",
            out.status
        );
        let line = String::from_utf8_lossy(&out.stdout);
        let at = |key: &str| -> SystemTime {
            let ns: u64 = line
                .split_whitespace()
                .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{key} missing from the restart's line {line:?}"));
            SystemTime::UNIX_EPOCH + Duration::from_nanos(ns)
        };
        ApiServerRestart {
            stopped: at("STOPPED_NS"),
            exited: at("EXITED_NS"),
            started: at("STARTED_NS"),
            ready: at("READY_NS"),
        }
    }

    /// A kubeconfig in `dir` (owner-only) that authenticates as the node `name`, the identity
    /// a kubelet's rotated certificate carries (user `system:node:<name>`, group
    /// `system:nodes`): a fresh P-256 key and a client certificate signed by the cluster's CA.
    pub fn node_kubeconfig(&self, name: &str, dir: &Path) -> PathBuf {
        use base64::Engine as _;
        let key = dir.join(format!("{name}.key"));
        let csr = dir.join(format!("{name}.csr"));
        let crt = dir.join(format!("{name}.crt"));
        let ext = dir.join(format!("{name}.ext"));
        std::fs::write(
            &ext,
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n",
        )
        .expect("extensions file");
        let subject = format!("/O=system:nodes/CN=system:node:{name}");
        let openssl = |args: &[&std::ffi::OsStr]| {
            let out = Command::new("openssl")
                .args(args)
                .output()
                .expect("openssl runs");
            assert!(
                out.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        openssl(&[
            "req".as_ref(),
            "-new".as_ref(),
            "-newkey".as_ref(),
            "ec".as_ref(),
            "-pkeyopt".as_ref(),
            "ec_paramgen_curve:prime256v1".as_ref(),
            "-nodes".as_ref(),
            "-subj".as_ref(),
            subject.as_ref(),
            "-keyout".as_ref(),
            key.as_os_str(),
            "-out".as_ref(),
            csr.as_os_str(),
        ]);
        let serial = format!("0x{:016x}", fastrand::u64(1..));
        openssl(&[
            "x509".as_ref(),
            "-req".as_ref(),
            "-in".as_ref(),
            csr.as_os_str(),
            "-CA".as_ref(),
            self.ca_cert.as_os_str(),
            "-CAkey".as_ref(),
            self.ca_key.as_os_str(),
            "-set_serial".as_ref(),
            serial.as_ref(),
            "-days".as_ref(),
            "2".as_ref(),
            "-extfile".as_ref(),
            ext.as_os_str(),
            "-out".as_ref(),
            crt.as_os_str(),
        ]);
        let b64 = |p: &Path| {
            base64::engine::general_purpose::STANDARD
                .encode(std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
        };
        let kubeconfig = dir.join(format!("{name}.kubeconfig"));
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: nodeward\n  cluster:\n    server: {}\n    certificate-authority-data: {}\nusers:\n- name: node\n  user:\n    client-certificate-data: {}\n    client-key-data: {}\ncontexts:\n- name: default\n  context:\n    cluster: nodeward\n    user: node\ncurrent-context: default\n",
            self.api_url,
            b64(&self.ca_cert),
            b64(&crt),
            b64(&key),
        );
        use std::io::Write as _;
        use std::os::unix::fs::OpenOptionsExt as _;
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&kubeconfig)
            .and_then(|mut f| f.write_all(text.as_bytes()))
            .unwrap_or_else(|e| panic!("{}: {e}", kubeconfig.display()));
        for f in [&key, &csr, &crt, &ext] {
            let _ = std::fs::remove_file(f);
        }
        kubeconfig
    }

    /// The cluster shared by the tests of this binary, started on first use and stopped when
    /// the binary exits.
    pub fn shared() -> &'static Cluster {
        static SHARED: OnceLock<Cluster> = OnceLock::new();
        extern "C" fn stop_shared() {
            if let Some(c) = SHARED.get() {
                c.stop_now();
            }
        }
        // The crate denies unsafe code; this is test-only: libc's `atexit`, declared here.
        #[allow(unsafe_code)]
        unsafe extern "C" {
            fn atexit(cb: extern "C" fn()) -> std::ffi::c_int;
        }
        SHARED.get_or_init(|| {
            let c = Cluster::start();
            // SAFETY: registers a plain extern "C" function without arguments.
            #[allow(unsafe_code)]
            unsafe {
                atexit(stop_shared)
            };
            c
        })
    }

    /// `kubectl --kubeconfig=<admin> ARGS`.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        Command::new(&self.kubectl)
            .arg(format!("--kubeconfig={}", self.admin_kubeconfig.display()))
            .arg("--request-timeout=30s")
            .args(args)
            .output()
            .expect("kubectl runs")
    }

    /// kubectl that must succeed; its stdout.
    #[track_caller]
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The nodeward.io API on the cluster (`deploy/crds`, `deploy/rbac.yaml`), once the API
    /// server serves the CRDs: idempotent, so every test and benchmark that needs a Machine
    /// calls it.
    pub fn install_nodeward_api(&self) {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
        for f in ["deploy/crds", "deploy/rbac.yaml"] {
            self.kubectl_ok(&["apply", "-f", &repo.join(f).display().to_string()]);
        }
        wait_for("the CRDs established", Duration::from_secs(30), || {
            self.kubectl(&["get", "machines.nodeward.io"])
                .status
                .success()
                .then_some(())
        });
    }

    /// Merges `patch` into the Machine `name` (`kubectl patch --type=merge`), which must succeed.
    #[track_caller]
    pub fn patch_machine(&self, name: &str, patch: &serde_json::Value) {
        self.kubectl_ok(&[
            "patch",
            "machines.nodeward.io",
            name,
            "--type=merge",
            "-p",
            &patch.to_string(),
        ]);
    }

    /// kubectl ... -o json, parsed.
    pub fn get_json(&self, args: &[&str]) -> Option<serde_json::Value> {
        let mut a = args.to_vec();
        a.extend(["-o", "json"]);
        let out = self.kubectl(&a);
        out.status
            .success()
            .then(|| serde_json::from_slice(&out.stdout).expect("kubectl JSON"))
    }

    /// Stops the control plane and removes its state directory (idempotent).
    pub fn stop_now(&self) {
        if self.stopped.swap(true, Ordering::SeqCst) {
            return;
        }
        run_script(
            "kube-cluster-stop.sh",
            &[("NODEWARD_CLUSTER_STATE", &self.state)],
        );
    }

    /// Stops the control plane and removes its state directory.
    pub fn stop(self) {
        self.stop_now();
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if !self.stopped.swap(true, Ordering::SeqCst) {
            let _ = Command::new(scripts().join("kube-cluster-stop.sh"))
                .env("NODEWARD_CLUSTER_STATE", &self.state)
                .status();
        }
    }
}

/// A running node: containerd and a kubelet in the harness's systemd.
#[derive(Debug)]
pub struct Node {
    pub state: PathBuf,
    pub name: String,
    /// Written by the kubelet once its CSR is signed.
    pub kubeconfig: PathBuf,
    pub kubelet_unit: String,
    pub containerd_unit: String,
    pub bridge: String,
    pub pod_cidr: String,
    cluster_env: PathBuf,
    stopped: bool,
}

impl Node {
    /// Starts a node joining `cluster` with its bootstrap token, running `kubelet` (the
    /// cluster's own kubelet when None).
    pub fn start(cluster: &Cluster, name: &str, kubelet: Option<&Path>) -> Node {
        let state = unique_dir("node");
        let name_os = PathBuf::from(name);
        let mut envs: Vec<(&str, &Path)> = vec![
            ("NODEWARD_NODE_STATE", &state),
            ("NODEWARD_CLUSTER_ENV", &cluster.env_file),
            ("NODEWARD_NODE_NAME", &name_os),
        ];
        if let Some(k) = kubelet {
            envs.push(("NODEWARD_KUBELET", k));
        }
        let env_file = PathBuf::from(run_script("kube-node-start.sh", &envs));
        let env = read_env(&env_file);
        Node {
            name: take(&env, "NODE_NAME"),
            kubeconfig: PathBuf::from(take(&env, "NODE_KUBECONFIG")),
            kubelet_unit: take(&env, "KUBELET_UNIT"),
            containerd_unit: take(&env, "CONTAINERD_UNIT"),
            bridge: take(&env, "BRIDGE"),
            pod_cidr: take(&env, "POD_CIDR"),
            cluster_env: cluster.env_file.clone(),
            state,
            stopped: false,
        }
    }

    /// Deletes its pods, stops kubelet and containerd, removes mounts, bridge and state, restores
    /// net.ipv4.ip_forward; panics when the stop script finds something left.
    pub fn stop(mut self) {
        self.stopped = true;
        run_script(
            "kube-node-stop.sh",
            &[
                ("NODEWARD_NODE_STATE", &self.state),
                ("NODEWARD_CLUSTER_ENV", &self.cluster_env),
            ],
        );
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if !self.stopped {
            self.stopped = true;
            let _ = Command::new(scripts().join("kube-node-stop.sh"))
                .env("NODEWARD_NODE_STATE", &self.state)
                .env("NODEWARD_CLUSTER_ENV", &self.cluster_env)
                .status();
        }
    }
}

/// Polls `f` every 200 ms until it returns Some, at most `timeout`; panics with `what`.
#[track_caller]
pub fn wait_for<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "{what}: not within {timeout:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}
