//! How long the daemon waits before it tries the API server again: exponential backoff with
//! full jitter, and the jittered resync period.
//!
//! # Background
//! Every node of a fleet runs the daemon against the same API server. When that server goes
//! away, each daemon has to wait longer between attempts (so it never spins in a tight loop)
//! and must not retry in step with the others: if every node came back after the same fixed
//! delay, a restarted server would get a relist from the whole fleet at once. Full jitter (a
//! delay drawn uniformly from `[floor, ceiling]`, the ceiling doubling with each failure) spreads
//! the retries out.
//!
//! # Guarantees
//! - A delay is never below [`Backoff::floor`], so even a server that fails at once cannot make
//!   the loop spin, and never above [`Backoff::max`].
//! - The ceiling doubles after each failure until it reaches `max`, and drops back to `base`
//!   only after [`Backoff::reset`] (a success).
//! - The random draw is an argument of the pure functions ([`Backoff::next_delay_with`],
//!   [`resync_with`]), so their bounds are tested without randomness; the daemon draws it
//!   from `fastrand`.

use std::time::Duration;

/// Exponential backoff with full jitter; see the module docs.
#[derive(Clone, Debug)]
pub struct Backoff {
    /// The ceiling after the first failure.
    base: Duration,
    /// The largest delay ever returned.
    max: Duration,
    /// The smallest delay ever returned.
    floor: Duration,
    /// Failures since the last success.
    failures: u32,
}

impl Backoff {
    /// What the daemon uses for the API server: ceilings 1 s, 2 s, 4 s, … up to 5 min, never
    /// less than 200 ms between attempts.
    pub fn for_api_server() -> Self {
        Backoff::new(
            Duration::from_secs(1),
            Duration::from_secs(300),
            Duration::from_millis(200),
        )
    }

    /// A backoff whose first ceiling is `base`, whose delays stay within `[floor, max]`. A
    /// `floor` above `max` is lowered to it, a `base` below `floor` raised to it.
    pub fn new(base: Duration, max: Duration, floor: Duration) -> Self {
        let floor = floor.min(max);
        Backoff {
            base: base.clamp(floor, max),
            max,
            floor,
            failures: 0,
        }
    }

    /// The smallest delay this backoff returns.
    pub fn floor(&self) -> Duration {
        self.floor
    }

    /// The largest delay this backoff returns.
    pub fn max(&self) -> Duration {
        self.max
    }

    /// Failures since the last [`Backoff::reset`].
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// The ceiling of the next delay: `base · 2^failures`, at most `max`.
    pub fn ceiling(&self) -> Duration {
        // 2^31 s is far beyond any sane max: the shift saturates there.
        let factor = 1u32.checked_shl(self.failures.min(31)).unwrap_or(u32::MAX);
        self.base.saturating_mul(factor).min(self.max)
    }

    /// Counts a failure and returns how long to wait before the next attempt, with `unit` a
    /// uniform draw from `[0, 1)`: `floor + unit · (ceiling − floor)`. A `unit` outside
    /// `[0, 1]` (or NaN) is clamped, so the bounds hold whatever the caller passes.
    pub fn next_delay_with(&mut self, unit: f64) -> Duration {
        let ceiling = self.ceiling();
        self.failures = self.failures.saturating_add(1);
        let unit = unit_interval(unit);
        let span = ceiling.saturating_sub(self.floor);
        (self.floor + span.mul_f64(unit)).clamp(self.floor, self.max)
    }

    /// Counts a failure and returns a jittered delay drawn from `fastrand`.
    pub fn next_delay(&mut self) -> Duration {
        self.next_delay_with(fastrand::f64())
    }

    /// A success: the next failure starts again at `base`.
    pub fn reset(&mut self) {
        self.failures = 0;
    }
}

/// The period between two full resyncs (a reconcile without any watch event): `period`
/// stretched by up to `fraction` of itself, with `unit` a uniform draw from `[0, 1)`. Spreads
/// the resyncs of a fleet whose daemons started together.
pub fn resync_with(period: Duration, fraction: f64, unit: f64) -> Duration {
    period + period.mul_f64(unit_interval(fraction) * unit_interval(unit))
}

/// `x` within `[0, 1]`; NaN is 0.
fn unit_interval(x: f64) -> f64 {
    if x.is_nan() { 0.0 } else { x.clamp(0.0, 1.0) }
}

