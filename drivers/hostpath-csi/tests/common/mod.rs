//! The lab the gRPC tests share: a state directory, one controller process
//! and one node plugin per node, each served on its own Unix socket, and each
//! node's fake mount table (fakes::csi::mounts) served on loopback.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use drivelab_fakes::clock::SimClock;
use drivelab_fakes::csi::mounts::{Filesystems, MountTable, MountView};
use drivelab_fakes::gate::Gate;
use drivelab_fakes::history::History;
use drivelab_fakes::serve::{loopback, Listener};
use drivelab_proto::csi::{
    controller_client::ControllerClient, node_client::NodeClient, volume_capability, CapacityRange,
    ControllerPublishVolumeRequest, CreateVolumeRequest, VolumeCapability,
};
use hostpath_csi::{BackendView, DriverConfig, Mode, Mutant};
use tonic::transport::Channel;

pub use volume_capability::access_mode::Mode as M;

/// One GiB.
pub const GIB: i64 = 1 << 30;

/// A driver process served in-test until stopped.
pub struct Server {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
    /// Its socket.
    pub socket: PathBuf,
}

impl Server {
    /// Serve `config` on `socket` and wait until it answers.
    pub async fn start(config: DriverConfig, socket: PathBuf) -> (Server, Channel) {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let s = socket.clone();
        let task = tokio::spawn(async move {
            hostpath_csi::serve_unix(config, &s, async {
                let _ = stopped.await;
            })
            .await
        });
        let channel = connect(&socket).await;
        (
            Server {
                stop: Some(stop),
                task,
                socket,
            },
            channel,
        )
    }

    /// Stop serving (as a crash would: nothing is flushed that was not already).
    pub async fn stop(mut self) {
        drop(self.stop.take());
        self.task.abort();
        let _ = (&mut self.task).await;
    }
}

/// Connect to a driver's socket, waiting for it to open.
pub async fn connect(socket: &Path) -> Channel {
    for _ in 0..500 {
        if let Ok(c) = drivelab_fakes::csi::connect_unix(socket).await {
            return c;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("driver never opened {}", socket.display());
}

/// The state directory, a controller, and node plugins with their mount tables.
pub struct Lab {
    /// The backend directory every process shares.
    pub state: tempfile::TempDir,
    /// The controller's client.
    pub ctl: ControllerClient<Channel>,
    /// Node id → that node plugin's client.
    pub nodes: BTreeMap<String, NodeClient<Channel>>,
    /// Node id → its mount table.
    pub tables: BTreeMap<String, MountTable>,
    mutants: Vec<Mutant>,
    controller: Option<Server>,
    node_servers: Vec<Server>,
    _listeners: Vec<Listener>,
    sockets: tempfile::TempDir,
}

impl Lab {
    /// A controller and node plugins for `nodes` (id, max volumes), all with `mutants`.
    pub async fn start(mutants: &[Mutant], nodes: &[(&str, i64)]) -> Lab {
        let state = tempfile::tempdir().unwrap();
        let sockets = tempfile::tempdir().unwrap();
        let (mut node_clients, mut tables, mut servers, mut listeners) =
            (BTreeMap::new(), BTreeMap::new(), Vec::new(), Vec::new());
        for (i, (node, max)) in nodes.iter().enumerate() {
            let table = MountTable::new(
                node,
                Arc::new(Vec::new),
                Filesystems::default(),
                Gate::new(History::new(SimClock::new())),
            );
            let l = table.serve(loopback()).await.unwrap();
            let config = DriverConfig {
                mode: Mode::Node,
                node_id: node.to_string(),
                state_dir: state.path().to_path_buf(),
                mounter_url: l.url(),
                max_volumes_per_node: *max,
                mutants: mutants.to_vec(),
                ..Default::default()
            };
            let (server, ch) =
                Server::start(config, sockets.path().join(format!("node-{i}.sock"))).await;
            node_clients.insert(node.to_string(), NodeClient::new(ch));
            tables.insert(node.to_string(), table);
            servers.push(server);
            listeners.push(l);
        }
        let (controller, ch) = Server::start(
            controller_config(state.path(), mutants),
            sockets.path().join("ctl.sock"),
        )
        .await;
        Lab {
            ctl: ControllerClient::new(ch),
            state,
            nodes: node_clients,
            tables,
            mutants: mutants.to_vec(),
            controller: Some(controller),
            node_servers: servers,
            _listeners: listeners,
            sockets,
        }
    }

    /// Stop the controller as a crash would, and start a fresh one on the same state directory.
    pub async fn restart_controller(&mut self) {
        if let Some(s) = self.controller.take() {
            s.stop().await;
        }
        let config = controller_config(self.state.path(), &self.mutants);
        let (server, ch) = Server::start(config, self.sockets.path().join("ctl.sock")).await;
        self.controller = Some(server);
        self.ctl = ControllerClient::new(ch);
    }

    /// A node plugin's client.
    pub fn node(&self, id: &str) -> NodeClient<Channel> {
        self.nodes[id].clone()
    }

    /// A node's mounts.
    pub fn mounts(&self, node: &str) -> Vec<MountView> {
        self.tables[node].mounts()
    }

    /// What the backend holds now.
    pub fn backend(&self) -> BackendView {
        hostpath_csi::inspect(self.state.path()).unwrap()
    }

    /// A volume's directory.
    pub fn volume_dir(&self, id: &str) -> PathBuf {
        std::fs::canonicalize(self.state.path())
            .unwrap()
            .join("volumes")
            .join(id)
    }

    /// Volume directories no record owns (what the no-orphans check counts).
    pub fn orphan_dirs(&self) -> Vec<String> {
        let b = self.backend();
        b.volume_dirs
            .into_iter()
            .filter(|d| !b.volumes.iter().any(|v| &v.id == d))
            .collect()
    }

    /// CreateVolume of `name` with `required` bytes, SINGLE_NODE_WRITER.
    pub async fn create(&mut self, name: &str, required: i64) -> Result<String, tonic::Status> {
        self.ctl
            .create_volume(create_req(name, required))
            .await
            .map(|r| r.into_inner().volume.unwrap().volume_id)
    }

    /// ControllerPublishVolume.
    pub async fn publish(
        &mut self,
        vol: &str,
        node: &str,
        mode: M,
        readonly: bool,
    ) -> Result<(), tonic::Status> {
        self.ctl
            .controller_publish_volume(ControllerPublishVolumeRequest {
                volume_id: vol.into(),
                node_id: node.into(),
                volume_capability: Some(cap(mode)),
                readonly,
                ..Default::default()
            })
            .await
            .map(drop)
    }
}

/// A controller-only configuration on `state`.
pub fn controller_config(state: &Path, mutants: &[Mutant]) -> DriverConfig {
    DriverConfig {
        mode: Mode::Controller,
        state_dir: state.to_path_buf(),
        mutants: mutants.to_vec(),
        ..Default::default()
    }
}

/// A mount capability with `mode`.
pub fn cap(mode: M) -> VolumeCapability {
    VolumeCapability {
        access_type: Some(volume_capability::AccessType::Mount(
            volume_capability::MountVolume::default(),
        )),
        access_mode: Some(volume_capability::AccessMode { mode: mode as i32 }),
    }
}

/// A CreateVolume of `name` for `required` bytes (0 = unspecified).
pub fn create_req(name: &str, required: i64) -> CreateVolumeRequest {
    CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(CapacityRange {
            required_bytes: required,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![cap(M::SingleNodeWriter)],
        ..Default::default()
    }
}
