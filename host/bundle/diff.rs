//! What a bundle's phases may do, and what changed between two bundles (`phases diff`, and
//! the escalation check of `phases install`).
//!
//! # Background
//! Auditors need to see what a new bundle may do that the old one could not. A phase's
//! authority is its capabilities (the `nodeward:host` interfaces its component actually
//! imports, read from the component without compiling it) narrowed by its grants. This module
//! compares both, phase by phase.
//!
//! # Guarantees
//! - Grants are compared entry by entry, as written in the manifests: any added entry counts
//!   as a widening, even one an existing entry already covers (`etc` → `etc/x`). That is
//!   conservative on purpose: a judgement of "covered" would be one more thing to get wrong.
//! - [`BundleDiff::widens`] is true when any phase gains a capability, a grant entry or a
//!   different world, or a phase is added that has any capability or grant.
//! - The JSON shape is documented in docs/bundle-format.md ("diff JSON") and is stable.

use crate::bundle::{Bundle, BundleError, BundleId};
use crate::grants::Grants;
use serde::Serialize;
use serde_json::{Map, Value};
use std::collections::BTreeSet;

/// The `nodeward:host` interface holding only shared types; importing it grants nothing.
const TYPES_INTERFACE: &str = "nodeward:host/types";

/// Why a component's imports could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ComponentError {
    /// The binary does not parse.
    #[error("not a valid component: {0}")]
    Invalid(#[source] wasmparser::BinaryReaderError),
    /// A core module where a component belongs.
    #[error("is a core module, not a component")]
    CoreModule,
}

/// Every import of the component `wasm`, as named in the component (e.g.
/// `nodeward:host/fs@0.1.0`, `wasi:io/streams@0.2.6`). Reads the binary without compiling it.
pub fn component_imports(wasm: &[u8]) -> Result<Vec<String>, ComponentError> {
    let mut imports = Vec::new();
    let mut depth = 0usize;
    for payload in wasmparser::Parser::new(0).parse_all(wasm) {
        match payload.map_err(ComponentError::Invalid)? {
            wasmparser::Payload::Version { encoding, .. } => {
                if depth == 0 && encoding != wasmparser::Encoding::Component {
                    return Err(ComponentError::CoreModule);
                }
                depth += 1;
            }
            wasmparser::Payload::End(_) => depth = depth.saturating_sub(1),
            wasmparser::Payload::ComponentImportSection(reader) if depth == 1 => {
                for import in reader {
                    let import = import.map_err(ComponentError::Invalid)?;
                    imports.push(import.name.name.to_string());
                }
            }
            _ => {}
        }
    }
    Ok(imports)
}

/// A component's capabilities: its `nodeward:host` imports other than the types interface.
/// WASI imports are not listed: the runtime links the same fixed, harmless set (stdio, clocks,
/// random) for every phase and refuses the rest.
pub fn capabilities(imports: &[String]) -> BTreeSet<String> {
    imports
        .iter()
        .filter(|i| i.starts_with("nodeward:host/"))
        .filter(|i| i.split('@').next() != Some(TYPES_INTERFACE))
        .cloned()
        .collect()
}

/// One phase as the diff sees it.
#[derive(Clone, Debug)]
pub struct PhaseView {
    /// Phase name.
    pub name: String,
    /// Declared world.
    pub world: String,
    /// Component sha256.
    pub sha256: String,
    /// Capabilities (see [`capabilities`]).
    pub capabilities: BTreeSet<String>,
    /// Grants.
    pub grants: Grants,
}

/// The phases of `bundle`, with their components' capabilities.
pub fn phase_views(bundle: &Bundle) -> Result<Vec<PhaseView>, BundleError> {
    bundle
        .manifest
        .phases
        .iter()
        .map(|p| {
            let wasm = bundle.verified_component(&p.name)?;
            let imports = component_imports(wasm).map_err(|source| BundleError::Component {
                source_desc: bundle.source.to_string(),
                file: p.component.clone(),
                phase: p.name.clone(),
                source,
            })?;
            Ok(PhaseView {
                name: p.name.clone(),
                world: p.world.clone(),
                sha256: p.sha256.clone(),
                capabilities: capabilities(&imports),
                grants: p.grants.clone(),
            })
        })
        .collect()
}

