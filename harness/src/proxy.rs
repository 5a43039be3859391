//! [`Proxy`]: a TCP proxy to the apiserver that can partition, delay, jitter,
//! trickle, stall and drop the connections of the candidates behind it.
//!
//! The proxy forwards TLS bytes: it cannot read requests. kube's client speaks
//! HTTP/1.1 (one request at a time per connection, the watch on a connection
//! of its own), so a fault can still pick connections by how they are used:
//! [`Proxy::stall_streams`] stalls the ones the server streams to (watches).

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use anyhow::{Context as _, Result, anyhow};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, mpsc, watch};
use tokio::time::Instant;

const PASS: u8 = 0;
const BLACK_HOLE: u8 = 1;
const REFUSE: u8 = 2;
const ANSWERS_LOST: u8 = 3;

/// A network partition mode of the [`Proxy`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Partition {
    /// Silence: bytes on existing connections are swallowed in both directions
    /// (the peers see nothing, not even a reset); new connections are accepted
    /// and swallowed too. Clients find out only through their own timeouts.
    BlackHole,
    /// Refusal: existing connections are reset at once, new ones are reset
    /// right after they are accepted.
    Refuse,
    /// One-way loss: bytes to the apiserver are forwarded (requests on
    /// established connections reach it and are applied), bytes back are
    /// swallowed (no answer, no reset). New connections never finish their
    /// TLS handshake. [`Proxy::heal`] closes the connections that lost bytes.
    AnswersLost,
}

/// A slow link back to the clients: each chunk of an answer is written
/// `bytes` at a time, one piece every `every` (on top of any latency).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Trickle {
    /// Bytes per piece (at least 1).
    pub bytes: usize,
    /// Pause after each piece.
    pub every: Duration,
}

/// Counters of a [`Proxy`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProxyStats {
    /// Connections accepted.
    pub accepted: u64,
    /// Connections reset on accept (refused).
    pub refused: u64,
    /// Connections closed by [`Proxy::drop_connections`], [`Proxy::partition`]
    /// (refuse) or [`Proxy::heal`].
    pub dropped: u64,
    /// Of those, connections with a request in flight: bytes forwarded to the
    /// apiserver and no answer forwarded back yet, on an established
    /// connection (past the TLS handshake).
    pub dropped_in_flight: u64,
    /// Chunks swallowed by a black hole, a one-way loss or a stall.
    pub swallowed_chunks: u64,
    /// Connections stalled by [`Proxy::stall_streams`] or
    /// [`Proxy::stall_open`].
    pub stalled: u64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Control {
    drop_all: u64,
    heal: u64,
}

#[derive(Default)]
struct ConnState {
    /// A request was forwarded and no answer forwarded back yet.
    in_flight: AtomicBool,
    /// Chunks forwarded to the client so far (2+ means past the TLS handshake).
    to_client_chunks: AtomicU64,
    /// Bytes were swallowed: the stream is corrupt, never forward again.
    poisoned: AtomicBool,
    /// Answers were swallowed (one-way loss): never forward to the client
    /// again; requests still go through while the loss lasts.
    answers_cut: AtomicBool,
    /// Chunks forwarded to the client 100 ms or more after the last chunk to
    /// the server (a server pushing, not answering): 2+ is a stream (a watch).
    streamed: AtomicU64,
    /// When the last chunk went to the server, in microseconds since the
    /// proxy started.
    last_request_us: AtomicU64,
}

impl ConnState {
    fn request_in_flight(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) && self.to_client_chunks.load(Ordering::Acquire) >= 2
    }

    /// Whether to swallow a chunk going `to_server` (or back), marking the
    /// connection broken when so.
    fn swallows(&self, shared: &ProxyShared, to_server: bool) -> bool {
        let mode = shared.mode.load(Ordering::Acquire);
        if mode == BLACK_HOLE || self.poisoned.load(Ordering::Acquire) {
            self.poisoned.store(true, Ordering::Release);
            return true;
        }
        if !to_server && (mode == ANSWERS_LOST || self.answers_cut.load(Ordering::Acquire)) {
            self.answers_cut.store(true, Ordering::Release);
            return true;
        }
        false
    }

    fn streaming(&self) -> bool {
        self.streamed.load(Ordering::Acquire) >= 2
    }

    fn broken(&self) -> bool {
        self.poisoned.load(Ordering::Acquire) || self.answers_cut.load(Ordering::Acquire)
    }
}

