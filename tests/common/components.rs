//! Test components written in the WebAssembly text format, for what a Rust guest cannot be
//! made to do: many memories, tables and instances, a `phase` export of the wrong type, an
//! import of every WASI interface the runtime admits.
//!
//! Each is a component exporting `nodeward:host/phase@0.1.0` (world `pure` of `tests/wit`)
//! whose `run` first executes `body` (core wasm instructions of the main module, which may call
//! the functions `$hogN`) and then returns `ok({summary: "ok", changed: []})`.

use sha2::{Digest, Sha256};

/// The component's `run` lifted from a core function: `(input: string) -> result<report,
/// string>`, the result returned through a pointer into the main module's memory.
const PHASE_EXPORT: &str = r#"
  (type $report (record (field "summary" string) (field "changed" (list string))))
  (export $report-e "report" (type $report))
  (func $run (param "input" string) (result (result $report-e (error string)))
    (canon lift (core func $main "run") (memory $main "mem") (realloc (func $main "realloc"))))
  (instance $phase (export "report" (type $report-e)) (export "run" (func $run)))
  (export "nodeward:host/phase@0.1.0" (instance $phase))
"#;

/// The main core module: `items` (imports first), a bump allocator for the input string,
/// `run` (which executes `body`) and the result record at offset 32 (`ok`, summary "ok" at
/// 16, no changes).
fn main_module(items: &str, body: &str) -> String {
    format!(
        r#"
  (core module $main-module
    {items}
    (memory (export "mem") 1)
    (global $bump (mut i32) (i32.const 1024))
    (data (i32.const 16) "ok")
    (func (export "realloc") (param i32 i32 i32 i32) (result i32)
      (local $p i32)
      (local.set $p (i32.and (i32.add (global.get $bump) (i32.const 7)) (i32.const -8)))
      (global.set $bump (i32.add (local.get $p) (local.get 3)))
      (local.get $p))
    (func (export "run") (param i32 i32) (result i32)
      {body}
      (i32.store8 (i32.const 32) (i32.const 0))
      (i32.store (i32.const 36) (i32.const 16))
      (i32.store (i32.const 40) (i32.const 2))
      (i32.store (i32.const 44) (i32.const 0))
      (i32.store (i32.const 48) (i32.const 0))
      (i32.const 32)))
"#
    )
}

/// A core module with a memory of its own and `hog(pages)`: grows the memory by `pages` and
/// writes one byte to every 4 KiB of the new pages, so they are really resident.
const HOG_MODULE: &str = r#"
  (core module $hog-module
    (memory 0)
    (func (export "hog") (param $pages i32)
      (local $addr i32) (local $end i32)
      (local.set $addr (i32.mul (memory.grow (local.get $pages)) (i32.const 65536)))
      (if (i32.lt_s (local.get $addr) (i32.const 0)) (then unreachable))
      (local.set $end (i32.add (local.get $addr) (i32.mul (local.get $pages) (i32.const 65536))))
      (block $done
        (loop $touch
          (br_if $done (i32.ge_u (local.get $addr) (local.get $end)))
          (i32.store8 (local.get $addr) (i32.const 165))
          (local.set $addr (i32.add (local.get $addr) (i32.const 4096)))
          (br $touch)))))
"#;

/// A component with the main module and `hogs` more core instances, each with a memory of its
/// own that `run` grows by `mib_each` MiB and touches, one after the other: `hogs + 1` linear
/// memories holding `hogs * mib_each` MiB at the end.
pub fn many_memories(hogs: usize, mib_each: u32) -> Vec<u8> {
    let pages = mib_each * 16;
    let mut wat = String::from("(component\n");
    wat.push_str(HOG_MODULE);
    let mut imports = String::new();
    let mut body = String::new();
    let mut with = String::new();
    for i in 0..hogs {
        wat.push_str(&format!(
            "  (core instance $hog{i} (instantiate $hog-module))\n"
        ));
        imports.push_str(&format!(
            "(import \"hog{i}\" \"hog\" (func $hog{i} (param i32)))\n"
        ));
        body.push_str(&format!("(call $hog{i} (i32.const {pages}))\n"));
        with.push_str(&format!(" (with \"hog{i}\" (instance $hog{i}))"));
    }
    wat.push_str(&main_module(&imports, &body));
    wat.push_str(&format!(
        "  (core instance $main (instantiate $main-module{with}))\n"
    ));
    wat.push_str(PHASE_EXPORT);
    wat.push(')');
    compile(&wat)
}