/// A grant entry: (field as in the manifest, e.g. `fs.write`; entry, `None` for a flag).
pub type GrantEntry = (String, Option<String>);

/// Every entry of `g`, flattened. Flags (`kernel.swap-off`, `systemd.reload`,
/// `download.pinned-artifacts`) appear only when true; input parts as field `input`.
pub fn grant_entries(g: &Grants) -> BTreeSet<GrantEntry> {
    let mut out = BTreeSet::new();
    for part in &g.input {
        out.insert(("input".to_string(), Some(part.as_str().to_string())));
    }
    let lists: [(&str, &Vec<String>); 14] = [
        ("fs.read", &g.fs.read),
        ("fs.write", &g.fs.write),
        ("kernel.modules", &g.kernel.modules),
        ("kernel.sysctls", &g.kernel.sysctls),
        ("systemd.write", &g.systemd.write),
        ("systemd.enable", &g.systemd.enable),
        ("systemd.start", &g.systemd.start),
        ("systemd.mask", &g.systemd.mask),
        ("systemd.status", &g.systemd.status),
        ("mounts.targets", &g.mounts.targets),
        ("download.urls", &g.download.urls),
        ("network.bridges", &g.network.bridges),
        ("cgroups.remove", &g.cgroups.remove),
        ("secrets.bootstrap-token", &g.secrets.bootstrap_token),
    ];
    for (field, list) in lists {
        for e in list {
            out.insert((field.to_string(), Some(e.clone())));
        }
    }
    for (field, on) in [
        ("kernel.swap-off", g.kernel.swap_off),
        ("systemd.reload", g.systemd.reload),
        ("download.pinned-artifacts", g.download.pinned_artifacts),
        ("network.node-bridge", g.network.node_bridge),
    ] {
        if on {
            out.insert((field.to_string(), None));
        }
    }
    out
}

/// Grant entries as a (partial) grants table, the manifest's own shape:
/// `{"fs": {"write": ["etc/x"]}, "systemd": {"reload": true}}`.
pub fn entries_json(entries: &BTreeSet<GrantEntry>) -> Value {
    let mut root = Map::new();
    for (field, entry) in entries {
        let Some((table, key)) = field.split_once('.') else {
            // A top-level list of the grants table (`input`).
            let list = root
                .entry(field.clone())
                .or_insert_with(|| Value::Array(Vec::new()));
            if let (Value::Array(list), Some(e)) = (list, entry) {
                list.push(Value::String(e.clone()));
            }
            continue;
        };
        let t = root
            .entry(table.to_string())
            .or_insert_with(|| Value::Object(Map::new()));
        let Value::Object(t) = t else { continue };
        match entry {
            Some(e) => {
                let list = t
                    .entry(key.to_string())
                    .or_insert_with(|| Value::Array(Vec::new()));
                if let Value::Array(list) = list {
                    list.push(Value::String(e.clone()));
                }
            }
            None => {
                t.insert(key.to_string(), Value::Bool(true));
            }
        }
    }
    Value::Object(root)
}

fn entry_text((field, entry): &GrantEntry) -> String {
    match entry {
        Some(e) => format!("{field} {e}"),
        None => field.clone(),
    }
}

/// How one phase differs.
#[derive(Clone, Debug)]
pub struct PhaseDiff {
    /// Phase name.
    pub name: String,
    /// `added`, `removed` or `changed`.
    pub change: &'static str,
    /// Old and new world, when they differ.
    pub world: Option<(Option<String>, Option<String>)>,
    /// Old and new component sha256, when they differ.
    pub sha256: Option<(Option<String>, Option<String>)>,
    /// Capabilities added.
    pub capabilities_added: BTreeSet<String>,
    /// Capabilities removed.
    pub capabilities_removed: BTreeSet<String>,
    /// Grant entries added.
    pub grants_added: BTreeSet<GrantEntry>,
    /// Grant entries removed.
    pub grants_removed: BTreeSet<GrantEntry>,
}

