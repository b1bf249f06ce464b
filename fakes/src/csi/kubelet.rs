//! Fake kubelet volume manager for one node (plus the attach/detach
//! controller's VolumeAttachment create/delete for that node): registers the
//! driver (NodeGetInfo → CSINode), and for each pod on the node that uses a
//! PVC of the driver waits for the attach, stages and publishes the volume,
//! and tears it down again when the pod goes.
//!
//! Matched from kubelet's CSI volume plugin (pkg/volume/csi) and volume manager:
//! - VolumeAttachment name `csi-<sha256(volumeHandle + driver + nodeName)>`, as
//!   the attach/detach controller names it; the kubelet waits for
//!   `status.attached` and passes `attachmentMetadata` as publish_context;
//! - staging path `/var/lib/kubelet/plugins/kubernetes.io/csi/<driver>/<sha256(volumeHandle)>/globalmount`,
//!   only when the driver has STAGE_UNSTAGE_VOLUME; target path
//!   `/var/lib/kubelet/pods/<pod uid>/volumes/kubernetes.io~csi/<pv name>/mount`;
//! - capability from the PV's first access mode; publish `readonly` from the
//!   pod's `persistentVolumeClaim.readOnly` or the PV's `spec.csi.readOnly`;
//! - a failed stage stops there: no publish, the pod stays Pending; a
//!   transient failure (the driver may have half-done it) marks the stage
//!   uncertain so teardown still calls NodeUnstageVolume, as kubelet does
//!   since 1.19; the same for publish;
//! - teardown: NodeUnpublishVolume, then NodeUnstageVolume once no other pod
//!   on the node uses the volume, then the VolumeAttachment is deleted, then
//!   a gracefully deleting pod is removed (grace period 0);
//! - back-off 500ms doubling to 2m2s per pod.
//!
//! After a restart the agent's record (in memory) is rebuilt from the node's
//! mount table with [`NodeAgent::reconstruct`], as kubelet reconstructs.
//!
//! Not matched: fsGroup, SELinux, subPath, inline
//! ephemeral volumes, CSIDriver `attachRequired`/`podInfoOnMount` (attach is
//! always required, no pod info is sent), volume limits and topology.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::{Arc, Mutex};

use drivelab_proto::csi;
use drivelab_proto::csi::node_client::NodeClient;
use serde_json::{json, Value};

use super::{
    deleting, kube_of, lock, pv_capability, sha256_hex, str_at, string_map, Backoff, CsiError,
    DriverConn, DriverReply, DriverRequest, Exchange, Failures, KubeSlot, Reconcile, Step,
};
use crate::gate::Gate;
use crate::history::Component;
use crate::json::bool_at;
use crate::kube::{Kind, KubeError, KubeFake};

/// A pod's CSI volumes of this driver: each PV (shared with the API's copy)
/// and whether the pod mounts it read-only.
type PodVolumes = Vec<(Arc<Value>, bool)>;

/// What the node agent reconciles.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum NodeTarget {
    /// Register the driver on this node (NodeGetInfo → CSINode).
    Register,
    /// A pod (namespace, name): set up its volumes, or tear them down if it
    /// is gone, deleting, or no longer on this node.
    Pod { namespace: String, name: String },
}

impl std::fmt::Display for NodeTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NodeTarget::Register => write!(f, "csinode registration"),
            NodeTarget::Pod { namespace, name } => write!(f, "pod {namespace}/{name}"),
        }
    }
}

/// How far an operation got, as kubelet tracks it.
#[derive(Copy, Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub enum OpState {
    /// The driver answered OK.
    Done,
    /// The driver failed transiently: it may have done it; teardown must undo it.
    Uncertain,
}

/// One of a pod's CSI volumes as the agent set it up.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct PodVolume {
    /// The PV name.
    pub pv: String,
    /// `spec.csi.volumeHandle`.
    pub volume_handle: String,
    /// The VolumeAttachment the agent waits on.
    pub attachment: String,
    /// The NodePublishVolume target path.
    pub target_path: String,
    /// Read-only publish.
    pub read_only: bool,
    /// Publish state (`None` = not published).
    pub published: Option<OpState>,
}

