//! [`Coordinated`]: the settings of Coordinated Leader Election (KEP-4355),
//! behind the `coordinated` feature.

use std::time::Duration;

use crate::config::LeaseConfig;

/// The bound of each request about the `LeaseCandidate` (its deletion when
/// the election task ends among them: part of
/// [`LeaseConfig::shutdown_budget`]).
pub(crate) const REQUEST_BOUND: Duration = Duration::from_secs(10);

/// Coordinated Leader Election: the API server picks the leader among the
/// candidates that publish a `coordination.k8s.io/v1beta1` `LeaseCandidate`
/// (client-go's `NewCandidate` with `LeaderElectionConfig.Coordinated`).
///
/// With [`LeaseConfig::coordinated`](crate::LeaseConfig::coordinated), the
/// elector:
/// - campaigns as `<identity>.<lease>` (what
///   [`LeaderElector::config`](crate::LeaderElector::config) then shows), the
///   name of the `LeaseCandidate` it publishes in the Lease's namespace for
///   the Lease: the API server writes the elected candidate's name as the
///   holder, so the name must be the identity, and with the Lease in it a
///   process with one identity and several Leases (two controllers under one
///   `unique_identity()`) has one candidate per Lease. (client-go's
///   components name theirs after the identity alone, with one Lease per
///   process.) A name over 253 characters is cut and given a stable hash. An
///   object of that name for another Lease (another process with the same
///   identity) is never adopted or deleted, and the candidate deletes only
///   the object it published;
/// - where the API server answers the `LeaseCandidate`'s creation 404 (the
///   `CoordinatedLeaderElection` feature gate is off, or the API server is
///   still starting, or one of an HA pair is older), runs the ordinary
///   election at once, with one warning, and publishes again with backoff
///   (10 s doubling to 5 min, across election tasks); once it is served,
///   the API server's election is in force from the next campaign, and a
///   term won by the ordinary election is renewed until the API server marks
///   its end (`preferredHolder`) or it is otherwise lost; and where it stops
///   serving it (the feature gate turned off again: nobody elects any more),
///   a publication answered 404 (the object gone, or a read or its watch
///   answered 404; at the latest its five-minute refresh) brings the
///   ordinary election back the same way;
/// - answers the API server's pings
///   (`spec.pingTime` newer than `spec.renewTime`) at once, from a watch of
///   that one object, once per ping, with a `renewTime` just after the
///   ping's when the API server's clock is ahead of ours by up to 5 s (its
///   election duration), since it counts only an answer after its ping; it also refreshes `renewTime` every five minutes, as
///   client-go's candidate does. While the Lease stays missing, free or
///   expired for 20 s (two of the API server's elections), it watches the
///   object anew (a watch that stalled misses pings; the re-list shows
///   one), then after 40 s, doubling up to five minutes. Where RBAC refuses
///   that watch (no `list`/`watch` on `leasecandidates`), it says so once
///   and reads the object every retry period instead, until the watch is
///   allowed, so that pings are still answered: the API server elects only
///   candidates that answered (a fresh one excepted);
/// - never creates the Lease and never takes it over: it leads when the API
///   server's election names it holder (a record written by the API server,
///   without `acquireTime`), and from then on renews it as in an ordinary
///   term. Its first write of a term sets `acquireTime` and increments
///   `leaseTransitions` (client-go's coordinated renewal does not), so that
///   [`fencing_token`](crate::LeaseGuard::fencing_token) still grows with
///   every term;
/// - ends its term when the API server marks `preferredHolder` for a better
///   candidate ([`Lost::SteppedDown`](crate::Lost::SteppedDown)), and
///   releases the Lease once its guarded work has stopped, so that the API
///   server hands it over at once instead of after its expiry. With its work
///   stopped rather than finished it does not release, and the API server
///   hands the Lease on when it expires; if nobody has taken it twice its
///   lease duration and 10 s after the mark (the preferred holder went away,
///   and the API server, electing this candidate again, writes nothing: it
///   gives an expired Lease to a new holder only), the candidate takes its
///   own record back, without the mark, so that the Lease does not stay
///   without a leader (client-go's coordinated candidate waits for ever);
/// - deletes its `LeaseCandidate` when its election task ends (shutdown, or
///   nobody wants leadership any more); client-go leaves it to the API
///   server's garbage collection (30 minutes).
///
/// When the API server does not serve `LeaseCandidate` (the
/// `CoordinatedLeaderElection` feature gate and `coordination.k8s.io/v1beta1`
/// are both off by default up to Kubernetes 1.37), creating it is answered
/// 404: the elector logs one warning and falls back to the ordinary election,
/// so that one binary runs on clusters with and without the gate.
/// [`LeaderStatus::coordinated`](crate::LeaderStatus::coordinated) says which
/// election is in force. The fallback needs that 404: an API server with the
/// gate off that still serves `coordination.k8s.io/v1beta1`
/// (`--runtime-config`) answers every call and elects nobody, so nobody
/// leads. Turn both off together, or the candidates' `coordinated` off.
///
/// The `LeaseCandidate` is named `<identity>.<lease name>`: an identity and a
/// Lease name that both contain dots can give two candidates the same name
/// (`pod.x` on Lease `y`, `pod` on Lease `x.y`), and the second is never
/// published. Keep dots out of identities (the defaults have none).
///
/// The API server's default strategy, `OldestEmulationVersion`, elects the
/// candidate with the lowest emulation version, then the lowest binary
/// version, then the oldest `LeaseCandidate`: during a rolling upgrade,
/// leadership stays with the old binary until the last old replica is gone.
/// The API server writes the Lease with a 5 s lease duration and checks again
/// every 5 s; [`LeaseConfig::retry_period`](crate::LeaseConfig::retry_period)
/// must be short enough (client-go's 2 s is) for the elected candidate to
/// renew within those 5 s.
///
/// The API server judges expiry by `renewTime` on its own clock, not by an
/// observed change as candidates do: a candidate whose wall clock lags the
/// API server's by more than `lease_duration - renew_deadline` may be replaced
/// while it still leads. Keep node clocks synchronised (NTP), as for
/// client-go's coordinated mode.
///
/// ```
/// use kube_runtime_lease::{LeaseConfig, coordinated::Coordinated};
///
/// let config = LeaseConfig::new("default", "my-controller", "pod-a")
///     .coordinated(Coordinated::new("1.37.0").emulation_version("1.36.0"));
/// assert!(config.validate().is_ok());
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Coordinated {
    pub(crate) binary_version: String,
    pub(crate) emulation_version: String,
    pub(crate) strategy: String,
}

