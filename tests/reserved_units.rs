//! The agent's own unit is reserved in every unit directory systemd reads, under every
//! spelling, link and alias (`host/reserved.rs`, `host/caps/systemd/aliases.rs`; issue 26).
//!
//! Each test is an attack by a phase (the probe guest) with grants that cover unit
//! directories by prefix, or exactly the dependency directory `multi-user.target.wants`, on a
//! root where someone planted links: every call that would reach the agent's unit file, a
//! drop-in it reads, a dependency of it or the link that starts it at boot is refused (`denied`,
//! or `invalid-argument` for a second spelling of a path), and the agent's files stay byte for
//! byte as they were. The same grants still reach every other unit.

mod common;

use common::*;
use nodeward::plan::RunMode;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::os::unix::fs::symlink;

/// The agent's unit in `etc`, its copy in `usr/lib`, the link that starts it at boot (as
/// `systemctl enable` makes it) and an ordinary unit's link next to it.
fn units_root() -> Fixture {
    let f = Fixture::new();
    f.put("etc/systemd/system/nodeward.service", "[Service]\n");
    f.put("usr/lib/systemd/system/nodeward.service", "[Service]\n");
    f.put("etc/systemd/system/kubelet.service", "[Service]\n");
    f.put("etc/kubernetes/kubelet.conf", "x\n");
    let wants = f.root.join("etc/systemd/system/multi-user.target.wants");
    std::fs::create_dir_all(&wants).expect("wants");
    symlink("../nodeward.service", wants.join("nodeward.service")).expect("agent link");
    symlink("../kubelet.service", wants.join("kubelet.service")).expect("kubelet link");
    f
}

/// Everything beneath the unit directories, for before/after comparison.
fn unit_dirs(f: &Fixture) -> BTreeMap<String, (char, u32, Vec<u8>)> {
    let mut tree = snapshot(&f.root);
    tree.retain(|p, _| p.starts_with("etc/systemd") || p.starts_with("usr/lib"));
    tree
}

/// Asserts each result is a refusal: `denied` naming what is reserved, or `invalid-argument`
/// for a path spelled a second way.
fn all_refused(results: &[Value], calls: &Value) {
    for (r, call) in results.iter().zip(calls.as_array().expect("calls")) {
        let message = r
            .pointer("/err/message")
            .and_then(Value::as_str)
            .unwrap_or_default();
        match kind(r).as_str() {
            "denied" => assert!(
                message.contains("reserved") || message.contains("nodeward.service"),
                "{call}: the denial names what is reserved: {message}"
            ),
            "invalid-argument" => assert!(message.contains("invalid host path"), "{call}: {r}"),
            other => panic!("{call}: {other}: {r}"),
        }
    }
}

