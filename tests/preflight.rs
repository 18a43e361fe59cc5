//! `nodeward preflight` and the `preflight-checks` step of `bootstrap`, through the built
//! binary: each check passes on a root made fit and fails on one made to fail it, against a
//! real HTTPS server on 127.0.0.1 for the API server checks; links out of the root are never
//! followed; the ignore list by name, `all` and an unknown name; the JSON shape; exit codes; a
//! bootstrap refused before it writes anything.

mod common;

use base64::Engine as _;
use common::http::{HttpServer, Reply};
use common::tls::TestCa;
use common::{Fixture, snapshot};
use serde_json::Value;
use std::collections::BTreeMap;
use std::process::Output;

const HEADER_TCP: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n";
/// A socket listening on 0.0.0.0:10250 (the address reads the same in either byte order).
const LISTEN_10250: &str = "   0: 00000000:280A 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4242 1 0000000000000000 100 0 0 10 0\n";

/// The HTTP date of now plus `offset_secs`, by `date` (the test does not trust our parser to
/// write what it reads).
fn http_date(offset_secs: i64) -> String {
    let out = std::process::Command::new("date")
        .args([
            "-u",
            "-d",
            &format!("{offset_secs} seconds"),
            "+%a, %d %b %Y %H:%M:%S GMT",
        ])
        .output()
        .expect("date");
    String::from_utf8(out.stdout)
        .expect("utf-8")
        .trim()
        .to_string()
}

/// An API server on 127.0.0.1 presenting `ca`'s certificate, its Date header `offset_secs` off.
fn api_server(ca: &TestCa, offset_secs: i64) -> HttpServer {
    HttpServer::start_tls(ca.server_config(), move |_| {
        Reply::json(200, &serde_json::json!({"gitVersion": "v1.34.1"}))
            .with_header("Date", &http_date(offset_secs))
    })
}

/// The example config with `api` and `ca_pem` for the cluster, `kubernetes` as its version,
/// and `kubelet_config` (YAML flow mapping) as `kubelet.config`; written beside the root.
fn config(f: &Fixture, api: &str, ca_pem: &str, kubernetes: &str, kubelet_config: &str) -> String {
    let text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("host/default-config.yaml"),
    )
    .expect("example config");
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    let text: String = text
        .lines()
        .map(|l| {
            if l.trim_start().starts_with("apiServer:") {
                format!("  apiServer: {api}")
            } else if l.trim_start().starts_with("caCertData:") {
                format!("  caCertData: {ca}")
            } else if l.trim_start().starts_with("kubernetesVersion:") {
                format!("  kubernetesVersion: \"{kubernetes}\"")
            } else if l == "kubelet:" {
                format!("kubelet:\n  config: {kubelet_config}")
            } else {
                l.to_string()
            }
        })
        .map(|l| l + "\n")
        .collect();
    let path = f.tmp.path().join("node.yaml");
    std::fs::write(&path, text).expect("config");
    path.display().to_string()
}

/// A root a node fits on: no swap, the modules loaded, the sysctls set, cgroup v2, no socket
/// listening.
fn fit_root(f: &Fixture) {
    f.put(
        "proc/swaps",
        "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n",
    );
    f.put(
        "proc/modules",
        "overlay 200704 0 - Live 0x0\nbr_netfilter 32768 0 - Live 0x0\n",
    );
    f.put("proc/sys/net/ipv4/ip_forward", "1\n");
    f.put("proc/sys/net/bridge/bridge-nf-call-iptables", "1\n");
    f.put("proc/sys/net/bridge/bridge-nf-call-ip6tables", "1\n");
    f.put("proc/sys/kernel/osrelease", "6.1.0-test\n");
    f.put(
        "sys/fs/cgroup/cgroup.controllers",
        "cpuset cpu io memory pids\n",
    );
    f.put("proc/net/tcp", HEADER_TCP);
    f.put("proc/net/tcp6", HEADER_TCP);
}

