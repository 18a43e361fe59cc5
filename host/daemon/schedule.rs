//! When the daemon's next reconcile pass runs, and when a failing watch is polled again.
//!
//! # Background
//! Three things ask for a pass: a watch event (the Machine or one of its operations changed),
//! the jittered resync (a safety net under the watches), and the retry of a pass that failed.
//! They meet in one decision, [`PassSchedule::wake`], because each alone is easy to get right
//! and the combination is not: a resync that falls due while the API server is away stays
//! due (its pass keeps failing), and if that alone could wake the loop, every failed pass
//! would be retried at once — a tight loop against a server that is down, from every node of
//! the fleet (tens of thousands of attempts in a 30 s outage, measured by the fleet benchmark
//! before this module existed). So after a failure nothing runs the next pass before the
//! backoff's delay has passed, whatever asks for it.
//!
//! A watch has its own backoff ([`WatchBackoff`]). Two rules keep it from carrying one outage
//! into the next: a failure after the watch has worked for [`WORKING_RESETS`] starts again at
//! the first ceiling, and so does a `410 Gone` (the server compacted past the watch's
//! resourceVersion; kube-runtime's watcher re-lists at once — routine, not an outage).
//!
//! # Guarantees
//! - After a failed pass, [`PassSchedule::wake`] is never earlier than that pass's end plus
//!   its backoff delay (at least the floor, 200 ms), however many events or resyncs came
//!   meanwhile (`a_due_resync_never_wakes_a_backing_off_pass`).
//! - A wanted pass is never forgotten: events during the backoff run with the retry.
//! - The random draws are arguments, so every bound is tested without randomness.

use crate::daemon::backoff::Backoff;
use std::time::Duration;
use tokio::time::Instant;

/// When the next reconcile pass runs; see the module docs.
#[derive(Clone, Debug)]
pub struct PassSchedule {
    /// A pass asked for (the start, an event, a failed pass's retry) and not yet run.
    wanted_at: Option<Instant>,
    /// The next resync: a full pass even without an event.
    next_resync: Instant,
    /// After a failed pass, nothing runs before this.
    not_before: Option<Instant>,
    backoff: Backoff,
}

impl PassSchedule {
    /// A schedule whose first pass runs at once (`now`), and whose first resync is `resync`
    /// after it.
    pub fn new(now: Instant, resync: Duration) -> Self {
        PassSchedule {
            wanted_at: Some(now),
            next_resync: now + resync,
            not_before: None,
            backoff: Backoff::for_api_server(),
        }
    }

    /// When the loop has to wake up for the next pass.
    pub fn wake(&self) -> Instant {
        let due = self
            .wanted_at
            .map_or(self.next_resync, |at| at.min(self.next_resync));
        self.not_before.map_or(due, |earliest| due.max(earliest))
    }

    /// A watch event asks for a pass: at `now`, or when a failed pass's backoff ends.
    pub fn want(&mut self, now: Instant) {
        self.wanted_at = Some(self.wanted_at.map_or(now, |at| at.min(now)));
    }

    /// Whether the pass starting at `now` is a resync (it looks at every known operation).
    /// Stays true through failed passes until one succeeds.
    pub fn resync_due(&self, now: Instant) -> bool {
        now >= self.next_resync
    }

    /// The pass that ended at `now` succeeded: nothing wanted, the backoff reset, the next
    /// resync `resync` from now.
    pub fn succeeded(&mut self, now: Instant, resync: Duration) {
        self.wanted_at = None;
        self.not_before = None;
        self.next_resync = now + resync;
        self.backoff.reset();
    }

    /// The pass that ended at `now` failed: it is retried after the backoff's next delay
    /// (drawn with `unit`, uniform in `[0, 1)`), which it returns; nothing runs earlier.
    pub fn failed(&mut self, now: Instant, unit: f64) -> Duration {
        let delay = self.backoff.next_delay_with(unit);
        let retry = now + delay;
        self.not_before = Some(retry);
        self.wanted_at = Some(retry);
        delay
    }
}

/// A watch that has worked this long since it was last polled again after a failure has
/// recovered: its next failure is a new outage, backed off from the first ceiling again.
pub const WORKING_RESETS: Duration = Duration::from_secs(60);

/// One watch's backoff: how long it is paused after a failure; see the module docs.
#[derive(Clone, Debug)]
pub struct WatchBackoff {
    backoff: Backoff,
    /// When the watch was last polled again after a failure (or first started).
    resumed_at: Instant,
    /// The last failure was a `410 Gone`.
    last_was_gone: bool,
}

impl WatchBackoff {
    /// A watch started at `now`.
    pub fn new(now: Instant) -> Self {
        WatchBackoff {
            backoff: Backoff::for_api_server(),
            resumed_at: now,
            last_was_gone: false,
        }
    }

    /// The watch failed at `now` (`gone`: with a `410 Gone`); returns how long to pause it,
    /// with `unit` the random draw.
    pub fn failed(&mut self, now: Instant, gone: bool, unit: f64) -> Duration {
        let recovered = now.saturating_duration_since(self.resumed_at) >= WORKING_RESETS;
        if recovered || (gone && !self.last_was_gone) {
            self.backoff.reset();
        }
        self.last_was_gone = gone;
        self.backoff.next_delay_with(unit)
    }

