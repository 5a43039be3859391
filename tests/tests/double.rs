//! The test kit's Lease API double (`kube_runtime_lease::test_util`) is
//! honest: one script of operations (creation races, conflicts, missing
//! objects, the API server's validation, resourceVersion semantics, lists,
//! watch events; and the same for `LeaseCandidate`s) runs against the double
//! and against a real kube-apiserver, and must have the same outcomes. Not
//! compared: what a real API server does only under conditions a test cannot
//! bring about on demand (a watch cache that lags, a compacted
//! resourceVersion): the double's `Fault::StaleList` and `expire_watches`
//! play those, as documented by the API.

use std::time::Duration;

use anyhow::{Context as _, Result};
use futures::TryStreamExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use kube::{
    Api,
    api::{
        ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, ObjectMeta, PostParams,
        WatchEvent, WatchParams,
    },
};
use kube_runtime_lease::test_util::FakeLeaseApi;
use kube_runtime_lease_harness::shared_env;
use tokio::time::timeout;

const NAME: &str = "lease";

fn lease(rv: Option<&str>, edit: impl FnOnce(&mut LeaseSpec)) -> Lease {
    let mut spec = LeaseSpec {
        holder_identity: Some("a".into()),
        lease_duration_seconds: Some(15),
        lease_transitions: Some(0),
        ..LeaseSpec::default()
    };
    edit(&mut spec);
    Lease {
        metadata: ObjectMeta {
            name: Some(NAME.into()),
            resource_version: rv.map(str::to_owned),
            ..ObjectMeta::default()
        },
        spec: Some(spec),
    }
}

/// `ok`, or the API's status code and reason.
fn outcome<T>(r: &kube::Result<T>) -> String {
    match r {
        Ok(_) => "ok".into(),
        Err(kube::Error::Api(s)) => format!("{} {}", s.code, s.reason),
        Err(e) => format!("error: {e}"),
    }
}

