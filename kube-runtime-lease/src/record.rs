//! Pure record logic: what to write on acquire, renew and release, and when an
//! observed record has expired. No I/O here; everything is tested exhaustively.

use std::time::Duration;

use k8s_openapi::{
    api::coordination::v1::LeaseSpec, apimachinery::pkg::apis::meta::v1::MicroTime, jiff::Timestamp,
};
use tokio::time::Instant;

/// The holder named by a record, `None` when the Lease is free (no holder, or `""`).
pub(crate) fn holder(spec: &LeaseSpec) -> Option<&str> {
    spec.holder_identity.as_deref().filter(|h| !h.is_empty())
}

/// The preferred holder named by a record, if any (Coordinated Leader Election).
pub(crate) fn preferred_holder(spec: &LeaseSpec) -> Option<&str> {
    spec.preferred_holder.as_deref().filter(|h| !h.is_empty())
}

/// The record's lease duration. A missing, zero or negative value falls back to
/// this candidate's own configured duration: treating it as zero (as client-go
/// does) would let anyone take over a held Lease at once.
pub(crate) fn lease_duration(spec: &LeaseSpec, fallback: Duration) -> Duration {
    match spec.lease_duration_seconds {
        Some(s) if s > 0 => Duration::from_secs(s.unsigned_abs().into()),
        _ => fallback,
    }
}

/// The record written when `identity` takes or keeps the Lease whose current
/// record is `prev` (`None` when the Lease does not exist yet).
///
/// As client-go: a change of holder sets `acquireTime = renewTime = now` and
/// increments `leaseTransitions`; a renewal by the same holder keeps both and
/// only moves `renewTime`. Every other field (`strategy`, `preferredHolder`) is
/// carried over untouched.
pub(crate) fn acquired(
    prev: Option<&LeaseSpec>,
    identity: &str,
    duration_seconds: i32,
    now: Timestamp,
) -> LeaseSpec {
    let mut next = prev.cloned().unwrap_or_default();
    let keep = prev.is_some_and(|p| p.holder_identity.as_deref() == Some(identity));
    if !keep {
        next.acquire_time = Some(MicroTime(now));
        next.lease_transitions = match prev {
            None => Some(0),
            Some(p) => Some(p.lease_transitions.unwrap_or(0).saturating_add(1)),
        };
    }
    next.holder_identity = Some(identity.to_owned());
    next.lease_duration_seconds = Some(duration_seconds);
    next.renew_time = Some(MicroTime(now));
    next
}

/// The record written to release a Lease held by us: holder `""`, a 1 s
/// duration (the API rejects 0), `acquireTime = renewTime = now`, transitions
/// and every other field unchanged.
pub(crate) fn released(prev: &LeaseSpec, now: Timestamp) -> LeaseSpec {
    let mut next = prev.clone();
    next.holder_identity = Some(String::new());
    next.lease_duration_seconds = Some(1);
    next.acquire_time = Some(MicroTime(now));
    next.renew_time = Some(MicroTime(now));
    next
}

/// The last record seen, and the local monotonic instant at which it was first
/// seen unchanged. Expiry is judged from this alone, never from `renewTime`, so
/// that clock offsets between nodes do not matter.
#[derive(Clone, Debug)]
pub(crate) struct Observed {
    pub(crate) spec: LeaseSpec,
    pub(crate) resource_version: Option<String>,
    pub(crate) at: Instant,
}

impl Observed {
    /// Records `spec` as seen at `now`. The clock restarts only when the record
    /// changed: a record seen again does not extend its own lifetime, and one seen
    /// late only makes expiry later.
    pub(crate) fn observe(
        prev: Option<Self>,
        spec: LeaseSpec,
        resource_version: Option<String>,
        now: Instant,
    ) -> Self {
        match prev {
            Some(p) if p.spec == spec => Observed {
                resource_version: resource_version.or(p.resource_version),
                ..p
            },
            _ => Observed {
                spec,
                resource_version,
                at: now,
            },
        }
    }
}

/// What a candidate that does not lead should do about the record it observed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Take it: free, expired, or already ours.
    Take,
    /// Wait: held by someone else (or reserved for a preferred holder) until the instant given.
    WaitUntil(Instant),
}

