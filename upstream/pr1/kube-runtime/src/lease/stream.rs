use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll, ready},
};

use futures::{FutureExt, Stream, future::BoxFuture};
use pin_project::pin_project;

use super::{LeaderElector, LeaseGuard, Lost};

/// A stream polled only while a [`LeaderElector`] leads: see
/// [`WatchStreamExt::with_leader_election`](crate::WatchStreamExt::with_leader_election).
#[pin_project]
#[must_use = "streams do nothing unless polled"]
pub struct WithLeaderElection<S> {
    #[pin]
    stream: Option<S>,
    acquire: Option<BoxFuture<'static, LeaseGuard>>,
    guard: Option<LeaseGuard>,
    lost: Option<Lost>,
}

impl<S> WithLeaderElection<S> {
    pub(crate) fn new(stream: S, elector: &LeaderElector) -> Self {
        WithLeaderElection {
            stream: Some(stream),
            acquire: Some(acquire(elector.clone()).boxed()),
            guard: None,
            lost: None,
        }
    }

    /// The guard of the term, once leadership was won and until the stream ended.
    #[must_use]
    pub fn guard(&self) -> Option<&LeaseGuard> {
        self.guard.as_ref()
    }

    /// Why the term ended, if the stream ended because leadership was lost.
    #[must_use]
    pub fn lost(&self) -> Option<Lost> {
        self.lost.clone()
    }
}

/// [`LeaderElector::acquire`] as a `'static` future.
pub(super) async fn acquire(elector: LeaderElector) -> LeaseGuard {
    elector.acquire().await
}

impl<S: Stream> Stream for WithLeaderElection<S> {
    type Item = S::Item;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<S::Item>> {
        let mut this = self.project();
        if this.stream.is_none() {
            return Poll::Ready(None);
        }
        if let Some(acquire) = this.acquire.as_mut() {
            *this.guard = Some(ready!(acquire.as_mut().poll(cx)));
            *this.acquire = None;
        }
        if let Some(guard) = this.guard.as_mut()
            && let Poll::Ready(lost) = Pin::new(guard).poll(cx)
        {
            // Dropped now: a Controller's reconcilers stop at their next `.await`.
            this.stream.set(None);
            *this.guard = None;
            *this.lost = Some(lost);
            return Poll::Ready(None);
        }
        let item = ready!(
            this.stream
                .as_mut()
                .as_pin_mut()
                .map_or(Poll::Ready(None), |s| s.poll_next(cx))
        );
        if item.is_none() {
            // The stream ended: the term's guard is dropped, and the Lease released.
            this.stream.set(None);
            *this.guard = None;
        }
        Poll::Ready(item)
    }
}
