//! The `start-node` phase without systemd: plans the units' reload, enable and start, and
//! refuses without binaries, grants or a writable unit directory.

use super::*;

fn ready(f: &Fixture) {
    put_version(f, VERSION, true);
    std::os::unix::fs::symlink(VERSION, f.root.join("opt/nodeward/node/current")).expect("current");
    std::fs::create_dir_all(f.root.join("etc/systemd/system")).expect("unit dir");
}

/// The planned contents of a unit file, from its diff.
fn planned_unit(changes: &[Value], unit: &str) -> String {
    let path = format!("etc/systemd/system/{unit}");
    let c = changes
        .iter()
        .find(|c| c["kind"] == "file-create" && c["path"] == path.as_str())
        .unwrap_or_else(|| panic!("no file-create of {path}: {changes:?}"));
    c["diff"]
        .as_str()
        .expect("diff")
        .lines()
        .filter(|l| l.starts_with('+') && !l.starts_with("+++"))
        .map(|l| format!("{}\n", &l[1..]))
        .collect()
}

#[test]
fn plans_units_reload_enable_and_start_without_systemd() {
    let f = Fixture::new();
    ready(&f);
    let before = snapshot(&f.root);
    let s = f.session(RunMode::Plan);
    let root = f.root.display().to_string();
    let out = phase(&s, "start-node", &input(&f)).expect("plan");
    assert_eq!(
        out.report.changed,
        ["units", "containerd-started", "kubelet-started"]
    );
    assert_eq!(snapshot(&f.root), before);
    no_denials(&s, "start-node");
    let changes = changes_json(&s);
    let kinds: Vec<String> = changes
        .iter()
        .filter(|c| c["kind"] != "file-create")
        .map(|c| {
            format!(
                "{} {}",
                c["kind"].as_str().unwrap_or(""),
                c["unit"].as_str().unwrap_or("")
            )
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "unit-write nodeward-containerd.service",
            "unit-write nodeward-kubelet.service",
            "daemon-reload ",
            "unit-enable nodeward-containerd.service",
            "unit-enable nodeward-kubelet.service",
            "unit-start nodeward-containerd.service",
            "unit-start nodeward-kubelet.service",
        ]
    );
    let containerd = planned_unit(&changes, "nodeward-containerd.service");
    for want in [
        format!(
            "ExecStart={root}/opt/nodeward/node/current/bin/containerd --config {root}/etc/containerd/config.toml\n"
        ),
        format!(
            "Environment=PATH={root}/opt/nodeward/node/current/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n"
        ),
        "Type=notify\n".into(),
        "Delegate=yes\n".into(),
        "KillMode=mixed\n".into(),
        "Restart=always\n".into(),
        "RestartSec=2\n".into(),
        "LimitNOFILE=infinity\n".into(),
        "TimeoutStopSec=30\n".into(),
        "WantedBy=multi-user.target\n".into(),
    ] {
        assert!(containerd.contains(&want), "{want} missing:\n{containerd}");
    }
    let kubelet = planned_unit(&changes, "nodeward-kubelet.service");
    for want in [
        "After=nodeward-containerd.service\n".to_string(),
        "Wants=nodeward-containerd.service\n".into(),
        format!("EnvironmentFile={root}/var/lib/kubelet/nodeward-flags.env\n"),
        format!("ExecStart={root}/opt/nodeward/node/current/bin/kubelet $KUBELET_ARGS\n"),
        "KillMode=mixed\n".into(),
        "WantedBy=multi-user.target\n".into(),
    ] {
        assert!(kubelet.contains(&want), "{want} missing:\n{kubelet}");
    }
}

#[test]
fn refuses_without_binaries_or_grants() {
    let f = Fixture::new();
    let s = f.session(RunMode::Plan);
    let err = phase(&s, "start-node", &input(&f)).expect_err("no binaries");
    assert!(err.to_string().contains("run install first"), "{err}");

    ready(&f);
    let g = bundle_grants("start-node");
    let units = ["nodeward-containerd.service", "nodeward-kubelet.service"];
    for list in [
        &g.systemd.write,
        &g.systemd.enable,
        &g.systemd.start,
        &g.systemd.status,
    ] {
        assert_eq!(list, &units, "exactly the node's units");
    }
    let mut no_reload = g.clone();
    no_reload.systemd.reload = false;
    let err = phase_with_grants(&s, "start-node", no_reload, &input(&f)).expect_err("reload");
    assert!(
        err.to_string().contains("daemon-reload") && err.to_string().contains("denied"),
        "{err}"
    );
    let mut no_enable = g;
    no_enable.systemd.enable.clear();
    let err = phase_with_grants(&s, "start-node", no_enable, &input(&f)).expect_err("enable");
    assert!(
        err.to_string()
            .contains("enabling nodeward-containerd.service"),
        "{err}"
    );
}

#[test]
fn refuses_a_root_it_cannot_write_into_units() {
    let f = Fixture::new();
    ready(&f);
    let s = f.session(RunMode::Plan);
    let mut input = input(&f);
    input.layout.root = "/tmp/a root".into();
    let err = phase(&s, "start-node", &input).expect_err("space");
    assert!(err.to_string().contains("/tmp/a root"), "{err}");
}
