//! Unit tests of the configuration and its validation.

use super::*;

fn cfg() -> LeaseConfig {
    LeaseConfig::new("default", "lease", "me")
}

#[test]
fn defaults_are_client_go_defaults_and_valid() {
    let c = cfg();
    assert_eq!(c.lease_duration, Duration::from_secs(15));
    assert_eq!(c.renew_deadline, Duration::from_secs(10));
    assert_eq!(c.retry_period, Duration::from_secs(2));
    assert_eq!(c.validate(), Ok(()));
    assert_eq!(c.lease_duration_seconds(), 15);
}

#[test]
fn client_go_rules_are_checked_in_order_with_client_go_wording() {
    let s = Duration::from_secs;
    let e = cfg().lease_duration(s(10)).validate().unwrap_err();
    assert_eq!(e, ConfigError::LeaseDurationNotGreaterThanRenewDeadline);
    assert_eq!(e.to_string(), "leaseDuration must be greater than renewDeadline");
    // 12 s renew deadline vs 10 s * 1.2 = 12 s: not greater.
    let e = cfg()
        .lease_duration(s(20))
        .renew_deadline(s(12))
        .retry_period(s(10))
        .validate();
    assert_eq!(
        e,
        Err(ConfigError::RenewDeadlineNotGreaterThanJitteredRetryPeriod)
    );
    assert_eq!(
        e.unwrap_err().to_string(),
        "renewDeadline must be greater than retryPeriod*JitterFactor"
    );
    let ok = cfg()
        .lease_duration(s(20))
        .renew_deadline(Duration::from_millis(12_001))
        .retry_period(s(10));
    assert_eq!(ok.validate(), Ok(()));
    let e = cfg().retry_period(Duration::ZERO).validate().unwrap_err();
    assert_eq!(e, ConfigError::NotPositive(Field::RetryPeriod));
    assert_eq!(e.to_string(), "retryPeriod must be greater than zero");
    let e = cfg().release_timeout(Duration::ZERO).validate().unwrap_err();
    assert_eq!(e, ConfigError::NotPositive(Field::ReleaseTimeout));
    let e = LeaseConfig::new("default", "lease", "").validate().unwrap_err();
    assert_eq!(e.to_string(), "Lock identity is empty");
}

#[test]
fn lease_duration_must_be_whole_seconds_that_fit_int32() {
    let e = cfg().lease_duration(Duration::from_millis(15_500)).validate();
    assert_eq!(
        e,
        Err(ConfigError::LeaseDurationNotWholeSeconds(Duration::from_millis(
            15_500
        )))
    );
    let huge = Duration::from_secs(u64::from(u32::MAX));
    let e = cfg().lease_duration(huge).validate();
    assert_eq!(e, Err(ConfigError::LeaseDurationTooLong(huge)));
    let max = Duration::from_secs(i32::MAX as u64);
    let c = cfg().lease_duration(max);
    assert_eq!(c.validate(), Ok(()));
    assert_eq!(c.lease_duration_seconds(), i32::MAX);
    // Durations that do not even fit a u64 of nanoseconds are still handled.
    let e = cfg().lease_duration(Duration::MAX).validate();
    assert!(
        matches!(e, Err(ConfigError::LeaseDurationNotWholeSeconds(_))),
        "{e:?}"
    );
}

#[test]
fn names_follow_dns1123() {
    for bad in ["", "Default", "-a", "a-", "a.b", "a_b", &"a".repeat(64)] {
        let e = LeaseConfig::new(bad, "lease", "me").validate();
        assert!(
            matches!(e, Err(ConfigError::InvalidNamespace { .. })),
            "{bad:?}: {e:?}"
        );
    }
    for good in ["a", "kube-system", "0ab", &"a".repeat(63)] {
        assert_eq!(
            LeaseConfig::new(good, "lease", "me").validate(),
            Ok(()),
            "{good:?}"
        );
    }
    for bad in [
        "",
        "A",
        "a..b",
        ".a",
        "a.",
        "-a.b",
        "a.b-",
        "a/b",
        &"a".repeat(254),
    ] {
        let e = LeaseConfig::new("ns", bad, "me").validate();
        assert!(
            matches!(e, Err(ConfigError::InvalidName { .. })),
            "{bad:?}: {e:?}"
        );
    }
    for good in ["a", "my-controller", "kube-controller-manager", "a.b.c", "1.2-3"] {
        assert_eq!(LeaseConfig::new("ns", good, "me").validate(), Ok(()), "{good:?}");
    }
    let e = LeaseConfig::new("ns", "Bad", "me").validate().unwrap_err();
    assert_eq!(
        e.to_string(),
        "lease name \"Bad\" is not a valid DNS-1123 subdomain: must consist of lower case alphanumeric characters, '-' or '.'"
    );
}

