//! `cosi-s3`: the reference COSI v1alpha1 driver for an S3 backend with a
//! RustFS-style admin API, written the way DOMAIN.md §1 says a correct one must
//! be (checkpoint before mutation, random persisted secrets, per-grant policies,
//! ownership-checked delete), plus switchable seeded bugs the lab must catch.

pub mod admin;
pub mod checkpoint;
pub mod config;
pub mod error;
pub mod policy;
pub mod service;

use std::path::Path;

use anyhow::Context as _;
use drivelab_proto::cosi::{identity_server::IdentityServer, provisioner_server::ProvisionerServer};

pub use config::{DriverConfig, Mutant, DEFAULT_STATE_NAMESPACE};
pub use error::DriverError;
pub use service::CosiS3Driver;

/// The name DriverGetInfo reports (the provisioner sidecar keys Buckets on it).
pub const DRIVER_NAME: &str = "cosi-s3.drivelab.dev";

/// Serve Identity + Provisioner on a Unix socket until `shutdown` resolves.
/// Removes a stale socket file first (never a regular file).
pub async fn serve_unix(
    config: DriverConfig,
    socket: &Path,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let driver = CosiS3Driver::new(config).await?;
    let listener = bind_unix(socket)?;
    tracing::info!(socket = %socket.display(), driver = DRIVER_NAME, "serving COSI");
    tonic::transport::Server::builder()
        .add_service(IdentityServer::new(driver.clone()))
        .add_service(ProvisionerServer::new(driver))
        .serve_with_incoming_shutdown(tokio_stream::wrappers::UnixListenerStream::new(listener), shutdown)
        .await
        .with_context(|| format!("serving on {}", socket.display()))?;
    // Leave no socket behind for the next start to trip over.
    let _ = std::fs::remove_file(socket);
    Ok(())
}

fn bind_unix(socket: &Path) -> anyhow::Result<tokio::net::UnixListener> {
    use std::os::unix::fs::FileTypeExt as _;
    match std::fs::symlink_metadata(socket) {
        Ok(m) if m.file_type().is_socket() => std::fs::remove_file(socket)
            .with_context(|| format!("removing stale socket {}", socket.display()))?,
        Ok(_) => anyhow::bail!(
            "{} exists and is not a socket; refusing to replace it (choose another --endpoint)",
            socket.display()
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("inspecting {}", socket.display())),
    }
    if let Some(dir) = socket.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    tokio::net::UnixListener::bind(socket).with_context(|| format!("binding {}", socket.display()))
}
