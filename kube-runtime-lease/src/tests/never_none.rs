//! "Never none": the schedules that left a Lease without a leader for longer
//! than its documented bounds, one test each, on the in-memory
//! Lease API double with paused time. Each failed on the code before its
//! fix.
//! <!-- upstream: omit -->
//! `docs/regressions.md` lists them in section 15.
//! <!-- upstream: end -->
//! The bounds are stated in the module docs (*Liveness: how long a Lease
//! can be without a leader*).

use std::{
    pin::pin,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use tokio::time::{Instant, sleep, timeout};

use crate::{
    LeaderElector, Lost, record,
    test_util::{FakeLeaseApi, Fault},
    tests::support::{config, count, elector, free, held_by, holder, paused, spec},
};

const S: fn(u64) -> Duration = Duration::from_secs;
const MS: fn(u64) -> Duration = Duration::from_millis;

/// When `client` last sent a `verb` request (its last renewal, for `update`).
fn last_sent(fake: &FakeLeaseApi, client: usize, verb: &str) -> Instant {
    let sent = fake
        .requests()
        .iter()
        .filter(|r| r.client == client && r.verb == verb)
        .map(|r| r.at)
        .next_back();
    sent.expect("no such request")
}

/// The kinds of 404 that are not the API server saying "this Lease does not
/// exist": its `NotFound` for a path it does not serve (no details naming
/// the Lease), a `Status` with another reason, and a plain-text answer from
/// something in front of the API server.
const ODD_404S: [Fault; 3] = [Fault::NoSuchResource, Fault::Status(404), Fault::PlainText(404)];

// ---- 1. A 404 is not always "deleted" ----------------------------------------

/// A renewal answered with a 404 that is not the API server's `NotFound`
/// for the Lease, and the read that checks it answered the same way, cost
/// that renewal, not the term: the next renewal succeeds and the guard was
/// valid throughout. (Before: the term ended as `Deleted` at once.)
#[test]
fn a_renewal_answered_an_odd_404_costs_that_renewal_not_the_term() {
    for fault in ODD_404S {
        paused(async move {
            let fake = free();
            let (e, id) = elector(&fake, config("me"));
            let guard = e.acquire().await.unwrap();
            let since = Instant::now();
            fake.fault(id, Some("update"), fault);
            fake.fault(id, Some("get"), fault);
            sleep(S(30)).await;
            assert_eq!(guard.lost(), None, "{fault:?}: the term ended");
            assert!(guard.is_valid(), "{fault:?}");
            assert!(e.is_leader(), "{fault:?}");
            assert!(
                count(&fake, id, "update", since) >= 14,
                "{fault:?}: renewed every retry period after the 404"
            );
            assert_eq!(holder(&fake).as_deref(), Some("me"));
        });
    }
}

/// The API server's own `NotFound` for the Lease, confirmed by a read, still
/// ends the term as deleted, within a retry period.
#[test]
fn a_renewal_answered_not_found_for_a_deleted_lease_ends_the_term_as_deleted() {
    paused(async {
        let fake = free();
        let (e, id) = elector(&fake, config("me"));
        let guard = e.acquire().await.unwrap();
        let deleted = Instant::now();
        fake.delete();
        fake.fault(id, Some("update"), Fault::Status(404));
        let lost = timeout(S(5), guard).await.expect("the term did not end");
        assert_eq!(lost, Lost::Deleted);
        assert!(deleted.elapsed() <= S(3), "{:?}", deleted.elapsed());
    });
}

/// The read that confirms a new Lease at the end of its creation hold is
/// answered with an odd 404: the hold goes on for one retry period and the
/// term begins then. (Before: the term ended as `Deleted`, the Lease was
/// taken for gone, and its own creator held it for another lease duration.)
#[test]
fn an_odd_404_on_the_read_that_ends_the_creation_hold_costs_one_retry_period() {
    for fault in ODD_404S {
        paused(async move {
            let fake = FakeLeaseApi::default();
            let (e, id) = elector(&fake, config("me"));
            let created = Instant::now();
            let mut acquire = pin!(e.acquire());
            assert!(timeout(S(14), &mut acquire).await.is_err(), "led during the hold");
            fake.fault(id, Some("get"), fault);
            let guard = timeout(S(4), acquire)
                .await
                .unwrap_or_else(|_| {
                    panic!(
                        "{fault:?}: not leading {:?} after creating the Lease (hold 15 s)",
                        created.elapsed()
                    )
                })
                .unwrap();
            assert!(guard.is_valid());
            assert_eq!(spec(&fake).lease_transitions, Some(0), "{fault:?}: one term only");
        });
    }
}

/// A candidate whose reads are answered with an odd 404 does not take the
/// Lease for missing: it creates nothing, and takes the expired record once
/// its reads are answered again.
#[test]
fn an_odd_404_on_a_read_is_not_a_missing_lease() {
    for fault in ODD_404S {
        paused(async move {
            let fake = FakeLeaseApi::default();
            fake.put(held_by("other", 5));
            let (e, id) = elector(&fake, config("me").watch(false));
            for _ in 0..2 {
                fake.fault(id, Some("get"), fault);
            }
            let guard = timeout(S(40), e.acquire())
                .await
                .unwrap_or_else(|_| panic!("{fault:?}: never led"))
                .unwrap();
            let creates = fake
                .requests()
                .iter()
                .filter(|r| r.client == id && r.verb == "create")
                .count();
            assert_eq!(creates, 0, "{fault:?}: took the Lease for missing and created it");
            assert!(guard.is_valid());
            assert_eq!(holder(&fake).as_deref(), Some("me"));
        });
    }
}

/// A `replace` that keeps answering 404 while reads succeed is retried with
/// backoff, never at once: no request loop runs without a delay. Once the
/// answers are right again, the candidate leads. (Before: it was retried at
/// once, in a loop, every fault consumed in the same instant.)
#[test]
fn a_replace_that_keeps_answering_404_is_retried_with_backoff() {
    for fault in ODD_404S {
        paused(async move {
            let fake = FakeLeaseApi::default();
            fake.put(held_by("other", 5));
            let (e, id) = elector(&fake, config("me"));
            for _ in 0..200 {
                fake.fault(id, Some("update"), fault);
            }
            let mut acquire = pin!(e.acquire());
            assert!(timeout(S(60), &mut acquire).await.is_err());
            let writes: Vec<Instant> = fake
                .requests()
                .iter()
                .filter(|r| r.client == id && r.verb == "update")
                .map(|r| r.at)
                .collect();
            assert!(
                (2..=30).contains(&writes.len()),
                "{fault:?}: {} writes in 60 s",
                writes.len()
            );
            for w in writes.windows(2) {
                assert!(w[1] - w[0] >= S(2), "{fault:?}: retried after {:?}", w[1] - w[0]);
            }
            fake.clear_faults();
            // The next attempt is at most 2.2 retry periods away.
            let guard = timeout(S(5), acquire)
                .await
                .unwrap_or_else(|_| panic!("{fault:?}: never led after the faults"))
                .unwrap();
            assert!(guard.is_valid());
        });
    }
}

// ---- 3. A step-down that is undone ------------------------------------------

/// A leader whose guarded work is alive when a `preferredHolder` naming
/// another candidate appears steps down without releasing, and campaigns
/// again at once (as `run_each_term` does): it must
/// not take its own unreleased record back. The preferred holder leads
/// within one lease duration of the mark. (Before: the leader took its record
/// back at once, and the preferred holder never led.)
#[test]
fn a_leader_that_campaigns_again_after_a_step_down_leaves_the_lease_to_the_preferred_holder() {
    paused(async {
        let fake = free();
        let (a, _) = elector(&fake, config("a"));
        let stepped_down = Arc::new(AtomicUsize::new(0));
        let campaign = tokio::spawn({
            let (a, stepped_down) = (a.clone(), stepped_down.clone());
            async move {
                // Each term's guard stays alive until the term ends.
                while let Ok(guard) = a.acquire().await {
                    if let Lost::SteppedDown { .. } = guard.await {
                        stepped_down.fetch_add(1, Ordering::SeqCst);
                    }
                }
            }
        });
        timeout(S(5), async {
            while !a.is_leader() {
                sleep(MS(10)).await;
            }
        })
        .await
        .expect("a leads");
        let (p, _) = elector(&fake, config("p"));
        let mut p_acquire = pin!(p.acquire());
        assert!(timeout(S(1), &mut p_acquire).await.is_err());
        let mut lease = fake.lease().unwrap();
        lease.spec.as_mut().unwrap().preferred_holder = Some("p".into());
        // The API server accepts a preferred holder only with a strategy.
        lease.spec.as_mut().unwrap().strategy = Some("OldestEmulationVersion".into());
        fake.put(lease);
        let marked = Instant::now();
        let p_guard = timeout(S(17), p_acquire)
            .await
            .expect("the preferred holder leads within a lease duration of the mark")
            .unwrap();
        assert!(marked.elapsed() >= S(5), "no overlap with a's stopped work");
        assert_eq!(stepped_down.load(Ordering::SeqCst), 1);
        sleep(S(30)).await;
        assert!(p_guard.is_valid(), "p keeps it");
        assert!(!a.is_leader());
        assert_eq!(holder(&fake).as_deref(), Some("p"));
        campaign.abort();
    });
}

/// The preferred holder never comes: the leader that stepped down takes its
/// record back within two lease durations of the mark, and keeps it.
#[test]
fn a_leader_that_stepped_down_for_a_preferred_holder_that_never_comes_leads_again() {
    paused(async {
        let fake = free();
        let (a, _) = elector(&fake, config("a"));
        let guard = a.acquire().await.unwrap();
        let mut lease = fake.lease().unwrap();
        lease.spec.as_mut().unwrap().preferred_holder = Some("ghost".into());
        lease.spec.as_mut().unwrap().strategy = Some("OldestEmulationVersion".into());
        fake.put(lease);
        let marked = Instant::now();
        assert!(matches!(
            timeout(S(3), guard).await.expect("a steps down"),
            Lost::SteppedDown { .. }
        ));
        let again = timeout(S(35), a.acquire())
            .await
            .expect("a leads again within two lease durations of the mark")
            .unwrap();
        assert!(marked.elapsed() >= S(15), "the preferred holder had its chance");
        sleep(S(30)).await;
        assert!(again.is_valid(), "and keeps it");
    });
}

// ---- 5. Fencing tokens never repeat ------------------------------------------

/// Fresh processes, one after the other, on a Lease whose `leaseTransitions`
/// is at the top of its range: every term gets a larger token, and so does
/// a term after `leaseTransitions` was edited down. (Before: every fresh
/// process's first term got `i32::MAX`.)
#[test]
fn tokens_never_repeat_across_processes_at_the_top_of_the_range_or_after_an_edit_down() {
    paused(async {
        let fake = FakeLeaseApi::default();
        let mut lease = held_by("", 1);
        lease.spec.as_mut().unwrap().lease_transitions = Some(i32::MAX);
        fake.put(lease);
        let mut tokens = Vec::new();
        for process in 0..4 {
            if process == 2 {
                // An admin (or a restore) moves the counter down.
                let mut lease = fake.lease().unwrap();
                lease.spec.as_mut().unwrap().lease_transitions = Some(3);
                fake.put(lease);
            }
            // A new process: an elector with no memory of the Lease.
            let (e, _) = elector(&fake, config(&format!("p{process}")));
            let guard = timeout(S(30), e.acquire()).await.expect("leads").unwrap();
            tokens.push(guard.fencing_token());
            let stored = record::token_of(&fake.lease().unwrap());
            assert_eq!(
                stored,
                guard.fencing_token(),
                "the Lease carries the term's token"
            );
            drop(guard);
            e.shutdown(S(1)).await.unwrap();
        }
        assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
        assert!(tokens[0] >= i64::from(i32::MAX), "{tokens:?}");
        assert!(
            spec(&fake).lease_transitions.is_some_and(|t| t >= 3),
            "the counter stays valid for the API server"
        );
    });
}

/// A term of another implementation (it moves `leaseTransitions`, keeps the
/// annotation) between two of ours: our next token is larger than both.
#[test]
fn a_term_of_another_implementation_in_between_does_not_make_tokens_repeat() {
    paused(async {
        let fake = free();
        let (a, _) = elector(&fake, config("a"));
        let first = a.acquire().await.unwrap().fencing_token();
        a.shutdown(S(1)).await.unwrap();
        // client-go takes it: transitions + 1, the object's metadata kept.
        let mut lease = fake.lease().unwrap();
        let s = lease.spec.as_mut().unwrap();
        s.holder_identity = Some("go".into());
        s.lease_transitions = s.lease_transitions.map(|t| t + 1);
        fake.put(lease);
        let go_transitions = i64::from(spec(&fake).lease_transitions.unwrap());
        let (b, _) = elector(&fake, config("b"));
        let second = timeout(S(30), b.acquire())
            .await
            .expect("b leads")
            .unwrap()
            .fencing_token();
        assert!(
            second > first && second > go_transitions,
            "{first}, go {go_transitions}, then {second}"
        );
    });
}

/// The elector does not lose an existing annotation written by others: the
/// token is added beside it.
#[test]
fn the_token_annotation_keeps_other_annotations() {
    paused(async {
        let fake = FakeLeaseApi::default();
        let mut lease = held_by("", 1);
        lease.metadata.annotations = Some([("example.com/kept".to_owned(), "yes".to_owned())].into());
        fake.put(lease);
        let (e, _): (LeaderElector, _) = elector(&fake, config("me"));
        let guard = e.acquire().await.unwrap();
        let annotations = fake.lease().unwrap().metadata.annotations.unwrap();
        assert_eq!(annotations["example.com/kept"], "yes");
        assert_eq!(
            annotations[record::TOKEN_ANNOTATION],
            guard.fencing_token().to_string()
        );
    });
}

/// A garbage fencing-token annotation (`i64::MAX`, written by an admin, a
/// restore, or a buggy tool) on the Lease: a token no run of terms reaches
/// (`record::MAX_TOKEN` or more) is ignored like a non-number, so tokens go
/// on growing from the record's transitions, and the next term begins.
/// (Before: honoured, and the next term's `last_token + 1` overflowed,
/// panicking the election task in a debug build, so that every later win
/// panicked again; in a release build the token repeated.)
#[test]
fn a_fencing_token_annotation_at_i64_max_does_not_stop_the_next_term() {
    paused(async {
        let fake = free();
        let mut lease = fake.lease().unwrap();
        lease
            .metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(record::TOKEN_ANNOTATION.to_owned(), i64::MAX.to_string());
        fake.put(lease);
        let (e, _) = elector(&fake, config("me"));
        let first = timeout(S(30), e.acquire()).await.expect("leads").unwrap();
        let first_token = first.fencing_token();
        assert!(first_token < record::MAX_TOKEN, "{first_token}");
        assert_eq!(record::token_of(&fake.lease().unwrap()), first_token);
        // Leadership given up: the Lease is released.
        drop(first);
        tokio::time::sleep(S(5)).await;
        let second = timeout(S(30), e.acquire())
            .await
            .expect("leads again")
            .expect("the second term begins (the election task did not panic)");
        assert!(second.fencing_token() > first_token);
    });
}

// ---- 6. Each renewal changes the record --------------------------------------
// `record::tests`' `every_renewal_moves_renew_time_forward_even_when_the_clock_does_not`
// (a clock that stands still or steps back). The test that was here set a
// `renewTime` ahead of the clock on the leader's record by another writer:
// that is now another process renewing our term (`regressions.rs`, section 2),
// which ends it.

// ---- 7. One shutdown budget --------------------------------------------------

/// A shutdown that begins while a campaign's read and write are in flight,
/// each answered just within the renew deadline: the task wins, releases,
/// and ends within `LeaseConfig::shutdown_budget`, and `shutdown` waits for
/// it instead of reporting `TaskDidNotEnd` for a task about to end. (Before:
/// its own bound left out the campaign's requests.)
#[test]
fn shutdown_waits_for_a_campaign_in_flight_within_the_budget() {
    paused(async {
        let fake = free();
        let cfg = config("me");
        let (e, id) = elector(&fake, cfg.clone());
        let slow = MS(9_900);
        fake.fault(id, Some("get"), Fault::DelayResponse(slow));
        fake.fault(id, Some("update"), Fault::DelayResponse(slow));
        let acquire = tokio::spawn({
            let e = e.clone();
            async move { e.acquire().await }
        });
        sleep(S(1)).await;
        let began = Instant::now();
        let result = timeout(S(120), e.shutdown(Duration::ZERO))
            .await
            .expect("shutdown is bounded");
        assert!(result.is_ok(), "{result:?} after {:?}", began.elapsed());
        assert!(
            began.elapsed() <= cfg.shutdown_budget(Duration::ZERO),
            "{:?}",
            began.elapsed()
        );
        assert!(acquire.await.unwrap().is_err(), "no guard after the shutdown");
        assert_eq!(holder(&fake).as_deref(), Some(""), "released");
    });
}

// ---- 8. Retries at client-go's pace ------------------------------------------

/// A candidate cut off from the API server for a minute, campaigning for a
/// free Lease, leads within a jittered retry period (2.2 *RP*) of the
/// API server answering again, as a client-go candidate does (it retries
/// every retry period whatever failed). (Before: its retries had backed off
/// to up to twice the lease duration, so the Lease stayed without a leader
/// for up to 30 s after the outage.)
#[test]
fn a_candidate_leads_within_a_jittered_retry_period_once_an_outage_ends() {
    // The backoff's jitter is random: several outages, each must end well.
    for round in 0..6 {
        paused(async move {
            let fake = free();
            let (e, id) = elector(&fake, config("me").watch(round % 2 == 0));
            fake.partition(id, true);
            let mut acquire = pin!(e.acquire());
            assert!(timeout(S(60), &mut acquire).await.is_err(), "led while cut off");
            fake.partition(id, false);
            let healed = Instant::now();
            let guard = timeout(MS(4_500), acquire)
                .await
                .unwrap_or_else(|_| {
                    panic!(
                        "round {round}: not leading 4.5 s after the outage ended (holder {:?}, \
                         first read after it at {:?})",
                        holder(&fake),
                        crate::tests::support::first_after(&fake, id, "get", healed).map(|t| t - healed),
                    )
                })
                .unwrap();
            assert!(guard.is_valid());
        });
    }
}

// ---- 9. Malformed records ----------------------------------------------------

/// A record whose `leaseTransitions` is negative (the API server refuses
/// to store one, but an older or patched one, or an etcd restore, may hold
/// it) is taken like any other: the takeover writes a valid count (0 or
/// more), not one more than the negative value, which the API server
/// refuses with 422 at every attempt, for ever.
#[test]
fn a_record_with_negative_transitions_is_taken_with_a_valid_count() {
    for holder_before in ["", "other"] {
        paused(async move {
            let fake = FakeLeaseApi::default();
            let mut lease = held_by(holder_before, 5);
            lease.spec.as_mut().unwrap().lease_transitions = Some(-5);
            fake.put(lease);
            let (e, _) = elector(&fake, config("me"));
            let guard = timeout(S(10), e.acquire())
                .await
                .unwrap_or_else(|_| {
                    panic!(
                        "{holder_before:?}: never led on a record with leaseTransitions -5 (holder {:?}, transitions {:?})",
                        holder(&fake),
                        spec(&fake).lease_transitions
                    )
                })
                .unwrap();
            assert!(guard.is_valid());
            assert!(spec(&fake).lease_transitions.is_some_and(|t| t >= 0));
        });
    }
}

/// A third party edits the leader's record (its holder untouched):
/// `leaseTransitions` set to another count, or `acquireTime` or `renewTime`
/// cleared (a `kubectl edit`, an apply of a partial spec). The record is
/// still the leader's own write (another process with its identity would
/// have written a `renewTime` of its own), which nobody else may take
/// before a lease duration: the Lease must not stay without a leader for
/// that lease duration (client-go's leader renews a record naming it and
/// leads on).
#[test]
fn an_edit_of_the_leaders_record_keeping_its_holder_does_not_leave_the_lease_without_a_leader() {
    for edit in ["transitions", "acquire_time", "renew_time"] {
        paused(async move {
            let fake = free();
            let (a, _) = elector(&fake, config("a"));
            let b_fake = fake.clone();
            let (b, _) = elector(&b_fake, config("b"));
            let guard = a.acquire().await.unwrap();
            let mut b_acquire = Box::pin(b.acquire());
            assert!(timeout(S(3), &mut b_acquire).await.is_err());
            let mut lease = fake.lease().unwrap();
            let spec = lease.spec.as_mut().unwrap();
            match edit {
                "transitions" => spec.lease_transitions = Some(100),
                "acquire_time" => spec.acquire_time = None,
                _ => spec.renew_time = None,
            }
            fake.put(lease);
            let edited = Instant::now();
            // Someone leads throughout: a on, or b within a retry period or two.
            sleep(S(5)).await;
            let a_leads = guard.lost().is_none() && a.is_leader();
            let b_leads = futures::FutureExt::now_or_never(&mut b_acquire).is_some();
            assert!(
                a_leads || b_leads,
                "{edit}: nobody leads {:?} after the edit (holder {:?}, a's term: {:?})",
                edited.elapsed(),
                holder(&fake),
                guard.lost(),
            );
        });
    }
}

// ---- 10. Rejoining after a loss ----------------------------------------------

/// `run_each_term` over work that yields no item (a Controller with nothing
/// to reconcile), on a single replica whose term is lost now and then (a
/// 12 s cut past its renew deadline, five minutes apart): after each cut it
/// leads again within a jittered retry period or two of the API server
/// answering. Long terms between the cuts start the rejoin's backoff over,
/// whether or not their work yielded. (Before: a term whose work yielded
/// nothing never started it over, so after a few incidents, however far
/// apart, each rejoin waited up to twice the lease duration.)
#[test]
fn run_each_term_rejoins_promptly_after_losses_far_apart() {
    paused(async {
        let fake = free();
        let (e, id) = elector(&fake, config("me"));
        let mut status = e.subscribe();
        let run = tokio::spawn({
            let e = e.clone();
            async move { e.run_each_term(futures::stream::pending::<()>).await }
        });
        timeout(S(5), status.wait_for(|s| s.is_leader))
            .await
            .expect("led")
            .unwrap();
        for round in 0..6 {
            sleep(S(300)).await;
            fake.partition(id, true);
            sleep(S(12)).await;
            assert!(!e.is_leader(), "round {round}: still leading after the cut");
            fake.partition(id, false);
            timeout(S(5), status.wait_for(|s| s.is_leader))
                .await
                .unwrap_or_else(|_| panic!("round {round}: not leading 5 s after the cut healed"))
                .unwrap();
        }
        run.abort();
    });
}

// ---- 11. A watch that stalls -------------------------------------------------

/// A candidate's watch stalls (open, but silent: a proxy that stopped
/// forwarding) while another candidate leads and renews; the leader then
/// crashes. The candidate leads within a lease duration and a jittered
/// retry period or two of the leader's last renewal, as a polling client-go
/// candidate does: a held record whose watch went silent for longer than
/// its holder's renewals take is checked with a read. (Before: the stalled
/// watch counted as in sync, so the candidate saw the last renewals only at
/// the conflict of its takeover, one lease duration after the record it
/// last saw, and waited another lease duration from then: up to twice the
/// lease duration.)
#[test]
fn a_candidate_whose_watch_stalls_takes_over_within_a_lease_duration_of_the_last_renewal() {
    for stalled_for in [S(1), S(7), S(13)] {
        paused(async move {
            let fake = free();
            let (a, a_id) = elector(&fake, config("a"));
            let (b, b_id) = elector(&fake, config("b"));
            let guard = a.acquire().await.unwrap();
            let mut b_acquire = Box::pin(b.acquire());
            assert!(timeout(S(3), &mut b_acquire).await.is_err());
            fake.stall_watches(b_id);
            sleep(stalled_for).await;
            // a crashes: cut off for good (its guard ends at its deadline).
            fake.partition(a_id, true);
            let last_renewal = last_sent(&fake, a_id, "update");
            let bound = S(15) + MS(4_400) + S(1);
            let b_guard = timeout(bound, &mut b_acquire)
                .await
                .unwrap_or_else(|_| {
                    panic!(
                        "stalled {stalled_for:?}: b did not lead within {bound:?} of a's last renewal \
                         ({:?} ago)",
                        last_renewal.elapsed()
                    )
                })
                .unwrap();
            assert!(b_guard.is_valid());
            drop(guard);
        });
    }
}

/// The same stall is told in the follower's log, once: a watch silent for
/// two retry periods while a read shows the Lease changed since its last
/// item. (Before: nothing was logged; the follower polled silently, its watch
/// dead for good.)
#[test]
fn a_stalled_watch_is_warned_once() {
    let logs = crate::tests::support::logs_during(tracing::Level::WARN, || {
        paused(async {
            let fake = free();
            let (a, _) = elector(&fake, config("a"));
            let (b, b_id) = elector(&fake, config("b"));
            let _guard = a.acquire().await.unwrap();
            let mut b_acquire = Box::pin(b.acquire());
            assert!(timeout(S(3), &mut b_acquire).await.is_err());
            fake.stall_watches(b_id);
            assert!(timeout(S(30), &mut b_acquire).await.is_err(), "b led beside a");
        });
    });
    let warned = logs.matches("lease watch delivered nothing").count();
    assert_eq!(warned, 1, "expected one warning of the stalled watch:\n{logs}");
    // A healthy watch silent because the holder died is not warned.
    let logs = crate::tests::support::logs_during(tracing::Level::WARN, || {
        paused(async {
            let fake = free();
            let (a, a_id) = elector(&fake, config("a"));
            let (b, _) = elector(&fake, config("b"));
            let _guard = a.acquire().await.unwrap();
            let mut b_acquire = Box::pin(b.acquire());
            assert!(timeout(S(3), &mut b_acquire).await.is_err());
            fake.partition(a_id, true);
            let b_guard = timeout(S(30), &mut b_acquire)
                .await
                .expect("b never led")
                .unwrap();
            assert!(b_guard.is_valid());
        });
    });
    assert!(
        !logs.contains("lease watch delivered nothing"),
        "a healthy watch was warned as stalled:\n{logs}"
    );
}

// ---- 12. A term ended during a renewal ---------------------------------------

/// A leader shuts down (its work already ended) while a renewal is in
/// flight on a slow API server: the handover does not wait for that
/// renewal's answer, nor for the read that follows a renewal answered 409
/// or 404. The request is abandoned, the Lease released at once,
/// and a watching standby leads within a second, as a client-go leader's
/// `ReleaseOnCancel` hands over (its cancelled context ends the request in
/// flight). The abandoned write may still land: it carries the old
/// resourceVersion, so it cannot overwrite the release. (Before: the
/// release waited for the renewal's answer, up to the renew deadline, with
/// nobody leading.)
#[test]
fn a_shutdown_during_a_slow_renewal_hands_over_at_once() {
    hands_over_at_once_during_a_slow_renewal(true);
}

/// The same when the leader's last guard is dropped (its work ended, and
/// nobody waits to acquire) during a slow renewal, or its read: the term is
/// given up at once, without a shutdown. (Before: the release waited for the
/// request's answer, up to the renew deadline, with the Lease held by a
/// candidate that no longer wanted it.)
#[test]
fn the_last_guard_dropped_during_a_slow_renewal_hands_over_at_once() {
    hands_over_at_once_during_a_slow_renewal(false);
}

/// A leads, b waits; a's next renewal is slow (or answered 409 or 404, and
/// the read that follows is slow); a's guard is dropped, then a shuts down
/// if `shutdown`: b leads within a second of it.
fn hands_over_at_once_during_a_slow_renewal(shutdown: bool) {
    let slow_read = |first: Fault| vec![("update", first), ("get", Fault::DelayResponse(S(5)))];
    for slow in [
        vec![("update", Fault::DelayResponse(S(5)))],
        vec![("update", Fault::DelayRequest(S(5)))],
        vec![("update", Fault::DelayResponse(S(9)))],
        slow_read(Fault::Status(409)),
        slow_read(Fault::Status(404)),
    ] {
        paused(async move {
            let fake = free();
            let (a, a_id) = elector(&fake, config("a"));
            let (b, _) = elector(&fake, config("b"));
            let guard = a.acquire().await.unwrap();
            let b_led = tokio::spawn(async move {
                let g = b.acquire().await.unwrap();
                (Instant::now(), g)
            });
            sleep(S(3)).await;
            assert!(!b_led.is_finished());
            for (verb, fault) in slow.clone() {
                fake.fault(a_id, Some(verb), fault);
            }
            sleep(MS(1500)).await;
            let began = Instant::now();
            drop(guard);
            if shutdown {
                a.shutdown(S(1)).await.unwrap();
            }
            let (at, b_guard) = timeout(S(30), b_led).await.expect("b never led").unwrap();
            assert!(
                at - began <= S(1),
                "{slow:?}: b led {:?} after a's guard was dropped (shutdown: {shutdown})",
                at - began
            );
            // The abandoned renewal lands, or is refused, and changes nothing.
            sleep(S(10)).await;
            assert!(b_guard.is_valid(), "{slow:?}");
            assert_eq!(holder(&fake).as_deref(), Some("b"), "{slow:?}");
        });
    }
}

// ---- 13. A list served by a cache behind -------------------------------------

/// The leader `a` crashes (cut off for good); 8 s later the follower `b`'s
/// watch expires (410) and its re-list is served by a watch cache one change
/// behind: it shows a's second-to-last renewal, and the watch then delivers
/// the last one again (A-B-A). Nothing was written since a crashed, so b
/// leads within a lease duration and a jittered retry period or two of a's
/// last renewal, as with an up-to-date re-list (`stale: false`). (Before:
/// each record counted as a change, the last one's clock restarted at the
/// re-list, and b led up to a lease duration later.)
#[test]
fn a_stale_re_list_does_not_restart_a_followers_expiry_clock() {
    for stale in [false, true] {
        paused(async move {
            let fake = free();
            let (a, a_id) = elector(&fake, config("a"));
            let (b, b_id) = elector(&fake, config("b"));
            let guard = a.acquire().await.unwrap();
            let mut b_acquire = Box::pin(b.acquire());
            assert!(timeout(S(5), &mut b_acquire).await.is_err(), "b led beside a");
            fake.partition(a_id, true);
            let last_renewal = last_sent(&fake, a_id, "update");
            sleep(S(8)).await;
            if stale {
                fake.fault(b_id, Some("list"), Fault::StaleList);
            }
            fake.expire_watches();
            let bound = S(15) + MS(4_400) + S(1);
            let b_guard = timeout(S(60), &mut b_acquire)
                .await
                .expect("b never led")
                .unwrap();
            let led = last_renewal.elapsed();
            assert!(
                led <= bound,
                "stale re-list {stale}: b led {led:?} after a's last renewal (bound {bound:?})"
            );
            assert!(b_guard.is_valid());
            drop(guard);
        });
    }
}

/// The same, for a follower that joined after the leader's last renewal: its
/// first read (a GET, from etcd) showed the last record, and the watch's
/// re-list, served by a cache one change behind, is the first it sees of the
/// record before it: an older version first seen after the newest one. The
/// last record, delivered again by the watch, is no change either: nothing
/// was written since the read. (Before: the older record, the last one
/// first seen, counted as the newest, and the newest one's clock restarted
/// when the watch delivered it again.)
#[test]
fn a_stale_re_list_after_a_late_join_does_not_restart_the_expiry_clock() {
    for stale in [false, true] {
        paused(async move {
            let fake = free();
            let (a, a_id) = elector(&fake, config("a"));
            let (b, b_id) = elector(&fake, config("b"));
            let guard = a.acquire().await.unwrap();
            sleep(S(5)).await;
            fake.partition(a_id, true);
            let last_renewal = last_sent(&fake, a_id, "update");
            // b joins now: its first read shows a's last renewal.
            let mut b_acquire = Box::pin(b.acquire());
            assert!(timeout(S(8), &mut b_acquire).await.is_err(), "b led within 8 s");
            if stale {
                fake.fault(b_id, Some("list"), Fault::StaleList);
            }
            fake.expire_watches();
            let bound = S(15) + MS(4_400) + S(1);
            let b_guard = timeout(S(60), &mut b_acquire)
                .await
                .expect("b never led")
                .unwrap();
            let led = last_renewal.elapsed();
            assert!(
                led <= bound,
                "stale re-list {stale}: b (joined after a's last renewal) led {led:?} after it (bound {bound:?})"
            );
            assert!(b_guard.is_valid());
            drop(guard);
        });
    }
}

// ---- 14. A free Lease reserved for someone who never comes ---------------------

/// A free Lease (holder `""`) whose `preferredHolder` names a candidate that
/// never comes, with the longest `leaseDurationSeconds` (written by hand or
/// by a tool; the API server keeps `preferredHolder` with the
/// `CoordinatedLeaderElection` gate on). A non-coordinated client-go
/// candidate takes a free Lease at once; the crate gives the preferred
/// holder one lease duration first (crate docs, *Liveness*), but a free
/// record's duration is nobody's promise (a release writes 1 s): waiting the
/// record's 2^31-1 s leaves the Lease without a leader for 68 years.
#[test]
fn a_free_lease_reserved_for_a_candidate_that_never_comes_with_the_longest_duration_gets_a_leader() {
    paused(async {
        let fake = free();
        let mut lease = fake.lease().unwrap();
        let spec_ = lease.spec.as_mut().unwrap();
        spec_.lease_duration_seconds = Some(i32::MAX);
        spec_.strategy = Some("OldestEmulationVersion".to_owned());
        spec_.preferred_holder = Some("ghost".to_owned());
        fake.put(lease);
        let (a, _) = elector(&fake, config("a"));
        let led = timeout(S(60), a.acquire()).await;
        assert!(
            matches!(led, Ok(Ok(_))),
            "a did not take the free Lease reserved for a ghost within 60 s (holder {:?})",
            holder(&fake)
        );
    });
}

/// Others' annotations that leave the fencing token no room under the API
/// server's 256 KiB limit: the takeover keeps the annotations it read (the
/// API server would refuse the token at every attempt, and the Lease would
/// have no leader), with a warning; any that leave room (here 200 KiB, and
/// exactly the token's size: the API server refuses only more than the
/// limit) get the token as always. (The double enforces no limit: this pins
/// the candidate's side of it; `tests/tests/never_none.rs` shows the API
/// server's.)
#[test]
fn a_takeover_writes_the_token_unless_others_annotations_leave_it_no_room() {
    let key = "example.com/state";
    // A takeover of a free Lease whose annotations are `key` with a value of
    // `len` bytes: the token it wrote, if any, and the warnings.
    let take = |len: usize| {
        let mut token = None;
        let logs = crate::tests::support::logs_during(tracing::Level::WARN, || {
            paused(async {
                let fake = free();
                let mut lease = fake.lease().unwrap();
                lease.metadata.annotations = Some([(key.to_owned(), "x".repeat(len))].into());
                fake.put(lease);
                let (a, _) = elector(&fake, config("a"));
                let _guard = timeout(S(10), a.acquire()).await.unwrap().unwrap();
                let annotations = fake.lease().unwrap().metadata.annotations.unwrap();
                assert!(annotations.contains_key(key));
                token = annotations.get(record::TOKEN_ANNOTATION).cloned();
            });
        });
        (token, logs)
    };
    let (token, logs) = take(200 * 1024);
    let token = token.unwrap_or_else(|| panic!("200 KiB: no token written: {logs}"));
    let exact = record::MAX_ANNOTATIONS_SIZE - key.len() - record::TOKEN_ANNOTATION.len() - token.len();
    for (len, stored) in [(exact, true), (exact + 1, false), (256 * 1024, false)] {
        let (written, logs) = take(len);
        assert_eq!(written.is_some(), stored, "a {len}-byte value: token {written:?}");
        assert_eq!(
            logs.contains("leave no room for the fencing token"),
            !stored,
            "a {len}-byte value: {logs}"
        );
    }
}

// ---- 15. A cache behind the creation; a release answered 409; slow renewals ---

/// A follower that joined just after the Lease was created: its first read
/// (a GET, from etcd) shows the Lease, and its watch's list, served by a
/// cache behind the creation, shows none. The same object (same uid) then
/// delivered by the watch was never deleted: its holder's graceful release
/// is taken within a watch event and a write, with no creation hold. (Before:
/// the list's "missing" counted as the object going away while held, and the
/// takeover held the same, never deleted, Lease for a whole lease duration.)
#[test]
fn a_stale_list_from_before_the_leases_creation_does_not_hold_a_handover() {
    paused(async {
        let fake = FakeLeaseApi::default();
        // a creates the Lease and leads at once (as client-go, or
        // `creation_hold(false)`, does).
        let (a, _) = elector(&fake, config("a").creation_hold(false));
        let (b, b_id) = elector(&fake, config("b"));
        let guard = a.acquire().await.unwrap();
        // b joins before a's first renewal: the list of its watch is served
        // as of before the creation.
        fake.fault(b_id, Some("list"), Fault::StaleList);
        let mut b_acquire = pin!(b.acquire());
        assert!(timeout(S(5), &mut b_acquire).await.is_err(), "b led beside a");
        assert_eq!(holder(&fake).as_deref(), Some("a"));
        drop(guard);
        let released = Instant::now();
        a.shutdown(S(1)).await.unwrap();
        let after = holder(&fake);
        assert!(
            matches!(after.as_deref(), Some("" | "b")),
            "a did not release: {after:?}"
        );
        let b_guard = timeout(S(60), &mut b_acquire)
            .await
            .expect("b never led")
            .unwrap();
        let took = released.elapsed();
        assert!(
            took <= S(1),
            "b led {took:?} after a's release of a Lease that was never deleted (a creation hold)"
        );
        assert!(b_guard.is_valid());
    });
}

/// A release applied but answered 409 (its 504 retried by the client, the
/// retry meeting our own release) was a release: the shutdown says so, and
/// does not log that the Lease no longer held our record (the record read
/// back is exactly our release). (Before: `not releasing: the lease no
/// longer holds our term's record`, for a Lease we had just released.)
#[test]
fn a_release_applied_but_answered_409_is_logged_as_a_release() {
    let logs = crate::tests::support::logs_during(tracing::Level::INFO, || {
        paused(async {
            let fake = free();
            let (e, id) = elector(&fake, config("me"));
            let guard = e.acquire().await.unwrap();
            drop(guard);
            fake.fault(id, Some("update"), Fault::AppliedThenStatus(409));
            e.shutdown(S(1)).await.unwrap();
            assert_eq!(holder(&fake).as_deref(), Some(""), "released");
        });
    });
    assert!(!logs.contains("not releasing"), "{logs}");
    assert!(logs.contains("released lease"), "{logs}");
}

/// A leader whose renewals are answered in 6 s (an API server or etcd under
/// load), within the 10 s renew deadline of each but slower than half of
/// it: each renewal carries the answer to the one before, so the second
/// lands after the first one's deadline and the term ends (crate docs,
/// *Timings*; client-go's leader keeps leading). What is asked: a warning at
/// the first slow renewal, before the term ends, naming the rule; never two
/// (b does not lead while a's term holds); and a takes its own record back.
#[test]
fn a_renewal_slower_than_half_the_renew_deadline_is_warned_before_the_term_ends() {
    // Exactly half (two round trips end at the deadline) and more.
    for latency in [S(5), S(6)] {
        let logs = crate::tests::support::logs_during(tracing::Level::WARN, || {
            paused(async {
                let fake = free();
                let (a, a_id) = elector(&fake, config("a"));
                let (b, _) = elector(&fake, config("b"));
                let guard = a.acquire().await.unwrap();
                let mut b_acquire = pin!(b.acquire());
                fake.set_latency(a_id, latency);
                let lost = tokio::select! {
                    lost = guard => lost,
                    _ = &mut b_acquire => panic!("b led while a's term held"),
                    () = tokio::time::sleep(S(60)) => panic!("a's term outlived its slow renewals"),
                };
                assert_eq!(lost, Lost::RenewDeadlineExceeded);
                // Never none: once the answers are fast again, one of them leads.
                fake.set_latency(a_id, S(0));
                let led = first_to_lead(pin!(a.acquire()), b_acquire, S(30)).await;
                assert!(
                    matches!(led, Some(Ok(_))),
                    "nobody led: {led:?}, holder {:?}",
                    holder(&fake)
                );
            });
        });
        let warned = logs
            .find("half the renew deadline or more")
            .unwrap_or_else(|| panic!("{latency:?}: no warning"));
        let ended = logs.find("giving the term up").unwrap_or(logs.len());
        assert!(
            warned < ended,
            "{latency:?}: the warning came after the term ended:\n{logs}"
        );
    }
}

/// Which of two pending acquisitions, `a`'s or `b`'s, completes first within
/// `within` (`None`: neither).
pub(super) async fn first_to_lead(
    a: std::pin::Pin<&mut impl std::future::Future<Output = Result<crate::LeaseGuard, crate::AcquireError>>>,
    b: std::pin::Pin<&mut impl std::future::Future<Output = Result<crate::LeaseGuard, crate::AcquireError>>>,
    within: Duration,
) -> Option<Result<&'static str, crate::AcquireError>> {
    let first = async {
        tokio::select! {
            g = a => g.map(|_| "a"),
            g = b => g.map(|_| "b"),
        }
    };
    timeout(within, first).await.ok()
}

