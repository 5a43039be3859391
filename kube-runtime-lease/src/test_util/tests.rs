//! Unit tests of the double.

use k8s_openapi::api::core::v1::ConfigMap;
use kube_client::{
    Api,
    api::{ListParams, ObjectMeta, PostParams},
};

use super::*;
use crate::tests::runtime::paused;

fn named(name: &str) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        spec: None,
    }
}

/// One double serves any number of Leases, by namespace and name, with one
/// resourceVersion sequence; lists and watches select by namespace, name and
/// labels; other resources are empty.
#[test]
fn a_double_serves_every_lease_by_namespace_and_name() {
    paused(async {
        use futures::{StreamExt, TryStreamExt};
        use kube_client::api::{WatchEvent, WatchParams};

        let fake = FakeLeaseApi::default();
        let (client, _) = fake.client();
        let leases = Api::<Lease>::namespaced(client.clone(), "default");
        let elsewhere = Api::<Lease>::namespaced(client.clone(), "other");
        let all = Api::<Lease>::all(client.clone());
        let pp = PostParams::default();
        let mut b = named("b");
        b.metadata.labels = Some([("shard-of".to_owned(), "x".to_owned())].into());
        let labelled = ListParams::default().labels("shard-of=x");
        let from = all
            .list(&ListParams::default())
            .await
            .unwrap()
            .metadata
            .resource_version
            .unwrap();
        let watch = leases
            .watch(&WatchParams::default().labels("shard-of=x"), &from)
            .await
            .unwrap();
        let a = leases.create(&pp, &named("a")).await.unwrap();
        let b = leases.create(&pp, &b).await.unwrap();
        let c = elsewhere.create(&pp, &named("a")).await.unwrap();
        assert!(
            a.metadata.resource_version < b.metadata.resource_version
                && b.metadata.resource_version < c.metadata.resource_version
        );
        assert_ne!(
            a.metadata.uid, c.metadata.uid,
            "one object per namespace and name"
        );
        let names = |l: kube_client::core::ObjectList<Lease>| {
            l.items
                .into_iter()
                .map(|l| l.metadata.name.unwrap())
                .collect::<Vec<_>>()
        };
        assert_eq!(
            names(leases.list(&ListParams::default()).await.unwrap()),
            ["a", "b"]
        );
        assert_eq!(
            names(elsewhere.list(&ListParams::default()).await.unwrap()),
            ["a"]
        );
        assert_eq!(names(all.list(&ListParams::default()).await.unwrap()).len(), 3);
        assert_eq!(names(leases.list(&labelled).await.unwrap()), ["b"]);
        let by_name = ListParams::default().fields("metadata.name=a");
        assert_eq!(names(leases.list(&by_name).await.unwrap()), ["a"]);
        assert!(leases.get_opt("c").await.unwrap().is_none());
        fake.take_over_in("default", "b", "other");
        fake.delete_in("other", "a");
        assert!(fake.lease_in("other", "a").is_none());
        assert_eq!(fake.leases().len(), 2);
        assert_eq!(
            fake.lease_in("default", "b")
                .unwrap()
                .spec
                .unwrap()
                .holder_identity
                .as_deref(),
            Some("other")
        );
        // The labelled watch saw b's creation and takeover, nothing of a.
        let seen: Vec<_> = watch
            .take(2)
            .map_ok(|e| match e {
                WatchEvent::Added(l) => format!("ADDED {}", l.metadata.name.unwrap()),
                WatchEvent::Modified(l) => format!("MODIFIED {}", l.metadata.name.unwrap()),
                other => format!("{other:?}"),
            })
            .try_collect()
            .await
            .unwrap();
        assert_eq!(seen, ["ADDED b", "MODIFIED b"]);
        assert_eq!(
            fake.lease().and_then(|l| l.metadata.name).as_deref(),
            Some("a"),
            "the first created"
        );
        let configmaps = Api::<ConfigMap>::namespaced(client, "default");
        assert!(
            configmaps
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .is_empty()
        );
        assert!(configmaps.get_opt("x").await.unwrap().is_none());
    });
}

