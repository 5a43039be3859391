//! Rust candidates (the `candidate` binary) and client-go candidates
//! (`goelect`) on one Lease, with the same short timings ([`Timings::FAST`],
//! except the tests of candidates with different timings):
//! each takes over from the other after expiry (SIGKILL) and after release
//! (SIGTERM), and they never both lead (the interval check of every run, see
//! `kube_runtime_lease_harness::check_log`; goelect stamps its events with the
//! same `CLOCK_MONOTONIC`).
//!
//! client-go polls: a follower tries every retry period times 1 to 2.2
//! (`JitterFactor` 1.2), so its takeovers come up to that much later than a
//! watch-driven Rust candidate's.
//!
//! client-go also notices a new version of the Lease only if it differs with
//! its times cut to whole seconds (it compares the JSON of a
//! `LeaderElectionRecord`, whose times are `metav1.Time`): a renewal in the
//! same wall-clock second as the version before it does not restart its
//! clock, so it can take over up to that renewal's distance from the previous
//! one (here at most one retry period) before the lease expired. The checks
//! allow exactly that for client-go takers, and print a note when it happens.

use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use kube_runtime_lease_harness::{
    EventLog, Fixture, Flavor, Kind, Process, Runs, Sig, Timings, fmt_delta, fmt_ms, go_candidate, ns,
    serial, wait_seen_by,
};

/// Runs of each scenario.
const RUNS: usize = 3;
const T: Timings = Timings::FAST;
/// client-go's `JitterFactor`.
const JITTER: f64 = 1.2;

/// The longest a polling client-go follower waits between two attempts.
fn go_poll() -> Duration {
    T.retry_period.mul_f64(1.0 + JITTER)
}

/// Kills `victim` (the leader) and waits for the next leader, which must take
/// over no earlier than the lease duration after the victim's last renewal
/// (at most one retry period, plus a round trip, before the kill) and no
/// later than `latest` after the kill. Returns a description of the takeover
/// and the new leader.
async fn kill_and_check_takeover(
    log: &EventLog,
    victim: &mut Process,
    latest: Duration,
) -> Result<(String, String)> {
    let killed = victim.kill().await?;
    let next = log
        .next_leader(killed, victim.name(), latest + Duration::from_secs(3))
        .await?;
    let delay = next.at - killed;
    let renewed = log.last_write_seen(victim.name(), killed).unwrap_or(killed);
    // The victim's last renewal was at most one retry period (plus a round
    // trip) before the kill. A client-go taker may miss it, though: it
    // compares records with their times cut to whole seconds, and at a
    // 0.5 s retry period two renewals can fall in one second.
    let unseen = match log.flavor_of(&next.process) {
        Some(Flavor::Go) => T.retry_period * 2,
        _ => T.retry_period,
    };
    ensure!(
        delay
            >= ns(T
                .lease_duration
                .saturating_sub(unseen + Duration::from_millis(50))),
        "{} took over {} after {} was killed: before the lease duration since {}'s last renewal could have passed",
        next.process,
        fmt_ms(delay),
        victim.name(),
        victim.name()
    );
    ensure!(
        delay <= ns(latest),
        "{} took over only {} after {} was killed (expected within {latest:?})",
        next.process,
        fmt_ms(delay),
        victim.name()
    );
    Ok((
        format!(
            "{} {} ({} after {}'s last renewal was seen)",
            next.process,
            fmt_ms(delay),
            fmt_ms(next.at - renewed),
            victim.name()
        ),
        next.process,
    ))
}

