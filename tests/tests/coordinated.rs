//! Coordinated Leader Election (`LeaseConfig::coordinated`) against a real
//! kube-apiserver with the `CoordinatedLeaderElection` gate on and
//! `coordination.k8s.io/v1beta1` served (the test control plane runs so):
//! the API server elects the candidate with the oldest emulation version;
//! a better candidate joining takes over at the end of the term, with no
//! overlap of the candidates' terms; every candidate publishes a
//! `LeaseCandidate` and deletes it on shutdown; and the API server makes the
//! same choice among Rust and client-go candidates (`goelect --coordinated`:
//! `NewCandidate` and `LeaderElectionConfig.Coordinated`), checked by the
//! failover suite's interval check (no two leaders at any instant).

mod support;

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
use kube_runtime_lease::{LeaderElector, LeaseConfig, Lost, coordinated::Coordinated};
use kube_runtime_lease_harness::{EventLog, Fixture, Flavor, Kind, Sig, Timings, check_log, shared_env};
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
    wait_leader(&leases, &older, "older.lease", Duration::from_secs(60))
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
    // Named `<identity>.<lease>`: the API server's holder when elected.
    ensure!(
        names == ["newer.lease", "older.lease"],
        "LeaseCandidates: {names:?}"
    );
    for c in &published.items {
        ensure!(c.data["spec"]["leaseName"] == "lease", "{c:?}");
    }
    // It stays with the older one.
    sleep(Duration::from_secs(6)).await;
    wait_leader(&leases, &older, "older.lease", Duration::from_secs(1)).await?;
    ensure!(!newer.is_leader(), "the newer candidate leads too");

    // An even older one joins: leadership moves to it at the end of the term.
    let oldest = LeaderElector::new(env.client().await?, config(&ns, "oldest", "1.35.0"))?;
    let mut tasks = tasks;
    tasks.push(campaign(oldest.clone(), terms.clone()));
    wait_leader(&leases, &oldest, "oldest.lease", Duration::from_secs(60))
        .await
        .context("leadership moves to the oldest emulation version")?;
    ensure!(!older.is_leader() && !newer.is_leader(), "two leaders");
    {
        let terms = terms.lock().expect("lock");
        ensure!(
            terms.iter().any(|(who, _, _, lost)| who == "older.lease"
                && *lost
                    == Some(Lost::SteppedDown {
                        preferred_holder: "oldest.lease".to_owned()
                    })),
            "the older candidate stepped down for the oldest: {terms:?}"
        );
    }
    assert_no_overlap(&terms);
    // The API server pinged the candidates that had not renewed for 5 s
    // before it elected again; each answered (renewTime at or after pingTime).
    let mut pinged = 0;
    for name in ["newer.lease", "older.lease"] {
        let c = candidates.get(name).await?;
        let time = |f: &str| c.data["spec"][f].as_str().map(str::to_owned);
        if let Some(ping) = time("pingTime") {
            pinged += 1;
            let renew = time("renewTime").unwrap_or_default();
            // RFC 3339 in UTC with fixed-width microseconds: strings order as times.
            ensure!(
                renew >= ping,
                "{name} did not answer its ping: renewTime {renew}, pingTime {ping}"
            );
        }
    }
    ensure!(
        pinged > 0,
        "the API server pinged nobody: the check above proved nothing"
    );

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

/// Waits for `who`'s `started-leading`.
async fn leads(log: &EventLog, who: &str, within: Duration) -> Result<u64> {
    Ok(log
        .wait_for(&format!("{who} to lead"), within, |e| {
            e.kind == Kind::StartedLeading && e.process == who
        })
        .await
        .with_context(|| log.dump())?
        .at)
}

/// Leadership stays with `who` (who started leading at `since`): nobody
/// else starts leading in the next 6 s (more than the API server's 5 s
/// re-check).
async fn stays_with(log: &EventLog, who: &str, since: u64) -> Result<()> {
    let other = log.wait_for("another leader", Duration::from_secs(6), |e| {
        e.kind == Kind::StartedLeading && e.at > since && e.process != who
    });
    match other.await {
        Ok(e) => bail!("{} led after {who}: {}", e.process, log.dump()),
        Err(_) => Ok(()),
    }
}

