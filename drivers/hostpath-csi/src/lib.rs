//! `hostpath-csi`: a reference CSI v1 driver with its own backend, in the
//! style of kubernetes-csi/csi-driver-host-path. Volumes are directories it
//! creates in a state directory on the host; the node plugin bind-mounts them
//! through the lab's node mount table. It shares no backend with bosh-csi —
//! it proves the lab's CSI system judges any driver — and carries switchable
//! seeded bugs the lab must catch.
//!
//! # Volumes
//!
//! The volume id is `hp-` + the first 32 hex digits of sha256(CSI name), and
//! the volume is the directory `<state-dir>/volumes/<id>`. The records
//! (volumes by name, snapshots, attachments per node) are JSON in
//! `<state-dir>/state.json`, written atomically and re-read under an flock for
//! every call, so a SIGKILLed controller restarts where it stopped and a retry
//! finds what the first try made: the same name answers the same volume; a
//! known name with a capacity outside the asked range or another content
//! source is ALREADY_EXISTS. The intent is saved before the directory is made
//! (under a temporary name, then renamed), so a crash in between is finished
//! by the retry and leaves no orphan. Capacity is recorded, not enforced (a
//! directory has none): `required_bytes`, default 1 GiB, at most 1 TiB
//! (OUT_OF_RANGE beyond, or when a content source does not fit `limit_bytes`).
//! A volume can be restored from a snapshot or cloned from a volume (a copy
//! of its directory). Every access mode is served, single-node modes on one
//! node at a time (FAILED_PRECONDITION otherwise); raw block is refused with
//! INVALID_ARGUMENT; `fs_type` and `mount_flags` are accepted and not applied
//! (the directory lives on the host's filesystem). See [`state`] for the layout.
//!
//! # Parameters
//!
//! None. Any StorageClass or VolumeSnapshotClass key other than the CO's own
//! `csi.storage.k8s.io/*` is INVALID_ARGUMENT.
//!
//! # Snapshots
//!
//! The snapshot id is `hps-` + 32 hex digits of sha256(name); CreateSnapshot
//! copies the volume's directory to `<state-dir>/snapshots/<id>`, ready when
//! answered. The same name for another source volume is ALREADY_EXISTS.
//!
//! # Node
//!
//! `--node-id` names the node; a node plugin registers itself in
//! `<state-dir>/nodes/` when it starts, which is how the controller tells a
//! node that exists (ControllerPublish to any other is NOT_FOUND) and its
//! `--max-volumes-per-node` (RESOURCE_EXHAUSTED beyond it). NodeStage binds
//! the volume's directory to the staging path (read-only for *_READER_ONLY
//! modes), NodePublish binds the staging path to the target (read-only when
//! `readonly` or a *_READER_ONLY mode), both through the lab's mount table at
//! `--mounter-url` (required: this driver never touches the host's mounts).
//! Controller and node processes on one host share `--state-dir`.
//!
//! # Mutants (seeded bugs, see [`Mutant`])
//!
//! `retry-makes-second-dir`, `publish-ignores-readonly`, `attach-steals`,
//! `delete-leaves-data`.

pub mod cli;
pub mod config;
pub mod controller;
pub mod driver;
pub mod error;
pub mod node;
pub mod state;

use std::path::Path;

use anyhow::Context as _;
use drivelab_proto::csi::{
    controller_server::ControllerServer, identity_server::IdentityServer, node_server::NodeServer,
};

pub use config::{DriverConfig, Mode, Mutant};
pub use driver::HostPathDriver;
pub use error::DriverError;
pub use state::{inspect, BackendView};

/// The name GetPluginInfo reports (the CO keys PVs and VolumeAttachments on it).
pub const DRIVER_NAME: &str = "hostpath.csi.drivelab.dev";

/// Serve the services `config.mode` names on a Unix socket until `shutdown`
/// resolves. Opens the state directory first (an unusable one is an error
/// before anything is served). Removes a stale socket file (never a regular file).
pub async fn serve_unix(
    config: DriverConfig,
    socket: &Path,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let state_dir = config.state_dir.clone();
    let driver = tokio::task::spawn_blocking(move || HostPathDriver::new(config))
        .await
        .context("starting the driver")?
        .with_context(|| format!("opening state directory {}", state_dir.display()))?;
    serve_driver(driver, socket, shutdown).await
}

/// [`serve_unix`] for an already built driver (e.g. one with its own mounter).
pub async fn serve_driver(
    driver: HostPathDriver,
    socket: &Path,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let listener = bind_unix(socket)?;
    let mode = driver.config().mode;
    tracing::info!(socket = %socket.display(), driver = DRIVER_NAME, ?mode, state_dir = %driver.backend().root().display(), "serving CSI");
    // Services left out answer UNIMPLEMENTED, as a split deployment's would.
    let controller = mode
        .controller()
        .then(|| ControllerServer::new(driver.clone()));
    let node = mode.node().then(|| NodeServer::new(driver.clone()));
    tonic::transport::Server::builder()
        .add_service(IdentityServer::new(driver))
        .add_optional_service(controller)
        .add_optional_service(node)
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