/// One round trip through every hand-over between the implementations:
///
/// 1. Rust `r1` leads; client-go `g1` takes over after `r1` is `SIGKILLed`;
/// 2. Rust `r2` takes over after `g1` is `SIGKILLed`;
/// 3. client-go `g2` takes over after `r2` releases on SIGTERM;
/// 4. Rust `r3` takes over after `g2` releases on SIGTERM.
async fn handovers_run(ctx: &Fixture, log: &EventLog) -> Result<String> {
    let lease = ctx.lease(log, "mixed").await?;
    let mut notes = Vec::new();

    // 1. Rust -> client-go, by expiry.
    let mut r1 = ctx.spawn_rust(log, &lease, "r1", T, None)?;
    log.wait_for("r1 to lead", Duration::from_secs(30), |e| {
        e.kind == Kind::StartedLeading && e.process == "r1"
    })
    .await?;
    let mut g1 = ctx.spawn_go(log, &lease, "g1", T)?;
    wait_seen_by(log, &["g1"], "r1", 0, Duration::from_secs(15)).await?;
    let latest = T.lease_duration + go_poll() + Duration::from_millis(500);
    let (took, next) = kill_and_check_takeover(log, &mut r1, latest).await?;
    ensure!(next == "g1", "{next} took over from r1, expected g1");
    notes.push(format!("r1 killed -> {took}"));

    // 2. client-go -> Rust, by expiry.
    let mut r2 = ctx.spawn_rust(log, &lease, "r2", T, None)?;
    wait_seen_by(log, &["r2"], "g1", 0, Duration::from_secs(15)).await?;
    let latest = T.lease_duration + Duration::from_secs(1);
    let (took, next) = kill_and_check_takeover(log, &mut g1, latest).await?;
    ensure!(next == "r2", "{next} took over from g1, expected r2");
    notes.push(format!("g1 killed -> {took}"));

    // 3. Rust -> client-go, by release. The Rust candidate keeps working for
    // its 5 s grace, then releases; goelect notices at its next poll.
    let mut g2 = ctx.spawn_go(log, &lease, "g2", T)?;
    wait_seen_by(log, &["g2"], "r2", 0, Duration::from_secs(15)).await?;
    let termed = r2.signal(Sig::Term)?;
    let stop = log.stopped_leading("r2", termed, Duration::from_secs(10)).await?;
    ensure!(
        stop.detail.contains("Shutdown"),
        "r2 stopped for {:?}, expected Shutdown",
        stop.detail
    );
    let next = log.next_leader(termed, "r2", Duration::from_secs(10)).await?;
    ensure!(
        next.process == "g2",
        "{} took over from r2, expected g2",
        next.process
    );
    let status = r2.wait_exit(Duration::from_secs(10)).await?;
    ensure!(status.success(), "r2 exited with {status}");
    let handover = next.at.saturating_sub(stop.at);
    let bound = go_poll() + Duration::from_millis(500);
    ensure!(
        handover <= ns(bound),
        "g2 took over {} after r2 stopped leading (expected within one client-go poll, {bound:?}, well before the lease duration)",
        fmt_ms(handover)
    );
    notes.push(format!("r2 released -> g2 {}", fmt_ms(handover)));

    // 4. client-go -> Rust, by release: goelect releases at once on SIGTERM
    // and the Rust candidate, watching, takes the free Lease at once.
    let mut r3 = ctx.spawn_rust(log, &lease, "r3", T, None)?;
    wait_seen_by(log, &["r3"], "g2", 0, Duration::from_secs(15)).await?;
    let termed = g2.signal(Sig::Term)?;
    let next = log.next_leader(termed, "g2", Duration::from_secs(10)).await?;
    ensure!(
        next.process == "r3",
        "{} took over from g2, expected r3",
        next.process
    );
    let g2_stop = log.stopped_leading("g2", termed, Duration::from_secs(10)).await?;
    let status = g2.wait_exit(Duration::from_secs(10)).await?;
    ensure!(status.success(), "g2 exited with {status}");
    let handover = next.at - termed;
    ensure!(
        handover <= ns(Duration::from_secs(1)),
        "r3 took over {} after g2 got SIGTERM (expected within 1 s: goelect releases at once, r3 watches)",
        fmt_ms(handover)
    );
    notes.push(format!(
        "g2 SIGTERM -> r3 {} (g2 printed stopped-leading at {} from r3's start)",
        fmt_ms(handover),
        fmt_delta(next.at, g2_stop.at)
    ));
    r3.kill().await?;
    Ok(notes.join(", "))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_and_client_go_hand_over_both_ways() -> Result<()> {
    let _serial = serial().await;
    let ctx = Fixture::new().await?;
    let mut runs = Runs::new("Rust <-> client-go hand-overs (expiry and release)");
    for i in 0..RUNS {
        let log = EventLog::new();
        let result = handovers_run(&ctx, &log).await;
        runs.record(i, result, &log);
    }
    runs.finish()
}

/// Two Rust and two client-go candidates race for one Lease; the leader is
/// `SIGKILLed` three times in a row: each time one of the others takes over,
/// never before the lease could have expired, and never two at once.
async fn race_run(ctx: &Fixture, log: &EventLog) -> Result<String> {
    let lease = ctx.lease(log, "race").await?;
    let procs = vec![
        ctx.spawn_rust(log, &lease, "r1", T, None)?,
        ctx.spawn_go(log, &lease, "g1", T)?,
        ctx.spawn_rust(log, &lease, "r2", T, None)?,
        ctx.spawn_go(log, &lease, "g2", T)?,
    ];
    kill_leaders(log, procs, 3, Duration::from_millis(500)).await
}

/// Waits for a first leader among `procs`, then `SIGKILLs` the leader
/// `kills` times in a row, once every other candidate saw it lead: each
/// time one of the others must take over within the lease duration, one
/// client-go poll and `slack` (`kill_and_check_takeover`). Returns who led
/// and who took over from whom.
async fn kill_leaders(
    log: &EventLog,
    mut procs: Vec<Process>,
    kills: usize,
    slack: Duration,
) -> Result<String> {
    let first = log
        .wait_for("a first leader", Duration::from_secs(30), |e| {
            e.kind == Kind::StartedLeading
        })
        .await?;
    let mut leader = first.process;
    let mut notes = vec![format!("{leader} first")];
    for _ in 0..kills {
        let others: Vec<String> = procs
            .iter()
            .map(|p| p.name().to_owned())
            .filter(|n| *n != leader)
            .collect();
        let others: Vec<&str> = others.iter().map(String::as_str).collect();
        wait_seen_by(log, &others, &leader, 0, Duration::from_secs(15)).await?;
        let i = procs
            .iter()
            .position(|p| p.name() == leader)
            .context("the leader's process")?;
        let mut victim = procs.remove(i);
        let latest = T.lease_duration + go_poll() + slack;
        let (took, next) = kill_and_check_takeover(log, &mut victim, latest).await?;
        notes.push(format!("{leader} killed -> {took}"));
        leader = next;
    }
    Ok(notes.join(", "))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_and_client_go_race_after_kills() -> Result<()> {
    let _serial = serial().await;
    let ctx = Fixture::new().await?;
    let mut runs = Runs::new("two Rust + two client-go candidates, leader killed 3 times");
    for i in 0..RUNS {
        let log = EventLog::new();
        let result = race_run(&ctx, &log).await;
        runs.record(i, result, &log);
    }
    runs.finish()
}

/// A client-go candidate started with the identity of the Rust leader (two
/// replicas given one identity, a restarted pod whose predecessor still
/// runs) does not take the Lease over: it sees its identity on the record
/// and renews it as its own. The Rust leader's term ends at the first record
/// of its term that it did not renew itself (a `renewTime` it did not
/// write), and it does not lead again while the other renews: the two never
/// go on leading together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_go_candidate_with_the_rust_leaders_identity_ends_its_term() -> Result<()> {
    let _serial = serial().await;
    let ctx = Fixture::new().await?;
    let log = EventLog::new();
    let lease = ctx.lease(&log, "one-identity").await?;
    let _rust = ctx.spawn_rust(&log, &lease, "x", T, None)?;
    let led = log
        .wait_for("the Rust x leads", Duration::from_secs(30), |e| {
            e.process == "x" && e.kind == Kind::StartedLeading
        })
        .await?;
    let go = go_candidate(&ctx.goelect, ctx.env.kubeconfig_path(), &lease, "x", T);
    let _go = Process::spawn("x-go", Flavor::Go, go, &log)?;
    let go_led = log
        .wait_for("client-go's x leads", Duration::from_secs(30), |e| {
            e.process == "x-go" && e.kind == Kind::StartedLeading
        })
        .await?;
    let stopped = log
        .wait_for("the Rust x stops leading", T.retry_period * 4, |e| {
            e.process == "x" && e.kind == Kind::StoppedLeading && e.seq > led.seq
        })
        .await?;
    let overlap = stopped.at.saturating_sub(go_led.at);
    ensure!(
        overlap <= ns(T.retry_period * 2),
        "the Rust x went on leading {} after client-go's x began renewing its record",
        fmt_ms(overlap)
    );
    // It campaigns again, and waits the other's record out like anyone
    // else's: it is renewed, so the Rust x does not lead again.
    let again = log
        .wait_for("the Rust x leads again", T.lease_duration * 3, |e| {
            e.process == "x" && e.kind == Kind::StartedLeading && e.seq > stopped.seq
        })
        .await;
    ensure!(
        again.is_err(),
        "the Rust x led again while client-go's x renewed the Lease"
    );
    Ok(())
}

/// A rollout that changes the timings, next to client-go: candidates of
/// both implementations with different lease durations, renew deadlines
/// and retry periods on one Lease. Each taker must go by the record's
/// duration (the holder's), whoever it is; the leader is killed and
/// sent SIGTERM in turn, and no two candidates ever lead at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_and_client_go_candidates_with_different_timings_never_lead_together() -> Result<()> {
    let _serial = serial().await;
    let ctx = Fixture::new().await?;
    let log = EventLog::new();
    let lease = ctx.lease(&log, "timings").await?;
    let t = |ld: u64, rd: u64, rp: u64| Timings {
        lease_duration: Duration::from_secs(ld),
        renew_deadline: Duration::from_millis(rd),
        retry_period: Duration::from_millis(rp),
    };
    let mut procs = vec![
        ctx.spawn_rust(&log, &lease, "r-fast", T, None)?,
        ctx.spawn_go(&log, &lease, "g-slow", t(5, 3500, 1000))?,
        ctx.spawn_rust(&log, &lease, "r-slow", t(4, 3000, 1000), None)?,
        ctx.spawn_go(&log, &lease, "g-fast", t(3, 2000, 500))?,
    ];
    let first = log
        .wait_for("a first leader", Duration::from_secs(30), |e| {
            e.kind == Kind::StartedLeading
        })
        .await?;
    let mut leader = first.process;
    for round in 0..3 {
        let others: Vec<String> = procs
            .iter()
            .map(|p| p.name().to_owned())
            .filter(|n| *n != leader)
            .collect();
        let others: Vec<&str> = others.iter().map(String::as_str).collect();
        wait_seen_by(&log, &others, &leader, 0, Duration::from_secs(20))
            .await
            .with_context(|| log.dump())?;
        let i = procs.iter().position(|p| p.name() == leader).context("leader")?;
        let mut victim = procs.remove(i);
        let at = if round % 2 == 0 {
            victim.kill().await?
        } else {
            victim.signal(Sig::Term)?
        };
        let next = log
            .next_leader(at, victim.name(), Duration::from_secs(15))
            .await
            .with_context(|| log.dump())?;
        if round % 2 == 1 {
            victim.wait_exit(Duration::from_secs(15)).await?;
        }
        leader = next.process;
    }
    kube_runtime_lease_harness::check_log(&log).with_context(|| log.dump())?;
    Ok(())
}

