//! Code the shipped phases share.
//!
//! # Background
//! Each phase crate generates its own bindings from its own WIT world, so the capability types
//! (`Error`, `Outcome`, the `log` interface) are distinct types per crate. What needs them is
//! the [`phase_helpers!`] macro, expanded inside each phase; what does not (input parsing,
//! version arithmetic) is plain functions here.

use nodeward_node_config::input::PhaseInput;

/// Parses a phase's `input`: refuses a `schemaVersion` other than the one this phase was
/// built for, then validates the node config when the phase was given one (its secrets must
/// be references, see `nodeward_node_config::secret`); the error says which.
pub fn parse_input(input: &str) -> Result<PhaseInput, String> {
    PhaseInput::parse(input)
}

/// `major.minor` of a version such as `1.34.1`, `v2.1.8` or `1.20.2-debian`; `None` when it
/// does not start with two numbers.
pub fn major_minor(version: &str) -> Option<(u32, u32)> {
    let v = version.strip_prefix('v').unwrap_or(version);
    let core = v.split(['-', '+']).next().unwrap_or(v);
    let mut parts = core.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// Checks that `version` (the host-resolved version directory name) is one path component
/// that [`nodeward_node_config::layout::Layout::version_dir`] can use.
pub fn check_version_name(version: &str) -> Result<(), String> {
    let ok = !version.is_empty()
        && version != "."
        && version != ".."
        && version != "current"
        && !version.starts_with('.')
        && version
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._+-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "input.version {version:?} is not a version directory name (letters, digits, '.', '_', '+', '-'; not empty, not 'current', no leading '.')"
        ))
    }
}

/// Defines, in the calling phase crate, helpers over its generated bindings: `describe`
/// (an error as "kind: message"), `verb` and `touched` (an outcome), and `info`/`warn` (log).
/// The crate must have generated bindings that import `types` and `log`.
// `crate::nodeward` deliberately names the *calling* phase's generated bindings.
#[allow(clippy::crate_in_macro_def)]
#[macro_export]
macro_rules! phase_helpers {
    () => {
        /// The error kind and message, for an `Err` that names the call at fault.
        #[allow(dead_code)]
        fn describe(e: crate::nodeward::host::types::Error) -> String {
            use crate::nodeward::host::types::Error;
            let (kind, message) = match e {
                Error::Denied(m) => ("denied", m),
                Error::InvalidArgument(m) => ("invalid argument", m),
                Error::NotFound(m) => ("not found", m),
                Error::Escape(m) => ("escape", m),
                Error::Io(m) => ("io", m),
                Error::Failed(m) => ("failed", m),
                Error::Timeout(m) => ("timeout", m),
                Error::Unavailable(m) => ("unavailable", m),
            };
            format!("{kind}: {message}")
        }

        /// The outcome as a past-tense word for logs.
        #[allow(dead_code)]
        fn verb(o: crate::nodeward::host::types::Outcome) -> &'static str {
            use crate::nodeward::host::types::Outcome;
            match o {
                Outcome::Created => "created",
                Outcome::Changed => "changed",
                Outcome::Unchanged => "unchanged",
                Outcome::Removed => "removed",
            }
        }

        /// Whether a mutating call touched the host (or would, in plan mode).
        #[allow(dead_code)]
        fn touched(o: crate::nodeward::host::types::Outcome) -> bool {
            !matches!(o, crate::nodeward::host::types::Outcome::Unchanged)
        }

        #[allow(dead_code)]
        fn info(message: &str) {
            crate::nodeward::host::log::log(crate::nodeward::host::log::Level::Info, message);
        }

        #[allow(dead_code)]
        fn warn(message: &str) {
            crate::nodeward::host::log::log(crate::nodeward::host::log::Level::Warn, message);
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions() {
        assert_eq!(major_minor("1.34.1"), Some((1, 34)));
        assert_eq!(major_minor("v2.1.8"), Some((2, 1)));
        assert_eq!(major_minor("1.20.2-debian"), Some((1, 20)));
        assert_eq!(major_minor("1.6"), Some((1, 6)));
        assert_eq!(major_minor("x"), None);
        assert!(check_version_name("1.34.1-abcdef012345").is_ok());
        for bad in ["", "..", "current", ".tmp", "a/b"] {
            assert!(check_version_name(bad).is_err(), "{bad}");
        }
    }
}

/// Checks that the absolute host path `abs` can be written into unit files, EnvironmentFile
/// values and command lines without quoting: systemd splits `$VAR` at whitespace and expands
/// `%` and `$`, so only letters, digits and `/._-+@:,` are accepted.
pub fn check_plain_path(abs: &str) -> Result<(), String> {
    if abs
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "/._-+@:,".contains(c))
    {
        Ok(())
    } else {
        Err(format!(
            "host path {abs:?} is written into unit files and command lines, so it may hold only letters, digits and /._-+@:, (check --root)"
        ))
    }
}
