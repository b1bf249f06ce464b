//! Scenario files: the YAML a developer writes, parsed into typed steps and
//! validated before anything runs. Every error carries `file:line:col`, what
//! was expected and a hint; unknown keys are errors.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use drivelab_fakes::history::Component;
use serde::Deserialize;
use serde_saphyr::Spanned;

pub mod bosh;
pub mod csi;
pub mod driver;
pub mod fault;
pub mod invariant;
pub mod mutant;
pub mod names;
pub mod write;
pub use bosh::{
    AccessMode, BackupStep, BackupToken, Bosh, DeploymentRef, NodeCallStep, NodeRef, PodRef,
    PublishStep, ReplayStep, ResendStep, ResumeStep, SnapshotRef, SnapshotStep, VolumeRef,
    VolumeStep, WriteBlocksStep,
};
pub use csi::{Csi, CsiStorageClass};
pub use driver::{BuiltinDriver, DriverLaunch, DriverProtocol, DriverSpec, ExternalDriver};
pub use fault::{FaultAction, FaultSpec, FaultTarget, PartitionSpec, When};
pub use invariant::Invariant;
pub use mutant::Mutant;
pub use names::Restartable;

/// A validated scenario, ready for the engine.
#[derive(Clone, Debug)]
pub struct Scenario {
    /// Where it was read from.
    pub path: PathBuf,
    /// Its `name:`.
    pub name: String,
    /// Free text describing what it provokes.
    pub description: String,
    /// The driver under test.
    pub driver: DriverSpec,
    /// Seed from the file (the command line may override it).
    pub seed: Option<u64>,
    /// BucketClasses the lab creates before the first step.
    pub bucket_classes: Vec<BucketClassSpec>,
    /// BucketAccessClasses the lab creates before the first step.
    pub access_classes: Vec<AccessClassSpec>,
    /// Faults armed before the first step, each with where the file says it.
    pub faults: Vec<Located<FaultSpec>>,
    /// What happens, in order.
    pub steps: Vec<Located<Step>>,
    /// The invariants to check at the end.
    pub invariants: Vec<Invariant>,
    /// Invariants this scenario must exercise: one with nothing to judge fails
    /// the run instead of reading "not exercised" (`require_exercised:`).
    pub require_exercised: Vec<Invariant>,
    /// What the scenario claims, in words, and the invariants that decide each claim.
    pub claims: Vec<Claim>,
    /// Requests the scenario makes invalid on purpose (`rejected_on_purpose:`):
    /// the only objects `converges` lets end refused while the sidecar still
    /// retries them.
    pub rejected_on_purpose: Vec<RejectedOnPurpose>,
    /// How much virtual time each step may take to converge.
    pub converge_within: Duration,
    /// The CSI system (`csi:`, or `bosh:` for it with the BOSH backend);
    /// without it the scenario drives a COSI driver.
    pub csi: Option<Csi>,
}

impl Scenario {
    /// Which system the scenario drives.
    pub fn system(&self) -> System {
        if self.csi.is_some() {
            System::Csi
        } else {
            System::Cosi
        }
    }

    /// The BOSH backend, if the scenario stands it up.
    pub fn bosh(&self) -> Option<&Bosh> {
        self.csi.as_ref().and_then(|c| c.bosh.as_ref())
    }
}

/// The system a scenario stands up around its driver.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum System {
    /// COSI: the provisioner sidecar, S3 and its admin API, Kubernetes.
    Cosi,
    /// CSI: the CSI sidecars, kubelets with node mount tables, Kubernetes; and
    /// the BOSH Director and CPI when the scenario stands that backend up.
    Csi,
}

/// A claim in words, decided by invariants (`claims:` in a scenario file).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct Claim {
    /// The claim, as a reviewer would state it.
    pub says: String,
    /// The invariants that must all hold for the claim to hold.
    pub by: Vec<Invariant>,
}

/// A COSI object whose request the scenario makes invalid on purpose, and the
/// code the driver must keep refusing it with (`rejected_on_purpose:` entry).
/// The real sidecar retries it for ever; `converges` accepts that for this
/// object and this code only.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RejectedOnPurpose {
    /// The object as the sidecar names it (its reconcile target).
    pub target: drivelab_fakes::cosi_sidecar::Target,
    /// The code it must end refused with.
    pub code: GrpcCode,
}

/// A value with the place in the file it came from.
#[derive(Clone, Debug)]
pub struct Located<T> {
    /// The value.
    pub value: T,
    /// 1-based line.
    pub line: u64,
    /// 1-based column.
    pub col: u64,
}

/// A BucketClass.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct BucketClassSpec {
    /// Object name.
    pub name: String,
    /// What happens to the backend bucket when its claim goes.
    pub deletion_policy: DeletionPolicy,
    /// Driver parameters. The lab adds `endpoint`, `objectStoreUserSecretName`
    /// and `objectStoreUserSecretNamespace` unless given; values may use the
    /// placeholders `{s3_endpoint}`, `{admin_secret_name}`, `{admin_secret_namespace}`.
    #[serde(default)]
    pub parameters: BTreeMap<String, String>,
}

/// COSI deletion policy.
#[derive(Copy, Clone, Debug, Deserialize, PartialEq, Eq, serde::Serialize)]
pub enum DeletionPolicy {
    /// DriverDeleteBucket is called.
    Delete,
    /// No driver call; the bucket stays.
    Retain,
}

/// A BucketAccessClass.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct AccessClassSpec {
    /// Object name.
    pub name: String,
    /// `Key`, `IAM`, or anything else (sent as UnknownAuthenticationType).
    pub authentication_type: String,
    /// Driver parameters (same connection defaults as BucketClass).
    #[serde(default)]
    pub parameters: BTreeMap<String, String>,
}

/// One scenario step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Create a BucketClaim and let the sidecar converge.
    CreateBucketClaim(ClaimStep),
    /// Create a BucketAccess and let the sidecar converge.
    GrantAccess(AccessStep),
    /// Delete a BucketAccess (revoke).
    RevokeAccess(ObjectRef),
    /// Delete a BucketClaim (honouring deletion policy).
    DeleteBucketClaim(ObjectRef),
    /// Send the driver request an earlier step made again.
    Retry(RetryStep),
    /// Assert on the state so far.
    Expect(Expectation),
    /// Arm a fault from this point on.
    Fault(FaultSpec),
    /// Cut the network between two components.
    Partition(PartitionSpec),
    /// Heal partitions (all, or those between two components).
    Heal(HealStep),
    /// Restart a fake (its state survives; its connections break).
    Restart(RestartStep),
    /// Start these steps at once; requests meeting at an interception point
    /// are released in an order drawn from the seed.
    Concurrent(Vec<Step>),
    /// Create a static Bucket object (as an admin would) for an existing backend bucket.
    CreateBucket(StaticBucketStep),
    /// Create a bucket directly in the backend, owned by someone other than the driver.
    CreateBackendBucket(BackendBucketStep),
    /// BOSH: a PVC the external-provisioner provisions.
    CreateVolume(VolumeStep),
    /// BOSH: delete a PVC.
    DeleteVolume(VolumeRef),
    /// BOSH: a pod using a volume on a node (attach, stage, publish).
    Publish(PublishStep),
    /// BOSH: delete a pod (unpublish, unstage, detach).
    Unpublish(PodRef),
    /// BOSH: one NodeStageVolume call, as the kubelet sends it.
    NodeStage(NodeCallStep),
    /// BOSH: one NodePublishVolume call (after a stage).
    NodePublish(NodeCallStep),
    /// BOSH: a deploy task (creates missing VMs; takes the deployment lock).
    Deploy(DeploymentRef),
    /// BOSH: recreate the VM a node runs on.
    RecreateVm(NodeRef),
    /// BOSH: recreate every VM of a deployment in turn, holding its lock.
    RollingUpdate(DeploymentRef),
    /// BOSH: the Director stops answering (connections refused).
    DirectorDown,
    /// BOSH: the Director answers again (state kept).
    DirectorUp,
    /// BOSH: a PVC's CreateVolume sent again with another size.
    ResendCreateVolume(ResendStep),
    /// CBT: a workload writes blocks of a volume.
    WriteBlocks(WriteBlocksStep),
    /// CBT: a VolumeSnapshot (CreateSnapshot, as the external-snapshotter sends it).
    Snapshot(SnapshotStep),
    /// CBT: delete a VolumeSnapshot (DeleteSnapshot).
    DeleteSnapshot(SnapshotRef),
    /// CBT: a backup client reads allocated or changed blocks through the snapshot-metadata sidecar.
    Backup(BackupStep),
    /// CBT: an earlier backup's session token replayed.
    ReplaySession(ReplayStep),
    /// CBT: a paused backup's client reads the rest of its stream.
    ResumeBackup(ResumeStep),
}