/// A pod the agent knows about.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct PodView {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// The uid its paths are under.
    pub uid: String,
    /// Its CSI volumes.
    pub volumes: Vec<PodVolume>,
    /// All volumes published and the pod marked Running.
    pub running: bool,
}

/// A staged volume on this node.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct StagedVolume {
    /// `spec.csi.volumeHandle`.
    pub volume_handle: String,
    /// The staging path.
    pub staging_path: String,
    /// Stage state.
    pub state: OpState,
}

#[derive(Default)]
struct NodeState {
    /// (namespace, name) → pod.
    pods: BTreeMap<(String, String), PodView>,
    /// volume handle → staging.
    staged: BTreeMap<String, StagedVolume>,
    node_id: Option<String>,
}

/// The fake kubelet volume manager for one node.
pub struct NodeAgent {
    node: String,
    kube_slot: KubeSlot,
    conn: DriverConn,
    driver_name: String,
    stages: bool,
    state: Mutex<super::Generational<NodeState>>,
    failures: Failures<NodeTarget>,
}

/// `/var/lib/kubelet/plugins/kubernetes.io/csi/<driver>/<sha256(volumeHandle)>/globalmount`
pub fn staging_path(driver: &str, volume_handle: &str) -> String {
    format!(
        "/var/lib/kubelet/plugins/kubernetes.io/csi/{driver}/{}/globalmount",
        sha256_hex(volume_handle)
    )
}

/// `/var/lib/kubelet/pods/<pod uid>/volumes/kubernetes.io~csi/<pv name>/mount`
pub fn target_path(pod_uid: &str, pv_name: &str) -> String {
    format!("/var/lib/kubelet/pods/{pod_uid}/volumes/kubernetes.io~csi/{pv_name}/mount")
}

/// `csi-<sha256(volumeHandle + driver + nodeName)>`, the attach/detach controller's name.
pub fn attachment_name(volume_handle: &str, driver: &str, node: &str) -> String {
    format!(
        "csi-{}",
        sha256_hex(&format!("{volume_handle}{driver}{node}"))
    )
}

