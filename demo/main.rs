//! The failover demo: several replicas of the example controller
//! (`examples/controller.rs`) on one Lease, against the local control plane
//! (or the cluster in `KUBECONFIG`), showing who leads and when leadership
//! moves: after a crash (SIGKILL) and after a graceful handover (SIGTERM);
//! then the same handover with warm-standby replicas (`WARM=1`:
//! `with_leader_election_warm`), and the time from each takeover to the new
//! leader's first reconcile, cold (a new Controller: LIST, then reconcile)
//! against warm (the store is already filled).
//!
//! Run it with `scripts/demo.sh`. Settings (environment): `DEMO_REPLICAS`
//! (default 3), `LEASE_DURATION` / `RENEW_DEADLINE` / `RETRY_PERIOD` (seconds,
//! default 5 / 3 / 1, so that the crash failover is quick to watch).

use std::{
    collections::BTreeMap,
    process::Stdio,
    time::{Duration, Instant},
};

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, Client,
    api::{ObjectMeta, PostParams},
};
use kube_runtime_lease_harness::{
    LeaseRef, Sig, TestEnv,
    cargo::{self, Target},
    send_signal, watch_lease,
};
// The example controller's own reader of its timings, for the same variables.
use kube_runtime_lease_examples::env_seconds;
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    process::{Child, Command},
    sync::mpsc,
};

const LEASE: &str = "configmap-controller";
const WARM_LEASE: &str = "configmap-controller-warm";

fn say(start: Instant, msg: &str) {
    println!("[{:>7.2}s] {msg}", start.elapsed().as_secs_f64());
}

/// Waits for the next non-empty holder; logs releases on the way.
async fn next_leader(
    holders: &mut mpsc::UnboundedReceiver<(Instant, String)>,
    start: Instant,
    timeout: Duration,
) -> anyhow::Result<(Instant, String)> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        match tokio::time::timeout_at(deadline, holders.recv()).await {
            Ok(Some((at, holder))) if !holder.is_empty() => return Ok((at, holder)),
            Ok(Some(_)) => say(start, "Lease holder (API server): none (released)"),
            Ok(None) => bail!("lease watch ended"),
            Err(_) => bail!("no leader within {timeout:?}"),
        }
    }
}

/// The time from `at` to `who`'s first reconcile after it.
async fn first_reconcile(
    reconciles: &mut mpsc::UnboundedReceiver<(Instant, String)>,
    who: &str,
    at: Instant,
) -> anyhow::Result<Duration> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match tokio::time::timeout_at(deadline, reconciles.recv()).await {
            Ok(Some((t, tag))) if tag == who && t >= at => return Ok(t - at),
            Ok(Some(_)) => {}
            Ok(None) => bail!("reconcile log ended"),
            Err(_) => bail!("{who} did not reconcile within 30 s of leading"),
        }
    }
}

/// Starts one replica and says so.
fn start_replica(
    s: &Spawn<'_>,
    leading_tx: mpsc::UnboundedSender<(Instant, String)>,
) -> anyhow::Result<Replica> {
    let child = spawn_replica(s, leading_tx)?;
    let how = if s.warm { " (warm)" } else { "" };
    say(s.start, &format!("started {}{how}", s.name));
    Ok(Replica {
        name: s.name.to_owned(),
        child,
    })
}

/// Sends SIGTERM to `replica` (as the kubelet does in a rollout).
fn sigterm(replica: &Replica) -> anyhow::Result<()> {
    let pid = replica.child.id().context("pid")?;
    // As `kill -TERM` did: a replica that already exited is no error here.
    let _ = send_signal(pid, Sig::Term);
    Ok(())
}

struct Replica {
    name: String,
    child: Child,
}

struct Spawn<'a> {
    controller: &'a std::path::Path,
    lease: &'a str,
    warm: bool,
    reconciles: mpsc::UnboundedSender<(Instant, String)>,
    env: &'a TestEnv,
    ns: &'a str,
    log_dir: &'a std::path::Path,
    name: &'a str,
    start: Instant,
}

