//! The election timings the tests give their candidates.

use std::time::Duration;

use anyhow::{Context as _, Result};

/// The election timings given to every candidate of a test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timings {
    /// Lease duration (whole seconds: the Lease stores seconds).
    pub lease_duration: Duration,
    /// Renew deadline.
    pub renew_deadline: Duration,
    /// Retry period.
    pub retry_period: Duration,
}

impl Timings {
    /// The short timings of the failover tests: 2 s / 1.5 s / 0.5 s.
    pub const FAST: Self = Self {
        lease_duration: Duration::from_secs(2),
        renew_deadline: Duration::from_millis(1500),
        retry_period: Duration::from_millis(500),
    };
}

/// A time in seconds from the environment variable `var` (`"1.5"`), or
/// `default` seconds when it is unset: how the demo reads `LEASE_DURATION`,
/// `RENEW_DEADLINE` and `RETRY_PERIOD`, as the example controller it runs does.
///
/// # Errors
/// When `var` is set but not a non-negative number of seconds.
pub fn env_seconds(var: &str, default: f64) -> Result<Duration> {
    let value = std::env::var(var).ok();
    let seconds = match &value {
        Some(v) => v
            .parse()
            .with_context(|| format!("{var}={v:?} is not a number of seconds"))?,
        None => default,
    };
    Duration::try_from_secs_f64(seconds).with_context(|| format!("{var}: {seconds} is not a duration"))
}