/// Sets `leaseTransitions` of `lease`'s current record to `to`, keeping the
/// rest (`kubectl edit`: a read and a replace), retried on conflict.
async fn edit_transitions(
    api: &kube::Api<k8s_openapi::api::coordination::v1::Lease>,
    name: &str,
    to: i32,
) -> Result<()> {
    for _ in 0..20 {
        let mut lease = api.get(name).await?;
        lease.spec.get_or_insert_with(Default::default).lease_transitions = Some(to);
        match api.replace(name, &kube::api::PostParams::default(), &lease).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
    }
    anyhow::bail!("could not edit leaseTransitions of {name}: 20 conflicts")
}

/// Never none, next to client-go: a Lease restored from a backup (or edited)
/// with `leaseTransitions` at `i32::MAX` cannot be taken by client-go (its
/// takeover writes the count plus one, which overflows int32 into a negative
/// value the API server refuses). An admin sets the count back down. From
/// then on a client-go candidate must be able to take the Lease over from a
/// Rust leader again, as it would in a fleet of client-go candidates alone:
/// a Rust candidate's takeover must not write `i32::MAX` back because it
/// once saw that value on the Lease's name. The fleet then loses its last
/// Rust candidate (a rollout to the Go implementation, a crash loop), and
/// the client-go candidate must lead within a lease duration and its poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_go_candidate_takes_over_after_leases_transitions_were_set_back_from_i32_max() -> Result<()>
{
    let _serial = serial().await;
    let ctx = Fixture::new().await?;
    let log = EventLog::new();
    let lease = ctx.lease(&log, "transitions").await?;
    let api = lease.api(ctx.client.clone());
    edit_transitions(&api, &lease.name, i32::MAX).await?;
    let mut rust = vec![
        ctx.spawn_rust(&log, &lease, "r1", T, None)?,
        ctx.spawn_rust(&log, &lease, "r2", T, None)?,
    ];
    let first = log
        .wait_for("a Rust candidate leads", Duration::from_secs(30), |e| {
            e.kind == Kind::StartedLeading
        })
        .await?;
    let _g = ctx.spawn_go(&log, &lease, "g", T)?;
    wait_seen_by(&log, &["g"], &first.process, 0, Duration::from_secs(15)).await?;
    // The admin sets the count back down; the leader renews on it.
    edit_transitions(&api, &lease.name, 1).await?;
    let fixed = log.note("leaseTransitions set back to 1");
    log.wait_for("a renewal after the edit", Duration::from_secs(5), |e| {
        e.kind == Kind::Record
            && e.at > fixed
            && e.who == first.process
            && e.detail.contains("transitions=1 ")
    })
    .await
    .with_context(|| log.dump())?;
    // A rollout: the Rust leader is shut down and releases; the other Rust
    // candidate takes the Lease at once.
    let i = rust
        .iter()
        .position(|p| p.name() == first.process)
        .context("leader")?;
    let mut leader = rust.remove(i);
    let termed = leader.signal(Sig::Term)?;
    let next = log
        .next_leader(termed, leader.name(), Duration::from_secs(10))
        .await
        .with_context(|| log.dump())?;
    leader.wait_exit(Duration::from_secs(10)).await?;
    let transitions = api.get(&lease.name).await?.spec.and_then(|s| s.lease_transitions);
    // The last Rust candidate goes away (a crash).
    let mut last = rust.pop().context("the other Rust candidate")?;
    ensure!(
        next.process == last.name(),
        "{} took over from {}: {}",
        next.process,
        first.process,
        log.dump()
    );
    let killed = last.kill().await?;
    let latest = T.lease_duration + go_poll() + Duration::from_secs(2);
    let took = log.next_leader(killed, last.name(), latest).await;
    ensure!(
        took.as_ref().is_ok_and(|e| e.process == "g"),
        "the client-go candidate g did not lead within {latest:?} after the last Rust candidate was killed: \
         leaseTransitions {transitions:?} after {}'s takeover (the admin had set it back to 1 from i32::MAX; \
         client-go's takeover writes it plus one, which overflows int32 and is refused), so the Lease has no \
         leader for as long as no Rust candidate runs\n{}",
        next.process,
        log.dump()
    );
    kube_runtime_lease_harness::check_log(&log).with_context(|| log.dump())?;
    Ok(())
}

