//! The fake CSI sidecars (provisioner, attacher, kubelet-like node agent,
//! external-snapshotter)
//! against a small in-test CSI driver served with tonic on a Unix socket,
//! whose node side mounts into the fake node mount table. Each test shows one
//! sidecar behaviour, and the checks fail on the wrong behaviour.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use drivelab_fakes::clock::SimClock;
use drivelab_fakes::csi::attacher::{AttachTarget, Attacher};
use drivelab_fakes::csi::kubelet::{staging_path, target_path, NodeAgent, NodeTarget};
use drivelab_fakes::csi::mounts::{Device, Filesystems, MountRequest, MountTable};
use drivelab_fakes::csi::provisioner::{ProvisionTarget, Provisioner, PV_FINALIZER};
use drivelab_fakes::csi::snapshotter::{SnapshotTarget, Snapshotter, DEFAULT_CLASS};
use drivelab_fakes::csi::{DriverReply, DriverRequest, KubeSlot, Reconcile};
use drivelab_fakes::gate::{CallSpec, Delivery, Gate, GateHook, Verdict};
use drivelab_fakes::history::{CallId, History, Outcome};
use drivelab_fakes::kube::{Kind, KubeFake, SNAPSHOT_API_VERSION};
use drivelab_fakes::store::MemStore;
use drivelab_proto::csi;
use drivelab_proto::csi::controller_server::{Controller, ControllerServer};
use drivelab_proto::csi::identity_server::{Identity, IdentityServer};
use drivelab_proto::csi::node_server::{Node, NodeServer};
use futures_util::future::BoxFuture;
use serde_json::{json, Value};
use tonic::{Request, Response, Status};

const DRIVER: &str = "test.csi.drivelab";
const NODE: &str = "node-a";
const NODE_ID: &str = "instance-0001";

// ---------------------------------------------------------------- test driver

#[derive(Default)]
struct DriverState {
    /// name → (volume id, bytes, parameters)
    volumes: BTreeMap<String, (String, i64, BTreeMap<String, String>)>,
    next_id: u64,
    /// volume id → node id
    published: BTreeMap<String, String>,
    fail_stage: Option<tonic::Code>,
    /// A buggy node plugin: binds read-write whatever `readonly` says.
    ignore_readonly: bool,
    /// CSI snapshot name → (snapshot id, source volume id).
    snapshots: BTreeMap<String, (String, String)>,
    /// Fail this many CreateSnapshot calls (INTERNAL) before serving them.
    fail_snapshots: u32,
}

#[derive(Clone)]
struct TestDriver {
    name: String,
    st: Arc<Mutex<DriverState>>,
    /// What the "agent" made visible on the node (fed to the mount table).
    devices: Arc<Mutex<Vec<Device>>>,
    mounts: MountTable,
}

/// The n-th volume id the in-test controller hands out: `disk-N`, or, when it
/// stands in for bosh-csi's controller, a disk name in bosh-csi's own form
/// (its node plugin answers NOT_FOUND for ids it could never have issued).
fn volume_id_of(driver_name: &str, n: u64) -> String {
    if driver_name == bosh_csi::DRIVER_NAME {
        format!("csi-{n:032x}")
    } else {
        format!("disk-{n}")
    }
}

fn st(d: &TestDriver) -> std::sync::MutexGuard<'_, DriverState> {
    d.st.lock().unwrap()
}

fn unimpl<T>() -> Result<Response<T>, Status> {
    Err(Status::unimplemented("not in the test driver"))
}

fn mount_err(e: drivelab_fakes::csi::mounts::MountError) -> Status {
    Status::internal(format!("{}: {e}", e.code()))
}

#[tonic::async_trait]
impl Identity for TestDriver {
    async fn get_plugin_info(
        &self,
        _: Request<csi::GetPluginInfoRequest>,
    ) -> Result<Response<csi::GetPluginInfoResponse>, Status> {
        Ok(Response::new(csi::GetPluginInfoResponse {
            name: self.name.clone(),
            vendor_version: "0.0.1".into(),
            manifest: Default::default(),
        }))
    }
    async fn get_plugin_capabilities(
        &self,
        _: Request<csi::GetPluginCapabilitiesRequest>,
    ) -> Result<Response<csi::GetPluginCapabilitiesResponse>, Status> {
        Ok(Response::new(Default::default()))
    }
    async fn probe(
        &self,
        _: Request<csi::ProbeRequest>,
    ) -> Result<Response<csi::ProbeResponse>, Status> {
        Ok(Response::new(Default::default()))
    }
}