/// As the API server: a created Lease must have a name (422 without one),
/// takes the request path's namespace when it names none, and is refused
/// (400) when it names another.
#[test]
fn a_create_needs_a_name_and_takes_the_namespace_of_its_path() {
    paused(async {
        let fake = FakeLeaseApi::default();
        let (client, _) = fake.client();
        let leases = Api::<Lease>::namespaced(client, "default");
        let pp = PostParams::default();
        let nameless = leases.create(&pp, &Lease::default()).await.unwrap_err();
        assert!(
            matches!(nameless, kube_client::Error::Api(ref s) if s.code == 422),
            "a create without a name: {nameless:?}"
        );
        assert!(fake.lease().is_none(), "nothing stored by a refused create");
        let mut elsewhere = named("a");
        elsewhere.metadata.namespace = Some("other".into());
        let mismatch = leases.create(&pp, &elsewhere).await.unwrap_err();
        assert!(
            matches!(mismatch, kube_client::Error::Api(ref s) if s.code == 400),
            "a create naming another namespace than its path: {mismatch:?}"
        );
        leases.create(&pp, &named("a")).await.unwrap();
        let stored = fake.lease().unwrap();
        assert_eq!(stored.metadata.name.as_deref(), Some("a"));
        assert_eq!(
            stored.metadata.namespace.as_deref(),
            Some("default"),
            "the namespace comes from the request path"
        );
    });
}

/// Set-based label requirements (`in`, `notin`), with commas inside their
/// parentheses (`key in (a, b)`).
#[test]
fn set_based_label_selectors_select_by_value_sets() {
    paused(async {
        let fake = FakeLeaseApi::default();
        let (client, _) = fake.client();
        let leases = Api::<Lease>::namespaced(client, "default");
        let pp = PostParams::default();
        leases.create(&pp, &named("a")).await.unwrap();
        let mut b = named("b");
        b.metadata.labels = Some([("shard-of".to_owned(), "x".to_owned())].into());
        leases.create(&pp, &b).await.unwrap();
        let names = |l: kube_client::core::ObjectList<Lease>| {
            l.items
                .into_iter()
                .map(|l| l.metadata.name.unwrap())
                .collect::<Vec<_>>()
        };
        let set = |sel: &str| ListParams::default().labels(sel);
        assert_eq!(
            names(leases.list(&set("shard-of in (y,x)")).await.unwrap()),
            ["b"]
        );
        assert_eq!(
            names(leases.list(&set("shard-of in (y,z)")).await.unwrap()),
            Vec::<String>::new()
        );
        assert_eq!(
            names(leases.list(&set("shard-of notin (x,y)")).await.unwrap()),
            ["a"]
        );
        assert_eq!(
            names(leases.list(&set("shard-of,shard-of in (x)")).await.unwrap()),
            ["b"]
        );
        assert_eq!(
            names(leases.list(&set("shard-of in x")).await.unwrap()),
            Vec::<String>::new(),
            "not understood: selects nothing"
        );
    });
}

/// A delete with preconditions deletes only the object it names: a
/// resourceVersion or uid that is not the stored one is a 409 Conflict and
/// leaves it, as the API server does; the request names its object.
#[test]
fn a_delete_with_preconditions_deletes_only_the_record_it_names() {
    paused(async {
        use kube_client::api::{DeleteParams, Preconditions};

        let fake = FakeLeaseApi::default();
        let (client, id) = fake.client();
        let leases = Api::<Lease>::namespaced(client, "default");
        let made = leases.create(&PostParams::default(), &named("m")).await.unwrap();
        let with = |resource_version: Option<String>, uid: Option<String>| DeleteParams {
            preconditions: Some(Preconditions {
                resource_version,
                uid,
            }),
            ..DeleteParams::default()
        };
        for (rv, uid) in [
            (Some("999".to_owned()), None),
            (None, Some("another-uid".to_owned())),
            (
                made.metadata.resource_version.clone(),
                Some("another-uid".to_owned()),
            ),
        ] {
            let err = leases.delete("m", &with(rv, uid)).await.unwrap_err();
            assert!(
                matches!(&err, kube_client::Error::Api(s) if s.code == 409 && s.message.contains("Precondition failed")),
                "{err:?}"
            );
            assert!(fake.lease_in("default", "m").is_some(), "not deleted");
        }
        leases
            .delete(
                "m",
                &with(made.metadata.resource_version.clone(), made.metadata.uid.clone()),
            )
            .await
            .unwrap();
        assert!(fake.lease_in("default", "m").is_none(), "deleted");
        let err = leases.delete("m", &DeleteParams::default()).await.unwrap_err();
        assert!(
            matches!(&err, kube_client::Error::Api(s) if s.code == 404),
            "{err:?}"
        );
        let deletes: Vec<Option<String>> = fake
            .requests()
            .into_iter()
            .filter(|r| r.client == id && r.verb == "delete")
            .map(|r| r.name)
            .collect();
        assert_eq!(deletes, vec![Some("m".to_owned()); 5]);
    });
}
