//! `nodeward phases …` (list, inspect, diff, pack, export, sign, verify, roll back and forward,
//! history, uninstall; install is [`super::install`]),
//! `version`, and `plan`/`apply --phase` (single phases of a bundle).

use super::audit::StoreTrail;
use super::flags::OutputArgs;
use super::json::{
    InspectOutput, InspectedPhase, ListOutput, ListedPhase, PackOutput, RollbackOutput,
    RollforwardOutput, RunOutput, SignOutput, Signature, VerifyOutput, VersionOutput,
};
use super::output::{
    print_change_total, print_json, print_new_changes, print_redacted_json, print_step,
};
use super::*;
use crate::audit::entry::BundleAction;
use crate::bundle::inspect::{self, SignatureStatus};
use crate::bundle::install::{self, Direction};
use crate::bundle::{BundleFiles, BundleSource, diff, pack as packing};
use crate::session::{RunError, Step};

/// `plan`/`apply --phase NAME…`: the named phases of the bundle, in bundle order.
pub(super) fn run(
    args: &RunArgs,
    names: &[String],
    mode: RunMode,
    offline: Option<&std::path::Path>,
) -> Result<(), Failure> {
    let config = crate::config::load(args.config.path()).map_err(usage)?;
    let offline = match offline {
        Some(file) => Some(super::offline::prepare(args, file, &config, mode)?),
        None => None,
    };
    let bundle = match &offline {
        Some(o) => o.bundle.clone(),
        None => run_bundle(args, mode)?,
    };
    let root = HostRoot::open(&args.host.root).map_err(usage)?;
    let runtime = runtime(&args.host.root, &args.state)?;
    let limits = args.limits.limits();
    let verb = if mode == RunMode::Plan {
        "plan"
    } else {
        "apply"
    };
    let text = args.output.text();
    if text {
        println!(
            "nodeward {verb}: {} {} v{} (sha256 {}) against {}",
            bundle.source,
            bundle.manifest.bundle.name,
            bundle.manifest.bundle.version,
            &bundle.digest[..16],
            root.path().display()
        );
    }
    let layout = layout(&args.host, &root);
    let session = session(args, root, mode, &config, offline.map(|o| o.name))?;
    let command = names
        .iter()
        .fold(verb.to_string(), |c, n| format!("{c} --phase {n}"));
    let audit = super::audit::start(
        &args.host.root,
        &args.state,
        &args.audit,
        &command,
        &session,
    )?;
    let mut printed = 0;
    let input =
        crate::node::input::for_phases(&config, &layout, mode, names, &args.config.source())
            .map_err(failed)?;
    // apply writes where bootstrap does: under the node lock, after the sweep.
    let _lock = match mode {
        RunMode::Apply => Some(crate::node::sweep::lock(&session, &runtime).map_err(failed)?),
        RunMode::Plan => None,
    };
    let mut steps = Vec::new();
    let result = crate::session::run(
        &runtime,
        &bundle,
        &session,
        &input,
        names,
        limits,
        |step: &Step| {
            if text {
                print_step(step, &session, false, &mut printed);
            }
            steps.push(step.clone());
        },
    );
    let error = match result {
        Ok(_) => None,
        Err(RunError::UnknownPhase(p)) => return Err(usage(RunError::UnknownPhase(p))),
        Err(e) => Some(session.redactor.redact(&e.to_string())),
    };
    let error = audit.end(error);
    if text {
        print_new_changes(&session, &mut printed);
        print_change_total(&session);
    } else {
        let output = RunOutput::new(
            mode,
            "phases".to_string(),
            &session,
            bundle.id(),
            steps,
            error.clone(),
        );
        print_redacted_json(&output, &session.redactor)?;
    }
    match error {
        Some(e) => Err(failed(e)),
        None => Ok(()),
    }
}

