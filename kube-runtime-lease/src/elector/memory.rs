//! What an elector remembers of its Lease across terms and tasks: our own
//! term's record, the creation hold and the risk a vanished object leaves, the
//! largest transitions and fencing token, and stopped work.

use std::time::Duration;

use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::MicroTime,
};
use tokio::time::Instant;

use super::task::LeaseView;
use crate::{
    config::LeaseConfig,
    record::{self, TermId},
    term::Term,
};

/// What this elector remembers of the Lease across terms and tasks.
#[derive(Default)]
pub(super) struct Memory {
    /// Our last term: a record of it (same object and holder) carrying one
    /// of `last_renewed` is our own write; any other record naming our
    /// identity is not (another process with the same identity, or a write
    /// we gave up on).
    pub(super) last_term: Option<TermId>,
    /// The `renewTime`s of our last term's record that we may have written
    /// last: the record as we last wrote or verified it, and the renewals
    /// sent since (whose answers may have been lost). A record of our last
    /// term with another `renewTime` was renewed by another process with
    /// our identity (client-go renews a record naming its identity as its
    /// own, keeping the `TermId`): it is not ours.
    pub(super) last_renewed: Vec<MicroTime>,
    /// The record of the last takeover we sent: one whose answer never came
    /// (a reset, a 5xx, a timeout) may have been applied, and a record that
    /// is exactly it is our own write, taken again at once (as client-go
    /// takes a record naming its identity), not waited out for a lease
    /// duration with nobody renewing it.
    pub(super) sent_takeover: Option<LeaseSpec>,
    /// The fencing token of the last term we sent a write to begin: the
    /// term's, whether or not its record could store it.
    pub(super) sent_token: i64,
    /// A term on this Lease object must not begin before this instant (the
    /// creation hold), whichever task campaigns.
    pub(super) hold: Option<(Option<String>, Instant)>,
    /// Until when the last holder of a Lease object that went away (deleted,
    /// or replaced by another object) may still believe it leads.
    pub(super) risk_until: Option<Instant>,
    /// What was seen of the Lease object last seen.
    pub(super) seen: Seen,
    /// The object last seen go away, and what was remembered of it then:
    /// restored if that very object (its uid) is seen again, since an
    /// object never comes back once deleted. Its absence was a stale
    /// answer (a list served by a watch cache behind the object's
    /// creation), not a deletion, and leaves no risk and no creation hold.
    pub(super) gone: Option<Gone>,
    /// The largest `leaseTransitions` seen on this Lease name, any object.
    pub(super) max_transitions: Option<i32>,
    /// The largest fencing token seen on this Lease name, any object
    /// ([`record::token_of`]).
    pub(super) max_token: Option<i64>,
    /// The largest fencing token handed out.
    pub(super) last_token: Option<i64>,
    /// Guarded work was stopped, not finished: requests it sent may land
    /// until then (lease duration − renew deadline after it stopped, the
    /// margin the protocol leaves for it). No term of ours releases the
    /// Lease before then: that would let a standby lead at once, inside the
    /// margin.
    pub(super) stopped_until: Option<Instant>,
    /// The last task's view of the Lease, the next task's first: a record
    /// read again unchanged keeps the clock of its first sight, as
    /// client-go's `observedTime` while the record it reads is the same.
    pub(super) view: Option<LeaseView>,
}

/// What [`Memory`] saw of the Lease object last seen (see [`Memory::seen`]).
#[derive(Clone, Debug, Default)]
pub(super) struct Seen {
    /// The object (its uid; `None`: none seen, or it went away).
    uid: Option<String>,
    /// Whether its last record named a holder.
    held: bool,
    /// The longest lease duration seen on it since its holder last wrote it
    /// (the `renewTime` of that write: `renewed`).
    longest: Duration,
    renewed: Option<MicroTime>,
    /// The newest resourceVersion seen on it, as a number (see
    /// [`record::rv_number`]).
    version: Option<u64>,
}

/// What [`Memory`] knew of an object when it was last seen go away (see
/// [`Memory::gone`]): what it saw of it, and the risk in force then.
#[derive(Clone, Debug)]
pub(super) struct Gone {
    seen: Seen,
    risk_until: Option<Instant>,
}

impl Memory {
    /// `term` ended: if any of its guarded work was stopped, not finished
    /// (see `Term::stopped_at`), no term releases the Lease until lease
    /// duration − renew deadline after that (see [`Memory::stopped_until`]),
    /// this one included. Both ends of a term call it: `end_term`, and the
    /// drop of a task whose runtime shut down under it.
    pub(super) fn term_ended(&mut self, term: &Term, config: &LeaseConfig) {
        let margin = config.lease_duration.saturating_sub(config.renew_deadline);
        let until = term.stopped_at().map(|stopped| record::later(stopped, margin));
        self.stopped_until = self.stopped_until.max(until);
    }

    /// Whether `lease` holds the record of our last term (see [`TermId`]),
    /// renewed last by us (see [`Memory::last_renewed`]; while our term
    /// holds, a record with no `renewTime` is an edit of ours: every other
    /// process writes its own, and nobody else can have taken the Lease).
    pub(super) fn is_last_term(&self, lease: &Lease) -> bool {
        let renewed = lease.spec.as_ref().and_then(|s| s.renew_time.as_ref());
        self.last_term.as_ref().is_some_and(|t| t.matches(lease))
            && renewed.is_none_or(|r| self.last_renewed.contains(r))
    }

