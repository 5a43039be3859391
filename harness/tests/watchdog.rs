//! A test process killed with SIGKILL leaves no etcd or kube-apiserver behind,
//! and no temporary directory either.

use std::io::{BufRead as _, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Whether `pid` is a live (non-zombie) process.
fn alive(pid: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        let state = stat.rsplit(')').next().unwrap_or("").trim_start();
        !state.starts_with('Z') && !state.starts_with('X')
    })
}

#[test]
fn kill9_leaves_no_orphans() {
    // Not a silent pass: with an external cluster there are no processes of ours to check.
    assert!(
        std::env::var_os("KRL_TEST_KUBECONFIG").is_none(),
        "this test checks the local control plane's processes: it cannot run with KRL_TEST_KUBECONFIG"
    );
    // A process that starts an environment and waits (src/bin/control-plane-hold.rs).
    let mut child = Command::new(env!("CARGO_BIN_EXE_control-plane-hold"))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn child test process");
    let stdout = child.stdout.take().expect("stdout");
    let line = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .find(|l| l.starts_with("PIDS "))
        .expect("control-plane-hold printed no PIDS line (did TestEnv::start fail?)");
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