struct ProxyShared {
    upstream: SocketAddr,
    mode: AtomicU8,
    /// Latency to the server and back, in microseconds.
    latency_us: [AtomicU64; 2],
    /// Up to this much more per chunk, uniformly drawn.
    jitter_us: AtomicU64,
    /// More latency back to the client on streams (watches).
    stream_latency_us: AtomicU64,
    started: Instant,
    /// [`Trickle`]: bytes per piece (0: off) and the pause in microseconds.
    trickle: [AtomicU64; 2],
    rng: AtomicU64,
    control: watch::Receiver<Control>,
    conns: Mutex<HashMap<u64, Arc<ConnState>>>,
    next_id: AtomicU64,
    stats: Mutex<ProxyStats>,
    request_sent: Notify,
}

impl ProxyShared {
    fn stats(&self) -> MutexGuard<'_, ProxyStats> {
        self.stats
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn conns(&self) -> MutexGuard<'_, HashMap<u64, Arc<ConnState>>> {
        self.conns
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn black_holed(&self) -> bool {
        self.mode.load(Ordering::Acquire) == BLACK_HOLE
    }

    /// The delay of a chunk going `to_server` (or back): the latency of its
    /// direction plus the jitter drawn for it.
    fn delay(&self, to_server: bool) -> Duration {
        let base = self.latency_us[usize::from(!to_server)].load(Ordering::Acquire);
        let jitter = self.jitter_us.load(Ordering::Acquire);
        let extra = if jitter == 0 {
            0
        } else {
            self.next_random() % (jitter + 1)
        };
        Duration::from_micros(base.saturating_add(extra))
    }

    /// xorshift64: enough for jitter.
    fn next_random(&self) -> u64 {
        let mut x = self.rng.load(Ordering::Relaxed);
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng.store(x, Ordering::Relaxed);
        x
    }

