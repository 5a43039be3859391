//! Ending a term: why it ended, and the release, which writes the Lease free
//! only when leadership was given up and the guarded work had ended first.

use std::sync::Arc;

use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::{Task, lead::TermRun};
use crate::{elector::Transition, error::Result, record, term::Lost};

impl Task {
    /// Ends the term for `reason`, releasing the Lease only when leadership
    /// was given up and the guarded work had ended before the term did.
    pub(in crate::elector) async fn end_term(&mut self, run: &TermRun, reason: &Lost) -> Result<()> {
        let term = &run.term;
        // Status first, so that subscribers see no leader once a guard resolves.
        self.inner.not_leading();
        term.lose(reason);
        self.inner.lock().term.take_if(|t| Arc::ptr_eq(t, term));
        if run.phase == super::lead::Phase::Leading {
            self.inner.observers.tell(Transition::TermEnded {
                reason,
                uid: run.cached.metadata.uid.as_deref(),
            });
        }
        if matches!(reason, Lost::TakenOver { holder } if *holder == self.inner.config.identity) {
            // Another process with our identity wrote the record (renewing
            // our term as its own, or taking it): it is not our term's any
            // more, whatever it still shares with it, and is waited out like
            // anyone else's.
            self.memory.last_term = None;
        }
        self.memory.term_ended(term, &self.inner.config);
        let wants_release = match reason {
            Lost::Shutdown | Lost::GivenUp | Lost::SteppedDown { .. } => {
                info!(%reason, "leadership ended");
                matches!(reason, Lost::SteppedDown { .. }) || self.config().release_on_drop
            }
            // (`ElectorStopped` is set only by a task's drop, never here.)
            _ => {
                warn!(%reason, "leadership lost");
                false
            }
        };
        let result = if !wants_release {
            Ok(())
        } else if run.phase.hold().is_some() {
            info!("not releasing during the creation hold: the lease will expire instead");
            Ok(())
        } else if let Some(until) = self.memory.stopped_until.filter(|u| *u > Instant::now()) {
            warn!(
                left = ?until.saturating_duration_since(Instant::now()),
                "guarded work was stopped, not finished, too recently (requests it sent may still land): \
                 not releasing; the lease will expire after its lease duration"
            );
            Ok(())
        } else {
            let until = record::later(Instant::now(), self.config().release_timeout);
            (self.release(until).await).inspect_err(|e| self.log_error("releasing the lease", e))
        };
        self.needs_read = true;
        result
    }

    /// Fetches the Lease and, if it still holds a record of our term renewed
    /// last by us (`Memory::is_last_term`: not one another process with our
    /// identity renewed since, which leads on it now), writes it free; a
    /// conflict (the Lease modified between the read and the write) is
    /// retried once after a fresh read, as client-go does.
    pub(in crate::elector) async fn release(&mut self, until: Instant) -> Result<()> {
        let left = || until.saturating_duration_since(Instant::now());
        // The record our last release sent (`None`: none sent yet).
        let mut sent: Option<k8s_openapi::api::coordination::v1::LeaseSpec> = None;
        loop {
            let Some(mut lease) = self.get(left()).await? else {
                return Ok(());
            };
            // Our release, applied though answered 409 (a 504 retried by the
            // client, whose retry met our own write): released.
            let read = lease.spec.as_ref();
            if let (Some(read), Some(sent)) = (read, &sent)
                && record::same_write(read, sent)
            {
                info!("released lease (the release answered with a conflict had been applied)");
                return Ok(());
            }
            if !self.memory.is_last_term(&lease) {
                info!(
                    holder = lease.spec.as_ref().and_then(record::holder).unwrap_or(""),
                    "not releasing: the lease no longer holds our term's record as we wrote it last"
                );
                return Ok(());
            }
            let spec = lease.spec.take().unwrap_or_default();
            lease.spec = Some(record::released(&spec, record::now()));
            // Retried once: the second attempt is the one sent after another.
            let retried = std::mem::replace(&mut sent, lease.spec.clone()).is_some();
            match self.inner.api.replace(&lease, left()).await {
                Ok(released) => {
                    self.see(Some(released), Instant::now());
                    info!("released lease");
                    return Ok(());
                }
                Err(e) if e.is_conflict() && !retried => {
                    debug!("the release conflicted; re-reading the lease");
                }
                Err(e) => return Err(e),
            }
        }
    }
}
