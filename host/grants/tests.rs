//! Unit tests of the grant checks.

use super::*;

fn grants() -> Grants {
    Grants {
        fs: FsGrant {
            read: vec!["etc/sysctl.d".into()],
            write: vec!["etc/containerd".into()],
        },
        kernel: KernelGrant {
            modules: vec!["overlay".into()],
            sysctls: vec!["net.ipv4.ip_forward".into(), "net.bridge.*".into()],
            swap_off: false,
        },
        systemd: SystemdGrant {
            start: vec!["kube*.service".into()],
            ..Default::default()
        },
        download: DownloadGrant {
            urls: vec!["https://dl.k8s.io".into()],
            ..Default::default()
        },
        ..Default::default()
    }
}

#[test]
fn default_denies_everything() {
    let g = Grants::default();
    let p = HostPath::parse("etc/x").expect("path");
    assert!(!g.may_read(&p) && !g.may_write(&p) && !g.may_mount(&p));
    assert!(!g.may_load_module("overlay") && !g.may_sysctl("net.ipv4.ip_forward"));
    assert!(!g.may_unit(UnitVerb::Start, "kubelet.service"));
    assert!(!g.may_download(&url::Url::parse("https://dl.k8s.io/x").expect("url")));
}

#[test]
fn matches_as_documented() {
    let g = grants();
    g.validate().expect("valid");
    let p = |s| HostPath::parse(s).expect("path");
    assert!(g.may_read(&p("etc/sysctl.d/a.conf")) && !g.may_write(&p("etc/sysctl.d/a.conf")));
    assert!(
        g.may_read(&p("etc/containerd/config.toml")),
        "write implies read"
    );
    assert!(!g.may_write(&p("etc/containerd-old")));
    assert!(g.may_sysctl("net.bridge.bridge-nf-call-iptables"));
    assert!(!g.may_sysctl("net.ipv4.conf.all.forwarding"));
    assert!(g.may_unit(UnitVerb::Start, "kubelet.service"));
    assert!(!g.may_unit(UnitVerb::Enable, "kubelet.service"));
    let u = |s| url::Url::parse(s).expect("url");
    assert!(g.may_download(&u("https://dl.k8s.io/release/v1/kubelet")));
    assert!(!g.may_download(&u("https://dl.k8s.io.evil.example/kubelet")));
    assert!(!g.may_download(&u("http://dl.k8s.io/kubelet")));
}

#[test]
fn wildcard_host_and_port() {
    let g = Grants {
        download: DownloadGrant {
            urls: vec!["https://*/".into(), "http://127.0.0.1:*/files/".into()],
            ..Default::default()
        },
        ..Default::default()
    };
    g.validate().expect("valid");
    let u = |s| url::Url::parse(s).expect("url");
    assert!(g.may_download(&u("https://mirror.example/k/kubelet")));
    assert!(
        !g.may_download(&u("https://mirror.example:8443/k")),
        "any host, but the default port unless the port is * too"
    );
    let any = Grants {
        download: DownloadGrant {
            urls: vec!["https://*:*/".into()],
            ..Default::default()
        },
        ..Default::default()
    };
    assert!(any.may_download(&u("https://mirror.example:8443/k")));
    assert!(!g.may_download(&u("http://mirror.example/k")), "https only");
    assert!(!g.may_download(&u("https://user:pw@mirror.example/k")));
    assert!(g.may_download(&u("http://127.0.0.1:41234/files/kubelet")));
    assert!(g.may_download(&u("http://127.0.0.1/files/kubelet")));
    assert!(!g.may_download(&u("http://127.0.0.1:41234/other")));
    assert!(!g.may_download(&u("http://127.0.0.2:41234/files/x")));
    assert!(!g.may_download(&u("http://localhost:41234/files/x")));
    let exact = Grants {
        download: DownloadGrant {
            urls: vec!["http://127.0.0.1:8080/".into()],
            ..Default::default()
        },
        ..Default::default()
    };
    assert!(exact.may_download(&u("http://127.0.0.1:8080/x")));
    assert!(!exact.may_download(&u("http://127.0.0.1:8081/x")));
    assert!(!exact.may_download(&u("http://127.0.0.1/x")));
    for bad in [
        "https://*.example/",
        "https://a*/",
        "https://*:8*/",
        "https://u@*/",
    ] {
        let g = Grants {
            download: DownloadGrant {
                urls: vec![bad.into()],
                ..Default::default()
            },
            ..Default::default()
        };
        assert!(g.validate().is_err(), "{bad} must be refused");
    }
}

#[test]
fn malformed_entries_refuse_the_manifest() {
    let mut g = grants();
    g.fs.write.push("/etc".into());
    assert_eq!(g.validate().expect_err("absolute").field, "fs.write");
    let mut g = grants();
    g.download.urls.push("ftp://x/".into());
    assert_eq!(g.validate().expect_err("ftp").field, "download.urls");
    let mut g = grants();
    g.kernel.modules.push("../evil".into());
    assert_eq!(g.validate().expect_err("module").field, "kernel.modules");
    let mut g = grants();
    g.systemd.write.push("a/b.service".into());
    assert_eq!(g.validate().expect_err("unit").field, "systemd.write");
}

#[test]
fn a_bridge_pattern_that_could_reach_another_tools_bridge_refuses_the_manifest() {
    let with = |b: &str| Grants {
        network: NetworkGrant {
            bridges: vec!["cni0".into(), b.into()],
            node_bridge: false,
        },
        ..Default::default()
    };
    for (entry, family) in [
        ("cni*", "cni-podman*"),
        ("*", ""),
        ("docker*", "docker*"),
        ("br-*", "br-*"),
        ("lxdbr0", "lxdbr*"),
        ("incus*", "incusbr*"),
        ("vmbr1", "vmbr*"),
    ] {
        let e = with(entry).validate().expect_err(entry);
        assert_eq!(
            (e.field.as_str(), e.entry.as_str()),
            ("network.bridges", entry)
        );
        assert!(e.to_string().contains(family), "{entry}: {e}");
    }
    for entry in ["cni0*", "nwbr*", "kube-bridge"] {
        with(entry).validate().expect(entry);
    }
}