fn preflight(f: &Fixture, config: &str, extra: &[&str]) -> Output {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_nodeward"));
    cmd.args(["preflight", "--config", config])
        .args(extra)
        .env("NODEWARD_ROOT", &f.root)
        .env_remove("NODEWARD_LOG");
    cmd.output().expect("nodeward preflight")
}

/// `preflight --output json`: the exit code and the checks by name.
fn checks(f: &Fixture, config: &str, extra: &[&str]) -> (i32, Value, BTreeMap<String, Value>) {
    let mut args = vec!["--output", "json"];
    args.extend(extra);
    let out = preflight(f, config, &args);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let by_name = v["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .map(|c| (c["name"].as_str().expect("name").to_string(), c.clone()))
        .collect();
    (out.status.code().unwrap_or(-1), v, by_name)
}

#[track_caller]
fn status_is(checks: &BTreeMap<String, Value>, name: &str, status: &str, needle: &str) {
    let c = checks
        .get(name)
        .unwrap_or_else(|| panic!("no check {name}: {checks:#?}"));
    assert_eq!(c["status"], status, "{name}: {c}");
    assert!(
        c["message"].as_str().is_some_and(|m| m.contains(needle)),
        "{name}'s message names {needle:?}: {c}"
    );
}

#[test]
fn a_fit_root_passes_every_check_and_changes_nothing() {
    let f = Fixture::new();
    fit_root(&f);
    let ca = TestCa::new("preflight-ca");
    let api = api_server(&ca, 0);
    let config = config(&f, &api.base_url(), &ca.ca_pem(), "1.34.1", "{}");
    let before = snapshot(&f.root);
    let (code, v, c) = checks(&f, &config, &[]);
    assert_eq!(code, 0, "{v:#}");
    assert_eq!(v["passed"], true);
    assert_eq!(v["ownNode"], false);
    let keys: Vec<&str> = v
        .as_object()
        .expect("object")
        .keys()
        .map(|k| k.as_str())
        .collect();
    assert_eq!(keys, ["checks", "ownNode", "passed", "root"]);
    for (name, check) in &c {
        let keys: Vec<&str> = check
            .as_object()
            .expect("check")
            .keys()
            .map(|k| k.as_str())
            .collect();
        assert_eq!(keys, ["ignored", "message", "name", "status"], "{name}");
        // Systemd may be out of reach of this test (no system bus): then the unit checks skip.
        if !name.starts_with("Service-") {
            assert_eq!(check["status"], "pass", "{check}");
        }
    }
    status_is(&c, "IsPrivilegedUser", "pass", "root");
    status_is(&c, "Swap", "pass", "no swap");
    status_is(&c, "KernelModule-br_netfilter", "pass", "proc/modules");
    status_is(&c, "Sysctl-net.ipv4.ip_forward", "pass", "= 1");
    status_is(&c, "CgroupVersion", "pass", "cgroup v2");
    status_is(&c, "CgroupDriver", "pass", "systemd");
    status_is(&c, "Port-10250", "pass", "proc/net/tcp");
    status_is(&c, "Port-10248", "pass", "free");
    status_is(&c, "DiskSpace", "pass", "MiB free at");
    status_is(&c, "APIServerReachable", "pass", &api.base_url());
    status_is(&c, "CACertMatch", "pass", "HTTP 200");
    status_is(&c, "ClockSanity", "pass", "within");
    assert_eq!(snapshot(&f.root), before, "preflight changed the root");
    // One request, to /version, without credentials.
    let requests = api.requests();
    assert_eq!(requests.len(), 1, "{requests:?}");
    assert_eq!(requests[0].path(), "/version");
    assert_eq!(requests[0].header("authorization"), None);

    // The text table: one line per check, then the summary.
    let out = preflight(&f, &config, &[]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("Port-10250 ") && l.contains(" pass ")),
        "{text}"
    );
    assert!(text.contains(&format!("{} checks: ", c.len())), "{text}");
}

