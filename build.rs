//! Builds the phase components and embeds the default bundle.
//!
//! One `cargo build` at the root builds the host for the machine and the guests for
//! wasm32-wasip2:
//! 1. `guest-phases/` (the shipped phases) and `tests/guests/` (test-only guests) are each
//!    built with a nested `cargo build --target wasm32-wasip2 --profile guest`, in a target
//!    directory of their own under `OUT_DIR` and with the outer cargo's environment scrubbed:
//!    sharing the outer build's target directory or leaking its `CARGO_*`/`RUSTC_*` variables
//!    deadlocks on the build lock or builds the wrong thing (research/wasm-spike.md §6).
//! 2. `guest-phases/bundle.toml` is the default bundle's manifest; each phase's sha256 is filled
//!    in from the component just built, and manifest plus components go to
//!    `OUT_DIR/default-bundle/`, which `host/built.rs` embeds with `include_bytes!`.
//! 3. Each of the default bundle's components is precompiled for the target cargo builds for,
//!    by an engine made from the runtime's own configuration (`host/runtime/engine_config.rs`,
//!    included here), into `OUT_DIR/default-bundle-precompiled/`, and embedded next to that
//!    engine's compatibility key and a hash of Cargo.toml's `[build-dependencies]` wasmtime
//!    entry (`host/runtime/embedded.rs` loads them when the runtime's key, made with the
//!    `[dependencies]` entry, matches, and compiles otherwise). A target wasmtime cannot compile for precompiles nothing, with a
//!    warning.
//! 4. The WIT package `wit/` (`nodeward:host`, shipped) is parsed with wit-parser, and each
//!    world's imports are written out as `WORLDS`, so the host can refuse a component whose
//!    imports exceed its declared world and a bundle that declares any other world. The test
//!    package `tests/wit/` (`nodeward:test`: the `probe` and `pure` worlds of the test guests)
//!    is written out apart, as `TEST_WORLDS`, which only a runtime made for tests admits.
//!
//! It panics (failing the build) on a guest crate the bundle does not list, a phase whose
//! component was not built, a world the WIT does not define, a shipped world that does not
//! export `phase`, and a test world named like a shipped one.

#[path = "host/runtime/engine_config.rs"]
mod engine_config;

use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::env;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

const GUEST_TARGET: &str = "wasm32-wasip2";
const GUEST_PROFILE: &str = "guest";

