//! Fake external-snapshotter: the snapshot-controller and the csi-snapshotter
//! sidecar collapsed into one reconcile loop (as the other fake sidecars are):
//! a VolumeSnapshot of a PVC becomes a VolumeSnapshotContent and a
//! CreateSnapshot call; deleting it becomes a DeleteSnapshot call (or not).
//!
//! Matched from kubernetes-csi/external-snapshotter (v8):
//! - content name `snapcontent-<VolumeSnapshot uid>`; CSI snapshot name
//!   `snapshot-<VolumeSnapshot uid>` (`--snapshot-name-prefix` default, no
//!   uid truncation), so every retry after a lost reply carries the same name;
//! - the class from `spec.volumeSnapshotClassName`, else the one class of the
//!   driver annotated `snapshot.storage.kubernetes.io/is-default-class: "true"`
//!   (written back into the VolumeSnapshot); its `parameters` minus the
//!   `csi.storage.k8s.io/` keys are the CreateSnapshot parameters; no secrets;
//! - the source volume handle from the PVC's bound PV (`spec.csi.volumeHandle`);
//!   an unbound PVC is an error in `status.error`, retried;
//! - annotation `snapshot.storage.kubernetes.io/volumesnapshot-being-created`
//!   while a CreateSnapshot may have taken effect without a final answer: a
//!   content deleted meanwhile asks again (same name) to learn the handle
//!   before DeleteSnapshot, so a lost reply leaks no IaaS snapshot;
//! - content `status`: snapshotHandle, readyToUse, restoreSize (bytes),
//!   creationTime (ns), error{message,time}; VolumeSnapshot `status`:
//!   boundVolumeSnapshotContentName, readyToUse, restoreSize (quantity),
//!   creationTime (RFC 3339), error copied from the content;
//!   readyToUse false → CreateSnapshot again (same name) after back-off;
//! - finalizers `volumesnapshot-as-source-protection` and
//!   `volumesnapshot-bound-protection` on the VolumeSnapshot,
//!   `volumesnapshotcontent-bound-protection` on the content; deletion with
//!   deletionPolicy Delete: the content is marked `volumesnapshot-being-deleted`
//!   and deleted, DeleteSnapshot(handle) until OK (a driver must answer OK for a
//!   snapshot that is already gone), then the finalizers go; Retain: the
//!   content and the IaaS snapshot stay;
//! - pre-provisioned snapshots (`spec.source.volumeSnapshotContentName`, content
//!   with `spec.source.snapshotHandle`): bound both ways, no driver call;
//! - per-item exponential back-off 1s doubling to 5m on the virtual clock.
//!
//! Not matched: ListSnapshots for pre-provisioned contents (readyToUse is set
//! at once), group snapshots, `--extra-create-metadata`, events, webhooks.

use std::path::Path;

use drivelab_proto::csi;
use serde_json::{json, Value};

use super::{
    deleting, has_finalizer, kube_of, remove_finalizer, str_at, string_map, strings, timestamp,
    Backoff, CsiError, DriverConn, DriverReply, DriverRequest, Exchange, Failures, KubeSlot,
    Reconcile, Step,
};
use crate::gate::Gate;
use crate::history::Component;
use crate::kube::{format_quantity, Kind, KubeError, KubeFake, SNAPSHOT_API_VERSION};

/// Finalizer the snapshot-controller puts on a VolumeSnapshot it binds.
pub const VS_BOUND_FINALIZER: &str =
    "snapshot.storage.kubernetes.io/volumesnapshot-bound-protection";
/// Finalizer guarding a VolumeSnapshot used as a restore source.
pub const VS_SOURCE_FINALIZER: &str =
    "snapshot.storage.kubernetes.io/volumesnapshot-as-source-protection";
/// Finalizer on a bound VolumeSnapshotContent.
pub const CONTENT_FINALIZER: &str =
    "snapshot.storage.kubernetes.io/volumesnapshotcontent-bound-protection";
