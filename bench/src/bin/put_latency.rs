//! Experiment: latency of a Lease GET and PUT from a kube-rs client as built by
//! default (kube-client 5 leaves TCP_NODELAY off: hyper-util's default) and
//! from one whose connector sets TCP_NODELAY (`examples/common.rs`'s), against the testenv apiserver.
//! Written to find the ~46 ms floor of kube-runtime-lease's handover on kube's
//! default client. On a connection in use both clients take ~2.5 ms per GET or
//! PUT; a PUT while a watch holds the pooled connection (a follower's takeover)
//! opens a new connection and, without TCP_NODELAY, waits ~40 ms more for a
//! delayed ACK. See BENCHMARKS.md, "Handover and TCP_NODELAY".
//!
//! usage: put-latency [rounds] [idle-ms]

use std::time::{Duration, Instant};

use anyhow::Result;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use kube::api::PostParams;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use kube_runtime_lease_harness::percentile;

async fn nodelay_client(path: &std::path::Path) -> Result<Client> {
    let config =
        Config::from_custom_kubeconfig(Kubeconfig::read_from(path)?, &KubeConfigOptions::default()).await?;
    kube_runtime_lease_examples::nodelay_client(config)
}

async fn create_lease(api: &Api<Lease>, name: &str) -> Result<()> {
    let spec = LeaseSpec {
        holder_identity: Some("x".into()),
        lease_duration_seconds: Some(15),
        ..LeaseSpec::default()
    };
    kube_runtime_lease_harness::create_lease(api, name, spec).await?;
    Ok(())
}

async fn measure(name: &str, client: Client, ns: &str, rounds: usize, idle: Duration) -> Result<()> {
    let api: Api<Lease> = Api::namespaced(client, ns);
    let lease_name = format!(
        "lat-{}",
        name.len() + name.matches('+').count() * 100 + name.matches('(').count() * 1000
    );
    create_lease(&api, &lease_name).await?;
    let (mut gets, mut puts) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        tokio::time::sleep(idle).await;
        let t0 = Instant::now();
        let mut l = api.get(&lease_name).await?;
        let t1 = Instant::now();
        l.spec.as_mut().unwrap().lease_transitions =
            Some(l.spec.as_ref().unwrap().lease_transitions.unwrap_or(0) + 1);
        api.replace(&lease_name, &PostParams::default(), &l).await?;
        let t2 = Instant::now();
        gets.push((t1 - t0).as_secs_f64() * 1e3);
        puts.push((t2 - t1).as_secs_f64() * 1e3);
    }
    gets.sort_by(f64::total_cmp);
    puts.sort_by(f64::total_cmp);
    println!(
        "{name:22} idle {:5} ms: GET p50 {:6.2} ms p99 {:6.2} ms | PUT p50 {:6.2} ms p99 {:6.2} ms min {:6.2} ms",
        idle.as_millis(),
        percentile(&gets, 0.5),
        percentile(&gets, 0.99),
        percentile(&puts, 0.5),
        percentile(&puts, 0.99),
        percentile(&puts, 0.0)
    );
    Ok(())
}

/// A PUT while a watch holds the client's only pooled connection, as on a
/// following candidate: HTTP/1.1 gives the watch a connection of its own, so
/// the PUT opens a new one (resuming the TLS session of the first).
async fn measure_behind_watch(name: &str, client: Client, ns: &str, rounds: usize) -> Result<()> {
    use futures::StreamExt as _;
    let api: Api<Lease> = Api::namespaced(client, ns);
    let lease_name = format!("watched-{}", name.len());
    create_lease(&api, &lease_name).await?;
    let mut puts = Vec::new();
    for _ in 0..rounds {
        let mut l = api.get(&lease_name).await?;
        let wp = kube::api::WatchParams::default().fields(&format!("metadata.name={lease_name}"));
        let mut watch = api
            .watch(&wp, l.metadata.resource_version.as_deref().unwrap_or("0"))
            .await?
            .boxed();
        l.spec.as_mut().unwrap().lease_transitions =
            Some(l.spec.as_ref().unwrap().lease_transitions.unwrap_or(0) + 1);
        let t0 = Instant::now();
        api.replace(&lease_name, &PostParams::default(), &l).await?;
        puts.push(t0.elapsed().as_secs_f64() * 1e3);
        // The watch sees the write, then is dropped with its connection.
        let _ = watch.next().await;
    }
    puts.sort_by(f64::total_cmp);
    println!(
        "{name:22} PUT behind a watch: p50 {:6.2} ms p99 {:6.2} ms min {:6.2} ms",
        percentile(&puts, 0.5),
        percentile(&puts, 0.99),
        percentile(&puts, 0.0)
    );
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let rounds: usize = args.next().and_then(|v| v.parse().ok()).unwrap_or(30);
    let idle_ms: u64 = args.next().and_then(|v| v.parse().ok()).unwrap_or(500);
    let env = kube_runtime_lease_harness::TestEnv::start().await?;
    let ns = env.new_namespace("put-latency").await?;
    let idle = Duration::from_millis(idle_ms);
    measure("kube default", env.client().await?, &ns, rounds, idle).await?;
    measure(
        "kube + TCP_NODELAY",
        nodelay_client(env.kubeconfig_path()).await?,
        &ns,
        rounds,
        idle,
    )
    .await?;
    measure("kube default (again)", env.client().await?, &ns, rounds, idle).await?;
    measure_behind_watch("kube default", env.client().await?, &ns, rounds).await?;
    measure_behind_watch(
        "kube + TCP_NODELAY",
        nodelay_client(env.kubeconfig_path()).await?,
        &ns,
        rounds,
    )
    .await?;
    Ok(())
}
