//! The fake CSI side of a Kubernetes cluster: external-provisioner,
//! external-attacher, external-snapshotter and a kubelet-like node agent that drive a CSI driver
//! over its Unix socket, and the node mount table the node plugin mounts into.
//!
//! Like the COSI sidecar they are not informers: the engine decides what to
//! reconcile and when (`reconcile(target) -> Reconcile`), and every
//! sidecar→driver call passes the gate (from CsiProvisioner / CsiAttacher /
//! Kubelet to Driver, op = the RPC name) and is kept as an [`Exchange`].

pub mod attacher;
pub mod cluster;
pub mod kubelet;
pub mod mounts;
pub mod provisioner;
pub mod retry;
pub mod snapshot_metadata;
pub mod snapshotter;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use drivelab_proto::csi;
use drivelab_proto::csi::controller_client::ControllerClient;
use drivelab_proto::csi::identity_client::IdentityClient;
use drivelab_proto::csi::node_client::NodeClient;
use serde_json::{json, Value};
use tonic::transport::Channel;

pub use crate::cosi_sidecar::{
    code_from_name, code_name, connect_unix, through_gate, KubeSlot, Reconcile,
};
use crate::gate::{CallSpec, Delivery, Gate, Verdict};
use crate::history::{CallId, Component, Outcome};
use crate::kube::{Kind, KubeError, KubeFake};
use crate::ops::Op;

/// Per-call deadline, in real time (a hung driver must not hang the lab).
pub const CALL_TIMEOUT: Duration = crate::cosi_sidecar::DEFAULT_CALL_TIMEOUT;
/// What a sidecar sees when the link to the driver is cut.
const CUT_MESSAGE: &str = "transport: connection refused or reset";

