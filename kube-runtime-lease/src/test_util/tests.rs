//! Unit tests of the double.

use k8s_openapi::api::core::v1::ConfigMap;
use kube_client::{
    Api,
    api::{ListParams, ObjectMeta, PostParams},
};

use super::*;
use crate::test_support::paused;

fn named(name: &str) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        spec: None,
    }
}

/// One double serves one Lease: another name or namespace is never
/// shared by accident; other resources are empty.
#[test]
fn a_double_serves_one_lease_and_nothing_else() {
    paused(async {
        let fake = FakeLeaseApi::default();
        let (client, _) = fake.client();
        let leases = Api::<Lease>::namespaced(client.clone(), "default");
        let pp = PostParams::default();
        leases.create(&pp, &named("a")).await.unwrap();
        let refused = leases.create(&pp, &named("b")).await.unwrap_err();
        assert!(
            matches!(refused, kube_client::Error::Api(ref s) if s.code == 403),
            "{refused:?}"
        );
        assert!(leases.get_opt("b").await.unwrap().is_none());
        assert!(leases.get_opt("a").await.unwrap().is_some());
        let elsewhere = Api::<Lease>::namespaced(client.clone(), "other");
        assert!(
            elsewhere
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .is_empty()
        );
        assert!(elsewhere.get_opt("a").await.unwrap().is_none());
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
        assert_eq!(fake.lease().and_then(|l| l.metadata.name).as_deref(), Some("a"));
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
