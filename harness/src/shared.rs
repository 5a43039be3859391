//! What the tests of one test binary share: the control plane, and a lock
//! that runs them one at a time.

use anyhow::{Result, anyhow};

use crate::TestEnv;

/// The control plane shared by every test of one test binary (one per file),
/// started on first use and never stopped: its processes exit with the test
/// process (the harness's stdin watchdog).
///
/// # Errors
/// When the control plane does not start; later callers get the same error.
pub async fn shared_env() -> Result<&'static TestEnv> {
    static ENV: tokio::sync::OnceCell<std::result::Result<TestEnv, String>> =
        tokio::sync::OnceCell::const_new();
    ENV.get_or_init(|| async { TestEnv::start().await.map_err(|e| format!("{e:#}")) })
        .await
        .as_ref()
        .map_err(|e| anyhow!("starting the test control plane: {e}"))
}

/// Serialises the tests of one binary: they share one apiserver, and some of
/// them restart it or depend on timing. Hold the guard for the whole test.
pub async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    static LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    LOCK.lock().await
}
