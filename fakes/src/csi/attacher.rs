//! Fake external-attacher: a VolumeAttachment for the driver becomes a
//! ControllerPublishVolume call to the node's CSI node id, and its deletion a
//! ControllerUnpublishVolume call, with the real sidecar's finalizers and
//! status fields.
//!
//! Matched from kubernetes-csi/external-attacher (v4):
//! - only VolumeAttachments whose `spec.attacher` is the driver's name;
//! - finalizer `external-attacher/<sanitised driver>` on the VolumeAttachment before the
//!   attach, and on the PV while it is attached (removed when the PV is being
//!   deleted and no VolumeAttachment uses it);
//! - node_id from the CSINode of `spec.nodeName` (`spec.drivers[].nodeID`, as
//!   the kubelet registered it); for a detach, a node without that entry counts
//!   as detached (the node is gone);
//! - volume capability from the PV (access modes folded: RWX → multi-node
//!   multi-writer, ROX+RWO → multi-node single-writer, ROX → multi-node
//!   reader-only, RWOP → single-node single-writer, else single-node writer),
//!   `readonly` from `spec.csi.readOnly`, volume_context = `volumeAttributes`;
//! - success: `status.attached = true`, `status.attachmentMetadata` =
//!   publish_context; failure: `status.attachError {time, message}`; detach
//!   failure: `status.detachError`; an attached VolumeAttachment is left alone;
//! - a driver without PUBLISH_UNPUBLISH_VOLUME is attached without a call;
//! - per-item exponential back-off 1s doubling to 5m.
//!
//! Not matched: inline volumes, secrets, the VolumeAttachment annotations
//! used for migration, ListVolumes-based reconciliation, leader election.

use std::path::Path;

use drivelab_proto::csi;
use drivelab_proto::csi::controller_client::ControllerClient;
use serde_json::{json, Value};

use super::{
    add_finalizer, deleting, has_finalizer, kube_of, pv_capability, remove_finalizer, str_at,
    string_map, timestamp, Backoff, CsiError, DriverConn, DriverReply, DriverRequest, Exchange,
    Failures, KubeSlot, Reconcile, Step,
};
use crate::gate::Gate;
use crate::history::Component;
use crate::json::{bool_at, str_ref};
use crate::kube::{Kind, KubeFake};

/// What the attacher reconciles.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AttachTarget {
    /// A VolumeAttachment (cluster-scoped).
    Attachment { name: String },
    /// A PV, to drop the attacher's finalizer once it is deleted and unused.
    Volume { name: String },
}

impl std::fmt::Display for AttachTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AttachTarget::Attachment { name } => write!(f, "volumeattachment {name}"),
            AttachTarget::Volume { name } => write!(f, "pv {name} (attacher)"),
        }
    }
}

/// The fake external-attacher for one driver.
pub struct Attacher {
    kube_slot: KubeSlot,
    conn: DriverConn,
    driver_name: String,
    finalizer: String,
    publishes: bool,
    failures: Failures<AttachTarget>,
}

