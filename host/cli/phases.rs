//! `nodeward phases …`: list, inspect, diff, pack, sign, verify, install and roll back bundles.

use super::*;

pub(super) fn phases_list(common: &Common) -> Result<(), Failure> {
    let bundle = load_bundle(common, false)?;
    if common.output == Format::Json {
        let phases: Vec<_> = bundle
            .manifest
            .phases
            .iter()
            .map(|p| json!({ "name": p.name, "world": p.world, "sha256": p.sha256 }))
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(
                &json!({ "bundle": bundle_json(&bundle), "phases": phases })
            )
            .unwrap_or_default()
        );
    } else {
        println!(
            "{} {} v{} (sha256 {})",
            bundle.source,
            bundle.manifest.bundle.name,
            bundle.manifest.bundle.version,
            bundle.digest
        );
        for p in &bundle.manifest.phases {
            println!("  {:<16} world {:<12} sha256 {}", p.name, p.world, p.sha256);
        }
    }
    Ok(())
}

/// The signature status of an explicitly named bundle, for auditors: never refuses.
pub(super) fn signature_status(common: &Common, files: &BundleFiles) -> serde_json::Value {
    let keys = match trusted_keys(common) {
        Ok(k) => k,
        Err(f) => return json!({ "verified": false, "problem": f.message }),
    };
    match bundles::verify_files(files, &keys) {
        Ok(b) => json!({ "verified": true, "key-id": b.signed_by }),
        Err(e) => json!({ "verified": false, "problem": e.to_string() }),
    }
}

pub(super) fn phases_inspect(common: &Common, path: Option<&Path>) -> Result<(), Failure> {
    let (bundle, sig) = match path.or(common.bundle.as_deref()) {
        Some(p) => {
            let files = BundleFiles::open(p).map_err(failed)?;
            let bundle = Bundle::from_files(&files).map_err(failed)?;
            (bundle, signature_status(common, &files))
        }
        None => {
            let b = effective_bundle(common)?;
            let s = match &b.source {
                bundles::BundleSource::Embedded => json!({ "verified": true, "embedded": true }),
                _ => json!({ "verified": true, "at": "install" }),
            };
            (b, s)
        }
    };
    let mut phases = Vec::new();
    for p in &bundle.manifest.phases {
        let imports = diff::component_imports(bundle.component(&p.name).unwrap_or_default())
            .map_err(|e| {
                failed(format!(
                    "{}: phase {}: {}: {e}",
                    bundle.source, p.name, p.component
                ))
            })?;
        let beyond = crate::runtime::check_imports(&p.name, &p.world, &imports).err();
        phases.push(json!({
            "name": p.name,
            "world": p.world,
            "component": p.component,
            "sha256": p.sha256,
            "imports": imports,
            "capabilities": diff::capabilities(&imports),
            "within-world": beyond.is_none(),
            "problem": beyond.map(|e| e.to_string()),
            "grants": p.grants,
        }));
    }
    if common.output == Format::Json {
        print_json(&json!({ "bundle": bundle_json(&bundle), "signature": sig, "phases": phases }));
    } else {
        println!("{} {}", bundle.source, bundle.id_text());
        println!("signature: {sig}");
        for p in &phases {
            println!(
                "\nphase {} (world {}, sha256 {})",
                p["name"].as_str().unwrap_or_default(),
                p["world"].as_str().unwrap_or_default(),
                p["sha256"].as_str().unwrap_or_default()
            );
            println!("  imports:");
            for i in p["imports"].as_array().into_iter().flatten() {
                println!("    {}", i.as_str().unwrap_or_default());
            }
            if let Some(problem) = p["problem"].as_str() {
                println!("  REFUSED: {problem}");
            }
            let grants = toml::to_string(&p["grants"]).unwrap_or_default();
            println!("  grants:");
            for line in grants.lines() {
                println!("    {line}");
            }
        }
    }
    Ok(())
}

pub(super) fn version(common: &Common) -> Result<(), Failure> {
    let bundle = load_bundle(common, false)?;
    let v = json!({
        "nodeward": env!("CARGO_PKG_VERSION"),
        "wasmtime": "48.0.8",
        "wit": crate::WIT_PACKAGE,
        "bundle": bundle_json(&bundle),
    });
    if common.output == Format::Json {
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
    } else {
        println!(
            "nodeward {} (wasmtime 48.0.8, WIT {}, {} {} v{} sha256 {})",
            env!("CARGO_PKG_VERSION"),
            crate::WIT_PACKAGE,
            bundle.source,
            bundle.manifest.bundle.name,
            bundle.manifest.bundle.version,
            bundle.digest
        );
    }
    Ok(())
}

/// Resolves a bundle argument of `phases diff`: `@current` is the bundle that runs now.
pub(super) fn diff_operand(common: &Common, path: &Path) -> Result<Bundle, Failure> {
    if path.as_os_str() == "@current" {
        return effective_bundle(common);
    }
    let files = BundleFiles::open(path).map_err(failed)?;
    Bundle::from_files(&files).map_err(failed)
}

