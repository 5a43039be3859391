//! An in-memory double of the Lease API, plugged into a real `kube::Client`:
//! get, create, replace with resourceVersion compare-and-swap, list and watch,
//! with per-client faults (status codes, delays before or after the write
//! takes effect, lost answers, partitions, latency) and a log of the requests.
//! Time is tokio's, so tests run with paused time.
//!
//! The one double of the workspace: kube-runtime-lease's unit tests and
//! simulation (a dev-dependency: this crate does not depend on the library,
//! so there is no cycle) and the adapter benchmark ([`client`]) use it.

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
use k8s_openapi::api::coordination::v1::Lease;
use kube::{Client, client::Body};
use serde_json::json;
use tokio::time::Instant;

type ResBody = UnsyncBoxBody<Bytes, Infallible>;

/// A fault injected into one client's next matching requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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

/// How many requests one double answers before it aborts the process: far
/// more than any test makes (a simulated minute of chaos makes a few
/// thousand), far fewer than a loop that retries without waiting makes in a
/// second.
pub const REQUEST_BUDGET: usize = 20_000;

/// Aborts the process once the double has answered [`REQUEST_BUDGET`]
/// requests: answered at once, requests take no paused time, so a loop that
/// retries without waiting (a bug) would spin for ever without reaching a
/// test's paused-time bound.
fn check_budget(s: &Store) {
    if s.seen.len() >= REQUEST_BUDGET {
        eprintln!(
            "fake_api: more than {REQUEST_BUDGET} requests on one double: a retry loop that never waits; aborting"
        );
        std::process::abort();
    }
}

/// One request seen by the double.
#[derive(Clone, Debug)]
pub struct Seen {
    /// When the double received it (tokio's clock).
    pub at: Instant,
    /// The client's index (see [`FakeApi::client`]).
    pub client: usize,
    /// `get`, `create`, `update`, `list` or `watch`.
    pub verb: &'static str,
}

#[derive(Default)]
struct Store {
    lease: Option<Lease>,
    rv: u64,
    history: Vec<(u64, &'static str, Lease)>,
    watchers: Vec<(usize, mpsc::UnboundedSender<Bytes>)>,
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
pub struct FakeApi {
    store: Arc<Mutex<Store>>,
}

impl FakeApi {
    fn lock(&self) -> MutexGuard<'_, Store> {
        // A test that panicked while holding the lock leaves consistent data.
        self.store
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
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
        let named = path.rsplit_once("/leases/").map(|(_, n)| n.to_owned());
        let verb: &'static str = match (&method, &named, is_watch) {
            (&Method::GET, Some(_), _) => "get",
            (&Method::GET, None, true) => "watch",
            (&Method::GET, None, false) => "list",
            (&Method::POST, _, _) => "create",
            (&Method::PUT, _, _) => "update",
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
                return Err(std::io::Error::new(
                    std::io::ErrorKind::ConnectionRefused,
                    "partitioned",
                ));
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
            return Err(std::io::Error::new(
                std::io::ErrorKind::ConnectionReset,
                "partitioned",
            ));
        }
        let resp = self.apply(client, verb, &query, &body);
        if !respond_after.is_zero() {
            tokio::time::sleep(respond_after).await;
            if self.lock().clients[client].partitioned {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::ConnectionReset,
                    "partitioned",
                ));
            }
        }
        Ok(resp)
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
                if s.lease.is_some() {
                    return status(409, "AlreadyExists", "leases already exists");
                }
                let Ok(mut lease) = serde_json::from_slice::<Lease>(body) else {
                    return status(400, "BadRequest", "bad body");
                };
                s.rv += 1;
                lease.metadata.resource_version = Some(s.rv.to_string());
                lease.metadata.uid = Some(format!("uid-{}", s.rv));
                s.lease = Some(lease.clone());
                Self::emit(&mut s, "ADDED", &lease);
                created(&with_type(&lease))
            }
            "update" => {
                let Ok(mut lease) = serde_json::from_slice::<Lease>(body) else {
                    return status(400, "BadRequest", "bad body");
                };
                let Some(current) = &s.lease else {
                    return status(404, "NotFound", "leases not found");
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
                if lease
                    .spec
                    .as_ref()
                    .and_then(|s| s.lease_duration_seconds)
                    .is_some_and(|d| d <= 0)
                {
                    return status(422, "Invalid", "leaseDurationSeconds must be greater than 0");
                }
                s.rv += 1;
                lease.metadata.resource_version = Some(s.rv.to_string());
                s.lease = Some(lease.clone());
                Self::emit(&mut s, "MODIFIED", &lease);
                ok(&with_type(&lease))
            }
            _ => status(405, "MethodNotAllowed", "not supported by the double"),
        }
    }
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

/// A client of a new double holding no Lease (the elector creates it): what
/// the adapter benchmark leads against.
pub fn client() -> Client {
    FakeApi::default().client().0
}