/// The other way round from the test above: a client-go candidate leads as
/// `x`, and a Rust candidate is started with the same identity (a restarted
/// pod whose predecessor, in Go, still runs). The Rust `x` does not take the
/// record naming its identity for its own: it waits it out, and while the
/// client-go `x` renews it never leads; once the client-go `x` releases it,
/// the Rust `x` takes it at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rust_candidate_with_the_client_go_leaders_identity_does_not_lead_beside_it() -> Result<()> {
    let _serial = serial().await;
    let ctx = Fixture::new().await?;
    let log = EventLog::new();
    let lease = ctx.lease(&log, "one-identity-go").await?;
    let go = go_candidate(&ctx.goelect, ctx.env.kubeconfig_path(), &lease, "x", T);
    let mut go = Process::spawn("x-go", Flavor::Go, go, &log)?;
    let go_led = log
        .wait_for("client-go's x leads", Duration::from_secs(30), |e| {
            e.process == "x-go" && e.kind == Kind::StartedLeading
        })
        .await?;
    let _rust = ctx.spawn_rust(&log, &lease, "x", T, None)?;
    let rust_led = log
        .wait_for("the Rust x leads", T.lease_duration * 4, |e| {
            e.process == "x" && e.kind == Kind::StartedLeading && e.at > go_led.at
        })
        .await;
    ensure!(
        rust_led.is_err(),
        "the Rust x led beside client-go's x: {}",
        log.dump()
    );
    let termed = go.signal(Sig::Term)?;
    let next = log
        .next_leader(termed, "x-go", Duration::from_secs(5))
        .await
        .with_context(|| log.dump())?;
    ensure!(next.process == "x", "{}", log.dump());
    go.wait_exit(Duration::from_secs(10)).await?;
    kube_runtime_lease_harness::check_log(&log).with_context(|| log.dump())?;
    Ok(())
}

