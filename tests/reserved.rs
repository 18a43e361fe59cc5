//! Paths and units reserved to the agent (`host/reserved.rs`): no grant, however broad, lets a
//! phase read, write, link into, remove, mount on, over or of the agent's trust root, state,
//! audit trail, locks, binary or unit; and a grant entry inside one refuses the bundle.
//!
//! Each test is an attack by a phase (the probe guest) holding grants that cover the reserved
//! paths by prefix (`etc`, `var`, `*`), in plan and apply mode: every call is `denied` naming
//! the reserved path, and the reserved files stay byte for byte as they were. Mount refusals
//! are checked in plan mode, which mounts nothing, so a broken check cannot leave a mount.

mod common;

use common::*;
use nodeward::hostpath::HostRoot;
use nodeward::plan::RunMode;
use nodeward::reserved::Reserved;
use serde_json::{Value, json};
use std::sync::Arc;

/// The agent's own files beneath a fresh root, next to ordinary ones a grant may reach.
fn agent_root() -> Fixture {
    let f = Fixture::new();
    f.put(
        "etc/nodeward/trusted-keys/platform.pub",
        "untrusted comment: k\nRWQ\n",
    );
    f.put("var/lib/nodeward/node/install-record.json", "{}\n");
    f.put("var/lib/nodeward/bundles/active", "nodeward-default\n");
    f.put("var/log/nodeward/audit/audit.log", "{\"seq\":1}\n");
    f.put("run/nodeward/node.lock", "");
    f.put("usr/local/bin/nodeward", "ELF\n");
    f.put("etc/systemd/system/nodeward.service", "[Service]\n");
    f.put("var/lib/other/data", "mine\n");
    std::fs::create_dir_all(f.root.join("mnt/x")).expect("mnt/x");
    f
}

/// What a reserved file holds now, for before/after comparison.
fn agent_files(f: &Fixture) -> Vec<(String, Option<Vec<u8>>)> {
    [
        "etc/nodeward/trusted-keys/platform.pub",
        "var/lib/nodeward/node/install-record.json",
        "var/lib/nodeward/bundles/active",
        "var/log/nodeward/audit/audit.log",
        "run/nodeward/node.lock",
        "usr/local/bin/nodeward",
        "etc/systemd/system/nodeward.service",
    ]
    .iter()
    .map(|p| (p.to_string(), std::fs::read(f.root.join(p)).ok()))
    .collect()
}

/// An apply session over `f`'s root that reserves `reserved` (what the CLI's session reserves
/// for the directories a run is given).
fn applying_reserving(f: &Fixture, reserved: Reserved) -> Arc<nodeward::caps::RunContext> {
    let mut session = nodeward::caps::RunContext::new(
        HostRoot::open(&f.root).expect("root"),
        RunMode::Apply,
        Default::default(),
    );
    session.reserved = reserved;
    Arc::new(session)
}

fn message(result: &Value) -> String {
    result
        .pointer("/err/message")
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_default()
}

/// Asserts every result is `denied`, its message naming one of `reserved`.
fn all_denied_naming(results: &[Value], calls: &Value, reserved: &[&str]) {
    for (r, call) in results.iter().zip(calls.as_array().expect("calls")) {
        let m = message(r);
        assert_eq!(kind(r), "denied", "{call} -> {r}");
        assert!(
            reserved.iter().any(|p| m.contains(p)) || m.contains("reserved"),
            "{call}: the denial names the reserved path: {m}"
        );
    }
}