#[test]
fn unique_identity_differs_per_call_and_keeps_the_pod_name() {
    let a = unique_identity();
    let b = unique_identity();
    assert_ne!(a, b);
    let (pod, suffix) = a.rsplit_once('_').unwrap();
    assert!(!pod.is_empty());
    assert_eq!(suffix.len(), 8);
    // Eight random lower-case letters: the digits of one random number, not
    // one letter repeated.
    let suffixes: Vec<String> = (0..20)
        .map(|_| unique_identity().rsplit_once('_').unwrap().1.to_owned())
        .collect();
    for s in &suffixes {
        assert!(s.len() == 8 && s.bytes().all(|c| c.is_ascii_lowercase()), "{s:?}");
    }
    assert!(
        suffixes.iter().any(|s| s.bytes().any(|c| c != s.as_bytes()[0])),
        "{suffixes:?}"
    );
}

#[test]
fn the_other_durations_may_reach_the_apis_limit_and_no_further() {
    assert_eq!(cfg().release_timeout(MAX_DURATION).validate(), Ok(()));
    let over = MAX_DURATION + Duration::from_secs(1);
    assert_eq!(
        cfg().release_timeout(over).validate(),
        Err(ConfigError::TooLong {
            field: Field::ReleaseTimeout,
            value: over,
            max: MAX_DURATION,
        })
    );
}

/// A zero lease duration or renew deadline breaks one of client-go's first
/// two rules, before any duration is checked for zero (`validate` leaves the
/// lease duration out of that check, as it cannot be reached).
#[test]
fn a_zero_lease_duration_or_renew_deadline_breaks_the_first_rules() {
    let e = cfg().lease_duration(Duration::ZERO).validate();
    assert_eq!(e, Err(ConfigError::LeaseDurationNotGreaterThanRenewDeadline));
    let e = cfg().renew_deadline(Duration::ZERO).validate();
    assert_eq!(
        e,
        Err(ConfigError::RenewDeadlineNotGreaterThanJitteredRetryPeriod)
    );
}

/// client-go's second rule is `RenewDeadline <= time.Duration(JitterFactor *
/// float64(RetryPeriod))`: the jittered retry period in whole nanoseconds.
/// In seconds as `f64`, 1.2 × 3 s came out below 3.6 s, so a 3.6 s renew
/// deadline at a 3 s retry period, which client-go refuses
/// ([`ConfigError::RenewDeadlineNotGreaterThanJitteredRetryPeriod`]), was
/// accepted; the chart refuses it too.
#[test]
fn the_jittered_retry_period_rule_is_client_gos_to_the_nanosecond() {
    let ms = Duration::from_millis;
    for (retry, renew) in [(3_000, 3_600), (6_000, 7_200), (9_000, 10_800), (95, 114)] {
        let c = cfg()
            .lease_duration(Duration::from_secs(60))
            .retry_period(ms(retry));
        assert_eq!(
            c.clone().renew_deadline(ms(renew)).validate(),
            Err(ConfigError::RenewDeadlineNotGreaterThanJitteredRetryPeriod),
            "renew deadline {renew} ms, retry period {retry} ms"
        );
        let above = ms(renew) + Duration::from_nanos(1);
        assert_eq!(
            c.renew_deadline(above).validate(),
            Ok(()),
            "{above:?} at {retry} ms"
        );
    }
    // The product does not overflow.
    let c = cfg().lease_duration(Duration::MAX).retry_period(Duration::MAX);
    assert_eq!(
        c.renew_deadline(Duration::from_secs(1)).validate(),
        Err(ConfigError::RenewDeadlineNotGreaterThanJitteredRetryPeriod)
    );
}