pub(super) fn list(
    root: &Path,
    state: &StateArgs,
    bundle: &BundleArgs,
    output: &OutputArgs,
) -> Result<(), Failure> {
    let bundle = load_bundle(root, state, bundle, RunMode::Plan, false)?;
    if !output.text() {
        let phases = bundle
            .manifest
            .phases
            .iter()
            .map(|p| ListedPhase {
                name: &p.name,
                world: &p.world,
                sha256: &p.sha256,
            })
            .collect();
        print_json(&ListOutput {
            bundle: bundle.id(),
            phases,
        })?;
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
fn signature(root: &Path, keys: &KeyArgs, files: &BundleFiles) -> Signature {
    let (verified, key_id, problem) = match inspect::signature_status(files, load_keys(root, keys))
    {
        SignatureStatus::Verified { key_id } => (true, key_id, None),
        SignatureStatus::Keys(e) => (false, None, Some(e.to_string())),
        SignatureStatus::Refused(e) => (false, None, Some(e.to_string())),
    };
    Signature {
        verified,
        checked: "now",
        key_id,
        problem,
    }
}

pub(super) fn inspect(
    root: &Path,
    state: &StateArgs,
    bundle: &BundleArgs,
    output: &OutputArgs,
    path: Option<&Path>,
) -> Result<(), Failure> {
    let (bundle, signature) = match path.or(bundle.bundle.as_deref()) {
        Some(p) => {
            let files = BundleFiles::open(p).map_err(failed)?;
            let b = Bundle::from_files(&files).map_err(failed)?;
            (b, signature(root, &bundle.keys, &files))
        }
        None => {
            let b = effective_bundle(root, state)?;
            let checked = match &b.source {
                BundleSource::Embedded => "embedded",
                _ => "install",
            };
            let signature = Signature {
                verified: true,
                checked,
                key_id: b.signed_by.clone(),
                problem: None,
            };
            (b, signature)
        }
    };
    let phases: Vec<InspectedPhase> = inspect::phases(&bundle)
        .map_err(failed)?
        .into_iter()
        .map(|p| InspectedPhase {
            name: p.name,
            world: p.world,
            component: p.component,
            sha256: p.sha256,
            imports: p.imports,
            capabilities: p.capabilities,
            within_world: p.beyond_world.is_none(),
            problem: p.beyond_world.map(|e| e.to_string()),
            grants: p.grants,
        })
        .collect();
    if !output.text() {
        return print_json(&InspectOutput {
            bundle: bundle.id(),
            signature,
            phases,
        });
    }
    println!("{} {}", bundle.source, bundle.id_text());
    println!("signature: {}", signature_text(&signature));
    for p in &phases {
        println!(
            "\nphase {} (world {}, sha256 {})",
            p.name, p.world, p.sha256
        );
        println!("  imports:");
        for i in &p.imports {
            println!("    {i}");
        }
        if let Some(problem) = &p.problem {
            println!("  REFUSED: {problem}");
        }
        // Display only: grants that do not render as TOML print as none (as they always have).
        let grants = toml::to_string(&p.grants).unwrap_or_default();
        println!("  grants:");
        for line in grants.lines() {
            println!("    {line}");
        }
    }
    Ok(())
}

/// The signature line of `phases inspect`, for people.
fn signature_text(s: &Signature) -> String {
    match (s.verified, s.checked, &s.key_id, &s.problem) {
        (_, _, _, Some(problem)) => format!("NOT verified: {problem}"),
        (true, "embedded", _, _) => "embedded in the binary".to_string(),
        (true, "install", _, _) => "verified when it was installed".to_string(),
        (true, _, Some(key), _) => format!("verified (signed by trusted key {key})"),
        _ => "NOT verified".to_string(),
    }
}

pub(super) fn version(
    root: &Path,
    state: &StateArgs,
    bundle: &BundleArgs,
    output: &OutputArgs,
) -> Result<(), Failure> {
    let bundle = load_bundle(root, state, bundle, RunMode::Plan, false)?;
    if !output.text() {
        print_json(&VersionOutput {
            nodeward: env!("CARGO_PKG_VERSION"),
            wasmtime: "48.0.8",
            wit: crate::WIT_PACKAGE,
            bundle: bundle.id(),
        })?;
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
fn diff_operand(root: &Path, state: &StateArgs, path: &Path) -> Result<Bundle, Failure> {
    if path.as_os_str() == "@current" {
        return effective_bundle(root, state);
    }
    let files = BundleFiles::open(path).map_err(failed)?;
    Bundle::from_files(&files).map_err(failed)
}

pub(super) fn diff(
    root: &Path,
    state: &StateArgs,
    output: &OutputArgs,
    old: &Path,
    new: &Path,
) -> Result<(), Failure> {
    let old = diff_operand(root, state, old)?;
    let new = diff_operand(root, state, new)?;
    let d = diff::diff(&old, &new).map_err(failed)?;
    if !output.text() {
        print_json(&d.to_json())?;
    } else {
        print!("{}", d.to_text());
    }
    Ok(())
}

pub(super) fn pack(output: &OutputArgs, dir: &Path, out: &Path) -> Result<(), Failure> {
    let packed = packing::pack(dir, out).map_err(failed)?;
    if !output.text() {
        return print_json(&PackOutput {
            path: out.display().to_string(),
            digest: packed.digest(),
            phases: packed.components.len(),
            signed: false,
        });
    }
    println!(
        "packed {} phase(s) into {} (manifest sha256 {}); sign it next",
        packed.components.len(),
        out.display(),
        packed.digest()
    );
    Ok(())
}

pub(super) fn export(out: &Path) -> Result<(), Failure> {
    let bundle = packing::export_embedded(out).map_err(failed)?;
    println!(
        "exported the embedded bundle {} ({} phase(s)) to {}; edit, pack and sign it",
        bundle.id_text(),
        bundle.manifest.phases.len(),
        out.display()
    );
    Ok(())
}

pub(super) fn sign(
    output: &OutputArgs,
    path: &Path,
    key: &Path,
    password_file: Option<&Path>,
) -> Result<(), Failure> {
    let bundle = packing::sign(path, key, password_file).map_err(failed)?;
    if !output.text() {
        return print_json(&SignOutput {
            path: path.display().to_string(),
            bundle: bundle.id(),
            key: key.display().to_string(),
        });
    }
    println!(
        "signed {} ({}) with {}",
        path.display(),
        bundle.id_text(),
        key.display()
    );
    Ok(())
}

pub(super) fn verify(
    root: &Path,
    keys: &KeyArgs,
    output: &OutputArgs,
    path: &Path,
) -> Result<(), Failure> {
    let keys = trusted_keys(root, keys)?;
    let (bundle, _) = crate::bundle::open_verified(path, &keys).map_err(failed)?;
    if !output.text() {
        print_json(&VerifyOutput {
            verified: true,
            bundle: bundle.id(),
        })?;
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

/// `phases rollback` and `phases rollforward`: one step back or forward in the store's history;
/// with `expect` (a digest or `embedded`), only when that is where the step lands.
pub(super) fn move_bundle(
    at: StoreTrail<'_>,
    state: &StateArgs,
    output: &OutputArgs,
    direction: Direction,
    expect: Option<&str>,
) -> Result<(), Failure> {
    let store = bundle_store(at.root, state);
    let pending = install::prepare_move(&store, direction).map_err(failed)?;
    if let Some(expected) = expect {
        let target = pending.target();
        let lands = match target.source {
            crate::bundle::BundleSource::Embedded => "embedded",
            _ => target.digest.as_str(),
        };
        if lands != expected {
            return Err(failed(format!(
                "a rollback would make {} current, not {expected}: nothing changed",
                target.id_text()
            )));
        }
    }
    let runtime = runtime(at.root, state)?;
    let (command, action) = match direction {
        Direction::Back => ("phases rollback", BundleAction::Rollback),
        Direction::Forward => ("phases rollforward", BundleAction::Rollforward),
    };
    let trail = super::audit::bundle_trail(at, state, command)?;
    let done = pending
        .commit(&runtime)
        .map_err(|e| super::audit::bundle_failed(&trail, e))?;
    let current = super::audit::bundle_ref(&done.current);
    super::audit::bundle_done(&trail, action, current, done.from.clone())?;
    if !output.text() {
        let current = done.current.id();
        match direction {
            Direction::Back => print_json(&RollbackOutput {
                current,
                rolled_back_from: done.from,
            })?,
            Direction::Forward => print_json(&RollforwardOutput {
                current,
                rolled_forward_from: done.from,
            })?,
        }
    } else {
        println!(
            "rolled {} to {}{} (from {})",
            match direction {
                Direction::Back => "back",
                Direction::Forward => "forward",
            },
            if done.current.source == BundleSource::Embedded {
                "the embedded bundle "
            } else {
                ""
            },
            done.current.id_text(),
            done.from.as_deref().unwrap_or("the embedded bundle")
        );
    }
    Ok(())
}

/// `phases history`: every install, oldest first, and which one runs.
pub(super) fn history(root: &Path, state: &StateArgs, output: &OutputArgs) -> Result<(), Failure> {
    let store = bundle_store(root, state);
    let history = {
        // Under the lock: the history is reconciled with the links a killed run left.
        let _lock = store.lock().map_err(failed)?;
        store.history().map_err(failed)?
    };
    let last_good = history.last_good().map(str::to_string);
    if !output.text() {
        let entries = history
            .entries
            .iter()
            .enumerate()
            .map(|(i, e)| super::json::HistoryEntry {
                digest: e.digest.clone(),
                name: e.name.clone(),
                version: e.version,
                installed_at: e.installed_at,
                rolled_back: e.rolled_back,
                current: history.current == Some(i),
            })
            .collect();
        return print_json(&super::json::HistoryOutput {
            entries,
            current: history.current_entry().map(|e| e.digest.clone()),
            embedded_current: history.current.is_none(),
            last_good,
        });
    }
    if history.entries.is_empty() {
        println!("no installs: the embedded bundle runs");
        return Ok(());
    }
    for (i, e) in history.entries.iter().enumerate() {
        let mark = if history.current == Some(i) {
            "current"
        } else if last_good.as_deref() == Some(e.digest.as_str())
            && history.rollback_target().flatten() == Some(i)
        {
            "last-good"
        } else if e.rolled_back {
            "rolled back"
        } else {
            ""
        };
        // 0: a time the history never had (recovered from the links of an older store);
        // never shown as the epoch.
        let at = match e.installed_at {
            0 => "installed at an unknown time".to_string(),
            t => format!(
                "installed at {}",
                humantime::format_rfc3339_seconds(
                    std::time::UNIX_EPOCH + std::time::Duration::from_secs(t)
                )
            ),
        };
        println!(
            "{:>3}  {} v{} (sha256 {})  {at}  {mark}",
            i + 1,
            e.name,
            e.version,
            e.digest,
        );
    }
    if history.current.is_none() {
        println!("the embedded bundle runs");
    }
    Ok(())
}

/// `phases uninstall`: back to the embedded bundle, history kept.
pub(super) fn uninstall(
    at: StoreTrail<'_>,
    state: &StateArgs,
    output: &OutputArgs,
) -> Result<(), Failure> {
    let store = bundle_store(at.root, state);
    let trail = super::audit::bundle_trail(at, state, "phases uninstall")?;
    let from = install::uninstall(&store).map_err(|e| super::audit::bundle_failed(&trail, e))?;
    super::audit::bundle_done(&trail, BundleAction::Uninstall, None, from.clone())?;
    let embedded = Bundle::embedded().map_err(failed)?;
    if !output.text() {
        print_json(&super::json::UninstallOutput {
            current: embedded.id(),
            uninstalled: from,
        })?;
    } else {
        match from {
            Some(d) => println!(
                "uninstalled {d}: the embedded bundle {} runs (`phases history` keeps the installs)",
                embedded.id_text()
            ),
            None => println!("the embedded bundle {} runs already", embedded.id_text()),
        }
    }
    Ok(())
}
