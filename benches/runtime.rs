//! Runtime benchmark (`cargo bench --bench runtime`): prints figures and ratios, asserts
//! nothing about time.
//!
//! 1. Cold compile per shipped phase (empty cache, the embedded precompiled forms set aside:
//!    validate, compile, write the .cwasm, load), and the size of the compiled form.
//! 2. Loading its precompiled form embedded in the binary (what a fresh node does), and
//!    cached load + instantiate per phase (a fresh runtime over the warm on-disk cache).
//! 3. 10,000 `fs.read-file` calls made by a guest (the probe test guest) vs the same calls made
//!    natively through the same host code (`fs::Host::read_file` on a `PhaseCtx`), and the
//!    ratio: the cost of crossing the component boundary.

use nodeward::audit::Redactor;
use nodeward::bundle::Bundle;
use nodeward::caps::PhaseCtx;
use nodeward::caps::RunContext;
use nodeward::grants::{FsGrant, Grants};
use nodeward::hostpath::HostRoot;
use nodeward::plan::RunMode;
use nodeward::runtime::{Limits, Origin, Runtime};
use nodeward::wit::fs::Host as _;
use sha2::{Digest, Sha256};
use std::sync::Arc;
use std::time::{Duration, Instant};

const READS: u64 = 10_000;

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn ctx(session: &Arc<RunContext>, phase: &str) -> PhaseCtx {
    PhaseCtx {
        phase: phase.into(),
        bundle_digest: "bench".into(),
        grants: Arc::new(Grants {
            fs: FsGrant {
                read: vec!["etc".into()],
                write: vec![],
            },
            ..Grants::default()
        }),
        run: session.clone(),
        deadline: Instant::now() + Duration::from_secs(600),
        budget: Default::default(),
        pinned_artifacts: Default::default(),
        node_bridge: None,
    }
}

/// How many embedded precompiled components a runtime's engine can use.
fn cold_embedded(cache: &std::path::Path) -> Result<usize, Box<dyn std::error::Error>> {
    Ok(Runtime::new(cache)?.embedded_precompiled())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let tmp = tempfile::tempdir()?;
    let cache = tmp.path().join("cache");
    let root_dir = tmp.path().join("root");
    std::fs::create_dir_all(root_dir.join("etc"))?;
    std::fs::write(root_dir.join("etc/hostname"), b"worker-01\n")?;
    let limits = Limits::default();
    let bundle = Bundle::embedded()?;
    let session = Arc::new(RunContext::new(
        HostRoot::open(&root_dir)?,
        RunMode::Plan,
        Redactor::default(),
    ));

    println!(
        "nodeward runtime benchmark (release build: {})",
        !cfg!(debug_assertions)
    );
    println!(
        "\n1. cold compile (empty cache) and 2. embedded precompiled load, cached load + instantiate, per phase"
    );
    let cold = Runtime::new(&cache)?.without_embedded_precompiled();
    println!(
        "  (this engine can use {} embedded precompiled components)",
        cold_embedded(&cache)?
    );
    let (mut wasm_total, mut compiled_total) = (0, 0);
    for phase in &bundle.manifest.phases {
        let wasm = bundle.component(&phase.name).unwrap_or_default();
        let t = Instant::now();
        cold.load(&phase.name, &phase.world, wasm, &phase.sha256)?;
        let compile = t.elapsed();
        let compiled = std::fs::metadata(cold.cache_path(&phase.sha256))?.len();
        wasm_total += wasm.len() as u64;
        compiled_total += compiled;

        let fresh = Runtime::new(&tmp.path().join(format!("fresh-{}", phase.name)))?;
        let t = Instant::now();
        let embedded = fresh.load(&phase.name, &phase.world, wasm, &phase.sha256)?;
        let embedded_load = t.elapsed();

        let warm = Runtime::new(&cache)?.without_embedded_precompiled();
        let t = Instant::now();
        let loaded = warm.load(&phase.name, &phase.world, wasm, &phase.sha256)?;
        let load = t.elapsed();
        assert_eq!(
            loaded.origin,
            Origin::Cache,
            "second runtime must load from the on-disk cache"
        );
        let mut samples = Vec::new();
        for _ in 0..200 {
            let t = Instant::now();
            warm.instantiate(&loaded, ctx(&session, &phase.name), limits)?;
            samples.push(t.elapsed());
        }
        samples.sort();
        let inst = samples[samples.len() / 2];
        println!(
            "  {:<18} {:>7} bytes ({:>7} compiled)  cold compile {:>8.2} ms | {} {:>6.3} ms | cached load {:>6.3} ms + instantiate (median of 200) {:>6.3} ms | cold/cached {:>6.1}x",
            phase.name,
            wasm.len(),
            compiled,
            ms(compile),
            match embedded.origin {
                Origin::Embedded => "embedded load",
                _ => "(not embedded) compile",
            },
            ms(embedded_load),
            ms(load),
            ms(inst),
            compile.as_secs_f64() / (load + inst).as_secs_f64()
        );
    }
    println!("  all phases: {wasm_total} bytes of components, {compiled_total} bytes compiled");

    println!(
        "\n3. {READS} fs.read-file calls of etc/hostname: guest vs native through the same host code"
    );
    let probe = std::fs::read(nodeward::built::TEST_GUEST_PROBE_COMPONENT)?;
    let digest = hex::encode(Sha256::digest(&probe));
    let rt = Runtime::new_admitting_test_worlds(&cache)?;
    let loaded = rt.load("probe", "probe", &probe, &digest)?;
    let input = format!(r#"[{{"op":"fs.read-file-repeat","path":"etc/hostname","n":{READS}}}]"#);
    let t = Instant::now();
    let report = rt.run(&loaded, ctx(&session, "probe"), &input, limits)?;
    let guest = t.elapsed();
    let expected = format!(r#"[{{"ok":{}}}]"#, READS * 10);
    assert_eq!(report.summary, expected, "probe read every byte");

    let mut native_ctx = ctx(&session, "native");
    let t = Instant::now();
    let mut total = 0usize;
    for _ in 0..READS {
        total += native_ctx
            .read_file("etc/hostname".into())
            .map_err(|e| format!("{e:?}"))?
            .len();
    }
    let native = t.elapsed();
    assert_eq!(total as u64, READS * 10);
    println!(
        "  guest  {:>8.2} ms ({:>6.2} µs/call, includes one instantiate)\n  native {:>8.2} ms ({:>6.2} µs/call)\n  guest/native ratio {:.2}",
        ms(guest),
        guest.as_secs_f64() * 1e6 / READS as f64,
        ms(native),
        native.as_secs_f64() * 1e6 / READS as f64,
        guest.as_secs_f64() / native.as_secs_f64()
    );
    Ok(())
}
