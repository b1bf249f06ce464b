//! Running a fake's axum router on a real loopback listener. We own the accept
//! loop (rather than `axum::serve`) so the interception point can cut one
//! connection — a lost reply, a partition — and a restart can break them all,
//! the way a real network or a real process restart does.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tower::ServiceExt;

/// Put into every request's extensions: firing it drops that request's TCP
/// connection without a reply (the client sees the connection close).
#[derive(Clone, Default, Debug)]
pub struct CutSwitch {
    fired: Arc<AtomicBool>,
    notify: Arc<Notify>,
}

impl CutSwitch {
    /// Drop the connection now.
    pub fn fire(&self) {
        self.fired.store(true, Ordering::SeqCst);
        self.notify.notify_waiters();
    }

    async fn fired(&self) {
        loop {
            let n = self.notify.notified();
            tokio::pin!(n);
            n.as_mut().enable();
            if self.fired.load(Ordering::SeqCst) {
                return;
            }
            n.await;
        }
    }
}

/// A running HTTP listener; dropping it (or calling `stop`) shuts it down and
/// breaks every open connection.
pub struct Listener {
    /// The bound address (port chosen by the OS when asked for port 0).
    pub addr: SocketAddr,
    /// `http` or `https`.
    scheme: &'static str,
    stop: Arc<Notify>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Listener {
    /// `http://127.0.0.1:PORT` (`https://` when served over TLS)
    pub fn url(&self) -> String {
        format!("{}://{}", self.scheme, self.addr)
    }

    /// Stop accepting, break every connection — the server's end closes and
    /// the client's end is waited for ([`DRAIN_BOUND`]) — and wait for it.
    pub async fn stop(mut self) {
        self.stop.notify_one();
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

/// How long a connection may sit without sending a complete request head —
/// idle between keep-alive requests, or dribbling its headers — before it is
/// closed. Every fake's listener has it, so idle clients cannot pin
/// connections (and their tasks) for ever.
pub const IDLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// How long a stopping listener waits for each client to close its end of a
/// connection the server closed (real time). A client that notices sooner
/// (every HTTP client with a connection pool: it reads the close at once)
/// costs nothing; one that never reads its socket costs this once per stop.
pub const DRAIN_BOUND: std::time::Duration = std::time::Duration::from_secs(2);

/// Serve `router` on `addr` (use `127.0.0.1:0` for an OS-chosen port), with
/// the [`IDLE_TIMEOUT`].
pub async fn serve_http(router: axum::Router, addr: SocketAddr) -> std::io::Result<Listener> {
    serve_http_with_idle_timeout(router, addr, IDLE_TIMEOUT).await
}

/// [`serve_http`] with another idle/slow-header timeout (tests use a short one).
pub async fn serve_http_with_idle_timeout(
    router: axum::Router,
    addr: SocketAddr,
    idle: std::time::Duration,
) -> std::io::Result<Listener> {
    serve_on(router, addr, idle, None).await
}

/// Serve `router` over TLS as `identity` (HTTP/1.1), with the [`IDLE_TIMEOUT`],
/// which also bounds the handshake.
pub async fn serve_https(
    router: axum::Router,
    addr: SocketAddr,
    identity: &crate::tls::TlsIdentity,
) -> std::io::Result<Listener> {
    serve_on(router, addr, IDLE_TIMEOUT, Some(identity.acceptor())).await
}

/// A connection's byte stream, plain or TLS.
trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Io for T {}

async fn serve_on(
    router: axum::Router,
    addr: SocketAddr,
    idle: std::time::Duration,
    tls: Option<tokio_rustls::TlsAcceptor>,
) -> std::io::Result<Listener> {
    let scheme = if tls.is_some() { "https" } else { "http" };
    let listener = TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    let stop = Arc::new(Notify::new());
    let stop_rx = stop.clone();
    let task = tokio::spawn(async move {
        // Aborting the accept loop drops this set, which aborts every connection.
        let conns = Arc::new(Mutex::new(JoinSet::new()));
        let (closing_tx, closing) = tokio::sync::watch::channel(false);
        loop {
            let accepted = tokio::select! {
                a = listener.accept() => a,
                _ = stop_rx.notified() => break,
            };
            let (stream, _) = match accepted {
                Ok(s) => s,
                Err(e) => {
                    tracing::debug!(%addr, error = %e, "accept failed");
                    continue;
                }
            };
            let Some((stream, end)) = with_second_handle(stream) else {
                continue;
            };
            let cut = CutSwitch::default();
            let ext = cut.clone();
            let svc = router.clone().map_request(
                move |mut req: axum::extract::Request<hyper::body::Incoming>| {
                    req.extensions_mut().insert(ext.clone());
                    req
                },
            );
            let svc = TowerToHyperService::new(svc);
            let mut set = conns.lock().unwrap_or_else(|p| p.into_inner());
            // Reap finished connections so the set does not grow without bound.
            while set.try_join_next().is_some() {}
            let tls = tls.clone();
            let mut closing = closing.clone();
            set.spawn(async move {
                let io: Box<dyn Io> = match tls {
                    None => Box::new(stream),
                    // A handshake that fails or stalls ends the connection.
                    Some(acceptor) => {
                        match tokio::time::timeout(idle, acceptor.accept(stream)).await {
                            Ok(Ok(s)) => Box::new(s),
                            Ok(Err(e)) => {
                                tracing::debug!(error = %e, "TLS handshake failed");
                                return;
                            }
                            Err(_) => return,
                        }
                    }
                };
                // hyper restarts the header-read timer whenever it waits for a
                // request head, so it bounds idle keep-alive connections too.
                let conn = hyper::server::conn::http1::Builder::new()
                    .timer(hyper_util::rt::TokioTimer::new())
                    .header_read_timeout(idle)
                    .keep_alive(true)
                    .serve_connection(TokioIo::new(io), svc);
                // The HTTP side is dropped with the select, before the close.
                let stopped = tokio::select! {
                    r = conn => {
                        if let Err(e) = r {
                            tracing::debug!(error = %e, "connection ended with an error");
                        }
                        false
                    }
                    _ = cut.fired() => false,
                    _ = closing.wait_for(|c| *c) => true,
                };
                if stopped {
                    close_and_wait(end).await;
                }
            });
        }
        // Stopped: no new connections; every open one — idle in a client's pool
        // or mid-request (that request gets no answer, as from a dead process)
        // — is closed and its client's close awaited, so a client never
        // reuses a connection it has not yet seen closed: whether that failed
        // would be real-time luck, and the same seed must tell one story.
        drop(listener);
        let _ = closing_tx.send(true);
        let mut set = std::mem::take(&mut *conns.lock().unwrap_or_else(|p| p.into_inner()));
        while set.join_next().await.is_some() {}
    });
    Ok(Listener {
        addr,
        scheme,
        stop,
        task: Some(task),
    })
}

/// The accepted stream, and a second handle on the same socket that outlives
/// the HTTP connection: a stopping listener closes the server's end with it
/// and waits for the client's. `None` if the socket cannot be duplicated.
fn with_second_handle(
    stream: tokio::net::TcpStream,
) -> Option<(tokio::net::TcpStream, std::net::TcpStream)> {
    let std = stream.into_std().ok()?;
    let second = std.try_clone().ok()?;
    Some((tokio::net::TcpStream::from_std(std).ok()?, second))
}

/// Close the server's end of a connection (its FIN) and wait, at most
/// [`DRAIN_BOUND`], until the client has closed its end — which a pooling
/// client does as soon as it reads the close, taking the connection out of
/// its pool.
async fn close_and_wait(end: std::net::TcpStream) {
    use tokio::io::AsyncReadExt;
    let _ = end.shutdown(std::net::Shutdown::Write);
    let Ok(mut end) = tokio::net::TcpStream::from_std(end) else {
        return;
    };
    let mut buf = [0u8; 4096];
    let _ = tokio::time::timeout(DRAIN_BOUND, async {
        // Whatever the client still sends is discarded; EOF or an error is its close.
        while let Ok(n) = end.read(&mut buf).await {
            if n == 0 {
                break;
            }
        }
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A pooling client's connections do not outlive a stop: the restarted
    /// listener's first request never lands on a connection the old one
    /// closed (which would fail or not by real-time luck). Fails when a stop
    /// closes connections without waiting for the client's close.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stop_waits_until_pooled_connections_are_gone() {
        use http_body_util::{BodyExt, Empty};
        use hyper_util::client::legacy::Client;
        let router = || axum::Router::new().route("/", axum::routing::get(|| async { "ok" }));
        let client: Client<_, Empty<bytes::Bytes>> =
            Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
        let mut l = serve_http(router(), loopback()).await.unwrap();
        let url: hyper::Uri = format!("{}/", l.url()).parse().unwrap();
        for round in 0..40 {
            for _ in 0..3 {
                let r = client.get(url.clone()).await.unwrap_or_else(|e| {
                    panic!("round {round}: a request after the restart failed: {e:?}")
                });
                r.into_body().collect().await.unwrap();
            }
            let addr = l.addr;
            l.stop().await;
            l = loop {
                // The port may take a moment to be free again (real time).
                match serve_http(router(), addr).await {
                    Ok(l) => break l,
                    Err(_) => tokio::time::sleep(std::time::Duration::from_millis(10)).await,
                }
            };
        }
    }

    /// An idle connection (before and after a request) and one dribbling its
    /// headers are closed by the server instead of being held for ever.
    #[tokio::test]
    async fn idle_and_slow_connections_are_closed() {
        let router = axum::Router::new().route("/", axum::routing::get(|| async { "ok" }));
        let l =
            serve_http_with_idle_timeout(router, loopback(), std::time::Duration::from_millis(200))
                .await
                .unwrap();
        let closed = |mut c: tokio::net::TcpStream| async move {
            let mut buf = vec![0u8; 4096];
            // Generous bound: the assertion is "closed", not how fast.
            let deadline = std::time::Duration::from_secs(20);
            loop {
                match tokio::time::timeout(deadline, c.read(&mut buf)).await {
                    Ok(Ok(0)) | Ok(Err(_)) => return true,
                    Ok(Ok(_)) => continue,
                    Err(_) => return false,
                }
            }
        };
        let idle = tokio::net::TcpStream::connect(l.addr).await.unwrap();
        assert!(closed(idle).await, "a silent connection was held");
        let mut slow = tokio::net::TcpStream::connect(l.addr).await.unwrap();
        slow.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n")
            .await
            .unwrap();
        assert!(
            closed(slow).await,
            "a connection dribbling headers was held"
        );
        let mut kept = tokio::net::TcpStream::connect(l.addr).await.unwrap();
        kept.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        assert!(closed(kept).await, "an idle keep-alive connection was held");
    }
}

/// The loopback address with an OS-chosen port.
pub fn loopback() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}
