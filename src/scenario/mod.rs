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

/// The systems' own sections of the language (`bosh:` backend, `csi:`).
pub use crate::systems::bosh::scenario as bosh;
pub use crate::systems::csi::scenario as csi;
pub use crate::systems::{bosh::steps::BoshStep, cosi::steps::CosiStep, csi::steps::CsiStep};
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
    /// COSI: the real server the S3/admin fake follows (`s3_backend:`,
    /// `rustfs` or `minio`; default `rustfs`, whose `/rustfs/admin/v3` the
    /// reference driver calls).
    pub s3_backend: drivelab_fakes::s3::Backend,
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
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, serde::Serialize)]
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

/// One scenario step: what the run loop does itself (expectations, faults,
/// partitions, restarts, concurrency), or a step of one system, which that
/// system's lab applies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
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
    /// A COSI step: claims, accesses, buckets.
    Cosi(CosiStep),
    /// A CSI step: volumes, pods, node calls, snapshots.
    Csi(CsiStep),
    /// A step on the CSI system's BOSH backend: VMs, the Director, the IaaS block API.
    Bosh(BoshStep),
}

impl Step {
    /// The step's keyword, as in the file.
    pub fn keyword(&self) -> &'static str {
        match self {
            Step::Expect(_) => "expect",
            Step::Fault(_) => "fault",
            Step::Partition(_) => "partition",
            Step::Heal(_) => "heal",
            Step::Restart(_) => "restart",
            Step::Concurrent(_) => "concurrent",
            Step::Cosi(s) => s.keyword(),
            Step::Csi(s) => s.keyword(),
            Step::Bosh(s) => s.keyword(),
        }
    }

    /// A one-line description for histories and reports.
    pub fn describe(&self) -> String {
        match self {
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
            Step::Cosi(s) => s.describe(),
            Step::Csi(s) => s.describe(),
            Step::Bosh(s) => s.describe(),
        }
    }

    /// Whether the step may be one actor of a `concurrent:` block.
    pub fn concurrent_ok(&self) -> bool {
        match self {
            Step::Cosi(s) => s.concurrent_ok(),
            Step::Csi(s) => s.concurrent_ok(),
            Step::Bosh(s) => s.concurrent_ok(),
            _ => false,
        }
    }
}

pub(crate) fn default_namespace() -> String {
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
    /// A bucket the lab plants with objects, or under a name built from a
    /// claim's bucket name (`prefix`/`suffix`): it must keep every object.
    Planted(PlantedBucket),
}

/// A bucket planted with objects (`create_backend_bucket` with `objects`,
/// `prefix` or `suffix`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlantedBucket {
    /// Its name.
    pub name: BackendName,
    /// Keys of the objects put in it.
    pub objects: Vec<String>,
}

/// The name of a backend object the lab plants.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BackendName {
    /// As written.
    Absolute(String),
    /// `prefix` + the backend name of claim's bucket + `suffix` (e.g. a bucket
    /// whose name merely starts with a claim's bucket name).
    OfClaim {
        /// The claim whose bucket name it builds on.
        claim: ObjectRef,
        /// Put before it.
        prefix: String,
        /// Put after it.
        suffix: String,
    },
}

impl BackendName {
    /// How the name reads, for messages.
    pub fn describe(&self) -> String {
        match self {
            BackendName::Absolute(n) => n.clone(),
            BackendName::OfClaim {
                claim,
                prefix,
                suffix,
            } => format!(
                "{prefix}(claim {}/{}'s bucket){suffix}",
                claim.namespace, claim.name
            ),
        }
    }
}

/// `create_backend_policy:` — a canned policy someone else manages, allowing
/// read and write on one bucket; it must end byte-identical.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackendPolicyStep {
    /// The policy's name (absolute: classes name it in `policy:`).
    pub name: String,
    /// The bucket it allows.
    pub bucket: BackendName,
}

/// `create_backend_user:` — a backend user someone else manages; it must keep
/// its secret, status and policies.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct BackendUserStep {
    /// Its access key.
    pub access_key: String,
    /// Canned policies attached to it (planted or built in).
    #[serde(default)]
    pub policies: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawBackendPolicy {
    pub(crate) name: String,
    #[serde(default)]
    pub(crate) bucket: Option<String>,
    #[serde(default)]
    pub(crate) bucket_of_claim: Option<String>,
    #[serde(default)]
    pub(crate) namespace: Option<String>,
    #[serde(default)]
    pub(crate) prefix: String,
    #[serde(default)]
    pub(crate) suffix: String,
}