#[test]
fn the_agents_unit_its_drop_ins_dependencies_and_boot_link_are_refused_in_every_unit_dir() {
    let g = grants("[fs]\nwrite = [\"etc\", \"run\", \"usr\", \"lib\"]\n");
    let unit = "[Service]\nExecStart=/bin/true\n";
    let calls = json!([
        {"op": "fs.write-file", "path": "etc/systemd/system/nodeward.service", "contents": unit, "mode": 0o644},
        {"op": "fs.write-file", "path": "run/systemd/system/nodeward.service", "contents": unit, "mode": 0o644},
        {"op": "fs.write-file", "path": "usr/lib/systemd/system/nodeward.service", "contents": unit, "mode": 0o644},
        {"op": "fs.write-file", "path": "lib/systemd/system/nodeward.service", "contents": unit, "mode": 0o644},
        {"op": "fs.write-file", "path": "usr/local/lib/systemd/system/nodeward.service", "contents": unit, "mode": 0o644},
        {"op": "fs.create-dir", "path": "etc/systemd/system/nodeward.service.d", "mode": 0o755},
        {"op": "fs.create-dir", "path": "run/systemd/system/nodeward.service.d", "mode": 0o755},
        // The portable-service directories and the other directories systemd reads.
        {"op": "fs.write-file", "path": "etc/systemd/system.attached/nodeward.service", "contents": unit, "mode": 0o644},
        {"op": "fs.write-file", "path": "run/systemd/system.attached/nodeward.service", "contents": unit, "mode": 0o644},
        {"op": "fs.create-dir", "path": "etc/systemd/system.attached/nodeward.service.d", "mode": 0o755},
        {"op": "fs.create-dir", "path": "run/systemd/system.attached/nodeward.service.d", "mode": 0o755},
        {"op": "fs.write-file", "path": "etc/systemd/system.attached/service.d/env.conf", "contents": "[Service]\n", "mode": 0o644},
        {"op": "fs.write-file", "path": "run/systemd/system.attached/service.d/env.conf", "contents": "[Service]\n", "mode": 0o644},
        {"op": "fs.write-file", "path": "run/systemd/system.control/nodeward.service", "contents": unit, "mode": 0o644},
        {"op": "fs.write-file", "path": "run/systemd/generator.early/nodeward.service", "contents": unit, "mode": 0o644},
        {"op": "fs.write-file", "path": "run/systemd/generator/service.d/env.conf", "contents": "[Service]\n", "mode": 0o644},
        {"op": "fs.write-file", "path": "run/systemd/generator.late/nodeward.service.d/x.conf", "contents": "[Service]\n", "mode": 0o644},
        {"op": "fs.write-file", "path": "usr/local/lib/systemd/system/service.d/env.conf", "contents": "[Service]\n", "mode": 0o644},
        // The manager's configuration in every directory it is read from: `DefaultEnvironment=`.
        {"op": "fs.write-file", "path": "usr/lib/systemd/system.conf.d/env.conf", "contents": "[Manager]\n", "mode": 0o644},
        {"op": "fs.write-file", "path": "usr/local/lib/systemd/system.conf.d/env.conf", "contents": "[Manager]\n", "mode": 0o644},
        {"op": "fs.write-file", "path": "run/systemd/system.conf.d/env.conf", "contents": "[Manager]\n", "mode": 0o644},
        {"op": "fs.write-file", "path": "usr/lib/systemd/system/service.d/env.conf", "contents": "[Service]\n", "mode": 0o644},
        {"op": "fs.write-file", "path": "etc/systemd/system/system.slice.d/cpu.conf", "contents": "[Slice]\nCPUQuota=1%\n", "mode": 0o644},
        {"op": "fs.create-dir", "path": "etc/systemd/system/nodeward.service.requires", "mode": 0o755},
        // Case: the same file on a case-insensitive (casefold) directory.
        {"op": "fs.write-file", "path": "etc/systemd/system/NodeWard.service", "contents": unit, "mode": 0o644},
        {"op": "fs.write-file", "path": "etc/systemd/system/nodeward.service.D/x.conf", "contents": unit, "mode": 0o644},
        // Other spellings of the same path: refused before any grant is consulted.
        {"op": "fs.write-file", "path": "etc/systemd/system//nodeward.service", "contents": unit, "mode": 0o644},
        {"op": "fs.write-file", "path": "./etc/systemd/system/nodeward.service", "contents": unit, "mode": 0o644},
        {"op": "fs.write-file", "path": "etc/systemd/system/./nodeward.service", "contents": unit, "mode": 0o644},
        {"op": "fs.write-file", "path": "etc/systemd/system/nodeward.service/", "contents": unit, "mode": 0o644},
        {"op": "fs.remove", "path": "etc/systemd/system/../system/nodeward.service"},
        // The link that starts the agent at boot, and every way to take it away.
        {"op": "fs.remove", "path": "etc/systemd/system/multi-user.target.wants/nodeward.service"},
        {"op": "fs.remove-all", "path": "etc/systemd/system/multi-user.target.wants"},
        {"op": "fs.symlink", "target": "../kubelet.service", "path": "etc/systemd/system/multi-user.target.wants/nodeward.service"},
        {"op": "fs.symlink", "target": "../nodeward.service", "path": "etc/systemd/system/default.target.requires/nodeward.service"},
        // An alias of the agent's unit under another name.
        {"op": "fs.symlink", "target": "nodeward.service", "path": "etc/systemd/system/helper.service"},
    ]);
    for mode in [RunMode::Plan, RunMode::Apply] {
        let f = units_root();
        let before = unit_dirs(&f);
        let s = f.session(mode);
        let r = probe(&s, g.clone(), calls.clone());
        all_refused(&r, &calls);
        assert_eq!(
            unit_dirs(&f),
            before,
            "{mode:?}: the unit directories are as they were"
        );
        assert!(s.changes().is_empty(), "{mode:?}: {:?}", s.changes());

        // The same grant reaches every other unit, and its boot link.
        let fine = probe(
            &s,
            g.clone(),
            json!([
                {"op": "fs.create-dir", "path": "etc/systemd/system/kubelet.service.d", "mode": 0o755},
                {"op": "fs.write-file", "path": "etc/systemd/system/kubelet.service.d/10.conf", "contents": unit, "mode": 0o644},
                {"op": "fs.remove", "path": "etc/systemd/system/multi-user.target.wants/kubelet.service"},
                {"op": "fs.write-file", "path": "etc/systemd/system/nodeward-kubelet.service", "contents": unit, "mode": 0o644},
                {"op": "fs.read-file", "path": "etc/systemd/system/kubelet.service"},
            ]),
        );
        assert!(fine.iter().all(|r| kind(r) == "ok"), "{mode:?}: {fine:?}");
    }
}

