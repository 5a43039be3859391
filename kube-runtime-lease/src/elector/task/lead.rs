//! Leading one term: publishing it, the loop that renews every retry period,
//! follows the watch and honours the creation hold, verifying foreign records,
//! and stepping down for a preferred holder.

use std::{sync::Arc, time::Duration};

use futures::FutureExt;
use k8s_openapi::api::coordination::v1::Lease;
use tokio::time::{Instant, sleep_until};
use tracing::{info, warn};

use super::{
    Next, Task, Won,
    view::{Delivered, Step},
};
use crate::{
    elector::{Transition, supervise::Demand},
    guard::LeaseGuard,
    record::{self, TermId},
    term::{Lost, Term},
};

/// The loss of a term whose Lease now holds `lease`, someone else's record
/// (its holder is `""` when someone else wrote it free).
fn taken_over(lease: &Lease) -> Lost {
    let holder = lease.spec.as_ref().and_then(record::holder).unwrap_or_default();
    let holder = holder.to_owned();
    Lost::TakenOver { holder }
}

/// Where a term is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::elector) enum Phase {
    /// The creation hold: the Lease is ours and renewed, but the term is not
    /// handed out before `until` (and a read confirming it).
    Holding { until: Instant },
    /// Published: guards are handed out.
    Leading,
    /// Free of any hold but never published: the shutdown began before the
    /// term could be handed out. No work ran under it, so it is released.
    Withheld,
}

impl Phase {
    /// The end of the creation hold, while it lasts.
    pub(in crate::elector) fn hold(self) -> Option<Instant> {
        match self {
            Phase::Holding { until } => Some(until),
            Phase::Leading | Phase::Withheld => None,
        }
    }
}

/// The state of one term, as its loop sees it.
pub(in crate::elector) struct TermRun {
    pub(in crate::elector) term: Arc<Term>,
    /// The record of this term (see [`TermId`]).
    pub(in crate::elector) id: TermId,
    pub(in crate::elector) phase: Phase,
    /// A `preferredHolder` already on the record when the term began: the
    /// preferred holder was given its chance (one lease duration), so it does
    /// not end this term; a preferred holder set during the term does.
    pub(in crate::elector) tolerated: Option<String>,
    /// The object as we last wrote or verified it: the next renewal writes
    /// on top of it.
    pub(in crate::elector) cached: Lease,
    /// The watch has delivered our last write, so every later event is newer
    /// than it.
    pub(in crate::elector) caught_up: bool,
    /// The instant before our last successful write was sent.
    pub(in crate::elector) sent: Instant,
}

impl TermRun {
    /// Whether `object` is our own last write (its resourceVersion).
    fn wrote(&self, object: &Lease) -> bool {
        let version = &object.metadata.resource_version;
        version.is_some() && *version == self.cached.metadata.resource_version
    }

    /// Whether `object` holds this term's record at a resourceVersion older
    /// than our last write's: a version we wrote over, which a read shows
    /// again only when etcd was restored from a snapshot taken during the
    /// term. Nobody else took the Lease in between (our last write was on
    /// top of it), so the term goes on from it, as client-go's leader renews
    /// a record naming it; giving the term up would leave the Lease without
    /// a leader for a lease duration.
    fn restored(&self, object: &Lease) -> bool {
        self.id.matches(object)
            && matches!((record::version_of(object), record::version_of(&self.cached)), (Some(o), Some(c)) if o < c)
    }
}

impl Task {
    /// Leads one term, begun by `won`, to its end and release.
    pub(in crate::elector) async fn lead(&mut self, Won { lease, sent, created }: Won) -> Next {
        let Some(id) = TermId::of(&lease) else {
            return Next::Campaign;
        };
        self.memory.last_term = Some(id.clone());
        self.memory.confirmed(&lease);
        let token = self.memory.next_token(self.memory.sent_token);
        let term = Arc::new(Term::new(token, sent, self.config().renew_deadline));
        self.see(Some((*lease).clone()), sent);
        let tolerated = lease.spec.as_ref().and_then(record::preferred_holder);
        // A Lease has no version once deleted and `create` has no
        // precondition, so the leader of a deleted incarnation may still
        // believe it leads: its last renewal was sent before the deletion.
        // Hold the Lease (renewing it) until that leader has given up.
        let uid = &lease.metadata.uid;
        let phase = match self.hold_for(uid.as_ref(), created) {
            Some(until) => {
                self.memory.hold = Some((uid.clone(), until));
                let left = until.saturating_duration_since(Instant::now());
                let why = if created {
                    "created the lease; holding it for one lease duration (or the deleted record's, if longer) before leading"
                } else {
                    "holding the lease before leading: the holder of the object it replaced may still lead"
                };
                info!(?left, "{why}");
                Phase::Holding { until }
            }
            None => self.begin_term(&term, uid.as_deref()),
        };
        let mut run = TermRun {
            term,
            id,
            phase,
            tolerated: tolerated.map(str::to_owned),
            cached: *lease,
            caught_up: false,
            sent,
        };
        let reason = self.lead_until_lost(&mut run).await;
        let result = self.end_term(&run, &reason).await;
        if self.inner.lock().shutdown {
            Next::End(result)
        } else {
            Next::Campaign
        }
    }