// ---- 16. The watch's lateness, judged by the wall clock ----------------------

/// A record as a holder whose wall clock is `offset` behind this node's
/// writes it now: renewed by `holder`, `renewTime` = now − `offset`.
fn renewed_behind(holder: &str, offset: Duration) -> k8s_openapi::api::coordination::v1::Lease {
    let mut lease = held_by(holder, 15);
    let at = k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(record::now() - offset);
    let spec = lease.spec.as_mut().unwrap();
    spec.acquire_time = Some(at.clone());
    spec.renew_time = Some(at);
    lease
}

/// A Lease left by a holder that died an hour ago (not released) is old,
/// not late: the watch's first item (its list) is the Lease as it is. A
/// candidate starting on it takes it over within a lease duration and
/// jittered retry period, and does not warn of a lagging watch or a clock
/// ahead of the holder's. (Before: `lease watch delivered a record late (or
/// this node's clock is ahead of the holder's)` at every start on a Lease
/// not renewed within the last retry period: a cold start after any
/// downtime, then "delivers in time again" once it led.)
#[test]
fn a_lease_left_long_ago_is_not_warned_as_delivered_late() {
    let logs = crate::tests::support::logs_during(tracing::Level::WARN, || {
        paused(async {
            let fake = FakeLeaseApi::default();
            fake.put(renewed_behind("z", S(3600)));
            let (a, _) = elector(&fake, config("a"));
            let started = Instant::now();
            let guard = timeout(S(15) + MS(4_400) + MS(100), a.acquire())
                .await
                .expect("a did not take over the dead holder's Lease within LD + 2.2 RP")
                .unwrap();
            assert!(
                guard.is_valid(),
                "a's guard is not valid {:?} after it started",
                started.elapsed()
            );
        });
    });
    assert!(
        !logs.contains("delivered a record late"),
        "a Lease renewed an hour ago was warned as delivered late:\n{logs}"
    );
}