#[test]
fn broad_file_grants_reach_nothing_reserved_to_the_agent() {
    let g = grants("[fs]\nwrite = [\"etc\", \"var\", \"run\", \"usr\"]\n");
    let calls = json!([
        {"op": "fs.read-file", "path": "etc/nodeward/trusted-keys/platform.pub"},
        {"op": "fs.write-file", "path": "etc/nodeward/trusted-keys/evil.pub", "contents": "k", "mode": 0o644},
        {"op": "fs.write-file", "path": "var/lib/nodeward/node/install-record.json", "contents": "{}", "mode": 0o600},
        {"op": "fs.remove", "path": "var/log/nodeward/audit/audit.log"},
        {"op": "fs.remove-all", "path": "var/lib"},
        {"op": "fs.remove-all", "path": "var/log"},
        {"op": "fs.remove-all", "path": "etc/nodeward"},
        {"op": "fs.create-dir", "path": "run/nodeward/other", "mode": 0o755},
        {"op": "fs.list-dir", "path": "var/lib/nodeward"},
        {"op": "fs.stat", "path": "var/lib/nodeward/node"},
        {"op": "fs.symlink", "target": "nodeward/node", "path": "var/lib/state"},
        {"op": "fs.symlink", "target": "../../etc/nodeward", "path": "var/lib/keys"},
        {"op": "fs.write-file", "path": "usr/local/bin/nodeward", "contents": "#!/bin/sh\n", "mode": 0o755},
        {"op": "fs.write-file", "path": "etc/systemd/system/nodeward.service", "contents": "[Service]\nExecStart=/x\n", "mode": 0o644},
        {"op": "fs.write-file", "path": "etc/systemd/system/nodeward.service.d/override.conf", "contents": "[Service]\n", "mode": 0o644},
    ]);
    for mode in [RunMode::Plan, RunMode::Apply] {
        let f = agent_root();
        let before = agent_files(&f);
        let s = f.session(mode);
        let r = probe(&s, g.clone(), calls.clone());
        all_denied_naming(
            &r,
            &calls,
            &[
                "etc/nodeward",
                "var/lib/nodeward",
                "var/log/nodeward",
                "run/nodeward",
                "usr/local/bin/nodeward",
                "nodeward.service",
            ],
        );
        assert_eq!(
            agent_files(&f),
            before,
            "{mode:?}: reserved files unchanged"
        );
        assert!(s.changes().is_empty(), "{mode:?}: {:?}", s.changes());
        assert!(!f.root.join("var/lib/state").exists());

        // The same grants still reach everything else, the parents of reserved paths included.
        let fine = probe(
            &s,
            g.clone(),
            json!([
                {"op": "fs.list-dir", "path": "var/lib"},
                {"op": "fs.write-file", "path": "var/lib/other/new", "contents": "x", "mode": 0o644},
                {"op": "fs.remove-all", "path": "var/lib/other"},
                {"op": "fs.write-file", "path": "etc/systemd/system/nodeward-kubelet.service", "contents": "[Service]\n", "mode": 0o644},
            ]),
        );
        assert!(fine.iter().all(|r| kind(r) == "ok"), "{mode:?}: {fine:?}");
        let names = fine[0].to_string();
        assert!(
            names.contains("nodeward"),
            "listing a parent shows names: {names}"
        );
    }
}

#[test]
fn links_do_not_lead_into_a_reserved_path() {
    for mode in [RunMode::Plan, RunMode::Apply] {
        let f = agent_root();
        // Planted by anyone: a link to the state directory, and one to its parent.
        std::os::unix::fs::symlink("nodeward", f.root.join("var/lib/state")).expect("link");
        std::os::unix::fs::symlink("lib", f.root.join("var/l")).expect("link");
        let before = agent_files(&f);
        let s = f.session(mode);
        let g = grants("[fs]\nwrite = [\"var\"]\n");
        let calls = json!([
            {"op": "fs.write-file", "path": "var/lib/state/node/install-record.json", "contents": "{}", "mode": 0o600},
            {"op": "fs.read-file", "path": "var/lib/state/node/install-record.json"},
            {"op": "fs.list-dir", "path": "var/lib/state"},
            {"op": "fs.remove-all", "path": "var/l/nodeward"},
            {"op": "fs.create-dir", "path": "var/l/nodeward/x", "mode": 0o755},
            {"op": "fs.symlink", "target": "../l/nodeward", "path": "var/lib/again"},
        ]);
        let r = probe(&s, g.clone(), calls.clone());
        all_denied_naming(&r, &calls, &["var/lib/nodeward"]);
        assert_eq!(agent_files(&f), before, "{mode:?}");

        // Removing the planted link itself is fine: it takes the link, not what it names.
        let rm = probe(
            &s,
            g,
            json!([{"op": "fs.remove-all", "path": "var/lib/state"}]),
        );
        assert_eq!(kind(&rm[0]), "ok", "{rm:?}");
        assert_eq!(agent_files(&f), before, "{mode:?}");
    }
}