    /// The watch is polled again at `now`, its pause over.
    pub fn resumed(&mut self, now: Instant) {
        self.resumed_at = now;
    }

    /// The watch delivered an event: it works (a new outage starts from the first ceiling).
    pub fn worked(&mut self) {
        self.backoff.reset();
        self.last_was_gone = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RESYNC: Duration = Duration::from_secs(600);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn the_first_pass_runs_at_once() {
        let t0 = Instant::now();
        let s = PassSchedule::new(t0, RESYNC);
        assert_eq!(s.wake(), t0);
        assert!(!s.resync_due(t0));
    }

    #[test]
    fn with_nothing_wanted_the_resync_wakes_the_loop() {
        let t0 = Instant::now();
        let mut s = PassSchedule::new(t0, RESYNC);
        s.succeeded(t0 + ms(50), RESYNC);
        assert_eq!(s.wake(), t0 + ms(50) + RESYNC);
        assert!(s.resync_due(s.wake()));
    }

    #[test]
    fn an_event_wakes_the_loop_at_once() {
        let t0 = Instant::now();
        let mut s = PassSchedule::new(t0, RESYNC);
        s.succeeded(t0, RESYNC);
        s.want(t0 + ms(700));
        assert_eq!(s.wake(), t0 + ms(700));
        // A later event does not push a wanted pass back.
        s.want(t0 + ms(900));
        assert_eq!(s.wake(), t0 + ms(700));
    }

    #[test]
    fn a_due_resync_never_wakes_a_backing_off_pass() {
        // The resync falls due inside an outage: every pass fails. Each retry still waits at
        // least the floor after the failure (the tight loop the fleet benchmark found).
        let t0 = Instant::now();
        let mut s = PassSchedule::new(t0, RESYNC);
        s.succeeded(t0, RESYNC);
        let mut now = t0 + RESYNC + ms(1);
        assert!(s.resync_due(now));
        for attempt in 0..50 {
            let delay = s.failed(now, 0.0);
            assert!(delay >= ms(200), "attempt {attempt}: {delay:?}");
            assert_eq!(s.wake(), now + delay, "attempt {attempt}");
            assert!(s.resync_due(s.wake()), "the retry is still the resync");
            now = s.wake();
        }
    }

    #[test]
    fn events_during_the_backoff_wait_for_it_and_are_not_lost() {
        let t0 = Instant::now();
        let mut s = PassSchedule::new(t0, RESYNC);
        let delay = s.failed(t0, 1.0);
        assert_eq!(delay, ms(1000));
        s.want(t0 + ms(10));
        assert_eq!(s.wake(), t0 + ms(1000));
        // The retry fails again: the ceiling doubles.
        let delay = s.failed(t0 + ms(1000), 1.0);
        assert_eq!(delay, ms(2000));
        assert_eq!(s.wake(), t0 + ms(3000));
        // It succeeds: the event was served by it; the next failure starts from the base.
        s.succeeded(t0 + ms(3000), RESYNC);
        assert_eq!(s.wake(), t0 + ms(3000) + RESYNC);
        assert_eq!(s.failed(t0 + ms(4000), 1.0), ms(1000));
    }

    #[test]
    fn a_watch_that_worked_a_while_starts_a_new_outage_from_the_base() {
        let t0 = Instant::now();
        let mut w = WatchBackoff::new(t0);
        let mut now = t0;
        for _ in 0..5 {
            now += w.failed(now, false, 1.0);
            w.resumed(now);
        }
        // Five failures in a row: ceiling 32 s.
        assert_eq!(w.failed(now, false, 1.0), Duration::from_secs(32));
        w.resumed(now + Duration::from_secs(32));
        // Watching for an hour without an event (the Machine did not change), then the next
        // outage: back at the first ceiling.
        let later = now + Duration::from_secs(3600);
        assert_eq!(w.failed(later, false, 1.0), ms(1000));
    }

    #[test]
    fn quick_failures_keep_doubling() {
        let t0 = Instant::now();
        let mut w = WatchBackoff::new(t0);
        let mut now = t0;
        let mut ceilings = Vec::new();
        for _ in 0..4 {
            let d = w.failed(now, false, 1.0);
            ceilings.push(d.as_millis());
            now += d;
            w.resumed(now);
        }
        assert_eq!(ceilings, [1000, 2000, 4000, 8000]);
    }

    #[test]
    fn a_first_gone_is_routine_a_repeated_one_backs_off() {
        let t0 = Instant::now();
        let mut w = WatchBackoff::new(t0);
        let mut now = t0;
        for _ in 0..4 {
            now += w.failed(now, false, 1.0);
            w.resumed(now);
        }
        // A 410 after a run of failures: re-list soon.
        let d = w.failed(now, true, 1.0);
        assert_eq!(d, ms(1000));
        now += d;
        w.resumed(now);
        // Another 410 at once: backed off like any failure.
        assert_eq!(w.failed(now, true, 1.0), ms(2000));
    }

    #[test]
    fn an_event_resets_the_watch_backoff() {
        let t0 = Instant::now();
        let mut w = WatchBackoff::new(t0);
        for _ in 0..3 {
            w.failed(t0, false, 1.0);
        }
        w.worked();
        assert_eq!(w.failed(t0, false, 1.0), ms(1000));
    }
}