/// Annotation on a content whose CreateSnapshot has no final answer yet.
pub const BEING_CREATED: &str = "snapshot.storage.kubernetes.io/volumesnapshot-being-created";
/// Annotation on a content whose VolumeSnapshot is being deleted.
pub const BEING_DELETED: &str = "snapshot.storage.kubernetes.io/volumesnapshot-being-deleted";
/// Annotation marking the default VolumeSnapshotClass of a driver.
pub const DEFAULT_CLASS: &str = "snapshot.storage.kubernetes.io/is-default-class";
/// Parameter prefix the sidecar consumes itself (secrets); never sent to the driver.
const RESERVED_PREFIX: &str = "csi.storage.k8s.io/";

/// What the snapshotter reconciles.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SnapshotTarget {
    /// A VolumeSnapshot (binding, creation, deletion).
    Snapshot { namespace: String, name: String },
    /// A VolumeSnapshotContent (deletion, orphaned contents).
    Content { name: String },
}

impl std::fmt::Display for SnapshotTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SnapshotTarget::Snapshot { namespace, name } => {
                write!(f, "volumesnapshot {namespace}/{name}")
            }
            SnapshotTarget::Content { name } => write!(f, "volumesnapshotcontent {name}"),
        }
    }
}

/// The fake external-snapshotter for one driver.
pub struct Snapshotter {
    kube_slot: KubeSlot,
    conn: DriverConn,
    driver_name: String,
    failures: Failures<SnapshotTarget>,
}

impl Snapshotter {
    /// Connect to the driver's controller socket and learn its name (GetPluginInfo).
    pub async fn connect(socket: &Path, kube: KubeSlot, gate: Gate) -> Result<Self, CsiError> {
        let conn = DriverConn::connect(socket, Component::CsiSnapshotter, gate).await?;
        let driver_name = conn.plugin_name().await?;
        Ok(Self {
            kube_slot: kube,
            conn,
            driver_name,
            failures: Failures::new(Backoff::SNAPSHOTTER),
        })
    }

