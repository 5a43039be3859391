//! The double's HTTP side: requests parsed, faults applied, the Lease API's
//! answers (and the API server's validation), watches.

use std::time::Duration;

use bytes::Bytes;
use futures::channel::mpsc;
use http::{Method, Request, Response};
use http_body_util::BodyExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube_client::client::Body;
use serde_json::json;
use tokio::time::Instant;

use super::wire::{
    ResBody, Target, created, cut_off, field_selector_name, idle_watch, in_namespace, invalid_spec, ok,
    status, watch_response, with_type,
};
use super::{FakeLeaseApi, Fault, Seen, Store, check_budget};

/// Whether a write would leave the stored Lease as it is (the API server
/// then skips it: the same resourceVersion, no watch event).
fn unchanged(lease: &Lease, current: &Lease) -> bool {
    let (a, b) = (&lease.metadata, &current.metadata);
    lease.spec == current.spec
        && a.labels == b.labels
        && a.annotations == b.annotations
        && a.owner_references == b.owner_references
}

/// A request's body, whole.
async fn read_body(body: Body) -> Result<Bytes, std::io::Error> {
    Ok(body.collect().await.map_err(std::io::Error::other)?.to_bytes())
}

/// The verb of a Lease request, as the double's faults and log name it.
fn verb(method: &Method, named: bool, is_watch: bool) -> &'static str {
    match (method, named, is_watch) {
        (&Method::GET, true, _) => "get",
        (&Method::GET, false, true) => "watch",
        (&Method::GET, false, false) => "list",
        (&Method::POST, _, _) => "create",
        (&Method::PUT, _, _) => "update",
        (&Method::DELETE, true, _) => "delete",
        _ => "other",
    }
}

/// A list of the Lease as it was before its last change, at that change's
/// resourceVersion (see [`Fault::StaleList`]); `None` with no earlier version.
fn stale_list(s: &Store) -> Option<Response<ResBody>> {
    let [.., (rv, kind, lease), _] = s.history.as_slice() else {
        return None;
    };
    let items: Vec<_> = (*kind != "DELETED")
        .then(|| with_type(lease))
        .into_iter()
        .collect();
    Some(ok(&json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "LeaseList",
        "metadata": { "resourceVersion": rv.to_string() }, "items": items,
    })))
}

/// A watch's `ERROR` event for `410 Gone` (the resourceVersion is too old).
pub(super) fn gone_event_line() -> Bytes {
    let status = json!({
        "kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 410, "reason": "Expired",
        "message": "too old resource version",
    });
    let mut v = serde_json::to_vec(&json!({ "type": "ERROR", "object": status })).unwrap();
    v.push(b'\n');
    v.into()
}

impl FakeLeaseApi {
    pub(super) fn emit(s: &mut Store, kind: &'static str, lease: &Lease) {
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

    pub(super) async fn handle(
        &self,
        client: usize,
        req: Request<Body>,
    ) -> Result<Response<ResBody>, std::io::Error> {
        let method = req.method().clone();
        let path = req.uri().path().to_owned();
        let query = req.uri().query().unwrap_or("").to_owned();
        let body = read_body(req.into_body()).await?;
        let is_watch = query.contains("watch=true");
        let target = Target::of(&path);
        if let Some(answer) = self
            .beside_leases(&target, &method, is_watch, &query, &body)
            .await
        {
            return Ok(answer);
        }
        if target.resource != "leases" {
            return Ok(self.other_resource(&method, is_watch, target.name.is_some()));
        }
        if let Some(refused) = self.another_lease(&target, &method, is_watch, &query, &body) {
            return Ok(refused);
        }
        let namespace = target.namespace.clone();
        let named = target.name;
        let verb = verb(&method, named.is_some(), is_watch);
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
                    api.apply(client, verb, namespace.as_deref(), &query, &body)
                });
                return handle.await.map_err(std::io::Error::other);
            }
            Some(Fault::DelayResponse(d)) => respond_after = d,
            Some(Fault::StaleList) => {
                if verb == "list"
                    && let Some(stale) = stale_list(&self.lock())
                {
                    return Ok(stale);
                }
            }
            Some(Fault::AppliedThenLost) => {
                let _ = self.apply(client, verb, namespace.as_deref(), &query, &body);
                return Err(std::io::Error::new(
                    std::io::ErrorKind::ConnectionReset,
                    "injected: the answer was lost after the write was applied",
                ));
            }
            Some(Fault::AppliedThenStatus(code)) => {
                let _ = self.apply(client, verb, namespace.as_deref(), &query, &body);
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
        let resp = self.apply(client, verb, namespace.as_deref(), &query, &body);
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
            (true, true) => idle_watch(&mut self.lock()),
            (true, false) => ok(&json!({
                "apiVersion": "v1", "kind": "List", "metadata": { "resourceVersion": "1" }, "items": [],
            })),
            (false, _) => status(404, "NotFound", "the double serves only leases"),
        }
    }

    /// What the double keeps beside the Lease: Events created, and
    /// `LeaseCandidate`s; `None` for everything else.
    async fn beside_leases(
        &self,
        target: &Target,
        method: &Method,
        is_watch: bool,
        query: &str,
        body: &[u8],
    ) -> Option<Response<ResBody>> {
        if target.resource == "leasecandidates" {
            let latency = self.lock().candidates_latency;
            if !latency.is_zero() {
                tokio::time::sleep(latency).await;
            }
        }
        match target.resource.as_str() {
            "events" if *method == Method::POST => Some(self.event_posted(body)),
            "leasecandidates" => {
                Some(self.lease_candidate(method, target.name.as_deref(), is_watch, query, body))
            }
            _ => None,
        }
    }

    /// An Event created (`events.k8s.io` or core): kept for
    /// [`FakeLeaseApi::events`], answered 201 with itself.
    fn event_posted(&self, body: &[u8]) -> Response<ResBody> {
        match serde_json::from_slice::<serde_json::Value>(body) {
            Ok(event) => {
                self.lock().events.push(event.clone());
                created(&event)
            }
            Err(_) => status(400, "BadRequest", "not JSON"),
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
            (&Method::GET, true) => idle_watch(&mut s),
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

    /// Handles one Lease request; `namespace` is the request path's.
    fn apply(
        &self,
        client: usize,
        verb: &str,
        namespace: Option<&str>,
        query: &str,
        body: &[u8],
    ) -> Response<ResBody> {
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
                watch_response(rx)
            }
            "create" => {
                let Ok(mut lease) = serde_json::from_slice::<Lease>(body) else {
                    return status(400, "BadRequest", "bad body");
                };
                if let Some(refused) = in_namespace(&mut lease, namespace) {
                    return refused;
                }
                // Validation comes first, as in the API server.
                if lease.metadata.name.is_none() {
                    return status(
                        422,
                        "Invalid",
                        "metadata.name: Required value: name or generateName is required",
                    );
                }
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
            "update" => Self::update(&mut s, namespace, body),
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
    fn update(s: &mut Store, namespace: Option<&str>, body: &[u8]) -> Response<ResBody> {
        let Ok(mut lease) = serde_json::from_slice::<Lease>(body) else {
            return status(400, "BadRequest", "bad body");
        };
        if let Some(refused) = in_namespace(&mut lease, namespace) {
            return refused;
        }
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
        if unchanged(&lease, current) {
            // A no-op: no new resourceVersion, no event.
            return ok(&with_type(current));
        }
        s.rv += 1;
        lease.metadata.resource_version = Some(s.rv.to_string());
        s.lease = Some(lease.clone());
        Self::emit(s, "MODIFIED", &lease);
        ok(&with_type(&lease))
    }
}
