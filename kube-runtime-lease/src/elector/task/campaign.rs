//! Campaigning: one attempt to acquire (create a missing Lease, or take a
//! free, expired or own record), the jittered retry period between attempts, and the
//! creation hold that delays leadership on a Lease whose last holder may still
//! lead.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::{Attempt, LeaseView, Rule, Task, Won};
use crate::{
    config::JITTER_FACTOR,
    elector::supervise::Demand,
    error::Result,
    record::{self, Asker, Observed, Verdict},
};

impl Task {
    /// Campaigns until this candidate leads (`Some`) or nobody wants it
    /// (`None`). Nobody wanting it, the task lingers for one retry period,
    /// keeping its watch, before it exits: demand that flaps (an `acquire`
    /// created and dropped repeatedly) costs no new LIST, WATCH and GET.
    pub(in crate::elector) async fn campaign(&mut self) -> Option<Won> {
        let mut linger_until = None;
        loop {
            match self.demand() {
                Demand::Shutdown => return None,
                Demand::Unwanted => {
                    let until =
                        *linger_until.get_or_insert_with(|| Instant::now() + self.config().retry_period);
                    if Instant::now() >= until {
                        debug!("nobody wants leadership: leaving the election");
                        #[cfg(test)]
                        crate::elector::test_hooks::reached(
                            &self.inner,
                            crate::elector::test_hooks::Point::Exiting,
                        );
                        return None;
                    }
                    self.idle_until(until).await;
                    continue;
                }
                Demand::Wanted => linger_until = None,
            }
            let until = match self.try_acquire().await {
                Ok(Attempt::Won(won)) => return Some(won),
                // Also with a watch: a silent one is checked (`try_acquire`).
                Ok(Attempt::WaitUntil(until)) => until.min(Instant::now() + self.jittered_retry()),
                // Retried at client-go's pace, whatever failed: a backoff
                // would leave the Lease without a leader long after the API
                // server answers again.
                Err(e) => {
                    self.log_error("acquiring the lease", &e);
                    Instant::now() + self.jittered_retry()
                }
            };
            self.idle_until(until).await;
        }
    }

    /// The lease duration to write: our own, or, during a creation hold, as
    /// much as is left of the hold, so that a candidate that only ever sees
    /// our record does not take it before the hold ends.
    pub(in crate::elector) fn seconds_to_write(&self, hold: Option<Instant>) -> i32 {
        let left = hold.map_or(Duration::ZERO, |h| h.saturating_duration_since(Instant::now()));
        let left = i32::try_from(left.as_secs() + u64::from(left.subsec_nanos() > 0)).unwrap_or(i32::MAX);
        self.config().lease_duration_seconds().max(left)
    }

    pub(in crate::elector) async fn try_acquire(&mut self) -> Result<Attempt> {
        let cfg = self.inner.config.clone();
        // A watch in sync is trusted while it is heard from: a held record's
        // renewals arrive every retry period, so a longer silence is a dead
        // holder or a stalled watch, which only a read tells apart.
        let trusted = self.watch.trusted(cfg.retry_period * 2);
        if !trusted || self.needs_read || matches!(self.view, LeaseView::Unknown) {
            self.get(cfg.renew_deadline).await?;
            let read = match &self.view {
                LeaseView::Known { observed, .. } => observed.resource_version.as_deref(),
                LeaseView::Missing | LeaseView::Unknown => None,
            };
            self.watch.check_silence(read, cfg.retry_period * 2);
        }
        let now = Instant::now();
        // The rule for a record: the ordinary election's, unless Coordinated
        // Leader Election says to wait or is in force.
        let rule: Rule = Observed::verdict;
        // (A binding of its own, with this comment: the upstream generator
        // drops both.)
        let rule = match super::super::extras::rule(self, rule, now) {
            Ok(rule) => rule,
            Err(until) => return Ok(Attempt::WaitUntil(until)),
        };
        let (lease, prev) = match &self.view {
            // Not read yet (no path leads here after a successful read):
            // never retried without a wait.
            LeaseView::Unknown => return Ok(Attempt::WaitUntil(now + self.jittered_retry())),
            LeaseView::Missing => {
                // The namespace is the request's (the API server sets it).
                let mut lease = Lease::default();
                lease.metadata.name = Some(cfg.name.clone());
                (lease, None)
            }
            LeaseView::Known { observed, object } => {
                let asker = Asker {
                    identity: &cfg.identity,
                    own_term: self.memory.is_ours(object),
                    fallback: cfg.lease_duration,
                };
                if let Verdict::WaitUntil(until) = rule(observed, asker, now) {
                    return Ok(Attempt::WaitUntil(until));
                }
                let mut lease = (**object).clone();
                lease.spec = Some(observed.spec.clone());
                let version = &mut lease.metadata.resource_version;
                version.clone_from(&observed.resource_version);
                (lease, Some(&**object))
            }
        };
        let (lease, token) = self.acquisition(lease, prev);
        self.memory.sent_token = token;
        let created = prev.is_none();
        self.write_to_acquire(lease, created).await
    }