#[tokio::test]
async fn rust_and_client_go_candidates_are_elected_alike() -> Result<()> {
    let ctx = Fixture::new().await?;
    let log = EventLog::new();
    let lease = ctx.lease(&log, "cle-mixed").await?;
    let t = Timings {
        lease_duration: Duration::from_secs(4),
        renew_deadline: Duration::from_secs(3),
        retry_period: Duration::from_millis(500),
    };
    // client-go emulating 1.36 against Rust emulating 1.37: client-go is elected.
    let mut procs = vec![
        ctx.spawn_coordinated(Flavor::Go, &log, &lease, "go-136", t, "1.36.0")?,
        ctx.spawn_coordinated(Flavor::Rust, &log, &lease, "rust-137", t, "1.37.0")?,
    ];
    // (Whichever candidate publishes first may be elected at once, alone;
    // the API server moves leadership to the better one at the end of the term.)
    let go_leads = leads(&log, "go-136", Duration::from_secs(60)).await?;
    stays_with(&log, "go-136", go_leads).await?;
    // Rust emulating 1.35 joins: it is elected at the end of client-go's term.
    let joined = log.note("rust-135 joins");
    procs.push(ctx.spawn_coordinated(Flavor::Rust, &log, &lease, "rust-135", t, "1.35.0")?);
    let took = leads(&log, "rust-135", Duration::from_secs(60)).await?;
    ensure!(took > joined, "{}", log.dump());
    stays_with(&log, "rust-135", took).await?;
    // The leader is killed: the API server elects the next oldest, client-go,
    // once the Lease expired.
    let killed = procs[2].kill().await?;
    let next = log
        .next_leader(killed, "rust-135", Duration::from_secs(60))
        .await?;
    ensure!(
        next.process == "go-136",
        "{} took over: {}",
        next.process,
        log.dump()
    );
    for p in &procs[..2] {
        p.signal(Sig::Term)?;
    }
    for p in &mut procs[..2] {
        p.wait_exit(Duration::from_secs(15)).await?;
    }
    check_log(&log).with_context(|| log.dump())?;
    Ok(())
}

/// Plain Rust candidates (no Coordinated Leader Election) and a coordinated
/// client-go candidate on one Lease: the API server elects the client-go
/// candidate, the only one that publishes a `LeaseCandidate`, and marks the
/// plain leader's term for it (`preferredHolder`); the plain leader steps
/// down (its work stopped by the step-down, it leaves the Lease to expire
/// rather than release it), the API server hands the expired Lease to
/// client-go at its next re-check, and the plain candidates leave it there
/// (no taking back before the API server writes the new holder, no back
/// and forth). Once client-go's leader is
/// killed, a plain candidate takes over after the record's lease duration,
/// and keeps the Lease (the API server cannot elect a candidate that does
/// not answer its pings). Never two leaders.
#[tokio::test]
async fn plain_rust_candidates_hand_over_to_a_coordinated_client_go_candidate_and_back() -> Result<()> {
    let ctx = Fixture::new().await?;
    let log = EventLog::new();
    let lease = ctx.lease(&log, "cle-plain").await?;
    let t = Timings {
        lease_duration: Duration::from_secs(4),
        renew_deadline: Duration::from_secs(3),
        retry_period: Duration::from_millis(500),
    };
    // The plain candidates' own record, once stepped down, is taken back
    // two of its lease durations after its last change if nobody else took
    // it: well after the API server's hand-over (its re-check every 5 s).
    let plain = Timings {
        lease_duration: Duration::from_secs(6),
        renew_deadline: Duration::from_secs(4),
        retry_period: Duration::from_secs(1),
    };
    let _r1 = ctx.spawn_rust(&log, &lease, "r1", plain, None)?;
    leads(&log, "r1", Duration::from_secs(30)).await?;
    let _r2 = ctx.spawn_rust(&log, &lease, "r2", plain, None)?;
    let mut g = ctx.spawn_coordinated(Flavor::Go, &log, &lease, "go", t, "1.37.0")?;
    let go_leads = leads(&log, "go", Duration::from_secs(60)).await?;
    let stepped = log
        .find(|e| e.kind == Kind::StoppedLeading && e.process == "r1")
        .context("r1 did not stop leading before client-go led")?;
    ensure!(
        stepped.detail.contains("SteppedDown"),
        "r1 stopped for {:?}, expected a step-down: {}",
        stepped.detail,
        log.dump_events()
    );
    // The plain leader's work was stopped by the step-down, so it does not
    // release: the API server gives client-go the Lease once it expired, at
    // its next re-check (every 5 s).
    let gap = go_leads.saturating_sub(stepped.at);
    let bound = plain.lease_duration + Duration::from_secs(5 + 3);
    ensure!(
        gap <= kube_runtime_lease_harness::ns(bound),
        "client-go led {} ms after r1 stepped down (expected within {bound:?}): {}",
        gap / 1_000_000,
        log.dump_events()
    );
    stays_with(&log, "go", go_leads).await?;
    let killed = g.kill().await?;
    let next = log
        .next_leader(killed, "go", t.lease_duration + Duration::from_secs(10))
        .await
        .with_context(|| log.dump_events())?;
    ensure!(
        next.at - killed <= kube_runtime_lease_harness::ns(t.lease_duration + Duration::from_secs(2)),
        "{} took over {} ms after client-go's leader was killed (lease duration {:?})",
        next.process,
        (next.at - killed) / 1_000_000,
        t.lease_duration
    );
    stays_with(&log, &next.process, next.at).await?;
    check_log(&log).with_context(|| log.dump_events())?;
    Ok(())
}

