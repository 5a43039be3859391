//! The rules of the Lease record: what to write to take, renew and release a Lease, and when
//! another candidate's record may be taken over. No I/O here.

use std::time::Duration;

use k8s_openapi::{
    api::coordination::v1::LeaseSpec,
    apimachinery::pkg::apis::meta::v1::MicroTime,
    jiff::{SignedDuration, Timestamp},
};
use tokio::time::Instant;

/// The holder named by a record, `None` when the Lease is free (no holder, or `""`).
pub(crate) fn holder(spec: &LeaseSpec) -> Option<&str> {
    spec.holder_identity.as_deref().filter(|h| !h.is_empty())
}

/// The record's lease duration. A missing, zero or negative value falls back to this
/// candidate's own: reading it as zero (as client-go does) would let anyone take a held Lease.
pub(crate) fn lease_duration(spec: &LeaseSpec, fallback: Duration) -> Duration {
    match spec.lease_duration_seconds {
        Some(s) if s > 0 => Duration::from_secs(s.unsigned_abs().into()),
        _ => fallback,
    }
}

/// Now, to the microsecond: what the API stores of a `MicroTime`.
pub(crate) fn now() -> Timestamp {
    let now = Timestamp::now();
    Timestamp::from_microsecond(now.as_microsecond()).unwrap_or(now)
}

/// The record written when `identity` begins a term on a Lease whose record is `prev` (`None`
/// when it does not exist yet): `acquireTime = renewTime = now`, `leaseTransitions =
/// transitions`. Every other field (`strategy`, `preferredHolder`) is carried over.
pub(crate) fn taken(
    prev: Option<&LeaseSpec>,
    identity: &str,
    duration_seconds: i32,
    transitions: i32,
    now: Timestamp,
) -> LeaseSpec {
    let mut next = prev.cloned().unwrap_or_default();
    next.holder_identity = Some(identity.to_owned());
    next.lease_duration_seconds = Some(duration_seconds);
    next.acquire_time = Some(MicroTime(now));
    next.renew_time = Some(MicroTime(now));
    next.lease_transitions = Some(transitions);
    next
}

/// The record written to renew our term: only `renewTime` (and the duration) move. `renewTime`
/// moves forward by at least a microsecond, so that a renewal always changes the record that
/// the other candidates time.
pub(crate) fn renewed(prev: &LeaseSpec, duration_seconds: i32, now: Timestamp) -> LeaseSpec {
    let mut next = prev.clone();
    next.lease_duration_seconds = Some(duration_seconds);
    let after_prev = prev
        .renew_time
        .as_ref()
        .and_then(|MicroTime(t)| t.checked_add(SignedDuration::from_micros(1)).ok());
    next.renew_time = Some(MicroTime(after_prev.map_or(now, |p| p.max(now))));
    next
}

/// The record written to release a Lease held by us (client-go's `ReleaseOnCancel`): holder
/// `""`, a 1 s duration (the API rejects 0), `acquireTime = renewTime = now`, the rest kept.
pub(crate) fn released(prev: &LeaseSpec, now: Timestamp) -> LeaseSpec {
    let mut next = prev.clone();
    next.holder_identity = Some(String::new());
    next.lease_duration_seconds = Some(1);
    next.acquire_time = Some(MicroTime(now));
    next.renew_time = Some(MicroTime(now));
    next
}

/// The last record seen, and the local monotonic instant at which it was first seen unchanged.
/// Expiry is judged from this alone, never from `renewTime`, so that clock offsets between
/// nodes do not matter.
#[derive(Clone, Debug)]
pub(crate) struct Observed {
    pub(crate) spec: LeaseSpec,
    pub(crate) at: Instant,
}

/// What a candidate that does not lead should do about the record it observed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Take it: free, ours, or expired.
    Take,
    /// Held by another candidate: it expires at the instant given, unless it changes.
    WaitUntil(Instant),
}

impl Observed {
    /// Records `spec` as seen at `now`. The clock restarts only when the record changed: a
    /// record seen again does not extend its own lifetime.
    pub(crate) fn update(prev: Option<Self>, spec: LeaseSpec, now: Instant) -> Self {
        match prev {
            Some(prev) if prev.spec == spec => prev,
            _ => Observed { spec, at: now },
        }
    }

    /// Whether `identity` may take this record at `now`: at once when it is free or names
    /// `identity`; otherwise once it has been seen unchanged for its lease duration.
    pub(crate) fn verdict(&self, identity: &str, fallback: Duration, now: Instant) -> Verdict {
        match holder(&self.spec) {
            None => Verdict::Take,
            Some(h) if h == identity => Verdict::Take,
            Some(_) => {
                let until = self.at + lease_duration(&self.spec, fallback);
                if now >= until {
                    Verdict::Take
                } else {
                    Verdict::WaitUntil(until)
                }
            }
        }
    }
}

#[cfg(test)] mod tests;
