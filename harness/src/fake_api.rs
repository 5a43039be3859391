//! An in-process double of the Lease API for the adapter benchmark
//! (`bench/benches/adapter.rs`): one Lease, GET/POST/PUT with
//! resourceVersion compare-and-swap, plugged into a real `kube::Client`, so
//! that an elector's renewals run as in production, minus the network.
//!
//! kube-runtime-lease's unit tests use a fuller double of their own
//! (`kube-runtime-lease/src/fake.rs`: faults, list, watch, a request log).
//! This crate does not depend on the library, so the library could take its
//! double from here as a dev-dependency without a cycle; until it does, that
//! file is the other copy.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Method, Request, Response};
use http_body_util::{BodyExt as _, Full};
use kube::client::Body;
use serde_json::json;

#[derive(Default)]
struct Store {
    lease: Option<serde_json::Value>,
    rv: u64,
}

fn respond(code: u16, v: &serde_json::Value) -> Response<Full<Bytes>> {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(
            serde_json::to_vec(v).expect("a JSON value serialises"),
        )))
        .expect("a valid response")
}

fn status(code: u16, reason: &str) -> Response<Full<Bytes>> {
    respond(
        code,
        &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason, "code": code, "message": reason}),
    )
}

/// Stores `body` as the new version of the Lease and answers it with `code`.
fn store(s: &mut Store, body: &[u8], code: u16) -> Response<Full<Bytes>> {
    let Ok(mut l) = serde_json::from_slice::<serde_json::Value>(body) else {
        return status(400, "BadRequest");
    };
    s.rv += 1;
    l["metadata"]["resourceVersion"] = json!(s.rv.to_string());
    l["metadata"]["uid"] = json!("uid-1");
    l["apiVersion"] = json!("coordination.k8s.io/v1");
    l["kind"] = json!("Lease");
    s.lease = Some(l.clone());
    respond(code, &l)
}

async fn handle(store_: Arc<Mutex<Store>>, req: Request<Body>) -> Result<Response<Full<Bytes>>, Infallible> {
    let method = req.method().clone();
    let named = req.uri().path().contains("/leases/");
    let body = req
        .into_body()
        .collect()
        .await
        .map(http_body_util::Collected::to_bytes)
        .unwrap_or_default();
    let mut s = store_.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let resp = match (method, named) {
        (Method::GET, true) => match &s.lease {
            Some(l) => respond(200, l),
            None => status(404, "NotFound"),
        },
        (Method::POST, _) => {
            if s.lease.is_some() {
                status(409, "AlreadyExists")
            } else {
                store(&mut s, &body, 201)
            }
        }
        (Method::PUT, true) => {
            let sent = serde_json::from_slice::<serde_json::Value>(&body)
                .map(|l| l["metadata"]["resourceVersion"].clone())
                .ok();
            let current = s.lease.as_ref().map(|c| c["metadata"]["resourceVersion"].clone());
            if current.is_none() || current != sent {
                status(409, "Conflict")
            } else {
                store(&mut s, &body, 200)
            }
        }
        _ => status(405, "MethodNotAllowed"),
    };
    Ok(resp)
}

/// A client of a new double holding no Lease yet (default namespace
/// `default`).
pub fn client() -> kube::Client {
    let store = Arc::new(Mutex::new(Store::default()));
    let svc = tower::service_fn(move |req: Request<Body>| handle(store.clone(), req));
    kube::Client::new(svc, "default")
}
