//! The fault vocabulary of scenario files: what to inject, where (component +
//! operation + occurrence) and when (before or after the callee commits).

use std::time::Duration;

use drivelab_fakes::history::Component;
use serde::Deserialize;

/// A fault aimed at an interception point.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FaultSpec {
    /// What happens.
    pub action: FaultAction,
    /// Where: the callee component and operation.
    pub on: FaultTarget,
    /// The first matching occurrence it hits (1 = the next one).
    pub nth: u32,
    /// How many consecutive occurrences it hits from there.
    pub times: u32,
    /// Before or after the callee commits.
    pub when: When,
}

/// What a fault does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FaultAction {
    /// Kill the driver (all its tasks) and start it again from its persisted state.
    CrashDriver,
    /// The callee commits; the caller never sees the reply (connection drops).
    DropResponse,
    /// Answer with an error instead of calling the callee.
    Error {
        status: u16,
        code: String,
        message: String,
    },
    /// The call takes this long on the virtual clock.
    Delay(Duration),
    /// The callee (a fake) restarts: its state survives, its connections break.
    Restart,
}

impl FaultAction {
    /// Name as in scenario files and histories.
    pub fn name(&self) -> &'static str {
        match self {
            FaultAction::CrashDriver => "crash_driver",
            FaultAction::DropResponse => "drop_response",
            FaultAction::Error { .. } => "error",
            FaultAction::Delay(_) => "delay",
            FaultAction::Restart => "restart",
        }
    }
}

/// `component.operation`, e.g. `s3admin.add_user`, `driver.DriverGrantBucketAccess`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FaultTarget {
    /// The callee.
    pub component: Component,
    /// The operation as the history names it.
    pub op: String,
}

impl std::fmt::Display for FaultTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.component, self.op)
    }
}

/// Relative to the callee's commit.
#[derive(Copy, Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum When {
    /// The callee never runs.
    BeforeCommit,
    /// The callee has run (committed) when the fault fires.
    AfterCommit,
}

/// Components a fault or partition may name.
pub fn parse_component(s: &str) -> Option<Component> {
    Some(match s {
        "sidecar" => Component::Sidecar,
        "driver" => Component::Driver,
        "s3" => Component::S3,
        "s3admin" => Component::S3Admin,
        "kube" => Component::Kube,
        "director" => Component::Director,
        "cpi" => Component::Cpi,
        "agent" => Component::Agent,
        "mounts" => Component::Mounts,
        "csi-provisioner" => Component::CsiProvisioner,
        "csi-attacher" => Component::CsiAttacher,
        "kubelet" => Component::Kubelet,
        "csi-snapshotter" => Component::CsiSnapshotter,
        "csi-snapshot-metadata" => Component::CsiSnapshotMetadata,
        _ => return None,
    })
}

/// Parse `component.operation`.
pub fn parse_target(s: &str) -> Result<FaultTarget, String> {
    let (c, op) = s
        .split_once('.')
        .ok_or_else(|| format!("`{s}` is not `component.operation`"))?;
    let component = parse_component(c)
        .ok_or_else(|| format!("unknown component `{c}` (sidecar, driver, s3, s3admin, kube; director, cpi, agent, mounts)"))?;
    if matches!(
        component,
        Component::Sidecar
            | Component::CsiProvisioner
            | Component::CsiAttacher
            | Component::Kubelet
    ) {
        return Err(
            "faults hit the callee; the sidecar is never called (aim at `driver.<RPC>` instead)"
                .into(),
        );
    }
    if op.is_empty() {
        return Err(format!("`{s}` names no operation"));
    }
    if component == Component::Driver && !DRIVER_OPS.contains(&op) && !CSI_DRIVER_OPS.contains(&op)
    {
        return Err(format!(
            "unknown driver RPC `{op}` (COSI: {}; CSI: {})",
            DRIVER_OPS.join(", "),
            CSI_DRIVER_OPS.join(", ")
        ));
    }
    Ok(FaultTarget {
        component,
        op: op.to_string(),
    })
}

/// The RPCs the sidecar makes.
pub const DRIVER_OPS: &[&str] = &[
    "DriverCreateBucket",
    "DriverDeleteBucket",
    "DriverGrantBucketAccess",
    "DriverRevokeBucketAccess",
];

/// The CSI RPCs the CSI sidecars make.
pub const CSI_DRIVER_OPS: &[&str] = &[
    "CreateVolume",
    "DeleteVolume",
    "ControllerPublishVolume",
    "ControllerUnpublishVolume",
    "NodeStageVolume",
    "NodeUnstageVolume",
    "NodePublishVolume",
    "NodeUnpublishVolume",
    "NodeGetInfo",
    "CreateSnapshot",
    "DeleteSnapshot",
    "GetMetadataAllocated",
    "GetMetadataDelta",
];

/// How a fault looks in the file (one key: the action).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum RawFault {
    /// `crash_driver: { on, nth?, times?, when? }` (default when: after_commit)
    CrashDriver(RawAim),
    /// `drop_response: { on, nth?, times? }`
    DropResponse(RawAim),
    /// `error: { on, nth?, times?, status?, code, message? }`
    Error(RawError),
    /// `delay: { on, nth?, times?, by }`
    Delay(RawDelay),
    /// `restart: { on, nth?, times?, when? }` — restart the fake `on` names (default when: after_commit)
    Restart(RawAim),
}

