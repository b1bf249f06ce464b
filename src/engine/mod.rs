//! The engine every system shares: how a run is asked for and what it
//! produces, the one run loop (`system`), the fault hook, the driver under test
//! (in-process, spawned or in a container) and the scheduler. Each system's
//! lab (`crate::systems`) plugs into it.

use std::path::PathBuf;

use drivelab_fakes::history::Event;
use drivelab_fakes::secret::Secret;
use rand::Rng;
use rand_chacha::ChaCha20Rng;

use crate::checks::Verdict;
use crate::scenario::{Mutant, Scenario};

pub(crate) mod driver;
pub(crate) mod external;
pub use external::{write_kubeconfig, HEAD_LINES, MAX_LINE_BYTES, TAIL_LINES};
pub(crate) mod hook;
pub use hook::UnfiredFault;
pub(crate) mod queue;
pub(crate) mod schedule;
pub(crate) mod system;

/// How to run.
#[derive(Clone, Debug, Default)]
pub struct RunOptions {
    /// Overrides the scenario's seed.
    pub seed: Option<u64>,
    /// Mutants to switch on in addition to the scenario's.
    pub mutants: Vec<Mutant>,
    /// Whether the ownership snapshot is rendered after every step (the report's
    /// per-step diffs need it). Rendering is O(state) per step, so a run of N
    /// steps is O(N²) with it; benches of the engine's own growth turn it off.
    pub step_snapshots: StepSnapshots,
    /// Where the run's history is appended at each step boundary (`drivelab run`
    /// records; library callers and benches leave it off).
    pub recorder: Option<crate::runs::Recorder>,
}

/// When the engine renders per-step ownership snapshots.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StepSnapshots {
    /// After every step (what `drivelab run` and reports use).
    #[default]
    Every,
    /// Only the final snapshot. Labels are then numbered in the final
    /// snapshot's order, so texts differ from an `Every` run's (each is
    /// deterministic on its own).
    FinalOnly,
}

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
    /// Invariant verdicts.
    pub verdicts: Vec<Verdict>,
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

impl RunOutcome {
    /// All checks and expectations held.
    pub fn passed(&self) -> bool {
        self.verdicts.iter().all(|v| v.passed)
            && self.expect_failures.is_empty()
            && self.unfired_faults.iter().all(|f| f.optional)
    }
}

/// The command line that replays a run of `scn`, naming the driver that ran
/// whenever the file alone would not.
pub fn replay_command(scn: &Scenario, seed: u64, mutants: &[Mutant]) -> String {
    let mut cmd = format!("drivelab run {} --seed {seed}", scn.path.display());
    for m in mutants {
        cmd.push_str(" --mutant ");
        cmd.push_str(m.name());
    }
    cmd + &scn.driver.replay_flag()
}

/// The seed used when neither the file nor the command line gives one.
pub const DEFAULT_SEED: u64 = 1;

/// Run one scenario to completion.
pub async fn run(scn: &Scenario, opts: &RunOptions) -> anyhow::Result<RunOutcome> {
    let seed = opts.seed.or(scn.seed).unwrap_or(DEFAULT_SEED);
    let mut mutants = scn.driver.mutants.clone();
    for m in &opts.mutants {
        if !mutants.contains(m) {
            mutants.push(*m);
        }
    }
    mutants.sort();
    let mut outcome = crate::systems::run(scn, opts, seed, &mutants).await?;
    require_exercised(scn, &mut outcome.verdicts);
    Ok(outcome)
}

/// A check the scenario requires to be exercised that had nothing to judge
/// fails: the scenario did not test the claim it was written for.
fn require_exercised(scn: &Scenario, verdicts: &mut [Verdict]) {
    for v in verdicts.iter_mut() {
        let required = scn.require_exercised.iter().any(|i| i.id() == v.invariant);
        if required && v.passed && !v.exercised {
            v.passed = false;
            v.details.push(
                "required to be exercised (require_exercised), but it had nothing to judge in this run"
                    .into(),
            );
        }
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

/// `file:line` of a fault or a step, as a fault or partition it arms is
/// reported; the explorer's generated faults have no line.
pub(crate) fn line_of<T>(path: &std::path::Path, at: &crate::scenario::Located<T>) -> String {
    match at.line {
        0 => format!("{}, generated", path.display()),
        n => format!("{}:{n}", path.display()),
    }
}

/// A random alphanumeric token (client secrets, signing keys) drawn from the run's seed.
pub(crate) fn random_token(rng: &mut ChaCha20Rng, len: usize) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    (0..len)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect()
}
