//! "Never none" against a real kube-apiserver and etcd: the faults
//! that left a Lease without a leader, made on the real API server where they
//! can be. The unit suite (`kube-runtime-lease/src/tests/never_none.rs`) has
//! each of them on the double, with paused time.
//!
//! A 404 that is not the Lease's `NotFound` is made by sending a request to
//! a path the API server does not serve (`coordination.k8s.io/v0`): the real
//! API server answers it with its own plain-text `404 page not found`, as it
//! (or a proxy in front of it) may answer while it starts or is upgraded.
//!
//! The same misrouting makes one "never two" fault as well: a leader whose
//! record is edited to a shorter lease duration while its renewals cannot
//! land.
//!
//! Timings are short (2 s lease duration, 1.5 s renew deadline, 0.5 s retry
//! period); every wait is bounded and says what it waited for.

mod support;

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use anyhow::{Context as _, Result, bail, ensure};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject, ObjectMeta, PostParams},
};
use kube_runtime_lease::{LeaderElector, LeaderStatus, LeaseConfig, LeaseGuard, LeaseObserver, Lost};
use kube_runtime_lease_harness::{TestEnv, Timings, free_spec, shared_env};
use tokio::time::{Instant, sleep, timeout};

const LEASE: &str = "lease";
const LEASE_DURATION: Duration = Timings::FAST.lease_duration;
/// The annotation that carries the fencing token (crate docs, *Liveness*).
const TOKEN_ANNOTATION: &str = "leases.kube.rs/fencing-token";

/// How many of a client's next requests for the Lease by name are sent where
/// the API server answers 404 without naming it.
#[derive(Clone, Default)]
struct Misroute {
    gets: Arc<AtomicUsize>,
    puts: Arc<AtomicUsize>,
    /// Creations sent (counted, never misrouted).
    posts: Arc<AtomicUsize>,
}

impl Misroute {
    /// A client of the test's API server whose Lease requests go through this.
    async fn client(&self, env: &TestEnv) -> Result<Client> {
        let kubeconfig = kube::config::Kubeconfig::read_from(env.kubeconfig_path())?;
        let config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default())
                .await?;
        let this = self.clone();
        Ok(kube::client::ClientBuilder::try_from(config)?
            .with_layer(&tower::util::MapRequestLayer::new(
                move |mut req: http::Request<kube::client::Body>| {
                    this.route(&mut req);
                    req
                },
            ))
            .build())
    }

    fn route(&self, req: &mut http::Request<kube::client::Body>) {
        let path = req.uri().path();
        if *req.method() == http::Method::POST && path.ends_with("/leases") {
            self.posts.fetch_add(1, Ordering::SeqCst);
            return;
        }
        if !path.ends_with(&format!("/leases/{LEASE}")) {
            return;
        }
        let counter = match *req.method() {
            http::Method::GET => &self.gets,
            http::Method::PUT => &self.puts,
            _ => return,
        };
        if counter
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            let misrouted = req
                .uri()
                .to_string()
                .replace("/coordination.k8s.io/v1/", "/coordination.k8s.io/v0/");
            if let Ok(uri) = misrouted.parse() {
                *req.uri_mut() = uri;
            }
        }
    }
}

struct Fx {
    env: &'static TestEnv,
    ns: String,
    leases: Api<Lease>,
}

async fn fixture(prefix: &str) -> Result<Fx> {
    let env = shared_env().await?;
    let ns = env.new_namespace(prefix).await?;
    let leases = Api::namespaced(env.client().await?, &ns);
    Ok(Fx { env, ns, leases })
}

impl Fx {
    fn config(&self, identity: &str) -> LeaseConfig {
        support::fast_config(&self.ns, identity).release_timeout(Duration::from_secs(2))
    }

    async fn candidate(&self, config: LeaseConfig) -> Result<LeaderElector> {
        Ok(LeaderElector::new(self.env.client().await?, config)?)
    }

    async fn create(&self, spec: LeaseSpec) -> Result<Lease> {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(LEASE.to_owned()),
                ..ObjectMeta::default()
            },
            spec: Some(spec),
        };
        Ok(self.leases.create(&PostParams::default(), &lease).await?)
    }

    async fn spec(&self) -> Result<LeaseSpec> {
        self.leases.get(LEASE).await?.spec.context("lease without spec")
    }

    /// Read-modify-write as admin, retried on conflicts with the electors.
    async fn modify(&self, edit: impl Fn(&mut LeaseSpec)) -> Result<()> {
        for _ in 0..50 {
            let mut lease = self.leases.get(LEASE).await?;
            edit(lease.spec.get_or_insert_with(LeaseSpec::default));
            match self.leases.replace(LEASE, &PostParams::default(), &lease).await {
                Ok(_) => return Ok(()),
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(e) => return Err(e.into()),
            }
        }
        bail!("50 conflicts in a row modifying the lease")
    }
}

