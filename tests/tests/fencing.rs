//! The fenced-write pattern (`kube_runtime_lease_examples::ledger`, the crate
//! docs' section *Fencing*) against a real apiserver, one outcome at a time:
//! a term that holds writes; a stored newer token fences it; a term that
//! ended writes nothing, even with the object's token its own; the next
//! term's token is larger and its write lands on top. The chaos run
//! (`chaos.rs`) is the same pattern under faults.

mod support;

use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube_runtime_lease::LeaderElector;
use kube_runtime_lease_examples::ledger::{Appended, append};
use kube_runtime_lease_harness::shared_env;
use support::fast_config;
use tokio::time::timeout;

const LEDGER: &str = "ledger";

async fn data(cms: &Api<ConfigMap>, key: &str) -> Result<Option<String>> {
    let cm = cms.get(LEDGER).await?;
    Ok(cm.data.and_then(|d| d.get(key).cloned()))
}

async fn store_token(cms: &Api<ConfigMap>, token: i64) -> Result<()> {
    let patch = serde_json::json!({"data": {"token": token.to_string()}});
    cms.patch(LEDGER, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_write_lands_only_for_a_term_that_holds_and_is_the_newest() -> Result<()> {
    let env = shared_env().await?;
    let client = env.client().await?;
    let ns = env.new_namespace("fencing").await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let empty = ConfigMap {
        metadata: ObjectMeta {
            name: Some(LEDGER.to_owned()),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    };
    cms.create(&PostParams::default(), &empty).await?;

    let a = LeaderElector::new(client.clone(), fast_config(&ns, "a"))?;
    let guard = timeout(Duration::from_secs(20), a.acquire())
        .await
        .context("a did not lead within 20 s")??;
    let token = guard.fencing_token();
    ensure!(append(&cms, LEDGER, &guard, "a 1").await? == Appended::Written { n: 1 });
    ensure!(data(&cms, "ledger").await?.as_deref() == Some(format!("1 {token} a 1").as_str()));
    ensure!(data(&cms, "token").await? == Some(token.to_string()));

    // A newer term's token in the object: nothing written.
    store_token(&cms, token + 1).await?;
    let fenced = append(&cms, LEDGER, &guard, "a 2").await?;
    ensure!(fenced == Appended::Fenced { newer: token + 1 }, "{fenced:?}");
    ensure!(data(&cms, "count").await?.as_deref() == Some("1"));

    // The term ends: nothing written, even with the object's token its own.
    store_token(&cms, token).await?;
    timeout(Duration::from_secs(10), a.shutdown(Duration::from_secs(5)))
        .await
        .context("shutdown did not end within 10 s")??;
    ensure!(!guard.is_valid());
    let ended = append(&cms, LEDGER, &guard, "a 3").await?;
    ensure!(ended == Appended::TermEnded, "{ended:?}");
    ensure!(data(&cms, "count").await?.as_deref() == Some("1"));

    // The next term: a larger token, written on top; the old term stays out.
    let b = LeaderElector::new(client, fast_config(&ns, "b"))?;
    let next = timeout(Duration::from_secs(20), b.acquire())
        .await
        .context("b did not lead within 20 s")??;
    ensure!(
        next.fencing_token() > token,
        "{} after {token}",
        next.fencing_token()
    );
    ensure!(append(&cms, LEDGER, &next, "b 1").await? == Appended::Written { n: 2 });
    let ledger = data(&cms, "ledger").await?.unwrap_or_default();
    ensure!(
        ledger == format!("1 {token} a 1\n2 {} b 1", next.fencing_token()),
        "{ledger}"
    );
    ensure!(append(&cms, LEDGER, &guard, "a 4").await? == Appended::TermEnded);
    b.shutdown(Duration::from_secs(5)).await?;
    Ok(())
}

/// A ledger whose `count` was edited to the largest `u64` (by hand, or by
/// another writer) is appended to without a panic: `n + 1` overflowed, a
/// panic in the example's reconcile in a debug build (a wrap to 0 in a
/// release build), where every other input the ledger reads (a `token` that
/// is no number, a missing key) is handled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ledger_count_at_the_top_of_its_range_is_appended_to_without_a_panic() -> Result<()> {
    let env = shared_env().await?;
    let client = env.client().await?;
    let ns = env.new_namespace("fencing-count").await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let full = ConfigMap {
        metadata: ObjectMeta {
            name: Some(LEDGER.to_owned()),
            ..ObjectMeta::default()
        },
        data: Some([("count".to_owned(), u64::MAX.to_string())].into()),
        ..ConfigMap::default()
    };
    cms.create(&PostParams::default(), &full).await?;
    let a = LeaderElector::new(client.clone(), fast_config(&ns, "a"))?;
    let guard = timeout(Duration::from_secs(20), a.acquire())
        .await
        .context("a did not lead within 20 s")??;
    let appended = tokio::spawn({
        let cms = cms.clone();
        async move { append(&cms, LEDGER, &guard, "a 1").await }
    })
    .await;
    let appended = appended.map_err(|e| anyhow::anyhow!("the append panicked: {e}"))??;
    ensure!(
        appended == Appended::Written { n: u64::MAX },
        "appended {appended:?} to a ledger counted at u64::MAX"
    );
    ensure!(data(&cms, "count").await? == Some(u64::MAX.to_string()));
    a.shutdown(Duration::from_secs(5)).await?;
    Ok(())
}