impl Step {
    /// The step's keyword, as in the file.
    pub fn keyword(&self) -> &'static str {
        match self {
            Step::CreateBucketClaim(_) => "create_bucket_claim",
            Step::GrantAccess(_) => "grant_access",
            Step::RevokeAccess(_) => "revoke_access",
            Step::DeleteBucketClaim(_) => "delete_bucket_claim",
            Step::Retry(_) => "retry",
            Step::Expect(_) => "expect",
            Step::Fault(_) => "fault",
            Step::Partition(_) => "partition",
            Step::Heal(_) => "heal",
            Step::Restart(_) => "restart",
            Step::Concurrent(_) => "concurrent",
            Step::CreateBucket(_) => "create_bucket",
            Step::CreateBackendBucket(_) => "create_backend_bucket",
            Step::CreateVolume(_) => "create_volume",
            Step::DeleteVolume(_) => "delete_volume",
            Step::Publish(_) => "publish",
            Step::Unpublish(_) => "unpublish",
            Step::NodeStage(_) => "node_stage",
            Step::NodePublish(_) => "node_publish",
            Step::Deploy(_) => "deploy",
            Step::RecreateVm(_) => "recreate_vm",
            Step::RollingUpdate(_) => "rolling_update",
            Step::DirectorDown => "director_down",
            Step::DirectorUp => "director_up",
            Step::ResendCreateVolume(_) => "resend_create_volume",
            Step::WriteBlocks(_) => "write_blocks",
            Step::Snapshot(_) => "snapshot",
            Step::DeleteSnapshot(_) => "delete_snapshot",
            Step::Backup(_) => "backup",
            Step::ReplaySession(_) => "replay_session",
            Step::ResumeBackup(_) => "resume_backup",
        }
    }

    /// A one-line description for histories and reports.
    pub fn describe(&self) -> String {
        match self {
            Step::CreateBucketClaim(c) => format!(
                "create_bucket_claim {}/{} (class {})",
                c.namespace, c.name, c.class
            ),
            Step::GrantAccess(a) => format!(
                "grant_access {}/{} to claim {} (class {})",
                a.namespace, a.name, a.claim, a.class
            ),
            Step::RevokeAccess(o) => format!("revoke_access {}/{}", o.namespace, o.name),
            Step::DeleteBucketClaim(o) => format!("delete_bucket_claim {}/{}", o.namespace, o.name),
            Step::Retry(r) => format!("retry {} {}", r.op.keyword(), r.name),
            Step::Expect(_) => "expect".to_string(),
            Step::Fault(f) => format!("fault {} on {} #{}", f.action.name(), f.on, f.nth),
            Step::Partition(p) => format!(
                "partition {} {} {}{}",
                p.from,
                if p.one_way { "->" } else { "<->" },
                p.to,
                p.duration
                    .map(|d| format!(" for {}ms", d.as_millis()))
                    .unwrap_or_default()
            ),
            Step::Heal(h) => match h.between {
                Some((a, b)) => format!("heal {a} <-> {b}"),
                None => "heal all".to_string(),
            },
            Step::Restart(r) => format!("restart {}", r.component.component()),
            Step::Concurrent(v) => format!(
                "concurrent [{}]",
                v.iter().map(Step::describe).collect::<Vec<_>>().join("; ")
            ),
            Step::CreateBucket(b) => format!(
                "create_bucket {} for existing {}",
                b.name, b.existing_bucket_id
            ),
            Step::CreateBackendBucket(b) => format!("create_backend_bucket {}", b.describe()),
            Step::CreateVolume(v) => format!(
                "create_volume {}/{} ({} {}, class {})",
                v.namespace,
                v.name,
                v.size,
                v.access.as_str(),
                v.class
            ),
            Step::DeleteVolume(v) => format!("delete_volume {}/{}", v.namespace, v.name),
            Step::Publish(p) => format!(
                "publish {}/{} to pod {} on {}{}",
                p.namespace,
                p.volume,
                p.pod,
                p.node,
                if p.read_only { " (read-only)" } else { "" }
            ),
            Step::Unpublish(p) => format!("unpublish pod {}/{}", p.namespace, p.pod),
            Step::NodeStage(n) => format!("node_stage {}/{} on {}", n.namespace, n.volume, n.node),
            Step::NodePublish(n) => format!(
                "node_publish {}/{} on {}{}",
                n.namespace,
                n.volume,
                n.node,
                if n.read_only { " (read-only)" } else { "" }
            ),
            Step::Deploy(d) => format!("deploy {}", d.deployment),
            Step::RecreateVm(n) => format!("recreate_vm of {}", n.node),
            Step::RollingUpdate(d) => format!("rolling_update {}", d.deployment),
            Step::DirectorDown => "director_down".into(),
            Step::DirectorUp => "director_up".into(),
            Step::ResendCreateVolume(r) => format!(
                "resend_create_volume {}/{} asking {}",
                r.namespace, r.name, r.size
            ),
            Step::WriteBlocks(w) => format!(
                "write_blocks {}/{} ({} ranges)",
                w.namespace,
                w.volume,
                w.ranges.len()
            ),
            Step::Snapshot(s) => format!("snapshot {}/{} of {}", s.namespace, s.name, s.volume),
            Step::DeleteSnapshot(s) => format!("delete_snapshot {}/{}", s.namespace, s.name),
            Step::Backup(b) => match &b.base {
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
            Step::ReplaySession(r) => format!(
                "replay_session of backup {} on {}{}",
                r.backup,
                r.snapshot,
                r.after
                    .as_ref()
                    .map(|a| format!(" after {a}"))
                    .unwrap_or_default()
            ),
            Step::ResumeBackup(r) => format!("resume_backup {}", r.name),
        }
    }
}

fn default_namespace() -> String {
    "default".to_string()
}

/// `create_bucket_claim:`
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ClaimStep {
    /// BucketClaim name.
    pub name: String,
    /// BucketClass name.
    pub class: String,
    /// Namespace (default `default`).
    #[serde(default = "default_namespace")]
    pub namespace: String,
    /// Bind to this static Bucket object (made by `create_bucket`) instead of provisioning.
    #[serde(default)]
    pub existing_bucket: Option<String>,
}

/// `create_bucket:` — a static Bucket object pointing at an existing backend bucket.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct StaticBucketStep {
    /// Bucket object name.
    pub name: String,
    /// BucketClass it claims to be of (its deletion policy applies).
    pub class: String,
    /// The backend bucket id.
    pub existing_bucket_id: String,
}

/// `create_backend_bucket:` — a bucket the driver did not make.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BackendBucketStep {
    /// `{ name: N }`: under a name given in the file.
    Named(String),
    /// `{ name_of_claim: C, namespace: NS }`: under the name the bucket of
    /// claim `C` has or had. S3 bucket names are global, so once a claim's
    /// bucket is deleted another tenant may take its name; a late duplicate
    /// delete must then not touch it.
    NameOfClaim(ObjectRef),
}

impl BackendBucketStep {
    /// How the step names its bucket, for messages.
    pub fn describe(&self) -> String {
        match self {
            BackendBucketStep::Named(n) => n.clone(),
            BackendBucketStep::NameOfClaim(c) => {
                format!("(the name of claim {}/{}'s bucket)", c.namespace, c.name)
            }
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBackendBucket {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    name_of_claim: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
}

/// `heal:` — the partitions between two components, or (`None`) every one.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HealStep {
    /// The two sides, in either order.
    pub between: Option<(Component, Component)>,
}

/// `heal:` as written — omit both sides to heal every partition.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
struct RawHeal {
    #[serde(default)]
    from: Option<String>,
    #[serde(default)]
    to: Option<String>,
}

/// `restart:` — a fake of the scenario's system (state kept, connections broken).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RestartStep {
    /// What restarts.
    pub component: Restartable,
}

/// `restart:` as written.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
struct RawRestart {
    component: String,
}

/// `grant_access:`
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct AccessStep {
    /// BucketAccess name.
    pub name: String,
    /// The BucketClaim it is for (same namespace).
    pub claim: String,
    /// BucketAccessClass name.
    pub class: String,
    /// Namespace (default `default`).
    #[serde(default = "default_namespace")]
    pub namespace: String,
    /// Name of the credentials Secret (default `<name>-creds`).
    #[serde(default)]
    pub credentials_secret: Option<String>,
}

/// A namespaced object named by a step.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ObjectRef {
    /// Object name.
    pub name: String,
    /// Namespace (default `default`).
    #[serde(default = "default_namespace")]
    pub namespace: String,
}

