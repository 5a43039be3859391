use super::*;

fn with(ping: Option<&str>, renew: Option<&str>) -> DynamicObject {
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("coordination.k8s.io", "v1beta1", "LeaseCandidate"),
        "leasecandidates",
    );
    let mut spec = serde_json::Map::new();
    if let Some(p) = ping {
        spec.insert("pingTime".into(), json!(p));
    }
    if let Some(r) = renew {
        spec.insert("renewTime".into(), json!(r));
    }
    DynamicObject::new("a", &resource).data(json!({ "spec": spec }))
}

#[test]
fn a_ping_is_a_ping_time_after_the_renew_time() {
    let (early, late) = ("2026-12-01T10:00:00.000000Z", "2026-12-01T10:00:05.000000Z");
    assert!(pinged(&with(Some(late), Some(early))));
    assert!(!pinged(&with(Some(early), Some(late))));
    assert!(!pinged(&with(Some(early), Some(early))), "answered: equal times");
    assert!(pinged(&with(Some(early), None)));
    assert!(!pinged(&with(None, Some(early))));
    assert!(!pinged(&with(Some("not a time"), Some(early))));
}

#[test]
fn the_published_object_carries_the_settings_and_a_renew_time() {
    // A client needs a runtime.
    crate::tests::support::paused(async { published_object_checks() });
}

fn published_object_checks() {
    let config = LeaseConfig::new("ns", "lease", "me")
        .coordinated(Coordinated::new("1.37.0").emulation_version("1.36.0"));
    let client = crate::test_util::FakeLeaseApi::default().client().0;
    let candidate = LeaseCandidate::new(client, &config, config.extras.coordinated.as_ref().expect("set"));
    let object = candidate.object();
    let spec = &object.data["spec"];
    assert_eq!(object.metadata.name.as_deref(), Some("me"));
    assert_eq!(object.metadata.namespace.as_deref(), Some("ns"));
    assert_eq!(spec["leaseName"], "lease");
    assert_eq!(spec["binaryVersion"], "1.37.0");
    assert_eq!(spec["emulationVersion"], "1.36.0");
    assert_eq!(spec["strategy"], "OldestEmulationVersion");
    assert!(
        spec["renewTime"].as_str().is_some_and(|t| t.ends_with('Z')),
        "{spec}"
    );
    assert!(spec.get("pingTime").is_none());
}
