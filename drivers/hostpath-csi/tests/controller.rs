//! The controller on a Unix socket, called through a tonic client, on a real
//! state directory (node plugins registered beside it). Checks the CSI
//! idempotency and error-code rules, snapshot/restore, crash recovery, and
//! that each controller mutant visibly breaks the rule it seeds.

mod common;

use std::collections::HashMap;

use common::{cap, create_req, Lab, GIB, M};
use drivelab_proto::csi::{
    volume_capability, volume_content_source, CapacityRange, ControllerUnpublishVolumeRequest,
    CreateSnapshotRequest, CreateVolumeRequest, DeleteSnapshotRequest, DeleteVolumeRequest,
    ListSnapshotsRequest, ListVolumesRequest, ValidateVolumeCapabilitiesRequest, VolumeCapability,
    VolumeContentSource,
};
use hostpath_csi::Mutant;
use tonic::Code;

const NODES: &[(&str, i64)] = &[("node-a", 0), ("node-b", 0)];

fn from_snapshot(name: &str, snapshot_id: &str, required: i64, limit: i64) -> CreateVolumeRequest {
    CreateVolumeRequest {
        capacity_range: Some(CapacityRange {
            required_bytes: required,
            limit_bytes: limit,
        }),
        volume_content_source: Some(VolumeContentSource {
            r#type: Some(volume_content_source::Type::Snapshot(
                volume_content_source::SnapshotSource {
                    snapshot_id: snapshot_id.into(),
                },
            )),
        }),
        ..create_req(name, 0)
    }
}

async fn snapshot(lab: &mut Lab, name: &str, vol: &str) -> Result<String, tonic::Status> {
    lab.ctl
        .create_snapshot(CreateSnapshotRequest {
            source_volume_id: vol.into(),
            name: name.into(),
            ..Default::default()
        })
        .await
        .map(|r| r.into_inner().snapshot.unwrap().snapshot_id)
}

async fn delete(lab: &mut Lab, id: &str) -> Result<(), tonic::Status> {
    lab.ctl
        .delete_volume(DeleteVolumeRequest {
            volume_id: id.into(),
            ..Default::default()
        })
        .await
        .map(drop)
}

#[tokio::test]
async fn create_is_idempotent_by_name_and_delete_by_id() {
    let mut lab = Lab::start(&[], NODES).await;
    let a = lab.create("pvc-1", 0).await.unwrap();
    assert_eq!(lab.create("pvc-1", 0).await.unwrap(), a);
    let r = lab
        .ctl
        .create_volume(create_req("pvc-1", 0))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        r.volume.unwrap().capacity_bytes,
        GIB,
        "default capacity is 1 GiB"
    );
    assert!(lab.volume_dir(&a).is_dir());
    assert_eq!(lab.backend().volume_dirs, vec![a.clone()]);
    let listed = lab
        .ctl
        .list_volumes(ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.entries.len(), 1);

    delete(&mut lab, &a).await.unwrap();
    assert!(!lab.volume_dir(&a).exists());
    delete(&mut lab, &a).await.unwrap();
    delete(&mut lab, "hp-0123456789abcdef0123456789abcdef")
        .await
        .unwrap();
    delete(&mut lab, "not-ours").await.unwrap();
    assert!(lab.backend().volumes.is_empty());
    assert_eq!(
        delete(&mut lab, "").await.unwrap_err().code(),
        Code::InvalidArgument
    );
}

