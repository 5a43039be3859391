//! A highly available control plane: three etcd members in one cluster and
//! two kube-apiservers on it, each with its own watch cache, for the chaos
//! run (`harness/src/chaos/`).
//!
//! Both apiservers share one PKI (serving certificate for `127.0.0.1`, client
//! CA, service-account keys), as the apiservers of a real HA control plane do,
//! so a client certificate works against either. Either apiserver can be
//! restarted, and any etcd member killed and restarted on its data directory
//! (it rejoins the cluster), while the rest keep serving. The apiservers
//! run with small in-flight limits (100 reads, 50 writes), so that the
//! chaos run's one-share API Priority and Fairness level gets one seat.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use anyhow::{Context as _, Result, anyhow, ensure};
use kube::Client;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use super::build::{CONTROL_PLANE_BIN, bin_dir};
use super::kubeconfig::{client_from_path, write_kubeconfig};
use super::local::{
    apiserver_args, cleanup_dir, free_ports, scratch_dir, wait_for_port, wait_ready, write_user_kubeconfig,
};
use super::lock;
use super::pki::Pki;
use super::process::Managed;

/// The etcd members of a [`HaControlPlane`].
pub const ETCD_MEMBERS: usize = 3;
/// The kube-apiservers of a [`HaControlPlane`].
pub const APISERVERS: usize = 2;

struct Member {
    name: String,
    client_port: u16,
    process: Mutex<Option<Managed>>,
}

struct Apiserver {
    port: u16,
    kubeconfig: PathBuf,
    process: Mutex<Option<Managed>>,
}

/// Three etcd members and two kube-apiservers, started by this process.
///
/// Both apiservers share one PKI (serving certificate for `127.0.0.1`, client
/// CA, service-account keys), so a client certificate works against either.
/// Either apiserver can be restarted, and any etcd member killed and
/// restarted on its data directory (it rejoins the cluster), while the rest
/// keep serving. The apiservers run with small in-flight limits (100 reads,
/// 50 writes), so that the chaos run's one-share API Priority and Fairness
/// level gets one seat. Dropping it stops them all and removes
/// their directory.
pub struct HaControlPlane {
    bin: PathBuf,
    pki: Pki,
    initial_cluster: String,
    peer_ports: [u16; ETCD_MEMBERS],
    restarts: AtomicU32,
    users: AtomicU32,
    // Drop order: the apiservers, then etcd, then the directory.
    apiservers: Vec<Apiserver>,
    etcd: Vec<Member>,
    dir: tempfile::TempDir,
}

