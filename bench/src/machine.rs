//! The machine and the versions a run used (`meta-*.json`).

use std::path::Path;

use serde::{Deserialize, Serialize};

pub fn loadavg() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(f64::NAN)
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Meta {
    pub command: String,
    pub quick: bool,
    pub scenarios: Vec<String>,
    pub started_unix: u64,
    pub duration_s: f64,
    pub nproc: usize,
    pub mem_total_kib: u64,
    pub cpu_model: String,
    pub kernel: String,
    pub rustc: String,
    pub go: String,
    pub kube_apiserver: String,
    pub client_go: String,
    pub k8s_controller: String,
    /// 1-minute load average, sampled every 10 s during the run.
    pub loadavg_samples: Vec<f64>,
    pub commit: String,
}

fn cmd_out(cmd: &str, args: &[&str]) -> String {
    std::process::Command::new(cmd)
        .args(args)
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

pub fn machine(meta: &mut Meta, root: &Path) {
    meta.nproc = std::thread::available_parallelism().map_or(0, std::num::NonZero::get);
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    meta.mem_total_kib = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    meta.cpu_model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|v| v.trim_start_matches([' ', '\t', ':']).trim().to_owned())
        .unwrap_or_default();
    meta.kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_owned();
    meta.rustc = cmd_out("rustc", &["--version"]);
    meta.go = cmd_out("go", &["version"]);
    let gomod = std::fs::read_to_string(root.join("harness/go/go.mod")).unwrap_or_default();
    meta.client_go = gomod
        .lines()
        .find(|l| l.trim_start().starts_with("k8s.io/client-go "))
        .map(|l| l.trim().to_owned())
        .unwrap_or_default();
    meta.k8s_controller = "k8s-controller 0.15.0".into();
    meta.commit = cmd_out(
        "git",
        &["-C", &root.display().to_string(), "rev-parse", "--short", "HEAD"],
    );
    // The candidates are built from the working tree: say when it differs.
    let dirty = cmd_out(
        "git",
        &[
            "-C",
            &root.display().to_string(),
            "status",
            "--porcelain",
            "--",
            "kube-runtime-lease",
            "examples",
            "harness/candidates",
        ],
    );
    if !dirty.is_empty() {
        meta.commit
            .push_str(" (+ uncommitted changes in kube-runtime-lease/, examples/ or harness/candidates/)");
    }
}