#[tokio::test]
async fn incompatible_requests_are_already_exists_and_bad_ones_invalid() {
    let mut lab = Lab::start(&[], NODES).await;
    let a = lab.create("pvc-1", GIB).await.unwrap();
    assert_eq!(
        lab.create("pvc-1", 2 * GIB).await.unwrap_err().code(),
        Code::AlreadyExists
    );
    let mut smaller = create_req("pvc-1", 0);
    smaller.capacity_range = Some(CapacityRange {
        required_bytes: 0,
        limit_bytes: GIB / 2,
    });
    assert_eq!(
        lab.ctl.create_volume(smaller).await.unwrap_err().code(),
        Code::AlreadyExists
    );
    // A known name with a content source it was not made from.
    let s = snapshot(&mut lab, "snap-1", &a).await.unwrap();
    let e = lab
        .ctl
        .create_volume(from_snapshot("pvc-1", &s, GIB, 0))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::AlreadyExists);

    let invalid = |r: CreateVolumeRequest| async {
        let mut ctl = lab.ctl.clone();
        ctl.create_volume(r).await.unwrap_err().code()
    };
    assert_eq!(invalid(create_req("", 0)).await, Code::InvalidArgument);
    assert_eq!(
        invalid(CreateVolumeRequest {
            volume_capabilities: vec![],
            ..create_req("pvc-2", 0)
        })
        .await,
        Code::InvalidArgument
    );
    let block = VolumeCapability {
        access_type: Some(volume_capability::AccessType::Block(
            volume_capability::BlockVolume {},
        )),
        ..cap(M::SingleNodeWriter)
    };
    assert_eq!(
        invalid(CreateVolumeRequest {
            volume_capabilities: vec![block],
            ..create_req("pvc-2", 0)
        })
        .await,
        Code::InvalidArgument
    );
    let params = |k: &str| HashMap::from([(k.to_string(), "v".to_string())]);
    assert_eq!(
        invalid(CreateVolumeRequest {
            parameters: params("type"),
            ..create_req("pvc-2", 0)
        })
        .await,
        Code::InvalidArgument
    );
    assert_eq!(
        invalid(create_req("pvc-2", 2048 * GIB)).await,
        Code::OutOfRange
    );
    assert_eq!(
        invalid(from_snapshot(
            "pvc-2",
            "hps-0123456789abcdef0123456789abcdef",
            0,
            0
        ))
        .await,
        Code::NotFound
    );
    // The CO's own parameters are not ours to refuse.
    let co = CreateVolumeRequest {
        parameters: params("csi.storage.k8s.io/pvc/name"),
        ..create_req("pvc-2", 0)
    };
    lab.ctl.create_volume(co).await.unwrap();
    assert!(lab.orphan_dirs().is_empty());
}

