//! Fake COSI provisioner sidecar (plus the central controller's BucketClaim →
//! Bucket step): reconciles COSI objects held in the fake Kubernetes API and
//! calls the driver over its Unix socket with a real tonic client.
//!
//! Matched from the v0.2.x line (kubernetes-sigs/container-object-storage-interface,
//! release-0.2), as summarised in shared/DOMAIN.md:
//! - Bucket object name `bucket-<BucketClaim uid>`, passed to DriverCreateBucket as
//!   `name` with the BucketClass parameters; static claims (`existingBucketID`) get
//!   no create call.
//! - Account name `ba-<BucketAccess uid>` for DriverGrantBucketAccess, with the
//!   BucketAccessClass parameters and authentication type (anything but Key/IAM is
//!   sent as UnknownAuthenticationType).
//! - The grant reply must carry a non-empty `account_id` and exactly one
//!   credentials entry (`s3`), else the grant is treated as failed and retried.
//! - The credentials Secret has one key, `BucketInfo`, a JSON document
//!   `{metadata:{name:"bc-<BucketAccess uid>"}, spec:{bucketName,
//!   authenticationType, protocols, secretS3:{endpoint, region, accessKeyID,
//!   accessSecretKey}}}`; it is created once and never updated.
//! - Finalizers on BucketClaim/BucketAccess while the sidecar owns them; deletion
//!   (a `deletionTimestamp` set by the API server) runs the driver cleanup, then
//!   drops the finalizer.
//! - A granted access marks its Bucket (`bucketaccess-bucket-protection`); deleting
//!   a marked bucket's claim first deletes every BucketAccess of that claim
//!   (`BucketListener.Update`, sidecar/pkg/bucket), so each is revoked in turn,
//!   and goes on to DriverDeleteBucket without waiting for those revokes.
//! - AlreadyExists is an error like any other (requeue), never success.
//! - DriverDeleteBucket carries the Bucket's parameters as `delete_context`, and
//!   is sent only for deletionPolicy Delete; Retain makes no call and keeps the
//!   Bucket object.
//! - Which driver answers end an operation and which are retried: [`requeues`]
//!   (see "Retry rule" below), the one place both this fake and the lab's
//!   `converges` check read.
//! - Requeue with per-object exponential back-off, 100 ms doubling to 30 s, reset
//!   on success — on the lab's virtual clock (the engine owns the queue).
//!
//! Retry rule (v0.2.x): no driver error is final. `BucketListener.Add` and
//! `deleteBucketOp` (sidecar/pkg/bucket/bucket_controller.go) and
//! `BucketAccessListener.Add` and `deleteBucketAccessOp`
//! (sidecar/pkg/bucketaccess/bucketaccess_controller.go) return every error of
//! DriverCreateBucket / DriverDeleteBucket / DriverGrantBucketAccess /
//! DriverRevokeBucketAccess to the controller, whose `handleErr`
//! (container-object-storage-interface-api controller/controller.go) calls
//! `AddRateLimited` with no give-up threshold. The one exception:
//! `deleteBucketOp` takes NOT_FOUND from DriverDeleteBucket as deleted. So an
//! object whose driver call keeps failing — INVALID_ARGUMENT included — is
//! retried for ever; it never settles as "rejected".
//!
//! Not matched: watches/informers and resync periods (the engine decides what to
//! reconcile and when), the Bucket object's own finalizer, events on objects, leader election, multi-protocol
//! buckets (S3 only), and the v0.2 controller's validation webhooks.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::Duration;

use base64::Engine as _;
use drivelab_proto::cosi::identity_client::IdentityClient;
use drivelab_proto::cosi::provisioner_client::ProvisionerClient;
use drivelab_proto::cosi::{
    AuthenticationType, DriverCreateBucketRequest, DriverDeleteBucketRequest, DriverGetInfoRequest,
    DriverGrantBucketAccessRequest, DriverRevokeBucketAccessRequest,
};
use serde_json::{json, Value};
use tonic::transport::{Channel, Endpoint};

use crate::gate::{CallSpec, Delivery, Gate, Verdict};
use crate::history::{CallId, Component, EventKind, Outcome};
use crate::json::{self, at, bool_at};
use crate::kube::{Kind, KubeError, KubeFake};
use crate::ops::Op;
use crate::secret::Secret;

/// First back-off after a failure.
pub const BACKOFF_BASE: Duration = Duration::from_millis(100);
/// Back-off ceiling.
pub const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// What the sidecar sees when the link to the driver is cut before the call.
const CUT_MESSAGE: &str = "transport: connection refused or reset";
/// What the sidecar sees when the driver's connection dies under a call.
const CONNECTION_LOST: &str = "transport: connection to the driver lost";
/// Finalizer the sidecar puts on BucketClaims it works on.
pub const CLAIM_FINALIZER: &str = "cosi.objectstorage.k8s.io/bucketclaim-protection";
/// Finalizer the sidecar puts on BucketAccesses it works on.
pub const ACCESS_FINALIZER: &str = "cosi.objectstorage.k8s.io/bucketaccess-protection";
/// Finalizer a successful grant puts on the Bucket object: while it is there,
/// deleting the bucket first deletes every BucketAccess of its claim.
pub const ACCESSED_BUCKET_FINALIZER: &str =
    "cosi.objectstorage.k8s.io/bucketaccess-bucket-protection";
/// Default per-call deadline, in real time (a hung driver must not hang the
/// lab): the external-provisioner's `--timeout` default, 10 s. A scenario's
/// `driver: { call_timeout: … }` overrides it ([`CosiSidecar::set_call_timeout`]).
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Kept for callers of the old name.
pub const CALL_TIMEOUT: Duration = DEFAULT_CALL_TIMEOUT;

/// The history's message for a call cut at its deadline.
pub fn deadline_message(rpc: &str, deadline: Duration) -> String {
    format!(
        "{rpc}: the driver did not answer within the call deadline ({}, call_timeout); the sidecar cancelled the call and will retry with back-off",
        show_duration(deadline)
    )
}

