//! Kubeconfigs: clients from them, and writing them.

use std::path::Path;

use anyhow::{Context as _, Result};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

pub(super) async fn client_from_kubeconfig(kubeconfig: Kubeconfig) -> Result<Client> {
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .context("loading kubeconfig")?;
    Client::try_from(config).context("creating a kube client")
}

async fn config_from_path(path: &Path) -> Result<Config> {
    let kubeconfig =
        Kubeconfig::read_from(path).with_context(|| format!("reading kubeconfig {}", path.display()))?;
    Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .context("loading kubeconfig")
}

pub(super) async fn client_from_path(path: &Path) -> Result<Client> {
    Client::try_from(config_from_path(path).await?).context("creating a kube client")
}

/// A client from the kubeconfig at `path` without kube's default retry
/// layer (which retries 429 and 5xx answers).
pub(super) async fn client_without_retries(path: &Path) -> Result<Client> {
    let mut config = config_from_path(path).await?;
    config.default_retry = false;
    Client::try_from(config).context("creating a kube client")
}

pub(super) fn get(path: &str) -> http::Request<Vec<u8>> {
    http::Request::get(path)
        .body(Vec::new())
        .expect("a valid request")
}

/// Writes a kubeconfig (JSON, which every YAML reader accepts) with file references.
pub(super) fn write_kubeconfig(
    path: &Path,
    server: &str,
    ca: &Path,
    user: &str,
    cert: &Path,
    key: &Path,
) -> Result<()> {
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
pub(super) fn sanitize(name: &str) -> String {
    name.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .take(40)
        .collect()
}
