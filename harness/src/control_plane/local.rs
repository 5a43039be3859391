//! A control plane that this process started: etcd and kube-apiserver as
//! children, on free loopback ports, in a temporary directory.

use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow};

use super::build::{CONTROL_PLANE_BIN, bin_dir};
use super::kubeconfig::{client_from_path, get, sanitize, write_kubeconfig};
use super::pki::Pki;
use super::process::Managed;
use super::{READY_TIMEOUT, lock};

/// A control plane that this process started.
pub(super) struct Local {
    pub(super) bin_dir: PathBuf,
    pki: Pki,
    pub(super) etcd_port: u16,
    etcd_args: Vec<String>,
    pub(super) apiserver_port: u16,
    pub(super) kubeconfig: PathBuf,
    users: AtomicU32,
    restarts: AtomicU32,
    /// Whether the apiserver runs with Coordinated Leader Election (the
    /// feature gate and `coordination.k8s.io/v1beta1`).
    coordinated: bool,
    // Drop order matters: the apiserver goes first, then etcd, then the directory.
    pub(super) apiserver: Mutex<Option<Managed>>,
    pub(super) etcd: Mutex<Option<Managed>>,
    pub(super) dir: tempfile::TempDir,
}

impl Local {
    pub(super) async fn start(coordinated: bool) -> Result<Self> {
        let bin_dir = bin_dir().await?;
        let control_plane = bin_dir.join(CONTROL_PLANE_BIN);
        let dir = scratch_dir("kube-runtime-lease-harness-")?;
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
            &control_plane,
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
            etcd_args,
            apiserver_port,
            kubeconfig,
            users: AtomicU32::new(0),
            restarts: AtomicU32::new(0),
            coordinated,
            apiserver: Mutex::new(None),
            etcd: Mutex::new(Some(etcd)),
            dir,
        };
        local.start_apiserver().await?;
        Ok(local)
    }

    fn apiserver_args(&self) -> Vec<String> {
        apiserver_args(
            &self.pki,
            &format!("http://127.0.0.1:{}", self.etcd_port),
            self.apiserver_port,
            &self.dir.path().join("apiserver-certs"),
            self.coordinated,
        )
    }

    pub(super) async fn start_apiserver(&self) -> Result<()> {
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
                &self.bin_dir.join(CONTROL_PLANE_BIN),
                &self.apiserver_args(),
                &log,
                cleanup_dir(&self.dir),
            )?);
        }
        self.wait_ready().await
    }

    /// etcd's data directory.
    pub(super) fn etcd_data(&self) -> PathBuf {
        self.dir.path().join("etcd")
    }

    /// Kills kube-apiserver, then etcd (SIGKILL each, waiting for it to
    /// exit), runs `between` with etcd's data directory, and starts both
    /// again on it, waiting until the apiserver is ready.
    pub(super) async fn with_etcd_stopped(&self, between: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
        drop(lock(&self.apiserver).take());
        drop(lock(&self.etcd).take());
        between(&self.etcd_data())?;
        let n = self.restarts.fetch_add(1, Ordering::Relaxed);
        let log = self.dir.path().join("logs").join(format!("etcd.{}.log", n + 1));
        let mut etcd = Managed::spawn(
            "etcd",
            &self.bin_dir.join(CONTROL_PLANE_BIN),
            &self.etcd_args,
            &log,
            cleanup_dir(&self.dir),
        )?;
        wait_for_port(&mut etcd, self.etcd_port, Duration::from_secs(30)).await?;
        *lock(&self.etcd) = Some(etcd);
        self.start_apiserver().await
    }

    async fn wait_ready(&self) -> Result<()> {
        wait_ready(&self.apiserver, &self.kubeconfig).await
    }

    pub(super) fn user_kubeconfig(&self, user: &str, groups: &[&str]) -> Result<PathBuf> {
        write_user_kubeconfig(
            &self.pki,
            &self.dir.path().join("users"),
            self.users.fetch_add(1, Ordering::Relaxed),
            &format!("https://127.0.0.1:{}", self.apiserver_port),
            user,
            groups,
        )
    }
}

/// kube-apiserver's command line: serving and client certificates from
/// `pki`, storage in `etcd_servers` (comma-separated URLs), listening on
/// `127.0.0.1:port`.
pub(super) fn apiserver_args(
    pki: &Pki,
    etcd_servers: &str,
    port: u16,
    cert_dir: &Path,
    coordinated: bool,
) -> Vec<String> {
    let f = &pki.files;
    let mut args = vec![
        "kube-apiserver".to_owned(),
        format!("--etcd-servers={etcd_servers}"),
        format!("--cert-dir={}", cert_dir.display()),
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
        "--profiling=false".to_owned(),
    ];
    if coordinated {
        args.push("--feature-gates=CoordinatedLeaderElection=true".to_owned());
        args.push("--runtime-config=coordination.k8s.io/v1beta1=true".to_owned());
    }
    args
}

/// Polls `/readyz` as admin until it answers `ok`, the process exits, or time runs out.
pub(super) async fn wait_ready(apiserver: &Mutex<Option<Managed>>, kubeconfig: &Path) -> Result<()> {
    let deadline = Instant::now() + READY_TIMEOUT;
    let client = client_from_path(kubeconfig).await?;
    let mut last_err = String::from("no answer yet");
    loop {
        {
            let mut guard = lock(apiserver);
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

/// A new temporary directory named `<prefix><random>`, kept after the test
/// (its path printed) when `KRL_KEEP_TESTENV=1`.
pub(super) fn scratch_dir(prefix: &str) -> Result<tempfile::TempDir> {
    let mut dir = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .context("creating a temporary directory")?;
    if std::env::var_os("KRL_KEEP_TESTENV").is_some_and(|v| v == "1") {
        dir.disable_cleanup(true);
        eprintln!("kube-runtime-lease-harness: keeping {}", dir.path().display());
    }
    Ok(dir)
}

/// Writes a client certificate for `user` in `groups` (signed by `pki`'s
/// client CA) into `users` as `<n>-<user>.{crt,key}`, and a kubeconfig
/// beside them for the apiserver at `server`; returns the kubeconfig's path.
pub(super) fn write_user_kubeconfig(
    pki: &Pki,
    users: &Path,
    n: u32,
    server: &str,
    user: &str,
    groups: &[&str],
) -> Result<PathBuf> {
    let (cert, key) = pki.issue_client(user, groups)?;
    let base = users.join(format!("{n}-{}", sanitize(user)));
    let (cert_path, key_path) = (base.with_extension("crt"), base.with_extension("key"));
    let kubeconfig = base.with_extension("kubeconfig");
    std::fs::write(&cert_path, cert)?;
    std::fs::write(&key_path, key)?;
    write_kubeconfig(
        &kubeconfig,
        server,
        &pki.files.serving_ca,
        user,
        &cert_path,
        &key_path,
    )?;
    Ok(kubeconfig)
}

/// The directory the children remove if this process dies without cleaning up.
pub(super) fn cleanup_dir(dir: &tempfile::TempDir) -> Option<&Path> {
    let keep = std::env::var_os("KRL_KEEP_TESTENV").is_some_and(|v| v == "1");
    (!keep).then(|| dir.path())
}

/// Waits until `port` accepts TCP connections or `proc` exits.
pub(super) async fn wait_for_port(proc: &mut Managed, port: u16, timeout: Duration) -> Result<()> {
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

/// Reserves distinct free loopback ports (the listeners are closed on return).
pub(super) fn free_ports<const N: usize>() -> Result<[u16; N]> {
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
