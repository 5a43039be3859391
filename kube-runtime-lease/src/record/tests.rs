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
/// A retry period of two seconds, client-go's.
const STEP: Duration = Duration::from_secs(2);
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
                let renewal = renewed(&next, 30, t(2), STEP);
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
        term.matches(&object("u1", renewed(&ours, 15, t(4), STEP))),
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
    // An older version first seen after the newest (a GET from etcd, then a
    // list from a cache behind) is not the newest: version 4, seen again,
    // keeps its clock.
    let o = Observed::update(None, renewal(4), v("4"), later(10));
    let o = Observed::update(Some(o), renewal(3), v("3"), later(12));
    assert_eq!(o.at, later(12));
    let o = Observed::update(Some(o), renewal(4), v("4"), later(13));
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
/// record, so that a follower judging expiry by the last change sees it; by
/// a whole second at a retry period of a second or more, since a client-go
/// follower compares times in whole seconds (never two: with the clock
/// stepped back, a renewal 1 µs after the last was no change to it, and it
/// took the Lease a lease duration later while our term held).
#[test]
fn every_renewal_moves_renew_time_forward_even_when_the_clock_does_not() {
    let first = taken(None, ME, 15, 0, t(0));
    let mut prev = first.clone();
    for now in [t(0), t(0), t(-30), t(0)] {
        let next = renewed(&prev, 15, now, STEP);
        assert_ne!(next, prev, "a renewal at {now} is a change");
        let (MicroTime(before), MicroTime(after)) =
            (prev.renew_time.clone().unwrap(), next.renew_time.clone().unwrap());
        assert_eq!(after.as_second(), before.as_second() + 1, "{before} -> {after}");
        prev = next;
    }
    // A retry period under a second: the step is the retry period, and a
    // retry period of nothing still moves it a microsecond.
    let half = renewed(&first, 15, t(0), Duration::from_millis(500));
    assert_eq!(
        half.renew_time,
        Some(MicroTime(t(0) + SignedDuration::from_millis(500)))
    );
    let tiny = renewed(&first, 15, t(-1), Duration::ZERO);
    assert_eq!(
        tiny.renew_time,
        Some(MicroTime(t(0) + SignedDuration::from_micros(1)))
    );
    // A clock that moves is followed as it is.
    let next = renewed(&first, 15, t(7), STEP);
    assert_eq!(next.renew_time, Some(MicroTime(t(7))));
    // A record with no renewTime is renewed at `now`.
    let mut bare = first;
    bare.renew_time = None;
    assert_eq!(renewed(&bare, 15, t(1), STEP).renew_time, Some(MicroTime(t(1))));
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

/// The bytes client-go compares (`observedRawRecord`): `json.Marshal` of the
/// `LeaderElectionRecord` that `LeaseSpecToLeaderElectionRecord` makes of a
/// spec, with its times as `metav1.Time` marshals them (RFC 3339, UTC, whole
/// seconds; `null` when unset).
fn client_go_raw(spec: &LeaseSpec) -> String {
    let time = |t: &Option<MicroTime>| {
        t.as_ref().map_or_else(
            || "null".to_owned(),
            |MicroTime(t)| format!("\"{}\"", Timestamp::from_second(t.as_second()).unwrap()),
        )
    };
    format!(
        r#"{{"holderIdentity":"{}","leaseDurationSeconds":{},"acquireTime":{},"renewTime":{},"leaderTransitions":{},"strategy":"{}","preferredHolder":"{}"}}"#,
        spec.holder_identity.as_deref().unwrap_or(""),
        spec.lease_duration_seconds.unwrap_or(0),
        time(&spec.acquire_time),
        time(&spec.renew_time),
        spec.lease_transitions.unwrap_or(0),
        spec.strategy.as_deref().unwrap_or(""),
        spec.preferred_holder.as_deref().unwrap_or(""),
    )
}

fn wall(s: &str) -> Timestamp {
    s.parse().unwrap()
}

/// Never two, next to client-go: our leader's node had its wall clock
/// stepped back (NTP correcting a clock that ran ahead, a VM restored from a
/// snapshot) by 30 s. Renewals never let `renewTime` move back; when they
/// wrote the previous `renewTime` plus 1 µs, renewal after renewal, every
/// one of those records was the same record to a client-go follower (its
/// times are compared in whole seconds, see `client_go_raw`), so its expiry
/// clock never restarted, and it took the Lease one lease duration after it
/// first saw it, while our leader, renewing in time, still held a valid
/// term. Now each renewal moves `renewTime` by the retry period (at most a
/// second).
///
/// client-go's own leader, with the same stepped clock, writes `renewTime =
/// now`: the record moves back by 30 s, its bytes change, and followers
/// restart their clocks: the fault was our rule, not the protocol's.
///
/// Timeline (monotonic seconds since the step, the defaults 15/10/2): our
/// renewal `k` is sent at `2k` and applied at once; the client-go follower
/// reads the Lease 0.1 s after each renewal (its polls come every 2 to 4.4
/// s; any phase gives the same result).
#[test]
fn renewals_after_the_wall_clock_stepped_back_are_changes_to_a_client_go_follower() {
    let (lease_duration, renew_deadline, retry_period) = (15.0_f64, 10.0_f64, 2.0_f64);
    // Our term's record, last renewed just before the step (wall clock 10:00:30.4).
    let mut record = taken(None, "rust", 15, 3, wall("2026-12-07T10:00:00.4Z"));
    record = renewed(&record, 15, wall("2026-12-07T10:00:30.4Z"), STEP);
    // The wall clock now reads 30 s earlier than before the step.
    let stepped_back = wall("2026-12-07T10:00:00.5Z");
    // The client-go follower "go": its observedRawRecord and observedTime.
    let mut observed = (client_go_raw(&record), 0.0_f64);
    for k in 0..=12_u32 {
        let sent = f64::from(k) * retry_period;
        let now = stepped_back
            .checked_add(SignedDuration::from_secs_f64(sent))
            .unwrap();
        // Our leader's renewal, as `Task::renew` makes it.
        let next = renewed(&record, 15, now, Duration::from_secs_f64(retry_period));
        let last_sent = sent;
        record = next;
        // client-go's read, 0.1 s later (`tryAcquireOrRenew`, steps 2 and 3).
        let read_at = sent + 0.1;
        let raw = client_go_raw(&record);
        if raw != observed.0 {
            observed = (raw, read_at);
        }
        let expired = observed.1 + lease_duration <= read_at;
        let ours_valid = read_at < last_sent + renew_deadline;
        assert!(
            !(expired && ours_valid),
            "two leaders: {read_at:.1}s after the wall clock stepped back 30 s, the client-go follower \
             takes the Lease (the record unchanged to it since {:.1}s: {}) while our leader renewed \
             {:.1}s ago and its term holds {:.1}s more. Our renewTime moved only by 1 µs per renewal \
             ({:?}), inside one second: client-go compares records in whole seconds",
            observed.1,
            observed.0,
            read_at - last_sent,
            last_sent + renew_deadline - read_at,
            record.renew_time.as_ref().map(|MicroTime(t)| t.to_string()),
        );
    }
    // What client-go's leader writes under the same clock: `renewTime = now`,
    // a change to every follower.
    let mut go = taken(None, "go", 15, 3, wall("2026-12-07T10:00:30.4Z"));
    let before = client_go_raw(&go);
    go.renew_time = Some(MicroTime(stepped_back));
    assert_ne!(client_go_raw(&go), before);
}

/// The earliest a client-go follower takes our Lease while our leader's term
/// still holds, for timings `(lease duration, renew deadline, retry period)`
/// in seconds: `None` if never. Our leader takes the Lease at monotonic 0
/// (wall clock `phase` past a whole second) and renews every retry period,
/// each write applied at once, until it is cut off after renewal `k` (its
/// later writes never land); its term holds until that renewal was sent plus
/// the renew deadline. The client-go follower reads the Lease 10 ms after
/// every write (it can: its polls come at any phase) and takes it once the
/// record it compares (`client_go_raw`: whole seconds) has been unchanged
/// for the lease duration.
fn client_go_takes_during_our_term(seconds: i32, rd: f64, rp: f64) -> Option<String> {
    let ld = f64::from(seconds);
    let base = wall("2026-12-07T10:00:00Z");
    for phase_ms in (0..1000).step_by(10) {
        for k in 0..12_u32 {
            let at = |mono: f64| {
                base.checked_add(SignedDuration::from_secs_f64(f64::from(phase_ms) / 1000.0 + mono))
                    .unwrap()
            };
            let mut record = taken(None, "rust", seconds, 1, at(0.0));
            let mut observed = (client_go_raw(&record), 0.01_f64);
            for i in 1..=k {
                let sent = f64::from(i) * rp;
                record = renewed(&record, seconds, at(sent), Duration::from_secs_f64(rp));
                let raw = client_go_raw(&record);
                if raw != observed.0 {
                    observed = (raw, sent + 0.01);
                }
            }
            let last_sent = f64::from(k) * rp;
            let takes = observed.1 + ld;
            let ours_until = last_sent + rd;
            if takes < ours_until {
                return Some(format!(
                    "wall clock {phase_ms} ms past a second, cut off after renewal {k}: the client-go \
                     follower takes the Lease at {takes:.2}s (the record unchanged to it since \
                     {:.2}s), our term holds until {ours_until:.2}s (last renewal sent at \
                     {last_sent:.2}s): {:.2}s with two leaders",
                    observed.1,
                    ours_until - takes
                ));
            }
        }
    }
    None
}

/// Never two, next to client-go, at a retry period under a second: the
/// README's rule for mixed fleets ("keep lease duration − renew deadline ≥
/// retry period") was meant to cover the renewals a client-go follower does
/// not see (it compares records with times in whole seconds), but at a
/// retry period under half a second several renewals fall in one wall-clock
/// second, and the follower's clock can start up to (not quite) a second
/// before our last renewal: what the margin must cover is a second, not a
/// retry period. Timings that keep both margins are safe.
#[test]
fn a_client_go_follower_never_takes_during_our_term_with_the_documented_margin() {
    // Timings (LD, RD, RP) as the crate accepts them (LD > RD > 1.2 RP) and
    // with the documented margin for Go candidates: LD − RD ≥ max(RP, 1 s).
    let documented = |ld: f64, rd: f64, rp: f64| ld - rd >= rp.max(1.0);
    for (seconds, rd, rp) in [
        (15, 10.0, 2.0),
        (2, 1.0, 0.3),
        (3, 2.0, 0.5),
        (2, 1.0, 0.1),
        (5, 3.0, 2.0),
        (2, 1.7, 0.3),
        (2, 1.5, 0.2),
    ] {
        let ld = f64::from(seconds);
        assert!(
            rd > 1.2 * rp && ld > rd,
            "({ld}, {rd}, {rp}) is accepted by validate"
        );
        if !documented(ld, rd, rp) {
            continue;
        }
        let two = client_go_takes_during_our_term(seconds, rd, rp);
        assert!(
            two.is_none(),
            "two leaders at {ld}/{rd}/{rp} s, timings the README calls safe next to client-go: {}",
            two.unwrap_or_default()
        );
    }
}

#[test]
fn a_lease_is_read_with_times_past_jiffs_range_as_the_last_instant() {
    let json = |time: &str| {
        serde_json::json!({
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": { "name": "l", "resourceVersion": "7" },
            "spec": { "holderIdentity": "gone", "acquireTime": time, "renewTime": time },
        })
    };
    // The end of 9999, as Go writes it: past jiff's last instant.
    let end = json("9999-12-31T23:59:59.000000Z");
    assert!(
        serde_json::from_value::<Lease>(end.clone()).is_err(),
        "k8s-openapi reads it now"
    );
    let Wire(lease) = serde_json::from_value(end).unwrap();
    let spec = lease.spec.unwrap();
    assert_eq!(spec.renew_time, Some(MicroTime(Timestamp::MAX)));
    assert_eq!(spec.acquire_time, Some(MicroTime(Timestamp::MAX)));
    assert_eq!(spec.holder_identity.as_deref(), Some("gone"));
    assert_eq!(lease.metadata.resource_version.as_deref(), Some("7"));
    // Any other time is read as it is, and written back as it was read.
    let Wire(lease) = serde_json::from_value(json("2026-12-06T16:00:00.123456Z")).unwrap();
    let renewed = lease.spec.as_ref().and_then(|s| s.renew_time.clone()).unwrap();
    assert_eq!(renewed.0.to_string(), "2026-12-06T16:00:00.123456Z");
    let written = serde_json::to_value(Wire(lease)).unwrap();
    assert_eq!(written["spec"]["renewTime"], "2026-12-06T16:00:00.123456Z");
    assert_eq!(written["kind"], "Lease");
}
