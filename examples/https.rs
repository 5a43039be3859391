//! An HTTPS server for webhooks, as an operator serves them on every replica:
//! an axum [`Router`] over hyper's HTTP/1 connections and tokio-rustls, with
//! rustls on ring (the crypto provider kube's client uses), and a graceful,
//! bounded drain ([`serve`]).
//!
//! The certificate ([`server_config`]) comes from two PEM files, a chain and
//! its key, as a deployment mounts them from a Secret (cert-manager's
//! `tls.crt` and `tls.key`); the files are read again when they change (looked
//! at every [`RELOAD_EVERY`]), so that a renewed certificate is served without
//! a restart, as controller-runtime's certificate watcher does. Without files,
//! a self-signed certificate for `localhost` and `127.0.0.1` is made at start:
//! enough to try the server locally (`curl -k`), useless to an API server,
//! which must be given the CA that signed the serving certificate
//! (`caBundle`).

use std::{
    path::{Path, PathBuf},
    sync::{Arc, PoisonError, RwLock},
    time::{Duration, SystemTime},
};

use anyhow::Context as _;
use axum::Router;
use hyper_util::{
    rt::{TokioIo, TokioTimer},
    server::graceful::{GracefulShutdown, Watcher},
    service::TowerToHyperService,
};
use rustls::{
    ServerConfig,
    crypto::CryptoProvider,
    pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, pem::PemObject as _},
    server::{ClientHello, ResolvesServerCert},
    sign::CertifiedKey,
};
use tokio::{net::TcpListener, task::JoinSet, time::Instant};
use tokio_rustls::TlsAcceptor;
use tracing::{debug, info, warn};

/// How often the certificate files are looked at for a change.
pub const RELOAD_EVERY: Duration = Duration::from_secs(10);