pub(super) fn phases_pack(dir: &Path, out: &Path) -> Result<(), Failure> {
    let manifest_path = dir.join(bundles::MANIFEST_FILE);
    let text = std::fs::read_to_string(&manifest_path)
        .map_err(|e| failed(format!("{}: {e}", manifest_path.display())))?;
    let mut table: toml::Table = text
        .parse()
        .map_err(|e| failed(format!("{}: {e}", manifest_path.display())))?;
    let mut files: Vec<(String, Vec<u8>)> = Vec::new();
    let phases = table
        .get_mut("phases")
        .and_then(toml::Value::as_array_mut)
        .ok_or_else(|| failed(format!("{}: no [[phases]]", manifest_path.display())))?;
    for (i, entry) in phases.iter_mut().enumerate() {
        let t = entry.as_table_mut().ok_or_else(|| {
            failed(format!(
                "{}: phases[{i}] is not a table",
                manifest_path.display()
            ))
        })?;
        let component = t
            .get("component")
            .and_then(toml::Value::as_str)
            .filter(|c| !c.is_empty() && !c.contains('/') && !c.starts_with('.'))
            .ok_or_else(|| {
                failed(format!(
                    "{}: phases[{i}].component must be a plain file name",
                    manifest_path.display()
                ))
            })?
            .to_string();
        let path = dir.join(&component);
        let bytes = std::fs::read(&path).map_err(|e| failed(format!("{}: {e}", path.display())))?;
        t.insert(
            "sha256".into(),
            toml::Value::String(bundles::sha256_hex(&bytes)),
        );
        files.push((component, bytes));
    }
    let manifest = toml::to_string(&table).map_err(failed)?.into_bytes();
    // Check the result exactly as the agent will, before writing anything.
    Bundle::from_parts(
        &manifest,
        bundles::BundleSource::Dir(dir.to_path_buf()),
        |f| {
            files
                .iter()
                .find(|(n, _)| n == f)
                .map(|(_, b)| b.clone())
                .ok_or_else(|| "not listed".to_string())
        },
    )
    .map_err(failed)?;
    let mut all: Vec<(&str, &[u8])> = vec![(bundles::MANIFEST_FILE, &manifest)];
    all.extend(files.iter().map(|(n, b)| (n.as_str(), b.as_slice())));
    if bundles::archive::is_archive_name(out) {
        bundles::archive::write(out, &all).map_err(failed)?;
    } else {
        if out.exists() {
            return Err(failed(format!("{}: already exists", out.display())));
        }
        std::fs::create_dir_all(out).map_err(|e| failed(format!("{}: {e}", out.display())))?;
        for (name, bytes) in &all {
            let p = out.join(name);
            std::fs::write(&p, bytes).map_err(|e| failed(format!("{}: {e}", p.display())))?;
        }
    }
    println!(
        "packed {} phase(s) into {} (manifest sha256 {}); sign it next",
        files.len(),
        out.display(),
        bundles::sha256_hex(&manifest)
    );
    Ok(())
}

pub(super) fn phases_sign(
    path: &Path,
    key: &Path,
    password_file: Option<&Path>,
) -> Result<(), Failure> {
    let files = BundleFiles::open(path).map_err(failed)?;
    // Parse and digest-check first: never sign a manifest the agent would refuse.
    let bundle = Bundle::from_files(&files).map_err(failed)?;
    let password = match password_file {
        Some(p) => Some(
            std::fs::read_to_string(p)
                .map_err(|e| failed(format!("{}: {e}", p.display())))?
                .trim_end_matches(['\n', '\r'])
                .to_string(),
        ),
        None => None,
    };
    let meta = &bundle.manifest.bundle;
    let sig = signature::sign(&files.manifest, key, password, &meta.name, meta.version)
        .map_err(failed)?;
    if path.is_dir() {
        let p = path.join(bundles::SIGNATURE_FILE);
        std::fs::write(&p, &sig).map_err(|e| failed(format!("{}: {e}", p.display())))?;
    } else {
        let mut all: Vec<(&str, &[u8])> = vec![
            (bundles::MANIFEST_FILE, &files.manifest),
            (bundles::SIGNATURE_FILE, sig.as_bytes()),
        ];
        let mut comps = Vec::new();
        for p in &bundle.manifest.phases {
            comps.push((
                p.component.as_str(),
                bundle.component(&p.name).unwrap_or_default(),
            ));
        }
        all.extend(comps);
        bundles::archive::write(path, &all).map_err(failed)?;
    }
    println!(
        "signed {} ({}) with {}",
        path.display(),
        bundle.id_text(),
        key.display()
    );
    Ok(())
}

pub(super) fn phases_verify(common: &Common, path: &Path) -> Result<(), Failure> {
    let keys = trusted_keys(common)?;
    let (bundle, _) = bundles::open_verified(path, &keys).map_err(failed)?;
    if common.output == Format::Json {
        print_json(&json!({ "verified": true, "bundle": bundle_json(&bundle) }));
    } else {
        println!(
            "{}: {} verified: signed by trusted key {}, every component digest matches",
            path.display(),
            bundle.id_text(),
            bundle.signed_by.as_deref().unwrap_or_default()
        );
    }
    Ok(())
}