impl BackendBucketStep {
    /// How the step names its bucket, for messages.
    pub fn describe(&self) -> String {
        match self {
            BackendBucketStep::Named(n) => n.clone(),
            BackendBucketStep::NameOfClaim(c) => {
                format!("(the name of claim {}/{}'s bucket)", c.namespace, c.name)
            }
            BackendBucketStep::Planted(p) => {
                format!("{} with {} objects", p.name.describe(), p.objects.len())
            }
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawBackendBucket {
    #[serde(default)]
    pub(crate) name: Option<String>,
    #[serde(default)]
    pub(crate) name_of_claim: Option<String>,
    #[serde(default)]
    pub(crate) namespace: Option<String>,
    #[serde(default)]
    pub(crate) prefix: String,
    #[serde(default)]
    pub(crate) suffix: String,
    #[serde(default)]
    pub(crate) objects: Vec<String>,
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
    /// This step asserts the reference driver's design (e.g. one policy per
    /// grant), not the spec: judged only on a reference driver in its
    /// reference design, reported "not exercised" for any other.
    #[serde(default)]
    pub reference_design: bool,
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
#[derive(Copy, Clone, Debug, Deserialize, serde::Serialize, PartialEq, Eq)]
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
    #[serde(default)]
    s3_backend: Option<Spanned<String>>,
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
    CreateBackendPolicy(RawBackendPolicy),
    CreateBackendUser(BackendUserStep),
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
    SpecSweep(crate::systems::csi::steps::SpecSweepStep),
    Backup(BackupStep),
    ReplaySession(ReplayStep),
    ResumeBackup(ResumeStep),
    Wait(String),
    Batch(Vec<Spanned<RawStep>>),
}

/// A generated step as the file would hold it.
fn raw_step(g: crate::systems::bosh::scale::GenStep, at: &Spanned<()>) -> RawStep {
    use crate::systems::bosh::scale::GenStep as G;
    match g {
        G::Create(v) => RawStep::CreateVolume(v),
        G::Publish(p) => RawStep::Publish(p),
        G::Unpublish(p) => RawStep::Unpublish(p),
        G::Delete(v) => RawStep::DeleteVolume(v),
        G::RollingUpdate(d) => RawStep::RollingUpdate(d),
        G::Wait(d) => RawStep::Wait(d),
        G::Batch(v) => RawStep::Batch(
            v.into_iter()
                .map(|g| Spanned::new(raw_step(g, at), at.referenced, at.defined))
                .collect(),
        ),
    }
}

/// Which system a step of the file belongs to (none: the run loop's own).
#[derive(Clone, Copy, PartialEq, Eq)]
enum StepOwner {
    Cosi,
    Csi,
    /// The CSI system's BOSH backend.
    Bosh,
}

impl RawStep {
    fn owner(&self) -> Option<StepOwner> {
        use RawStep as R;
        match self {
            R::CreateBucketClaim(_)
            | R::GrantAccess(_)
            | R::RevokeAccess(_)
            | R::DeleteBucketClaim(_)
            | R::Retry(_)
            | R::CreateBucket(_)
            | R::CreateBackendBucket(_)
            | R::CreateBackendPolicy(_)
            | R::CreateBackendUser(_) => Some(StepOwner::Cosi),
            R::CreateVolume(_)
            | R::DeleteVolume(_)
            | R::Publish(_)
            | R::Unpublish(_)
            | R::NodeStage(_)
            | R::NodePublish(_)
            | R::ResendCreateVolume(_)
            | R::Snapshot(_)
            | R::DeleteSnapshot(_)
            | R::SpecSweep(_) => Some(StepOwner::Csi),
            // What only the BOSH backend has: its VMs and Director, and the
            // IaaS block API changed-block backups read.
            R::Deploy(_)
            | R::RecreateVm(_)
            | R::RollingUpdate(_)
            | R::DirectorDown(_)
            | R::DirectorUp(_)
            | R::WriteBlocks(_)
            | R::Backup(_)
            | R::ReplaySession(_)
            | R::ResumeBackup(_)
            | R::Wait(_)
            | R::Batch(_) => Some(StepOwner::Bosh),
            R::Expect(_)
            | R::Fault(_)
            | R::Partition(_)
            | R::Heal(_)
            | R::Restart(_)
            | R::Concurrent(_) => None,
        }
    }
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

/// Largest scenario file we read. Room for 10⁵ generated steps (~7.5 MiB for
/// as many grants) twice over; the parse is linear in the text (see [`from_yaml`]).
pub const MAX_SCENARIO_BYTES: u64 = 32 << 20;

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
    let raw: RawScenario = from_yaml(text).map_err(|e| yaml_error(path, &e))?;
    Validator { path }.validate(raw)
}

/// Deserialise YAML the lab reads (scenarios, `serve` configs, fault files,
/// `--driver`). The parser's default budget stops at 250,000 nodes, about
/// 28,000 steps: a generated scenario of 10⁵ grants was refused. Here the
/// node and event budgets grow with the text, which the file-size limit
/// bounds; an alias bomb is still stopped by the parser's alias-replay
/// limit, left as it is, and every other budget keeps its default.
pub fn from_yaml<'de, T: serde::Deserialize<'de>>(
    text: &'de str,
) -> Result<T, serde_saphyr::Error> {
    let base = serde_saphyr::Budget::default();
    let options = serde_saphyr::options! {
        budget: serde_saphyr::budget! {
            // A node takes at least one byte of text, an event at most two
            // per node (start and end); twice that is slack, not a bound we rely on.
            max_nodes: base.max_nodes.max(2 * text.len()),
            max_events: base.max_events.max(4 * text.len()),
        },
    };
    serde_saphyr::from_str_with_options(text, options)
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
    } else if message.starts_with("budget breached") {
        Some(
            "the YAML passed the parser limit the message names (Depth: nesting deeper \
             than 64; Aliases, Anchors: 50,000; an alias ratio over ten per anchor); \
             write it out plainly, without aliases and less deeply nested"
                .into(),
        )
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

pub(crate) struct Validator<'a> {
    path: &'a Path,
}

impl Validator<'_> {
    pub(crate) fn err<T>(
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

    /// Objects of one kind (classes), each name defined once.
    fn unique<T>(
        &self,
        items: Vec<Spanned<T>>,
        what: &str,
        name: impl Fn(&T) -> &String,
    ) -> Result<Vec<T>, ScenarioError> {
        let mut seen = BTreeSet::new();
        let mut out = Vec::new();
        for c in items {
            if !seen.insert(name(&c.value).clone()) {
                return Err(self.err(
                    &c,
                    format!("{what} `{}` is defined twice", name(&c.value)),
                    None,
                ));
            }
            out.push(c.value);
        }
        Ok(out)
    }

    /// The driver speaks the protocol of the scenario's system.
    fn driver_fits(
        &self,
        at: &Spanned<()>,
        driver: &DriverSpec,
        csi: Option<&Csi>,
    ) -> Result<(), ScenarioError> {
        match (csi, driver.protocol()) {
            (Some(_), DriverProtocol::Cosi) => {
                Err(self.err(
                    at,
                    format!(
                        "a `csi:`/`bosh:` scenario drives a CSI driver, but {} speaks COSI",
                        driver.describe()
                    ),
                    Some("use a CSI builtin (bosh-csi, hostpath-csi), or `protocol: csi` for a command/image driver"),
                ))
            }
            (None, DriverProtocol::Csi) => {
                Err(self.err(
                    at,
                    format!(
                        "{} speaks CSI, which needs the CSI system",
                        driver.describe()
                    ),
                    Some("add `csi: {}` (the driver brings its own backend) or `bosh: {}` (the BOSH Director and CPI as its backend)"),
                ))
            }
            _ => Ok(()),
        }
    }

    /// The scenario's claims, each decided by invariants it checks.
    fn claims(
        &self,
        raw: Vec<Spanned<Claim>>,
        invariants: &[Invariant],
    ) -> Result<Vec<Claim>, ScenarioError> {
        let mut out = Vec::new();
        for c in raw {
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
        Ok(out)
    }

    /// Checks a scenario demands be exercised: only ones it checks.
    fn require_exercised(
        &self,
        raw: Vec<Spanned<Invariant>>,
        invariants: &[Invariant],
    ) -> Result<Vec<Invariant>, ScenarioError> {
        let mut require_exercised = Vec::new();
        for r in raw {
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
        Ok(require_exercised)
    }

    fn validate(&self, raw: RawScenario) -> Result<Scenario, ScenarioError> {
        if raw.name.value.trim().is_empty() {
            return Err(self.err(
                &raw.name,
                "`name` is empty",
                Some("give the scenario a short kebab-case name"),
            ));
        }
        let bucket_classes = self.unique(raw.bucket_classes, "bucket class", |c| &c.name)?;
        for c in &raw.bucket_access_classes {
            // The lab judges least-privilege by the mode the class asks for.
            if let Err(m) = crate::systems::cosi::requested_mode(&c.value.parameters) {
                return Err(self.err(
                    c,
                    format!("bucket access class `{}`: {m}", c.value.name),
                    None,
                ));
            }
        }
        let access_classes =
            self.unique(raw.bucket_access_classes, "bucket access class", |c| {
                &c.name
            })?;
        let scale_at = raw
            .bosh
            .as_ref()
            .filter(|b| b.value.has_scale())
            .map(|b| Spanned::new((), b.referenced, b.defined));
        if raw.steps.value.is_empty() && scale_at.is_none() {
            return Err(self.err(
                &raw.steps,
                "`steps` is empty",
                Some("a scenario needs at least one step"),
            ));
        }
        let driver_at = Spanned::new((), raw.driver.referenced, raw.driver.defined);
        let driver = raw
            .driver
            .value
            .resolve()
            .map_err(|(m, hint)| self.err(&driver_at, m, hint))?;
        let csi = self.csi_system(raw.bosh, raw.csi)?;
        self.driver_fits(&driver_at, &driver, csi.as_ref())?;
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
        // A `scale:` block's generated steps come first, each validated as if
        // written at the block (errors point there).
        if let Some((scale, at)) = csi
            .as_ref()
            .and_then(|c| c.bosh.as_ref())
            .and_then(|b| b.scale.clone().zip(scale_at.clone()))
        {
            for g in scale.expand(bosh::DEFAULT_DEPLOYMENT) {
                let s = Spanned::new(raw_step(g, &at), at.referenced, at.defined);
                steps.push(self.step(&mut ctx, s, false)?);
            }
        }
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
        let require_exercised = self.require_exercised(raw.require_exercised, &invariants)?;
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
            claims: self.claims(raw.claims, &invariants)?,
            invariants,
            require_exercised,
            rejected_on_purpose,
            converge_within,
            s3_backend: self.s3_backend(raw.s3_backend.as_ref(), system)?,
            csi,
        })
    }

    /// `s3_backend:` (COSI only): `rustfs` or `minio`.
    fn s3_backend(
        &self,
        raw: Option<&Spanned<String>>,
        system: System,
    ) -> Result<drivelab_fakes::s3::Backend, ScenarioError> {
        use drivelab_fakes::s3::Backend;
        let Some(b) = raw else {
            return Ok(Backend::default());
        };
        if system != System::Cosi {
            return Err(self.err(
                b,
                "`s3_backend` applies to COSI scenarios only",
                Some("remove it: CSI scenarios stand up no S3 backend"),
            ));
        }
        Backend::parse(b.value.trim()).ok_or_else(|| {
            self.err(
                b,
                format!("`{}` is not an S3 backend", b.value),
                Some("write `rustfs` or `minio`"),
            )
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
pub(crate) struct Ctx {
    pub(crate) bucket_classes: BTreeSet<String>,
    pub(crate) access_classes: BTreeSet<String>,
    pub(crate) claims: BTreeSet<(String, String)>,
    pub(crate) accesses: BTreeSet<(String, String)>,
    pub(crate) static_buckets: BTreeSet<String>,
    pub(crate) csi: Option<Csi>,
    pub(crate) volumes: BTreeSet<(String, String)>,
    pub(crate) pods: BTreeSet<(String, String)>,
    pub(crate) snapshots: BTreeSet<(String, String)>,
    pub(crate) backups: BTreeSet<String>,
    /// Backups paused by `pause_after` and not resumed yet, with where they paused.
    pub(crate) paused: BTreeMap<String, Spanned<()>>,
    /// The sides of every partition step so far (a `heal` must have one to heal).
    pub(crate) partitions: Vec<(Component, Component)>,
}

impl Ctx {
    pub(crate) fn system(&self) -> System {
        if self.csi.is_some() {
            System::Csi
        } else {
            System::Cosi
        }
    }

    /// Whether the CSI system stands up the BOSH backend.
    pub(crate) fn with_bosh(&self) -> bool {
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
        self.step_fits(ctx, &here, &s.value)?;
        let step = match s.value {
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
                Step::Concurrent(self.concurrent(ctx, &here, inner)?)
            }
            RawStep::DirectorDown(_) => Step::Bosh(BoshStep::DirectorDown),
            RawStep::DirectorUp(_) => Step::Bosh(BoshStep::DirectorUp),
            RawStep::CreateBucketClaim(x) => Step::Cosi(self.create_bucket_claim(ctx, &here, x)?),
            RawStep::GrantAccess(x) => Step::Cosi(self.grant_access(ctx, &here, x)?),
            RawStep::RevokeAccess(x) => Step::Cosi(self.revoke_access(ctx, &here, x)?),
            RawStep::DeleteBucketClaim(x) => Step::Cosi(self.delete_bucket_claim(ctx, &here, x)?),
            RawStep::Retry(x) => Step::Cosi(self.retry(ctx, &here, x)?),
            RawStep::CreateBucket(x) => Step::Cosi(self.create_bucket(ctx, &here, x)?),
            RawStep::CreateBackendBucket(x) => {
                Step::Cosi(self.create_backend_bucket(ctx, &here, x)?)
            }
            RawStep::CreateBackendPolicy(x) => {
                Step::Cosi(self.create_backend_policy(ctx, &here, x)?)
            }
            RawStep::CreateBackendUser(x) => Step::Cosi(self.create_backend_user(ctx, &here, x)?),
            RawStep::CreateVolume(x) => Step::Csi(self.create_volume(ctx, &here, x)?),
            RawStep::DeleteVolume(x) => Step::Csi(self.delete_volume(ctx, &here, x)?),
            RawStep::Publish(x) => Step::Csi(self.publish(ctx, &here, x)?),
            RawStep::Unpublish(x) => Step::Csi(self.unpublish(ctx, &here, x)?),
            RawStep::NodeStage(x) => Step::Csi(self.node_stage(ctx, &here, x)?),
            RawStep::NodePublish(x) => Step::Csi(self.node_publish(ctx, &here, x)?),
            RawStep::Deploy(x) => Step::Bosh(self.deploy(ctx, &here, x)?),
            RawStep::RollingUpdate(x) => Step::Bosh(self.rolling_update(ctx, &here, x)?),
            RawStep::RecreateVm(x) => Step::Bosh(self.recreate_vm(ctx, &here, x)?),
            RawStep::ResendCreateVolume(x) => Step::Csi(self.resend_create_volume(ctx, &here, x)?),
            RawStep::WriteBlocks(x) => Step::Bosh(self.write_blocks(ctx, &here, x)?),
            RawStep::Snapshot(x) => Step::Csi(self.snapshot(ctx, &here, x)?),
            RawStep::DeleteSnapshot(x) => Step::Csi(self.delete_snapshot(ctx, &here, x)?),
            RawStep::SpecSweep(x) => Step::Csi(self.spec_sweep(ctx, &here, x)?),
            RawStep::Backup(x) => Step::Bosh(self.backup(ctx, &here, x)?),
            RawStep::ReplaySession(x) => Step::Bosh(self.replay_session(ctx, &here, x)?),
            RawStep::ResumeBackup(x) => Step::Bosh(self.resume_backup(ctx, &here, x)?),
            RawStep::Wait(d) => Step::Bosh(self.wait(&here, &d)?),
            RawStep::Batch(inner) => {
                if nested {
                    return Err(self.err(
                        &here,
                        "`batch` cannot be part of `concurrent` or another `batch`",
                        None,
                    ));
                }
                let out = self.group(
                    ctx,
                    &here,
                    inner,
                    ("batch", 1),
                    "a batch takes create_volume, delete_volume, publish, unpublish, deploy, recreate_vm, rolling_update",
                )?;
                Step::Bosh(BoshStep::Batch(out))
            }
        };
        Ok(Located {
            value: step,
            line,
            col,
        })
    }

    /// A system's step only in a scenario of that system (BOSH steps only with its backend).
    fn step_fits(&self, ctx: &Ctx, here: &Spanned<()>, raw: &RawStep) -> Result<(), ScenarioError> {
        match (raw.owner(), &ctx.csi) {
            (Some(StepOwner::Csi | StepOwner::Bosh), None) => Err(self.err(
                here,
                "this is a CSI step, but the scenario has no `csi:` or `bosh:` section",
                Some("add `csi: {}` (a driver with its own backend) or `bosh: {}` (the BOSH backend), and a CSI driver"),
            )),
            (Some(StepOwner::Bosh), Some(c)) if c.bosh.is_none() => Err(self.err(
                here,
                "this step acts on the BOSH backend (its VMs, Director or IaaS block API), but the scenario stands up none",
                Some("replace `csi:` with `bosh:` to test the driver against the BOSH Director and CPI"),
            )),
            (Some(StepOwner::Cosi), Some(_)) => Err(self.err(
                here,
                "this is a COSI step, but the scenario drives the CSI system",
                Some("CSI steps: create_volume, delete_volume, publish, unpublish, node_stage, node_publish, resend_create_volume, snapshot, delete_snapshot, spec_sweep; with `bosh:` also deploy, recreate_vm, rolling_update, director_down, director_up, write_blocks, backup, replay_session, resume_backup"),
            )),
            _ => Ok(()),
        }
    }

    /// The actors of a `concurrent:` block: at least two, each a step its
    /// system lets run beside others.
    fn concurrent(
        &self,
        ctx: &mut Ctx,
        here: &Spanned<()>,
        inner: Vec<Spanned<RawStep>>,
    ) -> Result<Vec<Step>, ScenarioError> {
        self.group(
            ctx,
            here,
            inner,
            ("concurrent", 2),
            "concurrent blocks take create_bucket_claim, grant_access, revoke_access, delete_bucket_claim; or create_volume, delete_volume, publish, unpublish, deploy, recreate_vm, rolling_update",
        )
    }

    /// The steps of a group (`concurrent:` or `batch:`): at least `min`, each
    /// a step its system lets run beside others.
    fn group(
        &self,
        ctx: &mut Ctx,
        here: &Spanned<()>,
        inner: Vec<Spanned<RawStep>>,
        (keyword, min): (&str, usize),
        hint: &str,
    ) -> Result<Vec<Step>, ScenarioError> {
        if inner.len() < min {
            let n = if min == 1 { "one step" } else { "two steps" };
            return Err(self.err(here, &format!("`{keyword}` needs at least {n}"), None));
        }
        let mut out = Vec::new();
        for i in inner {
            let l = self.step(ctx, i, true)?;
            if !l.value.concurrent_ok() {
                return Err(ScenarioError {
                    path: self.path.to_path_buf(),
                    line: l.line,
                    col: l.col,
                    message: format!("`{}` cannot run inside `{keyword}`", l.value.keyword()),
                    hint: Some(hint.into()),
                });
            }
            out.push(l.value);
        }
        Ok(out)
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

    /// A volume an earlier `create_volume` made; `hint` says what the step needed it for.
    pub(crate) fn known_volume(
        &self,
        ctx: &Ctx,
        here: &Spanned<()>,
        namespace: &str,
        name: &str,
        hint: Option<&str>,
    ) -> Result<(), ScenarioError> {
        if ctx
            .volumes
            .contains(&(namespace.to_string(), name.to_string()))
        {
            return Ok(());
        }
        Err(self.err(
            here,
            format!("volume `{namespace}/{name}` is not created by an earlier step"),
            hint,
        ))
    }

    pub(crate) fn known_node(
        &self,
        ctx: &Ctx,
        here: &Spanned<()>,
        node: &str,
    ) -> Result<(), ScenarioError> {
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

    pub(crate) fn known_deployment(
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

    pub(crate) fn node_call(
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
        // A marked step goes unjudged for every other driver, so it may hold
        // only the design's shape: a spec-level assertion hidden in it would
        // never be checked against the drivers the spec is meant for.
        if e.reference_design {
            let spec_level: Vec<&str> = [
                ("code", e.code.is_some()),
                ("claim/ready", e.claim.is_some()),
                ("access/granted", e.access.is_some()),
                ("volume/bound", e.volume.is_some()),
                ("pod/running", e.pod.is_some()),
                ("snapshot/ready_to_use", e.snapshot.is_some()),
            ]
            .iter()
            .filter(|(_, given)| *given)
            .map(|(k, _)| *k)
            .collect();
            if !spec_level.is_empty() {
                return Err(self.err(
                    here,
                    format!(
                        "a `reference_design: true` expectation is skipped for other drivers, so it may not assert what the spec requires ({})",
                        spec_level.join(", ")
                    ),
                    Some("move those into an `expect` step of their own; keep only backend, driver_calls, iaas_disks or iaas_snapshots here"),
                ));
            }
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

pub(crate) fn check_dns(
    v: &Validator<'_>,
    at: &Spanned<()>,
    name: &str,
) -> Result<(), ScenarioError> {
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
