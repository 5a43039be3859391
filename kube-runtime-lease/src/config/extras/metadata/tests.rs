use super::*;

fn owner(uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: "apps/v1".into(),
        kind: "Deployment".into(),
        name: "operator".into(),
        uid: uid.into(),
        ..OwnerReference::default()
    }
}

#[test]
fn keys_and_values_follow_the_api_servers_rules() {
    for good in ["app", "example.com/holder-pod", "a.b_c-d", "k8s.io/x"] {
        assert_eq!(qualified_name(good), None, "{good}");
    }
    for bad in [
        "",
        "/x",
        "Example.com/x",
        "x/",
        "-x",
        "x-",
        "a b",
        &"x".repeat(64),
    ] {
        assert!(qualified_name(bad).is_some(), "{bad:?}");
    }
    assert_eq!(label_value(""), None);
    assert_eq!(label_value("pod-a_1.x"), None);
    assert!(label_value("node/1").is_some());
    assert!(label_value(&"v".repeat(64)).is_some());
}

#[test]
fn invalid_metadata_is_a_typed_error() {
    let mut m = LeaseMetadata::default();
    m.labels.insert("holder".into(), "not a value".into());
    assert!(matches!(m.validate(), Err(ConfigError::InvalidLabel { .. })));
    let mut m = LeaseMetadata::default();
    m.annotations.insert("Bad Key".into(), "anything at all".into());
    assert!(matches!(m.validate(), Err(ConfigError::InvalidAnnotation { .. })));
    let m = LeaseMetadata {
        owner: Some(owner("")),
        ..LeaseMetadata::default()
    };
    assert_eq!(
        m.validate(),
        Err(ConfigError::InvalidOwnerReference { field: "uid" })
    );
    let m = LeaseMetadata {
        owner: Some(owner("u1")),
        ..LeaseMetadata::default()
    };
    assert_eq!(m.validate(), Ok(()));
}

#[test]
fn only_the_configured_keys_are_written_and_the_rest_is_kept() {
    let mut m = LeaseMetadata::default();
    m.labels.insert("holder".into(), "pod-b".into());
    m.annotations.insert("example.com/node".into(), "node-2".into());
    m.owner = Some(owner("u1"));
    let mut meta = ObjectMeta {
        labels: Some([("holder".into(), "pod-a".into()), ("team".into(), "x".into())].into()),
        annotations: Some([("kept".into(), "yes".into())].into()),
        owner_references: Some(vec![owner("u0")]),
        ..ObjectMeta::default()
    };
    m.apply(&mut meta);
    m.apply(&mut meta);
    let labels = meta.labels.unwrap();
    assert_eq!(labels["holder"], "pod-b");
    assert_eq!(labels["team"], "x");
    let annotations = meta.annotations.unwrap();
    assert_eq!(annotations["kept"], "yes");
    assert_eq!(annotations["example.com/node"], "node-2");
    let owners: Vec<_> = meta
        .owner_references
        .unwrap()
        .into_iter()
        .map(|o| o.uid)
        .collect();
    assert_eq!(owners, ["u0", "u1"], "added once, the other kept");
}

/// Every writer of the configured metadata (a takeover, a shard roster
/// entry joined) leaves the configured annotations out, rather than have
/// its write refused with 422 at every attempt, when the Lease's own
/// annotations (someone else's, the fencing token) leave them no room; a
/// configured key already there counts once, and the limit itself fits.
#[test]
fn configured_annotations_are_written_only_where_they_fit_under_the_limit() {
    let metadata = LeaseMetadata {
        annotations: BTreeMap::from([("example.com/a".to_owned(), "x".repeat(10))]),
        ..LeaseMetadata::default()
    };
    let configured = "example.com/a".len() + 10;
    let filled = |total: usize, own: Option<&str>| {
        let mut annotations = BTreeMap::new();
        let mut rest = total;
        if let Some(v) = own {
            annotations.insert("example.com/a".to_owned(), v.to_owned());
            rest -= "example.com/a".len() + v.len();
        }
        annotations.insert(
            "other.example/filler".to_owned(),
            "f".repeat(rest - "other.example/filler".len()),
        );
        ObjectMeta {
            annotations: Some(annotations),
            ..ObjectMeta::default()
        }
    };
    let written = |mut meta: ObjectMeta| {
        metadata.apply(&mut meta);
        meta.annotations.unwrap().get("example.com/a").cloned()
    };
    let configured_value = Some("x".repeat(10));
    // Exactly at the limit with them: written.
    assert_eq!(
        written(filled(MAX_ANNOTATIONS_SIZE - configured, None)),
        configured_value
    );
    // One byte over: left out, the others kept as they are.
    let mut meta = filled(MAX_ANNOTATIONS_SIZE - configured + 1, None);
    let before = meta.clone();
    metadata.apply(&mut meta);
    assert_eq!(
        meta, before,
        "the configured annotation was written past the limit"
    );
    // Replacing a value of the same key counts the difference only.
    let full = filled(MAX_ANNOTATIONS_SIZE, Some(&"y".repeat(10)));
    assert_eq!(written(full), configured_value);
    // One byte more than the limit: left out, and the value under the key
    // (an earlier write's, another replica's) removed, as the candidate
    // would have replaced it: the room is the fencing token's.
    let full = filled(MAX_ANNOTATIONS_SIZE, Some(&"y".repeat(9)));
    assert_eq!(
        written(full),
        None,
        "one byte more than the limit was written, or the key kept"
    );
}

/// `validate` takes configured annotations up to the API server's limit
/// less the room the fencing token's annotation needs (its key and the
/// longest `i64`), and refuses one byte more.
#[test]
fn configured_annotations_are_valid_up_to_the_limit_less_the_tokens_room() {
    let room = crate::record::TOKEN_ANNOTATION.len() + i64::MIN.to_string().len();
    let key = "example.com/big";
    let with = |size: usize| LeaseMetadata {
        annotations: BTreeMap::from([(key.to_owned(), "x".repeat(size - key.len()))]),
        ..LeaseMetadata::default()
    };
    assert_eq!(with(MAX_ANNOTATIONS_SIZE - room).validate(), Ok(()));
    assert!(
        matches!(
            with(MAX_ANNOTATIONS_SIZE - room + 1).validate(),
            Err(ConfigError::InvalidAnnotation { .. })
        ),
        "one byte more than leaves the token its room is valid"
    );
}