#[test]
fn the_agent_directories_a_run_was_given_are_reserved_too() {
    let f = agent_root();
    f.put("data/agent/bundles/active", "b\n");
    f.put("data/other/file", "x\n");
    let s = applying_reserving(
        &f,
        Reserved::default().with_dir(&f.root, &f.root.join("data/agent")),
    );
    let g = grants("[fs]\nwrite = [\"data\"]\n");
    let calls = json!([
        {"op": "fs.write-file", "path": "data/agent/bundles/active", "contents": "evil", "mode": 0o644},
        {"op": "fs.remove-all", "path": "data"},
    ]);
    let r = probe(&s, g.clone(), calls.clone());
    all_denied_naming(&r, &calls, &["data/agent"]);
    let ok = probe(
        &s,
        g,
        json!([{"op": "fs.remove-all", "path": "data/other"}]),
    );
    assert_eq!(kind(&ok[0]), "ok", "{ok:?}");
    assert_eq!(
        std::fs::read_to_string(f.root.join("data/agent/bundles/active")).expect("kept"),
        "b\n"
    );
}

#[test]
fn mounts_on_over_or_of_a_reserved_path_are_refused() {
    let f = agent_root();
    std::os::unix::fs::symlink("../var/lib", f.root.join("mnt/lib")).expect("link");
    let s = f.session(RunMode::Plan);
    let g = grants(
        "[fs]\nread = [\"etc\", \"var\"]\nwrite = [\"mnt\"]\n\
         [mounts]\ntargets = [\"etc\", \"var\", \"run\", \"mnt\"]\n",
    );
    let calls = json!([
        {"op": "mounts.tmpfs", "target": "etc", "size-bytes": 1048576},
        {"op": "mounts.tmpfs", "target": "var/lib/nodeward", "size-bytes": 1048576},
        {"op": "mounts.tmpfs", "target": "etc/nodeward/trusted-keys", "size-bytes": 1048576},
        {"op": "mounts.tmpfs", "target": "run/nodeward", "size-bytes": 1048576},
        {"op": "mounts.tmpfs", "target": "mnt/lib", "size-bytes": 1048576},
        {"op": "mounts.bind", "source": "var/lib", "target": "mnt/x", "read-only": true},
        {"op": "mounts.bind", "source": "var/lib/nodeward/node", "target": "mnt/x", "read-only": true},
        {"op": "mounts.overlay", "lower": ["var"], "upper": "mnt/x", "work": "mnt/x", "target": "mnt/x"},
        {"op": "mounts.unmount", "target": "var/log/nodeward", "lazy": true},
    ]);
    let r = probe(&s, g.clone(), calls.clone());
    all_denied_naming(
        &r,
        &calls,
        &[
            "etc/nodeward",
            "var/lib/nodeward",
            "run/nodeward",
            "var/log/nodeward",
        ],
    );
    assert!(s.changes().is_empty(), "{:?}", s.changes());
    // The grant still works where no reserved path is involved.
    let fine = probe(
        &s,
        g,
        json!([{"op": "mounts.tmpfs", "target": "mnt/x", "size-bytes": 1048576}]),
    );
    assert_eq!(kind(&fine[0]), "ok", "{fine:?}");
}

#[test]
fn the_agents_own_unit_is_not_a_phases_to_drive() {
    let f = agent_root();
    let before = agent_files(&f);
    let s = f.session(RunMode::Plan);
    let g =
        grants("[systemd]\nwrite = [\"*\"]\nenable = [\"*\"]\nstart = [\"*\"]\nmask = [\"*\"]\n");
    let unit = "nodeward.service";
    let calls = json!([
        {"op": "systemd.write-unit", "unit": unit, "contents": "[Service]\nExecStart=/bin/true\n"},
        {"op": "systemd.write-drop-in", "unit": unit, "name": "10-evil.conf", "contents": "[Service]\n"},
        {"op": "systemd.remove-unit", "unit": unit},
        {"op": "systemd.enable", "unit": unit},
        {"op": "systemd.disable", "unit": unit},
        {"op": "systemd.stop", "unit": unit},
        {"op": "systemd.restart", "unit": unit},
        {"op": "systemd.mask", "unit": unit},
    ]);
    let r = probe(&s, g.clone(), calls.clone());
    all_denied_naming(&r, &calls, &["nodeward.service"]);
    assert!(s.changes().is_empty(), "{:?}", s.changes());
    assert_eq!(agent_files(&f), before);
    let other = probe(
        &s,
        g,
        json!([{"op": "systemd.write-unit", "unit": "nodeward-kubelet.service", "contents": "[Service]\n"}]),
    );
    assert_eq!(kind(&other[0]), "ok", "{other:?}");
}