#[tonic::async_trait]
impl Controller for TestDriver {
    async fn create_volume(
        &self,
        r: Request<csi::CreateVolumeRequest>,
    ) -> Result<Response<csi::CreateVolumeResponse>, Status> {
        let r = r.into_inner();
        let bytes = r.capacity_range.map_or(0, |c| c.required_bytes);
        let params: BTreeMap<_, _> = r.parameters.into_iter().collect();
        let mut s = st(self);
        let id = match s.volumes.get(&r.name) {
            Some((id, b, p)) if *b == bytes && *p == params => id.clone(),
            Some(_) => return Err(Status::already_exists("incompatible volume")),
            None => {
                s.next_id += 1;
                let id = volume_id_of(&self.name, s.next_id);
                s.volumes.insert(r.name, (id.clone(), bytes, params));
                id
            }
        };
        Ok(Response::new(csi::CreateVolumeResponse {
            volume: Some(csi::Volume {
                capacity_bytes: bytes,
                volume_id: id,
                volume_context: [("zone".to_string(), "z1".to_string())].into(),
                ..Default::default()
            }),
        }))
    }
    async fn delete_volume(
        &self,
        r: Request<csi::DeleteVolumeRequest>,
    ) -> Result<Response<csi::DeleteVolumeResponse>, Status> {
        let id = r.into_inner().volume_id;
        let mut s = st(self);
        if s.published.contains_key(&id) {
            return Err(Status::failed_precondition("volume is published"));
        }
        s.volumes.retain(|_, (v, _, _)| *v != id);
        Ok(Response::new(Default::default()))
    }
    async fn controller_publish_volume(
        &self,
        r: Request<csi::ControllerPublishVolumeRequest>,
    ) -> Result<Response<csi::ControllerPublishVolumeResponse>, Status> {
        let r = r.into_inner();
        let mut s = st(self);
        if !s.volumes.values().any(|(id, _, _)| *id == r.volume_id) {
            return Err(Status::not_found("no such volume"));
        }
        match s.published.get(&r.volume_id) {
            Some(n) if *n != r.node_id => {
                return Err(Status::failed_precondition("published elsewhere"))
            }
            _ => {}
        }
        s.published.insert(r.volume_id.clone(), r.node_id.clone());
        let mut devs = self.devices.lock().unwrap();
        if !devs.iter().any(|d| d.disk_cid == r.volume_id) {
            devs.push(Device::for_disk(&r.volume_id));
        }
        Ok(Response::new(csi::ControllerPublishVolumeResponse {
            publish_context: [("disk_cid".to_string(), r.volume_id)].into(),
        }))
    }
    async fn controller_unpublish_volume(
        &self,
        r: Request<csi::ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<csi::ControllerUnpublishVolumeResponse>, Status> {
        let r = r.into_inner();
        st(self).published.remove(&r.volume_id);
        self.devices
            .lock()
            .unwrap()
            .retain(|d| d.disk_cid != r.volume_id);
        Ok(Response::new(Default::default()))
    }
    async fn validate_volume_capabilities(
        &self,
        _: Request<csi::ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<csi::ValidateVolumeCapabilitiesResponse>, Status> {
        unimpl()
    }
    async fn list_volumes(
        &self,
        _: Request<csi::ListVolumesRequest>,
    ) -> Result<Response<csi::ListVolumesResponse>, Status> {
        unimpl()
    }
    async fn get_capacity(
        &self,
        _: Request<csi::GetCapacityRequest>,
    ) -> Result<Response<csi::GetCapacityResponse>, Status> {
        unimpl()
    }
    async fn controller_get_capabilities(
        &self,
        _: Request<csi::ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<csi::ControllerGetCapabilitiesResponse>, Status> {
        use csi::controller_service_capability::{rpc::Type, Rpc, Type as Cap};
        let cap = |t: Type| csi::ControllerServiceCapability {
            r#type: Some(Cap::Rpc(Rpc { r#type: t as i32 })),
        };
        Ok(Response::new(csi::ControllerGetCapabilitiesResponse {
            capabilities: vec![
                cap(Type::CreateDeleteVolume),
                cap(Type::PublishUnpublishVolume),
            ],
        }))
    }
    async fn create_snapshot(
        &self,
        r: Request<csi::CreateSnapshotRequest>,
    ) -> Result<Response<csi::CreateSnapshotResponse>, Status> {
        let r = r.into_inner();
        let mut s = st(self);
        if s.fail_snapshots > 0 {
            s.fail_snapshots -= 1;
            return Err(Status::internal("snapshot quota exceeded"));
        }
        // Idempotent by name, as the spec asks.
        let n = s.snapshots.len() + 1;
        let (id, _) = s
            .snapshots
            .entry(r.name)
            .or_insert_with(|| (format!("snap-{n}"), r.source_volume_id.clone()))
            .clone();
        Ok(Response::new(csi::CreateSnapshotResponse {
            snapshot: Some(csi::Snapshot {
                size_bytes: 1 << 30,
                snapshot_id: id,
                source_volume_id: r.source_volume_id,
                ready_to_use: true,
                ..Default::default()
            }),
        }))
    }
    async fn delete_snapshot(
        &self,
        r: Request<csi::DeleteSnapshotRequest>,
    ) -> Result<Response<csi::DeleteSnapshotResponse>, Status> {
        let id = r.into_inner().snapshot_id;
        st(self).snapshots.retain(|_, (s, _)| *s != id);
        Ok(Response::new(Default::default()))
    }
    async fn list_snapshots(
        &self,
        _: Request<csi::ListSnapshotsRequest>,
    ) -> Result<Response<csi::ListSnapshotsResponse>, Status> {
        unimpl()
    }
    async fn controller_expand_volume(
        &self,
        _: Request<csi::ControllerExpandVolumeRequest>,
    ) -> Result<Response<csi::ControllerExpandVolumeResponse>, Status> {
        unimpl()
    }
    async fn controller_get_volume(
        &self,
        _: Request<csi::ControllerGetVolumeRequest>,
    ) -> Result<Response<csi::ControllerGetVolumeResponse>, Status> {
        unimpl()
    }
}

fn reader_only(cap: &Option<csi::VolumeCapability>) -> bool {
    use csi::volume_capability::access_mode::Mode;
    cap.as_ref()
        .and_then(|c| c.access_mode.as_ref())
        .is_some_and(|m| m.mode == Mode::MultiNodeReaderOnly as i32)
}

#[tonic::async_trait]
impl Node for TestDriver {
    async fn node_stage_volume(
        &self,
        r: Request<csi::NodeStageVolumeRequest>,
    ) -> Result<Response<csi::NodeStageVolumeResponse>, Status> {
        let r = r.into_inner();
        if let Some(code) = st(self).fail_stage {
            return Err(Status::new(code, "stage failed (test fault)"));
        }
        let cid = r
            .publish_context
            .get("disk_cid")
            .ok_or_else(|| Status::invalid_argument("no disk_cid in publish_context"))?;
        let dev = self
            .mounts
            .devices()
            .into_iter()
            .find(|d| &d.disk_cid == cid)
            .ok_or_else(|| Status::not_found("device not visible on the node"))?;
        self.mounts.format(&dev.path, "ext4").map_err(mount_err)?;
        self.mounts
            .mount(&MountRequest {
                source: dev.path,
                target: r.staging_target_path,
                fstype: Some("ext4".into()),
                read_only: reader_only(&r.volume_capability),
                bind: false,
            })
            .map_err(mount_err)?;
        Ok(Response::new(Default::default()))
    }
    async fn node_unstage_volume(
        &self,
        r: Request<csi::NodeUnstageVolumeRequest>,
    ) -> Result<Response<csi::NodeUnstageVolumeResponse>, Status> {
        match self.mounts.unmount(&r.into_inner().staging_target_path) {
            Ok(()) => Ok(Response::new(Default::default())),
            Err(e) if e.code() == "NotMounted" => Ok(Response::new(Default::default())),
            Err(e) => Err(mount_err(e)),
        }
    }
    async fn node_publish_volume(
        &self,
        r: Request<csi::NodePublishVolumeRequest>,
    ) -> Result<Response<csi::NodePublishVolumeResponse>, Status> {
        let r = r.into_inner();
        let ro = r.readonly && !st(self).ignore_readonly;
        self.mounts
            .mount(&MountRequest {
                source: r.staging_target_path,
                target: r.target_path,
                fstype: None,
                read_only: ro,
                bind: true,
            })
            .map_err(mount_err)?;
        Ok(Response::new(Default::default()))
    }
    async fn node_unpublish_volume(
        &self,
        r: Request<csi::NodeUnpublishVolumeRequest>,
    ) -> Result<Response<csi::NodeUnpublishVolumeResponse>, Status> {
        match self.mounts.unmount(&r.into_inner().target_path) {
            Ok(()) => Ok(Response::new(Default::default())),
            Err(e) if e.code() == "NotMounted" => Ok(Response::new(Default::default())),
            Err(e) => Err(mount_err(e)),
        }
    }
    async fn node_get_volume_stats(
        &self,
        _: Request<csi::NodeGetVolumeStatsRequest>,
    ) -> Result<Response<csi::NodeGetVolumeStatsResponse>, Status> {
        unimpl()
    }
    async fn node_expand_volume(
        &self,
        _: Request<csi::NodeExpandVolumeRequest>,
    ) -> Result<Response<csi::NodeExpandVolumeResponse>, Status> {
        unimpl()
    }
    async fn node_get_capabilities(
        &self,
        _: Request<csi::NodeGetCapabilitiesRequest>,
    ) -> Result<Response<csi::NodeGetCapabilitiesResponse>, Status> {
        use csi::node_service_capability::{rpc::Type, Rpc, Type as Cap};
        Ok(Response::new(csi::NodeGetCapabilitiesResponse {
            capabilities: vec![csi::NodeServiceCapability {
                r#type: Some(Cap::Rpc(Rpc {
                    r#type: Type::StageUnstageVolume as i32,
                })),
            }],
        }))
    }
    async fn node_get_info(
        &self,
        _: Request<csi::NodeGetInfoRequest>,
    ) -> Result<Response<csi::NodeGetInfoResponse>, Status> {
        Ok(Response::new(csi::NodeGetInfoResponse {
            node_id: NODE_ID.into(),
            max_volumes_per_node: 8,
            accessible_topology: None,
        }))
    }
}

// ---------------------------------------------------------------- lab

/// Cuts the reply of the first call whose op is in `ops` (a lost reply).
#[derive(Default)]
struct LoseReply {
    ops: Mutex<Vec<&'static str>>,
}

impl GateHook for LoseReply {
    fn before<'a>(&'a self, _: CallId, _: &'a CallSpec) -> BoxFuture<'a, Verdict> {
        Box::pin(async { Verdict::Proceed })
    }
    fn after<'a>(
        &'a self,
        _: CallId,
        call: &'a CallSpec,
        _: &'a Outcome,
    ) -> BoxFuture<'a, Delivery> {
        Box::pin(async move {
            let mut ops = self.ops.lock().unwrap();
            match ops.iter().position(|o| *o == call.op) {
                Some(i) => {
                    ops.remove(i);
                    Delivery::Cut
                }
                None => Delivery::Deliver,
            }
        })
    }
}

struct Lab {
    _dir: tempfile::TempDir,
    kube: KubeFake,
    driver: TestDriver,
    mounts: MountTable,
    prov: Provisioner,
    att: Attacher,
    node: NodeAgent,
    hook: Arc<LoseReply>,
    history: History,
    /// The driver's socket, the gate and the API slot, for sidecars a test adds.
    sock: PathBuf,
    gate: Gate,
    slot: KubeSlot,
}

async fn lab() -> Lab {
    lab_named(DRIVER).await
}

/// A lab whose in-test driver reports `driver` as its name.
async fn lab_named(driver_name: &str) -> Lab {
    let history = History::new(SimClock::new());
    let gate = Gate::new(history.clone());
    let hook = Arc::new(LoseReply::default());
    gate.set_hook(hook.clone());
    let kube = KubeFake::new(Arc::new(MemStore::default()), gate.clone(), 9).unwrap();
    let devices: Arc<Mutex<Vec<Device>>> = Arc::default();
    let d2 = devices.clone();
    let mounts = MountTable::new(
        NODE,
        Arc::new(move || d2.lock().unwrap().clone()),
        Filesystems::default(),
        gate.clone(),
    );
    let driver = TestDriver {
        name: driver_name.to_string(),
        st: Arc::default(),
        devices,
        mounts: mounts.clone(),
    };
    let dir = tempfile::tempdir().unwrap();
    let sock: PathBuf = dir.path().join("csi.sock");
    let listener = tokio::net::UnixListener::bind(&sock).unwrap();
    let d = driver.clone();
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(IdentityServer::new(d.clone()))
            .add_service(ControllerServer::new(d.clone()))
            .add_service(NodeServer::new(d))
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener))
            .await
            .unwrap();
    });
    let slot: KubeSlot = Arc::new(RwLock::new(kube.clone()));
    let prov = Provisioner::connect(&sock, slot.clone(), gate.clone())
        .await
        .unwrap();
    let att = Attacher::connect(&sock, slot.clone(), gate.clone())
        .await
        .unwrap();
    let node = NodeAgent::connect(NODE, &sock, slot.clone(), gate.clone())
        .await
        .unwrap();
    kube.create(
        Kind::StorageClass,
        json!({"metadata":{"name":"fast"},"provisioner":driver_name,"parameters":{"tier":"gold","csi.storage.k8s.io/fstype":"ext4"}}),
    )
    .unwrap();
    kube.create(
        Kind::StorageClass,
        json!({"metadata":{"name":"keep"},"provisioner":driver_name,"reclaimPolicy":"Retain"}),
    )
    .unwrap();
    Lab {
        _dir: dir,
        kube,
        driver,
        mounts,
        prov,
        att,
        node,
        hook,
        history,
        sock,
        gate,
        slot,
    }
}

