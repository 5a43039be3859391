use std::{pin::pin, time::Duration};

use futures::{StreamExt, poll, stream};
use http::{Method, Request, Response};
use k8s_openapi::api::coordination::v1::Lease;
use kube_client::{Client, client::Body};
use serde_json::json;
use tokio::time::{Instant, sleep};
use tower_test::mock::{self, Handle, SendResponse};

use super::{Config, Error, LeaderElector, LeaseGuard, Lost};
use crate::WatchStreamExt;

type ApiServer = Handle<Request<Body>, Response<Body>>;

/// [`LeaderElector::acquire`] as a `'static` future.
async fn acquire(elector: LeaderElector) -> LeaseGuard {
    elector.acquire().await
}

fn elector() -> (LeaderElector, ApiServer) {
    let (service, server) = mock::pair::<Request<Body>, Response<Body>>();
    let elector = LeaderElector::new(Client::new(service, "ns"), Config::new("ns", "lock", "me"));
    (elector.unwrap(), server)
}

/// The next request: its method, the Lease it carries, and its answer's sender. The watch's
/// requests (a list or a watch, named by their `fieldSelector`) are refused with a 403.
async fn next(server: &mut ApiServer) -> (Method, Lease, SendResponse<Response<Body>>) {
    loop {
        let (watch, method, lease, send) = next_of_any(server).await;
        if !watch {
            return (method, lease, send);
        }
        answer(send, 403, Lease::default(), "");
    }
}

/// The next request, and whether it is the watch's.
async fn next_of_any(server: &mut ApiServer) -> (bool, Method, Lease, SendResponse<Response<Body>>) {
    let (request, send) = server.next_request().await.expect("a request");
    let (method, uri) = (request.method().clone(), request.uri().to_string());
    let body = request.into_body().collect_bytes().await.unwrap();
    let lease = serde_json::from_slice(&body).unwrap_or_default();
    (uri.contains("fieldSelector"), method, lease, send)
}

/// Answers the watch's list with `lease` (rv 5), then its watch with one event: `event`.
async fn watch_shows(server: &mut ApiServer, lease: Lease, event: serde_json::Value) {
    let (watch, _, _, send) = next_of_any(server).await;
    assert!(watch, "the watch's list");
    let list = json!({"metadata": {"resourceVersion": "5"}, "items": [lease]});
    send.send_response(Response::new(Body::from(serde_json::to_vec(&list).unwrap())));
    let (watch, _, _, send) = next_of_any(server).await;
    assert!(watch, "the watch");
    send.send_response(Response::new(Body::from(serde_json::to_vec(&event).unwrap())));
}

/// Answers `lease` with the resourceVersion `rv`, or an error status when `code` is not 2xx.
fn answer(send: SendResponse<Response<Body>>, code: u16, mut lease: Lease, rv: &str) {
    lease.metadata.resource_version = Some(rv.into());
    let body = if code < 300 {
        serde_json::to_vec(&lease)
    } else {
        let reason = match code {
            404 => "NotFound",
            403 => "Forbidden",
            409 => "Conflict",
            _ => "InternalError",
        };
        serde_json::to_vec(&json!({"kind": "Status", "apiVersion": "v1", "code": code, "reason": reason}))
    };
    let response = Response::builder().status(code).body(Body::from(body.unwrap()));
    send.send_response(response.unwrap());
}

fn held_by(holder: &str) -> Lease {
    // renewTime far in the past: expiry is judged on the candidate's clock only.
    let spec = json!({"holderIdentity": holder, "leaseDurationSeconds": 15, "leaseTransitions": 3,
                      "renewTime": "2000-01-01T00:00:00.000000Z"});
    serde_json::from_value(json!({"metadata": {"name": "lock"}, "spec": spec})).unwrap()
}

fn spec(lease: &Lease) -> (Option<&str>, Option<i32>) {
    let spec = lease.spec.as_ref().unwrap();
    (spec.holder_identity.as_deref(), spec.lease_transitions)
}

#[tokio::test(start_paused = true)]
async fn creates_a_missing_lease_renews_it_and_releases_it_when_the_guard_is_dropped() {
    let (elector, mut server) = elector();
    let start = Instant::now();
    let acquire = tokio::spawn(acquire(elector));
    let (method, _, send) = next(&mut server).await;
    assert_eq!(method, Method::GET);
    answer(send, 404, Lease::default(), "");
    let (method, lease, send) = next(&mut server).await;
    assert_eq!((method, spec(&lease)), (Method::POST, (Some("me"), Some(0))));
    answer(send, 201, lease, "1");
    let guard = acquire.await.unwrap();
    assert!(guard.is_valid() && guard.fencing_token() == 0);

    // One replace per retry period, with the resourceVersion of the last write.
    for (rv, next_rv) in [("1", "2"), ("2", "3")] {
        let (method, lease, send) = next(&mut server).await;
        assert_eq!(method, Method::PUT);
        assert_eq!(lease.metadata.resource_version.as_deref(), Some(rv));
        answer(send, 200, lease, next_rv);
    }
    assert_eq!(start.elapsed(), Duration::from_secs(4));

    drop(guard);
    let (method, lease, send) = next(&mut server).await;
    assert_eq!((method, spec(&lease)), (Method::PUT, (Some(""), Some(0))));
    assert_eq!(lease.metadata.resource_version.as_deref(), Some("3"));
    answer(send, 200, lease, "4");
}