/// Errors that stop a sidecar itself (driver errors are requeued instead).
#[derive(Debug, thiserror::Error)]
pub enum CsiError {
    /// The driver socket could not be reached.
    #[error("cannot connect to the driver at {path}: {source}")]
    Connect {
        path: PathBuf,
        source: tonic::transport::Error,
    },
    /// A start-up call (GetPluginInfo, capabilities) failed.
    #[error("{rpc} failed: {status}")]
    Startup {
        rpc: &'static str,
        status: tonic::Status,
    },
    /// The Kubernetes fake refused something the sidecar needs.
    #[error("kubernetes API: {0}")]
    Kube(#[from] KubeError),
    /// An object is malformed (missing a required field).
    #[error("{kind} {name}: {what}")]
    Malformed {
        kind: &'static str,
        name: String,
        what: String,
    },
}

/// A CSI request as a sidecar sent it (the generated message; sidecars never
/// put secrets in them).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum DriverRequest {
    /// Controller.CreateVolume
    CreateVolume(#[serde(with = "crate::record::message")] csi::CreateVolumeRequest),
    /// Controller.DeleteVolume
    DeleteVolume(#[serde(with = "crate::record::message")] csi::DeleteVolumeRequest),
    /// Controller.ControllerPublishVolume
    ControllerPublish(
        #[serde(with = "crate::record::message")] csi::ControllerPublishVolumeRequest,
    ),
    /// Controller.ControllerUnpublishVolume
    ControllerUnpublish(
        #[serde(with = "crate::record::message")] csi::ControllerUnpublishVolumeRequest,
    ),
    /// Node.NodeStageVolume
    NodeStage(#[serde(with = "crate::record::message")] csi::NodeStageVolumeRequest),
    /// Node.NodeUnstageVolume
    NodeUnstage(#[serde(with = "crate::record::message")] csi::NodeUnstageVolumeRequest),
    /// Node.NodePublishVolume
    NodePublish(#[serde(with = "crate::record::message")] csi::NodePublishVolumeRequest),
    /// Node.NodeUnpublishVolume
    NodeUnpublish(#[serde(with = "crate::record::message")] csi::NodeUnpublishVolumeRequest),
    /// Node.NodeGetInfo
    NodeGetInfo,
    /// Controller.CreateSnapshot
    CreateSnapshot(#[serde(with = "crate::record::message")] csi::CreateSnapshotRequest),
    /// Controller.DeleteSnapshot
    DeleteSnapshot(#[serde(with = "crate::record::message")] csi::DeleteSnapshotRequest),
}

crate::declare_ops!(
    /// The CSI RPCs the CSI sidecars send a driver (what the sidecar→driver
    /// gate records and faults aim at).
    pub DRIVER_RPCS {
        GET_PLUGIN_INFO = "GetPluginInfo",
        CONTROLLER_GET_CAPABILITIES = "ControllerGetCapabilities",
        NODE_GET_CAPABILITIES = "NodeGetCapabilities",
        CREATE_VOLUME = "CreateVolume",
        DELETE_VOLUME = "DeleteVolume",
        CONTROLLER_PUBLISH_VOLUME = "ControllerPublishVolume",
        CONTROLLER_UNPUBLISH_VOLUME = "ControllerUnpublishVolume",
        NODE_STAGE_VOLUME = "NodeStageVolume",
        NODE_UNSTAGE_VOLUME = "NodeUnstageVolume",
        NODE_PUBLISH_VOLUME = "NodePublishVolume",
        NODE_UNPUBLISH_VOLUME = "NodeUnpublishVolume",
        NODE_GET_INFO = "NodeGetInfo",
        CREATE_SNAPSHOT = "CreateSnapshot",
        DELETE_SNAPSHOT = "DeleteSnapshot",
    }
);

crate::declare_ops!(
    /// The further CSI RPCs only the lab's spec sweep (`spec_sweep:`) sends a
    /// driver, through the same gate (from `lab`).
    pub SWEEP_RPCS {
        PROBE = "Probe",
        GET_PLUGIN_CAPABILITIES = "GetPluginCapabilities",
        VALIDATE_VOLUME_CAPABILITIES = "ValidateVolumeCapabilities",
        LIST_VOLUMES = "ListVolumes",
        LIST_SNAPSHOTS = "ListSnapshots",
        GET_CAPACITY = "GetCapacity",
        CONTROLLER_EXPAND_VOLUME = "ControllerExpandVolume",
        CONTROLLER_GET_VOLUME = "ControllerGetVolume",
        NODE_GET_VOLUME_STATS = "NodeGetVolumeStats",
        NODE_EXPAND_VOLUME = "NodeExpandVolume",
    }
);

impl DriverRequest {
    /// The RPC, as the gate records it.
    pub fn op(&self) -> Op {
        match self {
            DriverRequest::CreateVolume(_) => CREATE_VOLUME,
            DriverRequest::DeleteVolume(_) => DELETE_VOLUME,
            DriverRequest::ControllerPublish(_) => CONTROLLER_PUBLISH_VOLUME,
            DriverRequest::ControllerUnpublish(_) => CONTROLLER_UNPUBLISH_VOLUME,
            DriverRequest::NodeStage(_) => NODE_STAGE_VOLUME,
            DriverRequest::NodeUnstage(_) => NODE_UNSTAGE_VOLUME,
            DriverRequest::NodePublish(_) => NODE_PUBLISH_VOLUME,
            DriverRequest::NodeUnpublish(_) => NODE_UNPUBLISH_VOLUME,
            DriverRequest::NodeGetInfo => NODE_GET_INFO,
            DriverRequest::CreateSnapshot(_) => CREATE_SNAPSHOT,
            DriverRequest::DeleteSnapshot(_) => DELETE_SNAPSHOT,
        }
    }

    /// The RPC name as on the wire.
    pub fn rpc(&self) -> &'static str {
        self.op().as_str()
    }

    /// The history subject: the volume name or id, `<volume>@<node id>` for
    /// controller publish calls, `<volume>@<path>` for node calls.
    pub fn subject(&self) -> String {
        match self {
            DriverRequest::CreateVolume(r) => r.name.clone(),
            DriverRequest::DeleteVolume(r) => r.volume_id.clone(),
            DriverRequest::ControllerPublish(r) => format!("{}@{}", r.volume_id, r.node_id),
            DriverRequest::ControllerUnpublish(r) => format!("{}@{}", r.volume_id, r.node_id),
            DriverRequest::NodeStage(r) => {
                format!("{}@{}", r.volume_id, r.staging_target_path)
            }
            DriverRequest::NodeUnstage(r) => {
                format!("{}@{}", r.volume_id, r.staging_target_path)
            }
            DriverRequest::NodePublish(r) => format!("{}@{}", r.volume_id, r.target_path),
            DriverRequest::NodeUnpublish(r) => format!("{}@{}", r.volume_id, r.target_path),
            DriverRequest::NodeGetInfo => String::new(),
            DriverRequest::CreateSnapshot(r) => format!("{}@{}", r.name, r.source_volume_id),
            DriverRequest::DeleteSnapshot(r) => r.snapshot_id.clone(),
        }
    }
}

/// What the driver answered.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum DriverReply {
    /// CreateVolume OK (the volume may be absent in a malformed reply).
    Created(#[serde(with = "crate::record::opt_message")] Option<csi::Volume>),
    /// ControllerPublishVolume OK.
    Published {
        publish_context: BTreeMap<String, String>,
    },
    /// NodeGetInfo OK.
    Info(#[serde(with = "crate::record::message")] csi::NodeGetInfoResponse),
    /// CreateSnapshot OK (the snapshot may be absent in a malformed reply).
    Snapshot(#[serde(with = "crate::record::opt_message")] Option<csi::Snapshot>),
    /// Any other RPC answered OK.
    Empty,
    /// A gRPC error (or the lab's stand-in for a lost connection).
    Failed {
        #[serde(with = "crate::record::grpc_code")]
        code: tonic::Code,
        message: String,
    },
}

impl DriverReply {
    /// The gRPC code name (`OK`, `ALREADY_EXISTS`, ...).
    pub fn code_name(&self) -> String {
        code_name(self.code())
    }

    /// True unless it is a gRPC error.
    pub fn is_ok(&self) -> bool {
        !matches!(self, DriverReply::Failed { .. })
    }

    /// The gRPC code (`Ok` for any successful reply).
    pub fn code(&self) -> tonic::Code {
        match self {
            DriverReply::Failed { code, .. } => *code,
            _ => tonic::Code::Ok,
        }
    }

    /// `CODE: message` for requeue reasons and object status.
    pub fn describe(&self) -> String {
        match self {
            DriverReply::Failed { code, message } => format!("{}: {message}", code_name(*code)),
            _ => "OK".into(),
        }
    }
}

/// One sidecar→driver exchange, kept for checks.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Exchange {
    /// The history call id.
    pub call: CallId,
    /// Which sidecar sent it.
    pub from: Component,
    /// The request as sent.
    pub request: DriverRequest,
    /// The reply as the sidecar saw it.
    pub reply: DriverReply,
}

/// One sidecar's connection to the driver: dial, redial after a transport
/// failure, the gate on every call, and the exchange log.
pub struct DriverConn {
    component: Component,
    gate: Gate,
    socket: PathBuf,
    channel: Mutex<Channel>,
    /// Set after a transport failure: dial afresh before the next call, as
    /// grpc-go's reconnect would, rather than trust a channel to a dead peer.
    redial: AtomicBool,
    exchanges: Mutex<Vec<Exchange>>,
    /// Per-call deadline in milliseconds (real time; the driver is a real process).
    call_timeout_ms: std::sync::atomic::AtomicU64,
}

impl DriverConn {
    /// Dial the driver's socket as `component`.
    pub async fn connect(
        socket: &Path,
        component: Component,
        gate: Gate,
    ) -> Result<Self, CsiError> {
        let channel = connect_unix(socket)
            .await
            .map_err(|source| CsiError::Connect {
                path: socket.to_path_buf(),
                source,
            })?;
        Ok(Self {
            component,
            gate,
            socket: socket.to_path_buf(),
            channel: Mutex::new(channel),
            redial: AtomicBool::new(false),
            exchanges: Mutex::default(),
            call_timeout_ms: std::sync::atomic::AtomicU64::new(CALL_TIMEOUT.as_millis() as u64),
        })
    }

    /// Re-dial the driver (after it was restarted on the same socket).
    pub async fn reconnect(&self) -> Result<(), CsiError> {
        let channel = connect_unix(&self.socket)
            .await
            .map_err(|source| CsiError::Connect {
                path: self.socket.clone(),
                source,
            })?;
        *lock(&self.channel) = channel;
        Ok(())
    }

    /// Set the deadline of every later driver call (the scenario's `call_timeout`).
    pub fn set_call_timeout(&self, d: Duration) {
        let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1);
        self.call_timeout_ms.store(ms, Ordering::SeqCst);
    }

    /// The current per-call deadline.
    pub fn call_timeout(&self) -> Duration {
        Duration::from_millis(self.call_timeout_ms.load(Ordering::SeqCst))
    }

    /// The gate calls pass through.
    pub fn gate(&self) -> &Gate {
        &self.gate
    }

    /// Every exchange so far, in order.
    pub fn exchanges(&self) -> Vec<Exchange> {
        lock(&self.exchanges).clone()
    }

    /// How many exchanges [`DriverConn::exchanges`] would return.
    pub fn exchange_count(&self) -> usize {
        lock(&self.exchanges).len()
    }

    fn channel(&self) -> Channel {
        lock(&self.channel).clone()
    }

    /// A start-up RPC (GetPluginInfo, capabilities), recorded through the gate
    /// but not kept as an exchange; faults at the gate fail the start-up.
    pub async fn startup<T, F, Fut>(&self, op: Op, f: F) -> Result<T, CsiError>
    where
        F: FnOnce(Channel) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let rpc = op.as_str();
        let call = CallSpec::new(self.component, Component::Driver, op, "");
        let (id, verdict) = self.gate.enter(&call).await;
        let res = match verdict {
            Verdict::Reject(r) => Err(tonic::Status::new(code_from_name(&r.code), r.message)),
            Verdict::Cut => {
                self.gate.cut_before(id);
                return Err(CsiError::Startup {
                    rpc,
                    status: tonic::Status::unavailable(CUT_MESSAGE),
                });
            }
            Verdict::Proceed => {
                match tokio::time::timeout(self.call_timeout(), f(self.channel())).await {
                    Ok(r) => r.map(tonic::Response::into_inner),
                    Err(_) => Err(tonic::Status::deadline_exceeded(format!("{rpc} timed out"))),
                }
            }
        };
        let outcome = match &res {
            Ok(_) => Outcome::Grpc {
                code: "OK".into(),
                message: String::new(),
            },
            Err(s) => Outcome::Grpc {
                code: code_name(s.code()),
                message: s.message().to_string(),
            },
        };
        if self.gate.leave(id, &call, outcome).await == Delivery::Cut {
            return Err(CsiError::Startup {
                rpc,
                status: tonic::Status::unavailable(CUT_MESSAGE),
            });
        }
        res.map_err(|status| CsiError::Startup { rpc, status })
    }

    /// The driver's name (Identity.GetPluginInfo), as every sidecar asks at start.
    pub(crate) async fn plugin_name(&self) -> Result<String, CsiError> {
        let info = self
            .startup(GET_PLUGIN_INFO, |ch| async move {
                IdentityClient::new(ch)
                    .get_plugin_info(csi::GetPluginInfoRequest {})
                    .await
            })
            .await?;
        Ok(info.name)
    }

    /// One driver RPC through the gate, recorded as an exchange.
    pub async fn send(&self, request: DriverRequest) -> Exchange {
        let call = CallSpec::new(
            self.component,
            Component::Driver,
            request.op(),
            request.subject(),
        );
        let rpc = async {
            match self.rpc(&request).await {
                DriverReply::Failed { code, message } => Err((code, message)),
                ok => Ok(ok),
            }
        };
        let (id, result, _) = through_gate(&self.gate, &call, rpc).await;
        let reply = result.unwrap_or_else(|(code, message)| DriverReply::Failed { code, message });
        let ex = Exchange {
            call: id,
            from: self.component,
            request,
            reply,
        };
        lock(&self.exchanges).push(ex.clone());
        ex
    }

    async fn rpc(&self, request: &DriverRequest) -> DriverReply {
        if self.redial.swap(false, Ordering::SeqCst) && self.reconnect().await.is_err() {
            self.redial.store(true, Ordering::SeqCst);
        }
        let reply = self.rpc_once(request).await;
        if matches!(
            reply,
            DriverReply::Failed {
                code: tonic::Code::Unavailable | tonic::Code::Unknown,
                ..
            }
        ) {
            self.redial.store(true, Ordering::SeqCst);
        }
        reply
    }

    async fn rpc_once(&self, request: &DriverRequest) -> DriverReply {
        let deadline = self.call_timeout();
        let rpc_name = request.rpc();
        let ch = self.channel();
        let fut = async move {
            let mut ctl = ControllerClient::new(ch.clone());
            let mut node = NodeClient::new(ch);
            match request.clone() {
                DriverRequest::CreateVolume(r) => ctl
                    .create_volume(r)
                    .await
                    .map(|r| DriverReply::Created(r.into_inner().volume)),
                DriverRequest::DeleteVolume(r) => {
                    ctl.delete_volume(r).await.map(|_| DriverReply::Empty)
                }
                DriverRequest::ControllerPublish(r) => {
                    ctl.controller_publish_volume(r)
                        .await
                        .map(|r| DriverReply::Published {
                            publish_context: r.into_inner().publish_context.into_iter().collect(),
                        })
                }
                DriverRequest::ControllerUnpublish(r) => ctl
                    .controller_unpublish_volume(r)
                    .await
                    .map(|_| DriverReply::Empty),
                DriverRequest::NodeStage(r) => {
                    node.node_stage_volume(r).await.map(|_| DriverReply::Empty)
                }
                DriverRequest::NodeUnstage(r) => node
                    .node_unstage_volume(r)
                    .await
                    .map(|_| DriverReply::Empty),
                DriverRequest::NodePublish(r) => node
                    .node_publish_volume(r)
                    .await
                    .map(|_| DriverReply::Empty),
                DriverRequest::NodeUnpublish(r) => node
                    .node_unpublish_volume(r)
                    .await
                    .map(|_| DriverReply::Empty),
                DriverRequest::NodeGetInfo => node
                    .node_get_info(csi::NodeGetInfoRequest {})
                    .await
                    .map(|r| DriverReply::Info(r.into_inner())),
                DriverRequest::CreateSnapshot(r) => ctl
                    .create_snapshot(r)
                    .await
                    .map(|r| DriverReply::Snapshot(r.into_inner().snapshot)),
                DriverRequest::DeleteSnapshot(r) => {
                    ctl.delete_snapshot(r).await.map(|_| DriverReply::Empty)
                }
            }
        };
        match tokio::time::timeout(deadline, fut).await {
            Ok(Ok(reply)) => reply,
            // A dead peer shows up as UNKNOWN or UNAVAILABLE with varying text,
            // depending on how the OS reported the broken connection; the real
            // sidecars treat all of them alike, and the history must not vary.
            Ok(Err(status))
                if matches!(
                    status.code(),
                    tonic::Code::Unknown | tonic::Code::Unavailable
                ) && std::error::Error::source(&status).is_some() =>
            {
                DriverReply::Failed {
                    code: tonic::Code::Unavailable,
                    message: "transport: connection to the driver lost".into(),
                }
            }
            Ok(Err(status)) => DriverReply::Failed {
                code: status.code(),
                message: status.message().to_string(),
            },
            Err(_) => DriverReply::Failed {
                code: tonic::Code::DeadlineExceeded,
                message: crate::cosi_sidecar::deadline_message(rpc_name, deadline),
            },
        }
    }
}

/// Per-item exponential back-off (client-go's ItemExponentialFailureRateLimiter):
/// `base · 2^failures`, capped at `max`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Backoff {
    /// First delay.
    pub base: Duration,
    /// Ceiling.
    pub max: Duration,
}

impl Backoff {
    /// external-provisioner's `--retry-interval-start` / `--retry-interval-max` defaults.
    pub const PROVISIONER: Backoff = Backoff {
        base: Duration::from_secs(1),
        max: Duration::from_secs(300),
    };
    /// external-attacher's `--retry-interval-start` / `--retry-interval-max` defaults.
    pub const ATTACHER: Backoff = Backoff {
        base: Duration::from_secs(1),
        max: Duration::from_secs(300),
    };
    /// csi-snapshotter's and snapshot-controller's `--retry-interval-start` /
    /// `--retry-interval-max` defaults.
    pub const SNAPSHOTTER: Backoff = Backoff {
        base: Duration::from_secs(1),
        max: Duration::from_secs(300),
    };
    /// kubelet's volume operations (nestedpendingoperations: 500ms doubling to 2m2s).
    pub const KUBELET: Backoff = Backoff {
        base: Duration::from_millis(500),
        max: Duration::from_millis(122_000),
    };

    /// The delay after `failures` consecutive failures (0 = the first failure).
    pub fn delay(self, failures: u32) -> Duration {
        let ms = u64::try_from(self.base.as_millis()).unwrap_or(u64::MAX);
        Duration::from_millis(ms.saturating_mul(1u64 << failures.min(30))).min(self.max)
    }
}

/// Failure counts per target, turning a step into a [`Reconcile`].
pub(crate) struct Failures<T: Ord + Clone> {
    backoff: Backoff,
    counts: Mutex<BTreeMap<T, u32>>,
}

impl<T: Ord + Clone> Failures<T> {
    pub(crate) fn new(backoff: Backoff) -> Self {
        Self {
            backoff,
            counts: Mutex::default(),
        }
    }

    pub(crate) fn settle(&self, target: &T, step: Step) -> Reconcile {
        let mut counts = lock(&self.counts);
        match step {
            Step::Done => {
                counts.remove(target);
                Reconcile::Done
            }
            Step::Retry(reason) => {
                let n = counts.entry(target.clone()).or_insert(0);
                let after = self.backoff.delay(*n);
                *n = n.saturating_add(1);
                Reconcile::Requeue { after, reason }
            }
        }
    }
}

/// One reconcile's verdict before back-off is applied.
pub(crate) enum Step {
    Done,
    Retry(String),
}

/// CSI access mode for one Kubernetes access mode.
pub fn access_mode(mode: &str) -> csi::volume_capability::access_mode::Mode {
    use csi::volume_capability::access_mode::Mode;
    match mode {
        "ReadWriteOnce" => Mode::SingleNodeWriter,
        "ReadOnlyMany" => Mode::MultiNodeReaderOnly,
        "ReadWriteMany" => Mode::MultiNodeMultiWriter,
        "ReadWriteOncePod" => Mode::SingleNodeSingleWriter,
        _ => Mode::Unknown,
    }
}

/// A volume capability: block or mount (with fs type and mount flags) plus one access mode.
pub fn capability(
    block: bool,
    fs_type: &str,
    mount_flags: &[String],
    mode: csi::volume_capability::access_mode::Mode,
) -> csi::VolumeCapability {
    use csi::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume};
    csi::VolumeCapability {
        access_type: Some(if block {
            AccessType::Block(BlockVolume {})
        } else {
            AccessType::Mount(MountVolume {
                fs_type: fs_type.to_string(),
                mount_flags: mount_flags.to_vec(),
                volume_mount_group: String::new(),
            })
        }),
        access_mode: Some(AccessMode { mode: mode as i32 }),
    }
}

/// The capability the attacher and kubelet send for a PV: block or mount by
/// `volumeMode`, fs type and mount options from the PV, one access mode.
/// `first_mode_only` is the kubelet's rule (the PV's first access mode); the
/// attacher folds the whole list.
pub fn pv_capability(pv: &Value, first_mode_only: bool) -> csi::VolumeCapability {
    use csi::volume_capability::access_mode::Mode;
    let modes = strings(pv, &["spec", "accessModes"]);
    let has = |m: &str| modes.iter().any(|x| x == m);
    let mode = if first_mode_only {
        modes
            .first()
            .map_or(Mode::SingleNodeWriter, |m| access_mode(m))
    } else if has("ReadWriteMany") {
        Mode::MultiNodeMultiWriter
    } else if has("ReadWriteOncePod") {
        Mode::SingleNodeSingleWriter
    } else if has("ReadOnlyMany") && has("ReadWriteOnce") {
        Mode::MultiNodeSingleWriter
    } else if has("ReadOnlyMany") {
        Mode::MultiNodeReaderOnly
    } else {
        Mode::SingleNodeWriter
    };
    capability(
        str_at(pv, &["spec", "volumeMode"]) == "Block",
        &str_at(pv, &["spec", "csi", "fsType"]),
        &strings(pv, &["spec", "mountOptions"]),
        mode,
    )
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A sidecar's own state with a generation that every mutable borrow moves
/// on, so a resync can tell "the state this target last read" from "some
/// state": it passes over a target only while its sidecar's generation is
/// the one it saw. Generations come from one process-wide counter, so a
/// restarted sidecar's never repeat an old one's. Borrow mutably only to
/// change something: a needless mutable borrow costs a pass over the node.
#[derive(Debug)]
pub(crate) struct Generational<T> {
    value: T,
    generation: u64,
}

static NEXT_GENERATION: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

fn next_generation() -> u64 {
    NEXT_GENERATION.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

impl<T: Default> Default for Generational<T> {
    fn default() -> Self {
        Self {
            value: T::default(),
            generation: next_generation(),
        }
    }
}

impl<T> Generational<T> {
    /// The generation: the same only while nothing borrowed the state mutably.
    pub(crate) fn generation(&self) -> u64 {
        self.generation
    }
}

impl<T> std::ops::Deref for Generational<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.value
    }
}

impl<T> std::ops::DerefMut for Generational<T> {
    fn deref_mut(&mut self) -> &mut T {
        self.generation = next_generation();
        &mut self.value
    }
}

pub(crate) fn str_at(v: &Value, path: &[&str]) -> String {
    crate::json::str_at(v, path)
}

pub(crate) fn strings(v: &Value, path: &[&str]) -> Vec<String> {
    crate::json::at(v, path)
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

pub(crate) fn string_map(v: &Value, path: &[&str]) -> BTreeMap<String, String> {
    crate::json::at(v, path)
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_string())))
                .collect()
        })
        .unwrap_or_default()
}

