use super::*;

/// The verdict on `observed` for the candidate `identity`.
fn verdict_of(
    observed: &Observed,
    identity: &str,
    own_term: bool,
    fallback: Duration,
    now: Instant,
) -> Verdict {
    let asker = Asker {
        identity,
        own_term,
        fallback,
    };
    observed.verdict(asker, now)
}

const ME: &str = "me";
const FALLBACK: Duration = Duration::from_secs(15);

fn t(secs: i64) -> Timestamp {
    Timestamp::from_second(1_700_000_000 + secs).unwrap()
}

fn spec(holder: Option<&str>, transitions: Option<i32>, duration: Option<i32>) -> LeaseSpec {
    LeaseSpec {
        holder_identity: holder.map(str::to_owned),
        lease_transitions: transitions,
        lease_duration_seconds: duration,
        acquire_time: Some(MicroTime(t(-100))),
        renew_time: Some(MicroTime(t(-10))),
        strategy: Some("OldestEmulationVersion".into()),
        preferred_holder: Some("pref".into()),
    }
}

#[test]
fn a_term_begins_with_a_new_acquisition_whatever_the_previous_record() {
    let holders = [None, Some(""), Some(ME), Some("other")];
    let transitions = [None, Some(0), Some(7), Some(i32::MAX)];
    let durations = [None, Some(0), Some(-3), Some(1), Some(15)];
    for h in holders {
        for tr in transitions {
            for d in durations {
                let prev = spec(h, tr, d);
                let next = taken(Some(&prev), ME, 30, 9, t(0));
                assert_eq!(next.holder_identity.as_deref(), Some(ME));
                assert_eq!(next.lease_duration_seconds, Some(30));
                assert_eq!(
                    next.acquire_time,
                    Some(MicroTime(t(0))),
                    "{h:?}: a new acquisition"
                );
                assert_eq!(next.renew_time, Some(MicroTime(t(0))));
                assert_eq!(next.lease_transitions, Some(9));
                assert_eq!(next.strategy, prev.strategy, "strategy kept");
                assert_eq!(
                    next.preferred_holder, prev.preferred_holder,
                    "preferredHolder kept"
                );
                let renewal = renewed(&next, 30, t(2));
                assert_eq!(
                    renewal.acquire_time, next.acquire_time,
                    "renewal keeps acquireTime"
                );
                assert_eq!(renewal.lease_transitions, next.lease_transitions);
                assert_eq!(renewal.renew_time, Some(MicroTime(t(2))));
                assert_eq!(renewal.preferred_holder, prev.preferred_holder);
                assert!(same_write(&renewal, &renewal.clone()));
                assert!(!same_write(&renewal, &next), "another renewTime");
                let rel = released(&next, t(5));
                assert_eq!(rel.holder_identity.as_deref(), Some(""));
                assert_eq!(rel.lease_duration_seconds, Some(1));
                assert_eq!(rel.acquire_time, Some(MicroTime(t(5))));
                assert_eq!(rel.renew_time, Some(MicroTime(t(5))));
                assert_eq!(rel.lease_transitions, next.lease_transitions);
                assert_eq!(rel.strategy, prev.strategy);
                assert_eq!(rel.preferred_holder, prev.preferred_holder);
                assert_eq!(holder(&rel), None);
            }
        }
    }
}

fn object(uid: &str, spec: LeaseSpec) -> Lease {
    Lease {
        metadata: kube_client::core::ObjectMeta {
            uid: Some(uid.into()),
            ..Default::default()
        },
        spec: Some(spec),
    }
}

/// A term is its object and holder; which writes on it are ours is told by
/// their `renewTime` (`Memory::is_last_term`), not by `acquireTime` or
/// `leaseTransitions`, which an edit may change on our own write.
#[test]
fn a_term_is_its_object_and_holder() {
    let ours = taken(None, ME, 15, 3, t(0));
    let term = TermId::of(&object("u1", ours.clone())).unwrap();
    assert!(
        term.matches(&object("u1", renewed(&ours, 15, t(4)))),
        "renewed: same term"
    );
    let mut labelled = object("u1", ours.clone());
    labelled.metadata.labels = Some([("k".to_owned(), "v".to_owned())].into());
    assert!(term.matches(&labelled), "metadata does not matter");
    assert!(!term.matches(&object("u2", ours.clone())), "another object");
    assert!(
        term.matches(&object("u1", taken(Some(&ours), ME, 15, 4, t(1)))),
        "the same identity on the same object: told apart by renewTime, elsewhere"
    );
    assert!(!term.matches(&object("u1", taken(Some(&ours), "other", 15, 3, t(0)))));
    assert!(!term.matches(&object("u1", released(&ours, t(1)))), "free");
    assert_eq!(TermId::of(&object("u1", released(&ours, t(1)))), None);
}

