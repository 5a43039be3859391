//! Operability against a real kube-apiserver and etcd: metrics read back from
//! a `prometheus-client` registry during a real election and handover, the
//! health check, the manifests in `deploy/` (accepted by the API server,
//! and their leader-election Role is exactly enough for a watch-driven
//! election), and the off switch (no Lease permission, no Lease request).

mod support;

use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use k8s_openapi::api::rbac::v1::Role;
use kube::{
    Api, Client,
    api::{DynamicObject, ObjectMeta, PostParams},
    core::GroupVersionKind,
    discovery::{self, Scope},
};
use kube_runtime_lease::{LeaderElector, metrics::LeaseMetrics};
use kube_runtime_lease_harness::{TestEnv, Timings, shared_env};
use prometheus_client::{encoding::text::encode, registry::Registry};
use support::fast_config;
use tokio::time::timeout;

fn scrape(registry: &Registry) -> String {
    let mut out = String::new();
    encode(&mut out, registry).expect("encoding metrics");
    out
}

/// The value of the sample `name{labels}` in a text exposition.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.trim().parse().ok()))
}

#[tokio::test]
async fn metrics_follow_a_real_election_and_handover() -> Result<()> {
    let env = shared_env().await?;
    let ns = env.new_namespace("metrics").await?;
    let labels = format!(r#"{{namespace="{ns}",lease="lease"}}"#);
    let is_leader = format!("leader_election_is_leader{labels}");
    let since = format!("leader_election_seconds_since_last_renewal{labels}");
    let renewals =
        format!(r#"leader_election_renewals_total{{namespace="{ns}",lease="lease",outcome="success"}}"#);

    // Two replicas, each with its own registry (as two pods would have).
    let (mut reg_a, mut reg_b) = (Registry::default(), Registry::default());
    let a = LeaderElector::new(env.client().await?, fast_config(&ns, "a"))?
        .with_metrics(&LeaseMetrics::register(&mut reg_a));
    let b = LeaderElector::new(env.client().await?, fast_config(&ns, "b"))?
        .with_metrics(&LeaseMetrics::register(&mut reg_b));
    assert_eq!(sample(&scrape(&reg_a), &is_leader), Some(0.0));

    // a creates the Lease (and leads one lease duration later); b stands by.
    let guard_a = timeout(Duration::from_secs(10), a.acquire()).await??;
    let mut acquiring_b = Box::pin(b.acquire());
    ensure!(
        timeout(Duration::from_secs(2), &mut acquiring_b).await.is_err(),
        "b led while a holds the lease"
    );
    let (text_a, text_b) = (scrape(&reg_a), scrape(&reg_b));
    assert_eq!(sample(&text_a, &is_leader), Some(1.0), "{text_a}");
    assert_eq!(sample(&text_b, &is_leader), Some(0.0), "{text_b}");
    let renewed = sample(&text_a, &renewals).context("renewals")?;
    assert!(renewed >= 4.0, "a renews every 0.5 s: {renewed}\n{text_a}");
    let age = sample(&text_a, &since).context("seconds since last renewal")?;
    assert!((0.0..=1.0).contains(&age), "{age}");
    assert!(
        sample(&text_b, &since).is_none(),
        "only a leader has a last renewal: {text_b}"
    );
    assert!(a.health_check(Duration::ZERO).is_ok());
    assert!(b.health_check(Duration::ZERO).is_ok());

    // a hands over; b leads at once; the gauges sum to one throughout.
    drop(guard_a);
    let guard_b = timeout(Duration::from_secs(2), acquiring_b).await??;
    let (text_a, text_b) = (scrape(&reg_a), scrape(&reg_b));
    assert_eq!(sample(&text_a, &is_leader), Some(0.0), "{text_a}");
    assert_eq!(sample(&text_b, &is_leader), Some(1.0), "{text_b}");
    let changes = format!("leader_election_transitions_total{labels}");
    assert!(
        sample(&text_b, &changes).context("transitions")? >= 2.0,
        "a, then b: {text_b}"
    );
    assert!(guard_b.is_valid());
    Ok(())
}

/// Every document of the manifests in `deploy/`.
fn manifests() -> Result<Vec<serde_json::Value>> {
    let dir = kube_runtime_lease_harness::workspace_root().join("deploy");
    let mut docs = Vec::new();
    for file in ["rbac.yaml", "deployment.yaml", "pdb.yaml", "sharded.yaml"] {
        let text =
            std::fs::read_to_string(dir.join(file)).with_context(|| format!("reading deploy/{file}"))?;
        let parsed: Vec<serde_json::Value> =
            serde_saphyr::from_multiple(&text).with_context(|| format!("parsing deploy/{file}"))?;
        docs.extend(parsed.into_iter().filter(|d| !d.is_null()));
    }
    Ok(docs)
}

async fn api_for(client: &Client, obj: &DynamicObject) -> Result<Api<DynamicObject>> {
    let types = obj.types.as_ref().context("manifest without apiVersion/kind")?;
    let gvk = GroupVersionKind::try_from(types)?;
    let (resource, caps) = discovery::pinned_kind(client, &gvk).await?;
    Ok(match (caps.scope, obj.metadata.namespace.as_deref()) {
        (Scope::Namespaced, Some(ns)) => Api::namespaced_with(client.clone(), ns, &resource),
        (Scope::Namespaced, None) => Api::default_namespaced_with(client.clone(), &resource),
        (Scope::Cluster, _) => Api::all_with(client.clone(), &resource),
    })
}

#[tokio::test]
async fn the_deploy_manifests_are_accepted_by_the_api_server() -> Result<()> {
    let env = shared_env().await?;
    let client = env.client().await?;
    let docs = manifests()?;
    let kinds: Vec<_> = docs.iter().filter_map(|d| d["kind"].as_str()).collect();
    for kind in [
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "Deployment",
        "PodDisruptionBudget",
    ] {
        assert!(kinds.contains(&kind), "deploy/ lacks a {kind}: {kinds:?}");
    }
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    for doc in docs {
        let obj: DynamicObject = serde_json::from_value(doc)?;
        let name = obj.metadata.name.clone().unwrap_or_default();
        api_for(&client, &obj)
            .await?
            .create(&dry_run, &obj)
            .await
            .with_context(|| format!("the API server rejected {name}"))?;
    }
    Ok(())
}

#[tokio::test]
async fn the_deploy_role_is_enough_for_a_watch_driven_election_its_events_and_lease_labels() -> Result<()> {
    let env = shared_env().await?;
    let ns = env.new_namespace("deploy-rbac").await?;
    let admin = env.client().await?;
    let mut role: Role = manifests()?
        .into_iter()
        .find(|d| d["kind"] == "Role")
        .map(serde_json::from_value)
        .context("no Role in deploy/rbac.yaml")??;
    role.metadata = ObjectMeta {
        name: Some("leader-election".into()),
        ..ObjectMeta::default()
    };
    Api::<Role>::namespaced(admin.clone(), &ns)
        .create(&PostParams::default(), &role)
        .await?;
    let user = format!("deploy-{ns}");
    TestEnv::bind_role(&admin, &ns, "leader-election", &user).await?;

    // With exactly that Role: a leader that labels the Lease and publishes
    // Events (as the example does), and a standby that takes a release at
    // once (so it watches).
    let a = LeaderElector::new(
        env.user_client(&user, &[]).await?,
        fast_config(&ns, "a").label("app.kubernetes.io/name", "lease"),
    )?
    .with_events(kube::runtime::events::Reporter {
        controller: "deploy-rbac".into(),
        instance: None,
    });
    let b = LeaderElector::new(env.user_client(&user, &[]).await?, fast_config(&ns, "b"))?;
    let guard = timeout(Duration::from_secs(10), a.acquire()).await??;
    let mut acquiring = Box::pin(b.acquire());
    ensure!(
        timeout(Duration::from_secs(1), &mut acquiring).await.is_err(),
        "b led while a holds the lease"
    );
    let released = tokio::time::Instant::now();
    drop(guard);
    let guard = timeout(Duration::from_secs(2), acquiring).await??;
    let took = released.elapsed();
    // A polling standby would need up to 2.2 retry periods (1.1 s); a watching one, one event.
    assert!(took < Duration::from_millis(400), "handover took {took:?}");
    assert!(guard.is_valid());
    let admin = env.client().await?;
    let lease = Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(admin.clone(), &ns)
        .get("lease")
        .await?;
    assert_eq!(
        lease
            .metadata
            .labels
            .unwrap_or_default()
            .get("app.kubernetes.io/name")
            .map(String::as_str),
        Some("lease"),
        "the leader's label"
    );
    // a's two Events (became leader, gave up), created with the Role's rights.
    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(admin, &ns);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let list = events.list(&kube::api::ListParams::default()).await?;
        let ours = list
            .items
            .iter()
            .filter(|e| e.reporting_controller.as_deref() == Some("deploy-rbac"))
            .count();
        if ours >= 2 {
            break;
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "{ours} Events of the leader within 10 s: the Role does not let it publish them"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// Lets `user` get, list and watch `ConfigMaps` in `ns`, and nothing else.
async fn grant_configmap_reads(admin: &Client, ns: &str, user: &str) -> Result<()> {
    use k8s_openapi::api::rbac::v1::PolicyRule;

    let role = Role {
        metadata: ObjectMeta {
            name: Some("configmaps".into()),
            ..ObjectMeta::default()
        },
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(vec!["configmaps".into()]),
            verbs: vec!["get".into(), "list".into(), "watch".into()],
            ..PolicyRule::default()
        }]),
    };
    Api::<Role>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &role)
        .await?;
    TestEnv::bind_role(admin, ns, "configmaps", user).await?;
    Ok(())
}