    /// Makes `lease` the write that begins a term on top of `prev` (`None`:
    /// creating the Lease): a new acquisition of its record (`lease.spec`),
    /// with transitions above any seen on the name, a fencing token above
    /// any seen or handed out, stored on the Lease, and the configured Lease
    /// metadata; returned with that token.
    ///
    /// Kept within the API server's limit on the annotations' total size
    /// (256 KiB): a Lease whose annotations (someone else's) leave room for
    /// the fencing token but not for the configured annotations is written
    /// with the token only (the token keeps terms apart across processes;
    /// the configured annotations are for people). One that leaves no room
    /// for the token is written with the annotations it has, as client-go
    /// writes it, instead of being refused
    /// with 422 at every attempt, which would leave it without a leader for
    /// ever. The term's fencing token is then not stored (warned): another
    /// process may hand out the same one.
    fn acquisition(&self, mut lease: Lease, prev: Option<&Lease>) -> (Lease, i64) {
        // During a hold, the duration covers its rest, as every write of the
        // hold does.
        let hold = self.hold_for(prev.and_then(|p| p.metadata.uid.as_ref()), prev.is_none());
        let prev_transitions = prev.map(|p| p.spec.as_ref().and_then(|s| s.lease_transitions).unwrap_or(0));
        let transitions = self.memory.next_transitions(prev_transitions);
        let token = self.memory.token_for(prev.map(record::token_of), transitions);
        lease.spec = Some(record::taken(
            lease.spec.as_ref(),
            &self.config().identity,
            self.seconds_to_write(hold),
            transitions,
            record::now(),
        ));
        record::set_token(&mut lease, token);
        // The configured labels, annotations (where they fit beside the
        // token) and owner; the rest is kept.
        let mut lease = self.config().extras.prepare(lease);
        if record::annotations_size(lease.metadata.annotations.as_ref()) > record::MAX_ANNOTATIONS_SIZE {
            let before = prev.and_then(|p| p.metadata.annotations.clone());
            warn!(
                annotations_bytes = record::annotations_size(before.as_ref()),
                "the lease's annotations leave no room for the fencing token (the API server's limit is 256 KiB): \
                 taking it without writing the token or the configured annotations; fencing tokens may repeat \
                 across processes until the annotations shrink"
            );
            lease.metadata.annotations = before;
        }
        (lease, token)
    }

    /// Sends the write that acquires: `create` for a missing Lease, else
    /// `replace` with the resourceVersion read. A lost race (409) is checked
    /// with a read (see below). A `replace`
    /// answered 404 is an error like any other, retried after a jittered retry
    /// period and a fresh read: the API server answers a replace of a deleted Lease with
    /// 409 (its uid is the precondition), so a 404 here comes from something
    /// in front of it, and retrying at once would be a loop without a delay
    /// while reads succeed.
    async fn write_to_acquire(&mut self, lease: Lease, created: bool) -> Result<Attempt> {
        let bound = self.config().renew_deadline;
        if !created {
            self.memory.sent_takeover.clone_from(&lease.spec);
        }
        let sent = Instant::now();
        let result = if created {
            self.inner.api.create(&lease, bound).await
        } else {
            self.inner.api.replace(&lease, bound).await
        };
        let lease = Box::new(match result {
            Ok(written) => written,
            // Someone else won the race, unless the write was ours after all
            // (applied, answered 504 and retried by the client, whose retry
            // met our own write). A read tells: the record is exactly the one
            // sent.
            Err(e) if e.is_conflict() => {
                self.needs_read = true;
                let spec = lease.spec.unwrap_or_default();
                match self.get(bound.saturating_sub(sent.elapsed())).await {
                    Ok(Some(read)) if read.spec.as_ref().is_some_and(|s| record::same_write(s, &spec)) => {
                        info!(
                            "the write answered with a conflict had been applied (a retried request): it was ours"
                        );
                        read
                    }
                    _ => {
                        debug!("lost the race to acquire the lease");
                        return Ok(Attempt::WaitUntil(Instant::now() + self.jittered_retry()));
                    }
                }
            }
            Err(e) => {
                self.needs_read |= e.status() == Some(404);
                return Err(e);
            }
        });
        Ok(Attempt::Won(Won { lease, sent, created }))
    }

    /// The creation hold a term beginning now on the object `uid` would
    /// have: until the previous holder of a Lease object that went away may
    /// still lead (at least one lease duration when we created it), and any
    /// hold a term of ours on the same object already had. What the write
    /// that begins the term must cover; remembered (`Memory::hold`) once the
    /// term began (`Task::lead`).
    pub(in crate::elector) fn hold_for(&self, uid: Option<&String>, created: bool) -> Option<Instant> {
        let cfg = &self.inner.config;
        if !cfg.creation_hold {
            return None;
        }
        let now = Instant::now();
        let risk = self.memory.risk_until.filter(|t| *t > now);
        let held = match &self.memory.hold {
            Some((held_uid, until)) if held_uid.as_ref() == uid && *until > now => Some(*until),
            _ => None,
        };
        created.then_some(now + cfg.lease_duration).max(risk).max(held)
    }

    /// The retry period with client-go's jitter (`JitterFactor` 1.2: up to
    /// 120 % longer, so each wait is 1 to 2.2 retry periods).
    pub(in crate::elector) fn jittered_retry(&self) -> Duration {
        // A random number in `[0, 1]`.
        let bits = u32::try_from(crate::config::random_u64() >> 32).unwrap_or(u32::MAX);
        let unit_random = f64::from(bits) / f64::from(u32::MAX);
        let period = self.config().retry_period;
        period.mul_f64(1.0 + unit_random * JITTER_FACTOR)
    }
}
