//! The client-go candidate `goelect`: its output format, hand-over on SIGTERM
//! (release on cancel) and its exit code.

use std::io::{BufRead as _, BufReader, Lines};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube_runtime_lease_harness::TestEnv;

/// One parsed stdout line of goelect.
#[derive(Debug, Clone, PartialEq)]
struct Event {
    kind: String,
    mono_ns: u64,
    identity: String,
}

fn parse(line: &str) -> Option<Event> {
    let mut parts = line.split_whitespace();
    match parts.next()? {
        "READY" => Some(Event {
            kind: "READY".to_owned(),
            mono_ns: parts.next()?.parse().ok()?,
            identity: String::new(),
        }),
        "EVENT" => Some(Event {
            kind: parts.next()?.to_owned(),
            mono_ns: parts.next()?.parse().ok()?,
            identity: parts.next().unwrap_or("").to_owned(),
        }),
        _ => None,
    }
}

struct Candidate {
    child: Child,
    events: mpsc::Receiver<Event>,
}

impl Candidate {
    fn spawn(bin: &std::path::Path, kubeconfig: &std::path::Path, ns: &str, id: &str) -> Result<Self> {
        let mut child = Command::new(bin)
            .args([
                format!("--kubeconfig={}", kubeconfig.display()),
                format!("--namespace={ns}"),
                "--name=goelect-test".to_owned(),
                format!("--identity={id}"),
                "--lease-duration=4s".to_owned(),
                "--renew-deadline=3s".to_owned(),
                "--retry-period=500ms".to_owned(),
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("spawning goelect")?;
        let lines: Lines<BufReader<ChildStdout>> =
            BufReader::new(child.stdout.take().context("stdout")?).lines();
        let (tx, events) = mpsc::channel();
        std::thread::spawn(move || {
            for ev in lines.map_while(Result::ok).filter_map(|l| parse(&l)) {
                if tx.send(ev).is_err() {
                    break;
                }
            }
        });
        Ok(Self { child, events })
    }

    fn wait_for(&self, kind: &str, timeout: Duration) -> Result<Event> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.events.recv_timeout(left) {
                Ok(ev) if ev.kind == kind => return Ok(ev),
                Ok(_) => {}
                Err(e) => bail!("no {kind} event within {timeout:?}: {e}"),
            }
        }
    }

    fn sigterm(&self) -> Result<()> {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()?;
        anyhow::ensure!(status.success(), "kill -TERM failed");
        Ok(())
    }
}

impl Drop for Candidate {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn goelect_hands_over_on_sigterm() -> Result<()> {
    let env = TestEnv::start().await?;
    let ns = env.new_namespace("goelect").await?;
    let bin = env.goelect_path().await?;

    let a = Candidate::spawn(&bin, env.kubeconfig_path(), &ns, "cand-a")?;
    let ready = a.wait_for("READY", Duration::from_secs(10))?;
    let led = a.wait_for("started-leading", Duration::from_secs(20))?;
    assert_eq!(led.identity, "cand-a");
    assert!(led.mono_ns >= ready.mono_ns);

    let b = Candidate::spawn(&bin, env.kubeconfig_path(), &ns, "cand-b")?;
    let seen = b.wait_for("new-leader", Duration::from_secs(10))?;
    assert_eq!(seen.identity, "cand-a");

    let leases: Api<Lease> = Api::namespaced(env.client().await?, &ns);
    let lease = leases.get("goelect-test").await?;
    assert_eq!(
        lease.spec.as_ref().and_then(|s| s.holder_identity.as_deref()),
        Some("cand-a")
    );

    // SIGTERM: a releases (ReleaseOnCancel), prints stopped-leading, exits 0;
    // b takes over well before the 4 s lease would have expired.
    let mut a = a;
    a.sigterm()?;
    let stopped = a.wait_for("stopped-leading", Duration::from_secs(10))?;
    let status = a.child.wait()?;
    assert!(status.success(), "goelect exited with {status}");
    let b_led = b.wait_for("started-leading", Duration::from_secs(10))?;
    let handover = Duration::from_nanos(b_led.mono_ns.saturating_sub(stopped.mono_ns));
    assert!(handover < Duration::from_secs(3), "hand-over took {handover:?}");
    assert_eq!(b_led.identity, "cand-b");
    Ok(())
}