    /// Re-dial the driver (after it was restarted on the same socket).
    pub async fn reconnect(&self) -> Result<(), CsiError> {
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

    fn kube(&self) -> KubeFake {
        kube_of(&self.kube_slot)
    }

    /// Every target a resync would visit now, sorted.
    pub fn targets(&self) -> Result<Vec<SnapshotTarget>, CsiError> {
        let kube = self.kube();
        let mut out = Vec::new();
        for vs in kube.list_shared(Kind::VolumeSnapshot, None)? {
            out.push(SnapshotTarget::Snapshot {
                namespace: str_at(&vs, &["metadata", "namespace"]),
                name: str_at(&vs, &["metadata", "name"]),
            });
        }
        for c in kube.list_shared(Kind::VolumeSnapshotContent, None)? {
            out.push(SnapshotTarget::Content {
                name: str_at(&c, &["metadata", "name"]),
            });
        }
        out.sort();
        Ok(out)
    }

    /// Reconcile one object once.
    pub async fn reconcile(&self, target: &SnapshotTarget) -> Result<Reconcile, CsiError> {
        let step = match target {
            SnapshotTarget::Snapshot { namespace, name } => {
                self.reconcile_snapshot(namespace, name).await?
            }
            SnapshotTarget::Content { name } => self.reconcile_content(name).await?,
        };
        Ok(self.failures.settle(target, step))
    }

    async fn reconcile_snapshot(&self, ns: &str, name: &str) -> Result<Step, CsiError> {
        let kube = self.kube();
        let Some(vs) = kube.get(Kind::VolumeSnapshot, Some(ns), name)? else {
            return Ok(Step::Done);
        };
        let uid = str_at(&vs, &["metadata", "uid"]);
        let static_content = str_at(&vs, &["spec", "source", "volumeSnapshotContentName"]);
        let content_name = if static_content.is_empty() {
            format!("snapcontent-{uid}")
        } else {
            static_content.clone()
        };
        if deleting(&vs) {
            return self.delete_snapshot(&kube, &vs, &content_name).await;
        }
        self.protect_snapshot(&kube, &vs)?;
        let content = match kube.get(Kind::VolumeSnapshotContent, None, &content_name)? {
            Some(c) => c,
            None if !static_content.is_empty() => {
                return self.snapshot_error(
                    &kube,
                    &vs,
                    format!("VolumeSnapshotContent {content_name} not found"),
                );
            }
            None => match self.new_content(&kube, &vs, &content_name)? {
                Ok(Some(c)) => c,
                // Another driver's snapshot.
                Ok(None) => return Ok(Step::Done),
                Err(why) => return self.snapshot_error(&kube, &vs, why),
            },
        };
        if !static_content.is_empty() {
            let ref_ns = str_at(&content, &["spec", "volumeSnapshotRef", "namespace"]);
            let ref_name = str_at(&content, &["spec", "volumeSnapshotRef", "name"]);
            let ref_uid = str_at(&content, &["spec", "volumeSnapshotRef", "uid"]);
            if ref_ns != ns || ref_name != name || !(ref_uid.is_empty() || ref_uid == uid) {
                return self.snapshot_error(
                    &kube,
                    &vs,
                    format!("VolumeSnapshotContent {content_name} is bound to another snapshot"),
                );
            }
            if ref_uid.is_empty() {
                kube.merge_patch(
                    Kind::VolumeSnapshotContent,
                    None,
                    &content_name,
                    json!({"metadata": {"finalizers": [CONTENT_FINALIZER]},
                        "spec": {"volumeSnapshotRef": {"uid": uid}}}),
                )?;
            }
        }
        let step = self.sync_content(&kube, &content_name).await?;
        self.sync_status(&kube, ns, name, &content_name)?;
        Ok(step)
    }

    /// Both VolumeSnapshot finalizers, once.
    fn protect_snapshot(&self, kube: &KubeFake, vs: &Value) -> Result<(), CsiError> {
        let mut list = strings(vs, &["metadata", "finalizers"]);
        let before = list.len();
        for f in [VS_SOURCE_FINALIZER, VS_BOUND_FINALIZER] {
            if !list.iter().any(|x| x == f) {
                list.push(f.to_string());
            }
        }
        if list.len() != before {
            kube.merge_patch(
                Kind::VolumeSnapshot,
                Some(&str_at(vs, &["metadata", "namespace"])),
                &str_at(vs, &["metadata", "name"]),
                json!({"metadata": {"finalizers": list}}),
            )?;
        }
        Ok(())
    }

    /// The VolumeSnapshotClass of `vs`: named, or the driver's one default
    /// (written back into the VolumeSnapshot as the controller does).
    fn class_of(&self, kube: &KubeFake, vs: &Value) -> Result<Result<Value, String>, CsiError> {
        let named = str_at(vs, &["spec", "volumeSnapshotClassName"]);
        if !named.is_empty() {
            return Ok(kube
                .get(Kind::VolumeSnapshotClass, None, &named)?
                .ok_or_else(|| format!("VolumeSnapshotClass {named} not found")));
        }
        let defaults: Vec<Value> = kube
            .list(Kind::VolumeSnapshotClass, None)?
            .into_iter()
            .filter(|c| {
                str_at(c, &["driver"]) == self.driver_name
                    && str_at(c, &["metadata", "annotations", DEFAULT_CLASS]) == "true"
            })
            .collect();
        let [class] = defaults.as_slice() else {
            return Ok(Err(format!(
                "{} default VolumeSnapshotClasses for driver {}; name one",
                defaults.len(),
                self.driver_name
            )));
        };
        kube.merge_patch(
            Kind::VolumeSnapshot,
            Some(&str_at(vs, &["metadata", "namespace"])),
            &str_at(vs, &["metadata", "name"]),
            json!({"spec": {"volumeSnapshotClassName": str_at(class, &["metadata", "name"])}}),
        )?;
        Ok(Ok(class.clone()))
    }

    /// Create the content of a dynamic snapshot; `Ok(None)` when the class is
    /// another driver's, `Err(why)` for what goes into `status.error`.
    fn new_content(
        &self,
        kube: &KubeFake,
        vs: &Value,
        content_name: &str,
    ) -> Result<Result<Option<Value>, String>, CsiError> {
        let ns = str_at(vs, &["metadata", "namespace"]);
        let class = match self.class_of(kube, vs)? {
            Ok(c) => c,
            Err(why) => return Ok(Err(why)),
        };
        if str_at(&class, &["driver"]) != self.driver_name {
            return Ok(Ok(None));
        }
        let claim = str_at(vs, &["spec", "source", "persistentVolumeClaimName"]);
        let Some(pvc) = kube.get(Kind::PersistentVolumeClaim, Some(&ns), &claim)? else {
            return Ok(Err(format!("PersistentVolumeClaim {ns}/{claim} not found")));
        };
        let pv_name = str_at(&pvc, &["spec", "volumeName"]);
        let pv = if pv_name.is_empty() {
            None
        } else {
            kube.get(Kind::PersistentVolume, None, &pv_name)?
        };
        let Some(pv) = pv.filter(|_| str_at(&pvc, &["status", "phase"]) == "Bound") else {
            return Ok(Err(format!(
                "PersistentVolumeClaim {ns}/{claim} is not bound to a volume yet"
            )));
        };
        let handle = str_at(&pv, &["spec", "csi", "volumeHandle"]);
        if handle.is_empty() || str_at(&pv, &["spec", "csi", "driver"]) != self.driver_name {
            return Ok(Err(format!(
                "the volume of PersistentVolumeClaim {ns}/{claim} is not a {} volume",
                self.driver_name
            )));
        }
        let content = json!({
            "apiVersion": SNAPSHOT_API_VERSION,
            "kind": "VolumeSnapshotContent",
            "metadata": {"name": content_name, "finalizers": [CONTENT_FINALIZER]},
            "spec": {
                "volumeSnapshotRef": {
                    "kind": "VolumeSnapshot",
                    "apiVersion": SNAPSHOT_API_VERSION,
                    "namespace": ns,
                    "name": str_at(vs, &["metadata", "name"]),
                    "uid": str_at(vs, &["metadata", "uid"]),
                    "resourceVersion": str_at(vs, &["metadata", "resourceVersion"]),
                },
                "source": {"volumeHandle": handle},
                "driver": self.driver_name,
                "deletionPolicy": str_at(&class, &["deletionPolicy"]),
                "volumeSnapshotClassName": str_at(&class, &["metadata", "name"]),
                "sourceVolumeMode": str_at(&pv, &["spec", "volumeMode"]),
            },
        });
        match kube.create(Kind::VolumeSnapshotContent, content) {
            Ok(c) => Ok(Ok(Some(Value::clone(&c)))),
            Err(KubeError::AlreadyExists { .. }) => Ok(Ok(kube.get(
                Kind::VolumeSnapshotContent,
                None,
                content_name,
            )?)),
            Err(e) => Err(e.into()),
        }
    }

    fn snapshot_error(&self, kube: &KubeFake, vs: &Value, why: String) -> Result<Step, CsiError> {
        let ns = str_at(vs, &["metadata", "namespace"]);
        let name = str_at(vs, &["metadata", "name"]);
        kube.merge_patch(
            Kind::VolumeSnapshot,
            Some(&ns),
            &name,
            json!({"status": {"readyToUse": false,
                "error": {"message": why, "time": timestamp(self.conn.gate())}}}),
        )?;
        Ok(Step::Retry(why))
    }

    /// The csi-snapshotter's part on a live content: CreateSnapshot until it
    /// answers a ready snapshot; pre-provisioned contents are ready as they are.
    async fn sync_content(&self, kube: &KubeFake, name: &str) -> Result<Step, CsiError> {
        let Some(c) = kube.get(Kind::VolumeSnapshotContent, None, name)? else {
            return Ok(Step::Done);
        };
        if str_at(&c, &["spec", "driver"]) != self.driver_name {
            return Ok(Step::Done);
        }
        let ready = crate::json::at(&c, &["status", "readyToUse"]) == Some(&json!(true));
        if ready && !str_at(&c, &["status", "snapshotHandle"]).is_empty() {
            return Ok(Step::Done);
        }
        let pre = str_at(&c, &["spec", "source", "snapshotHandle"]);
        if !pre.is_empty() {
            kube.merge_patch(
                Kind::VolumeSnapshotContent,
                None,
                name,
                json!({"status": {"snapshotHandle": pre, "readyToUse": true}}),
            )?;
            return Ok(Step::Done);
        }
        Ok(match self.create_snapshot(kube, &c).await? {
            Ok(true) => Step::Done,
            Ok(false) => Step::Retry(format!("snapshot of content {name} is not ready yet")),
            Err(why) => Step::Retry(why),
        })
    }

    /// CreateSnapshot for a dynamic content; `Ok(ready)` or the failure.
    async fn create_snapshot(
        &self,
        kube: &KubeFake,
        c: &Value,
    ) -> Result<Result<bool, String>, CsiError> {
        let name = str_at(c, &["metadata", "name"]);
        let class = str_at(c, &["spec", "volumeSnapshotClassName"]);
        let params = match kube.get(Kind::VolumeSnapshotClass, None, &class)? {
            Some(cl) => string_map(&cl, &["parameters"]),
            None if class.is_empty() => Default::default(),
            None => return Ok(Err(format!("VolumeSnapshotClass {class} not found"))),
        };
        if str_at(c, &["metadata", "annotations", BEING_CREATED]).is_empty() {
            kube.merge_patch(
                Kind::VolumeSnapshotContent,
                None,
                &name,
                json!({"metadata": {"annotations": {BEING_CREATED: "yes"}}}),
            )?;
        }
        let request = csi::CreateSnapshotRequest {
            source_volume_id: str_at(c, &["spec", "source", "volumeHandle"]),
            name: format!(
                "snapshot-{}",
                str_at(c, &["spec", "volumeSnapshotRef", "uid"])
            ),
            secrets: Default::default(),
            parameters: params
                .into_iter()
                .filter(|(k, _)| !k.starts_with(RESERVED_PREFIX))
                .collect(),
        };
        let ex = self.conn.send(DriverRequest::CreateSnapshot(request)).await;
        if ex.requeues() {
            let why = format!("CreateSnapshot: {}", ex.reply.describe());
            // Only a final error proves the driver made nothing (retry::may_be_in_progress).
            self.content_error(kube, &name, &why, !ex.may_be_in_progress())?;
            return Ok(Err(why));
        }
        let snap = match ex.reply {
            DriverReply::Snapshot(Some(s)) if !s.snapshot_id.is_empty() => s,
            _ => {
                let why = "CreateSnapshot: driver returned no snapshot id".to_string();
                self.content_error(kube, &name, &why, true)?;
                return Ok(Err(why));
            }
        };
        let created_ns = snap.creation_time.as_ref().map_or(0, |t| {
            t.seconds.saturating_mul(1_000_000_000) + i64::from(t.nanos)
        });
        kube.merge_patch(
            Kind::VolumeSnapshotContent,
            None,
            &name,
            json!({
                "metadata": {"annotations": {BEING_CREATED: null}},
                "status": {
                    "snapshotHandle": snap.snapshot_id,
                    "readyToUse": snap.ready_to_use,
                    "restoreSize": snap.size_bytes,
                    "creationTime": created_ns,
                    "error": null,
                },
            }),
        )?;
        Ok(Ok(snap.ready_to_use))
    }

    fn content_error(
        &self,
        kube: &KubeFake,
        name: &str,
        why: &str,
        settled: bool,
    ) -> Result<(), CsiError> {
        let mut patch = json!({"status": {"readyToUse": false,
            "error": {"message": why, "time": timestamp(self.conn.gate())}}});
        if settled {
            patch["metadata"] = json!({"annotations": {BEING_CREATED: null}});
        }
        match kube.merge_patch(Kind::VolumeSnapshotContent, None, name, patch) {
            Ok(_) | Err(KubeError::NotFound { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// VolumeSnapshot status from its content's.
    fn sync_status(
        &self,
        kube: &KubeFake,
        ns: &str,
        name: &str,
        content_name: &str,
    ) -> Result<(), CsiError> {
        let Some(c) = kube.get(Kind::VolumeSnapshotContent, None, content_name)? else {
            return Ok(());
        };
        let st = c.get("status").cloned().unwrap_or(Value::Null);
        let mut status = json!({
            "boundVolumeSnapshotContentName": content_name,
            "readyToUse": st.get("readyToUse").and_then(Value::as_bool).unwrap_or(false),
            "error": st.get("error").cloned().unwrap_or(Value::Null),
        });
        if let Some(bytes) = st.get("restoreSize").and_then(Value::as_u64) {
            status["restoreSize"] = json!(format_quantity(bytes));
        }
        if let Some(ns_time) = st.get("creationTime").and_then(Value::as_i64) {
            status["creationTime"] = json!(rfc3339(ns_time));
        }
        kube.merge_patch(
            Kind::VolumeSnapshot,
            Some(ns),
            name,
            json!({ "status": status }),
        )?;
        Ok(())
    }

    /// A VolumeSnapshot being deleted: its content first (Delete policy), then
    /// its finalizers.
    async fn delete_snapshot(
        &self,
        kube: &KubeFake,
        vs: &Value,
        content_name: &str,
    ) -> Result<Step, CsiError> {
        let ns = str_at(vs, &["metadata", "namespace"]);
        let name = str_at(vs, &["metadata", "name"]);
        if let Some(c) = kube.get(Kind::VolumeSnapshotContent, None, content_name)? {
            let ours = str_at(&c, &["spec", "volumeSnapshotRef", "uid"])
                == str_at(vs, &["metadata", "uid"]);
            if ours && str_at(&c, &["spec", "deletionPolicy"]) == "Delete" {
                if !deleting(&c) {
                    kube.merge_patch(
                        Kind::VolumeSnapshotContent,
                        None,
                        content_name,
                        json!({"metadata": {"annotations": {BEING_DELETED: "yes"}}}),
                    )?;
                    kube.delete(Kind::VolumeSnapshotContent, None, content_name)?;
                }
                if let Step::Retry(why) = self.finish_content(kube, content_name).await? {
                    return Ok(Step::Retry(why));
                }
            }
        }
        for f in [VS_SOURCE_FINALIZER, VS_BOUND_FINALIZER] {
            remove_finalizer(kube, Kind::VolumeSnapshot, Some(&ns), &name, f)?;
        }
        Ok(Step::Done)
    }

    async fn reconcile_content(&self, name: &str) -> Result<Step, CsiError> {
        let kube = self.kube();
        let Some(c) = kube.get(Kind::VolumeSnapshotContent, None, name)? else {
            return Ok(Step::Done);
        };
        if str_at(&c, &["spec", "driver"]) != self.driver_name {
            return Ok(Step::Done);
        }
        if deleting(&c) {
            return self.finish_content(&kube, name).await;
        }
        let ref_uid = str_at(&c, &["spec", "volumeSnapshotRef", "uid"]);
        let vs = kube.get(
            Kind::VolumeSnapshot,
            Some(&str_at(&c, &["spec", "volumeSnapshotRef", "namespace"])),
            &str_at(&c, &["spec", "volumeSnapshotRef", "name"]),
        )?;
        let orphaned =
            !ref_uid.is_empty() && !vs.is_some_and(|v| str_at(&v, &["metadata", "uid"]) == ref_uid);
        if !orphaned {
            // Its VolumeSnapshot's reconcile creates and binds it.
            return Ok(Step::Done);
        }
        // The snapshot-controller: a content whose VolumeSnapshot is gone is
        // deleted (Delete) or let go (Retain).
        if str_at(&c, &["spec", "deletionPolicy"]) == "Delete" {
            kube.delete(Kind::VolumeSnapshotContent, None, name)?;
            return self.finish_content(&kube, name).await;
        }
        remove_finalizer(
            &kube,
            Kind::VolumeSnapshotContent,
            None,
            name,
            CONTENT_FINALIZER,
        )?;
        Ok(Step::Done)
    }

    /// A content marked for deletion: DeleteSnapshot (Delete policy) until OK,
    /// then its finalizer goes and with it the object.
    async fn finish_content(&self, kube: &KubeFake, name: &str) -> Result<Step, CsiError> {
        let Some(mut c) = kube.get(Kind::VolumeSnapshotContent, None, name)? else {
            return Ok(Step::Done);
        };
        if !has_finalizer(&c, CONTENT_FINALIZER) {
            return Ok(Step::Done);
        }
        if str_at(&c, &["spec", "deletionPolicy"]) == "Delete" {
            if !str_at(&c, &["metadata", "annotations", BEING_CREATED]).is_empty() {
                // A CreateSnapshot may have taken effect: ask again (same name)
                // for the handle, or the IaaS snapshot would leak.
                if let Err(why) = self.create_snapshot(kube, &c).await? {
                    return Ok(Step::Retry(why));
                }
                c = kube
                    .get(Kind::VolumeSnapshotContent, None, name)?
                    .unwrap_or(c);
            }
            let handle = Some(str_at(&c, &["status", "snapshotHandle"]))
                .filter(|h| !h.is_empty())
                .unwrap_or_else(|| str_at(&c, &["spec", "source", "snapshotHandle"]));
            if !handle.is_empty() {
                let ex = self
                    .conn
                    .send(DriverRequest::DeleteSnapshot(csi::DeleteSnapshotRequest {
                        snapshot_id: handle,
                        secrets: Default::default(),
                    }))
                    .await;
                if ex.requeues() {
                    let why = format!("DeleteSnapshot: {}", ex.reply.describe());
                    self.content_error(kube, name, &why, false)?;
                    return Ok(Step::Retry(why));
                }
            }
        }
        remove_finalizer(
            kube,
            Kind::VolumeSnapshotContent,
            None,
            name,
            CONTENT_FINALIZER,
        )?;
        Ok(Step::Done)
    }
}

/// Nanoseconds since the Unix epoch as RFC 3339 (seconds precision, as
/// metav1.Time serialises).
fn rfc3339(ns: i64) -> String {
    let fmt = time::macros::format_description!("[year]-[month]-[day]T[hour]:[minute]:[second]Z");
    time::OffsetDateTime::from_unix_timestamp(ns.div_euclid(1_000_000_000))
        .ok()
        .and_then(|t| t.format(&fmt).ok())
        .unwrap_or_else(|| "1970-01-01T00:00:00Z".to_string())
}

/// A pre-provisioned snapshot as the snapshot-controller leaves it once bound:
/// a VolumeSnapshotContent `snapcontent-<ns>-<name>` with
/// `spec.source.snapshotHandle = handle`, ready, and the VolumeSnapshot
/// `ns/name` naming it, ready. For tests that take snapshots themselves and
/// need the Kubernetes side without running the snapshotter.
pub fn pre_provisioned(
    kube: &KubeFake,
    driver: &str,
    ns: &str,
    name: &str,
    handle: &str,
) -> Result<(), KubeError> {
    let content = format!("snapcontent-{ns}-{name}");
    let vs = kube.create(
        Kind::VolumeSnapshot,
        json!({"apiVersion": SNAPSHOT_API_VERSION, "kind": "VolumeSnapshot",
            "metadata": {"name": name, "namespace": ns,
                "finalizers": [VS_SOURCE_FINALIZER, VS_BOUND_FINALIZER]},
            "spec": {"source": {"volumeSnapshotContentName": content}}}),
    )?;
    kube.create(
        Kind::VolumeSnapshotContent,
        json!({"apiVersion": SNAPSHOT_API_VERSION, "kind": "VolumeSnapshotContent",
            "metadata": {"name": content, "finalizers": [CONTENT_FINALIZER]},
            "spec": {"driver": driver, "deletionPolicy": "Retain",
                "source": {"snapshotHandle": handle},
                "volumeSnapshotRef": {"kind": "VolumeSnapshot", "apiVersion": SNAPSHOT_API_VERSION,
                    "namespace": ns, "name": name, "uid": str_at(&vs, &["metadata", "uid"])}},
            "status": {"snapshotHandle": handle, "readyToUse": true}}),
    )?;
    kube.merge_patch(
        Kind::VolumeSnapshot,
        Some(ns),
        name,
        json!({"status": {"boundVolumeSnapshotContentName": content, "readyToUse": true}}),
    )?;
    Ok(())
}
