//! The node plugin on a Unix socket, called through a tonic client, against
//! the lab's real node mount table (fakes::csi::mounts) on loopback. Checks
//! stage/publish idempotency, read-only binds and that a failed stage leaks
//! no mount — and that the node mutants visibly break those rules.

use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use bosh_csi::{DriverConfig, Mode, Mutant};
use drivelab_fakes::clock::SimClock;
use drivelab_fakes::csi::mounts::{Device, DeviceSource, Filesystems, MountEntry, MountTable};
use drivelab_fakes::gate::{CallSpec, Delivery, Gate, GateHook, Verdict};
use drivelab_fakes::history::{CallId, Component, History, Outcome};
use drivelab_fakes::serve::{loopback, Listener};
use drivelab_proto::csi::{
    controller_client::ControllerClient, identity_client::IdentityClient, node_client::NodeClient,
    volume_capability, CreateVolumeRequest, GetPluginCapabilitiesRequest,
    NodeGetCapabilitiesRequest, NodeGetInfoRequest, NodePublishVolumeRequest,
    NodeStageVolumeRequest, NodeUnpublishVolumeRequest, NodeUnstageVolumeRequest, VolumeCapability,
};
use tonic::transport::Channel;
use tonic::Code;

const NODE: &str = "2f1e1c9a-0000-4000-8000-000000000001";
const CID: &str = "disk-0001";
const VOL: &str = "csi-0123456789abcdef0123456789abcdef";
const STAGING: &str =
    "/var/lib/kubelet/plugins/kubernetes.io/csi/bosh-csi.drivelab.dev/h/globalmount";
const TARGET: &str = "/var/lib/kubelet/pods/p1/volumes/kubernetes.io~csi/pv-1/mount";
const TARGET2: &str = "/var/lib/kubelet/pods/p2/volumes/kubernetes.io~csi/pv-1/mount";

type BoxFut<'a, T> = Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

/// What the test hook does to calls into the mount table.
#[derive(Default)]
struct Faults {
    /// Lose the reply of the next call with this op (after it committed).
    lose_reply_of: Mutex<Option<&'static str>>,
}

impl GateHook for Faults {
    fn before<'a>(&'a self, _id: CallId, _call: &'a CallSpec) -> BoxFut<'a, Verdict> {
        Box::pin(async { Verdict::Proceed })
    }
    fn after<'a>(
        &'a self,
        _id: CallId,
        call: &'a CallSpec,
        _o: &'a Outcome,
    ) -> BoxFut<'a, Delivery> {
        Box::pin(async move {
            let mut slot = self.lose_reply_of.lock().unwrap();
            if slot.is_some_and(|op| op == call.op) {
                *slot = None;
                return Delivery::Cut;
            }
            Delivery::Deliver
        })
    }
}

