//! [`LeaseConfig`]: the validated settings of one election.

use std::time::Duration;

mod error;
pub(crate) mod extras;
pub(crate) mod names;

pub use self::error::{ConfigError, Field};

/// client-go's `JitterFactor`: acquisition retries wait `retry_period * (1 + rand * 1.2)`.
pub(crate) const JITTER_FACTOR: f64 = 1.2;

/// Settings of a leader election on one `coordination.k8s.io/v1` Lease.
///
/// The defaults are client-go's (and controller-runtime's and
/// kube-controller-manager's): a 15 s lease duration, a 10 s renew deadline and
/// a 2 s retry period. [`LeaseConfig::validate`] checks the same rules as
/// client-go's `NewLeaderElector`, plus what the API server would reject, and
/// it is called before any API call is made.
///
/// # Choosing timings
/// - `lease_duration` is how long the other candidates wait, after they last
///   saw the Lease change, before they take it over. It bounds the downtime
///   after a crash, and it is written to the Lease in whole seconds.
/// - `renew_deadline` is how long the leader keeps trying to renew before it
///   gives up and stops its guarded work. The gap `lease_duration -
///   renew_deadline` is the safety margin that absorbs clock *rate* differences
///   between nodes and the time it takes to stop the guarded work.
/// - `retry_period` is the renewal cadence of the leader and the polling
///   cadence of candidates (jittered by a factor of 1.2 when acquiring).
///
/// ```
/// use std::time::Duration;
/// use kube_runtime_lease::LeaseConfig;
///
/// let config = LeaseConfig::new("default", "my-controller", "pod-a_1f3x")
///     .lease_duration(Duration::from_secs(15))
///     .renew_deadline(Duration::from_secs(10))
///     .retry_period(Duration::from_secs(2));
/// assert!(config.validate().is_ok());
/// ```
#[derive(Clone, Debug, PartialEq)]
#[allow(
    clippy::struct_excessive_bools,
    reason = "independent switches of a builder, each set by its own method"
)]
pub struct LeaseConfig {
    pub(crate) namespace: String,
    pub(crate) name: String,
    pub(crate) identity: String,
    pub(crate) lease_duration: Duration,
    pub(crate) renew_deadline: Duration,
    pub(crate) retry_period: Duration,
    pub(crate) release_on_drop: bool,
    pub(crate) release_timeout: Duration,
    pub(crate) watch: bool,
    pub(crate) enabled: bool,
    pub(crate) creation_hold: bool,
    /// The extras' settings: Lease metadata, Coordinated Leader Election
    /// (empty without their features).
    pub(crate) extras: extras::Extras,
}

// Every field compares fully (`OwnerReference`'s `PartialEq` included).
impl Eq for LeaseConfig {}

