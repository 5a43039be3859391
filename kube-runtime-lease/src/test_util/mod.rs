//! An in-memory double of the Lease API behind a real [`kube::Client`](kube_client::Client), so
//! that guarded streams and Controllers can be tested without a cluster, on
//! tokio's paused time (enable `tokio`'s `test-util` feature in your
//! dev-dependencies for that, as for `#[tokio::test(start_paused = true)]`).
//! <!-- upstream: omit -->
//! It is this crate's test kit for code it guards (the `test-util`
//! feature), which does not enable tokio's, so that it changes no clock: a
//! benchmark built with it measures the real one.
//! <!-- upstream: end -->
//!
//! The double serves any number of Leases, by namespace and name, with one
//! resourceVersion sequence for all (as etcd has): `get`, `create`, `update`
//! (with resourceVersion compare-and-swap, no-op updates, and create on
//! update as Leases allow), `delete` (with `preconditions` on the uid and
//! resourceVersion), `list` and `watch` (by namespace or
//! across namespaces, by `metadata.name`, by equality-based label
//! selectors), and the API server's validation of a Lease's spec (422).
//! [`FakeLeaseApi::lease`], [`take_over`](FakeLeaseApi::take_over) and
//! [`delete`](FakeLeaseApi::delete) act on the Lease created or put first;
//! [`lease_in`](FakeLeaseApi::lease_in), [`take_over_in`](FakeLeaseApi::take_over_in)
//! and [`delete_in`](FakeLeaseApi::delete_in) on any. Every other resource answers
//! an empty list, a watch that stays open, and 404 for an object by name, so
//! that a `Controller` of anything runs against it (it reconciles nothing);
//! faults, partitions and latency apply to Lease requests only. Another
//! candidate is simulated with [`FakeLeaseApi::take_over`] and
//! [`FakeLeaseApi::delete`]; requests are made to fail, arrive late, be
//! answered late or lose their answer with [`FakeLeaseApi::fault`]; a client
//! is cut off with [`FakeLeaseApi::partition`].
//! <!-- upstream: omit -->
//! The repository's differential test runs one script of operations against
//! this double and against a real kube-apiserver and asserts the same
//! outcomes.
//! <!-- upstream: end -->
//!
//! Requests are answered at once (unless delayed), so they take no paused
//! time: a loop that retries without waiting would spin for ever, and the
//! double aborts the process after [`REQUEST_BUDGET`] requests instead.
//!
//! ```
//! use std::sync::{Arc, atomic::{AtomicUsize, Ordering::SeqCst}};
//! use std::time::Duration;
//! use futures::StreamExt;
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kube_client::Api;
//! use kube_runtime::{Controller, controller::Action, watcher};
//! use kube_runtime_lease::{
//!     LeaderElectionControllerExt, LeaderElector, LeaseConfig, Lost, RunEnded, test_util::FakeLeaseApi,
//! };
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let runtime = tokio::runtime::Builder::new_current_thread().enable_all().start_paused(true).build()?;
//! runtime.block_on(async {
//!     let fake = FakeLeaseApi::default();
//!     let (client, _) = fake.client();
//!     let elector = LeaderElector::new(client.clone(), LeaseConfig::new("default", "my-controller", "me"))?;
//!     let mut status = elector.subscribe();
//!     // Counts the Controllers made (one per term) and those still running.
//!     let (made, running) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
//!     struct Running(Arc<AtomicUsize>);
//!     impl Drop for Running {
//!         fn drop(&mut self) {
//!             self.0.fetch_sub(1, SeqCst);
//!         }
//!     }
//!     // The guarded Controller, campaigning again after every loss.
//!     let run = tokio::spawn({
//!         let (elector, made, running) = (elector.clone(), made.clone(), running.clone());
//!         async move {
//!             elector
//!                 .run_each_term(|| {
//!                     made.fetch_add(1, SeqCst);
//!                     running.fetch_add(1, SeqCst);
//!                     let alive = Running(running.clone());
//!                     Controller::new(Api::<ConfigMap>::all(client.clone()), watcher::Config::default())
//!                         .with_leader_election(&elector)
//!                         .run(
//!                             |_cm, _ctx| async { Ok::<_, kube_client::Error>(Action::await_change()) },
//!                             |_cm, _err, _ctx| Action::requeue(Duration::from_secs(5)),
//!                             Arc::new(()),
//!                         )
//!                         // `alive` lives as long as this term's Controller.
//!                         .map(move |item| {
//!                             let _alive = &alive;
//!                             item
//!                         })
//!                 })
//!                 .await
//!         }
//!     });
//!     // This candidate creates the Lease, and leads after the creation hold.
//!     status.wait_for(|s| s.is_leader).await?;
//!     assert_eq!((made.load(SeqCst), running.load(SeqCst)), (1, 1));
//!     // Another candidate takes over: the Controller is dropped...
//!     fake.take_over("other");
//!     status.wait_for(|s| !s.is_leader).await?;
//!     tokio::time::sleep(Duration::from_millis(10)).await;
//!     assert_eq!(running.load(SeqCst), 0);
//!     assert_eq!(status.borrow().holder.as_deref(), Some("other"));
//!     // ...and a new one runs once the candidate leads again (the other
//!     // stopped renewing: its record expires).
//!     status.wait_for(|s| s.is_leader).await?;
//!     tokio::time::sleep(Duration::from_millis(10)).await;
//!     assert_eq!((made.load(SeqCst), running.load(SeqCst)), (2, 1));
//!     elector.shutdown(Duration::from_secs(1)).await?;
//!     assert_eq!(run.await?, RunEnded::Shutdown);
//!     assert_eq!(running.load(SeqCst), 0);
//!     Ok::<_, Box<dyn std::error::Error>>(())
//! })
//! # }
//! ```

