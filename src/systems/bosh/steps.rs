//! The BOSH backend's steps: what a scenario does to the Director and its VMs
//! (deploys, recreates, rolling updates, outages) and through the IaaS block
//! API (writes, changed-block backups), and how each is checked.

use crate::scenario::{
    parse_duration, BackupStep, Ctx, DeploymentRef, NodeRef, ReplayStep, ResumeStep, ScenarioError,
    Validator, WriteBlocksStep,
};
use serde_saphyr::Spanned;

/// A step on the CSI system's BOSH backend, which the CSI lab applies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BoshStep {
    /// A deploy task (creates missing VMs; takes the deployment lock).
    Deploy(DeploymentRef),
    /// Recreate the VM a node runs on.
    RecreateVm(NodeRef),
    /// Recreate every VM of a deployment in turn, holding its lock.
    RollingUpdate(DeploymentRef),
    /// The Director stops answering (connections refused).
    DirectorDown,
    /// The Director answers again (state kept).
    DirectorUp,
    /// A workload writes blocks of a volume (the IaaS records them).
    WriteBlocks(WriteBlocksStep),
    /// A backup client reads allocated or changed blocks through the snapshot-metadata sidecar.
    Backup(BackupStep),
    /// An earlier backup's session token replayed.
    ReplaySession(ReplayStep),
    /// A paused backup's client reads the rest of its stream.
    ResumeBackup(ResumeStep),
    /// Let virtual time pass (between the waves of a `scale:` churn).
    Wait(std::time::Duration),
    /// Make these steps' changes at once (VM operations first, to their end),
    /// then converge once: the controllers reconcile in their own order, with
    /// no seeded interleaving (`batch:`, what a `scale:` churn is made of).
    Batch(Vec<crate::scenario::Step>),
}

impl BoshStep {
    /// The step's keyword, as in the file.
    pub fn keyword(&self) -> &'static str {
        match self {
            BoshStep::Deploy(_) => "deploy",
            BoshStep::RecreateVm(_) => "recreate_vm",
            BoshStep::RollingUpdate(_) => "rolling_update",
            BoshStep::DirectorDown => "director_down",
            BoshStep::DirectorUp => "director_up",
            BoshStep::WriteBlocks(_) => "write_blocks",
            BoshStep::Backup(_) => "backup",
            BoshStep::ReplaySession(_) => "replay_session",
            BoshStep::ResumeBackup(_) => "resume_backup",
            BoshStep::Wait(_) => "wait",
            BoshStep::Batch(_) => "batch",
        }
    }

    /// A one-line description for histories and reports.
    pub fn describe(&self) -> String {
        match self {
            BoshStep::Deploy(d) => format!("deploy {}", d.deployment),
            BoshStep::RecreateVm(n) => format!("recreate_vm of {}", n.node),
            BoshStep::RollingUpdate(d) => format!("rolling_update {}", d.deployment),
            BoshStep::DirectorDown => "director_down".into(),
            BoshStep::DirectorUp => "director_up".into(),
            BoshStep::WriteBlocks(w) => format!(
                "write_blocks {}/{} ({} ranges)",
                w.namespace,
                w.volume,
                w.ranges.len()
            ),
            BoshStep::Backup(b) => match &b.base {
                Some(base) => format!(
                    "backup {} (changed blocks {base} → {}, token {})",
                    b.name,
                    b.snapshot,
                    b.token.as_str()
                ),
                None => format!(
                    "backup {} (allocated blocks of {}, token {})",
                    b.name,
                    b.snapshot,
                    b.token.as_str()
                ),
            },
            BoshStep::ReplaySession(r) => format!(
                "replay_session of backup {} on {}{}",
                r.backup,
                r.snapshot,
                r.after
                    .as_ref()
                    .map(|a| format!(" after {a}"))
                    .unwrap_or_default()
            ),
            BoshStep::ResumeBackup(r) => format!("resume_backup {}", r.name),
            BoshStep::Wait(d) => format!("wait {}", crate::scenario::write::duration(*d)),
            BoshStep::Batch(v) => format!(
                "batch [{}]",
                v.iter()
                    .map(crate::scenario::Step::describe)
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
        }
    }

    /// Whether the step may be one actor of a `concurrent:` block.
    pub fn concurrent_ok(&self) -> bool {
        matches!(
            self,
            BoshStep::Deploy(_) | BoshStep::RecreateVm(_) | BoshStep::RollingUpdate(_)
        )
    }
}

