//! The operator example (`examples/operator.rs`) against a real kube-apiserver
//! and etcd, as a Deployment of three replicas runs it: each replica with its
//! own identity and its own webhook port on 127.0.0.1, all serving one
//! certificate that the test made (a CA of its own signs it; the clients
//! trust that CA), on one Lease with the short timings of [`Timings::FAST`].
//!
//! For the whole run, one client per replica sends it admission reviews
//! without pause (one request in flight, the next sent when the answer is
//! in, over a kept-alive connection, alternately one the webhook allows and
//! one it denies), and a writer changes the managed `ConfigMap` and `Secret`
//! every 200 ms, so that the leader keeps reconciling. A replica that leaves
//! is replaced by a new one, as a Deployment would. The run goes through:
//!
//! 1. **a SIGTERM handover**: the leader's `/readyz` turns 503 while its
//!    webhook keeps answering; another replica leads within a lease duration
//!    (the release, not expiry); the old leader exits 0 after the drain delay
//!    and within its shutdown budget;
//! 2. **a SIGKILL failover**: another replica leads once the Lease expired;
//! 3. **a loss to another candidate**: the test writes a foreign holder into
//!    the Lease (as a client-go candidate's takeover); the leader's gauge
//!    goes to 0, and the replica neither exits nor restarts; once the foreign
//!    record has expired, a replica leads again (possibly the same one: it
//!    rejoined);
//!
//! and then SIGTERMs every replica. After each change, reconciliation resumes:
//! the new leader stamps both managed objects (both controllers run) with its
//! identity and a larger fencing token. At the end it checks:
//! - no webhook request failed, except on a replica draining after its own
//!   SIGTERM (a request that ended at least the drain delay after the
//!   signal) and, on the replica killed with SIGKILL, the requests in flight
//!   at the kill (its client stops there; a killed pod's endpoints go too);
//! - exactly one replica reconciled at any time: the reconciles every replica
//!   logged (stamped by the replicas' own clocks, one machine) checked by the
//!   harness's interval checker ([`check_reconciles`]: no two processes at
//!   once, fencing tokens growing from term to term), and none while the
//!   foreign holder held the Lease.
//!
//! Every wait is bounded; the replicas are killed when the test ends, passed
//! or failed.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    path::PathBuf,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, SystemTime},
};

use anyhow::{Context as _, Result, anyhow, bail, ensure};
use http_body_util::{BodyExt as _, Full};
use hyper::{StatusCode, body::Bytes, client::conn::http1::SendRequest};
use hyper_util::rt::TokioIo;
use k8s_openapi::{
    api::{
        coordination::v1::Lease,
        core::v1::{ConfigMap, Secret},
    },
    apimachinery::pkg::apis::meta::v1::MicroTime,
    jiff::Timestamp,
};
use kube::{
    Api, Client, ResourceExt,
    api::{ObjectMeta, Patch, PatchParams, PostParams},
};
use kube_runtime_lease_harness::{
    Entry, EventLog, Flavor, Kind, Process, Sig, Timings, cargo::Target, check_reconciles, create_lease,
    free_spec, shared_env,
};
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::{net::TcpStream, process::Command, task::JoinHandle, time::Instant};
use tokio_rustls::TlsConnector;

/// The replicas' election timings: 2 s / 1.5 s / 0.5 s.
const T: Timings = Timings::FAST;
/// How long a replica keeps serving its webhook after SIGTERM.
const DRAIN_DELAY: Duration = Duration::from_secs(2);
/// The lease duration of the foreign holder's record.
const INTRUDER_SECONDS: u64 = 4;
/// The replicas' shutdown budget with these timings:
/// `shutdown_budget(SHUTDOWN_GRACE)` = 20 s grace + 2 × 1.5 s + 5 s release
/// timeout + 0.5 s.
const BUDGET: Duration = Duration::from_millis(28_500);
/// The Lease.
const LEASE: &str = "operator";
/// The managed objects (one per controller).
const MANAGED: &str = "managed";
/// The annotations the reconciles write.
const RECONCILED_BY: &str = "operator.example.com/reconciled-by";
const FENCING_TOKEN: &str = "operator.example.com/fencing-token";

/// Wall-clock time, in nanoseconds since the epoch: the clock of the
/// replicas' log lines.
fn wall_ns() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .ok()
        .and_then(|d| u64::try_from(d.as_nanos()).ok())
        .unwrap_or(0)
}

fn secs(ns: u64) -> f64 {
    Duration::from_nanos(ns).as_secs_f64()
}

// ---------------------------------------------------------------------------
// The webhook's clients
// ---------------------------------------------------------------------------

/// One webhook request: to which replica, when, and why it failed.
#[derive(Clone, Debug)]
struct Outcome {
    replica: String,
    start: u64,
    end: u64,
    error: Option<String>,
}

type Outcomes = Arc<Mutex<Vec<Outcome>>>;

/// A CA, and a serving certificate for `localhost` and 127.0.0.1 it signed,
/// written to `dir` as `tls.crt` and `tls.key`; returns the CA certificate.
fn make_certificates(dir: &std::path::Path) -> Result<CertificateDer<'static>> {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
        KeyUsagePurpose,
    };
    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name.push(DnType::CommonName, "operator-test-ca");
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
    let ca_cert = ca.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate()?;
    let mut leaf = CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])?;
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let cert = leaf.signed_by(&key, &issuer)?;
    std::fs::write(dir.join("tls.crt"), cert.pem())?;
    std::fs::write(dir.join("tls.key"), key.serialize_pem())?;
    Ok(ca_cert.der().clone())
}

