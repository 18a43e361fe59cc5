//! What a download shows while its body arrives: a progress bar when stderr is a terminal, one
//! plain line every [`LINE_EVERY`] otherwise (CI logs, journald, a redirected file), nothing
//! when the log level hides `info` (`--quiet`).
//!
//! A download shorter than [`LINE_EVERY`] prints no line at all: the lines are for the long
//! ones an operator would otherwise watch in silence. Their number is bounded by the phase
//! deadline (one per [`LINE_EVERY`]), never by what a guest asks.

use std::io::{self, IsTerminal};
use std::time::{Duration, Instant};
use url::Url;

/// How often a plain progress line is printed while a download runs.
pub const LINE_EVERY: Duration = Duration::from_secs(5);

/// The log target of the progress lines.
const TARGET: &str = "nodeward::download";

/// The progress display of one download attempt.
pub(super) enum Progress {
    /// A terminal: indicatif's bar (cleared when done).
    Bar(indicatif::ProgressBar),
    /// Not a terminal: a line now and then.
    Lines(Lines),
    /// Nothing (`--quiet`).
    Off,
}

impl Progress {
    /// The display for a download of `url` announcing `len` bytes.
    pub(super) fn start(len: Option<u64>, url: &Url) -> Progress {
        if !tracing::enabled!(target: TARGET, tracing::Level::INFO) {
            return Progress::Off;
        }
        let name = url
            .path_segments()
            .and_then(|mut s| s.next_back())
            .filter(|s| !s.is_empty())
            .unwrap_or("download")
            .to_string();
        if !io::stderr().is_terminal() {
            return Progress::Lines(Lines::new(name, len, Instant::now()));
        }
        let bar = match len {
            Some(n) => indicatif::ProgressBar::new(n),
            None => indicatif::ProgressBar::new_spinner(),
        };
        if let Ok(style) = indicatif::ProgressStyle::with_template(
            "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        ) {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_message(name);
        Progress::Bar(bar)
    }

    /// `n` more bytes arrived.
    pub(super) fn advance(&mut self, n: u64) {
        match self {
            Progress::Bar(bar) => bar.inc(n),
            Progress::Lines(lines) => {
                if let Some(line) = lines.advance(n, Instant::now()) {
                    tracing::info!(target: TARGET, "{line}");
                }
            }
            Progress::Off => {}
        }
    }

    /// The body is complete (or the attempt ended).
    pub(super) fn finish(self) {
        match self {
            Progress::Bar(bar) => bar.finish_and_clear(),
            Progress::Lines(lines) => {
                if let Some(line) = lines.finish(Instant::now()) {
                    tracing::info!(target: TARGET, "{line}");
                }
            }
            Progress::Off => {}
        }
    }
}

/// The plain-line display: what to print, and when.
#[derive(Debug)]
pub(super) struct Lines {
    name: String,
    len: Option<u64>,
    started: Instant,
    next: Instant,
    done: u64,
    printed: bool,
}

impl Lines {
    pub(super) fn new(name: String, len: Option<u64>, now: Instant) -> Lines {
        Lines {
            name,
            len,
            started: now,
            next: now + LINE_EVERY,
            done: 0,
            printed: false,
        }
    }

    /// Counts `n` bytes at `now`; the line to print when one is due.
    pub(super) fn advance(&mut self, n: u64, now: Instant) -> Option<String> {
        self.done = self.done.saturating_add(n);
        if now < self.next {
            return None;
        }
        self.next = now + LINE_EVERY;
        self.printed = true;
        let rate = rate(self.done, now.duration_since(self.started));
        Some(match self.len {
            Some(len) if len > 0 => format!(
                "downloading {}: {} of {} ({}%) at {}/s",
                self.name,
                indicatif::HumanBytes(self.done),
                indicatif::HumanBytes(len),
                self.done.saturating_mul(100) / len,
                indicatif::HumanBytes(rate)
            ),
            _ => format!(
                "downloading {}: {} at {}/s",
                self.name,
                indicatif::HumanBytes(self.done),
                indicatif::HumanBytes(rate)
            ),
        })
    }

    /// The closing line of a download that printed progress; `None` for a short one.
    pub(super) fn finish(&self, now: Instant) -> Option<String> {
        self.printed.then(|| {
            let took = now.duration_since(self.started);
            format!(
                "downloaded {}: {} in {:.1} s",
                self.name,
                indicatif::HumanBytes(self.done),
                took.as_secs_f64()
            )
        })
    }
}

/// Bytes per second over `elapsed` (0 before any time passed).
fn rate(bytes: u64, elapsed: Duration) -> u64 {
    let ms = u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX);
    bytes.saturating_mul(1000).checked_div(ms).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_every_interval_and_a_closing_line_only_after_one() {
        let t0 = Instant::now();
        let mut quick = Lines::new("runc".into(), Some(100), t0);
        assert_eq!(quick.advance(100, t0 + Duration::from_secs(1)), None);
        assert_eq!(quick.finish(t0 + Duration::from_secs(1)), None, "short");

        let mut slow = Lines::new("kubelet".into(), Some(100 << 20), t0);
        assert_eq!(slow.advance(10 << 20, t0 + Duration::from_secs(4)), None);
        let line = slow.advance(10 << 20, t0 + Duration::from_secs(5));
        assert_eq!(
            line.as_deref(),
            Some("downloading kubelet: 20.00 MiB of 100.00 MiB (20%) at 4.00 MiB/s")
        );
        assert_eq!(slow.advance(1, t0 + Duration::from_secs(9)), None);
        assert!(slow.advance(1, t0 + Duration::from_secs(10)).is_some());
        assert_eq!(
            slow.finish(t0 + Duration::from_secs(12)).as_deref(),
            Some("downloaded kubelet: 20.00 MiB in 12.0 s")
        );
    }

    #[test]
    fn an_unknown_length_shows_bytes_and_rate() {
        let t0 = Instant::now();
        let mut l = Lines::new("x".into(), None, t0);
        let line = l.advance(2048, t0 + LINE_EVERY).expect("due");
        assert_eq!(line, "downloading x: 2.00 KiB at 409 B/s");
        // A zero announced length cannot divide by zero.
        let mut z = Lines::new("z".into(), Some(0), t0);
        assert!(z.advance(1, t0 + LINE_EVERY).is_some());
        assert_eq!(rate(5, Duration::ZERO), 0);
    }
}
