//! Fake external-provisioner (with the PV controller's binding and release
//! steps): a PVC of a StorageClass whose provisioner is the driver becomes a
//! CreateVolume call and a bound PV; a released PV with reclaimPolicy Delete
//! becomes a DeleteVolume call and the PV's removal.
//!
//! Matched from kubernetes-csi/external-provisioner (v5) and
//! sig-storage-lib-external-provisioner:
//! - volume name `pvc-<PVC uid>` (the default `--volume-name-prefix`), so a
//!   retried CreateVolume after a lost reply carries the same name;
//! - capacity from `spec.resources.requests/limits.storage`; one volume
//!   capability per PVC access mode, block or mount by `volumeMode`, fs type
//!   from the `csi.storage.k8s.io/fstype` parameter, mount flags from the
//!   class's `mountOptions`; `csi.storage.k8s.io/*` keys are stripped from the
//!   parameters the driver sees;
//! - the PV: annotation `pv.kubernetes.io/provisioned-by`, reclaim policy from
//!   the class, `spec.csi` {driver, volumeHandle, fsType, volumeAttributes =
//!   volume_context + `storage.kubernetes.io/csiProvisionerIdentity`}, capacity
//!   from the reply (the request when the driver says 0), the claimRef, and the
//!   finalizer `external-provisioner.volume.kubernetes.io/finalizer` for Delete;
//! - an existing PV named `pvc-<uid>` is reused (no second CreateVolume);
//! - a PVC deleted while CreateVolume was still failing with a transient error
//!   is dropped without cleanup, as the real one does (the known leak of
//!   kubernetes-csi/external-provisioner#486); the lab's checks can see it;
//! - Delete: DeleteVolume(volumeHandle) until OK, then the finalizer goes and
//!   the PV is deleted; Retain: PV phase Released, no call;
//! - a PV deleted while still bound with reclaimPolicy Delete is cleaned up the
//!   same way (KEP-2644, honour reclaim policy);
//! - per-item exponential back-off 1s doubling to 5m, reset on success;
//! - the pvc-protection controller's part: a deleted PVC keeps its
//!   `kubernetes.io/pvc-protection` finalizer (put there by the API fake's
//!   admission) while a pod that is not finished uses it.
//!
//! Not matched: topology, secrets, data sources (clones/snapshots), capacity
//! tracking, WaitForFirstConsumer (treated as Immediate), events, leader election.

use std::path::Path;

use drivelab_proto::csi;
use serde_json::{json, Value};

use super::{
    add_finalizer, capability, deleting, has_finalizer, kube_of, remove_finalizer, str_at,
    string_map, strings, Backoff, CsiError, DriverConn, DriverReply, DriverRequest, Exchange,
    Failures, KubeSlot, Reconcile, Step,
};
use crate::gate::Gate;
use crate::history::Component;
use crate::json::str_ref;
use crate::kube::{format_quantity, parse_quantity, Kind, KubeError, KubeFake, PVC_PROTECTION};

/// Finalizer on PVs this provisioner will delete (reclaimPolicy Delete).
pub const PV_FINALIZER: &str = "external-provisioner.volume.kubernetes.io/finalizer";
/// Annotation naming the provisioner of a PV.
pub const PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";
/// Prefix of the StorageClass parameters the sidecar consumes itself.
pub const RESERVED_PREFIX: &str = "csi.storage.k8s.io/";
/// The parameter carrying the filesystem type.
pub const FSTYPE_PARAM: &str = "csi.storage.k8s.io/fstype";

/// What the provisioner reconciles.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ProvisionTarget {
    /// A PVC; if it is gone, the PVs bound to it are released.
    Claim { namespace: String, name: String },
    /// A PV (release, reclaim, deletion).
    Volume { name: String },
}

impl std::fmt::Display for ProvisionTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProvisionTarget::Claim { namespace, name } => write!(f, "pvc {namespace}/{name}"),
            ProvisionTarget::Volume { name } => write!(f, "pv {name}"),
        }
    }
}

