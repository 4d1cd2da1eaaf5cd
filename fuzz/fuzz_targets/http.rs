//! The agent's metrics endpoint, request path end to end: arbitrary bytes sent on one
//! connection to `http::serve_connection` (hyper's HTTP/1 parser, then the router and the
//! `/metrics`, `/healthz` and `/` handlers), the way a client on the network would send them.
//! Checked: the connection ends (the input is followed by EOF), nothing panics, and what comes
//! back is nothing or HTTP/1.1 responses with a status the endpoint is documented to give.
#![no_main]

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use hami_user::http::{router, serve_connection, Health, ServeLimits};
use hami_user::metrics::{Metrics, MetricsOptions};
use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Statuses the endpoint may answer with: the handlers' (200), the router's (404, 405) and
/// hyper's for malformed requests (400, 408, 413, 414, 431, 501, 505).
const ALLOWED: [&str; 10] = [
    "200", "400", "404", "405", "408", "413", "414", "431", "501", "505",
];

struct Fixture {
    rt: tokio::runtime::Runtime,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let metrics = Arc::new(Metrics::new(MetricsOptions::default()).expect("metrics"));
        metrics.processes.set(3);
        Fixture {
            rt: tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .expect("runtime"),
            metrics,
            health: Arc::new(Health::new()),
        }
    })
}

fuzz_target!(|data: &[u8]| {
    let f = fixture();
    let app = router(
        Arc::clone(&f.metrics),
        Arc::clone(&f.health),
        Duration::from_secs(3600),
    );
    let limits = ServeLimits {
        header_timeout: Duration::from_secs(2),
        connection_timeout: Duration::from_secs(4),
        max_connections: 1,
    };
    let input = data.to_vec();
    let out = f.rt.block_on(async move {
        let (mut client, server) = tokio::io::duplex(16 * 1024);
        let srv = tokio::spawn(serve_connection(server, app, limits));
        let (mut rd, mut wr) = tokio::io::split(&mut client);
        let write = async {
            // The server may close early (a 400): what is left is not read, that is fine.
            let _ = wr.write_all(&input).await;
            let _ = wr.shutdown().await;
        };
        let read = async {
            let mut out = Vec::new();
            let _ = rd.read_to_end(&mut out).await;
            out
        };
        let both = async { tokio::join!(write, read).1 };
        let out = tokio::time::timeout(Duration::from_secs(8), both)
            .await
            .expect("the connection did not end within 8 s of the input's EOF");
        srv.await.expect("the connection task panicked");
        out
    });
    if out.is_empty() {
        return;
    }
    let text = String::from_utf8_lossy(&out);
    assert!(
        text.starts_with("HTTP/1.1 ") || text.starts_with("HTTP/1.0 "),
        "not an HTTP response: {:?}",
        &text[..text.len().min(200)]
    );
    let status = &text[9..text.len().min(12)];
    assert!(
        ALLOWED.contains(&status),
        "unexpected status {status:?}: {:?}",
        &text[..text.len().min(200)]
    );
});