#[test]
fn a_grant_on_a_dependency_directory_or_a_planted_link_does_not_reach_the_agent() {
    let f = units_root();
    // Planted by someone else in directories the phase may write: a link to the directory
    // holding the agent's boot link, and one to the agent's unit file itself.
    symlink(
        "../systemd/system/multi-user.target.wants",
        f.root.join("etc/kubernetes/wants"),
    )
    .expect("link");
    symlink(
        "../systemd/system/nodeward.service",
        f.root.join("etc/kubernetes/unit"),
    )
    .expect("link");
    let before = unit_dirs(&f);
    let s = f.session(RunMode::Apply);
    let g = grants(
        "[fs]\nwrite = [\"etc/systemd/system/multi-user.target.wants\", \"etc/kubernetes\"]\n",
    );
    let calls = json!([
        {"op": "fs.remove", "path": "etc/systemd/system/multi-user.target.wants/nodeward.service"},
        {"op": "fs.remove-all", "path": "etc/systemd/system/multi-user.target.wants"},
        {"op": "fs.remove", "path": "etc/kubernetes/wants/nodeward.service"},
        {"op": "fs.remove-all", "path": "etc/kubernetes/wants/nodeward.service"},
        {"op": "fs.read-file", "path": "etc/kubernetes/unit"},
        {"op": "fs.create-dir", "path": "etc/kubernetes/unit/x", "mode": 0o755},
        {"op": "fs.list-dir", "path": "etc/kubernetes/wants/nodeward.service"},
    ]);
    let r = probe(&s, g.clone(), calls.clone());
    all_refused(&r, &calls);
    assert_eq!(unit_dirs(&f), before);
    // The planted links themselves are the phase's to remove; the kubelet's boot link too.
    let fine = probe(
        &s,
        g,
        json!([
            {"op": "fs.remove", "path": "etc/kubernetes/unit"},
            {"op": "fs.remove", "path": "etc/kubernetes/wants"},
            {"op": "fs.remove", "path": "etc/systemd/system/multi-user.target.wants/kubelet.service"},
        ]),
    );
    assert!(fine.iter().all(|r| kind(r) == "ok"), "{fine:?}");
    let agent_link = f
        .root
        .join("etc/systemd/system/multi-user.target.wants/nodeward.service");
    assert_eq!(
        std::fs::read_link(agent_link).expect("the agent's boot link is still there"),
        std::path::Path::new("../nodeward.service")
    );
}

#[test]
fn mounts_and_downloads_over_the_agents_boot_link_are_refused() {
    let f = units_root();
    let before = unit_dirs(&f);
    let s = f.session(RunMode::Plan);
    let g = grants(
        "[fs]\nwrite = [\"etc/systemd\"]\n[mounts]\ntargets = [\"etc/systemd\"]\n\
         [download]\nurls = [\"http://127.0.0.1:*/\"]\n",
    );
    let sha = "0".repeat(64);
    let calls = json!([
        {"op": "mounts.tmpfs", "target": "etc/systemd/system/multi-user.target.wants", "size-bytes": 1048576},
        {"op": "mounts.tmpfs", "target": "etc/systemd/system", "size-bytes": 1048576},
        {"op": "download.fetch", "url": "http://127.0.0.1:9/u", "sha256": sha, "dest": "etc/systemd/system/multi-user.target.wants/nodeward.service", "mode": 0o644},
        {"op": "download.fetch-and-extract", "url": "http://127.0.0.1:9/u.tar", "sha256": sha, "dest-dir": "etc/systemd/system/multi-user.target.wants", "strip-components": 0},
    ]);
    let r = probe(&s, g, calls.clone());
    all_refused(&r, &calls);
    assert_eq!(unit_dirs(&f), before);
    assert!(s.changes().is_empty(), "{:?}", s.changes());
}

