//! etcd restored from an older snapshot under a running election of Rust
//! and client-go candidates, on a real kube-apiserver: the Lease, and etcd's
//! revision, go back to what they were when the snapshot was taken (an
//! etcd restored without `--bump-revision`). Its own binary, since it
//! rewinds the control plane's data.

use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use kube_runtime_lease_harness::{
    EventLog, Fixture, Kind, Runs, Timings, fmt_ms, now_ns, ns, serial, wait_seen_by, wait_settled,
};

const T: Timings = Timings::FAST;

/// Waits until the test's watch has seen the Lease written `n` times after
/// `after` (its [`Kind::Record`] entries).
async fn lease_written(log: &EventLog, after: u64, n: usize, within: Duration) -> Result<()> {
    log.wait_until(
        &format!("{n} writes of the Lease after the snapshot"),
        within,
        |entries| {
            (entries
                .iter()
                .filter(|e| e.kind == Kind::Record && e.at > after)
                .count()
                >= n)
                .then_some(())
        },
    )
    .await
}

/// Two Rust candidates and one of client-go lead through a snapshot of etcd
/// (the control plane stopped for the copy), renew for a while, then etcd is
/// restored from the snapshot: the Lease shows an older record, at an older
/// resourceVersion, and every watch resumes from a version etcd has not
/// reached yet. Exactly one leads again, as soon after the apiserver is
/// ready as after any outage: the restored record waited out for a lease
/// duration, read at client-go's pace.
async fn restore_run(ctx: &Fixture, log: &EventLog) -> Result<String> {
    let lease = ctx.lease(log, "restore").await?;
    let _procs = [
        ctx.spawn_rust(log, &lease, "a", T, None)?,
        ctx.spawn_rust(log, &lease, "b", T, None)?,
        ctx.spawn_go(log, &lease, "g", T)?,
    ];
    let live = ["a", "b", "g"];
    let observer = kube_runtime_lease::LeaseObserver::new(ctx.client.clone(), &lease.namespace, &lease.name)?;
    let first = log
        .wait_for("a first leader", Duration::from_secs(30), |e| {
            e.kind == Kind::StartedLeading
        })
        .await?;
    let others: Vec<&str> = live.iter().copied().filter(|n| *n != first.process).collect();
    wait_seen_by(log, &others, &first.process, 0, Duration::from_secs(15)).await?;
    let snapshot = ctx.dir.path().join("etcd-snapshot");
    log.note("taking a snapshot of etcd");
    ctx.env.snapshot_etcd(&snapshot).await?;
    let snapped = now_ns();
    let before = wait_settled(log, &live, Duration::from_secs(20))
        .await
        .context("after the snapshot")?;
    // Renewals move the revision well past the snapshot's: six (3 s of them).
    lease_written(log, snapped, 6, Duration::from_secs(60)).await?;
    let restoring = log.note("restoring etcd");
    ctx.env.restore_etcd(&snapshot).await?;
    let ready = log.note("apiserver ready on the restored data");
    let leader = wait_settled(log, &live, Duration::from_secs(30))
        .await
        .context("after the restore")?;
    let started = log
        .filter(|e| e.kind == Kind::StartedLeading && e.process == leader)
        .last()
        .map_or(0, |e| e.at);
    // A restore faster than the leader's renew deadline (its renewal, sent
    // in time, answered once the apiserver was back: a 409, then a read of
    // its own term's older record) leaves the leader in its term, as
    // client-go's leader; a slower one, a new term (never two: `Runs`).
    let kept = started < restoring;
    ensure!(
        !kept || leader == before,
        "{leader} leads from before the restore, though {before} led then"
    );
    let bound = T.lease_duration + T.retry_period * 3;
    ensure!(
        kept || started.saturating_sub(ready) <= ns(bound),
        "{leader} led only {} after the apiserver was ready on the restored data (bound {}: a lease \
         duration and client-go's retry periods)",
        fmt_ms(started.saturating_sub(ready)),
        fmt_ms(ns(bound))
    );
    // A process that only observes learns of the new leader as soon: its
    // watch resumes from a resourceVersion etcd has not reached again.
    let mut status = observer.subscribe();
    let seen = tokio::time::timeout(
        T.lease_duration * 2,
        status.wait_for(|s| s.holder.as_deref() == Some(leader.as_str())),
    )
    .await;
    ensure!(
        seen.is_ok(),
        "the LeaseObserver still reports {:?} {} after {leader} began leading on the restored data",
        observer.status().holder,
        fmt_ms(now_ns().saturating_sub(started))
    );
    Ok(format!(
        "{before} led after the snapshot; {leader} led {} after the apiserver was ready on the restored data \
         (kept its term through the restore: {kept}); the observer reported it {} after",
        fmt_ms(started.saturating_sub(ready)),
        fmt_ms(now_ns().saturating_sub(started))
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_restored_from_an_older_snapshot() -> Result<()> {
    let _serial = serial().await;
    let ctx = Fixture::new().await?;
    let mut runs = Runs::new("etcd restored from an older snapshot");
    let log = EventLog::new();
    let result = restore_run(&ctx, &log).await;
    runs.record(0, result, &log);
    runs.finish()
}

/// client-go's default timings (15 s / 10 s / 2 s): an apiserver restart
/// takes a few seconds, less than the renew deadline.
const DEFAULT: Timings = Timings {
    lease_duration: Duration::from_secs(15),
    renew_deadline: Duration::from_secs(10),
    retry_period: Duration::from_secs(2),
};

/// The apiserver restarted (killed, started again on the same etcd) faster
/// than the renew deadline: the leader renews once it is back and keeps its
/// term, as client-go's leader does; no follower, Rust or client-go, leads
/// meanwhile.
async fn short_restart_run(ctx: &Fixture, log: &EventLog) -> Result<String> {
    let lease = ctx.lease(log, "short-restart").await?;
    let _procs = [
        ctx.spawn_rust(log, &lease, "a", DEFAULT, None)?,
        ctx.spawn_rust(log, &lease, "b", DEFAULT, None)?,
        ctx.spawn_go(log, &lease, "g", DEFAULT)?,
    ];
    let live = ["a", "b", "g"];
    let leader = wait_settled(log, &live, Duration::from_secs(40)).await?;
    let down = log.note("restarting the apiserver");
    ctx.env.stop_apiserver()?;
    ctx.env.start_apiserver().await?;
    let ready = log.note("apiserver ready");
    ensure!(
        ready - down < ns(DEFAULT.renew_deadline.saturating_sub(DEFAULT.retry_period * 2)),
        "the restart took {}: too long for this scenario",
        fmt_ms(ready - down)
    );
    // An observation window of two renewals after the restart: nobody starts
    // leading, and the leader does not stop.
    tokio::time::sleep(DEFAULT.retry_period * 2 + Duration::from_millis(500)).await;
    if let Some(e) = log.find(|e| {
        e.at > down
            && (e.kind == Kind::StartedLeading || (e.kind == Kind::StoppedLeading && e.process == leader))
    }) {
        anyhow::bail!(
            "{} {:?} {} after the apiserver went down for {} (leader {leader}, renew deadline 10 s)",
            e.process,
            e.kind,
            fmt_ms(e.at - down),
            fmt_ms(ready - down)
        );
    }
    Ok(format!(
        "{leader} kept its term through a restart of {}",
        fmt_ms(ready - down)
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apiserver_restart_shorter_than_the_renew_deadline() -> Result<()> {
    let _serial = serial().await;
    let ctx = Fixture::new().await?;
    let mut runs = Runs::new("apiserver restart shorter than the renew deadline");
    let log = EventLog::new();
    let result = short_restart_run(&ctx, &log).await;
    runs.record(0, result, &log);
    runs.finish()
}

/// etcd restored from a snapshot taken during the leader's term, faster than
/// its renew deadline (client-go's timings): the Lease shows an older
/// renewal of the same term, and the leader's next renewal conflicts. The
/// leader renews on from it and keeps its term, as client-go's leader does;
/// nobody else leads.
async fn quick_restore_run(ctx: &Fixture, log: &EventLog) -> Result<String> {
    let lease = ctx.lease(log, "quick-restore").await?;
    let a = ctx.spawn_rust(log, &lease, "a", DEFAULT, None)?;
    log.wait_for("a to lead", Duration::from_secs(30), |e| {
        e.kind == Kind::StartedLeading && e.process == "a"
    })
    .await?;
    let _procs = [
        a,
        ctx.spawn_rust(log, &lease, "b", DEFAULT, None)?,
        ctx.spawn_go(log, &lease, "g", DEFAULT)?,
    ];
    wait_seen_by(log, &["b", "g"], "a", 0, Duration::from_secs(15)).await?;
    let snapshot = ctx.dir.path().join("etcd-snapshot-quick");
    ctx.env.snapshot_etcd(&snapshot).await?;
    // Renewals move the revision past the snapshot's: three (three retry periods).
    lease_written(log, now_ns(), 3, Duration::from_secs(60)).await?;
    let down = log.note("restoring etcd");
    ctx.env.restore_etcd(&snapshot).await?;
    let ready = log.note("apiserver ready on the restored data");
    ensure!(
        ready - down < ns(DEFAULT.renew_deadline.saturating_sub(DEFAULT.retry_period * 2)),
        "the restore took {}: too long for this scenario",
        fmt_ms(ready - down)
    );
    // An observation window of two renewals after the restore (the test's
    // watch may miss them: it resumes from a revision etcd has not reached):
    // nobody starts leading, and a does not stop.
    tokio::time::sleep(DEFAULT.retry_period * 2 + Duration::from_millis(500)).await;
    if let Some(e) = log.find(|e| {
        e.at > down
            && (e.kind == Kind::StartedLeading || (e.kind == Kind::StoppedLeading && e.process == "a"))
    }) {
        anyhow::bail!(
            "{} {:?} {} after etcd was restored to an older renewal of a's term ({} down; renew deadline 10 s)",
            e.process,
            e.kind,
            fmt_ms(e.at - down),
            fmt_ms(ready - down)
        );
    }
    Ok(format!(
        "a kept its term through a restore of {}",
        fmt_ms(ready - down)
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_keeps_its_term_through_a_quick_etcd_restore() -> Result<()> {
    let _serial = serial().await;
    let ctx = Fixture::new().await?;
    let mut runs = Runs::new("a quick etcd restore under the leader");
    let log = EventLog::new();
    let result = quick_restore_run(&ctx, &log).await;
    runs.record(0, result, &log);
    runs.finish()
}