fn pvc(name: &str, class: &str, modes: &[&str]) -> Value {
    json!({"metadata":{"name":name,"namespace":"app"},"spec":{
        "storageClassName":class,"accessModes":modes,
        "resources":{"requests":{"storage":"1Gi"}}}})
}

fn pod(name: &str, claim: &str, read_only: bool) -> Value {
    json!({"metadata":{"name":name,"namespace":"app"},"spec":{
        "nodeName":NODE,
        "containers":[{"name":"c","image":"busybox"}],
        "volumes":[{"name":"data","persistentVolumeClaim":{"claimName":claim,"readOnly":read_only}}]}})
}

fn claim(name: &str) -> ProvisionTarget {
    ProvisionTarget::Claim {
        namespace: "app".into(),
        name: name.into(),
    }
}

fn pod_t(name: &str) -> NodeTarget {
    NodeTarget::Pod {
        namespace: "app".into(),
        name: name.into(),
    }
}

fn get(l: &Lab, kind: Kind, ns: Option<&str>, name: &str) -> Option<Value> {
    l.kube.get(kind, ns, name).unwrap()
}

fn rpcs(ex: &[drivelab_fakes::csi::Exchange]) -> Vec<&'static str> {
    ex.iter().map(|e| e.request.rpc()).collect()
}

async fn provisioned(l: &Lab, name: &str, class: &str, modes: &[&str]) -> Value {
    l.kube
        .create(Kind::PersistentVolumeClaim, pvc(name, class, modes))
        .unwrap();
    assert_eq!(
        l.prov.reconcile(&claim(name)).await.unwrap(),
        Reconcile::Done
    );
    get(l, Kind::PersistentVolumeClaim, Some("app"), name).unwrap()
}

/// Drive the node agent and attacher until the pod is set up (or give up).
async fn run_pod(l: &Lab, name: &str) -> Reconcile {
    let mut last = Reconcile::Done;
    for _ in 0..6 {
        last = l.node.reconcile(&pod_t(name)).await.unwrap();
        if last == Reconcile::Done {
            break;
        }
        for va in l.kube.list(Kind::VolumeAttachment, None).unwrap() {
            let n = va["metadata"]["name"].as_str().unwrap().to_string();
            l.att
                .reconcile(&AttachTarget::Attachment { name: n })
                .await
                .unwrap();
        }
    }
    last
}

// ---------------------------------------------------------------- tests

#[tokio::test]
async fn pvc_becomes_a_bound_pv() {
    let l = lab().await;
    let c = provisioned(&l, "data", "fast", &["ReadWriteOnce"]).await;
    let uid = c["metadata"]["uid"].as_str().unwrap();
    let pv_name = format!("pvc-{uid}");
    assert_eq!(c["spec"]["volumeName"], pv_name.as_str());
    assert_eq!(c["status"]["phase"], "Bound");
    let pv = get(&l, Kind::PersistentVolume, None, &pv_name).unwrap();
    assert_eq!(pv["spec"]["csi"]["driver"], DRIVER);
    assert_eq!(pv["spec"]["csi"]["volumeHandle"], "disk-1");
    assert_eq!(pv["spec"]["csi"]["fsType"], "ext4");
    assert_eq!(pv["spec"]["csi"]["volumeAttributes"]["zone"], "z1");
    assert_eq!(pv["spec"]["capacity"]["storage"], "1Gi");
    assert_eq!(pv["spec"]["claimRef"]["uid"], uid);
    assert_eq!(pv["spec"]["persistentVolumeReclaimPolicy"], "Delete");
    assert_eq!(pv["metadata"]["finalizers"], json!([PV_FINALIZER]));
    assert_eq!(pv["status"]["phase"], "Bound");
    let ex = l.prov.exchanges();
    let DriverRequest::CreateVolume(req) = &ex[0].request else {
        panic!("first call is not CreateVolume: {ex:?}")
    };
    assert_eq!(req.name, pv_name);
    assert_eq!(req.capacity_range.unwrap().required_bytes, 1 << 30);
    // The sidecar's own parameters are stripped; the rest reach the driver.
    assert_eq!(
        req.parameters,
        [("tier".to_string(), "gold".to_string())].into()
    );
    use csi::volume_capability::{access_mode::Mode, AccessType};
    let cap = &req.volume_capabilities[0];
    assert_eq!(cap.access_mode.unwrap().mode, Mode::SingleNodeWriter as i32);
    assert!(matches!(&cap.access_type, Some(AccessType::Mount(m)) if m.fs_type == "ext4"));
    // Reconciling again changes nothing and calls nothing.
    assert_eq!(
        l.prov.reconcile(&claim("data")).await.unwrap(),
        Reconcile::Done
    );
    assert_eq!(l.prov.exchanges().len(), 1);
    // A claim of another driver's class is not ours.
    l.kube
        .create(
            Kind::StorageClass,
            json!({"metadata":{"name":"other"},"provisioner":"other.csi"}),
        )
        .unwrap();
    l.kube
        .create(
            Kind::PersistentVolumeClaim,
            pvc("theirs", "other", &["ReadWriteOnce"]),
        )
        .unwrap();
    assert_eq!(
        l.prov.reconcile(&claim("theirs")).await.unwrap(),
        Reconcile::Done
    );
    assert_eq!(l.prov.exchanges().len(), 1);
}