impl LeaseConfig {
    /// Settings for the Lease `namespace/name`, campaigning as `identity`, with
    /// client-go's default timings.
    ///
    /// `identity` must be unique among the candidates: two candidates with the
    /// same identity both believe they lead. [`unique_identity`] builds one.
    #[must_use]
    pub fn new(namespace: impl Into<String>, name: impl Into<String>, identity: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
            identity: identity.into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
            release_on_drop: true,
            release_timeout: Duration::from_secs(5),
            watch: true,
            enabled: true,
            creation_hold: true,
            extras: extras::Extras::default(),
        }
    }

    /// How long others wait, after they last saw the Lease change, before they
    /// may take it over (default 15 s). Whole seconds, at least 1 s.
    #[must_use]
    pub fn lease_duration(mut self, duration: Duration) -> Self {
        self.lease_duration = duration;
        self
    }

    /// How long the leader keeps retrying a renewal before it gives up
    /// (default 10 s). Counted from the instant before the last successful
    /// renewal was sent.
    #[must_use]
    pub fn renew_deadline(mut self, deadline: Duration) -> Self {
        self.renew_deadline = deadline;
        self
    }

    /// The renewal cadence of the leader and the retry cadence of candidates
    /// (default 2 s).
    #[must_use]
    pub fn retry_period(mut self, period: Duration) -> Self {
        self.retry_period = period;
        self
    }

    /// Whether the leader releases the Lease when leadership is given up
    /// voluntarily: every guard dropped, the guarded stream ended, or
    /// [`shutdown`](crate::LeaderElector::shutdown) (default `true`, like
    /// client-go's `ReleaseOnCancel`). A released Lease is taken over by a
    /// standby at once instead of after `lease_duration`. A step-down for a
    /// `preferredHolder` releases whatever this says.
    #[must_use]
    pub fn release_on_drop(mut self, release: bool) -> Self {
        self.release_on_drop = release;
        self
    }

    /// The bound on the whole release (fetch and write) (default 5 s).
    #[must_use]
    pub fn release_timeout(mut self, timeout: Duration) -> Self {
        self.release_timeout = timeout;
        self
    }

    /// Whether candidates also watch the Lease (default `true`), so that a
    /// release is acted on within one watch event and a leader learns of a
    /// takeover at once. Without `watch`/`list` permission on Leases the
    /// elector falls back to polling with one warning while kube-runtime's
    /// watcher retries with its default backoff (up to 30 s, jittered); set
    /// this to `false` to poll from the start. A follower trusts the watch
    /// only while it is heard from (within two retry periods) and in time
    /// (the last renewal it delivered came within a retry period of its
    /// `renewTime`, by this node's clock, and the last version a read showed
    /// first came within a retry period of that read); otherwise it reads
    /// before every attempt, at client-go's pace, with a warning (a stalled
    /// or lagging watch, or a clock ahead of the holder's: reads, never
    /// safety).
    #[must_use]
    pub fn watch(mut self, watch: bool) -> Self {
        self.watch = watch;
        self
    }

    /// Whether a Lease object that is new to this candidate is held before
    /// anyone leads on it (default `true`): one lease duration after this
    /// candidate created it, or as long as the holder of a deleted Lease of
    /// the same name may still lead (the lease duration of its last record:
    /// the longest seen since its holder last wrote it).
    ///
    /// What the hold protects against: a Lease deleted while it is held. Its
    /// leader may be partitioned from the API server, so that it sees neither
    /// the deletion nor the new object, and goes on leading until its renew
    /// deadline; `create` has no precondition that could stop a new leader
    /// meanwhile. With the hold, nobody leads the new object before that old
    /// leader has given up. The cost: a fresh install (or a namespace made
    /// for one test) waits one lease duration for its first leader, where
    /// client-go leads at once.
    /// <!-- upstream: omit -->
    ///
    /// A candidate that never saw the deleted record (started after the
    /// deletion) can only hold for its own lease duration, which outlasts
    /// the old leader's renew deadline when both have the same timings. In a
    /// rolling update that lowers the lease duration below the old replicas'
    /// renew deadline, a Lease deleted while an old replica leads (cut off)
    /// may be led by a new replica before that old leader gives up: do not
    /// delete the Lease during such an update.
    /// <!-- upstream: end -->
    ///
    /// Turning it off is reasonable where nothing deletes a held Lease: a
    /// fresh install, an end-to-end suite with a namespace per test, a demo.
    /// Then a Lease this candidate creates is led at once, and a re-created
    /// Lease is taken like any other record (a deleted Lease's leader that
    /// cannot reach the API server may then act alongside the new one until
    /// its renew deadline).
    #[must_use]
    pub fn creation_hold(mut self, hold: bool) -> Self {
        self.creation_hold = hold;
        self
    }

    /// Whether to run the election at all (default `true`): the off switch
    /// behind a `--leader-elect=false` flag, for local runs and single-replica
    /// installs.
    ///
    /// Disabled, the elector makes no API call (no Lease RBAC is needed) and
    /// leads from the first [`acquire`](crate::LeaderElector::acquire) until
    /// [`shutdown`](crate::LeaderElector::shutdown), with the same types, so
    /// the application does not branch: guards and guarded streams never end
    /// but with [`Lost::Shutdown`](crate::Lost::Shutdown), `is_leader` is true
    /// until shutdown, `health_check` always passes, and the fencing token is
    /// 0. Never disable it where several replicas run: each would lead.
    /// <!-- upstream: omit -->
    /// That includes the old and the new replicas of a rolling update that
    /// switches it off (or on): the replica without the election leads beside
    /// the Lease's leader until the update is over. Switch it with the
    /// `Recreate` strategy, or by scaling to 0 first.
    /// <!-- upstream: end -->
    ///
    /// ```no_run
    /// # fn doc(client: kube_client::Client, leader_elect: bool) -> Result<(), kube_runtime_lease::ConfigError> {
    /// use kube_runtime_lease::{LeaderElector, LeaseConfig, unique_identity};
    ///
    /// let config = LeaseConfig::new("default", "my-controller", unique_identity()).enabled(leader_elect);
    /// let elector = LeaderElector::new(client, config)?;
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn enabled(mut self, enabled: bool) -> Self {
        self.enabled = enabled;
        self
    }

    /// The longest [`LeaderElector::shutdown`](crate::LeaderElector::shutdown)`(grace)`
    /// can take with these settings: what a pod's
    /// `terminationGracePeriodSeconds` must cover (with a margin for what
    /// the process does before and after it).
    ///
    /// It is the sum of what `shutdown` waits for, each step bounded:
    /// 1. `grace`, for the guarded work to finish;
    /// 2. a campaign attempt in flight when the shutdown began: a read and a
    ///    write (a write answered with a conflict is followed by a read
    ///    within the same bound), each bounded by the renew deadline; or a
    ///    renewal in flight, bounded by less;
    /// 3. the release, bounded by the release timeout;
    /// 4. one retry period, for the election task to see the shutdown and end;
    /// 5. with Coordinated Leader Election, the deletion of the
    ///    `LeaseCandidate` (10 s at most).
    ///
    /// `shutdown` waits exactly this long in all before it reports
    /// [`ShutdownError::TaskDidNotEnd`](crate::ShutdownError::TaskDidNotEnd).
    /// With client-go's defaults and a 20 s grace it is 47 s (57 s
    /// coordinated); Kubernetes' default termination grace is 30 s.
    ///
    /// ```
    /// use std::time::Duration;
    /// use kube_runtime_lease::LeaseConfig;
    ///
    /// let config = LeaseConfig::new("default", "my-controller", "pod-a_1f3x");
    /// assert_eq!(config.shutdown_budget(Duration::from_secs(20)), Duration::from_secs(47));
    /// ```
    #[must_use]
    pub fn shutdown_budget(&self, grace: Duration) -> Duration {
        // The extras' part, waited like the grace: the `LeaseCandidate`'s
        // deletion (coordinated).
        let grace = grace.saturating_add(self.extras.shutdown_bound());
        grace
            .saturating_add(self.renew_deadline.saturating_mul(2))
            .saturating_add(self.release_timeout)
            .saturating_add(self.retry_period)
    }

    /// The span of every line about this election (`leader_election`, with
    /// the Lease's namespace and name and this candidate's identity), under
    /// `parent` (`None`: a root, for a task of its own). At ERROR level so
    /// that it is enabled whenever one of its lines is: at INFO, a filter
    /// at WARN (`RUST_LOG=warn`) dropped it, and with it the only names its
    /// warnings carried.
    pub(crate) fn span(&self, parent: Option<tracing::Id>) -> tracing::Span {
        tracing::error_span!(
            parent: parent,
            "leader_election",
            lease.namespace = %self.namespace,
            lease.name = %self.name,
            identity = %self.identity,
        )
    }

    /// Whether the election runs (see [`enabled`](Self::enabled)).
    #[must_use]
    pub fn is_enabled(&self) -> bool {
        self.enabled
    }

    /// The namespace of the Lease.
    #[must_use]
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The name of the Lease.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The identity this candidate campaigns as.
    #[must_use]
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// The lease duration in the API's whole seconds.
    pub(crate) fn lease_duration_seconds(&self) -> i32 {
        // validate() guarantees this fits.
        i32::try_from(self.lease_duration.as_secs()).unwrap_or(i32::MAX)
    }

    /// Checks every rule, in client-go's order, then the API server's.
    ///
    /// # Errors
    /// The first rule broken, as a [`ConfigError`] naming the field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.lease_duration <= self.renew_deadline {
            return Err(ConfigError::LeaseDurationNotGreaterThanRenewDeadline);
        }
        // client-go's arithmetic, `time.Duration(JitterFactor * float64(RetryPeriod))`:
        // whole nanoseconds (in seconds as `f64`, 1.2 × 3 s fell below 3.6 s).
        #[allow(
            clippy::cast_precision_loss,
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss
        )]
        let jittered = (JITTER_FACTOR * self.retry_period.as_nanos() as f64) as u128;
        if self.renew_deadline.as_nanos() <= jittered {
            return Err(ConfigError::RenewDeadlineNotGreaterThanJitteredRetryPeriod);
        }
        // Every duration but the lease duration: a zero one broke the first
        // rule already (`0 <= renew_deadline`), and its limit is its own
        // (whole `int32` seconds, below).
        let durations = [
            (Field::RenewDeadline, self.renew_deadline),
            (Field::RetryPeriod, self.retry_period),
            (Field::ReleaseTimeout, self.release_timeout),
        ];
        if let Some(&(field, _)) = durations.iter().find(|(_, value)| value.is_zero()) {
            return Err(ConfigError::NotPositive(field));
        }
        if let Some(&(field, value)) = durations.iter().find(|(_, value)| *value > MAX_DURATION) {
            let max = MAX_DURATION;
            return Err(ConfigError::TooLong { field, value, max });
        }
        if self.identity.is_empty() {
            return Err(ConfigError::EmptyIdentity);
        }
        if self.lease_duration.subsec_nanos() != 0 {
            return Err(ConfigError::LeaseDurationNotWholeSeconds(self.lease_duration));
        }
        if i32::try_from(self.lease_duration.as_secs()).is_err() {
            return Err(ConfigError::LeaseDurationTooLong(self.lease_duration));
        }
        names::check_lease(&self.namespace, &self.name)?;
        // A statement of its own: the upstream generator drops the extras' line.
        self.extras.validate(&self.identity)?;
        Ok(())
    }
}

