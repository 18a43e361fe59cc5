//! `network` capability, for real, through the probe guest.
//!
//! Every test acts only inside a network namespace of its own. A test process is
//! multi-threaded, so it cannot `unshare(CLONE_NEWNET)` itself; instead each test re-executes
//! this test binary for just itself under `unshare --net`, with `NODEWARD_IN_NET_NS` set to the
//! host namespace's id. The child refuses to touch a link unless its own namespace differs,
//! builds its links with `ip`, runs the body and exits; its links die with its namespace. A
//! pod's namespace is a `sleep` started under `unshare --net` (killed by its PID at the end).
//! Without root the tests fail, saying so.

mod common;

use common::{Probe, err_kind, ok};
use nodeward::audit::Redactor;
use nodeward::caps::RunContext;
use nodeward::grants::{Grants, NetworkGrant};
use nodeward::hostpath::HostRoot;
use nodeward::plan::{ChangeKind, RunMode};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::process::{Child, Command};

const IN_NS: &str = "NODEWARD_IN_NET_NS";

/// Runs `body` inside a fresh network namespace (see the module docs).
fn in_net_ns(name: &str, body: impl FnOnce()) {
    if let Some(host_ns) = std::env::var_os(IN_NS) {
        let own = std::fs::read_link("/proc/self/ns/net").expect("own network namespace");
        assert_ne!(
            own.as_os_str(),
            host_ns,
            "refusing to touch links: not in a network namespace of this test's own"
        );
        body();
        return;
    }
    assert!(
        rustix::process::geteuid().is_root(),
        "{name}: links need root (CAP_NET_ADMIN) in a network namespace; run as root"
    );
    let host_ns = std::fs::read_link("/proc/self/ns/net").expect("host network namespace");
    let host_links = links();
    let exe = std::env::current_exe().expect("test binary");
    let out = Command::new("unshare")
        .arg("--net")
        .arg(exe)
        .args([
            "--exact",
            name,
            "--nocapture",
            "--include-ignored",
            "--test-threads=1",
        ])
        .env(IN_NS, host_ns)
        .output()
        .expect("run unshare");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "{name} in a network namespace: {}\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        out.status
    );
    assert_eq!(links(), host_links, "the host's links changed");
}

