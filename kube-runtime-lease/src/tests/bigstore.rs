//! A guarded Controller with a large store (thousands of objects) at the
//! term's boundaries: the storm of reconciles a term begins with, a term
//! that ends during it, a shutdown during it.

use std::{sync::Arc, time::Duration};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube_runtime::{
    Controller,
    controller::{Action, Config},
    watcher,
};

use crate::{
    LeaderElectionControllerExt,
    test_util::FakeLeaseApi,
    tests::support::{busy, config, elector, free, paused},
};

const S: fn(u64) -> Duration = Duration::from_secs;

/// `n` Leases in namespace `objs`: the objects a Controller reconciles
/// (the election's Lease is in `default`).
fn objects(fake: &FakeLeaseApi, n: usize) {
    for i in 0..n {
        let mut lease = crate::tests::support::held_by("", 15);
        lease.metadata.namespace = Some("objs".into());
        lease.metadata.name = Some(format!("o{i}"));
        fake.put(lease);
    }
}

/// A cold guarded Controller's takeover: its first LIST fills the store
/// with 2,000 objects, all released to the reconciler at once, each
/// reconcile a synchronous step of 10 ms (20 s in all, twice the renew
/// deadline) on the current-thread runtime. With a concurrency limit the
/// election task renews between reconciles: the term holds through the
/// storm and every object is reconciled once. (Without one, kube-runtime's
/// default, every reconcile task is queued ahead of the election task's
/// renewal and the term ends at the renew deadline half-way through: the
/// README's *Timings* says so.)
#[test]
fn a_takeover_storm_with_a_concurrency_limit_keeps_the_term() {
    paused(async {
        let n = 2000;
        let fake = free();
        objects(&fake, n);
        let (a, _) = elector(&fake, config("a"));
        let (client, _) = fake.client();
        let calls = Arc::new(parking_lot::Mutex::new(0usize));
        let counted = calls.clone();
        let run = Controller::new(
            kube_client::Api::<Lease>::namespaced(client, "objs"),
            watcher::Config::default(),
        )
        .with_config(Config::default().concurrency(10))
        .with_leader_election(&a)
        .run(
            move |_, _: Arc<()>| {
                let counted = counted.clone();
                async move {
                    busy(Duration::from_millis(10));
                    *counted.lock() += 1;
                    Ok::<_, kube_client::Error>(Action::await_change())
                }
            },
            |_, _, _| Action::await_change(),
            Arc::new(()),
        );
        let mut run = std::pin::pin!(run);
        let mut items = 0;
        while items < n {
            match tokio::time::timeout(S(60), run.next()).await {
                Ok(Some(_)) => items += 1,
                _ => break,
            }
        }
        assert!(
            items == n && *calls.lock() == n && run.lost().is_none() && a.is_leader(),
            "a storm of {n} reconciles of 10 ms each, 10 at a time: {items} items, {} calls, \
             the term ended: {:?}, a leads: {}",
            calls.lock(),
            run.lost(),
            a.is_leader()
        );
    });
}

/// Warm standby with 2,000 objects, reconciles of 5 s, 50 at a time: a
/// term taken over 1 s into its reconcile-all storm, the next term, then a
/// shutdown 1 s into the storm of a third. Counted by the fencing token of
/// the term each reconciler call ran in: the cut term's queue is drained
/// with skips (no reconciler call once it ended, none finished), the next
/// term reconciles every object exactly once (the old storm does not pile
/// on), and the shutdown waits for the reconciles in flight only (the
/// queued ones are not started) and releases the Lease.
#[cfg(feature = "warm-standby")]
#[test]
fn a_warm_term_cut_during_its_storm_is_followed_by_one_storm_and_a_shutdown_releases() {
    use std::collections::BTreeMap;

    use tokio::time::sleep;

    use crate::tests::support::holder;

    paused(async {
        let n = 2000;
        let fake = free();
        objects(&fake, n);
        let (a, _) = elector(&fake, config("a"));
        let (client, _) = fake.client();
        // The fencing token of the term of each call: (calls, finished).
        let terms = Arc::new(parking_lot::Mutex::new(BTreeMap::<i64, (usize, usize)>::new()));
        let (counted, gate) = (terms.clone(), a.clone());
        let run = Controller::new(
            kube_client::Api::<Lease>::namespaced(client, "objs"),
            watcher::Config::default(),
        )
        .with_config(Config::default().concurrency(50))
        .with_leader_election_warm(&a)
        .run(
            move |_, _: Arc<()>| {
                let token = gate.current_guard().map_or(-1, |g| g.fencing_token());
                counted.lock().entry(token).or_default().0 += 1;
                let counted = counted.clone();
                async move {
                    sleep(S(5)).await;
                    counted.lock().entry(token).or_default().1 += 1;
                    Ok::<_, kube_client::Error>(Action::await_change())
                }
            },
            |_, _, _| Action::await_change(),
            Arc::new(()),
        );
        tokio::spawn(run.for_each(|_| async {}));
        // Taken over (unless `first`), then led again once the other's
        // record expired.
        let next_term = async |first: bool| {
            if !first {
                fake.take_over("other");
            }
            while a.is_leader() != first {
                sleep(Duration::from_millis(10)).await;
            }
            while !a.is_leader() {
                sleep(Duration::from_millis(10)).await;
            }
            a.current_guard().unwrap().fencing_token()
        };
        let first = next_term(true).await;
        sleep(S(300)).await;
        let cut = next_term(false).await;
        sleep(S(1)).await;
        let full = next_term(false).await;
        sleep(S(300)).await;
        let last = next_term(false).await;
        sleep(S(1)).await;
        let shutdown = tokio::time::timeout(S(30), a.shutdown(S(10))).await;
        let terms = terms.lock().clone();
        assert!(
            terms.get(&first) == Some(&(n, n))
                && terms.get(&cut) == Some(&(50, 0))
                && terms.get(&full) == Some(&(n, n))
                && terms.get(&last) == Some(&(50, 50))
                && terms.len() == 4
                && matches!(shutdown, Ok(Ok(())))
                && holder(&fake).as_deref() == Some(""),
            "(calls, finished) by term: {terms:?} (terms {first}, {cut} cut after 1 s, {full}, \
             {last} shut down after 1 s); the shutdown: {shutdown:?}, the Lease is held by {:?}",
            holder(&fake)
        );
    });
}
