//! A test kit for code guarded by this crate (the `test-util` feature): an
//! in-memory double of the Lease API behind a real [`kube::Client`](kube_client::Client), so
//! that guarded streams and Controllers can be tested without a cluster, on
//! tokio's paused time (the feature enables `tokio/test-util`).
//!
//! The double serves one Lease (the namespace and name of its first
//! `create` or [`FakeLeaseApi::put`]; use one double per Lease): `get`,
//! `create`, `update` (with resourceVersion compare-and-swap, and create on
//! update as Leases allow), `delete`, `list` and `watch`, and the API
//! server's validation of a Lease's spec (422). Every other resource answers
//! an empty list, a watch that stays open, and 404 for an object by name, so
//! that a `Controller` of anything runs against it (it reconciles nothing);
//! faults, partitions and latency apply to Lease requests only. Another
//! candidate is simulated with [`FakeLeaseApi::take_over`] and
//! [`FakeLeaseApi::delete`]; requests are made to fail, arrive late, be
//! answered late or lose their answer with [`FakeLeaseApi::fault`]; a client
//! is cut off with [`FakeLeaseApi::partition`]. The repository's
//! differential test runs one script of operations against this double and
//! against a real kube-apiserver and asserts the same outcomes.
//!
//! Requests are answered at once (unless delayed), so they take no paused
//! time: a loop that retries without waiting would spin for ever, and the
//! double aborts the process after [`REQUEST_BUDGET`] requests instead.
//!
//! ```
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
//!     // The guarded Controller, campaigning again after every loss.
//!     let run = tokio::spawn({
//!         let elector = elector.clone();
//!         async move {
//!             elector
//!                 .run_each_term(|| {
//!                     Controller::new(Api::<ConfigMap>::all(client.clone()), watcher::Config::default())
//!                         .with_leader_election(&elector)
//!                         .run(
//!                             |_cm, _ctx| async { Ok::<_, kube_client::Error>(Action::await_change()) },
//!                             |_cm, _err, _ctx| Action::requeue(Duration::from_secs(5)),
//!                             std::sync::Arc::new(()),
//!                         )
//!                 })
//!                 .await
//!         }
//!     });
//!     // This candidate creates the Lease, and leads after the creation hold.
//!     status.wait_for(|s| s.is_leader).await?;
//!     // Another candidate takes over: the Controller stops...
//!     fake.take_over("other");
//!     status.wait_for(|s| !s.is_leader).await?;
//!     // ...and the candidate leads again once the other stops renewing.
//!     status.wait_for(|s| s.is_leader).await?;
//!     elector.shutdown(Duration::from_secs(1)).await?;
//!     assert_eq!(run.await?, RunEnded::Shutdown);
//!     Ok::<_, Box<dyn std::error::Error>>(())
//! })
//! # }
//! ```

use std::{
    collections::VecDeque,
    convert::Infallible,
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use bytes::Bytes;
use futures::{StreamExt, channel::mpsc};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody, combinators::UnsyncBoxBody};
use k8s_openapi::{api::coordination::v1::Lease, apimachinery::pkg::apis::meta::v1::MicroTime};
use kube_client::{Client, client::Body};
use serde_json::json;
use tokio::time::Instant;

type ResBody = UnsyncBoxBody<Bytes, Infallible>;

/// A fault injected into one client's next matching requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// Answer with this HTTP status (no effect on the Lease).
    Status(u16),
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
    if s.seen.len() >= budget {
        eprintln!(
            "test_util::FakeLeaseApi: more than {budget} requests on one double: a retry loop that \
             never waits (or a long test: see FakeLeaseApi::with_request_budget); aborting"
        );
        std::process::abort();
    }
}

/// One Lease request seen by the double.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Seen {
    /// When the double received it (tokio's clock).
    pub at: Instant,
    /// The client's index (see [`FakeLeaseApi::client`]).
    pub client: usize,
    /// `get`, `create`, `update`, `delete`, `list`, `watch`, or `other`.
    pub verb: &'static str,
}