fn tls_connector(ca: CertificateDer<'static>) -> Result<TlsConnector> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca)?;
    let config =
        rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
    Ok(TlsConnector::from(Arc::new(config)))
}

/// An HTTPS connection to the replica on `port`, verified against the CA.
async fn connect(port: u16, tls: &TlsConnector) -> Result<SendRequest<Full<Bytes>>> {
    let tcp = TcpStream::connect(("127.0.0.1", port)).await?;
    tcp.set_nodelay(true)?;
    let stream = tls.connect(ServerName::try_from("localhost")?, tcp).await?;
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(sender)
}

/// Sends `request` on `sender`; the status and body of the answer.
async fn send(
    sender: &mut SendRequest<Full<Bytes>>,
    request: http::Request<Full<Bytes>>,
) -> Result<(StatusCode, Bytes)> {
    let response = sender.send_request(request).await?;
    let status = response.status();
    Ok((status, response.into_body().collect().await?.to_bytes()))
}

/// `GET path` on a new connection to the replica on `port` (bounded: 5 s).
async fn get(port: u16, tls: &TlsConnector, path: &str) -> Result<(StatusCode, String)> {
    tokio::time::timeout(Duration::from_secs(5), async {
        let mut sender = connect(port, tls).await?;
        let request = http::Request::get(path)
            .header(http::header::HOST, "localhost")
            .body(Full::new(Bytes::new()))?;
        let (status, body) = send(&mut sender, request).await?;
        Ok((status, String::from_utf8_lossy(&body).into_owned()))
    })
    .await
    .with_context(|| format!("GET {path} timed out"))?
}

/// The `n`-th admission review: a `ConfigMap` the webhook allows (even `n`)
/// or denies (odd `n`: a data key with `password` in it).
fn review(n: u64) -> (String, bool, Vec<u8>) {
    let uid = format!("00000000-0000-0000-0000-{n:012}");
    let allowed = n.is_multiple_of(2);
    let mut data = serde_json::Map::new();
    data.insert(
        if allowed { "colour" } else { "db-password" }.to_owned(),
        "x".into(),
    );
    let body = serde_json::json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": { "group": "", "version": "v1", "kind": "ConfigMap" },
            "resource": { "group": "", "version": "v1", "resource": "configmaps" },
            "name": "cm",
            "namespace": "default",
            "operation": "CREATE",
            "userInfo": { "username": "test" },
            "object": {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": { "name": "cm", "namespace": "default" },
                "data": data,
            },
        },
    });
    (uid, allowed, body.to_string().into_bytes())
}

/// One admission review on `sender` (a new connection if it has none, or if
/// the server closed it: a connection closed before the request was sent is
/// no failed request), checked: 200, the request's uid, the right verdict.
async fn admission(
    sender: &mut Option<SendRequest<Full<Bytes>>>,
    port: u16,
    tls: &TlsConnector,
    n: u64,
) -> Result<()> {
    let reusable = match sender.as_mut() {
        Some(s) => s.ready().await.is_ok(),
        None => false,
    };
    if !reusable {
        *sender = None;
        *sender = Some(connect(port, tls).await.context("connecting")?);
    }
    let s = sender.as_mut().context("no connection")?;
    let (uid, allowed, body) = review(n);
    let request = http::Request::post("/validate")
        .header(http::header::HOST, "localhost")
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)))?;
    let (status, body) = send(s, request).await?;
    ensure!(status == StatusCode::OK, "answered {status}");
    let answer: serde_json::Value = serde_json::from_slice(&body)?;
    let response = &answer["response"];
    ensure!(
        response["uid"] == uid.as_str(),
        "answered for uid {}",
        response["uid"]
    );
    ensure!(
        response["allowed"] == allowed,
        "answered allowed={} for a review that should be allowed={allowed}",
        response["allowed"]
    );
    Ok(())
}

/// A client sending admission reviews to one replica without pause (after a
/// failure, 20 ms, so that a replica that is gone is not hammered), until
/// stopped.
struct WebhookClient {
    stop: Arc<AtomicBool>,
    task: JoinHandle<()>,
}

