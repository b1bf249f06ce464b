//! The node plugin on a Unix socket, called through a tonic client, against
//! the lab's real node mount table (fakes::csi::mounts) on loopback: stage
//! binds the volume's directory, publish binds the staging path, read-only
//! when asked; both idempotent; and the node mutant visibly breaks that.

mod common;

use common::{cap, Lab, M};
use drivelab_proto::csi::{
    NodeGetCapabilitiesRequest, NodeGetInfoRequest, NodePublishVolumeRequest,
    NodeStageVolumeRequest, NodeUnpublishVolumeRequest, NodeUnstageVolumeRequest,
};
use hostpath_csi::{DriverConfig, Mode, Mutant};
use tonic::Code;

const NODE: &str = "node-a";
const STAGING: &str =
    "/var/lib/kubelet/plugins/kubernetes.io/csi/hostpath.csi.drivelab.dev/h/globalmount";
const TARGET: &str = "/var/lib/kubelet/pods/p1/volumes/kubernetes.io~csi/pv-1/mount";

fn stage_req(vol: &str, staging: &str, mode: M) -> NodeStageVolumeRequest {
    NodeStageVolumeRequest {
        volume_id: vol.into(),
        staging_target_path: staging.into(),
        volume_capability: Some(cap(mode)),
        ..Default::default()
    }
}

fn publish_req(vol: &str, target: &str, mode: M, readonly: bool) -> NodePublishVolumeRequest {
    NodePublishVolumeRequest {
        volume_id: vol.into(),
        staging_target_path: STAGING.into(),
        target_path: target.into(),
        volume_capability: Some(cap(mode)),
        readonly,
        ..Default::default()
    }
}

async fn lab_with_volume(mutants: &[Mutant]) -> (Lab, String) {
    let mut lab = Lab::start(mutants, &[(NODE, 4)]).await;
    let vol = lab.create("pvc-1", 0).await.unwrap();
    lab.publish(&vol, NODE, M::SingleNodeWriter, false)
        .await
        .unwrap();
    (lab, vol)
}

#[tokio::test]
async fn stage_and_publish_bind_the_volume_directory_idempotently() {
    let (lab, vol) = lab_with_volume(&[]).await;
    let mut node = lab.node(NODE);
    let dir = lab.volume_dir(&vol).to_str().unwrap().to_string();
    node.node_stage_volume(stage_req(&vol, STAGING, M::SingleNodeWriter))
        .await
        .unwrap();
    node.node_stage_volume(stage_req(&vol, STAGING, M::SingleNodeWriter))
        .await
        .unwrap();
    node.node_publish_volume(publish_req(&vol, TARGET, M::SingleNodeWriter, false))
        .await
        .unwrap();
    node.node_publish_volume(publish_req(&vol, TARGET, M::SingleNodeWriter, false))
        .await
        .unwrap();
    let mounts = lab.mounts(NODE);
    assert_eq!(mounts.len(), 2);
    let staged = mounts.iter().find(|m| m.target == STAGING).unwrap();
    assert_eq!(
        (staged.source.as_str(), staged.host_dir.as_str()),
        (dir.as_str(), dir.as_str())
    );
    let published = mounts.iter().find(|m| m.target == TARGET).unwrap();
    assert_eq!(
        (
            published.source.as_str(),
            published.host_dir.as_str(),
            published.read_only
        ),
        (STAGING, dir.as_str(), false)
    );
    assert!(mounts
        .iter()
        .all(|m| m.bind && m.disk_cid.is_empty() && m.device_present));

    // Unstaging under a publish is refused (the staging bind is busy).
    let unstage = NodeUnstageVolumeRequest {
        volume_id: vol.clone(),
        staging_target_path: STAGING.into(),
    };
    let e = node.node_unstage_volume(unstage.clone()).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    let unpublish = NodeUnpublishVolumeRequest {
        volume_id: vol.clone(),
        target_path: TARGET.into(),
    };
    node.node_unpublish_volume(unpublish.clone()).await.unwrap();
    node.node_unpublish_volume(unpublish).await.unwrap();
    node.node_unstage_volume(unstage.clone()).await.unwrap();
    node.node_unstage_volume(unstage).await.unwrap();
    assert!(lab.mounts(NODE).is_empty());
}