impl NodeAgent {
    /// Connect to the driver's node socket on `node` and learn its name and
    /// whether it stages (NodeGetCapabilities).
    pub async fn connect(
        node: &str,
        socket: &Path,
        kube: KubeSlot,
        gate: Gate,
    ) -> Result<Self, CsiError> {
        let conn = DriverConn::connect(socket, Component::Kubelet, gate).await?;
        let driver_name = conn.plugin_name().await?;
        let caps = conn
            .startup(super::NODE_GET_CAPABILITIES, |ch| async move {
                NodeClient::new(ch)
                    .node_get_capabilities(csi::NodeGetCapabilitiesRequest {})
                    .await
            })
            .await?;
        use csi::node_service_capability::{rpc::Type, Type as Cap};
        let stages = caps.capabilities.iter().any(|c| {
            matches!(&c.r#type, Some(Cap::Rpc(r)) if r.r#type == Type::StageUnstageVolume as i32)
        });
        Ok(Self {
            node: node.to_string(),
            kube_slot: kube,
            conn,
            driver_name,
            stages,
            state: Mutex::default(),
            failures: Failures::new(Backoff::KUBELET),
        })
    }

    /// The node this agent runs on.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// The driver's name.
    pub fn driver_name(&self) -> &str {
        &self.driver_name
    }

    /// The node id NodeGetInfo returned, once registered.
    pub fn node_id(&self) -> Option<String> {
        lock(&self.state).node_id.clone()
    }

    /// Re-dial the driver (after it was restarted on the same socket).
    pub async fn reconnect(&self) -> Result<(), CsiError> {
        // A restarted plugin registers again.
        lock(&self.state).node_id = None;
        self.conn.reconnect().await
    }

    /// Set the deadline of every later call to the driver (the scenario's `call_timeout`).
    pub fn set_call_timeout(&self, d: std::time::Duration) {
        self.conn.set_call_timeout(d);
    }

    /// Every exchange so far, in order.
    pub fn exchanges(&self) -> Vec<Exchange> {
        self.conn.exchanges()
    }

    /// How many exchanges it has made.
    pub fn exchange_count(&self) -> usize {
        self.conn.exchange_count()
    }

    /// Send a recorded request again, unchanged (the lab's `retry` steps).
    pub async fn replay(&self, request: DriverRequest) -> Exchange {
        self.conn.send(request).await
    }

    /// The pods the agent has set up (or is setting up), sorted.
    pub fn pods(&self) -> Vec<PodView> {
        lock(&self.state).pods.values().cloned().collect()
    }

    /// Moves on whenever the agent's own state changes (see
    /// [`super::Generational`]): a pod target whose reads are unchanged is
    /// passed over only while this is what it was.
    pub fn generation(&self) -> u64 {
        lock(&self.state).generation()
    }

    /// The (namespace, name) of each pod the agent knows, sorted.
    pub fn pod_keys(&self) -> Vec<(String, String)> {
        lock(&self.state).pods.keys().cloned().collect()
    }

    /// The volumes staged (or uncertainly staged) on this node.
    pub fn staged(&self) -> Vec<StagedVolume> {
        lock(&self.state).staged.values().cloned().collect()
    }

    fn kube(&self) -> KubeFake {
        kube_of(&self.kube_slot)
    }

    /// Reconcile one target once.
    pub async fn reconcile(&self, target: &NodeTarget) -> Result<Reconcile, CsiError> {
        let step = match target {
            NodeTarget::Register => self.register().await?,
            NodeTarget::Pod { namespace, name } => self.reconcile_pod(namespace, name).await?,
        };
        Ok(self.failures.settle(target, step))
    }

    async fn register(&self) -> Result<Step, CsiError> {
        // Kubelet registers a plugin once per plugin start, not on every resync.
        let registered = lock(&self.state).node_id.is_some() && {
            let csinode = self.kube().get_shared(Kind::CsiNode, None, &self.node)?;
            csinode
                .as_deref()
                .and_then(|n| crate::json::at(n, &["spec", "drivers"]))
                .and_then(Value::as_array)
                .is_some_and(|d| {
                    d.iter()
                        .any(|x| crate::json::str_ref(x, &["name"]) == self.driver_name)
                })
        };
        if registered {
            return Ok(Step::Done);
        }
        let ex = self.conn.send(DriverRequest::NodeGetInfo).await;
        let info = match ex.reply {
            DriverReply::Info(i) if !i.node_id.is_empty() => i,
            DriverReply::Info(_) => {
                return Ok(Step::Retry(
                    "NodeGetInfo: driver returned an empty node_id".into(),
                ))
            }
            other => return Ok(Step::Retry(format!("NodeGetInfo: {}", other.describe()))),
        };
        let mut entry = json!({
            "name": self.driver_name,
            "nodeID": info.node_id,
            "topologyKeys": info
                .accessible_topology
                .as_ref()
                .map(|t| t.segments.keys().cloned().collect::<Vec<_>>())
                .unwrap_or_default(),
        });
        if info.max_volumes_per_node > 0 {
            entry["allocatable"] = json!({"count": info.max_volumes_per_node});
        }
        let kube = self.kube();
        match kube.get_shared(Kind::CsiNode, None, &self.node)? {
            None => {
                let obj = json!({
                    "apiVersion": "storage.k8s.io/v1",
                    "kind": "CSINode",
                    "metadata": {"name": self.node},
                    "spec": {"drivers": [entry]},
                });
                match kube.create(Kind::CsiNode, obj) {
                    Ok(_) => {}
                    Err(KubeError::AlreadyExists { .. }) => {
                        return Ok(Step::Retry("csinode created concurrently".into()))
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            Some(existing) => {
                let mut drivers: Vec<Value> = crate::json::at(&existing, &["spec", "drivers"])
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                drivers.retain(|d| str_at(d, &["name"]) != self.driver_name);
                drivers.push(entry);
                kube.merge_patch(
                    Kind::CsiNode,
                    None,
                    &self.node,
                    json!({"spec": {"drivers": drivers}}),
                )?;
            }
        }
        lock(&self.state).node_id = Some(info.node_id);
        Ok(Step::Done)
    }

    async fn reconcile_pod(&self, ns: &str, name: &str) -> Result<Step, CsiError> {
        let kube = self.kube();
        // An orphan found by reconstruction has no namespace: its pod is gone.
        let pod = if ns.is_empty() {
            None
        } else {
            kube.get_shared(Kind::Pod, Some(ns), name)?
        };
        let key = (ns.to_string(), name.to_string());
        let live = pod
            .as_ref()
            .filter(|p| !deleting(p) && str_at(p, &["spec", "nodeName"]) == self.node);
        let known_uid = lock(&self.state).pods.get(&key).map(|p| p.uid.clone());
        match live {
            Some(p)
                if known_uid
                    .as_deref()
                    .is_none_or(|u| u == str_at(p, &["metadata", "uid"])) =>
            {
                let p = p.clone();
                self.set_up(&kube, &key, &p).await
            }
            // A pod of the same name but another uid: the old one must go first.
            Some(p) => {
                let p = p.clone();
                match self.tear_down(&kube, &key, None).await? {
                    Step::Done => self.set_up(&kube, &key, &p).await,
                    retry => Ok(retry),
                }
            }
            None => self.tear_down(&kube, &key, pod.as_deref()).await,
        }
    }

    /// The pod's CSI volumes of this driver, or why not yet.
    fn pod_volumes(
        &self,
        kube: &KubeFake,
        ns: &str,
        pod: &Value,
    ) -> Result<Result<PodVolumes, String>, CsiError> {
        let mut out = Vec::new();
        let vols = crate::json::at(pod, &["spec", "volumes"])
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default();
        for v in vols {
            let claim = str_at(v, &["persistentVolumeClaim", "claimName"]);
            if claim.is_empty() {
                continue;
            }
            let Some(pvc) = kube.get_shared(Kind::PersistentVolumeClaim, Some(ns), &claim)? else {
                return Ok(Err(format!("persistentvolumeclaim {ns}/{claim} not found")));
            };
            let pv_name = str_at(&pvc, &["spec", "volumeName"]);
            if pv_name.is_empty() || str_at(&pvc, &["status", "phase"]) != "Bound" {
                return Ok(Err(format!(
                    "persistentvolumeclaim {ns}/{claim} is not bound"
                )));
            }
            let Some(pv) = kube.get_shared(Kind::PersistentVolume, None, &pv_name)? else {
                return Ok(Err(format!("persistentvolume {pv_name} not found")));
            };
            if str_at(&pv, &["spec", "csi", "driver"]) != self.driver_name {
                continue;
            }
            let ro = bool_at(v, &["persistentVolumeClaim", "readOnly"])
                || bool_at(&pv, &["spec", "csi", "readOnly"]);
            out.push((pv, ro));
        }
        Ok(Ok(out))
    }

    async fn set_up(
        &self,
        kube: &KubeFake,
        key: &(String, String),
        pod: &Value,
    ) -> Result<Step, CsiError> {
        let (ns, name) = key;
        let uid = str_at(pod, &["metadata", "uid"]);
        let vols = match self.pod_volumes(kube, ns, pod)? {
            Ok(v) => v,
            Err(why) => return Ok(Step::Retry(why)),
        };
        {
            let mut st = lock(&self.state);
            // Read first: a pod already known with these volumes changes nothing.
            let known = st.pods.get(key);
            let mut added: Vec<PodVolume> = Vec::new();
            for (pv, ro) in &vols {
                let pv_name = str_at(pv, &["metadata", "name"]);
                let mut had = known.into_iter().flat_map(|p| &p.volumes).chain(&added);
                if had.all(|v| v.pv != pv_name) {
                    let handle = str_at(pv, &["spec", "csi", "volumeHandle"]);
                    added.push(PodVolume {
                        attachment: attachment_name(&handle, &self.driver_name, &self.node),
                        volume_handle: handle,
                        target_path: target_path(&uid, &pv_name),
                        read_only: *ro,
                        published: None,
                        pv: pv_name,
                    });
                }
            }
            if known.is_none() || !added.is_empty() {
                let entry = st.pods.entry(key.clone()).or_insert_with(|| PodView {
                    namespace: ns.clone(),
                    name: name.clone(),
                    uid: uid.clone(),
                    volumes: Vec::new(),
                    running: false,
                });
                entry.volumes.extend(added);
            }
        }
        for (pv, ro) in &vols {
            let pv_name = str_at(pv, &["metadata", "name"]);
            let handle = str_at(pv, &["spec", "csi", "volumeHandle"]);
            let va_name = attachment_name(&handle, &self.driver_name, &self.node);
            // The attach/detach controller's part: ask for the attach.
            let va = match kube.get_shared(Kind::VolumeAttachment, None, &va_name)? {
                Some(va) => va,
                None => {
                    let obj = json!({
                        "apiVersion": "storage.k8s.io/v1",
                        "kind": "VolumeAttachment",
                        "metadata": {"name": va_name},
                        "spec": {
                            "attacher": self.driver_name,
                            "nodeName": self.node,
                            "source": {"persistentVolumeName": pv_name},
                        },
                    });
                    match kube.create(Kind::VolumeAttachment, obj) {
                        Ok(_) | Err(KubeError::AlreadyExists { .. }) => {}
                        Err(e) => return Err(e.into()),
                    }
                    return Ok(Step::Retry(format!(
                        "waiting for volumeattachment {va_name} to be attached"
                    )));
                }
            };
            if deleting(&va) || !bool_at(&va, &["status", "attached"]) {
                let err = str_at(&va, &["status", "attachError", "message"]);
                return Ok(Step::Retry(if err.is_empty() {
                    format!("waiting for volumeattachment {va_name} to be attached")
                } else {
                    format!("volumeattachment {va_name} not attached: {err}")
                }));
            }
            let publish_context: std::collections::HashMap<String, String> =
                string_map(&va, &["status", "attachmentMetadata"])
                    .into_iter()
                    .collect();
            let volume_context: std::collections::HashMap<String, String> =
                string_map(pv, &["spec", "csi", "volumeAttributes"])
                    .into_iter()
                    .collect();
            let cap = pv_capability(pv, true);
            let staging = staging_path(&self.driver_name, &handle);
            if self.stages {
                let staged = lock(&self.state).staged.get(&handle).map(|s| s.state);
                if staged != Some(OpState::Done) {
                    let ex = self
                        .conn
                        .send(DriverRequest::NodeStage(csi::NodeStageVolumeRequest {
                            volume_id: handle.clone(),
                            publish_context: publish_context.clone(),
                            staging_target_path: staging.clone(),
                            volume_capability: Some(cap.clone()),
                            secrets: Default::default(),
                            volume_context: volume_context.clone(),
                        }))
                        .await;
                    let mut st = lock(&self.state);
                    if ex.reply.is_ok() {
                        st.staged.insert(
                            handle.clone(),
                            StagedVolume {
                                volume_handle: handle.clone(),
                                staging_path: staging.clone(),
                                state: OpState::Done,
                            },
                        );
                    } else {
                        if ex.may_be_in_progress() {
                            st.staged.insert(
                                handle.clone(),
                                StagedVolume {
                                    volume_handle: handle.clone(),
                                    staging_path: staging.clone(),
                                    state: OpState::Uncertain,
                                },
                            );
                        }
                        return Ok(Step::Retry(format!(
                            "MountVolume.MountDevice failed for volume {pv_name:?}: NodeStageVolume: {}",
                            ex.reply.describe()
                        )));
                    }
                }
            }
            let published = lock(&self.state)
                .pods
                .get(key)
                .and_then(|p| p.volumes.iter().find(|v| v.pv == pv_name))
                .and_then(|v| v.published);
            if published == Some(OpState::Done) {
                continue;
            }
            let target = target_path(&uid, &pv_name);
            let ex = self
                .conn
                .send(DriverRequest::NodePublish(csi::NodePublishVolumeRequest {
                    volume_id: handle.clone(),
                    publish_context,
                    staging_target_path: if self.stages { staging } else { String::new() },
                    target_path: target,
                    volume_capability: Some(cap),
                    readonly: *ro,
                    secrets: Default::default(),
                    volume_context,
                }))
                .await;
            let state = if ex.reply.is_ok() {
                Some(OpState::Done)
            } else if ex.may_be_in_progress() {
                Some(OpState::Uncertain)
            } else {
                None
            };
            {
                let mut st = lock(&self.state);
                if let Some(v) = st
                    .pods
                    .get_mut(key)
                    .and_then(|p| p.volumes.iter_mut().find(|v| v.pv == pv_name))
                {
                    v.published = state;
                }
            }
            if !ex.reply.is_ok() {
                return Ok(Step::Retry(format!(
                    "MountVolume.SetUp failed for volume {pv_name:?}: NodePublishVolume: {}",
                    ex.reply.describe()
                )));
            }
        }
        let was_running = {
            let mut st = lock(&self.state);
            let was = st.pods.get(key).is_some_and(|p| p.running);
            if !was {
                if let Some(p) = st.pods.get_mut(key) {
                    p.running = true;
                }
            }
            was
        };
        if !was_running || str_at(pod, &["status", "phase"]) != "Running" {
            kube.merge_patch(
                Kind::Pod,
                Some(ns),
                name,
                json!({"status": {
                    "phase": "Running",
                    "conditions": [{"type": "Ready", "status": "True"}],
                }}),
            )?;
        }
        Ok(Step::Done)
    }

    async fn tear_down(
        &self,
        kube: &KubeFake,
        key: &(String, String),
        pod: Option<&Value>,
    ) -> Result<Step, CsiError> {
        let Some(view) = lock(&self.state).pods.get(key).cloned() else {
            return self.finish_delete(kube, key, pod);
        };
        for v in &view.volumes {
            if v.published.is_some() {
                let ex = self
                    .conn
                    .send(DriverRequest::NodeUnpublish(
                        csi::NodeUnpublishVolumeRequest {
                            volume_id: v.volume_handle.clone(),
                            target_path: v.target_path.clone(),
                        },
                    ))
                    .await;
                if !ex.reply.is_ok() {
                    return Ok(Step::Retry(format!(
                        "UnmountVolume.TearDown failed for volume {:?}: NodeUnpublishVolume: {}",
                        v.pv,
                        ex.reply.describe()
                    )));
                }
                let mut st = lock(&self.state);
                if let Some(pv) = st
                    .pods
                    .get_mut(key)
                    .and_then(|p| p.volumes.iter_mut().find(|x| x.pv == v.pv))
                {
                    pv.published = None;
                }
            }
            let others = lock(&self.state).pods.iter().any(|(k, p)| {
                k != key && p.volumes.iter().any(|x| x.volume_handle == v.volume_handle)
            });
            if others {
                continue;
            }
            let staged = lock(&self.state).staged.get(&v.volume_handle).cloned();
            if let Some(s) = staged {
                let ex = self
                    .conn
                    .send(DriverRequest::NodeUnstage(csi::NodeUnstageVolumeRequest {
                        volume_id: s.volume_handle.clone(),
                        staging_target_path: s.staging_path.clone(),
                    }))
                    .await;
                if !ex.reply.is_ok() {
                    return Ok(Step::Retry(format!(
                        "UnmountDevice failed for volume {:?}: NodeUnstageVolume: {}",
                        v.pv,
                        ex.reply.describe()
                    )));
                }
                lock(&self.state).staged.remove(&v.volume_handle);
            }
            // The attach/detach controller's part: unmounted everywhere here, detach.
            match kube.delete(Kind::VolumeAttachment, None, &v.attachment) {
                Ok(_) | Err(KubeError::NotFound { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        lock(&self.state).pods.remove(key);
        self.finish_delete(kube, key, pod)
    }

    /// Volumes are down: finish a graceful pod deletion.
    fn finish_delete(
        &self,
        kube: &KubeFake,
        key: &(String, String),
        pod: Option<&Value>,
    ) -> Result<Step, CsiError> {
        if let Some(p) = pod {
            if deleting(p) && str_at(p, &["spec", "nodeName"]) == self.node {
                match kube.delete_with_grace(Kind::Pod, Some(&key.0), &key.1, 0) {
                    Ok(_) | Err(KubeError::NotFound { .. }) => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
        Ok(Step::Done)
    }

    /// After a restart of the agent: rebuild what it had set up from the node's
    /// mount table, as kubelet reconstructs its volumes from the mounts it finds.
    /// Staging mounts are matched to this driver's PVs by their path; pod
    /// mounts by `pods/<uid>/volumes/kubernetes.io~csi/<pv>/mount`. A pod that
    /// no longer exists is kept as an orphan (namespace "", name = its uid) so a
    /// reconcile of it tears its volumes down. Returns how many mounts it took over.
    pub fn reconstruct(&self, mounts: &[super::mounts::MountView]) -> Result<usize, CsiError> {
        let kube = self.kube();
        let pvs: Vec<Value> = kube
            .list(Kind::PersistentVolume, None)?
            .into_iter()
            .filter(|pv| str_at(pv, &["spec", "csi", "driver"]) == self.driver_name)
            .collect();
        let pods = kube.list(Kind::Pod, None)?;
        let mut taken = 0;
        let mut st = lock(&self.state);
        for m in mounts {
            if let Some(pv) = pvs.iter().find(|pv| {
                staging_path(
                    &self.driver_name,
                    &str_at(pv, &["spec", "csi", "volumeHandle"]),
                ) == m.target
            }) {
                let handle = str_at(pv, &["spec", "csi", "volumeHandle"]);
                st.staged.insert(
                    handle.clone(),
                    StagedVolume {
                        volume_handle: handle,
                        staging_path: m.target.clone(),
                        state: OpState::Done,
                    },
                );
                taken += 1;
                continue;
            }
            let Some(rest) = m.target.strip_prefix("/var/lib/kubelet/pods/") else {
                continue;
            };
            let parts: Vec<&str> = rest.split('/').collect();
            let [uid, "volumes", "kubernetes.io~csi", pv_name, "mount"] = parts.as_slice() else {
                continue;
            };
            let Some(pv) = pvs
                .iter()
                .find(|pv| str_at(pv, &["metadata", "name"]) == *pv_name)
            else {
                continue;
            };
            let key = pods
                .iter()
                .find(|p| str_at(p, &["metadata", "uid"]) == *uid)
                .map(|p| {
                    (
                        str_at(p, &["metadata", "namespace"]),
                        str_at(p, &["metadata", "name"]),
                    )
                })
                .unwrap_or_else(|| (String::new(), uid.to_string()));
            let handle = str_at(pv, &["spec", "csi", "volumeHandle"]);
            let entry = st.pods.entry(key.clone()).or_insert_with(|| PodView {
                namespace: key.0.clone(),
                name: key.1.clone(),
                uid: uid.to_string(),
                volumes: Vec::new(),
                running: false,
            });
            if entry.volumes.iter().all(|v| v.pv != *pv_name) {
                entry.volumes.push(PodVolume {
                    pv: pv_name.to_string(),
                    attachment: attachment_name(&handle, &self.driver_name, &self.node),
                    volume_handle: handle,
                    target_path: m.target.clone(),
                    read_only: m.read_only,
                    published: Some(OpState::Done),
                });
            }
            taken += 1;
        }
        Ok(taken)
    }

    /// Volume handles in use by pods on this node (published or being set up).
    pub fn volumes_in_use(&self) -> BTreeSet<String> {
        lock(&self.state)
            .pods
            .values()
            .flat_map(|p| p.volumes.iter().map(|v| v.volume_handle.clone()))
            .collect()
    }
}
