//! The double's HTTP side: requests parsed, faults applied, the Lease API's
//! answers (and the API server's validation), watches.

use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response};
use http_body_util::BodyExt;
use kube_client::client::Body;
use serde_json::json;
use tokio::time::Instant;

use super::{
    FakeLeaseApi, Fault, Received, check_budget,
    leases::{Filter, LeaseRequest},
    wire::{ResBody, Target, created, cut_off, forbidden, idle_watch, ok, plain_text, raw, status},
};

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

/// Authorization refusing `verb` on Leases (on the Lease `name`, if named).
fn rbac_refusal(verb: &str, name: Option<&str>) -> Response<ResBody> {
    forbidden("leases", "coordination.k8s.io", verb, name)
}

/// The answer of `Fault::Status(code)`: a 403 is authorization's (a missing
/// RBAC rule).
fn injected(code: u16, verb: &str, name: Option<&str>) -> Response<ResBody> {
    if code == 403 {
        rbac_refusal(verb, name)
    } else {
        status(code, "Injected", "injected fault")
    }
}

/// The answer of `Fault::Admission`: admission refusing `verb` on the Lease
/// `name`.
fn injected_admission(verb: &str, name: Option<&str>) -> Response<ResBody> {
    let object = name.map_or_else(String::new, |name| format!(" {name:?}"));
    let why = if verb == "create" {
        let count = "count/leases.coordination.k8s.io";
        format!("exceeded quota: leases, requested: {count}=1, used: {count}=1, limited: {count}=1")
    } else {
        "ValidatingAdmissionPolicy 'p' with binding 'b' denied request: refused by the test".to_owned()
    };
    let message = format!("leases.coordination.k8s.io{object} is forbidden: {why}");
    status(403, "Forbidden", &message)
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
        if target.resource == "events" && method == Method::POST {
            return Ok(self.event_posted(&body));
        }
        if target.resource == "events" && method == Method::PATCH {
            return Ok(self.event_patched(target.name.as_deref(), &body));
        }
        #[cfg(feature = "coordinated")]
        if target.resource == "leasecandidates" {
            return Ok(self
                .lease_candidate_request(&target, &method, is_watch, &query, &body)
                .await);
        }
        if target.resource != "leases" {
            return Ok(self.other_resource(&method, is_watch, target.name.is_some()));
        }
        let verb = verb(&method, target.name.is_some(), is_watch);
        let r = LeaseRequest {
            client,
            verb,
            namespace: target.namespace,
            name: target.name,
            query,
            body,
        };
        let (fault, latency, forbidden) = self.received(client, verb, r.name.clone())?;
        if verb != "watch" && !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        if forbidden {
            return Ok(rbac_refusal(verb, r.name.as_deref()));
        }
        let mut respond_after = Duration::ZERO;
        match fault {
            Some(Fault::Status(code)) => return Ok(injected(code, verb, r.name.as_deref())),
            Some(Fault::Admission) => return Ok(injected_admission(verb, r.name.as_deref())),
            Some(Fault::PlainText(code)) => return Ok(plain_text(code)),
            Some(Fault::Body(code, body)) => return Ok(raw(code, body)),
            Some(Fault::NoSuchResource) => {
                return Ok(status(
                    404,
                    "NotFound",
                    "the server could not find the requested resource",
                ));
            }
            Some(Fault::DelayRequest(d)) => {
                // As on a real network, a request the client gave up on may still arrive.
                let api = self.clone();
                let handle = tokio::spawn(async move {
                    tokio::time::sleep(d).await;
                    api.apply(&r)
                });
                return handle.await.map_err(std::io::Error::other);
            }
            Some(Fault::DelayResponse(d)) => respond_after = d,
            Some(Fault::StaleList) => {
                let filter = Filter::of(r.namespace.as_deref(), &r.query);
                if verb == "list"
                    && let Some(stale) = self.lock().stale_list(&filter)
                {
                    return Ok(stale);
                }
            }
            Some(Fault::AppliedThenLost) => {
                let _ = self.apply(&r);
                return Err(std::io::Error::new(
                    std::io::ErrorKind::ConnectionReset,
                    "injected: the answer was lost after the write was applied",
                ));
            }
            Some(Fault::AppliedThenStatus(code)) => {
                let _ = self.apply(&r);
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
        let resp = self.apply(&r);
        if !respond_after.is_zero() {
            tokio::time::sleep(respond_after).await;
            if self.lock().clients[client].partitioned {
                return Err(cut_off(std::io::ErrorKind::ConnectionReset));
            }
        }
        Ok(resp)
    }

    /// Logs a Lease request of `client`, and takes the fault queued for it:
    /// the fault, the client's latency, and whether its lists and watches are
    /// forbidden; the error of a partitioned client.
    fn received(
        &self,
        client: usize,
        verb: &'static str,
        name: Option<String>,
    ) -> Result<(Option<Fault>, Duration, bool), std::io::Error> {
        let mut s = self.lock();
        check_budget(&s);
        s.received.push(Received {
            at: Instant::now(),
            client,
            verb,
            name,
        });
        let c = &mut s.clients[client];
        if c.partitioned {
            return Err(cut_off(std::io::ErrorKind::ConnectionRefused));
        }
        let pos = c.queue.iter().position(|(v, f)| {
            v.is_none_or(|v| v == verb) && (verb == "list" || !matches!(f, Fault::StaleList))
        });
        let fault = pos.and_then(|p| c.queue.remove(p)).map(|(_, f)| f);
        Ok((
            fault,
            c.latency,
            c.watch_forbidden && matches!(verb, "watch" | "list"),
        ))
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

    /// An Event created (`events.k8s.io` or core): kept for
    /// [`FakeLeaseApi::events`], answered 201 with itself.
    fn event_posted(&self, body: &[u8]) -> Response<ResBody> {
        #[cfg(all(test, feature = "events"))]
        if self.lock().events_forbidden {
            return forbidden("events", "events.k8s.io", "create", None);
        }
        match serde_json::from_slice::<serde_json::Value>(body) {
            Ok(event) => {
                self.lock().events.push(event.clone());
                created(&event)
            }
            Err(_) => status(400, "BadRequest", "not JSON"),
        }
    }

    /// An Event series updated (a JSON merge patch, as kube-runtime's
    /// `Recorder` sends for a repeat): applied to the Event created under
    /// `name`, as the API server does, answered 200 with the result.
    fn event_patched(&self, name: Option<&str>, body: &[u8]) -> Response<ResBody> {
        fn merge(target: &mut serde_json::Value, patch: &serde_json::Value) {
            match (target.as_object_mut(), patch.as_object()) {
                (Some(target), Some(patch)) => {
                    for (k, v) in patch {
                        if v.is_null() {
                            target.remove(k);
                        } else {
                            merge(target.entry(k.clone()).or_insert(serde_json::Value::Null), v);
                        }
                    }
                }
                _ => *target = patch.clone(),
            }
        }
        let Ok(patch) = serde_json::from_slice::<serde_json::Value>(body) else {
            return status(400, "BadRequest", "not JSON");
        };
        let mut s = self.lock();
        let event = s
            .events
            .iter_mut()
            .find(|e| name.is_some() && e["metadata"]["name"].as_str() == name);
        match event {
            Some(event) => {
                merge(event, &patch);
                ok(event)
            }
            None => status(404, "NotFound", "no such event"),
        }
    }
}