/// Runs the script on `api`: what each step answered, then the watch events.
#[allow(clippy::too_many_lines, reason = "one script, step by step")]
async fn script(api: &Api<Lease>) -> Result<Vec<String>> {
    let mut out = Vec::new();
    let start = api.list(&ListParams::default()).await?;
    let from = start
        .metadata
        .resource_version
        .context("no list resourceVersion")?;
    let watch = api
        .watch(
            &WatchParams::default().fields(&format!("metadata.name={NAME}")),
            &from,
        )
        .await?;
    // A watch by label: the Leases that start or stop matching appear as
    // ADDED and DELETED.
    let by_label = api
        .watch(&WatchParams::default().labels("shard-of=x"), &from)
        .await?;
    let label_events = tokio::spawn(async move {
        let mut seen = Vec::new();
        let mut watch = std::pin::pin!(by_label);
        while let Some(event) = watch.try_next().await? {
            seen.push(match event {
                WatchEvent::Added(l) => format!("ADDED {}", l.metadata.name.unwrap_or_default()),
                WatchEvent::Modified(l) => format!("MODIFIED {}", l.metadata.name.unwrap_or_default()),
                WatchEvent::Deleted(l) => format!("DELETED {}", l.metadata.name.unwrap_or_default()),
                WatchEvent::Bookmark(_) => continue,
                WatchEvent::Error(e) => return Err(anyhow::anyhow!("watch error: {e:?}")),
            });
            if seen.iter().filter(|k| k.starts_with("DELETED")).count() == 2 {
                break;
            }
        }
        anyhow::Ok(seen)
    });
    let events = tokio::spawn(async move {
        let mut seen = Vec::new();
        let mut watch = std::pin::pin!(watch);
        while let Some(event) = watch.try_next().await? {
            let kind = match event {
                WatchEvent::Added(_) => "ADDED",
                WatchEvent::Modified(_) => "MODIFIED",
                WatchEvent::Deleted(_) => "DELETED",
                WatchEvent::Bookmark(_) => continue,
                WatchEvent::Error(e) => return Err(anyhow::anyhow!("watch error: {e:?}")),
            };
            seen.push(kind);
            // The script deletes the Lease four times: after its creation,
            // its re-creation by an update, the creation race, and beside
            // another Lease.
            if seen.iter().filter(|k| **k == "DELETED").count() == 4 {
                break;
            }
        }
        anyhow::Ok(seen)
    });
    let pp = PostParams::default();
    out.push(format!("get missing: {}", outcome(&api.get(NAME).await)));
    let created = api.create(&pp, &lease(None, |_| {})).await;
    out.push(format!("create: {}", outcome(&created)));
    // A watch from resourceVersion "0" begins with the current state.
    {
        let zero = api
            .watch(
                &WatchParams::default().fields(&format!("metadata.name={NAME}")),
                "0",
            )
            .await?;
        let mut zero = std::pin::pin!(zero);
        // The first event that is not a bookmark (the API server may send
        // one first: kube asks for bookmarks).
        let first = timeout(Duration::from_secs(5), async {
            loop {
                match zero.try_next().await? {
                    Some(WatchEvent::Bookmark(_)) => {}
                    other => return anyhow::Ok(other),
                }
            }
        })
        .await
        .context("a watch from 0 sent nothing")??;
        out.push(format!(
            "watch from 0 begins with: {}",
            match first {
                Some(WatchEvent::Added(l)) => format!("ADDED {}", l.metadata.name.unwrap_or_default()),
                other => format!("{other:?}"),
            }
        ));
    }
    out.push(format!(
        "create again: {}",
        outcome(&api.create(&pp, &lease(None, |_| {})).await)
    ));
    out.push(format!(
        "create invalid: {}",
        outcome(
            &api.create(&pp, &lease(None, |s| s.lease_duration_seconds = Some(0)))
                .await
        )
    ));
    let rv1 = created?.metadata.resource_version.context("no resourceVersion")?;
    let taken = api
        .replace(
            NAME,
            &pp,
            &lease(Some(&rv1), |s| s.holder_identity = Some("b".into())),
        )
        .await;
    out.push(format!("replace current: {}", outcome(&taken)));
    let rv2 = taken?.metadata.resource_version.context("no resourceVersion")?;
    out.push(format!("resourceVersion changed: {}", rv1 != rv2));
    out.push(format!(
        "replace stale: {}",
        outcome(&api.replace(NAME, &pp, &lease(Some(&rv1), |_| {})).await)
    ));
    for (what, edit) in [
        (
            "zero duration",
            (|s: &mut LeaseSpec| s.lease_duration_seconds = Some(0)) as fn(&mut LeaseSpec),
        ),
        ("negative transitions", |s| s.lease_transitions = Some(-1)),
        ("preferred holder without strategy", |s| {
            s.preferred_holder = Some("c".into());
        }),
    ] {
        out.push(format!(
            "replace {what}: {}",
            outcome(&api.replace(NAME, &pp, &lease(Some(&rv2), edit)).await)
        ));
    }
    let with_strategy = api
        .replace(
            NAME,
            &pp,
            &lease(Some(&rv2), |s| {
                s.strategy = Some("OldestEmulationVersion".into());
                s.preferred_holder = Some("c".into());
            }),
        )
        .await;
    out.push(format!(
        "replace preferred holder with strategy: {}",
        outcome(&with_strategy)
    ));
    let rv3 = with_strategy?
        .metadata
        .resource_version
        .context("no resourceVersion")?;
    let same = api
        .replace(
            NAME,
            &pp,
            &lease(Some(&rv3), |s| {
                s.strategy = Some("OldestEmulationVersion".into());
                s.preferred_holder = Some("c".into());
            }),
        )
        .await?;
    out.push(format!(
        "replace unchanged keeps the resourceVersion: {}",
        same.metadata.resource_version.as_deref() == Some(rv3.as_str())
    ));
    out.push(format!(
        "replace without a resourceVersion: {}",
        outcome(
            &api.replace(
                NAME,
                &pp,
                &lease(None, |s| {
                    s.strategy = Some("OldestEmulationVersion".into());
                    s.preferred_holder = Some("c".into());
                    s.lease_transitions = Some(1);
                }),
            )
            .await
        )
    ));
    let read = api.get(NAME).await?;
    let old_uid = read.metadata.uid.clone();
    let kept = read.spec.unwrap_or_default();
    out.push(format!(
        "read back: {:?} {:?}",
        kept.holder_identity, kept.preferred_holder
    ));
    out.push(format!(
        "delete: {}",
        outcome(&api.delete(NAME, &DeleteParams::default()).await)
    ));
    out.push(format!("get deleted: {}", outcome(&api.get(NAME).await)));
    out.push(format!(
        "list deleted: {} items",
        api.list(&ListParams::default()).await?.items.len()
    ));
    // A replace of a deleted Lease carrying the deleted object's uid (as
    // every write of the elector does) fails its precondition; without a uid,
    // Leases allow create on update.
    let mut stale = lease(Some(&rv2), |_| {});
    stale.metadata.uid.clone_from(&old_uid);
    out.push(format!(
        "replace deleted: {}",
        outcome(&api.replace(NAME, &pp, &stale).await)
    ));
    let recreated = api.replace(NAME, &pp, &lease(Some(&rv2), |_| {})).await;
    out.push(format!("replace deleted without uid: {}", outcome(&recreated)));
    if let Ok(recreated) = &recreated {
        out.push(format!(
            "recreated with a new uid: {}",
            recreated.metadata.uid != old_uid
        ));
    }
    out.push(format!(
        "list: {} items",
        api.list(&ListParams::default()).await?.items.len()
    ));
    out.push(format!(
        "delete again: {}",
        outcome(&api.delete(NAME, &DeleteParams::default()).await)
    ));
    out.push(format!(
        "delete missing: {}",
        outcome(&api.delete(NAME, &DeleteParams::default()).await)
    ));
    // Two candidates create the missing Lease at once: one wins.
    let (la, lb) = (
        lease(None, |_| {}),
        lease(None, |s| s.holder_identity = Some("b".into())),
    );
    let (a, b) = futures::join!(api.create(&pp, &la), api.create(&pp, &lb));
    let mut race = [outcome(&a), outcome(&b)];
    race.sort();
    out.push(format!("create race: {race:?}"));
    let winner = api.get(NAME).await?.spec.unwrap_or_default().holder_identity;
    out.push(format!(
        "race won by one: {}",
        matches!(winner.as_deref(), Some("a" | "b"))
    ));
    out.push(format!(
        "delete the winner: {}",
        outcome(&api.delete(NAME, &DeleteParams::default()).await)
    ));
    // Several Leases side by side: by name, and selected by labels (the
    // watch above, of `lease` only, sees nothing of them).
    let mut labelled = lease(None, |_| {});
    labelled.metadata.name = Some("other".into());
    labelled.metadata.labels = Some([("shard-of".to_owned(), "x".to_owned())].into());
    out.push(format!(
        "create another: {}",
        outcome(&api.create(&pp, &labelled).await)
    ));
    out.push(format!(
        "create the first again: {}",
        outcome(&api.create(&pp, &lease(None, |_| {})).await)
    ));
    let names = |l: kube::core::ObjectList<Lease>| {
        let mut n: Vec<_> = l.items.into_iter().filter_map(|l| l.metadata.name).collect();
        n.sort();
        n.join(",")
    };
    out.push(format!(
        "list: {}",
        names(api.list(&ListParams::default()).await?)
    ));
    out.push(format!(
        "list by label: {}",
        names(api.list(&ListParams::default().labels("shard-of=x")).await?)
    ));
    out.push(format!(
        "list by a label's absence: {}",
        names(api.list(&ListParams::default().labels("!shard-of")).await?)
    ));
    out.push(format!(
        "list by name: {}",
        names(
            api.list(&ListParams::default().fields(&format!("metadata.name={NAME}")))
                .await?
        )
    ));
    // Relabelled: it stops matching the label watch, then matches again.
    for label in ["y", "x"] {
        let mut other = api.get("other").await?;
        other.metadata.labels = Some([("shard-of".to_owned(), label.to_owned())].into());
        out.push(format!(
            "relabel other {label}: {}",
            outcome(&api.replace("other", &pp, &other).await)
        ));
    }
    for name in ["other", NAME] {
        out.push(format!(
            "delete {name}: {}",
            outcome(&api.delete(name, &DeleteParams::default()).await)
        ));
    }
    let label_events = timeout(Duration::from_secs(10), label_events)
        .await
        .context("label watch events")???;
    out.push(format!("label watch: {}", label_events.join(", ")));
    let events = timeout(Duration::from_secs(10), events)
        .await
        .context("watch events")???;
    out.push(format!("watch: {}", events.join(" ")));
    Ok(out)
}