#[derive(Default)]
struct Store {
    lease: Option<Lease>,
    rv: u64,
    history: Vec<(u64, &'static str, Lease)>,
    watchers: Vec<(usize, mpsc::UnboundedSender<Bytes>)>,
    /// Watches of other resources, kept open and silent.
    idle_watches: Vec<mpsc::UnboundedSender<Bytes>>,
    /// See [`FakeLeaseApi::with_request_budget`].
    budget: Option<usize>,
    /// The namespace and name of the Lease this double serves: set by the
    /// first `create` or [`FakeLeaseApi::put`].
    served: Option<(String, String)>,
    seen: Vec<Seen>,
    clients: Vec<ClientFaults>,
}

#[derive(Default)]
struct ClientFaults {
    /// Faults for the next requests, in order, matched by verb (`None` = any verb).
    queue: VecDeque<(Option<&'static str>, Fault)>,
    /// Every request fails as if the API server were unreachable.
    partitioned: bool,
    /// Every request (other than watches) is delayed this long before it is handled.
    latency: Duration,
    /// Watches are refused with 403.
    watch_forbidden: bool,
}

/// The double: one Lease, shared by every client made from it.
#[derive(Clone, Default)]
pub struct FakeLeaseApi {
    store: Arc<Mutex<Store>>,
}

impl FakeLeaseApi {
    fn lock(&self) -> MutexGuard<'_, Store> {
        // A test that panicked while holding the lock leaves consistent data.
        self.store
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
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
    pub fn fault(&self, client: usize, verb: Option<&'static str>, fault: Fault) {
        self.lock().clients[client].queue.push_back((verb, fault));
    }

    /// Drops every fault still queued for the next requests.
    pub fn clear_faults(&self) {
        for c in &mut self.lock().clients {
            c.queue.clear();
        }
    }

    /// Cuts `client` off (every request fails as if the API server were
    /// unreachable, its watches end), or reconnects it.
    pub fn partition(&self, client: usize, partitioned: bool) {
        let mut s = self.lock();
        s.clients[client].partitioned = partitioned;
        if partitioned {
            s.watchers.retain(|(c, _)| *c != client);
        }
    }

    /// Delays every request of `client` (other than watches) this long.
    pub fn set_latency(&self, client: usize, latency: Duration) {
        self.lock().clients[client].latency = latency;
    }

    /// Refuses `client`'s lists and watches with 403 (RBAC without them).
    pub fn forbid_watch(&self, client: usize) {
        self.lock().clients[client].watch_forbidden = true;
    }

    /// The Lease as stored now.
    pub fn lease(&self) -> Option<Lease> {
        self.lock().lease.clone()
    }

    /// Every request received so far, in order.
    pub fn seen(&self) -> Vec<Seen> {
        self.lock().seen.clone()
    }

    /// Writes the Lease directly (as another actor would), bumping its resourceVersion.
    pub fn put(&self, mut lease: Lease) {
        let mut s = self.lock();
        if s.served.is_none() {
            s.served = Some((
                lease
                    .metadata
                    .namespace
                    .clone()
                    .unwrap_or_else(|| "default".to_owned()),
                lease.metadata.name.clone().unwrap_or_else(|| "lease".to_owned()),
            ));
        }
        s.rv += 1;
        lease.metadata.resource_version = Some(s.rv.to_string());
        let kind = if s.lease.is_some() { "MODIFIED" } else { "ADDED" };
        if lease.metadata.uid.is_none() {
            lease.metadata.uid = s
                .lease
                .as_ref()
                .and_then(|l| l.metadata.uid.clone())
                .or_else(|| Some(format!("uid-{}", s.rv)));
        }
        s.lease = Some(lease.clone());
        Self::emit(&mut s, kind, &lease);
    }

    /// Another candidate, `holder`, takes the Lease over now: a record naming
    /// it, acquired and renewed now, with one more transition and the current
    /// record's lease duration (15 s if there is none). It then never renews:
    /// the record expires one lease duration later, as after a crash.
    pub fn take_over(&self, holder: &str) {
        let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
        let mut lease = self.lease().unwrap_or_default();
        let spec = lease.spec.get_or_insert_with(Default::default);
        spec.holder_identity = Some(holder.to_owned());
        spec.lease_duration_seconds = Some(spec.lease_duration_seconds.unwrap_or(15));
        spec.lease_transitions = Some(spec.lease_transitions.map_or(0, |t| t.saturating_add(1)));
        spec.acquire_time = Some(now.clone());
        spec.renew_time = Some(now);
        lease.metadata.name.get_or_insert_with(|| "lease".to_owned());
        self.put(lease);
    }

