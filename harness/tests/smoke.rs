//! Smoke test of the control plane: namespaces, Lease fields behind the
//! `CoordinatedLeaderElection` gate, an apiserver restart, RBAC and metrics.

use anyhow::{Context as _, Result};
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use kube_runtime_lease_harness::TestEnv;

async fn read_back(client: Client, ns: &str) -> Result<LeaseSpec> {
    let leases: Api<Lease> = Api::namespaced(client, ns);
    let lease = leases.get("smoke").await.context("reading the lease")?;
    lease.spec.context("lease has no spec")
}

fn assert_fields(spec: &LeaseSpec, when: &str) {
    assert_eq!(
        spec.strategy.as_deref(),
        Some("OldestEmulationVersion"),
        "spec.strategy {when}"
    );
    assert_eq!(
        spec.preferred_holder.as_deref(),
        Some("candidate-b"),
        "spec.preferredHolder {when}"
    );
    assert_eq!(spec.holder_identity.as_deref(), Some("candidate-a"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smoke() -> Result<()> {
    let env = TestEnv::start().await?;
    eprintln!("{env:?}");
    let client = env.client().await?;
    let ns = env.new_namespace("smoke").await?;
    assert!(ns.starts_with("smoke-"), "{ns}");

    // A Lease with the fields that only persist with CoordinatedLeaderElection on.
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some("smoke".to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some("candidate-a".to_owned()),
            lease_duration_seconds: Some(15),
            strategy: Some("OldestEmulationVersion".to_owned()),
            preferred_holder: Some("candidate-b".to_owned()),
            ..LeaseSpec::default()
        }),
    };
    let created = leases.create(&PostParams::default(), &lease).await?;
    assert_fields(created.spec.as_ref().context("no spec")?, "on create");
    assert_fields(&read_back(client.clone(), &ns).await?, "on read");

    // Restart the apiserver: same port, same etcd, the same client reconnects.
    if !env.is_external() {
        let pid = env.apiserver_pid();
        env.stop_apiserver()?;
        assert!(env.apiserver_pid().is_none());
        assert!(
            read_back(client.clone(), &ns).await.is_err(),
            "apiserver answered while stopped"
        );
        env.start_apiserver().await?;
        assert_ne!(env.apiserver_pid(), pid);
        assert_fields(&read_back(client.clone(), &ns).await?, "after restart");
    }

    // A user without RBAC grants is refused the Lease API.
    let limited = env.user_client("limited-user", &["team-a", "team-b"]).await?;
    let review: SelfSubjectReview = Api::all(limited.clone())
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
        .context("SelfSubjectReview as limited-user")?;
    let user = review.status.and_then(|s| s.user_info).context("no user info")?;
    assert_eq!(user.username.as_deref(), Some("limited-user"));
    let groups = user.groups.unwrap_or_default();
    for g in ["team-a", "team-b", "system:authenticated"] {
        assert!(groups.iter().any(|x| x == g), "{g} not in {groups:?}");
    }
    let err = Api::<Lease>::namespaced(limited, &ns)
        .get("smoke")
        .await
        .expect_err("limited user read a lease");
    match err {
        kube::Error::Api(status) => assert_eq!(status.code, 403, "{status:?}"),
        other => panic!("expected a 403, got {other:?}"),
    }

    // The apiserver's own request counters.
    let metrics = env.metrics_text().await?;
    assert!(
        metrics.contains("apiserver_request_total{"),
        "no apiserver_request_total in /metrics"
    );

    // goelect was built alongside.
    assert!(env.goelect_path().await?.is_file());
    Ok(())
}