fn main() {
    let root =
        PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    for watched in [
        "wit",
        "guest-phases",
        "tests/guests",
        "tests/wit",
        "node-config/src",
        "node-config/Cargo.toml",
        // Its two wasmtime entries go into the precompiled components' key.
        "Cargo.toml",
    ] {
        println!("cargo:rerun-if-changed={}", root.join(watched).display());
    }

    let worlds = world_imports(&root.join("wit"), None);
    let test_worlds = world_imports(&root.join("tests/wit"), Some(&root.join("wit")));
    for world in test_worlds.keys() {
        assert!(
            !worlds.contains_key(world),
            "tests/wit declares world {world:?}, which wit/ also declares: keep them apart"
        );
    }
    let target_dir = out.join("guest-target");
    let phases = build_workspace(&root.join("guest-phases"), &target_dir);
    let test_guests = build_workspace(&root.join("tests/guests"), &target_dir);

    let bundle_dir = out.join("default-bundle");
    let bundle = write_default_bundle(
        &root.join("guest-phases/bundle.toml"),
        &phases,
        &worlds,
        &bundle_dir,
    );

    let target = env::var("TARGET").expect("cargo sets TARGET");
    println!("cargo:rustc-env=NODEWARD_TARGET={target}");
    // The wasmtime this script links (`[build-dependencies]`) and the one the binary links
    // (`[dependencies]`): the precompiled components' key hashes the first, the runtime's the
    // second (`engine_config::precompiled_key`), so entries that drift apart fall back to
    // compiling rather than load code compiled by another wasmtime.
    let manifest = fs::read_to_string(root.join("Cargo.toml")).expect("read Cargo.toml");
    let wasmtime_build = engine_config::wasmtime_dependency(&manifest, "build-dependencies")
        .unwrap_or_else(|e| panic!("{e}"));
    let wasmtime_runtime = engine_config::wasmtime_dependency(&manifest, "dependencies")
        .unwrap_or_else(|e| panic!("{e}"));
    if wasmtime_build != wasmtime_runtime {
        println!(
            "cargo:warning=Cargo.toml's wasmtime entries differ ([build-dependencies] {wasmtime_build}, [dependencies] {wasmtime_runtime}): the embedded precompiled components will not be used"
        );
    }
    let precompiled = precompile_bundle(
        &target,
        &bundle_dir,
        &bundle,
        &out.join("default-bundle-precompiled"),
        &wasmtime_build,
    );

    let mut src = String::new();
    src.push_str("// @generated by build.rs: the default bundle, the built components and the WIT worlds.\n\n");
    writeln!(
        src,
        "/// Directory holding the default bundle (manifest with digests, and components)."
    )
    .ok();
    writeln!(
        src,
        "pub const DEFAULT_BUNDLE_DIR: &str = {:?};",
        bundle_dir.display().to_string()
    )
    .ok();
    writeln!(src, "/// The default bundle's manifest, digests filled in.").ok();
    writeln!(
        src,
        "pub const DEFAULT_BUNDLE_MANIFEST: &str = include_str!({:?});",
        bundle_dir.join("manifest.toml").display().to_string()
    )
    .ok();
    writeln!(
        src,
        "/// The default bundle's components: (file name, bytes)."
    )
    .ok();
    src.push_str("pub const DEFAULT_BUNDLE_COMPONENTS: &[(&str, &[u8])] = &[\n");
    for file in &bundle {
        writeln!(
            src,
            "    ({file:?}, include_bytes!({:?})),",
            bundle_dir.join(file).display().to_string()
        )
        .ok();
    }
    src.push_str("];\n\n");
    writeln!(
        src,
        "/// The compatibility key of the engine that precompiled the default bundle's components\n\
         /// (empty when nothing was precompiled)."
    )
    .ok();
    writeln!(
        src,
        "pub const PRECOMPILED_COMPAT: &str = {:?};",
        precompiled.compat
    )
    .ok();
    writeln!(
        src,
        "/// The binary's wasmtime entry of Cargo.toml (`[dependencies]`), canonical: part of the\n\
         /// key its engine looks the precompiled components up under."
    )
    .ok();
    writeln!(
        src,
        "pub const WASMTIME_DEPENDENCY: &str = {wasmtime_runtime:?};"
    )
    .ok();
    writeln!(
        src,
        "/// The default bundle's components precompiled, one after the other, in one zstd frame."
    )
    .ok();
    writeln!(
        src,
        "pub const DEFAULT_BUNDLE_PRECOMPILED_ZSTD: &[u8] = include_bytes!({:?});",
        precompiled.frame.display().to_string()
    )
    .ok();
    writeln!(src, "/// The frame's decompressed length.").ok();
    writeln!(
        src,
        "pub const DEFAULT_BUNDLE_PRECOMPILED_LEN: usize = {};",
        precompiled.len
    )
    .ok();
    writeln!(
        src,
        "/// Each precompiled component: (the component's sha256, offset, length) in the\n\
         /// decompressed frame."
    )
    .ok();
    src.push_str("pub const DEFAULT_BUNDLE_PRECOMPILED: &[(&str, usize, usize)] = &[\n");
    for (sha256, offset, len) in &precompiled.index {
        writeln!(src, "    ({sha256:?}, {offset}, {len}),").ok();
    }
    src.push_str("];\n\n");

    let mut phase_names = Vec::new();
    for (name, path) in &phases {
        let konst = name.to_uppercase().replace('-', "_");
        writeln!(src, "/// The built `{name}` phase component.").ok();
        writeln!(
            src,
            "pub const PHASE_{konst}_COMPONENT: &str = {:?};",
            path.display().to_string()
        )
        .ok();
        phase_names.push(name.replace('-', "_"));
    }
    for (name, path) in &test_guests {
        let konst = name.to_uppercase().replace('-', "_");
        writeln!(
            src,
            "/// The built `{name}` test guest (tests/guests/{name})."
        )
        .ok();
        writeln!(
            src,
            "pub const TEST_GUEST_{konst}_COMPONENT: &str = {:?};",
            path.display().to_string()
        )
        .ok();
    }
    src.push_str(
        "\n/// Calls `$m!(phase_name)` once per shipped phase, so a test file can assert that each\n\
         /// phase has a test (`foreach_phase!(assert_test_exists)`).\n#[macro_export]\nmacro_rules! foreach_phase {\n    ($m:ident) => {\n",
    );
    for p in &phase_names {
        writeln!(src, "        $m!({p});").ok();
    }
    src.push_str("    };\n}\n\n");

    src.push_str(
        "/// Each phase world of the shipped package `nodeward:host` (wit/) and the interfaces it\n\
         /// imports: the only worlds a bundle may declare.\n",
    );
    write_worlds(&mut src, "WORLDS", &worlds);
    src.push_str(
        "/// Each world of the test package `nodeward:test` (tests/wit) and the interfaces it\n\
         /// imports. Admitted only by `Runtime::new_admitting_test_worlds`, never by the CLI.\n",
    );
    write_worlds(&mut src, "TEST_WORLDS", &test_worlds);
    fs::write(out.join("built.rs"), src).expect("write OUT_DIR/built.rs");
}