/// A holder whose wall clock is a minute behind this node's (so every record
/// it writes looks late here): the follower's watch is not trusted, and it
/// reads before each attempt, as client-go's candidates do, at client-go's
/// pace (one attempt per jittered retry period: 1 to 2.2 RP, 1.6 on
/// average), not one read per renewal delivered. Once the holder dies, the
/// follower still takes over within a lease duration and 2.2 retry periods
/// of its last renewal. (Before: 30 reads in 60 s, one per renewal, 1.6
/// times client-go's.)
#[test]
fn a_follower_ahead_of_the_holders_clock_reads_at_client_gos_pace() {
    paused(async {
        let fake = FakeLeaseApi::default();
        fake.put(renewed_behind("h", S(60)));
        let (b, b_id) = elector(&fake, config("b"));
        let renewing = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let holder_task = tokio::spawn({
            let (fake, renewing) = (fake.clone(), renewing.clone());
            async move {
                while renewing.load(Ordering::SeqCst) {
                    sleep(S(2)).await;
                    let mut lease = renewed_behind("h", S(60));
                    lease.metadata.uid = fake.lease().and_then(|l| l.metadata.uid);
                    fake.put(lease);
                }
            }
        });
        let mut b_acquire = pin!(b.acquire());
        assert!(timeout(S(5), &mut b_acquire).await.is_err(), "b led beside h");
        let since = Instant::now();
        assert!(timeout(S(60), &mut b_acquire).await.is_err(), "b led beside h");
        let reads = count(&fake, b_id, "get", since);
        // client-go: 60 s / 3.2 s ≈ 19 on average; at most 30 if every
        // jitter were 0.
        assert!(
            reads <= 25,
            "b read {reads} times in 60 s beside a live holder (one read per renewal delivered); \
             client-go's candidates read about 19 times (one per 1.6 retry periods on average)"
        );
        renewing.store(false, Ordering::SeqCst);
        holder_task.await.unwrap();
        let died = Instant::now();
        let guard = timeout(S(15) + MS(4_400) + MS(100), &mut b_acquire)
            .await
            .expect("b did not take over within LD + 2.2 RP of h's last renewal")
            .unwrap();
        assert!(guard.is_valid(), "{:?}", died.elapsed());
    });
}