    /// The loop of one term: why it ended.
    pub(in crate::elector) async fn lead_until_lost(&mut self, run: &mut TermRun) -> Lost {
        let period = self.config().retry_period;
        let mut next_tick = run.sent + period;
        loop {
            // Ended from outside (by `shutdown` once its grace ran out, by a
            // guard that saw the renew deadline pass first), or past the renew
            // deadline. Checked before waiting, so that no storm of wake-ups
            // can starve the deadline or the renewals. Then a step-down.
            if let Some(lost) = run.term.over().or_else(|| self.step_down(run)) {
                return lost;
            }
            match self.demand_for_term() {
                Demand::Wanted => {}
                Demand::Unwanted => return Lost::GivenUp,
                Demand::Shutdown => return Lost::Shutdown,
            }
            if run.phase.hold().is_some_and(|until| Instant::now() >= until) {
                // Before handing out guards, one read: the record must still
                // be ours (a watch, even one caught up with our last write,
                // may have stalled or broken during the hold). A read that
                // fails leaves the hold on for another retry period.
                run.phase = match self
                    .reread(run, "confirming the lease at the end of the creation hold")
                    .await
                {
                    Err(lost) => return lost,
                    Ok(Read::Ours) => self.begin_term(&run.term, run.cached.metadata.uid.as_deref()),
                    Ok(Read::Unknown) => Phase::Holding {
                        until: Instant::now() + period,
                    },
                };
            }
            let now = Instant::now();
            if now >= next_tick {
                while next_tick <= now {
                    next_tick += period;
                }
                if let Err(lost) = self.renew(run).await {
                    return lost;
                }
                continue;
            }
            // The end of the creation hold, or the renew deadline if sooner.
            let deadline = run.term.deadline();
            let hold_or_deadline = run.phase.hold().map_or(deadline, |h| h.min(deadline));
            // A watch event (or the watch's end), else `None`: a change of
            // demand (a guard dropped, a shutdown), the end of the hold, the
            // renew deadline or the tick, re-checked at the top of the loop.
            // The branches' futures borrow `self.watch`: act once they are
            // dropped.
            let event = futures::select_biased! {
                () = self.inner.wake.notified().fuse() => None,
                () = sleep_until(hold_or_deadline).fuse() => None,
                step = self.watch.next().fuse() => Some(step),
                () = sleep_until(next_tick).fuse() => None,
            };
            // A timer due half the renew deadline ago or more (what makes a
            // renewal slow): this task was not run meanwhile, and sent
            // nothing (the cause of a term that ends at its renew deadline
            // with no failed renewal).
            let late = Instant::now().saturating_duration_since(hold_or_deadline.min(next_tick));
            if late >= self.config().renew_deadline / 2 {
                warn!(
                    ?late,
                    "the leader election task ran late: its runtime was blocked (a step without `.await`, \
                     a blocking call outside `spawn_blocking`), not driven, or the process was paused; \
                     nothing was renewed meanwhile"
                );
            }
            if let Some(event) = event
                && let Err(lost) = self.on_watch_event(run, event).await
            {
                return lost;
            }
        }
    }

    /// The `preferredHolder` marks the end of this term for another candidate
    /// (set during the term: one already there when it began was given its
    /// chance, and a preferred holder that never campaigns must not stop the
    /// election).
    pub(in crate::elector) fn step_down(&self, run: &mut TermRun) -> Option<Lost> {
        let identity = &self.config().identity;
        let preferred = run.cached.spec.as_ref().and_then(record::preferred_holder);
        let Some(p) = preferred.filter(|p| p != identity) else {
            run.tolerated = None;
            return None;
        };
        (run.tolerated.as_deref() != Some(p)).then(|| Lost::SteppedDown {
            preferred_holder: p.to_owned(),
        })
    }

    /// A watch event while leading.
    async fn on_watch_event(&mut self, run: &mut TermRun, step: Step) -> Result<(), Lost> {
        // Only an item that shows the Lease (or its absence) says what the
        // watch delivered; after a failure or the end of the watch the last
        // object observed may be our own write's answer, which the watch has
        // not delivered. `object`: the Lease delivered (`None`: gone), which
        // the view then shows.
        let Some(Delivered { lease: object, news }) = step else {
            run.caught_up = false;
            return Ok(());
        };
        let changed = self.see(object.clone(), Instant::now()) || news;
        match object {
            // Our own last write, delivered: every later event is newer.
            Some(object) if run.wrote(&object) => run.caught_up = true,
            // Our term's record: news only once the watch caught up with
            // our last write (before, it may be older than that write).
            Some(object) if run.id.matches(&object) => {
                if run.caught_up && !run.restored(&object) {
                    if !self.memory.is_last_term(&object) {
                        // Written after our last write, by another process with
                        // our identity renewing our term as its own.
                        return Err(taken_over(&object));
                    }
                    // Our record, changed by someone else since our last write
                    // (a `preferredHolder` set, labels): the newest version. A
                    // duration cut short is written back at once.
                    if self.ours(run, object) {
                        self.renew(run).await?;
                    }
                }
            }
            // Someone else's record (or none), as the view already showed it
            // with the watch in sync: nothing new.
            _ if !changed => {}
            // Written after our last write: the term is over, now.
            object if run.caught_up => return Err(object.as_ref().map_or(Lost::Deleted, taken_over)),
            // Possibly older than our last write: confirm with a read before
            // stepping down (a read that fails leaves the term on).
            _ => {
                self.reread(run, "verifying the lease").await?;
            }
        }
        Ok(())
    }

