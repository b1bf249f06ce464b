//! hostpath-csi (controller + node on one socket) driven by the lab's fake CSI
//! sidecars — provisioner, attacher, kubelet node agent — against the fake
//! kube API and the node's fake mount table: a PVC becomes a directory, a
//! read-only pod gets a read-only bind of it, and teardown leaves nothing.

mod common;

use std::sync::{Arc, RwLock};

use common::{Server, GIB};
use drivelab_fakes::clock::SimClock;
use drivelab_fakes::csi::attacher::{AttachTarget, Attacher};
use drivelab_fakes::csi::kubelet::{staging_path, target_path, NodeAgent, NodeTarget};
use drivelab_fakes::csi::mounts::{Filesystems, MountTable};
use drivelab_fakes::csi::provisioner::{ProvisionTarget, Provisioner};
use drivelab_fakes::csi::{KubeSlot, Reconcile};
use drivelab_fakes::gate::Gate;
use drivelab_fakes::history::History;
use drivelab_fakes::kube::{Kind, KubeFake};
use drivelab_fakes::serve::loopback;
use drivelab_fakes::store::MemStore;
use hostpath_csi::{DriverConfig, Mode, Mutant, DRIVER_NAME};
use serde_json::json;

const NODE: &str = "node-a";

struct Cluster {
    kube: KubeFake,
    prov: Provisioner,
    att: Attacher,
    agent: NodeAgent,
}

impl Cluster {
    async fn attach_all(&self) {
        for va in self.kube.list(Kind::VolumeAttachment, None).unwrap() {
            let name = va["metadata"]["name"].as_str().unwrap().to_string();
            self.att
                .reconcile(&AttachTarget::Attachment { name })
                .await
                .unwrap();
        }
    }

    async fn run_pod(&self, name: &str) -> Reconcile {
        let pod = NodeTarget::Pod {
            namespace: "app".into(),
            name: name.into(),
        };
        let mut last = Reconcile::Done;
        for _ in 0..6 {
            last = self.agent.reconcile(&pod).await.unwrap();
            if last == Reconcile::Done {
                break;
            }
            self.attach_all().await;
        }
        last
    }
}