/// A follower whose watch lags 8 s behind a holder whose clock is ahead of
/// this node's by about as much (in paused time the wall clock stands still,
/// so every record the holder writes looks fresh when it is delivered): the
/// lag cannot be seen from `renewTime`, only on this node's monotonic clock,
/// by a version read and then delivered by the watch more than a retry
/// period later. Once the holder dies, the follower takes over within a
/// lease duration and 2.2 retry periods of its last renewal, as client-go's
/// polling candidates do, not the lag later.
#[test]
fn a_lag_hidden_by_a_holders_clock_ahead_does_not_delay_the_takeover() {
    paused(async {
        let fake = FakeLeaseApi::default();
        fake.put(renewed_behind("h", Duration::ZERO));
        let (b, b_id) = elector(&fake, config("b"));
        fake.set_watch_latency(b_id, S(8));
        let renewing = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let holder_task = tokio::spawn({
            let (fake, renewing) = (fake.clone(), renewing.clone());
            async move {
                while renewing.load(Ordering::SeqCst) {
                    sleep(S(2)).await;
                    let mut lease = renewed_behind("h", Duration::ZERO);
                    lease.metadata.uid = fake.lease().and_then(|l| l.metadata.uid);
                    fake.put(lease);
                }
            }
        });
        let mut b_acquire = pin!(b.acquire());
        assert!(timeout(S(60), &mut b_acquire).await.is_err(), "b led beside h");
        renewing.store(false, Ordering::SeqCst);
        holder_task.await.unwrap();
        let died = Instant::now();
        let guard = timeout(S(60), &mut b_acquire)
            .await
            .expect("b did not lead within 60 s of h's death")
            .unwrap();
        let after = died.elapsed();
        assert!(
            after <= S(15) + MS(4_500),
            "b took over {after:?} after h's last renewal (expected within LD + 2.2 RP = 19.4 s, as client-go): \
             its watch, 8 s late, was trusted because h's clock ahead hid the lag"
        );
        assert!(guard.is_valid());
    });
}