#[tokio::test(start_paused = true)]
async fn takes_another_holders_lease_only_after_seeing_it_unchanged_for_its_duration() {
    let (elector, mut server) = elector();
    let start = Instant::now();
    let acquire = tokio::spawn(acquire(elector));
    loop {
        let (method, lease, send) = next(&mut server).await;
        if method == Method::PUT {
            assert!(start.elapsed() >= Duration::from_secs(15));
            assert_eq!(spec(&lease), (Some("me"), Some(4)));
            answer(send, 200, lease, "6");
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(16));
        answer(send, 200, held_by("other"), "5");
    }
    assert_eq!(acquire.await.unwrap().fencing_token(), 4);
}

#[tokio::test(start_paused = true)]
async fn a_conflict_on_acquire_means_not_leader() {
    let (elector, mut server) = elector();
    let mut guarded = pin!(stream::iter([1]).with_leader_election(&elector));
    assert!(poll!(guarded.next()).is_pending());
    let (_, _, send) = next(&mut server).await;
    answer(send, 200, held_by(""), "5");
    let (method, lease, send) = next(&mut server).await;
    assert_eq!(method, Method::PUT);
    assert_eq!(lease.metadata.resource_version.as_deref(), Some("5"));
    answer(send, 409, lease, "");

    // The stream is not polled; the candidate reads the Lease again.
    let (method, _, _send) = next(&mut server).await;
    assert_eq!(method, Method::GET);
    assert!(poll!(guarded.next()).is_pending());
}

#[tokio::test(start_paused = true)]
async fn the_guarded_stream_is_dropped_at_the_renew_deadline_when_renewals_fail() {
    let (elector, mut server) = elector();
    let ticks = stream::unfold(0, |n| async move {
        sleep(Duration::from_secs(1)).await;
        Some((n, n + 1))
    });
    let mut guarded = pin!(ticks.with_leader_election(&elector));
    tokio::spawn(async move {
        let (_, _, send) = next(&mut server).await;
        answer(send, 404, Lease::default(), "");
        let (_, lease, send) = next(&mut server).await;
        answer(send, 201, lease, "1");
        // The first renewal fails, the others are never answered.
        let (_, lease, send) = next(&mut server).await;
        answer(send, 500, lease, "");
        let mut stalled = Vec::new();
        while let Some(request) = server.next_request().await {
            stalled.push(request);
        }
    });
    let start = Instant::now();
    assert_eq!(guarded.next().await, Some(0));
    while guarded.next().await.is_some() {}
    assert_eq!(start.elapsed(), Duration::from_secs(10));
    assert_eq!(guarded.lost(), Some(Lost::RenewDeadlineExceeded));
}

#[tokio::test]
async fn invalid_configs_are_rejected_before_any_request() {
    let (secs, millis) = (Duration::from_secs, Duration::from_millis);
    let broken = |config: Config| match config.validate() {
        Err(Error::InvalidConfig(rule)) => rule,
        _ => "valid",
    };
    let config = || Config::new("ns", "lock", "me");
    assert_eq!(broken(config()), "valid");
    assert_eq!(broken(Config::new("ns", "lock", "")), "Lock identity is empty");
    let zero = config().retry_period(Duration::ZERO);
    assert_eq!(broken(zero), "retryPeriod must be greater than zero");
    let short = config().renew_deadline(secs(15));
    assert_eq!(broken(short), "leaseDuration must be greater than renewDeadline");
    let tight = config().retry_period(secs(9));
    assert_eq!(
        broken(tight),
        "renewDeadline must be greater than retryPeriod*JitterFactor"
    );
    let subsecond = config().lease_duration(millis(900)).renew_deadline(millis(500));
    assert_eq!(
        broken(subsecond.retry_period(millis(100))),
        "leaseDuration must be between 1 s and i32::MAX s"
    );

    let (service, _server) = mock::pair::<Request<Body>, Response<Body>>();
    let elector = LeaderElector::new(Client::new(service, "ns"), Config::new("ns", "lock", ""));
    assert!(matches!(elector, Err(Error::InvalidConfig(_))));
}

#[tokio::test(start_paused = true)]
async fn a_released_lease_is_taken_on_the_watch_event_without_waiting_a_retry_period() {
    let (elector, mut server) = elector();
    let acquire = tokio::spawn(acquire(elector));
    let (method, _, send) = next(&mut server).await;
    assert_eq!(method, Method::GET);
    answer(send, 200, held_by("other"), "5");
    let start = Instant::now();
    let mut released = held_by("");
    released.metadata.resource_version = Some("6".into());
    watch_shows(
        &mut server,
        held_by("other"),
        json!({"type": "MODIFIED", "object": released}),
    )
    .await;

    // One write, with the event's resourceVersion, and no read before it.
    let (watch, method, lease, send) = next_of_any(&mut server).await;
    assert_eq!(
        (watch, method, spec(&lease)),
        (false, Method::PUT, (Some("me"), Some(4)))
    );
    assert_eq!(lease.metadata.resource_version.as_deref(), Some("6"));
    assert!(start.elapsed() < Duration::from_secs(1));
    answer(send, 200, lease, "7");
    assert_eq!(acquire.await.unwrap().fencing_token(), 4);
}