    /// Deletes the Lease (as an admin would), telling its watchers.
    pub fn delete(&self) {
        let mut s = self.lock();
        if let Some(mut lease) = s.lease.take() {
            s.rv += 1;
            lease.metadata.resource_version = Some(s.rv.to_string());
            Self::emit(&mut s, "DELETED", &lease);
        }
    }

    fn emit(s: &mut Store, kind: &'static str, lease: &Lease) {
        let rv = s.rv;
        s.history.push((rv, kind, lease.clone()));
        let line = Self::event_line(kind, lease);
        s.watchers
            .retain(|(_, tx)| tx.unbounded_send(line.clone()).is_ok());
    }

    fn event_line(kind: &str, lease: &Lease) -> Bytes {
        let mut v = serde_json::to_vec(&json!({ "type": kind, "object": with_type(lease) })).unwrap();
        v.push(b'\n');
        v.into()
    }

    async fn handle(&self, client: usize, req: Request<Body>) -> Result<Response<ResBody>, std::io::Error> {
        let method = req.method().clone();
        let path = req.uri().path().to_owned();
        let query = req.uri().query().unwrap_or("").to_owned();
        let body = req
            .into_body()
            .collect()
            .await
            .map_err(std::io::Error::other)?
            .to_bytes();
        let is_watch = query.contains("watch=true");
        let target = Target::of(&path);
        if target.resource != "leases" {
            return Ok(self.other_resource(&method, is_watch, target.name.is_some()));
        }
        if let Some(refused) = self.another_lease(&target, &method, is_watch, &query, &body) {
            return Ok(refused);
        }
        let named = target.name;
        let verb: &'static str = match (&method, &named, is_watch) {
            (&Method::GET, Some(_), _) => "get",
            (&Method::GET, None, true) => "watch",
            (&Method::GET, None, false) => "list",
            (&Method::POST, _, _) => "create",
            (&Method::PUT, _, _) => "update",
            (&Method::DELETE, Some(_), _) => "delete",
            _ => "other",
        };
        let (fault, latency, forbidden) = {
            let mut s = self.lock();
            check_budget(&s);
            s.seen.push(Seen {
                at: Instant::now(),
                client,
                verb,
            });
            let c = &mut s.clients[client];
            if c.partitioned {
                return Err(cut_off(std::io::ErrorKind::ConnectionRefused));
            }
            let pos = c.queue.iter().position(|(v, _)| v.is_none_or(|v| v == verb));
            let fault = pos.and_then(|p| c.queue.remove(p)).map(|(_, f)| f);
            (
                fault,
                c.latency,
                c.watch_forbidden && matches!(verb, "watch" | "list"),
            )
        };
        if verb != "watch" && !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        if forbidden {
            return Ok(status(403, "Forbidden", "leases is forbidden"));
        }
        let mut respond_after = Duration::ZERO;
        match fault {
            Some(Fault::Status(code)) => return Ok(status(code, "Injected", "injected fault")),
            Some(Fault::DelayRequest(d)) => {
                // As on a real network, a request the client gave up on may still arrive.
                let api = self.clone();
                let handle = tokio::spawn(async move {
                    tokio::time::sleep(d).await;
                    api.apply(client, verb, &query, &body)
                });
                return handle.await.map_err(std::io::Error::other);
            }
            Some(Fault::DelayResponse(d)) => respond_after = d,
            Some(Fault::AppliedThenLost) => {
                let _ = self.apply(client, verb, &query, &body);
                return Err(std::io::Error::new(
                    std::io::ErrorKind::ConnectionReset,
                    "injected: the answer was lost after the write was applied",
                ));
            }
            Some(Fault::AppliedThenStatus(code)) => {
                let _ = self.apply(client, verb, &query, &body);
                return Ok(status(
                    code,
                    "Injected",
                    "injected fault after the write was applied",
                ));
            }
            None => {}
        }
        if self.lock().clients[client].partitioned {
            return Err(cut_off(std::io::ErrorKind::ConnectionReset));
        }
        let resp = self.apply(client, verb, &query, &body);
        if !respond_after.is_zero() {
            tokio::time::sleep(respond_after).await;
            if self.lock().clients[client].partitioned {
                return Err(cut_off(std::io::ErrorKind::ConnectionReset));
            }
        }
        Ok(resp)
    }

