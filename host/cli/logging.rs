//! Logs on stderr: which targets at which level, colour, and the JSON line shape.
//!
//! An operator's `--log-level debug` asks about nodeward, not about wasmtime's compiler (which
//! logs megabytes per component at debug): a bare level applies to nodeward's own targets and
//! every other crate stays at `warn` unless a `target=level` directive names it. A filter that
//! is not one (`verbose`, `bogus=[`) is a usage error instead of a filter that logs nothing.
//!
//! Under `--log-format json` every line is one JSON object with structured fields — the
//! audit record's `args` a JSON value, not JSON text in a string — and the command's final
//! error is such a line too ([`error_line`]).

use super::flags::{ColorWhen, Format, LogArgs};
use crate::audit::journal::{self, JOURNAL_TARGET};
use serde_json::{Map, Value};
use std::fmt;
use std::io::IsTerminal as _;
use tracing::field::{Field, Visit};
use tracing::level_filters::LevelFilter;
use tracing::{Event, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::filter::Directive;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::fmt::FmtContext;
use tracing_subscriber::fmt::format::{FormatEvent, FormatFields, Writer};
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::registry::LookupSpan;

/// The environment variable read when no flag sets the level.
pub const LOG_ENV: &str = "NODEWARD_LOG";

/// The target prefix of nodeward's own logs (a bare level in a filter applies to it).
const OWN_TARGET: &str = "nodeward";

/// The level of other crates when no directive names them.
const DEPENDENCY_LEVEL: LevelFilter = LevelFilter::WARN;

/// A log filter that is not one; names where it came from and the directive at fault.
#[derive(Debug, thiserror::Error)]
#[error("invalid log filter {filter:?} ({origin}): {problem}")]
pub struct FilterError {
    /// The filter as given.
    pub filter: String,
    /// `--log-level` or `NODEWARD_LOG`.
    pub origin: &'static str,
    /// What is wrong with which directive.
    #[source]
    pub problem: DirectiveError,
}

/// What is wrong with one directive of a filter.
#[derive(Debug, thiserror::Error)]
pub enum DirectiveError {
    /// A bare word that is no level: most likely a misspelt level, not a target.
    #[error(
        "{0:?} is neither a level (error, warn, info, debug, trace, off) nor a `target=level` directive"
    )]
    NotALevel(String),
    /// tracing's parser refused it.
    #[error("{directive:?} is not a valid directive")]
    Syntax {
        /// The directive.
        directive: String,
        /// The parser's error.
        #[source]
        source: tracing_subscriber::filter::ParseError,
    },
}

/// How this process logs: the filter and the format, settled before the command runs.
#[derive(Debug)]
pub struct Logging {
    filter: String,
    format: Format,
    ansi: bool,
}

impl Logging {
    /// The logging the flags ask for: `--log-level`, else `--quiet`/`--verbose`, else
    /// `NODEWARD_LOG`, else `default_level`.
    pub fn from_args(args: &LogArgs, default_level: &str) -> Result<Self, FilterError> {
        let env = std::env::var(LOG_ENV).ok().filter(|v| !v.trim().is_empty());
        let (spec, origin) = match (&args.log_level, args.quiet, args.verbose, env) {
            (Some(l), _, _, _) => (l.clone(), "--log-level"),
            (None, true, _, _) => ("warn".to_string(), "--quiet"),
            (None, _, true, _) => ("debug".to_string(), "--verbose"),
            (None, _, _, Some(e)) => (e, LOG_ENV),
            (None, _, _, None) => (default_level.to_string(), "default"),
        };
        let filter = expand(&spec, default_level).map_err(|problem| FilterError {
            filter: spec,
            origin,
            problem,
        })?;
        Ok(Logging {
            filter,
            format: args.log_format,
            ansi: use_colour(args.color),
        })
    }

    /// Logging that only reports the final error, when the flags could not be used (a usage
    /// error found while parsing them): JSON when `--log-format json` was asked for.
    pub fn for_errors(json: bool) -> Self {
        Logging {
            filter: String::new(),
            format: if json { Format::Json } else { Format::Text },
            ansi: false,
        }
    }

    /// Whether log lines (and the final error) are JSON.
    pub fn json(&self) -> bool {
        self.format == Format::Json
    }