#[test]
fn now_is_whole_microseconds() {
    let n = now();
    assert_eq!(n.subsec_nanosecond() % 1000, 0);
}

#[test]
fn a_spec_with_nothing_in_it_is_free() {
    let empty = LeaseSpec::default();
    assert_eq!(holder(&empty), None);
    assert_eq!(lease_duration(&empty, FALLBACK), FALLBACK);
}

#[test]
fn invalid_durations_fall_back_to_our_own() {
    for (d, want) in [
        (None, FALLBACK),
        (Some(0), FALLBACK),
        (Some(-1), FALLBACK),
        (Some(i32::MIN), FALLBACK),
        (Some(1), Duration::from_secs(1)),
        (Some(i32::MAX), Duration::from_secs(i32::MAX as u64)),
    ] {
        assert_eq!(lease_duration(&spec(Some("x"), None, d), FALLBACK), want, "{d:?}");
    }
}

#[test]
fn expiry_counts_from_the_first_sight_of_an_unchanged_record() {
    let start = Instant::now();
    let mut rec = spec(Some("other"), Some(1), Some(10));
    rec.preferred_holder = None;
    let o = Observed::update(None, rec.clone(), Some("1".into()), start);
    let later = start + Duration::from_secs(4);
    // Seen again, unchanged: the clock does not restart.
    let o = Observed::update(Some(o), rec.clone(), Some("1".into()), later);
    assert_eq!(o.at, start);
    for (dt, want) in [(0, false), (9, false), (10, true), (11, true)] {
        let now = start + Duration::from_secs(dt);
        let v = verdict_of(&o, ME, true, FALLBACK, now);
        assert_eq!(v == Verdict::Take, want, "after {dt}s");
        if !want {
            assert_eq!(v, Verdict::WaitUntil(start + Duration::from_secs(10)));
        }
    }
    // A changed record (a renewal) restarts the clock, even when seen late.
    let mut renewed = rec;
    renewed.renew_time = Some(MicroTime(t(100)));
    let o = Observed::update(Some(o), renewed, Some("2".into()), later);
    assert_eq!(o.at, later);
    assert_eq!(
        verdict_of(&o, ME, true, FALLBACK, start + Duration::from_secs(10)),
        Verdict::WaitUntil(later + Duration::from_secs(10))
    );
}

/// A-B-A: the newest version seen, seen again after an older one (a list
/// served by a cache behind), keeps the clock of its first sight; an older
/// version seen again, a version with another record, or a record without
/// a version, restarts it.
#[test]
fn the_newest_version_seen_again_keeps_its_clock() {
    let start = Instant::now();
    let later = |s| start + Duration::from_secs(s);
    let renewal = |s| {
        let mut rec = spec(Some("other"), Some(1), Some(10));
        rec.renew_time = Some(MicroTime(t(s)));
        rec
    };
    let v = |s: &str| Some(s.to_owned());
    let o = Observed::update(None, renewal(1), v("1"), start);
    let o = Observed::update(Some(o), renewal(2), v("2"), later(2));
    // The stale list: version 1 again, a change (it may be an etcd restore).
    let o = Observed::update(Some(o), renewal(1), v("1"), later(8));
    assert_eq!(o.at, later(8));
    // The watch: version 2 again, the newest seen: its clock goes on.
    let newest = Observed::update(Some(o.clone()), renewal(2), v("2"), later(9));
    assert_eq!(newest.at, later(2));
    assert_eq!(newest.resource_version, v("2"));
    // Version 2's number with another record (numbers reused after a
    // restore), or no version at all: a change.
    let reused = Observed::update(Some(o.clone()), renewal(3), v("2"), later(9));
    assert_eq!(reused.at, later(9));
    let unversioned = Observed::update(Some(o), renewal(2), None, later(9));
    assert_eq!(unversioned.at, later(9));
    // A version never seen before becomes the newest; the one before it is
    // then an older version.
    let o = Observed::update(Some(newest), renewal(4), v("4"), later(10));
    let o = Observed::update(Some(o), renewal(2), v("2"), later(11));
    assert_eq!(o.at, later(11));
    let o = Observed::update(Some(o), renewal(4), v("4"), later(12));
    assert_eq!(o.at, later(10));
}

