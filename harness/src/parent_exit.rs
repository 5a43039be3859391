//! Noticing that the parent exited: the watchdog that ends a candidate process
//! when the test or benchmark that started it is gone.

/// Resolves when stdin reaches end-of-file or fails: the parent that holds
/// its write end exited or was killed (even by SIGKILL). Never resolves unless
/// `EXIT_ON_STDIN_EOF` is set, so that a candidate started from a terminal
/// does not exit on its own.
pub async fn stdin_closed() {
    use tokio::io::AsyncReadExt as _;

    if std::env::var_os("EXIT_ON_STDIN_EOF").is_none() {
        return std::future::pending().await;
    }
    let mut buf = [0u8; 64];
    let mut stdin = tokio::io::stdin();
    while matches!(stdin.read(&mut buf).await, Ok(n) if n > 0) {}
}