#[tokio::test(start_paused = true)]
async fn a_forbidden_watch_falls_back_to_polling_every_retry_period() {
    let (elector, mut server) = elector();
    let _acquire = tokio::spawn(acquire(elector));
    let (method, _, send) = next(&mut server).await;
    assert_eq!(method, Method::GET);
    answer(send, 200, held_by("other"), "5");
    let (watch, _, _, send) = next_of_any(&mut server).await;
    assert!(watch);
    answer(send, 403, Lease::default(), "");
    let mut start = Instant::now();
    let (mut method, _, mut send) = next(&mut server).await;
    assert_eq!(method, Method::GET);
    // client-go's jittered retry period: between 2 s and 4.4 s, after a failed read too.
    for code in [500, 200] {
        assert!((Duration::from_secs(2)..=Duration::from_millis(4400)).contains(&start.elapsed()));
        answer(send, code, held_by("other"), "5");
        (start, (method, _, send)) = (Instant::now(), next(&mut server).await);
        assert_eq!(method, Method::GET);
    }
}

#[tokio::test(start_paused = true)]
async fn a_leader_ends_its_term_when_the_watch_shows_another_holder() {
    let (elector, mut server) = elector();
    let acquire = tokio::spawn(acquire(elector));
    let (_, _, send) = next(&mut server).await;
    answer(send, 404, Lease::default(), "");
    let (_, mine, send) = next(&mut server).await;
    answer(send, 201, mine.clone(), "1");
    let guard = acquire.await.unwrap();
    let start = Instant::now();
    let mut taken = held_by("other");
    taken.metadata.resource_version = Some("2".into());
    watch_shows(&mut server, mine, json!({"type": "MODIFIED", "object": taken})).await;

    // The event may be older than our last write: a renewal at once tells.
    let (method, lease, send) = next(&mut server).await;
    assert_eq!(
        (method, lease.metadata.resource_version.as_deref()),
        (Method::PUT, Some("1"))
    );
    answer(send, 409, lease, "");
    let (method, _, send) = next(&mut server).await;
    assert_eq!(method, Method::GET);
    answer(send, 200, held_by("other"), "2");
    let holder = "other".to_owned();
    assert_eq!(guard.await, Lost::TakenOver { holder });
    assert!(start.elapsed() < Duration::from_secs(1));
}

/// Acquires the Lease by creating it (answered rv "1").
async fn lead(elector: &LeaderElector, server: &mut ApiServer) -> LeaseGuard {
    let acquire = tokio::spawn(acquire(elector.clone()));
    let (_, _, send) = next(server).await;
    answer(send, 404, Lease::default(), "");
    let (_, lease, send) = next(server).await;
    answer(send, 201, lease, "1");
    acquire.await.unwrap()
}

#[tokio::test(start_paused = true)]
async fn shutdown_releases_the_lease_once_the_last_guard_is_dropped_within_the_grace() {
    let (elector, mut server) = elector();
    let guard = lead(&elector, &mut server).await;
    let shutdown = tokio::spawn({
        let elector = elector.clone();
        async move { elector.shutdown(Duration::from_secs(10)).await }
    });
    elector.shutdown_requested().await;
    // A candidate that shut down does not lead again: a guarded stream ends unpolled.
    let mut guarded = pin!(stream::iter([1]).with_leader_election(&elector));
    assert_eq!(guarded.next().await, None);
    assert_eq!(guarded.lost(), Some(Lost::Shutdown));

    sleep(Duration::from_secs(1)).await;
    drop(guard);
    let (method, lease, send) = next(&mut server).await;
    assert_eq!((method, spec(&lease)), (Method::PUT, (Some(""), Some(0))));
    answer(send, 200, lease, "2");
    shutdown.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_guard_alive_after_the_grace_ends_with_shutdown_and_the_lease_is_left_to_expire() {
    let (elector, mut server) = elector();
    let mut guard = lead(&elector, &mut server).await;
    let lost_signal = tokio::spawn(guard.lost_signal());
    let shutdown = tokio::spawn({
        let elector = elector.clone();
        async move { elector.shutdown(Duration::from_secs(3)).await }
    });
    // The leader renews during the grace.
    let (method, lease, send) = next(&mut server).await;
    assert_eq!((method, spec(&lease)), (Method::PUT, (Some("me"), Some(0))));
    answer(send, 200, lease, "2");
    assert_eq!((&mut guard).await, Lost::Shutdown);
    lost_signal.await.unwrap();
    shutdown.await.unwrap();
    // No release: work stopped by the shutdown may still land.
    let after = tokio::time::timeout(Duration::from_secs(60), next(&mut server)).await;
    assert!(after.is_err(), "no request after the shutdown");
}