/// Provision, run a read-only pod, tear it all down; returns the orphaned directories.
async fn lifecycle(mutants: &[Mutant]) -> Vec<String> {
    let state = tempfile::tempdir().unwrap();
    let gate = Gate::new(History::new(SimClock::new()));
    let table = MountTable::new(
        NODE,
        Arc::new(Vec::new),
        Filesystems::default(),
        gate.clone(),
    );
    let table_l = table.serve(loopback()).await.unwrap();
    let config = DriverConfig {
        mode: Mode::All,
        node_id: NODE.into(),
        state_dir: state.path().to_path_buf(),
        mounter_url: table_l.url(),
        mutants: mutants.to_vec(),
        ..Default::default()
    };
    let sock = state.path().join("csi.sock");
    let (server, _) = Server::start(config, sock.clone()).await;
    let kube = KubeFake::new(Arc::new(MemStore::default()), gate.clone(), 9).unwrap();
    let slot: KubeSlot = Arc::new(RwLock::new(kube.clone()));
    let c = Cluster {
        prov: Provisioner::connect(&sock, slot.clone(), gate.clone())
            .await
            .unwrap(),
        att: Attacher::connect(&sock, slot.clone(), gate.clone())
            .await
            .unwrap(),
        agent: NodeAgent::connect(NODE, &sock, slot, gate).await.unwrap(),
        kube,
    };
    assert_eq!(c.agent.driver_name(), DRIVER_NAME);
    assert_eq!(
        c.agent.reconcile(&NodeTarget::Register).await.unwrap(),
        Reconcile::Done
    );
    c.kube
        .create(Kind::StorageClass, json!({"metadata":{"name":"dirs"},"provisioner":DRIVER_NAME,"parameters":{"csi.storage.k8s.io/fstype":"ext4"}}))
        .unwrap();
    c.kube
        .create(Kind::PersistentVolumeClaim, json!({"metadata":{"name":"data","namespace":"app"},"spec":{
            "storageClassName":"dirs","accessModes":["ReadWriteOnce"],"resources":{"requests":{"storage":"1Gi"}}}}))
        .unwrap();
    let claim = ProvisionTarget::Claim {
        namespace: "app".into(),
        name: "data".into(),
    };
    assert_eq!(c.prov.reconcile(&claim).await.unwrap(), Reconcile::Done);
    let pvc = c
        .kube
        .get(Kind::PersistentVolumeClaim, Some("app"), "data")
        .unwrap()
        .unwrap();
    let pv_name = pvc["spec"]["volumeName"].as_str().unwrap().to_string();
    let pv = c
        .kube
        .get(Kind::PersistentVolume, None, &pv_name)
        .unwrap()
        .unwrap();
    let handle = pv["spec"]["csi"]["volumeHandle"]
        .as_str()
        .unwrap()
        .to_string();
    let backend = hostpath_csi::inspect(state.path()).unwrap();
    assert_eq!(
        (
            backend.volume_dirs.clone(),
            backend.volumes[0].capacity_bytes
        ),
        (vec![handle.clone()], GIB)
    );

    let pod = c
        .kube
        .create(
            Kind::Pod,
            json!({"metadata":{"name":"web","namespace":"app"},"spec":{
        "nodeName":NODE,"containers":[{"name":"c","image":"busybox"}],
        "volumes":[{"name":"data","persistentVolumeClaim":{"claimName":"data","readOnly":true}}]}}),
        )
        .unwrap();
    let uid = pod["metadata"]["uid"].as_str().unwrap().to_string();
    assert_eq!(c.run_pod("web").await, Reconcile::Done);
    let dir = std::fs::canonicalize(state.path())
        .unwrap()
        .join("volumes")
        .join(&handle);
    let mounts = table.mounts();
    let staged = mounts
        .iter()
        .find(|m| m.target == staging_path(DRIVER_NAME, &handle))
        .expect("staged");
    assert_eq!(staged.host_dir, dir.to_str().unwrap());
    let published = mounts
        .iter()
        .find(|m| m.target == target_path(&uid, &pv_name))
        .expect("published");
    assert!(
        published.read_only && published.host_dir == staged.host_dir,
        "{published:?}"
    );

    // Teardown: pod, attachment, claim.
    c.kube.delete(Kind::Pod, Some("app"), "web").unwrap();
    assert_eq!(c.run_pod("web").await, Reconcile::Done);
    assert!(table.mounts().is_empty(), "{:?}", table.mounts());
    c.attach_all().await;
    assert!(c
        .kube
        .list(Kind::VolumeAttachment, None)
        .unwrap()
        .is_empty());
    c.kube
        .delete(Kind::PersistentVolumeClaim, Some("app"), "data")
        .unwrap();
    assert_eq!(c.prov.reconcile(&claim).await.unwrap(), Reconcile::Done);
    // The attacher's finalizer on the PV goes once the PV is deleted and unused.
    let pv_target = AttachTarget::Volume {
        name: pv_name.clone(),
    };
    c.att.reconcile(&pv_target).await.unwrap();
    let left = c.kube.get(Kind::PersistentVolume, None, &pv_name).unwrap();
    assert!(left.is_none(), "{left:?}");
    server.stop().await;
    let b = hostpath_csi::inspect(state.path()).unwrap();
    assert!(b.volumes.is_empty());
    b.volume_dirs
}

#[tokio::test]
async fn pvc_to_read_only_pod_and_back_through_the_sidecars() {
    assert!(lifecycle(&[]).await.is_empty());
}

#[tokio::test]
async fn delete_leaves_data_is_an_orphan_after_the_claim_is_gone() {
    assert_eq!(lifecycle(&[Mutant::DeleteLeavesData]).await.len(), 1);
}