/// How long a client may take over its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a client may take to send a request's headers (also the longest
/// an idle keep-alive connection is kept open).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// A server configuration for the certificate in the PEM files `cert` (the
/// chain) and `key`, read again whenever they change; with `None`, for a
/// self-signed certificate made now.
///
/// # Errors
/// When the files cannot be read or do not hold a certificate and its key.
///
/// # Panics
/// With files, outside a Tokio runtime (the task that looks at them is
/// spawned on the current one).
pub fn server_config(files: Option<(PathBuf, PathBuf)>) -> anyhow::Result<Arc<ServerConfig>> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth();
    let mut config = if let Some((cert, key)) = files {
        let resolver = Arc::new(Reloading::load(cert, key, provider)?);
        tokio::spawn(resolver.clone().reload_on_change());
        builder.with_cert_resolver(resolver)
    } else {
        let generated = rcgen::generate_simple_self_signed(["localhost".to_owned(), "127.0.0.1".to_owned()])
            .context("generating a self-signed certificate")?;
        let key = PrivatePkcs8KeyDer::from(generated.signing_key.serialize_der());
        builder.with_single_cert(vec![generated.cert.der().clone()], key.into())?
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The certificate of two PEM files, read again when they change.
#[derive(Debug)]
struct Reloading {
    cert: PathBuf,
    key: PathBuf,
    provider: Arc<CryptoProvider>,
    current: RwLock<(Arc<CertifiedKey>, [Option<SystemTime>; 2])>,
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

impl Reloading {
    fn load(cert: PathBuf, key: PathBuf, provider: Arc<CryptoProvider>) -> anyhow::Result<Self> {
        let stamps = [modified(&cert), modified(&key)];
        let certified = Self::read(&cert, &key, &provider)?;
        Ok(Self {
            cert,
            key,
            provider,
            current: RwLock::new((Arc::new(certified), stamps)),
        })
    }

    fn read(cert: &Path, key: &Path, provider: &CryptoProvider) -> anyhow::Result<CertifiedKey> {
        let chain = CertificateDer::pem_file_iter(cert)
            .and_then(Iterator::collect::<Result<Vec<_>, _>>)
            .with_context(|| format!("reading the certificate chain {}", cert.display()))?;
        let private = PrivateKeyDer::from_pem_file(key)
            .with_context(|| format!("reading the private key {}", key.display()))?;
        CertifiedKey::from_der(chain, private, provider).with_context(|| {
            format!(
                "{} and {} do not make a certificate and its key",
                cert.display(),
                key.display()
            )
        })
    }

    /// If either file changed since the certificate served now was read,
    /// reads both again; whether it did.
    fn reload_if_changed(&self) -> anyhow::Result<bool> {
        // The stamps before the read: a change during it is seen next time.
        let stamps = [modified(&self.cert), modified(&self.key)];
        if self.current.read().unwrap_or_else(PoisonError::into_inner).1 == stamps {
            return Ok(false);
        }
        let certified = Self::read(&self.cert, &self.key, &self.provider)?;
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = (Arc::new(certified), stamps);
        Ok(true)
    }

    /// Every [`RELOAD_EVERY`], [`reload_if_changed`](Self::reload_if_changed).
    /// A pair that does not load (a Secret's update seen half-way) is logged,
    /// and the certificate served so far kept, until the next look.
    async fn reload_on_change(self: Arc<Self>) {
        loop {
            tokio::time::sleep(RELOAD_EVERY).await;
            match self.reload_if_changed() {
                Ok(false) => {}
                Ok(true) => info!(cert = %self.cert.display(), "serving certificate reloaded"),
                Err(e) => warn!(
                    error = format!("{e:#}"),
                    "serving certificate changed but does not load; keeping the old one"
                ),
            }
        }
    }
}

impl ResolvesServerCert for Reloading {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(
            self.current
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .0
                .clone(),
        )
    }
}

/// What [`serve`]'s drain did.
#[derive(Clone, Copy, Debug)]
pub struct Drained {
    /// Connections open when the drain began.
    pub open: usize,
    /// Connections still open when the drain timed out (closed then).
    pub cut: usize,
    /// How long the drain took.
    pub took: Duration,
}

/// Serves `router` over HTTPS with `tls` on `listener` until `stop`
/// resolves; then drains: stops accepting (the listener is closed), lets
/// requests in flight finish and closes every connection once its response
/// is sent (idle keep-alive connections at once), for up to `drain`, and
/// closes what is still open after that. Each connection's TLS handshake is
/// bounded by [`HANDSHAKE_TIMEOUT`] and each request's headers by
/// [`HEADER_READ_TIMEOUT`], so that a slow client holds nothing for long.
/// Failed accepts (out of file descriptors) are logged and retried.
pub async fn serve(
    listener: TcpListener,
    tls: Arc<ServerConfig>,
    router: Router,
    stop: impl Future<Output = ()>,
    drain: Duration,
) -> Drained {
    let acceptor = TlsAcceptor::from(tls);
    let graceful = GracefulShutdown::new();
    let mut connections = JoinSet::new();
    let mut stop = std::pin::pin!(stop);
    loop {
        tokio::select! {
            () = &mut stop => break,
            // Reap finished connections as they end.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((tcp, peer)) => {
                    debug!(%peer, "connection accepted");
                    let service = TowerToHyperService::new(router.clone());
                    connections.spawn(connection(tcp, acceptor.clone(), service, graceful.watcher()));
                }
                Err(e) => {
                    warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
        }
    }
    drop(listener);
    let started = Instant::now();
    let open = connections.len();
    // Tells every connection (those still in their handshake too: each holds
    // a watcher) to close after its response, and waits until all have.
    let _ = tokio::time::timeout(drain, graceful.shutdown()).await;
    // What is still open now is closed (its task aborted).
    connections.abort_all();
    let mut cut = 0;
    while let Some(ended) = connections.join_next().await {
        if ended.is_err_and(|e| e.is_cancelled()) {
            cut += 1;
        }
    }
    Drained {
        open,
        cut,
        took: started.elapsed(),
    }
}

/// One connection: the TLS handshake, then HTTP/1 until the client closes or
/// the drain asks it to close.
async fn connection(
    tcp: tokio::net::TcpStream,
    acceptor: TlsAcceptor,
    service: TowerToHyperService<Router>,
    watcher: Watcher,
) {
    let _ = tcp.set_nodelay(true);
    let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => return debug!(error = %e, "TLS handshake failed"),
        Err(_) => return debug!("TLS handshake timed out"),
    };
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .serve_connection(TokioIo::new(tls), service);
    if let Err(e) = watcher.watch(conn).await {
        debug!(error = %e, "connection ended with an error");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A new self-signed certificate's PEM files in `dir`.
    fn write_pair(dir: &Path) -> (PathBuf, PathBuf) {
        let generated = rcgen::generate_simple_self_signed(["localhost".to_owned()]).expect("a certificate");
        let (cert, key) = (dir.join("tls.crt"), dir.join("tls.key"));
        std::fs::write(&cert, generated.cert.pem()).expect("writing tls.crt");
        std::fs::write(&key, generated.signing_key.serialize_pem()).expect("writing tls.key");
        (cert, key)
    }

    fn served(resolver: &Reloading) -> CertificateDer<'static> {
        resolver.current.read().expect("lock").0.cert[0].clone()
    }

    #[test]
    fn a_renewed_certificate_is_served_and_a_broken_one_is_not() {
        let dir = std::env::temp_dir().join(format!("krl-https-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a scratch directory");
        let (cert, key) = write_pair(&dir);
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let resolver = Reloading::load(cert.clone(), key.clone(), provider).expect("loads");
        let first = served(&resolver);
        assert!(
            !resolver.reload_if_changed().expect("unchanged"),
            "nothing changed"
        );

        // Renewed (the stamps moved on, as a Secret's update moves them).
        write_pair(&dir);
        let later = SystemTime::now() + Duration::from_secs(5);
        for path in [&cert, &key] {
            std::fs::File::options()
                .append(true)
                .open(path)
                .and_then(|f| f.set_modified(later))
                .expect("stamping");
        }
        assert!(resolver.reload_if_changed().expect("reloads"));
        let second = served(&resolver);
        assert_ne!(first, second, "the renewed certificate is served");

        // Half-written: an error, and the certificate served so far kept.
        std::fs::write(&key, "not a key").expect("writing");
        std::fs::File::options()
            .append(true)
            .open(&key)
            .and_then(|f| f.set_modified(later + Duration::from_secs(5)))
            .expect("stamping");
        assert!(resolver.reload_if_changed().is_err());
        assert_eq!(served(&resolver), second);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