/// A mixed fleet at scale: eight Rust and four client-go candidates start at
/// the same instant on a missing Lease (one create wins), then the leader is
/// `SIGKILLed` five times in a row: each time one of the others takes over
/// within the lease duration and one client-go poll (plus slack for twelve
/// processes on the machine), never before the lease could have expired,
/// and never two at once.
async fn mixed_fleet_run(ctx: &Fixture, log: &EventLog) -> Result<String> {
    let lease = ctx.lease(log, "fleet").await?;
    let mut procs = Vec::new();
    for i in 0..8 {
        procs.push(ctx.spawn_rust(log, &lease, &format!("r{i}"), T, None)?);
        if i % 2 == 1 {
            procs.push(ctx.spawn_go(log, &lease, &format!("g{}", i / 2), T)?);
        }
    }
    kill_leaders(log, procs, 5, Duration::from_secs(1)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_rust_and_four_client_go_candidates_take_over_in_bound() -> Result<()> {
    let _serial = serial().await;
    let ctx = Fixture::new().await?;
    let mut runs = Runs::new("eight Rust + four client-go candidates, leader killed 5 times");
    let log = EventLog::new();
    let result = mixed_fleet_run(&ctx, &log).await;
    runs.record(0, result, &log);
    runs.finish()
}

/// client-go's defaults (component-base, controller-runtime).
const LONG: Timings = Timings {
    lease_duration: Duration::from_secs(15),
    renew_deadline: Duration::from_secs(10),
    retry_period: Duration::from_secs(2),
};
/// Short timings, a lease duration under the other side's renew deadline.
const SHORT: Timings = Timings {
    lease_duration: Duration::from_secs(4),
    renew_deadline: Duration::from_secs(3),
    retry_period: Duration::from_secs(1),
};

/// A record's `field=value` in the test's own records ([`Kind::Record`]).
fn record_field(record: &kube_runtime_lease_harness::Entry, name: &str) -> i64 {
    record
        .detail
        .split_whitespace()
        .find_map(|f| f.strip_prefix(name)?.strip_prefix('='))
        .and_then(|v| v.parse().ok())
        .unwrap_or(-1)
}

/// Every version of the Lease in `log`, judged against what each writer
/// must write: its own lease duration (`durations`, by holder) while it
/// holds, 1 s on a release; `leaseTransitions` one more at each change of
/// holder (a release followed by a take counts once, at the take) and kept
/// otherwise.
fn check_records(log: &EventLog, durations: &[(&str, Timings)]) -> Result<()> {
    let records = log.filter(|e| e.kind == Kind::Record);
    let mut problems = Vec::new();
    let mut holder = String::new();
    for pair in records.windows(2) {
        let (prev, r) = (&pair[0], &pair[1]);
        if !prev.who.is_empty() {
            holder.clone_from(&prev.who);
        }
        let expected = if r.who.is_empty() {
            Some(1)
        } else {
            durations
                .iter()
                .find(|(name, _)| *name == r.who)
                .map(|(_, t)| i64::try_from(t.lease_duration.as_secs()).unwrap_or(i64::MAX))
        };
        if expected != Some(record_field(r, "duration")) {
            problems.push(format!(
                "holder {:?} wrote duration {} (expected {expected:?}): {}",
                r.who,
                record_field(r, "duration"),
                r.detail
            ));
        }
        let step = record_field(r, "transitions") - record_field(prev, "transitions");
        let taken = !r.who.is_empty() && r.who != holder;
        if step != i64::from(taken) {
            problems.push(format!(
                "leaseTransitions moved by {step} from {:?} to {:?} (a change of holder: {taken}): {} -> {}",
                prev.who, r.who, prev.detail, r.detail
            ));
        }
    }
    ensure!(problems.is_empty(), "{}", problems.join("\n"));
    Ok(())
}

/// Kills the leader `victim`, whose lease duration is `leader`'s, and waits
/// for `taker` to lead: no earlier than that duration after the victim's last
/// renewal was seen (the test's watch sees a renewal a little after it was
/// written: 100 ms of slack), and no later than `latest` after the kill.
async fn kill_and_expect(
    log: &EventLog,
    victim: &mut Process,
    leader: Timings,
    taker: &str,
    latest: Duration,
) -> Result<String> {
    let killed = victim.kill().await?;
    let next = log
        .next_leader(killed, victim.name(), latest + Duration::from_secs(5))
        .await
        .with_context(|| log.dump())?;
    ensure!(
        next.process == taker,
        "{} took over from {}, expected {taker}",
        next.process,
        victim.name()
    );
    let renewed = log.last_write_seen(victim.name(), killed).unwrap_or(killed);
    let since = next.at.saturating_sub(renewed);
    ensure!(
        since >= ns(leader.lease_duration.saturating_sub(Duration::from_millis(100))),
        "{taker} took over {} after {}'s last renewal was seen: before {}'s lease duration ({:?}) (never two)",
        fmt_ms(since),
        victim.name(),
        victim.name(),
        leader.lease_duration
    );
    let delay = next.at - killed;
    ensure!(
        delay <= ns(latest),
        "{taker} took over only {} after {} was killed (expected within {latest:?}: its lease duration and \
         the taker's poll; never none)",
        fmt_ms(delay),
        victim.name()
    );
    Ok(format!(
        "{} killed -> {taker} {} ({} after the last renewal)",
        victim.name(),
        fmt_ms(delay),
        fmt_ms(since)
    ))
}

/// Sends SIGTERM to the leader `victim` (each implementation releases on
/// it) once `taker` saw it lead, and waits for `taker` to lead within
/// `within` of the victim's `stopped-leading` (client-go's is printed after
/// its release: the SIGTERM counts for it), and for the victim's exit.
async fn release_and_expect(
    log: &EventLog,
    victim: &mut Process,
    taker: &str,
    within: Duration,
) -> Result<String> {
    wait_seen_by(log, &[taker], victim.name(), 0, Duration::from_secs(15)).await?;
    let termed = victim.signal(Sig::Term)?;
    let stopped = match log.flavor_of(victim.name()) {
        Some(Flavor::Go) => termed,
        _ => {
            log.stopped_leading(victim.name(), termed, Duration::from_secs(10))
                .await?
                .at
        }
    };
    let next = log
        .next_leader(termed, victim.name(), within + Duration::from_secs(10))
        .await
        .with_context(|| log.dump())?;
    ensure!(
        next.process == taker,
        "{} took {}'s release, expected {taker}",
        next.process,
        victim.name()
    );
    let handover = next.at.saturating_sub(stopped);
    ensure!(
        handover <= ns(within),
        "{taker} took {}'s release {} after it stopped leading (expected within {within:?})",
        victim.name(),
        fmt_ms(handover)
    );
    let status = victim.wait_exit(Duration::from_secs(10)).await?;
    ensure!(status.success(), "{} exited with {status}", victim.name());
    Ok(format!(
        "{} released -> {taker} {}",
        victim.name(),
        fmt_ms(handover)
    ))
}

/// Candidates of both implementations whose timings differ, one at a time
/// next to each other: client-go's defaults (15/10/2 s) next to short ones
/// (4/3/1 s), a lease duration on one side below the other's renew deadline.
/// A crashed leader is taken over one of the *leader's* lease durations
/// after its last renewal (never before: never two; not much after: never
/// none), whatever the taker's own; a release at once by a Rust follower
/// (it watches), within its poll by a client-go one:
///
/// 1. Rust `r-long` (15 s) killed: client-go `g-short` (4 s) takes over;
/// 2. `g-short` killed: Rust `r-long2` (15 s) takes over after 4 s;
/// 3. `r-long2` released (SIGTERM): client-go `g-long` (15 s) takes it;
/// 4. `g-long` killed: Rust `r-short` (4 s) takes over after 15 s;
/// 5. `r-short` released: client-go `g-short2` (4 s) takes it;
/// 6. `g-short2` released: Rust `r-long3` (15 s) takes it.
///
/// Each writes its own lease duration (1 s on a release), each change of
/// holder counts once in `leaseTransitions`, no two lead at once, and the
/// Rust candidates warn of nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_go_defaults_next_to_short_timings_take_over_by_the_leaders_duration() -> Result<()> {
    let _serial = serial().await;
    let ctx = Fixture::new().await?;
    let log = EventLog::new();
    let lease = ctx.lease(&log, "mixed-timings").await?;
    let mut notes = Vec::new();
    let poll = |t: Timings| t.retry_period.mul_f64(1.0 + JITTER);
    let slack = Duration::from_secs(1);
    // `g…` a client-go candidate, else a Rust one.
    let spawn = |name: &str, t: Timings| {
        if name.starts_with('g') {
            ctx.spawn_go(&log, &lease, name, t)
        } else {
            ctx.spawn_rust(&log, &lease, name, t, None)
        }
    };

    let mut r_long = spawn("r-long", LONG)?;
    log.wait_for("r-long to lead", Duration::from_secs(30), |e| {
        e.kind == Kind::StartedLeading && e.process == "r-long"
    })
    .await?;
    // 1. client-go sees the last renewal at its next poll, and takes the
    // Lease at the first poll after the record's duration from then.
    let mut g_short = spawn("g-short", SHORT)?;
    wait_seen_by(&log, &["g-short"], "r-long", 0, Duration::from_secs(15)).await?;
    let latest = LONG.lease_duration + poll(SHORT) * 2 + slack;
    notes.push(kill_and_expect(&log, &mut r_long, LONG, "g-short", latest).await?);

    // 2. A Rust follower watches: the record's duration after the last
    // renewal it saw, not its own.
    let mut r_long2 = spawn("r-long2", LONG)?;
    wait_seen_by(&log, &["r-long2"], "g-short", 0, Duration::from_secs(15)).await?;
    let latest = SHORT.lease_duration + slack;
    notes.push(kill_and_expect(&log, &mut g_short, SHORT, "r-long2", latest).await?);

    // 3. Our release (shutdown), taken by a client-go follower within its poll.
    let mut g_long = spawn("g-long", LONG)?;
    notes.push(release_and_expect(&log, &mut r_long2, "g-long", poll(LONG) + slack).await?);

    // 4. A client-go leader at 15 s, a Rust follower at 4 s.
    let mut r_short = spawn("r-short", SHORT)?;
    wait_seen_by(&log, &["r-short"], "g-long", 0, Duration::from_secs(15)).await?;
    let latest = LONG.lease_duration + slack;
    notes.push(kill_and_expect(&log, &mut g_long, LONG, "r-short", latest).await?);

    // 5, 6. Releases both ways.
    let mut g_short2 = spawn("g-short2", SHORT)?;
    notes.push(release_and_expect(&log, &mut r_short, "g-short2", poll(SHORT) + slack).await?);
    let _r_long3 = spawn("r-long3", LONG)?;
    notes.push(release_and_expect(&log, &mut g_short2, "r-long3", slack).await?);
    // The new leader's first renewal, so that its own duration is on record.
    let took = log.note("r-long3 leads");
    log.wait_for("r-long3's renewal", Duration::from_secs(10), |e| {
        e.kind == Kind::Record && e.who == "r-long3" && e.at > took
    })
    .await?;

    kube_runtime_lease_harness::check_log(&log).with_context(|| log.dump())?;
    let durations = [
        ("r-long", LONG),
        ("g-short", SHORT),
        ("r-long2", LONG),
        ("g-long", LONG),
        ("r-short", SHORT),
        ("g-short2", SHORT),
        ("r-long3", LONG),
    ];
    check_records(&log, &durations).with_context(|| log.dump_events())?;
    let rust = ["r-long", "r-long2", "r-short", "r-long3"];
    let warnings: Vec<String> = log
        .filter(|e| {
            e.kind == Kind::Stderr
                && rust.contains(&e.process.as_str())
                && (e.detail.contains(" WARN ") || e.detail.contains(" ERROR "))
        })
        .into_iter()
        .map(|e| format!("{}: {}", e.process, e.detail))
        .collect();
    ensure!(warnings.is_empty(), "the Rust candidates warned: {warnings:#?}");
    println!("{}", notes.join(", "));
    Ok(())
}

/// A record's `acquire=` or `renew=` time, as the test's watch printed it.
fn record_time<'a>(record: &'a kube_runtime_lease_harness::Entry, name: &str) -> &'a str {
    record
        .detail
        .split_whitespace()
        .find_map(|f| f.strip_prefix(name)?.strip_prefix('='))
        .unwrap_or("")
}

