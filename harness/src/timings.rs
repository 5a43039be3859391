//! The election timings the tests give their candidates.

use std::time::Duration;

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