#[cfg(feature = "coordinated")]
mod lease_candidates;
mod leases;
mod server;
#[cfg(test)]
mod tests;
mod wire;

use std::{
    collections::{BTreeMap, VecDeque},
    io::Write as _,
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use bytes::Bytes;
use futures::channel::mpsc;
use http::Request;
use k8s_openapi::{api::coordination::v1::Lease, apimachinery::pkg::apis::meta::v1::MicroTime};
use kube_client::{Client, client::Body};
use tokio::time::Instant;

/// A fault injected into one client's next matching requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// Answer with this HTTP status (no effect on the Lease). A 403 is the
    /// API server's authorization refusing the request (a missing RBAC rule).
    Status(u16),
    /// Answer 403 as admission refuses (no effect on the Lease), not
    /// authorization: a `create` as a `ResourceQuota` at its limit does
    /// (`exceeded quota`, with no cause), any other request as a validating
    /// admission policy does (`denied request`). No RBAC rule is missing.
    Admission,
    /// Answer with this HTTP status and this body, as JSON (no effect on the
    /// Lease): a `2xx` whose body is not the Lease asked for (`{}`, another
    /// object, a truncated one), as something in front of the API server
    /// may answer.
    Body(u16, &'static str),
    /// Answer with this HTTP status and a plain-text body, not a `Status`
    /// (no effect on the Lease): what a proxy or load balancer in front of
    /// the API server answers, such as `404 page not found`.
    PlainText(u16),
    /// Answer 404 with the API server's `Status` for a path it does not
    /// serve (reason `NotFound`, no details naming an object): what an API
    /// server answers while it is starting, or without the API group. It
    /// does not say that the object asked for does not exist.
    NoSuchResource,
    /// Wait this long, then handle the request.
    DelayRequest(Duration),
    /// Handle the request at once, answer after this long (the write takes effect early).
    DelayResponse(Duration),
    /// Handle the request (the write takes effect), then answer with this
    /// status instead of the result: what a client sees when its write was
    /// applied, answered 504, and its retry was answered 409.
    AppliedThenStatus(u16),
    /// Handle the request (the write takes effect), then lose the answer
    /// (the connection resets): the client cannot tell whether it applied.
    AppliedThenLost,
    /// Answer a `list` as of just before the last change of the Leases it
    /// selects, at the resourceVersion before that change (a watch started
    /// from it then delivers the change): what an API server's watch cache
    /// that lags answers to the `resourceVersion=0` lists of kube-runtime's
    /// watcher. With no such change, the list is answered as usual. Matches
    /// only a `list` request (other requests leave it queued).
    StaleList,
}

/// How many Lease requests one double answers, by default, before it aborts
/// the process (see [`FakeLeaseApi::with_request_budget`]): far more than a
/// test of minutes makes (a leader renewing every 2 s makes 1,800 an hour),
/// far fewer than a loop that retries without waiting makes in a few seconds.
pub const REQUEST_BUDGET: usize = 20_000;

/// Aborts the process once the double has answered [`REQUEST_BUDGET`]
/// requests: answered at once, requests take no paused time, so a loop that
/// retries without waiting (a bug) would spin for ever without reaching a
/// test's paused-time bound.
fn check_budget(s: &Store) {
    let budget = s.budget.unwrap_or(REQUEST_BUDGET);
    if s.received.len() >= budget {
        // To stderr itself: a test harness captures `eprintln!`, and its
        // capture is lost with the process.
        let _ = writeln!(
            std::io::stderr(),
            "test_util::FakeLeaseApi: more than {budget} requests on one double: a retry loop that \
             never waits (or a long test: see FakeLeaseApi::with_request_budget); aborting"
        );
        std::process::abort();
    }
}

/// One request received by the double (see [`FakeLeaseApi::requests`]).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Received {
    /// When the double received it (tokio's clock).
    pub at: Instant,
    /// The client's index (see [`FakeLeaseApi::client`]).
    pub client: usize,
    /// `get`, `create`, `update`, `delete`, `list`, `watch`, or `other`
    /// (`candidate ` and one of those for a `LeaseCandidate` request, whose
    /// `client` is `usize::MAX`).
    pub verb: &'static str,
    /// The object's name, for a request of one object (`get`, `update`,
    /// `delete`); `None` for a list, a watch or a create.
    pub name: Option<String>,
}

