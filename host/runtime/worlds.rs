//! Which worlds a runtime admits, what a component of each may import, and the type of the
//! `phase` export every component must have. All checked before instantiation.
//!
//! # Background
//! `build.rs` writes the shipped package's phase worlds (`wit/`) as `crate::built::WORLDS` and
//! the test package's worlds (`tests/wit`, `probe` and `pure`) apart, as
//! `crate::built::TEST_WORLDS`. A bundle may declare only a shipped world (checked when its
//! manifest is parsed), and the CLI's runtime admits only those. The test suite needs to run
//! its probe and hostile guests through the same runtime, so [`AdmittedWorlds::WithTestWorlds`]
//! exists, set only by `Runtime::new_admitting_test_worlds`: an explicit constructor, not a
//! cargo feature, because features unify across a build and would reach the `nodeward` binary
//! the CLI tests run.

use super::LoadError;
use wasmtime::Engine;
use wasmtime::component::types::{self, ComponentItem, Type};

/// WASI interfaces a guest may import (by name without version). Filesystem and sockets are
/// absent on purpose: files go through `nodeward:host/fs`, and phases have no network. Every
/// name here is linked by `Runtime::linker` (`tests/load.rs` links a component importing each).
pub const WASI_ALLOWED: &[&str] = &[
    "wasi:io/error",
    "wasi:io/poll",
    "wasi:io/streams",
    "wasi:cli/environment",
    "wasi:cli/exit",
    "wasi:cli/stdin",
    "wasi:cli/stdout",
    "wasi:cli/stderr",
    "wasi:cli/terminal-input",
    "wasi:cli/terminal-output",
    "wasi:cli/terminal-stdin",
    "wasi:cli/terminal-stdout",
    "wasi:cli/terminal-stderr",
    "wasi:clocks/wall-clock",
    "wasi:clocks/monotonic-clock",
    "wasi:random/random",
    "wasi:random/insecure",
    "wasi:random/insecure-seed",
];

/// The interface every phase component exports, and its one function.
pub const PHASE_EXPORT: &str = "nodeward:host/phase@0.1.0";
const RUN: &str = "run";

/// Which worlds a runtime loads components for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdmittedWorlds {
    /// The shipped phase worlds only (`wit/worlds.wit`): what the CLI uses.
    Production,
    /// The shipped phase worlds and the test package's (`tests/wit`): for the test suite and
    /// the benchmarks only.
    WithTestWorlds,
}

impl AdmittedWorlds {
    /// The interfaces `world` imports, or [`LoadError::UnknownWorld`].
    pub(crate) fn imports(
        self,
        phase: &str,
        world: &str,
    ) -> Result<&'static [&'static str], LoadError> {
        let find = |set: &'static [(&'static str, &'static [&'static str])]| {
            set.iter().find(|(w, _)| *w == world).map(|(_, i)| *i)
        };
        let found = match self {
            AdmittedWorlds::Production => find(crate::built::WORLDS),
            AdmittedWorlds::WithTestWorlds => {
                find(crate::built::WORLDS).or_else(|| find(crate::built::TEST_WORLDS))
            }
        };
        found.ok_or_else(|| LoadError::UnknownWorld {
            phase: phase.into(),
            world: world.into(),
        })
    }

    /// Checks a component's `imports` against its declared `world` (plus the WASI interfaces
    /// every phase may import).
    pub(crate) fn check_imports(
        self,
        phase: &str,
        world: &str,
        imports: &[String],
    ) -> Result<(), LoadError> {
        let world_imports = self.imports(phase, world)?;
        for name in imports {
            let allowed = if name.starts_with("wasi:") {
                let unversioned = name.split('@').next().unwrap_or(name);
                WASI_ALLOWED.contains(&unversioned)
            } else {
                world_imports.contains(&name.as_str())
            };
            if !allowed {
                return Err(LoadError::ImportsExceedWorld {
                    phase: phase.into(),
                    import: name.clone(),
                    world: world.into(),
                });
            }
        }
        Ok(())
    }
}

/// Whether `world` is a phase world of the shipped package, the only worlds a bundle may
/// declare.
pub fn is_production_world(world: &str) -> bool {
    crate::built::WORLDS.iter().any(|(w, _)| *w == world)
}

/// Checks a component's `imports` against its declared shipped `world` (plus the WASI
/// interfaces every phase may import). Used before instantiation, and by `phases inspect` to
/// flag a component.
pub fn check_imports(phase: &str, world: &str, imports: &[String]) -> Result<(), LoadError> {
    AdmittedWorlds::Production.check_imports(phase, world, imports)
}

