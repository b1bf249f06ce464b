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

    /// Stop accepting, break every connection, and wait for the accept loop.
    pub async fn stop(mut self) {
        self.stop.notify_one();
        if let Some(t) = self.task.take() {
            t.abort();
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
            set.spawn(async move {
                let io: Box<dyn Io> = match tls {
                    None => Box::new(stream),
                    // A handshake that fails or stalls ends the connection.
                    Some(acceptor) => match tokio::time::timeout(idle, acceptor.accept(stream)).await {
                        Ok(Ok(s)) => Box::new(s),
                        Ok(Err(e)) => {
                            tracing::debug!(error = %e, "TLS handshake failed");
                            return;
                        }
                        Err(_) => return,
                    },
                };
                // hyper restarts the header-read timer whenever it waits for a
                // request head, so it bounds idle keep-alive connections too.
                let conn = hyper::server::conn::http1::Builder::new()
                    .timer(hyper_util::rt::TokioTimer::new())
                    .header_read_timeout(idle)
                    .keep_alive(true)
                    .serve_connection(TokioIo::new(io), svc);
                tokio::select! {
                    r = conn => if let Err(e) = r { tracing::debug!(error = %e, "connection ended with an error") },
                    _ = cut.fired() => {}
                }
            });
        }
        conns.lock().unwrap_or_else(|p| p.into_inner()).abort_all();
    });
    Ok(Listener {
        addr,
        scheme,
        stop,
        task: Some(task),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

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