/// Which earlier operation a `retry` re-sends.
#[derive(Copy, Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum RetryOp {
    /// DriverCreateBucket of a claim's bucket.
    CreateBucketClaim,
    /// DriverGrantBucketAccess of an access.
    GrantAccess,
    /// DriverRevokeBucketAccess of an access.
    RevokeAccess,
    /// DriverDeleteBucket of a claim's bucket.
    DeleteBucketClaim,
}

impl RetryOp {
    /// As written in the file.
    pub fn keyword(self) -> &'static str {
        match self {
            RetryOp::CreateBucketClaim => "create_bucket_claim",
            RetryOp::GrantAccess => "grant_access",
            RetryOp::RevokeAccess => "revoke_access",
            RetryOp::DeleteBucketClaim => "delete_bucket_claim",
        }
    }
}

/// `retry:` — the same request again, as a sidecar retry after a lost reply would send it.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RetryStep {
    /// Which operation.
    pub op: RetryOp,
    /// The claim or access it was for.
    pub name: String,
    /// Namespace (default `default`).
    #[serde(default = "default_namespace")]
    pub namespace: String,
    /// Parameters that differ from the original request (to provoke AlreadyExists).
    #[serde(default)]
    pub parameters: Option<BTreeMap<String, String>>,
    /// Authentication type to send instead of the original (grant only).
    #[serde(default)]
    pub authentication_type: Option<String>,
}

/// `expect:` — assertions; every field given must hold.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Expectation {
    /// gRPC code of the last driver reply in the previous step (`OK`, `ALREADY_EXISTS`, ...).
    #[serde(default)]
    pub code: Option<GrpcCode>,
    /// A claim whose readiness to check (with `ready`).
    #[serde(default)]
    pub claim: Option<String>,
    /// Expected `status.bucketReady` of `claim`.
    #[serde(default)]
    pub ready: Option<bool>,
    /// An access whose grant to check (with `granted`).
    #[serde(default)]
    pub access: Option<String>,
    /// Expected `status.accessGranted` of `access`.
    #[serde(default)]
    pub granted: Option<bool>,
    /// Namespace of `claim`/`access` (default `default`).
    #[serde(default = "default_namespace")]
    pub namespace: String,
    /// Expected counts of driver-made backend objects.
    #[serde(default)]
    pub backend: Option<BackendCounts>,
    /// How many calls of each driver RPC the sidecar made so far (e.g. `DriverDeleteBucket: 0`).
    #[serde(default)]
    pub driver_calls: Option<BTreeMap<String, usize>>,
    /// BOSH: a PVC whose binding to check (with `bound`).
    #[serde(default)]
    pub volume: Option<String>,
    /// BOSH: expected: `volume` is Bound.
    #[serde(default)]
    pub bound: Option<bool>,
    /// BOSH: a pod whose phase to check (with `running`).
    #[serde(default)]
    pub pod: Option<String>,
    /// BOSH: expected: `pod` is Running.
    #[serde(default)]
    pub running: Option<bool>,
    /// BOSH: how many disks the IaaS has.
    #[serde(default)]
    pub iaas_disks: Option<usize>,
    /// BOSH: a VolumeSnapshot whose readiness to check (with `ready_to_use`).
    #[serde(default)]
    pub snapshot: Option<String>,
    /// BOSH: expected `status.readyToUse` of `snapshot` (false also when it is gone).
    #[serde(default)]
    pub ready_to_use: Option<bool>,
    /// BOSH: how many snapshots the IaaS has.
    #[serde(default)]
    pub iaas_snapshots: Option<usize>,
}

/// Counts of what the driver made in the backend (the lab's own canary excluded).
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct BackendCounts {
    /// Buckets.
    #[serde(default)]
    pub buckets: Option<usize>,
    /// Users.
    #[serde(default)]
    pub users: Option<usize>,
    /// Canned policies.
    #[serde(default)]
    pub policies: Option<usize>,
}

/// gRPC status codes by their spec names.
#[derive(Copy, Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
#[allow(missing_docs)]
pub enum GrpcCode {
    Ok,
    Cancelled,
    Unknown,
    InvalidArgument,
    DeadlineExceeded,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    ResourceExhausted,
    FailedPrecondition,
    Aborted,
    OutOfRange,
    Unimplemented,
    Internal,
    Unavailable,
    DataLoss,
    Unauthenticated,
}

impl GrpcCode {
    /// The spec name, e.g. `ALREADY_EXISTS`.
    pub fn name(self) -> String {
        let code: tonic::Code = self.into();
        drivelab_fakes::cosi_sidecar::code_name(code)
    }
}

impl From<GrpcCode> for tonic::Code {
    fn from(c: GrpcCode) -> Self {
        use GrpcCode::*;
        match c {
            Ok => tonic::Code::Ok,
            Cancelled => tonic::Code::Cancelled,
            Unknown => tonic::Code::Unknown,
            InvalidArgument => tonic::Code::InvalidArgument,
            DeadlineExceeded => tonic::Code::DeadlineExceeded,
            NotFound => tonic::Code::NotFound,
            AlreadyExists => tonic::Code::AlreadyExists,
            PermissionDenied => tonic::Code::PermissionDenied,
            ResourceExhausted => tonic::Code::ResourceExhausted,
            FailedPrecondition => tonic::Code::FailedPrecondition,
            Aborted => tonic::Code::Aborted,
            OutOfRange => tonic::Code::OutOfRange,
            Unimplemented => tonic::Code::Unimplemented,
            Internal => tonic::Code::Internal,
            Unavailable => tonic::Code::Unavailable,
            DataLoss => tonic::Code::DataLoss,
            Unauthenticated => tonic::Code::Unauthenticated,
        }
    }
}

// ---- raw file shape (what serde sees) ----

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawScenario {
    name: Spanned<String>,
    #[serde(default)]
    description: String,
    driver: Spanned<driver::RawDriver>,
    #[serde(default)]
    seed: Option<u64>,
    #[serde(default)]
    bucket_classes: Vec<Spanned<BucketClassSpec>>,
    #[serde(default)]
    bucket_access_classes: Vec<Spanned<AccessClassSpec>>,
    #[serde(default)]
    faults: Vec<Spanned<fault::RawFault>>,
    steps: Spanned<Vec<Spanned<RawStep>>>,
    #[serde(default)]
    invariants: Vec<Spanned<Invariant>>,
    #[serde(default)]
    require_exercised: Vec<Spanned<Invariant>>,
    #[serde(default)]
    claims: Vec<Spanned<Claim>>,
    #[serde(default)]
    rejected_on_purpose: Vec<Spanned<RawRejected>>,
    #[serde(default)]
    converge_within: Option<Spanned<String>>,
    #[serde(default)]
    bosh: Option<Spanned<bosh::RawBosh>>,
    #[serde(default)]
    csi: Option<Spanned<csi::RawCsi>>,
}

/// One `rejected_on_purpose:` entry as written: a claim or an access, and a code.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRejected {
    #[serde(default)]
    claim: Option<String>,
    #[serde(default)]
    access: Option<String>,
    #[serde(default = "default_namespace")]
    namespace: String,
    code: GrpcCode,
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
enum RawStep {
    CreateBucketClaim(ClaimStep),
    GrantAccess(AccessStep),
    RevokeAccess(ObjectRef),
    DeleteBucketClaim(ObjectRef),
    Retry(RetryStep),
    Expect(Expectation),
    Fault(fault::RawFault),
    Partition(fault::RawPartition),
    Heal(RawHeal),
    Restart(RawRestart),
    Concurrent(Vec<Spanned<RawStep>>),
    CreateBucket(StaticBucketStep),
    CreateBackendBucket(RawBackendBucket),
    CreateVolume(VolumeStep),
    DeleteVolume(VolumeRef),
    Publish(PublishStep),
    Unpublish(PodRef),
    NodeStage(NodeCallStep),
    NodePublish(NodeCallStep),
    Deploy(DeploymentRef),
    RecreateVm(NodeRef),
    RollingUpdate(DeploymentRef),
    DirectorDown(bosh::Nothing),
    DirectorUp(bosh::Nothing),
    ResendCreateVolume(ResendStep),
    WriteBlocks(WriteBlocksStep),
    Snapshot(SnapshotStep),
    DeleteSnapshot(SnapshotRef),
    Backup(BackupStep),
    ReplaySession(ReplayStep),
    ResumeBackup(ResumeStep),
}

/// A scenario that cannot run, with where and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScenarioError {
    /// The file.
    pub path: PathBuf,
    /// 1-based line (0 when unknown).
    pub line: u64,
    /// 1-based column (0 when unknown).
    pub col: u64,
    /// What is wrong, and what was expected.
    pub message: String,
    /// What to do about it.
    pub hint: Option<String>,
}

