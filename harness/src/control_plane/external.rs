//! An existing cluster named by `KRL_TEST_KUBECONFIG`, used instead of a
//! control plane of our own.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::{Context as _, Result, anyhow};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use super::kubeconfig::{get, sanitize};

/// An existing cluster named by `KRL_TEST_KUBECONFIG`.
pub(super) struct External {
    pub(super) kubeconfig_path: PathBuf,
    pub(super) kubeconfig: Kubeconfig,
    pub(super) server_url: String,
    users: AtomicU32,
    dir: tempfile::TempDir,
}

impl External {
    pub(super) async fn connect(path: PathBuf) -> Result<Self> {
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
        let dir = tempfile::Builder::new()
            .prefix("kube-runtime-lease-harness-")
            .tempdir()?;
        Ok(Self {
            kubeconfig_path: path,
            kubeconfig,
            server_url,
            users: AtomicU32::new(0),
            dir,
        })
    }

    pub(super) fn user_kubeconfig(&self, user: &str, groups: &[&str]) -> Result<PathBuf> {
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
