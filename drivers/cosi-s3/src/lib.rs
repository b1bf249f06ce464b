//! `cosi-s3`: the reference COSI v1alpha1 driver for an S3 backend with a
//! RustFS-style admin API, written the way DOMAIN.md §1 says a correct one must
//! be (checkpoint before mutation, random persisted secrets, per-grant policies,
//! ownership-checked delete), plus switchable seeded bugs the lab must catch.
//!
//! # Class parameters
//!
//! BucketClass and BucketAccessClass: `endpoint` (required, `http://host:port`),
//! `objectStoreUserSecretName` / `objectStoreUserSecretNamespace` (required: the
//! admin Secret with `accessKey` and `secretKey`), `region` (default
//! `us-east-1`), `adminApi` (only `rustfs`).
//!
//! BucketAccessClass only:
//! - `policy`: an existing canned policy to attach instead of generating one.
//! - `accessMode`: `ReadWrite` (default) or `ReadOnly` (case-insensitive), for
//!   the generated policy: COSI v1alpha2's `BucketAccessMode` spelling, carried
//!   as a class parameter because v1alpha1 has no field for it. A read-only
//!   grant's policy has only `s3:GetObject`, `s3:ListBucket`, `s3:GetBucketLocation`.
//! - `preferredAccessKey`: the access key the grant should get (3-20 of
//!   `A-Z a-z 0-9 - _ .`). At most one access holds it at a time: the first
//!   grant reserves it, every other grant asking for it gets a random key (and
//!   keeps that key on retries). A backend user with that key that this driver
//!   did not create is left alone and the grant gets a random key. Revoke frees it.
//!
//! Every parameter is part of the grant's (or bucket's) parameters hash: the
//! same name with different parameters answers AlreadyExists.
//!
//! # State in Kubernetes (`--state-namespace`)
//!
//! - ConfigMap `bucket-<h>`: one per bucket created (ownership proof for delete).
//! - Secret `grant-<h>`: one per grant, with its secret key, written before add-user.
//! - ConfigMap `key-<h>`: a `preferredAccessKey` reservation, data `accessKey`,
//!   `accountName`, `state` (`Held`, or `Releasing` while the holder's revoke
//!   finishes). Created before the grant checkpoint; deleted by revoke after it.
//!
//! `<h>` is the first 16 hex digits of sha256 of the bucket name, account name
//! or access key; all carry the labels `app.kubernetes.io/managed-by` and
//! `cosi-s3.drivelab.dev/kind` (`bucket`, `grant`, `key`).
//!
//! # Mutants (seeded bugs, see [`Mutant`])
//!
//! `predictable-secret`, `user-before-checkpoint`, `shared-policy`,
//! `rotate-on-retry`, `already-exists-is-success`, `delete-unowned`,
//! `unknown-auth-as-key`, `ignore-incompatible-params`,
//! `shared-preferred-key` (`preferredAccessKey` used with no reservation and no
//! check, so a second grant's add-user replaces the first grant's secret), and
//! `revoke-needs-parameter` (every revoke refused INVALID_ARGUMENT, which the
//! sidecar retries for ever); two order-of-commit bugs a crash exposes:
//! `bucket-before-checkpoint` (the bucket PUT before its ownership checkpoint)
//! and `policy-after-forget` (revoke deletes the grant's checkpoint before
//! its policy); and, for access modes, objects the driver does not own and
//! secret sources: `read-only-gets-write`, `rewrite-external-policy`,
//! `delete-prefix-buckets`, `time-seeded-secret`, `same-secret-every-access`.

pub mod admin;
pub mod checkpoint;
pub mod config;
pub mod error;
pub mod policy;
pub mod service;

use std::path::Path;

use anyhow::Context as _;
use drivelab_proto::cosi::{
    identity_server::IdentityServer, provisioner_server::ProvisionerServer,
};

pub use config::{DriverConfig, Mutant, PolicyLayout, DEFAULT_STATE_NAMESPACE, SECRET_LENGTHS};
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
    serve_driver(CosiS3Driver::new(config).await?, socket, shutdown).await
}

/// Serve an already built driver (e.g. one given a wall clock) on a Unix socket.
pub async fn serve_driver(
    driver: CosiS3Driver,
    socket: &Path,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let listener = bind_unix(socket)?;
    tracing::info!(socket = %socket.display(), driver = DRIVER_NAME, "serving COSI");
    tonic::transport::Server::builder()
        .add_service(IdentityServer::new(driver.clone()))
        .add_service(ProvisionerServer::new(driver))
        .serve_with_incoming_shutdown(
            tokio_stream::wrappers::UnixListenerStream::new(listener),
            shutdown,
        )
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