fn show_duration(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

/// Errors that stop the sidecar itself (not driver errors, which are requeued).
#[derive(Debug, thiserror::Error)]
pub enum SidecarError {
    /// The driver socket could not be reached.
    #[error("cannot connect to the driver at {path}: {source}")]
    Connect {
        path: PathBuf,
        source: tonic::transport::Error,
    },
    /// DriverGetInfo failed.
    #[error("DriverGetInfo failed: {0}")]
    Info(tonic::Status),
    /// The Kubernetes fake refused something the sidecar needs.
    #[error("kubernetes API: {0}")]
    Kube(#[from] KubeError),
    /// A COSI object is malformed (missing a required field).
    #[error("{kind} {name}: {what}")]
    Malformed {
        kind: &'static str,
        name: String,
        what: String,
    },
}

/// What the engine should do with an object after one reconcile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reconcile {
    /// Nothing more to do.
    Done,
    /// Try again after this (virtual) delay; `reason` says why.
    Requeue { after: Duration, reason: String },
}

/// A COSI object the sidecar reconciles.
#[derive(
    Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub enum Target {
    /// A BucketClaim (namespace, name).
    Claim { namespace: String, name: String },
    /// A BucketAccess (namespace, name).
    Access { namespace: String, name: String },
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Claim { namespace, name } => write!(f, "bucketclaim {namespace}/{name}"),
            Target::Access { namespace, name } => write!(f, "bucketaccess {namespace}/{name}"),
        }
    }
}

/// The driver RPCs the sidecar makes.
#[derive(
    Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub enum DriverOp {
    /// Provisioner.DriverCreateBucket
    CreateBucket,
    /// Provisioner.DriverDeleteBucket
    DeleteBucket,
    /// Provisioner.DriverGrantBucketAccess
    GrantBucketAccess,
    /// Provisioner.DriverRevokeBucketAccess
    RevokeBucketAccess,
}

crate::declare_ops!(
    /// The COSI RPCs this sidecar sends a driver (what the sidecar→driver gate
    /// records and faults aim at).
    pub DRIVER_RPCS {
        DRIVER_GET_INFO = "DriverGetInfo",
        DRIVER_CREATE_BUCKET = "DriverCreateBucket",
        DRIVER_DELETE_BUCKET = "DriverDeleteBucket",
        DRIVER_GRANT_BUCKET_ACCESS = "DriverGrantBucketAccess",
        DRIVER_REVOKE_BUCKET_ACCESS = "DriverRevokeBucketAccess",
    }
);

/// The v0.2.x sidecar's retry rule (module doc, "Retry rule"): whether a
/// driver answer with `code` to `op` leaves the object requeued. OK never
/// does; NOT_FOUND to DriverDeleteBucket counts as deleted; every other error
/// of every RPC is retried with back-off, for ever.
pub fn requeues(op: DriverOp, code: tonic::Code) -> bool {
    match (op, code) {
        (_, tonic::Code::Ok) => false,
        (DriverOp::DeleteBucket, tonic::Code::NotFound) => false,
        _ => true,
    }
}

impl DriverOp {
    /// The op for an RPC name as on the wire (`DriverRevokeBucketAccess`).
    pub fn from_rpc(rpc: &str) -> Option<DriverOp> {
        [
            DriverOp::CreateBucket,
            DriverOp::DeleteBucket,
            DriverOp::GrantBucketAccess,
            DriverOp::RevokeBucketAccess,
        ]
        .into_iter()
        .find(|op| op.rpc() == rpc)
    }

    /// The RPC, as the gate records it.
    pub fn name(self) -> Op {
        match self {
            DriverOp::CreateBucket => DRIVER_CREATE_BUCKET,
            DriverOp::DeleteBucket => DRIVER_DELETE_BUCKET,
            DriverOp::GrantBucketAccess => DRIVER_GRANT_BUCKET_ACCESS,
            DriverOp::RevokeBucketAccess => DRIVER_REVOKE_BUCKET_ACCESS,
        }
    }

    /// The RPC name as on the wire.
    pub fn rpc(self) -> &'static str {
        self.name().as_str()
    }
}

/// A request's parameters (a class's or Bucket's `parameters`), shared
/// between the requests that send the same map: every grant of a class
/// does, and each exchange held a copy of its own (~650 B a grant).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Parameters(Arc<BTreeMap<String, String>>);

impl std::ops::Deref for Parameters {
    type Target = BTreeMap<String, String>;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl From<BTreeMap<String, String>> for Parameters {
    fn from(map: BTreeMap<String, String>) -> Self {
        Self(Arc::new(map))
    }
}

impl Parameters {
    /// As the gRPC request's map.
    fn to_proto(&self) -> std::collections::HashMap<String, String> {
        self.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    }
}

/// Written as the map it holds.
impl serde::Serialize for Parameters {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

/// Read as one with equal maps read before (see [`crate::shared::reading`]).
impl<'de> serde::Deserialize<'de> for Parameters {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        BTreeMap::deserialize(d).map(|map| crate::shared::read(Self::from(map)))
    }
}

/// A request as the sidecar sent it, kept so the lab can send it again.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum DriverRequest {
    /// DriverCreateBucket
    Create {
        name: String,
        parameters: Parameters,
    },
    /// DriverDeleteBucket (`delete_context` = the Bucket's parameters, as the v0.2 sidecar sends)
    Delete {
        bucket_id: String,
        context: Parameters,
    },
    /// DriverGrantBucketAccess
    Grant {
        bucket_id: String,
        name: String,
        auth: i32,
        parameters: Parameters,
    },
    /// DriverRevokeBucketAccess
    Revoke {
        bucket_id: String,
        account_id: String,
    },
}

impl DriverRequest {
    /// Which RPC this is.
    pub fn op(&self) -> DriverOp {
        match self {
            DriverRequest::Create { .. } => DriverOp::CreateBucket,
            DriverRequest::Delete { .. } => DriverOp::DeleteBucket,
            DriverRequest::Grant { .. } => DriverOp::GrantBucketAccess,
            DriverRequest::Revoke { .. } => DriverOp::RevokeBucketAccess,
        }
    }

    /// The idempotency key: bucket name, bucket id or account name/id.
    pub fn key(&self) -> &str {
        match self {
            DriverRequest::Create { name, .. } => name,
            DriverRequest::Delete { bucket_id, .. } => bucket_id,
            DriverRequest::Grant { name, .. } => name,
            DriverRequest::Revoke { account_id, .. } => account_id,
        }
    }
}