/// The off switch (`LeaseConfig::enabled(false)`, a `--leader-elect=false`):
/// with a user that may read `ConfigMaps` but has no Lease permission at all, a
/// guarded Controller reconciles, and not one Lease request is sent (counted
/// on the client; any would be refused with 403).
#[tokio::test]
async fn a_disabled_election_reconciles_with_no_lease_permission_and_no_lease_request() -> Result<()> {
    use std::sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    };

    use futures::StreamExt;
    use k8s_openapi::api::{coordination::v1::Lease, core::v1::ConfigMap};
    use kube::runtime::{Controller, controller::Action, watcher};
    use kube_runtime_lease::LeaderElectionControllerExt;

    let env = shared_env().await?;
    let ns = env.new_namespace("disabled").await?;
    let admin = env.client().await?;
    let user = format!("no-lease-{ns}");
    grant_configmap_reads(&admin, &ns, &user).await?;
    // The user's client, counting the Lease requests it sends.
    let lease_requests = Arc::new(AtomicUsize::new(0));
    let client = {
        let counter = lease_requests.clone();
        let kubeconfig = kube::config::Kubeconfig::read_from(env.user_kubeconfig(&user, &[])?)?;
        let config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default())
                .await?;
        kube::client::ClientBuilder::try_from(config)?
            .with_layer(&tower::util::MapRequestLayer::new(
                move |req: http::Request<kube::client::Body>| {
                    if req.uri().path().contains("/leases") {
                        counter.fetch_add(1, Ordering::SeqCst);
                    }
                    req
                },
            ))
            .build()
    };
    // The count sees a Lease request (one, refused: no Lease permission).
    let refused = Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(client.clone(), &ns)
        .get_opt("lease")
        .await;
    ensure!(
        matches!(&refused, Err(kube::Error::Api(s)) if s.code == 403),
        "expected a 403: {refused:?}"
    );
    ensure!(
        lease_requests.load(Ordering::SeqCst) == 1,
        "the Lease request was not counted"
    );
    let elector = LeaderElector::new(client.clone(), fast_config(&ns, "solo").enabled(false))?;
    let reconciled = Arc::new(AtomicUsize::new(0));
    let controller = Controller::new(
        Api::<ConfigMap>::namespaced(client, &ns),
        watcher::Config::default(),
    )
    .with_leader_election(&elector)
    .run(
        |_cm: Arc<ConfigMap>, seen: Arc<AtomicUsize>| async move {
            seen.fetch_add(1, Ordering::SeqCst);
            Ok::<_, kube::Error>(Action::await_change())
        },
        |_cm, _err: &kube::Error, _seen| Action::requeue(Duration::from_millis(500)),
        reconciled.clone(),
    );
    let running = tokio::spawn(async move {
        let mut controller = std::pin::pin!(controller);
        while controller.next().await.is_some() {}
        controller.lost()
    });
    let cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some("reconcile-me".into()),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    };
    Api::<ConfigMap>::namespaced(admin.clone(), &ns)
        .create(&PostParams::default(), &cm)
        .await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while reconciled.load(Ordering::SeqCst) == 0 {
        ensure!(
            tokio::time::Instant::now() < deadline,
            "the guarded controller did not reconcile within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(elector.is_leader());
    elector.shutdown(Duration::from_secs(5)).await?;
    // The guarded Controller shuts down gracefully with the elector (its
    // stream ends on its own), or is dropped as the term ends.
    let lost = timeout(Duration::from_secs(10), running).await??;
    assert!(
        matches!(lost, None | Some(kube_runtime_lease::Lost::Shutdown)),
        "{lost:?}"
    );
    let leases = Api::<Lease>::namespaced(admin, &ns)
        .list(&kube::api::ListParams::default())
        .await?;
    assert!(leases.items.is_empty(), "a lease was written: {:?}", leases.items);
    assert_eq!(
        lease_requests.load(Ordering::SeqCst),
        1,
        "the disabled elector sent Lease requests"
    );
    Ok(())
}

/// Kubernetes Events (`LeaderElector::with_events`): one `events.k8s.io/v1`
/// Event when the candidate becomes leader and one when it stops, on the
/// Lease; renewals publish nothing.
#[tokio::test]
async fn transitions_are_published_as_events_on_the_lease() -> Result<()> {
    use k8s_openapi::api::events::v1::Event;
    use kube::{api::ListParams, runtime::events::Reporter};

    let env = shared_env().await?;
    let ns = env.new_namespace("events").await?;
    let admin = env.client().await?;
    let events = Api::<Event>::namespaced(admin, &ns);
    let notes = || async {
        let list = events.list(&ListParams::default()).await?;
        // Each transition its own Event: no repeat folded into a series.
        let notes: Vec<String> =
            list.items
                .iter()
                .filter(|e| {
                    e.regarding.as_ref().is_some_and(|r| {
                        r.kind.as_deref() == Some("Lease") && r.name.as_deref() == Some("lease")
                    }) && e.reason.as_deref() == Some("LeaderElection")
                })
                .map(|e| {
                    let folded = if e.series.is_some() { " (folded)" } else { "" };
                    format!(
                        "{}: {}{folded}",
                        e.action.clone().unwrap_or_default(),
                        e.note.clone().unwrap_or_default()
                    )
                })
                .collect();
        anyhow::Ok(notes)
    };
    let wait_for = |n: usize| async move {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let found = notes().await?;
            if found.len() >= n {
                return anyhow::Ok(found);
            }
            ensure!(
                tokio::time::Instant::now() < deadline,
                "{n} events expected within 10 s, found {found:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let elector = LeaderElector::new(env.client().await?, fast_config(&ns, "pod-a"))?.with_events(Reporter {
        controller: "kube-runtime-lease-tests".into(),
        instance: Some("pod-a".into()),
    });
    let guard = timeout(Duration::from_secs(10), elector.acquire()).await??;
    let found = wait_for(1).await?;
    assert_eq!(found, ["BecameLeader: pod-a became leader"]);
    // Renewals (several retry periods) publish nothing.
    tokio::time::sleep(Timings::FAST.retry_period * 3).await;
    assert_eq!(notes().await?, ["BecameLeader: pod-a became leader"]);
    drop(guard);
    let mut found = wait_for(2).await?;
    found.sort();
    assert_eq!(
        found,
        [
            "BecameLeader: pod-a became leader",
            "GivenUp: pod-a stopped leading: nobody wants leadership any more",
        ]
    );
    Ok(())
}

/// `GET path` on `addr`: the status code and the body.
async fn http_get(addr: std::net::SocketAddr, path: &str) -> Result<(u16, String)> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream
        .write_all(format!("GET {path} HTTP/1.1\r\nHost: probes\r\nConnection: close\r\n\r\n").as_bytes())
        .await?;
    let mut response = String::new();
    timeout(Duration::from_secs(5), stream.read_to_string(&mut response)).await??;
    let code = response
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .context("no status line")?;
    let body = response.split("\r\n\r\n").nth(1).unwrap_or_default().to_owned();
    Ok((code, body))
}