    /// Installs the process's subscriber: stderr with the filter, and, when the agent runs
    /// under systemd, the journal for the audit trail's records
    /// ([`crate::audit::journal`]), which stderr never shows.
    pub fn init(&self) {
        use tracing_subscriber::Layer as _;
        use tracing_subscriber::layer::SubscriberExt as _;
        use tracing_subscriber::util::SubscriberInitExt as _;
        // `expand` checked every directive, so this parse cannot fail; should it, nothing is
        // lost but logs, and the fallback is the dependency level.
        let filter = EnvFilter::builder()
            .parse(format!("{},{JOURNAL_TARGET}=off", self.filter))
            .unwrap_or_else(|_| EnvFilter::new(DEPENDENCY_LEVEL.to_string()));
        let stderr = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
        let stderr = if self.json() {
            stderr.event_format(JsonLines).boxed()
        } else {
            stderr.with_ansi(self.ansi).boxed()
        };
        let journal = journal::under_systemd()
            .then(tracing_journald::layer)
            .and_then(|l| {
                l.inspect_err(|e| eprintln!("nodeward: no journal for the audit trail: {e}"))
                    .ok()
            })
            .map(|l| {
                l.with_field_prefix(Some(journal::FIELD_PREFIX.to_string()))
                    .with_filter(Targets::new().with_target(JOURNAL_TARGET, LevelFilter::INFO))
            });
        tracing_subscriber::registry()
            .with(stderr.with_filter(filter))
            .with(journal)
            .init();
    }

    /// Prints the command's final error on stderr: `error: …`, or under `--log-format json`
    /// a JSON line like every other (whatever the filter lets through).
    pub fn print_error(&self, code: u8, message: &str) {
        if self.json() {
            eprintln!("{}", error_line(code, message));
        } else {
            eprintln!("error: {message}");
        }
    }
}

/// The final error as a JSON log line: `level` `ERROR`, target `nodeward`, the message and
/// the process's `exit_code`.
pub fn error_line(code: u8, message: &str) -> Value {
    let mut line = Map::new();
    line.insert("timestamp".into(), Value::String(timestamp()));
    line.insert("level".into(), Value::String("ERROR".into()));
    line.insert("target".into(), Value::String(OWN_TARGET.into()));
    line.insert("message".into(), Value::String(message.into()));
    line.insert("exit_code".into(), Value::from(code));
    Value::Object(line)
}

/// Rewrites a user filter into the one installed: `<deps>,nodeward=<level>,<directives>`.
fn expand(spec: &str, default_level: &str) -> Result<String, DirectiveError> {
    let mut own: Option<LevelFilter> = None;
    let mut named = Vec::new();
    for directive in split_directives(spec) {
        if let Ok(level) = directive.parse::<LevelFilter>() {
            own = Some(level);
            continue;
        }
        let directive = if directive.starts_with('[') {
            format!("{OWN_TARGET}{directive}")
        } else if !directive.contains('=') {
            return Err(DirectiveError::NotALevel(directive.to_string()));
        } else {
            directive.to_string()
        };
        directive
            .parse::<Directive>()
            .map_err(|source| DirectiveError::Syntax {
                directive: directive.clone(),
                source,
            })?;
        named.push(directive);
    }
    let own = match own {
        Some(level) => level,
        None => default_level
            .parse::<LevelFilter>()
            .map_err(|_| DirectiveError::NotALevel(default_level.to_string()))?,
    };
    // Quieter than `warn` for nodeward means quieter for everyone (`off` is off).
    let deps = own.min(DEPENDENCY_LEVEL);
    let mut filter = vec![deps.to_string(), format!("{OWN_TARGET}={own}")];
    filter.extend(named);
    Ok(filter.join(","))
}