#[test]
fn a_grant_entry_inside_a_reserved_path_is_named_for_install_to_refuse() {
    for (table, reserved) in [
        (
            "[fs]\nwrite = [\"var/lib/nodeward/node\"]\n",
            "var/lib/nodeward",
        ),
        (
            "[fs]\nread = [\"var/log/nodeward/audit\"]\n",
            "var/log/nodeward",
        ),
        ("[fs]\nwrite = [\"etc/nodeward\"]\n", "etc/nodeward"),
        ("[mounts]\ntargets = [\"run/nodeward\"]\n", "run/nodeward"),
        (
            "[fs]\nwrite = [\"etc\"]\n[secrets]\nbootstrap-token = [\"etc/nodeward/token\"]\n",
            "etc/nodeward",
        ),
        (
            "[systemd]\nstart = [\"nodeward.service\"]\n",
            "nodeward.service",
        ),
        (
            "[systemd]\nmask = [\"NodeWard.service\"]\n",
            "NodeWard.service",
        ),
        // The agent's unit, drop-ins and boot link in every unit directory (issue 26).
        (
            "[fs]\nwrite = [\"etc/systemd/system/nodeward.service\"]\n",
            "etc/systemd/system/nodeward.service",
        ),
        (
            "[fs]\nwrite = [\"etc/systemd/system/nodeward.service.d\"]\n",
            "etc/systemd/system/nodeward.service.d",
        ),
        (
            "[fs]\nwrite = [\"run/systemd/system/nodeward.service\"]\n",
            "run/systemd/system/nodeward.service",
        ),
        (
            "[fs]\nread = [\"usr/lib/systemd/system/service.d/x.conf\"]\n",
            "usr/lib/systemd/system/service.d",
        ),
        (
            "[fs]\nwrite = [\"lib/systemd/system/Nodeward.Service\"]\n",
            "lib/systemd/system/Nodeward.Service",
        ),
        (
            "[fs]\nwrite = [\"etc/systemd/system/multi-user.target.wants/nodeward.service\"]\n",
            "multi-user.target.wants/nodeward.service",
        ),
        (
            "[mounts]\ntargets = [\"etc/systemd/system/nodeward.service.requires\"]\n",
            "nodeward.service.requires",
        ),
        (
            "[fs]\nwrite = [\"etc/systemd/system.attached/nodeward.service\"]\n",
            "etc/systemd/system.attached/nodeward.service",
        ),
        (
            "[fs]\nwrite = [\"run/systemd/system.attached/nodeward.service.d\"]\n",
            "run/systemd/system.attached/nodeward.service.d",
        ),
        (
            "[fs]\nwrite = [\"etc/systemd/system.attached/service.d/x.conf\"]\n",
            "etc/systemd/system.attached/service.d",
        ),
        (
            "[fs]\nwrite = [\"run/systemd/system.attached/service.d\"]\n",
            "run/systemd/system.attached/service.d",
        ),
        (
            "[fs]\nwrite = [\"usr/lib/systemd/system.conf.d/env.conf\"]\n",
            "usr/lib/systemd/system.conf.d",
        ),
        (
            "[fs]\nwrite = [\"usr/local/lib/systemd/system.conf.d\"]\n",
            "usr/local/lib/systemd/system.conf.d",
        ),
    ] {
        // Still well-formed (a bundle installed before the path was reserved keeps loading;
        // its calls there are denied)...
        let g = grants(table);
        // ...but named, so `phases install` refuses it (host/bundle/install/tests.rs).
        let found = g.reserved_entries();
        assert_eq!(found.len(), 1, "{table}: {found:?}");
        assert!(
            found[0].to_string().contains(reserved),
            "{table}: {}",
            found[0]
        );
    }
    // Parents of reserved paths are ordinary grants, a dependency directory too (the agent's
    // link in it is denied at each call).
    let g = grants(
        "[fs]\nwrite = [\"var/lib\", \"etc\", \"etc/systemd/system/multi-user.target.wants\"]\n\
         [mounts]\ntargets = [\"var\"]\n",
    );
    assert!(g.reserved_entries().is_empty());
}