#[tokio::test]
async fn snapshot_then_restore_copies_the_data() {
    let mut lab = Lab::start(&[], NODES).await;
    let a = lab.create("pvc-1", 2 * GIB).await.unwrap();
    std::fs::create_dir(lab.volume_dir(&a).join("sub")).unwrap();
    std::fs::write(lab.volume_dir(&a).join("sub/data"), b"before").unwrap();
    let s = snapshot(&mut lab, "snap-1", &a).await.unwrap();
    assert_eq!(
        snapshot(&mut lab, "snap-1", &a).await.unwrap(),
        s,
        "idempotent by name"
    );
    std::fs::write(lab.volume_dir(&a).join("sub/data"), b"after").unwrap();

    let b = lab.create("pvc-2", 0).await.unwrap();
    assert_eq!(
        snapshot(&mut lab, "snap-1", &b).await.unwrap_err().code(),
        Code::AlreadyExists
    );
    assert_eq!(
        snapshot(&mut lab, "snap-2", "hp-0123456789abcdef0123456789abcdef")
            .await
            .unwrap_err()
            .code(),
        Code::NotFound
    );

    // Smaller than the snapshot: raised to its size; a limit below it cannot be met.
    let r = lab
        .ctl
        .create_volume(from_snapshot("pvc-3", &s, GIB, 0))
        .await
        .unwrap()
        .into_inner();
    let restored = r.volume.unwrap();
    assert_eq!(restored.capacity_bytes, 2 * GIB);
    assert!(
        restored.content_source.is_some(),
        "a restored volume names its source"
    );
    assert_eq!(
        std::fs::read(lab.volume_dir(&restored.volume_id).join("sub/data")).unwrap(),
        b"before"
    );
    let e = lab
        .ctl
        .create_volume(from_snapshot("pvc-4", &s, 0, GIB))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::OutOfRange);

    let listed = lab
        .ctl
        .list_snapshots(ListSnapshotsRequest {
            source_volume_id: a.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.entries.len(), 1);
    assert!(listed.entries[0].snapshot.as_ref().unwrap().ready_to_use);
    // The snapshot is a copy: it outlives its volume, and goes on its own.
    delete(&mut lab, &a).await.unwrap();
    lab.ctl
        .delete_snapshot(DeleteSnapshotRequest {
            snapshot_id: s.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    lab.ctl
        .delete_snapshot(DeleteSnapshotRequest {
            snapshot_id: s,
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(lab.backend().snapshot_dirs.is_empty());
    assert!(lab.orphan_dirs().is_empty());
}

#[tokio::test]
async fn publish_follows_the_access_mode_and_the_nodes() {
    let mut lab = Lab::start(&[], &[("node-a", 0), ("node-b", 1)]).await;
    let a = lab.create("pvc-1", 0).await.unwrap();
    lab.publish(&a, "node-a", M::SingleNodeWriter, false)
        .await
        .unwrap();
    lab.publish(&a, "node-a", M::SingleNodeWriter, false)
        .await
        .unwrap();
    let code = |r: Result<(), tonic::Status>| r.unwrap_err().code();
    assert_eq!(
        code(lab.publish(&a, "node-a", M::SingleNodeWriter, true).await),
        Code::AlreadyExists
    );
    assert_eq!(
        code(lab.publish(&a, "node-b", M::SingleNodeWriter, false).await),
        Code::FailedPrecondition
    );
    assert_eq!(
        code(
            lab.publish(
                "hp-0123456789abcdef0123456789abcdef",
                "node-a",
                M::SingleNodeWriter,
                false
            )
            .await
        ),
        Code::NotFound
    );
    assert_eq!(
        code(lab.publish(&a, "node-z", M::SingleNodeWriter, false).await),
        Code::NotFound
    );
    assert_eq!(
        code(delete(&mut lab, &a).await),
        Code::FailedPrecondition,
        "attached volumes are not deleted"
    );
    let v = &lab.backend().volumes[0];
    assert_eq!(v.attachments.keys().collect::<Vec<_>>(), vec!["node-a"]);

    let unpublish = |node: &str| ControllerUnpublishVolumeRequest {
        volume_id: a.clone(),
        node_id: node.into(),
        ..Default::default()
    };
    lab.ctl
        .controller_unpublish_volume(unpublish("node-b"))
        .await
        .unwrap();
    lab.ctl
        .controller_unpublish_volume(unpublish("node-a"))
        .await
        .unwrap();
    lab.ctl
        .controller_unpublish_volume(unpublish("node-a"))
        .await
        .unwrap();
    lab.publish(&a, "node-b", M::SingleNodeWriter, false)
        .await
        .unwrap();
    // node-b takes one volume.
    let b = lab.create("pvc-2", 0).await.unwrap();
    assert_eq!(
        code(lab.publish(&b, "node-b", M::SingleNodeWriter, false).await),
        Code::ResourceExhausted
    );
    // Multi-node readers share a volume; a single-node publish does not join them.
    lab.publish(&b, "node-a", M::MultiNodeReaderOnly, true)
        .await
        .unwrap();
    lab.ctl
        .controller_unpublish_volume(ControllerUnpublishVolumeRequest {
            volume_id: a.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    lab.publish(&a, "node-a", M::MultiNodeReaderOnly, true)
        .await
        .unwrap();
    lab.publish(&a, "node-b", M::MultiNodeReaderOnly, true)
        .await
        .unwrap();
    let c = lab.create("pvc-3", 0).await.unwrap();
    lab.publish(&c, "node-a", M::MultiNodeSingleWriter, false)
        .await
        .unwrap();
    assert_eq!(
        code(
            lab.publish(&c, "node-b", M::MultiNodeSingleWriter, false)
                .await
        ),
        Code::FailedPrecondition
    );
    let listed = lab
        .ctl
        .list_volumes(ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner();
    let nodes_of = |id: &str| {
        listed
            .entries
            .iter()
            .find(|e| e.volume.as_ref().unwrap().volume_id == id)
            .unwrap()
            .status
            .clone()
            .unwrap()
            .published_node_ids
    };
    assert_eq!(nodes_of(&a), vec!["node-a", "node-b"]);
}

#[tokio::test]
async fn validate_confirms_what_a_directory_serves() {
    let mut lab = Lab::start(&[], NODES).await;
    let a = lab.create("pvc-1", 0).await.unwrap();
    let validate = |caps: Vec<VolumeCapability>, id: &str| ValidateVolumeCapabilitiesRequest {
        volume_id: id.into(),
        volume_capabilities: caps,
        ..Default::default()
    };
    let ok = lab
        .ctl
        .validate_volume_capabilities(validate(vec![cap(M::MultiNodeMultiWriter)], &a))
        .await
        .unwrap()
        .into_inner();
    assert!(ok.confirmed.is_some());
    let block = VolumeCapability {
        access_type: Some(volume_capability::AccessType::Block(
            volume_capability::BlockVolume {},
        )),
        ..cap(M::SingleNodeWriter)
    };
    let no = lab
        .ctl
        .validate_volume_capabilities(validate(vec![block], &a))
        .await
        .unwrap()
        .into_inner();
    assert!(no.confirmed.is_none() && no.message.contains("block"));
    let e = lab
        .ctl
        .validate_volume_capabilities(validate(
            vec![cap(M::SingleNodeWriter)],
            "hp-0123456789abcdef0123456789abcdef",
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    let e = lab
        .ctl
        .validate_volume_capabilities(validate(vec![], &a))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
}

#[tokio::test]
async fn concurrent_creates_of_one_name_make_one_volume() {
    let lab = Lab::start(&[], NODES).await;
    let calls = (0..8).map(|_| {
        let mut ctl = lab.ctl.clone();
        tokio::spawn(async move {
            ctl.create_volume(create_req("pvc-race", 0))
                .await
                .map(|r| r.into_inner().volume.unwrap().volume_id)
        })
    });
    let mut ids = Vec::new();
    for c in calls {
        ids.push(c.await.unwrap().unwrap());
    }
    ids.dedup();
    assert_eq!(ids.len(), 1);
    assert_eq!(lab.backend().volume_dirs.len(), 1);
}

#[tokio::test]
async fn a_restarted_controller_answers_retries_from_its_state() {
    let mut lab = Lab::start(&[], NODES).await;
    let a = lab.create("pvc-1", 0).await.unwrap();
    lab.publish(&a, "node-a", M::SingleNodeWriter, false)
        .await
        .unwrap();
    lab.restart_controller().await;
    assert_eq!(lab.create("pvc-1", 0).await.unwrap(), a);
    assert_eq!(
        lab.publish(&a, "node-b", M::SingleNodeWriter, false)
            .await
            .unwrap_err()
            .code(),
        Code::FailedPrecondition
    );
    assert_eq!(lab.backend().volume_dirs, vec![a]);
}

#[tokio::test]
async fn a_create_cut_between_intent_and_directory_is_finished_by_the_retry() {
    let mut lab = Lab::start(&[], NODES).await;
    let a = lab.create("pvc-1", 0).await.unwrap();
    let s = snapshot(&mut lab, "snap-1", &a).await.unwrap();
    std::fs::write(lab.volume_dir(&a).join("f"), b"x").unwrap();
    // What a crash mid-restore leaves: the intent saved, a half-made copy.
    let id = hostpath_csi::config::volume_id_for("pvc-2");
    let backend = hostpath_csi::state::Backend::open(lab.state.path()).unwrap();
    backend
        .transaction(|txn| {
            txn.state.volumes.insert(
                "pvc-2".into(),
                hostpath_csi::state::VolumeRecord {
                    id: id.clone(),
                    name: "pvc-2".into(),
                    capacity_bytes: GIB,
                    source: Some(hostpath_csi::state::ContentSource::Snapshot { id: s.clone() }),
                    ready: false,
                    attachments: Default::default(),
                },
            );
            txn.save()
        })
        .unwrap();
    let half = lab
        .volume_dir(&a)
        .parent()
        .unwrap()
        .join(format!(".tmp-{id}"));
    std::fs::create_dir(&half).unwrap();
    std::fs::write(half.join("partial"), b"?").unwrap();
    lab.restart_controller().await;
    assert!(!half.exists(), "the restart removes the half-made copy");
    // Not listed until complete; the retry completes it from its source.
    let listed = lab
        .ctl
        .list_volumes(ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.entries.len(), 1);
    let r = lab
        .ctl
        .create_volume(from_snapshot("pvc-2", &s, 0, 0))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.volume.unwrap().volume_id, id);
    assert!(!lab.volume_dir(&id).join("partial").exists());
    assert!(
        !lab.volume_dir(&id).join("f").exists(),
        "restored from the snapshot, not the volume now"
    );
    assert!(lab.orphan_dirs().is_empty());
}

#[tokio::test]
async fn mutant_create_not_idempotent_orphans_a_directory() {
    let mut lab = Lab::start(&[Mutant::RetryMakesSecondDir], NODES).await;
    let a = lab.create("pvc-1", 0).await.unwrap();
    let b = lab.create("pvc-1", 0).await.unwrap();
    assert_ne!(a, b, "the retry answered another volume");
    assert_eq!(lab.orphan_dirs(), vec![a]);
}

#[tokio::test]
async fn mutant_attach_steals_moves_a_single_node_volume() {
    let mut lab = Lab::start(&[Mutant::AttachSteals], NODES).await;
    let a = lab.create("pvc-1", 0).await.unwrap();
    lab.publish(&a, "node-a", M::SingleNodeWriter, false)
        .await
        .unwrap();
    lab.publish(&a, "node-b", M::SingleNodeWriter, false)
        .await
        .unwrap();
    let v = &lab.backend().volumes[0];
    assert_eq!(
        v.attachments.keys().collect::<Vec<_>>(),
        vec!["node-b"],
        "taken from node-a while it may still use it"
    );
}

#[tokio::test]
async fn mutant_delete_leaves_data_orphans_the_directory() {
    let mut lab = Lab::start(&[Mutant::DeleteLeavesData], NODES).await;
    let a = lab.create("pvc-1", 0).await.unwrap();
    std::fs::write(lab.volume_dir(&a).join("secret"), b"data").unwrap();
    delete(&mut lab, &a).await.unwrap();
    assert!(lab.backend().volumes.is_empty());
    assert_eq!(lab.orphan_dirs(), vec![a.clone()]);
    assert!(lab.volume_dir(&a).join("secret").exists());
}