/// S3 credentials as a driver handed them out.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct S3Credentials {
    /// `accessKeyID`
    pub access_key_id: String,
    /// `accessSecretKey`
    pub secret: Secret,
    /// `endpoint`
    pub endpoint: String,
    /// `region`
    pub region: String,
}

/// What the driver answered.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum DriverReply {
    /// Create answered OK.
    Created { bucket_id: String },
    /// Grant answered OK. `credentials` is None when the reply was malformed.
    Granted {
        account_id: String,
        credentials: Option<S3Credentials>,
        credential_entries: usize,
    },
    /// Delete/Revoke answered OK.
    Empty,
    /// A gRPC error.
    Failed {
        #[serde(with = "crate::record::grpc_code")]
        code: tonic::Code,
        message: String,
    },
}

impl DriverReply {
    /// The gRPC code (`Ok` for any successful reply, malformed or not).
    pub fn code(&self) -> tonic::Code {
        match self {
            DriverReply::Failed { code, .. } => *code,
            _ => tonic::Code::Ok,
        }
    }

    /// The gRPC code name (`OK`, `ALREADY_EXISTS`, ...).
    pub fn code_name(&self) -> String {
        code_name(self.code())
    }
}

/// One sidecar→driver exchange, kept for checks (it holds secrets: it is
/// written only into a run's record, its secrets as fingerprints).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Exchange {
    /// The history call id.
    pub call: CallId,
    /// The request as sent.
    pub request: DriverRequest,
    /// The reply.
    pub reply: DriverReply,
    /// True if the lab re-sent a recorded request (a `retry` step), not a reconcile.
    pub replay: bool,
    /// Who gave the reply: the checks judge the driver only by its own answers.
    pub answered_by: AnsweredBy,
}

/// Who gave an exchange's reply. A call the lab answered, cut, or crashed the
/// driver under says nothing about what the driver would have answered.
#[derive(Copy, Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum AnsweredBy {
    /// The driver (including its own failures: a hang, a connection it dropped
    /// while the lab crashed nothing).
    Driver,
    /// The lab's fault hook, in the driver's place (an injected error).
    Injected,
    /// Nobody: the lab cut the call or lost its reply (partition,
    /// drop_response, crash_driver on this call), or crashed the driver while
    /// the call was in flight.
    Lost,
}

/// One sidecar→driver RPC through the gate (shared by the COSI and CSI
/// sidecars): the hook may answer it, cut it before the driver sees it, or
/// lose the reply after the driver committed. Both cuts reach the caller as
/// UNAVAILABLE, as a dead connection would; the history records what happened,
/// and the third value says who answered.
pub async fn through_gate<T>(
    gate: &Gate,
    call: &CallSpec,
    rpc: impl std::future::Future<Output = Result<T, (tonic::Code, String)>>,
) -> (CallId, Result<T, (tonic::Code, String)>, AnsweredBy) {
    let cut = || Err((tonic::Code::Unavailable, CUT_MESSAGE.to_string()));
    let (id, verdict) = gate.enter(call).await;
    let mut by = AnsweredBy::Driver;
    let answered = match verdict {
        Verdict::Reject(r) => {
            by = AnsweredBy::Injected;
            Err((code_from_name(&r.code), r.message))
        }
        Verdict::Cut => {
            gate.cut_before(id);
            return (id, cut(), AnsweredBy::Lost);
        }
        Verdict::Proceed => {
            let from = gate.history().len();
            let answered = rpc.await;
            if matches!(&answered, Err((tonic::Code::Unavailable, m)) if m == CONNECTION_LOST)
                && crashed_since(gate.history(), from)
            {
                by = AnsweredBy::Lost;
            }
            answered
        }
    };
    let outcome = match &answered {
        Err((code, message)) => Outcome::Grpc {
            code: code_name(*code),
            message: message.clone(),
        },
        Ok(_) => Outcome::Grpc {
            code: "OK".into(),
            message: String::new(),
        },
    };
    match gate.leave(id, call, outcome).await {
        Delivery::Deliver => (id, answered, by),
        // The driver committed; the caller sees what a lost reply looks like.
        Delivery::Cut => (id, cut(), AnsweredBy::Lost),
    }
}

/// Did the lab crash the driver after history index `from` (a `crash_driver`
/// fault fired, on this call or any other in flight)?
fn crashed_since(history: &crate::history::History, from: usize) -> bool {
    history
        .events_from(from)
        .iter()
        .any(|e| matches!(&e.kind, EventKind::Fault { fault, .. } if fault == "crash_driver"))
}

/// `OK`, `ALREADY_EXISTS`, ... as in the gRPC spec.
pub fn code_name(code: tonic::Code) -> String {
    let s = match code {
        tonic::Code::Ok => "OK",
        tonic::Code::Cancelled => "CANCELLED",
        tonic::Code::Unknown => "UNKNOWN",
        tonic::Code::InvalidArgument => "INVALID_ARGUMENT",
        tonic::Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        tonic::Code::NotFound => "NOT_FOUND",
        tonic::Code::AlreadyExists => "ALREADY_EXISTS",
        tonic::Code::PermissionDenied => "PERMISSION_DENIED",
        tonic::Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        tonic::Code::FailedPrecondition => "FAILED_PRECONDITION",
        tonic::Code::Aborted => "ABORTED",
        tonic::Code::OutOfRange => "OUT_OF_RANGE",
        tonic::Code::Unimplemented => "UNIMPLEMENTED",
        tonic::Code::Internal => "INTERNAL",
        tonic::Code::Unavailable => "UNAVAILABLE",
        tonic::Code::DataLoss => "DATA_LOSS",
        tonic::Code::Unauthenticated => "UNAUTHENTICATED",
    };
    s.to_string()
}

/// Open a tonic channel to a Unix socket.
pub async fn connect_unix(path: &Path) -> Result<Channel, tonic::transport::Error> {
    connect_unix_with(path, |e| e).await
}

/// Open a tonic channel to a Unix socket with endpoint settings of the
/// caller's (HTTP/2 windows, say).
pub async fn connect_unix_with(
    path: &Path,
    tune: impl FnOnce(Endpoint) -> Endpoint,
) -> Result<Channel, tonic::transport::Error> {
    let path = path.to_path_buf();
    // The URI is required by tonic but unused: the connector always dials the socket.
    tune(Endpoint::from_static("http://[::1]:50051"))
        .connect_timeout(Duration::from_secs(10))
        .connect_with_connector(tower::service_fn(move |_| {
            let path = path.clone();
            async move {
                let s = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(s))
            }
        }))
        .await
}

