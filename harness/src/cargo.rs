//! Building with cargo and finding the executable: a binary of this
//! workspace ([`build`]), or any package ([`Build`]: its directory, target
//! directory and environment).

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Output, Stdio};
use std::time::Duration;

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

/// A `cargo build --message-format=json`, run by the cargo running this
/// process if any (`$CARGO`), else the one this crate was built with.
#[derive(Clone, Debug)]
pub struct Build {
    dir: PathBuf,
    args: Vec<String>,
    envs: Vec<(OsString, OsString)>,
    show_progress: bool,
}

impl Build {
    /// `cargo build -p <package> --bin|--example <name>` in the workspace root.
    pub fn target(package: &str, target: Target<'_>) -> Self {
        let kind = match target {
            Target::Bin(_) => "--bin",
            Target::Example(_) => "--example",
        };
        let mut build = Self::in_dir(&workspace_root());
        build
            .args
            .extend(["-p", package, kind, target.name()].map(str::to_owned));
        build
    }

    /// `cargo build` in `dir`: the package (or workspace) whose manifest is
    /// there, with every target.
    #[must_use]
    pub fn in_dir(dir: &Path) -> Self {
        Self {
            dir: dir.to_owned(),
            args: Vec::new(),
            envs: Vec::new(),
            show_progress: false,
        }
    }

    /// Sets an environment variable of cargo's (`CARGO_TARGET_DIR`,
    /// `CARGO_PROFILE_DEV_DEBUG`, ...).
    #[must_use]
    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Self {
        self.envs
            .push((key.as_ref().to_owned(), value.as_ref().to_owned()));
        self
    }

    /// With `show`, cargo's own output goes to this process's stderr; without
    /// (the default), it is kept ([`Built::stderr`]).
    #[must_use]
    pub fn show_progress(mut self, show: bool) -> Self {
        self.show_progress = show;
        self
    }

    /// The command line.
    ///
    /// Without the variables that cargo sets for the test binary running
    /// this (`CARGO_MANIFEST_DIR`, `CARGO_PKG_*`, ...): some build scripts
    /// (ring's) rerun when one of them changes, so a build inheriting them
    /// would rebuild ring and everything above it, and the next `cargo test`
    /// from a shell, which has none of them, all of it again.
    #[must_use]
    pub fn command(&self) -> Command {
        let mut cmd = Command::new(cargo());
        for (key, _) in std::env::vars_os() {
            let name = key.to_string_lossy();
            if ["CARGO_PKG_", "CARGO_BIN_", "CARGO_MANIFEST_"]
                .iter()
                .any(|prefix| name.starts_with(prefix))
                || ["CARGO_CRATE_NAME", "CARGO_PRIMARY_PACKAGE", "CARGO_TARGET_TMPDIR"].contains(&&*name)
            {
                cmd.env_remove(&key);
            }
        }
        cmd.current_dir(&self.dir)
            .arg("build")
            .args(&self.args)
            .arg("--message-format=json")
            .envs(self.envs.iter().map(|(k, v)| (k, v)))
            .stderr(if self.show_progress {
                Stdio::inherit()
            } else {
                Stdio::piped()
            });
        cmd
    }

    /// Runs the build and returns what cargo printed, whether it succeeded or
    /// not. Blocks while cargo runs.
    ///
    /// # Errors
    /// When cargo cannot run.
    pub fn run(&self) -> Result<Built> {
        let output = self
            .command()
            .output()
            .with_context(|| format!("cannot run {}", cargo().display()))?;
        Ok(Built::from(output))
    }

    /// [`Build::run`] on tokio; cargo is killed when it takes over `timeout`.
    ///
    /// # Errors
    /// When cargo cannot run or takes over `timeout`.
    pub async fn run_within(&self, timeout: Duration) -> Result<Built> {
        let output = tokio::time::timeout(
            timeout,
            tokio::process::Command::from(self.command())
                .kill_on_drop(true)
                .output(),
        )
        .await
        .map_err(|_| anyhow!("cargo build took over {timeout:?}"))?
        .with_context(|| format!("cannot run {}", cargo().display()))?;
        Ok(Built::from(output))
    }
}

/// What a [`Build`] printed.
#[derive(Clone, Debug)]
pub struct Built {
    /// Cargo's exit status.
    pub status: ExitStatus,
    /// Cargo's JSON messages (stdout), in order.
    pub messages: Vec<serde_json::Value>,
    /// Cargo's stderr (empty with [`Build::show_progress`]).
    pub stderr: String,
}

impl From<Output> for Built {
    fn from(output: Output) -> Self {
        Self {
            status: output.status,
            messages: String::from_utf8_lossy(&output.stdout)
                .lines()
                .filter_map(|l| serde_json::from_str(l).ok())
                .collect(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }
}

impl Built {
    /// The executable cargo reported for the target `name`, if any.
    #[must_use]
    pub fn executable(&self, name: &str) -> Option<PathBuf> {
        self.messages
            .iter()
            .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == name)
            .find_map(|m| m["executable"].as_str().map(PathBuf::from))
    }

    /// The compiler's messages (rendered) about the target `name`: its
    /// warnings and errors.
    pub fn diagnostics(&self, name: &str) -> Vec<String> {
        self.compiler_messages()
            .filter(|m| m["target"]["name"] == name)
            .filter_map(rendered)
            .collect()
    }

    /// The compiler's errors (rendered) in any crate of the build.
    pub fn errors(&self) -> Vec<String> {
        self.compiler_messages()
            .filter(|m| m["message"]["level"] == "error")
            .filter_map(rendered)
            .collect()
    }

    /// The last `n` lines of cargo's stderr.
    #[must_use]
    pub fn stderr_tail(&self, n: usize) -> String {
        let tail: Vec<&str> = self.stderr.lines().rev().take(n).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    }

    fn compiler_messages(&self) -> impl Iterator<Item = &serde_json::Value> {
        self.messages.iter().filter(|m| m["reason"] == "compiler-message")
    }
}

fn rendered(m: &serde_json::Value) -> Option<String> {
    m["message"]["rendered"].as_str().map(str::to_owned)
}

fn cargo() -> PathBuf {
    std::env::var_os("CARGO").map_or_else(|| PathBuf::from(env!("CARGO")), PathBuf::from)
}

/// Builds `target` of `package` (`cargo build -p <package> --bin|--example
/// <name>` in the workspace root, [`Build::target`]) and returns the path of
/// its executable. Blocks while cargo runs.
///
/// With `show_progress`, cargo's own output goes to this process's stderr;
/// without, it is kept for the error message.
///
/// # Errors
/// When cargo cannot run, the build fails (the message holds cargo's last
/// lines) or cargo reports no executable.
pub fn build(package: &str, target: Target<'_>, show_progress: bool) -> Result<PathBuf> {
    let name = target.name();
    let built = Build::target(package, target)
        .show_progress(show_progress)
        .run()?;
    if !built.status.success() {
        bail!(
            "building {name} of {package} failed ({}):\n{}",
            built.status,
            built.stderr_tail(20)
        );
    }
    built
        .executable(name)
        .ok_or_else(|| anyhow!("cargo reported no executable for {name} of {package}"))
}
