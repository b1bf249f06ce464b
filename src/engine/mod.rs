//! The engine every system shares: how a run is asked for and what it
//! produces, the one run loop (`system`), the fault hook, the driver under test
//! (in-process, spawned or in a container) and the scheduler. Each system's
//! lab (`crate::systems`) plugs into it.

use rand::Rng;
use rand_chacha::ChaCha20Rng;

use crate::scenario::{Mutant, Scenario};

pub(crate) mod driver;
pub(crate) mod external;
pub use external::{write_kubeconfig, HEAD_LINES, MAX_LINE_BYTES, TAIL_LINES};
pub(crate) mod hook;
pub(crate) mod queue;
pub(crate) mod schedule;
pub(crate) mod system;

pub use crate::outcome::{ExpectFailure, RunOutcome, UnfiredFault};

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
    crate::systems::run(scn, opts, seed, &mutants).await
}

/// Worker threads of the runtime each run gets ([`run_isolated`]): one, so
/// the lab's fakes and sidecars hand work to each other on one thread instead
/// of waking a second one for every hop (on 2 cores that cost a context
/// switch per hop); the driver has a runtime of its own beside it.
/// Benchmarks that time the lab build their runtime with this too.
pub const RUN_WORKERS: usize = 1;

/// [`run`] on a runtime and thread of its own, logging into a buffer of its
/// own: how runs go side by side (`drivelab run`, seed sweeps, the mutant kill
/// table, the explorer, sweep-faults) without one run's lines in another's
/// evidence, and without a run
/// that blocks a thread stalling its neighbours. A panic is an error here.
pub async fn run_isolated(
    scn: std::sync::Arc<Scenario>,
    opts: RunOptions,
) -> anyhow::Result<RunOutcome> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let name = scn.name.clone();
    let spawned = std::thread::Builder::new()
        .name("run".into())
        .spawn(move || {
            let log = crate::logcap::RunLog::new();
            crate::logcap::adopt(Some(log.clone()));
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(RUN_WORKERS)
                .thread_name("run")
                .on_thread_start(move || crate::logcap::adopt(Some(log.clone())))
                .enable_all()
                .build();
            let res = match rt {
                Ok(rt) => {
                    let res = rt.block_on(run(&scn, &opts));
                    // A task the run left behind (a driver that never answers) is
                    // not waited for.
                    rt.shutdown_background();
                    res
                }
                Err(e) => Err(anyhow::Error::new(e).context("starting the run's runtime")),
            };
            let _ = tx.send(res);
        });
    if let Err(e) = spawned {
        return Err(anyhow::Error::new(e).context(format!("{name}: starting the run's thread")));
    }
    rx.await
        .unwrap_or_else(|_| Err(anyhow::anyhow!("{name}: the run panicked")))
}

/// What a run yields to [`in_order`]: its recorder (to complete) and its result.
pub type Finished = (Option<crate::runs::Recorder>, anyhow::Result<RunOutcome>);

/// Runs `runs` `jobs` at a time, each isolated ([`run_isolated`]), and yields
/// each result in input order as soon as it and those before it are done, so
/// output streams in file order whatever finishes first. The iterator is drawn
/// as runs start, so a record begins when its run does.
pub fn in_order<'a>(
    runs: impl Iterator<Item = (std::sync::Arc<Scenario>, RunOptions)> + Send + 'a,
    jobs: usize,
) -> futures_util::stream::BoxStream<'a, Finished> {
    use futures_util::stream::{self, StreamExt};
    stream::iter(runs)
        .map(|(scn, opts)| {
            let recorder = opts.recorder.clone();
            async move { (recorder, run_isolated(scn, opts).await) }
        })
        .buffered(jobs.max(1))
        .boxed()
}

/// The machine's cores (1 if unknown).
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Scenarios side by side unless `--jobs` says otherwise: four per core. A run
/// mostly waits (sockets, drivers starting, the scheduler's quiet windows), so
/// one per core leaves the cores idle; results do not depend on it.
pub fn default_jobs() -> usize {
    4 * cores()
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