// ---- 17. Many candidates on one Lease ----------------------------------------

/// What a fleet of candidates on one Lease did: who led when, and whether two
/// ever held valid guards at once.
#[derive(Default)]
struct Fleet {
    /// The valid guards held now.
    leading: AtomicUsize,
    /// The most held at once.
    most: AtomicUsize,
    /// Each term's candidate index and when it began.
    terms: std::sync::Mutex<Vec<(usize, Instant)>>,
}

/// Starts `n` candidates at the same instant on `fake`, each campaigning
/// again after each term; returns their clients' indices.
fn start_fleet(fake: &FakeLeaseApi, n: usize, fleet: &Arc<Fleet>) -> Vec<usize> {
    (0..n)
        .map(|i| {
            let (e, id) = elector(fake, config(&format!("c{i}")));
            let fleet = fleet.clone();
            tokio::spawn(async move {
                loop {
                    let Ok(guard) = e.acquire().await else { return };
                    let now = fleet.leading.fetch_add(1, Ordering::SeqCst) + 1;
                    fleet.most.fetch_max(now, Ordering::SeqCst);
                    fleet.terms.lock().unwrap().push((i, Instant::now()));
                    let _lost = guard.await;
                    fleet.leading.fetch_sub(1, Ordering::SeqCst);
                }
            });
            id
        })
        .collect()
}