/// The fake external-provisioner for one driver.
pub struct Provisioner {
    kube_slot: KubeSlot,
    conn: DriverConn,
    driver_name: String,
    failures: Failures<ProvisionTarget>,
}

impl Provisioner {
    /// Connect to the driver's controller socket and learn its name (GetPluginInfo).
    pub async fn connect(socket: &Path, kube: KubeSlot, gate: Gate) -> Result<Self, CsiError> {
        let conn = DriverConn::connect(socket, Component::CsiProvisioner, gate).await?;
        let driver_name = conn.plugin_name().await?;
        Ok(Self {
            kube_slot: kube,
            conn,
            driver_name,
            failures: Failures::new(Backoff::PROVISIONER),
        })
    }

    /// The driver's name (matched against `StorageClass.provisioner`).
    pub fn driver_name(&self) -> &str {
        &self.driver_name
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

    /// Send a recorded request again, unchanged (the lab's `retry` steps).
    pub async fn replay(&self, request: DriverRequest) -> Exchange {
        self.conn.send(request).await
    }

    fn kube(&self) -> KubeFake {
        kube_of(&self.kube_slot)
    }

    /// Reconcile one object once.
    pub async fn reconcile(&self, target: &ProvisionTarget) -> Result<Reconcile, CsiError> {
        let step = match target {
            ProvisionTarget::Claim { namespace, name } => {
                self.reconcile_claim(namespace, name).await?
            }
            ProvisionTarget::Volume { name } => self.reconcile_volume(name).await?,
        };
        Ok(self.failures.settle(target, step))
    }

    async fn reconcile_claim(&self, ns: &str, name: &str) -> Result<Step, CsiError> {
        let kube = self.kube();
        let mut pvc = kube.get_shared(Kind::PersistentVolumeClaim, Some(ns), name)?;
        if let Some(p) = pvc.as_ref().filter(|p| deleting(p)) {
            // The pvc-protection controller's part: the claim goes only once no pod uses it.
            if let Some(user) = self.pod_using(&kube, ns, name)? {
                return Ok(Step::Retry(format!(
                    "pvc {ns}/{name} is in use by pod {user}"
                )));
            }
            if has_finalizer(p, PVC_PROTECTION) {
                remove_finalizer(
                    &kube,
                    Kind::PersistentVolumeClaim,
                    Some(ns),
                    name,
                    PVC_PROTECTION,
                )?;
                pvc = kube.get_shared(Kind::PersistentVolumeClaim, Some(ns), name)?;
            }
        }
        let Some(pvc) = pvc else {
            // The claim is gone: whatever PV was bound to it is released.
            let mut pending = Vec::new();
            for pv in kube.volumes_claiming(ns, name)? {
                let pv_name = str_at(&pv, &["metadata", "name"]);
                if let Step::Retry(r) = self.reconcile_volume(&pv_name).await? {
                    pending.push(r);
                }
            }
            return Ok(if pending.is_empty() {
                Step::Done
            } else {
                Step::Retry(pending.join("; "))
            });
        };
        if deleting(&pvc) {
            return Ok(Step::Done);
        }
        let malformed = |what: &str| CsiError::Malformed {
            kind: "PersistentVolumeClaim",
            name: format!("{ns}/{name}"),
            what: what.to_string(),
        };
        let uid = str_at(&pvc, &["metadata", "uid"]);
        if uid.is_empty() {
            return Err(malformed("no metadata.uid"));
        }
        let bound_to = str_at(&pvc, &["spec", "volumeName"]);
        if !bound_to.is_empty() {
            if let Some(pv) = kube.get_shared(Kind::PersistentVolume, None, &bound_to)? {
                if str_at(&pvc, &["status", "phase"]) != "Bound" {
                    self.bind(&kube, &pvc, &pv)?;
                }
                // KEP-2644: bound PVs of this driver (static ones too) get the finalizer.
                if str_at(&pv, &["spec", "csi", "driver"]) == self.driver_name {
                    self.protect(&bound_to)?;
                }
            }
            return Ok(Step::Done);
        }
        let class_name = str_at(&pvc, &["spec", "storageClassName"]);
        if class_name.is_empty() {
            return Ok(Step::Done);
        }
        let Some(class) = kube.get_shared(Kind::StorageClass, None, &class_name)? else {
            return Ok(Step::Retry(format!("storageclass {class_name} not found")));
        };
        if str_at(&class, &["provisioner"]) != self.driver_name {
            return Ok(Step::Done);
        }
        let pv_name = format!("pvc-{uid}");
        // Provisioned before (the PVC update was lost): bind, do not create again.
        if let Some(pv) = kube.get_shared(Kind::PersistentVolume, None, &pv_name)? {
            self.bind(&kube, &pvc, &pv)?;
            return Ok(Step::Done);
        }
        let request = self.create_request(&pvc, &class, &pv_name);
        let ex = self
            .conn
            .send(DriverRequest::CreateVolume(request.clone()))
            .await;
        // Every error is retried, "final" or not (retry::requeues).
        if ex.requeues() {
            return Ok(Step::Retry(format!(
                "CreateVolume: {}",
                ex.reply.describe()
            )));
        }
        let volume = match ex.reply {
            DriverReply::Created(Some(v)) if !v.volume_id.is_empty() => v,
            _ => {
                return Ok(Step::Retry(
                    "CreateVolume: driver returned no volume id".into(),
                ))
            }
        };
        let pv = self.pv_object(&pvc, &class, &pv_name, &request, &volume);
        let pv = match kube.create(Kind::PersistentVolume, pv) {
            Ok(pv) => pv,
            Err(KubeError::AlreadyExists { .. }) => kube
                .get_shared(Kind::PersistentVolume, None, &pv_name)?
                .ok_or_else(|| malformed("PV vanished while binding"))?,
            Err(e) => return Err(e.into()),
        };
        self.bind(&kube, &pvc, &pv)?;
        Ok(Step::Done)
    }

    fn create_request(
        &self,
        pvc: &Value,
        class: &Value,
        pv_name: &str,
    ) -> csi::CreateVolumeRequest {
        let params = string_map(class, &["parameters"]);
        let fs_type = params.get(FSTYPE_PARAM).cloned().unwrap_or_default();
        let block = str_at(pvc, &["spec", "volumeMode"]) == "Block";
        let flags = strings(class, &["mountOptions"]);
        let bytes = |q: &str| {
            let text = str_at(pvc, &["spec", "resources", q, "storage"]);
            parse_quantity(&text)
                .and_then(|b| i64::try_from(b).ok())
                .unwrap_or(0)
        };
        let volume_capabilities = strings(pvc, &["spec", "accessModes"])
            .iter()
            .map(|m| capability(block, &fs_type, &flags, super::access_mode(m)))
            .collect();
        csi::CreateVolumeRequest {
            name: pv_name.to_string(),
            capacity_range: Some(csi::CapacityRange {
                required_bytes: bytes("requests"),
                limit_bytes: bytes("limits"),
            }),
            volume_capabilities,
            parameters: params
                .into_iter()
                .filter(|(k, _)| !k.starts_with(RESERVED_PREFIX))
                .collect(),
            ..Default::default()
        }
    }

    fn pv_object(
        &self,
        pvc: &Value,
        class: &Value,
        pv_name: &str,
        request: &csi::CreateVolumeRequest,
        volume: &csi::Volume,
    ) -> Value {
        let policy = Some(str_at(class, &["reclaimPolicy"]))
            .filter(|p| !p.is_empty())
            .unwrap_or_else(|| "Delete".into());
        let requested = request
            .capacity_range
            .as_ref()
            .map_or(0, |c| c.required_bytes);
        let bytes = if volume.capacity_bytes > 0 {
            volume.capacity_bytes
        } else {
            requested
        };
        let mut attributes: serde_json::Map<String, Value> = volume
            .volume_context
            .iter()
            .map(|(k, v)| (k.clone(), json!(v)))
            .collect();
        // The real sidecar stamps its start time and a random number here; ours is fixed.
        attributes.insert(
            "storage.kubernetes.io/csiProvisionerIdentity".into(),
            json!(format!("1735689600000-0-{}", self.driver_name)),
        );
        let fs_type = string_map(class, &["parameters"])
            .get(FSTYPE_PARAM)
            .cloned()
            .unwrap_or_default();
        let mut csi_source = json!({
            "driver": self.driver_name,
            "volumeHandle": volume.volume_id,
            "volumeAttributes": attributes,
        });
        if !fs_type.is_empty() {
            csi_source["fsType"] = json!(fs_type);
        }
        let finalizers: Vec<&str> = if policy == "Delete" {
            vec![PV_FINALIZER]
        } else {
            vec![]
        };
        json!({
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {
                "name": pv_name,
                "annotations": {PROVISIONED_BY: self.driver_name},
                "finalizers": finalizers,
            },
            "spec": {
                "capacity": {"storage": format_quantity(u64::try_from(bytes).unwrap_or(0))},
                "accessModes": pvc.pointer("/spec/accessModes").cloned().unwrap_or(json!([])),
                "persistentVolumeReclaimPolicy": policy,
                "storageClassName": str_at(pvc, &["spec", "storageClassName"]),
                "volumeMode": str_at(pvc, &["spec", "volumeMode"]),
                "mountOptions": strings(class, &["mountOptions"]),
                "claimRef": {
                    "kind": "PersistentVolumeClaim",
                    "apiVersion": "v1",
                    "namespace": str_at(pvc, &["metadata", "namespace"]),
                    "name": str_at(pvc, &["metadata", "name"]),
                    "uid": str_at(pvc, &["metadata", "uid"]),
                    "resourceVersion": str_at(pvc, &["metadata", "resourceVersion"]),
                },
                "csi": csi_source,
            },
        })
    }

    /// The PV controller's bind: PV Bound, PVC `volumeName` + Bound.
    fn bind(&self, kube: &KubeFake, pvc: &Value, pv: &Value) -> Result<(), CsiError> {
        let ns = str_at(pvc, &["metadata", "namespace"]);
        let name = str_at(pvc, &["metadata", "name"]);
        let pv_name = str_at(pv, &["metadata", "name"]);
        // The PV controller completes a pre-bound claimRef with the claim's uid.
        kube.merge_patch(
            Kind::PersistentVolume,
            None,
            &pv_name,
            json!({
                "spec": {"claimRef": {
                    "kind": "PersistentVolumeClaim",
                    "apiVersion": "v1",
                    "namespace": ns,
                    "name": name,
                    "uid": str_at(pvc, &["metadata", "uid"]),
                }},
                "status": {"phase": "Bound"},
            }),
        )?;
        kube.merge_patch(
            Kind::PersistentVolumeClaim,
            Some(&ns),
            &name,
            json!({
                "metadata": {"annotations": {
                    "pv.kubernetes.io/bind-completed": "yes",
                    "pv.kubernetes.io/bound-by-controller": "yes",
                    "volume.kubernetes.io/storage-provisioner": self.driver_name,
                }},
                "spec": {"volumeName": pv_name},
                "status": {
                    "phase": "Bound",
                    "accessModes": pv.pointer("/spec/accessModes").cloned().unwrap_or(json!([])),
                    "capacity": pv.pointer("/spec/capacity").cloned().unwrap_or(json!({})),
                },
            }),
        )?;
        Ok(())
    }

    /// Release, reclaim or finish deleting one PV.
    async fn reconcile_volume(&self, name: &str) -> Result<Step, CsiError> {
        let kube = self.kube();
        // Looked at only (every resync visits every PV): shared, not copied.
        let Some(pv) = kube.get_shared(Kind::PersistentVolume, None, name)? else {
            return Ok(Step::Done);
        };
        let ours = str_ref(&pv, &["metadata", "annotations", PROVISIONED_BY]) == self.driver_name
            || str_ref(&pv, &["spec", "csi", "driver"]) == self.driver_name;
        if !ours {
            return Ok(Step::Done);
        }
        let claim_ns = str_ref(&pv, &["spec", "claimRef", "namespace"]);
        let claim_name = str_ref(&pv, &["spec", "claimRef", "name"]);
        let claim_uid = str_ref(&pv, &["spec", "claimRef", "uid"]);
        let claim_alive = !claim_name.is_empty()
            && kube
                .get_shared(Kind::PersistentVolumeClaim, Some(claim_ns), claim_name)?
                // An empty uid is a pre-bound claimRef: any claim of that name is its claim.
                .is_some_and(|c| {
                    claim_uid.is_empty() || str_ref(&c, &["metadata", "uid"]) == claim_uid
                });
        let released = !claim_name.is_empty() && !claim_alive;
        if !released && !deleting(&pv) {
            return Ok(Step::Done);
        }
        if released && str_at(&pv, &["status", "phase"]) != "Released" {
            kube.merge_patch(
                Kind::PersistentVolume,
                None,
                name,
                json!({"status": {"phase": "Released"}}),
            )?;
        }
        let policy = str_at(&pv, &["spec", "persistentVolumeReclaimPolicy"]);
        if policy != "Delete" {
            // Retain: the PV stays Released and the volume is kept; no driver call.
            return Ok(Step::Done);
        }
        if deleting(&pv) && !has_finalizer(&pv, PV_FINALIZER) {
            return Ok(Step::Done);
        }
        let handle = str_at(&pv, &["spec", "csi", "volumeHandle"]);
        let ex = self
            .conn
            .send(DriverRequest::DeleteVolume(csi::DeleteVolumeRequest {
                volume_id: handle,
                secrets: Default::default(),
            }))
            .await;
        if ex.requeues() {
            return Ok(Step::Retry(format!(
                "DeleteVolume: {}",
                ex.reply.describe()
            )));
        }
        remove_finalizer(&kube, Kind::PersistentVolume, None, name, PV_FINALIZER)?;
        match kube.delete(Kind::PersistentVolume, None, name) {
            Ok(_) | Err(KubeError::NotFound { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        Ok(Step::Done)
    }

    /// A pod (not finished) in `ns` whose volumes use the claim, if any.
    fn pod_using(
        &self,
        kube: &KubeFake,
        ns: &str,
        claim: &str,
    ) -> Result<Option<String>, CsiError> {
        for pod in kube.list_shared(Kind::Pod, Some(ns))? {
            if matches!(
                str_at(&pod, &["status", "phase"]).as_str(),
                "Succeeded" | "Failed"
            ) {
                continue;
            }
            let uses = crate::json::at(&pod, &["spec", "volumes"])
                .and_then(Value::as_array)
                .is_some_and(|vs| {
                    vs.iter()
                        .any(|v| str_at(v, &["persistentVolumeClaim", "claimName"]) == claim)
                });
            if uses {
                return Ok(Some(str_at(&pod, &["metadata", "name"])));
            }
        }
        Ok(None)
    }

    /// Put the provisioner's finalizer on a PV of ours that lacks it (e.g. a
    /// statically created one bound with reclaimPolicy Delete).
    pub fn protect(&self, pv_name: &str) -> Result<(), CsiError> {
        let kube = self.kube();
        if let Some(pv) = kube.get_shared(Kind::PersistentVolume, None, pv_name)? {
            if !deleting(&pv) && str_at(&pv, &["spec", "persistentVolumeReclaimPolicy"]) == "Delete"
            {
                add_finalizer(&kube, Kind::PersistentVolume, None, &pv, PV_FINALIZER)?;
            }
        }
        Ok(())
    }
}
