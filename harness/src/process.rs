//! [`Process`]: a candidate process whose output feeds an [`EventLog`].

use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use anyhow::{Context as _, Result, anyhow};
use rustix::process::Pid;
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::{Child, ChildStdin, Command};

use crate::clock::now_ns;
use crate::events::{EventLog, Flavor, Kind, Sig, parse_line};

/// Where a [`Process`]'s output goes besides its [`EventLog`]
/// ([`Process::spawn_with`]); by default, nowhere else.
#[derive(Debug, Default)]
pub struct Outputs {
    /// The process's stderr goes to this file instead of the log (its lines
    /// are not recorded): for candidates whose logs are kept, not judged.
    pub stderr_to: Option<std::fs::File>,
    /// Every stdout line is also appended to this file, as `[<name> stdout]
    /// <line>` (the file is opened for each line, so that several processes
    /// can share it).
    pub copy_stdout_to: Option<PathBuf>,
}

/// A candidate process whose output feeds an [`EventLog`]. Killed on drop.
#[derive(Debug)]
pub struct Process {
    name: String,
    flavor: Flavor,
    pid: Pid,
    child: Child,
    /// Held open: goelect exits when it closes (`--exit-on-stdin-eof`).
    _stdin: Option<ChildStdin>,
    log: EventLog,
    status: Option<ExitStatus>,
}

impl Process {
    /// Spawns `cmd` (stdin, stdout and stderr piped, killed on drop) under
    /// `name`; a task per output stream appends its lines to `log`.
    ///
    /// # Errors
    /// When the process cannot be started.
    pub fn spawn(name: &str, flavor: Flavor, cmd: Command, log: &EventLog) -> Result<Self> {
        Self::spawn_with(name, flavor, cmd, log, Outputs::default())
    }

    /// [`Process::spawn`], with some output going elsewhere too ([`Outputs`]).
    /// What else `cmd` was given stays (a `pre_exec`, such as a parent-death
    /// signal, environment, arguments).
    ///
    /// # Errors
    /// When the process cannot be started.
    pub fn spawn_with(
        name: &str,
        flavor: Flavor,
        mut cmd: Command,
        log: &EventLog,
        outputs: Outputs,
    ) -> Result<Self> {
        let stderr_to = outputs.stderr_to.map_or_else(Stdio::piped, Stdio::from);
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr_to)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("spawning candidate {name}"))?;
        let pid = child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .and_then(Pid::from_raw)
            .ok_or_else(|| anyhow!("candidate {name} has no pid"))?;
        log.record(
            name,
            Kind::Spawned,
            now_ns(),
            "",
            &format!("{flavor:?}, pid {}", pid.as_raw_pid()),
        );
        let stdout = child.stdout.take().context("stdout")?;
        let (l, n) = (log.clone(), name.to_owned());
        let copy_to = outputs.copy_stdout_to;
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(path) = &copy_to
                    && let Ok(mut f) = std::fs::OpenOptions::new().append(true).open(path)
                {
                    use std::io::Write as _;
                    let _ = writeln!(f, "[{n} stdout] {line}");
                }
                match parse_line(&line) {
                    Some((kind, at, who, detail)) => l.record(&n, kind, at, &who, &detail),
                    None => l.record(&n, Kind::Other, now_ns(), "", &line),
                };
            }
            l.record(&n, Kind::StdoutClosed, now_ns(), "", "");
        });
        if let Some(stderr) = child.stderr.take() {
            let (l, n) = (log.clone(), name.to_owned());
            tokio::spawn(async move {
                let mut lines = BufReader::new(stderr).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    l.record(&n, Kind::Stderr, now_ns(), "", line.trim_end());
                }
            });
        }
        Ok(Self {
            name: name.to_owned(),
            flavor,
            pid,
            _stdin: child.stdin.take(),
            child,
            log: log.clone(),
            status: None,
        })
    }

    /// Its name in the log (also its identity, for the helpers of this crate).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.pid.as_raw_pid().unsigned_abs()
    }

    /// Which implementation it runs.
    pub fn flavor(&self) -> Flavor {
        self.flavor
    }

    /// Sends `sig` and records it in the log; returns the recorded time.
    ///
    /// The stamp is taken after sending (the process can no longer act on its
    /// own after it), except for SIGCONT, stamped before sending (the process
    /// cannot act before it).
    ///
    /// # Errors
    /// When `kill(2)` fails.
    pub fn signal(&self, sig: Sig) -> Result<u64> {
        let before = now_ns();
        send_signal(self.pid(), sig).with_context(|| format!("sending {sig:?} to {}", self.name))?;
        // SIGKILL and SIGSTOP take effect at some point before `kill` returns:
        // the later reading is the conservative one. SIGCONT and SIGTERM start
        // something in the process, which may react (and print a timestamp)
        // before `kill` returns: the earlier reading is the right one.
        let at = if matches!(sig, Sig::Cont | Sig::Term) {
            before
        } else {
            now_ns()
        };
        Ok(self
            .log
            .record(&self.name, Kind::Signal(sig), at, "", &format!("{sig:?}")))
    }

    /// SIGKILL, then reaps the process. Returns the time of the kill.
    ///
    /// # Errors
    /// When the signal cannot be sent or the process is not reaped within 10 s.
    pub async fn kill(&mut self) -> Result<u64> {
        let at = self.signal(Sig::Kill)?;
        self.wait_exit(Duration::from_secs(10)).await?;
        Ok(at)
    }

    /// Waits up to `timeout` for the process to exit, then SIGKILLs and reaps
    /// it. Returns whether it exited on its own.
    ///
    /// # Errors
    /// When it does not exit on its own and cannot be killed and reaped
    /// ([`Process::kill`]).
    pub async fn reap(&mut self, timeout: Duration) -> Result<bool> {
        if self.wait_exit(timeout).await.is_ok() {
            return Ok(true);
        }
        self.kill().await?;
        Ok(false)
    }

    /// Waits for the process to exit and records it.
    ///
    /// # Errors
    /// After `timeout`.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Result<ExitStatus> {
        if let Some(status) = self.status {
            return Ok(status);
        }
        let status = tokio::time::timeout(timeout, self.child.wait())
            .await
            .with_context(|| format!("{} did not exit within {timeout:?}", self.name))?
            .with_context(|| format!("waiting for {}", self.name))?;
        self.log
            .record(&self.name, Kind::Exited, now_ns(), "", &status.to_string());
        self.status = Some(status);
        Ok(status)
    }
}

/// Sends `sig` to the process `pid` (`kill(2)`): for a child the test did not
/// spawn as a [`Process`] (which has [`Process::signal`], recorded in its log).
///
/// # Errors
/// When `pid` is not a valid process id or `kill(2)` fails (no such process,
/// no permission).
pub fn send_signal(pid: u32, sig: Sig) -> Result<()> {
    let id = i32::try_from(pid)
        .ok()
        .and_then(Pid::from_raw)
        .ok_or_else(|| anyhow!("{pid} is not a process id"))?;
    rustix::process::kill_process(id, sig.signal()).with_context(|| format!("sending {sig:?} to pid {pid}"))
}

/// Removes the process named `name` from `procs` and returns it (to signal,
/// kill or reap it while the others run on).
///
/// # Errors
/// When no process of `procs` has that name.
pub fn take_process(procs: &mut Vec<Process>, name: &str) -> Result<Process> {
    let i = procs
        .iter()
        .position(|p| p.name() == name)
        .with_context(|| format!("no live process {name}"))?;
    Ok(procs.remove(i))
}
