//! `bosh-csi`: the reference CSI v1 driver for BOSH dynamic disks. The
//! Controller provisions and attaches disks through the Director's
//! dynamic-disks API with a narrowly scoped UAA token; the Node plugin stages
//! and publishes them on the BOSH instance; both are idempotent the way the
//! CSI spec demands, and carry switchable seeded bugs the lab must catch.
//!
//! # Volumes
//!
//! The volume id is the BOSH disk name, `csi-` + the first 32 hex digits of
//! sha256(CSI name): a retried CreateVolume finds the disk its first try made
//! (looked up with `GET /dynamic_disks` before any create). Sizes are whole MiB
//! (BOSH's unit), rounded up from `required_bytes`; 1 GiB when unspecified.
//! Only single-node access modes and mounted filesystems (ext4, xfs) are
//! served: a BOSH disk attaches to one VM at a time.
//!
//! # StorageClass parameters
//!
//! `disk_pool_name` (required: a disk type of the Director's cloud config),
//! `deployment_name` (required: the deployment owning the disks), `az`
//! (optional). Any other key is INVALID_ARGUMENT, except the CO's own
//! `csi.storage.k8s.io/*`. A known name with a different pool, deployment, az
//! or a size outside the capacity range answers ALREADY_EXISTS.
//!
//! # Node
//!
//! `--node-id` is the BOSH instance id; ControllerPublish attaches to it and
//! answers `publish_context {"disk_cid": ...}`, by which NodeStage finds the
//! device. The node talks to a [`mounter::Mounter`]: the lab's HTTP mount
//! table (`--mounter-url`) or, without it, real mount(8). A capability's
//! `mount_flags` are accepted but not applied (the mount table has no options),
//! and the driver keeps no state of its own: the Director and the mount table
//! are the truth, so a restarted driver picks up where the old one stopped.
//!
//! # Mutants (seeded bugs, see [`Mutant`])
//!
//! `create-not-idempotent`, `ignore-incompatible-size`,
//! `publish-steals-attachment`, `unpublish-missing-is-error`,
//! `leak-mount-on-failed-stage`, `writable-readonly-publish`, `admin-token`,
//! `stale-delta`, `replayable-token`.
//!
//! # Snapshots and changed blocks
//!
//! See [`snapshots`] (CreateSnapshot/DeleteSnapshot/ListSnapshots through the
//! Director's snapshot endpoints) and [`snapshot_metadata`] (the CSI
//! SnapshotMetadata service over the IaaS block API, with session tokens).

pub mod cli;
pub mod config;
pub mod controller;
pub mod director;
pub mod driver;
pub mod error;
pub mod http;
pub mod mounter;
pub mod node;
pub mod secret;
pub mod snapshot_metadata;
pub mod snapshots;

use std::path::Path;

use anyhow::Context as _;
use drivelab_proto::csi::{
    controller_server::ControllerServer, identity_server::IdentityServer, node_server::NodeServer,
    snapshot_metadata_server::SnapshotMetadataServer,
};

pub use config::{DriverConfig, Mode, Mutant};
pub use driver::BoshCsiDriver;
pub use error::DriverError;
pub use secret::Secret;

/// The name GetPluginInfo reports (the CO keys PVs and VolumeAttachments on it).
pub const DRIVER_NAME: &str = "bosh-csi.drivelab.dev";

/// Serve the services `config.mode` names on a Unix socket until `shutdown`
/// resolves. Removes a stale socket file first (never a regular file).
pub async fn serve_unix(
    config: DriverConfig,
    socket: &Path,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let driver = BoshCsiDriver::new(config).map_err(anyhow::Error::msg)?;
    serve_driver(driver, socket, shutdown).await
}

/// [`serve_unix`] for an already built driver (e.g. one with its own mounter).
pub async fn serve_driver(
    driver: BoshCsiDriver,
    socket: &Path,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    if let Some(d) = &driver.inner.director {
        d.warm_up().await;
    }
    let listener = bind_unix(socket)?;
    let mode = driver.config().mode;
    tracing::info!(socket = %socket.display(), driver = DRIVER_NAME, ?mode, "serving CSI");
    // Services left out answer UNIMPLEMENTED, as a split deployment's would.
    let controller = mode
        .controller()
        .then(|| ControllerServer::new(driver.clone()));
    let node = mode.node().then(|| NodeServer::new(driver.clone()));
    // The SnapshotMetadata service shares the controller's socket (the
    // sidecar is its only caller) when an IaaS block API is configured.
    let metadata = (mode.controller() && !driver.config().block_api_url.is_empty())
        .then(|| SnapshotMetadataServer::new(driver.clone()));
    tonic::transport::Server::builder()
        .add_service(IdentityServer::new(driver))
        .add_optional_service(controller)
        .add_optional_service(node)
        .add_optional_service(metadata)
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