#[test]
fn free_ours_and_preferred_verdicts() {
    let now = Instant::now();
    let mut free = spec(Some(""), None, Some(1));
    free.preferred_holder = None;
    let o = Observed::update(None, free.clone(), None, now);
    assert_eq!(verdict_of(&o, ME, true, FALLBACK, now), Verdict::Take);
    let mut none = free.clone();
    none.holder_identity = None;
    assert_eq!(
        verdict_of(&Observed::update(None, none, None, now), ME, true, FALLBACK, now),
        Verdict::Take
    );
    let mut ours = spec(Some(ME), None, Some(10));
    ours.preferred_holder = None;
    let o = Observed::update(None, ours, None, now);
    assert_eq!(verdict_of(&o, ME, true, FALLBACK, now), Verdict::Take);
    assert_eq!(
        verdict_of(&o, ME, false, FALLBACK, now),
        Verdict::WaitUntil(now + Duration::from_secs(10)),
        "ours, unknown object"
    );
    // Free, but reserved for a preferred holder: wait one record duration.
    let mut reserved = free;
    reserved.preferred_holder = Some("pref".into());
    reserved.lease_duration_seconds = Some(3);
    let o = Observed::update(None, reserved.clone(), None, now);
    assert_eq!(
        verdict_of(&o, ME, true, FALLBACK, now),
        Verdict::WaitUntil(now + Duration::from_secs(3))
    );
    assert_eq!(
        verdict_of(&o, ME, true, FALLBACK, now + Duration::from_secs(3)),
        Verdict::Take
    );
    assert_eq!(verdict_of(&o, "pref", true, FALLBACK, now), Verdict::Take);
    assert_eq!(
        verdict_of(&o, "pref", false, FALLBACK, now),
        Verdict::Take,
        "a free lease reserved for us, at once"
    );
    // Held by the preferred holder itself, someone else waits as usual.
    let mut held = reserved.clone();
    held.holder_identity = Some("pref".into());
    let o = Observed::update(None, held, None, now);
    assert_eq!(
        verdict_of(&o, ME, true, FALLBACK, now),
        Verdict::WaitUntil(now + Duration::from_secs(3))
    );
    // Held by another, its end of term marked for a third: expiry, then
    // one more lease duration for the preferred holder.
    let o = Observed::update(None, spec(Some("other"), None, Some(3)), None, now);
    assert_eq!(
        verdict_of(&o, ME, true, FALLBACK, now + Duration::from_secs(5)),
        Verdict::WaitUntil(now + Duration::from_secs(6))
    );
    assert_eq!(
        verdict_of(&o, "pref", true, FALLBACK, now + Duration::from_secs(3)),
        Verdict::Take
    );
    // Missing duration on a held record: our own duration, never zero.
    let mut unmarked = spec(Some("other"), None, None);
    unmarked.preferred_holder = None;
    let o = Observed::update(None, unmarked, None, now);
    assert_eq!(
        verdict_of(&o, ME, true, FALLBACK, now + Duration::from_secs(14)),
        Verdict::WaitUntil(now + FALLBACK)
    );
}

/// An instant too far to represent (a user's `Duration::MAX` grace) is
/// as far ahead as an `Instant` goes, decades, never a short wait.
#[test]
fn later_saturates_decades_ahead() {
    let now = Instant::now();
    assert_eq!(later(now, Duration::from_secs(5)), now + Duration::from_secs(5));
    let far = later(now, Duration::MAX);
    assert!(
        far >= now + Duration::from_secs(29 * 365 * 86_400),
        "{:?}",
        far - now
    );
}

#[test]
fn observe_keeps_the_newest_resource_version() {
    let now = Instant::now();
    let rec = spec(Some("x"), None, Some(5));
    let o = Observed::update(None, rec.clone(), Some("5".into()), now);
    let o = Observed::update(Some(o), rec.clone(), None, now);
    assert_eq!(o.resource_version.as_deref(), Some("5"));
    // The same record under a newer version (a metadata-only change:
    // labels, annotations): the write that takes it must carry the
    // newer version, or it is refused with a conflict.
    let later = now + Duration::from_secs(1);
    let o = Observed::update(Some(o), rec, Some("6".into()), later);
    assert_eq!(o.resource_version.as_deref(), Some("6"));
    assert_eq!(o.at, now, "an unchanged record keeps its first sighting");
}