/// Writes `worlds` as `pub const {name}: &[(&str, &[&str])]`.
fn write_worlds(src: &mut String, name: &str, worlds: &BTreeMap<String, Vec<String>>) {
    writeln!(src, "pub const {name}: &[(&str, &[&str])] = &[").ok();
    for (world, imports) in worlds {
        writeln!(src, "    ({world:?}, &{imports:?}),").ok();
    }
    src.push_str("];\n");
}

/// The interface every phase world exports.
const PHASE_EXPORT: &str = "nodeward:host/phase@0.1.0";

/// Parses the WIT package in `dir` (after the package in `uses`, whose interfaces it may
/// import) and returns each world with its imported interfaces (`nodeward:host/fs@0.1.0`).
/// Every world must export [`PHASE_EXPORT`] and nothing else.
fn world_imports(dir: &Path, uses: Option<&Path>) -> BTreeMap<String, Vec<String>> {
    let mut resolve = wit_parser::Resolve::default();
    if let Some(uses) = uses {
        resolve.push_dir(uses).unwrap_or_else(|e| {
            panic!("cannot parse the WIT package in {}: {e:#}", uses.display())
        });
    }
    let (pkg, _) = resolve
        .push_dir(dir)
        .unwrap_or_else(|e| panic!("cannot parse the WIT package in {}: {e:#}", dir.display()));
    let mut out = BTreeMap::new();
    for (name, world_id) in &resolve.packages[pkg].worlds {
        let world = &resolve.worlds[*world_id];
        let exports: Vec<String> = world
            .exports
            .keys()
            .filter_map(|key| match key {
                wit_parser::WorldKey::Interface(id) => resolve.id_of(*id),
                wit_parser::WorldKey::Name(n) => Some(n.clone()),
            })
            .collect();
        assert_eq!(
            exports,
            [PHASE_EXPORT],
            "world {name} in {} must export {PHASE_EXPORT} and nothing else: only phase \
             worlds belong in a WIT package of nodeward",
            dir.display()
        );
        let mut imports: Vec<String> = world
            .imports
            .keys()
            .filter_map(|key| match key {
                wit_parser::WorldKey::Interface(id) => resolve.id_of(*id),
                wit_parser::WorldKey::Name(n) => Some(n.clone()),
            })
            .collect();
        imports.sort();
        out.insert(name.clone(), imports);
    }
    out
}

