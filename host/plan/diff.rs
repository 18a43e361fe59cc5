//! The diff a plan shows for a file change, bounded in size and time.
//!
//! # Background
//! A phase chooses both sides of a write, and a line diff costs up to the product of their
//! line counts (80,000 changed lines took 28.6 s). So only text within
//! [`diff_limits::MAX_BYTES`] and [`diff_limits::MAX_LINES`] is diffed line by line, and only
//! for [`diff_limits::MAX_TIME`] and until the phase deadline; anything else gets a one-line
//! summary with both sides' sha256 and size.

use super::octal;
use crate::hostpath::HostPath;
use std::time::Instant;

/// The bounds of a plan's file diffs (documented in `wit/fs.wit` and `docs/capabilities.md`).
///
/// Line diffs cost up to the product of the two sides' line counts, and a phase chooses both,
/// so above these a change carries a summary (sizes and digests) instead of a line diff.
pub mod diff_limits {
    use std::time::Duration;

    /// Largest side diffed line by line, in bytes.
    pub const MAX_BYTES: usize = 1 << 20;
    /// Most lines of one side diffed line by line.
    pub const MAX_LINES: usize = 10_000;
    /// Longest one diff may run; the phase deadline cuts it shorter.
    pub const MAX_TIME: Duration = Duration::from_secs(1);
}

/// Why a file's change carries no line diff.
fn no_line_diff(why: &str, old: Option<&[u8]>, new: &[u8]) -> String {
    let new_sum = format!("{}, {} bytes", crate::digest::sha256_hex(new), new.len());
    match old {
        Some(old) => format!(
            "(no line diff: {why}; sha256 {} -> {}, {} -> {} bytes)\n",
            crate::digest::sha256_hex(old),
            crate::digest::sha256_hex(new),
            old.len(),
            new.len()
        ),
        None => format!("(no line diff: {why}; sha256 {new_sum})\n"),
    }
}

/// Why `bytes` cannot be diffed line by line, if they cannot.
fn not_diffable(bytes: &[u8]) -> Option<String> {
    if bytes.contains(&0) || std::str::from_utf8(bytes).is_err() {
        return Some("binary contents".into());
    }
    if bytes.len() > diff_limits::MAX_BYTES {
        return Some(format!(
            "{} bytes, above the {} byte limit",
            bytes.len(),
            diff_limits::MAX_BYTES
        ));
    }
    let lines = bytes.iter().filter(|b| **b == b'\n').count();
    if lines > diff_limits::MAX_LINES {
        return Some(format!(
            "{lines} lines, above the {} line limit",
            diff_limits::MAX_LINES
        ));
    }
    None
}

/// The diff shown for a file change, or why none is shown.
///
/// Withheld for secrets (see the module doc). A binary side, a side above
/// [`diff_limits::MAX_BYTES`] or [`diff_limits::MAX_LINES`], or a diff that does not finish
/// within [`diff_limits::MAX_TIME`] and before `deadline` (the phase's) gives a one-line
/// summary with both sides' sha256 and size instead of a line diff.
pub fn file_diff(
    path: &HostPath,
    old: Option<&[u8]>,
    new: &[u8],
    new_mode: u32,
    secret: bool,
    deadline: Instant,
) -> Option<String> {
    if new_mode & 0o077 == 0 || secret {
        return Some(format!(
            "(contents withheld: {} is {} or holds a secret)\n",
            path,
            octal(new_mode)
        ));
    }
    if let Some(why) = old.and_then(not_diffable).or_else(|| not_diffable(new)) {
        return Some(no_line_diff(&why, old, new));
    }
    let budget = deadline.min(Instant::now() + diff_limits::MAX_TIME);
    let (old_text, new_text) = (
        String::from_utf8_lossy(old.unwrap_or_default()),
        String::from_utf8_lossy(new),
    );
    let diff = similar::TextDiff::configure()
        .deadline(budget)
        .diff_lines(old_text.as_ref(), new_text.as_ref());
    // Past the budget similar gives up on a minimal diff and approximates the rest; say so
    // rather than show a diff that may be as long as both files.
    if Instant::now() >= budget {
        return Some(no_line_diff(
            "the time allowed for diffing passed",
            old,
            new,
        ));
    }
    let text = diff
        .unified_diff()
        .context_radius(3)
        .header(&format!("a/{path}"), &format!("b/{path}"))
        .to_string();
    Some(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> HostPath {
        HostPath::parse(s).expect("path")
    }

    fn later() -> Instant {
        Instant::now() + std::time::Duration::from_secs(60)
    }

    #[test]
    fn secrets_get_no_diff() {
        let d = file_diff(&p("etc/k"), None, b"token: abc\n", 0o600, false, later()).expect("note");
        assert!(!d.contains("abc") && d.contains("withheld"));
        let d = file_diff(&p("etc/k"), None, b"token: abc\n", 0o644, true, later()).expect("note");
        assert!(!d.contains("abc"));
        let d = file_diff(&p("etc/c"), Some(b"a\n"), b"b\n", 0o644, false, later()).expect("diff");
        assert!(
            d.contains("-a") && d.contains("+b") && d.contains("b/etc/c"),
            "{d}"
        );
        let d = file_diff(&p("bin"), None, &[0, 1, 2], 0o755, false, later()).expect("note");
        assert!(
            d.starts_with("(no line diff: binary contents; sha256 ") && d.contains(", 3 bytes)"),
            "{d}"
        );
    }

    #[test]
    fn large_files_and_slow_diffs_get_a_summary() {
        let many: String = (0..=diff_limits::MAX_LINES)
            .map(|i| format!("{i}\n"))
            .collect();
        let d = file_diff(
            &p("etc/big"),
            Some(b"a\n"),
            many.as_bytes(),
            0o644,
            false,
            later(),
        )
        .expect("note");
        assert!(
            d.contains("lines, above the 10000 line limit") && d.contains(" -> "),
            "{d}"
        );
        let huge = "x".repeat(diff_limits::MAX_BYTES + 1);
        let d = file_diff(
            &p("etc/big"),
            Some(huge.as_bytes()),
            b"a\n",
            0o644,
            false,
            later(),
        )
        .expect("note");
        assert!(
            d.contains("byte limit") && d.contains(&format!("{} -> 2 bytes", huge.len())),
            "{d}"
        );
        // A deadline already passed: no line diff is attempted past it.
        let d = file_diff(
            &p("etc/c"),
            Some(b"a\n"),
            b"b\n",
            0o644,
            false,
            Instant::now(),
        )
        .expect("note");
        assert!(d.contains("the time allowed for diffing passed"), "{d}");
    }
}