impl PhaseDiff {
    /// Whether this phase may do something it could not before.
    pub fn widens(&self) -> bool {
        !self.capabilities_added.is_empty()
            || !self.grants_added.is_empty()
            || matches!(&self.world, Some((Some(_), Some(_))))
    }
}

/// What changed from one bundle to another.
#[derive(Clone, Debug)]
pub struct BundleDiff {
    /// The old bundle's name, version, digest and source.
    pub old: BundleId,
    /// The new bundle's.
    pub new: BundleId,
    /// Phases that differ, in the new bundle's order, then removed phases in the old order.
    pub phases: Vec<PhaseDiff>,
    /// Phases identical in both.
    pub unchanged: Vec<String>,
}

/// Compares `old` with `new`.
pub fn diff(old: &Bundle, new: &Bundle) -> Result<BundleDiff, BundleError> {
    let old_views = phase_views(old)?;
    let new_views = phase_views(new)?;
    let mut phases = Vec::new();
    let mut unchanged = Vec::new();
    for n in &new_views {
        let Some(o) = old_views.iter().find(|o| o.name == n.name) else {
            phases.push(PhaseDiff {
                name: n.name.clone(),
                change: "added",
                world: Some((None, Some(n.world.clone()))),
                sha256: Some((None, Some(n.sha256.clone()))),
                capabilities_added: n.capabilities.clone(),
                capabilities_removed: BTreeSet::new(),
                grants_added: grant_entries(&n.grants),
                grants_removed: BTreeSet::new(),
            });
            continue;
        };
        let (og, ng) = (grant_entries(&o.grants), grant_entries(&n.grants));
        let d = PhaseDiff {
            name: n.name.clone(),
            change: "changed",
            world: (o.world != n.world).then(|| (Some(o.world.clone()), Some(n.world.clone()))),
            sha256: (o.sha256 != n.sha256)
                .then(|| (Some(o.sha256.clone()), Some(n.sha256.clone()))),
            capabilities_added: &n.capabilities - &o.capabilities,
            capabilities_removed: &o.capabilities - &n.capabilities,
            grants_added: &ng - &og,
            grants_removed: &og - &ng,
        };
        if d.world.is_none()
            && d.sha256.is_none()
            && d.capabilities_added.is_empty()
            && d.capabilities_removed.is_empty()
            && d.grants_added.is_empty()
            && d.grants_removed.is_empty()
        {
            unchanged.push(n.name.clone());
        } else {
            phases.push(d);
        }
    }
    for o in &old_views {
        if new_views.iter().all(|n| n.name != o.name) {
            phases.push(PhaseDiff {
                name: o.name.clone(),
                change: "removed",
                world: Some((Some(o.world.clone()), None)),
                sha256: Some((Some(o.sha256.clone()), None)),
                capabilities_added: BTreeSet::new(),
                capabilities_removed: o.capabilities.clone(),
                grants_added: BTreeSet::new(),
                grants_removed: grant_entries(&o.grants),
            });
        }
    }
    Ok(BundleDiff {
        old: old.id(),
        new: new.id(),
        phases,
        unchanged,
    })
}

/// The documented JSON shape of a [`BundleDiff`] (`docs/schemas/phases-diff.schema.json`).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DiffJson<'a> {
    /// The old bundle.
    pub old: &'a BundleId,
    /// The new bundle.
    pub new: &'a BundleId,
    /// Whether the new bundle may do anything the old one could not.
    pub widens: bool,
    /// Phases that differ.
    pub phases: Vec<PhaseDiffJson<'a>>,
    /// Phases identical in both.
    pub unchanged: &'a [String],
}

