//! Time: `CLOCK_MONOTONIC`, the clock of every timestamp the candidates print
//! and the harness takes, and its formatting.

use std::time::Duration;

/// `CLOCK_MONOTONIC` now, in nanoseconds: the clock of every timestamp that the
/// candidates print, so the test's own records compare with theirs.
///
/// Comparable across processes on one machine: the candidates (Rust,
/// k8s-controller) print it with this function, goelect reads the same clock.
#[must_use]
pub fn now_ns() -> u64 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(ts.tv_nsec).unwrap_or(0)
}

/// A duration in nanoseconds (saturating).
#[must_use]
pub fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Formats a nanosecond quantity as milliseconds with three decimals.
#[must_use]
pub fn fmt_ms(ns: u64) -> String {
    format!("{}.{:03} ms", ns / 1_000_000, (ns / 1_000) % 1_000)
}

/// Formats `b - a` (nanoseconds, either sign) as milliseconds.
#[must_use]
pub fn fmt_delta(a: u64, b: u64) -> String {
    if b >= a {
        format!("+{}", fmt_ms(b - a))
    } else {
        format!("-{}", fmt_ms(a - b))
    }
}
