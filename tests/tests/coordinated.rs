//! Coordinated Leader Election (`LeaseConfig::coordinated`) against a real
//! kube-apiserver with the `CoordinatedLeaderElection` gate on and
//! `coordination.k8s.io/v1beta1` served (the test control plane runs so):
//! the API server elects the candidate with the oldest emulation version;
//! a better candidate joining takes over at the end of the term, with no
//! overlap of the candidates' terms; every candidate publishes a
//! `LeaseCandidate` and deletes it on shutdown.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::{Context as _, Result, bail, ensure};
use k8s_openapi::api::coordination::v1::Lease;
use kube::{
    Api,
    api::{ApiResource, DynamicObject, GroupVersionKind, ListParams},
};
use kube_runtime_lease::{Coordinated, LeaderElector, LeaseConfig, Lost};
use kube_runtime_lease_harness::shared_env;
use tokio::time::{Instant, sleep, timeout};

/// One candidate's terms as it saw them: (identity, begun, ended or `None`
/// while it leads, why it ended).
type Terms = Arc<Mutex<Vec<(String, Instant, Option<Instant>, Option<Lost>)>>>;

fn config(ns: &str, identity: &str, emulation: &str) -> LeaseConfig {
    // The API server writes a 5 s lease and re-checks every 5 s: the
    // elected candidate renews well within that.
    LeaseConfig::new(ns, "lease", identity)
        .lease_duration(Duration::from_secs(4))
        .renew_deadline(Duration::from_secs(3))
        .retry_period(Duration::from_millis(500))
        .coordinated(Coordinated::new("1.37.0").emulation_version(emulation))
}

/// Campaigns for ever, recording every term in `terms`.
fn campaign(elector: LeaderElector, terms: Terms) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let identity = elector.config().identity().to_owned();
        while let Ok(guard) = elector.acquire().await {
            let index = {
                let mut t = terms.lock().expect("lock");
                t.push((identity.clone(), Instant::now(), None, None));
                t.len() - 1
            };
            let lost = guard.await;
            let mut t = terms.lock().expect("lock");
            t[index].2 = Some(Instant::now());
            t[index].3 = Some(lost.clone());
            if lost == Lost::Shutdown {
                break;
            }
        }
    })
}

/// Waits until the Lease names `who` and `who`'s elector leads.
async fn wait_leader(
    leases: &Api<Lease>,
    elector: &LeaderElector,
    who: &str,
    within: Duration,
) -> Result<()> {
    let deadline = Instant::now() + within;
    loop {
        let holder = leases
            .get_opt("lease")
            .await?
            .and_then(|l| l.spec)
            .and_then(|s| s.holder_identity);
        if holder.as_deref() == Some(who) && elector.is_leader() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!("{who} did not lead within {within:?} (holder {holder:?})");
        }
        sleep(Duration::from_millis(100)).await;
    }
}

/// No two candidates' terms overlap (all ran in this process, on one clock).
fn assert_no_overlap(terms: &Terms) {
    let terms = terms.lock().expect("lock").clone();
    let now = Instant::now();
    for (i, (a, a0, a1, _)) in terms.iter().enumerate() {
        for (b, b0, b1, _) in &terms[i + 1..] {
            if a == b {
                continue;
            }
            let (a1, b1) = (a1.unwrap_or(now), b1.unwrap_or(now));
            assert!(
                a1 <= *b0 || b1 <= *a0,
                "the terms of {a} and {b} overlap: {terms:?}"
            );
        }
    }
}

#[tokio::test]
async fn the_api_server_elects_the_oldest_emulation_version_and_hands_over_at_the_end_of_term() -> Result<()>
{
    let env = shared_env().await?;
    let ns = env.new_namespace("cle").await?;
    let admin = env.client().await?;
    let leases = Api::<Lease>::namespaced(admin.clone(), &ns);
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("coordination.k8s.io", "v1beta1", "LeaseCandidate"),
        "leasecandidates",
    );
    let candidates = Api::<DynamicObject>::namespaced_with(admin, &ns, &resource);
    let terms: Terms = Arc::default();

    let newer = LeaderElector::new(env.client().await?, config(&ns, "newer", "1.37.0"))?;
    let older = LeaderElector::new(env.client().await?, config(&ns, "older", "1.36.0"))?;
    let tasks = vec![
        campaign(newer.clone(), terms.clone()),
        campaign(older.clone(), terms.clone()),
    ];
    wait_leader(&leases, &older, "older", Duration::from_secs(60))
        .await
        .context("the API server elects the older emulation version")?;
    ensure!(
        older.status().coordinated && newer.status().coordinated,
        "coordinated mode in force"
    );
    // Published, one per candidate, for the Lease.
    let published = candidates.list(&ListParams::default()).await?;
    let mut names: Vec<_> = published
        .items
        .iter()
        .filter_map(|c| c.metadata.name.clone())
        .collect();
    names.sort();
    ensure!(names == ["newer", "older"], "LeaseCandidates: {names:?}");
    for c in &published.items {
        ensure!(c.data["spec"]["leaseName"] == "lease", "{c:?}");
    }
    // It stays with the older one.
    sleep(Duration::from_secs(6)).await;
    wait_leader(&leases, &older, "older", Duration::from_secs(1)).await?;
    ensure!(!newer.is_leader(), "the newer candidate leads too");

    // An even older one joins: leadership moves to it at the end of the term.
    let oldest = LeaderElector::new(env.client().await?, config(&ns, "oldest", "1.35.0"))?;
    let mut tasks = tasks;
    tasks.push(campaign(oldest.clone(), terms.clone()));
    wait_leader(&leases, &oldest, "oldest", Duration::from_secs(60))
        .await
        .context("leadership moves to the oldest emulation version")?;
    ensure!(!older.is_leader() && !newer.is_leader(), "two leaders");
    {
        let terms = terms.lock().expect("lock");
        ensure!(
            terms.iter().any(|(who, _, _, lost)| who == "older"
                && *lost
                    == Some(Lost::SteppedDown {
                        preferred_holder: "oldest".to_owned()
                    })),
            "the older candidate stepped down for the oldest: {terms:?}"
        );
    }
    assert_no_overlap(&terms);

    for e in [&newer, &older, &oldest] {
        e.shutdown(Duration::from_secs(5)).await?;
    }
    for t in tasks {
        timeout(Duration::from_secs(10), t).await??;
    }
    assert_no_overlap(&terms);
    let left = candidates.list(&ListParams::default()).await?.items;
    ensure!(left.is_empty(), "LeaseCandidates left after shutdown: {left:?}");
    Ok(())
}