    /// Any resource other than Leases: an empty list, a watch that stays
    /// open, and nothing to get or write.
    fn other_resource(&self, method: &Method, is_watch: bool, named: bool) -> Response<ResBody> {
        let listing = *method == Method::GET && !named;
        match (listing, is_watch) {
            (true, true) => {
                let (tx, rx) = mpsc::unbounded::<Bytes>();
                self.lock().idle_watches.push(tx);
                let stream = rx.map(|b| Ok::<_, Infallible>(http_body::Frame::data(b)));
                Response::builder()
                    .status(200)
                    .body(StreamBody::new(stream).boxed_unsync())
                    .unwrap()
            }
            (true, false) => ok(&json!({
                "apiVersion": "v1", "kind": "List", "metadata": { "resourceVersion": "1" }, "items": [],
            })),
            (false, _) => status(404, "NotFound", "the double serves only leases"),
        }
    }

    /// A request for a Lease other than the one this double serves (another
    /// namespace or name): lists and watches of it are empty, reads find
    /// nothing, writes are refused (use one double per Lease).
    fn another_lease(
        &self,
        target: &Target,
        method: &Method,
        is_watch: bool,
        query: &str,
        body: &[u8],
    ) -> Option<Response<ResBody>> {
        let mut s = self.lock();
        let body_name = || {
            serde_json::from_slice::<Lease>(body)
                .ok()
                .and_then(|l| l.metadata.name)
        };
        let name = target
            .name
            .clone()
            .or_else(|| field_selector_name(query))
            .or_else(|| (*method == Method::POST).then(body_name).flatten());
        if s.served.is_none()
            && *method == Method::POST
            && let (Some(ns), Some(name)) = (&target.namespace, &name)
        {
            s.served = Some((ns.clone(), name.clone()));
        }
        let (ns, served) = s.served.as_ref()?;
        let other =
            target.namespace.as_ref().is_some_and(|n| n != ns) || name.as_ref().is_some_and(|n| n != served);
        if !other {
            return None;
        }
        Some(match (method, is_watch) {
            (&Method::GET, true) => {
                let (tx, rx) = mpsc::unbounded::<Bytes>();
                s.idle_watches.push(tx);
                let stream = rx.map(|b| Ok::<_, Infallible>(http_body::Frame::data(b)));
                Response::builder()
                    .status(200)
                    .body(StreamBody::new(stream).boxed_unsync())
                    .unwrap()
            }
            (&Method::GET, false) if target.name.is_none() => ok(&json!({
                "apiVersion": "coordination.k8s.io/v1", "kind": "LeaseList",
                "metadata": { "resourceVersion": s.rv.to_string() }, "items": [],
            })),
            (&Method::GET | &Method::DELETE, _) => status(404, "NotFound", "leases not found"),
            _ => status(
                403,
                "Forbidden",
                "the fake Lease API serves one Lease: use one FakeLeaseApi per Lease",
            ),
        })
    }