struct NodeLab {
    table: MountTable,
    devices: Arc<Mutex<Vec<Device>>>,
    faults: Arc<Faults>,
    gate: Gate,
    node: NodeClient<Channel>,
    channel: Channel,
    _table_l: Listener,
    _dir: tempfile::TempDir,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl NodeLab {
    async fn start(mutants: &[Mutant]) -> NodeLab {
        let gate = Gate::new(History::new(SimClock::new()));
        let faults = Arc::new(Faults::default());
        gate.set_hook(faults.clone());
        let devices: Arc<Mutex<Vec<Device>>> = Arc::default();
        let d2 = devices.clone();
        let source: DeviceSource = Arc::new(move || d2.lock().unwrap().clone());
        let table = MountTable::new(NODE, source, Filesystems::default(), gate.clone());
        let table_l = table.serve(loopback()).await.unwrap();

        let dir = tempfile::tempdir().unwrap();
        let socket: PathBuf = dir.path().join("csi.sock");
        let config = DriverConfig {
            mode: Mode::Node,
            node_id: NODE.into(),
            mounter_url: table_l.url(),
            mutants: mutants.to_vec(),
            ..Default::default()
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let s = socket.clone();
        tokio::spawn(async move {
            bosh_csi::serve_unix(config, &s, async {
                let _ = stopped.await;
            })
            .await
            .unwrap();
        });
        let channel = connect(&socket).await;
        NodeLab {
            table,
            devices,
            faults,
            gate,
            node: NodeClient::new(channel.clone()),
            channel,
            _table_l: table_l,
            _dir: dir,
            _stop: stop,
        }
    }

    fn attach(&self, cid: &str) {
        self.devices.lock().unwrap().push(Device::for_disk(cid));
    }

    fn mount_at(&self, target: &str) -> Option<MountEntry> {
        self.table
            .entries()
            .into_iter()
            .find(|m| m.target == target)
    }

    async fn stage(
        &mut self,
        mode: volume_capability::access_mode::Mode,
    ) -> Result<(), tonic::Status> {
        self.node.node_stage_volume(stage_req(mode)).await.map(drop)
    }

    async fn publish(&mut self, target: &str, readonly: bool) -> Result<(), tonic::Status> {
        self.node
            .node_publish_volume(NodePublishVolumeRequest {
                volume_id: VOL.into(),
                staging_target_path: STAGING.into(),
                target_path: target.into(),
                volume_capability: Some(cap(
                    volume_capability::access_mode::Mode::SingleNodeWriter,
                    "",
                )),
                readonly,
                ..Default::default()
            })
            .await
            .map(drop)
    }

    async fn unpublish(&mut self, target: &str) -> Result<(), tonic::Status> {
        self.node
            .node_unpublish_volume(NodeUnpublishVolumeRequest {
                volume_id: VOL.into(),
                target_path: target.into(),
            })
            .await
            .map(drop)
    }

    async fn unstage(&mut self) -> Result<(), tonic::Status> {
        self.node
            .node_unstage_volume(NodeUnstageVolumeRequest {
                volume_id: VOL.into(),
                staging_target_path: STAGING.into(),
            })
            .await
            .map(drop)
    }
}

async fn connect(socket: &std::path::Path) -> Channel {
    for _ in 0..500 {
        if let Ok(c) = drivelab_fakes::csi::connect_unix(socket).await {
            return c;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("driver never opened {}", socket.display());
}

fn cap(mode: volume_capability::access_mode::Mode, fs: &str) -> VolumeCapability {
    VolumeCapability {
        access_type: Some(volume_capability::AccessType::Mount(
            volume_capability::MountVolume {
                fs_type: fs.into(),
                ..Default::default()
            },
        )),
        access_mode: Some(volume_capability::AccessMode { mode: mode as i32 }),
    }
}

fn stage_req(mode: volume_capability::access_mode::Mode) -> NodeStageVolumeRequest {
    NodeStageVolumeRequest {
        volume_id: VOL.into(),
        publish_context: [("disk_cid".to_string(), CID.to_string())].into(),
        staging_target_path: STAGING.into(),
        volume_capability: Some(cap(mode, "")),
        ..Default::default()
    }
}

use volume_capability::access_mode::Mode as M;

#[tokio::test]
async fn stage_publish_unpublish_unstage_round_trip() {
    let mut lab = NodeLab::start(&[]).await;
    lab.attach(CID);
    lab.stage(M::SingleNodeWriter).await.unwrap();
    let staged = lab.mount_at(STAGING).expect("staging mount");
    assert_eq!(staged.source, format!("/dev/disk/by-id/{CID}"));
    assert!(!staged.read_only && !staged.bind);
    assert_eq!(lab.table.filesystems().fstype(CID).as_deref(), Some("ext4"));
    // Idempotent.
    lab.stage(M::SingleNodeWriter).await.unwrap();
    assert_eq!(lab.table.entries().len(), 1);

    lab.publish(TARGET, false).await.unwrap();
    lab.publish(TARGET, false).await.unwrap();
    let p = lab.mount_at(TARGET).unwrap();
    assert!(p.bind && !p.read_only);
    assert_eq!(p.source, STAGING);
    // The same target asked read-only is a different mount: ALREADY_EXISTS.
    assert_eq!(
        lab.publish(TARGET, true).await.unwrap_err().code(),
        Code::AlreadyExists
    );
    lab.publish(TARGET2, true).await.unwrap();
    assert!(lab.mount_at(TARGET2).unwrap().read_only);

    // Unstage while published is refused; nothing is torn down under a pod.
    assert_eq!(
        lab.unstage().await.unwrap_err().code(),
        Code::FailedPrecondition
    );
    assert!(lab.mount_at(STAGING).is_some());

    for t in [TARGET, TARGET2] {
        lab.unpublish(t).await.unwrap();
        lab.unpublish(t).await.unwrap();
    }
    lab.unstage().await.unwrap();
    lab.unstage().await.unwrap();
    assert!(lab.table.entries().is_empty());

    // Every call went through the table's gate, from the driver.
    let calls = drivelab_fakes::history::calls(&lab.gate.history().events());
    assert!(calls
        .iter()
        .any(|c| c.from == Component::Driver && c.to == Component::Mounts && c.op == "mount"));
}

#[tokio::test]
async fn stage_errors_are_clean() {
    let mut lab = NodeLab::start(&[]).await;
    // Not attached here yet: NOT_FOUND, nothing mounted.
    assert_eq!(
        lab.stage(M::SingleNodeWriter).await.unwrap_err().code(),
        Code::NotFound
    );
    assert!(lab.table.entries().is_empty());
    // No publish_context: the CO skipped ControllerPublish.
    let mut req = stage_req(M::SingleNodeWriter);
    req.publish_context.clear();
    assert_eq!(
        lab.node.node_stage_volume(req).await.unwrap_err().code(),
        Code::InvalidArgument
    );
    // Bad requests.
    for bad in [
        NodeStageVolumeRequest {
            staging_target_path: "relative".into(),
            ..stage_req(M::SingleNodeWriter)
        },
        NodeStageVolumeRequest {
            volume_capability: None,
            ..stage_req(M::SingleNodeWriter)
        },
        NodeStageVolumeRequest {
            volume_capability: Some(cap(M::MultiNodeMultiWriter, "")),
            ..stage_req(M::SingleNodeWriter)
        },
        NodeStageVolumeRequest {
            volume_id: String::new(),
            ..stage_req(M::SingleNodeWriter)
        },
    ] {
        assert_eq!(
            lab.node.node_stage_volume(bad).await.unwrap_err().code(),
            Code::InvalidArgument
        );
    }
    // A disk that already holds another filesystem is not reformatted.
    lab.attach(CID);
    lab.table
        .format(&format!("/dev/disk/by-id/{CID}"), "xfs")
        .unwrap();
    assert_eq!(
        lab.stage(M::SingleNodeWriter).await.unwrap_err().code(),
        Code::FailedPrecondition
    );
    assert!(lab.table.entries().is_empty());
    let mut xfs = stage_req(M::SingleNodeWriter);
    xfs.volume_capability = Some(cap(M::SingleNodeWriter, "xfs"));
    lab.node.node_stage_volume(xfs).await.unwrap();
    // Publish before stage elsewhere, or onto a used target, is refused.
    lab.unstage().await.unwrap();
    assert_eq!(
        lab.publish(TARGET, false).await.unwrap_err().code(),
        Code::FailedPrecondition
    );
}

#[tokio::test]
async fn readonly_publish_is_a_readonly_bind() {
    let mut lab = NodeLab::start(&[]).await;
    lab.attach(CID);
    lab.stage(M::SingleNodeWriter).await.unwrap();
    lab.publish(TARGET, true).await.unwrap();
    assert!(lab.mount_at(TARGET).unwrap().read_only);
}

#[tokio::test]
async fn reader_only_mode_stages_and_publishes_read_only() {
    let mut lab = NodeLab::start(&[]).await;
    lab.attach(CID);
    lab.stage(M::SingleNodeReaderOnly).await.unwrap();
    assert!(lab.mount_at(STAGING).unwrap().read_only);
    let req = NodePublishVolumeRequest {
        volume_id: VOL.into(),
        staging_target_path: STAGING.into(),
        target_path: TARGET.into(),
        volume_capability: Some(cap(M::SingleNodeReaderOnly, "")),
        readonly: false,
        ..Default::default()
    };
    lab.node.node_publish_volume(req).await.unwrap();
    assert!(lab.mount_at(TARGET).unwrap().read_only);
}

#[tokio::test]
async fn mutant_writable_readonly_publish_is_visible() {
    let mut lab = NodeLab::start(&[Mutant::WritableReadonlyPublish]).await;
    lab.attach(CID);
    lab.stage(M::SingleNodeWriter).await.unwrap();
    lab.publish(TARGET, true).await.unwrap();
    assert!(
        !lab.mount_at(TARGET).unwrap().read_only,
        "the mutant should mount read-write"
    );
}

#[tokio::test]
async fn lost_mount_reply_leaves_no_staging_mount() {
    let mut lab = NodeLab::start(&[]).await;
    lab.attach(CID);
    *lab.faults.lose_reply_of.lock().unwrap() = Some("mount");
    let err = lab.stage(M::SingleNodeWriter).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err}");
    assert!(
        lab.mount_at(STAGING).is_none(),
        "the driver must undo the mount it may have made"
    );
    // The kubelet's retry then stages normally.
    lab.stage(M::SingleNodeWriter).await.unwrap();
    assert!(lab.mount_at(STAGING).is_some());
}

#[tokio::test]
async fn mutant_leak_mount_on_failed_stage_is_visible() {
    let mut lab = NodeLab::start(&[Mutant::LeakMountOnFailedStage]).await;
    lab.attach(CID);
    *lab.faults.lose_reply_of.lock().unwrap() = Some("mount");
    assert!(lab.stage(M::SingleNodeWriter).await.is_err());
    assert!(
        lab.mount_at(STAGING).is_some(),
        "the mutant leaves the mount behind"
    );
}

#[tokio::test]
async fn node_identity() {
    let mut lab = NodeLab::start(&[]).await;
    let info = lab
        .node
        .node_get_info(NodeGetInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.node_id, NODE);
    let caps = lab
        .node
        .node_get_capabilities(NodeGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(caps.capabilities.len(), 1);
    let mut id = IdentityClient::new(lab.channel.clone());
    let pc = id
        .get_plugin_capabilities(GetPluginCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(
        pc.capabilities.is_empty(),
        "a node-only plugin has no controller service"
    );
    let mut ctl = ControllerClient::new(lab.channel.clone());
    let e = ctl
        .create_volume(CreateVolumeRequest::default())
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unimplemented);
}