/// Starts `count` replicas of `group`, named `{group.name}-{i}`.
fn start_group(
    group: &Spawn<'_>,
    count: usize,
    leading_tx: &mpsc::UnboundedSender<(Instant, String)>,
) -> anyhow::Result<BTreeMap<String, Replica>> {
    let mut replicas = BTreeMap::new();
    for i in 1..=count {
        let name = format!("{}-{i}", group.name);
        let spawn = Spawn {
            name: &name,
            reconciles: group.reconciles.clone(),
            ..*group
        };
        replicas.insert(name.clone(), start_replica(&spawn, leading_tx.clone())?);
    }
    Ok(replicas)
}

/// Starts one replica; its log goes to a file, its leadership events to `leading_tx`.
fn spawn_replica(
    s: &Spawn<'_>,
    leading_tx: mpsc::UnboundedSender<(Instant, String)>,
) -> anyhow::Result<Child> {
    let (controller, env, ns, log_dir, name, start) = (s.controller, s.env, s.ns, s.log_dir, s.name, s.start);
    let reconciles = s.reconciles.clone();
    let env_f = |v: &str, d: f64| env_seconds(v, d).map(|s| s.as_secs_f64().to_string());
    let log = std::fs::File::create(log_dir.join(format!("{name}.log")))?;
    let mut child = Command::new(controller)
        .env("KUBECONFIG", env.kubeconfig_path())
        .env("POD_NAME", name)
        // Several replicas on one machine: each its own probe port.
        .env("PROBE_ADDR", "127.0.0.1:0")
        .env("LEASE_NAMESPACE", ns)
        .env("LEASE_NAME", s.lease)
        .env("WARM", if s.warm { "1" } else { "0" })
        .env("LEASE_DURATION", env_f("LEASE_DURATION", 5.0)?)
        .env("RENEW_DEADLINE", env_f("RENEW_DEADLINE", 3.0)?)
        .env("RETRY_PERIOD", env_f("RETRY_PERIOD", 1.0)?)
        .env("RUST_LOG", "info,kube_runtime_lease=info")
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", controller.display()))?;
    let stderr = child.stderr.take().context("stderr")?;
    let (tag, ns) = (name.to_owned(), ns.to_owned());
    tokio::spawn(async move {
        let mut log = log;
        let mut lines = BufReader::new(stderr).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            let _ = std::io::Write::write_all(&mut log, format!("{line}\n").as_bytes());
            if line.contains("now leading") {
                let _ = leading_tx.send((Instant::now(), tag.clone()));
            } else if line.contains("holding it for one lease duration") {
                say(
                    start,
                    &format!("{tag}: created the Lease; holds it one lease duration before leading"),
                );
            } else if line.contains("leadership lost") || line.contains("leadership ended") {
                let reason = line.split("reason=").nth(1).unwrap_or("").trim();
                say(start, &format!("{tag}: stops leading: {reason}"));
            } else if line.contains(&format!("namespace=\"{ns}\""))
                && let Some(cm) = line.split("configmap=").nth(1)
            {
                let _ = reconciles.send((Instant::now(), tag.clone()));
                say(
                    start,
                    &format!(
                        "{tag}: reconciles ConfigMap {}",
                        cm.split_whitespace().next().unwrap_or("")
                    ),
                );
            }
        }
    });
    Ok(child)
}

/// Who holds the Lease, as the API server says: one message per change.
fn watch_holders(client: Client, ns: &str) -> mpsc::UnboundedReceiver<(Instant, String)> {
    let (holders_tx, holders) = mpsc::unbounded_channel::<(Instant, String)>();
    let lease = LeaseRef {
        namespace: ns.to_owned(),
        name: LEASE.to_owned(),
    };
    let mut last = None;
    // Runs as long as the demo: the task is never aborted.
    drop(watch_lease(client, &lease, move |_, lease| {
        let holder = lease.spec.and_then(|s| s.holder_identity).unwrap_or_default();
        if last.as_ref() != Some(&holder) {
            last = Some(holder.clone());
            let _ = holders_tx.send((Instant::now(), holder));
        }
    }));
    holders
}

