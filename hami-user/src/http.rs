//! The HTTP endpoint (axum on hyper, on the agent's tokio runtime): `GET /metrics` (the
//! Prometheus text format), `GET /healthz` (200 while the event loop has ticked recently,
//! 503 otherwise), `GET /` (a pointer to both). Anything else is 404; methods other than
//! GET/HEAD are 405 (axum's routing). The endpoint faces the network: hyper parses the
//! requests (malformed ones get 400), a client has [`ServeLimits::header_timeout`] to send
//! its headers (at most [`MAX_HEADER_BYTES`]) and [`ServeLimits::connection_timeout`] in
//! all, and at most [`ServeLimits::max_connections`] are open at once (a new one closes the
//! oldest, so slow clients cannot lock a scraper out).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

use crate::metrics::Metrics;

/// Errors of `--metrics-addr`.
#[derive(Debug, thiserror::Error)]
pub enum AddrError {
    /// Neither `HOST:PORT`, `:PORT` nor `PORT`.
    #[error("invalid listen address {0:?}: expected HOST:PORT, :PORT or PORT (e.g. :9494, 0.0.0.0:9494, [::]:9494)")]
    Invalid(String),
}

/// Parses a listen address: `HOST:PORT` (IPv4 or bracketed IPv6), `:PORT` (every IPv4
/// address, as Go programs and `node_exporter` accept it) or a bare `PORT`.
pub fn parse_listen_addr(s: &str) -> Result<SocketAddr, AddrError> {
    let t = s.trim();
    if let Some(port) = t.strip_prefix(':') {
        return port
            .parse::<u16>()
            .map(|p| SocketAddr::from(([0, 0, 0, 0], p)))
            .map_err(|_| AddrError::Invalid(s.to_string()));
    }
    if let Ok(p) = t.parse::<u16>() {
        return Ok(SocketAddr::from(([0, 0, 0, 0], p)));
    }
    t.parse::<SocketAddr>()
        .map_err(|_| AddrError::Invalid(s.to_string()))
}

/// Liveness of the event loop: the loop calls [`Health::beat`] on every tick.
#[derive(Debug, Default)]
pub struct Health {
    last_beat_ms: AtomicU64,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl Health {
    /// A health state that has beaten now.
    pub fn new() -> Health {
        let h = Health::default();
        h.beat();
        h
    }

    /// The loop is alive.
    pub fn beat(&self) {
        self.last_beat_ms.store(now_ms(), Ordering::Relaxed);
    }

    /// Whether the loop beat within `max_age`.
    pub fn is_fresh(&self, max_age: Duration) -> bool {
        now_ms().saturating_sub(self.last_beat_ms.load(Ordering::Relaxed))
            <= max_age.as_millis() as u64
    }
}

/// What an endpoint's `/metrics` serves.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Exposition {
    /// The agent's families ([`Metrics::render`]): `--metrics-addr`.
    #[default]
    Agent,
    /// HAMi's vGPU monitor families alone ([`Metrics::render_hami`]):
    /// `--hami-metrics-addr`, in place of HAMi's monitor on its port.
    Hami,
}

#[derive(Clone)]
struct AppState {
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    max_age: Duration,
    exposition: Exposition,
}

/// The router: `/metrics`, `/healthz`, `/`.
pub fn router(metrics: Arc<Metrics>, health: Arc<Health>, max_age: Duration) -> Router {
    router_for(metrics, health, max_age, Exposition::Agent)
}

/// The router of one endpoint: `/metrics` (serving `exposition`), `/healthz`, `/`.
pub fn router_for(
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    max_age: Duration,
    exposition: Exposition,
) -> Router {
    Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(healthz_handler))
        .route("/", get(root_handler))
        .with_state(AppState {
            metrics,
            health,
            max_age,
            exposition,
        })
}

async fn metrics_handler(State(s): State<AppState>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        match s.exposition {
            Exposition::Agent => s.metrics.render(),
            Exposition::Hami => s.metrics.render_hami(),
        },
    )
}

async fn healthz_handler(State(s): State<AppState>) -> impl IntoResponse {
    if s.health.is_fresh(s.max_age) {
        (StatusCode::OK, "ok\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "event loop stalled\n")
    }
}

async fn root_handler() -> &'static str {
    "hami-agent: /metrics, /healthz\n"
}

/// Bounds on what one client can hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServeLimits {
    /// Time to send the request headers.
    pub header_timeout: Duration,
    /// Time a connection may stay open in all (keep-alive included).
    pub connection_timeout: Duration,
    /// Connections open at once (a new one beyond this closes the oldest).
    pub max_connections: usize,
}

impl Default for ServeLimits {
    fn default() -> Self {
        ServeLimits {
            header_timeout: Duration::from_secs(5),
            connection_timeout: Duration::from_secs(60),
            max_connections: 64,
        }
    }
}

/// Serves the router on `listener` until the task is dropped.
pub async fn serve(
    listener: tokio::net::TcpListener,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    max_age: Duration,
) -> std::io::Result<()> {
    serve_with(listener, metrics, health, max_age, ServeLimits::default()).await
}

