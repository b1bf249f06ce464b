//! The driver under test, run in-process on a runtime of its own so that a
//! crash is real: shutting that runtime down drops every task the driver has
//! (its gRPC server, in-flight handlers, client connections) at once.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use anyhow::{anyhow, Context};
use cosi_s3::DriverConfig;

/// A reference driver linked into the lab.
pub struct InProcessDriver {
    config: DriverConfig,
    socket: PathBuf,
    runtime: Mutex<Option<tokio::runtime::Runtime>>,
}

impl InProcessDriver {
    /// A driver that will serve on `socket` once started.
    pub fn new(config: DriverConfig, socket: &Path) -> Self {
        Self {
            config,
            socket: socket.to_path_buf(),
            runtime: Mutex::new(None),
        }
    }

    /// Start it (on a fresh runtime) and wait until its socket accepts connections.
    pub async fn start(&self) -> anyhow::Result<()> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("driver")
            .enable_all()
            .build()
            .context("starting the driver's runtime")?;
        let config = self.config.clone();
        let socket = self.socket.clone();
        let task =
            rt.spawn(
                async move { cosi_s3::serve_unix(config, &socket, std::future::pending()).await },
            );
        *self.runtime.lock().unwrap_or_else(|p| p.into_inner()) = Some(rt);
        // Real time: the driver binds its socket on its own schedule.
        for _ in 0..2000 {
            if tokio::net::UnixStream::connect(&self.socket).await.is_ok() {
                return Ok(());
            }
            if task.is_finished() {
                let why = match task.await {
                    Ok(Err(e)) => format!("{e:#}"),
                    Ok(Ok(())) => "it returned".to_string(),
                    Err(e) => e.to_string(),
                };
                return Err(anyhow!(
                    "the driver exited before opening its socket {}: {why}",
                    self.socket.display()
                ));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Err(anyhow!(
            "the driver did not open its socket {} within 20s",
            self.socket.display()
        ))
    }

    /// Kill every task of the driver now.
    pub fn kill(&self) {
        if let Some(rt) = self
            .runtime
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            rt.shutdown_background();
        }
    }

    /// Kill every task of the driver and wait until they are all gone, so none
    /// of them can still act on what happens next.
    pub async fn kill_and_wait(&self) {
        let rt = self
            .runtime
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(rt) = rt {
            let _ =
                tokio::task::spawn_blocking(move || rt.shutdown_timeout(Duration::from_secs(5)))
                    .await;
        }
    }

    /// Kill it and start it again from its persisted state (its checkpoints).
    pub async fn crash_and_restart(&self) -> anyhow::Result<()> {
        self.kill();
        // The old runtime shuts down in the background and may still accept on
        // the old socket for a moment; unlink it so "connectable" below can only
        // mean the new driver is up.
        let _ = std::fs::remove_file(&self.socket);
        self.start().await
    }
}

impl Drop for InProcessDriver {
    fn drop(&mut self) {
        // Never drop a runtime from async context (it would block); shut it down instead.
        self.kill();
    }
}