/// The API server's default strategy.
pub(crate) const OLDEST_EMULATION_VERSION: &str = "OldestEmulationVersion";

impl LeaseConfig {
    /// Coordinated Leader Election: publish a `LeaseCandidate` and lead only
    /// when the API server's election names this candidate (see
    /// [`Coordinated`]). Off by default.
    #[must_use]
    pub fn coordinated(mut self, coordinated: Coordinated) -> Self {
        self.extras.coordinated = Some(coordinated);
        self
    }
}

impl Coordinated {
    /// A candidate of binary version `binary_version` (strict semantic
    /// version, `"1.37.0"`: the API server refuses `"1.37"` and `"v1.37.0"`),
    /// emulating the same version, offering the `OldestEmulationVersion`
    /// strategy.
    #[must_use]
    pub fn new(binary_version: impl Into<String>) -> Self {
        let binary_version = binary_version.into();
        Coordinated {
            emulation_version: binary_version.clone(),
            binary_version,
            strategy: OLDEST_EMULATION_VERSION.to_owned(),
        }
    }

    /// The emulation version (strict semantic version, at most the binary
    /// version): what `OldestEmulationVersion` orders candidates by.
    #[must_use]
    pub fn emulation_version(mut self, version: impl Into<String>) -> Self {
        self.emulation_version = version.into();
        self
    }

    /// The strategy offered: `OldestEmulationVersion` (the default, and the
    /// only one the API server implements), or a third-party strategy, a
    /// qualified name such as `example.com/my-strategy`. (`v1beta1` carries
    /// one strategy per candidate; `v1alpha1`'s list is gone.) Give every
    /// candidate of a Lease the same strategy, across a rollout too: the API
    /// server picks the strategy of the candidates with the newest binary
    /// version, and when those disagree it elects nobody (its log says
    /// why; a candidate cannot see it without listing the others).
    #[must_use]
    pub fn strategy(mut self, strategy: impl Into<String>) -> Self {
        self.strategy = strategy.into();
        self
    }