/// Serves `exposition` on `listener` until the task is dropped, with the default limits.
pub async fn serve_exposition(
    listener: tokio::net::TcpListener,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    max_age: Duration,
    exposition: Exposition,
) -> std::io::Result<()> {
    let app = router_for(metrics, health, max_age, exposition);
    serve_router(listener, app, ServeLimits::default()).await
}

/// [`serve`] with explicit limits.
///
/// At most [`ServeLimits::max_connections`] connections are open at once; a new one when
/// all are taken closes the *oldest* (rather than being refused): a well-behaved client
/// (a scraper sends its request at once and is answered in milliseconds) is then served even
/// while that many slow or malformed clients hold connections open, and each of those is
/// gone after [`ServeLimits::header_timeout`] anyway. Request headers are read into at most
/// [`MAX_HEADER_BYTES`].
pub async fn serve_with(
    listener: tokio::net::TcpListener,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    max_age: Duration,
    limits: ServeLimits,
) -> std::io::Result<()> {
    serve_router(listener, router(metrics, health, max_age), limits).await
}

/// Serves `app` on `listener` within `limits` (see [`serve_with`]).
async fn serve_router(
    listener: tokio::net::TcpListener,
    app: Router,
    limits: ServeLimits,
) -> std::io::Result<()> {
    let open = Arc::new(OpenConnections::default());
    let max = limits.max_connections.max(1);
    let mut next_id: u64 = 0;
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(_) => {
                // Out of descriptors and the like: back off instead of spinning.
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        next_id += 1;
        let id = next_id;
        let app = app.clone();
        let registered = Arc::clone(&open);
        // Registered under the lock before the task can end (and unregister itself).
        let mut tasks = open.lock();
        while tasks.len() >= max {
            if let Some((_, oldest)) = tasks.pop_front() {
                oldest.abort();
            }
        }
        let task = tokio::spawn(async move {
            // Unregisters the connection however the task ends (done, timed out, aborted).
            let _open = OpenGuard {
                open: registered,
                id,
            };
            serve_connection(stream, app, limits).await;
        });
        tasks.push_back((id, task.abort_handle()));
    }
}

/// Most bytes of one request's head (hyper's read buffer); a larger one closes the
/// connection (hyper answers 431).
pub const MAX_HEADER_BYTES: usize = 16 * 1024;

/// The connections being served, oldest first.
#[derive(Default)]
struct OpenConnections {
    tasks: std::sync::Mutex<std::collections::VecDeque<(u64, tokio::task::AbortHandle)>>,
}

impl OpenConnections {
    fn lock(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::VecDeque<(u64, tokio::task::AbortHandle)>>
    {
        self.tasks.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn remove(&self, id: u64) {
        self.lock().retain(|(i, _)| *i != id);
    }
}

/// Unregisters a connection when its task ends.
struct OpenGuard {
    open: Arc<OpenConnections>,
    id: u64,
}

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.open.remove(self.id);
    }
}

