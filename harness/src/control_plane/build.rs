//! Building the control plane's binaries (`scripts/control-plane.sh build`),
//! or finding prebuilt ones.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use anyhow::{Context as _, Result, anyhow};

/// The etcd + kube-apiserver binary (`harness/go/cmd/krl-control-plane`).
pub const CONTROL_PLANE_BIN: &str = "krl-control-plane";
/// The client-go candidate (`harness/go/cmd/goelect`).
pub const GOELECT_BIN: &str = "goelect";

/// The workspace root (the parent of this crate's directory).
///
/// # Panics
/// Never in practice: this crate's manifest directory always has a parent.
#[must_use]
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the harness lives inside the workspace")
        .to_path_buf()
}

/// Builds `krl-control-plane` and `goelect` if needed (once per process) and returns their
/// directory.
///
/// Uses `KRL_BIN_DIR` when set; otherwise runs `scripts/control-plane.sh build`,
/// whose cold build takes several minutes and a warm one milliseconds.
///
/// # Errors
/// When the build fails (the message holds the script's last lines).
pub async fn bin_dir() -> Result<PathBuf> {
    static BUILT: OnceLock<std::result::Result<PathBuf, String>> = OnceLock::new();
    let built = tokio::task::spawn_blocking(|| BUILT.get_or_init(build_binaries).clone())
        .await
        .context("build task panicked")?;
    built.map_err(|e| anyhow!(e))
}

fn build_binaries() -> std::result::Result<PathBuf, String> {
    if let Some(dir) = std::env::var_os("KRL_BIN_DIR") {
        let dir = PathBuf::from(dir);
        for bin in [CONTROL_PLANE_BIN, GOELECT_BIN] {
            if !dir.join(bin).is_file() {
                return Err(format!("KRL_BIN_DIR={} has no {bin} binary", dir.display()));
            }
        }
        return Ok(dir);
    }
    let script = workspace_root().join("scripts/control-plane.sh");
    let output = Command::new("bash")
        .arg(&script)
        .arg("build")
        .output()
        .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        let last: Vec<&str> = stderr.lines().rev().take(15).collect();
        let last: Vec<&str> = last.into_iter().rev().collect();
        return Err(format!(
            "building the control plane failed ({}): {}",
            output.status,
            last.join("\n")
        ));
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let dir = stdout
        .lines()
        .last()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .ok_or_else(|| format!("{} printed no bin directory", script.display()))?;
    Ok(PathBuf::from(dir))
}