#[tokio::test]
async fn without_the_feature_gate_the_ordinary_election_runs_after_one_warning() -> Result<()> {
    // The test's runtime is current-thread: every task of the electors logs
    // on this thread, into this subscriber.
    let (logs, _default) = support::LogBuf::capture(tracing::Level::INFO);

    let env = kube_runtime_lease_harness::TestEnv::start_without_coordinated_leader_election().await?;
    let ns = env.new_namespace("cle-off").await?;
    let leases = Api::<Lease>::namespaced(env.client().await?, &ns);
    let a = LeaderElector::new(env.client().await?, config(&ns, "a", "1.36.0"))?;
    let b = LeaderElector::new(env.client().await?, config(&ns, "b", "1.37.0"))?;
    let terms: Terms = Arc::default();
    let tasks = [
        campaign(a.clone(), terms.clone()),
        campaign(b.clone(), terms.clone()),
    ];
    // The ordinary election: someone creates the Lease and leads.
    let deadline = Instant::now() + Duration::from_secs(30);
    let leader = loop {
        if let Some(l) = [&a, &b].into_iter().find(|e| e.is_leader()) {
            break l.clone();
        }
        ensure!(Instant::now() < deadline, "nobody leads without the gate");
        sleep(Duration::from_millis(50)).await;
    };
    ensure!(
        !a.status().coordinated && !b.status().coordinated,
        "coordinated mode claimed"
    );
    let holder = leases.get("lease").await?.spec.and_then(|s| s.holder_identity);
    ensure!(
        holder.as_deref() == Some(leader.config().identity()),
        "{holder:?}"
    );
    // A handover on shutdown, as in the ordinary election.
    let other = if leader.config().identity() == "a.lease" {
        &b
    } else {
        &a
    };
    leader.shutdown(Duration::from_secs(5)).await?;
    wait_leader(&leases, other, other.config().identity(), Duration::from_secs(30)).await?;
    other.shutdown(Duration::from_secs(5)).await?;
    for t in tasks {
        timeout(Duration::from_secs(10), t).await??;
    }
    assert_no_overlap(&terms);
    let text = logs.text();
    let warnings = text.matches("does not serve coordination.k8s.io/v1beta1").count();
    ensure!(
        warnings == 2,
        "one fallback warning per elector, {warnings} seen:\n{text}"
    );
    Ok(())
}

/// One process, one identity, two coordinated Leases (two controllers under
/// one `unique_identity()`): each Lease gets a `LeaseCandidate` of its own
/// (`<identity>.<lease>`), the API server elects the candidate on both, and
/// shutting one elector down deletes only its own candidate.
#[tokio::test]
async fn one_identity_on_two_coordinated_leases_leads_both() -> Result<()> {
    let env = shared_env().await?;
    let ns = env.new_namespace("cle-two").await?;
    let admin = env.client().await?;
    let leases = Api::<Lease>::namespaced(admin.clone(), &ns);
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("coordination.k8s.io", "v1beta1", "LeaseCandidate"),
        "leasecandidates",
    );
    let candidates = Api::<DynamicObject>::namespaced_with(admin, &ns, &resource);
    let with_lease = |name: &str| {
        LeaseConfig::new(&ns, name, "pod-0_same")
            .lease_duration(Duration::from_secs(4))
            .renew_deadline(Duration::from_secs(3))
            .retry_period(Duration::from_millis(500))
            .coordinated(Coordinated::new("1.37.0").emulation_version("1.36.0"))
    };
    let a = LeaderElector::new(env.client().await?, with_lease("lease-a"))?;
    let b = LeaderElector::new(env.client().await?, with_lease("lease-b"))?;
    let terms: Terms = Arc::default();
    let tasks = [
        campaign(a.clone(), terms.clone()),
        campaign(b.clone(), terms.clone()),
    ];
    let deadline = Instant::now() + Duration::from_secs(60);
    while !(a.is_leader() && b.is_leader()) {
        ensure!(
            Instant::now() < deadline,
            "not both elected within 60 s: a {:?}, b {:?}",
            a.status(),
            b.status()
        );
        sleep(Duration::from_millis(100)).await;
    }
    ensure!(
        a.status().coordinated && b.status().coordinated,
        "coordinated mode in force"
    );
    for (lease, holder) in [
        ("lease-a", "pod-0_same.lease-a"),
        ("lease-b", "pod-0_same.lease-b"),
    ] {
        let spec = leases.get(lease).await?.spec.context("spec")?;
        ensure!(
            spec.holder_identity.as_deref() == Some(holder),
            "{lease}: {spec:?}"
        );
    }
    let mut names: Vec<_> = candidates
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .collect();
    names.sort();
    ensure!(
        names == ["pod-0_same.lease-a", "pod-0_same.lease-b"],
        "one LeaseCandidate per Lease: {names:?}"
    );
    a.shutdown(Duration::from_secs(5)).await?;
    let left: Vec<_> = candidates
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .collect();
    ensure!(
        left == ["pod-0_same.lease-b"],
        "only a's candidate deleted: {left:?}"
    );
    ensure!(b.is_leader(), "b lost its Lease when a shut down");
    b.shutdown(Duration::from_secs(5)).await?;
    for t in tasks {
        timeout(Duration::from_secs(10), t).await??;
    }
    Ok(())
}