/// Serves one accepted connection (any byte stream) with `app` until the client is done,
/// the connection fails, or [`ServeLimits::connection_timeout`] passes: hyper's HTTP/1
/// parser, then the router. What [`serve_with`] runs per client; the `http` fuzz target
/// feeds it arbitrary bytes.
pub async fn serve_connection<I>(io: I, app: Router, limits: ServeLimits)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let svc = hyper_util::service::TowerToHyperService::new(app);
    let mut b = hyper::server::conn::http1::Builder::new();
    b.timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(MAX_HEADER_BYTES);
    let conn = b.serve_connection(hyper_util::rt::TokioIo::new(io), svc);
    let _ = tokio::time::timeout(limits.connection_timeout, conn).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::MetricsOptions;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn listen_addresses() {
        assert_eq!(
            parse_listen_addr(":9494").unwrap(),
            "0.0.0.0:9494".parse().unwrap()
        );
        assert_eq!(
            parse_listen_addr("9494").unwrap(),
            "0.0.0.0:9494".parse().unwrap()
        );
        assert_eq!(
            parse_listen_addr("127.0.0.1:1").unwrap(),
            "127.0.0.1:1".parse().unwrap()
        );
        assert_eq!(
            parse_listen_addr("[::1]:9494").unwrap(),
            "[::1]:9494".parse().unwrap()
        );
        for bad in ["", ":", ":99999", "host", "1.2.3.4", "::1:9494"] {
            let e = parse_listen_addr(bad).unwrap_err().to_string();
            assert!(e.contains("HOST:PORT"), "{bad}: {e}");
        }
    }

    async fn get_raw(addr: SocketAddr, req: &str) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(req.as_bytes()).await.unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn serves_metrics_health_and_rejects_the_rest() {
        let m = Arc::new(Metrics::new(MetricsOptions::default()).unwrap());
        m.processes.set(3);
        let health = Arc::new(Health::new());
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let task = tokio::spawn(serve(
            l,
            Arc::clone(&m),
            Arc::clone(&health),
            Duration::from_secs(60),
        ));
        let out = get_raw(
            addr,
            "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
        .await;
        assert!(out.starts_with("HTTP/1.1 200 OK\r\n"), "{out}");
        assert!(out.contains("text/plain; version=0.0.4"), "{out}");
        assert!(out.contains("hami_processes_tracked 3"));
        let out = get_raw(
            addr,
            "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
        .await;
        assert!(out.starts_with("HTTP/1.1 200 OK\r\n"), "{out}");
        let out = get_raw(
            addr,
            "GET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
        .await;
        assert!(out.starts_with("HTTP/1.1 404"), "{out}");
        let out = get_raw(
            addr,
            "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        )
        .await;
        assert!(out.starts_with("HTTP/1.1 405"), "{out}");
        // Garbage gets a 400 from hyper, not a hang or a crash.
        let out = get_raw(addr, "\u{1}\u{2}garbage\r\n\r\n").await;
        assert!(out.is_empty() || out.starts_with("HTTP/1.1 400"), "{out}");
        task.abort();
    }

    #[tokio::test]
    async fn a_client_that_never_finishes_its_headers_is_dropped() {
        let m = Arc::new(Metrics::new(MetricsOptions::default()).unwrap());
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let limits = ServeLimits {
            header_timeout: Duration::from_millis(200),
            connection_timeout: Duration::from_secs(30),
            max_connections: 2,
        };
        let task = tokio::spawn(serve_with(
            l,
            m,
            Arc::new(Health::new()),
            Duration::from_secs(60),
            limits,
        ));
        let mut slow = tokio::net::TcpStream::connect(addr).await.unwrap();
        slow.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
            .await
            .unwrap();
        let mut buf = Vec::new();
        let t = std::time::Instant::now();
        let _ = tokio::time::timeout(Duration::from_secs(5), slow.read_to_end(&mut buf)).await;
        assert!(
            t.elapsed() < Duration::from_secs(3),
            "held {:?}",
            t.elapsed()
        );
        // The server still answers others.
        let out = get_raw(
            addr,
            "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
        .await;
        assert!(out.starts_with("HTTP/1.1 200"), "{out}");
        task.abort();
    }

    #[tokio::test]
    async fn healthz_is_503_when_the_loop_stalls() {
        let m = Arc::new(Metrics::new(MetricsOptions::default()).unwrap());
        let health = Arc::new(Health::default()); // never beat
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let task = tokio::spawn(serve(l, m, health, Duration::from_secs(1)));
        let out = get_raw(
            addr,
            "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
        .await;
        assert!(out.starts_with("HTTP/1.1 503"), "{out}");
        task.abort();
    }

    /// Issue 12 (agent faults): 200 clients that connect and then stall (half a request,
    /// one byte, a TLS hello, nothing at all) held every connection slot for the header
    /// timeout, and the scraper was refused at accept meanwhile. Now a new connection closes
    /// the oldest: the endpoint keeps answering, and holds at most `max_connections`.
    #[tokio::test]
    async fn keeps_serving_while_200_slow_or_malformed_clients_are_connected() {
        let m = Arc::new(Metrics::new(MetricsOptions::default()).unwrap());
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let limits = ServeLimits::default();
        let task = tokio::spawn(serve_with(
            l,
            m,
            Arc::new(Health::new()),
            Duration::from_secs(60),
            limits,
        ));
        let mut clients = Vec::new();
        for i in 0..200 {
            let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
            let stall: &[u8] = match i % 4 {
                0 => b"GET /metrics HTTP/1.1\r\nHost: x\r\n",
                1 => b"G",
                2 => b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",
                _ => b"",
            };
            c.write_all(stall).await.unwrap();
            clients.push(c);
        }
        // All connected, well within the header timeout: the endpoint still answers.
        let t = std::time::Instant::now();
        for _ in 0..5 {
            let out = tokio::time::timeout(
                Duration::from_secs(2),
                get_raw(
                    addr,
                    "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                ),
            )
            .await
            .expect("answered in time");
            assert!(out.starts_with("HTTP/1.1 200 OK\r\n"), "{out:?}");
        }
        assert!(t.elapsed() < limits.header_timeout, "{:?}", t.elapsed());
        // Bounded: the server holds at most `max_connections` of them open.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut open = 0;
        for c in &mut clients {
            let mut buf = [0u8; 256];
            if let Err(_still_open) =
                tokio::time::timeout(Duration::from_millis(1), c.read(&mut buf)).await
            {
                open += 1;
            }
        }
        assert!(
            open <= limits.max_connections,
            "{open} slow clients still connected"
        );
        // A head over the limit is refused, not buffered.
        let big = format!(
            "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Pad: {}\r\n\r\n",
            "a".repeat(MAX_HEADER_BYTES * 2)
        );
        let out = get_raw(addr, &big).await;
        assert!(out.is_empty() || out.starts_with("HTTP/1.1 431"), "{out:?}");
        task.abort();
    }
}