/// Some `ConfigMaps` for the replicas to reconcile.
async fn create_configmaps(cms: &Api<ConfigMap>) -> anyhow::Result<()> {
    for i in 1..=3 {
        let metadata = ObjectMeta {
            name: Some(format!("demo-{i}")),
            ..Default::default()
        };
        cms.create(
            &PostParams::default(),
            &ConfigMap {
                metadata,
                ..Default::default()
            },
        )
        .await?;
    }
    Ok(())
}

#[tokio::main]
#[allow(clippy::too_many_lines)] // a linear script, read top to bottom
async fn main() -> anyhow::Result<()> {
    let replicas: usize = std::env::var("DEMO_REPLICAS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let (lease_duration, renew_deadline, retry_period) = (
        env_seconds("LEASE_DURATION", 5.0)?.as_secs_f64(),
        env_seconds("RENEW_DEADLINE", 3.0)?.as_secs_f64(),
        env_seconds("RETRY_PERIOD", 1.0)?.as_secs_f64(),
    );
    // scripts/demo.sh passes KUBECONFIG on as KRL_TEST_KUBECONFIG for the harness.
    if let Ok(kubeconfig) = std::env::var("KRL_TEST_KUBECONFIG") {
        println!("Using the cluster in KUBECONFIG={kubeconfig}");
    } else {
        println!("Starting a local control plane (etcd + kube-apiserver built from their Go modules)...");
    }
    let controller = tokio::task::spawn_blocking(|| {
        cargo::build("kube-runtime-lease-examples", Target::Example("controller"), true)
    })
    .await??;
    let env = TestEnv::start().await?;
    let client = env.client().await?;
    let ns = env.new_namespace("failover-demo").await?;
    create_configmaps(&Api::namespaced(client.clone(), &ns)).await?;
    println!(
        "Namespace {ns}, Lease {LEASE}: {replicas} replicas, lease duration {lease_duration} s, renew deadline {renew_deadline} s, retry period {retry_period} s\n"
    );

    let start = Instant::now();
    let mut holders = watch_holders(client.clone(), &ns);

    let (leading_tx, mut leading) = mpsc::unbounded_channel::<(Instant, String)>();
    let (reconciles_tx, mut reconciles) = mpsc::unbounded_channel::<(Instant, String)>();
    let log_dir = kube_runtime_lease_harness::workspace_root().join("target/failover-demo");
    std::fs::create_dir_all(&log_dir)?;
    let group = Spawn {
        controller: &controller,
        lease: LEASE,
        warm: false,
        reconciles: reconciles_tx.clone(),
        env: &env,
        ns: &ns,
        log_dir: &log_dir,
        name: "replica",
        start,
    };
    let mut running = start_group(&group, replicas, &leading_tx)?;

    let timeout = Duration::from_secs_f64(lease_duration * 4.0 + 30.0);

    // Lease holder changes, as the API server reports them.
    tokio::spawn(async move {
        while let Ok((_, holder)) = next_leader(&mut holders, start, Duration::from_secs(3600)).await {
            say(start, &format!("Lease holder (API server): {holder}"));
        }
    });
    let (_, first) = next_leader(&mut leading, start, timeout).await?;
    say(start, &format!("LEADER: {first}"));
    tokio::time::sleep(Duration::from_secs(3)).await;

    // 1. Crash: SIGKILL the leader. A standby takes over after the lease duration.
    let victim = running.remove(&first).context("leader is not one of ours")?;
    let killed = Instant::now();
    say(
        start,
        &format!(
            "SIGKILL {} (crash): standbys wait one lease duration ({lease_duration} s)",
            victim.name
        ),
    );
    drop(victim); // kill_on_drop sends SIGKILL
    let (at, second) = next_leader(&mut leading, start, timeout).await?;
    let crash_failover = at - killed;
    say(
        start,
        &format!(
            "LEADER: {second}, {:.2} s after the crash",
            crash_failover.as_secs_f64()
        ),
    );
    tokio::time::sleep(Duration::from_secs(3)).await;

    // 2. Graceful: SIGTERM the leader. It finishes its work, releases, and a standby takes over at once.
    let mut handover_ms = None;
    let mut cold_first = None;
    if let Some(mut leader) = running.remove(&second) {
        let termed = Instant::now();
        say(
            start,
            &format!(
                "SIGTERM {} (rollout): it releases the lease on its way out",
                leader.name
            ),
        );
        sigterm(&leader)?;
        let (at, third) = next_leader(&mut leading, start, timeout).await?;
        let handover = at - termed;
        handover_ms = Some(handover.as_millis());
        say(
            start,
            &format!("LEADER: {third}, {} ms after the SIGTERM", handover.as_millis()),
        );
        let first = first_reconcile(&mut reconciles, &third, at).await?;
        cold_first = Some(first);
        say(
            start,
            &format!(
                "{third}: first reconcile {:.1} ms after it took over (cold: a new Controller lists, then reconciles)",
                first.as_secs_f64() * 1000.0
            ),
        );
        let status = tokio::time::timeout(Duration::from_secs(30), leader.child.wait()).await??;
        say(start, &format!("{} exited ({status})", leader.name));
    }

    // 3. The same handover in warm standby: the standby's store is filled
    // already, so it reconciles at once on taking over.
    drop(running);
    println!();
    say(
        start,
        &format!("Warm standby (WARM=1), Lease {WARM_LEASE}: 2 replicas"),
    );
    let (warm_tx, mut warm_leading) = mpsc::unbounded_channel::<(Instant, String)>();
    let warm_group = Spawn {
        lease: WARM_LEASE,
        warm: true,
        reconciles: reconciles_tx.clone(),
        name: "warm",
        ..group
    };
    let mut warm = start_group(&warm_group, 2, &warm_tx)?;
    let (_, warm_leader) = next_leader(&mut warm_leading, start, timeout).await?;
    say(start, &format!("LEADER: {warm_leader}"));
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut warm_first = None;
    if let Some(mut leader) = warm.remove(&warm_leader) {
        say(start, &format!("SIGTERM {} (rollout)", leader.name));
        sigterm(&leader)?;
        let (at, next) = next_leader(&mut warm_leading, start, timeout).await?;
        say(start, &format!("LEADER: {next}"));
        let first = first_reconcile(&mut reconciles, &next, at).await?;
        warm_first = Some(first);
        say(
            start,
            &format!(
                "{next}: first reconcile {:.1} ms after it took over (warm: its store was filled while it stood by)",
                first.as_secs_f64() * 1000.0
            ),
        );
        let _ = tokio::time::timeout(Duration::from_secs(30), leader.child.wait()).await;
    }

    println!("\nSummary");
    println!(
        "  crash (SIGKILL) failover: {:.2} s  (lease duration {lease_duration} s)",
        crash_failover.as_secs_f64()
    );
    if let Some(ms) = handover_ms {
        println!("  graceful (SIGTERM) handover: {ms} ms");
    }
    if let (Some(cold), Some(warm)) = (cold_first, warm_first) {
        println!(
            "  takeover -> first reconcile: cold {:.1} ms, warm {:.1} ms",
            cold.as_secs_f64() * 1000.0,
            warm.as_secs_f64() * 1000.0
        );
    }
    println!("  replica logs: {}", log_dir.display());
    if crash_failover < Duration::from_secs_f64(lease_duration - retry_period) {
        bail!("failover faster than the lease duration allows: unsafe");
    }
    drop(warm);
    Ok(())
}