#[derive(Default)]
struct Store {
    /// Every Lease, by namespace and name.
    leases: BTreeMap<leases::Key, Lease>,
    /// The resourceVersion of the last change (of any Lease, as in etcd).
    rv: u64,
    /// Every change, in order: (resourceVersion, event type, the object).
    history: Vec<(u64, &'static str, Lease)>,
    watchers: Vec<leases::Watcher>,
    /// Lease watch events sent, by client.
    watch_events: BTreeMap<usize, u64>,
    /// Watches of other resources, kept open and silent.
    idle_watches: Vec<mpsc::UnboundedSender<Bytes>>,
    /// See [`FakeLeaseApi::with_request_budget`].
    budget: Option<usize>,
    /// The Lease created or put first: the one [`FakeLeaseApi::lease`],
    /// [`FakeLeaseApi::take_over`] and [`FakeLeaseApi::delete`] act on.
    served: Option<leases::Key>,
    received: Vec<Received>,
    clients: Vec<ClientFaults>,
    /// Events created, in order (see [`FakeLeaseApi::events`]).
    events: Vec<serde_json::Value>,
    /// Event creations are refused with authorization's 403 (see
    /// [`FakeLeaseApi::forbid_events`]).
    #[cfg(all(test, feature = "events"))]
    events_forbidden: bool,
    /// What the double serves of `LeaseCandidate`s.
    #[cfg(feature = "coordinated")]
    candidates: lease_candidates::Served,
}

#[derive(Default)]
struct ClientFaults {
    /// Faults for the next requests, in order, matched by verb (`None` = any verb).
    queue: VecDeque<(Option<&'static str>, Fault)>,
    /// Every request fails as if the API server were unreachable.
    partitioned: bool,
    /// Every request (other than watches) is delayed this long before it is handled.
    latency: Duration,
    /// Every event of the Lease watches opened from now on is delivered this
    /// long after it happened (a watch that lags).
    watch_latency: Duration,
    /// Watches are refused with 403.
    watch_forbidden: bool,
}

/// The double: its Leases (and `LeaseCandidates`, and Events), shared by every
/// client made from it.
#[derive(Clone, Default)]
pub struct FakeLeaseApi {
    store: Arc<Mutex<Store>>,
}

impl std::fmt::Debug for FakeLeaseApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let store = self.lock();
        f.debug_struct("FakeLeaseApi")
            .field("leases", &store.leases.len())
            .field("resource_version", &store.rv)
            .field("clients", &store.clients.len())
            .field("requests", &store.received.len())
            .finish_non_exhaustive()
    }
}

impl FakeLeaseApi {
    fn lock(&self) -> MutexGuard<'_, Store> {
        // A test that panicked while holding the lock leaves consistent data.
        self.store
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The faults of `client`, which must be an index [`client`](Self::client)
    /// returned: a test's mistake otherwise, told as such.
    fn client_faults(store: &mut Store, client: usize) -> &mut ClientFaults {
        let clients = store.clients.len();
        store.clients.get_mut(client).unwrap_or_else(|| {
            panic!("FakeLeaseApi: client {client} was never handed out by `client()` ({clients} were)")
        })
    }