/// Common aim fields.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RawAim {
    /// `component.operation`
    pub on: String,
    /// Occurrence (1-based) after arming.
    #[serde(default)]
    pub nth: Option<u32>,
    /// Consecutive occurrences.
    #[serde(default)]
    pub times: Option<u32>,
    /// before_commit | after_commit
    #[serde(default)]
    pub when: Option<When>,
}

/// `error:` fields.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RawError {
    /// `component.operation`
    pub on: String,
    /// Occurrence (1-based).
    #[serde(default)]
    pub nth: Option<u32>,
    /// Consecutive occurrences.
    #[serde(default)]
    pub times: Option<u32>,
    /// HTTP status (HTTP fakes; default 500).
    #[serde(default)]
    pub status: Option<u16>,
    /// S3/admin/Kubernetes error code, or a gRPC code name for `driver.*`.
    pub code: String,
    /// Message text.
    #[serde(default)]
    pub message: Option<String>,
}

/// `delay:` fields.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RawDelay {
    /// `component.operation`
    pub on: String,
    /// Occurrence (1-based).
    #[serde(default)]
    pub nth: Option<u32>,
    /// Consecutive occurrences.
    #[serde(default)]
    pub times: Option<u32>,
    /// Virtual duration.
    pub by: String,
}

/// gRPC code names a driver error fault may use.
pub const GRPC_CODES: &[&str] = &[
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
];

impl RawFault {
    /// Validate into a [`FaultSpec`]; the error text says what is wrong.
    pub fn resolve(&self) -> Result<FaultSpec, String> {
        let (on, nth, times, when, action) = match self {
            RawFault::CrashDriver(a) => (
                &a.on,
                a.nth,
                a.times,
                a.when.unwrap_or(When::AfterCommit),
                FaultAction::CrashDriver,
            ),
            RawFault::DropResponse(a) => {
                if a.when == Some(When::BeforeCommit) {
                    return Err("drop_response is after_commit by definition (the callee commits, the reply is lost)".into());
                }
                (
                    &a.on,
                    a.nth,
                    a.times,
                    When::AfterCommit,
                    FaultAction::DropResponse,
                )
            }
            RawFault::Error(e) => (
                &e.on,
                e.nth,
                e.times,
                When::BeforeCommit,
                FaultAction::Error {
                    status: e.status.unwrap_or(500),
                    code: e.code.clone(),
                    message: e
                        .message
                        .clone()
                        .unwrap_or_else(|| format!("injected {}", e.code)),
                },
            ),
            RawFault::Restart(a) => (
                &a.on,
                a.nth,
                a.times,
                a.when.unwrap_or(When::AfterCommit),
                FaultAction::Restart,
            ),
            RawFault::Delay(d) => {
                let by = super::parse_duration(&d.by)
                    .ok_or_else(|| format!("`{}` is not a duration (e.g. 500ms, 5s, 2m)", d.by))?;
                (
                    &d.on,
                    d.nth,
                    d.times,
                    When::BeforeCommit,
                    FaultAction::Delay(by),
                )
            }
        };
        let on = parse_target(on)?;
        if action == FaultAction::Restart && on.component == Component::Driver {
            return Err("the driver is not restarted but crashed: use crash_driver".into());
        }
        if let FaultAction::Error { status, code, .. } = &action {
            if on.component == Component::Driver && !GRPC_CODES.contains(&code.as_str()) {
                return Err(format!(
                    "`{code}` is not a gRPC code name (e.g. UNAVAILABLE, INTERNAL)"
                ));
            }
            if !(400..=599).contains(status) {
                return Err(format!(
                    "status {status} is not an HTTP error status (400-599)"
                ));
            }
        }
        let nth = nth.unwrap_or(1);
        let times = times.unwrap_or(1);
        if nth == 0 || times == 0 {
            return Err("`nth` and `times` count from 1".into());
        }
        Ok(FaultSpec {
            action,
            on,
            nth,
            times,
            when,
        })
    }
}

/// A network partition between two components.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartitionSpec {
    /// One side.
    pub from: Component,
    /// The other side.
    pub to: Component,
    /// Only `from`→`to` traffic is cut (requests from `from` vanish; with `from`
    /// the callee, its replies vanish).
    pub one_way: bool,
    /// Heals by itself after this much virtual time; `None` = until a `heal` step.
    pub duration: Option<Duration>,
}

/// `partition:` as written.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RawPartition {
    /// One side.
    pub from: String,
    /// The other side.
    pub to: String,
    /// Cut only `from` → `to`.
    #[serde(default)]
    pub one_way: bool,
    /// Virtual duration, e.g. `30s`.
    #[serde(default, rename = "for")]
    pub duration: Option<String>,
}

impl RawPartition {
    /// Validate.
    pub fn resolve(&self) -> Result<PartitionSpec, String> {
        let c = |s: &str| {
            parse_component(s).ok_or_else(|| {
                format!("unknown component `{s}` (sidecar, driver, s3, s3admin, kube)")
            })
        };
        let from = c(&self.from)?;
        let to = c(&self.to)?;
        if from == to {
            return Err("a partition needs two different components".into());
        }
        let duration = match &self.duration {
            None => None,
            Some(d) => {
                Some(super::parse_duration(d).ok_or_else(|| format!("`{d}` is not a duration"))?)
            }
        };
        Ok(PartitionSpec {
            from,
            to,
            one_way: self.one_way,
            duration,
        })
    }
}