#[tokio::test]
async fn the_double_answers_as_a_real_api_server_does() -> Result<()> {
    let env = shared_env().await?;
    let ns = env.new_namespace("double").await?;
    let real = script(&Api::namespaced(env.client().await?, &ns)).await?;
    let fake = FakeLeaseApi::default();
    let double = script(&Api::namespaced(fake.client().0, "default")).await?;
    // The script itself is meaningful: it saw each kind of answer.
    for expected in [
        "get missing: 404 NotFound",
        "create race: [\"409 AlreadyExists\", \"ok\"]",
        "watch: ADDED MODIFIED MODIFIED DELETED ADDED DELETED ADDED DELETED ADDED DELETED",
        "list by label: other",
        "label watch: ADDED other, DELETED other, ADDED other, DELETED other",
        "create again: 409 AlreadyExists",
        "replace stale: 409 Conflict",
        "replace deleted: 409 Conflict",
        "recreated with a new uid: true",
    ] {
        assert!(
            real.iter().any(|l| l == expected),
            "{expected:?} not in {real:#?}"
        );
    }
    assert!(real.iter().any(|l| l.contains("422")), "{real:#?}");
    assert_eq!(double, real, "the double differs from the real apiserver");
    Ok(())
}

/// The same for the double's `LeaseCandidate`s (Coordinated Leader
/// Election): creation, conflicts on a stale resourceVersion, missing
/// objects, lists by name, and watch events.
async fn candidate_script(api: &Api<DynamicObject>) -> Result<Vec<String>> {
    let mut out = Vec::new();
    let object = |name: &str, rv: Option<&str>| {
        let mut o = DynamicObject::new(name, &candidate_resource()).data(serde_json::json!({
            "spec": {
                "leaseName": "lease", "binaryVersion": "1.37.0", "emulationVersion": "1.36.0",
                "strategy": "OldestEmulationVersion",
            },
        }));
        o.metadata.resource_version = rv.map(str::to_owned);
        o
    };
    let named = ListParams::default().fields("metadata.name=a");
    let from = api
        .list(&named)
        .await?
        .metadata
        .resource_version
        .context("no list resourceVersion")?;
    let watch = api
        .watch(&WatchParams::default().fields("metadata.name=a"), &from)
        .await?;
    let events = tokio::spawn(async move {
        let mut seen = Vec::new();
        let mut watch = std::pin::pin!(watch);
        while let Some(event) = watch.try_next().await? {
            seen.push(match event {
                WatchEvent::Added(_) => "ADDED",
                WatchEvent::Modified(_) => "MODIFIED",
                WatchEvent::Deleted(_) => "DELETED",
                WatchEvent::Bookmark(_) => continue,
                WatchEvent::Error(e) => return Err(anyhow::anyhow!("watch error: {e:?}")),
            });
            if seen.last() == Some(&"DELETED") {
                break;
            }
        }
        anyhow::Ok(seen)
    });
    let pp = PostParams::default();
    out.push(format!("get missing: {}", outcome(&api.get("a").await)));
    let created = api.create(&pp, &object("a", None)).await;
    out.push(format!("create: {}", outcome(&created)));
    out.push(format!(
        "create again: {}",
        outcome(&api.create(&pp, &object("a", None)).await)
    ));
    out.push(format!(
        "create another: {}",
        outcome(&api.create(&pp, &object("b", None)).await)
    ));
    let rv1 = created?.metadata.resource_version.context("no resourceVersion")?;
    let mut renew = object("a", Some(&rv1));
    renew.data["spec"]["renewTime"] = serde_json::json!("2026-12-01T10:00:00.000000Z");
    let renewed = api.replace("a", &pp, &renew).await;
    out.push(format!("replace current: {}", outcome(&renewed)));
    let rv2 = renewed?.metadata.resource_version.context("no resourceVersion")?;
    renew.metadata.resource_version = Some(rv2.clone());
    let again = api.replace("a", &pp, &renew).await?;
    out.push(format!(
        "replace unchanged keeps the resourceVersion: {}",
        again.metadata.resource_version.as_deref() == Some(rv2.as_str())
    ));
    out.push(format!(
        "replace stale: {}",
        outcome(&api.replace("a", &pp, &object("a", Some(&rv1))).await)
    ));
    let mut unconditional = object("a", None);
    unconditional.data["spec"]["renewTime"] = serde_json::json!("2026-12-01T11:00:00.000000Z");
    out.push(format!(
        "replace without a resourceVersion: {}",
        outcome(&api.replace("a", &pp, &unconditional).await)
    ));
    out.push(format!(
        "list by name: {} items",
        api.list(&named).await?.items.len()
    ));
    out.push(format!(
        "delete: {}",
        outcome(&api.delete("a", &DeleteParams::default()).await)
    ));
    out.push(format!(
        "delete again: {}",
        outcome(&api.delete("a", &DeleteParams::default()).await)
    ));
    out.push(format!(
        "replace deleted: {}",
        outcome(&api.replace("a", &pp, &object("a", Some(&rv1))).await)
    ));
    let events = timeout(Duration::from_secs(10), events)
        .await
        .context("watch events")???;
    out.push(format!("watch: {}", events.join(" ")));
    Ok(out)
}

fn candidate_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("coordination.k8s.io", "v1beta1", "LeaseCandidate"),
        "leasecandidates",
    )
}

#[tokio::test]
async fn the_doubles_lease_candidates_answer_as_a_real_api_server_does() -> Result<()> {
    let env = shared_env().await?;
    let ns = env.new_namespace("double-candidates").await?;
    let resource = candidate_resource();
    let real = candidate_script(&Api::namespaced_with(env.client().await?, &ns, &resource)).await?;
    let fake = FakeLeaseApi::default().serve_lease_candidates();
    let double = candidate_script(&Api::namespaced_with(fake.client().0, "default", &resource)).await?;
    for expected in [
        "create again: 409 AlreadyExists",
        "replace stale: 409 Conflict",
        "delete again: 404 NotFound",
        "watch: ADDED MODIFIED DELETED",
    ] {
        assert!(
            real.iter().any(|l| l == expected),
            "{expected:?} not in {real:#?}"
        );
    }
    assert_eq!(
        double, real,
        "the double's LeaseCandidates differ from the real apiserver's"
    );
    Ok(())
}