/// A root each check fails on (or warns, for what setup-host fixes).
fn unfit_root(f: &Fixture) {
    f.put(
        "proc/swaps",
        "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n/swapfile file 1048572 0 -2\n",
    );
    f.put("proc/modules", "");
    std::fs::create_dir_all(f.root.join("sys/module")).expect("sys/module");
    f.put("proc/sys/kernel/osrelease", "6.1.0-test\n");
    // A hard link into the repository, as on an OSTree host: still read for the check.
    f.put(
        "ostree/repo/objects/dep.file",
        "kernel/fs/ext4/ext4.ko: kernel/fs/jbd2/jbd2.ko\n",
    );
    std::fs::create_dir_all(f.root.join("lib/modules/6.1.0-test")).expect("modules dir");
    std::fs::hard_link(
        f.root.join("ostree/repo/objects/dep.file"),
        f.root.join("lib/modules/6.1.0-test/modules.dep"),
    )
    .expect("hard link");
    f.put(
        "lib/modules/6.1.0-test/modules.builtin",
        "kernel/fs/vfat/vfat.ko\n",
    );
    f.put("proc/sys/net/ipv4/ip_forward", "0\n");
    std::fs::create_dir_all(f.root.join("sys/fs/cgroup/cpu")).expect("cgroup v1");
    f.put("proc/net/tcp", &format!("{HEADER_TCP}{LISTEN_10250}"));
    f.put("run/containerd/containerd.sock", "");
    f.put("run/crio/crio.sock", "");
    f.put("etc/kubernetes/manifests/etcd.yaml", "kind: Pod\n");
    f.put(
        "etc/kubernetes/pki/ca.crt",
        "-----BEGIN CERTIFICATE-----\nanother\n-----END CERTIFICATE-----\n",
    );
    f.put(
        "etc/kubernetes/bootstrap-kubelet.conf",
        "apiVersion: v1\nkind: Config\n",
    );
    f.put("opt/cni/bin/bridge", "plugin");
}

/// An API URL nothing listens on: bound, then closed.
fn dead_url() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("port");
    format!("https://127.0.0.1:{port}")
}

#[test]
fn each_check_fails_or_warns_on_a_root_made_to_fail_it() {
    let f = Fixture::new();
    unfit_root(&f);
    let ca = TestCa::new("preflight-ca");
    let config = config(
        &f,
        &dead_url(),
        &ca.ca_pem(),
        "1.35.0",
        "{cgroupDriver: cgroupfs}",
    );
    let before = snapshot(&f.root);
    let (code, v, c) = checks(&f, &config, &[]);
    assert_eq!(code, 1, "{v:#}");
    assert_eq!(v["passed"], false);
    status_is(&c, "Swap", "warning", "/swapfile");
    status_is(
        &c,
        "KernelModule-overlay",
        "fail",
        "lib/modules/6.1.0-test/modules.dep",
    );
    status_is(&c, "KernelModule-br_netfilter", "fail", "cannot load it");
    status_is(&c, "Sysctl-net.ipv4.ip_forward", "warning", "is 0");
    status_is(
        &c,
        "Sysctl-net.bridge.bridge-nf-call-iptables",
        "warning",
        "br_netfilter",
    );
    status_is(&c, "CgroupVersion", "fail", "failCgroupV1");
    status_is(&c, "CgroupDriver", "fail", "cgroupfs");
    status_is(&c, "Port-10250", "fail", "0.0.0.0");
    status_is(&c, "Port-10248", "pass", "free");
    status_is(&c, "CRISocket", "fail", "run/containerd/containerd.sock");
    status_is(
        &c,
        "DirAvailable--etc-kubernetes-manifests",
        "fail",
        "etcd.yaml",
    );
    status_is(
        &c,
        "FileAvailable--etc-kubernetes-pki-ca.crt",
        "fail",
        "another CA",
    );
    status_is(
        &c,
        "FileAvailable--etc-kubernetes-bootstrap-kubelet.conf",
        "fail",
        "did not write it",
    );
    status_is(&c, "DirAvailable--opt-cni-bin", "fail", "bridge");
    status_is(&c, "APIServerReachable", "fail", "unreachable");
    status_is(&c, "CACertMatch", "skip", "unreachable");
    status_is(&c, "ClockSanity", "skip", "could not be asked");
    assert_eq!(snapshot(&f.root), before, "preflight changed the root");
    // The error names every failed check and the flag that lets them through.
    let out = preflight(&f, &config, &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("--ignore-preflight-errors=KernelModule-overlay,")
            && err.contains("Port-10250: port 10250"),
        "{err}"
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.lines()
            .any(|l| l.starts_with("Port-10250 ") && l.contains(" FAIL ")),
        "{text}"
    );

    // Another containerd's socket alone is fine once nodeward's node is here (its own), and so
    // are the kubelet's port and configure's files.
    std::os::unix::fs::symlink("v1", {
        std::fs::create_dir_all(f.root.join("opt/nodeward/node/v1")).expect("version");
        f.root.join("opt/nodeward/node/current")
    })
    .expect("current link");
    let (_, v, c) = checks(&f, &config, &[]);
    assert_eq!(v["ownNode"], true);
    status_is(&c, "Port-10250", "pass", "its kubelet");
    status_is(&c, "CRISocket", "warning", "run/crio/crio.sock");
    status_is(
        &c,
        "FileAvailable--etc-kubernetes-pki-ca.crt",
        "pass",
        "installed node",
    );
}