/// One phase of [`DiffJson`].
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PhaseDiffJson<'a> {
    /// Phase name.
    pub name: &'a str,
    /// `added`, `removed` or `changed`.
    pub change: &'static str,
    /// Whether this phase may do something it could not before.
    pub widens: bool,
    /// Old and new world, when they differ.
    pub world: Option<OldNew<'a>>,
    /// Old and new component sha256, when they differ.
    pub sha256: Option<OldNew<'a>>,
    /// Capabilities added and removed.
    pub capabilities: AddedRemoved<&'a BTreeSet<String>>,
    /// Grant entries added and removed, each a partial grants table in the manifest's own
    /// shape and spelling ([`entries_json`]).
    pub grants: AddedRemoved<Value>,
}

/// A value before and after; `null` where there is none (an added or removed phase).
#[derive(Debug, Serialize)]
pub struct OldNew<'a> {
    /// Before.
    pub old: Option<&'a str>,
    /// After.
    pub new: Option<&'a str>,
}

/// What was added and what removed.
#[derive(Debug, Serialize)]
pub struct AddedRemoved<T> {
    /// Added.
    pub added: T,
    /// Removed.
    pub removed: T,
}

fn old_new(p: &Option<(Option<String>, Option<String>)>) -> Option<OldNew<'_>> {
    p.as_ref().map(|(o, n)| OldNew {
        old: o.as_deref(),
        new: n.as_deref(),
    })
}

impl BundleDiff {
    /// Whether the new bundle may do anything the old one could not.
    pub fn widens(&self) -> bool {
        self.phases.iter().any(PhaseDiff::widens)
    }

    /// The documented JSON shape.
    pub fn to_json(&self) -> DiffJson<'_> {
        DiffJson {
            old: &self.old,
            new: &self.new,
            widens: self.widens(),
            phases: self
                .phases
                .iter()
                .map(|p| PhaseDiffJson {
                    name: &p.name,
                    change: p.change,
                    widens: p.widens(),
                    world: old_new(&p.world),
                    sha256: old_new(&p.sha256),
                    capabilities: AddedRemoved {
                        added: &p.capabilities_added,
                        removed: &p.capabilities_removed,
                    },
                    grants: AddedRemoved {
                        added: entries_json(&p.grants_added),
                        removed: entries_json(&p.grants_removed),
                    },
                })
                .collect(),
            unchanged: &self.unchanged,
        }
    }

    /// The same, for people: one line per phase, then `+`/`-` lines.
    pub fn to_text(&self) -> String {
        let who = |v: &BundleId| format!("{} v{} (sha256 {})", v.name, v.version, v.digest);
        let mut s = format!("old: {}\nnew: {}\n", who(&self.old), who(&self.new));
        for p in &self.phases {
            let mut head = format!("phase {}: {}", p.name, p.change);
            if let Some((Some(o), Some(n))) = &p.world {
                head.push_str(&format!(", world {o} -> {n}"));
            } else if let Some((None, Some(n))) = &p.world {
                head.push_str(&format!(" (world {n})"));
            }
            if p.change == "changed" {
                if let Some((Some(o), Some(n))) = &p.sha256 {
                    head.push_str(&format!(", sha256 {} -> {}", &o[..12], &n[..12]));
                }
                if p.grants_added.is_empty()
                    && p.grants_removed.is_empty()
                    && p.capabilities_added.is_empty()
                    && p.capabilities_removed.is_empty()
                {
                    head.push_str(", capabilities and grants unchanged");
                }
            }
            if p.widens() {
                head.push_str("  [WIDENS]");
            }
            s.push_str(&head);
            s.push('\n');
            for c in &p.capabilities_added {
                s.push_str(&format!("  + capability {c}\n"));
            }
            for c in &p.capabilities_removed {
                s.push_str(&format!("  - capability {c}\n"));
            }
            for g in &p.grants_added {
                s.push_str(&format!("  + grant {}\n", entry_text(g)));
            }
            for g in &p.grants_removed {
                s.push_str(&format!("  - grant {}\n", entry_text(g)));
            }
        }
        if !self.unchanged.is_empty() {
            s.push_str(&format!("unchanged: {}\n", self.unchanged.join(", ")));
        }
        s.push_str(if self.widens() {
            "the new bundle's authority is WIDER\n"
        } else {
            "the new bundle's authority is not wider\n"
        });
        s
    }
}
