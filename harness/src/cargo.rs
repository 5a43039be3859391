//! Building a binary of this workspace with cargo, and finding it.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use anyhow::{Context as _, Result, anyhow, bail};

use crate::workspace_root;

/// A target of a workspace package.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target<'a> {
    /// A `[[bin]]`.
    Bin(&'a str),
    /// An `[[example]]`.
    Example(&'a str),
}

impl Target<'_> {
    fn name(&self) -> &str {
        match self {
            Target::Bin(name) | Target::Example(name) => name,
        }
    }
}

/// Builds `target` of `package` (`cargo build -p <package> --bin|--example
/// <name>` in the workspace root, with the cargo running this process if
/// any) and returns the path of its executable. Blocks while cargo runs.
///
/// With `show_progress`, cargo's own output goes to this process's stderr;
/// without, it is kept for the error message.
///
/// # Errors
/// When cargo cannot run, the build fails (the message holds cargo's last
/// lines) or cargo reports no executable.
pub fn build(package: &str, target: Target<'_>, show_progress: bool) -> Result<PathBuf> {
    let cargo = std::env::var_os("CARGO").map_or_else(|| PathBuf::from(env!("CARGO")), PathBuf::from);
    let kind = match target {
        Target::Bin(_) => "--bin",
        Target::Example(_) => "--example",
    };
    let name = target.name();
    let output = Command::new(&cargo)
        .current_dir(workspace_root())
        .args(["build", "-p", package, kind, name, "--message-format=json"])
        .stderr(if show_progress {
            Stdio::inherit()
        } else {
            Stdio::piped()
        })
        .output()
        .with_context(|| format!("cannot run {}", cargo.display()))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(20).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        bail!(
            "building {name} of {package} failed ({}):\n{}",
            output.status,
            tail.join("\n")
        );
    }
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == name)
        .find_map(|m| m["executable"].as_str().map(PathBuf::from))
        .ok_or_else(|| anyhow!("cargo reported no executable for {name} of {package}"))
}
