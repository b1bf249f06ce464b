//! The CSI spec sweep (`spec_sweep:`): the lab calls the driver under test
//! directly over its real sockets — controller and one node plugin — case by
//! case, each case a rule of the CSI spec (cited by section), and records
//! pass, fail or not applicable (a capability not advertised) with the
//! history call ids that show it. The `csi-spec` invariant reports it.
//! Coverage is at least that of csi-test's sanity suite (docs/csi-spec-sweep.md).

mod cases;
mod client;

use serde::{Deserialize, Serialize};

pub(crate) use cases::run;

/// How one case of the sweep ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CaseOutcome {
    /// The driver did what the spec requires.
    Pass,
    /// It did not.
    Fail,
    /// The case does not apply (a capability not advertised, or nothing to
    /// act on): not exercised, never a pass.
    NotApplicable,
}

/// One case of the sweep: plain data, for observations and reports.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SweepCase {
    /// Stable id, e.g. `node-unpublish.removes-target`.
    pub id: String,
    /// The spec's rule it checks (section, paraphrased).
    pub rule: String,
    /// How it ended.
    pub outcome: CaseOutcome,
    /// What was seen (or why it does not apply).
    pub detail: String,
    /// History call ids of the calls it made.
    pub calls: Vec<u64>,
}

/// The node plugin the sweep drives, as the lab knows it.
pub(crate) struct SweepNode {
    /// The node's socket.
    pub socket: std::path::PathBuf,
    /// Whether a path exists on that node (its mount table's view).
    pub path_exists: Box<dyn Fn(&str) -> bool + Send + Sync>,
}

/// Waits until a crash or restart the lab's faults began has finished (the
/// lab's hook), before the sweep retries a call those faults spoiled.
pub(crate) type Settle =
    std::sync::Arc<dyn Fn() -> futures_util::future::BoxFuture<'static, ()> + Send + Sync>;

/// What the sweep needs from the lab.
pub(crate) struct SweepTarget {
    /// The controller's socket.
    pub controller: std::path::PathBuf,
    /// The node plugin it drives.
    pub node: SweepNode,
    /// The driver's name (the kubelet's paths carry it).
    pub driver_name: String,
    /// StorageClass parameters for CreateVolume (the first class's).
    pub parameters: std::collections::HashMap<String, String>,
    /// The fs type of that class, if any.
    pub fs_type: String,
    /// Per-call deadline.
    pub call_timeout: std::time::Duration,
    /// See [`Settle`].
    pub settle: Settle,
}
