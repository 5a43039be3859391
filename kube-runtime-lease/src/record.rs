//! Pure record logic: what to write on acquire, renew and release, and when an
//! observed record has expired. No I/O here; everything is tested exhaustively.

use std::{collections::BTreeMap, time::Duration};

use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
    jiff::{SignedDuration, Timestamp},
};
use serde::{Deserialize, Deserializer, Serialize, de::Error as _};
use serde_json::Value;
use tokio::time::Instant;

/// A Lease as the API server serves it, read leniently: a time past the last
/// instant a `MicroTime` holds (jiff's `Timestamp` ends at 9999-12-30T22:00Z;
/// Go's time, and so the API server and client-go, at the end of 9999, where
/// a "never expires" sentinel such as `9999-12-31T23:59:59Z` lies) reads as
/// [`Timestamp::MAX`]. A record is judged by when it last changed, as
/// client-go judges it, never by its times against a clock; the strict
/// decoding failed every read of such a Lease, and its holder kept it for good.
#[derive(Clone, Debug, Serialize)]
#[serde(transparent)]
pub(crate) struct Wire(pub(crate) Lease);

impl<'de> Deserialize<'de> for Wire {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let mut lease = Value::deserialize(deserializer)?;
        if let Some(spec) = lease.get_mut("spec").and_then(Value::as_object_mut) {
            for field in ["acquireTime", "renewTime"] {
                if let Some(Value::String(time)) = spec.get_mut(field)
                    && time.parse::<Timestamp>().is_err()
                {
                    *time = Timestamp::MAX.to_string();
                }
            }
        }
        Lease::deserialize(lease).map(Wire).map_err(D::Error::custom)
    }
}

impl Wire {
    /// The Lease, if it is the Lease `name` as the API server writes it (a
    /// name and a resourceVersion): a `2xx` of something in front of the
    /// API server (`{}`, another object) is an error, not the Lease.
    pub(crate) fn answer_for(self, name: &str) -> kube_client::Result<Wire> {
        let meta = &self.0.metadata;
        if meta.name.as_deref() == Some(name) && meta.resource_version.is_some() {
            return Ok(self);
        }
        let (named, version) = (&meta.name, &meta.resource_version);
        let why = format!("the answer is not lease {name:?} (name {named:?}, resourceVersion {version:?})");
        Err(kube_client::Error::SerdeError(serde::de::Error::custom(why)))
    }
}

impl k8s_openapi::Resource for Wire {
    const API_VERSION: &'static str = Lease::API_VERSION;
    const GROUP: &'static str = Lease::GROUP;
    const KIND: &'static str = Lease::KIND;
    const VERSION: &'static str = Lease::VERSION;
    const URL_PATH_SEGMENT: &'static str = Lease::URL_PATH_SEGMENT;
    type Scope = <Lease as k8s_openapi::Resource>::Scope;
}

impl k8s_openapi::Metadata for Wire {
    type Ty = ObjectMeta;

    fn metadata(&self) -> &ObjectMeta {
        &self.0.metadata
    }

    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.0.metadata
    }
}

/// The API server's limit on an object's annotations, keys and values
/// together, in bytes (`TotalAnnotationSizeLimitB`).
pub(crate) const MAX_ANNOTATIONS_SIZE: usize = 256 * 1024;

/// The size of `annotations` as the API server counts it against
/// [`MAX_ANNOTATIONS_SIZE`].
pub(crate) fn annotations_size(annotations: Option<&BTreeMap<String, String>>) -> usize {
    annotations.map_or(0, |a| a.iter().map(|(k, v)| k.len() + v.len()).sum())
}

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
    spec.lease_duration_seconds
        .filter(|s| *s > 0)
        .map_or(fallback, |s| Duration::from_secs(s.unsigned_abs().into()))
}

/// Now, to the microsecond: what the API stores of a `MicroTime`, so that a
/// record we send compares equal, field by field, to the one read back.
pub(crate) fn now() -> Timestamp {
    let now = Timestamp::now();
    Timestamp::from_microsecond(now.as_microsecond()).unwrap_or(now)
}