#[tokio::test]
async fn readonly_publishes_are_read_only_mounts() {
    let (mut lab, vol) = lab_with_volume(&[]).await;
    let mut node = lab.node(NODE);
    node.node_stage_volume(stage_req(&vol, STAGING, M::SingleNodeWriter))
        .await
        .unwrap();
    node.node_publish_volume(publish_req(&vol, TARGET, M::SingleNodeWriter, true))
        .await
        .unwrap();
    let at = |lab: &Lab, t: &str| {
        lab.mounts(NODE)
            .into_iter()
            .find(|m| m.target == t)
            .unwrap()
    };
    assert!(at(&lab, TARGET).read_only);
    assert!(!at(&lab, STAGING).read_only);
    // The same target asked read-write is another mount: ALREADY_EXISTS.
    let e = node
        .node_publish_volume(publish_req(&vol, TARGET, M::SingleNodeWriter, false))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::AlreadyExists);

    // A *_READER_ONLY volume is staged read-only, and so published.
    let ro = lab.create("pvc-ro", 0).await.unwrap();
    let staging =
        "/var/lib/kubelet/plugins/kubernetes.io/csi/hostpath.csi.drivelab.dev/ro/globalmount";
    let target = "/var/lib/kubelet/pods/p2/volumes/kubernetes.io~csi/pv-ro/mount";
    node.node_stage_volume(stage_req(&ro, staging, M::SingleNodeReaderOnly))
        .await
        .unwrap();
    let mut req = publish_req(&ro, target, M::SingleNodeReaderOnly, false);
    req.staging_target_path = staging.into();
    node.node_publish_volume(req).await.unwrap();
    assert!(at(&lab, staging).read_only && at(&lab, target).read_only);
}

fn code<T>(r: Result<tonic::Response<T>, tonic::Status>) -> Code {
    r.map(drop).unwrap_err().code()
}

#[tokio::test]
async fn node_calls_check_what_they_are_given() {
    let (mut lab, vol) = lab_with_volume(&[]).await;
    let mut node = lab.node(NODE);
    // Not staged yet.
    assert_eq!(
        code(
            node.node_publish_volume(publish_req(&vol, TARGET, M::SingleNodeWriter, false))
                .await
        ),
        Code::FailedPrecondition
    );
    assert_eq!(
        code(
            node.node_stage_volume(stage_req(
                "hp-0123456789abcdef0123456789abcdef",
                STAGING,
                M::SingleNodeWriter
            ))
            .await
        ),
        Code::NotFound
    );
    assert_eq!(
        code(
            node.node_stage_volume(stage_req(&vol, "relative", M::SingleNodeWriter))
                .await
        ),
        Code::InvalidArgument
    );
    let mut no_cap = stage_req(&vol, STAGING, M::SingleNodeWriter);
    no_cap.volume_capability = None;
    assert_eq!(
        code(node.node_stage_volume(no_cap).await),
        Code::InvalidArgument
    );
    // The staging path holds another volume: ALREADY_EXISTS; publishing from it: FAILED_PRECONDITION.
    let other = lab.create("pvc-2", 0).await.unwrap();
    node.node_stage_volume(stage_req(&other, STAGING, M::SingleNodeWriter))
        .await
        .unwrap();
    assert_eq!(
        code(
            node.node_stage_volume(stage_req(&vol, STAGING, M::SingleNodeWriter))
                .await
        ),
        Code::AlreadyExists
    );
    assert_eq!(
        code(
            node.node_publish_volume(publish_req(&vol, TARGET, M::SingleNodeWriter, false))
                .await
        ),
        Code::FailedPrecondition
    );
    // Unpublishing what was never published is done already.
    node.node_unpublish_volume(NodeUnpublishVolumeRequest {
        volume_id: vol.clone(),
        target_path: TARGET.into(),
    })
    .await
    .unwrap();

    let info = node
        .node_get_info(NodeGetInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (info.node_id.as_str(), info.max_volumes_per_node),
        (NODE, 4)
    );
    let caps = node
        .node_get_capabilities(NodeGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(!caps.capabilities.is_empty());
}

#[tokio::test]
async fn deleting_a_volume_under_its_mounts_shows_in_the_table() {
    let (lab, vol) = lab_with_volume(&[]).await;
    let mut node = lab.node(NODE);
    node.node_stage_volume(stage_req(&vol, STAGING, M::SingleNodeWriter))
        .await
        .unwrap();
    assert!(lab.mounts(NODE).iter().all(|m| m.device_present));
    std::fs::remove_dir_all(lab.volume_dir(&vol)).unwrap();
    assert!(lab.mounts(NODE).iter().all(|m| !m.device_present));
}

#[tokio::test]
async fn mutant_publish_ignores_readonly_mounts_read_write() {
    let (lab, vol) = lab_with_volume(&[Mutant::PublishIgnoresReadonly]).await;
    let mut node = lab.node(NODE);
    node.node_stage_volume(stage_req(&vol, STAGING, M::SingleNodeWriter))
        .await
        .unwrap();
    node.node_publish_volume(publish_req(&vol, TARGET, M::SingleNodeWriter, true))
        .await
        .unwrap();
    let m = lab
        .mounts(NODE)
        .into_iter()
        .find(|m| m.target == TARGET)
        .unwrap();
    assert!(!m.read_only, "a readonly publish became a writable mount");
}

#[tokio::test]
async fn a_node_plugin_without_a_mount_table_refuses_to_start() {
    let state = tempfile::tempdir().unwrap();
    let config = DriverConfig {
        mode: Mode::Node,
        node_id: NODE.into(),
        state_dir: state.path().to_path_buf(),
        ..Default::default()
    };
    let sock = state.path().join("n.sock");
    let e = hostpath_csi::serve_unix(config, &sock, async {})
        .await
        .unwrap_err();
    assert!(format!("{e:#}").contains("--mounter-url"), "{e:#}");
    assert!(!sock.exists());
}