/// Decides whether `identity` may take the observed record at `now`.
///
/// A free Lease whose `preferredHolder` names another candidate is treated as
/// held by that candidate: it is given one lease duration to take it. A record
/// naming us is ours to renew at once only if `ours_known`: it is the Lease
/// object (same `uid`) of a term we led. Otherwise it was written by a request
/// of ours that we gave up on (a create that timed out, say), possibly on a
/// Lease just re-created while the leader of the deleted one still acts, and it
/// is treated like anyone else's record.
pub(crate) fn verdict(
    observed: &Observed,
    identity: &str,
    ours_known: bool,
    fallback: Duration,
    now: Instant,
) -> Verdict {
    let spec = &observed.spec;
    let expiry = || {
        let until = observed.at + lease_duration(spec, fallback);
        if now >= until {
            Verdict::Take
        } else {
            Verdict::WaitUntil(until)
        }
    };
    match (holder(spec), preferred_holder(spec)) {
        // Free, and reserved for nobody or for us.
        (None, None) => Verdict::Take,
        (None, Some(p)) if p == identity => Verdict::Take,
        // Ours, on a Lease object we led on.
        (Some(h), _) if h == identity && ours_known => Verdict::Take,
        // Held by someone else, reserved for someone else, or ours of unknown provenance.
        _ => expiry(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ME: &str = "me";
    const FALLBACK: Duration = Duration::from_secs(15);

    fn t(secs: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + secs).unwrap()
    }

    fn spec(holder: Option<&str>, transitions: Option<i32>, duration: Option<i32>) -> LeaseSpec {
        LeaseSpec {
            holder_identity: holder.map(str::to_owned),
            lease_transitions: transitions,
            lease_duration_seconds: duration,
            acquire_time: Some(MicroTime(t(-100))),
            renew_time: Some(MicroTime(t(-10))),
            strategy: Some("OldestEmulationVersion".into()),
            preferred_holder: Some("pref".into()),
        }
    }

    #[test]
    fn acquire_and_renew_follow_client_go_for_every_previous_record() {
        let holders = [None, Some(""), Some(ME), Some("other")];
        let transitions = [None, Some(0), Some(7), Some(i32::MAX)];
        let durations = [None, Some(0), Some(-3), Some(1), Some(15)];
        for h in holders {
            for tr in transitions {
                for d in durations {
                    let prev = spec(h, tr, d);
                    let next = acquired(Some(&prev), ME, 30, t(0));
                    assert_eq!(next.holder_identity.as_deref(), Some(ME));
                    assert_eq!(next.lease_duration_seconds, Some(30));
                    assert_eq!(next.renew_time, Some(MicroTime(t(0))));
                    assert_eq!(next.strategy, prev.strategy, "strategy kept");
                    assert_eq!(
                        next.preferred_holder, prev.preferred_holder,
                        "preferredHolder kept"
                    );
                    if h == Some(ME) {
                        assert_eq!(next.acquire_time, prev.acquire_time, "renewal keeps acquireTime");
                        assert_eq!(
                            next.lease_transitions, prev.lease_transitions,
                            "renewal keeps transitions"
                        );
                    } else {
                        assert_eq!(next.acquire_time, Some(MicroTime(t(0))));
                        let expected = tr.unwrap_or(0).saturating_add(1);
                        assert_eq!(next.lease_transitions, Some(expected), "{h:?} {tr:?}");
                    }
                    let rel = released(&next, t(5));
                    assert_eq!(rel.holder_identity.as_deref(), Some(""));
                    assert_eq!(rel.lease_duration_seconds, Some(1));
                    assert_eq!(rel.acquire_time, Some(MicroTime(t(5))));
                    assert_eq!(rel.renew_time, Some(MicroTime(t(5))));
                    assert_eq!(rel.lease_transitions, next.lease_transitions);
                    assert_eq!(rel.strategy, prev.strategy);
                    assert_eq!(rel.preferred_holder, prev.preferred_holder);
                    assert_eq!(holder(&rel), None);
                }
            }
        }
    }

    #[test]
    fn create_starts_transitions_at_zero() {
        let next = acquired(None, ME, 15, t(0));
        assert_eq!(next.lease_transitions, Some(0));
        assert_eq!(next.acquire_time, Some(MicroTime(t(0))));
        assert_eq!(next.strategy, None);
        assert_eq!(next.preferred_holder, None);
    }

    #[test]
    fn a_spec_with_nothing_in_it_is_free() {
        let empty = LeaseSpec::default();
        assert_eq!(holder(&empty), None);
        assert_eq!(lease_duration(&empty, FALLBACK), FALLBACK);
        let next = acquired(Some(&empty), ME, 15, t(0));
        assert_eq!(next.lease_transitions, Some(1));
    }

    #[test]
    fn invalid_durations_fall_back_to_our_own() {
        for (d, want) in [
            (None, FALLBACK),
            (Some(0), FALLBACK),
            (Some(-1), FALLBACK),
            (Some(i32::MIN), FALLBACK),
            (Some(1), Duration::from_secs(1)),
            (Some(i32::MAX), Duration::from_secs(i32::MAX as u64)),
        ] {
            assert_eq!(lease_duration(&spec(Some("x"), None, d), FALLBACK), want, "{d:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn expiry_counts_from_the_first_sight_of_an_unchanged_record() {
        let start = Instant::now();
        let rec = spec(Some("other"), Some(1), Some(10));
        let o = Observed::observe(None, rec.clone(), Some("1".into()), start);
        let later = start + Duration::from_secs(4);
        // Seen again, unchanged: the clock does not restart.
        let o = Observed::observe(Some(o), rec.clone(), Some("1".into()), later);
        assert_eq!(o.at, start);
        for (dt, want) in [(0, false), (9, false), (10, true), (11, true)] {
            let now = start + Duration::from_secs(dt);
            let v = verdict(&o, ME, true, FALLBACK, now);
            assert_eq!(v == Verdict::Take, want, "after {dt}s");
            if !want {
                assert_eq!(v, Verdict::WaitUntil(start + Duration::from_secs(10)));
            }
        }
        // A changed record (a renewal) restarts the clock, even when seen late.
        let mut renewed = rec;
        renewed.renew_time = Some(MicroTime(t(100)));
        let o = Observed::observe(Some(o), renewed, Some("2".into()), later);
        assert_eq!(o.at, later);
        assert_eq!(
            verdict(&o, ME, true, FALLBACK, start + Duration::from_secs(10)),
            Verdict::WaitUntil(later + Duration::from_secs(10))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn free_ours_and_preferred_verdicts() {
        let now = Instant::now();
        let mut free = spec(Some(""), None, Some(1));
        free.preferred_holder = None;
        let o = Observed::observe(None, free.clone(), None, now);
        assert_eq!(verdict(&o, ME, true, FALLBACK, now), Verdict::Take);
        let mut none = free.clone();
        none.holder_identity = None;
        assert_eq!(
            verdict(&Observed::observe(None, none, None, now), ME, true, FALLBACK, now),
            Verdict::Take
        );
        let ours = spec(Some(ME), None, Some(10));
        let o = Observed::observe(None, ours, None, now);
        assert_eq!(verdict(&o, ME, true, FALLBACK, now), Verdict::Take);
        assert_eq!(
            verdict(&o, ME, false, FALLBACK, now),
            Verdict::WaitUntil(now + Duration::from_secs(10)),
            "ours, unknown object"
        );
        // Free, but reserved for a preferred holder: wait one record duration.
        let mut reserved = free;
        reserved.preferred_holder = Some("pref".into());
        reserved.lease_duration_seconds = Some(3);
        let o = Observed::observe(None, reserved.clone(), None, now);
        assert_eq!(
            verdict(&o, ME, true, FALLBACK, now),
            Verdict::WaitUntil(now + Duration::from_secs(3))
        );
        assert_eq!(
            verdict(&o, ME, true, FALLBACK, now + Duration::from_secs(3)),
            Verdict::Take
        );
        assert_eq!(verdict(&o, "pref", true, FALLBACK, now), Verdict::Take);
        assert_eq!(
            verdict(&o, "pref", false, FALLBACK, now),
            Verdict::Take,
            "a free lease reserved for us, at once"
        );
        // Held by the preferred holder itself, someone else waits as usual.
        let mut held = reserved.clone();
        held.holder_identity = Some("pref".into());
        let o = Observed::observe(None, held, None, now);
        assert_eq!(
            verdict(&o, ME, true, FALLBACK, now),
            Verdict::WaitUntil(now + Duration::from_secs(3))
        );
        // Missing duration on a held record: our own duration, never zero.
        let o = Observed::observe(None, spec(Some("other"), None, None), None, now);
        assert_eq!(
            verdict(&o, ME, true, FALLBACK, now + Duration::from_secs(14)),
            Verdict::WaitUntil(now + FALLBACK)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn observe_keeps_the_newest_resource_version() {
        let now = Instant::now();
        let rec = spec(Some("x"), None, Some(5));
        let o = Observed::observe(None, rec.clone(), Some("5".into()), now);
        let o = Observed::observe(Some(o), rec, None, now);
        assert_eq!(o.resource_version.as_deref(), Some("5"));
    }
}
