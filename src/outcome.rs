//! What a run produced: the engine's output, and all that the run records
//! and reports are made from. It sits below the engine, the runs db and the
//! report, so none of them needs another to name it.

use std::path::PathBuf;

use drivelab_fakes::history::Event;
use drivelab_fakes::secret::Secret;

use crate::checks::Verdict;
use crate::scenario::Mutant;

/// A failed `expect:` step.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ExpectFailure {
    /// 1-based step number.
    pub step: usize,
    /// `file:line:col` of the step.
    pub at: String,
    /// What did not hold.
    pub message: String,
}

/// Everything one run produced.
#[derive(Debug)]
pub struct RunOutcome {
    /// Scenario name.
    pub scenario: String,
    /// Scenario file.
    pub path: PathBuf,
    /// The seed used.
    pub seed: u64,
    /// Mutants that were on.
    pub mutants: Vec<Mutant>,
    /// DriverGetInfo name.
    pub driver_name: String,
    /// Invariant verdicts, judged from `record`.
    pub verdicts: Vec<Verdict>,
    /// What the verdicts were judged from ([`crate::systems::Record`], as
    /// written: secrets fingerprinted), for the runs db to keep.
    pub record: String,
    /// Failed expectations.
    pub expect_failures: Vec<ExpectFailure>,
    /// Reference-design expectations not judged for this driver (neither pass nor fail).
    pub expect_not_exercised: Vec<ExpectFailure>,
    /// Faults and partitions the scenario set up that never acted (a failure
    /// unless optional: the scenario did not test what it says).
    pub unfired_faults: Vec<UnfiredFault>,
    /// How many faults and partitions the scenario set up.
    pub faults_armed: usize,
    /// Objects that had not converged when their step's window closed.
    pub not_converged: Vec<String>,
    /// Measured figures for the report, one line each (e.g. attach throughput).
    pub figures: Vec<String>,
    /// The Director worker pool's figures, when the run modelled it in virtual time.
    pub scale: Option<ScaleFigures>,
    /// The canonical ownership snapshot.
    pub snapshot: String,
    /// The full history.
    pub history: Vec<Event>,
    /// The history as JSON with ids labelled as in the snapshot (what reports write).
    pub history_text: String,
    /// The snapshot after each step, for before/after diffs.
    pub step_snapshots: Vec<StepSnapshot>,
    /// The scenario's own claims (decided by its verdicts).
    pub claims: Vec<crate::scenario::Claim>,
    /// The command that replays this run.
    pub replay: String,
    /// Every secret value the run created or handed out (what no-secret-leak
    /// searched for); for leak scans of what a run wrote, never written itself.
    pub secrets: Vec<Secret>,
}

/// Attach throughput and latency of a run whose Director modelled its worker
/// pool in virtual time (`bosh: { scale: … }` or `virtual_lanes: true`): one
/// row of the report's scale table.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ScaleFigures {
    /// Nodes (instances of the deployments).
    pub nodes: u32,
    /// Dynamic-disks workers.
    pub workers: usize,
    /// Disk tasks the pool ran.
    pub disk_tasks: usize,
    /// Volume-to-node attachments that completed.
    pub attaches: usize,
    /// Virtual ms from the first attach queued to the last done.
    pub span_ms: u64,
    /// Attaches per virtual minute over that span.
    pub per_minute: f64,
    /// Attach latency (first attach task queued to its successful task done), virtual ms.
    pub p50_ms: u64,
    /// 99th percentile of the same.
    pub p99_ms: u64,
    /// Largest of the same.
    pub max_ms: u64,
    /// How far behind the pool was at the end: the last disk task's wait from
    /// queued to taken by a worker, virtual ms.
    pub final_queue_wait_ms: u64,
}

impl RunOutcome {
    /// All checks and expectations held.
    pub fn passed(&self) -> bool {
        self.verdicts.iter().all(|v| v.passed)
            && self.expect_failures.is_empty()
            && self.unfired_faults.iter().all(|f| f.optional)
    }
}

/// The ownership snapshot after one step (labels shared with the final one).
#[derive(Clone, Debug, serde::Serialize)]
pub struct StepSnapshot {
    /// 0-based step index.
    pub step: usize,
    /// The step, described.
    pub name: String,
    /// The snapshot text.
    pub text: String,
}

/// A fault or partition the scenario set up that never acted: a failure of
/// the run (the scenario did not test what it says), or a note when optional.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnfiredFault {
    /// `fault #N (file:line)` or `partition #N (file:line)`: N counts in the
    /// order the run armed them.
    pub origin: String,
    /// What it was, e.g. `crash_driver armed on s3admin.add_user nth 1`.
    pub what: String,
    /// Why it counts as never acting, with the calls that were made.
    pub why: String,
    /// `optional: true`, or generated by the explorer: a note, not a failure.
    pub optional: bool,
}

impl UnfiredFault {
    /// One line for consoles and reports.
    pub fn message(&self) -> String {
        format!("{} {} {}", self.origin, self.what, self.why)
    }
}
