//! Child processes (etcd, kube-apiserver) that cannot outlive the test process.
//!
//! Each child runs `krl-control-plane` with `KRL_EXIT_ON_STDIN_EOF=1` and a pipe as its stdin,
//! whose write end only this process holds (std opens pipes close-on-exec, so no
//! other child inherits it). When this process exits for any reason — including
//! SIGKILL or a panic that aborts — the pipe closes, `krl-control-plane` reads EOF and exits,
//! removing `KRL_CLEANUP_DIR` first. On a normal drop the child is killed and reaped.

use std::fs::File;
use std::io::{Read as _, Seek as _, SeekFrom};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};

use anyhow::{Context as _, Result};

/// A running child with its log file.
pub(crate) struct Managed {
    name: String,
    child: Child,
    /// Held only so that the pipe stays open; dropping it is the watchdog signal.
    stdin: Option<ChildStdin>,
    log: PathBuf,
}

impl Managed {
    /// Starts `bin args...`, stdout and stderr appended to `log`.
    pub(crate) fn spawn(
        name: &str,
        bin: &Path,
        args: &[String],
        log: &Path,
        cleanup_dir: Option<&Path>,
    ) -> Result<Self> {
        let out = File::options()
            .create(true)
            .append(true)
            .open(log)
            .with_context(|| format!("opening log file {}", log.display()))?;
        let err = out.try_clone()?;
        let mut command = Command::new(bin);
        if let Some(dir) = cleanup_dir {
            command.env("KRL_CLEANUP_DIR", dir);
        }
        let mut child = command
            .args(args)
            .env("KRL_EXIT_ON_STDIN_EOF", "1")
            .stdin(Stdio::piped())
            .stdout(out)
            .stderr(err)
            // Own process group: a terminal's Ctrl-C reaches the test process only;
            // the children then follow through the stdin watchdog.
            .process_group(0)
            .spawn()
            .with_context(|| format!("spawning {name} ({})", bin.display()))?;
        let stdin = child.stdin.take();
        Ok(Self {
            name: name.to_owned(),
            child,
            stdin,
            log: log.to_owned(),
        })
    }

    /// The process id.
    pub(crate) fn id(&self) -> u32 {
        self.child.id()
    }

    /// `Some(description)` if the process has exited.
    pub(crate) fn exited(&mut self) -> Option<String> {
        match self.child.try_wait() {
            Ok(Some(status)) => Some(status.to_string()),
            Ok(None) => None,
            Err(e) => Some(format!("unknown state ({e})")),
        }
    }

    /// An error saying what happened, with the tail of the log.
    pub(crate) fn failure(&self, what: &str) -> anyhow::Error {
        anyhow::anyhow!(
            "{} {what}; last lines of {}:\n{}",
            self.name,
            self.log.display(),
            tail(&self.log, 40)
        )
    }

    /// Kills the process (SIGKILL) and reaps it.
    ///
    /// The stdin pipe is closed only after the process is gone: closing it first
    /// would make the watchdog remove the shared directory (etcd's data too).
    pub(crate) fn kill(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
        drop(self.stdin.take());
    }
}

impl Drop for Managed {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The last `lines` lines of a log file (at most 64 KiB read).
pub(crate) fn tail(path: &Path, lines: usize) -> String {
    let Ok(mut file) = File::open(path) else {
        return format!("(cannot open {})", path.display());
    };
    let len = file.metadata().map_or(0, |m| m.len());
    let _ = file.seek(SeekFrom::Start(len.saturating_sub(64 * 1024)));
    let mut buf = Vec::new();
    let _ = file.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