impl fmt::Display for ScenarioError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}: error: {}",
            self.path.display(),
            self.line,
            self.col,
            self.message
        )?;
        if let Some(h) = &self.hint {
            write!(f, "\n  hint: {h}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ScenarioError {}

/// Largest scenario file we read (a scenario is hand-written; bigger is a mistake).
pub const MAX_SCENARIO_BYTES: u64 = 1 << 20;

/// Read and validate one scenario file.
pub fn load(path: &Path) -> Result<Scenario, ScenarioError> {
    let err0 = |message: String, hint: Option<&str>| ScenarioError {
        path: path.to_path_buf(),
        line: 0,
        col: 0,
        message,
        hint: hint.map(str::to_string),
    };
    let meta =
        std::fs::metadata(path).map_err(|e| err0(format!("cannot read the file: {e}"), None))?;
    if meta.len() > MAX_SCENARIO_BYTES {
        return Err(err0(
            format!(
                "file is {} bytes; scenarios are limited to {MAX_SCENARIO_BYTES}",
                meta.len()
            ),
            Some("split it into several scenarios"),
        ));
    }
    let bytes =
        std::fs::read(path).map_err(|e| err0(format!("cannot read the file: {e}"), None))?;
    let text = String::from_utf8(bytes).map_err(|e| {
        let (line, col) = line_col_of_offset(&e.as_bytes()[..e.utf8_error().valid_up_to()]);
        ScenarioError {
            path: path.to_path_buf(),
            line,
            col,
            message: "the file is not valid UTF-8".into(),
            hint: Some("save it as UTF-8".into()),
        }
    })?;
    parse(path, &text)
}

fn line_col_of_offset(prefix: &[u8]) -> (u64, u64) {
    let line = prefix.iter().filter(|&&b| b == b'\n').count() as u64 + 1;
    let col = prefix.iter().rev().take_while(|&&b| b != b'\n').count() as u64 + 1;
    (line, col)
}

/// Parse and validate scenario text; `path` is used in messages.
pub fn parse(path: &Path, text: &str) -> Result<Scenario, ScenarioError> {
    let raw: RawScenario = serde_saphyr::from_str(text).map_err(|e| yaml_error(path, &e))?;
    Validator { path }.validate(raw)
}

/// A YAML/serde error as `file:line:col: error: …` with a hint (shared by the
/// other YAML files the lab reads: `serve` configs and fault files).
pub fn yaml_error(path: &Path, e: &serde_saphyr::Error) -> ScenarioError {
    let (line, col) = e
        .location()
        .map(|l| (l.line(), l.column()))
        .unwrap_or((0, 0));
    let message = first_line(&e.without_snippet().to_string());
    ScenarioError {
        path: path.to_path_buf(),
        line,
        col,
        hint: hint_for(&message),
        message,
    }
}

/// An error at a spanned value of a YAML file the lab reads.
pub fn error_at<T>(
    path: &Path,
    at: &Spanned<T>,
    message: impl Into<String>,
    hint: Option<&str>,
) -> ScenarioError {
    ScenarioError {
        path: path.to_path_buf(),
        line: at.referenced.line(),
        col: at.referenced.column(),
        message: message.into(),
        hint: hint.map(str::to_string),
    }
}

fn first_line(s: &str) -> String {
    // serde-saphyr appends its own location; we print ours in front instead.
    let line = s.lines().next().unwrap_or("").trim();
    match line.rfind(" at line ") {
        Some(i) => line[..i].to_string(),
        None => line.to_string(),
    }
}

fn hint_for(message: &str) -> Option<String> {
    if let Some(name) = misspelt(message) {
        Some(format!(
            "did you mean `{name}`? (the accepted names are in the message; see scenarios/README.md)"
        ))
    } else if message.contains("unknown field") || message.contains("unknown variant") {
        Some("check the spelling against the accepted names in the message (see scenarios/README.md)".into())
    } else if message.contains("missing field") {
        Some("add the field; see scenarios/README.md for each step's fields".into())
    } else {
        None
    }
}

/// The accepted name closest to the unknown one in serde's "unknown field
/// `x`, expected one of a, b" (a step kind, a key).
fn misspelt(message: &str) -> Option<&str> {
    let rest = message
        .strip_prefix("unknown variant `")
        .or_else(|| message.strip_prefix("unknown field `"))?;
    let (got, rest) = rest.split_once('`')?;
    let list = rest
        .strip_prefix(", expected one of ")
        .or_else(|| rest.strip_prefix(", expected "))?;
    let valid: Vec<&str> = list
        .split(", ")
        .map(|n| n.trim_matches(|c| c == '`' || c == ' '))
        .collect();
    names::closest(got, &valid)
}

struct Validator<'a> {
    path: &'a Path,
}

impl Validator<'_> {
    fn err<T>(
        &self,
        at: &Spanned<T>,
        message: impl Into<String>,
        hint: Option<&str>,
    ) -> ScenarioError {
        ScenarioError {
            path: self.path.to_path_buf(),
            line: at.referenced.line(),
            col: at.referenced.column(),
            message: message.into(),
            hint: hint.map(str::to_string),
        }
    }

    fn validate(&self, raw: RawScenario) -> Result<Scenario, ScenarioError> {
        if raw.name.value.trim().is_empty() {
            return Err(self.err(
                &raw.name,
                "`name` is empty",
                Some("give the scenario a short kebab-case name"),
            ));
        }
        let mut bucket_classes = Vec::new();
        let mut seen = BTreeSet::new();
        for c in raw.bucket_classes {
            if !seen.insert(c.value.name.clone()) {
                return Err(self.err(
                    &c,
                    format!("bucket class `{}` is defined twice", c.value.name),
                    None,
                ));
            }
            bucket_classes.push(c.value);
        }
        let mut access_classes = Vec::new();
        let mut seen = BTreeSet::new();
        for c in raw.bucket_access_classes {
            if !seen.insert(c.value.name.clone()) {
                return Err(self.err(
                    &c,
                    format!("bucket access class `{}` is defined twice", c.value.name),
                    None,
                ));
            }
            access_classes.push(c.value);
        }
        if raw.steps.value.is_empty() {
            return Err(self.err(
                &raw.steps,
                "`steps` is empty",
                Some("a scenario needs at least one step"),
            ));
        }
        let driver = {
            let at = Spanned::new((), raw.driver.referenced, raw.driver.defined);
            raw.driver
                .value
                .resolve()
                .map_err(|(m, hint)| self.err(&at, m, hint))?
        };
        let csi = self.csi_system(raw.bosh, raw.csi)?;
        match (&csi, driver.protocol()) {
            (Some(_), DriverProtocol::Cosi) => {
                let at = Spanned::new((), raw.driver.referenced, raw.driver.defined);
                return Err(self.err(
                    &at,
                    format!(
                        "a `csi:`/`bosh:` scenario drives a CSI driver, but {} speaks COSI",
                        driver.describe()
                    ),
                    Some("use a CSI builtin (bosh-csi, hostpath-csi), or `protocol: csi` for a command/image driver"),
                ));
            }
            (None, DriverProtocol::Csi) => {
                let at = Spanned::new((), raw.driver.referenced, raw.driver.defined);
                return Err(self.err(
                    &at,
                    format!(
                        "{} speaks CSI, which needs the CSI system",
                        driver.describe()
                    ),
                    Some("add `csi: {}` (the driver brings its own backend) or `bosh: {}` (the BOSH Director and CPI as its backend)"),
                ));
            }
            _ => {}
        }
        let system = if csi.is_some() {
            System::Csi
        } else {
            System::Cosi
        };
        let mut faults = Vec::new();
        for f in raw.faults {
            let here = Spanned::new((), f.referenced, f.defined);
            let spec = self.fault(
                &here,
                &f.value,
                system,
                csi.as_ref().is_some_and(|c| c.bosh.is_some()),
            )?;
            faults.push(Located {
                value: spec,
                line: here.referenced.line(),
                col: here.referenced.column(),
            });
        }
        let mut ctx = Ctx {
            bucket_classes: bucket_classes.iter().map(|c| c.name.clone()).collect(),
            access_classes: access_classes.iter().map(|c| c.name.clone()).collect(),
            csi: csi.clone(),
            ..Ctx::default()
        };
        let mut steps = Vec::new();
        for s in raw.steps.value {
            steps.push(self.step(&mut ctx, s, false)?);
        }
        if let Some((name, at)) = ctx.paused.iter().next() {
            return Err(self.err(
                at,
                format!("backup `{name}` pauses, but no later step resumes it"),
                Some("add `resume_backup: { name: ... }` after the steps that act mid-stream"),
            ));
        }
        let mut invariants = Vec::new();
        for i in raw.invariants {
            if !i.value.applies_to(system) {
                return Err(self.err(
                    &i,
                    format!(
                        "invariant `{}` does not apply to a {} scenario",
                        i.value.id(),
                        if system == System::Csi { "CSI" } else { "COSI" }
                    ),
                    Some("`drivelab list invariants` says which system each is for"),
                ));
            }
            if i.value.needs_bosh() && csi.as_ref().is_some_and(|c| c.bosh.is_none()) {
                return Err(self.err(
                    &i,
                    format!(
                        "invariant `{}` reads what only the BOSH backend shows, and this scenario has `csi:` without it",
                        i.value.id()
                    ),
                    Some("use `bosh:` instead of `csi:`, or drop the invariant"),
                ));
            }
            if invariants.contains(&i.value) {
                return Err(self.err(
                    &i,
                    format!("invariant `{}` is listed twice", i.value.id()),
                    None,
                ));
            }
            invariants.push(i.value);
        }
        if invariants.is_empty() {
            invariants = match system {
                System::Cosi => Invariant::cosi_defaults().to_vec(),
                System::Csi => {
                    Invariant::csi_defaults(csi.as_ref().is_some_and(|c| c.bosh.is_some()))
                }
            };
        }
        let mut require_exercised = Vec::new();
        for r in raw.require_exercised {
            if !invariants.contains(&r.value) {
                return Err(self.err(
                    &r,
                    format!(
                        "`require_exercised` names `{}`, which this scenario does not check",
                        r.value.id()
                    ),
                    Some("add it to `invariants:` (or remove the list to check the system's defaults)"),
                ));
            }
            require_exercised.push(r.value);
        }
        let rejected_on_purpose =
            self.rejected_on_purpose(raw.rejected_on_purpose, system, &ctx)?;
        let converge_within = match &raw.converge_within {
            None => Duration::from_secs(120),
            Some(s) => parse_duration(&s.value).ok_or_else(|| {
                self.err(
                    s,
                    format!("`{}` is not a duration", s.value),
                    Some("write e.g. 500ms, 30s, 2m, 1h"),
                )
            })?,
        };
        Ok(Scenario {
            path: self.path.to_path_buf(),
            name: raw.name.value,
            description: raw.description,
            driver,
            seed: raw.seed,
            bucket_classes,
            access_classes,
            faults,
            steps,
            claims: {
                let mut out = Vec::new();
                for c in raw.claims {
                    if c.value.by.is_empty() {
                        return Err(self.err(
                            &c,
                            "a claim needs at least one invariant in `by`",
                            Some("e.g. by: [idempotent-replay, no-rotation]"),
                        ));
                    }
                    if let Some(i) = c.value.by.iter().find(|i| !invariants.contains(i)) {
                        return Err(self.err(
                            &c,
                            format!(
                                "claim relies on `{}`, which this scenario does not check",
                                i.id()
                            ),
                            Some("add it to `invariants:` or remove the list to check all"),
                        ));
                    }
                    out.push(c.value);
                }
                out
            },
            invariants,
            require_exercised,
            rejected_on_purpose,
            converge_within,
            csi,
        })
    }

    /// `rejected_on_purpose:`: each entry one COSI object some step makes,
    /// named once, with an error code.
    fn rejected_on_purpose(
        &self,
        raw: Vec<Spanned<RawRejected>>,
        system: System,
        ctx: &Ctx,
    ) -> Result<Vec<RejectedOnPurpose>, ScenarioError> {
        use drivelab_fakes::cosi_sidecar::Target;
        let mut out: Vec<RejectedOnPurpose> = Vec::new();
        for r in raw {
            if system == System::Csi {
                return Err(self.err(
                    &r,
                    "`rejected_on_purpose` names COSI objects (claim, access); a CSI scenario has none",
                    Some("the CSI `converges` check fails every object a sidecar still requeues; leave the entry out"),
                ));
            }
            let e = &r.value;
            let key = (
                e.namespace.clone(),
                e.claim.clone().or(e.access.clone()).unwrap_or_default(),
            );
            let target = match (&e.claim, &e.access) {
                (Some(name), None) if ctx.claims.contains(&key) => Target::Claim {
                    namespace: e.namespace.clone(),
                    name: name.clone(),
                },
                (None, Some(name)) if ctx.accesses.contains(&key) => Target::Access {
                    namespace: e.namespace.clone(),
                    name: name.clone(),
                },
                (Some(_), None) | (None, Some(_)) => {
                    return Err(self.err(
                        &r,
                        format!("`rejected_on_purpose` names {}/{}, which no step makes", key.0, key.1),
                        Some("name a claim of `create_bucket_claim` or an access of `grant_access` (and its `namespace`)"),
                    ))
                }
                _ => {
                    return Err(self.err(
                        &r,
                        "a `rejected_on_purpose` entry names exactly one of `claim` or `access`",
                        Some("e.g. { claim: ledger, code: FAILED_PRECONDITION }"),
                    ))
                }
            };
            if e.code == GrpcCode::Ok {
                return Err(self.err(
                    &r,
                    "a request rejected on purpose cannot end OK",
                    Some(
                        "give the error code the driver must refuse it with, e.g. INVALID_ARGUMENT",
                    ),
                ));
            }
            if out.iter().any(|o| o.target == target) {
                return Err(self.err(
                    &r,
                    format!("{target} is listed twice in `rejected_on_purpose`"),
                    None,
                ));
            }
            out.push(RejectedOnPurpose {
                target,
                code: e.code,
            });
        }
        Ok(out)
    }
}