/// `ip ARGS`, which must succeed.
fn ip(args: &str) {
    let out = Command::new("ip")
        .args(args.split_whitespace())
        .output()
        .expect("ip");
    assert!(
        out.status.success(),
        "ip {args}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The names of the host namespace's links (sysfs, mounted there).
fn links() -> BTreeSet<String> {
    std::fs::read_dir("/sys/class/net")
        .expect("/sys/class/net")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect()
}

fn names(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// A process in a network namespace of its own: a pod's, for the far end of a veth.
struct Pod(Child);

impl Pod {
    fn start() -> Pod {
        let pod = Pod(Command::new("unshare")
            .args(["--net", "sleep", "60"])
            .spawn()
            .expect("unshare sleep"));
        // Wait until the child is in its own namespace.
        let me = std::fs::read_link("/proc/self/ns/net").expect("ns");
        for _ in 0..200 {
            let ns = std::fs::read_link(format!("/proc/{}/ns/net", pod.0.id()));
            if ns.is_ok_and(|n| n != me) {
                return pod;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        panic!("the pod namespace did not appear");
    }

    /// Moves `link` into the pod's namespace.
    fn take(&self, link: &str) {
        ip(&format!("link set {link} netns {}", self.0.id()));
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The names of this namespace's links, as `ip` lists them (`/sys/class/net` shows the
/// namespace sysfs was mounted in: the host's, under `unshare --net` alone).
fn links_here() -> BTreeSet<String> {
    let out = Command::new("ip")
        .args(["-o", "link", "show"])
        .output()
        .expect("ip link");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split(": ").nth(1))
        .map(|n| n.split('@').next().unwrap_or(n).to_string())
        .collect()
}

fn grants(bridges: &[&str]) -> Grants {
    let g = Grants {
        network: NetworkGrant {
            bridges: bridges.iter().map(|s| s.to_string()).collect(),
            node_bridge: false,
        },
        ..Grants::default()
    };
    g.validate().expect("valid grants");
    g
}

fn delete(name: &str) -> Value {
    json!({"op": "network.delete-bridge", "name": name})
}

fn probe(mode: RunMode) -> (tempfile::TempDir, Probe) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let session = RunContext::new(
        HostRoot::open(tmp.path()).expect("root"),
        mode,
        Redactor::default(),
    );
    (tmp, Probe::with_session(session))
}

/// The links of a node with two pods on `cni0`, plus what is not the node's: a veth pair
/// both of whose ends are here (`vb`/`vb-peer`, on the bridge: an operator's), one linking the
/// bridge to another bridge (`vc` on `cni0`, `vc-peer` on `br-other`), an unrelated veth pair
/// and another bridge. Every port of `cni0` is a veth.
fn node_links(pod: &Pod) {
    ip("link set lo up");
    ip("link add cni0 type bridge");
    ip("link add br-other type bridge");
    for (a, b) in [
        ("va1", "pod1-eth0"),
        ("va2", "pod2-eth0"),
        ("vb", "vb-peer"),
        ("vc", "vc-peer"),
        ("vx", "vy"),
    ] {
        ip(&format!("link add {a} type veth peer name {b}"));
    }
    pod.take("pod1-eth0");
    pod.take("pod2-eth0");
    for port in ["va1", "va2", "vb", "vc"] {
        ip(&format!("link set {port} master cni0"));
    }
    ip("link set vc-peer master br-other");
}

#[test]
fn deletes_the_bridge_and_only_its_veths() {
    in_net_ns("deletes_the_bridge_and_only_its_veths", || {
        let pod = Pod::start();
        node_links(&pod);
        let (_tmp, p) = probe(RunMode::Apply);
        let g = grants(&["cni0"]);
        assert_eq!(ok(&p.call(&g, delete("cni0"))), "removed");
        assert_eq!(
            links_here(),
            names(&[
                "lo", "br-other", "vb", "vb-peer", "vc", "vc-peer", "vx", "vy"
            ])
        );
        let changes: Vec<ChangeKind> = p.changes().into_iter().map(|c| c.kind).collect();
        let deleted: Vec<(&str, &str)> = changes
            .iter()
            .filter_map(|c| match c {
                ChangeKind::LinkDelete {
                    link, link_kind, ..
                } => Some((link.as_str(), link_kind.as_str())),
                _ => None,
            })
            .collect();
        assert_eq!(
            deleted,
            [("va1", "veth"), ("va2", "veth"), ("cni0", "bridge")]
        );
        let notes = format!("{changes:?}");
        assert!(
            notes.contains("vb: its peer vb-peer is in this namespace"),
            "an operator's pair is released, and named: {notes}"
        );
        assert!(notes.contains("vc: its peer vc-peer"), "{notes}");
        let records = p.audit();
        let per_link: Vec<_> = records
            .iter()
            .filter(|r| r.call == "network.delete-link")
            .collect();
        assert_eq!(per_link.len(), 3, "one audit record per deleted link");
        let bridge_record = format!("{:?}", per_link[2]);
        assert!(
            bridge_record.contains("vb: its peer vb-peer")
                && bridge_record.contains("vc: its peer"),
            "the bridge's record names what it released: {bridge_record}"
        );
        assert_eq!(ok(&p.call(&g, delete("cni0"))), "unchanged");
        assert_eq!(
            p.changes().len(),
            changes.len(),
            "a second call changes nothing"
        );
    });
}

#[test]
fn plan_lists_the_links_and_deletes_none() {
    in_net_ns("plan_lists_the_links_and_deletes_none", || {
        let pod = Pod::start();
        node_links(&pod);
        let before = links_here();
        let (_tmp, p) = probe(RunMode::Plan);
        assert_eq!(ok(&p.call(&grants(&["cni0*"]), delete("cni0"))), "removed");
        assert_eq!(links_here(), before);
        assert_eq!(p.changes().len(), 3, "{:?}", p.changes());
    });
}

#[test]
fn refuses_ungranted_malformed_and_non_bridge_names() {
    in_net_ns("refuses_ungranted_malformed_and_non_bridge_names", || {
        let pod = Pod::start();
        node_links(&pod);
        let before = links_here();
        let (_tmp, p) = probe(RunMode::Apply);
        let g = grants(&["cni1", "nwbr*"]);
        let r = p.call(&g, delete("cni0"));
        assert_eq!(err_kind(&r), "denied", "{r}");
        for bad in ["", "lo", "a/b", "abcdefghijklmnop", "cni0 ", "..", "x\n"] {
            let r = p.call(&g, delete(bad));
            assert_eq!(err_kind(&r), "invalid-argument", "{bad:?}: {r}");
        }
        // Granted by pattern, but a veth: nothing deleted.
        let r = p.call(&grants(&["va*"]), delete("va1"));
        assert_eq!(err_kind(&r), "failed", "{r}");
        assert!(r.to_string().contains("not a bridge"), "{r}");
        // Only the run's node bridge passes `node-bridge`.
        let node = Grants {
            network: NetworkGrant {
                node_bridge: true,
                ..Default::default()
            },
            ..Grants::default()
        };
        let r = &p.run_with_bridge(&node, Some("br-other"), json!([delete("cni0")]))[0];
        assert_eq!(err_kind(r), "denied", "{r}");
        let r = &p.run_with_bridge(&node, None, json!([delete("cni0")]))[0];
        assert_eq!(err_kind(r), "denied", "{r}");
        // An uplink's name, even as the node bridge.
        ip("link add eth7 type bridge");
        let r = &p.run_with_bridge(&node, Some("eth7"), json!([delete("eth7")]))[0];
        assert_eq!(err_kind(r), "denied", "{r}");
        ip("link del eth7");
        assert_eq!(links_here(), before, "nothing deleted");
        assert!(p.changes().is_empty());
        let denied = p.audit().iter().filter(|r| r.denied).count();
        assert_eq!(denied, 4, "each refusal audited as denied");
        let r = &p.run_with_bridge(&node, Some("cni0"), json!([delete("cni0")]))[0];
        assert_eq!(ok(r), "removed");
    });
}

#[test]
fn an_altname_is_never_taken_for_the_name() {
    in_net_ns("an_altname_is_never_taken_for_the_name", || {
        ip("link add realbr type bridge");
        ip("link property add dev realbr altname cni0");
        // `ip link show cni0` resolves the altname: the kernel's own lookup would find it.
        ip("link show cni0");
        let (_tmp, p) = probe(RunMode::Apply);
        assert_eq!(ok(&p.call(&grants(&["cni0"]), delete("cni0"))), "unchanged");
        assert!(links_here().contains("realbr"));
    });
}

#[test]
fn a_default_route_through_the_bridge_or_a_port_refuses_the_call() {
    in_net_ns(
        "a_default_route_through_the_bridge_or_a_port_refuses_the_call",
        || {
            let pod = Pod::start();
            node_links(&pod);
            for l in ["cni0", "vb", "vb-peer", "va1"] {
                ip(&format!("link set {l} up"));
            }
            ip("addr add 10.9.0.1/24 dev cni0");
            ip("addr add 10.8.0.1/24 dev vb-peer");
            let before = links_here();
            let (_tmp, p) = probe(RunMode::Apply);
            let g = grants(&["cni0"]);
            let routes = [
                // Through the bridge, main table.
                (
                    "route add default via 10.9.0.2 dev cni0",
                    "route del default via 10.9.0.2 dev cni0",
                ),
                // Through a pod's veth, in another table.
                (
                    "route add default dev va1 table 100",
                    "route del default table 100",
                ),
                // Half the address space each (a VPN's trick), through the bridge.
                (
                    "route add 0.0.0.0/1 via 10.9.0.2 dev cni0",
                    "route del 0.0.0.0/1",
                ),
                (
                    "route add 128.0.0.0/1 dev va1 table 103",
                    "route del 128.0.0.0/1 table 103",
                ),
                // A multipath next hop (IPv4 ECMP) in another table.
                (
                    "route add default table 101 nexthop via 10.9.0.2 dev cni0 nexthop via 10.8.0.2 dev vb-peer",
                    "route del default table 101",
                ),
                // A nexthop object in a group.
                (
                    "nexthop add id 10 via 10.9.0.2 dev cni0",
                    "nexthop del id 10",
                ),
            ];
            for (add, del) in routes {
                ip(add);
                if add.starts_with("nexthop") {
                    ip("nexthop add id 11 group 10");
                    ip("route add default nhid 11 table 102");
                }
                let r = p.call(&g, delete("cni0"));
                assert_eq!(err_kind(&r), "denied", "{add}: {r}");
                assert!(r.to_string().contains("default route"), "{r}");
                assert_eq!(links_here(), before, "{add}: nothing deleted");
                if add.starts_with("nexthop") {
                    ip("route del default table 102");
                    ip("nexthop del id 11");
                }
                ip(del);
            }
            // IPv6 too.
            ip("-6 addr add fd00::1/64 dev cni0 nodad");
            ip("-6 route add default via fd00::2 dev cni0");
            let r = p.call(&g, delete("cni0"));
            assert_eq!(err_kind(&r), "denied", "{r}");
            ip("-6 route del default via fd00::2 dev cni0");
            ip("-6 route add 8000::/1 via fd00::2 dev cni0");
            let r = p.call(&g, delete("cni0"));
            assert_eq!(err_kind(&r), "denied", "::/1: {r}");
            ip("-6 route del 8000::/1 via fd00::2 dev cni0");
            // A /2 is no default; nor is a default route through a released port's peer.
            ip("route add 64.0.0.0/2 via 10.9.0.2 dev cni0");
            ip("route add default via 10.8.0.2 dev vb-peer table 100");
            // A default route elsewhere does not matter.
            ip("link add up0 type veth peer name up1");
            ip("link set up0 up");
            ip("link set up1 up");
            ip("addr add 10.7.0.1/24 dev up0");
            ip("route add default via 10.7.0.2 dev up0");
            assert!(p.changes().is_empty());
            assert_eq!(ok(&p.call(&g, delete("cni0"))), "removed");
            assert!(links_here().contains("up0"));
        },
    );
}

#[test]
fn a_namespace_with_more_links_than_the_limit_is_refused() {
    in_net_ns(
        "a_namespace_with_more_links_than_the_limit_is_refused",
        || {
            let pod = Pod::start();
            node_links(&pod);
            let before = links_here();
            let tmp = tempfile::tempdir().expect("tempdir");
            let mut session = RunContext::new(
                HostRoot::open(tmp.path()).expect("root"),
                RunMode::Apply,
                Redactor::default(),
            );
            session.network.limits.max_links = before.len() - 1;
            let p = Probe::with_session(session);
            let r = p.call(&grants(&["cni0"]), delete("cni0"));
            assert_eq!(err_kind(&r), "failed", "{r}");
            assert!(
                r.to_string()
                    .contains(&format!("more than {}", before.len() - 1)),
                "{r}"
            );
            assert_eq!(links_here(), before);
        },
    );
}

/// Calls `delete-bridge cni0` in plan mode, then in apply mode: both refuse alike (`denied`,
/// the message holding each of `says`), record no change, and nothing is deleted.
fn refused_in_both_modes(says: &[&str]) {
    let before = links_here();
    for mode in [RunMode::Plan, RunMode::Apply] {
        let (_tmp, p) = probe(mode);
        let r = p.call(&grants(&["cni0"]), delete("cni0"));
        assert_eq!(err_kind(&r), "denied", "{mode:?}: {r}");
        for s in says {
            assert!(r.to_string().contains(s), "{mode:?}, {s:?}: {r}");
        }
        assert!(r.to_string().contains("nothing deleted"), "{r}");
        assert!(p.changes().is_empty(), "{mode:?}: {:?}", p.changes());
        assert_eq!(links_here(), before, "{mode:?}: nothing deleted");
    }
}

#[test]
fn a_link_stacked_on_the_bridge_or_a_veth_refuses_the_call() {
    in_net_ns(
        "a_link_stacked_on_the_bridge_or_a_veth_refuses_the_call",
        || {
            let pod = Pod::start();
            node_links(&pod);
            // What the kernel does: an upper goes with its lower, unasked.
            ip("link add low0 type bridge");
            ip("link add link low0 name up0 type macvlan");
            ip("link del low0");
            assert!(!links_here().contains("up0"), "the kernel took the macvlan");
            let stacked = [
                // IFLA_LINK names the lower link.
                (
                    "link add link cni0 name mv0 type macvlan mode bridge",
                    "mv0 (kind macvlan), stacked on cni0",
                    "link del mv0",
                ),
                // A vxlan names it in its own attributes (IFLA_VXLAN_LINK).
                (
                    "link add vx0 type vxlan id 5 dstport 4789 dev va1",
                    "vx0 (kind vxlan), stacked on va1",
                    "link del vx0",
                ),
            ];
            for (add, says, del) in stacked {
                ip(add);
                refused_in_both_modes(&[says]);
                ip(del);
            }
            // Stacked on a port that is only released (vb): it stays, and so may its upper.
            ip("link add vx1 type vxlan id 6 dstport 4790 dev vb");
            let (_tmp, p) = probe(RunMode::Apply);
            assert_eq!(ok(&p.call(&grants(&["cni0"]), delete("cni0"))), "removed");
            assert!(links_here().contains("vx1") && links_here().contains("vb"));
        },
    );
}

#[test]
fn a_port_that_is_not_a_veth_refuses_the_call() {
    in_net_ns("a_port_that_is_not_a_veth_refuses_the_call", || {
        let pod = Pod::start();
        node_links(&pod);
        let ports = [
            (
                "tuntap add tap0 mode tap",
                "tap0 (kind tun)",
                "link del tap0",
            ),
            (
                "link add vxp type vxlan id 9 dstport 4791",
                "vxp (kind vxlan)",
                "link del vxp",
            ),
        ];
        for (add, says, del) in ports {
            ip(add);
            let port = says.split(' ').next().unwrap_or(says);
            ip(&format!("link set {port} master cni0"));
            refused_in_both_modes(&[says, "not a veth"]);
            ip(del);
        }
        let (_tmp, p) = probe(RunMode::Apply);
        assert_eq!(ok(&p.call(&grants(&["cni0"]), delete("cni0"))), "removed");
    });
}

/// `ip -batch -` with `lines` on its standard input, which must succeed.
fn ip_batch(lines: &str) {
    use std::io::Write;
    let mut child = Command::new("ip")
        .args(["-batch", "-"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect("ip -batch");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(lines.as_bytes())
        .expect("write the batch");
    assert!(child.wait().expect("ip -batch").success(), "ip -batch");
}

#[test]
fn a_full_routing_table_is_read_to_its_end() {
    in_net_ns("a_full_routing_table_is_read_to_its_end", || {
        let pod = Pod::start();
        node_links(&pod);
        ip("link set vx up");
        ip("link set cni0 up");
        ip("addr add 10.9.0.1/24 dev cni0");
        // More routes than the former limit of 65536 (a BGP table has ~1M), through a link
        // that stays; then a default route through the bridge in a later table.
        let batch: String = (0..70_000u32)
            .map(|i| {
                let (a, b, c) = (16 + i / 65536, (i / 256) % 256, i % 256);
                format!("route add 10.{a}.{b}.{c}/32 dev vx table 7\n")
            })
            .collect();
        ip_batch(&batch);
        ip("route add default via 10.9.0.2 dev cni0 table 200");
        refused_in_both_modes(&["default route"]);
        ip("route del default table 200");
        let (_tmp, p) = probe(RunMode::Apply);
        assert_eq!(ok(&p.call(&grants(&["cni0"]), delete("cni0"))), "removed");
    });
}
