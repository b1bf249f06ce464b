//! The CSI steps of the scenario language: what a scenario asks of the CSI
//! system (volumes, pods, the kubelet's node calls, resent creates,
//! snapshots), and how each is checked against what earlier steps made.

use crate::scenario::{
    bosh, check_dns, Ctx, NodeCallStep, PodRef, PublishStep, ResendStep, ScenarioError,
    SnapshotRef, SnapshotStep, Validator, VolumeRef, VolumeStep,
};
use serde_saphyr::Spanned;

/// A CSI step, which the CSI lab applies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CsiStep {
    /// A PVC the external-provisioner provisions.
    CreateVolume(VolumeStep),
    /// Delete a PVC.
    DeleteVolume(VolumeRef),
    /// A pod using a volume on a node (attach, stage, publish).
    Publish(PublishStep),
    /// Delete a pod (unpublish, unstage, detach).
    Unpublish(PodRef),
    /// One NodeStageVolume call, as the kubelet sends it.
    NodeStage(NodeCallStep),
    /// One NodePublishVolume call (after a stage).
    NodePublish(NodeCallStep),
    /// A PVC's CreateVolume sent again with another size.
    ResendCreateVolume(ResendStep),
    /// A VolumeSnapshot (CreateSnapshot, as the external-snapshotter sends it).
    Snapshot(SnapshotStep),
    /// Delete a VolumeSnapshot (DeleteSnapshot).
    DeleteSnapshot(SnapshotRef),
    /// The CSI spec sweep against the controller and one node plugin.
    SpecSweep(SpecSweepStep),
}

/// `spec_sweep:` — the lab calls the driver case by case as the CSI spec
/// rules it (see `sweep`); the `csi-spec` invariant reports the cases.
#[derive(Clone, Debug, Default, serde::Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct SpecSweepStep {
    /// The node whose plugin the node cases call (default: the first node).
    #[serde(default)]
    pub node: Option<String>,
}

impl CsiStep {
    /// The step's keyword, as in the file.
    pub fn keyword(&self) -> &'static str {
        match self {
            CsiStep::CreateVolume(_) => "create_volume",
            CsiStep::DeleteVolume(_) => "delete_volume",
            CsiStep::Publish(_) => "publish",
            CsiStep::Unpublish(_) => "unpublish",
            CsiStep::NodeStage(_) => "node_stage",
            CsiStep::NodePublish(_) => "node_publish",
            CsiStep::ResendCreateVolume(_) => "resend_create_volume",
            CsiStep::Snapshot(_) => "snapshot",
            CsiStep::DeleteSnapshot(_) => "delete_snapshot",
            CsiStep::SpecSweep(_) => "spec_sweep",
        }
    }

    /// A one-line description for histories and reports.
    pub fn describe(&self) -> String {
        match self {
            CsiStep::CreateVolume(v) => format!(
                "create_volume {}/{} ({} {}, class {})",
                v.namespace,
                v.name,
                v.size,
                v.access.as_str(),
                v.class
            ),
            CsiStep::DeleteVolume(v) => format!("delete_volume {}/{}", v.namespace, v.name),
            CsiStep::Publish(p) => format!(
                "publish {}/{} to pod {} on {}{}",
                p.namespace,
                p.volume,
                p.pod,
                p.node,
                if p.read_only { " (read-only)" } else { "" }
            ),
            CsiStep::Unpublish(p) => format!("unpublish pod {}/{}", p.namespace, p.pod),
            CsiStep::NodeStage(n) => {
                format!("node_stage {}/{} on {}", n.namespace, n.volume, n.node)
            }
            CsiStep::NodePublish(n) => format!(
                "node_publish {}/{} on {}{}",
                n.namespace,
                n.volume,
                n.node,
                if n.read_only { " (read-only)" } else { "" }
            ),
            CsiStep::ResendCreateVolume(r) => format!(
                "resend_create_volume {}/{} asking {}",
                r.namespace, r.name, r.size
            ),
            CsiStep::Snapshot(s) => {
                format!("snapshot {}/{} of {}", s.namespace, s.name, s.volume)
            }
            CsiStep::DeleteSnapshot(s) => format!("delete_snapshot {}/{}", s.namespace, s.name),
            CsiStep::SpecSweep(s) => match &s.node {
                Some(n) => format!("spec_sweep (node {n})"),
                None => "spec_sweep".into(),
            },
        }
    }

    /// Whether the step may be one actor of a `concurrent:` block.
    pub fn concurrent_ok(&self) -> bool {
        matches!(
            self,
            CsiStep::CreateVolume(_)
                | CsiStep::DeleteVolume(_)
                | CsiStep::Publish(_)
                | CsiStep::Unpublish(_)
        )
    }
}

