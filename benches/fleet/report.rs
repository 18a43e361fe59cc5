//! Figures from the fleet's requests and passes: quantiles, rates per second, spreads. Pure
//! arithmetic; the bench prints what these return and asserts nothing about them.

use crate::audit::Request;
use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

/// Seconds from `from` to `to` (negative when `to` is earlier).
pub fn secs_between(from: SystemTime, to: SystemTime) -> f64 {
    match to.duration_since(from) {
        Ok(d) => d.as_secs_f64(),
        Err(e) => -e.duration().as_secs_f64(),
    }
}

/// `(median, 90th percentile, max)` of `values` (nearest rank); zeros when empty.
pub fn quantiles(values: &[f64]) -> (f64, f64, f64) {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = |q: f64| -> f64 {
        if v.is_empty() {
            return 0.0;
        }
        let i = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
        v[i]
    };
    (rank(0.5), rank(0.9), v.last().copied().unwrap_or(0.0))
}

/// How many of `times` fall in each whole second after `from` (key: seconds since `from`).
pub fn per_second(
    times: impl IntoIterator<Item = SystemTime>,
    from: SystemTime,
) -> BTreeMap<u64, u64> {
    let mut buckets = BTreeMap::new();
    for t in times {
        if let Ok(d) = t.duration_since(from) {
            *buckets.entry(d.as_secs()).or_default() += 1;
        }
    }
    buckets
}

/// The busiest second of `buckets`: `(seconds after the start, count)`.
pub fn peak(buckets: &BTreeMap<u64, u64>) -> (u64, u64) {
    buckets
        .iter()
        .max_by_key(|(second, count)| (**count, std::cmp::Reverse(**second)))
        .map_or((0, 0), |(s, c)| (*s, *c))
}

/// The most of `buckets` within any `width` consecutive seconds.
pub fn busiest_window(buckets: &BTreeMap<u64, u64>, width: u64) -> u64 {
    buckets
        .keys()
        .map(|&start| buckets.range(start..start + width).map(|(_, c)| c).sum())
        .max()
        .unwrap_or(0)
}

/// `buckets` summed into `width`-second bins over `[0, until)`: one line, `start-end s: n`
/// per bin (empty bins shown, so the spread is visible).
pub fn bins(buckets: &BTreeMap<u64, u64>, width: u64, until: u64) -> String {
    let width = width.max(1);
    (0..until.div_ceil(width))
        .map(|b| {
            let n: u64 = buckets
                .range(b * width..(b + 1) * width)
                .map(|(_, c)| c)
                .sum();
            format!("{}-{}s:{n}", b * width, (b + 1) * width)
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// How many of `requests` there are per `verb resource`, most first.
pub fn by_kind(requests: &[&Request]) -> Vec<(String, usize)> {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for r in requests {
        *counts
            .entry(format!("{} {}", r.verb, r.resource))
            .or_default() += 1;
    }
    let mut v: Vec<_> = counts.into_iter().collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    v
}

/// `by_kind` as one line, each count scaled by `scale` (e.g. per node per hour).
pub fn kinds_line(requests: &[&Request], scale: f64) -> String {
    by_kind(requests)
        .iter()
        .map(|(k, n)| format!("{k} {:.1}", *n as f64 * scale))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Milliseconds of `d`, for printing.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
