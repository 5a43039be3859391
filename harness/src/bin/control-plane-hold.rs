//! Starts a [`TestEnv`], prints `PIDS <etcd> <apiserver> <dir>` and waits to
//! be killed: the child process of the `watchdog` test, which SIGKILLs it and
//! checks that nothing outlives it.

use std::time::Duration;

use kube_runtime_lease_harness::TestEnv;

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let env = TestEnv::start().await?;
    let dir = env
        .log_dir()
        .ok_or_else(|| anyhow::anyhow!("not a local environment"))?;
    println!(
        "PIDS {} {} {}",
        env.etcd_pid().unwrap_or_default(),
        env.apiserver_pid().unwrap_or_default(),
        dir.parent().unwrap_or(&dir).display()
    );
    tokio::time::sleep(Duration::from_secs(600)).await;
    Ok(())
}