async fn acquire_within(elector: &LeaderElector, within: Duration) -> Result<LeaseGuard> {
    timeout(within, elector.acquire())
        .await
        .with_context(|| {
            format!(
                "{} did not lead within {within:?}; status {:?}",
                elector.config().identity(),
                elector.status()
            )
        })?
        .map_err(Into::into)
}

/// A renewal answered with the API server's 404 for a path it does not serve,
/// and the read that checks it answered the same way, cost that renewal: the
/// term goes on, and the leader keeps renewing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_answered_an_odd_404_does_not_end_the_term() -> Result<()> {
    let fx = fixture("odd-404-renewal").await?;
    fx.create(free_spec()).await?;
    let misroute = Misroute::default();
    let a = LeaderElector::new(misroute.client(fx.env).await?, fx.config("a"))?;
    let guard = acquire_within(&a, Duration::from_secs(5)).await?;
    let renewed = fx.spec().await?.renew_time.context("renewTime")?.0;
    misroute.puts.store(1, Ordering::SeqCst);
    misroute.gets.store(1, Ordering::SeqCst);
    timeout(Duration::from_secs(5), async {
        while misroute.puts.load(Ordering::SeqCst) > 0 {
            sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .context("no renewal within 5 s")?;
    sleep(LEASE_DURATION * 2).await;
    ensure!(guard.lost().is_none(), "the term ended: {:?}", guard.lost());
    ensure!(
        misroute.gets.load(Ordering::SeqCst) == 0,
        "the 404 was not checked with a read"
    );
    ensure!(guard.is_valid() && a.is_leader(), "no longer leading");
    let spec = fx.spec().await?;
    ensure!(spec.holder_identity.as_deref() == Some("a"), "{spec:?}");
    ensure!(
        spec.renew_time.context("renewTime")?.0 > renewed,
        "the leader stopped renewing"
    );
    a.shutdown(Duration::from_secs(1)).await?;
    Ok(())
}

/// A leader whose record is edited to a lease duration below its renew
/// deadline (1 s against 1.5 s: `kubectl edit`, a tool) while its renewals,
/// and the reads that check them, are answered with that 404, ends its term
/// that long after its last renewal was sent: before a candidate that saw
/// the edit may take the record (never two leaders). With its renewals
/// landing, it writes its duration back at once (the unit test has both).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_record_is_edited_to_a_shorter_duration_never_leads_beside_the_taker() -> Result<()> {
    let fx = fixture("edited-duration").await?;
    fx.create(free_spec()).await?;
    let misroute = Misroute::default();
    let a = LeaderElector::new(misroute.client(fx.env).await?, fx.config("a"))?;
    let a_guard = acquire_within(&a, Duration::from_secs(5)).await?;
    let b = fx.candidate(fx.config("b")).await?;
    let mut b_acquire = tokio::spawn({
        let b = b.clone();
        async move { acquire_within(&b, Duration::from_secs(20)).await }
    });
    ensure!(
        timeout(LEASE_DURATION, &mut b_acquire).await.is_err(),
        "b led beside a"
    );
    // Right after one of a's renewals, its renewals stop landing, and the
    // record is edited.
    let renewed = fx.spec().await?.renew_time;
    timeout(Duration::from_secs(5), async {
        while fx.spec().await.is_ok_and(|s| s.renew_time == renewed) {
            sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .context("no renewal within 5 s")?;
    misroute.puts.store(1_000, Ordering::SeqCst);
    misroute.gets.store(1_000, Ordering::SeqCst);
    fx.modify(|s| s.lease_duration_seconds = Some(1)).await?;
    let b_guard = b_acquire.await??;
    // a's term ended at its cut deadline, before b could take the record;
    // without the cut it is still valid here, or ended only when its watch
    // showed b's takeover.
    ensure!(
        a_guard.lost() == Some(Lost::RenewDeadlineExceeded),
        "two leaders: b took the record edited to 1 s before a's term ended ({:?}, {:?} left)",
        a_guard.lost(),
        a_guard.time_left()
    );
    ensure!(b_guard.is_valid() && fx.spec().await?.holder_identity.as_deref() == Some("b"));
    misroute.puts.store(0, Ordering::SeqCst);
    misroute.gets.store(0, Ordering::SeqCst);
    drop((a_guard, b_guard));
    a.shutdown(Duration::from_secs(1)).await?;
    b.shutdown(Duration::from_secs(1)).await?;
    Ok(())
}

/// A candidate whose reads are answered with that 404 does not take the
/// Lease for missing: it never sends a create, and takes the record once it
/// expires and its reads are answered again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_answered_an_odd_404_is_not_a_missing_lease() -> Result<()> {
    let fx = fixture("odd-404-read").await?;
    fx.create(LeaseSpec {
        holder_identity: Some("gone".into()),
        lease_duration_seconds: Some(2),
        lease_transitions: Some(3),
        ..LeaseSpec::default()
    })
    .await?;
    let misroute = Misroute::default();
    misroute.gets.store(2, Ordering::SeqCst);
    let b = LeaderElector::new(misroute.client(fx.env).await?, fx.config("b").watch(false))?;
    let guard = acquire_within(&b, Duration::from_secs(20)).await?;
    ensure!(guard.is_valid());
    ensure!(
        misroute.gets.load(Ordering::SeqCst) == 0,
        "the reads were not misrouted"
    );
    ensure!(
        misroute.posts.load(Ordering::SeqCst) == 0,
        "took the Lease for missing and sent a create"
    );
    let spec = fx.spec().await?;
    ensure!(
        spec.holder_identity.as_deref() == Some("b") && spec.lease_transitions == Some(4),
        "{spec:?}"
    );
    b.shutdown(Duration::from_secs(1)).await?;
    Ok(())
}

/// A leader whose guarded work is alive when the end of its term is marked
/// for another candidate steps down without releasing and campaigns again
/// at once: the preferred holder gets the Lease when the record expires, and
/// keeps it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_down_is_not_undone_by_campaigning_again() -> Result<()> {
    let fx = fixture("step-down-kept").await?;
    fx.create(free_spec()).await?;
    let a = fx.candidate(fx.config("a")).await?;
    let stepped_down = Arc::new(AtomicUsize::new(0));
    let campaign = tokio::spawn({
        let (a, stepped_down) = (a.clone(), stepped_down.clone());
        async move {
            // Each term's guard stays alive until its term ends.
            while let Ok(guard) = a.acquire().await {
                if let Lost::SteppedDown { .. } = guard.await {
                    stepped_down.fetch_add(1, Ordering::SeqCst);
                }
            }
        }
    });
    timeout(Duration::from_secs(5), a.subscribe().wait_for(|s| s.is_leader))
        .await
        .context("a did not lead")??;
    let p = fx.candidate(fx.config("p")).await?;
    let p_acquire = tokio::spawn({
        let p = p.clone();
        async move { p.acquire().await }
    });
    fx.modify(|s| {
        s.preferred_holder = Some("p".into());
        // The API server accepts a preferred holder only with a strategy.
        s.strategy = Some("OldestEmulationVersion".into());
    })
    .await?;
    let marked = Instant::now();
    let p_guard = timeout(LEASE_DURATION + Duration::from_secs(2), p_acquire)
        .await
        .context("the preferred holder did not lead within a lease duration of the mark")???;
    ensure!(
        stepped_down.load(Ordering::SeqCst) == 1,
        "a did not step down once"
    );
    sleep(LEASE_DURATION * 3).await;
    ensure!(p_guard.is_valid(), "p lost it: {:?}", p_guard.lost());
    ensure!(!a.is_leader(), "a took it back");
    ensure!(fx.spec().await?.holder_identity.as_deref() == Some("p"));
    ensure!(
        marked.elapsed() >= LEASE_DURATION,
        "p led before a's record expired"
    );
    campaign.abort();
    p.shutdown(Duration::from_secs(1)).await?;
    Ok(())
}

/// Fresh processes one after the other on a Lease whose `leaseTransitions`
/// is at the top of its range, then edited down: every term's token is
/// larger than the last, and the Lease carries it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_never_repeat_at_the_top_of_the_range_or_after_an_edit_down() -> Result<()> {
    let fx = fixture("token-top").await?;
    fx.create(LeaseSpec {
        lease_transitions: Some(i32::MAX),
        ..free_spec()
    })
    .await?;
    let mut tokens = Vec::new();
    for process in 0..4 {
        if process == 2 {
            fx.modify(|s| s.lease_transitions = Some(3)).await?;
        }
        let e = fx.candidate(fx.config(&format!("p{process}"))).await?;
        let guard = acquire_within(&e, Duration::from_secs(10)).await?;
        tokens.push(guard.fencing_token());
        let lease = fx.leases.get(LEASE).await?;
        let stored = lease
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(TOKEN_ANNOTATION))
            .context("no token annotation")?;
        ensure!(*stored == guard.fencing_token().to_string(), "{stored} stored");
        drop(guard);
        e.shutdown(Duration::from_secs(1)).await?;
    }
    ensure!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
    ensure!(tokens[0] >= i64::from(i32::MAX), "{tokens:?}");
    Ok(())
}

