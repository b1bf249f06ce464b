//! The CSI sidecars of one driver as one unit for the engine: one target
//! type, one `reconcile`, and the resync list (every object a watch would
//! deliver), so the engine can schedule them like the COSI sidecar's targets.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::attacher::{AttachTarget, Attacher};
use super::kubelet::{NodeAgent, NodeTarget};
use super::provisioner::{ProvisionTarget, Provisioner};
use super::snapshotter::{SnapshotTarget, Snapshotter};
use super::{kube_of, str_at, CsiError, KubeSlot, Reconcile};
use crate::kube::Kind;

/// Anything one of the sidecars reconciles.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CsiTarget {
    /// For the external-provisioner.
    Provision(ProvisionTarget),
    /// For the external-attacher.
    Attach(AttachTarget),
    /// For the node agent of `node`.
    Node { node: String, target: NodeTarget },
    /// For the external-snapshotter.
    Snapshot(SnapshotTarget),
}

impl std::fmt::Display for CsiTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CsiTarget::Provision(t) => write!(f, "csi-provisioner: {t}"),
            CsiTarget::Attach(t) => write!(f, "csi-attacher: {t}"),
            CsiTarget::Node { node, target } => write!(f, "kubelet {node}: {target}"),
            CsiTarget::Snapshot(t) => write!(f, "csi-snapshotter: {t}"),
        }
    }
}

/// Why a target could not be reconciled at all.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// No node agent runs on that node.
    #[error("no kubelet for node {0}")]
    NoSuchNode(String),
    /// A snapshot target, but no external-snapshotter runs.
    #[error("no external-snapshotter for {0}")]
    NoSnapshotter(SnapshotTarget),
    /// The sidecar failed (not a driver error; those are requeues).
    #[error(transparent)]
    Csi(#[from] CsiError),
}

/// The sidecars of one driver: one provisioner, one attacher, a node agent
/// per node, and an external-snapshotter when the lab serves snapshots.
pub struct CsiSidecars {
    /// The Kubernetes fake they all read and write.
    pub kube: KubeSlot,
    /// external-provisioner.
    pub provisioner: Arc<Provisioner>,
    /// external-attacher.
    pub attacher: Arc<Attacher>,
    /// Node agents by node name.
    pub nodes: BTreeMap<String, Arc<NodeAgent>>,
    /// external-snapshotter (with the snapshot-controller's part), if any.
    pub snapshotter: Option<Arc<Snapshotter>>,
}

impl CsiSidecars {
    /// Reconcile one target once with the sidecar it belongs to.
    pub async fn reconcile(&self, target: &CsiTarget) -> Result<Reconcile, ClusterError> {
        Ok(match target {
            CsiTarget::Provision(t) => self.provisioner.reconcile(t).await?,
            CsiTarget::Attach(t) => self.attacher.reconcile(t).await?,
            CsiTarget::Node { node, target } => {
                self.nodes
                    .get(node)
                    .ok_or_else(|| ClusterError::NoSuchNode(node.clone()))?
                    .reconcile(target)
                    .await?
            }
            CsiTarget::Snapshot(t) => {
                self.snapshotter
                    .as_ref()
                    .ok_or_else(|| ClusterError::NoSnapshotter(t.clone()))?
                    .reconcile(t)
                    .await?
            }
        })
    }

    /// How many driver calls the sidecars have made.
    pub fn exchange_count(&self) -> usize {
        self.provisioner.exchange_count()
            + self.attacher.exchange_count()
            + self.snapshotter.as_ref().map_or(0, |x| x.exchange_count())
            + self
                .nodes
                .values()
                .map(|a| a.exchange_count())
                .sum::<usize>()
    }

    /// How many driver calls the sidecar that serves `target` has made: what
    /// one pass of it can change (the resync asks before and after every
    /// pass, so summing every node's count made a round cost nodes × targets).
    pub fn exchange_count_of(&self, target: &CsiTarget) -> usize {
        match target {
            CsiTarget::Provision(_) => self.provisioner.exchange_count(),
            CsiTarget::Attach(_) => self.attacher.exchange_count(),
            CsiTarget::Node { node, .. } => self.nodes.get(node).map_or(0, |a| a.exchange_count()),
            CsiTarget::Snapshot(_) => self.snapshotter.as_ref().map_or(0, |x| x.exchange_count()),
        }
    }

