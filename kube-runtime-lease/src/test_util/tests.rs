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
