//! Runtime benchmark (`cargo bench --bench runtime`): prints figures and ratios, asserts
//! nothing about time.
//!
//! 1. Cold compile per shipped phase (empty cache: validate, compile, write the .cwasm, load).
//! 2. Cached load + instantiate per phase (a fresh runtime over the warm on-disk cache).
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
use nodeward::runtime::{Limits, Runtime};
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
    println!("\n1. cold compile (empty cache) and 2. cached load + instantiate, per phase");
    let cold = Runtime::new(&cache)?;
    for phase in &bundle.manifest.phases {
        let wasm = bundle.component(&phase.name).unwrap_or_default();
        let t = Instant::now();
        cold.load(&phase.name, &phase.world, wasm, &phase.sha256)?;
        let compile = t.elapsed();

        let warm = Runtime::new(&cache)?;
        let t = Instant::now();
        let loaded = warm.load(&phase.name, &phase.world, wasm, &phase.sha256)?;
        let load = t.elapsed();
        assert!(
            loaded.from_cache,
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
            "  {:<12} {:>7} bytes  cold compile {:>8.2} ms | cached load {:>6.3} ms + instantiate (median of 200) {:>6.3} ms | cold/cached {:>6.1}x",
            phase.name,
            wasm.len(),
            ms(compile),
            ms(load),
            ms(inst),
            compile.as_secs_f64() / (load + inst).as_secs_f64()
        );
    }

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