#[test]
fn the_api_server_checks_fail_on_another_ca_and_a_skewed_clock() {
    let f = Fixture::new();
    fit_root(&f);
    let ca = TestCa::new("the-cluster-ca");
    let other = TestCa::new("another-ca");
    let api = api_server(&ca, 0);
    let config_other = config(&f, &api.base_url(), &other.ca_pem(), "1.34.1", "{}");
    let (code, _, c) = checks(&f, &config_other, &[]);
    assert_eq!(code, 1);
    status_is(&c, "APIServerReachable", "pass", "accepts connections");
    status_is(&c, "CACertMatch", "fail", "caCertData");
    status_is(&c, "ClockSanity", "skip", "");

    let skewed = api_server(&ca, -3600);
    let config_skewed = config(&f, &skewed.base_url(), &ca.ca_pem(), "1.34.1", "{}");
    let (code, _, c) = checks(&f, &config_skewed, &[]);
    assert_eq!(code, 1);
    status_is(&c, "CACertMatch", "pass", "verifies");
    status_is(&c, "ClockSanity", "fail", "s ahead of");
    // Five minutes is the limit.
    let near = api_server(&ca, -200);
    let config_near = config(&f, &near.base_url(), &ca.ca_pem(), "1.34.1", "{}");
    let (code, _, c) = checks(&f, &config_near, &[]);
    assert_eq!(code, 0);
    status_is(&c, "ClockSanity", "pass", "within");
}

