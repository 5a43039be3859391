//! The Lease metadata a candidate writes (`LeaseConfig::label`,
//! `annotation`, `owner_reference`), on the in-memory Lease API double with
//! paused tokio time.

use crate::{
    test_util::FakeLeaseApi,
    tests::support::{config, elector, held_by, paused},
};

/// Lease metadata (`LeaseConfig::label`, `annotation`, `owner_reference`):
/// written when the Lease is created and when a term begins on someone
/// else's record, and only the configured keys.
#[test]
fn the_configured_lease_metadata_is_written_on_creation_and_on_takeover() {
    paused(async {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

        let owner = OwnerReference {
            api_version: "apps/v1".into(),
            kind: "Deployment".into(),
            name: "operator".into(),
            uid: "d1".into(),
            ..OwnerReference::default()
        };
        let with_metadata = |identity: &str| {
            config(identity)
                .label("holder", identity)
                .annotation("example.com/node", "node-1")
                .owner_reference(owner.clone())
        };
        // Creating the Lease.
        let fake = FakeLeaseApi::default();
        let (e, _) = elector(&fake, with_metadata("a"));
        let guard = e.acquire().await.unwrap();
        let meta = fake.lease().unwrap().metadata;
        assert_eq!(meta.labels.unwrap()["holder"], "a");
        assert_eq!(meta.annotations.unwrap()["example.com/node"], "node-1");
        assert_eq!(meta.owner_references.unwrap().len(), 1);
        drop(guard);
        // Taking over a free Lease that carries labels of its own.
        let fake = FakeLeaseApi::default();
        fake.put(held_by("", 1));
        let (b, _) = elector(&fake, with_metadata("b"));
        let _guard = b.acquire().await.unwrap();
        let meta = fake.lease().unwrap().metadata;
        let labels = meta.labels.unwrap();
        assert_eq!(labels["holder"], "b");
        assert_eq!(labels["app"], "x", "other labels are kept");
        assert_eq!(meta.owner_references.unwrap()[0].uid, "d1");
    });
}
