//! The user's `kube::Client` stack, shared with the election: tower's
//! concurrency limit and kube's own retry layer in front of the Lease API
//! double, on paused time. Which Client to give the elector (the README's
//! *Which Client to give the elector*, the crate docs' *The client's stack*).

use std::{pin::pin, time::Duration};

use http::{Request, Response};
use k8s_openapi::api::core::v1::ConfigMap;
use kube_client::{
    Api, Client,
    api::ListParams,
    client::{Body, retry::RetryPolicy},
};
use tokio::time::{Instant, sleep, timeout};
use tower::{BoxError, Layer as _, limit::ConcurrencyLimitLayer, retry::RetryLayer, util::BoxCloneService};

use crate::{
    LeaderElector, Lost,
    test_util::{FakeLeaseApi, Fault},
    tests::support::{config, count, free, holder, paused},
};

const S: fn(u64) -> Duration = Duration::from_secs;

/// A service in front of a new client of `fake` (its index for faults is
/// returned too): every request other than a Lease's (a controller's LIST
/// of `ConfigMap`s) takes `slow` before the double answers it, as a large
/// LIST does on a loaded API server. The user's layers go on top of it.
fn service(
    fake: &FakeLeaseApi,
    slow: Duration,
) -> (BoxCloneService<Request<Body>, Response<Body>, BoxError>, usize) {
    let (client, id) = fake.client();
    let service = tower::service_fn(move |req: Request<Body>| {
        let client = client.clone();
        async move {
            if !req.uri().path().contains("/leases") {
                sleep(slow).await;
            }
            client.send(req).await.map_err(BoxError::from)
        }
    });
    (BoxCloneService::new(service), id)
}

/// A controller's traffic on `client`: `n` slow LISTs in flight at all times.
fn controller_load(client: &Client, n: usize) {
    for _ in 0..n {
        let api = Api::<ConfigMap>::all(client.clone());
        tokio::spawn(async move {
            loop {
                let _ = api.list(&ListParams::default()).await;
            }
        });
    }
}

/// A leader whose Client shares a concurrency limit (tower's
/// `ConcurrencyLimitLayer`, 4) with its controller's slow LISTs (8 in
/// flight): its renewals queue behind them in the Client's own stack, and a
/// healthy leader loses its term at the renew deadline under its own load.
/// On a Client of its own (the advice of the README and the crate docs, as
/// client-go's leader election has its own client and rate limiter) it keeps
/// the term under the same load. kube's default Client has no such limit.
#[test]
fn a_client_limit_filled_by_the_controller_costs_the_term_and_a_client_of_its_own_keeps_it() {
    for own_client in [false, true] {
        paused(async move {
            let fake = free();
            let (service, _) = service(&fake, S(30));
            let shared = Client::new(ConcurrencyLimitLayer::new(4).layer(service), "default");
            let client = if own_client {
                fake.client().0
            } else {
                shared.clone()
            };
            let elector = LeaderElector::new(client, config("a")).unwrap();
            let guard = elector.acquire().await.unwrap();
            let start = Instant::now();
            controller_load(&shared, 8);
            sleep(S(120)).await;
            if own_client {
                assert!(
                    guard.is_valid(),
                    "the leader on a Client of its own lost its term under the controller's load: {:?}",
                    guard.lost()
                );
                assert_eq!(holder(&fake).as_deref(), Some("a"));
            } else {
                assert_eq!(
                    guard.lost(),
                    Some(Lost::RenewDeadlineExceeded),
                    "a leader sharing the controller's saturated limit kept its term"
                );
                assert!(
                    count(&fake, 0, "update", start) == 0,
                    "a renewal went through the saturated limit"
                );
            }
        });
    }
}

/// A watch holds no slot of a concurrency limit: the limit's permit goes
/// with the response's head, not its streamed body. With a limit of one
/// request on each candidate's Client, the leader renews every retry period
/// beside its open watch, and the follower, its watch open too, reads and
/// takes over through its one slot once the leader is cut off.
#[test]
fn the_watch_takes_no_slot_of_a_concurrency_limit_of_one() {
    paused(async {
        let fake = free();
        let limited = |fake: &FakeLeaseApi| {
            let (service, id) = service(fake, Duration::ZERO);
            (
                Client::new(ConcurrencyLimitLayer::new(1).layer(service), "default"),
                id,
            )
        };
        let ((a_client, a_id), (b_client, b_id)) = (limited(&fake), limited(&fake));
        let a = LeaderElector::new(a_client, config("a")).unwrap();
        let b = LeaderElector::new(b_client, config("b")).unwrap();
        let a_guard = a.acquire().await.unwrap();
        let start = Instant::now();
        let mut b_acquire = pin!(b.acquire());
        assert!(timeout(S(60), &mut b_acquire).await.is_err(), "b led beside a");
        assert!(a_guard.is_valid(), "a lost its term: {:?}", a_guard.lost());
        let renewals = count(&fake, a_id, "update", start);
        assert!(
            renewals >= 29,
            "a renewed {renewals} times in 60 s beside its watch"
        );
        for id in [a_id, b_id] {
            assert!(
                count(&fake, id, "watch", Instant::now() - S(3600)) >= 1,
                "client {id} never watched"
            );
        }
        fake.partition(a_id, true);
        let _b_guard = timeout(S(20), b_acquire)
            .await
            .expect("b did not take over through its one slot within 20 s of a's crash")
            .unwrap();
    });
}

/// kube's own retry layer (`Config::default_retry`, on by default in kube 5:
/// 429, 503 and 504 retried up to 15 times) in front of the election: a
/// renewal and a takeover applied and answered 504 are sent again by the
/// layer and answered 409 (the resourceVersion moved on with our own
/// write). The term goes on without a break, and the takeover is led at
/// once: the election recognises its own write.
#[test]
fn kubes_retry_layer_resending_an_applied_write_costs_no_term() {
    paused(async {
        let fake = free();
        let (service, id) = service(&fake, Duration::ZERO);
        let retried = RetryLayer::new(RetryPolicy::server_retry()).layer(service);
        let elector = LeaderElector::new(Client::new(retried, "default"), config("a").watch(false)).unwrap();
        fake.fault(id, Some("update"), Fault::AppliedThenStatus(504));
        let guard = timeout(S(1), elector.acquire())
            .await
            .expect("a takeover applied, answered 504 and retried was not led at once")
            .unwrap();
        let start = Instant::now();
        for _ in 0..3 {
            fake.fault(id, Some("update"), Fault::AppliedThenStatus(504));
            sleep(S(10)).await;
        }
        assert!(guard.is_valid(), "the term ended: {:?}", guard.lost());
        // Each faulted renewal: the write, the layer's retry (409), the read,
        // the renewal again.
        assert!(
            count(&fake, id, "update", start) >= 3 * 3 + 9,
            "renewals not retried as expected"
        );
        assert_eq!(holder(&fake).as_deref(), Some("a"));
    });
}