/// Builds every member of the guest workspace at `ws` and returns each member's name (without
/// its `phase-`/`test-guest-` prefix) with the path of its component.
fn build_workspace(ws: &Path, target_dir: &Path) -> BTreeMap<String, PathBuf> {
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.arg("build")
        .arg("--manifest-path")
        .arg(ws.join("Cargo.toml"))
        .args([
            "--workspace",
            "--target",
            GUEST_TARGET,
            "--profile",
            GUEST_PROFILE,
            "--locked",
        ])
        .arg("--target-dir")
        .arg(target_dir);
    // Scrub what the outer cargo set for this build script; keep the toolchain selection,
    // PATH and HOME.
    for (key, _) in env::vars_os() {
        let Some(key) = key.to_str() else { continue };
        let outer = (key.starts_with("CARGO") && key != "CARGO_HOME" && key != "CARGO_NET_OFFLINE")
            || key.starts_with("RUSTC")
            || key.starts_with("RUSTDOC")
            || key.starts_with("DEP_")
            || matches!(
                key,
                "RUSTFLAGS"
                    | "TARGET"
                    | "HOST"
                    | "OUT_DIR"
                    | "OPT_LEVEL"
                    | "PROFILE"
                    | "DEBUG"
                    | "NUM_JOBS"
            );
        if outer {
            cmd.env_remove(key);
        }
    }
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("cannot run cargo for the guests in {}: {e}", ws.display()));
    if !status.success() {
        panic!(
            "building the guests in {} for {GUEST_TARGET} failed ({status}); \
             is the target installed? `rustup target add {GUEST_TARGET}`",
            ws.display()
        );
    }

    let manifest =
        fs::read_to_string(ws.join("Cargo.toml")).expect("read guest workspace manifest");
    let manifest: toml::Table = manifest.parse().expect("guest workspace manifest is TOML");
    let members = manifest["workspace"]["members"]
        .as_array()
        .expect("guest workspace lists its members");
    let mut out = BTreeMap::new();
    for member in members {
        let member = member.as_str().expect("member is a string");
        let pkg: toml::Table = fs::read_to_string(ws.join(member).join("Cargo.toml"))
            .expect("read guest crate manifest")
            .parse()
            .expect("guest crate manifest is TOML");
        let crate_name = pkg["package"]["name"]
            .as_str()
            .expect("package.name")
            .to_string();
        let wasm = target_dir
            .join(GUEST_TARGET)
            .join(GUEST_PROFILE)
            .join(format!("{}.wasm", crate_name.replace('-', "_")));
        assert!(
            wasm.is_file(),
            "guest {crate_name} built but {} is missing",
            wasm.display()
        );
        let short = crate_name
            .strip_prefix("phase-")
            .or_else(|| crate_name.strip_prefix("test-guest-"))
            .unwrap_or(&crate_name)
            .to_string();
        out.insert(short, wasm);
    }
    out
}