/// The longest duration any setting may have: the API's limit on
/// `leaseDurationSeconds` (`int32` seconds, about 68 years). Every instant the
/// elector computes from a setting then stays far from overflow.
pub(crate) const MAX_DURATION: Duration = Duration::from_secs(i32::MAX as u64);

/// A candidate identity that is unique per process: the pod name with a random
/// suffix, `<pod>_<suffix>`.
///
/// The pod name comes from `POD_NAME` (set it from the downward API,
/// `fieldRef: metadata.name`), else `HOSTNAME`, else `"unknown"`. The suffix
/// keeps two processes in one pod, or a restarted container whose previous
/// instance still holds the Lease, from sharing an identity, which would let
/// both believe they lead.
#[must_use]
pub fn unique_identity() -> String {
    let pod = ["POD_NAME", "HOSTNAME"]
        .into_iter()
        .find_map(|var| std::env::var(var).ok().filter(|s| !s.is_empty()))
        .unwrap_or_else(|| "unknown".to_owned());
    // Eight base-26 digits of one random number, as letters.
    let suffix: String = std::iter::successors(Some(random_u64()), |bits| Some(bits / 26))
        .take(8)
        .map(|bits| char::from(b'a' + u8::try_from(bits % 26).unwrap_or(0)))
        .collect();
    format!("{pod}_{suffix}")
}

/// A random `u64`, for the identity's suffix and the retry jitter: a hash by
/// the standard library's randomly keyed hasher (its keys are drawn once per
/// thread and change with every `RandomState`), so that no random-number
/// crate is needed.
pub(crate) fn random_u64() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    // A simulated schedule draws from its seeded generator, so that its seed
    // replays the jitter too. (A statement of its own, with this comment: the
    // upstream generator drops both.)
    #[cfg(test)]
    if let Some(bits) = crate::tests::simulation::seeded_bits() {
        return bits;
    }
    RandomState::new().hash_one(std::time::SystemTime::now())
}

#[cfg(test)]
mod tests;