    fn trickle(&self) -> Option<Trickle> {
        let bytes = self.trickle[0].load(Ordering::Acquire);
        (bytes > 0).then(|| Trickle {
            bytes: usize::try_from(bytes).unwrap_or(usize::MAX),
            every: Duration::from_micros(self.trickle[1].load(Ordering::Acquire)),
        })
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// A TCP proxy on `127.0.0.1:<free port>` to the apiserver, for the
/// candidates whose network is to fail. Point a candidate at it with
/// [`Proxy::kubeconfig`] (the apiserver's certificate is for `127.0.0.1`, so
/// TLS still verifies through it). Dropping it closes every connection.
pub struct Proxy {
    addr: SocketAddr,
    shared: Arc<ProxyShared>,
    control: watch::Sender<Control>,
    accept: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy")
            .field("addr", &self.addr)
            .field("upstream", &self.shared.upstream)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        // Connections end when the control channel closes.
        self.control.send_modify(|c| c.drop_all += 1);
    }
}

impl Proxy {
    /// Starts a proxy to `127.0.0.1:upstream_port`.
    ///
    /// # Errors
    /// When no port can be bound.
    pub async fn start(upstream_port: u16) -> Result<Self> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .context("binding the proxy")?;
        let addr = listener.local_addr()?;
        let (control, control_rx) = watch::channel(Control::default());
        let shared = Arc::new(ProxyShared {
            upstream: SocketAddr::from((Ipv4Addr::LOCALHOST, upstream_port)),
            mode: AtomicU8::new(PASS),
            latency_us: [AtomicU64::new(0), AtomicU64::new(0)],
            jitter_us: AtomicU64::new(0),
            stream_latency_us: AtomicU64::new(0),
            started: Instant::now(),
            trickle: [AtomicU64::new(0), AtomicU64::new(0)],
            rng: AtomicU64::new(
                u64::from(std::process::id()) << 32
                    | u64::from(
                        std::time::SystemTime::now()
                            .duration_since(std::time::UNIX_EPOCH)
                            .map_or(1, |d| d.subsec_nanos())
                            | 1,
                    ),
            ),
            control: control_rx,
            conns: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
            stats: Mutex::new(ProxyStats::default()),
            request_sent: Notify::new(),
        });
        let s = shared.clone();
        let accept = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(s.clone(), stream));
            }
        });
        Ok(Self {
            addr,
            shared,
            control,
            accept,
        })
    }

    /// Its URL, `https://127.0.0.1:<port>`.
    #[must_use]
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// Writes a copy of the kubeconfig at `source` into `dir`, its server URL
    /// replaced by this proxy's, and returns its path.
    ///
    /// # Errors
    /// When the kubeconfig cannot be read or written.
    pub fn kubeconfig(&self, source: &Path, dir: &Path) -> Result<PathBuf> {
        let mut kc = kube::config::Kubeconfig::read_from(source)
            .with_context(|| format!("reading {}", source.display()))?;
        for named in &mut kc.clusters {
            if let Some(cluster) = named.cluster.as_mut() {
                cluster.server = Some(self.url());
            }
        }
        let path = dir.join(format!("proxy-{}.kubeconfig", self.addr.port()));
        std::fs::write(&path, serde_json::to_vec_pretty(&kc)?)
            .with_context(|| format!("writing {}", path.display()))?;
        Ok(path)
    }

    /// Cuts the network between the clients and the apiserver (see
    /// [`Partition`]) until [`Proxy::heal`].
    pub fn partition(&self, how: Partition) {
        match how {
            Partition::BlackHole => self.shared.mode.store(BLACK_HOLE, Ordering::Release),
            Partition::AnswersLost => self.shared.mode.store(ANSWERS_LOST, Ordering::Release),
            Partition::Refuse => {
                self.shared.mode.store(REFUSE, Ordering::Release);
                self.drop_connections();
            }
        }
    }

    /// Ends a partition (and the stalls): forwards again, and closes the
    /// connections that lost bytes to a black hole, a one-way loss or a stall
    /// (their TLS streams are broken) so that clients reconnect at once.
    pub fn heal(&self) {
        self.shared.mode.store(PASS, Ordering::Release);
        let poisoned = self.shared.conns().values().filter(|c| c.broken()).count();
        self.shared.stats().dropped += poisoned as u64;
        self.control.send_modify(|c| c.heal += 1);
    }

    /// Delays every chunk, in both directions, by `latency` (order kept; no
    /// throughput limit). Applies to chunks read from now on.
    pub fn set_latency(&self, latency: Duration) {
        self.set_latency_each(latency, latency);
    }

    /// Delays the chunks to the apiserver by `to_server` and the chunks back
    /// by `to_client`. Applies to chunks read from now on.
    pub fn set_latency_each(&self, to_server: Duration, to_client: Duration) {
        self.shared.latency_us[0].store(micros(to_server), Ordering::Release);
        self.shared.latency_us[1].store(micros(to_client), Ordering::Release);
    }

    /// Adds to each chunk's latency a delay drawn uniformly from `0..=jitter`;
    /// the order within a connection is kept (a chunk never overtakes the one
    /// before it), connections are delayed independently.
    pub fn set_jitter(&self, jitter: Duration) {
        self.shared.jitter_us.store(micros(jitter), Ordering::Release);
    }

    /// Delays the chunks back to the client on streams (a watch: see
    /// [`Proxy::stall_streams`]) by `latency` more: a watch that lags while
    /// requests are answered at once. Applies to chunks read from now on.
    pub fn set_stream_latency(&self, latency: Duration) {
        self.shared
            .stream_latency_us
            .store(micros(latency), Ordering::Release);
    }

    /// Dribbles the answers (see [`Trickle`]); `None` ends it. Applies to
    /// chunks written from now on.
    pub fn set_trickle(&self, trickle: Option<Trickle>) {
        let (bytes, every) = trickle.map_or((0, 0), |t| (t.bytes.max(1) as u64, micros(t.every)));
        self.shared.trickle[1].store(every, Ordering::Release);
        self.shared.trickle[0].store(bytes, Ordering::Release);
    }

    /// Stalls, silently and for good, the connections a server streams to
    /// (two chunks or more pushed 100 ms or more after the client last wrote:
    /// a watch; a list's answer comes at once),
    /// while the others and new ones keep working; returns how many.
    /// [`Proxy::heal`] closes them.
    #[allow(
        clippy::must_use_candidate,
        reason = "called for its effect; the value is for the callers that want it"
    )]
    pub fn stall_streams(&self) -> u64 {
        self.stall(ConnState::streaming)
    }

    /// Stalls, silently and for good, every open connection (a NAT or
    /// conntrack entry lost: the kept-alive connections of a client's pool
    /// die unnoticed), while new ones work; returns how many.
    /// [`Proxy::heal`] closes them.
    #[allow(
        clippy::must_use_candidate,
        reason = "called for its effect; the value is for the callers that want it"
    )]
    pub fn stall_open(&self) -> u64 {
        self.stall(|_| true)
    }

    fn stall(&self, which: impl Fn(&ConnState) -> bool) -> u64 {
        let n = self
            .shared
            .conns()
            .values()
            .filter(|c| which(c))
            .map(|c| c.poisoned.store(true, Ordering::Release))
            .count() as u64;
        self.shared.stats().stalled += n;
        n
    }

    /// Closes (resets) every open connection now; returns how many there were
    /// and how many had a request in flight.
    #[allow(
        clippy::must_use_candidate,
        reason = "called for its effect; the value is for the callers that want it"
    )]
    pub fn drop_connections(&self) -> (u64, u64) {
        let (all, in_flight) = {
            let conns = self.shared.conns();
            let in_flight = conns.values().filter(|c| c.request_in_flight()).count();
            (conns.len() as u64, in_flight as u64)
        };
        {
            let mut stats = self.shared.stats();
            stats.dropped += all;
            stats.dropped_in_flight += in_flight;
        }
        self.control.send_modify(|c| c.drop_all += 1);
        (all, in_flight)
    }

    /// Waits until a request is in flight on an established connection (see
    /// [`ProxyStats::dropped_in_flight`]).
    ///
    /// # Errors
    /// After `timeout`.
    pub async fn wait_request_in_flight(&self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let notified = self.shared.request_sent.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.shared.conns().values().any(|c| c.request_in_flight()) {
                return Ok(());
            }
            tokio::time::timeout_at(deadline, notified)
                .await
                .map_err(|_| anyhow!("no request in flight through the proxy within {timeout:?}"))?;
        }
    }

    /// Its counters.
    #[must_use]
    pub fn stats(&self) -> ProxyStats {
        *self.shared.stats()
    }
}