/// The Kubernetes fake the sidecar talks to, swappable when the fake restarts.
pub type KubeSlot = Arc<RwLock<KubeFake>>;

/// The fake sidecar for one driver.
pub struct CosiSidecar {
    kube_slot: KubeSlot,
    gate: Gate,
    socket: PathBuf,
    provisioner: Mutex<ProvisionerClient<Channel>>,
    driver_name: String,
    failures: Mutex<BTreeMap<Target, u32>>,
    exchanges: Mutex<Vec<Exchange>>,
    /// Every parameter map sent, each held once.
    parameters: crate::shared::Shared<Parameters>,
    /// Targets its own writes woke ([`CosiSidecar::take_woken`]).
    woken: Mutex<Vec<Target>>,
    /// Set after a transport failure: dial afresh before the next call, as
    /// grpc-go's reconnect would, rather than trust a channel to a dead peer.
    redial: std::sync::atomic::AtomicBool,
    /// Per-call deadline in milliseconds (real time).
    call_timeout_ms: std::sync::atomic::AtomicU64,
}

impl CosiSidecar {
    /// Set the deadline of every later driver call (the scenario's `call_timeout`).
    pub fn set_call_timeout(&self, d: Duration) {
        let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1);
        self.call_timeout_ms
            .store(ms, std::sync::atomic::Ordering::SeqCst);
    }

    /// The current per-call deadline.
    pub fn call_timeout(&self) -> Duration {
        Duration::from_millis(
            self.call_timeout_ms
                .load(std::sync::atomic::Ordering::SeqCst),
        )
    }

    /// The string map at `path` of `obj` as a request's parameters, sharing
    /// an equal map sent before.
    fn parameters(&self, obj: &Value, path: &[&str]) -> Parameters {
        self.parameters.get(string_map(obj, path).into())
    }

    /// Connect to the driver at `socket` and learn its name (DriverGetInfo).
    pub async fn connect(socket: &Path, kube: KubeSlot, gate: Gate) -> Result<Self, SidecarError> {
        let channel = connect_unix(socket)
            .await
            .map_err(|source| SidecarError::Connect {
                path: socket.to_path_buf(),
                source,
            })?;
        let call = CallSpec::new(Component::Sidecar, Component::Driver, DRIVER_GET_INFO, "");
        let (id, _) = gate.enter(&call).await;
        let mut identity = IdentityClient::new(channel.clone());
        let res = tokio::time::timeout(
            CALL_TIMEOUT,
            identity.driver_get_info(DriverGetInfoRequest {}),
        )
        .await;
        let res = match res {
            Ok(r) => r,
            Err(_) => Err(tonic::Status::deadline_exceeded("DriverGetInfo timed out")),
        };
        gate.leave(id, &call, grpc_outcome(&res)).await;
        let info = res.map_err(SidecarError::Info)?.into_inner();
        Ok(Self {
            kube_slot: kube,
            gate,
            socket: socket.to_path_buf(),
            provisioner: Mutex::new(ProvisionerClient::new(channel)),
            driver_name: info.name,
            failures: Mutex::default(),
            exchanges: Mutex::default(),
            parameters: Default::default(),
            woken: Mutex::default(),
            redial: Default::default(),
            call_timeout_ms: std::sync::atomic::AtomicU64::new(
                DEFAULT_CALL_TIMEOUT.as_millis() as u64
            ),
        })
    }

    /// Re-dial the driver (after it was restarted on the same socket).
    pub async fn reconnect(&self) -> Result<(), SidecarError> {
        let channel = connect_unix(&self.socket)
            .await
            .map_err(|source| SidecarError::Connect {
                path: self.socket.clone(),
                source,
            })?;
        *lock(&self.provisioner) = ProvisionerClient::new(channel);
        Ok(())
    }

    /// The kube fake, through a handle that holds what the sidecar writes
    /// as text: it reads each access and Secret back a few times while it
    /// reconciles them, then leaves them for the rest of the run.
    fn kube(&self) -> KubeFake {
        (self.kube_slot.read().unwrap_or_else(|p| p.into_inner())).holding_text()
    }

    /// The name the driver reported.
    pub fn driver_name(&self) -> &str {
        &self.driver_name
    }

    /// Every exchange so far, in order.
    pub fn exchanges(&self) -> Vec<Exchange> {
        lock(&self.exchanges).clone()
    }

    /// `f` of every exchange so far, read in place (a copy of them all was
    /// a kilobyte a grant). `f` must not call back into the sidecar.
    pub fn with_exchanges<R>(&self, f: impl FnOnce(&[Exchange]) -> R) -> R {
        f(&lock(&self.exchanges))
    }

    /// Every exchange so far, moved out (the end of a run, which reads none
    /// after: a copy of each would be held beside the record as it is sealed).
    pub fn take_exchanges(&self) -> Vec<Exchange> {
        std::mem::take(&mut *lock(&self.exchanges))
    }

    /// How many exchanges so far.
    pub fn exchange_count(&self) -> usize {
        lock(&self.exchanges).len()
    }

    /// Reconcile one object once.
    pub async fn reconcile(&self, target: &Target) -> Result<Reconcile, SidecarError> {
        let r = match target {
            Target::Claim { namespace, name } => self.reconcile_claim(namespace, name).await?,
            Target::Access { namespace, name } => self.reconcile_access(namespace, name).await?,
        };
        Ok(match r {
            Step::Done => {
                lock(&self.failures).remove(target);
                Reconcile::Done
            }
            Step::Retry(reason) => {
                let mut failures = lock(&self.failures);
                let n = failures.entry(target.clone()).or_insert(0);
                let after = backoff(*n);
                *n = n.saturating_add(1);
                Reconcile::Requeue { after, reason }
            }
        })
    }

    /// Send a recorded request again, unchanged or with `parameters` overriding
    /// the original ones (create and grant only). Nothing in Kubernetes is updated.
    pub async fn replay(
        &self,
        request: DriverRequest,
        parameters: Option<&BTreeMap<String, String>>,
        auth: Option<i32>,
    ) -> Exchange {
        let request = match (request, parameters, auth) {
            (
                DriverRequest::Create {
                    name,
                    parameters: p,
                },
                over,
                _,
            ) => DriverRequest::Create {
                name,
                parameters: merged(p, over),
            },
            (
                DriverRequest::Grant {
                    bucket_id,
                    name,
                    auth: a,
                    parameters: p,
                },
                over,
                new_auth,
            ) => DriverRequest::Grant {
                bucket_id,
                name,
                auth: new_auth.unwrap_or(a),
                parameters: merged(p, over),
            },
            (other, _, _) => other,
        };
        self.send(request, true).await
    }

    async fn reconcile_claim(&self, ns: &str, name: &str) -> Result<Step, SidecarError> {
        let Some(claim) = self.kube().get(Kind::BucketClaim, Some(ns), name)? else {
            return Ok(Step::Done);
        };
        let bucket_name = str_at(&claim, &["status", "bucketName"]);
        if deleting(&claim) {
            return self.delete_claim(ns, name, bucket_name.as_deref()).await;
        }
        self.ensure_finalizer(Kind::BucketClaim, Some(ns), name, &claim, CLAIM_FINALIZER)?;
        let bucket_name = match bucket_name {
            Some(b) => b,
            None => self.bind_claim(ns, name, &claim)?,
        };
        let Some(bucket) = self.kube().get(Kind::Bucket, None, &bucket_name)? else {
            return Ok(Step::Retry(format!("bucket {bucket_name} not found")));
        };
        if bool_at(&bucket, &["status", "bucketReady"]) {
            self.mark_claim_ready(ns, name, &bucket_name)?;
            return Ok(Step::Done);
        }
        if let Some(existing) = str_at(&bucket, &["spec", "existingBucketID"]) {
            // Static bucket: no driver call, as the real sidecar.
            self.kube().merge_patch(
                Kind::Bucket,
                None,
                &bucket_name,
                json!({"status": {"bucketReady": true, "bucketID": existing}}),
            )?;
            self.mark_claim_ready(ns, name, &bucket_name)?;
            return Ok(Step::Done);
        }
        let parameters = self.parameters(&bucket, &["spec", "parameters"]);
        let ex = self
            .send(
                DriverRequest::Create {
                    name: bucket_name.clone(),
                    parameters,
                },
                false,
            )
            .await;
        if let Some(reason) = requeue_reason(&ex) {
            return Ok(Step::Retry(reason));
        }
        match ex.reply {
            DriverReply::Created { bucket_id } if !bucket_id.is_empty() => {
                self.kube().merge_patch(
                    Kind::Bucket,
                    None,
                    &bucket_name,
                    json!({"status": {"bucketReady": true, "bucketID": bucket_id}}),
                )?;
                self.mark_claim_ready(ns, name, &bucket_name)?;
                Ok(Step::Done)
            }
            _ => Ok(Step::Retry("driver returned an empty bucket_id".into())),
        }
    }

    /// The controller's half: make the Bucket object for a new claim.
    fn bind_claim(&self, ns: &str, name: &str, claim: &Value) -> Result<String, SidecarError> {
        let malformed = |what: &str| SidecarError::Malformed {
            kind: "BucketClaim",
            name: format!("{ns}/{name}"),
            what: what.to_string(),
        };
        let uid =
            str_at(claim, &["metadata", "uid"]).ok_or_else(|| malformed("no metadata.uid"))?;
        let existing = str_at(claim, &["spec", "existingBucketName"]);
        let bucket_name = match &existing {
            Some(b) => b.clone(),
            None => format!("bucket-{uid}"),
        };
        if existing.is_none() {
            let class_name = str_at(claim, &["spec", "bucketClassName"])
                .ok_or_else(|| malformed("no spec.bucketClassName"))?;
            let class = self
                .kube()
                .get(Kind::BucketClass, None, &class_name)?
                .ok_or_else(|| malformed(&format!("BucketClass {class_name} not found")))?;
            let bucket = json!({
                "apiVersion": "objectstorage.k8s.io/v1alpha1",
                "kind": "Bucket",
                "metadata": {"name": bucket_name},
                "spec": {
                    "driverName": class.get("driverName").cloned().unwrap_or(Value::Null),
                    "bucketClassName": class_name,
                    "bucketClaim": {"namespace": ns, "name": name, "uid": uid},
                    "protocols": ["S3"],
                    "parameters": class.get("parameters").cloned().unwrap_or_else(|| json!({})),
                    "deletionPolicy": class.get("deletionPolicy").cloned().unwrap_or_else(|| json!("Retain")),
                },
            });
            match self.kube().create(Kind::Bucket, bucket) {
                Ok(_) | Err(KubeError::AlreadyExists { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        self.kube().merge_patch(
            Kind::BucketClaim,
            Some(ns),
            name,
            json!({"status": {"bucketName": bucket_name}}),
        )?;
        Ok(bucket_name)
    }

    fn mark_claim_ready(&self, ns: &str, name: &str, bucket: &str) -> Result<(), SidecarError> {
        self.kube().merge_patch(
            Kind::BucketClaim,
            Some(ns),
            name,
            json!({"status": {"bucketReady": true, "bucketName": bucket}}),
        )?;
        Ok(())
    }

    async fn delete_claim(
        &self,
        ns: &str,
        name: &str,
        bucket_name: Option<&str>,
    ) -> Result<Step, SidecarError> {
        if let Some(bucket_name) = bucket_name {
            if let Some(bucket) = self.kube().get(Kind::Bucket, None, bucket_name)? {
                self.delete_accesses_of(&bucket, ns, name)?;
                let policy =
                    str_at(&bucket, &["spec", "deletionPolicy"]).unwrap_or_else(|| "Retain".into());
                let bucket_id = str_at(&bucket, &["status", "bucketID"]);
                if policy == "Delete" {
                    if let Some(bucket_id) = bucket_id {
                        let context = self.parameters(&bucket, &["spec", "parameters"]);
                        let ex = self
                            .send(DriverRequest::Delete { bucket_id, context }, false)
                            .await;
                        if let Some(reason) = requeue_reason(&ex) {
                            return Ok(Step::Retry(reason));
                        }
                    }
                    self.kube().delete(Kind::Bucket, None, bucket_name)?;
                } else {
                    // Retain: no driver call; the Bucket object stays, released from its claim.
                    self.kube().merge_patch(
                        Kind::Bucket,
                        None,
                        bucket_name,
                        json!({"spec": {"bucketClaim": null}}),
                    )?;
                }
            }
        }
        self.drop_finalizer(Kind::BucketClaim, Some(ns), name, CLAIM_FINALIZER)?;
        Ok(Step::Done)
    }

    /// The Bucket controller's first deletion step: once a grant has marked the
    /// bucket, delete every BucketAccess of its claim (their own deletion then
    /// revokes), then unmark it. It does not wait for those revokes, so the
    /// driver may see DriverDeleteBucket before them.
    fn delete_accesses_of(
        &self,
        bucket: &Value,
        ns: &str,
        claim: &str,
    ) -> Result<(), SidecarError> {
        if !has_finalizer(bucket, ACCESSED_BUCKET_FINALIZER) {
            return Ok(());
        }
        for access in self.kube().list(Kind::BucketAccess, Some(ns))? {
            if str_at(&access, &["spec", "bucketClaimName"]).as_deref() != Some(claim) {
                continue;
            }
            let Some(name) = str_at(&access, &["metadata", "name"]) else {
                continue;
            };
            match self.kube().delete(Kind::BucketAccess, Some(ns), &name) {
                Ok(_) | Err(KubeError::NotFound { .. }) => {}
                Err(e) => return Err(e.into()),
            }
            lock(&self.woken).push(Target::Access {
                namespace: ns.to_string(),
                name,
            });
        }
        let bucket_name = str_at(bucket, &["metadata", "name"]).unwrap_or_default();
        self.drop_finalizer(Kind::Bucket, None, &bucket_name, ACCESSED_BUCKET_FINALIZER)
    }

    /// Objects this sidecar changed in a way its watch would deliver back to it
    /// (so far: the BucketAccesses a claim's deletion deleted), taken once.
    pub fn take_woken(&self) -> Vec<Target> {
        std::mem::take(&mut *lock(&self.woken))
    }

    async fn reconcile_access(&self, ns: &str, name: &str) -> Result<Step, SidecarError> {
        let Some(access) = self.kube().get(Kind::BucketAccess, Some(ns), name)? else {
            return Ok(Step::Done);
        };
        let malformed = |what: &str| SidecarError::Malformed {
            kind: "BucketAccess",
            name: format!("{ns}/{name}"),
            what: what.to_string(),
        };
        let account_id = str_at(&access, &["status", "accountID"]);
        let secret_name = str_at(&access, &["spec", "credentialsSecretName"]);
        if deleting(&access) {
            if let Some(account_id) = account_id {
                let bucket_id = str_at(&access, &["status", "bucketID"]).unwrap_or_default();
                let ex = self
                    .send(
                        DriverRequest::Revoke {
                            bucket_id,
                            account_id,
                        },
                        false,
                    )
                    .await;
                if let Some(reason) = requeue_reason(&ex) {
                    return Ok(Step::Retry(reason));
                }
            }
            if let Some(s) = secret_name {
                match self.kube().delete(Kind::Secret, Some(ns), &s) {
                    Ok(_) | Err(KubeError::NotFound { .. }) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            self.drop_finalizer(Kind::BucketAccess, Some(ns), name, ACCESS_FINALIZER)?;
            return Ok(Step::Done);
        }
        if bool_at(&access, &["status", "accessGranted"]) {
            return Ok(Step::Done);
        }
        self.ensure_finalizer(
            Kind::BucketAccess,
            Some(ns),
            name,
            &access,
            ACCESS_FINALIZER,
        )?;
        let uid =
            str_at(&access, &["metadata", "uid"]).ok_or_else(|| malformed("no metadata.uid"))?;
        let claim_name = str_at(&access, &["spec", "bucketClaimName"])
            .ok_or_else(|| malformed("no spec.bucketClaimName"))?;
        let class_name = str_at(&access, &["spec", "bucketAccessClassName"])
            .ok_or_else(|| malformed("no spec.bucketAccessClassName"))?;
        let secret_name = secret_name.ok_or_else(|| malformed("no spec.credentialsSecretName"))?;
        let Some(claim) = self.kube().get(Kind::BucketClaim, Some(ns), &claim_name)? else {
            return Ok(Step::Retry(format!(
                "bucketclaim {ns}/{claim_name} not found"
            )));
        };
        if !bool_at(&claim, &["status", "bucketReady"]) {
            return Ok(Step::Retry(format!(
                "bucketclaim {ns}/{claim_name} not ready"
            )));
        }
        let bucket_name = str_at(&claim, &["status", "bucketName"]).unwrap_or_default();
        let Some(bucket) = self.kube().get(Kind::Bucket, None, &bucket_name)? else {
            return Ok(Step::Retry(format!("bucket {bucket_name} not found")));
        };
        let bucket_id = str_at(&bucket, &["status", "bucketID"]).unwrap_or_default();
        let Some(class) = self
            .kube()
            .get(Kind::BucketAccessClass, None, &class_name)?
        else {
            return Ok(Step::Retry(format!(
                "bucketaccessclass {class_name} not found"
            )));
        };
        let auth_name = str_at(&class, &["authenticationType"]).unwrap_or_default();
        let auth = match auth_name.as_str() {
            "Key" => AuthenticationType::Key,
            "IAM" => AuthenticationType::Iam,
            _ => AuthenticationType::UnknownAuthenticationType,
        } as i32;
        let request = DriverRequest::Grant {
            bucket_id: bucket_id.clone(),
            name: format!("ba-{uid}"),
            auth,
            parameters: self.parameters(&class, &["parameters"]),
        };
        let ex = self.send(request, false).await;
        if let Some(reason) = requeue_reason(&ex) {
            return Ok(Step::Retry(reason));
        }
        let DriverReply::Granted {
            account_id,
            credentials: creds,
            credential_entries: entries,
        } = ex.reply
        else {
            return Ok(Step::Retry(
                "DriverGrantBucketAccess: the driver's reply was not a grant".into(),
            ));
        };
        if account_id.is_empty() {
            return Ok(Step::Retry("driver returned an empty account_id".into()));
        }
        let Some(creds) = creds.filter(|_| entries == 1) else {
            return Ok(Step::Retry(format!(
                "driver returned {entries} credential entries, want exactly one (s3)"
            )));
        };
        // Created once, never updated: an existing Secret is left as it is.
        if self
            .kube()
            .get(Kind::Secret, Some(ns), &secret_name)?
            .is_none()
        {
            let info = json!({
                "metadata": {"name": format!("bc-{uid}")},
                "spec": {
                    "bucketName": bucket_id,
                    "authenticationType": auth_name,
                    "protocols": ["s3"],
                    "secretS3": {
                        "endpoint": creds.endpoint,
                        "region": creds.region,
                        "accessKeyID": creds.access_key_id,
                        "accessSecretKey": creds.secret.expose(),
                    },
                    "secretAzure": null,
                },
            });
            let encoded = base64::engine::general_purpose::STANDARD.encode(info.to_string());
            let secret = json!({
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": secret_name, "namespace": ns},
                "type": "Opaque",
                "data": {"BucketInfo": encoded},
            });
            match self.kube().create(Kind::Secret, secret) {
                Ok(_) | Err(KubeError::AlreadyExists { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        // Re-read: another grant on the same bucket may have added it meanwhile.
        if let Some(bucket) = self.kube().get(Kind::Bucket, None, &bucket_name)? {
            self.ensure_finalizer(
                Kind::Bucket,
                None,
                &bucket_name,
                &bucket,
                ACCESSED_BUCKET_FINALIZER,
            )?;
        }
        self.kube().merge_patch(
            Kind::BucketAccess,
            Some(ns),
            name,
            json!({"status": {"accessGranted": true, "accountID": account_id, "bucketID": bucket_id}}),
        )?;
        Ok(Step::Done)
    }

    /// Protect an object the sidecar has started working on, as the real one does,
    /// so that deleting it waits for the driver cleanup.
    fn ensure_finalizer(
        &self,
        kind: Kind,
        ns: Option<&str>,
        name: &str,
        obj: &Value,
        finalizer: &str,
    ) -> Result<(), SidecarError> {
        if has_finalizer(obj, finalizer) {
            return Ok(());
        }
        let mut list: Vec<Value> = at(obj, &["metadata", "finalizers"])
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        list.push(json!(finalizer));
        self.kube()
            .merge_patch(kind, ns, name, json!({"metadata": {"finalizers": list}}))?;
        Ok(())
    }

    /// Cleanup done: drop `finalizer` so the API server completes the deletion.
    fn drop_finalizer(
        &self,
        kind: Kind,
        ns: Option<&str>,
        name: &str,
        finalizer: &str,
    ) -> Result<(), SidecarError> {
        let Some(obj) = self.kube().get(kind, ns, name)? else {
            return Ok(());
        };
        let list: Vec<Value> = at(&obj, &["metadata", "finalizers"])
            .and_then(Value::as_array)
            .map(|l| {
                l.iter()
                    .filter(|f| f.as_str() != Some(finalizer))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        match self
            .kube()
            .merge_patch(kind, ns, name, json!({"metadata": {"finalizers": list}}))
        {
            Ok(_) | Err(KubeError::NotFound { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// One driver RPC through the gate, recorded as an exchange.
    async fn send(&self, request: DriverRequest, replay: bool) -> Exchange {
        let call = CallSpec::new(
            Component::Sidecar,
            Component::Driver,
            request.op().name(),
            request.key(),
        );
        let rpc = async {
            match self.rpc(&request).await {
                DriverReply::Failed { code, message } => Err((code, message)),
                ok => Ok(ok),
            }
        };
        let (id, result, answered_by) = through_gate(&self.gate, &call, rpc).await;
        let reply = result.unwrap_or_else(|(code, message)| DriverReply::Failed { code, message });
        if replay {
            self.gate.history().record(EventKind::Note {
                component: Component::Lab,
                text: format!("replayed {} for {}", request.op().rpc(), request.key()),
            });
        }
        let ex = Exchange {
            call: id,
            request,
            reply,
            replay,
            answered_by,
        };
        lock(&self.exchanges).push(ex.clone());
        ex
    }

    async fn rpc(&self, request: &DriverRequest) -> DriverReply {
        if self.redial.swap(false, std::sync::atomic::Ordering::SeqCst)
            && self.reconnect().await.is_err()
        {
            self.redial.store(true, std::sync::atomic::Ordering::SeqCst);
        }
        let reply = self.rpc_once(request).await;
        if matches!(
            reply,
            DriverReply::Failed {
                code: tonic::Code::Unavailable | tonic::Code::Unknown,
                ..
            }
        ) {
            self.redial.store(true, std::sync::atomic::Ordering::SeqCst);
        }
        reply
    }

    async fn rpc_once(&self, request: &DriverRequest) -> DriverReply {
        let deadline = self.call_timeout();
        let rpc_name = request.op().rpc();
        let mut client = lock(&self.provisioner).clone();
        let fut = async move {
            match request.clone() {
                DriverRequest::Create { name, parameters } => client
                    .driver_create_bucket(DriverCreateBucketRequest {
                        name,
                        parameters: parameters.to_proto(),
                    })
                    .await
                    .map(|r| DriverReply::Created {
                        bucket_id: r.into_inner().bucket_id,
                    }),
                DriverRequest::Delete { bucket_id, context } => client
                    .driver_delete_bucket(DriverDeleteBucketRequest {
                        bucket_id,
                        delete_context: context.to_proto(),
                    })
                    .await
                    .map(|_| DriverReply::Empty),
                DriverRequest::Grant {
                    bucket_id,
                    name,
                    auth,
                    parameters,
                } => client
                    .driver_grant_bucket_access(DriverGrantBucketAccessRequest {
                        bucket_id,
                        name,
                        authentication_type: auth,
                        parameters: parameters.to_proto(),
                    })
                    .await
                    .map(|r| {
                        let r = r.into_inner();
                        let entries = r.credentials.len();
                        let credentials = r.credentials.get("s3").map(|c| S3Credentials {
                            access_key_id: c
                                .secrets
                                .get("accessKeyID")
                                .cloned()
                                .unwrap_or_default(),
                            secret: Secret::new(
                                c.secrets
                                    .get("accessSecretKey")
                                    .cloned()
                                    .unwrap_or_default(),
                            ),
                            endpoint: c.secrets.get("endpoint").cloned().unwrap_or_default(),
                            region: c.secrets.get("region").cloned().unwrap_or_default(),
                        });
                        DriverReply::Granted {
                            account_id: r.account_id,
                            credentials,
                            credential_entries: entries,
                        }
                    }),
                DriverRequest::Revoke {
                    bucket_id,
                    account_id,
                } => client
                    .driver_revoke_bucket_access(DriverRevokeBucketAccessRequest {
                        bucket_id,
                        account_id,
                        revoke_access_context: Default::default(),
                    })
                    .await
                    .map(|_| DriverReply::Empty),
            }
        };
        match tokio::time::timeout(deadline, fut).await {
            Ok(Ok(reply)) => reply,
            // A dead peer shows up as UNKNOWN or UNAVAILABLE with varying text,
            // depending on how the OS reported the broken connection; the real
            // sidecar treats all of them alike, and the history must not vary.
            Ok(Err(status))
                if matches!(
                    status.code(),
                    tonic::Code::Unknown | tonic::Code::Unavailable
                ) && std::error::Error::source(&status).is_some() =>
            {
                DriverReply::Failed {
                    code: tonic::Code::Unavailable,
                    message: CONNECTION_LOST.into(),
                }
            }
            Ok(Err(status)) => DriverReply::Failed {
                code: status.code(),
                message: status.message().to_string(),
            },
            Err(_) => DriverReply::Failed {
                code: tonic::Code::DeadlineExceeded,
                message: deadline_message(rpc_name, deadline),
            },
        }
    }
}

enum Step {
    Done,
    Retry(String),
}

/// Why the object is requeued after `ex`, by the sidecar's rule ([`requeues`]);
/// None when the answer lets the operation go on.
fn requeue_reason(ex: &Exchange) -> Option<String> {
    let op = ex.request.op();
    let code = ex.reply.code();
    requeues(op, code).then(|| format!("{}: {}", op.rpc(), code_name(code)))
}

/// The real sidecar's requeue delay after `failures` consecutive failures.
pub fn backoff(failures: u32) -> Duration {
    let ms = BACKOFF_BASE.as_millis() as u64;
    let d = ms.saturating_mul(1u64 << failures.min(20));
    Duration::from_millis(d).min(BACKOFF_MAX)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The gRPC code named `name` (`UNAVAILABLE`, ...); UNKNOWN for anything else.
pub fn code_from_name(name: &str) -> tonic::Code {
    (0..=16)
        .map(tonic::Code::from_i32)
        .find(|c| code_name(*c) == name)
        .unwrap_or(tonic::Code::Unknown)
}

fn grpc_outcome<T>(r: &Result<T, tonic::Status>) -> Outcome {
    match r {
        Ok(_) => Outcome::Grpc {
            code: "OK".into(),
            message: String::new(),
        },
        Err(s) => Outcome::Grpc {
            code: code_name(s.code()),
            message: s.message().to_string(),
        },
    }
}

fn merged(base: Parameters, over: Option<&BTreeMap<String, String>>) -> Parameters {
    let Some(over) = over else {
        return base;
    };
    let mut map = (*base).clone();
    for (k, v) in over {
        map.insert(k.clone(), v.clone());
    }
    map.into()
}

/// The non-empty string at `path`: the sidecar treats "" as unset, as the real one does.
fn str_at(v: &Value, path: &[&str]) -> Option<String> {
    Some(json::str_at(v, path)).filter(|s| !s.is_empty())
}

fn string_map(v: &Value, path: &[&str]) -> BTreeMap<String, String> {
    at(v, path)
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_string())))
                .collect()
        })
        .unwrap_or_default()
}

fn has_finalizer(obj: &Value, finalizer: &str) -> bool {
    at(obj, &["metadata", "finalizers"])
        .and_then(Value::as_array)
        .is_some_and(|l| l.iter().any(|f| f.as_str() == Some(finalizer)))
}

fn deleting(v: &Value) -> bool {
    str_at(v, &["metadata", "deletionTimestamp"]).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_write_as_their_map_and_an_unchanged_replay_shares_them() {
        let map = BTreeMap::from([("mode".to_string(), "ro".to_string())]);
        let p = Parameters::from(map.clone());
        let text = serde_json::to_string(&p).unwrap();
        assert_eq!(text, serde_json::to_string(&map).unwrap());
        assert_eq!(serde_json::from_str::<Parameters>(&text).unwrap(), p);
        assert!(Arc::ptr_eq(&merged(p.clone(), None).0, &p.0));
        let over = BTreeMap::from([("mode".to_string(), "rw".to_string())]);
        assert_eq!(merged(p.clone(), Some(&over))["mode"], "rw");
        assert_eq!(p["mode"], "ro", "an override changed the shared map");
    }

    #[test]
    fn v02_requeues_every_error_but_a_deleted_buckets_not_found() {
        use tonic::Code;
        let ops = [
            DriverOp::CreateBucket,
            DriverOp::DeleteBucket,
            DriverOp::GrantBucketAccess,
            DriverOp::RevokeBucketAccess,
        ];
        for op in ops {
            assert_eq!(DriverOp::from_rpc(op.rpc()), Some(op));
            assert!(!requeues(op, Code::Ok), "{op:?} OK");
            for code in [
                Code::InvalidArgument,
                Code::AlreadyExists,
                Code::FailedPrecondition,
                Code::Unimplemented,
                Code::PermissionDenied,
                Code::Unavailable,
                Code::Internal,
            ] {
                assert!(requeues(op, code), "{op:?} {code:?} must be retried");
            }
        }
        assert!(!requeues(DriverOp::DeleteBucket, Code::NotFound));
        assert!(requeues(DriverOp::RevokeBucketAccess, Code::NotFound));
    }

    #[test]
    fn backoff_doubles_from_100ms_to_30s() {
        assert_eq!(backoff(0), Duration::from_millis(100));
        assert_eq!(backoff(1), Duration::from_millis(200));
        assert_eq!(backoff(4), Duration::from_millis(1600));
        assert_eq!(backoff(9), Duration::from_secs(30));
        assert_eq!(backoff(u32::MAX), Duration::from_secs(30));
    }
}
