//! A real Kubernetes control plane for kube-runtime-lease's tests.
//!
//! [`TestEnv::start`] runs a real etcd and a real kube-apiserver on loopback
//! (free ports, never 2379/2380), both built from their upstream Go modules by
//! `scripts/control-plane.sh build` into one cached binary, `kcp`. The same build
//! produces `goelect`, a client-go leader-election candidate (see
//! [`TestEnv::goelect_path`]).
//!
//! The apiserver runs with `--feature-gates=CoordinatedLeaderElection=true` and
//! `--runtime-config=coordination.k8s.io/v1beta1=true`, so `spec.strategy` and
//! `spec.preferredHolder` of `coordination.k8s.io/v1` Leases are persisted and
//! `LeaseCandidate` (v1beta1) is served. Authorization is RBAC; the admin user
//! is in `system:masters`. No controllers run: namespaces never finish deleting,
//! so each test takes a fresh one from [`TestEnv::new_namespace`].
//!
//! Processes are killed when the [`TestEnv`] is dropped; if the test process dies
//! without dropping it (SIGKILL, abort), the children notice that their stdin
//! pipe closed and exit by themselves, removing the temporary directory.
//!
//! Environment variables:
//! - `KRL_TEST_KUBECONFIG`: use this existing cluster instead of starting one
//!   (no processes; [`TestEnv::stop_apiserver`] and [`TestEnv::start_apiserver`]
//!   fail; limited users are impersonated, which the kubeconfig's user must be
//!   allowed to do).
//! - `KRL_BIN_DIR`: use prebuilt `kcp` and `goelect` from this directory.
//! - `KRL_K8S_VERSION`, `KRL_CACHE_DIR`: passed to `scripts/control-plane.sh`.
//! - `KRL_KEEP_TESTENV=1`: keep the temporary directory (logs, certificates,
//!   etcd data) after the test; its path is printed on stderr.

mod pki;
mod process;

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow, bail};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{ObjectMeta, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};

use crate::pki::Pki;
use crate::process::Managed;

/// How long to wait for kube-apiserver's `/readyz`.
pub const READY_TIMEOUT: Duration = Duration::from_secs(90);

/// A running (or borrowed) Kubernetes control plane for one test.
///
/// Dropping it stops etcd and kube-apiserver and removes their temporary
/// directory.
pub struct TestEnv {
    mode: Mode,
    namespaces: AtomicU32,
}

enum Mode {
    Local(Box<Local>),
    External(Box<External>),
}

/// A control plane that this process started.
struct Local {
    bin_dir: PathBuf,
    pki: Pki,
    etcd_port: u16,
    apiserver_port: u16,
    kubeconfig: PathBuf,
    users: AtomicU32,
    restarts: AtomicU32,
    // Drop order matters: the apiserver goes first, then etcd, then the directory.
    apiserver: Mutex<Option<Managed>>,
    etcd: Mutex<Option<Managed>>,
    dir: tempfile::TempDir,
}

/// An existing cluster named by `KRL_TEST_KUBECONFIG`.
struct External {
    kubeconfig_path: PathBuf,
    kubeconfig: Kubeconfig,
    server_url: String,
    users: AtomicU32,
    dir: tempfile::TempDir,
}

impl std::fmt::Debug for TestEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestEnv")
            .field("server_url", &self.server_url())
            .field("kubeconfig", &self.kubeconfig_path())
            .field("external", &matches!(self.mode, Mode::External(_)))
            .finish_non_exhaustive()
    }
}

/// The workspace root (the parent of this crate's directory).
///
/// # Panics
/// Never in practice: this crate's manifest directory always has a parent.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("testenv lives inside the workspace")
        .to_path_buf()
}