/// A component whose main module grows a table by `elements` (null `funcref`s) in `run`.
pub fn growing_table(elements: u32) -> Vec<u8> {
    let body = format!(
        "(if (i32.lt_s (table.grow $t (ref.null func) (i32.const {elements})) (i32.const 0)) \
         (then unreachable))"
    );
    component_with_main("(table $t 0 funcref)", &body, "")
}

/// A component with `instances` extra core instances of a module defining `memories` memories
/// and `tables` tables each (all empty): for the count caps.
pub fn many_instances(instances: usize, memories: usize, tables: usize) -> Vec<u8> {
    let mut module = String::from("  (core module $filler\n");
    for _ in 0..memories {
        module.push_str("    (memory 0)\n");
    }
    for _ in 0..tables {
        module.push_str("    (table 0 funcref)\n");
    }
    module.push_str("  )\n");
    for i in 0..instances {
        module.push_str(&format!(
            "  (core instance $filler{i} (instantiate $filler))\n"
        ));
    }
    component_with_main("", "", &module)
}

/// For each WASI interface the runtime admits (`wasi:random/insecure-seed`), its import at
/// version 0.2.0 with one of its functions or resources: a component importing it links only
/// when the host defines that interface (an import of an empty instance would link to
/// nothing). Resources other interfaces use are aliased out (`$input-stream` ...).
pub const WASI_IMPORTS: &[(&str, &str)] = &[
    (
        "wasi:io/error",
        r#"(import "wasi:io/error@0.2.0" (instance (export "error" (type (sub resource)))))"#,
    ),
    (
        "wasi:io/poll",
        r#"(import "wasi:io/poll@0.2.0" (instance (export "pollable" (type (sub resource)))))"#,
    ),
    (
        "wasi:io/streams",
        r#"(import "wasi:io/streams@0.2.0" (instance $streams
             (export "input-stream" (type (sub resource)))
             (export "output-stream" (type (sub resource)))))
           (alias export $streams "input-stream" (type $input-stream))
           (alias export $streams "output-stream" (type $output-stream))"#,
    ),
    (
        "wasi:cli/environment",
        r#"(import "wasi:cli/environment@0.2.0" (instance
             (export "get-environment" (func (result (list (tuple string string)))))))"#,
    ),
    (
        "wasi:cli/exit",
        r#"(import "wasi:cli/exit@0.2.0" (instance (export "exit" (func (param "status" (result))))))"#,
    ),
    (
        "wasi:cli/stdin",
        r#"(import "wasi:cli/stdin@0.2.0" (instance
             (alias outer $C $input-stream (type $s))
             (export "input-stream" (type $s2 (eq $s)))
             (export "get-stdin" (func (result (own $s2))))))"#,
    ),
    (
        "wasi:cli/stdout",
        r#"(import "wasi:cli/stdout@0.2.0" (instance
             (alias outer $C $output-stream (type $s))
             (export "output-stream" (type $s2 (eq $s)))
             (export "get-stdout" (func (result (own $s2))))))"#,
    ),
    (
        "wasi:cli/stderr",
        r#"(import "wasi:cli/stderr@0.2.0" (instance
             (alias outer $C $output-stream (type $s))
             (export "output-stream" (type $s2 (eq $s)))
             (export "get-stderr" (func (result (own $s2))))))"#,
    ),
    (
        "wasi:cli/terminal-input",
        r#"(import "wasi:cli/terminal-input@0.2.0" (instance $ti
             (export "terminal-input" (type (sub resource)))))
           (alias export $ti "terminal-input" (type $terminal-input))"#,
    ),
    (
        "wasi:cli/terminal-output",
        r#"(import "wasi:cli/terminal-output@0.2.0" (instance $to
             (export "terminal-output" (type (sub resource)))))
           (alias export $to "terminal-output" (type $terminal-output))"#,
    ),
    (
        "wasi:cli/terminal-stdin",
        r#"(import "wasi:cli/terminal-stdin@0.2.0" (instance
             (alias outer $C $terminal-input (type $t))
             (export "terminal-input" (type $t2 (eq $t)))
             (export "get-terminal-stdin" (func (result (option (own $t2)))))))"#,
    ),
    (
        "wasi:cli/terminal-stdout",
        r#"(import "wasi:cli/terminal-stdout@0.2.0" (instance
             (alias outer $C $terminal-output (type $t))
             (export "terminal-output" (type $t2 (eq $t)))
             (export "get-terminal-stdout" (func (result (option (own $t2)))))))"#,
    ),
    (
        "wasi:cli/terminal-stderr",
        r#"(import "wasi:cli/terminal-stderr@0.2.0" (instance
             (alias outer $C $terminal-output (type $t))
             (export "terminal-output" (type $t2 (eq $t)))
             (export "get-terminal-stderr" (func (result (option (own $t2)))))))"#,
    ),
    (
        "wasi:clocks/wall-clock",
        r#"(import "wasi:clocks/wall-clock@0.2.0" (instance
             (type $dt (record (field "seconds" u64) (field "nanoseconds" u32)))
             (export "datetime" (type $dt2 (eq $dt)))
             (export "now" (func (result $dt2)))))"#,
    ),
    (
        "wasi:clocks/monotonic-clock",
        r#"(import "wasi:clocks/monotonic-clock@0.2.0" (instance (export "now" (func (result u64)))))"#,
    ),
    (
        "wasi:random/random",
        r#"(import "wasi:random/random@0.2.0" (instance (export "get-random-u64" (func (result u64)))))"#,
    ),
    (
        "wasi:random/insecure",
        r#"(import "wasi:random/insecure@0.2.0" (instance
             (export "get-insecure-random-u64" (func (result u64)))))"#,
    ),
    (
        "wasi:random/insecure-seed",
        r#"(import "wasi:random/insecure-seed@0.2.0" (instance
             (export "insecure-seed" (func (result (tuple u64 u64))))))"#,
    ),
];