pub(crate) fn deleting(v: &Value) -> bool {
    !crate::json::str_ref(v, &["metadata", "deletionTimestamp"]).is_empty()
}

pub(crate) fn has_finalizer(v: &Value, f: &str) -> bool {
    strings(v, &["metadata", "finalizers"])
        .iter()
        .any(|x| x == f)
}

/// Add `finalizer` to an object (no-op if present); not allowed once it is deleting.
pub(crate) fn add_finalizer(
    kube: &KubeFake,
    kind: Kind,
    ns: Option<&str>,
    obj: &Value,
    finalizer: &str,
) -> Result<(), KubeError> {
    let mut list = strings(obj, &["metadata", "finalizers"]);
    if list.iter().any(|f| f == finalizer) {
        return Ok(());
    }
    list.push(finalizer.to_string());
    let name = str_at(obj, &["metadata", "name"]);
    kube.merge_patch(kind, ns, &name, json!({"metadata": {"finalizers": list}}))?;
    Ok(())
}

/// Drop `finalizer` from the named object, if it still exists.
pub(crate) fn remove_finalizer(
    kube: &KubeFake,
    kind: Kind,
    ns: Option<&str>,
    name: &str,
    finalizer: &str,
) -> Result<(), KubeError> {
    let Some(obj) = kube.get(kind, ns, name)? else {
        return Ok(());
    };
    let list: Vec<String> = strings(&obj, &["metadata", "finalizers"])
        .into_iter()
        .filter(|f| f != finalizer)
        .collect();
    if list.len() == strings(&obj, &["metadata", "finalizers"]).len() {
        return Ok(());
    }
    match kube.merge_patch(kind, ns, name, json!({"metadata": {"finalizers": list}})) {
        Ok(_) | Err(KubeError::NotFound { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

/// The kube fake currently in the slot.
pub fn kube_of(slot: &KubeSlot) -> KubeFake {
    slot.read().unwrap_or_else(|p| p.into_inner()).clone()
}

/// `sha256(text)` as lower-case hex (kubelet staging dirs, VolumeAttachment names).
pub fn sha256_hex(text: &str) -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(text.as_bytes()))
}

/// The virtual time as an RFC 3339 timestamp, for `status.*Error.time`.
pub(crate) fn timestamp(gate: &Gate) -> String {
    gate.history().clock().rfc3339(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoffs_match_the_real_defaults() {
        assert_eq!(Backoff::PROVISIONER.delay(0), Duration::from_secs(1));
        assert_eq!(Backoff::PROVISIONER.delay(3), Duration::from_secs(8));
        assert_eq!(Backoff::PROVISIONER.delay(9), Duration::from_secs(300));
        assert_eq!(
            Backoff::PROVISIONER.delay(u32::MAX),
            Duration::from_secs(300)
        );
        assert_eq!(Backoff::KUBELET.delay(0), Duration::from_millis(500));
        assert_eq!(Backoff::KUBELET.delay(20), Duration::from_millis(122_000));
    }

    #[test]
    fn attacher_folds_access_modes() {
        use csi::volume_capability::access_mode::Mode;
        let pv = |modes: Value| json!({"spec": {"accessModes": modes, "csi": {"fsType": "ext4"}}});
        let mode = |v: &Value, first| {
            pv_capability(v, first)
                .access_mode
                .map(|m| m.mode)
                .unwrap_or_default()
        };
        assert_eq!(
            mode(&pv(json!(["ReadWriteOnce"])), false),
            Mode::SingleNodeWriter as i32
        );
        assert_eq!(
            mode(&pv(json!(["ReadOnlyMany", "ReadWriteOnce"])), false),
            Mode::MultiNodeSingleWriter as i32
        );
        assert_eq!(
            mode(&pv(json!(["ReadOnlyMany", "ReadWriteOnce"])), true),
            Mode::MultiNodeReaderOnly as i32
        );
        assert_eq!(
            mode(&pv(json!(["ReadWriteMany"])), false),
            Mode::MultiNodeMultiWriter as i32
        );
    }
}