/// The probes of the example controller (`examples/probes.rs`, wired in
/// `deploy/deployment.yaml`): `/readyz` follows leadership when asked to,
/// `/livez` passes for a healthy leader and a standby alike.
#[tokio::test]
async fn the_probes_follow_leadership() -> Result<()> {
    use kube_runtime_lease_examples::probes::{self, Readiness};

    let env = shared_env().await?;
    let ns = env.new_namespace("probes").await?;
    let serve = |elector: &LeaderElector, readiness| {
        let elector = elector.clone();
        async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
            let addr = listener.local_addr()?;
            tokio::spawn(probes::serve(listener, elector, readiness));
            anyhow::Ok(addr)
        }
    };
    let a = LeaderElector::new(env.client().await?, fast_config(&ns, "a"))?;
    let b = LeaderElector::new(env.client().await?, fast_config(&ns, "b"))?;
    let (a_probes, b_probes) = (
        serve(&a, Readiness::WhenLeading).await?,
        serve(&b, Readiness::WhenLeading).await?,
    );
    let b_always = serve(&b, Readiness::Always).await?;
    let guard = timeout(Duration::from_secs(10), a.acquire()).await??;
    let _standby = tokio::spawn({
        let b = b.clone();
        async move { b.acquire().await }
    });
    assert_eq!(http_get(a_probes, "/readyz").await?, (200, "leading\n".into()));
    assert_eq!(http_get(b_probes, "/readyz").await?.0, 503);
    assert_eq!(http_get(b_always, "/readyz").await?.0, 200);
    for addr in [a_probes, b_probes] {
        assert_eq!(http_get(addr, "/livez").await?, (200, "ok\n".into()));
    }
    drop(guard);
    a.shutdown(Duration::from_secs(5)).await?;
    assert_eq!(
        http_get(a_probes, "/readyz").await?.0,
        503,
        "not ready once shutdown begins"
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while http_get(b_probes, "/readyz").await?.0 != 200 {
        ensure!(tokio::time::Instant::now() < deadline, "b never became ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}