    /// The first rule broken, as `(field, value, rule)`.
    pub(crate) fn check(&self, identity: &str) -> Option<(&'static str, String, &'static str)> {
        let Some(binary) = semver(&self.binary_version) else {
            return Some((
                "binaryVersion",
                self.binary_version.clone(),
                "must be a semantic version MAJOR.MINOR.PATCH, such as 1.37.0",
            ));
        };
        let Some(emulation) = semver(&self.emulation_version) else {
            return Some((
                "emulationVersion",
                self.emulation_version.clone(),
                "must be a semantic version MAJOR.MINOR.PATCH, such as 1.36.0",
            ));
        };
        // Semantic versioning's precedence, pre-release included, as the API
        // server compares them.
        let newer = match emulation.cmp(&binary) {
            std::cmp::Ordering::Equal => pre_release_precedes(&self.binary_version, &self.emulation_version),
            order => order.is_gt(),
        };
        if newer {
            return Some((
                "emulationVersion",
                self.emulation_version.clone(),
                "must not be newer than the binary version",
            ));
        }
        if self.strategy == OLDEST_EMULATION_VERSION {
            if emulation == (0, 0, 0) && pre_release(&self.emulation_version).is_none() {
                return Some((
                    "emulationVersion",
                    self.emulation_version.clone(),
                    "must not be 0.0.0 with the strategy OldestEmulationVersion (the API server takes it for none)",
                ));
            }
        } else if !prefixed_name(&self.strategy) {
            return Some((
                "strategy",
                self.strategy.clone(),
                "must be OldestEmulationVersion or a qualified name with a prefix, <DNS subdomain>/<name> \
                 (example.com/name)",
            ));
        }
        // The LeaseCandidate is named `<identity>.<lease>`: a ConfigMap key,
        // which must not be `.` or `..` or start with `..`.
        if identity.len() > 253
            || identity == "."
            || identity.starts_with("..")
            || !identity
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))
        {
            return Some((
                "identity",
                identity.to_owned(),
                "names the LeaseCandidate: at most 253 of [-._a-zA-Z0-9], not . and not starting with ..",
            ));
        }
        None
    }
}

/// Whether `s` is a qualified name with a prefix, `<prefix>/<name>`, as the
/// API server checks a strategy that is not its own: the prefix a DNS-1123
/// subdomain, the name at most 63 characters, alphanumeric at both ends,
/// with `-`, `_` and `.` inside.
fn prefixed_name(s: &str) -> bool {
    let Some((prefix, name)) = s.split_once('/') else {
        return false;
    };
    let b = name.as_bytes();
    crate::config::names::dns1123_subdomain(prefix).is_none()
        && !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
}

/// The pre-release of the version `v` (after the first `-` of what precedes
/// any `+`), if it has one.
fn pre_release(v: &str) -> Option<&str> {
    v.split('+').next()?.split_once('-').map(|(_, pre)| pre)
}

/// Whether the version `a` precedes `b`, both valid with the same
/// `MAJOR.MINOR.PATCH`: by their pre-releases, as semantic versioning orders
/// them (none after any; identifiers in turn, numbers by value and before
/// words; more identifiers after fewer).
fn pre_release_precedes(a: &str, b: &str) -> bool {
    match (pre_release(a), pre_release(b)) {
        (None, _) => false,
        (Some(_), None) => true,
        (Some(a), Some(b)) => {
            let key = |id: &str| match id.parse::<u64>() {
                Ok(n) if id.bytes().all(|c| c.is_ascii_digit()) => (0, n, String::new()),
                _ => (1, 0, id.to_owned()),
            };
            a.split('.').map(key).lt(b.split('.').map(key))
        }
    }
}

/// `MAJOR.MINOR.PATCH[-pre][+build]` as numbers, or `None` unless it is a
/// strict semantic version, pre-release and build included (as the API
/// server parses a `LeaseCandidate`'s versions).
fn semver(v: &str) -> Option<(u64, u64, u64)> {
    let (rest, build) = match v.split_once('+') {
        Some((rest, build)) => (rest, Some(build)),
        None => (v, None),
    };
    let (core, pre) = match rest.split_once('-') {
        Some((core, pre)) => (core, Some(pre)),
        None => (rest, None),
    };
    let identifier = |id: &str| !id.is_empty() && id.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-');
    if let Some(pre) = pre {
        let numeric_ok = |id: &str| {
            !id.bytes().all(|c| c.is_ascii_digit())
                || ((id.len() == 1 || !id.starts_with('0')) && id.parse::<u64>().is_ok())
        };
        if !pre.split('.').all(|id| identifier(id) && numeric_ok(id)) {
            return None;
        }
    }
    if build.is_some_and(|build| !build.split('.').all(identifier)) {
        return None;
    }
    let mut parts = core.split('.');
    let mut num = || -> Option<u64> {
        let p = parts.next()?;
        // No leading zeros, digits only (semver's rule).
        if p.is_empty() || (p.len() > 1 && p.starts_with('0')) || !p.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        p.parse().ok()
    };
    let version = (num()?, num()?, num()?);
    parts.next().is_none().then_some(version)
}

#[cfg(test)]
mod tests;