#[tokio::test]
async fn create_retried_after_a_lost_reply_uses_the_same_name() {
    let l = lab().await;
    l.hook.ops.lock().unwrap().push("CreateVolume");
    l.kube
        .create(
            Kind::PersistentVolumeClaim,
            pvc("data", "fast", &["ReadWriteOnce"]),
        )
        .unwrap();
    let r = l.prov.reconcile(&claim("data")).await.unwrap();
    assert_eq!(
        r,
        Reconcile::Requeue {
            after: Duration::from_secs(1),
            reason: "CreateVolume: UNAVAILABLE: transport: connection refused or reset".into()
        }
    );
    // The driver did create it; the claim is not bound yet.
    assert_eq!(st(&l.driver).volumes.len(), 1);
    assert_eq!(
        get(&l, Kind::PersistentVolumeClaim, Some("app"), "data").unwrap()["status"]["phase"],
        "Pending"
    );
    assert_eq!(
        l.prov.reconcile(&claim("data")).await.unwrap(),
        Reconcile::Done
    );
    let names: Vec<String> = l
        .prov
        .exchanges()
        .iter()
        .map(|e| match &e.request {
            DriverRequest::CreateVolume(r) => r.name.clone(),
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    assert_eq!(names.len(), 2);
    assert_eq!(names[0], names[1], "the retry must reuse the volume name");
    assert_eq!(st(&l.driver).volumes.len(), 1, "no duplicate volume");
    // The history has the lost reply and the retry.
    let lost = l
        .history
        .events()
        .iter()
        .filter(|e| format!("{e:?}").contains("reply lost"))
        .count();
    assert_eq!(lost, 1);
}

#[tokio::test]
async fn backoff_doubles_per_claim_and_resets() {
    let l = lab().await;
    l.kube
        .create(
            Kind::PersistentVolumeClaim,
            pvc("data", "missing-class", &["ReadWriteOnce"]),
        )
        .unwrap();
    let mut delays = Vec::new();
    for _ in 0..4 {
        match l.prov.reconcile(&claim("data")).await.unwrap() {
            Reconcile::Requeue { after, .. } => delays.push(after.as_secs()),
            Reconcile::Done => panic!("no class, cannot be done"),
        }
    }
    assert_eq!(delays, [1, 2, 4, 8]);
}

#[tokio::test]
async fn delete_policy_deletes_volume_and_pv_retain_keeps_them() {
    let l = lab().await;
    let gone = provisioned(&l, "gone", "fast", &["ReadWriteOnce"]).await;
    let kept = provisioned(&l, "kept", "keep", &["ReadWriteOnce"]).await;
    let gone_pv = gone["spec"]["volumeName"].as_str().unwrap().to_string();
    let kept_pv = kept["spec"]["volumeName"].as_str().unwrap().to_string();
    assert!(
        get(&l, Kind::PersistentVolume, None, &kept_pv).unwrap()["metadata"]
            .get("finalizers")
            .is_none_or(|f| f.as_array().is_some_and(|a| a.is_empty()))
    );
    l.kube
        .delete(Kind::PersistentVolumeClaim, Some("app"), "gone")
        .unwrap();
    l.kube
        .delete(Kind::PersistentVolumeClaim, Some("app"), "kept")
        .unwrap();
    assert_eq!(
        l.prov.reconcile(&claim("gone")).await.unwrap(),
        Reconcile::Done
    );
    assert_eq!(
        l.prov.reconcile(&claim("kept")).await.unwrap(),
        Reconcile::Done
    );
    assert!(get(&l, Kind::PersistentVolume, None, &gone_pv).is_none());
    let kept_obj = get(&l, Kind::PersistentVolume, None, &kept_pv).unwrap();
    assert_eq!(kept_obj["status"]["phase"], "Released");
    assert_eq!(
        rpcs(&l.prov.exchanges()),
        ["CreateVolume", "CreateVolume", "DeleteVolume"]
    );
    let DriverRequest::DeleteVolume(d) = &l.prov.exchanges()[2].request else {
        panic!()
    };
    assert_eq!(d.volume_id, "disk-1");
    let vols: Vec<String> = st(&l.driver)
        .volumes
        .values()
        .map(|v| v.0.clone())
        .collect();
    assert_eq!(vols, ["disk-2"]);
}

#[tokio::test]
async fn failed_delete_keeps_the_pv_and_retries() {
    let l = lab().await;
    let c = provisioned(&l, "data", "fast", &["ReadWriteOnce"]).await;
    let pv = c["spec"]["volumeName"].as_str().unwrap().to_string();
    // Still published: the driver refuses the delete.
    st(&l.driver)
        .published
        .insert("disk-1".into(), NODE_ID.into());
    l.kube
        .delete(Kind::PersistentVolumeClaim, Some("app"), "data")
        .unwrap();
    let r = l.prov.reconcile(&claim("data")).await.unwrap();
    assert!(
        matches!(r, Reconcile::Requeue { ref reason, .. } if reason.contains("FAILED_PRECONDITION")),
        "{r:?}"
    );
    assert!(get(&l, Kind::PersistentVolume, None, &pv).is_some());
    st(&l.driver).published.clear();
    let r = l
        .prov
        .reconcile(&ProvisionTarget::Volume { name: pv.clone() })
        .await
        .unwrap();
    assert_eq!(r, Reconcile::Done);
    assert!(get(&l, Kind::PersistentVolume, None, &pv).is_none());
}

#[tokio::test]
async fn attach_and_detach_with_finalizers() {
    let l = lab().await;
    assert_eq!(
        l.node.reconcile(&NodeTarget::Register).await.unwrap(),
        Reconcile::Done
    );
    let csinode = get(&l, Kind::CsiNode, None, NODE).unwrap();
    assert_eq!(csinode["spec"]["drivers"][0]["nodeID"], NODE_ID);
    assert_eq!(csinode["spec"]["drivers"][0]["allocatable"]["count"], 8);
    let c = provisioned(&l, "data", "fast", &["ReadWriteOnce"]).await;
    let pv = c["spec"]["volumeName"].as_str().unwrap().to_string();
    l.kube
        .create(
            Kind::VolumeAttachment,
            json!({"metadata":{"name":"va-1"},"spec":{"attacher":DRIVER,"nodeName":NODE,"source":{"persistentVolumeName":pv}}}),
        )
        .unwrap();
    let t = AttachTarget::Attachment {
        name: "va-1".into(),
    };
    assert_eq!(l.att.reconcile(&t).await.unwrap(), Reconcile::Done);
    let va = get(&l, Kind::VolumeAttachment, None, "va-1").unwrap();
    assert_eq!(va["status"]["attached"], true);
    assert_eq!(va["status"]["attachmentMetadata"]["disk_cid"], "disk-1");
    assert_eq!(
        va["metadata"]["finalizers"],
        json!(["external-attacher/test-csi-drivelab"])
    );
    let pv_obj = get(&l, Kind::PersistentVolume, None, &pv).unwrap();
    assert!(pv_obj["metadata"]["finalizers"]
        .as_array()
        .unwrap()
        .contains(&json!("external-attacher/test-csi-drivelab")));
    let DriverRequest::ControllerPublish(p) = &l.att.exchanges()[0].request else {
        panic!()
    };
    assert_eq!(
        (p.volume_id.as_str(), p.node_id.as_str()),
        ("disk-1", NODE_ID)
    );
    assert!(!p.readonly);
    // Attached: reconciling again makes no call.
    assert_eq!(l.att.reconcile(&t).await.unwrap(), Reconcile::Done);
    assert_eq!(l.att.exchanges().len(), 1);
    // Delete: the finalizer holds the object until the unpublish succeeds.
    l.kube.delete(Kind::VolumeAttachment, None, "va-1").unwrap();
    assert!(get(&l, Kind::VolumeAttachment, None, "va-1").is_some());
    assert_eq!(l.att.reconcile(&t).await.unwrap(), Reconcile::Done);
    assert!(get(&l, Kind::VolumeAttachment, None, "va-1").is_none());
    assert_eq!(
        rpcs(&l.att.exchanges()),
        ["ControllerPublishVolume", "ControllerUnpublishVolume"]
    );
    assert!(st(&l.driver).published.is_empty());
}

#[tokio::test]
async fn attach_errors_are_recorded_in_status() {
    let l = lab().await;
    // No CSINode yet: the attacher cannot know the node id.
    let c = provisioned(&l, "data", "fast", &["ReadWriteOnce"]).await;
    let pv = c["spec"]["volumeName"].as_str().unwrap().to_string();
    l.kube
        .create(
            Kind::VolumeAttachment,
            json!({"metadata":{"name":"va-1"},"spec":{"attacher":DRIVER,"nodeName":NODE,"source":{"persistentVolumeName":pv}}}),
        )
        .unwrap();
    let t = AttachTarget::Attachment {
        name: "va-1".into(),
    };
    let r = l.att.reconcile(&t).await.unwrap();
    assert!(matches!(r, Reconcile::Requeue { after, .. } if after == Duration::from_secs(1)));
    let va = get(&l, Kind::VolumeAttachment, None, "va-1").unwrap();
    assert!(va["status"]["attachError"]["message"]
        .as_str()
        .unwrap()
        .contains("no CSINode"));
    assert!(l.att.exchanges().is_empty());
    // Another node holds it: the driver's FAILED_PRECONDITION lands in attachError.
    l.node.reconcile(&NodeTarget::Register).await.unwrap();
    st(&l.driver)
        .published
        .insert("disk-1".into(), "other-node".into());
    let r = l.att.reconcile(&t).await.unwrap();
    assert!(matches!(r, Reconcile::Requeue { after, .. } if after == Duration::from_secs(2)));
    let va = get(&l, Kind::VolumeAttachment, None, "va-1").unwrap();
    assert!(va["status"]["attachError"]["message"]
        .as_str()
        .unwrap()
        .contains("FAILED_PRECONDITION"));
    assert_ne!(va["status"]["attached"], true);
    st(&l.driver).published.clear();
    assert_eq!(l.att.reconcile(&t).await.unwrap(), Reconcile::Done);
    let va = get(&l, Kind::VolumeAttachment, None, "va-1").unwrap();
    assert!(va["status"]["attachError"].is_null());
}

#[tokio::test]
async fn node_stage_and_publish_paths_then_teardown() {
    let l = lab().await;
    l.node.reconcile(&NodeTarget::Register).await.unwrap();
    let c = provisioned(&l, "data", "fast", &["ReadWriteOnce"]).await;
    let pv = c["spec"]["volumeName"].as_str().unwrap().to_string();
    let p = l.kube.create(Kind::Pod, pod("web", "data", false)).unwrap();
    let uid = p["metadata"]["uid"].as_str().unwrap().to_string();
    assert_eq!(run_pod(&l, "web").await, Reconcile::Done);
    assert_eq!(
        get(&l, Kind::Pod, Some("app"), "web").unwrap()["status"]["phase"],
        "Running"
    );
    let ex = l.node.exchanges();
    assert_eq!(
        rpcs(&ex),
        ["NodeGetInfo", "NodeStageVolume", "NodePublishVolume"]
    );
    let staging = staging_path(DRIVER, "disk-1");
    let target = target_path(&uid, &pv);
    assert!(staging.starts_with(&format!(
        "/var/lib/kubelet/plugins/kubernetes.io/csi/{DRIVER}/"
    )));
    assert!(staging.ends_with("/globalmount"));
    assert_eq!(
        target,
        format!("/var/lib/kubelet/pods/{uid}/volumes/kubernetes.io~csi/{pv}/mount")
    );
    let DriverRequest::NodeStage(s) = &ex[1].request else {
        panic!()
    };
    assert_eq!(s.staging_target_path, staging);
    assert_eq!(
        s.publish_context.get("disk_cid").map(String::as_str),
        Some("disk-1")
    );
    let DriverRequest::NodePublish(p) = &ex[2].request else {
        panic!()
    };
    assert_eq!(
        (
            p.staging_target_path.as_str(),
            p.target_path.as_str(),
            p.readonly
        ),
        (staging.as_str(), target.as_str(), false)
    );
    let m = l.mounts.mounts();
    assert_eq!(m.len(), 2);
    assert!(m.iter().any(|m| m.target == staging && !m.bind));
    assert!(m
        .iter()
        .any(|m| m.target == target && m.bind && !m.read_only));
    // Pod deleted: graceful, so it stays until the agent tore its volumes down.
    l.kube.delete(Kind::Pod, Some("app"), "web").unwrap();
    assert!(get(&l, Kind::Pod, Some("app"), "web").is_some());
    assert_eq!(
        l.node.reconcile(&pod_t("web")).await.unwrap(),
        Reconcile::Done
    );
    assert!(get(&l, Kind::Pod, Some("app"), "web").is_none());
    assert!(l.mounts.mounts().is_empty(), "{:?}", l.mounts.mounts());
    assert_eq!(
        rpcs(&l.node.exchanges())[3..],
        ["NodeUnpublishVolume", "NodeUnstageVolume"]
    );
    // The VolumeAttachment was deleted; the attacher detaches.
    let va: Vec<String> = l
        .kube
        .list(Kind::VolumeAttachment, None)
        .unwrap()
        .iter()
        .map(|v| v["metadata"]["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(va.len(), 1);
    l.att
        .reconcile(&AttachTarget::Attachment {
            name: va[0].clone(),
        })
        .await
        .unwrap();
    assert!(l
        .kube
        .list(Kind::VolumeAttachment, None)
        .unwrap()
        .is_empty());
    assert!(st(&l.driver).published.is_empty());
}

/// What the lab's resync relies on to pass over a target: once a pod is set
/// up, each sidecar's pass of it answers Done having only read objects by
/// name, written nothing, called nothing and left its sidecar's state (and
/// so its generation) alone; a change to a read object shows.
#[tokio::test]
async fn a_settled_objects_pass_only_reads() {
    use drivelab_fakes::kube::reads::Reads;
    let l = lab().await;
    l.node.reconcile(&NodeTarget::Register).await.unwrap();
    let c = provisioned(&l, "data", "fast", &["ReadWriteOnce"]).await;
    l.kube.create(Kind::Pod, pod("web", "data", false)).unwrap();
    assert_eq!(run_pod(&l, "web").await, Reconcile::Done);
    let va = l.kube.list(Kind::VolumeAttachment, None).unwrap()[0]["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_string();
    let pv = c["spec"]["volumeName"].as_str().unwrap().to_string();
    let calls =
        |l: &Lab| l.node.exchanges().len() + l.att.exchanges().len() + l.prov.exchanges().len();
    let before = (calls(&l), l.node.generation());
    let (r, pod_reads) = Reads::track(l.node.reconcile(&pod_t("web"))).await;
    assert_eq!(r.unwrap(), Reconcile::Done);
    let (r, claim_reads) = Reads::track(l.prov.reconcile(&claim("data"))).await;
    assert_eq!(r.unwrap(), Reconcile::Done);
    let (r, va_reads) = Reads::track(l.att.reconcile(&AttachTarget::Attachment { name: va })).await;
    assert_eq!(r.unwrap(), Reconcile::Done);
    let (r, pv_reads) = Reads::track(l.att.reconcile(&AttachTarget::Volume { name: pv })).await;
    assert_eq!(r.unwrap(), Reconcile::Done);
    assert_eq!(
        (calls(&l), l.node.generation()),
        before,
        "a settled pass acted"
    );
    for reads in [&pod_reads, &claim_reads, &va_reads, &pv_reads] {
        assert!(!reads.wrote() && reads.is_checkable() && !reads.is_empty());
        assert!(l.kube.unchanged(reads).unwrap());
    }
    // The pod's claim is among what its pass read.
    let patch = json!({"metadata": {"labels": {"touched": "yes"}}});
    l.kube
        .merge_patch(Kind::PersistentVolumeClaim, Some("app"), "data", patch)
        .unwrap();
    assert!(!l.kube.unchanged(&pod_reads).unwrap());
    assert!(!l.kube.unchanged(&claim_reads).unwrap());
    // Deleting the pod changes the agent's state when its volumes come down.
    l.kube.delete(Kind::Pod, Some("app"), "web").unwrap();
    assert_eq!(
        l.node.reconcile(&pod_t("web")).await.unwrap(),
        Reconcile::Done
    );
    assert_ne!(l.node.generation(), before.1);
}

#[tokio::test]
async fn shared_volume_is_unstaged_only_after_the_last_pod() {
    let l = lab().await;
    l.node.reconcile(&NodeTarget::Register).await.unwrap();
    provisioned(&l, "data", "fast", &["ReadWriteOnce"]).await;
    l.kube.create(Kind::Pod, pod("a", "data", false)).unwrap();
    l.kube.create(Kind::Pod, pod("b", "data", false)).unwrap();
    assert_eq!(run_pod(&l, "a").await, Reconcile::Done);
    assert_eq!(run_pod(&l, "b").await, Reconcile::Done);
    // One stage for two pods.
    let stages = rpcs(&l.node.exchanges())
        .iter()
        .filter(|r| **r == "NodeStageVolume")
        .count();
    assert_eq!(stages, 1);
    l.kube.delete(Kind::Pod, Some("app"), "a").unwrap();
    l.node.reconcile(&pod_t("a")).await.unwrap();
    assert!(!rpcs(&l.node.exchanges()).contains(&"NodeUnstageVolume"));
    assert_eq!(l.mounts.mounts().len(), 2);
    l.kube.delete(Kind::Pod, Some("app"), "b").unwrap();
    l.node.reconcile(&pod_t("b")).await.unwrap();
    assert!(rpcs(&l.node.exchanges()).contains(&"NodeUnstageVolume"));
    assert!(l.mounts.mounts().is_empty());
}

#[tokio::test]
async fn failed_stage_means_no_publish_and_no_leaked_mount() {
    let l = lab().await;
    l.node.reconcile(&NodeTarget::Register).await.unwrap();
    provisioned(&l, "data", "fast", &["ReadWriteOnce"]).await;
    st(&l.driver).fail_stage = Some(tonic::Code::Internal);
    l.kube.create(Kind::Pod, pod("web", "data", false)).unwrap();
    let r = run_pod(&l, "web").await;
    assert!(
        matches!(&r, Reconcile::Requeue { reason, .. } if reason.contains("NodeStageVolume: INTERNAL")),
        "{r:?}"
    );
    let calls = rpcs(&l.node.exchanges());
    assert!(calls.contains(&"NodeStageVolume"));
    assert!(!calls.contains(&"NodePublishVolume"), "{calls:?}");
    assert_eq!(
        get(&l, Kind::Pod, Some("app"), "web").unwrap()["status"]["phase"],
        "Pending"
    );
    assert!(l.mounts.mounts().is_empty());
    // A final error left nothing staged: teardown makes no node calls.
    l.kube.delete(Kind::Pod, Some("app"), "web").unwrap();
    assert_eq!(
        l.node.reconcile(&pod_t("web")).await.unwrap(),
        Reconcile::Done
    );
    let after = rpcs(&l.node.exchanges());
    assert!(!after.contains(&"NodeUnstageVolume"), "{after:?}");
    assert!(get(&l, Kind::Pod, Some("app"), "web").is_none());
}

#[tokio::test]
async fn uncertain_stage_is_unstaged_on_teardown() {
    let l = lab().await;
    l.node.reconcile(&NodeTarget::Register).await.unwrap();
    provisioned(&l, "data", "fast", &["ReadWriteOnce"]).await;
    // The stage happens but its reply is lost: kubelet must assume it may be mounted.
    l.hook.ops.lock().unwrap().push("NodeStageVolume");
    l.kube.create(Kind::Pod, pod("web", "data", false)).unwrap();
    l.node.reconcile(&pod_t("web")).await.unwrap();
    l.att
        .reconcile(&AttachTarget::Attachment {
            name: l.kube.list(Kind::VolumeAttachment, None).unwrap()[0]["metadata"]["name"]
                .as_str()
                .unwrap()
                .to_string(),
        })
        .await
        .unwrap();
    let r = l.node.reconcile(&pod_t("web")).await.unwrap();
    assert!(
        matches!(&r, Reconcile::Requeue { reason, .. } if reason.contains("UNAVAILABLE")),
        "{r:?}"
    );
    assert_eq!(l.mounts.mounts().len(), 1, "the driver did stage");
    l.kube.delete(Kind::Pod, Some("app"), "web").unwrap();
    assert_eq!(
        l.node.reconcile(&pod_t("web")).await.unwrap(),
        Reconcile::Done
    );
    assert!(rpcs(&l.node.exchanges()).contains(&"NodeUnstageVolume"));
    assert!(l.mounts.mounts().is_empty(), "nothing leaks");
}

#[tokio::test]
async fn read_only_publish_is_a_read_only_bind() {
    let l = lab().await;
    l.node.reconcile(&NodeTarget::Register).await.unwrap();
    provisioned(&l, "data", "fast", &["ReadWriteOnce"]).await;
    l.kube.create(Kind::Pod, pod("ro", "data", true)).unwrap();
    assert_eq!(run_pod(&l, "ro").await, Reconcile::Done);
    let publish = l
        .node
        .exchanges()
        .into_iter()
        .find_map(|e| match e.request {
            DriverRequest::NodePublish(p) => Some(p),
            _ => None,
        })
        .unwrap();
    assert!(publish.readonly);
    let binds: Vec<_> = l.mounts.mounts().into_iter().filter(|m| m.bind).collect();
    assert_eq!(binds.len(), 1);
    assert!(binds[0].read_only);
}

#[tokio::test]
async fn mount_table_refuses_a_read_write_bind_of_a_read_only_stage() {
    let l = lab().await;
    l.node.reconcile(&NodeTarget::Register).await.unwrap();
    // ReadOnlyMany: the driver stages read-only; a buggy publish asks read-write.
    provisioned(&l, "data", "fast", &["ReadOnlyMany"]).await;
    st(&l.driver).ignore_readonly = true;
    l.kube.create(Kind::Pod, pod("web", "data", true)).unwrap();
    let r = run_pod(&l, "web").await;
    assert!(
        matches!(&r, Reconcile::Requeue { reason, .. } if reason.contains("ReadOnlySource")),
        "{r:?}"
    );
    let m = l.mounts.mounts();
    assert_eq!(m.len(), 1, "only the read-only stage: {m:?}");
    assert!(m[0].read_only);
    assert_ne!(
        get(&l, Kind::Pod, Some("app"), "web").unwrap()["status"]["phase"],
        "Running"
    );
}

#[tokio::test]
async fn startup_and_every_driver_call_pass_the_gate() {
    let l = lab().await;
    l.node.reconcile(&NodeTarget::Register).await.unwrap();
    let events = format!("{:?}", l.history.events());
    for op in [
        "GetPluginInfo",
        "ControllerGetCapabilities",
        "NodeGetCapabilities",
        "NodeGetInfo",
    ] {
        assert!(events.contains(op), "{op} not in history");
    }
    assert!(events.contains("CsiProvisioner") || events.contains("csi_provisioner"));
    // Replaying a recorded request sends the same thing again.
    provisioned(&l, "data", "fast", &["ReadWriteOnce"]).await;
    let first = l.prov.exchanges()[0].request.clone();
    let again = l.prov.replay(first.clone()).await;
    assert_eq!(again.request, first);
    assert!(matches!(again.reply, DriverReply::Created(Some(ref v)) if v.volume_id == "disk-1"));
}

// ------------------------------------------- end to end with bosh-csi's node plugin

/// The controller side is the in-test driver (no Director needed, it stands in
/// for bosh-csi's controller and the BOSH agent); the node
/// side is the reference `bosh-csi` node plugin, mounting into the mount
/// table over its HTTP API.
struct BoshLab {
    lab: Lab,
    node: NodeAgent,
    _table: drivelab_fakes::serve::Listener,
    _stop: tokio::sync::oneshot::Sender<()>,
}

async fn bosh_lab(mutants: &[bosh_csi::Mutant]) -> BoshLab {
    // The in-test controller answers to bosh-csi's name, so the PVs and
    // VolumeAttachments it makes are the node plugin's.
    let lab = lab_named(bosh_csi::DRIVER_NAME).await;
    let table = lab
        .mounts
        .serve(drivelab_fakes::serve::loopback())
        .await
        .unwrap();
    let sock = lab._dir.path().join("node.sock");
    let config = bosh_csi::DriverConfig {
        mode: bosh_csi::Mode::Node,
        node_id: NODE_ID.into(),
        mounter_url: table.url(),
        mutants: mutants.to_vec(),
        ..Default::default()
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let s = sock.clone();
    tokio::spawn(async move {
        bosh_csi::serve_unix(config, &s, async {
            let _ = stopped.await;
        })
        .await
        .unwrap();
    });
    let mut tries = 0;
    while !sock.exists() && tries < 200 {
        tokio::time::sleep(Duration::from_millis(10)).await;
        tries += 1;
    }
    let slot: KubeSlot = Arc::new(RwLock::new(lab.kube.clone()));
    let gate = lab.kube.gate().clone();
    let node = NodeAgent::connect(NODE, &sock, slot, gate).await.unwrap();
    assert_eq!(node.driver_name(), bosh_csi::DRIVER_NAME);
    BoshLab {
        lab,
        node,
        _table: table,
        _stop: stop,
    }
}

async fn bosh_run_pod(b: &BoshLab, name: &str) -> Reconcile {
    bosh_run_pod_until(b, name, None).await
}

/// Drive the pod until it is set up, or until a requeue reason contains `stop`.
async fn bosh_run_pod_until(b: &BoshLab, name: &str, stop: Option<&str>) -> Reconcile {
    let mut last = Reconcile::Done;
    for _ in 0..6 {
        last = b.node.reconcile(&pod_t(name)).await.unwrap();
        if last == Reconcile::Done {
            break;
        }
        if let (Some(s), Reconcile::Requeue { reason, .. }) = (stop, &last) {
            if reason.contains(s) {
                break;
            }
        }
        for va in b.lab.kube.list(Kind::VolumeAttachment, None).unwrap() {
            let n = va["metadata"]["name"].as_str().unwrap().to_string();
            b.lab
                .att
                .reconcile(&AttachTarget::Attachment { name: n })
                .await
                .unwrap();
        }
    }
    last
}

#[tokio::test]
async fn end_to_end_with_the_bosh_csi_node_plugin() {
    let b = bosh_lab(&[]).await;
    let l = &b.lab;
    assert_eq!(
        b.node.reconcile(&NodeTarget::Register).await.unwrap(),
        Reconcile::Done
    );
    let csinode = get(l, Kind::CsiNode, None, NODE).unwrap();
    assert_eq!(csinode["spec"]["drivers"][0]["name"], bosh_csi::DRIVER_NAME);
    assert_eq!(csinode["spec"]["drivers"][0]["nodeID"], NODE_ID);
    let c = provisioned(l, "data", "fast", &["ReadWriteOnce"]).await;
    let pv = c["spec"]["volumeName"].as_str().unwrap().to_string();
    let p = l.kube.create(Kind::Pod, pod("web", "data", true)).unwrap();
    let uid = p["metadata"]["uid"].as_str().unwrap().to_string();
    assert_eq!(bosh_run_pod(&b, "web").await, Reconcile::Done);
    assert_eq!(
        rpcs(&b.node.exchanges()),
        ["NodeGetInfo", "NodeStageVolume", "NodePublishVolume"]
    );
    assert_eq!(
        get(l, Kind::Pod, Some("app"), "web").unwrap()["status"]["phase"],
        "Running"
    );
    let staging = staging_path(
        bosh_csi::DRIVER_NAME,
        &volume_id_of(bosh_csi::DRIVER_NAME, 1),
    );
    let target = target_path(&uid, &pv);
    let m = l.mounts.mounts();
    assert_eq!(m.len(), 2, "{m:?}");
    let stage = m.iter().find(|m| m.target == staging).expect("staged");
    assert!(
        !stage.bind
            && stage.disk_cid == volume_id_of(bosh_csi::DRIVER_NAME, 1)
            && stage.fstype == "ext4"
    );
    let publish = m.iter().find(|m| m.target == target).expect("published");
    assert!(publish.bind && publish.read_only, "{publish:?}");
    // Teardown through the real node plugin leaves nothing mounted.
    l.kube.delete(Kind::Pod, Some("app"), "web").unwrap();
    assert_eq!(
        b.node.reconcile(&pod_t("web")).await.unwrap(),
        Reconcile::Done
    );
    assert!(l.mounts.mounts().is_empty(), "{:?}", l.mounts.mounts());
    assert!(get(l, Kind::Pod, Some("app"), "web").is_none());
}

/// A mount whose reply is lost makes bosh-csi's NodeStage fail; the correct
/// plugin takes its mount down again, the `leak-mount-on-failed-stage` mutant
/// leaves it. The check (no mount survives a failed stage) tells them apart.
async fn leaked_after_failed_stage(mutants: &[bosh_csi::Mutant]) -> usize {
    let b = bosh_lab(mutants).await;
    let l = &b.lab;
    b.node.reconcile(&NodeTarget::Register).await.unwrap();
    provisioned(l, "data", "fast", &["ReadWriteOnce"]).await;
    l.kube.create(Kind::Pod, pod("web", "data", false)).unwrap();
    l.hook.ops.lock().unwrap().push("mount");
    let r = bosh_run_pod_until(&b, "web", Some("NodeStageVolume")).await;
    assert!(
        matches!(&r, Reconcile::Requeue { reason, .. } if reason.contains("NodeStageVolume")),
        "{r:?}"
    );
    assert!(!rpcs(&b.node.exchanges()).contains(&"NodePublishVolume"));
    let leaked = l.mounts.mounts().len();
    // Either way the kubelet recovers: a retry stages and publishes.
    assert_eq!(bosh_run_pod(&b, "web").await, Reconcile::Done);
    leaked
}

#[tokio::test]
async fn failed_stage_leak_is_caught_in_the_mount_table() {
    assert_eq!(leaked_after_failed_stage(&[]).await, 0);
    assert_eq!(
        leaked_after_failed_stage(&[bosh_csi::Mutant::LeakMountOnFailedStage]).await,
        1,
        "the leak mutant must be visible"
    );
}

#[tokio::test]
async fn pvc_in_use_is_protected_until_its_pod_is_gone() {
    let l = lab().await;
    l.node.reconcile(&NodeTarget::Register).await.unwrap();
    let c = provisioned(&l, "data", "fast", &["ReadWriteOnce"]).await;
    assert_eq!(
        c["metadata"]["finalizers"],
        json!([drivelab_fakes::kube::PVC_PROTECTION])
    );
    let pv = c["spec"]["volumeName"].as_str().unwrap().to_string();
    l.kube.create(Kind::Pod, pod("web", "data", false)).unwrap();
    assert_eq!(run_pod(&l, "web").await, Reconcile::Done);
    l.kube
        .delete(Kind::PersistentVolumeClaim, Some("app"), "data")
        .unwrap();
    let r = l.prov.reconcile(&claim("data")).await.unwrap();
    assert!(
        matches!(&r, Reconcile::Requeue { reason, .. } if reason.contains("in use by pod web")),
        "{r:?}"
    );
    assert!(get(&l, Kind::PersistentVolumeClaim, Some("app"), "data").is_some());
    assert!(!rpcs(&l.prov.exchanges()).contains(&"DeleteVolume"));
    // The pod goes (volumes torn down, detached); then the claim and its volume go.
    l.kube.delete(Kind::Pod, Some("app"), "web").unwrap();
    assert_eq!(
        l.node.reconcile(&pod_t("web")).await.unwrap(),
        Reconcile::Done
    );
    let va = l.kube.list(Kind::VolumeAttachment, None).unwrap()[0]["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_string();
    l.att
        .reconcile(&AttachTarget::Attachment { name: va })
        .await
        .unwrap();
    assert_eq!(
        l.prov.reconcile(&claim("data")).await.unwrap(),
        Reconcile::Done
    );
    assert!(get(&l, Kind::PersistentVolumeClaim, Some("app"), "data").is_none());
    assert!(st(&l.driver).volumes.is_empty());
    // The attacher's PV finalizer holds the deleted PV until it sees no attachment.
    let held = get(&l, Kind::PersistentVolume, None, &pv).unwrap();
    assert!(held["metadata"]["deletionTimestamp"].is_string());
    assert_eq!(
        l.att
            .reconcile(&AttachTarget::Volume { name: pv.clone() })
            .await
            .unwrap(),
        Reconcile::Done
    );
    assert!(get(&l, Kind::PersistentVolume, None, &pv).is_none());
}

#[tokio::test]
async fn resync_converges_the_whole_lifecycle_from_concurrent_tasks() {
    use drivelab_fakes::csi::cluster::CsiSidecars;
    let Lab {
        _dir,
        kube,
        driver,
        mounts,
        prov,
        att,
        node,
        ..
    } = lab().await;
    let cluster = Arc::new(CsiSidecars {
        kube: Arc::new(RwLock::new(kube.clone())),
        provisioner: Arc::new(prov),
        attacher: Arc::new(att),
        nodes: [(NODE.to_string(), Arc::new(node))].into(),
        snapshotter: None,
    });
    for (c, p) in [("a", "pa"), ("b", "pb")] {
        kube.create(
            Kind::PersistentVolumeClaim,
            pvc(c, "fast", &["ReadWriteOnce"]),
        )
        .unwrap();
        kube.create(Kind::Pod, pod(p, c, false)).unwrap();
    }
    // The engine runs reconciles on spawned tasks: the futures must be Send.
    let mut tasks = Vec::new();
    for t in cluster.targets().unwrap() {
        let c = cluster.clone();
        tasks.push(tokio::spawn(
            async move { c.reconcile(&t).await.map(|_| ()) },
        ));
    }
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    let pending = cluster.settle(10).await.unwrap();
    assert!(pending.is_empty(), "{pending:?}");
    for p in ["pa", "pb"] {
        assert_eq!(
            kube.get(Kind::Pod, Some("app"), p).unwrap().unwrap()["status"]["phase"],
            "Running"
        );
    }
    assert_eq!(mounts.mounts().len(), 4);
    for p in ["pa", "pb"] {
        kube.delete(Kind::Pod, Some("app"), p).unwrap();
    }
    for c in ["a", "b"] {
        kube.delete(Kind::PersistentVolumeClaim, Some("app"), c)
            .unwrap();
    }
    let pending = cluster.settle(10).await.unwrap();
    assert!(pending.is_empty(), "{pending:?}");
    for k in [
        Kind::Pod,
        Kind::PersistentVolumeClaim,
        Kind::PersistentVolume,
        Kind::VolumeAttachment,
    ] {
        assert!(kube.list(k, None).unwrap().is_empty(), "{k} left over");
    }
    assert!(mounts.mounts().is_empty());
    assert!(st(&driver).volumes.is_empty() && st(&driver).published.is_empty());
}

#[tokio::test]
async fn static_pv_is_bound_and_protected_without_a_create() {
    let l = lab().await;
    l.kube
        .create(
            Kind::PersistentVolume,
            json!({"metadata":{"name":"static-1"},"spec":{
                "capacity":{"storage":"2Gi"},"accessModes":["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy":"Delete",
                "claimRef":{"namespace":"app","name":"data"},
                "csi":{"driver":DRIVER,"volumeHandle":"pre-existing"}}}),
        )
        .unwrap();
    let mut c = pvc("data", "", &["ReadWriteOnce"]);
    c["spec"]["volumeName"] = json!("static-1");
    l.kube.create(Kind::PersistentVolumeClaim, c).unwrap();
    assert_eq!(
        l.prov.reconcile(&claim("data")).await.unwrap(),
        Reconcile::Done
    );
    assert!(
        l.prov.exchanges().is_empty(),
        "no CreateVolume for a static PV"
    );
    let pvc = get(&l, Kind::PersistentVolumeClaim, Some("app"), "data").unwrap();
    assert_eq!(pvc["status"]["phase"], "Bound");
    assert_eq!(pvc["status"]["capacity"]["storage"], "2Gi");
    let pv = get(&l, Kind::PersistentVolume, None, "static-1").unwrap();
    assert_eq!(pv["metadata"]["finalizers"], json!([PV_FINALIZER]));
    assert_eq!(pv["spec"]["claimRef"]["uid"], pvc["metadata"]["uid"]);
    // Bound to a live claim: a PV resync deletes nothing.
    let r = l
        .prov
        .reconcile(&ProvisionTarget::Volume {
            name: "static-1".into(),
        })
        .await
        .unwrap();
    assert_eq!(r, Reconcile::Done);
    assert!(l.prov.exchanges().is_empty());
    assert!(get(&l, Kind::PersistentVolume, None, "static-1").is_some());
}

#[tokio::test]
async fn restarted_agent_reconstructs_from_the_mount_table() {
    let l = lab().await;
    l.node.reconcile(&NodeTarget::Register).await.unwrap();
    provisioned(&l, "data", "fast", &["ReadWriteOnce"]).await;
    let p = l.kube.create(Kind::Pod, pod("web", "data", false)).unwrap();
    let uid = p["metadata"]["uid"].as_str().unwrap().to_string();
    assert_eq!(run_pod(&l, "web").await, Reconcile::Done);
    // The pod is force-deleted while the kubelet is down; a new agent starts.
    l.kube
        .delete_with_grace(Kind::Pod, Some("app"), "web", 0)
        .unwrap();
    let slot: KubeSlot = Arc::new(RwLock::new(l.kube.clone()));
    let fresh = NodeAgent::connect(
        NODE,
        &l._dir.path().join("csi.sock"),
        slot,
        l.kube.gate().clone(),
    )
    .await
    .unwrap();
    assert!(fresh.pods().is_empty());
    assert_eq!(fresh.reconstruct(&l.mounts.mounts()).unwrap(), 2);
    let orphans = fresh.pods();
    assert_eq!(orphans.len(), 1);
    assert_eq!(
        (orphans[0].namespace.as_str(), orphans[0].uid.as_str()),
        ("", uid.as_str())
    );
    assert_eq!(fresh.staged().len(), 1);
    let t = NodeTarget::Pod {
        namespace: String::new(),
        name: uid.clone(),
    };
    assert_eq!(fresh.reconcile(&t).await.unwrap(), Reconcile::Done);
    assert_eq!(
        rpcs(&fresh.exchanges()),
        ["NodeUnpublishVolume", "NodeUnstageVolume"]
    );
    assert!(l.mounts.mounts().is_empty());
    assert!(fresh.pods().is_empty());
}

// ---------------------------------------------------------------- snapshotter

async fn snapshotter(l: &Lab) -> Snapshotter {
    Snapshotter::connect(&l.sock, l.slot.clone(), l.gate.clone())
        .await
        .unwrap()
}

fn snapshot_class(l: &Lab, name: &str, policy: &str, default: bool, params: Value) {
    let annotations = if default {
        json!({ DEFAULT_CLASS: "true" })
    } else {
        json!({})
    };
    l.kube
        .create(
            Kind::VolumeSnapshotClass,
            json!({"apiVersion": SNAPSHOT_API_VERSION, "kind": "VolumeSnapshotClass",
                "metadata": {"name": name, "annotations": annotations},
                "driver": DRIVER, "deletionPolicy": policy, "parameters": params}),
        )
        .unwrap();
}

/// A VolumeSnapshot of PVC `claim` in `app`, of class `class` (None: the default).
fn take_snapshot(l: &Lab, name: &str, claim: &str, class: Option<&str>) {
    let mut spec = json!({"source": {"persistentVolumeClaimName": claim}});
    if let Some(c) = class {
        spec["volumeSnapshotClassName"] = json!(c);
    }
    l.kube
        .create(
            Kind::VolumeSnapshot,
            json!({"apiVersion": SNAPSHOT_API_VERSION, "kind": "VolumeSnapshot",
                "metadata": {"name": name, "namespace": "app"}, "spec": spec}),
        )
        .unwrap();
}

fn vs_t(name: &str) -> SnapshotTarget {
    SnapshotTarget::Snapshot {
        namespace: "app".into(),
        name: name.into(),
    }
}

/// Reconcile every snapshotter target until a round changes nothing; the
/// last round's answers.
async fn settle(s: &Snapshotter) -> Vec<Reconcile> {
    let mut last = Vec::new();
    for _ in 0..4 {
        last.clear();
        for t in s.targets().unwrap() {
            last.push(s.reconcile(&t).await.unwrap());
        }
    }
    last
}

/// The CSI names of the CreateSnapshot calls and the ids of the DeleteSnapshot calls.
fn snapshot_calls(s: &Snapshotter) -> (Vec<String>, Vec<String>) {
    let mut created = Vec::new();
    let mut deleted = Vec::new();
    for e in s.exchanges() {
        match &e.request {
            DriverRequest::CreateSnapshot(r) => created.push(r.name.clone()),
            DriverRequest::DeleteSnapshot(r) => deleted.push(r.snapshot_id.clone()),
            _ => {}
        }
    }
    (created, deleted)
}

#[tokio::test]
async fn retain_keeps_the_snapshot_and_content_delete_removes_them() {
    let l = lab().await;
    provisioned(&l, "data", "fast", &["ReadWriteOnce"]).await;
    snapshot_class(&l, "keep", "Retain", false, json!({}));
    snapshot_class(&l, "drop", "Delete", false, json!({}));
    let s = snapshotter(&l).await;
    take_snapshot(&l, "kept", "data", Some("keep"));
    take_snapshot(&l, "gone", "data", Some("drop"));
    assert!(settle(&s).await.iter().all(|r| *r == Reconcile::Done));
    assert_eq!(st(&l.driver).snapshots.len(), 2);
    let kept_content = get(&l, Kind::VolumeSnapshot, Some("app"), "kept").unwrap()["status"]
        ["boundVolumeSnapshotContentName"]
        .as_str()
        .unwrap()
        .to_string();
    let kept_handle = get(&l, Kind::VolumeSnapshotContent, None, &kept_content).unwrap()["status"]
        ["snapshotHandle"]
        .clone();

    l.kube
        .delete(Kind::VolumeSnapshot, Some("app"), "kept")
        .unwrap();
    l.kube
        .delete(Kind::VolumeSnapshot, Some("app"), "gone")
        .unwrap();
    assert!(settle(&s).await.iter().all(|r| *r == Reconcile::Done));

    assert!(get(&l, Kind::VolumeSnapshot, Some("app"), "kept").is_none());
    assert!(get(&l, Kind::VolumeSnapshot, Some("app"), "gone").is_none());
    // Retain: the content stays with its handle, and the driver's snapshot with it.
    let c = get(&l, Kind::VolumeSnapshotContent, None, &kept_content).expect("content kept");
    assert_eq!(c["status"]["snapshotHandle"], kept_handle);
    let left: Vec<String> = st(&l.driver)
        .snapshots
        .values()
        .map(|(id, _)| id.clone())
        .collect();
    assert_eq!(left, [kept_handle.as_str().unwrap().to_string()]);
    // Delete: exactly one DeleteSnapshot, of the other snapshot's handle.
    let (_, deleted) = snapshot_calls(&s);
    assert_eq!(deleted.len(), 1);
    assert_ne!(Some(deleted[0].as_str()), kept_handle.as_str());
    assert_eq!(
        l.kube
            .list(Kind::VolumeSnapshotContent, None)
            .unwrap()
            .len(),
        1
    );
}

#[tokio::test]
async fn pre_provisioned_content_is_bound_without_create_snapshot() {
    let l = lab().await;
    let s = snapshotter(&l).await;
    l.kube
        .create(
            Kind::VolumeSnapshotContent,
            json!({"apiVersion": SNAPSHOT_API_VERSION, "kind": "VolumeSnapshotContent",
                "metadata": {"name": "imported"},
                "spec": {"driver": DRIVER, "deletionPolicy": "Retain",
                    "source": {"snapshotHandle": "snap-from-elsewhere"},
                    "volumeSnapshotRef": {"namespace": "app", "name": "old"}}}),
        )
        .unwrap();
    l.kube
        .create(
            Kind::VolumeSnapshot,
            json!({"apiVersion": SNAPSHOT_API_VERSION, "kind": "VolumeSnapshot",
                "metadata": {"name": "old", "namespace": "app"},
                "spec": {"source": {"volumeSnapshotContentName": "imported"}}}),
        )
        .unwrap();
    assert!(settle(&s).await.iter().all(|r| *r == Reconcile::Done));
    let vs = get(&l, Kind::VolumeSnapshot, Some("app"), "old").unwrap();
    assert_eq!(vs["status"]["boundVolumeSnapshotContentName"], "imported");
    assert_eq!(vs["status"]["readyToUse"], true);
    let c = get(&l, Kind::VolumeSnapshotContent, None, "imported").unwrap();
    assert_eq!(c["status"]["snapshotHandle"], "snap-from-elsewhere");
    assert_eq!(c["spec"]["volumeSnapshotRef"]["uid"], vs["metadata"]["uid"]);
    assert_eq!(
        snapshot_calls(&s),
        (vec![], vec![]),
        "no driver call for an imported snapshot"
    );
    assert!(st(&l.driver).snapshots.is_empty());
}

#[tokio::test]
async fn the_one_default_class_is_used_and_written_back() {
    let l = lab().await;
    provisioned(&l, "data", "fast", &["ReadWriteOnce"]).await;
    snapshot_class(&l, "other", "Delete", false, json!({"tier": "cold"}));
    snapshot_class(
        &l,
        "standard",
        "Delete",
        true,
        json!({"tier": "gold", "csi.storage.k8s.io/snapshotter-secret-name": "s"}),
    );
    let s = snapshotter(&l).await;
    take_snapshot(&l, "s1", "data", None);
    assert_eq!(s.reconcile(&vs_t("s1")).await.unwrap(), Reconcile::Done);
    let vs = get(&l, Kind::VolumeSnapshot, Some("app"), "s1").unwrap();
    assert_eq!(vs["spec"]["volumeSnapshotClassName"], "standard");
    let params: Vec<BTreeMap<String, String>> = s
        .exchanges()
        .iter()
        .filter_map(|e| match &e.request {
            DriverRequest::CreateSnapshot(r) => Some(r.parameters.clone().into_iter().collect()),
            _ => None,
        })
        .collect();
    // The class's parameters, without the ones the sidecar keeps for itself.
    assert_eq!(
        params,
        [BTreeMap::from([("tier".to_string(), "gold".to_string())])]
    );

    // A second default makes the choice ambiguous: an error, and no call.
    snapshot_class(&l, "also-default", "Delete", true, json!({}));
    take_snapshot(&l, "s2", "data", None);
    assert!(matches!(
        s.reconcile(&vs_t("s2")).await.unwrap(),
        Reconcile::Requeue { .. }
    ));
    let vs = get(&l, Kind::VolumeSnapshot, Some("app"), "s2").unwrap();
    let msg = vs["status"]["error"]["message"].as_str().unwrap();
    assert!(msg.contains("2 default VolumeSnapshotClasses"), "{msg}");
    assert_eq!(snapshot_calls(&s).0.len(), 1);
}

#[tokio::test]
async fn create_snapshot_errors_land_in_status_and_retry_with_backoff_and_the_same_name() {
    let l = lab().await;
    provisioned(&l, "data", "fast", &["ReadWriteOnce"]).await;
    snapshot_class(&l, "standard", "Delete", true, json!({}));
    st(&l.driver).fail_snapshots = 2;
    let s = snapshotter(&l).await;
    take_snapshot(&l, "s1", "data", None);
    let mut delays = Vec::new();
    for _ in 0..2 {
        match s.reconcile(&vs_t("s1")).await.unwrap() {
            Reconcile::Requeue { after, reason } => {
                assert!(reason.contains("INTERNAL"), "{reason}");
                delays.push(after.as_secs());
            }
            Reconcile::Done => panic!("the driver failed; cannot be done"),
        }
        let vs = get(&l, Kind::VolumeSnapshot, Some("app"), "s1").unwrap();
        assert_eq!(vs["status"]["readyToUse"], false);
        let msg = vs["status"]["error"]["message"].as_str().unwrap();
        assert!(msg.contains("snapshot quota exceeded"), "{msg}");
    }
    // Back-off on the virtual clock: 1 s, then doubled.
    assert_eq!(delays, [1, 2]);
    assert_eq!(s.reconcile(&vs_t("s1")).await.unwrap(), Reconcile::Done);
    let vs = get(&l, Kind::VolumeSnapshot, Some("app"), "s1").unwrap();
    assert_eq!(vs["status"]["readyToUse"], true);
    assert!(vs["status"]["error"].is_null(), "{}", vs["status"]);
    let (names, _) = snapshot_calls(&s);
    let want = format!("snapshot-{}", vs["metadata"]["uid"].as_str().unwrap());
    assert_eq!(
        names,
        [want.clone(), want.clone(), want],
        "every retry carries the same name"
    );
    assert_eq!(st(&l.driver).snapshots.len(), 1);
}