/// The requests of `clients` other than `except` since `since`: how many,
/// and how many of each verb.
fn requests_of(fake: &FakeLeaseApi, clients: &[usize], except: usize, since: Instant) -> (usize, String) {
    let mut by_verb = std::collections::BTreeMap::<&str, usize>::new();
    for r in fake.requests() {
        if r.at >= since && r.client != except && clients.contains(&r.client) {
            *by_verb.entry(r.verb).or_default() += 1;
        }
    }
    (by_verb.values().sum(), format!("{by_verb:?}"))
}

/// Waits up to `bound` for the fleet's term number `terms` to begin.
async fn term_begins(fleet: &Fleet, terms: usize, bound: Duration) -> (usize, Instant) {
    let begun = async {
        loop {
            if let Some(term) = fleet.terms.lock().unwrap().get(terms - 1) {
                return *term;
            }
            sleep(MS(10)).await;
        }
    };
    timeout(bound, begun)
        .await
        .unwrap_or_else(|_| panic!("term {terms} did not begin within {bound:?}"))
}

/// Fifty candidates started at the same instant on a missing Lease, then
/// their leaders cut off for good one after another: exactly one leads at
/// any instant; the first term begins after the creation hold, each next
/// within a lease duration and 2.2 retry periods of the last renewal; one
/// create wins and the others' conflicts cost one read each; the followers
/// make no request beside a live leader, and one re-list and one read each
/// when all their watches end at once.
#[test]
fn fifty_candidates_on_one_lease_take_over_one_after_another_in_bound() {
    paused(async {
        const N: usize = 50;
        let fake = FakeLeaseApi::default();
        let fleet = Arc::new(Fleet::default());
        let start = Instant::now();
        let ids = start_fleet(&fake, N, &fleet);
        term_begins(&fleet, 1, S(15) + MS(4_400) + S(1)).await;
        let (_, started) = requests_of(&fake, &ids, usize::MAX, start);
        let creates = fake.requests().iter().filter(|r| r.verb == "create").count();
        let gets = fake.requests().iter().filter(|r| r.verb == "get").count();
        assert!(
            creates <= N && gets <= 2 * N,
            "{N} candidates started at once on a missing Lease sent {started} until the first term"
        );
        sleep(S(30)).await;
        let (leader, _) = *fleet.terms.lock().unwrap().last().unwrap();
        let quiet = Instant::now();
        sleep(S(60)).await;
        let (idle, verbs) = requests_of(&fake, &ids, ids[leader], quiet);
        assert_eq!(
            idle,
            0,
            "{} followers beside a live leader sent {verbs} in 60 s",
            N - 1
        );
        // Every watch ends at once (410 Gone, as after a compaction).
        let expired = Instant::now();
        fake.expire_watches();
        sleep(S(60)).await;
        let (relisted, verbs) = requests_of(&fake, &ids, ids[leader], expired);
        assert!(
            relisted <= 3 * (N - 1),
            "{} followers sent {verbs} in 60 s after their watches ended",
            N - 1
        );
        for round in 2..=6 {
            let (leader, _) = *fleet.terms.lock().unwrap().last().unwrap();
            let last_renewal = last_sent(&fake, ids[leader], "update");
            fake.partition(ids[leader], true);
            let (next, at) = term_begins(&fleet, round, S(30)).await;
            let after = at - last_renewal;
            assert!(
                after <= S(15) + MS(4_400) + MS(100),
                "term {round}: c{next} took over {after:?} after c{leader}'s last renewal (bound LD + 2.2 RP)"
            );
            sleep(S(10)).await;
        }
        let most = fleet.most.load(Ordering::SeqCst);
        assert_eq!(most, 1, "{most} candidates held valid guards at once");
    });
}