/// Review (RBAC verb by verb): a Role on `leasecandidates` without `list`
/// and `watch` (`create`, `get`, `update`, `delete` granted, and the
/// Lease's verbs). The `LeaseCandidate` is published, but its watch is
/// refused, so the API server's pings went unseen (answered only by the
/// five-minute refresh) and the API server, which elects only candidates
/// that answered, never elected it: nobody led, and nothing of this crate
/// named the rule (a fresh candidate is elected unpinged; the next
/// election, here after the Lease's deletion, is where it was lost). Now
/// it says so once and reads its `LeaseCandidate`
/// every retry period instead, answering the pings: it is elected.
#[tokio::test]
async fn a_candidate_that_cannot_watch_its_lease_candidate_is_still_elected() -> Result<()> {
    use k8s_openapi::api::rbac::v1::{PolicyRule, Role};
    use kube::api::{ObjectMeta, PostParams};
    use kube_runtime_lease_harness::TestEnv;
    let (logs, _default) = support::LogBuf::capture(tracing::Level::INFO);
    let env = shared_env().await?;
    let ns = env.new_namespace("cle-rbac").await?;
    let admin = env.client().await?;
    let leases = Api::<Lease>::namespaced(admin.clone(), &ns);
    let user = format!("cle-user-{ns}");
    let allow = |resource: &str, verbs: &[&str]| PolicyRule {
        api_groups: Some(vec!["coordination.k8s.io".to_owned()]),
        resources: Some(vec![resource.to_owned()]),
        verbs: verbs.iter().map(|v| (*v).to_owned()).collect(),
        ..PolicyRule::default()
    };
    let meta = || ObjectMeta {
        name: Some("cle".to_owned()),
        ..ObjectMeta::default()
    };
    let role = Role {
        metadata: meta(),
        rules: Some(vec![
            allow("leases", &["get", "create", "update", "list", "watch"]),
            allow("leasecandidates", &["create", "get", "update", "delete"]),
        ]),
    };
    Api::<Role>::namespaced(admin.clone(), &ns)
        .create(&PostParams::default(), &role)
        .await?;
    TestEnv::bind_role(&admin, &ns, "cle", &user).await?;

    let a = LeaderElector::new(env.user_client(&user, &[]).await?, config(&ns, "a", "1.37.0"))?;
    let terms: Terms = Arc::default();
    let task = campaign(a.clone(), terms);
    wait_leader(&leases, &a, "a.lease", Duration::from_secs(60))
        .await
        .with_context(|| format!("without list/watch on leasecandidates; logs:\n{}", logs.text()))?;
    // A fresh candidate is elected without a ping (renewed within the API
    // server's election); a later election pings it: the Lease deleted
    // once its publication is older than that.
    sleep(Duration::from_secs(6)).await;
    leases
        .delete("lease", &kube::api::DeleteParams::default())
        .await?;
    timeout(Duration::from_secs(10), async {
        while a.is_leader() {
            sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .context("the term did not end with the Lease deleted")?;
    wait_leader(&leases, &a, "a.lease", Duration::from_secs(60))
        .await
        .with_context(|| {
            format!(
                "not elected again without list/watch on leasecandidates (a ping unanswered); logs:\n{}",
                logs.text()
            )
        })?;
    let named: Vec<_> = logs
        .text()
        .lines()
        .filter(|l| l.contains("forbidden to watch the LeaseCandidate"))
        .map(str::to_owned)
        .collect();
    ensure!(
        named.len() == 1 && named[0].contains("`list` and `watch` are missing"),
        "one warning naming the rule: {named:?}"
    );
    a.shutdown(Duration::from_secs(5)).await?;
    timeout(Duration::from_secs(10), task).await??;
    Ok(())
}
