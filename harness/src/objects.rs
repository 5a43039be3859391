//! The objects the Controller candidates and tests reconcile: `ConfigMaps`.

use std::collections::BTreeMap;

use anyhow::{Context as _, Result};
use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};

/// Creations in flight at once.
const CONCURRENCY: usize = 16;

/// Creates `count` `ConfigMaps` in `namespace` (`cm-00000`, `cm-00001`, ...),
/// each with one key of `value_bytes` bytes (no data when 0), 16 creations
/// at a time.
///
/// # Errors
/// The first creation that fails.
pub async fn create_configmaps(
    client: &Client,
    namespace: &str,
    count: usize,
    value_bytes: usize,
) -> Result<()> {
    let api = Api::<ConfigMap>::namespaced(client.clone(), namespace);
    let data = (value_bytes > 0).then(|| BTreeMap::from([("v".to_owned(), "x".repeat(value_bytes))]));
    futures::stream::iter(0..count)
        .map(|i| {
            let (api, data) = (api.clone(), data.clone());
            async move {
                let cm = ConfigMap {
                    metadata: ObjectMeta {
                        name: Some(format!("cm-{i:05}")),
                        ..ObjectMeta::default()
                    },
                    data,
                    ..ConfigMap::default()
                };
                api.create(&PostParams::default(), &cm).await.map(drop)
            }
        })
        .buffer_unordered(CONCURRENCY)
        .try_collect::<()>()
        .await
        .with_context(|| format!("creating {count} ConfigMaps in {namespace}"))
}