/// Twenty candidates, their leader cut off three times in a row: no
/// follower's healthy watch is warned as stalled. At the takeover every
/// follower reads before its write (its watch silent since the leader
/// died), and a read that comes just after another follower's winning
/// write shows a version the watch has not delivered yet, though it is
/// about to. (Before: up to one such warning per follower and takeover.)
#[test]
fn a_takeover_among_twenty_candidates_warns_no_stalled_watch() {
    let logs = crate::tests::support::logs_during(tracing::Level::WARN, || {
        paused(async {
            let fake = free();
            let fleet = Arc::new(Fleet::default());
            let ids = start_fleet(&fake, 20, &fleet);
            // As on a real API server: answers in a few milliseconds, each
            // client's its own, and watch events a little later.
            for (i, id) in ids.iter().enumerate() {
                fake.set_latency(*id, MS(1 + u64::try_from(i % 7).unwrap()));
                fake.set_watch_latency(*id, MS(10));
            }
            for round in 1..=4 {
                let led = async {
                    while fleet.terms.lock().unwrap().len() < round {
                        sleep(MS(10)).await;
                    }
                };
                timeout(S(30), led)
                    .await
                    .unwrap_or_else(|_| panic!("no term {round} within 30 s"));
                sleep(S(10)).await;
                if round < 4 {
                    let (leader, _) = *fleet.terms.lock().unwrap().last().unwrap();
                    fake.partition(ids[leader], true);
                }
            }
        });
    });
    let warned = logs.matches("lease watch delivered nothing").count();
    assert_eq!(
        warned, 0,
        "{warned} warnings of a stalled watch on healthy watches:\n{logs}"
    );
}
