//! The client-go candidate `goelect`: its output format, hand-over on SIGTERM
//! (release on cancel) and its exit code.

use std::time::Duration;

use anyhow::Result;
use kube_runtime_lease_harness::{
    Entry, EventLog, Flavor, Kind, LeaseRef, Process, Sig, TestEnv, Timings, go_candidate,
};

/// The timings of this test: a 4 s lease, so that a hand-over by release is
/// told apart from one by expiry.
const TIMINGS: Timings = Timings {
    lease_duration: Duration::from_secs(4),
    renew_deadline: Duration::from_secs(3),
    retry_period: Duration::from_millis(500),
};

/// Waits for `process`'s first line of `kind`.
async fn line(log: &EventLog, process: &str, kind: Kind, timeout: Duration) -> Result<Entry> {
    log.wait_for(&format!("{kind:?} of {process}"), timeout, |e| {
        e.process == process && e.kind == kind
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn goelect_hands_over_on_sigterm() -> Result<()> {
    let env = TestEnv::start().await?;
    let lease = LeaseRef {
        namespace: env.new_namespace("goelect").await?,
        name: "goelect-test".to_owned(),
    };
    let bin = env.goelect_path().await?;
    let log = EventLog::new();
    let spawn = |id: &str| {
        let cmd = go_candidate(&bin, env.kubeconfig_path(), &lease, id, TIMINGS);
        Process::spawn(id, Flavor::Go, cmd, &log)
    };

    let mut a = spawn("cand-a")?;
    let ready = line(&log, "cand-a", Kind::Ready, Duration::from_secs(10)).await?;
    let led = line(&log, "cand-a", Kind::StartedLeading, Duration::from_secs(20)).await?;
    assert_eq!(led.who, "cand-a");
    assert!(led.at >= ready.at);

    let _b = spawn("cand-b")?;
    let seen = line(&log, "cand-b", Kind::NewLeader, Duration::from_secs(10)).await?;
    assert_eq!(seen.who, "cand-a");

    let lease = lease.api(env.client().await?).get(&lease.name).await?;
    assert_eq!(
        lease.spec.as_ref().and_then(|s| s.holder_identity.as_deref()),
        Some("cand-a")
    );

    // SIGTERM: a releases (ReleaseOnCancel), prints stopped-leading, exits 0;
    // b takes over well before the 4 s lease would have expired.
    a.signal(Sig::Term)?;
    let stopped = line(&log, "cand-a", Kind::StoppedLeading, Duration::from_secs(10)).await?;
    let status = a.wait_exit(Duration::from_secs(10)).await?;
    assert!(status.success(), "goelect exited with {status}");
    let b_led = line(&log, "cand-b", Kind::StartedLeading, Duration::from_secs(10)).await?;
    let handover = Duration::from_nanos(b_led.at.saturating_sub(stopped.at));
    assert!(
        handover < Duration::from_secs(3),
        "hand-over took {handover:?}\n{}",
        log.dump()
    );
    assert_eq!(b_led.who, "cand-b");
    Ok(())
}