/// Builds `kcp` and `goelect` if needed (once per process) and returns their
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
        for bin in ["kcp", "goelect"] {
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

/// Reserves distinct free loopback ports (the listeners are closed on return).
fn free_ports<const N: usize>() -> Result<[u16; N]> {
    let listeners = (0..N)
        .map(|_| TcpListener::bind((Ipv4Addr::LOCALHOST, 0)))
        .collect::<std::io::Result<Vec<_>>>()
        .context("binding a free loopback port")?;
    let mut ports = [0; N];
    for (port, listener) in ports.iter_mut().zip(&listeners) {
        *port = listener.local_addr()?.port();
    }
    Ok(ports)
}

async fn client_from_kubeconfig(kubeconfig: Kubeconfig) -> Result<Client> {
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .context("loading kubeconfig")?;
    Client::try_from(config).context("creating a kube client")
}

async fn client_from_path(path: &Path) -> Result<Client> {
    let kubeconfig =
        Kubeconfig::read_from(path).with_context(|| format!("reading kubeconfig {}", path.display()))?;
    client_from_kubeconfig(kubeconfig).await
}

fn get(path: &str) -> http::Request<Vec<u8>> {
    http::Request::get(path)
        .body(Vec::new())
        .expect("a valid request")
}

/// Writes a kubeconfig (JSON, which every YAML reader accepts) with file references.
fn write_kubeconfig(path: &Path, server: &str, ca: &Path, user: &str, cert: &Path, key: &Path) -> Result<()> {
    let doc = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "testenv", "cluster": {
            "server": server,
            "certificate-authority": ca,
        }}],
        "users": [{"name": user, "user": {
            "client-certificate": cert,
            "client-key": key,
        }}],
        "contexts": [{"name": "testenv", "context": {"cluster": "testenv", "user": user}}],
        "current-context": "testenv",
    });
    std::fs::write(path, serde_json::to_vec_pretty(&doc)?)
        .with_context(|| format!("writing {}", path.display()))
}

/// A file-name-safe form of a user name.
fn sanitize(name: &str) -> String {
    name.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .take(40)
        .collect()
}

impl TestEnv {
    /// Starts etcd and kube-apiserver (building them first if needed), or
    /// connects to the cluster named by `KRL_TEST_KUBECONFIG`.
    ///
    /// # Errors
    /// When the build fails, a process does not start or exits, or the
    /// apiserver is not ready within [`READY_TIMEOUT`]; the message includes the
    /// tail of the process's log.
    pub async fn start() -> Result<Self> {
        let mode = if let Some(path) = std::env::var_os("KRL_TEST_KUBECONFIG") {
            Mode::External(Box::new(External::connect(PathBuf::from(path)).await?))
        } else {
            Mode::Local(Box::new(Local::start().await?))
        };
        Ok(Self {
            mode,
            namespaces: AtomicU32::new(0),
        })
    }

    /// Whether this environment uses an existing cluster (`KRL_TEST_KUBECONFIG`).
    pub fn is_external(&self) -> bool {
        matches!(self.mode, Mode::External(_))
    }

    /// A new admin client (its own connection pool).
    ///
    /// # Errors
    /// When the kubeconfig cannot be loaded.
    pub async fn client(&self) -> Result<Client> {
        match &self.mode {
            Mode::Local(l) => client_from_path(&l.kubeconfig).await,
            Mode::External(e) => client_from_kubeconfig(e.kubeconfig.clone()).await,
        }
    }

    /// The admin kubeconfig file.
    pub fn kubeconfig_path(&self) -> &Path {
        match &self.mode {
            Mode::Local(l) => &l.kubeconfig,
            Mode::External(e) => &e.kubeconfig_path,
        }
    }

    /// The apiserver URL, e.g. `https://127.0.0.1:40123`.
    pub fn server_url(&self) -> String {
        match &self.mode {
            Mode::Local(l) => format!("https://127.0.0.1:{}", l.apiserver_port),
            Mode::External(e) => e.server_url.clone(),
        }
    }

    /// The apiserver's port (for an external cluster: the port in its URL).
    pub fn apiserver_port(&self) -> u16 {
        match &self.mode {
            Mode::Local(l) => l.apiserver_port,
            Mode::External(e) => e
                .server_url
                .parse::<http::Uri>()
                .ok()
                .and_then(|u| u.port_u16())
                .unwrap_or(443),
        }
    }

