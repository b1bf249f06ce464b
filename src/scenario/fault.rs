//! The fault vocabulary of scenario files: what to inject, where (component +
//! operation + occurrence) and when (before or after the callee commits).

use std::time::Duration;

use drivelab_fakes::history::Component;
use drivelab_fakes::ops::Op;
use serde::Deserialize;
use serde_saphyr::Spanned;

use super::names::{self, NameError, Restartable};
use super::System;

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
    /// Never firing is a note, not a failure (`optional: true`; the explorer's
    /// generated faults).
    pub optional: bool,
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
    /// The operation, as the callee declared it (and the history names it).
    pub op: Op,
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

/// Parse `component.operation` against what `system` stands up.
pub fn parse_target(s: &str, system: System) -> Result<FaultTarget, NameError> {
    let (component, op) = names::fault_target(s, system)?;
    Ok(FaultTarget { component, op })
}

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
    pub on: Spanned<String>,
    /// Occurrence (1-based) after arming.
    #[serde(default)]
    pub nth: Option<u32>,
    /// Consecutive occurrences.
    #[serde(default)]
    pub times: Option<u32>,
    /// before_commit | after_commit
    #[serde(default)]
    pub when: Option<When>,
    /// Never firing is a note, not a failure.
    #[serde(default)]
    pub optional: bool,
}

/// `error:` fields.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RawError {
    /// `component.operation`
    pub on: Spanned<String>,
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
    /// Never firing is a note, not a failure.
    #[serde(default)]
    pub optional: bool,
}

/// `delay:` fields.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RawDelay {
    /// `component.operation`
    pub on: Spanned<String>,
    /// Occurrence (1-based).
    #[serde(default)]
    pub nth: Option<u32>,
    /// Consecutive occurrences.
    #[serde(default)]
    pub times: Option<u32>,
    /// Virtual duration.
    pub by: String,
    /// Never firing is a note, not a failure.
    #[serde(default)]
    pub optional: bool,
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

/// Why a fault cannot be armed: what is wrong, the valid names, and where
/// (the `on:` value when the target is at fault, else the whole fault).
#[derive(Clone, Debug)]
pub struct FaultError {
    /// What is wrong.
    pub message: String,
    /// What would be right.
    pub hint: Option<String>,
    /// The `on:` value, when it is the part at fault.
    pub at: Option<Spanned<()>>,
}

impl From<String> for FaultError {
    fn from(message: String) -> Self {
        Self {
            message,
            hint: None,
            at: None,
        }
    }
}

impl From<&str> for FaultError {
    fn from(message: &str) -> Self {
        message.to_string().into()
    }
}

impl RawFault {
    /// The fields every fault has: target, occurrence, count, optional.
    fn aim(&self) -> (&Spanned<String>, Option<u32>, Option<u32>, bool) {
        match self {
            RawFault::CrashDriver(a) | RawFault::DropResponse(a) | RawFault::Restart(a) => {
                (&a.on, a.nth, a.times, a.optional)
            }
            RawFault::Error(e) => (&e.on, e.nth, e.times, e.optional),
            RawFault::Delay(d) => (&d.on, d.nth, d.times, d.optional),
        }
    }

    fn action(&self) -> Result<(FaultAction, When), FaultError> {
        Ok(match self {
            RawFault::CrashDriver(a) => (
                FaultAction::CrashDriver,
                a.when.unwrap_or(When::AfterCommit),
            ),
            RawFault::DropResponse(a) => {
                if a.when == Some(When::BeforeCommit) {
                    return Err("drop_response is after_commit by definition (the callee commits, the reply is lost)".into());
                }
                (FaultAction::DropResponse, When::AfterCommit)
            }
            RawFault::Error(e) => (
                FaultAction::Error {
                    status: e.status.unwrap_or(500),
                    code: e.code.clone(),
                    message: e
                        .message
                        .clone()
                        .unwrap_or_else(|| format!("injected {}", e.code)),
                },
                When::BeforeCommit,
            ),
            RawFault::Restart(a) => (FaultAction::Restart, a.when.unwrap_or(When::AfterCommit)),
            RawFault::Delay(d) => {
                let by = super::parse_duration(&d.by)
                    .ok_or_else(|| format!("`{}` is not a duration (e.g. 500ms, 5s, 2m)", d.by))?;
                (FaultAction::Delay(by), When::BeforeCommit)
            }
        })
    }

    /// Validate into a [`FaultSpec`] for a scenario of `system`.
    pub fn resolve(&self, system: System) -> Result<FaultSpec, FaultError> {
        let (on_raw, nth, times, optional) = self.aim();
        let (action, when) = self.action()?;
        let at_on = || Some(Spanned::new((), on_raw.referenced, on_raw.defined));
        let on = parse_target(&on_raw.value, system).map_err(|e| FaultError {
            message: e.message,
            hint: e.hint,
            at: at_on(),
        })?;
        if action == FaultAction::Restart {
            if on.component == Component::Driver {
                return Err("the driver is not restarted but crashed: use crash_driver".into());
            }
            let allowed = Restartable::by_fault(system);
            if !Restartable::of(on.component).is_some_and(|r| allowed.contains(&r)) {
                let valid: Vec<&str> = allowed.iter().map(|r| r.component().as_str()).collect();
                return Err(FaultError {
                    message: format!(
                        "a restart fault cannot restart `{}` in this scenario",
                        on.component
                    ),
                    hint: Some(format!("aim it at an operation of {}", valid.join(" or "))),
                    at: at_on(),
                });
            }
        }
        if let FaultAction::Error { status, code, .. } = &action {
            if on.component == Component::Driver && !GRPC_CODES.contains(&code.as_str()) {
                return Err(format!(
                    "`{code}` is not a gRPC code name (e.g. UNAVAILABLE, INTERNAL)"
                )
                .into());
            }
            if !(400..=599).contains(status) {
                return Err(
                    format!("status {status} is not an HTTP error status (400-599)").into(),
                );
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
            optional,
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
    /// Cutting nothing is a note, not a failure (`optional: true`).
    pub optional: bool,
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
    /// Cutting nothing is a note, not a failure.
    #[serde(default)]
    pub optional: bool,
}

impl RawPartition {
    /// Validate for a scenario of `system`.
    pub fn resolve(&self, system: System) -> Result<PartitionSpec, NameError> {
        let sides = names::partition_sides(system);
        let from = names::component_in(&self.from, sides, system, "a partition")?;
        let to = names::component_in(&self.to, sides, system, "a partition")?;
        let plain = |m: String| NameError {
            message: m,
            hint: None,
        };
        if from == to {
            return Err(plain("a partition needs two different components".into()));
        }
        let duration = match &self.duration {
            None => None,
            Some(d) => Some(
                super::parse_duration(d)
                    .ok_or_else(|| plain(format!("`{d}` is not a duration")))?,
            ),
        };
        Ok(PartitionSpec {
            from,
            to,
            one_way: self.one_way,
            duration,
            optional: self.optional,
        })
    }
}