/// Checks that `component` exports [`PHASE_EXPORT`] with exactly the type `wit/phase.wit`
/// declares: `run: func(input: string) -> result<report, string>`, `report` being the record
/// `{ summary: string, changed: list<string> }`. Done before linking, so a component the host
/// could not call is refused at load rather than after its start-up code ran.
pub(crate) fn check_phase_export(
    engine: &Engine,
    component: &types::Component,
    phase: &str,
) -> Result<(), LoadError> {
    let wrong = |export: &str, message: String| LoadError::ExportType {
        phase: phase.into(),
        export: export.into(),
        message,
    };
    let instance = match component.get_export(engine, PHASE_EXPORT).map(|e| e.ty) {
        Some(ComponentItem::ComponentInstance(i)) => i,
        Some(other) => {
            return Err(wrong(
                PHASE_EXPORT,
                format!("is a {}, not an instance", item_kind(&other)),
            ));
        }
        None => return Err(wrong(PHASE_EXPORT, "is missing".into())),
    };
    let run_export = format!("{PHASE_EXPORT}#{RUN}");
    let run = match instance.get_export(engine, RUN).map(|e| e.ty) {
        Some(ComponentItem::ComponentFunc(f)) => f,
        Some(other) => {
            return Err(wrong(
                &run_export,
                format!("is a {}, not a function", item_kind(&other)),
            ));
        }
        None => return Err(wrong(&run_export, "is missing".into())),
    };
    let expected = "must be func(input: string) -> result<report, string>";
    if run.async_() {
        return Err(wrong(&run_export, format!("is async; {expected}")));
    }
    let params: Vec<(&str, Type)> = run.params().collect();
    let params_ok = matches!(params.as_slice(), [(_, Type::String)]);
    let results: Vec<Type> = run.results().collect();
    let result_ok = match results.as_slice() {
        [Type::Result(r)] => {
            matches!(r.err(), Some(Type::String)) && r.ok().is_some_and(|ok| is_report(&ok))
        }
        _ => false,
    };
    if !params_ok || !result_ok {
        return Err(wrong(
            &run_export,
            format!("has type {}; {expected}", describe(&params, &results)),
        ));
    }
    Ok(())
}

/// Whether `ty` is the `report` record: `summary: string`, `changed: list<string>`, in order.
fn is_report(ty: &Type) -> bool {
    let Type::Record(record) = ty else {
        return false;
    };
    let fields: Vec<types::Field<'_>> = record.fields().collect();
    match fields.as_slice() {
        [summary, changed] => {
            summary.name == "summary"
                && summary.ty == Type::String
                && changed.name == "changed"
                && matches!(&changed.ty, Type::List(l) if l.ty() == Type::String)
        }
        _ => false,
    }
}

fn item_kind(item: &ComponentItem) -> &'static str {
    match item {
        ComponentItem::ComponentFunc(_) => "function",
        ComponentItem::CoreFunc(_) => "core function",
        ComponentItem::Module(_) => "core module",
        ComponentItem::Component(_) => "component",
        ComponentItem::ComponentInstance(_) => "instance",
        ComponentItem::Type(_) => "type",
        ComponentItem::Resource(_) => "resource",
    }
}

/// A short description of a function type for the error message, e.g. `func(u32) -> (s32)`.
fn describe(params: &[(&str, Type)], results: &[Type]) -> String {
    let params: Vec<String> = params
        .iter()
        .map(|(n, t)| format!("{n}: {}", type_name(t)))
        .collect();
    let results: Vec<&str> = results.iter().map(type_name).collect();
    format!("func({}) -> ({})", params.join(", "), results.join(", "))
}

fn type_name(ty: &Type) -> &'static str {
    match ty {
        Type::Bool => "bool",
        Type::S8 => "s8",
        Type::U8 => "u8",
        Type::S16 => "s16",
        Type::U16 => "u16",
        Type::S32 => "s32",
        Type::U32 => "u32",
        Type::S64 => "s64",
        Type::U64 => "u64",
        Type::Float32 => "f32",
        Type::Float64 => "f64",
        Type::Char => "char",
        Type::String => "string",
        Type::List(_) => "list<..>",
        Type::Record(_) => "record",
        Type::Tuple(_) => "tuple<..>",
        Type::Variant(_) => "variant",
        Type::Enum(_) => "enum",
        Type::Option(_) => "option<..>",
        Type::Result(_) => "result<..>",
        Type::Flags(_) => "flags",
        _ => "other",
    }
}