#[test]
fn the_agents_unit_under_another_name_is_not_a_phases_to_drive() {
    let f = units_root();
    // Aliases planted by someone else: a link in `etc` to the agent's unit, and a chain from
    // `usr/lib` through it (an absolute target, as `systemctl link` makes them).
    symlink(
        "nodeward.service",
        f.root.join("etc/systemd/system/helper.service"),
    )
    .expect("alias");
    symlink(
        "/etc/systemd/system/helper.service",
        f.root.join("usr/lib/systemd/system/chain.service"),
    )
    .expect("chain");
    // Units whose [Install] section would link the agent: as an alias (shadowing a unit in
    // usr/lib), as a dependency of it, or enabled and disabled along with it (in a drop-in).
    f.put(
        "etc/systemd/system/evil.service",
        "[Service]\nExecStart=/bin/true\n[Install]\nWantedBy=multi-user.target\nAlias=nodeward.service\n",
    );
    f.put(
        "etc/systemd/system/needy.service",
        "[Service]\nExecStart=/bin/true\n[Install]\nRequiredBy=nodeward.service\n",
    );
    f.put(
        "etc/systemd/system/also.service",
        "[Service]\n[Install]\nWantedBy=multi-user.target\n",
    );
    f.put(
        "run/systemd/system/also.service.d/10-also.conf",
        "[Install]\nAlso=nodeward.service\n",
    );
    f.put(
        "etc/systemd/system/fine.service",
        "[Service]\nExecStart=/bin/true\n[Install]\nWantedBy=multi-user.target\n",
    );
    let before = unit_dirs(&f);
    let s = f.session(RunMode::Plan);
    let g = grants(
        "[systemd]\nwrite = [\"*\"]\nenable = [\"*\"]\nstart = [\"*\"]\nmask = [\"*\"]\n\
         status = [\"*\"]\n",
    );
    let calls = json!([
        {"op": "systemd.stop", "unit": "helper.service"},
        {"op": "systemd.restart", "unit": "chain.service"},
        {"op": "systemd.disable", "unit": "helper.service"},
        {"op": "systemd.mask", "unit": "helper.service"},
        {"op": "systemd.remove-unit", "unit": "helper.service"},
        {"op": "systemd.stop", "unit": "NODEWARD.service"},
        {"op": "systemd.enable", "unit": "evil.service"},
        {"op": "systemd.enable", "unit": "needy.service"},
        {"op": "systemd.disable", "unit": "also.service"},
    ]);
    let r = probe(&s, g.clone(), calls.clone());
    all_refused(&r, &calls);
    assert!(s.changes().is_empty(), "{:?}", s.changes());
    assert_eq!(unit_dirs(&f), before);
    let fine = probe(
        &s,
        g,
        json!([
            {"op": "systemd.enable", "unit": "fine.service"},
            {"op": "systemd.stop", "unit": "kubelet.service"},
            {"op": "systemd.write-unit", "unit": "kubelet.service", "contents": "[Service]\nExecStart=/bin/true\n"},
        ]),
    );
    assert!(fine.iter().all(|r| kind(r) == "ok"), "{fine:?}");
}