/// A Lease whose times lie past the last instant k8s-openapi's `MicroTime`
/// holds (jiff's `Timestamp` ends at 9999-12-30T22:00Z; Go's time, and so the
/// API server and client-go, at the end of 9999): `9999-12-31T23:59:59Z` is a
/// common "never expires" sentinel, written here by hand for a holder that is
/// gone. client-go reads such a record and takes the Lease one lease duration
/// after it last saw it change; a candidate that cannot decode it would never
/// read the Lease, and never lead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_dated_at_the_end_of_year_9999_is_read_and_taken_over() -> Result<()> {
    const END: &str = "9999-12-31T23:59:59.000000Z";
    let fx = fixture("year-9999").await?;
    let raw: Api<DynamicObject> =
        Api::namespaced_with(fx.env.client().await?, &fx.ns, &ApiResource::erase::<Lease>(&()));
    let lease = serde_json::from_value(serde_json::json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": { "name": LEASE },
        "spec": {
            "holderIdentity": "gone",
            "leaseDurationSeconds": 2,
            "acquireTime": END,
            "renewTime": END,
            "leaseTransitions": 4,
        },
    }))?;
    let stored = raw.create(&PostParams::default(), &lease).await?;
    ensure!(
        stored.data["spec"]["renewTime"] == END,
        "stored {:?}",
        stored.data["spec"]
    );
    // An observer reads it too.
    let observer = LeaseObserver::new(fx.env.client().await?, &fx.ns, LEASE)?;
    let mut seen = observer.subscribe();
    let holder = |want: &'static str| move |s: &LeaderStatus| s.holder.as_deref() == Some(want);
    timeout(LEASE_DURATION * 4, seen.wait_for(holder("gone")))
        .await
        .context("the observer never read the holder")??;

    let e = fx.candidate(fx.config("a")).await?;
    let guard = acquire_within(&e, LEASE_DURATION * 4).await?;
    timeout(LEASE_DURATION * 4, seen.wait_for(holder("a")))
        .await
        .context("the observer never saw the takeover")??;
    let spec = fx.spec().await?;
    ensure!(spec.holder_identity.as_deref() == Some("a"), "{spec:?}");
    ensure!(spec.lease_transitions == Some(5), "{spec:?}");
    ensure!(guard.is_valid(), "the term ended at once");
    drop(guard);
    e.shutdown(Duration::from_secs(1)).await?;
    Ok(())
}

