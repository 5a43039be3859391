//! Every long-running example's SIGTERM path, against a real kube-apiserver
//! and etcd: the example leads, is sent SIGTERM, exits successfully within
//! its shutdown budget, and has released the Lease by the time it exits (it
//! awaits its handover instead of exiting while the release is in flight);
//! and, standing by while another holds the Lease, exits at once on SIGTERM
//! without writing it (a rolling update's old standbys).
//!
//! The examples run one at a time, each in a namespace of its own, with short
//! timings (2 s lease duration); each waits one lease duration after creating
//! its Lease (the creation hold), as in production.

use std::{process::Stdio, time::Duration};

use anyhow::{Context as _, Result, bail, ensure};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube_runtime_lease_harness::{
    Sig,
    cargo::{Target, build},
    send_signal, shared_env,
};
use tokio::{
    process::Command,
    time::{Instant, sleep, timeout},
};

/// The examples that run until SIGTERM (`sharded` has its own process tests).
const EXAMPLES: &[&str] = &[
    "controller",
    "two_controllers",
    "warm_standby",
    "rejoin",
    "sigterm_handover",
    "stream",
    "fenced_write",
    "operator",
];

/// The grace the examples give `shutdown` (the longest: 20 s).
const GRACE: Duration = Duration::from_secs(20);

async fn holder(leases: &Api<Lease>) -> Result<Option<String>> {
    Ok(leases
        .get_opt("ex")
        .await?
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity))
}