/// The comma-separated directives of a filter; a comma inside `[…]` or `{…}` (a span's
/// field list) does not separate.
fn split_directives(spec: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in spec.char_indices() {
        match c {
            '[' | '{' => depth += 1,
            ']' | '}' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                out.push(&spec[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&spec[start..]);
    out.into_iter()
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .collect()
}

/// Colour in text logs: `--color always|never`, else only on a terminal, and not with
/// `NO_COLOR` (non-empty, <https://no-color.org>) or `TERM=dumb`.
fn use_colour(when: ColorWhen) -> bool {
    colour(
        when,
        std::io::stderr().is_terminal(),
        std::env::var_os("NO_COLOR"),
        std::env::var_os("TERM"),
    )
}

/// [`use_colour`] given what it reads.
fn colour(
    when: ColorWhen,
    terminal: bool,
    no_color: Option<std::ffi::OsString>,
    term: Option<std::ffi::OsString>,
) -> bool {
    match when {
        ColorWhen::Always => true,
        ColorWhen::Never => false,
        ColorWhen::Auto => {
            terminal && no_color.is_none_or(|v| v.is_empty()) && term.is_none_or(|t| t != "dumb")
        }
    }
}

/// The time in the text logs' format (RFC 3339, UTC).
fn timestamp() -> String {
    let mut out = String::new();
    // Writing to a String cannot fail; a clock that cannot be formatted leaves it empty.
    let _ = SystemTime.format_time(&mut Writer::new(&mut out));
    out
}

/// Fields whose text is a JSON document, emitted as that value in JSON logs: the audit
/// record's arguments (`nodeward::audit`, `args`).
fn is_json_field(target: &str, field: &str) -> bool {
    target.starts_with("nodeward::audit") && field == "args"
}

/// One JSON object per event: `timestamp`, `level`, `target`, `message` and every field as
/// a typed value.
struct JsonLines;

impl<S, N> FormatEvent<S, N> for JsonLines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        let mut line = Map::new();
        line.insert("timestamp".into(), Value::String(timestamp()));
        line.insert("level".into(), Value::String(meta.level().to_string()));
        line.insert("target".into(), Value::String(meta.target().into()));
        event.record(&mut JsonFields {
            target: meta.target(),
            line: &mut line,
        });
        writeln!(writer, "{}", Value::Object(line))
    }
}

/// Collects an event's fields into a JSON object.
struct JsonFields<'a> {
    target: &'a str,
    line: &'a mut Map<String, Value>,
}

impl JsonFields<'_> {
    fn put(&mut self, field: &Field, value: Value) {
        self.line.insert(field.name().to_string(), value);
    }
}

impl Visit for JsonFields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        let text = format!("{value:?}");
        let value = if is_json_field(self.target, field.name()) {
            serde_json::from_str(&text).unwrap_or(Value::String(text))
        } else {
            Value::String(text)
        };
        self.put(field, value);
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        let value = if is_json_field(self.target, field.name()) {
            serde_json::from_str(value).unwrap_or_else(|_| Value::String(value.into()))
        } else {
            Value::String(value.into())
        };
        self.put(field, value);
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, Value::from(value));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, Value::from(value));
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.put(field, Value::from(value));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, Value::from(value));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_level_is_nodeward_and_dependencies_stay_at_warn() {
        assert_eq!(expand("debug", "warn").expect("ok"), "warn,nodeward=debug");
        assert_eq!(expand("trace", "warn").expect("ok"), "warn,nodeward=trace");
        assert_eq!(expand("off", "info").expect("ok"), "off,nodeward=off");
        assert_eq!(
            expand("warn,nodeward::audit=debug", "info").expect("ok"),
            "warn,nodeward=warn,nodeward::audit=debug"
        );
        assert_eq!(
            expand("cranelift_codegen=debug", "info").expect("ok"),
            "warn,nodeward=info,cranelift_codegen=debug"
        );
        assert_eq!(
            expand("[run{phase=a,b}]=debug", "info").expect("ok"),
            "warn,nodeward=info,nodeward[run{phase=a,b}]=debug"
        );
    }

    #[test]
    fn a_filter_that_is_not_one_is_refused() {
        assert!(matches!(
            expand("verbose", "info"),
            Err(DirectiveError::NotALevel(d)) if d == "verbose"
        ));
        assert!(matches!(
            expand("bogus=[", "info"),
            Err(DirectiveError::Syntax { directive, .. }) if directive == "bogus=["
        ));
        assert!(expand("nodeward=loud", "info").is_err());
    }

    #[test]
    fn colour_on_a_terminal_unless_no_color_or_a_dumb_one() {
        let os = |s: &str| Some(std::ffi::OsString::from(s));
        assert!(colour(ColorWhen::Auto, true, None, os("xterm")));
        assert!(!colour(ColorWhen::Auto, false, None, os("xterm")));
        assert!(!colour(ColorWhen::Auto, true, os("1"), os("xterm")));
        assert!(colour(ColorWhen::Auto, true, os(""), None));
        assert!(!colour(ColorWhen::Auto, true, None, os("dumb")));
        assert!(colour(ColorWhen::Always, false, os("1"), os("dumb")));
        assert!(!colour(ColorWhen::Never, true, None, None));
    }

    #[test]
    fn the_final_error_is_a_json_log_line() {
        let line = error_line(2, "no such phase");
        assert_eq!(line["level"], "ERROR");
        assert_eq!(line["exit_code"], 2);
        assert_eq!(line["message"], "no such phase");
        assert!(line["timestamp"].as_str().is_some_and(|t| !t.is_empty()));
    }
}
