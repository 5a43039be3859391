//! What the double says on the wire, as the API server does: request paths
//! parsed, a Lease's validation, and the answers (objects, `Status` errors,
//! streamed watches).

use std::convert::Infallible;

use bytes::Bytes;
use futures::{StreamExt, channel::mpsc};
use http::{Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody, combinators::UnsyncBoxBody};
use k8s_openapi::api::coordination::v1::Lease;
use serde_json::json;

use super::Store;

/// The body of the double's answers.
pub(super) type ResBody = UnsyncBoxBody<Bytes, Infallible>;

/// A watch's answer: the events sent on the channel, as they come.
pub(super) fn watch_response(events: mpsc::UnboundedReceiver<Bytes>) -> Response<ResBody> {
    let stream = events.map(|b| Ok::<_, Infallible>(http_body::Frame::data(b)));
    Response::builder()
        .status(200)
        .body(StreamBody::new(stream).boxed_unsync())
        .unwrap()
}

/// `events`, each delivered `lag` after it was sent, in order (none: as
/// they come).
pub(super) fn lagging(
    events: mpsc::UnboundedReceiver<Bytes>,
    lag: std::time::Duration,
) -> mpsc::UnboundedReceiver<Bytes> {
    if lag.is_zero() {
        return events;
    }
    let (stamped_tx, stamped) = mpsc::unbounded();
    let (out_tx, out) = mpsc::unbounded();
    // Stamped as they come, delivered at their time.
    tokio::spawn(events.for_each(move |line| {
        let _ = stamped_tx.unbounded_send((tokio::time::Instant::now() + lag, line));
        async {}
    }));
    tokio::spawn(stamped.for_each(move |(at, line)| {
        let out = out_tx.clone();
        async move {
            tokio::time::sleep_until(at).await;
            let _ = out.unbounded_send(line);
        }
    }));
    out
}

/// A watch that stays open and silent (of a resource or Lease not served).
pub(super) fn idle_watch(s: &mut Store) -> Response<ResBody> {
    let (tx, rx) = mpsc::unbounded::<Bytes>();
    s.idle_watches.push(tx);
    watch_response(rx)
}

/// The error of a request from a partitioned client.
pub(super) fn cut_off(kind: std::io::ErrorKind) -> std::io::Error {
    std::io::Error::new(kind, "partitioned")
}

/// What a request's path names: `/api/v1/...` or `/apis/<group>/<version>/...`,
/// then optionally `namespaces/<ns>/`, then the resource and maybe a name.
pub(super) struct Target {
    pub(super) resource: String,
    pub(super) namespace: Option<String>,
    pub(super) name: Option<String>,
}

impl Target {
    pub(super) fn of(path: &str) -> Self {
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
pub(super) fn field_selector_name(query: &str) -> Option<String> {
    query.split('&').find_map(|kv| {
        let v = kv
            .strip_prefix("fieldSelector=")?
            .replace("%3D", "=")
            .replace("%3d", "=");
        v.strip_prefix("metadata.name=").map(str::to_owned)
    })
}

/// As the API server does before anything else: a written object takes the
/// request path's namespace if it names none; the refusal (400) if it names
/// another.
pub(super) fn in_namespace(lease: &mut Lease, path: Option<&str>) -> Option<Response<ResBody>> {
    match (lease.metadata.namespace.as_deref(), path) {
        (Some(named), Some(path)) if named != path => Some(status(
            400,
            "BadRequest",
            "the namespace of the provided object does not match the namespace sent on the request",
        )),
        (None, Some(path)) => {
            lease.metadata.namespace = Some(path.to_owned());
            None
        }
        _ => None,
    }
}

/// The API server's validation of a Lease's spec (`ValidateLeaseSpec`).
pub(super) fn invalid_spec(lease: &Lease) -> Option<&'static str> {
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

pub(super) fn with_type(lease: &Lease) -> serde_json::Value {
    let mut v = serde_json::to_value(lease).unwrap();
    v["apiVersion"] = json!("coordination.k8s.io/v1");
    v["kind"] = json!("Lease");
    v
}

pub(super) fn full(code: u16, v: &serde_json::Value) -> Response<ResBody> {
    Response::builder()
        .status(StatusCode::from_u16(code).unwrap())
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(serde_json::to_vec(v).unwrap())).boxed_unsync())
        .unwrap()
}

/// An answer that is not the API server's: status `code`, a plain-text body.
pub(super) fn plain_text(code: u16) -> Response<ResBody> {
    let code = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    Response::builder()
        .status(code)
        .header("content-type", "text/plain; charset=utf-8")
        .body(Full::new(Bytes::from(format!("{} page not found\n", code.as_u16()))).boxed_unsync())
        .unwrap()
}

/// An answer with `code` and `body`, as JSON, whatever it holds.
pub(super) fn raw(code: u16, body: &'static str) -> Response<ResBody> {
    let code = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(body.as_bytes())).boxed_unsync())
        .unwrap()
}

pub(super) fn ok(v: &serde_json::Value) -> Response<ResBody> {
    full(200, v)
}

pub(super) fn created(v: &serde_json::Value) -> Response<ResBody> {
    full(201, v)
}

/// The API server's authorization refusing `verb` on `resource` of API
/// group `group` (on the object `name`, if named): what a missing RBAC rule
/// answers.
pub(super) fn forbidden(resource: &str, group: &str, verb: &str, name: Option<&str>) -> Response<ResBody> {
    let object = name.map_or_else(String::new, |name| format!(" {name:?}"));
    let message = format!(
        r#"{resource}.{group}{object} is forbidden: User "test" cannot {verb} resource "{resource}" in API group "{group}""#
    );
    status(403, "Forbidden", &message)
}

pub(super) fn status(code: u16, reason: &str, message: &str) -> Response<ResBody> {
    full(
        code,
        &json!({ "kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message, "reason": reason, "code": code }),
    )
}
