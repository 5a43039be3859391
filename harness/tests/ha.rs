//! The HA control plane itself: a write through one apiserver is read through
//! the other, etcd keeps serving with its leader killed (and the member
//! rejoins), and either apiserver restarts while the other serves.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use kube_runtime_lease_harness::control_plane::{APISERVERS, HaControlPlane};

/// Polls `etcd_leader` until it names a member other than `not`.
async fn leader_other_than(ha: &HaControlPlane, not: Option<usize>) -> Result<usize> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match ha.etcd_leader().await {
            Some(i) if Some(i) != not => return Ok(i),
            _ if Instant::now() > deadline => bail!("no etcd leader other than {not:?} after 30 s"),
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// [`write_then_read`], bounded: a request that hangs fails the test.
async fn write_and_read(ha: &HaControlPlane, ns: &str, name: &str, via: usize, read: usize) -> Result<()> {
    tokio::time::timeout(Duration::from_secs(60), write_then_read(ha, ns, name, via, read))
        .await
        .with_context(|| format!("{name}: no answer within 60 s"))?
}

async fn write_then_read(ha: &HaControlPlane, ns: &str, name: &str, via: usize, read: usize) -> Result<()> {
    let cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        data: Some([("via".to_owned(), via.to_string())].into()),
        ..ConfigMap::default()
    };
    Api::<ConfigMap>::namespaced(ha.client(via).await?, ns)
        .create(&PostParams::default(), &cm)
        .await
        .with_context(|| format!("creating {name} through apiserver {via}"))?;
    let got = Api::<ConfigMap>::namespaced(ha.client(read).await?, ns)
        .get(name)
        .await
        .with_context(|| format!("reading {name} through apiserver {read}"))?;
    assert_eq!(
        got.data.and_then(|d| d.get("via").cloned()),
        Some(via.to_string())
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ha_control_plane_survives_member_and_apiserver_loss() -> Result<()> {
    let t0 = Instant::now();
    let step = |what: &str| eprintln!("{:>7.1} s  {what}", t0.elapsed().as_secs_f64());
    let ha = HaControlPlane::start().await?;
    step("started");
    let ns = "default";
    write_and_read(&ha, ns, "first", 0, 1).await?;

    let leader = leader_other_than(&ha, None).await?;
    step("leader found");
    ha.kill_etcd(leader);
    assert!(!ha.etcd_running(leader));
    let next = leader_other_than(&ha, Some(leader)).await?;
    assert_ne!(next, leader, "a new etcd leader is elected");
    step("new leader");
    write_and_read(&ha, ns, "without-a-member", 1, 0).await?;
    step("written without a member");
    tokio::time::timeout(Duration::from_secs(60), ha.start_etcd(leader))
        .await
        .context("the etcd member not back within 60 s")??;
    assert!(ha.etcd_running(leader));
    step("member back");

    for i in 0..APISERVERS {
        let other = 1 - i;
        ha.stop_apiserver(i);
        step("apiserver stopped");
        write_and_read(&ha, ns, &format!("apiserver-{i}-down"), other, other).await?;
        step("written");
        tokio::time::timeout(Duration::from_secs(120), ha.start_apiserver(i))
            .await
            .with_context(|| format!("apiserver {i} not back within 120 s"))??;
        step("apiserver back");
        write_and_read(&ha, ns, &format!("apiserver-{i}-back"), i, other).await?;
    }
    Ok(())
}