/// The record written when `identity` begins a term on the Lease whose
/// current record is `prev` (`None` when the Lease does not exist yet):
/// `acquireTime = renewTime = now`, `leaseTransitions = transitions`.
///
/// Every term is a new acquisition, even one that takes over a record naming
/// `identity` (another process with the same identity, or a term of ours
/// given up): its `acquireTime` and `leaseTransitions` tell the term apart
/// from every other (see [`TermId`]), and the fencing token grows. Every other
/// field (`strategy`, `preferredHolder`) is carried over untouched.
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

/// The record written to renew our own term: only `renewTime` (and the
/// duration) move, as client-go's renewal.
///
/// `renewTime` always moves forward: with a wall clock that stands still
/// (frozen, coarse, or stepped back), a renewal that wrote the same record
/// would be no change to a follower, which judges expiry by when it last saw
/// the record change, and could take the Lease while this term's guards are
/// valid. A client-go follower compares records with their times in whole
/// seconds, so with the clock at or behind the last `renewTime`, the renewal
/// writes that `renewTime` plus `step` (the retry period, at most a second,
/// at least a microsecond): each renewal, or at least one a second, is a
/// change to every follower, and `renewTime` catches up with the clock (or,
/// with a retry period under a second, stays ahead by the step back).
pub(crate) fn renewed(prev: &LeaseSpec, duration_seconds: i32, now: Timestamp, step: Duration) -> LeaseSpec {
    let mut next = prev.clone();
    next.lease_duration_seconds = Some(duration_seconds);
    let micros = step.min(Duration::from_secs(1)).as_micros().max(1);
    let step = SignedDuration::from_micros(i64::try_from(micros).unwrap_or(1));
    let after_prev = prev
        .renew_time
        .as_ref()
        .filter(|MicroTime(t)| now <= *t)
        .and_then(|MicroTime(t)| t.checked_add(step).ok());
    next.renew_time = Some(MicroTime(after_prev.unwrap_or(now)));
    next
}

/// Whether `read` is exactly the record `sent` (holder, times, transitions,
/// duration):
/// a write of ours that was applied although its answer said otherwise.
pub(crate) fn same_write(read: &LeaseSpec, sent: &LeaseSpec) -> bool {
    read.holder_identity == sent.holder_identity
        && read.acquire_time == sent.acquire_time
        && read.renew_time == sent.renew_time
        && read.lease_transitions == sent.lease_transitions
        && read.lease_duration_seconds == sent.lease_duration_seconds
}

/// The annotation in which every term of ours stores its fencing token on
/// the Lease (see [`token_of`]). Renewals and releases keep it, as they keep
/// all metadata; client-go's candidates keep it too (they update the object
/// they read).
pub(crate) const TOKEN_ANNOTATION: &str = "leases.kube.rs/fencing-token";

/// The fencing token of the term that wrote `lease`'s record, as far as the
/// record tells: its [`TOKEN_ANNOTATION`] or its `leaseTransitions`, whichever
/// is larger (a term of another implementation moves only the transitions).
///
/// `leaseTransitions` alone cannot carry the token: it stops at `i32::MAX`
/// (where every fresh process would read the same number and hand out the
/// same token), and an edit can move it down. The annotation goes on past
/// both. A value that is not a number is ignored, and so is one from which
/// tokens could not go on growing ([`MAX_TOKEN`] or more: no run of terms
/// reaches it, so it was written by something else, and honouring it would
/// make every later token the same).
pub(crate) fn token_of(lease: &Lease) -> i64 {
    let stored = lease
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(TOKEN_ANNOTATION))
        .and_then(|v| v.parse::<i64>().ok())
        .filter(|t| *t < MAX_TOKEN);
    let transitions = lease.spec.as_ref().and_then(|s| s.lease_transitions);
    stored.max(transitions.map(i64::from)).unwrap_or(0)
}

/// The first fencing token [`token_of`] does not believe: 2^62.
pub(crate) const MAX_TOKEN: i64 = 1 << 62;

/// Stores `token` in `lease`'s [`TOKEN_ANNOTATION`].
pub(crate) fn set_token(lease: &mut Lease, token: i64) {
    lease
        .metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(TOKEN_ANNOTATION.to_owned(), token.to_string());
}

