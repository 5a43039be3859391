//! One renewal of the term's Lease: the fast path (one `replace` with the
//! cached resourceVersion), a read and one retry on conflict, and what each
//! answer means for the term.

use std::future::Future;

use futures::FutureExt;
use tokio::time::Instant;
use tracing::{debug, warn};

use super::{
    Task,
    lead::{Read, TermRun},
};
use crate::{
    elector::{Inner, Transition, supervise::Demand},
    record,
    term::{Lost, Term},
};

impl Task {
    /// One renewal: the fast path (one `replace` with the cached
    /// resourceVersion), falling to a read and a retry on conflict. The renew
    /// deadline moves to the instant before the successful request was sent.
    pub(in crate::elector) async fn renew(&mut self, run: &mut TermRun) -> Result<(), Lost> {
        for attempt in 0..2 {
            let sent = Instant::now();
            if let Some(lost) = run.term.over_at(sent) {
                return Err(lost);
            }
            let mut lease = run.cached.clone();
            self.config().extras.relabel(&mut lease);
            let seconds = self.seconds_to_write(run.phase.hold());
            let prev = lease.spec.take().unwrap_or_default();
            let spec = record::renewed(&prev, seconds, record::now(), self.config().retry_period);
            self.memory.last_renewed.extend(spec.renew_time.clone());
            lease.spec = Some(spec);
            // Abandoned for a term that ends meanwhile (`while_wanted`).
            let inner = self.inner.clone();
            let write = inner.api.replace(&lease, run.term.deadline() - sent);
            let Some(written) = while_wanted(&inner, &run.term, write).await else {
                return Ok(());
            };
            match written {
                Ok(lease) => {
                    let in_time = run.term.renewed(sent, self.config().renew_deadline);
                    self.see(Some(lease.clone()), sent);
                    self.memory.confirmed(&lease);
                    run.cached = lease;
                    run.caught_up = false;
                    run.sent = sent;
                    // Late, the renewal gives the term up; unless the term
                    // ended from outside while the request was in flight:
                    // the top of the loop handles it.
                    if in_time {
                        self.renewal_told("success", sent);
                        debug!("renewed lease");
                        // The next renewal carries this answer's
                        // resourceVersion: two round trips must fit in RD.
                        if sent.elapsed() >= self.config().renew_deadline / 2 {
                            warn!(
                                took = ?sent.elapsed(),
                                "a renewal took half the renew deadline or more: the term ends if the next one \
                                 takes as long (raise the renew deadline, or find what delays the answers)"
                            );
                        }
                    } else if run.term.lost().is_none() {
                        self.renewal_told("late", sent);
                        warn!(
                            after = ?sent.elapsed(),
                            "the renewal succeeded only after the renew deadline; giving the term up"
                        );
                        return Err(Lost::RenewDeadlineExceeded);
                    }
                    return Ok(());
                }
                Err(e) if e.status() == Some(404) => {
                    self.renewal_told("not_found", sent);
                    // Not proof of a deletion (the API server answers a
                    // replace of a deleted Lease with 409): a read decides.
                    // A 404 from something in front of the API server costs
                    // this renewal, not the term.
                    self.log_error("renewing the lease (answered 404: reading it to confirm)", &e);
                    self.reread(run, "confirming the lease after a 404").await?;
                    return Ok(());
                }
                Err(e) if attempt == 0 && e.is_conflict() => {
                    self.renewal_told("conflict", sent);
                    debug!("renewal conflicted; re-reading the lease");
                    if let Read::Unknown = self.reread(run, "re-reading the lease").await? {
                        return Ok(());
                    }
                }
                Err(e) => {
                    self.renewal_told("error", sent);
                    self.log_error("renewing the lease", &e);
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    /// Tells the observers of a renewal write sent at `sent`, and its outcome.
    fn renewal_told(&self, outcome: &'static str, sent: Instant) {
        self.inner.observers.tell(Transition::Renewal {
            outcome,
            latency: sent.elapsed(),
            sent,
        });
    }
}

/// `request`'s answer, unless the term ends from outside (a shutdown) or
/// nobody wants it any more (its last guard dropped) first: `None` then, so
/// that the release need not wait for the answer. A request abandoned so may
/// still land and changes nothing the release relies on: a write carries the
/// old resourceVersion, and the release reads first. Demand is re-counted on
/// the state, not at the task's recount point (`Task::demand`): a wake-up
/// after each recount (the storm of the tests' hooks) would spin this loop,
/// never letting the answer in.
pub(super) async fn while_wanted<T>(
    inner: &Inner,
    term: &Term,
    request: impl Future<Output = T>,
) -> Option<T> {
    let mut request = std::pin::pin!(request.fuse());
    loop {
        futures::select_biased! {
            answer = request => return Some(answer),
            () = inner.wake.notified().fuse() => {}
        }
        if term.lost().is_some() || inner.lock().demand() != Demand::Wanted {
            debug!("the term ended, or nobody wants it, during a request: not waiting for its answer");
            return None;
        }
    }
}