/// An example running against the shared control plane, in a namespace of
/// its own, leading its Lease `ex`.
struct Leading {
    child: tokio::process::Child,
    leases: Api<Lease>,
    log_path: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Leading {
    /// What the example logged so far.
    fn output(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }
}

/// Builds and starts `example` with short timings, campaigning for the
/// Lease `ex` in the existing namespace `ns`.
async fn spawn(example: &str, ns: &str) -> Result<Leading> {
    let env = shared_env().await?;
    let bin = tokio::task::spawn_blocking({
        let example = example.to_owned();
        move || build("kube-runtime-lease-examples", Target::Example(&example), false)
    })
    .await??;
    let leases: Api<Lease> = Api::namespaced(env.client().await?, ns);
    let dir = tempfile::tempdir()?;
    let log_path = dir.path().join("example.log");
    let log = std::fs::File::create(&log_path)?;
    let child = Command::new(&bin)
        .env("KUBECONFIG", env.kubeconfig_path())
        .env("LEASE_NAMESPACE", ns)
        .env("LEASE_NAME", "ex")
        .env("IDENTITY", example)
        .env("POD_NAME", example)
        .env("LEASE_DURATION", "2")
        .env("RENEW_DEADLINE", "1.5")
        .env("RETRY_PERIOD", "0.5")
        .env("PROBE_ADDR", "127.0.0.1:0")
        // The operator's webhook server: any free port, and a short drain
        // delay (it keeps serving that long after SIGTERM).
        .env("WEBHOOK_ADDR", "127.0.0.1:0")
        .env("WEBHOOK_DRAIN_DELAY", "1")
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    Ok(Leading {
        child,
        leases,
        log_path,
        _dir: dir,
    })
}

/// Starts `example` in a new namespace `ns` and waits until it leads (one
/// lease duration after creating the Lease: the creation hold).
async fn start_leading(example: &str, ns: &str) -> Result<Leading> {
    let ns = shared_env().await?.new_namespace(ns).await?;
    let mut running = spawn(example, &ns).await?;
    let started = Instant::now();
    loop {
        if let Some(status) = running.child.try_wait()? {
            bail!(
                "{example} exited before leading ({status}):\n{}",
                running.output()
            );
        }
        // The creation hold has ended (the holder is written at creation).
        if running.output().contains("now leading")
            && holder(&running.leases).await?.as_deref() == Some(example)
        {
            return Ok(running);
        }
        if started.elapsed() > Duration::from_secs(30) {
            bail!("{example} did not lead within 30 s:\n{}", running.output());
        }
        sleep(Duration::from_millis(100)).await;
    }
}

async fn sigterm_path(example: &str) -> Result<()> {
    let ns = format!("ex-{}", example.replace('_', "-"));
    let mut running = start_leading(example, &ns).await?;
    // Let its work start (a Controller lists, a stream makes its first item).
    sleep(Duration::from_secs(1)).await;
    send_signal(running.child.id().context("no pid")?, Sig::Term)?;
    let signalled = Instant::now();
    let bound = GRACE + Duration::from_secs(10);
    let status = timeout(bound, running.child.wait()).await.with_context(|| {
        format!(
            "{example} did not exit within {bound:?} of SIGTERM:\n{}",
            running.output()
        )
    })??;
    ensure!(
        status.success(),
        "{example} exited with {status} after SIGTERM:\n{}",
        running.output()
    );
    // Nothing was in flight: the handover is quick, and the release landed
    // before the process exited.
    ensure!(
        signalled.elapsed() < Duration::from_secs(7),
        "{example} took {:?} to hand over",
        signalled.elapsed()
    );
    let after = holder(&running.leases).await?;
    ensure!(
        after.as_deref() == Some(""),
        "{example} exited without releasing the Lease (holder {after:?}):\n{}",
        running.output()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_example_hands_over_on_sigterm_and_exits_after_the_release() -> Result<()> {
    let mut failed = Vec::new();
    for example in EXAMPLES {
        if let Err(e) = sigterm_path(example).await {
            failed.push(format!("{example}: {e:#}"));
        }
    }
    ensure!(failed.is_empty(), "{}", failed.join("\n\n"));
    Ok(())
}

/// An example replica that loses the Lease (another candidate
/// takes it over) must not stay up without campaigning: it either rejoins
/// the election in process (`run_each_term`) or exits so that its pod
/// restarts and campaigns again (`exit_after_work`, the README's quick
/// start). A replica that waits for SIGTERM after a loss is a pod that looks
/// alive and never leads again: once every replica has lost once (API server
/// outages), nobody campaigns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_handover_does_not_stay_up_out_of_the_election_after_a_loss() -> Result<()> {
    use k8s_openapi::{apimachinery::pkg::apis::meta::v1::MicroTime, jiff::Timestamp};
    use kube::api::PostParams;

    let example = "sigterm_handover";
    let mut running = start_leading(example, "ex-lost-sigterm-handover").await?;
    let leases = running.leases.clone();
    sleep(Duration::from_secs(1)).await;
    // Another candidate takes the Lease over, for a long term.
    let mut taken = false;
    for _ in 0..20 {
        let mut lease = leases.get("ex").await?;
        let spec = lease.spec.get_or_insert_default();
        let now = MicroTime(Timestamp::now());
        spec.holder_identity = Some("intruder".to_owned());
        spec.lease_duration_seconds = Some(3600);
        spec.acquire_time = Some(now.clone());
        spec.renew_time = Some(now);
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        match leases.replace("ex", &PostParams::default(), &lease).await {
            Ok(_) => {
                taken = true;
                break;
            }
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
    }
    ensure!(taken, "the takeover conflicted 20 times");
    let took = Instant::now();
    // Out of the election: it must exit (to restart and campaign again).
    let exited = timeout(Duration::from_secs(15), running.child.wait()).await;
    let Ok(status) = exited else {
        bail!(
            "{example} still runs {:?} after losing the Lease, no longer campaigning (it waits for \
             SIGTERM):\n{}",
            took.elapsed(),
            running.output()
        );
    };
    ensure!(
        !status?.success(),
        "{example} exited successfully after a loss:\n{}",
        running.output()
    );
    Ok(())
}

/// A rolling update sends SIGTERM to every old replica, most of them
/// standbys: each example, standing by while another holds the Lease, must
/// exit successfully and at once on SIGTERM (its `shutdown` has no work to
/// wait for and nothing to release), without writing the Lease. A standby
/// that waits for work it never had, exits with an error, or writes the
/// Lease on its way out turns every rollout into a pod killed at its
/// `terminationGracePeriodSeconds`, a failed pod, or a disturbed leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_example_standing_by_exits_at_once_on_sigterm_without_writing_the_lease() -> Result<()> {
    use k8s_openapi::{apimachinery::pkg::apis::meta::v1::MicroTime, jiff::Timestamp};
    use kube::api::{ObjectMeta, PostParams};

    let env = shared_env().await?;
    let ns = env.new_namespace("ex-standby").await?;
    let leases: Api<Lease> = Api::namespaced(env.client().await?, &ns);
    // Held by a leader elsewhere for an hour: every example stands by.
    let now = MicroTime(Timestamp::now());
    let held = leases
        .create(
            &PostParams::default(),
            &Lease {
                metadata: ObjectMeta {
                    name: Some("ex".to_owned()),
                    ..ObjectMeta::default()
                },
                spec: Some(k8s_openapi::api::coordination::v1::LeaseSpec {
                    holder_identity: Some("elsewhere".to_owned()),
                    lease_duration_seconds: Some(3600),
                    acquire_time: Some(now.clone()),
                    renew_time: Some(now),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            },
        )
        .await?;
    let version = held.metadata.resource_version;
    let mut failed = Vec::new();
    let mut took = Vec::new();
    for example in EXAMPLES {
        let mut running = spawn(example, &ns).await?;
        let started = Instant::now();
        // Its election task has read the Lease (and its SIGTERM handler,
        // set up before the campaign, is installed).
        while !running.output().contains("new leader observed") {
            if let Some(status) = running.child.try_wait()? {
                bail!(
                    "{example} exited while standing by ({status}):\n{}",
                    running.output()
                );
            }
            ensure!(
                started.elapsed() < Duration::from_secs(30),
                "{example} did not see the leader within 30 s:\n{}",
                running.output()
            );
            sleep(Duration::from_millis(50)).await;
        }
        send_signal(running.child.id().context("no pid")?, Sig::Term)?;
        let signalled = Instant::now();
        let Ok(status) = timeout(Duration::from_secs(10), running.child.wait()).await else {
            failed.push(format!(
                "{example}: still running 10 s after SIGTERM as a standby:\n{}",
                running.output()
            ));
            continue;
        };
        let status = status?;
        let exited = signalled.elapsed();
        took.push(format!("{example} {exited:?}"));
        let lease = leases.get("ex").await?;
        if !status.success() {
            failed.push(format!(
                "{example}: exited with {status} after SIGTERM as a standby:\n{}",
                running.output()
            ));
        } else if exited > Duration::from_secs(5) {
            failed.push(format!(
                "{example}: took {exited:?} to exit as a standby:\n{}",
                running.output()
            ));
        } else if lease.metadata.resource_version != version {
            failed.push(format!(
                "{example}: wrote the Lease as a standby ({:?}):\n{}",
                lease.spec,
                running.output()
            ));
        }
    }
    ensure!(failed.is_empty(), "{}", failed.join("\n\n"));
    eprintln!("standbys exited after SIGTERM: {}", took.join(", "));
    Ok(())
}
