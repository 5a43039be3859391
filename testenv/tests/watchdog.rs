//! A test process killed with SIGKILL leaves no etcd or kube-apiserver behind,
//! and no temporary directory either.

use std::io::{BufRead as _, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kube_lease_testenv::TestEnv;

const CHILD_ENV: &str = "KRL_WATCHDOG_CHILD";

/// Run by `kill9_leaves_no_orphans` in a child process: starts an environment,
/// reports its pids and waits to be killed.
#[tokio::test]
#[ignore = "helper run by kill9_leaves_no_orphans"]
async fn hold_env_until_killed() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    let env = TestEnv::start().await.expect("start");
    let dir = env.log_dir().expect("local env");
    println!(
        "PIDS {} {} {}",
        env.etcd_pid().expect("etcd"),
        env.apiserver_pid().expect("apiserver"),
        dir.parent().expect("parent").display()
    );
    tokio::time::sleep(Duration::from_secs(600)).await;
}

/// Whether `pid` is a live (non-zombie) process.
fn alive(pid: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        let state = stat.rsplit(')').next().unwrap_or("").trim_start();
        !state.starts_with('Z') && !state.starts_with('X')
    })
}

#[test]
fn kill9_leaves_no_orphans() {
    if std::env::var_os("KRL_TEST_KUBECONFIG").is_some() {
        return; // no processes of ours to orphan
    }
    let exe = std::env::current_exe().expect("current exe");
    let mut child = Command::new(exe)
        .args(["--ignored", "--exact", "hold_env_until_killed", "--nocapture"])
        .env(CHILD_ENV, "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn child test process");
    let stdout = child.stdout.take().expect("stdout");
    let line = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .find(|l| l.starts_with("PIDS "))
        .expect("child printed no PIDS line (did TestEnv::start fail?)");
    let fields: Vec<&str> = line.split_whitespace().collect();
    let (etcd, apiserver, dir) = (fields[1], fields[2], fields[3]);
    assert!(alive(etcd) && alive(apiserver), "children not running");

    child.kill().expect("SIGKILL the test process");
    child.wait().expect("reap");

    let deadline = Instant::now() + Duration::from_secs(20);
    while (alive(etcd) || alive(apiserver) || Path::new(dir).exists()) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(!alive(etcd), "etcd {etcd} outlived the killed test process");
    assert!(
        !alive(apiserver),
        "kube-apiserver {apiserver} outlived the killed test process"
    );
    assert!(!Path::new(dir).exists(), "{dir} was not removed");
}