impl Attacher {
    /// Connect to the driver's controller socket, learn its name and whether it
    /// implements ControllerPublish (ControllerGetCapabilities).
    pub async fn connect(socket: &Path, kube: KubeSlot, gate: Gate) -> Result<Self, CsiError> {
        let conn = DriverConn::connect(socket, Component::CsiAttacher, gate).await?;
        let driver_name = conn.plugin_name().await?;
        let caps = conn
            .startup(super::CONTROLLER_GET_CAPABILITIES, |ch| async move {
                ControllerClient::new(ch)
                    .controller_get_capabilities(csi::ControllerGetCapabilitiesRequest {})
                    .await
            })
            .await?;
        use csi::controller_service_capability::{rpc::Type, Type as Cap};
        let publishes = caps.capabilities.iter().any(|c| {
            matches!(&c.r#type, Some(Cap::Rpc(r)) if r.r#type == Type::PublishUnpublishVolume as i32)
        });
        Ok(Self {
            kube_slot: kube,
            conn,
            finalizer: finalizer_for(&driver_name),
            driver_name,
            publishes,
            failures: Failures::new(Backoff::ATTACHER),
        })
    }

    /// The driver's name (matched against `spec.attacher`).
    pub fn driver_name(&self) -> &str {
        &self.driver_name
    }

    /// The finalizer this attacher uses (`external-attacher/<driver>`).
    pub fn finalizer(&self) -> &str {
        &self.finalizer
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
    pub async fn reconcile(&self, target: &AttachTarget) -> Result<Reconcile, CsiError> {
        let step = match target {
            AttachTarget::Attachment { name } => self.reconcile_attachment(name).await?,
            AttachTarget::Volume { name } => self.reconcile_volume(name)?,
        };
        Ok(self.failures.settle(target, step))
    }

    fn node_id(&self, kube: &KubeFake, node: &str) -> Result<Option<String>, CsiError> {
        let Some(csinode) = kube.get_shared(Kind::CsiNode, None, node)? else {
            return Ok(None);
        };
        Ok(crate::json::at(&csinode, &["spec", "drivers"])
            .and_then(Value::as_array)
            .and_then(|ds| {
                ds.iter()
                    .find(|d| str_at(d, &["name"]) == self.driver_name)
                    .map(|d| str_at(d, &["nodeID"]))
            })
            .filter(|id| !id.is_empty()))
    }

    async fn reconcile_attachment(&self, name: &str) -> Result<Step, CsiError> {
        let kube = self.kube();
        let Some(va) = kube.get_shared(Kind::VolumeAttachment, None, name)? else {
            return Ok(Step::Done);
        };
        if str_at(&va, &["spec", "attacher"]) != self.driver_name {
            return Ok(Step::Done);
        }
        let node = str_at(&va, &["spec", "nodeName"]);
        let pv_name = str_at(&va, &["spec", "source", "persistentVolumeName"]);
        if deleting(&va) {
            return self.detach(&kube, name, &va, &node, &pv_name).await;
        }
        if bool_at(&va, &["status", "attached"]) {
            return Ok(Step::Done);
        }
        let fail = |kube: &KubeFake, message: String| -> Result<Step, CsiError> {
            kube.merge_patch(
                Kind::VolumeAttachment,
                None,
                name,
                json!({"status": {"attachError": {"time": timestamp(self.conn.gate()), "message": message}}}),
            )?;
            Ok(Step::Retry(message))
        };
        add_finalizer(&kube, Kind::VolumeAttachment, None, &va, &self.finalizer)?;
        let Some(pv) = kube.get_shared(Kind::PersistentVolume, None, &pv_name)? else {
            return fail(&kube, format!("persistentvolume {pv_name:?} not found"));
        };
        if !deleting(&pv) {
            add_finalizer(&kube, Kind::PersistentVolume, None, &pv, &self.finalizer)?;
        }
        let Some(node_id) = self.node_id(&kube, &node)? else {
            return fail(
                &kube,
                format!(
                    "node {node:?} has no CSINode entry for driver {}",
                    self.driver_name
                ),
            );
        };
        let publish_context = if self.publishes {
            let request = csi::ControllerPublishVolumeRequest {
                volume_id: str_at(&pv, &["spec", "csi", "volumeHandle"]),
                node_id,
                volume_capability: Some(pv_capability(&pv, false)),
                readonly: bool_at(&pv, &["spec", "csi", "readOnly"]),
                secrets: Default::default(),
                volume_context: string_map(&pv, &["spec", "csi", "volumeAttributes"])
                    .into_iter()
                    .collect(),
            };
            let ex = self
                .conn
                .send(DriverRequest::ControllerPublish(request))
                .await;
            // Every error is retried (retry::requeues); only OK attaches.
            if ex.requeues() {
                return fail(
                    &kube,
                    format!(
                        "rpc error: ControllerPublishVolume: {}",
                        ex.reply.describe()
                    ),
                );
            }
            match ex.reply {
                DriverReply::Published { publish_context } => publish_context,
                _ => Default::default(),
            }
        } else {
            Default::default()
        };
        kube.merge_patch(
            Kind::VolumeAttachment,
            None,
            name,
            json!({"status": {"attached": true, "attachmentMetadata": publish_context, "attachError": null}}),
        )?;
        Ok(Step::Done)
    }

    async fn detach(
        &self,
        kube: &KubeFake,
        name: &str,
        va: &Value,
        node: &str,
        pv_name: &str,
    ) -> Result<Step, CsiError> {
        if !has_finalizer(va, &self.finalizer) {
            return Ok(Step::Done);
        }
        let pv = kube.get_shared(Kind::PersistentVolume, None, pv_name)?;
        let node_id = self.node_id(kube, node)?;
        match (pv, node_id) {
            (Some(pv), Some(node_id)) if self.publishes => {
                let request = csi::ControllerUnpublishVolumeRequest {
                    volume_id: str_at(&pv, &["spec", "csi", "volumeHandle"]),
                    node_id,
                    secrets: Default::default(),
                };
                let ex = self
                    .conn
                    .send(DriverRequest::ControllerUnpublish(request))
                    .await;
                if ex.requeues() {
                    let message = format!(
                        "rpc error: ControllerUnpublishVolume: {}",
                        ex.reply.describe()
                    );
                    kube.merge_patch(
                        Kind::VolumeAttachment,
                        None,
                        name,
                        json!({"status": {"detachError": {"time": timestamp(self.conn.gate()), "message": message}}}),
                    )?;
                    return Ok(Step::Retry(message));
                }
            }
            // No PV (its finalizer should have prevented that) or no node entry
            // (the node is gone): nothing to call, treat as detached.
            _ => {}
        }
        kube.merge_patch(
            Kind::VolumeAttachment,
            None,
            name,
            json!({"status": {"attached": false, "attachmentMetadata": null, "detachError": null}}),
        )?;
        remove_finalizer(kube, Kind::VolumeAttachment, None, name, &self.finalizer)?;
        // The PV may be waiting for this detach to finish its own deletion.
        self.reconcile_volume(pv_name)
    }

    fn reconcile_volume(&self, pv_name: &str) -> Result<Step, CsiError> {
        let kube = self.kube();
        // Looked at only (every resync visits every PV): shared, not copied.
        let Some(pv) = kube.get_shared(Kind::PersistentVolume, None, pv_name)? else {
            return Ok(Step::Done);
        };
        if !deleting(&pv) || !has_finalizer(&pv, &self.finalizer) {
            return Ok(Step::Done);
        }
        let in_use = kube
            .list_shared(Kind::VolumeAttachment, None)?
            .iter()
            .any(|va| {
                str_ref(va, &["spec", "source", "persistentVolumeName"]) == pv_name
                    && str_ref(va, &["spec", "attacher"]) == self.driver_name
                    && has_finalizer(va, &self.finalizer)
            });
        if in_use {
            return Ok(Step::Retry(format!(
                "pv {pv_name} is still attached somewhere"
            )));
        }
        remove_finalizer(
            &kube,
            Kind::PersistentVolume,
            None,
            pv_name,
            &self.finalizer,
        )?;
        Ok(Step::Done)
    }
}

/// `external-attacher/<driver>` with every character outside `[a-zA-Z0-9-]`
/// made `-` and an `X` after a trailing `-`, as the real sidecar sanitises it
/// (`ebs.csi.aws.com` → `external-attacher/ebs-csi-aws-com`).
pub fn finalizer_for(driver: &str) -> String {
    let mut name: String = driver
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    if name.is_empty() || name.ends_with('-') {
        name.push('X');
    }
    format!("external-attacher/{name}")
}

#[cfg(test)]
mod tests {
    #[test]
    fn finalizer_name_is_sanitised() {
        assert_eq!(
            super::finalizer_for("ebs.csi.aws.com"),
            "external-attacher/ebs-csi-aws-com"
        );
        assert_eq!(super::finalizer_for("a/b."), "external-attacher/a-b-X");
    }
}