    /// A double that aborts the process after `budget` Lease requests
    /// instead of [`REQUEST_BUDGET`] (for a test that runs for many paused
    /// hours).
    #[must_use]
    pub fn with_request_budget(self, budget: usize) -> Self {
        self.lock().budget = Some(budget);
        self
    }

    /// A new client of the double, and its index for faults.
    #[must_use]
    pub fn client(&self) -> (Client, usize) {
        let id = {
            let mut s = self.lock();
            s.clients.push(ClientFaults::default());
            s.clients.len() - 1
        };
        let api = self.clone();
        let svc = tower::service_fn(move |req: Request<Body>| {
            let api = api.clone();
            async move { api.handle(id, req).await }
        });
        (Client::new(svc, "default"), id)
    }

    /// Queues `fault` for `client`'s next request of `verb` (`None`: any verb).
    ///
    /// # Panics
    /// If `client` is not an index [`client`](Self::client) returned.
    pub fn fault(&self, client: usize, verb: Option<&'static str>, fault: Fault) {
        Self::client_faults(&mut self.lock(), client)
            .queue
            .push_back((verb, fault));
    }

    /// Drops every fault still queued for the next requests.
    pub fn clear_faults(&self) {
        for c in &mut self.lock().clients {
            c.queue.clear();
        }
    }

    /// Cuts `client` off (every request fails as if the API server were
    /// unreachable, its watches end), or reconnects it.
    ///
    /// # Panics
    /// If `client` is not an index [`client`](Self::client) returned.
    pub fn partition(&self, client: usize, partitioned: bool) {
        let mut s = self.lock();
        Self::client_faults(&mut s, client).partitioned = partitioned;
        if partitioned {
            s.cut_watches(client);
        }
    }

    /// Keeps `client`'s open Lease watches open but silent from now on, as a
    /// connection that stalled (no event, no error, no end).
    pub fn stall_watches(&self, client: usize) {
        self.lock().stall_watches(client);
    }

    /// Ends every Lease watch with a `410 Gone` error event, as an API server does
    /// when etcd compacted past a watch's resourceVersion: watchers re-list.
    pub fn expire_watches(&self) {
        self.lock().end_watches(&server::gone_event_line());
    }

    /// The API server restarted on etcd data restored from a snapshot taken
    /// at resourceVersion `rv`: the Leases as they were then, the revision
    /// moved back (later writes reuse versions already seen), and every
    /// watch ended with `410 Gone`.
    pub fn restore(&self, rv: u64) {
        let mut s = self.lock();
        s.restore(rv);
        s.end_watches(&server::gone_event_line());
    }

    /// Delays every request of `client` (other than watches) this long.
    ///
    /// # Panics
    /// If `client` is not an index [`client`](Self::client) returned.
    pub fn set_latency(&self, client: usize, latency: Duration) {
        Self::client_faults(&mut self.lock(), client).latency = latency;
    }

    /// Delivers every event of `client`'s Lease watches opened from now on
    /// `latency` after it happened, in order (a watch that lags: a slow
    /// watch cache or a congested connection); its other requests are
    /// answered as before.
    ///
    /// # Panics
    /// If `client` is not an index [`client`](Self::client) returned.
    pub fn set_watch_latency(&self, client: usize, latency: Duration) {
        Self::client_faults(&mut self.lock(), client).watch_latency = latency;
    }

    /// Refuses `client`'s lists and watches with 403 (RBAC without them).
    ///
    /// # Panics
    /// If `client` is not an index [`client`](Self::client) returned.
    pub fn forbid_watch(&self, client: usize) {
        Self::client_faults(&mut self.lock(), client).watch_forbidden = true;
    }

    /// Serves `client`'s lists and watches again after
    /// [`forbid_watch`](Self::forbid_watch) (a 403 that passes, as from an
    /// apiserver whose authorization cache was not synced yet).
    ///
    /// # Panics
    /// If `client` is not an index [`client`](Self::client) returned.
    pub fn allow_watch(&self, client: usize) {
        Self::client_faults(&mut self.lock(), client).watch_forbidden = false;
    }

    /// Refuses (or serves again) the creation of Events with
    /// authorization's 403: a Role without `create` on `events`.
    #[cfg(all(test, feature = "events"))]
    pub(crate) fn forbid_events(&self, forbidden: bool) {
        self.lock().events_forbidden = forbidden;
    }