/// Serves one accepted connection.
async fn serve(shared: Arc<ProxyShared>, client: TcpStream) {
    // Reset rather than FIN when closing: a dropped connection looks dropped.
    let _ = client.set_zero_linger();
    let _ = client.set_nodelay(true);
    shared.stats().accepted += 1;
    if shared.mode.load(Ordering::Acquire) == REFUSE {
        shared.stats().refused += 1;
        return;
    }
    let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
    let state = Arc::new(ConnState::default());
    shared.conns().insert(id, state.clone());
    let mut control = shared.control.clone();
    let start = *control.borrow_and_update();

    let black_holed = shared.black_holed();
    let upstream = if black_holed {
        state.poisoned.store(true, Ordering::Release);
        None
    } else if let Ok(up) = TcpStream::connect(shared.upstream).await {
        let _ = up.set_zero_linger();
        let _ = up.set_nodelay(true);
        Some(up)
    } else {
        // The apiserver is down: reset the client, as it would be.
        shared.conns().remove(&id);
        return;
    };
    let (client_r, client_w) = client.into_split();
    let ended = ended_by_control(&mut control, &state, start);
    if let Some(up) = upstream {
        let (up_r, up_w) = up.into_split();
        let to_server = pump(client_r, up_w, shared.clone(), state.clone(), true);
        let to_client = pump(up_r, client_w, shared.clone(), state.clone(), false);
        tokio::select! {
            ((), ()) = async { tokio::join!(to_server, to_client) } => {}
            () = ended => {}
        }
    } else {
        tokio::select! {
            () = swallow(client_r, &shared) => {}
            () = ended => {}
        }
        drop(client_w);
    }
    shared.conns().remove(&id);
}

/// Resolves when the connection must be closed: every connection on
/// `drop_all` (or when the proxy is gone), poisoned ones on `heal`.
async fn ended_by_control(control: &mut watch::Receiver<Control>, state: &ConnState, start: Control) {
    loop {
        if control.changed().await.is_err() {
            return;
        }
        let now = *control.borrow_and_update();
        if now.drop_all != start.drop_all {
            return;
        }
        if now.heal != start.heal && state.poisoned.load(Ordering::Acquire) {
            return;
        }
    }
}

