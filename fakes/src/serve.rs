//! Running a fake's axum router on a real loopback listener, with a handle
//! that stops it. Every fake binds 127.0.0.1 unless told otherwise.

use std::net::SocketAddr;

use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A running HTTP listener; dropping it (or calling `stop`) shuts it down.
pub struct Listener {
    /// The bound address (port chosen by the OS when asked for port 0).
    pub addr: SocketAddr,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl Listener {
    /// `http://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stop accepting, close connections, and wait for the server task.
    pub async fn stop(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.task.take() {
            t.abort();
            let _ = t.await;
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

/// Serve `router` on `addr` (use `127.0.0.1:0` for an OS-chosen port).
pub async fn serve_http(router: axum::Router, addr: SocketAddr) -> std::io::Result<Listener> {
    let listener = TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let server = axum::serve(listener, router.into_make_service())
            .with_graceful_shutdown(async move {
                let _ = rx.await;
            });
        if let Err(e) = server.await {
            tracing::warn!(%addr, error = %e, "fake listener stopped with an error");
        }
    });
    Ok(Listener { addr, shutdown: Some(tx), task: Some(task) })
}

/// The loopback address with an OS-chosen port.
pub fn loopback() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}