/// The daemon's resync period: 10 min plus up to 10 % jitter (the seeds' poll period, here a
/// safety net under the watches rather than the only trigger).
pub fn resync() -> Duration {
    resync_with(Duration::from_secs(600), 0.1, fastrand::f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn ceilings_double_up_to_the_max() {
        let mut b = Backoff::new(ms(1000), ms(10_000), ms(200));
        let mut ceilings = Vec::new();
        for _ in 0..6 {
            ceilings.push(b.ceiling().as_millis());
            b.next_delay_with(0.5);
        }
        assert_eq!(ceilings, [1000, 2000, 4000, 8000, 10_000, 10_000]);
    }

    #[test]
    fn every_delay_is_within_floor_and_ceiling() {
        let mut b = Backoff::for_api_server();
        for i in 0..100u32 {
            let ceiling = b.ceiling();
            // The extremes of the draw, and a spread of values between.
            let unit = f64::from(i % 11) / 10.0;
            let d = b.next_delay_with(unit);
            assert!(d >= b.floor(), "attempt {i}: {d:?} below the floor");
            assert!(
                d <= ceiling,
                "attempt {i}: {d:?} above the ceiling {ceiling:?}"
            );
            assert!(d <= b.max(), "attempt {i}: {d:?} above the max");
        }
        assert_eq!(b.failures(), 100);
    }

    #[test]
    fn a_zero_draw_still_waits_the_floor() {
        // Never a tight loop, even when every draw is 0 and the server fails at once.
        let mut b = Backoff::for_api_server();
        for _ in 0..10 {
            assert_eq!(b.next_delay_with(0.0), ms(200));
        }
    }

    #[test]
    fn a_full_draw_reaches_the_ceiling() {
        let mut b = Backoff::new(ms(1000), ms(5000), ms(100));
        assert_eq!(b.next_delay_with(1.0), ms(1000));
        assert_eq!(b.next_delay_with(1.0), ms(2000));
        assert_eq!(b.next_delay_with(1.0), ms(4000));
        assert_eq!(b.next_delay_with(1.0), ms(5000));
    }

    #[test]
    fn out_of_range_draws_are_clamped() {
        let mut b = Backoff::new(ms(1000), ms(5000), ms(100));
        assert_eq!(b.next_delay_with(f64::NAN), ms(100));
        assert_eq!(b.next_delay_with(-3.0), ms(100));
        assert_eq!(b.next_delay_with(7.0), ms(4000));
        assert_eq!(b.next_delay_with(f64::INFINITY), ms(5000));
    }

    #[test]
    fn reset_starts_again_at_base() {
        let mut b = Backoff::new(ms(1000), ms(60_000), ms(100));
        for _ in 0..5 {
            b.next_delay_with(0.5);
        }
        assert_eq!(b.ceiling(), ms(32_000));
        b.reset();
        assert_eq!(b.failures(), 0);
        assert_eq!(b.ceiling(), ms(1000));
    }

    #[test]
    fn many_failures_do_not_overflow() {
        let mut b = Backoff::for_api_server();
        for _ in 0..10_000 {
            b.next_delay_with(1.0);
        }
        assert_eq!(b.ceiling(), b.max());
        assert_eq!(b.next_delay_with(1.0), b.max());
    }

    #[test]
    fn inconsistent_bounds_are_repaired() {
        // A floor above the max, a base below the floor.
        let b = Backoff::new(ms(10), ms(500), ms(900));
        assert_eq!(b.floor(), ms(500));
        assert_eq!(b.ceiling(), ms(500));
    }

    #[test]
    fn resync_is_stretched_by_at_most_the_fraction() {
        let period = Duration::from_secs(600);
        assert_eq!(resync_with(period, 0.1, 0.0), period);
        assert_eq!(resync_with(period, 0.1, 1.0), Duration::from_secs(660));
        assert_eq!(resync_with(period, 0.1, 0.5), Duration::from_secs(630));
        assert_eq!(resync_with(period, f64::NAN, 0.5), period);
        assert_eq!(resync_with(period, 0.1, 9.0), Duration::from_secs(660));
    }

    #[test]
    fn random_draws_stay_in_bounds() {
        let mut b = Backoff::for_api_server();
        for _ in 0..1000 {
            let ceiling = b.ceiling();
            let d = b.next_delay();
            assert!(d >= b.floor() && d <= ceiling, "{d:?}");
        }
        for _ in 0..1000 {
            let r = resync();
            assert!(r >= Duration::from_secs(600) && r <= Duration::from_secs(660));
        }
    }
}