/// Each CSI step checked against the scenario so far (classes, nodes, volumes, pods).
impl Validator<'_> {
    /// `create_volume`: its StorageClass is defined (the first one when omitted), the size is a quantity, the name is new and DNS-safe.
    pub(crate) fn create_volume(
        &self,
        ctx: &mut Ctx,
        here: &Spanned<()>,
        mut v: VolumeStep,
    ) -> Result<CsiStep, ScenarioError> {
        let Some(csi) = ctx.csi.as_ref() else {
            return Err(self.err(
                here,
                "`create_volume` needs a `csi:` or `bosh:` section",
                None,
            ));
        };
        if v.class.is_empty() {
            // No `class:`: the scenario's first StorageClass.
            v.class = csi.storage_classes[0].name.clone();
        }
        if !csi.storage_classes.iter().any(|c| c.name == v.class) {
            let names: Vec<&str> = csi
                .storage_classes
                .iter()
                .map(|c| c.name.as_str())
                .collect();
            return Err(self.err(
                here,
                format!(
                    "volume `{}` uses storage class `{}`, which is not defined (classes: {})",
                    v.name,
                    v.class,
                    names.join(", ")
                ),
                Some("add it under `storage_classes:` of `csi:` or `bosh:`"),
            ));
        }
        if bosh::parse_quantity(&v.size).is_none() {
            return Err(self.err(
                here,
                format!("size `{}` is not a Kubernetes quantity", v.size),
                Some("e.g. 1Gi, 512Mi"),
            ));
        }
        check_dns(self, here, &v.name)?;
        if !ctx.volumes.insert((v.namespace.clone(), v.name.clone())) {
            return Err(self.err(
                here,
                format!("volume `{}/{}` is created twice", v.namespace, v.name),
                None,
            ));
        }
        Ok(CsiStep::CreateVolume(v))
    }

    /// `delete_volume`: an earlier step created it.
    pub(crate) fn delete_volume(
        &self,
        ctx: &mut Ctx,
        here: &Spanned<()>,
        v: VolumeRef,
    ) -> Result<CsiStep, ScenarioError> {
        self.known_volume(ctx, here, &v.namespace, &v.name, None)?;
        Ok(CsiStep::DeleteVolume(v))
    }

    /// `publish`: the volume exists, the node is known, the pod is new and DNS-safe.
    pub(crate) fn publish(
        &self,
        ctx: &mut Ctx,
        here: &Spanned<()>,
        p: PublishStep,
    ) -> Result<CsiStep, ScenarioError> {
        if !ctx
            .volumes
            .contains(&(p.namespace.clone(), p.volume.clone()))
        {
            return Err(self.err(
                here,
                format!(
                    "pod `{}` uses volume `{}/{}`, which no earlier step creates",
                    p.pod, p.namespace, p.volume
                ),
                Some("create it first with `create_volume`"),
            ));
        }
        self.known_node(ctx, here, &p.node)?;
        check_dns(self, here, &p.pod)?;
        if !ctx.pods.insert((p.namespace.clone(), p.pod.clone())) {
            return Err(self.err(
                here,
                format!("pod `{}/{}` is created twice", p.namespace, p.pod),
                None,
            ));
        }
        Ok(CsiStep::Publish(p))
    }

    /// `unpublish`: an earlier step published the pod.
    pub(crate) fn unpublish(
        &self,
        ctx: &mut Ctx,
        here: &Spanned<()>,
        p: PodRef,
    ) -> Result<CsiStep, ScenarioError> {
        if !ctx.pods.contains(&(p.namespace.clone(), p.pod.clone())) {
            return Err(self.err(
                here,
                format!(
                    "pod `{}/{}` is not created by an earlier `publish`",
                    p.namespace, p.pod
                ),
                None,
            ));
        }
        Ok(CsiStep::Unpublish(p))
    }

    /// `node_stage`: one kubelet call, on a known node for an existing volume.
    pub(crate) fn node_stage(
        &self,
        ctx: &mut Ctx,
        here: &Spanned<()>,
        n: NodeCallStep,
    ) -> Result<CsiStep, ScenarioError> {
        self.node_call(ctx, here, &n)?;
        Ok(CsiStep::NodeStage(n))
    }

    /// `node_publish`: one kubelet call, on a known node for an existing volume.
    pub(crate) fn node_publish(
        &self,
        ctx: &mut Ctx,
        here: &Spanned<()>,
        n: NodeCallStep,
    ) -> Result<CsiStep, ScenarioError> {
        self.node_call(ctx, here, &n)?;
        Ok(CsiStep::NodePublish(n))
    }

    /// `resend_create_volume`: repeats an earlier create_volume, with a size that is a quantity.
    pub(crate) fn resend_create_volume(
        &self,
        ctx: &mut Ctx,
        here: &Spanned<()>,
        r: ResendStep,
    ) -> Result<CsiStep, ScenarioError> {
        self.known_volume(
            ctx,
            here,
            &r.namespace,
            &r.name,
            Some("a resend repeats a request an earlier create_volume made"),
        )?;
        if bosh::parse_quantity(&r.size).is_none() {
            return Err(self.err(
                here,
                format!("size `{}` is not a Kubernetes quantity", r.size),
                Some("e.g. 1Gi, 512Mi"),
            ));
        }
        Ok(CsiStep::ResendCreateVolume(r))
    }

    /// `snapshot`: of an existing volume, under a new DNS-safe name.
    pub(crate) fn snapshot(
        &self,
        ctx: &mut Ctx,
        here: &Spanned<()>,
        sn: SnapshotStep,
    ) -> Result<CsiStep, ScenarioError> {
        self.known_volume(ctx, here, &sn.namespace, &sn.volume, None)?;
        check_dns(self, here, &sn.name)?;
        if !ctx
            .snapshots
            .insert((sn.namespace.clone(), sn.name.clone()))
        {
            return Err(self.err(
                here,
                format!("snapshot `{}/{}` is taken twice", sn.namespace, sn.name),
                None,
            ));
        }
        Ok(CsiStep::Snapshot(sn))
    }

    /// `delete_snapshot`: an earlier step took it.
    pub(crate) fn delete_snapshot(
        &self,
        ctx: &mut Ctx,
        here: &Spanned<()>,
        sn: SnapshotRef,
    ) -> Result<CsiStep, ScenarioError> {
        if !ctx
            .snapshots
            .contains(&(sn.namespace.clone(), sn.name.clone()))
        {
            return Err(self.err(
                here,
                format!(
                    "snapshot `{}/{}` is not taken by an earlier step",
                    sn.namespace, sn.name
                ),
                None,
            ));
        }
        Ok(CsiStep::DeleteSnapshot(sn))
    }

    /// `spec_sweep`: its node, when named, is one of the scenario's.
    pub(crate) fn spec_sweep(
        &self,
        ctx: &mut Ctx,
        here: &Spanned<()>,
        sw: SpecSweepStep,
    ) -> Result<CsiStep, ScenarioError> {
        if let Some(n) = &sw.node {
            self.known_node(ctx, here, n)?;
        }
        Ok(CsiStep::SpecSweep(sw))
    }
}
