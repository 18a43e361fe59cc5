//! Components are refused before any guest code runs: a digest mismatch, a malformed component,
//! imports beyond the declared world, an unknown or test-only world, a `phase` export of the
//! wrong type, or a malformed manifest. What the import check admits is linked.

mod common;

use common::components;
use common::*;
use nodeward::bundle::{Bundle, BundleError};
use nodeward::plan::RunMode;
use nodeward::runtime::worlds::WASI_ALLOWED;
use nodeward::runtime::{Limits, LoadError, Origin, Runtime};
use nodeward::session::{self, RunError};
use nodeward_node_config::input::PhaseInput;
use sha2::{Digest, Sha256};
use std::path::Path;

fn sha(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// An extra phase for [`write_bundle`]: (name, file, bytes, world, sha256 override).
type ExtraPhase<'a> = (&'a str, &'a str, &'a [u8], &'a str, Option<&'a str>);

/// Writes a bundle into `dir`: the shipped setup-host phase, then `extra` phases.
fn write_bundle(dir: &Path, extra: &[ExtraPhase<'_>]) {
    std::fs::create_dir_all(dir).expect("bundle dir");
    let setup = std::fs::read(nodeward::built::PHASE_SETUP_HOST_COMPONENT).expect("setup-host");
    std::fs::write(dir.join("setup-host.wasm"), &setup).expect("write");
    let mut manifest = format!(
        "format = 1\n[bundle]\nname = \"test\"\nversion = 1\n\n[[phases]]\nname = \"setup-host\"\ncomponent = \"setup-host.wasm\"\nsha256 = \"{}\"\nworld = \"setup-host\"\n[phases.grants.fs]\nwrite = [\"etc\", \"opt\", \"var\"]\n",
        sha(&setup)
    );
    for (name, file, bytes, world, digest) in extra {
        std::fs::write(dir.join(file), bytes).expect("write component");
        let digest = digest.map(str::to_string).unwrap_or_else(|| sha(bytes));
        manifest.push_str(&format!(
            "\n[[phases]]\nname = \"{name}\"\ncomponent = \"{file}\"\nsha256 = \"{digest}\"\nworld = \"{world}\"\n"
        ));
    }
    std::fs::write(dir.join("manifest.toml"), manifest).expect("manifest");
}

/// Runs every phase of the bundle in `dir` against the fixture's root.
fn run_bundle(
    f: &Fixture,
    bundle: &Bundle,
) -> (
    Result<(), RunError>,
    std::sync::Arc<nodeward::caps::RunContext>,
) {
    let s = f.session(RunMode::Apply);
    let config = nodeward::config::load(None).expect("config");
    let r = session::run(
        runtime(),
        bundle,
        &s,
        &PhaseInput::new(config),
        &[],
        Limits::default(),
        |_| {},
    )
    .map(|_| ());
    (r, s)
}

#[test]
fn a_digest_mismatch_refuses_the_bundle() {
    let f = Fixture::new();
    let dir = f.tmp.path().join("bundle");
    let probe = std::fs::read(nodeward::built::TEST_GUEST_PROBE_COMPONENT).expect("probe");
    let wrong = "a".repeat(64);
    write_bundle(
        &dir,
        &[("probe", "probe.wasm", &probe, "teardown", Some(&wrong))],
    );
    let err = Bundle::load_dir(&dir).expect_err("mismatch");
    assert!(
        matches!(&err, BundleError::DigestMismatch { phase, expected, .. } if phase == "probe" && *expected == wrong),
        "{err:?}"
    );
    assert!(err.to_string().contains("probe.wasm"), "{err}");
}

#[test]
fn a_malformed_component_is_refused_before_any_phase_runs() {
    let f = Fixture::new();
    let dir = f.tmp.path().join("bundle");
    write_bundle(
        &dir,
        &[(
            "broken",
            "broken.wasm",
            b"\0asm this is not a component",
            "configure",
            None,
        )],
    );
    let bundle = Bundle::load_dir(&dir).expect("digests match");
    let before = snapshot(&f.root);
    let (r, s) = run_bundle(&f, &bundle);
    let err = r.expect_err("refused");
    assert!(
        matches!(&err, RunError::Load(LoadError::Malformed { phase, .. }) if phase == "broken"),
        "{err:?}"
    );
    assert!(
        s.audit.records().is_empty(),
        "setup-host, listed first, never ran"
    );
    assert_eq!(snapshot(&f.root), before);
}

#[test]
fn imports_beyond_the_declared_world_are_refused_before_any_phase_runs() {
    let f = Fixture::new();
    let dir = f.tmp.path().join("bundle");
    let probe = std::fs::read(nodeward::built::TEST_GUEST_PROBE_COMPONENT).expect("probe");
    // The probe imports systemd, mounts and download; world configure allows fs and log only.
    write_bundle(
        &dir,
        &[("sneaky", "sneaky.wasm", &probe, "configure", None)],
    );
    let bundle = Bundle::load_dir(&dir).expect("digests match");
    let before = snapshot(&f.root);
    let (r, s) = run_bundle(&f, &bundle);
    let err = r.expect_err("refused");
    let RunError::Load(LoadError::ImportsExceedWorld {
        phase,
        import,
        world,
    }) = &err
    else {
        panic!("expected ImportsExceedWorld, got {err:?}");
    };
    assert_eq!((phase.as_str(), world.as_str()), ("sneaky", "configure"));
    assert!(import.starts_with("nodeward:host/"), "{import}");
    assert!(
        ![
            "nodeward:host/fs@0.1.0",
            "nodeward:host/log@0.1.0",
            "nodeward:host/types@0.1.0"
        ]
        .contains(&import.as_str())
    );
    assert!(s.audit.records().is_empty());
    assert_eq!(snapshot(&f.root), before);
}

#[test]
fn malformed_manifests_are_refused_naming_the_problem() {
    let f = Fixture::new();
    let dir = f.tmp.path().join("bundle");
    write_bundle(&dir, &[]);
    let good = std::fs::read_to_string(dir.join("manifest.toml")).expect("manifest");
    let cases = [
        (
            good.replace("world = \"setup-host\"", "world = \"everything\""),
            "unknown world",
        ),
        (
            good.replace("format = 1", "format = 2"),
            "format 2 is not supported",
        ),
        (
            good.replace("[bundle]", "[bundle]\nsignature = \"x\""),
            "unknown field",
        ),
        (
            good.replace(
                "component = \"setup-host.wasm\"",
                "component = \"../setup-host.wasm\"",
            ),
            "plain file name",
        ),
        (
            good.replace("write = [\"etc\", \"opt\", \"var\"]", "write = [\"/etc\"]"),
            "fs.write",
        ),
        (
            good.replace(
                "[phases.grants.fs]",
                "[phases.grants.fs]\nexec = [\"/bin/sh\"]",
            ),
            "unknown field",
        ),
    ];
    for (text, needle) in cases {
        std::fs::write(dir.join("manifest.toml"), &text).expect("write");
        let err = Bundle::load_dir(&dir).expect_err(needle);
        assert!(err.to_string().contains(needle), "{needle}: {err}");
    }
}

#[test]
fn a_bridge_grant_that_could_reach_another_tools_bridge_refuses_the_bundle() {
    let f = Fixture::new();
    let dir = f.tmp.path().join("bundle");
    write_bundle(&dir, &[]);
    let good = std::fs::read_to_string(dir.join("manifest.toml")).expect("manifest");
    let with = |bridges: &str| format!("{good}[phases.grants.network]\nbridges = {bridges}\n");
    for (bridges, needle) in [
        (
            r#"["cni*"]"#,
            r#"network.bridges entry "cni*": could name a bridge of Podman's CNI networks (cni-podman*)"#,
        ),
        (
            r#"["cni0", "docker0"]"#,
            r#""docker0": could name a bridge of Docker (docker*)"#,
        ),
        (r#"["br-*"]"#, "Docker's user-defined networks (br-*)"),
        (r#"["vi*"]"#, "libvirt (virbr*)"),
        (r#"["*"]"#, r#"entry "*""#),
    ] {
        std::fs::write(dir.join("manifest.toml"), with(bridges)).expect("write");
        let err = Bundle::load_dir(&dir).expect_err(bridges);
        assert!(err.to_string().contains(needle), "{bridges}: {err}");
    }
    std::fs::write(dir.join("manifest.toml"), with(r#"["cni0*", "nwbr*"]"#)).expect("write");
    Bundle::load_dir(&dir).expect("patterns no other tool's bridge can match load");
}

#[test]
fn the_embedded_bundle_loads_and_its_phases_stay_within_their_worlds() {
    let bundle = Bundle::embedded().expect("embedded bundle");
    assert_eq!(
        bundle
            .manifest
            .phases
            .iter()
            .map(|p| p.name.as_str())
            .collect::<Vec<_>>(),
        [
            "preflight",
            "setup-host",
            "download-artifacts",
            "install",
            "configure",
            "start-node",
            "stop-node",
            "teardown"
        ]
    );
    for p in &bundle.manifest.phases {
        let loaded = runtime()
            .load(
                &p.name,
                &p.world,
                bundle.component(&p.name).expect("bytes"),
                &p.sha256,
            )
            .expect("loads");
        assert!(
            loaded
                .imports
                .iter()
                .all(|i| !i.starts_with("wasi:filesystem") && !i.starts_with("wasi:sockets"))
        );
        let wants_fs = p.name != "stop-node";
        assert_eq!(
            loaded.imports.iter().any(|i| i == "nodeward:host/fs@0.1.0"),
            wants_fs,
            "{}: {:?}",
            p.name,
            loaded.imports
        );
    }
}

/// A fresh node (an empty compiled-component cache) compiles none of the embedded bundle's
/// phases: each comes precompiled in the binary, for this very engine, and writes nothing to
/// the cache. Set aside, the same phases compile and are cached as before; and a component
/// that is not the embedded one (another digest) never gets an embedded form.
#[test]
fn the_embedded_bundle_comes_precompiled_and_compiles_only_without_it() {
    let bundle = Bundle::embedded().expect("embedded bundle");
    let tmp = tempfile::tempdir().expect("tmp");
    let fresh = Runtime::new(&tmp.path().join("fresh")).expect("runtime");
    assert_eq!(
        fresh.embedded_precompiled(),
        bundle.manifest.phases.len(),
        "this engine can use every embedded precompiled phase"
    );
    for p in &bundle.manifest.phases {
        let wasm = bundle.component(&p.name).expect("bytes");
        let loaded = fresh
            .load(&p.name, &p.world, wasm, &p.sha256)
            .expect("loads");
        assert_eq!(loaded.origin, Origin::Embedded, "{}", p.name);
    }
    assert_eq!(
        std::fs::read_dir(tmp.path().join("fresh"))
            .expect("cache dir")
            .count(),
        0,
        "nothing was compiled into the cache"
    );

    let compiling = Runtime::new(&tmp.path().join("compiling"))
        .expect("runtime")
        .without_embedded_precompiled();
    assert_eq!(compiling.embedded_precompiled(), 0);
    let p = &bundle.manifest.phases[0];
    let wasm = bundle.component(&p.name).expect("bytes");
    let loaded = compiling
        .load(&p.name, &p.world, wasm, &p.sha256)
        .expect("compiles");
    assert_eq!(loaded.origin, Origin::Compiled);
    assert!(compiling.cache_path(&p.sha256).is_file(), "and is cached");

    // The same component with an empty custom section `x` appended (id 0, size 2, name
    // length 1, "x") is another digest: it has no embedded form and is compiled.
    let mut other = wasm.to_vec();
    other.extend_from_slice(&[0x00, 0x02, 0x01, b'x']);
    let digest = sha(&other);
    let loaded = fresh
        .load(&p.name, &p.world, &other, &digest)
        .expect("a component with a custom section appended still loads");
    assert_eq!(loaded.origin, Origin::Compiled);
}

#[test]
fn a_phase_export_of_the_wrong_type_is_refused_at_load() {
    let wasm = components::wrong_run_type();
    let err = runtime()
        .load("typo", "pure", &wasm, &components::digest(&wasm))
        .err()
        .expect("refused");
    let LoadError::ExportType {
        phase,
        export,
        message,
    } = &err
    else {
        panic!("expected ExportType, got {err:?}");
    };
    assert_eq!(phase, "typo");
    assert_eq!(export, "nodeward:host/phase@0.1.0#run");
    assert_eq!(
        message,
        "has type func(input: u32) -> (u32); must be func(input: string) -> result<report, string>"
    );

    // No export at all.
    let bare = wat::parse_str("(component)").expect("assembles");
    let err = runtime()
        .load("bare", "pure", &bare, &components::digest(&bare))
        .err()
        .expect("refused");
    assert!(
        matches!(&err, LoadError::ExportType { phase, export, message }
            if phase == "bare" && export == "nodeward:host/phase@0.1.0" && message == "is missing"),
        "{err:?}"
    );
}

#[test]
fn a_bundle_with_a_wrong_export_type_runs_nothing() {
    let f = Fixture::new();
    let dir = f.tmp.path().join("bundle");
    let wasm = components::wrong_run_type();
    write_bundle(&dir, &[("typo", "typo.wasm", &wasm, "configure", None)]);
    let bundle = Bundle::load_dir(&dir).expect("digests match");
    let before = snapshot(&f.root);
    let (r, s) = run_bundle(&f, &bundle);
    let err = r.expect_err("refused");
    assert!(
        matches!(&err, RunError::Load(LoadError::ExportType { phase, .. }) if phase == "typo"),
        "{err:?}"
    );
    assert!(
        s.audit.records().is_empty(),
        "setup-host, listed first, never ran"
    );
    assert_eq!(snapshot(&f.root), before);
}

#[test]
fn every_wasi_interface_the_import_check_admits_is_linked() {
    let covered: Vec<&str> = components::WASI_IMPORTS.iter().map(|(n, _)| *n).collect();
    assert_eq!(
        covered, WASI_ALLOWED,
        "each admitted WASI interface needs an import in components::WASI_IMPORTS"
    );
    let imports: Vec<&str> = components::WASI_IMPORTS.iter().map(|(_, w)| *w).collect();
    let wasm = components::importing(&imports);
    let loaded = runtime()
        .load("wasi", "pure", &wasm, &components::digest(&wasm))
        .unwrap_or_else(|e| panic!("an admitted WASI interface does not link: {e}"));
    let expected: Vec<String> = WASI_ALLOWED.iter().map(|n| format!("{n}@0.2.0")).collect();
    assert_eq!(loaded.imports, expected);
    let f = Fixture::new();
    let s = f.session(RunMode::Apply);
    let report = components::run(&s, "wasi", &wasm, Limits::default()).expect("links and runs");
    assert_eq!(report.summary, "ok");

    // What the check does not admit is refused before linking.
    let wasm = components::importing(&[r#"(import "wasi:filesystem/preopens@0.2.0" (instance))"#]);
    let err = runtime()
        .load("wasi", "pure", &wasm, &components::digest(&wasm))
        .err()
        .expect("refused");
    assert!(
        matches!(&err, LoadError::ImportsExceedWorld { import, .. } if import == "wasi:filesystem/preopens@0.2.0"),
        "{err:?}"
    );
}

#[test]
fn a_guest_using_std_hashmap_links_and_runs() {
    let loaded = load_guest(
        nodeward::built::TEST_GUEST_MISBEHAVE_COMPONENT,
        "misbehave",
        "pure",
    );
    assert!(
        loaded
            .imports
            .iter()
            .any(|i| i.starts_with("wasi:random/insecure-seed@")),
        "HashMap::new() seeds from insecure-seed: {:?}",
        loaded.imports
    );
    let f = Fixture::new();
    let s = f.session(RunMode::Apply);
    let report = misbehave(&s, "hashmap", Limits::default()).expect("runs");
    assert_eq!(report.summary, "hashmap: a=2 b=1");
}

#[test]
fn the_test_worlds_are_not_shipped_phase_worlds() {
    let shipped: Vec<&str> = nodeward::built::WORLDS.iter().map(|(w, _)| *w).collect();
    assert_eq!(
        shipped,
        [
            "configure",
            "download-artifacts",
            "install",
            "preflight",
            "setup-host",
            "start-node",
            "stop-node",
            "teardown"
        ]
    );
    let test: Vec<&str> = nodeward::built::TEST_WORLDS
        .iter()
        .map(|(w, _)| *w)
        .collect();
    assert_eq!(test, ["probe", "pure"]);

    // The CLI's runtime does not load a component for a test world; the tests' runtime does.
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("compiled-cache");
    let production = Runtime::new(&cache).expect("runtime");
    let probe = std::fs::read(nodeward::built::TEST_GUEST_PROBE_COMPONENT).expect("probe");
    for world in ["probe", "pure"] {
        let err = production
            .load("p", world, &probe, &sha(&probe))
            .err()
            .expect("refused");
        assert!(
            matches!(&err, LoadError::UnknownWorld { phase, world: w } if phase == "p" && w == world),
            "{err:?}"
        );
    }
    runtime()
        .load("p", "probe", &probe, &sha(&probe))
        .expect("the tests' runtime admits the test worlds");
}

#[test]
fn a_bundle_declaring_a_test_world_is_refused() {
    let f = Fixture::new();
    let dir = f.tmp.path().join("bundle");
    let probe = std::fs::read(nodeward::built::TEST_GUEST_PROBE_COMPONENT).expect("probe");
    let misbehave =
        std::fs::read(nodeward::built::TEST_GUEST_MISBEHAVE_COMPONENT).expect("misbehave");
    for (component, world) in [(&probe, "probe"), (&misbehave, "pure")] {
        write_bundle(&dir, &[("hostile", "hostile.wasm", component, world, None)]);
        let err = Bundle::load_dir(&dir).expect_err("refused");
        assert!(
            matches!(&err, BundleError::UnknownWorld { phase, world: w, .. } if phase == "hostile" && w == world),
            "{err:?}"
        );
        assert!(
            err.to_string()
                .contains(&format!("phase hostile: unknown world \"{world}\"")),
            "{err}"
        );
        // The CLI refuses it too, naming the phase and the world.
        let out = nodeward(&f, &["phases", "inspect", s(&dir)]);
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(&format!("phase hostile: unknown world \"{world}\"")),
            "{stderr}"
        );
    }
}

fn s(p: &Path) -> &str {
    p.to_str().expect("UTF-8 path")
}
