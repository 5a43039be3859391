use super::*;

#[test]
fn versions_are_strict_semver_and_emulation_is_not_newer() {
    assert_eq!(semver("1.37.0"), Some((1, 37, 0)));
    assert_eq!(semver("1.37.0-alpha.1+abc"), Some((1, 37, 0)));
    for bad in ["1.37", "v1.37.0", "1.37.0.1", "01.2.3", "1..3", "", "a.b.c"] {
        assert_eq!(semver(bad), None, "{bad}");
    }
    assert_eq!(Coordinated::new("1.37.0").check("a"), None);
    assert_eq!(
        Coordinated::new("1.37.0")
            .emulation_version("1.36.0")
            .check("pod-a_1.x"),
        None
    );
    let broken = |c: &Coordinated, id: &str| c.check(id).map(|(field, _, _)| field);
    assert_eq!(broken(&Coordinated::new("1.37"), "a"), Some("binaryVersion"));
    assert_eq!(
        broken(&Coordinated::new("1.37.0").emulation_version("v1.36.0"), "a"),
        Some("emulationVersion")
    );
    assert_eq!(
        broken(&Coordinated::new("1.36.0").emulation_version("1.37.0"), "a"),
        Some("emulationVersion")
    );
    assert_eq!(
        broken(&Coordinated::new("1.37.0").strategy("Mine"), "a"),
        Some("strategy")
    );
    assert_eq!(
        broken(&Coordinated::new("1.37.0").strategy("example.com/mine"), "a"),
        None
    );
    assert_eq!(broken(&Coordinated::new("1.37.0"), "pod a"), Some("identity"));
    assert_eq!(broken(&Coordinated::new("1.37.0"), ".."), Some("identity"));
    assert_eq!(
        broken(&Coordinated::new("1.37.0"), &"x".repeat(254)),
        Some("identity")
    );
}

/// The `LeaseCandidate`'s deletion is part of the shutdown's worst case: one
/// request bound more than the same configuration without it.
#[test]
fn the_shutdown_budget_counts_the_lease_candidates_deletion() {
    let plain = crate::LeaseConfig::new("default", "lease", "me");
    let coordinated = plain.clone().coordinated(Coordinated::new("1.37.0"));
    let grace = Duration::from_secs(1);
    assert_eq!(
        coordinated.shutdown_budget(grace),
        plain.shutdown_budget(grace) + REQUEST_BOUND,
    );
    assert_eq!(REQUEST_BOUND, Duration::from_secs(10));
}

/// What the API server refuses in a `LeaseCandidate` (`ValidateLeaseCandidateSpec`:
/// versions are strict semantic versions, pre-release and build included;
/// `OldestEmulationVersion` needs an emulation version other than 0.0.0; a
/// strategy with a `/` is a qualified name, `<DNS subdomain>/<name>`) is a
/// configuration error before any API call: accepted, the candidate's every
/// publication is answered 422, it is never elected and never falls back
/// (the API is served), so replicas sharing the configuration never lead.
#[test]
fn what_the_api_server_refuses_in_a_lease_candidate_is_refused_by_validate() {
    let broken = |c: Coordinated| c.check("a").map(|(field, value, _)| (field, value));
    for strategy in [
        "example.com/a/b",
        "/mine",
        "example.com/",
        "Example.com/mine",
        "example.com/-mine",
        "example.com/my strategy",
        "-example.com/mine",
    ] {
        assert_eq!(
            broken(Coordinated::new("1.37.0").strategy(strategy)),
            Some(("strategy", strategy.to_owned())),
            "{strategy:?} accepted"
        );
    }
    for version in [
        "1.37.0-",
        "1.37.0+",
        "1.37.0-01",
        "1.37.0-a..b",
        "1.37.0-a_b",
        "1.37.0+a_b",
    ] {
        assert_eq!(
            broken(Coordinated::new(version)),
            Some(("binaryVersion", version.to_owned())),
            "{version:?} accepted"
        );
    }
    assert_eq!(
        broken(Coordinated::new("1.37.0").emulation_version("0.0.0")),
        Some(("emulationVersion", "0.0.0".to_owned())),
        "OldestEmulationVersion without an emulation version accepted"
    );
    // An emulation version newer than the binary's by its pre-release.
    for (binary, emulation) in [
        ("1.37.0-alpha", "1.37.0"),
        ("1.37.0-alpha.1", "1.37.0-alpha.2"),
        ("1.37.0-alpha", "1.37.0-alpha.1"),
        ("1.37.0-2", "1.37.0-alpha"),
    ] {
        assert_eq!(
            broken(Coordinated::new(binary).emulation_version(emulation)),
            Some(("emulationVersion", emulation.to_owned())),
            "{emulation} after {binary} accepted"
        );
    }
    for (binary, emulation) in [
        ("1.37.0", "1.37.0-alpha"),
        ("1.37.0-alpha.10", "1.37.0-alpha.9"),
        ("1.37.0-beta", "1.37.0-alpha"),
        ("1.37.0-alpha+b", "1.37.0-alpha+a"),
    ] {
        assert_eq!(
            broken(Coordinated::new(binary).emulation_version(emulation)),
            None,
            "{emulation} before {binary} refused"
        );
    }
    // What the API server accepts stays accepted.
    for fine in [
        Coordinated::new("1.37.0-alpha.1+abc.2"),
        Coordinated::new("1.37.0").strategy("example.com/Mine_1.x"),
        Coordinated::new("0.0.0").strategy("example.com/mine"),
    ] {
        assert_eq!(broken(fine.clone()), None, "{fine:?} refused");
    }
}

/// The `LeaseCandidate`'s name (`<identity>.<lease>`) is checked by the API
/// server as a `ConfigMap` key, which must not start with `..`: an identity
/// that does is refused by `validate`, or the candidate's every publication
/// is answered 422 and it never leads.
#[test]
fn an_identity_that_makes_the_lease_candidate_name_start_with_two_dots_is_refused() {
    let broken = |id: &str| Coordinated::new("1.37.0").check(id).map(|(field, _, _)| field);
    for id in ["..pod", "...", "..a.b"] {
        assert_eq!(broken(id), Some("identity"), "{id:?} accepted");
    }
    for id in [".pod", "pod..a", "a.."] {
        assert_eq!(broken(id), None, "{id:?} refused");
    }
}