/// Writes the default bundle (manifest with digests + components) into `dir` and returns the
/// component file names.
fn write_default_bundle(
    template: &Path,
    phases: &BTreeMap<String, PathBuf>,
    worlds: &BTreeMap<String, Vec<String>>,
    dir: &Path,
) -> Vec<String> {
    let text = fs::read_to_string(template).expect("read guest-phases/bundle.toml");
    let mut manifest: toml::Table = text.parse().expect("guest-phases/bundle.toml is TOML");
    let _ = fs::remove_dir_all(dir);
    fs::create_dir_all(dir).expect("create default-bundle dir");
    let mut files = Vec::new();
    let mut listed = Vec::new();
    let entries = manifest
        .get_mut("phases")
        .and_then(|p| p.as_array_mut())
        .expect("bundle.toml has [[phases]]");
    for entry in entries {
        let table = entry.as_table_mut().expect("each [[phases]] is a table");
        let name = table["name"].as_str().expect("phase name").to_string();
        let world = table["world"].as_str().expect("phase world");
        assert!(
            worlds.contains_key(world),
            "phase {name} declares world {world:?}, which wit/ does not define"
        );
        let wasm = phases.get(&name).unwrap_or_else(|| {
            panic!("bundle.toml lists phase {name:?} but guest-phases/ has no crate phase-{name}")
        });
        let bytes = fs::read(wasm).expect("read built component");
        let file = table["component"]
            .as_str()
            .expect("phase component")
            .to_string();
        fs::write(dir.join(&file), &bytes).expect("copy component into default bundle");
        table.insert(
            "sha256".into(),
            toml::Value::String(hex::encode(Sha256::digest(&bytes))),
        );
        files.push(file);
        listed.push(name);
    }
    for name in phases.keys() {
        assert!(
            listed.contains(name),
            "guest-phases/ has phase crate {name:?} that bundle.toml does not list"
        );
    }
    let header = "# @generated by build.rs from guest-phases/bundle.toml with digests filled in.\n";
    fs::write(
        dir.join("manifest.toml"),
        format!(
            "{header}{}",
            toml::to_string(&manifest).expect("serialize manifest")
        ),
    )
    .expect("write default bundle manifest");
    files
}

/// What [`precompile_bundle`] made: the engine's compatibility key, the one zstd frame holding
/// every compiled component one after the other, its decompressed length, and per component
/// its sha256, offset and length in the decompressed bytes.
struct Precompiled {
    compat: String,
    frame: PathBuf,
    len: usize,
    index: Vec<(String, usize, usize)>,
}

/// Precompiles each component of the default bundle in `bundle_dir` (its `files`) for
/// `target` into `dir`, as one zstd frame: the components share much of their code (std,
/// serde, the bindings), which one frame with a window over all of them stores once (8 MB of
/// compiled code become under 1 MB; each compressed alone, over 2 MB). Nothing is precompiled
/// (a cargo warning says so) when wasmtime cannot compile for `target`: the runtime then
/// compiles on first use, as it does any bundle's components.
fn precompile_bundle(
    target: &str,
    bundle_dir: &Path,
    files: &[String],
    dir: &Path,
    wasmtime_dependency: &str,
) -> Precompiled {
    let _ = fs::remove_dir_all(dir);
    fs::create_dir_all(dir).expect("create default-bundle-precompiled dir");
    let frame = dir.join("components.cwasm.zst");
    let mut precompiled = Precompiled {
        compat: String::new(),
        frame: frame.clone(),
        len: 0,
        index: Vec::new(),
    };
    let engine = match engine_config::engine_config(target)
        .and_then(|config| wasmtime::Engine::new(&config))
    {
        Ok(engine) => engine,
        Err(e) => {
            println!(
                "cargo:warning=not precompiling the default bundle for {target}: {e:#}; nodeward will compile it on first use"
            );
            fs::write(&frame, []).expect("write empty precompiled frame");
            return precompiled;
        }
    };
    let mut all = Vec::new();
    for file in files {
        let bytes = fs::read(bundle_dir.join(file)).expect("read default bundle component");
        let compiled = engine
            .precompile_component(&bytes)
            .unwrap_or_else(|e| panic!("precompiling default bundle component {file}: {e:#}"));
        precompiled.index.push((
            hex::encode(Sha256::digest(&bytes)),
            all.len(),
            compiled.len(),
        ));
        all.extend_from_slice(&compiled);
    }
    let mut encoder = zstd::Encoder::new(Vec::new(), 19).expect("zstd encoder");
    encoder.include_checksum(true).expect("zstd frame checksum");
    encoder
        .set_pledged_src_size(Some(all.len() as u64))
        .expect("zstd pledged size");
    std::io::Write::write_all(&mut encoder, &all).expect("compress precompiled components");
    fs::write(&frame, encoder.finish().expect("finish zstd frame"))
        .expect("write precompiled frame");
    precompiled.compat = engine_config::precompiled_key(&engine, wasmtime_dependency);
    precompiled.len = all.len();
    precompiled
}