    fn apply(&self, client: usize, verb: &str, query: &str, body: &[u8]) -> Response<ResBody> {
        let mut s = self.lock();
        match verb {
            "get" => match &s.lease {
                Some(l) => ok(&with_type(l)),
                None => status(404, "NotFound", "leases not found"),
            },
            "list" => {
                let items: Vec<_> = s.lease.iter().map(with_type).collect();
                ok(&json!({
                    "apiVersion": "coordination.k8s.io/v1", "kind": "LeaseList",
                    "metadata": { "resourceVersion": s.rv.to_string() }, "items": items,
                }))
            }
            "watch" => {
                let from: u64 = query
                    .split('&')
                    .find_map(|kv| kv.strip_prefix("resourceVersion="))
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(s.rv);
                let (tx, rx) = mpsc::unbounded();
                for (rv, kind, lease) in &s.history {
                    if *rv > from {
                        let _ = tx.unbounded_send(Self::event_line(kind, lease));
                    }
                }
                s.watchers.push((client, tx));
                let stream = rx.map(|b| Ok::<_, Infallible>(http_body::Frame::data(b)));
                Response::builder()
                    .status(200)
                    .body(StreamBody::new(stream).boxed_unsync())
                    .unwrap()
            }
            "create" => {
                let Ok(mut lease) = serde_json::from_slice::<Lease>(body) else {
                    return status(400, "BadRequest", "bad body");
                };
                // Validation comes first, as in the API server.
                if let Some(invalid) = invalid_spec(&lease) {
                    return status(422, "Invalid", invalid);
                }
                if s.lease.is_some() {
                    return status(409, "AlreadyExists", "leases already exists");
                }
                s.rv += 1;
                lease.metadata.resource_version = Some(s.rv.to_string());
                lease.metadata.uid = Some(format!("uid-{}", s.rv));
                s.lease = Some(lease.clone());
                Self::emit(&mut s, "ADDED", &lease);
                created(&with_type(&lease))
            }
            "update" => Self::update(&mut s, body),
            "delete" => match s.lease.take() {
                Some(mut lease) => {
                    s.rv += 1;
                    lease.metadata.resource_version = Some(s.rv.to_string());
                    Self::emit(&mut s, "DELETED", &lease);
                    ok(&with_type(&lease))
                }
                None => status(404, "NotFound", "leases not found"),
            },
            _ => status(405, "MethodNotAllowed", "not supported by the double"),
        }
    }
    /// A `replace`: compare-and-swap on the resourceVersion; create on
    /// update (Leases allow it) unless the write names a uid that is gone.
    fn update(s: &mut Store, body: &[u8]) -> Response<ResBody> {
        let Ok(mut lease) = serde_json::from_slice::<Lease>(body) else {
            return status(400, "BadRequest", "bad body");
        };
        let Some(current) = &s.lease else {
            // Leases allow create on update; a write that names the
            // uid of an object that is gone fails its precondition.
            if lease.metadata.uid.is_some() {
                return status(
                    409,
                    "Conflict",
                    "Precondition failed: UID in precondition does not match",
                );
            }
            if let Some(invalid) = invalid_spec(&lease) {
                return status(422, "Invalid", invalid);
            }
            s.rv += 1;
            lease.metadata.resource_version = Some(s.rv.to_string());
            lease.metadata.uid = Some(format!("uid-{}", s.rv));
            s.lease = Some(lease.clone());
            Self::emit(s, "ADDED", &lease);
            return created(&with_type(&lease));
        };
        if lease.metadata.resource_version != current.metadata.resource_version
            || lease
                .metadata
                .uid
                .as_ref()
                .is_some_and(|u| Some(u) != current.metadata.uid.as_ref())
        {
            return status(409, "Conflict", "the object has been modified");
        }
        if let Some(invalid) = invalid_spec(&lease) {
            return status(422, "Invalid", invalid);
        }
        // The server keeps the object's identity.
        lease.metadata.uid.clone_from(&current.metadata.uid);
        s.rv += 1;
        lease.metadata.resource_version = Some(s.rv.to_string());
        s.lease = Some(lease.clone());
        Self::emit(s, "MODIFIED", &lease);
        ok(&with_type(&lease))
    }
}

/// The error of a request from a partitioned client.
fn cut_off(kind: std::io::ErrorKind) -> std::io::Error {
    std::io::Error::new(kind, "partitioned")
}

/// What a request's path names: `/api/v1/...` or `/apis/<group>/<version>/...`,
/// then optionally `namespaces/<ns>/`, then the resource and maybe a name.
struct Target {
    resource: String,
    namespace: Option<String>,
    name: Option<String>,
}

impl Target {
    fn of(path: &str) -> Self {
        let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
        let mut rest = match segments.first() {
            Some(&"api") => &segments[segments.len().min(2)..],
            _ => &segments[segments.len().min(3)..],
        };
        let mut namespace = None;
        if rest.len() >= 3 && rest[0] == "namespaces" {
            namespace = Some(rest[1].to_owned());
            rest = &rest[2..];
        }
        Target {
            resource: rest.first().copied().unwrap_or_default().to_owned(),
            namespace,
            name: rest.get(1).map(|n| (*n).to_owned()),
        }
    }
}

/// The name in a `fieldSelector=metadata.name=<name>` query.
fn field_selector_name(query: &str) -> Option<String> {
    query.split('&').find_map(|kv| {
        let v = kv
            .strip_prefix("fieldSelector=")?
            .replace("%3D", "=")
            .replace("%3d", "=");
        v.strip_prefix("metadata.name=").map(str::to_owned)
    })
}

/// The API server's validation of a Lease's spec (`ValidateLeaseSpec`).
fn invalid_spec(lease: &Lease) -> Option<&'static str> {
    let spec = lease.spec.as_ref()?;
    if spec.lease_duration_seconds.is_some_and(|d| d <= 0) {
        return Some("spec.leaseDurationSeconds: must be greater than 0");
    }
    if spec.lease_transitions.is_some_and(|t| t < 0) {
        return Some("spec.leaseTransitions: must be greater than or equal to 0");
    }
    if spec.preferred_holder.as_deref().is_some_and(|p| !p.is_empty()) && spec.strategy.is_none() {
        return Some("spec.strategy: Required value: must be specified when preferredHolder is set");
    }
    None
}