    /// Publishes `term`, free of any hold, on the Lease object `uid` (logged
    /// with it: which incarnation of the Lease, after a re-creation): hands
    /// guards to every waiter; its phase is then `Leading`. Not once the
    /// shutdown began (`Withheld`): no guard, status or observer may see a
    /// term then.
    fn begin_term(&mut self, term: &Arc<Term>, uid: Option<&str>) -> Phase {
        let mut state = self.inner.lock();
        if state.shutdown {
            info!("won the lease as the shutdown began: not leading, releasing it");
            return Phase::Withheld;
        }
        // Status first, so that subscribers agree with a guard as soon as
        // it is handed out; under the lock, so that a shutdown beginning
        // now sets it back after this.
        self.inner.update_status(|s| s.is_leader = true);
        state.term = Some(term.clone());
        // A waiter that cannot get a guard (the renew deadline already
        // passed) keeps waiting, for the next term.
        for tx in std::mem::take(&mut state.waiters) {
            match LeaseGuard::undelivered(term, self.inner.wake.clone()) {
                Some(guard) => drop(tx.send(guard)),
                None => state.waiters.push(tx),
            }
        }
        drop(state);
        self.inner.observers.tell(Transition::Leading(true));
        info!(
            fencing_token = term.token,
            lease.uid = uid,
            "acquired lease, now leading"
        );
        // `sent`: the instant before its last successful write was sent, one
        // renew deadline before the term's deadline.
        self.inner.observers.tell(Transition::TermBegan {
            uid,
            sent: term.deadline() - self.config().renew_deadline,
        });
        Phase::Leading
    }

    /// Reads the Lease (bounded by the renew deadline): whether it still holds
    /// a record of our term as we wrote it (the same identity is not enough:
    /// another process may share it; see `Memory::is_last_term`), which
    /// then becomes the cached object; the term's end if it does not.
    /// Abandoned for a term that ends meanwhile (`while_wanted`).
    pub(super) async fn reread(&mut self, run: &mut TermRun, what: &str) -> Result<Read, Lost> {
        let left = run.term.deadline().saturating_duration_since(Instant::now());
        let inner = self.inner.clone();
        let Some(read) = super::renew::while_wanted(&inner, &run.term, self.get(left)).await else {
            return Ok(Read::Unknown);
        };
        match read {
            Ok(None) => Err(Lost::Deleted),
            Ok(Some(lease)) if self.memory.is_last_term(&lease) || run.restored(&lease) => {
                self.ours(run, lease);
                Ok(Read::Ours)
            }
            Ok(Some(lease)) => Err(taken_over(&lease)),
            Err(e) => {
                self.log_error(what, &e);
                Ok(Read::Unknown)
            }
        }
    }

    /// `lease`, our term's record as we wrote it (`Memory::is_last_term`),
    /// perhaps edited since, becomes the cached object. Edited to a
    /// `leaseDurationSeconds` below the renew deadline (or none, which
    /// client-go reads as 0), it lets other candidates take the Lease that
    /// long after they saw the edit, which came after our last write: the
    /// term's deadline is cut to that long after the write was sent. Whether
    /// it was cut (the caller renews, to write our duration back).
    fn ours(&mut self, run: &mut TermRun, lease: Lease) -> bool {
        self.memory.confirmed(&lease);
        let seconds = lease.spec.as_ref().and_then(|s| s.lease_duration_seconds);
        run.cached = lease;
        let edited = Duration::from_secs(seconds.map_or(0, |s| s.max(0).unsigned_abs().into()));
        // (A duration of at least the renew deadline moves nothing.)
        let cut = run.term.cut(run.sent + edited);
        if cut {
            warn!(
                lease_duration_seconds = seconds,
                left = ?run.term.deadline().saturating_duration_since(Instant::now()),
                "our lease record was edited to a lease duration shorter than the renew deadline: \
                 the term ends that much sooner unless a renewal writes ours back"
            );
        }
        cut
    }
}

/// What a read of the Lease during a term showed, when it did not end the term.
pub(in crate::elector) enum Read {
    /// Our term's record as we wrote it.
    Ours,
    /// Nothing: the read failed (logged), or was abandoned for a term that
    /// ended or that nobody wants any more. The term goes on unconfirmed,
    /// until the loop's next check.
    Unknown,
}