/// The times of every version of the Lease in `log`, as PROTOCOL.md's
/// record says each write sets them, whichever implementation wrote it: a
/// takeover and a release `acquireTime = renewTime = now` (no earlier than
/// the version before), a renewal keeps `acquireTime` and moves `renewTime`
/// forward.
fn check_times(log: &EventLog) -> Result<()> {
    let records = log.filter(|e| e.kind == Kind::Record);
    let mut problems = Vec::new();
    for pair in records.windows(2) {
        let (prev, r) = (&pair[0], &pair[1]);
        let (acquire, renew) = (record_time(r, "acquire"), record_time(r, "renew"));
        let parse = |t: &str| t.parse::<k8s_openapi::jiff::Timestamp>().ok();
        let renewal = !r.who.is_empty() && r.who == prev.who;
        let fine = if renewal {
            acquire == record_time(prev, "acquire") && parse(renew) > parse(record_time(prev, "renew"))
        } else {
            acquire == renew && parse(acquire) >= parse(record_time(prev, "renew"))
        };
        if !fine {
            let what = if renewal { "renewal" } else { "takeover or release" };
            problems.push(format!("{what} by {:?}: {} -> {}", r.who, prev.detail, r.detail));
        }
    }
    ensure!(problems.is_empty(), "{}", problems.join("\n"));
    Ok(())
}