/// The API server's limit on the total size of an object's annotations (keys
/// and values, in bytes: `TotalAnnotationSizeLimitB`).
const ANNOTATIONS_LIMIT: usize = 256 * 1024;

/// A free Lease whose annotations (someone else's: `kubectl apply`'s
/// `last-applied-configuration` of a large object, a tool's state) come close
/// to the API server's 256 KiB limit. client-go takes it as it is (its write
/// keeps the metadata it read); every takeover here adds the fencing-token
/// annotation, which the API server refused at every attempt: the Lease was
/// left without a leader for good.
#[tokio::test]
async fn a_free_lease_with_annotations_near_the_size_limit_gets_a_leader() -> Result<()> {
    let fx = fixture("big-annotations").await?;
    let key = "example.com/state";
    // 10 bytes of room: less than the token annotation's key alone.
    let value = "x".repeat(ANNOTATIONS_LIMIT - key.len() - 10);
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some(LEASE.to_owned()),
            annotations: Some([(key.to_owned(), value)].into()),
            ..ObjectMeta::default()
        },
        spec: Some(free_spec()),
    };
    fx.leases.create(&PostParams::default(), &lease).await?;
    let (logs, _log_guard) = support::LogBuf::capture(tracing::Level::WARN);
    let a = fx.candidate(fx.config("a")).await?;
    let led = acquire_within(&a, LEASE_DURATION * 5).await;
    let spec = fx.spec().await?;
    let guard = led.with_context(|| {
        let first_warning = logs
            .text()
            .lines()
            .find(|l| l.contains("WARN"))
            .map(str::to_owned);
        format!(
            "the free Lease was never taken: holder {:?}; first warning: {first_warning:?}",
            spec.holder_identity
        )
    })?;
    ensure!(spec.holder_identity.as_deref() == Some("a"), "{spec:?}");
    ensure!(
        logs.text().contains("leave no room for the fencing token"),
        "no warning that the token is not stored: {}",
        logs.text()
    );
    drop(guard);
    a.shutdown(Duration::from_secs(1)).await?;
    Ok(())
}