impl WebhookClient {
    fn start(replica: &str, port: u16, tls: TlsConnector, outcomes: Outcomes) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let (stopped, replica) = (stop.clone(), replica.to_owned());
        let task = tokio::spawn(async move {
            let mut sender = None;
            for n in 0.. {
                if stopped.load(Ordering::SeqCst) {
                    break;
                }
                let start = wall_ns();
                let result =
                    tokio::time::timeout(Duration::from_secs(5), admission(&mut sender, port, &tls, n))
                        .await
                        .unwrap_or_else(|_| Err(anyhow!("no answer within 5 s")));
                let error = result.err().map(|e| format!("{e:#}"));
                if error.is_some() {
                    sender = None;
                }
                let failed = error.is_some();
                outcomes.lock().expect("outcomes").push(Outcome {
                    replica: replica.clone(),
                    start,
                    end: wall_ns(),
                    error,
                });
                if failed {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        });
        Self { stop, task }
    }

    async fn stop(self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = tokio::time::timeout(Duration::from_secs(10), self.task).await;
    }
}

// ---------------------------------------------------------------------------
// The replicas and the scenario
// ---------------------------------------------------------------------------

struct Replica {
    name: String,
    process: Process,
    port: u16,
    client: Option<WebhookClient>,
}

/// What the test did to a replica, and when (wall clock).
#[derive(Clone, Debug)]
struct Signalled {
    replica: String,
    signal: Sig,
    at: u64,
}

struct Scenario {
    client: Client,
    namespace: String,
    bin: PathBuf,
    dir: tempfile::TempDir,
    kubeconfig: PathBuf,
    tls: TlsConnector,
    log: EventLog,
    outcomes: Outcomes,
    live: Vec<Replica>,
    signals: Vec<Signalled>,
    notes: Vec<String>,
}

impl Scenario {
    async fn new() -> Result<Self> {
        let env = shared_env().await?;
        let bin = tokio::task::spawn_blocking(|| {
            kube_runtime_lease_harness::cargo::build(
                "kube-runtime-lease-examples",
                Target::Example("operator"),
                false,
            )
        })
        .await??;
        let client = env.client().await?;
        let namespace = env.new_namespace("operator").await?;
        // A free Lease: the first replica leads at once (no creation hold).
        create_lease(&Api::namespaced(client.clone(), &namespace), LEASE, free_spec()).await?;
        let labels = BTreeMap::from([("operator.example.com/managed".to_owned(), "true".to_owned())]);
        let metadata = ObjectMeta {
            name: Some(MANAGED.to_owned()),
            labels: Some(labels),
            ..ObjectMeta::default()
        };
        Api::<ConfigMap>::namespaced(client.clone(), &namespace)
            .create(
                &PostParams::default(),
                &ConfigMap {
                    metadata: metadata.clone(),
                    ..ConfigMap::default()
                },
            )
            .await?;
        Api::<Secret>::namespaced(client.clone(), &namespace)
            .create(
                &PostParams::default(),
                &Secret {
                    metadata,
                    ..Secret::default()
                },
            )
            .await?;
        let dir = tempfile::Builder::new().prefix("operator-").tempdir()?;
        let tls = tls_connector(make_certificates(dir.path())?)?;
        Ok(Self {
            client,
            namespace,
            bin,
            dir,
            kubeconfig: env.kubeconfig_path().to_owned(),
            tls,
            log: EventLog::new(),
            outcomes: Outcomes::default(),
            live: Vec::new(),
            signals: Vec::new(),
            notes: Vec::new(),
        })
    }

    /// Starts replica `name`; once its webhook serves, starts its client.
    async fn spawn(&mut self, name: &str) -> Result<()> {
        self.spawn_with(name, &[]).await
    }

    /// [`spawn`](Self::spawn), with `env` set on top of the defaults.
    async fn spawn_with(&mut self, name: &str, env: &[(&str, &str)]) -> Result<()> {
        let mut command = Command::new(&self.bin);
        command
            .env("KUBECONFIG", &self.kubeconfig)
            .env("LEASE_NAMESPACE", &self.namespace)
            .env("LEASE_NAME", LEASE)
            .env("IDENTITY", name)
            .env("POD_NAME", name)
            .env("WATCH_NAMESPACE", &self.namespace)
            .env("LEASE_DURATION", T.lease_duration.as_secs_f64().to_string())
            .env("RENEW_DEADLINE", T.renew_deadline.as_secs_f64().to_string())
            .env("RETRY_PERIOD", T.retry_period.as_secs_f64().to_string())
            .env("WEBHOOK_ADDR", "127.0.0.1:0")
            .env("WEBHOOK_CERT", self.dir.path().join("tls.crt"))
            .env("WEBHOOK_KEY", self.dir.path().join("tls.key"))
            .env("WEBHOOK_DRAIN_DELAY", DRAIN_DELAY.as_secs_f64().to_string())
            // Plain log lines (the test reads them; a pipe gets no colour
            // anyway).
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1");
        for (key, value) in env {
            command.env(key, value);
        }
        let process = Process::spawn(name, Flavor::Rust, command, &self.log)?;
        let serving = self
            .log
            .wait_for(
                &format!("{name} to serve its webhook"),
                Duration::from_secs(30),
                |e| {
                    e.process == name
                        && (e.kind == Kind::StdoutClosed
                            || (e.kind == Kind::Stderr && e.detail.contains("over HTTPS")))
                },
            )
            .await?;
        let port = field(&serving.detail, "addr")
            .and_then(|addr| addr.rsplit(':').next()?.parse().ok())
            .with_context(|| format!("{name} exited or printed no address:\n{}", self.output(name)))?;
        let client = WebhookClient::start(name, port, self.tls.clone(), self.outcomes.clone());
        self.live.push(Replica {
            name: name.to_owned(),
            process,
            port,
            client: Some(client),
        });
        Ok(())
    }

    /// Replica `name`'s stderr.
    fn output(&self, name: &str) -> String {
        self.log
            .filter(|e| e.process == name && e.kind == Kind::Stderr)
            .iter()
            .fold(String::new(), |mut s, e| {
                let _ = writeln!(s, "{}", e.detail);
                s
            })
    }

    fn replica(&self, name: &str) -> Result<&Replica> {
        self.live
            .iter()
            .find(|r| r.name == name)
            .with_context(|| format!("no live replica {name}"))
    }

