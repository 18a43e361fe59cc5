//! Shared pieces of the fuzz targets (docs/fuzzing.md).
//!
//! # Background
//! libFuzzer enforces `-malloc_limit_mb` only through a sanitizer's malloc hooks, and the
//! targets are built without a sanitizer (the code under test is safe Rust, and ASAN made a
//! target 10x slower and 9x larger in RSS: docs/fuzzing.md). So every
//! target binary uses [`Bounded`] as its global allocator: one allocation larger than
//! [`MAX_ALLOC`] aborts the process, which libFuzzer reports as a crash and saves the input.
//! The whole process is bounded by libFuzzer's own `-rss_limit_mb`.
//!
//! # Input shapes
//! Targets that take several strings split one UTF-8 input at newlines ([`lines2`]), so seeds
//! stay readable text and libFuzzer's mutations of one part leave the others alone.

use std::alloc::{GlobalAlloc, Layout, System};

/// The largest single allocation a target may make: 64 MiB. No input of the fuzzer's size
/// (`-max_len`, at most a few hundred KiB) needs anything near it; an allocation sized from an
/// untrusted length field does.
pub const MAX_ALLOC: usize = 64 << 20;

/// The global allocator of every target: the system allocator, refusing (by aborting) any
/// single allocation over [`MAX_ALLOC`].
pub struct Bounded;

#[global_allocator]
static ALLOC: Bounded = Bounded;

fn over_limit() -> ! {
    // No allocation here: write a fixed message straight to stderr, then abort, which
    // libFuzzer reports as a crash (with the input saved under fuzz/artifacts/).
    let msg = b"nodeward-fuzz: a single allocation exceeded MAX_ALLOC (64 MiB)\n";
    // SAFETY: writing a static buffer to fd 2.
    unsafe { libc_write(2, msg.as_ptr(), msg.len()) };
    std::process::abort()
}

unsafe extern "C" {
    #[link_name = "write"]
    fn libc_write(fd: i32, buf: *const u8, count: usize) -> isize;
}

// SAFETY: every method forwards to `System` with the caller's layout.
unsafe impl GlobalAlloc for Bounded {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.size() > MAX_ALLOC {
            over_limit();
        }
        // SAFETY: forwarded as is.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if layout.size() > MAX_ALLOC {
            over_limit();
        }
        // SAFETY: forwarded as is.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded as is.
        unsafe { System.dealloc(ptr, layout) };
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > MAX_ALLOC {
            over_limit();
        }
        // SAFETY: forwarded as is.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// The input as UTF-8 text, or `None` (string-typed APIs never see anything else).
pub fn text(data: &[u8]) -> Option<&str> {
    std::str::from_utf8(data).ok()
}

/// The first line and the rest (`""` when there is no newline).
pub fn lines2(s: &str) -> (&str, &str) {
    s.split_once('\n').unwrap_or((s, ""))
}
