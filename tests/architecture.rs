//! The house rules of `host/`, checked on the source: what a newcomer can rely on.
//!
//! - No import cycle between the top-level modules of the library (`host/lib.rs`).
//! - `caps` (the capabilities) imports nothing from `session`, `cli` or `node`; `rootfs` (the
//!   plan-aware root filesystem) nothing from `caps`, `session`, `cli` or `node`: the layers
//!   below a run do not know about runs, commands or modes of operation.
//! - No file under `host/` is over 600 lines.
//! - The test hook's variable is named only in `host/test_hooks.rs`, behind the `test-hooks`
//!   feature, so a release binary does not contain it.
//!
//! Imports are read textually (`crate::NAME`, also inside `use crate::{…}` groups), up to a
//! file's `#[cfg(test)]` module: unit tests may use anything.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const HOST: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/host");
const MAX_LINES: usize = 600;

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read host/") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level modules `host/lib.rs` declares (`pub mod x;` and inline `pub mod x {`).
fn top_level_modules() -> BTreeSet<String> {
    let lib = std::fs::read_to_string(Path::new(HOST).join("lib.rs")).expect("lib.rs");
    lib.lines()
        .filter_map(|l| {
            l.trim()
                .strip_prefix("pub mod ")
                .or(l.trim().strip_prefix("mod "))
        })
        .map(|rest| rest.trim_end_matches([';', '{', ' ']).trim().to_string())
        .collect()
}

/// The top-level module a file belongs to (`host/caps/fs.rs` → `caps`).
fn owner(path: &Path) -> Option<String> {
    let rel = path.strip_prefix(HOST).ok()?;
    let first = rel.components().next()?.as_os_str().to_str()?;
    Some(first.trim_end_matches(".rs").to_string())
}

/// The file's code before its unit tests, without line comments.
fn code(text: &str) -> String {
    let body = text.split("#[cfg(test)]").next().unwrap_or(text);
    body.lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every top-level module name `code` reaches through `crate::`.
fn imports(code: &str, modules: &BTreeSet<String>) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // `use crate::{a, b::c, d::{e, f}}`: the first segment of each top-level item.
            let mut depth = 1;
            let mut item = String::new();
            let mut items = Vec::new();
            for ch in group.chars() {
                match ch {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    ',' if depth == 1 => items.push(std::mem::take(&mut item)),
                    _ if depth == 1 => item.push(ch),
                    _ => {}
                }
            }
            items.push(item);
            for it in items {
                let name = it
                    .trim()
                    .split("::")
                    .next()
                    .unwrap_or("")
                    .trim()
                    .to_string();
                if modules.contains(&name) {
                    found.insert(name);
                }
            }
        } else {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if modules.contains(&name) {
                found.insert(name);
            }
        }
    }
    found
}

/// The import graph between top-level modules (self-imports left out).
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let modules = top_level_modules();
    let mut files = Vec::new();
    rust_files(Path::new(HOST), &mut files);
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in files {
        let Some(from) = owner(&file) else { continue };
        if !modules.contains(&from) {
            continue; // lib.rs, main.rs
        }
        let text = std::fs::read_to_string(&file).expect("read source");
        let deps = graph.entry(from.clone()).or_default();
        for to in imports(&code(&text), &modules) {
            if to != from {
                deps.insert(to);
            }
        }
    }
    graph
}

/// A cycle through `start`, if there is one (depth-first search).
fn cycle_through(graph: &BTreeMap<String, BTreeSet<String>>, start: &str) -> Option<Vec<String>> {
    fn walk(
        graph: &BTreeMap<String, BTreeSet<String>>,
        start: &str,
        at: &str,
        path: &mut Vec<String>,
        seen: &mut BTreeSet<String>,
    ) -> bool {
        for next in graph.get(at).into_iter().flatten() {
            if next == start {
                path.push(next.clone());
                return true;
            }
            if seen.insert(next.clone()) {
                path.push(next.clone());
                if walk(graph, start, next, path, seen) {
                    return true;
                }
                path.pop();
            }
        }
        false
    }
    let mut path = vec![start.to_string()];
    let mut seen = BTreeSet::new();
    walk(graph, start, start, &mut path, &mut seen).then_some(path)
}

#[test]
fn no_import_cycle_between_top_level_modules() {
    let graph = graph();
    assert!(graph.len() > 10, "the module graph was read: {graph:?}");
    for module in graph.keys() {
        if let Some(cycle) = cycle_through(&graph, module) {
            panic!("import cycle: {}", cycle.join(" → "));
        }
    }
}

#[test]
fn lower_layers_do_not_know_runs_commands_or_modes() {
    let graph = graph();
    let forbidden: &[(&str, &[&str])] = &[
        ("caps", &["session", "cli", "node", "bundle"]),
        (
            "rootfs",
            &["caps", "session", "cli", "node", "bundle", "runtime"],
        ),
        (
            "plan",
            &["caps", "rootfs", "session", "cli", "node", "runtime"],
        ),
        ("session", &["cli", "node"]),
        ("bundle", &["cli", "node", "session"]),
    ];
    for (module, not) in forbidden {
        let deps = graph.get(*module).cloned().unwrap_or_default();
        for n in *not {
            assert!(!deps.contains(*n), "{module} imports {n}: {deps:?}");
        }
    }
}

#[test]
fn a_test_of_the_imports_reader_itself() {
    let modules: BTreeSet<String> = ["caps", "plan", "wit"].map(String::from).into();
    let found = imports(
        "use crate::{caps::{A, B}, plan};\nlet x = crate::wit::Error::Io;\n// crate::nope",
        &modules,
    );
    assert_eq!(found, modules);
    assert!(imports(&code("// use crate::caps;\n"), &modules).is_empty());
}

#[test]
fn no_host_file_is_over_600_lines() {
    let mut files = Vec::new();
    rust_files(Path::new(HOST), &mut files);
    let long: Vec<String> = files
        .iter()
        .filter_map(|f| {
            let n = std::fs::read_to_string(f).expect("read").lines().count();
            (n > MAX_LINES).then(|| format!("{} ({n} lines)", f.display()))
        })
        .collect();
    assert!(long.is_empty(), "over {MAX_LINES} lines: {long:?}");
}

#[test]
fn the_test_hook_is_named_only_behind_its_feature() {
    let mut files = Vec::new();
    rust_files(Path::new(HOST), &mut files);
    for f in files {
        let text = std::fs::read_to_string(&f).expect("read");
        if f.ends_with("test_hooks.rs") {
            for (i, line) in text.lines().enumerate() {
                if line.contains("\"NODEWARD_TEST") {
                    let before: Vec<&str> = text.lines().take(i).collect();
                    assert!(
                        before
                            .last()
                            .is_some_and(|l| l.contains("#[cfg(feature = \"test-hooks\")]")),
                        "{}:{}: the variable's name outside the feature",
                        f.display(),
                        i + 1
                    );
                }
            }
        } else {
            assert!(
                !code(&text).contains("\"NODEWARD_TEST"),
                "{} names a test variable; use crate::test_hooks",
                f.display()
            );
        }
    }
}
