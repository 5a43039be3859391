use std::time::Duration;

use super::Error;

/// The settings of a leader election on one `coordination.k8s.io/v1` Lease.
///
/// The defaults are client-go's: a 15 s lease duration, a 10 s renew deadline and a 2 s retry
/// period. [`LeaderElector::new`](super::LeaderElector::new) checks them with client-go's rules
/// ([`Config::validate`]) before any API call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    pub(crate) namespace: String,
    pub(crate) name: String,
    pub(crate) identity: String,
    pub(crate) lease_duration: Duration,
    pub(crate) renew_deadline: Duration,
    pub(crate) retry_period: Duration,
}

impl Config {
    /// Settings for the Lease `namespace/name`, campaigning as `identity`, with client-go's
    /// default timings. `identity` must be unique among the candidates (a pod's name is).
    #[must_use]
    pub fn new(namespace: impl Into<String>, name: impl Into<String>, identity: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
            identity: identity.into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }

    /// How long the other candidates wait, after they last saw the Lease change, before they
    /// take it over (default 15 s). Written to the Lease in whole seconds.
    #[must_use]
    pub fn lease_duration(mut self, duration: Duration) -> Self {
        self.lease_duration = duration;
        self
    }

    /// How long the leader keeps trying to renew before it gives up (default 10 s), counted
    /// from the instant before its last successful renewal was sent.
    #[must_use]
    pub fn renew_deadline(mut self, deadline: Duration) -> Self {
        self.renew_deadline = deadline;
        self
    }

    /// The leader's renewal cadence and the other candidates' retry cadence (default 2 s).
    #[must_use]
    pub fn retry_period(mut self, period: Duration) -> Self {
        self.retry_period = period;
        self
    }

    /// Checks client-go's rules (lease duration > renew deadline > 1.2 × retry period, all
    /// greater than zero, a non-empty identity) and what the API server would reject.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] with the first rule broken, in client-go's words.
    pub fn validate(&self) -> Result<(), Error> {
        let rules = [
            (self.namespace.is_empty(), "lease namespace is empty"),
            (self.name.is_empty(), "lease name is empty"),
            (self.identity.is_empty(), "Lock identity is empty"),
            (
                self.lease_duration.is_zero(),
                "leaseDuration must be greater than zero",
            ),
            (
                self.renew_deadline.is_zero(),
                "renewDeadline must be greater than zero",
            ),
            (
                self.retry_period.is_zero(),
                "retryPeriod must be greater than zero",
            ),
            (
                self.lease_duration <= self.renew_deadline,
                "leaseDuration must be greater than renewDeadline",
            ),
            (
                self.renew_deadline.as_nanos() * 5 <= self.retry_period.as_nanos() * 6,
                "renewDeadline must be greater than retryPeriod*JitterFactor",
            ),
            (
                self.lease_duration.as_secs() == 0 || i32::try_from(self.lease_duration.as_secs()).is_err(),
                "leaseDuration must be between 1 s and i32::MAX s",
            ),
        ];
        match rules.into_iter().find(|(broken, _)| *broken) {
            Some((_, rule)) => Err(Error::InvalidConfig(rule)),
            None => Ok(()),
        }
    }

    /// The lease duration as the Lease stores it (validated to fit).
    pub(crate) fn lease_duration_seconds(&self) -> i32 {
        i32::try_from(self.lease_duration.as_secs()).unwrap_or(i32::MAX)
    }
}
