//! Why a component was not loaded ([`LoadError`]) and why a phase run failed ([`PhaseError`]).

use super::Limits;
use super::limits::{self, MAX_WASM_STACK};
use std::path::PathBuf;
use std::time::Duration;
use wasmtime::{Trap, WasmBacktrace};

/// Why a component was not loaded. Nothing of it ran.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The bytes are not a valid component.
    #[error("phase {phase}: component is not valid WebAssembly: {message}")]
    Malformed {
        /// Phase name.
        phase: String,
        /// The validator's message.
        message: String,
    },
    /// The component imports an interface its declared world does not.
    #[error("phase {phase}: component imports {import}, which world {world} does not allow")]
    ImportsExceedWorld {
        /// Phase name.
        phase: String,
        /// The offending import.
        import: String,
        /// The declared world.
        world: String,
    },
    /// The declared world is not a phase world this runtime admits (for the CLI: not one of
    /// the shipped package's phase worlds, see `wit/worlds.wit`).
    #[error("phase {phase}: unknown world {world:?}")]
    UnknownWorld {
        /// Phase name.
        phase: String,
        /// The declared world.
        world: String,
    },
    /// The component does not export `nodeward:host/phase` with exactly the type of
    /// `wit/phase.wit`, so the host could not call it.
    #[error("phase {phase}: component export {export}: {message}")]
    ExportType {
        /// Phase name.
        phase: String,
        /// The export at fault (`nodeward:host/phase@0.1.0`, or its function `run`).
        export: String,
        /// What is wrong with it.
        message: String,
    },
    /// The component passes strings across the boundary in an encoding other than UTF-8.
    #[error(
        "phase {phase}: component passes strings as {encoding}; only UTF-8 is accepted \
         (the host's bound on what one call copies counts the guest's bytes)"
    )]
    StringEncoding {
        /// Phase name.
        phase: String,
        /// The encoding its canonical options name (`utf16`, `latin1+utf16`).
        encoding: &'static str,
    },
    /// The compiled-component cache cannot be used.
    #[error("compiled component cache {path}: {message}")]
    Cache {
        /// The cache directory or file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// Linking or pre-instantiation failed.
    #[error("phase {phase}: cannot link component: {message}")]
    Link {
        /// Phase name.
        phase: String,
        /// wasmtime's message.
        message: String,
    },
}

/// Why a phase run failed. The runtime stays usable after each.
#[derive(Debug, thiserror::Error)]
pub enum PhaseError {
    /// The deadline passed.
    #[error("phase {phase} timed out after {after:?}")]
    Timeout {
        /// Phase name.
        phase: String,
        /// The deadline.
        after: Duration,
    },
    /// The guest's memories and tables together would have grown beyond the run's budget
    /// (see [`super::Limits::memory`]).
    #[error("phase {phase} exceeded its memory limit of {limit} bytes")]
    MemoryLimit {
        /// Phase name.
        phase: String,
        /// The budget.
        limit: usize,
    },
    /// The component instantiates more core instances, memories or tables than a run may
    /// have (see [`super::limits::MAX_INSTANCES`] and its siblings). Stopped while it was
    /// instantiated: its `run` was never called.
    #[error("phase {phase} needs more than {limit} {what} (the most one run may have)")]
    CountLimit {
        /// Phase name.
        phase: String,
        /// `instances`, `memories` or `tables`.
        what: &'static str,
        /// The cap.
        limit: usize,
    },
    /// The guest's wasm frames used up their stack (endless or too deep recursion).
    #[error("phase {phase} overflowed its stack of {limit} bytes (recursion too deep)")]
    StackOverflow {
        /// Phase name.
        phase: String,
        /// The wasm stack limit, bytes.
        limit: usize,
    },
    /// The guest trapped (a panic, an abort, an out-of-bounds access).
    #[error("phase {phase} crashed: {message}")]
    Trapped {
        /// Phase name.
        phase: String,
        /// The trap and the tail of the guest's stderr.
        message: String,
    },
    /// The phase returned an error.
    #[error("phase {phase} failed: {message}")]
    Failed {
        /// Phase name.
        phase: String,
        /// The phase's message.
        message: String,
    },
}

/// Names why a run stopped: the budget, a count cap, the deadline, the wasm stack, or another
/// trap, described by wasmtime's trap message, the guest function it happened in and the tail
/// of the guest's stderr (which holds a Rust guest's panic message), never a whole backtrace.
pub(crate) fn run_error(
    phase: String,
    e: &wasmtime::Error,
    over_budget: bool,
    limits: Limits,
    stderr_text: &str,
    redact: impl Fn(&str) -> String,
) -> PhaseError {
    if over_budget {
        return PhaseError::MemoryLimit {
            phase,
            limit: limits.memory,
        };
    }
    if let Some((what, limit)) = limits::count_limit(e) {
        return PhaseError::CountLimit { phase, what, limit };
    }
    let trap = e.downcast_ref::<Trap>();
    match trap {
        Some(Trap::Interrupt) => {
            return PhaseError::Timeout {
                phase,
                after: limits.deadline,
            };
        }
        Some(Trap::StackOverflow) => {
            return PhaseError::StackOverflow {
                phase,
                limit: MAX_WASM_STACK,
            };
        }
        _ => {}
    }
    let mut message = match trap {
        Some(t) => t.to_string(),
        None => e.root_cause().to_string(),
    };
    // wasmtime's hostcall fuel ran out (its error type is private; its message is the mark).
    if message.contains("fuel allocated for hostcalls") {
        message.push_str(&format!(
            " (a capability call's arguments may take at most {} bytes in the host: the \
             phase's memory limit, at most {} bytes)",
            limits.hostcall_bytes(),
            limits::MAX_HOSTCALL_BYTES
        ));
    }
    let frames = e
        .downcast_ref::<WasmBacktrace>()
        .map(WasmBacktrace::frames)
        .unwrap_or_default();
    if let Some(name) = frames.first().and_then(|f| f.func_name()) {
        // `{:#}`: the demangled path without its hash.
        message.push_str(&format!(" in {:#}", rustc_demangle::demangle(name)));
    }
    // A Rust guest keeps its own stack (its "shadow stack") in linear memory, below its data;
    // overflowing it is an access out of bounds, which wasmtime cannot tell from any other.
    // A function that called itself at the top of the stack is the telltale sign.
    let recursing = matches!(frames, [a, b, ..]
        if a.func_index() == b.func_index() && a.func_name() == b.func_name());
    if matches!(trap, Some(Trap::MemoryOutOfBounds)) && recursing {
        message.push_str(
            " (a function calling itself: most likely the guest overflowed its own stack, \
             which it keeps in its linear memory; recursion too deep)",
        );
    }
    let tail: Vec<&str> = stderr_text.lines().rev().take(5).collect();
    if !tail.is_empty() {
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        message = format!("{message}; guest stderr: {}", tail.join(" | "));
    }
    PhaseError::Trapped {
        phase,
        message: redact(&message),
    }
}
