//! A real Kubernetes control plane for kube-runtime-lease's tests.
//!
//! [`TestEnv::start`] runs a real etcd and a real kube-apiserver on loopback
//! (free ports, never 2379/2380), both built from their upstream Go modules by
//! `scripts/control-plane.sh build` into one cached binary, `krl-control-plane`
//! (from `harness/go/cmd/krl-control-plane`). The same build
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
//! - `KRL_BIN_DIR`: use prebuilt `krl-control-plane` and `goelect` from this directory.
//! - `KRL_K8S_VERSION`, `KRL_CACHE_DIR`: passed to `scripts/control-plane.sh`.
//! - `KRL_KEEP_TESTENV=1`: keep the temporary directory (logs, certificates,
//!   etcd data) after the test; its path is printed on stderr.

mod build;
mod external;
mod ha;
mod kubeconfig;
mod local;
mod pki;
mod process;

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use anyhow::{Context as _, Result, anyhow, bail};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};

pub use self::build::{CONTROL_PLANE_BIN, GOELECT_BIN, bin_dir, workspace_root};
use self::external::External;
pub use self::ha::{APISERVERS, ETCD_MEMBERS, HaControlPlane};
use self::kubeconfig::{client_from_kubeconfig, client_from_path, get};
use self::local::Local;
use self::process::Managed;

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

impl std::fmt::Debug for TestEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestEnv")
            .field("server_url", &self.server_url())
            .field("kubeconfig", &self.kubeconfig_path())
            .field("external", &matches!(self.mode, Mode::External(_)))
            .finish_non_exhaustive()
    }
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
            Mode::Local(Box::new(Local::start(true).await?))
        };
        Ok(Self {
            mode,
            namespaces: AtomicU32::new(0),
        })
    }

    /// Starts a local etcd and kube-apiserver like [`TestEnv::start`], but
    /// without Coordinated Leader Election (no `CoordinatedLeaderElection`
    /// gate, no `coordination.k8s.io/v1beta1`: Kubernetes' defaults up to
    /// 1.37), whatever `KRL_TEST_KUBECONFIG` says.
    ///
    /// # Errors
    /// As [`TestEnv::start`].
    pub async fn start_without_coordinated_leader_election() -> Result<Self> {
        Ok(Self {
            mode: Mode::Local(Box::new(Local::start(false).await?)),
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
    /// `harness/go/cmd/goelect/main.go` for its flags.
    ///
    /// # Errors
    /// When the build fails.
    pub async fn goelect_path(&self) -> Result<PathBuf> {
        match &self.mode {
            Mode::Local(l) => Ok(l.bin_dir.join(GOELECT_BIN)),
            Mode::External(_) => Ok(bin_dir().await?.join(GOELECT_BIN)),
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
                        ("kube-runtime-lease-harness".to_owned(), "true".to_owned()),
                        ("kube-runtime-lease-harness/seq".to_owned(), n.to_string()),
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

    /// Binds the Role `role` in `namespace` to `user` (a `RoleBinding` of the
    /// same name), with the `admin` client.
    ///
    /// # Errors
    /// When the API server refuses the binding.
    pub async fn bind_role(admin: &Client, namespace: &str, role: &str, user: &str) -> Result<()> {
        use k8s_openapi::api::rbac::v1::{RoleBinding, RoleRef, Subject};
        let binding = RoleBinding {
            metadata: ObjectMeta {
                name: Some(role.to_owned()),
                ..ObjectMeta::default()
            },
            role_ref: RoleRef {
                api_group: Some("rbac.authorization.k8s.io".to_owned()),
                kind: "Role".to_owned(),
                name: role.to_owned(),
            },
            subjects: Some(vec![Subject {
                api_group: Some("rbac.authorization.k8s.io".to_owned()),
                kind: "User".to_owned(),
                name: user.to_owned(),
                ..Subject::default()
            }]),
        };
        Api::<RoleBinding>::namespaced(admin.clone(), namespace)
            .create(&PostParams::default(), &binding)
            .await
            .with_context(|| format!("binding the Role {namespace}/{role} to {user}"))?;
        Ok(())
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

impl TestEnv {
    /// Takes a snapshot of etcd's data into `to` (a directory that must not
    /// exist): kube-apiserver and etcd are killed for the copy and started
    /// again, so the control plane is down for a few seconds.
    ///
    /// # Errors
    /// For an external cluster, when the copy fails, or when the apiserver
    /// is not ready again.
    pub async fn snapshot_etcd(&self, to: &Path) -> Result<()> {
        let Mode::Local(l) = &self.mode else {
            bail!("snapshot_etcd is not supported with KRL_TEST_KUBECONFIG")
        };
        l.with_etcd_stopped(|data| copy_dir(data, to)).await
    }

    /// Restarts kube-apiserver and etcd on the data of a snapshot taken by
    /// [`TestEnv::snapshot_etcd`] (kept, so it can be restored again), as
    /// an etcd restored from a backup without `--bump-revision`: every
    /// object, and the revision, as they were then.
    ///
    /// # Errors
    /// As [`TestEnv::snapshot_etcd`].
    pub async fn restore_etcd(&self, from: &Path) -> Result<()> {
        let Mode::Local(l) = &self.mode else {
            bail!("restore_etcd is not supported with KRL_TEST_KUBECONFIG")
        };
        l.with_etcd_stopped(|data| {
            std::fs::remove_dir_all(data).with_context(|| format!("removing {}", data.display()))?;
            copy_dir(from, data)
        })
        .await
    }
}

/// Copies the directory `from` to `to` (which must not exist), keeping modes.
fn copy_dir(from: &Path, to: &Path) -> Result<()> {
    let status = std::process::Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .context("running cp")?;
    anyhow::ensure!(
        status.success(),
        "cp -a {} {}: {status}",
        from.display(),
        to.display()
    );
    Ok(())
}

/// A client from the kubeconfig file at `path`.
///
/// # Errors
/// When the file cannot be read or the client built.
pub async fn client_from_kubeconfig_path(path: &Path) -> Result<Client> {
    client_from_path(path).await
}

/// A client from the kubeconfig file at `path` that does not retry: kube's
/// default retry layer (429 and 5xx answers) is off.
///
/// # Errors
/// When the file cannot be read or the client built.
pub async fn client_without_retries(path: &Path) -> Result<Client> {
    self::kubeconfig::client_without_retries(path).await
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