/// A Lease taken over by a holder with a long identity (the API server sets
/// no limit on `holderIdentity`; client-go's candidates accept any string).
/// The leader that loses it still publishes its "stopped leading" Event
/// (events.k8s.io/v1 notes are at most 1024 characters; the note quotes the
/// new holder), and does not blame RBAC for a refusal that is not one.
#[tokio::test]
async fn a_takeover_by_a_long_holder_identity_is_published_as_an_event() -> Result<()> {
    use futures::StreamExt;
    use k8s_openapi::api::events::v1::Event;
    use kube::runtime::{WatchStreamExt, events::Reporter, watcher};

    let fx = fixture("long-holder").await?;
    let events = Api::<Event>::namespaced(fx.env.client().await?, &fx.ns);
    let (logs, _log_guard) = support::LogBuf::capture(tracing::Level::WARN);
    let a = fx.candidate(fx.config("a")).await?.with_events(Reporter {
        controller: "kube-runtime-lease-tests".into(),
        instance: Some("a".into()),
    });
    let guard = acquire_within(&a, LEASE_DURATION * 5).await?;
    let long = "ü".repeat(1500);
    fx.modify(|s| {
        s.holder_identity = Some(long.clone());
        s.lease_transitions = Some(s.lease_transitions.unwrap_or(0) + 1);
    })
    .await?;
    let lost = timeout(LEASE_DURATION * 5, guard)
        .await
        .context("a still leads after its record was taken over")?;
    ensure!(matches!(lost, Lost::TakenOver { .. }), "{lost:?}");
    let mut applied = std::pin::pin!(watcher(events, watcher::Config::default()).applied_objects());
    let taken_over = timeout(LEASE_DURATION * 5, async {
        while let Some(event) = applied.next().await {
            if event?.action.as_deref() == Some("TakenOver") {
                return Ok(());
            }
        }
        bail!("the Events' watch ended")
    });
    taken_over.await.with_context(|| {
        format!(
            "no TakenOver Event after the loss; the leader logged: {:?}",
            logs.text().lines().find(|l| l.contains("event"))
        )
    })??;
    ensure!(!logs.text().contains("RBAC"), "RBAC blamed: {}", logs.text());
    a.shutdown(Duration::from_secs(1)).await?;
    Ok(())
}

/// A Lease whose name is as long as the API allows (253 characters, which
/// `LeaseConfig::validate` accepts), with Events on: each Event is named
/// after the Lease (`<name>.<hex>`), and the API server refuses an Event
/// name longer than 253 characters (422), so none of its transitions was
/// ever published. (Before: kube-runtime's `Recorder` named them with the
/// whole Lease name, 269 characters.)
#[tokio::test]
async fn the_events_of_a_lease_with_the_longest_name_are_published() -> Result<()> {
    use futures::StreamExt;
    use k8s_openapi::api::events::v1::Event;
    use kube::runtime::{WatchStreamExt, events::Reporter, watcher};

    let fx = fixture("long-lease-name").await?;
    let name = ["a".repeat(62), "b".repeat(62), "c".repeat(62), "d".repeat(64)].join(".");
    let events = Api::<Event>::namespaced(fx.env.client().await?, &fx.ns);
    let (logs, _log_guard) = support::LogBuf::capture(tracing::Level::WARN);
    let t = Timings::FAST;
    let config = LeaseConfig::new(&fx.ns, name.clone(), "a")
        .lease_duration(t.lease_duration)
        .renew_deadline(t.renew_deadline)
        .retry_period(t.retry_period)
        .creation_hold(false);
    let a = fx.candidate(config).await?.with_events(Reporter {
        controller: "kube-runtime-lease-tests".into(),
        instance: Some("a".into()),
    });
    let guard = acquire_within(&a, LEASE_DURATION * 5).await?;
    let mut applied = std::pin::pin!(watcher(events, watcher::Config::default()).applied_objects());
    let became_leader = timeout(LEASE_DURATION * 5, async {
        while let Some(event) = applied.next().await {
            let event = event?;
            if event.action.as_deref() == Some("BecameLeader")
                && event.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name.as_str())
            {
                return Ok(());
            }
        }
        bail!("the Events' watch ended")
    });
    became_leader.await.with_context(|| {
        format!(
            "no BecameLeader Event for the Lease with a 253-character name; the leader logged: {:?}",
            logs.text().lines().find(|l| l.contains("event"))
        )
    })??;
    drop(guard);
    a.shutdown(Duration::from_secs(1)).await?;
    Ok(())
}
