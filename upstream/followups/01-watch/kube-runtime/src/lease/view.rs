use futures::{StreamExt, stream::BoxStream};
use k8s_openapi::api::coordination::v1::Lease;
use kube_client::Api;

use super::record;
use crate::{WatchStreamExt, watcher};

/// The Lease as the watch last delivered it.
#[derive(Clone)]
pub(crate) enum Seen {
    /// The watch is not in sync (not listed yet, or failed since): the election reads.
    Unknown,
    /// The Lease does not exist.
    Missing,
    /// The Lease as it is.
    Lease(Box<Lease>),
}

/// The election's view of its Lease through [`watcher::watch_object`], with
/// [`WatchStreamExt::default_backoff`].
///
/// While the watch is in sync, the election acts on what it delivers: no read before a write,
/// and no polling. When the watch is refused (no `list`/`watch` permission on Leases) or
/// failing, the election reads and polls every retry period, as it does without a watch,
/// while the backoff opens the watch again.
pub(crate) struct View {
    watch: BoxStream<'static, watcher::Result<Option<Lease>>>,
    seen: Seen,
    warned: bool,
}

impl View {
    pub(crate) fn new(api: Api<Lease>, name: &str) -> Self {
        View {
            watch: watcher::watch_object(api, name).default_backoff().boxed(),
            seen: Seen::Unknown,
            warned: false,
        }
    }

    /// The Lease as the watch last delivered it.
    pub(crate) fn seen(&self) -> Seen {
        self.seen.clone()
    }

    /// Whether the watch, in sync, shows the Lease gone or held by another than `identity`.
    pub(crate) fn shows_other_than(&self, identity: &str) -> bool {
        match &self.seen {
            Seen::Unknown => false,
            Seen::Missing => true,
            Seen::Lease(lease) => lease.spec.as_ref().and_then(record::holder) != Some(identity),
        }
    }

    /// Waits for the next change of the view: a delivery, or the watch falling out of sync.
    pub(crate) async fn changed(&mut self) {
        loop {
            match self.watch.next().await {
                Some(Ok(lease)) => {
                    self.warned = false;
                    self.seen = lease.map_or(Seen::Missing, |l| Seen::Lease(Box::new(l)));
                    return;
                }
                Some(Err(error)) => {
                    if !self.warned {
                        tracing::warn!(%error, "cannot watch the lease: polling every retry period");
                        self.warned = true;
                    }
                    if !matches!(std::mem::replace(&mut self.seen, Seen::Unknown), Seen::Unknown) {
                        return;
                    }
                }
                // The watcher's stream does not end; if it did, the view would stay as it is.
                None => futures::future::pending().await,
            }
        }
    }
}