/// The record each write leaves, field by field, when the two
/// implementations release to each other: a Rust leader releases
/// (SIGTERM) to a client-go follower, which releases to a Rust follower.
/// Both releases write the same record (holder `""`, 1 s, `acquireTime =
/// renewTime = now`, transitions kept), each takeover `acquireTime =
/// renewTime = now` with transitions one more and the taker's duration, and
/// each renewal keeps `acquireTime` and the transitions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releases_and_takeovers_write_the_same_record_in_both_implementations() -> Result<()> {
    let _serial = serial().await;
    let ctx = Fixture::new().await?;
    let log = EventLog::new();
    let lease = ctx.lease(&log, "release-records").await?;
    let slack = Duration::from_secs(1);
    let mut r1 = ctx.spawn_rust(&log, &lease, "r1", T, None)?;
    log.wait_for("r1 to lead", Duration::from_secs(30), |e| {
        e.kind == Kind::StartedLeading && e.process == "r1"
    })
    .await?;
    let mut g1 = ctx.spawn_go(&log, &lease, "g1", T)?;
    release_and_expect(&log, &mut r1, "g1", go_poll() + slack).await?;
    let _r2 = ctx.spawn_rust(&log, &lease, "r2", T, None)?;
    release_and_expect(&log, &mut g1, "r2", slack).await?;
    // Three renewals of r2's.
    log.wait_until("three renewals by r2", T.retry_period * 8, |all| {
        let r2 = all.iter().filter(|e| e.kind == Kind::Record && e.who == "r2");
        (r2.count() >= 4).then_some(())
    })
    .await?;
    // The free Lease the test created, and a release by each.
    let free = log.filter(|e| e.kind == Kind::Record && e.who.is_empty());
    ensure!(free.len() == 3, "the free Lease and two releases: {}", log.dump());
    check_records(&log, &[("r1", T), ("g1", T), ("r2", T)])?;
    check_times(&log).with_context(|| log.dump())
}