#[test]
fn links_out_of_the_root_are_not_followed() {
    let f = Fixture::new();
    fit_root(&f);
    // What the links lead to: a swap, static pods, a listening kubelet port.
    std::fs::write(
        f.outside.join("swaps"),
        "Filename Type Size Used Priority\n/outside-swap file 1 0 -2\n",
    )
    .expect("outside swaps");
    std::fs::create_dir_all(f.outside.join("net")).expect("outside net");
    std::fs::write(
        f.outside.join("net/tcp"),
        format!("{HEADER_TCP}{LISTEN_10250}"),
    )
    .expect("tcp");
    std::fs::create_dir_all(f.outside.join("manifests")).expect("outside manifests");
    std::fs::write(f.outside.join("manifests/outside-pod.yaml"), "kind: Pod\n").expect("pod");
    std::fs::remove_file(f.root.join("proc/swaps")).expect("swaps");
    std::os::unix::fs::symlink(f.outside.join("swaps"), f.root.join("proc/swaps")).expect("link");
    std::fs::remove_dir_all(f.root.join("proc/net")).expect("proc/net");
    std::os::unix::fs::symlink(f.outside.join("net"), f.root.join("proc/net")).expect("link");
    std::fs::create_dir_all(f.root.join("etc/kubernetes")).expect("etc/kubernetes");
    std::os::unix::fs::symlink(
        f.outside.join("manifests"),
        f.root.join("etc/kubernetes/manifests"),
    )
    .expect("link");
    std::fs::create_dir_all(f.root.join("opt")).expect("opt");
    std::os::unix::fs::symlink(&f.outside, f.root.join("opt/nodeward")).expect("link");
    let outside_before = snapshot(&f.outside);
    let config = config(&f, &dead_url(), &TestCa::new("ca").ca_pem(), "1.34.1", "{}");
    let (_, v, c) = checks(&f, &config, &[]);
    status_is(&c, "Swap", "fail", "proc/swaps: a symlink");
    status_is(&c, "Port-10250", "fail", "proc/net is a symlink");
    status_is(
        &c,
        "DirAvailable--etc-kubernetes-manifests",
        "fail",
        "is a symlink",
    );
    status_is(&c, "DiskSpace", "fail", "opt/nodeward/node: a symlink");
    let all = v.to_string();
    assert!(
        !all.contains("outside-swap") && !all.contains("outside-pod"),
        "read through a link: {v:#}"
    );
    assert_eq!(snapshot(&f.outside), outside_before);
}