impl std::fmt::Debug for HaControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HaControlPlane")
            .field("dir", &self.dir.path())
            .field(
                "apiserver_ports",
                &self.apiservers.iter().map(|a| a.port).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

impl HaControlPlane {
    /// Builds the control plane binary if needed, starts the three etcd
    /// members and, once they listen, both apiservers; returns when both
    /// answer `/readyz`.
    ///
    /// # Errors
    /// When the build fails or a process does not start (with its log's tail).
    pub async fn start() -> Result<Self> {
        let bin = bin_dir().await?.join(CONTROL_PLANE_BIN);
        let dir = scratch_dir("kube-runtime-lease-ha-")?;
        std::fs::create_dir_all(dir.path().join("logs")).context("creating the log directory")?;
        std::fs::create_dir_all(dir.path().join("users"))?;
        let pki = Pki::generate(&dir.path().join("pki"))?;
        let ports = free_ports::<{ 2 * ETCD_MEMBERS + APISERVERS }>()?;
        let (client_ports, rest) = ports.split_at(ETCD_MEMBERS);
        let (peer_ports, apiserver_ports) = rest.split_at(ETCD_MEMBERS);
        let initial_cluster = (0..ETCD_MEMBERS)
            .map(|i| format!("etcd{i}=http://127.0.0.1:{}", peer_ports[i]))
            .collect::<Vec<_>>()
            .join(",");
        let etcd = client_ports
            .iter()
            .enumerate()
            .map(|(i, port)| Member {
                name: format!("etcd{i}"),
                client_port: *port,
                process: Mutex::new(None),
            })
            .collect();
        let mut apiservers = Vec::new();
        for (i, port) in apiserver_ports.iter().enumerate() {
            let kubeconfig = dir.path().join(format!("admin-{i}.kubeconfig"));
            write_kubeconfig(
                &kubeconfig,
                &format!("https://127.0.0.1:{port}"),
                &pki.files.serving_ca,
                "admin",
                &pki.files.admin_cert,
                &pki.files.admin_key,
            )?;
            apiservers.push(Apiserver {
                port: *port,
                kubeconfig,
                process: Mutex::new(None),
            });
        }
        let ha = Self {
            bin,
            pki,
            initial_cluster,
            peer_ports: peer_ports.try_into().context("three peer ports")?,
            restarts: AtomicU32::new(0),
            users: AtomicU32::new(0),
            apiservers,
            etcd,
            dir,
        };
        // All members first: none can serve before a quorum has formed.
        for i in 0..ETCD_MEMBERS {
            ha.spawn_etcd(i)?;
        }
        for i in 0..ETCD_MEMBERS {
            ha.wait_etcd(i).await?;
        }
        for i in 0..APISERVERS {
            ha.spawn_apiserver(i)?;
        }
        for i in 0..APISERVERS {
            wait_ready(&ha.apiservers[i].process, &ha.apiservers[i].kubeconfig).await?;
        }
        Ok(ha)
    }

    fn log(&self, name: &str) -> PathBuf {
        let n = self.restarts.fetch_add(1, Ordering::Relaxed);
        self.dir.path().join("logs").join(format!("{name}.{n}.log"))
    }

    fn spawn_etcd(&self, i: usize) -> Result<()> {
        let member = &self.etcd[i];
        let client_url = format!("http://127.0.0.1:{}", member.client_port);
        let peer_url = format!("http://127.0.0.1:{}", self.peer_ports[i]);
        let args = vec![
            "etcd".to_owned(),
            format!("--name={}", member.name),
            format!("--data-dir={}", self.dir.path().join(&member.name).display()),
            format!("--listen-client-urls={client_url}"),
            format!("--advertise-client-urls={client_url}"),
            format!("--listen-peer-urls={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster={}", self.initial_cluster),
            // Read only on the first start: a restarted member rejoins from its data.
            "--initial-cluster-state=new".to_owned(),
            "--initial-cluster-token=kube-runtime-lease-ha".to_owned(),
            "--unsafe-no-fsync=true".to_owned(),
            "--log-level=warn".to_owned(),
        ];
        let process = Managed::spawn(
            &member.name,
            &self.bin,
            &args,
            &self.log(&member.name),
            cleanup_dir(&self.dir),
        )?;
        *lock(&member.process) = Some(process);
        Ok(())
    }

    async fn wait_etcd(&self, i: usize) -> Result<()> {
        let member = &self.etcd[i];
        let mut process = lock(&member.process)
            .take()
            .ok_or_else(|| anyhow!("{} is not running", member.name))?;
        let waited = wait_for_port(&mut process, member.client_port, Duration::from_secs(30)).await;
        *lock(&member.process) = Some(process);
        waited
    }

    fn spawn_apiserver(&self, i: usize) -> Result<()> {
        let api = &self.apiservers[i];
        let etcd_servers = self
            .etcd
            .iter()
            .map(|m| format!("http://127.0.0.1:{}", m.client_port))
            .collect::<Vec<_>>()
            .join(",");
        let mut args = apiserver_args(
            &self.pki,
            &etcd_servers,
            api.port,
            &self.dir.path().join(format!("apiserver-{i}-certs")),
            false,
        );
        // One issuer for both, as in an HA control plane: tokens either signs verify at both.
        for arg in &mut args {
            if arg.starts_with("--service-account-issuer=") {
                *arg = format!(
                    "--service-account-issuer=https://127.0.0.1:{}/",
                    self.apiservers[0].port
                );
            }
        }
        // A small server: API Priority and Fairness's seats are shares of
        // these, so that the APF fault's one-share level gets one seat.
        args.push("--max-requests-inflight=100".to_owned());
        args.push("--max-mutating-requests-inflight=50".to_owned());
        let name = format!("kube-apiserver-{i}");
        let process = Managed::spawn(&name, &self.bin, &args, &self.log(&name), cleanup_dir(&self.dir))?;
        *lock(&api.process) = Some(process);
        Ok(())
    }

    /// The port of apiserver `i` (`0..APISERVERS`).
    #[must_use]
    pub fn apiserver_port(&self, i: usize) -> u16 {
        self.apiservers[i].port
    }

    /// The admin kubeconfig of apiserver `i`.
    #[must_use]
    pub fn kubeconfig(&self, i: usize) -> &Path {
        &self.apiservers[i].kubeconfig
    }

    /// A new admin client of apiserver `i`.
    ///
    /// # Errors
    /// When the kubeconfig cannot be loaded.
    pub async fn client(&self, i: usize) -> Result<Client> {
        client_from_path(&self.apiservers[i].kubeconfig).await
    }

    /// A kubeconfig for `user` in `groups` (a client certificate, at most two
    /// groups) that talks to apiserver `i`.
    ///
    /// # Errors
    /// When certificates or files cannot be written.
    pub fn user_kubeconfig(&self, i: usize, user: &str, groups: &[&str]) -> Result<PathBuf> {
        write_user_kubeconfig(
            &self.pki,
            &self.dir.path().join("users"),
            self.users.fetch_add(1, Ordering::Relaxed),
            &format!("https://127.0.0.1:{}", self.apiservers[i].port),
            user,
            groups,
        )
    }

    /// Kills apiserver `i` (SIGKILL) and waits for it to exit.
    pub fn stop_apiserver(&self, i: usize) {
        drop(lock(&self.apiservers[i].process).take());
    }

    /// Starts apiserver `i` again (same port, same etcd) unless it runs, and
    /// waits until it is ready.
    ///
    /// # Errors
    /// When it does not become ready.
    pub async fn start_apiserver(&self, i: usize) -> Result<()> {
        let running = lock(&self.apiservers[i].process)
            .as_mut()
            .is_some_and(|p| p.exited().is_none());
        if !running {
            self.spawn_apiserver(i)?;
        }
        wait_ready(&self.apiservers[i].process, &self.apiservers[i].kubeconfig).await
    }

    /// The etcd member that is the Raft leader now, from each running
    /// member's `/metrics` (`etcd_server_is_leader`); `None` while there is none.
    pub async fn etcd_leader(&self) -> Option<usize> {
        for (i, member) in self.etcd.iter().enumerate() {
            if !self.etcd_running(i) {
                continue;
            }
            let Ok(Ok(text)) =
                tokio::time::timeout(Duration::from_secs(2), http_get(member.client_port, "/metrics")).await
            else {
                continue;
            };
            if text.lines().any(|l| l.trim() == "etcd_server_is_leader 1") {
                return Some(i);
            }
        }
        None
    }

    /// Whether etcd member `i` runs.
    #[must_use]
    pub fn etcd_running(&self, i: usize) -> bool {
        lock(&self.etcd[i].process)
            .as_mut()
            .is_some_and(|p| p.exited().is_none())
    }

    /// Kills etcd member `i` (SIGKILL) and waits for it to exit; its data stays.
    pub fn kill_etcd(&self, i: usize) {
        drop(lock(&self.etcd[i].process).take());
    }

    /// Starts etcd member `i` again on its data directory (it rejoins the
    /// cluster) and waits until it listens.
    ///
    /// # Errors
    /// When it does not start.
    pub async fn start_etcd(&self, i: usize) -> Result<()> {
        ensure!(!self.etcd_running(i), "etcd{i} is running");
        self.spawn_etcd(i)?;
        self.wait_etcd(i).await
    }

    /// The `/metrics` text of apiserver `i`, read as admin.
    ///
    /// # Errors
    /// When the request fails.
    pub async fn metrics_text(&self, i: usize) -> Result<String> {
        let client = self.client(i).await?;
        let request = http::Request::get("/metrics").body(Vec::new())?;
        client.request_text(request).await.context("GET /metrics")
    }

    /// The directory of the process logs.
    #[must_use]
    pub fn log_dir(&self) -> PathBuf {
        self.dir.path().join("logs")
    }
}

/// A plain HTTP/1.0 GET on loopback (etcd's client port serves `/metrics`).
async fn http_get(port: u16, path: &str) -> Result<String> {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
        .await?;
    let mut body = String::new();
    stream.read_to_string(&mut body).await?;
    Ok(body)
}