#[test]
fn install_sections_are_read_as_systemctl_reads_them_templates_specifiers_and_linked_drop_ins() {
    let f = units_root();
    let install = |line: &str| format!("[Service]\nExecStart=/bin/true\n[Install]\n{line}\n");
    // A template instance's [Install] is its template's, in the file or a template drop-in.
    f.put(
        "etc/systemd/system/tpl@.service",
        &install("Alias=nodeward.service"),
    );
    f.put(
        "etc/systemd/system/tpl2@.service",
        &install("WantedBy=multi-user.target"),
    );
    f.put(
        "run/systemd/system/tpl2@.service.d/10.conf",
        "[Install]\nAlso=nodeward.service\n",
    );
    // systemd expands specifiers in these settings: `%p` of `nodeward@x.service` is `nodeward`.
    f.put(
        "etc/systemd/system/nodeward@.service",
        &install("Alias=%p.service"),
    );
    f.put(
        "etc/systemd/system/spec.service",
        &install("WantedBy=%n.wants"),
    );
    // A drop-in that is a link, followed (beneath the root) as systemd follows it.
    f.put(
        "etc/systemd/system/linked.service",
        &install("WantedBy=multi-user.target"),
    );
    f.put("opt/conf/evil.conf", "[Install]\nAlso=nodeward.service\n");
    std::fs::create_dir_all(f.root.join("etc/systemd/system/linked.service.d")).expect("dir");
    symlink(
        "/opt/conf/evil.conf",
        f.root
            .join("etc/systemd/system/linked.service.d/10-evil.conf"),
    )
    .expect("drop-in link");
    // Harmless ones still enable.
    f.put(
        "etc/systemd/system/good@.service",
        &install("WantedBy=multi-user.target"),
    );
    f.put(
        "opt/conf/fine.conf",
        "[Install]\nWantedBy=kubelet.service\n",
    );
    std::fs::create_dir_all(f.root.join("etc/systemd/system/kubelet.service.d")).expect("dir");
    symlink(
        "/opt/conf/fine.conf",
        f.root
            .join("etc/systemd/system/kubelet.service.d/10-fine.conf"),
    )
    .expect("fine link");
    let before = unit_dirs(&f);
    let s = f.session(RunMode::Plan);
    let g = grants("[systemd]\nenable = [\"*\"]\n");
    let calls = json!([
        {"op": "systemd.enable", "unit": "tpl@x.service"},
        {"op": "systemd.disable", "unit": "tpl2@y.service"},
        {"op": "systemd.enable", "unit": "nodeward@x.service"},
        {"op": "systemd.enable", "unit": "spec.service"},
        {"op": "systemd.disable", "unit": "linked.service"},
    ]);
    let r = probe(&s, g.clone(), calls.clone());
    for (r, call) in r.iter().zip(calls.as_array().expect("calls")) {
        assert_eq!(kind(r), "denied", "{call}: {r}");
        let m = r.pointer("/err/message").and_then(Value::as_str);
        assert!(
            m.is_some_and(|m| m.contains("[Install]")),
            "{call}: names the setting: {r}"
        );
    }
    assert!(s.changes().is_empty(), "{:?}", s.changes());
    assert_eq!(unit_dirs(&f), before);
    let fine = probe(
        &s,
        g,
        json!([
            {"op": "systemd.enable", "unit": "good@x.service"},
            {"op": "systemd.enable", "unit": "kubelet.service"},
        ]),
    );
    assert!(fine.iter().all(|r| kind(r) == "ok"), "{fine:?}");
}

#[test]
fn a_unit_file_with_more_than_one_name_is_parsed_for_the_guard() {
    // An OSTree host (Fedora CoreOS, RHCOS): every file in `usr` is a hard link into the repo.
    let f = units_root();
    let unit = "[Service]\nExecStart=/bin/true\n[Install]\nWantedBy=multi-user.target\n";
    f.put("ostree/repo/objects/aa.file", unit);
    f.put(
        "ostree/repo/objects/bb.file",
        "[Service]\n[Install]\nAlias=nodeward.service\n",
    );
    let units = f.root.join("usr/lib/systemd/system");
    std::fs::hard_link(
        f.root.join("ostree/repo/objects/aa.file"),
        units.join("ost.service"),
    )
    .expect("hard link");
    std::fs::hard_link(
        f.root.join("ostree/repo/objects/bb.file"),
        units.join("evil.service"),
    )
    .expect("hard link");
    let s = f.session(RunMode::Plan);
    let g = grants("[systemd]\nenable = [\"*\"]\n[fs]\nread = [\"usr/lib/systemd\"]\n");
    let r = probe(
        &s,
        g,
        json!([
            {"op": "systemd.enable", "unit": "ost.service"},
            {"op": "systemd.enable", "unit": "evil.service"},
            // A phase still never gets the bytes of a file with another name.
            {"op": "fs.read-file", "path": "usr/lib/systemd/system/ost.service"},
        ]),
    );
    assert_eq!(kind(&r[0]), "ok", "{r:?}");
    assert_eq!(kind(&r[1]), "denied", "{r:?}");
    let m = r[1].pointer("/err/message").and_then(Value::as_str);
    assert!(
        m.is_some_and(|m| m.contains("Alias=nodeward.service")),
        "{r:?}"
    );
    assert_eq!(kind(&r[2]), "denied", "{r:?}");
    // Only the harmless unit was enabled.
    assert_eq!(s.changes().len(), 1, "{:?}", s.changes());
    assert!(
        format!("{:?}", s.changes()).contains("ost.service"),
        "{:?}",
        s.changes()
    );
}