/// A component with `imports` (component-level WAT items such as [`WASI_IMPORTS`]' entries)
/// that uses none of them.
pub fn importing(imports: &[&str]) -> Vec<u8> {
    let wat = format!(
        "(component $C\n{}\n{}  (core instance $main (instantiate $main-module))\n{PHASE_EXPORT})",
        imports.join("\n"),
        main_module("", "")
    );
    compile(&wat)
}

/// A component whose `nodeward:host/phase@0.1.0` export has `run: func(input: u32) -> u32`.
pub fn wrong_run_type() -> Vec<u8> {
    compile(
        r#"(component
  (core module $m (func (export "run") (param i32) (result i32) (local.get 0)))
  (core instance $main (instantiate $m))
  (func $run (param "input" u32) (result u32) (canon lift (core func $main "run")))
  (instance $phase (export "run" (func $run)))
  (export "nodeward:host/phase@0.1.0" (instance $phase))
)"#,
    )
}

/// A well-formed phase component whose main module runs `body` (with `main_items` declared
/// in the main module) after the component-level `before` items.
fn component_with_main(main_items: &str, body: &str, before: &str) -> Vec<u8> {
    let wat = format!(
        "(component\n{before}{}  (core instance $main (instantiate $main-module))\n{PHASE_EXPORT})",
        main_module(main_items, body)
    );
    compile(&wat)
}

fn compile(wat: &str) -> Vec<u8> {
    match wat::parse_str(wat) {
        Ok(bytes) => bytes,
        Err(e) => panic!("test component does not assemble: {e}\n{wat}"),
    }
}

/// sha256 of `bytes`, hex.
pub fn digest(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Loads `wasm` as phase `phase` of world `pure` and runs it once with no grants.
pub fn run(
    session: &std::sync::Arc<nodeward::caps::RunContext>,
    phase: &str,
    wasm: &[u8],
    limits: nodeward::runtime::Limits,
) -> Result<nodeward::runtime::PhaseReport, nodeward::runtime::PhaseError> {
    let loaded = super::runtime()
        .load(phase, "pure", wasm, &digest(wasm))
        .expect("the test component loads");
    super::runtime().run(
        &loaded,
        super::ctx(session, phase, nodeward::grants::Grants::default()),
        "",
        limits,
    )
}