/// Where a term of a holder is: the Lease object and the holder.
///
/// The same identity on the same object is not enough for a record to be
/// "ours": another process with the same identity (a duplicate, or our own
/// earlier process) may have written it. What tells our writes apart is
/// their `renewTime` (`Memory::is_last_term`): every write of another
/// process carries its own. `acquireTime` and `leaseTransitions` do not: a
/// client-go process with our identity renews our record keeping both, and
/// an edit by a third party (`kubectl edit`) may change them on a record
/// that is still our own write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TermId {
    uid: Option<String>,
    holder: String,
}

impl TermId {
    /// The term a Lease object's record belongs to; `None` when it is free.
    pub(crate) fn of(lease: &Lease) -> Option<Self> {
        let spec = lease.spec.as_ref()?;
        Some(TermId {
            uid: lease.metadata.uid.clone(),
            holder: holder(spec)?.to_owned(),
        })
    }

    /// Whether `lease` holds a record of this term.
    pub(crate) fn matches(&self, lease: &Lease) -> bool {
        TermId::of(lease).is_some_and(|t| t == *self)
    }
}

/// The record written to release a Lease held by us: holder `""`, a 1 s
/// duration (the API rejects 0), `acquireTime = renewTime = now`, transitions
/// and every other field unchanged.
pub(crate) fn released(prev: &LeaseSpec, now: Timestamp) -> LeaseSpec {
    let mut next = taken(Some(prev), "", 1, 0, now);
    next.lease_transitions = prev.lease_transitions;
    next
}

/// What a candidate that does not lead should do about the record it observed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Take it: free, expired, or already ours.
    Take,
    /// Wait: held by someone else (or reserved for a preferred holder) until the instant given.
    WaitUntil(Instant),
}

/// The candidate a [`verdict`](Observed::verdict) is for.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Asker<'a> {
    /// Its identity.
    pub(crate) identity: &'a str,
    /// Whether the record observed is the record of its own term (see
    /// [`TermId`]), not merely one naming its identity.
    pub(crate) own_term: bool,
    /// Its configured lease duration, for a record that carries none.
    pub(crate) fallback: Duration,
}

/// The last record seen, and the local monotonic instant at which it was first
/// seen unchanged. Expiry is judged from this alone, never from `renewTime`, so
/// that clock offsets between nodes do not matter.
#[derive(Clone, Debug)]
pub(crate) struct Observed {
    pub(crate) spec: LeaseSpec,
    pub(crate) resource_version: Option<String>,
    pub(crate) at: Instant,
    /// The last two versions first seen, the newest last (by resourceVersion
    /// when they compare as numbers, else in the order first seen), each with
    /// its record and the instant it was first seen.
    pub(crate) firsts: Vec<(String, LeaseSpec, Instant)>,
}

impl Observed {
    /// Records `spec`, under the resourceVersion `version`, as seen at `now`.
    /// The clock restarts only when the record changed: a record seen again
    /// does not extend its own lifetime, and one seen late only makes expiry
    /// later. The newest version seen, seen again after an older one (a list
    /// served by a cache behind: A-B-A), keeps the clock of its first sight:
    /// nothing was written on top of it, or a takeover written with its
    /// resourceVersion meets a conflict. The newest is the one with the
    /// largest resourceVersion (an etcd revision on every API server), not
    /// merely the last first seen: a follower that read the newest record
    /// from etcd may then see an older one for the first time in a list from
    /// a cache behind. Any other version seen again (an etcd restore brings
    /// old ones back) is a change.
    pub(crate) fn update(prev: Option<Self>, spec: LeaseSpec, version: Option<String>, now: Instant) -> Self {
        let mut firsts = match prev {
            Some(p) if p.spec == spec => {
                return Observed {
                    resource_version: version.or(p.resource_version),
                    ..p
                };
            }
            Some(p) => p.firsts,
            None => Vec::new(),
        };
        let seen = firsts
            .iter()
            .rposition(|(v, s, _)| version.as_ref() == Some(v) && *s == spec);
        let at = match seen {
            Some(i) if i + 1 == firsts.len() => firsts[i].2,
            Some(_) => now,
            None => {
                if let Some(v) = version.clone() {
                    // In order of resourceVersion when they compare (etcd's
                    // revisions, as every API server's): an older version
                    // first seen after a newer one (a GET from etcd, then a
                    // list from a cache behind) is not the newest.
                    let newer = |(w, _, _): &(String, LeaseSpec, Instant)| matches!((rv_number(&v), rv_number(w)), (Some(v), Some(w)) if w > v);
                    let at = firsts.iter().position(newer).unwrap_or(firsts.len());
                    firsts.insert(at, (v, spec.clone(), now));
                }
                if firsts.len() > 2 {
                    firsts.remove(0);
                }
                now
            }
        };
        Observed {
            spec,
            resource_version: version,
            at,
            firsts,
        }
    }