/// Each BOSH backend step checked against the scenario so far (deployments, nodes, snapshots, backups).
impl Validator<'_> {
    /// `deploy`: of a deployment the `bosh:` section declares.
    pub(crate) fn deploy(
        &self,
        ctx: &mut Ctx,
        here: &Spanned<()>,
        d: DeploymentRef,
    ) -> Result<BoshStep, ScenarioError> {
        self.known_deployment(ctx, here, &d.deployment)?;
        Ok(BoshStep::Deploy(d))
    }

    /// `rolling_update`: of a deployment the `bosh:` section declares.
    pub(crate) fn rolling_update(
        &self,
        ctx: &mut Ctx,
        here: &Spanned<()>,
        d: DeploymentRef,
    ) -> Result<BoshStep, ScenarioError> {
        self.known_deployment(ctx, here, &d.deployment)?;
        Ok(BoshStep::RollingUpdate(d))
    }

    /// `recreate_vm`: of a node that runs on a BOSH instance.
    pub(crate) fn recreate_vm(
        &self,
        ctx: &mut Ctx,
        here: &Spanned<()>,
        n: NodeRef,
    ) -> Result<BoshStep, ScenarioError> {
        self.known_node(ctx, here, &n.node)?;
        Ok(BoshStep::RecreateVm(n))
    }

    /// `wait`: a duration up to a day.
    pub(crate) fn wait(&self, here: &Spanned<()>, d: &str) -> Result<BoshStep, ScenarioError> {
        parse_duration(d)
            .filter(|d| *d <= std::time::Duration::from_secs(86_400))
            .map(BoshStep::Wait)
            .ok_or_else(|| {
                self.err(
                    here,
                    format!("wait: `{d}` is not a duration up to 24h"),
                    Some("write e.g. 30s, 1m"),
                )
            })
    }

    /// `write_blocks`: to an existing volume, in block ranges.
    pub(crate) fn write_blocks(
        &self,
        ctx: &mut Ctx,
        here: &Spanned<()>,
        w: WriteBlocksStep,
    ) -> Result<BoshStep, ScenarioError> {
        self.known_volume(ctx, here, &w.namespace, &w.volume, None)?;
        if w.ranges.is_empty() || w.ranges.iter().any(|[_, n]| *n == 0) {
            return Err(self.err(
                here,
                "`ranges` needs [first, count] pairs with count > 0",
                Some("e.g. ranges: [[0, 4], [100, 2]]"),
            ));
        }
        Ok(BoshStep::WriteBlocks(w))
    }

    /// `backup`: of an existing snapshot (and base), under a new name; a paused one must be resumed later.
    pub(crate) fn backup(
        &self,
        ctx: &mut Ctx,
        here: &Spanned<()>,
        b: BackupStep,
    ) -> Result<BoshStep, ScenarioError> {
        for sn in std::iter::once(&b.snapshot).chain(b.base.iter()) {
            if !ctx.snapshots.contains(&(b.namespace.clone(), sn.clone())) {
                return Err(self.err(
                    here,
                    format!(
                        "backup `{}` reads snapshot `{}/{sn}`, which no earlier step takes",
                        b.name, b.namespace
                    ),
                    Some("take it first with `snapshot`"),
                ));
            }
        }
        if !ctx.backups.insert(b.name.clone()) {
            return Err(self.err(here, format!("backup `{}` is named twice", b.name), None));
        }
        match b.pause_after {
            Some(0) => {
                return Err(self.err(
                    here,
                    "`pause_after` counts messages read before the pause and must be at least 1",
                    Some("to act before the stream opens, put the step before `backup`"),
                ))
            }
            Some(_) => {
                ctx.paused.insert(b.name.clone(), here.clone());
            }
            None => {}
        }
        Ok(BoshStep::Backup(b))
    }

    /// `replay_session`: of an earlier backup, after a valid duration.
    pub(crate) fn replay_session(
        &self,
        ctx: &mut Ctx,
        here: &Spanned<()>,
        r: ReplayStep,
    ) -> Result<BoshStep, ScenarioError> {
        if !ctx.backups.contains(&r.backup) {
            return Err(self.err(
                here,
                format!("no earlier backup `{}` to replay the session of", r.backup),
                None,
            ));
        }
        for sn in std::iter::once(&r.snapshot).chain(r.base.iter()) {
            if !ctx.snapshots.contains(&(r.namespace.clone(), sn.clone())) {
                return Err(self.err(
                    here,
                    format!(
                        "snapshot `{}/{sn}` is not taken by an earlier step",
                        r.namespace
                    ),
                    None,
                ));
            }
        }
        if let Some(a) = &r.after {
            if parse_duration(a).is_none() {
                return Err(self.err(
                    here,
                    format!("`{a}` is not a duration"),
                    Some("write e.g. 10m"),
                ));
            }
        }
        Ok(BoshStep::ReplaySession(r))
    }

    /// `resume_backup`: of a backup paused by `pause_after` and not resumed yet.
    pub(crate) fn resume_backup(
        &self,
        ctx: &mut Ctx,
        here: &Spanned<()>,
        r: ResumeStep,
    ) -> Result<BoshStep, ScenarioError> {
        if ctx.paused.remove(&r.name).is_none() {
            let why = if ctx.backups.contains(&r.name) {
                format!(
                    "backup `{}` is not paused (no `pause_after`, or resumed already)",
                    r.name
                )
            } else {
                format!("no earlier backup `{}` to resume", r.name)
            };
            return Err(self.err(
                here,
                why,
                Some("pause it first: `backup: { ..., pause_after: 2 }`"),
            ));
        }
        Ok(BoshStep::ResumeBackup(r))
    }
}