/// Asks on the terminal whether to accept wider grants.
pub(super) fn confirm_on_terminal() -> bool {
    eprint!("Accept the wider authority? [y/N] ");
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    std::io::stdin().read_line(&mut answer).is_ok() && matches!(answer.trim(), "y" | "Y" | "yes")
}

pub(super) fn phases_install(
    common: &Common,
    path: &Path,
    allow_downgrade: bool,
    accept_new_grants: bool,
) -> Result<(), Failure> {
    let keys = trusted_keys(common)?;
    let (bundle, files) = bundles::open_verified(path, &keys).map_err(failed)?;
    let store = Store::new(&state_dir(common));
    let _lock = store.lock().map_err(failed)?;
    let current = store.current().map_err(|e| {
        failed(format!(
            "{e} (the installed current bundle is unusable; `nodeward phases rollback` returns to last-good)"
        ))
    })?;
    if current.as_ref().is_some_and(|c| c.digest == bundle.digest) {
        println!("{} is already current", bundle.id_text());
        return Ok(());
    }
    if let Some(c) = &current {
        let (old, new) = (c.manifest.bundle.version, bundle.manifest.bundle.version);
        if new <= old && !allow_downgrade {
            return Err(failed(format!(
                "{}: version {new} is not higher than the current bundle's ({}); pass --allow-downgrade to install it anyway",
                files.source,
                c.id_text()
            )));
        }
    }
    // Escalation is judged against what runs now: the installed bundle, else the embedded one.
    let baseline = match current {
        Some(c) => c,
        None => Bundle::embedded().map_err(failed)?,
    };
    let d: BundleDiff = diff::diff(&baseline, &bundle).map_err(failed)?;
    if d.widens() {
        eprintln!(
            "{} may do more than the current bundle:\n{}",
            bundle.id_text(),
            d.to_text()
        );
        if !accept_new_grants {
            let accepted = std::io::stdin().is_terminal() && confirm_on_terminal();
            if !accepted {
                return Err(failed(format!(
                    "{}: its capabilities or grants are wider than the current bundle's (above); pass --accept-new-grants to install it",
                    files.source
                )));
            }
        }
    }
    // Precompile every component (this also refuses imports beyond a phase's world) before
    // anything of the store changes.
    let runtime = runtime(common)?;
    for p in &bundle.manifest.phases {
        runtime
            .load(
                &p.name,
                &p.world,
                bundle.component(&p.name).unwrap_or_default(),
                &p.sha256,
            )
            .map_err(|e| failed(format!("{}: {e}", files.source)))?;
    }
    store::abort_point("install:after-precompile");
    store.stage(&bundle, &files).map_err(failed)?;
    store::abort_point("install:after-stage");
    let previous = store.switch(&bundle.digest).map_err(failed)?;
    store.prune().map_err(failed)?;
    if common.output == Format::Json {
        print_json(&json!({
            "installed": bundle_json(&bundle),
            "last-good": previous,
            "widened": d.widens(),
        }));
    } else {
        println!(
            "installed {} as current (signed by {}); last-good: {}",
            bundle.id_text(),
            bundle.signed_by.as_deref().unwrap_or_default(),
            previous.as_deref().unwrap_or("none (the embedded bundle)")
        );
    }
    Ok(())
}

pub(super) fn phases_rollback(common: &Common) -> Result<(), Failure> {
    let store = Store::new(&state_dir(common));
    let _lock = store.lock().map_err(failed)?;
    let target = store.last_good().map_err(failed)?.ok_or_else(|| {
        failed(format!(
            "{}: there is no last-good bundle to roll back to",
            store.dir().display()
        ))
    })?;
    let from = store.link(store::CURRENT).map_err(failed)?;
    // The target is about to run: make sure its components compile and stay in their worlds.
    let runtime = runtime(common)?;
    for p in &target.manifest.phases {
        runtime
            .load(
                &p.name,
                &p.world,
                target.component(&p.name).unwrap_or_default(),
                &p.sha256,
            )
            .map_err(|e| failed(format!("{}: {e}", target.source)))?;
    }
    store
        .set_link(store::CURRENT, &target.digest)
        .map_err(failed)?;
    store.remove_link(store::LAST_GOOD).map_err(failed)?;
    if common.output == Format::Json {
        print_json(&json!({ "current": bundle_json(&target), "rolled-back-from": from }));
    } else {
        println!(
            "rolled back to {} (from {})",
            target.id_text(),
            from.as_deref().unwrap_or("none")
        );
    }
    Ok(())
}

pub(super) fn phases_diff(common: &Common, old: &Path, new: &Path) -> Result<(), Failure> {
    let old = diff_operand(common, old)?;
    let new = diff_operand(common, new)?;
    let d = diff::diff(&old, &new).map_err(failed)?;
    if common.output == Format::Json {
        print_json(&d.to_json());
    } else {
        print!("{}", d.to_text());
    }
    Ok(())
}