/// What earlier steps made, for reference checks.
#[derive(Default)]
struct Ctx {
    bucket_classes: BTreeSet<String>,
    access_classes: BTreeSet<String>,
    claims: BTreeSet<(String, String)>,
    accesses: BTreeSet<(String, String)>,
    static_buckets: BTreeSet<String>,
    csi: Option<Csi>,
    volumes: BTreeSet<(String, String)>,
    pods: BTreeSet<(String, String)>,
    snapshots: BTreeSet<(String, String)>,
    backups: BTreeSet<String>,
    /// Backups paused by `pause_after` and not resumed yet, with where they paused.
    paused: BTreeMap<String, Spanned<()>>,
    /// The sides of every partition step so far (a `heal` must have one to heal).
    partitions: Vec<(Component, Component)>,
}

impl Ctx {
    fn system(&self) -> System {
        if self.csi.is_some() {
            System::Csi
        } else {
            System::Cosi
        }
    }

    /// Whether the CSI system stands up the BOSH backend.
    fn with_bosh(&self) -> bool {
        self.csi.as_ref().is_some_and(|c| c.bosh.is_some())
    }
}

impl Validator<'_> {
    fn step(
        &self,
        ctx: &mut Ctx,
        s: Spanned<RawStep>,
        nested: bool,
    ) -> Result<Located<Step>, ScenarioError> {
        let line = s.referenced.line();
        let col = s.referenced.column();
        let here = Spanned::new((), s.referenced, s.defined);
        // Steps on what only the BOSH backend has: its VMs and Director, and
        // the IaaS block API changed-block backups read.
        let backend_step = matches!(
            &s.value,
            RawStep::Deploy(_)
                | RawStep::RecreateVm(_)
                | RawStep::RollingUpdate(_)
                | RawStep::DirectorDown(_)
                | RawStep::DirectorUp(_)
                | RawStep::WriteBlocks(_)
                | RawStep::Backup(_)
                | RawStep::ReplaySession(_)
                | RawStep::ResumeBackup(_)
        );
        let csi_step = backend_step
            || matches!(
                &s.value,
                RawStep::CreateVolume(_)
                    | RawStep::DeleteVolume(_)
                    | RawStep::Publish(_)
                    | RawStep::Unpublish(_)
                    | RawStep::NodeStage(_)
                    | RawStep::NodePublish(_)
                    | RawStep::ResendCreateVolume(_)
                    | RawStep::Snapshot(_)
                    | RawStep::DeleteSnapshot(_)
            );
        let cosi_step = matches!(
            &s.value,
            RawStep::CreateBucketClaim(_)
                | RawStep::GrantAccess(_)
                | RawStep::RevokeAccess(_)
                | RawStep::DeleteBucketClaim(_)
                | RawStep::Retry(_)
                | RawStep::CreateBucket(_)
                | RawStep::CreateBackendBucket(_)
        );
        if csi_step && ctx.csi.is_none() {
            return Err(self.err(
                &here,
                "this is a CSI step, but the scenario has no `csi:` or `bosh:` section",
                Some("add `csi: {}` (a driver with its own backend) or `bosh: {}` (the BOSH backend), and a CSI driver"),
            ));
        }
        if backend_step && ctx.csi.as_ref().is_some_and(|c| c.bosh.is_none()) {
            return Err(self.err(
                &here,
                "this step acts on the BOSH backend (its VMs, Director or IaaS block API), but the scenario stands up none",
                Some("replace `csi:` with `bosh:` to test the driver against the BOSH Director and CPI"),
            ));
        }
        if cosi_step && ctx.csi.is_some() {
            return Err(self.err(
                &here,
                "this is a COSI step, but the scenario drives the CSI system",
                Some("CSI steps: create_volume, delete_volume, publish, unpublish, node_stage, node_publish, resend_create_volume, snapshot, delete_snapshot; with `bosh:` also deploy, recreate_vm, rolling_update, director_down, director_up, write_blocks, backup, replay_session, resume_backup"),
            ));
        }
        let step = match s.value {
            RawStep::CreateBucketClaim(c) => {
                if !ctx.bucket_classes.contains(&c.class) {
                    return Err(self.err(
                        &here,
                        format!(
                            "claim `{}` uses bucket class `{}`, which is not defined",
                            c.name, c.class
                        ),
                        Some("add it under `bucket_classes:`"),
                    ));
                }
                if let Some(b) = &c.existing_bucket {
                    if !ctx.static_buckets.contains(b) {
                        return Err(self.err(&here, format!("claim `{}` binds Bucket `{b}`, which no earlier `create_bucket` step makes", c.name), None));
                    }
                }
                if !ctx.claims.insert((c.namespace.clone(), c.name.clone())) {
                    return Err(self.err(
                        &here,
                        format!("claim `{}/{}` is created twice", c.namespace, c.name),
                        None,
                    ));
                }
                check_dns(self, &here, &c.name)?;
                Step::CreateBucketClaim(c)
            }
            RawStep::GrantAccess(a) => {
                if !ctx.access_classes.contains(&a.class) {
                    return Err(self.err(
                        &here,
                        format!(
                            "access `{}` uses bucket access class `{}`, which is not defined",
                            a.name, a.class
                        ),
                        Some("add it under `bucket_access_classes:`"),
                    ));
                }
                if !ctx.claims.contains(&(a.namespace.clone(), a.claim.clone())) {
                    return Err(self.err(
                        &here,
                        format!(
                            "access `{}` is for claim `{}/{}`, which no earlier step creates",
                            a.name, a.namespace, a.claim
                        ),
                        Some("create the claim first with `create_bucket_claim`"),
                    ));
                }
                if !ctx.accesses.insert((a.namespace.clone(), a.name.clone())) {
                    return Err(self.err(
                        &here,
                        format!("access `{}/{}` is granted twice", a.namespace, a.name),
                        None,
                    ));
                }
                check_dns(self, &here, &a.name)?;
                Step::GrantAccess(a)
            }
            RawStep::RevokeAccess(o) => {
                if !ctx
                    .accesses
                    .contains(&(o.namespace.clone(), o.name.clone()))
                {
                    return Err(self.err(
                        &here,
                        format!(
                            "access `{}/{}` is not granted by an earlier step",
                            o.namespace, o.name
                        ),
                        None,
                    ));
                }
                Step::RevokeAccess(o)
            }
            RawStep::DeleteBucketClaim(o) => {
                if !ctx.claims.contains(&(o.namespace.clone(), o.name.clone())) {
                    return Err(self.err(
                        &here,
                        format!(
                            "claim `{}/{}` is not created by an earlier step",
                            o.namespace, o.name
                        ),
                        None,
                    ));
                }
                Step::DeleteBucketClaim(o)
            }
            RawStep::Retry(r) => {
                if nested {
                    return Err(self.err(&here, "`retry` cannot be part of `concurrent`", None));
                }
                let known = match r.op {
                    RetryOp::CreateBucketClaim | RetryOp::DeleteBucketClaim => {
                        ctx.claims.contains(&(r.namespace.clone(), r.name.clone()))
                    }
                    RetryOp::GrantAccess | RetryOp::RevokeAccess => ctx
                        .accesses
                        .contains(&(r.namespace.clone(), r.name.clone())),
                };
                if !known {
                    return Err(self.err(
                        &here,
                        format!("retry of {} `{}/{}`: no earlier step made that request", r.op.keyword(), r.namespace, r.name),
                        Some("a retry re-sends a request an earlier step made; put it after that step"),
                    ));
                }
                if r.parameters.is_some()
                    && !matches!(r.op, RetryOp::CreateBucketClaim | RetryOp::GrantAccess)
                {
                    return Err(self.err(
                        &here,
                        "`parameters` only applies to create_bucket_claim and grant_access retries",
                        None,
                    ));
                }
                if r.authentication_type.is_some() && r.op != RetryOp::GrantAccess {
                    return Err(self.err(
                        &here,
                        "`authentication_type` only applies to grant_access retries",
                        None,
                    ));
                }
                Step::Retry(r)
            }
            RawStep::Expect(e) => {
                if nested {
                    return Err(self.err(
                        &here,
                        "`expect` cannot be part of `concurrent`; put it after the block",
                        None,
                    ));
                }
                self.expectation(&here, &e, ctx.system())?;
                Step::Expect(e)
            }
            RawStep::Fault(f) => {
                Step::Fault(self.fault(&here, &f, ctx.system(), ctx.with_bosh())?)
            }
            RawStep::Partition(p) => {
                let spec = p
                    .resolve(ctx.system())
                    .map_err(|e| self.err(&here, e.message, e.hint.as_deref()))?;
                ctx.partitions.push((spec.from, spec.to));
                Step::Partition(spec)
            }
            RawStep::Heal(h) => Step::Heal(self.heal(ctx, &here, &h)?),
            RawStep::Restart(r) => {
                let component = names::restartable(&r.component, ctx.system())
                    .map_err(|e| self.err(&here, e.message, e.hint.as_deref()))?;
                if component == names::Restartable::Director && !ctx.with_bosh() {
                    return Err(self.err(
                        &here,
                        "cannot restart `director` in this scenario: it has no BOSH backend",
                        Some("restart csi-snapshot-metadata; use `bosh:` instead of `csi:` for the Director"),
                    ));
                }
                Step::Restart(RestartStep { component })
            }
            RawStep::Concurrent(inner) => {
                if nested {
                    return Err(self.err(&here, "`concurrent` blocks do not nest", None));
                }
                if inner.len() < 2 {
                    return Err(self.err(&here, "`concurrent` needs at least two steps", None));
                }
                let mut out = Vec::new();
                for i in inner {
                    let l = self.step(ctx, i, true)?;
                    if !matches!(
                        l.value,
                        Step::CreateBucketClaim(_)
                            | Step::GrantAccess(_)
                            | Step::RevokeAccess(_)
                            | Step::DeleteBucketClaim(_)
                            | Step::CreateVolume(_)
                            | Step::DeleteVolume(_)
                            | Step::Publish(_)
                            | Step::Unpublish(_)
                            | Step::Deploy(_)
                            | Step::RecreateVm(_)
                            | Step::RollingUpdate(_)
                    ) {
                        return Err(ScenarioError {
                            path: self.path.to_path_buf(),
                            line: l.line,
                            col: l.col,
                            message: format!("`{}` cannot run inside `concurrent`", l.value.keyword()),
                            hint: Some("concurrent blocks take create_bucket_claim, grant_access, revoke_access, delete_bucket_claim; or create_volume, delete_volume, publish, unpublish, deploy, recreate_vm, rolling_update".into()),
                        });
                    }
                    out.push(l.value);
                }
                Step::Concurrent(out)
            }
            RawStep::CreateBucket(b) => {
                if !ctx.bucket_classes.contains(&b.class) {
                    return Err(self.err(
                        &here,
                        format!(
                            "bucket `{}` uses bucket class `{}`, which is not defined",
                            b.name, b.class
                        ),
                        None,
                    ));
                }
                if !ctx.static_buckets.insert(b.name.clone()) {
                    return Err(self.err(
                        &here,
                        format!("bucket `{}` is created twice", b.name),
                        None,
                    ));
                }
                Step::CreateBucket(b)
            }
            RawStep::CreateBackendBucket(b) => {
                match (b.name, b.name_of_claim) {
                    (Some(name), None) => {
                        if b.namespace.is_some() {
                            return Err(self.err(
                                &here,
                                "`namespace` goes with `name_of_claim`, not with `name`",
                                None,
                            ));
                        }
                        if cosi_s3::config::validate_bucket_name("name", &name).is_err() {
                            return Err(self.err(
                                &here,
                                format!("`{name}` is not a valid S3 bucket name"),
                                Some("3-63 lowercase letters, digits, '-' and '.'"),
                            ));
                        }
                        Step::CreateBackendBucket(BackendBucketStep::Named(name))
                    }
                    (None, Some(claim)) => {
                        let namespace = b.namespace.unwrap_or_else(default_namespace);
                        if !ctx.claims.contains(&(namespace.clone(), claim.clone())) {
                            return Err(self.err(
                            &here,
                            format!("`name_of_claim: {claim}`: no earlier step creates claim `{namespace}/{claim}`"),
                            Some("the bucket takes the name of a claim's bucket; put it after the claim's steps"),
                        ));
                        }
                        Step::CreateBackendBucket(BackendBucketStep::NameOfClaim(ObjectRef {
                            name: claim,
                            namespace,
                        }))
                    }
                    _ => return Err(self.err(
                        &here,
                        "`create_backend_bucket` takes exactly one of `name` and `name_of_claim`",
                        Some("{ name: finance-archive } or { name_of_claim: scratch }"),
                    )),
                }
            }
            RawStep::CreateVolume(mut v) => {
                let csi = ctx.csi.as_ref().expect("checked above");
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
                        &here,
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
                        &here,
                        format!("size `{}` is not a Kubernetes quantity", v.size),
                        Some("e.g. 1Gi, 512Mi"),
                    ));
                }
                check_dns(self, &here, &v.name)?;
                if !ctx.volumes.insert((v.namespace.clone(), v.name.clone())) {
                    return Err(self.err(
                        &here,
                        format!("volume `{}/{}` is created twice", v.namespace, v.name),
                        None,
                    ));
                }
                Step::CreateVolume(v)
            }
            RawStep::DeleteVolume(v) => {
                if !ctx.volumes.contains(&(v.namespace.clone(), v.name.clone())) {
                    return Err(self.err(
                        &here,
                        format!(
                            "volume `{}/{}` is not created by an earlier step",
                            v.namespace, v.name
                        ),
                        None,
                    ));
                }
                Step::DeleteVolume(v)
            }
            RawStep::Publish(p) => {
                if !ctx
                    .volumes
                    .contains(&(p.namespace.clone(), p.volume.clone()))
                {
                    return Err(self.err(
                        &here,
                        format!(
                            "pod `{}` uses volume `{}/{}`, which no earlier step creates",
                            p.pod, p.namespace, p.volume
                        ),
                        Some("create it first with `create_volume`"),
                    ));
                }
                self.known_node(ctx, &here, &p.node)?;
                check_dns(self, &here, &p.pod)?;
                if !ctx.pods.insert((p.namespace.clone(), p.pod.clone())) {
                    return Err(self.err(
                        &here,
                        format!("pod `{}/{}` is created twice", p.namespace, p.pod),
                        None,
                    ));
                }
                Step::Publish(p)
            }
            RawStep::Unpublish(p) => {
                if !ctx.pods.contains(&(p.namespace.clone(), p.pod.clone())) {
                    return Err(self.err(
                        &here,
                        format!(
                            "pod `{}/{}` is not created by an earlier `publish`",
                            p.namespace, p.pod
                        ),
                        None,
                    ));
                }
                Step::Unpublish(p)
            }
            RawStep::NodeStage(n) | RawStep::NodePublish(n) if nested => {
                let _ = n;
                return Err(self.err(&here, "node calls cannot be part of `concurrent`", None));
            }
            RawStep::NodeStage(n) => {
                self.node_call(ctx, &here, &n)?;
                Step::NodeStage(n)
            }
            RawStep::NodePublish(n) => {
                self.node_call(ctx, &here, &n)?;
                Step::NodePublish(n)
            }
            RawStep::Deploy(d) => {
                self.known_deployment(ctx, &here, &d.deployment)?;
                Step::Deploy(d)
            }
            RawStep::RollingUpdate(d) => {
                self.known_deployment(ctx, &here, &d.deployment)?;
                Step::RollingUpdate(d)
            }
            RawStep::RecreateVm(n) => {
                self.known_node(ctx, &here, &n.node)?;
                Step::RecreateVm(n)
            }
            RawStep::ResendCreateVolume(r) => {
                if nested {
                    return Err(self.err(
                        &here,
                        "`resend_create_volume` cannot be part of `concurrent`",
                        None,
                    ));
                }
                if !ctx.volumes.contains(&(r.namespace.clone(), r.name.clone())) {
                    return Err(self.err(
                        &here,
                        format!(
                            "volume `{}/{}` is not created by an earlier step",
                            r.namespace, r.name
                        ),
                        Some("a resend repeats a request an earlier create_volume made"),
                    ));
                }
                if bosh::parse_quantity(&r.size).is_none() {
                    return Err(self.err(
                        &here,
                        format!("size `{}` is not a Kubernetes quantity", r.size),
                        Some("e.g. 1Gi, 512Mi"),
                    ));
                }
                Step::ResendCreateVolume(r)
            }
            RawStep::WriteBlocks(_)
            | RawStep::Snapshot(_)
            | RawStep::DeleteSnapshot(_)
            | RawStep::Backup(_)
            | RawStep::ReplaySession(_)
            | RawStep::ResumeBackup(_)
                if nested =>
            {
                return Err(self.err(
                    &here,
                    "snapshot and backup steps cannot be part of `concurrent`",
                    None,
                ));
            }
            RawStep::WriteBlocks(w) => {
                if !ctx
                    .volumes
                    .contains(&(w.namespace.clone(), w.volume.clone()))
                {
                    return Err(self.err(
                        &here,
                        format!(
                            "volume `{}/{}` is not created by an earlier step",
                            w.namespace, w.volume
                        ),
                        None,
                    ));
                }
                if w.ranges.is_empty() || w.ranges.iter().any(|[_, n]| *n == 0) {
                    return Err(self.err(
                        &here,
                        "`ranges` needs [first, count] pairs with count > 0",
                        Some("e.g. ranges: [[0, 4], [100, 2]]"),
                    ));
                }
                Step::WriteBlocks(w)
            }
            RawStep::Snapshot(sn) => {
                if !ctx
                    .volumes
                    .contains(&(sn.namespace.clone(), sn.volume.clone()))
                {
                    return Err(self.err(
                        &here,
                        format!(
                            "volume `{}/{}` is not created by an earlier step",
                            sn.namespace, sn.volume
                        ),
                        None,
                    ));
                }
                check_dns(self, &here, &sn.name)?;
                if !ctx
                    .snapshots
                    .insert((sn.namespace.clone(), sn.name.clone()))
                {
                    return Err(self.err(
                        &here,
                        format!("snapshot `{}/{}` is taken twice", sn.namespace, sn.name),
                        None,
                    ));
                }
                Step::Snapshot(sn)
            }
            RawStep::DeleteSnapshot(sn) => {
                if !ctx
                    .snapshots
                    .contains(&(sn.namespace.clone(), sn.name.clone()))
                {
                    return Err(self.err(
                        &here,
                        format!(
                            "snapshot `{}/{}` is not taken by an earlier step",
                            sn.namespace, sn.name
                        ),
                        None,
                    ));
                }
                Step::DeleteSnapshot(sn)
            }
            RawStep::Backup(b) => {
                for sn in std::iter::once(&b.snapshot).chain(b.base.iter()) {
                    if !ctx.snapshots.contains(&(b.namespace.clone(), sn.clone())) {
                        return Err(self.err(
                            &here,
                            format!(
                                "backup `{}` reads snapshot `{}/{sn}`, which no earlier step takes",
                                b.name, b.namespace
                            ),
                            Some("take it first with `snapshot`"),
                        ));
                    }
                }
                if !ctx.backups.insert(b.name.clone()) {
                    return Err(self.err(
                        &here,
                        format!("backup `{}` is named twice", b.name),
                        None,
                    ));
                }
                match b.pause_after {
                    Some(0) => {
                        return Err(self.err(
                            &here,
                            "`pause_after` counts messages read before the pause and must be at least 1",
                            Some("to act before the stream opens, put the step before `backup`"),
                        ))
                    }
                    Some(_) => {
                        ctx.paused.insert(b.name.clone(), here.clone());
                    }
                    None => {}
                }
                Step::Backup(b)
            }
            RawStep::ReplaySession(r) => {
                if !ctx.backups.contains(&r.backup) {
                    return Err(self.err(
                        &here,
                        format!("no earlier backup `{}` to replay the session of", r.backup),
                        None,
                    ));
                }
                for sn in std::iter::once(&r.snapshot).chain(r.base.iter()) {
                    if !ctx.snapshots.contains(&(r.namespace.clone(), sn.clone())) {
                        return Err(self.err(
                            &here,
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
                            &here,
                            format!("`{a}` is not a duration"),
                            Some("write e.g. 10m"),
                        ));
                    }
                }
                Step::ReplaySession(r)
            }
            RawStep::ResumeBackup(r) => {
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
                        &here,
                        why,
                        Some("pause it first: `backup: { ..., pause_after: 2 }`"),
                    ));
                }
                Step::ResumeBackup(r)
            }
            RawStep::DirectorDown(_) => Step::DirectorDown,
            RawStep::DirectorUp(_) => Step::DirectorUp,
        };
        Ok(Located {
            value: step,
            line,
            col,
        })
    }

    /// The CSI system from `bosh:` (with the BOSH backend) or `csi:` (without);
    /// never both.
    fn csi_system(
        &self,
        bosh: Option<Spanned<bosh::RawBosh>>,
        csi: Option<Spanned<csi::RawCsi>>,
    ) -> Result<Option<Csi>, ScenarioError> {
        match (bosh, csi) {
            (Some(_), Some(c)) => Err(self.err(
                &c,
                "a scenario has `bosh:` or `csi:`, not both",
                Some("`bosh:` is the CSI system with the BOSH backend (nodes and storage classes go there); `csi:` is the CSI system for a driver with its own backend"),
            )),
            (Some(b), None) => {
                let at = Spanned::new((), b.referenced, b.defined);
                let bosh = b.value.resolve().map_err(|(m, h)| self.err(&at, m, h))?;
                Ok(Some(Csi::with_bosh(bosh)))
            }
            (None, Some(c)) => {
                let at = Spanned::new((), c.referenced, c.defined);
                Ok(Some(c.value.resolve().map_err(|(m, h)| self.err(&at, m, h))?))
            }
            (None, None) => Ok(None),
        }
    }

    /// A fault of the file (`faults:` or a `fault:` step), for the scenario's system.
    fn fault(
        &self,
        here: &Spanned<()>,
        f: &fault::RawFault,
        system: System,
        with_bosh: bool,
    ) -> Result<FaultSpec, ScenarioError> {
        let spec = f.resolve(system).map_err(|e| {
            let hint = e
                .hint
                .unwrap_or_else(|| "see scenarios/README.md, Faults".into());
            self.err(e.at.as_ref().unwrap_or(here), e.message, Some(&hint))
        })?;
        let backend = matches!(
            spec.on.component,
            Component::Director | Component::Cpi | Component::Agent
        );
        if backend && !with_bosh {
            return Err(self.err(
                here,
                format!(
                    "`{}` is in the BOSH backend, and this scenario stands up none",
                    spec.on
                ),
                Some("use `bosh:` instead of `csi:` to fault the Director, CPI or agents"),
            ));
        }
        Ok(spec)
    }

    /// A `heal` step: both sides or neither, and something to heal.
    fn heal(&self, ctx: &Ctx, here: &Spanned<()>, h: &RawHeal) -> Result<HealStep, ScenarioError> {
        let system = ctx.system();
        let sides = names::partition_sides(system);
        let side = |s: &str| {
            names::component_in(s, sides, system, "`heal`")
                .map_err(|e| self.err(here, e.message, e.hint.as_deref()))
        };
        let between = match (&h.from, &h.to) {
            (Some(a), Some(b)) => Some((side(a)?, side(b)?)),
            (None, None) => None,
            _ => {
                return Err(self.err(
                    here,
                    "`heal` takes both `from` and `to`, or neither (heal all)",
                    None,
                ))
            }
        };
        let host = |c| match c {
            Component::S3Admin => Component::S3,
            other => other,
        };
        let heals = |(x, y): &(_, _)| match between {
            None => true,
            Some((a, b)) => {
                let (x, y, a, b) = (host(*x), host(*y), host(a), host(b));
                (x == a && y == b) || (x == b && y == a)
            }
        };
        if !ctx.partitions.iter().any(heals) {
            return Err(self.err(
                here,
                "`heal` has nothing to heal: no earlier `partition` step cuts that link",
                Some("put a `partition` step before it, or remove the `heal`"),
            ));
        }
        Ok(HealStep { between })
    }

    fn known_node(&self, ctx: &Ctx, here: &Spanned<()>, node: &str) -> Result<(), ScenarioError> {
        let csi = ctx
            .csi
            .as_ref()
            .expect("CSI steps need a csi or bosh section");
        if csi.nodes.iter().any(|n| n == node) {
            return Ok(());
        }
        Err(self.err(
            here,
            format!("no node `{node}` (nodes: {})", csi.nodes.join(", ")),
            Some("declare it under `csi: nodes:` or `bosh: nodes:` (bosh's default is one node-<i> per instance of the first deployment; csi's is node-0)"),
        ))
    }

    fn known_deployment(
        &self,
        ctx: &Ctx,
        here: &Spanned<()>,
        d: &str,
    ) -> Result<(), ScenarioError> {
        let bosh = ctx
            .csi
            .as_ref()
            .and_then(|c| c.bosh.as_ref())
            .expect("backend steps need a bosh section");
        if bosh.deployments.iter().any(|x| x.name == d) {
            return Ok(());
        }
        Err(self.err(
            here,
            format!("no deployment `{d}`"),
            Some("declare it under `bosh: deployments:`"),
        ))
    }

    fn node_call(
        &self,
        ctx: &Ctx,
        here: &Spanned<()>,
        n: &NodeCallStep,
    ) -> Result<(), ScenarioError> {
        if !ctx
            .volumes
            .contains(&(n.namespace.clone(), n.volume.clone()))
        {
            return Err(self.err(
                here,
                format!(
                    "volume `{}/{}` is not created by an earlier step",
                    n.namespace, n.volume
                ),
                None,
            ));
        }
        self.known_node(ctx, here, &n.node)
    }

    fn expectation(
        &self,
        here: &Spanned<()>,
        e: &Expectation,
        system: System,
    ) -> Result<(), ScenarioError> {
        if e.snapshot.is_some() != e.ready_to_use.is_some() {
            return Err(self.err(
                here,
                "`snapshot` and `ready_to_use` go together",
                Some("write `snapshot: NAME` and `ready_to_use: true|false`"),
            ));
        }
        if e.bound.is_some() != e.volume.is_some() {
            return Err(self.err(
                here,
                "`bound` and `volume` go together",
                Some("write `volume: NAME` and `bound: true|false`"),
            ));
        }
        if e.running.is_some() != e.pod.is_some() {
            return Err(self.err(
                here,
                "`running` and `pod` go together",
                Some("write `pod: NAME` and `running: true|false`"),
            ));
        }
        if e.ready.is_some() != e.claim.is_some() {
            return Err(self.err(
                here,
                "`ready` and `claim` go together",
                Some("write `claim: NAME` and `ready: true|false`"),
            ));
        }
        if e.granted.is_some() != e.access.is_some() {
            return Err(self.err(
                here,
                "`granted` and `access` go together",
                Some("write `access: NAME` and `granted: true|false`"),
            ));
        }
        if e.code.is_none()
            && e.claim.is_none()
            && e.access.is_none()
            && e.backend.is_none()
            && e.driver_calls.is_none()
            && e.volume.is_none()
            && e.pod.is_none()
            && e.iaas_disks.is_none()
            && e.snapshot.is_none()
            && e.iaas_snapshots.is_none()
        {
            return Err(self.err(
                here,
                "`expect` asserts nothing",
                Some(
                    "give at least one of code, claim/ready, access/granted, backend, driver_calls (COSI), volume/bound, pod/running, iaas_disks, snapshot/ready_to_use, iaas_snapshots (BOSH)",
                ),
            ));
        }
        if let Some(calls) = &e.driver_calls {
            let rpcs = names::ops_of(system, Component::Driver);
            let valid: Vec<&str> = rpcs.iter().map(|o| o.as_str()).collect();
            for k in calls.keys() {
                if !valid.contains(&k.as_str()) {
                    return Err(self.err(
                        here,
                        format!(
                            "unknown driver RPC `{k}` in driver_calls{}",
                            names::did_you_mean(k, &valid)
                        ),
                        Some(&format!("driver RPCs here: {}", valid.join(", "))),
                    ));
                }
            }
        }
        Ok(())
    }
}

fn check_dns(v: &Validator<'_>, at: &Spanned<()>, name: &str) -> Result<(), ScenarioError> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(v.err(
            at,
            format!("`{name}` is not a valid Kubernetes object name"),
            Some("use at most 63 lowercase letters, digits and '-'"),
        ))
    }
}

/// `500ms`, `30s`, `2m`, `1h`.
pub fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit())?);
    let n: u64 = num.parse().ok()?;
    Some(match unit {
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.checked_mul(60)?),
        "h" => Duration::from_secs(n.checked_mul(3600)?),
        _ => return None,
    })
}

/// Every `*.yaml`/`*.yml` under `paths` (files as given, directories recursively), sorted.
pub fn discover(paths: &[PathBuf]) -> std::io::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for p in paths {
        if p.is_dir() {
            walk(p, &mut out)?;
        } else {
            out.push(p.clone());
        }
    }
    out.sort();
    out.dedup();
    Ok(out)
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let p = entry?.path();
        if p.is_dir() {
            walk(&p, out)?;
        } else if matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml")) {
            out.push(p);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