#[test]
fn the_ignore_list_takes_names_or_all_and_refuses_unknown_names() {
    let f = Fixture::new();
    fit_root(&f);
    f.put("proc/net/tcp", &format!("{HEADER_TCP}{LISTEN_10250}"));
    let config = config(&f, &dead_url(), &TestCa::new("ca").ca_pem(), "1.34.1", "{}");
    let (code, _, c) = checks(&f, &config, &[]);
    assert_eq!(code, 1);
    assert_eq!(c["Port-10250"]["ignored"], false);

    // By name, any case, comma-separated or repeated.
    let (code, v, c) = checks(
        &f,
        &config,
        &[
            "--ignore-preflight-errors=port-10250",
            "--ignore-preflight-errors",
            "APIServerReachable",
        ],
    );
    assert_eq!(code, 0, "{v:#}");
    assert_eq!(v["passed"], true);
    assert_eq!(c["Port-10250"]["status"], "fail");
    assert_eq!(c["Port-10250"]["ignored"], true);
    assert_eq!(c["APIServerReachable"]["ignored"], true);
    assert_eq!(c["Swap"]["ignored"], false, "only failures are ignored");
    let out = preflight(
        &f,
        &config,
        &["--ignore-preflight-errors=Port-10250,APIServerReachable"],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("Port-10250 ") && l.contains(" ignored ")),
        "{text}"
    );
    assert!(text.contains("2 failed but ignored"), "{text}");

    // Only some: still refused, naming what is left.
    let out = preflight(&f, &config, &["--ignore-preflight-errors=Port-10250"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("APIServerReachable") && !err.contains("Port-10250:"),
        "{err}"
    );

    let (code, _, _) = checks(&f, &config, &["--ignore-preflight-errors=all"]);
    assert_eq!(code, 0);

    // A typo is a usage error listing the checks; nothing is checked.
    for bad in ["Port-1025", "all,Swap"] {
        let out = preflight(
            &f,
            &config,
            &[
                &format!("--ignore-preflight-errors={bad}"),
                "--output",
                "json",
            ],
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad}: {err}");
        assert!(out.stdout.is_empty(), "{bad}: checks ran");
        assert!(err.contains("--ignore-preflight-errors"), "{err}");
    }
    let out = preflight(&f, &config, &["--ignore-preflight-errors=Port-1025"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("\"Port-1025\"") && err.contains("Port-10250, Port-10248"),
        "{err}"
    );
}

#[test]
fn bootstrap_runs_the_checks_first_and_stops_before_changing_anything() {
    let f = Fixture::new();
    unfit_root(&f);
    let config = config(&f, &dead_url(), &TestCa::new("ca").ca_pem(), "1.34.1", "{}");
    // Pinned artifacts (never fetched): bootstrap refuses an unpinned config before its checks.
    let mut text = std::fs::read_to_string(&config).expect("config");
    text.push_str("downloads:\n");
    for (i, a) in ["kubelet", "containerd", "runc", "cni-plugins"]
        .iter()
        .enumerate()
    {
        text.push_str(&format!(
            "  {a}: {{url: \"http://127.0.0.1:9/{a}\", sha256: \"{}\"}}\n",
            i.to_string().repeat(64)
        ));
    }
    std::fs::write(&config, text).expect("pinned config");
    let state = f.tmp.path().join("state");
    let audit = f.tmp.path().join("audit");
    // The agent's own bookkeeping beneath the root: the node lock (taken before the checks).
    let host_tree = || {
        let mut t = snapshot(&f.root);
        t.retain(|k, _| !k.starts_with("run/nodeward"));
        t
    };
    let run = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_nodeward"))
            .args(args)
            .args(["--config", &config, "--output", "json"])
            .arg("--audit-dir")
            .arg(&audit)
            .env("NODEWARD_ROOT", &f.root)
            .env("NODEWARD_STATE_DIR", &state)
            .env_remove("NODEWARD_LOG")
            .output()
            .expect("nodeward")
    };
    let before = host_tree();
    let out = run(&["bootstrap"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    let v: Value = serde_json::from_slice(&out.stdout).expect("run report");
    let steps = v["steps"].as_array().expect("steps");
    assert_eq!(steps.len(), 1, "{v:#}");
    assert_eq!(steps[0]["name"], "preflight-checks");
    assert_eq!(steps[0]["phase"], false);
    assert!(
        v["error"]
            .as_str()
            .is_some_and(|e| e.contains("Port-10250: port 10250") && e.contains("CRISocket")),
        "{v:#}"
    );
    assert_eq!(v["mutations"], 0);
    assert_eq!(host_tree(), before, "a refused bootstrap changed the root");

    // An unknown name is a usage error for bootstrap and upgrade too, before anything runs.
    for cmd in ["bootstrap", "upgrade"] {
        let out = run(&[cmd, "--ignore-preflight-errors=Nope"]);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{cmd}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.stdout.is_empty(), "{cmd} ran");
    }
    assert_eq!(host_tree(), before);
}

#[test]
fn an_unprivileged_user_fails_is_privileged_user() {
    let f = Fixture::new();
    fit_root(&f);
    let config = config(&f, &dead_url(), &TestCa::new("ca").ca_pem(), "1.34.1", "{}");
    // Readable by nobody: the temp directory is 0700.
    let mut p = f.tmp.path().to_path_buf();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    p.push("node.yaml");
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let out = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(env!("CARGO_BIN_EXE_nodeward"))
        .args(["preflight", "--config", &config, "--output", "json"])
        .args(["--ignore-preflight-errors=APIServerReachable"])
        .env("NODEWARD_ROOT", &f.root)
        .output()
        .expect("setpriv (util-linux)");
    let v: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(out.status.code(), Some(1));
    let c = v["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .find(|c| c["name"] == "IsPrivilegedUser")
        .expect("IsPrivilegedUser");
    assert_eq!(c["status"], "fail", "{c}");
    assert!(
        c["message"]
            .as_str()
            .is_some_and(|m| m.contains("uid 65534")),
        "{c}"
    );
}