fn with_type(lease: &Lease) -> serde_json::Value {
    let mut v = serde_json::to_value(lease).unwrap();
    v["apiVersion"] = json!("coordination.k8s.io/v1");
    v["kind"] = json!("Lease");
    v
}

fn full(code: u16, v: &serde_json::Value) -> Response<ResBody> {
    Response::builder()
        .status(StatusCode::from_u16(code).unwrap())
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(serde_json::to_vec(v).unwrap())).boxed_unsync())
        .unwrap()
}

fn ok(v: &serde_json::Value) -> Response<ResBody> {
    full(200, v)
}

fn created(v: &serde_json::Value) -> Response<ResBody> {
    full(201, v)
}

fn status(code: u16, reason: &str, message: &str) -> Response<ResBody> {
    full(
        code,
        &json!({ "kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message, "reason": reason, "code": code }),
    )
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube_client::{
        Api,
        api::{ListParams, ObjectMeta, PostParams},
    };

    use super::*;
    use crate::test_support::paused;

    fn named(name: &str) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            spec: None,
        }
    }

    /// One double serves one Lease: another name or namespace is never
    /// shared by accident; other resources are empty.
    #[test]
    fn a_double_serves_one_lease_and_nothing_else() {
        paused(async {
            let fake = FakeLeaseApi::default();
            let (client, _) = fake.client();
            let leases = Api::<Lease>::namespaced(client.clone(), "default");
            let pp = PostParams::default();
            leases.create(&pp, &named("a")).await.unwrap();
            let refused = leases.create(&pp, &named("b")).await.unwrap_err();
            assert!(
                matches!(refused, kube_client::Error::Api(ref s) if s.code == 403),
                "{refused:?}"
            );
            assert!(leases.get_opt("b").await.unwrap().is_none());
            assert!(leases.get_opt("a").await.unwrap().is_some());
            let elsewhere = Api::<Lease>::namespaced(client.clone(), "other");
            assert!(
                elsewhere
                    .list(&ListParams::default())
                    .await
                    .unwrap()
                    .items
                    .is_empty()
            );
            assert!(elsewhere.get_opt("a").await.unwrap().is_none());
            let configmaps = Api::<ConfigMap>::namespaced(client, "default");
            assert!(
                configmaps
                    .list(&ListParams::default())
                    .await
                    .unwrap()
                    .items
                    .is_empty()
            );
            assert!(configmaps.get_opt("x").await.unwrap().is_none());
            assert_eq!(fake.lease().and_then(|l| l.metadata.name).as_deref(), Some("a"));
        });
    }
}