    /// Whether `lease` is our own to a campaign: our last term's record
    /// with a `renewTime` of ours (with none, it is an edit that may have
    /// followed another holder's term since ours ended), or exactly our last
    /// takeover sent (see [`Memory::sent_takeover`]).
    pub(super) fn is_ours(&self, lease: &Lease) -> bool {
        let Some(spec) = &lease.spec else { return false };
        // A version older than one already seen on this object was brought
        // back (etcd restored from a snapshot): whoever wrote the newer one
        // may lead now, so the record is waited out like anyone else's.
        let version = record::version_of(lease);
        if version.zip(self.seen.version).is_some_and(|(v, seen)| v < seen) {
            return false;
        }
        if spec.renew_time.is_some() && self.is_last_term(lease) {
            return true;
        }
        let sent = self.sent_takeover.as_ref();
        let ours = sent.is_some_and(|sent| record::same_write(spec, sent));
        if ours {
            tracing::info!(
                "the lease holds our last takeover, applied though its answer was lost: taking it again"
            );
        }
        ours
    }

    /// `lease` is our last term's record as we wrote or verified it: its
    /// `renewTime` is the one we wrote last, until we send another. It is
    /// the newest version of the object, even below one seen before etcd
    /// was restored from a snapshot.
    pub(super) fn confirmed(&mut self, lease: &Lease) {
        let renewed = lease.spec.as_ref().and_then(|s| s.renew_time.clone());
        self.last_renewed = renewed.into_iter().collect();
        self.seen.version = record::version_of(lease).or(self.seen.version);
    }

    /// Remembers the Lease as seen at `now` (`None`: missing).
    pub(super) fn saw(&mut self, lease: Option<&Lease>, fallback: Duration, now: Instant) {
        let Some(lease) = lease else {
            self.went_away(now);
            return;
        };
        let spec = lease.spec.clone().unwrap_or_default();
        self.max_token = self.max_token.max(Some(record::token_of(lease)));
        if self.seen.uid != lease.metadata.uid {
            match self.gone.take() {
                // The object seen go away is back: it never went.
                Some(gone) if self.seen.uid.is_none() && gone.seen.uid == lease.metadata.uid => {
                    (self.seen, self.risk_until) = (gone.seen, gone.risk_until);
                }
                _ => {
                    self.went_away(now);
                    self.seen.uid.clone_from(&lease.metadata.uid);
                }
            }
        }
        let duration = record::lease_duration(&spec, fallback);
        let version = record::version_of(lease);
        // A newer write of its holder (a renewal, or a new term): another
        // `renewTime` on a newer version. Told by the resourceVersion where
        // it compares, not by comparing `renewTime`s, which different nodes'
        // clocks wrote (a holder's clock an hour ahead would make every
        // later holder's write look older for an hour). Else, `renewTime`
        // moved forward. (`None` orders before any `renewTime`.)
        let seen = &mut self.seen;
        let newer = match (version, seen.version) {
            (Some(v), Some(before)) => {
                v > before && spec.renew_time.is_some() && spec.renew_time != seen.renewed
            }
            _ => spec.renew_time > seen.renewed,
        };
        seen.version = seen.version.max(version);
        if newer {
            // The duration it writes is what it goes by from now on,
            // whatever earlier records said (or an edit of them: a huge
            // value written once by someone else would otherwise make the
            // creation hold after a deletion as long, up to 68 years).
            seen.longest = duration;
            seen.renewed.clone_from(&spec.renew_time);
        } else {
            // The same write edited by someone else (`kubectl edit`), or an
            // older one seen late (a lagging re-list): until its holder
            // writes again, either duration may be what it goes by.
            seen.longest = seen.longest.max(duration);
        }
        seen.held = record::holder(&spec).is_some();
        self.max_transitions = self.max_transitions.max(spec.lease_transitions);
    }

    /// The object last seen is gone (seen missing at `now`, or replaced).
    fn went_away(&mut self, now: Instant) {
        let seen = std::mem::take(&mut self.seen);
        if seen.uid.is_none() {
            return;
        }
        let risk_until = self.risk_until;
        if seen.held {
            self.risk_until = risk_until.max(Some(record::later(now, seen.longest)));
        }
        self.gone = Some(Gone { seen, risk_until });
    }

    /// The `leaseTransitions` to write when a term begins on a record with
    /// `prev`: more than anything seen on this name, and within the range
    /// every implementation can count on from: never negative (the API
    /// server refuses a negative count, so one more than a negative value
    /// seen would be refused at every attempt), and never `i32::MAX`, where
    /// the count starts again at 0. client-go's takeover writes the count it
    /// read plus one as an int32: after a record of `i32::MAX` (written by
    /// us, or once seen and remembered here) every one of its takeovers is
    /// refused, and the Lease has no leader once no candidate of ours runs.
    /// The fencing token does not depend on the count (its annotation goes on).
    pub(super) fn next_transitions(&self, prev: Option<i32>) -> i32 {
        match prev.max(self.max_transitions) {
            Some(t) if (0..i32::MAX - 1).contains(&t) => t + 1,
            _ => 0,
        }
    }

    /// The fencing token for a term beginning on a record whose token is
    /// `prev` (`None`: creating the Lease), writing `transitions`: more than
    /// every token this elector saw or handed out on this name, and than
    /// `transitions`. Stored on the Lease ([`record::set_token`]), it is what
    /// the next candidate reads, whichever process that is.
    pub(super) fn token_for(&self, prev: Option<i64>, transitions: i32) -> i64 {
        [prev, self.max_token, self.last_token]
            .into_iter()
            .flatten()
            .fold(i64::from(transitions), |max, t| max.max(t.saturating_add(1)))
    }

    /// The fencing token of a term whose record carries `token`: strictly
    /// more than every token before it in this elector.
    pub(super) fn next_token(&mut self, token: i64) -> i64 {
        let token = token.max(self.last_token.map_or(token, |last| last.saturating_add(1)));
        self.last_token = Some(token);
        token
    }
}

#[cfg(test)]
mod tests;