    /// The Events created through this double so far, as JSON,
    /// in order (every Event POST is accepted; an update of an Event series,
    /// a merge patch, is applied to the Event it names, as the API server
    /// does).
    #[must_use]
    pub fn events(&self) -> Vec<serde_json::Value> {
        self.lock().events.clone()
    }

    /// The Lease watch events sent so far to the watches of `client` (each
    /// change a watch selects is one event, as the API server counts them
    /// in `apiserver_watch_events_total`).
    #[must_use]
    pub fn watch_events(&self, client: usize) -> u64 {
        self.lock().watch_events.get(&client).copied().unwrap_or(0)
    }

    /// The Lease created or put first, as stored now (see
    /// [`lease_in`](Self::lease_in) for any other).
    #[must_use]
    pub fn lease(&self) -> Option<Lease> {
        let s = self.lock();
        s.served.as_ref().and_then(|k| s.leases.get(k)).cloned()
    }

    /// The Lease `name` in `namespace`, as stored now.
    #[must_use]
    pub fn lease_in(&self, namespace: &str, name: &str) -> Option<Lease> {
        self.lock()
            .leases
            .get(&(namespace.to_owned(), name.to_owned()))
            .cloned()
    }

    /// Every Lease stored now, by namespace and name.
    #[must_use]
    pub fn leases(&self) -> Vec<Lease> {
        self.lock().leases.values().cloned().collect()
    }

    /// Every request received so far, in order.
    #[must_use]
    pub fn requests(&self) -> Vec<Received> {
        self.lock().received.clone()
    }

    /// Writes a Lease directly (as another actor would), bumping its
    /// resourceVersion: the one its metadata names (namespace `default` and
    /// name `lease` when it names none), keeping the stored object's uid.
    pub fn put(&self, mut lease: Lease) {
        lease
            .metadata
            .namespace
            .get_or_insert_with(|| "default".to_owned());
        lease.metadata.name.get_or_insert_with(|| "lease".to_owned());
        let mut s = self.lock();
        let stored = s.leases.get(&leases::key(&lease));
        let kind = if stored.is_some() { "MODIFIED" } else { "ADDED" };
        if lease.metadata.uid.is_none() {
            lease.metadata.uid = stored.and_then(|l| l.metadata.uid.clone());
        }
        s.store(lease, kind);
    }

    /// Another candidate, `holder`, takes the Lease created or put first
    /// over now (see [`take_over_in`](Self::take_over_in)).
    pub fn take_over(&self, holder: &str) {
        let (namespace, name) = self
            .lock()
            .served
            .clone()
            .unwrap_or_else(|| ("default".to_owned(), "lease".to_owned()));
        self.take_over_in(&namespace, &name, holder);
    }

    /// Another candidate, `holder`, takes the Lease `name` in `namespace`
    /// over now: a record naming it, acquired and renewed now, with one more
    /// transition and the current record's lease duration (15 s if there is
    /// none). It then never renews: the record expires one lease duration
    /// later, as after a crash.
    pub fn take_over_in(&self, namespace: &str, name: &str, holder: &str) {
        let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
        let mut lease = self.lease_in(namespace, name).unwrap_or_default();
        let spec = lease.spec.get_or_insert_with(Default::default);
        spec.holder_identity = Some(holder.to_owned());
        spec.lease_duration_seconds = Some(spec.lease_duration_seconds.unwrap_or(15));
        spec.lease_transitions = Some(spec.lease_transitions.map_or(0, |t| t.saturating_add(1)));
        spec.acquire_time = Some(now.clone());
        spec.renew_time = Some(now);
        lease.metadata.namespace = Some(namespace.to_owned());
        lease.metadata.name = Some(name.to_owned());
        self.put(lease);
    }

    /// Deletes the Lease created or put first (as an admin would), telling
    /// its watchers (see [`delete_in`](Self::delete_in)).
    pub fn delete(&self) {
        let mut s = self.lock();
        if let Some(k) = s.served.clone() {
            s.remove(&k);
        }
    }

    /// Deletes the Lease `name` in `namespace` (as an admin would), telling
    /// its watchers.
    pub fn delete_in(&self, namespace: &str, name: &str) {
        self.lock().remove(&(namespace.to_owned(), name.to_owned()));
    }
}