/// Reads and discards everything (a black-holed connection).
async fn swallow(mut r: impl AsyncRead + Unpin, shared: &ProxyShared) {
    let mut buf = vec![0; 16 * 1024];
    while let Ok(n) = r.read(&mut buf).await {
        if n == 0 {
            break;
        }
        shared.stats().swallowed_chunks += 1;
    }
}

/// Forwards one direction, each chunk delayed by the latency in force when it
/// was read, swallowing chunks while black-holed.
async fn pump(
    mut r: OwnedReadHalf,
    mut w: OwnedWriteHalf,
    shared: Arc<ProxyShared>,
    state: Arc<ConnState>,
    to_server: bool,
) {
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Option<Vec<u8>>)>();
    let reader = {
        let (shared, state) = (shared.clone(), state.clone());
        async move {
            let mut buf = vec![0; 16 * 1024];
            let mut due = Instant::now();
            loop {
                let n = match r.read(&mut buf).await {
                    Ok(0) | Err(_) => {
                        let _ = tx.send((Instant::now(), None));
                        break;
                    }
                    Ok(n) => n,
                };
                if state.swallows(&shared, to_server) {
                    shared.stats().swallowed_chunks += 1;
                    continue;
                }
                let mut delay = shared.delay(to_server);
                if !to_server && state.streaming() {
                    delay += Duration::from_micros(shared.stream_latency_us.load(Ordering::Acquire));
                }
                // Never before the chunk ahead of it: jitter keeps the order.
                due = due.max(Instant::now() + delay);
                if tx.send((due, Some(buf[..n].to_vec()))).is_err() {
                    break;
                }
            }
        }
    };
    let writer = async move {
        while let Some((due, chunk)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            let Some(bytes) = chunk else {
                let _ = w.shutdown().await;
                break;
            };
            // A partition that began while the chunk waited swallows it too.
            if state.swallows(&shared, to_server) {
                shared.stats().swallowed_chunks += 1;
                continue;
            }
            if write(&mut w, &bytes, if to_server { None } else { shared.trickle() })
                .await
                .is_err()
            {
                break;
            }
            let now_us = micros(shared.started.elapsed());
            if to_server {
                state.streamed.store(0, Ordering::Release);
                state.last_request_us.store(now_us, Ordering::Release);
                state.in_flight.store(true, Ordering::Release);
                if state.to_client_chunks.load(Ordering::Acquire) >= 2 {
                    shared.request_sent.notify_waiters();
                }
            } else {
                state.in_flight.store(false, Ordering::Release);
                state.to_client_chunks.fetch_add(1, Ordering::AcqRel);
                if now_us.saturating_sub(state.last_request_us.load(Ordering::Acquire)) >= 100_000 {
                    state.streamed.fetch_add(1, Ordering::AcqRel);
                }
            }
        }
    };
    tokio::join!(reader, writer);
}

