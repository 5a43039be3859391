//! The test kit's Lease API double (`kube_runtime_lease::test_util`) is
//! honest: one script of operations (creation races, conflicts, missing
//! objects, the API server's validation, resourceVersion semantics, watch
//! events) runs against the double and against a real kube-apiserver, and
//! must have the same outcomes.

use std::time::Duration;

use anyhow::{Context as _, Result};
use futures::TryStreamExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use kube::{
    Api,
    api::{DeleteParams, ListParams, ObjectMeta, PostParams, WatchEvent, WatchParams},
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
            if kind == "DELETED" {
                break;
            }
        }
        anyhow::Ok(seen)
    });
    let pp = PostParams::default();
    out.push(format!("get missing: {:?}", api.get_opt(NAME).await?.is_some()));
    let created = api.create(&pp, &lease(None, |_| {})).await;
    out.push(format!("create: {}", outcome(&created)));
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
    out.push(format!("get deleted: {:?}", api.get_opt(NAME).await?.is_some()));
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
        "delete again: {}",
        outcome(&api.delete(NAME, &DeleteParams::default()).await)
    ));
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