    /// Removes replica `name` from the live ones (it is leaving).
    fn take(&mut self, name: &str) -> Result<Replica> {
        let i = self
            .live
            .iter()
            .position(|r| r.name == name)
            .with_context(|| format!("no live replica {name}"))?;
        Ok(self.live.remove(i))
    }

    /// Waits until the Lease names a live replica not in `excluding`.
    async fn wait_leader(&self, excluding: &[&str], within: Duration) -> Result<(String, u64)> {
        let leases = Api::<Lease>::namespaced(self.client.clone(), &self.namespace);
        let deadline = Instant::now() + within;
        loop {
            let holder = leases
                .get(LEASE)
                .await?
                .spec
                .and_then(|s| s.holder_identity)
                .unwrap_or_default();
            if !excluding.contains(&holder.as_str()) && self.live.iter().any(|r| r.name == holder) {
                return Ok((holder, wall_ns()));
            }
            ensure!(
                Instant::now() < deadline,
                "no new leader (other than {excluding:?}) within {within:?}; the Lease names {holder:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Replica `name`'s leader gauge, `leader_election_is_leader`, from its
    /// `/metrics`.
    async fn gauge(&self, name: &str) -> Result<i64> {
        let (status, text) = get(self.replica(name)?.port, &self.tls, "/metrics").await?;
        ensure!(status == StatusCode::OK, "{name}'s /metrics answered {status}");
        text.lines()
            .find(|l| l.starts_with("leader_election_is_leader{"))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .with_context(|| format!("no leader_election_is_leader in {name}'s /metrics:\n{text}"))
    }

    async fn wait_gauge(&self, name: &str, value: i64, within: Duration) -> Result<()> {
        let deadline = Instant::now() + within;
        loop {
            let now = self.gauge(name).await?;
            if now == value {
                return Ok(());
            }
            ensure!(
                Instant::now() < deadline,
                "{name}'s leader gauge is {now}, not {value}, after {within:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The largest fencing token stamped on the managed objects so far.
    async fn stamped_token(&self) -> Result<i64> {
        let (cm, secret) = self.stamps().await?;
        Ok(cm.1.max(secret.1))
    }

    /// Who stamped the managed `ConfigMap` and `Secret` last, with which token.
    async fn stamps(&self) -> Result<((String, i64), (String, i64))> {
        fn stamp(annotations: &BTreeMap<String, String>) -> (String, i64) {
            (
                annotations.get(RECONCILED_BY).cloned().unwrap_or_default(),
                annotations
                    .get(FENCING_TOKEN)
                    .and_then(|t| t.parse().ok())
                    .unwrap_or(-1),
            )
        }
        let cm = Api::<ConfigMap>::namespaced(self.client.clone(), &self.namespace)
            .get(MANAGED)
            .await?;
        let secret = Api::<Secret>::namespaced(self.client.clone(), &self.namespace)
            .get(MANAGED)
            .await?;
        Ok((stamp(cm.annotations()), stamp(secret.annotations())))
    }

    /// Waits until both controllers of `leader` have stamped their object
    /// with a token larger than `after`: reconciliation has resumed.
    async fn wait_resumed(&mut self, leader: &str, after: i64, since: u64) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let (cm, secret) = self.stamps().await?;
            if cm.0 == leader && secret.0 == leader && cm.1 > after && secret.1 > after {
                self.notes.push(format!(
                    "{leader} reconciled both objects (token {}) {:.2} s after the change",
                    cm.1,
                    secs(wall_ns() - since)
                ));
                return Ok(());
            }
            ensure!(
                Instant::now() < deadline,
                "reconciliation did not resume under {leader} (token > {after}) within 15 s: ConfigMap {cm:?}, Secret {secret:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn signalled(&mut self, replica: &str, signal: Sig) -> u64 {
        let at = wall_ns();
        self.signals.push(Signalled {
            replica: replica.to_owned(),
            signal,
            at,
        });
        at
    }

    /// Sends SIGTERM to `name`; returns when it was sent.
    fn sigterm(&mut self, name: &str) -> Result<u64> {
        let at = self.signalled(name, Sig::Term);
        self.replica(name)?.process.signal(Sig::Term)?;
        Ok(at)
    }

    /// Waits until `name`, sent SIGTERM at `at`, exits; checks that it exited
    /// 0 after the drain delay and within its budget, having logged each step.
    async fn wait_exit(&mut self, name: &str, at: u64) -> Result<()> {
        let mut replica = self.take(name)?;
        let status = replica.process.wait_exit(BUDGET + Duration::from_secs(5)).await;
        let took = wall_ns() - at;
        if let Some(client) = replica.client.take() {
            client.stop().await;
        }
        let status = status.with_context(|| format!("{name} after SIGTERM:\n{}", self.output(name)))?;
        let output = self.output(name);
        ensure!(
            status.success(),
            "{name} exited with {status} after SIGTERM:\n{output}"
        );
        ensure!(
            Duration::from_nanos(took) >= DRAIN_DELAY,
            "{name} exited {:.2} s after SIGTERM, before the drain delay ({DRAIN_DELAY:?}):\n{output}",
            secs(took)
        );
        for step in ["step 1/4", "step 2/4", "step 3/4", "step 4/4", "exiting"] {
            ensure!(output.contains(step), "{name} did not log {step:?}:\n{output}");
        }
        self.notes
            .push(format!("{name} exited 0 {:.2} s after SIGTERM", secs(took)));
        Ok(())
    }

    /// Kills `name` (SIGKILL) and stops its client; returns when.
    async fn sigkill(&mut self, name: &str) -> Result<u64> {
        let mut replica = self.take(name)?;
        let at = self.signalled(name, Sig::Kill);
        replica.process.kill().await?;
        if let Some(client) = replica.client.take() {
            client.stop().await;
        }
        Ok(at)
    }

    /// Writes a foreign holder into the Lease, held for
    /// [`INTRUDER_SECONDS`] (as another candidate's takeover); returns when
    /// (before the write).
    async fn take_over(&self) -> Result<u64> {
        let leases = Api::<Lease>::namespaced(self.client.clone(), &self.namespace);
        for _ in 0..20 {
            let mut lease = leases.get(LEASE).await?;
            let at = wall_ns();
            let spec = lease.spec.get_or_insert_default();
            let now = MicroTime(Timestamp::now());
            spec.holder_identity = Some("intruder".to_owned());
            spec.lease_duration_seconds = Some(i32::try_from(INTRUDER_SECONDS)?);
            spec.acquire_time = Some(now.clone());
            spec.renew_time = Some(now);
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
            match leases.replace(LEASE, &PostParams::default(), &lease).await {
                Ok(_) => return Ok(at),
                // The leader renewed in between: read again.
                Err(kube::Error::Api(status)) if status.code == 409 => {}
                Err(e) => return Err(e.into()),
            }
        }
        bail!("the foreign write conflicted 20 times")
    }
}

/// The value of `key=` in a log line (quotes trimmed).
fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let at = line.find(&format!(" {key}="))? + key.len() + 2;
    line[at..].split_whitespace().next().map(|v| v.trim_matches('"'))
}

/// The wall-clock stamp of a log line (its first word, RFC 3339).
fn stamp(line: &str) -> Option<u64> {
    let ts: Timestamp = line.split_whitespace().next()?.parse().ok()?;
    u64::try_from(ts.as_nanosecond()).ok()
}

/// Every reconcile the replicas logged, as the interval checker's
/// `RECONCILE` entries (one shard: the Lease): `[start, end]` from its
/// `reconcile started` and `reconcile done` lines (a reconcile dropped at a
/// loss has no end: its start alone).
fn reconciles(log: &EventLog) -> Vec<Entry> {
    let mut open: BTreeMap<(String, String), (u64, String)> = BTreeMap::new();
    let mut out = Vec::new();
    let mut finish = |process: &str, object: &str, start: u64, end: u64, token: &str| {
        out.push(Entry {
            seq: out.len(),
            process: process.to_owned(),
            kind: Kind::Reconcile,
            at: start,
            who: object.to_owned(),
            detail: format!("{end} 0 {token}"),
        });
    };
    for e in log.filter(|e| e.kind == Kind::Stderr) {
        let (Some(at), Some(object), Some(token)) = (
            stamp(&e.detail),
            field(&e.detail, "object"),
            field(&e.detail, "token"),
        ) else {
            continue;
        };
        let key = (e.process.clone(), object.to_owned());
        if e.detail.contains(" reconcile started ") {
            if let Some((start, token)) = open.insert(key, (at, token.to_owned())) {
                finish(&e.process, object, start, start, &token);
            }
        } else if e.detail.contains(" reconcile done ")
            && let Some((start, token)) = open.remove(&key)
        {
            finish(&e.process, object, start, at, &token);
        }
    }
    for ((process, object), (start, token)) in open {
        finish(&process, &object, start, start, &token);
    }
    out
}

/// Keeps changing the managed objects' data (every 200 ms), so that the
/// leader keeps reconciling.
fn start_writer(client: Client, namespace: &str) -> JoinHandle<()> {
    let cms = Api::<ConfigMap>::namespaced(client.clone(), namespace);
    let secrets = Api::<Secret>::namespaced(client, namespace);
    tokio::spawn(async move {
        for n in 0u64.. {
            let data = serde_json::json!({ "data": { "n": n.to_string() } });
            let string_data = serde_json::json!({ "stringData": { "n": n.to_string() } });
            let _ = cms
                .patch(MANAGED, &PatchParams::default(), &Patch::Merge(&data))
                .await;
            let _ = secrets
                .patch(MANAGED, &PatchParams::default(), &Patch::Merge(&string_data))
                .await;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
}

/// Checks every webhook request: failures only on a replica draining after
/// its own SIGTERM, or in flight when it was killed. Returns a summary.
fn check_webhook(outcomes: &[Outcome], signals: &[Signalled]) -> Result<String> {
    let excused = |o: &Outcome| {
        signals.iter().any(|s| {
            s.replica == o.replica
                && match s.signal {
                    Sig::Term => o.end >= s.at + u64::try_from(DRAIN_DELAY.as_nanos()).unwrap_or(u64::MAX),
                    Sig::Kill => o.end >= s.at,
                    _ => false,
                }
        })
    };
    let failed: Vec<&Outcome> = outcomes.iter().filter(|o| o.error.is_some()).collect();
    let unexcused: Vec<String> = failed
        .iter()
        .filter(|o| !excused(o))
        .take(20)
        .map(|o| {
            format!(
                "{} at {}: {}",
                o.replica,
                o.start,
                o.error.as_deref().unwrap_or("")
            )
        })
        .collect();
    ensure!(
        unexcused.is_empty(),
        "webhook requests failed on replicas that were not draining:\n{}",
        unexcused.join("\n")
    );
    let mut per_replica: BTreeMap<&str, usize> = BTreeMap::new();
    for o in outcomes.iter().filter(|o| o.error.is_none()) {
        *per_replica.entry(&o.replica).or_default() += 1;
    }
    Ok(format!(
        "{} webhook requests answered ({per_replica:?}), {} failed, all on a replica after its drain delay or at its kill",
        outcomes.len() - failed.len(),
        failed.len()
    ))
}

/// A SIGTERM handover of `leader`: not ready at once, serving for the drain
/// delay, another leader within a lease duration, a clean exit.
async fn sigterm_handover(s: &mut Scenario, leader: &str, replacement: &str) -> Result<String> {
    let before = s.stamped_token().await?;
    let port = s.replica(leader)?.port;
    let at = s.sigterm(leader)?;
    // /readyz turns 503 while the webhook still answers.
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let (status, _) = get(port, &s.tls, "/readyz")
            .await
            .with_context(|| format!("{leader}'s /readyz after SIGTERM"))?;
        if status == StatusCode::SERVICE_UNAVAILABLE {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "{leader}'s /readyz still {status} 3 s after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let unready = wall_ns();
    let (next, led) = s.wait_leader(&[leader], Duration::from_secs(10)).await?;
    ensure!(
        Duration::from_nanos(led - at) < T.lease_duration,
        "{next} led {:.2} s after {leader}'s SIGTERM: not by the release (the lease duration is {:?})",
        secs(led - at),
        T.lease_duration
    );
    s.wait_resumed(&next, before, at).await?;
    s.wait_exit(leader, at).await?;
    let served = s
        .outcomes
        .lock()
        .expect("outcomes")
        .iter()
        .filter(|o| o.replica == leader && o.error.is_none() && o.start > unready)
        .count();
    ensure!(
        served > 0,
        "{leader} answered no webhook request once /readyz said 503"
    );
    s.spawn(replacement).await?;
    Ok(format!(
        "SIGTERM {leader}: not ready after {:.3} s, {served} webhook requests answered after that, {next} led after {:.3} s",
        secs(unready - at),
        secs(led - at)
    ))
}

/// A SIGKILL failover of `leader`: another leads once the Lease expired.
async fn sigkill_failover(s: &mut Scenario, leader: &str, replacement: &str) -> Result<String> {
    let before = s.stamped_token().await?;
    let at = s.sigkill(leader).await?;
    let (next, led) = s
        .wait_leader(&[leader], T.lease_duration + Duration::from_secs(5))
        .await?;
    ensure!(
        Duration::from_nanos(led - at) >= T.lease_duration.saturating_sub(T.retry_period),
        "{next} led {:.2} s after {leader} was killed: before its Lease could expire",
        secs(led - at)
    );
    s.wait_resumed(&next, before, at).await?;
    s.spawn(replacement).await?;
    Ok(format!(
        "SIGKILL {leader}: {next} led after {:.3} s",
        secs(led - at)
    ))
}

/// The Lease taken by a foreign holder from `leader`: its gauge goes to 0,
/// it neither exits nor restarts, and a replica leads once the foreign
/// record expired. Returns the new leader, when the write was made, and
/// when `leader` logged its loss.
async fn loss_to_another(s: &mut Scenario, leader: &str) -> Result<(String, u64, u64, String)> {
    let before = s.stamped_token().await?;
    let at = s.take_over().await?;
    s.wait_gauge(leader, 0, Duration::from_secs(3)).await?;
    let gauge_zero = wall_ns();
    let lost = s
        .log
        .wait_for(
            &format!("{leader} to log its loss"),
            Duration::from_secs(5),
            |e| {
                e.process == leader
                    && e.kind == Kind::Stderr
                    && e.detail.contains("leadership lost")
                    && stamp(&e.detail).is_some_and(|t| t >= at)
            },
        )
        .await?;
    let lost_at = stamp(&lost.detail).context("a log line without a timestamp")?;
    let (next, led) = s
        .wait_leader(
            &["intruder"],
            Duration::from_secs(INTRUDER_SECONDS) + T.lease_duration + Duration::from_secs(5),
        )
        .await?;
    s.wait_resumed(&next, before, at).await?;
    let exited = s
        .log
        .find(|e| e.process == leader && e.kind == Kind::StdoutClosed);
    ensure!(
        exited.is_none(),
        "{leader} exited after losing the Lease:\n{}",
        s.output(leader)
    );
    let starts = s
        .log
        .filter(|e| e.process == leader && e.kind == Kind::Stderr && e.detail.contains("operator: starting"))
        .len();
    ensure!(starts == 1, "{leader} started {starts} times");
    ensure!(
        s.output(leader).contains("rejoining the election"),
        "{leader} did not rejoin the election:\n{}",
        s.output(leader)
    );
    let summary = format!(
        "Lease taken from {leader}: gauge 0 after {:.3} s, {next} led after {:.3} s; {leader} still runs",
        secs(gauge_zero - at),
        secs(led - at)
    );
    Ok((next, at, lost_at, summary))
}

/// Checks the reconciles: one replica at a time, and none while the foreign
/// holder held the Lease (from the loser's loss to the foreign record's
/// expiry).
fn check_reconciling(log: &EventLog, lost_at: u64, taken_at: u64) -> Result<String> {
    let entries = reconciles(log);
    ensure!(!entries.is_empty(), "no reconcile logged");
    let checked = check_reconciles(&entries)?;
    let held_until = taken_at + INTRUDER_SECONDS * 1_000_000_000;
    let during: Vec<String> = entries
        .iter()
        .filter(|e| e.at > lost_at && e.at < held_until)
        .map(|e| format!("{} {} at +{:.3} s", e.process, e.who, secs(e.at - taken_at)))
        .collect();
    ensure!(
        during.is_empty(),
        "reconciles while the foreign holder held the Lease: {during:?}"
    );
    Ok(format!(
        "{} reconciles of {} objects, one replica at a time, {} moves between replicas",
        checked.reconciles, checked.objects, checked.moves
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_serves_its_webhook_through_handover_failover_and_loss() -> Result<()> {
    let mut s = Scenario::new().await?;
    let writer = start_writer(s.client.clone(), &s.namespace);
    let result = run(&mut s).await;
    writer.abort();
    for replica in &mut s.live {
        if let Some(client) = replica.client.take() {
            client.stop().await;
        }
    }
    match result {
        Ok(()) => {
            println!("{}", s.notes.join("\n"));
            Ok(())
        }
        Err(e) => Err(e.context(format!(
            "notes so far:\n{}\nlog:\n{}",
            s.notes.join("\n"),
            s.log.dump()
        ))),
    }
}

async fn run(s: &mut Scenario) -> Result<()> {
    let started = wall_ns();
    for name in ["a", "b", "c"] {
        s.spawn(name).await?;
    }
    let (first, _) = s.wait_leader(&[], Duration::from_secs(30)).await?;
    s.wait_resumed(&first, -1, started).await?;
    for replica in ["a", "b", "c"] {
        let (status, body) = get(s.replica(replica)?.port, &s.tls, "/livez").await?;
        ensure!(status == StatusCode::OK, "{replica}'s /livez: {status} {body}");
        s.wait_gauge(replica, i64::from(replica == first), Duration::from_secs(3))
            .await?;
    }

    let note = sigterm_handover(s, &first, "d").await?;
    s.notes.push(note);
    let (second, _) = s.wait_leader(&[], Duration::from_secs(1)).await?;
    let note = sigkill_failover(s, &second, "e").await?;
    s.notes.push(note);
    let (third, _) = s.wait_leader(&[], Duration::from_secs(1)).await?;
    let (fourth, taken_at, lost_at, note) = loss_to_another(s, &third).await?;
    s.notes.push(note);
    s.wait_gauge(&fourth, 1, Duration::from_secs(3)).await?;

    // Every replica left is sent SIGTERM, and exits cleanly.
    let names: Vec<String> = s.live.iter().map(|r| r.name.clone()).collect();
    let mut sent = Vec::new();
    for name in &names {
        sent.push((name.clone(), s.sigterm(name)?));
    }
    for (name, at) in sent {
        s.wait_exit(&name, at).await?;
    }

    let webhook = check_webhook(&s.outcomes.lock().expect("outcomes"), &s.signals)?;
    s.notes.push(webhook);
    let reconciling = check_reconciling(&s.log, lost_at, taken_at)?;
    s.notes.push(reconciling);
    Ok(())
}

/// Review (operator env handling, never none for the guarded work): the
/// fencing tokens of one Lease say nothing about another's. An object last
/// stamped by a term of token 5 (say, before the operator's Lease was renamed
/// with `LEASE_NAME`, or before the election was switched off with
/// `LEADER_ELECT=false`, whose term has token 0) must still be reconciled:
/// the operator must not take the old stamp for "a newer term wrote it" and
/// skip the object for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_reconciles_objects_stamped_under_another_lease_or_with_the_election_off() -> Result<()> {
    let cases: [(&str, &[(&str, &str)]); 2] = [
        ("with LEADER_ELECT=false", &[("LEADER_ELECT", "false")]),
        ("on a renamed Lease", &[("LEASE_NAME", "operator-renamed")]),
    ];
    for (case, env) in cases {
        let mut s = Scenario::new().await?;
        // Both managed objects, as a term of token 5 of the earlier Lease left them.
        let old = serde_json::json!({ "metadata": { "annotations": {
            "operator.example.com/checksum": "stale",
            RECONCILED_BY: "an-earlier-replica",
            FENCING_TOKEN: "5",
        }}});
        Api::<ConfigMap>::namespaced(s.client.clone(), &s.namespace)
            .patch(MANAGED, &PatchParams::default(), &Patch::Merge(&old))
            .await?;
        Api::<Secret>::namespaced(s.client.clone(), &s.namespace)
            .patch(MANAGED, &PatchParams::default(), &Patch::Merge(&old))
            .await?;
        s.spawn_with("a", env).await?;
        let deadline = Instant::now() + Duration::from_secs(15);
        let result = loop {
            let (cm, secret) = s.stamps().await?;
            if cm.0 == "a" && secret.0 == "a" {
                break Ok(());
            }
            if Instant::now() >= deadline {
                break Err(anyhow!(
                    "{case}: the operator did not reconcile the objects stamped under the earlier Lease within 15 s \
                     (ConfigMap {cm:?}, Secret {secret:?}); its log:\n{}",
                    s.output("a")
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        s.sigkill("a").await?;
        result?;
    }
    Ok(())
}

/// Review (operator env handling, no panic on bad input): shutdown settings
/// that `env_seconds` accepts as durations but that no clock can add up
/// (`WEBHOOK_DRAIN_DELAY` and `WEBHOOK_DRAIN_TIMEOUT` of 1e19 s under a
/// `SHUTDOWN_GRACE` of 1.8e19 s) are refused at start with a message naming
/// them, not a panic at start (`delay + drain` overflows) or, worse, at
/// SIGTERM (`signalled + delay` overflows an `Instant` after the release,
/// so the webhook is never drained).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_refuses_shutdown_settings_out_of_range_without_panicking() -> Result<()> {
    let s = Scenario::new().await?;
    let cases: [(&str, &[(&str, &str)]); 2] = [
        (
            "huge",
            &[
                ("SHUTDOWN_GRACE", "1.8e19"),
                ("WEBHOOK_DRAIN_TIMEOUT", "1e19"),
                ("WEBHOOK_DRAIN_DELAY", "1e19"),
            ],
        ),
        (
            "huge-delay",
            &[
                ("SHUTDOWN_GRACE", "1.8e19"),
                ("WEBHOOK_DRAIN_TIMEOUT", "0"),
                ("WEBHOOK_DRAIN_DELAY", "1e19"),
            ],
        ),
    ];
    for (name, env) in cases {
        let mut command = Command::new(&s.bin);
        command
            .env("KUBECONFIG", &s.kubeconfig)
            .env("LEASE_NAMESPACE", &s.namespace)
            .env("LEASE_NAME", LEASE)
            .env("IDENTITY", name)
            .env("WATCH_NAMESPACE", &s.namespace)
            .env("WEBHOOK_ADDR", "127.0.0.1:0")
            .env("WEBHOOK_CERT", s.dir.path().join("tls.crt"))
            .env("WEBHOOK_KEY", s.dir.path().join("tls.key"))
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1");
        for (key, value) in env {
            command.env(key, value);
        }
        let mut process = Process::spawn(name, Flavor::Rust, command, &s.log)?;
        // Refused at start, or serving: then SIGTERM, as a rollout would.
        let first = s
            .log
            .wait_for(
                &format!("{name} to start or exit"),
                Duration::from_secs(30),
                |e| {
                    e.process == name
                        && (e.kind == Kind::StdoutClosed
                            || (e.kind == Kind::Stderr && e.detail.contains("over HTTPS")))
                },
            )
            .await?;
        if first.kind == Kind::Stderr {
            process.signal(Sig::Term)?;
        }
        let status = process.wait_exit(Duration::from_secs(60)).await;
        let output = s.output(name);
        let status = status.with_context(|| format!("{name}: did not exit:\n{output}"))?;
        ensure!(
            !output.contains("panicked"),
            "{name}: the operator panicked on its shutdown settings ({status}; {}):\n{output}",
            if first.kind == Kind::Stderr {
                "after SIGTERM"
            } else {
                "at start"
            }
        );
        ensure!(
            first.kind == Kind::StdoutClosed && !status.success() && output.contains("WEBHOOK_DRAIN_DELAY"),
            "{name}: not refused at start with a message naming the setting ({status}):\n{output}"
        );
    }
    Ok(())
}

/// Review (RBAC verb by verb, least privilege): the operator runs on
/// exactly the verbs its chart grants minus `get` on `configmaps` and
/// `secrets`: it only lists and watches them (its Controllers) and
/// merge-patches them, so the chart's `get` is not needed. One replica
/// with a user that has the Lease's Role and that rule leads and stamps
/// both managed objects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_needs_no_get_on_the_objects_it_reconciles() -> Result<()> {
    use k8s_openapi::api::rbac::v1::{PolicyRule, Role};
    use kube_runtime_lease_harness::TestEnv;
    let mut s = Scenario::new().await?;
    let env = shared_env().await?;
    let user = format!("operator-{}", s.namespace);
    let allow = |group: &str, resources: &[&str], verbs: &[&str]| PolicyRule {
        api_groups: Some(vec![group.to_owned()]),
        resources: Some(resources.iter().map(|r| (*r).to_owned()).collect()),
        verbs: verbs.iter().map(|v| (*v).to_owned()).collect(),
        ..PolicyRule::default()
    };
    let meta = || ObjectMeta {
        name: Some("operator".to_owned()),
        ..ObjectMeta::default()
    };
    let role = Role {
        metadata: meta(),
        rules: Some(vec![
            allow(
                "coordination.k8s.io",
                &["leases"],
                &["get", "create", "update", "list", "watch"],
            ),
            allow("", &["configmaps", "secrets"], &["list", "watch", "patch"]),
        ]),
    };
    Api::<Role>::namespaced(s.client.clone(), &s.namespace)
        .create(&PostParams::default(), &role)
        .await?;
    TestEnv::bind_role(&s.client, &s.namespace, "operator", &user).await?;
    s.kubeconfig = env.user_kubeconfig(&user, &[])?;
    s.spawn("a").await?;
    let deadline = Instant::now() + Duration::from_secs(30);
    let result = loop {
        let (cm, secret) = s.stamps().await?;
        if cm.0 == "a" && secret.0 == "a" {
            break Ok(());
        }
        if Instant::now() >= deadline {
            break Err(anyhow!(
                "the operator without `get` did not reconcile both objects within 30 s (ConfigMap {cm:?}, \
                 Secret {secret:?}); its log:\n{}",
                s.output("a")
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    s.sigkill("a").await?;
    result
}