/// Writes `bytes`, dribbled when `trickle` says so.
async fn write(w: &mut OwnedWriteHalf, bytes: &[u8], trickle: Option<Trickle>) -> std::io::Result<()> {
    let Some(t) = trickle else {
        return w.write_all(bytes).await;
    };
    for piece in bytes.chunks(t.bytes.max(1)) {
        w.write_all(piece).await?;
        tokio::time::sleep(t.every).await;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo server on loopback; returns its port.
    async fn echo_server() -> u16 {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        port
    }

    async fn round_trip(s: &mut TcpStream, timeout: Duration) -> std::io::Result<usize> {
        s.write_all(b"ping").await?;
        let mut buf = [0; 4];
        match tokio::time::timeout(timeout, s.read(&mut buf)).await {
            Ok(r) => r,
            Err(_) => Err(std::io::ErrorKind::TimedOut.into()),
        }
    }

    #[tokio::test]
    async fn proxy_forwards_delays_partitions_and_drops() {
        let proxy = Proxy::start(echo_server().await).await.unwrap();
        let mut s = TcpStream::connect(proxy.addr).await.unwrap();
        assert_eq!(round_trip(&mut s, Duration::from_secs(5)).await.unwrap(), 4);

        proxy.set_latency(Duration::from_millis(100));
        let t = Instant::now();
        assert_eq!(round_trip(&mut s, Duration::from_secs(5)).await.unwrap(), 4);
        assert!(t.elapsed() >= Duration::from_millis(200), "{:?}", t.elapsed());
        proxy.set_latency(Duration::ZERO);

        // Black hole: silence on the old connection and on a new one.
        proxy.partition(Partition::BlackHole);
        let err = round_trip(&mut s, Duration::from_millis(300)).await.unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::TimedOut);
        let mut fresh = TcpStream::connect(proxy.addr).await.unwrap();
        let err = round_trip(&mut fresh, Duration::from_millis(300))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::TimedOut);
        // Healing closes both (their bytes were lost); new ones work.
        proxy.heal();
        assert!(matches!(
            round_trip(&mut s, Duration::from_secs(5)).await,
            Ok(0) | Err(_)
        ));
        let mut s = TcpStream::connect(proxy.addr).await.unwrap();
        assert_eq!(round_trip(&mut s, Duration::from_secs(5)).await.unwrap(), 4);

        // Refuse: the old connection is reset, and so is a new one.
        proxy.partition(Partition::Refuse);
        assert!(matches!(
            round_trip(&mut s, Duration::from_secs(5)).await,
            Ok(0) | Err(_)
        ));
        let mut fresh = TcpStream::connect(proxy.addr).await.unwrap();
        assert!(matches!(
            round_trip(&mut fresh, Duration::from_secs(5)).await,
            Ok(0) | Err(_)
        ));
        proxy.heal();

        // Drop: open connections are closed at once.
        let mut s = TcpStream::connect(proxy.addr).await.unwrap();
        assert_eq!(round_trip(&mut s, Duration::from_secs(5)).await.unwrap(), 4);
        let (dropped, _) = proxy.drop_connections();
        assert_eq!(dropped, 1);
        assert!(matches!(
            round_trip(&mut s, Duration::from_secs(5)).await,
            Ok(0) | Err(_)
        ));
        let stats = proxy.stats();
        assert!(stats.refused >= 1 && stats.swallowed_chunks >= 2, "{stats:?}");
    }

    /// A server that echoes, and answers `watch` with an event (2 bytes) every 30 ms
    /// for good (a stream); returns its port.
    async fn streaming_server() -> u16 {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0; 64];
                    while let Ok(n @ 1..) = s.read(&mut buf).await {
                        if &buf[..n] == b"watch" {
                            loop {
                                tokio::time::sleep(Duration::from_millis(30)).await;
                                if s.write_all(b"ev").await.is_err() {
                                    return;
                                }
                            }
                        } else if s.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        port
    }

    async fn read_exact(s: &mut TcpStream, n: usize, timeout: Duration) -> std::io::Result<Vec<u8>> {
        let mut buf = vec![0; n];
        match tokio::time::timeout(timeout, s.read_exact(&mut buf)).await {
            Ok(r) => r.map(|_| buf),
            Err(_) => Err(std::io::ErrorKind::TimedOut.into()),
        }
    }

    #[tokio::test]
    async fn proxy_delays_each_way_jitters_and_trickles() {
        let proxy = Proxy::start(echo_server().await).await.unwrap();
        let mut s = TcpStream::connect(proxy.addr).await.unwrap();
        proxy.set_latency_each(Duration::from_millis(150), Duration::ZERO);
        let t = Instant::now();
        assert_eq!(round_trip(&mut s, Duration::from_secs(5)).await.unwrap(), 4);
        assert!(t.elapsed() >= Duration::from_millis(150), "{:?}", t.elapsed());
        proxy.set_latency_each(Duration::ZERO, Duration::ZERO);

        // Jitter keeps the order of a connection's bytes.
        proxy.set_jitter(Duration::from_millis(40));
        let sent: Vec<u8> = (0..200u8).collect();
        for b in &sent {
            s.write_all(&[*b]).await.unwrap();
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(
            read_exact(&mut s, sent.len(), Duration::from_secs(10))
                .await
                .unwrap(),
            sent
        );
        proxy.set_jitter(Duration::ZERO);

        // A trickle: 40 bytes, 10 at a time, 100 ms apart: the first piece
        // comes at once, the whole takes 300 ms or more.
        proxy.set_trickle(Some(Trickle {
            bytes: 10,
            every: Duration::from_millis(100),
        }));
        let t = Instant::now();
        s.write_all(&[7; 40]).await.unwrap();
        let first = read_exact(&mut s, 10, Duration::from_secs(5)).await.unwrap();
        let first_at = t.elapsed();
        read_exact(&mut s, 30, Duration::from_secs(5)).await.unwrap();
        assert_eq!(first, [7; 10]);
        assert!(
            first_at < Duration::from_millis(100) && t.elapsed() >= Duration::from_millis(300),
            "first piece after {first_at:?}, all after {:?}",
            t.elapsed()
        );
        proxy.set_trickle(None);
        assert_eq!(round_trip(&mut s, Duration::from_secs(5)).await.unwrap(), 4);
    }

    #[tokio::test]
    async fn proxy_loses_answers_and_stalls_streams() {
        let upstream = streaming_server().await;
        let proxy = Proxy::start(upstream).await.unwrap();
        let mut s = TcpStream::connect(proxy.addr).await.unwrap();
        assert_eq!(round_trip(&mut s, Duration::from_secs(5)).await.unwrap(), 4);

        // One-way loss: the request reaches the server (its answer is
        // swallowed), new connections get no answer either; healing closes
        // the connection that lost answers.
        proxy.partition(Partition::AnswersLost);
        let err = round_trip(&mut s, Duration::from_millis(300)).await.unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::TimedOut);
        let mut fresh = TcpStream::connect(proxy.addr).await.unwrap();
        let err = round_trip(&mut fresh, Duration::from_millis(300))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::TimedOut);
        assert!(proxy.stats().swallowed_chunks >= 2, "{:?}", proxy.stats());
        proxy.heal();
        assert!(matches!(
            round_trip(&mut s, Duration::from_secs(5)).await,
            Ok(0) | Err(_)
        ));

        // A stalled stream: the watch connection goes silent, a request
        // connection keeps working, and so does a new one.
        let mut watch = TcpStream::connect(proxy.addr).await.unwrap();
        let mut requests = TcpStream::connect(proxy.addr).await.unwrap();
        assert_eq!(
            round_trip(&mut requests, Duration::from_secs(5)).await.unwrap(),
            4
        );
        watch.write_all(b"watch").await.unwrap();
        read_exact(&mut watch, 20, Duration::from_secs(5)).await.unwrap();
        assert_eq!(proxy.stall_streams(), 1);
        watch.write_all(b"watch").await.unwrap();
        let err = read_exact(&mut watch, 2, Duration::from_millis(300))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::TimedOut);
        assert_eq!(
            round_trip(&mut requests, Duration::from_secs(5)).await.unwrap(),
            4
        );

        // A lagging stream: a new watch's events come late once it streams,
        // requests on the other connection are answered at once.
        let mut watch = TcpStream::connect(proxy.addr).await.unwrap();
        watch.write_all(b"watch").await.unwrap();
        read_exact(&mut watch, 20, Duration::from_secs(5)).await.unwrap();
        proxy.set_stream_latency(Duration::from_millis(400));
        let mut gap = Duration::ZERO;
        for _ in 0..20 {
            let t = Instant::now();
            read_exact(&mut watch, 2, Duration::from_secs(5)).await.unwrap();
            gap = gap.max(t.elapsed());
        }
        assert!(
            gap >= Duration::from_millis(300),
            "longest gap between events {gap:?}"
        );
        let t = Instant::now();
        assert_eq!(
            round_trip(&mut requests, Duration::from_secs(5)).await.unwrap(),
            4
        );
        assert!(t.elapsed() < Duration::from_millis(400), "{:?}", t.elapsed());
        proxy.set_stream_latency(Duration::ZERO);
        drop(watch);

        // Every open connection stalled: the old ones are silent, a new one
        // works.
        // (The connections healed above may not be gone yet.)
        let open = proxy.stall_open();
        assert!(open >= 2, "{open} stalled");
        let err = round_trip(&mut requests, Duration::from_millis(300))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::TimedOut);
        let mut fresh = TcpStream::connect(proxy.addr).await.unwrap();
        assert_eq!(round_trip(&mut fresh, Duration::from_secs(5)).await.unwrap(), 4);
        assert_eq!(proxy.stats().stalled, 1 + open, "{:?}", proxy.stats());
    }
}