    /// Decides whether `asker` may take this record at `now`.
    ///
    /// - A free Lease is taken at once, unless its `preferredHolder` names another
    ///   candidate: that candidate is given one lease duration to take it
    ///   (the record's, at most the asker's own).
    /// - A record of the asker's own term ([`Asker::own_term`]) is taken at
    ///   once, unless its `preferredHolder` names another candidate: the asker
    ///   stepped down (or should), and waits as a third candidate would (the
    ///   preferred holder takes the record at its expiry, and is given one
    ///   more lease duration). Taking it back at once would undo every
    ///   step-down whose guarded work was still alive (so that the Lease was
    ///   not released), and the preferred holder would never lead.
    /// - Any other held record is taken once it has been seen unchanged for its
    ///   lease duration. If its `preferredHolder` names a third candidate (the end
    ///   of the holder's term was marked), the preferred holder is given one more
    ///   lease duration after the expiry, as on a free Lease.
    ///
    /// A record naming the asker's identity that is not its own term's (another
    /// process with the same identity, or a write of ours we gave up on, possibly
    /// on a Lease just re-created while the leader of the deleted one still acts)
    /// is treated like anyone else's.
    pub(crate) fn verdict(&self, asker: Asker<'_>, now: Instant) -> Verdict {
        let spec = &self.spec;
        let identity = asker.identity;
        let duration = lease_duration(spec, asker.fallback);
        let after = |times: u32| after_unchanged(self, duration.saturating_mul(times), now);
        match (holder(spec), preferred_holder(spec)) {
            // Free, and reserved for nobody or for us.
            (None, p) if p.is_none_or(|p| p == identity) => Verdict::Take,
            // Held, its end of term marked for a third candidate; or our own
            // term's record, its end marked for another candidate (we
            // stepped down, or should): as a third candidate would, we give
            // the preferred holder one lease duration after the record
            // expires (it takes it at expiry) before we take it (back).
            (Some(h), Some(p)) if p != identity && p != h => after(2),
            // Our own term's record.
            (Some(h), _) if h == identity && asker.own_term => Verdict::Take,
            // Free but reserved for someone else: one lease duration for the
            // preferred holder to take it, at most ours. A free record's
            // duration is no holder's promise (a release writes 1 s; a
            // record written by hand may say 2^31-1 s, and waiting that out
            // would leave the Lease without a leader for 68 years, where a
            // client-go candidate takes a free Lease at once).
            (None, Some(_)) => after_unchanged(self, duration.min(asker.fallback), now),
            // Held by someone else; or ours of unknown provenance.
            _ => after(1),
        }
    }
}

/// A resourceVersion as the number it is on every API server (an etcd
/// revision); `None` for any other.
pub(crate) fn rv_number(version: &str) -> Option<u64> {
    version.parse().ok()
}

/// `lease`'s resourceVersion as a number ([`rv_number`]).
pub(crate) fn version_of(lease: &Lease) -> Option<u64> {
    lease.metadata.resource_version.as_deref().and_then(rv_number)
}

/// Take once `observed` has stayed unchanged for `wait`, else wait until then.
pub(crate) fn after_unchanged(observed: &Observed, wait: Duration, now: Instant) -> Verdict {
    let until = later(observed.at, wait);
    if now >= until {
        Verdict::Take
    } else {
        Verdict::WaitUntil(until)
    }
}

/// `at + d`, or as far ahead as an `Instant` goes.
pub(crate) fn later(at: Instant, d: Duration) -> Instant {
    at.checked_add(d)
        .unwrap_or_else(|| at + Duration::from_secs(86_400 * 365 * 30))
}

#[cfg(test)]
mod tests;