/// Never none (a step-down that is undone): a record of our own term whose
/// `preferredHolder` names another candidate is not taken back at once,
/// whatever the durations: the preferred holder takes it at expiry (one
/// lease duration after its last change), and has one more lease duration
/// before we take it back (it never came).
#[test]
fn our_own_term_marked_for_another_is_left_to_the_preferred_holder_for_one_lease_duration() {
    let now = Instant::now();
    for duration in [None, Some(1), Some(3), Some(15), Some(i32::MAX)] {
        let mut marked = spec(Some(ME), Some(4), duration);
        marked.preferred_holder = Some("pref".into());
        let seen = Observed::update(None, marked.clone(), None, now);
        let wait = lease_duration(&marked, FALLBACK);
        let ours_again = later(now, wait.saturating_mul(2));
        assert_eq!(
            verdict_of(&seen, ME, true, FALLBACK, now),
            Verdict::WaitUntil(ours_again),
            "{duration:?}: stepped down for `pref`, which gets its chance"
        );
        assert_eq!(
            verdict_of(&seen, ME, true, FALLBACK, later(now, wait)),
            Verdict::WaitUntil(ours_again),
            "{duration:?}: `pref` takes it at expiry, before us"
        );
        assert_eq!(
            verdict_of(&seen, "pref", false, FALLBACK, later(now, wait)),
            Verdict::Take,
            "{duration:?}: at expiry, the preferred holder takes it"
        );
        assert_eq!(
            verdict_of(&seen, ME, true, FALLBACK, ours_again),
            Verdict::Take,
            "{duration:?}: `pref` did not come: ours again"
        );
        assert_eq!(
            verdict_of(&seen, "pref", false, FALLBACK, now),
            Verdict::WaitUntil(later(now, wait)),
            "{duration:?}: the preferred holder waits for our record to expire, as for anyone's"
        );
        // Marked for us (or not at all): our own record, taken at once.
        for preferred in [Some(ME), None, Some("")] {
            let mut ours = marked.clone();
            ours.preferred_holder = preferred.map(str::to_owned);
            let seen = Observed::update(None, ours, None, now);
            assert_eq!(
                verdict_of(&seen, ME, true, FALLBACK, now),
                Verdict::Take,
                "{preferred:?}"
            );
        }
    }
}

/// Never none (a clock that stands still): every renewal changes the
/// record, so that a follower judging expiry by the last change sees it.
#[test]
fn every_renewal_moves_renew_time_forward_even_when_the_clock_does_not() {
    let first = taken(None, ME, 15, 0, t(0));
    let mut prev = first.clone();
    for now in [t(0), t(0), t(-30), t(0)] {
        let next = renewed(&prev, 15, now);
        assert_ne!(next, prev, "a renewal at {now} is a change");
        let (MicroTime(before), MicroTime(after)) =
            (prev.renew_time.clone().unwrap(), next.renew_time.clone().unwrap());
        assert!(after > before, "renewTime moves forward: {before} -> {after}");
        assert!(after.as_microsecond() - before.as_microsecond() >= 1);
        prev = next;
    }
    // A clock that moves is followed as it is.
    let next = renewed(&first, 15, t(7));
    assert_eq!(next.renew_time, Some(MicroTime(t(7))));
    // A record with no renewTime is renewed at `now`.
    let mut bare = first;
    bare.renew_time = None;
    assert_eq!(renewed(&bare, 15, t(1)).renew_time, Some(MicroTime(t(1))));
}

#[test]
fn a_token_annotation_no_run_of_terms_reaches_is_ignored() {
    let with_token = |token: i64| {
        let mut lease = object("u", spec(Some(ME), Some(3), Some(15)));
        set_token(&mut lease, token);
        token_of(&lease)
    };
    assert_eq!(with_token(MAX_TOKEN - 1), MAX_TOKEN - 1);
    // From here on tokens could not go on growing: the transitions count.
    assert_eq!(with_token(MAX_TOKEN), 3);
    assert_eq!(with_token(i64::MAX), 3);
}