    /// The generation of the sidecar state `target`'s pass reads besides the
    /// API: a node agent's own (see [`NodeAgent::generation`]); the
    /// controllers keep none a Done pass reads (their back-off counts are
    /// cleared by a Done), so theirs is 0.
    pub fn generation_of(&self, target: &CsiTarget) -> u64 {
        match target {
            CsiTarget::Node { node, .. } => self.nodes.get(node).map_or(0, |a| a.generation()),
            _ => 0,
        }
    }

    /// Every target a resync would visit now: each PVC and PV, each
    /// VolumeAttachment and PV for the attacher, registration and each pod on
    /// each agent's node, plus pods an agent still holds volumes for (they may
    /// be gone from the API). Sorted, so the order is reproducible.
    pub fn targets(&self) -> Result<Vec<CsiTarget>, CsiError> {
        let kube = kube_of(&self.kube);
        let mut out = Vec::new();
        let name = |o: &serde_json::Value| str_at(o, &["metadata", "name"]);
        let ns = |o: &serde_json::Value| str_at(o, &["metadata", "namespace"]);
        for c in kube.list_shared(Kind::PersistentVolumeClaim, None)? {
            out.push(CsiTarget::Provision(ProvisionTarget::Claim {
                namespace: ns(&c),
                name: name(&c),
            }));
        }
        let pvs: Vec<String> = (kube.list_shared(Kind::PersistentVolume, None)?.iter())
            .map(|pv| name(pv))
            .collect();
        for pv in &pvs {
            out.push(CsiTarget::Provision(ProvisionTarget::Volume {
                name: pv.clone(),
            }));
        }
        for va in kube.list_shared(Kind::VolumeAttachment, None)? {
            out.push(CsiTarget::Attach(AttachTarget::Attachment {
                name: name(&va),
            }));
        }
        for pv in pvs {
            out.push(CsiTarget::Attach(AttachTarget::Volume { name: pv }));
        }
        let mut pods_on: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
        for p in kube.list_shared(Kind::Pod, None)? {
            pods_on
                .entry(str_at(&p, &["spec", "nodeName"]))
                .or_default()
                .push((ns(&p), name(&p)));
        }
        for (node, agent) in &self.nodes {
            out.push(CsiTarget::Node {
                node: node.clone(),
                target: NodeTarget::Register,
            });
            let mut mine = pods_on.remove(node).unwrap_or_default();
            mine.extend(agent.pod_keys());
            mine.sort();
            mine.dedup();
            for (namespace, name) in mine {
                out.push(CsiTarget::Node {
                    node: node.clone(),
                    target: NodeTarget::Pod { namespace, name },
                });
            }
        }
        if let Some(s) = &self.snapshotter {
            out.extend(s.targets()?.into_iter().map(CsiTarget::Snapshot));
        }
        // Made in order (lists come in (namespace, name) order): sorting
        // them every round was a tenth of a long CSI run.
        debug_assert!(
            out.windows(2).all(|w| w[0] < w[1]),
            "resync targets not made in order"
        );
        Ok(out)
    }

    /// Resync until a round where every target answers Done and nothing
    /// changed, at most `rounds` times; the requeue reasons of the last round
    /// if it did not converge. (An all-Done round can still make work for a
    /// target visited earlier in it — the kubelet deleting a VolumeAttachment
    /// after the attacher's turn — which a watch would deliver.) Tests and
    /// simple drivers of the lab use it; the engine schedules targets itself.
    pub async fn settle(&self, rounds: usize) -> Result<Vec<String>, ClusterError> {
        let mut pending = Vec::new();
        for _ in 0..rounds {
            pending.clear();
            let before = self.fingerprint()?;
            for t in self.targets()? {
                if let Reconcile::Requeue { reason, .. } = self.reconcile(&t).await? {
                    pending.push(format!("{t}: {reason}"));
                }
            }
            if pending.is_empty() && self.fingerprint()? == before {
                break;
            }
        }
        Ok(pending)
    }

    /// What the sidecars read and write, to tell a quiet round from a busy
    /// one: the API's resourceVersion (every write moves it, a no-op write
    /// does not) and what each node agent holds.
    fn fingerprint(&self) -> Result<(u64, String), CsiError> {
        let mut out = String::new();
        for (node, agent) in &self.nodes {
            out.push_str(&format!("{node}:{:?}", agent.pods()));
        }
        Ok((kube_of(&self.kube).resource_version(), out))
    }
}
