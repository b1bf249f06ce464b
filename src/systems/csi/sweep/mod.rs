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

/// The volumes and snapshots the sweep's calls made (with the calls that
/// handed each out) and the ones a delete answered OK for: plain data, so
/// no-orphans judges what the sweep made as it judges a sidecar's creates.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SweepLedger {
    /// Volume id → the CreateVolume calls that answered it.
    pub volumes: std::collections::BTreeMap<String, Vec<u64>>,
    /// Snapshot id → the CreateSnapshot calls that answered it.
    pub snapshots: std::collections::BTreeMap<String, Vec<u64>>,
    /// Volume ids a DeleteVolume answered OK for.
    pub volumes_deleted: std::collections::BTreeSet<String>,
    /// Snapshot ids a DeleteSnapshot answered OK for.
    pub snapshots_deleted: std::collections::BTreeSet<String>,
}

impl SweepLedger {
    /// Take note of one call's final answer (`subject` is the id a delete names).
    pub(crate) fn note<T: client::Yields>(
        &mut self,
        op: drivelab_fakes::ops::Op,
        subject: &str,
        call: u64,
        reply: &client::Reply<T>,
    ) {
        use drivelab_fakes::csi::{DELETE_SNAPSHOT, DELETE_VOLUME};
        let Ok(r) = reply else { return };
        match r.made() {
            Some(client::Made::Volume(id)) if !id.is_empty() => {
                self.volumes.entry(id.to_string()).or_default().push(call)
            }
            Some(client::Made::Snapshot(id)) if !id.is_empty() => {
                self.snapshots.entry(id.to_string()).or_default().push(call)
            }
            _ if subject.is_empty() => {}
            _ if op == DELETE_VOLUME => {
                self.volumes_deleted.insert(subject.to_string());
            }
            _ if op == DELETE_SNAPSHOT => {
                self.snapshots_deleted.insert(subject.to_string());
            }
            _ => {}
        }
    }

    /// Extend with another sweep's.
    pub(crate) fn extend(&mut self, other: SweepLedger) {
        for (k, v) in other.volumes {
            self.volumes.entry(k).or_default().extend(v);
        }
        for (k, v) in other.snapshots {
            self.snapshots.entry(k).or_default().extend(v);
        }
        self.volumes_deleted.extend(other.volumes_deleted);
        self.snapshots_deleted.extend(other.snapshots_deleted);
    }
}

/// The node plugin the sweep drives, as the lab knows it.
pub(crate) struct SweepNode {
    /// The node's socket.
    pub socket: std::path::PathBuf,
    /// Whether a path exists on that node (its mount table's view).
    pub path_exists: Box<dyn Fn(&str) -> bool + Send + Sync>,
}

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
    /// The lab's fault hook (a retry waits out the crash or restart it began).
    pub hook: std::sync::Arc<crate::engine::hook::LabHook>,
}