    /// The apiserver's socket address (loopback for a local control plane).
    pub fn apiserver_addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.apiserver_port()))
    }

    /// The etcd client port (`None` for an external cluster).
    pub fn etcd_port(&self) -> Option<u16> {
        match &self.mode {
            Mode::Local(l) => Some(l.etcd_port),
            Mode::External(_) => None,
        }
    }

    /// The kube-apiserver's process id while it runs (`None` if stopped or external),
    /// e.g. to SIGSTOP it.
    pub fn apiserver_pid(&self) -> Option<u32> {
        match &self.mode {
            Mode::Local(l) => lock(&l.apiserver).as_ref().map(Managed::id),
            Mode::External(_) => None,
        }
    }

    /// The etcd process id while it runs (`None` if external).
    pub fn etcd_pid(&self) -> Option<u32> {
        match &self.mode {
            Mode::Local(l) => lock(&l.etcd).as_ref().map(Managed::id),
            Mode::External(_) => None,
        }
    }

    /// The directory of the process logs (`None` for an external cluster).
    pub fn log_dir(&self) -> Option<PathBuf> {
        match &self.mode {
            Mode::Local(l) => Some(l.dir.path().join("logs")),
            Mode::External(_) => None,
        }
    }

    /// Path of the `goelect` client-go candidate binary (built if needed).
    ///
    /// It prints `READY <mono_ns>` then `EVENT <started-leading|stopped-leading|new-leader>
    /// <mono_ns> <identity>` lines, `mono_ns` being `CLOCK_MONOTONIC` nanoseconds; see
    /// `hack/control-plane/cmd/goelect/main.go` for its flags.
    ///
    /// # Errors
    /// When the build fails.
    pub async fn goelect_path(&self) -> Result<PathBuf> {
        match &self.mode {
            Mode::Local(l) => Ok(l.bin_dir.join("goelect")),
            Mode::External(_) => Ok(bin_dir().await?.join("goelect")),
        }
    }

    /// Creates a namespace named `<prefix>-<random suffix>` and returns its name.
    ///
    /// # Errors
    /// When the API call fails.
    pub async fn new_namespace(&self, prefix: &str) -> Result<String> {
        let cleaned: String = prefix
            .to_ascii_lowercase()
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .take(50)
            .collect();
        let prefix = match cleaned.trim_matches('-') {
            "" => "test",
            trimmed => trimmed,
        };
        let n = self.namespaces.fetch_add(1, Ordering::Relaxed);
        let ns = Namespace {
            metadata: ObjectMeta {
                generate_name: Some(format!("{prefix}-")),
                labels: Some(
                    [
                        ("kube-lease-testenv".to_owned(), "true".to_owned()),
                        ("kube-lease-testenv/seq".to_owned(), n.to_string()),
                    ]
                    .into(),
                ),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        let api: Api<Namespace> = Api::all(self.client().await?);
        let created = api
            .create(&PostParams::default(), &ns)
            .await
            .with_context(|| format!("creating a namespace with prefix {prefix}"))?;
        created
            .metadata
            .name
            .ok_or_else(|| anyhow!("created namespace has no name"))
    }

    /// Writes a kubeconfig for `user` in `groups` and returns its path.
    ///
    /// Locally this is a client certificate signed by the client CA (at most two
    /// groups; `system:authenticated` is added by the apiserver). For an external
    /// cluster it is the admin kubeconfig with impersonation (`as`, `as-groups`).
    ///
    /// # Errors
    /// When certificates or files cannot be written, or more than two groups are given.
    pub fn user_kubeconfig(&self, user: &str, groups: &[&str]) -> Result<PathBuf> {
        match &self.mode {
            Mode::Local(l) => l.user_kubeconfig(user, groups),
            Mode::External(e) => e.user_kubeconfig(user, groups),
        }
    }

    /// A client authenticated as `user` in `groups` (see [`TestEnv::user_kubeconfig`]).
    ///
    /// # Errors
    /// As [`TestEnv::user_kubeconfig`].
    pub async fn user_client(&self, user: &str, groups: &[&str]) -> Result<Client> {
        client_from_path(&self.user_kubeconfig(user, groups)?).await
    }

    /// The apiserver's `/metrics` text (Prometheus format), fetched as admin.
    ///
    /// # Errors
    /// When the request fails.
    pub async fn metrics_text(&self) -> Result<String> {
        self.client()
            .await?
            .request_text(get("/metrics"))
            .await
            .context("GET /metrics")
    }

    /// Kills kube-apiserver (SIGKILL) and waits for it to exit; etcd keeps running.
    ///
    /// # Errors
    /// For an external cluster.
    pub fn stop_apiserver(&self) -> Result<()> {
        match &self.mode {
            Mode::Local(l) => {
                let old = lock(&l.apiserver).take();
                drop(old);
                Ok(())
            }
            Mode::External(_) => bail!("stop_apiserver is not supported with KRL_TEST_KUBECONFIG"),
        }
    }

    /// Starts kube-apiserver again on the same port with the same etcd, and waits
    /// until it is ready. Does nothing if it is running.
    ///
    /// # Errors
    /// For an external cluster, or when it does not become ready.
    pub async fn start_apiserver(&self) -> Result<()> {
        match &self.mode {
            Mode::Local(l) => l.start_apiserver().await,
            Mode::External(_) => {
                bail!("start_apiserver is not supported with KRL_TEST_KUBECONFIG")
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Local {
    async fn start() -> Result<Self> {
        let bin_dir = bin_dir().await?;
        let kcp = bin_dir.join("kcp");
        let mut dir = tempfile::Builder::new()
            .prefix("kube-lease-testenv-")
            .tempdir()
            .context("creating a temporary directory")?;
        if std::env::var_os("KRL_KEEP_TESTENV").is_some_and(|v| v == "1") {
            dir.disable_cleanup(true);
            eprintln!("kube-lease-testenv: keeping {}", dir.path().display());
        }
        let logs = dir.path().join("logs");
        std::fs::create_dir_all(&logs).context("creating the log directory")?;
        let pki = Pki::generate(&dir.path().join("pki"))?;
        let [etcd_port, peer_port, apiserver_port] = free_ports::<3>()?;

        let etcd_url = format!("http://127.0.0.1:{etcd_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let etcd_args = vec![
            "etcd".to_owned(),
            "--name=testenv".to_owned(),
            format!("--data-dir={}", dir.path().join("etcd").display()),
            format!("--listen-client-urls={etcd_url}"),
            format!("--advertise-client-urls={etcd_url}"),
            format!("--listen-peer-urls={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster=testenv={peer_url}"),
            "--unsafe-no-fsync=true".to_owned(),
            "--log-level=warn".to_owned(),
        ];
        let mut etcd = Managed::spawn(
            "etcd",
            &kcp,
            &etcd_args,
            &logs.join("etcd.log"),
            cleanup_dir(&dir),
        )?;
        wait_for_port(&mut etcd, etcd_port, Duration::from_secs(30)).await?;

        let kubeconfig = dir.path().join("admin.kubeconfig");
        write_kubeconfig(
            &kubeconfig,
            &format!("https://127.0.0.1:{apiserver_port}"),
            &pki.files.serving_ca,
            "admin",
            &pki.files.admin_cert,
            &pki.files.admin_key,
        )?;
        std::fs::create_dir_all(dir.path().join("users"))?;

        let local = Self {
            bin_dir,
            pki,
            etcd_port,
            apiserver_port,
            kubeconfig,
            users: AtomicU32::new(0),
            restarts: AtomicU32::new(0),
            apiserver: Mutex::new(None),
            etcd: Mutex::new(Some(etcd)),
            dir,
        };
        local.start_apiserver().await?;
        Ok(local)
    }

    fn apiserver_args(&self) -> Vec<String> {
        let f = &self.pki.files;
        let port = self.apiserver_port;
        vec![
            "kube-apiserver".to_owned(),
            format!("--etcd-servers=http://127.0.0.1:{}", self.etcd_port),
            format!("--cert-dir={}", self.dir.path().join("apiserver-certs").display()),
            format!("--tls-cert-file={}", f.serving_cert.display()),
            format!("--tls-private-key-file={}", f.serving_key.display()),
            format!("--client-ca-file={}", f.client_ca.display()),
            format!("--secure-port={port}"),
            "--bind-address=127.0.0.1".to_owned(),
            "--service-cluster-ip-range=10.0.0.0/24".to_owned(),
            "--authorization-mode=RBAC".to_owned(),
            format!("--service-account-issuer=https://127.0.0.1:{port}/"),
            format!("--service-account-key-file={}", f.sa_pub.display()),
            format!("--service-account-signing-key-file={}", f.sa_key.display()),
            "--disable-admission-plugins=ServiceAccount".to_owned(),
            "--feature-gates=CoordinatedLeaderElection=true".to_owned(),
            "--runtime-config=coordination.k8s.io/v1beta1=true".to_owned(),
            "--profiling=false".to_owned(),
        ]
    }

    async fn start_apiserver(&self) -> Result<()> {
        {
            let mut guard = lock(&self.apiserver);
            if guard.as_mut().is_some_and(|running| running.exited().is_none()) {
                return Ok(());
            }
            let n = self.restarts.fetch_add(1, Ordering::Relaxed);
            let log = self
                .dir
                .path()
                .join("logs")
                .join(format!("kube-apiserver.{n}.log"));
            *guard = Some(Managed::spawn(
                "kube-apiserver",
                &self.bin_dir.join("kcp"),
                &self.apiserver_args(),
                &log,
                cleanup_dir(&self.dir),
            )?);
        }
        self.wait_ready().await
    }

    /// Polls `/readyz` as admin until it answers `ok`, the process exits, or time runs out.
    async fn wait_ready(&self) -> Result<()> {
        let deadline = Instant::now() + READY_TIMEOUT;
        let client = client_from_path(&self.kubeconfig).await?;
        let mut last_err = String::from("no answer yet");
        loop {
            {
                let mut guard = lock(&self.apiserver);
                let proc = guard
                    .as_mut()
                    .ok_or_else(|| anyhow!("kube-apiserver was stopped while starting"))?;
                if let Some(status) = proc.exited() {
                    return Err(proc.failure(&format!("exited during startup ({status})")));
                }
                if Instant::now() > deadline {
                    return Err(proc.failure(&format!(
                        "not ready after {} s (last /readyz: {last_err})",
                        READY_TIMEOUT.as_secs()
                    )));
                }
            }
            match tokio::time::timeout(Duration::from_secs(5), client.request_text(get("/readyz"))).await {
                Ok(Ok(body)) if body.trim() == "ok" => return Ok(()),
                Ok(Ok(body)) => last_err = body,
                Ok(Err(e)) => last_err = e.to_string(),
                Err(_) => "timed out".clone_into(&mut last_err),
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    fn user_kubeconfig(&self, user: &str, groups: &[&str]) -> Result<PathBuf> {
        let (cert, key) = self.pki.issue_client(user, groups)?;
        let n = self.users.fetch_add(1, Ordering::Relaxed);
        let base = self
            .dir
            .path()
            .join("users")
            .join(format!("{n}-{}", sanitize(user)));
        let cert_path = base.with_extension("crt");
        let key_path = base.with_extension("key");
        let kubeconfig = base.with_extension("kubeconfig");
        std::fs::write(&cert_path, cert)?;
        std::fs::write(&key_path, key)?;
        write_kubeconfig(
            &kubeconfig,
            &format!("https://127.0.0.1:{}", self.apiserver_port),
            &self.pki.files.serving_ca,
            user,
            &cert_path,
            &key_path,
        )?;
        Ok(kubeconfig)
    }
}

/// The directory the children remove if this process dies without cleaning up.
fn cleanup_dir(dir: &tempfile::TempDir) -> Option<&Path> {
    let keep = std::env::var_os("KRL_KEEP_TESTENV").is_some_and(|v| v == "1");
    (!keep).then(|| dir.path())
}

/// Waits until `port` accepts TCP connections or `proc` exits.
async fn wait_for_port(proc: &mut Managed, port: u16, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = proc.exited() {
            return Err(proc.failure(&format!("exited during startup ({status})")));
        }
        if tokio::net::TcpStream::connect((Ipv4Addr::LOCALHOST, port))
            .await
            .is_ok()
        {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(proc.failure(&format!(
                "does not listen on 127.0.0.1:{port} after {} s",
                timeout.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

impl External {
    async fn connect(path: PathBuf) -> Result<Self> {
        let kubeconfig = Kubeconfig::read_from(&path)
            .with_context(|| format!("reading KRL_TEST_KUBECONFIG={}", path.display()))?;
        let config = Config::from_custom_kubeconfig(kubeconfig.clone(), &KubeConfigOptions::default())
            .await
            .with_context(|| format!("loading KRL_TEST_KUBECONFIG={}", path.display()))?;
        let server_url = config.cluster_url.to_string().trim_end_matches('/').to_owned();
        let client = Client::try_from(config)?;
        client
            .request_text(get("/readyz"))
            .await
            .with_context(|| format!("GET /readyz on {server_url} (KRL_TEST_KUBECONFIG)"))?;
        let dir = tempfile::Builder::new().prefix("kube-lease-testenv-").tempdir()?;
        Ok(Self {
            kubeconfig_path: path,
            kubeconfig,
            server_url,
            users: AtomicU32::new(0),
            dir,
        })
    }

    fn user_kubeconfig(&self, user: &str, groups: &[&str]) -> Result<PathBuf> {
        let mut kc = self.kubeconfig.clone();
        let context_name = kc
            .current_context
            .clone()
            .ok_or_else(|| anyhow!("KRL_TEST_KUBECONFIG has no current-context"))?;
        let user_name = kc
            .contexts
            .iter()
            .find(|c| c.name == context_name)
            .and_then(|c| c.context.as_ref())
            .map(|c| c.user.clone())
            .ok_or_else(|| anyhow!("context {context_name} not found in KRL_TEST_KUBECONFIG"))?;
        let auth = kc
            .auth_infos
            .iter_mut()
            .find(|a| Some(&a.name) == user_name.as_ref())
            .and_then(|a| a.auth_info.as_mut())
            .ok_or_else(|| anyhow!("user {user_name:?} not found in KRL_TEST_KUBECONFIG"))?;
        auth.impersonate = Some(user.to_owned());
        auth.impersonate_groups =
            (!groups.is_empty()).then(|| groups.iter().map(|g| (*g).to_owned()).collect());
        let n = self.users.fetch_add(1, Ordering::Relaxed);
        let path = self.dir.path().join(format!("{n}-{}.kubeconfig", sanitize(user)));
        std::fs::write(&path, serde_json::to_vec_pretty(&kc)?)
            .with_context(|| format!("writing {}", path.display()))?;
        Ok(path)
    }
}