#[test]
fn extracting_or_downloading_over_a_parent_of_a_reserved_path_is_refused() {
    // Refused before any request: no server is needed (nothing listens on port 9).
    let g = grants(
        "[fs]\nwrite = [\"etc\", \"var\", \"usr\"]\n[download]\nurls = [\"http://127.0.0.1:*/\"]\n",
    );
    let sha = "0".repeat(64);
    let calls = json!([
        {"op": "download.fetch-and-extract", "url": "http://127.0.0.1:9/keys.tar", "sha256": sha, "dest-dir": "etc", "strip-components": 0},
        {"op": "download.fetch-and-extract", "url": "http://127.0.0.1:9/state.tar", "sha256": sha, "dest-dir": "var/lib", "strip-components": 0},
        {"op": "download.fetch", "url": "http://127.0.0.1:9/bin", "sha256": sha, "dest": "usr/local", "mode": 0o755},
        {"op": "download.fetch", "url": "http://127.0.0.1:9/k", "sha256": sha, "dest": "etc/nodeward/trusted-keys/k.pub", "mode": 0o644},
    ]);
    for mode in [RunMode::Plan, RunMode::Apply] {
        let f = agent_root();
        let before = agent_files(&f);
        let s = f.session(mode);
        let r = probe(&s, g.clone(), calls.clone());
        all_denied_naming(
            &r,
            &calls,
            &["etc/nodeward", "var/lib/nodeward", "usr/local/bin/nodeward"],
        );
        assert_eq!(agent_files(&f), before, "{mode:?}");
    }
}

#[test]
fn a_link_on_the_way_to_a_reserved_path_can_be_neither_replaced_nor_used_around() {
    let f = Fixture::new();
    // As on hosts where /usr/local is a link into /var.
    f.put("var/usrlocal/bin/nodeward", "ELF\n");
    std::fs::create_dir_all(f.root.join("usr")).expect("usr");
    std::os::unix::fs::symlink("../var/usrlocal", f.root.join("usr/local")).expect("link");
    let s = applying_reserving(&f, Reserved::default().resolved_in(&f.root));
    let g = grants("[fs]\nwrite = [\"usr\", \"var\"]\n");
    let calls = json!([
        {"op": "fs.remove", "path": "usr/local"},
        {"op": "fs.symlink", "target": "../var/tmp", "path": "usr/local"},
        {"op": "fs.write-file", "path": "var/usrlocal/bin/nodeward", "contents": "evil", "mode": 0o755},
        {"op": "fs.remove-all", "path": "var/usrlocal"},
    ]);
    let r = probe(&s, g, calls.clone());
    all_denied_naming(
        &r,
        &calls,
        &["usr/local/bin/nodeward", "var/usrlocal/bin/nodeward"],
    );
    assert_eq!(
        std::fs::read_to_string(f.root.join("usr/local/bin/nodeward")).expect("kept"),
        "ELF\n"
    );
}

#[test]
fn the_agents_unit_is_reserved_in_every_unit_directory_and_the_system_cannot_be_stopped() {
    let f = agent_root();
    let s = f.session(RunMode::Plan);
    let g = grants(
        "[fs]\nwrite = [\"etc\", \"run\"]\n[systemd]\nstart = [\"*\"]\nmask = [\"*\"]\n\
         [mounts]\ntargets = [\"proc\"]\n",
    );
    let calls = json!([
        {"op": "fs.write-file", "path": "run/systemd/transient/nodeward.service", "contents": "", "mode": 0o644},
        {"op": "fs.write-file", "path": "run/systemd/system/nodeward.service.d/env.conf", "contents": "[Service]\n", "mode": 0o644},
        {"op": "fs.write-file", "path": "etc/systemd/system.control/nodeward.service.d/x.conf", "contents": "[Service]\n", "mode": 0o644},
        {"op": "fs.write-file", "path": "etc/systemd/system/service.d/env.conf", "contents": "[Service]\n", "mode": 0o644},
        {"op": "fs.write-file", "path": "etc/systemd/system.conf.d/env.conf", "contents": "[Manager]\n", "mode": 0o644},
        {"op": "systemd.stop", "unit": "system.slice"},
        // Every service `Requires=sysinit.target`: stopping it stops the agent.
        {"op": "systemd.stop", "unit": "sysinit.target"},
        {"op": "systemd.mask", "unit": "sysinit.target"},
        {"op": "fs.write-file", "path": "etc/systemd/system/sysinit.target.d/x.conf", "contents": "[Unit]\n", "mode": 0o644},
        {"op": "systemd.start", "unit": "poweroff.target"},
        {"op": "systemd.mask", "unit": "nodeward.service"},
        {"op": "mounts.tmpfs", "target": "proc", "size-bytes": 1048576},
    ]);
    let r = probe(&s, g, calls.clone());
    all_denied_naming(
        &r,
        &calls,
        &[
            "nodeward.service",
            "service.d",
            "system.conf.d",
            "sysinit.target",
            "proc",
        ],
    );
    assert!(s.changes().is_empty(), "{:?}", s.changes());
}
