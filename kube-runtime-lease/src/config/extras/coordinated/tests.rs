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
