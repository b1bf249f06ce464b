//! Explore: proptest generates fault schedules (which interception point,
//! which occurrence, which fault), concurrency (which adjacent steps run
//! together) and an interleaving seed for a scenario, and a coverage guide
//! ([`guide`]) mutates the schedules that reached new calls; each case runs on
//! the virtual clock, and a failure is shrunk to a plain scenario file that
//! `drivelab run` replays with the same result. Unguided ([`StreamMode`]),
//! the fresh draws are numbered and a campaign shard takes its share of them;
//! [`merge`] joins the shards' found files.

use std::collections::{BTreeSet, HashSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::scenario::Mutant;
use crate::scenario::{BoshStep, CosiStep, CsiStep};
use anyhow::{anyhow, Context};
use drivelab_fakes::history::{Component, EventKind};
use drivelab_fakes::ops::Op;
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

use crate::engine::{self, RunOptions, RunOutcome, StepSnapshots};
use crate::report::cli::Partition;
use crate::scenario::{self, FaultAction, FaultSpec, FaultTarget, Located, Scenario, Step, When};

mod guide;
pub mod merge;
pub mod sweep;

/// What to explore and how hard.
#[derive(Clone, Debug)]
pub struct ExploreOptions {
    /// Cases to generate (before shrinking).
    pub cases: u32,
    /// Seed of the explorer itself (which schedules get generated).
    pub seed: u64,
    /// Stop generating new cases after this much wall time.
    pub time_budget: Duration,
    /// Mutants switched on in every case (and written into the found file).
    pub mutants: Vec<Mutant>,
    /// Where found scenarios are written.
    pub out_dir: PathBuf,
    /// Stop at the first failure: no shrinking, no file (for measuring time to detection).
    pub detect_only: bool,
    /// Count failing schedules and go on to the budget (for measuring the rate
    /// and for collecting the schedules the correct driver fails); nothing is
    /// shrunk, and each failing schedule is written as it ran only when
    /// `detect_only` is off.
    pub keep_going: bool,
    /// Guided, or a partition of the unguided stream (campaigns).
    pub stream: StreamMode,
    /// Schedules run at once ([`DEFAULT_JOBS`]); guided, part of what a seed replays.
    pub jobs: usize,
}

/// Schedules an exploration runs at once unless told otherwise. A case spends
/// most of its wall time waiting (sockets, the seeded scheduler's quiet
/// windows), so a few side by side fill the cores. Fixed rather than the
/// machine's core count: guided, what is drawn next depends on the results of
/// the batch before, so the batch size is part of what a seed replays.
pub const DEFAULT_JOBS: usize = 16;

/// Which schedules an exploration draws. Guided (the default), each case may
/// be a child of an earlier one that reached something new, so what runs
/// depends on earlier results; unguided, only the fresh stream, where stream
/// number `s` is proptest's `s`th draw from the seed, so disjoint partitions
/// of it are deterministic, independent, and together one unguided run.
#[derive(Clone, Debug, Default)]
pub struct StreamMode {
    /// Draw only the fresh stream (`--no-guide`).
    pub unguided: bool,
    /// Take only the stream numbers of shard k of n (implies unguided).
    pub partition: Option<Partition>,
    /// Write one line per case run here: stream number, schedule hash, verdict.
    pub manifest: Option<PathBuf>,
}

impl StreamMode {
    /// Is the coverage guide on?
    pub fn guided(&self) -> bool {
        !self.unguided && self.partition.is_none()
    }

    /// The share of the stream this run takes (all of it unpartitioned).
    fn share(&self) -> Partition {
        self.partition.unwrap_or(Partition { k: 1, n: 1 })
    }
}

/// The kinds of fault the explorer places.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GenKind {
    /// crash_driver after the callee commits.
    CrashAfter,
    /// The reply is lost.
    DropResponse,
    /// crash_driver before the callee sees the request.
    CrashBefore,
    /// The callee answers "unavailable" (503 / UNAVAILABLE).
    Unavailable,
    /// The callee answers "already exists / taken" (409 / ALREADY_EXISTS).
    Conflict,
    /// The callee refuses this call and every later one at the point, with a
    /// definite (not retryable) error, until the final convergence heals
    /// the lab: a node whose mount(8)/findmnt fail for good. Only at the
    /// node's mount table (see [`guide::kinds_for`]).
    RefusedUntilHealed,
}

/// How many calls a [`GenKind::RefusedUntilHealed`] fault refuses: more than
/// any run makes at one point, so it lasts until the final convergence
/// disarms every fault (and `nth + times` cannot overflow).
const UNTIL_HEALED: u32 = 100_000;

/// One generated fault: index into the scenario's interception points.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct GenFault {
    /// Which interception point (index into the baseline's targets).
    pub target: usize,
    /// Which occurrence (1-based).
    pub nth: u32,
    /// What.
    pub kind: GenKind,
}

/// One case.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Schedule {
    /// Interleaving and naming seed.
    pub seed: u64,
    /// Faults to arm before the first step.
    pub faults: Vec<GenFault>,
    /// Step indices `i` whose step runs concurrently with step `i + 1`.
    pub merges: Vec<usize>,
    /// Duplicate deliveries: after step `i`, its driver request again, as is or altered.
    pub dups: Vec<(usize, Dup)>,
}

/// How a duplicated request differs from the original.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dup {
    /// The same request (a retry after a lost reply, a network duplicate).
    Same,
    /// Same name, different parameters (the spec wants ALREADY_EXISTS).
    ChangedParameters,
    /// A grant with UnknownAuthenticationType (the spec wants INVALID_ARGUMENT).
    UnknownAuth,
    /// A delete again, after another tenant took the freed bucket name (S3
    /// names are global): the driver must not delete a bucket it does not own.
    NameReused,
}

const DUPS: [Dup; 4] = [
    Dup::Same,
    Dup::ChangedParameters,
    Dup::UnknownAuth,
    Dup::NameReused,
];

/// The steps that deliver `step`'s driver request again `how`; empty where
/// that kind does not apply to the step.
fn dup_of(step: &Step, how: Dup) -> Vec<Step> {
    use crate::scenario::BackendBucketStep;
    let Some(retry) = retry_of(step, how) else {
        return Vec::new();
    };
    // `retry_of` takes NameReused for deletes only.
    let (Dup::NameReused, Step::Cosi(CosiStep::DeleteBucketClaim(claim))) = (how, step) else {
        return vec![retry];
    };
    vec![
        Step::Cosi(CosiStep::CreateBackendBucket(
            BackendBucketStep::NameOfClaim(claim.clone()),
        )),
        retry,
    ]
}

/// The `retry` step that re-sends `step`'s request `how`.
fn retry_of(step: &Step, how: Dup) -> Option<Step> {
    use crate::scenario::{RetryOp, RetryStep};
    if let Step::Csi(CsiStep::CreateVolume(v)) = step {
        return resend_of(v, how);
    }
    let (op, name, namespace) = match step {
        Step::Cosi(CosiStep::CreateBucketClaim(c)) => (
            RetryOp::CreateBucketClaim,
            c.name.clone(),
            c.namespace.clone(),
        ),
        Step::Cosi(CosiStep::GrantAccess(a)) => {
            (RetryOp::GrantAccess, a.name.clone(), a.namespace.clone())
        }
        Step::Cosi(CosiStep::RevokeAccess(o)) => {
            (RetryOp::RevokeAccess, o.name.clone(), o.namespace.clone())
        }
        Step::Cosi(CosiStep::DeleteBucketClaim(o)) => (
            RetryOp::DeleteBucketClaim,
            o.name.clone(),
            o.namespace.clone(),
        ),
        _ => return None,
    };
    let creates = matches!(op, RetryOp::CreateBucketClaim | RetryOp::GrantAccess);
    let (parameters, authentication_type) = match how {
        Dup::Same => (None, None),
        Dup::NameReused if op == RetryOp::DeleteBucketClaim => (None, None),
        Dup::ChangedParameters if creates => (
            Some(
                [("drivelab-explore".to_string(), "changed".to_string())]
                    .into_iter()
                    .collect(),
            ),
            None,
        ),
        Dup::UnknownAuth if op == RetryOp::GrantAccess => (None, Some("Unknown".to_string())),
        _ => return None,
    };
    Some(Step::Cosi(CosiStep::Retry(RetryStep {
        op,
        name,
        namespace,
        parameters,
        authentication_type,
    })))
}

/// A CreateVolume sent again: the same (a retry after a lost reply) or, for
/// ChangedParameters, twice the size (the spec wants ALREADY_EXISTS).
fn resend_of(v: &crate::scenario::VolumeStep, how: Dup) -> Option<Step> {
    let size = match how {
        Dup::Same => v.size.clone(),
        Dup::ChangedParameters => {
            (scenario::bosh::parse_quantity(&v.size)?.checked_mul(2)?).to_string()
        }
        _ => return None,
    };
    Some(Step::Csi(CsiStep::ResendCreateVolume(
        crate::scenario::ResendStep {
            name: v.name.clone(),
            namespace: v.namespace.clone(),
            size,
        },
    )))
}

/// The shrunk failure, written to disk.
#[derive(Debug)]
pub struct Found {
    /// The scenario file written.
    pub path: PathBuf,
    /// The failing invariants.
    pub failed: Vec<&'static str>,
    /// The replayed run of the written file.
    pub outcome: RunOutcome,
}

/// What an exploration did.
#[derive(Debug)]
pub struct ExploreReport {
    /// Cases run (generated and shrinking), duplicates excluded.
    pub cases_run: usize,
    /// Duplicate schedules skipped.
    pub duplicates: usize,
    /// Distinct call orders seen (interleavings × fault effects).
    pub distinct_interleavings: usize,
    /// Distinct (point, occurrence, fault) placements tried.
    pub fault_placements: usize,
    /// Distinct (interception point, occurrence, answer) tuples the runs reached.
    pub tuples_reached: usize,
    /// Interception points faults were aimed at (the baseline's, then any
    /// further ones a schedule reached).
    pub targets: Vec<FaultTarget>,
    /// Schedules that broke the correct driver too (skipped when hunting a mutant).
    pub reference_failures: usize,
    /// Wall time to the first failing case, if any.
    pub first_failure_after: Option<Duration>,
    /// Failing schedules (more than one only with `keep_going`).
    pub failing_schedules: usize,
    /// With `keep_going` and not `detect_only`: each failing schedule, unshrunk,
    /// written as a scenario file, with the invariants it failed.
    pub kept: Vec<(PathBuf, Vec<&'static str>)>,
    /// The shrunk failure.
    pub found: Option<Found>,
    /// Unguided: stream numbers drawn (this partition took its share of them).
    pub streams: Option<u64>,
    /// The command that runs this exploration (this partition) again.
    pub replay: String,
    /// Total wall time.
    pub elapsed: Duration,
}

#[derive(Default)]
struct Coverage {
    seen: HashSet<Schedule>,
    orders: BTreeSet<u64>,
    placements: BTreeSet<(usize, u32, GenKind)>,
    runs: usize,
    duplicates: usize,
    reference_failures: usize,
    failing: usize,
    first_failure: Option<Duration>,
}

/// The interception points a baseline run of `base` passed through.
pub fn targets_of(outcome: &RunOutcome) -> Vec<FaultTarget> {
    let mut t: BTreeSet<(Component, Op)> = BTreeSet::new();
    for e in &outcome.history {
        if let EventKind::Call { from, to, op, .. } = &e.kind {
            if guide::faultable(*from, *to, op) {
                // Every recorded op is declared (the gate only takes declared ones).
                if let Some(op) = drivelab_fakes::ops::lookup(*to, op) {
                    t.insert((*to, op));
                }
            }
        }
    }
    t.into_iter()
        .map(|(component, op)| FaultTarget { component, op })
        .collect()
}

/// Steps a `concurrent:` block may hold (as the validator allows them).
fn concurrent_ok(s: &Step) -> bool {
    matches!(
        s,
        Step::Cosi(CosiStep::CreateBucketClaim(_))
            | Step::Cosi(CosiStep::GrantAccess(_))
            | Step::Cosi(CosiStep::RevokeAccess(_))
            | Step::Cosi(CosiStep::DeleteBucketClaim(_))
            | Step::Csi(CsiStep::CreateVolume(_))
            | Step::Csi(CsiStep::DeleteVolume(_))
            | Step::Csi(CsiStep::Publish(_))
            | Step::Csi(CsiStep::Unpublish(_))
            | Step::Bosh(BoshStep::Deploy(_))
            | Step::Bosh(BoshStep::RecreateVm(_))
            | Step::Bosh(BoshStep::RollingUpdate(_))
    )
}

/// The scenario a schedule describes: `base` minus its `expect` steps (the
/// invariants are the oracle), with the faults armed and the merges applied.
pub fn apply(base: &Scenario, targets: &[FaultTarget], sched: &Schedule) -> Scenario {
    let mut s = base.clone();
    s.seed = Some(sched.seed);
    let mut steps: Vec<Located<Step>> = Vec::new();
    for (i, l) in base
        .steps
        .iter()
        .filter(|l| !matches!(l.value, Step::Expect(_)))
        .enumerate()
    {
        steps.push(l.clone());
        for (_, how) in sched.dups.iter().filter(|(d, _)| *d == i) {
            for d in dup_of(&l.value, *how) {
                steps.push(Located {
                    value: d,
                    line: l.line,
                    col: l.col,
                });
            }
        }
    }
    let merges: BTreeSet<usize> = sched.merges.iter().copied().collect();
    let mut out: Vec<Located<Step>> = Vec::new();
    let mut i = 0;
    while i < steps.len() {
        let mut group = vec![steps[i].clone()];
        while merges.contains(&(i + group.len() - 1))
            && i + group.len() < steps.len()
            && concurrent_ok(&steps[i + group.len()].value)
            && concurrent_ok(&group[0].value)
        {
            group.push(steps[i + group.len()].clone());
        }
        i += group.len();
        if group.len() == 1 {
            out.extend(group);
        } else {
            let (line, col) = (group[0].line, group[0].col);
            out.push(Located {
                value: Step::Concurrent(group.into_iter().map(|l| l.value).collect()),
                line,
                col,
            });
        }
    }
    s.steps = out;
    for f in &sched.faults {
        let Some(on) = targets.get(f.target % targets.len().max(1)).cloned() else {
            continue;
        };
        let driver = on.component == Component::Driver;
        let mut times = 1;
        let (action, when) = match f.kind {
            GenKind::CrashAfter => (FaultAction::CrashDriver, When::AfterCommit),
            GenKind::CrashBefore => (FaultAction::CrashDriver, When::BeforeCommit),
            GenKind::DropResponse => (FaultAction::DropResponse, When::AfterCommit),
            GenKind::Unavailable => (
                FaultAction::Error {
                    status: 503,
                    code: if driver {
                        "UNAVAILABLE".into()
                    } else {
                        "ServiceUnavailable".into()
                    },
                    message: "injected by explore".into(),
                },
                When::BeforeCommit,
            ),
            // Only where "taken" is an answer a real backend gives without lying
            // about state: another tenant owns the bucket name. Elsewhere, unavailable.
            GenKind::Conflict if guide::takes_conflict(&on) => (
                FaultAction::Error {
                    status: 409,
                    code: "BucketAlreadyExists".into(),
                    message: "injected by explore".into(),
                },
                When::BeforeCommit,
            ),
            // The mount table's definite refusal (400 → the driver's INTERNAL):
            // a NodeStage that fails so is final to the kubelet, which then
            // never unstages, so what the driver mounted before it failed
            // is its own to take down (a 503 would be retried and unstaged).
            GenKind::RefusedUntilHealed => {
                times = UNTIL_HEALED;
                (
                    FaultAction::Error {
                        status: 400,
                        code: "InvalidRequest".into(),
                        message: "injected by explore: refused until healed".into(),
                    },
                    When::BeforeCommit,
                )
            }
            GenKind::Conflict => (
                FaultAction::Error {
                    status: 503,
                    code: if driver {
                        "UNAVAILABLE".into()
                    } else {
                        "ServiceUnavailable".into()
                    },
                    message: "injected by explore".into(),
                },
                When::BeforeCommit,
            ),
        };
        // Generated: a fault the schedule aims where the run no longer goes is
        // a note, not a failure (the invariants are the explorer's oracle).
        s.faults.push(Located {
            value: FaultSpec {
                action,
                on,
                nth: f.nth,
                times,
                when,
                optional: true,
            },
            line: 0,
            col: 0,
        });
    }
    s
}

fn call_order_hash(o: &RunOutcome) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for e in &o.history {
        if let EventKind::Call { from, to, op, .. } = &e.kind {
            (from, to, op).hash(&mut h);
        }
    }
    h.finish()
}

fn failed_invariants(o: &RunOutcome) -> Vec<&'static str> {
    o.verdicts
        .iter()
        .filter(|v| !v.passed)
        .map(|v| v.invariant)
        .collect()
}

/// Explore `base`. Must be called on a multi-thread tokio runtime.
///
/// Guided (the default): each case is either fresh (drawn by proptest from
/// the whole schedule space) or a child of a kept schedule (see [`guide`]):
/// one that reached an (interception point, occurrence, answer) tuple no
/// earlier run had, with a fault aimed at what it reached, or one more
/// duplicate, merge or seed. Unguided ([`StreamMode`]): only the fresh
/// stream, numbered, so that partitions of it are independent.
pub async fn explore(base: &Scenario, opts: &ExploreOptions) -> anyhow::Result<ExploreReport> {
    let started = Instant::now();
    let (base, opts) = &hoist_mutants(base, opts);
    let baseline = engine::run(
        base,
        &RunOptions {
            seed: base.seed,
            mutants: vec![],
            ..Default::default()
        },
    )
    .await
    .context("the baseline run")?;
    let targets = targets_of(&baseline);
    if targets.is_empty() {
        return Err(anyhow!(
            "the scenario's baseline run made no calls a fault could hit"
        ));
    }
    if std::env::var_os("DRIVELAB_EXPLORE_TRACE").is_some() {
        for (i, t) in targets.iter().enumerate() {
            eprintln!("target {i}: {t}");
        }
    }
    let mut seed_bytes = [0u8; 32];
    seed_bytes[..8].copy_from_slice(&opts.seed.to_le_bytes());
    let runner = TestRunner::new_with_rng(
        Config {
            failure_persistence: None,
            ..Config::default()
        },
        TestRng::from_seed(RngAlgorithm::ChaCha, &seed_bytes),
    );
    // The guide draws from its own stream, so that how many children were
    // made does not shift which fresh schedules proptest draws.
    seed_bytes[8] = 1;
    let mut ex = Explorer {
        strategy: fresh_schedules(base, &targets),
        dups: dup_choices(base),
        n_steps: base.steps.len().max(1),
        base,
        opts,
        targets,
        runner,
        rng: TestRng::from_seed(RngAlgorithm::ChaCha, &seed_bytes),
        corpus: guide::Corpus::default(),
        c: Coverage::default(),
        kept: Vec::new(),
        manifest: Vec::new(),
        streams: 0,
        started,
    };
    let failing = if opts.stream.guided() {
        ex.guided().await?
    } else {
        ex.stream().await?
    };
    ex.finish(failing).await
}

/// One case's run: its outcome, the invariants it failed, and whether the
/// correct driver failed the same schedule (hunting a mutant).
struct Ran {
    outcome: RunOutcome,
    failed: Vec<&'static str>,
    reference_failed: bool,
}

/// What ends a case: go on, or stop at this failing schedule.
enum Next {
    Go,
    Stop(Schedule),
}

/// The state of one exploration: generators, coverage, what was kept.
struct Explorer<'a> {
    base: &'a Scenario,
    opts: &'a ExploreOptions,
    targets: Vec<FaultTarget>,
    strategy: BoxedStrategy<Schedule>,
    dups: Vec<(usize, Dup)>,
    n_steps: usize,
    runner: TestRunner,
    rng: TestRng,
    corpus: guide::Corpus,
    c: Coverage,
    kept: Vec<(PathBuf, Vec<&'static str>)>,
    /// One line per case run: stream number, schedule hash, verdict.
    manifest: Vec<String>,
    /// Stream numbers drawn (unguided).
    streams: u64,
    started: Instant,
}

/// Consecutive duplicate draws after which the schedule space counts as exhausted.
const MAX_MISSES: u32 = 10_000;

impl Explorer<'_> {
    fn fresh(&mut self) -> anyhow::Result<Schedule> {
        Ok(self
            .strategy
            .new_tree(&mut self.runner)
            .map_err(|e| anyhow!("generating a schedule: {e}"))?
            .current())
    }

    fn in_budget(&self, drawn: usize) -> bool {
        drawn < self.opts.cases as usize && self.started.elapsed() <= self.opts.time_budget
    }

    /// Schedules run side by side (at least one).
    fn jobs(&self) -> usize {
        self.opts.jobs.max(1)
    }

    /// Guided: fresh schedules and children of kept ones; `--cases` counts runs.
    /// A batch is drawn from what the batches before it reached, then run at once.
    async fn guided(&mut self) -> anyhow::Result<Option<Schedule>> {
        let mut misses = 0u32;
        while self.in_budget(self.c.runs) {
            let room = self.jobs().min(self.opts.cases as usize - self.c.runs);
            let mut batch = Vec::new();
            while batch.len() < room {
                let (targets, dups) = (&self.targets, &self.dups);
                let child = self
                    .corpus
                    .child(&mut self.rng, targets, dups, self.n_steps);
                let sched = match child {
                    Some(s) => s,
                    None => self.fresh()?,
                };
                if !self.c.seen.insert(sched.clone()) {
                    self.c.duplicates += 1;
                    misses += 1;
                    // A space this small is exhausted: stop rather than spin.
                    if misses > MAX_MISSES {
                        break;
                    }
                    continue;
                }
                misses = 0;
                batch.push((sched, None));
            }
            if batch.is_empty() {
                break;
            }
            if let Some(s) = self.run_batch(batch).await? {
                return Ok(Some(s));
            }
        }
        Ok(None)
    }

    /// Unguided: stream number `s` is the `s`th fresh draw (0-based); this
    /// run takes those of its partition and `--cases` counts stream numbers.
    /// Every draw is made and remembered, whoever's it is, so a schedule
    /// that repeats an earlier stream number is skipped by every partition,
    /// as the unpartitioned run skips it.
    async fn stream(&mut self) -> anyhow::Result<Option<Schedule>> {
        let share = self.opts.stream.share();
        let mut seen_anywhere: HashSet<Schedule> = HashSet::new();
        let mut misses = 0u32;
        let mut exhausted = false;
        while !exhausted && self.in_budget(self.streams as usize) {
            let mut batch = Vec::new();
            while batch.len() < self.jobs() && self.in_budget(self.streams as usize) {
                let s = self.streams;
                self.streams += 1;
                let sched = self.fresh()?;
                let first = seen_anywhere.insert(sched.clone());
                misses = if first { 0 } else { misses + 1 };
                if misses > MAX_MISSES {
                    exhausted = true;
                    break;
                }
                if !share.takes(s) {
                    continue;
                }
                if !first {
                    self.c.duplicates += 1;
                    continue;
                }
                self.c.seen.insert(sched.clone());
                batch.push((sched, Some(s)));
            }
            if let Some(s) = self.run_batch(batch).await? {
                return Ok(Some(s));
            }
        }
        Ok(None)
    }

    /// Run a batch side by side, then take the results in the order drawn:
    /// the first failing schedule (in that order) stops an exploration that
    /// does not keep going, whatever finished first.
    async fn run_batch(
        &mut self,
        batch: Vec<(Schedule, Option<u64>)>,
    ) -> anyhow::Result<Option<Schedule>> {
        let runs: Vec<_> = batch.iter().map(|(s, _)| self.launch(s)).collect();
        let ran = futures_util::future::join_all(runs).await;
        for ((sched, stream), ran) in batch.into_iter().zip(ran) {
            let ran = ran
                .map_err(|e| anyhow!("the run panicked: {e}"))
                .and_then(|r| r)
                .with_context(|| format!("lab error on schedule {sched:?}"))?;
            if let Next::Stop(s) = self.record(sched, stream, ran).await? {
                return Ok(Some(s));
            }
        }
        Ok(None)
    }

    /// Start one case on its own task (and, hunting a mutant, the correct
    /// driver on a failure): its outcome and what it failed.
    fn launch(&mut self, sched: &Schedule) -> tokio::task::JoinHandle<anyhow::Result<Ran>> {
        for f in &sched.faults {
            self.c.placements.insert((f.target, f.nth, f.kind));
        }
        let scn = std::sync::Arc::new(apply(self.base, &self.targets, sched));
        let mutants = self.opts.mutants.clone();
        tokio::spawn(async move {
            let run = |mutants: Vec<Mutant>| {
                // Verdicts and the history are all a case reads: no per-step
                // snapshots (they were a fifth of a case's CPU).
                let opts = RunOptions {
                    seed: scn.seed,
                    mutants,
                    step_snapshots: StepSnapshots::FinalOnly,
                    ..Default::default()
                };
                // Isolated: a case's no-secret-leak reads its own log, not its
                // batch neighbours' (same seed, same secrets).
                engine::run_isolated(scn.clone(), opts)
            };
            let hunting = !mutants.is_empty();
            let outcome = run(mutants).await?;
            let failed = failed_invariants(&outcome);
            // Hunting a mutant: a schedule that breaks the correct driver too says
            // nothing about the mutant (it is a finding of its own, reported apart).
            let reference_failed =
                !failed.is_empty() && hunting && !failed_invariants(&run(vec![]).await?).is_empty();
            Ok(Ran {
                outcome,
                failed,
                reference_failed,
            })
        })
    }

    /// Take one case's result into the coverage, the corpus and the manifest.
    async fn record(
        &mut self,
        sched: Schedule,
        stream: Option<u64>,
        ran: Ran,
    ) -> anyhow::Result<Next> {
        let opts = self.opts;
        let Ran {
            outcome,
            mut failed,
            reference_failed,
        } = ran;
        if reference_failed {
            self.c.reference_failures += 1;
            failed.clear();
        }
        if std::env::var_os("DRIVELAB_EXPLORE_TRACE").is_some() {
            eprintln!(
                "case {} {:.2}s {failed:?} {sched:?}",
                self.c.runs,
                self.started.elapsed().as_secs_f64()
            );
        }
        self.manifest.push(format!(
            "{}\t{:016x}\t{}",
            stream.map_or_else(|| "-".to_string(), |s| s.to_string()),
            schedule_hash(&sched),
            if failed.is_empty() {
                "pass".to_string()
            } else {
                failed.join(",")
            }
        ));
        self.c.runs += 1;
        self.c.orders.insert(call_order_hash(&outcome));
        self.corpus.observe(
            &sched,
            &outcome,
            &mut self.targets,
            &mut self.rng,
            &self.dups,
            self.n_steps,
        );
        if failed.is_empty() {
            return Ok(Next::Go);
        }
        self.c.failing += 1;
        self.c.first_failure.get_or_insert(self.started.elapsed());
        if !opts.keep_going {
            return Ok(Next::Stop(sched));
        }
        if !opts.detect_only {
            let (path, _) = write_schedule(
                self.base,
                &self.targets,
                &sched,
                opts,
                ("kept", "explore"),
                Some(&failed[..]),
            )
            .await?;
            self.kept.push((path, failed));
        }
        Ok(Next::Go)
    }

    /// Shrink and write the failure (if any), write the manifest, and report.
    async fn finish(self, failing: Option<Schedule>) -> anyhow::Result<ExploreReport> {
        let (base, opts) = (self.base, self.opts);
        let found = match failing {
            Some(sched) if !opts.detect_only => {
                let sched = finish_shrinking(base, &self.targets, sched, opts).await;
                Some(write_found(base, &self.targets, &sched, opts, "explore").await?)
            }
            _ => None,
        };
        if let Some(path) = &opts.stream.manifest {
            let mut text = String::from("# stream\tschedule\tverdict\n");
            for l in &self.manifest {
                text.push_str(l);
                text.push('\n');
            }
            // A shard's dir may not exist yet (nothing found, nothing written).
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("creating {}", dir.display()))?;
            }
            std::fs::write(path, text)
                .with_context(|| format!("writing the manifest {}", path.display()))?;
        }
        Ok(ExploreReport {
            cases_run: self.c.runs,
            duplicates: self.c.duplicates,
            reference_failures: self.c.reference_failures,
            distinct_interleavings: self.c.orders.len(),
            fault_placements: self.c.placements.len(),
            tuples_reached: self.corpus.tuples(),
            targets: self.targets,
            first_failure_after: self.c.first_failure,
            failing_schedules: self.c.failing,
            kept: self.kept,
            found,
            streams: (!opts.stream.guided()).then_some(self.streams),
            replay: replay_line(base, opts),
            elapsed: self.started.elapsed(),
        })
    }
}

/// The command that runs this exploration again (this partition of it).
fn replay_line(base: &Scenario, opts: &ExploreOptions) -> String {
    let mut cmd = format!(
        "drivelab explore {} --seed {}",
        base.path.display(),
        opts.seed
    );
    if opts.cases != u32::MAX {
        cmd.push_str(&format!(" --cases {}", opts.cases));
    } else {
        cmd.push_str(&format!(
            " --time-budget {}ms",
            opts.time_budget.as_millis()
        ));
    }
    for m in &opts.mutants {
        cmd.push_str(&format!(" --mutant {}", m.name()));
    }
    match (&opts.stream.partition, opts.stream.guided()) {
        (Some(p), _) => cmd.push_str(&format!(" --partition {}/{}", p.k, p.n)),
        (None, false) => cmd.push_str(" --no-guide"),
        (None, true) => {}
    }
    if opts.jobs != DEFAULT_JOBS {
        cmd.push_str(&format!(" --jobs {}", opts.jobs));
    }
    if opts.keep_going {
        cmd.push_str(" --keep-going");
    }
    if opts.detect_only {
        cmd.push_str(" --detect-only");
    }
    cmd.push_str(&base.driver.replay_flag());
    cmd
}

/// The seeded bugs the base's driver declares (`--driver '{builtin: bosh-csi,
/// mutants: [X]}'`, or a file that names them) are hunted as `--mutant X` is:
/// left in the driver they would be on in the baseline and in the reference
/// runs that tell a mutant's failure from one the correct driver shares, and
/// written into the found file, which must pass with the correct driver.
fn hoist_mutants(base: &Scenario, opts: &ExploreOptions) -> (Scenario, ExploreOptions) {
    let mut base = base.clone();
    let mut opts = opts.clone();
    for m in std::mem::take(&mut base.driver.mutants) {
        if !opts.mutants.contains(&m) {
            opts.mutants.push(m);
        }
    }
    (base, opts)
}

/// Every (step, duplicate kind) pair that makes a request, each once, deletes
/// and revokes three times: their retries are where a driver deletes what it
/// does not own, and they have one kind (the same request) where a grant has three.
fn dup_choices(base: &Scenario) -> Vec<(usize, Dup)> {
    let mut out = Vec::new();
    for (i, st) in base
        .steps
        .iter()
        .filter(|l| !matches!(l.value, Step::Expect(_)))
        .enumerate()
    {
        let w = match &st.value {
            Step::Cosi(CosiStep::DeleteBucketClaim(_)) | Step::Cosi(CosiStep::RevokeAccess(_)) => 3,
            _ => 1,
        };
        for how in DUPS {
            if !dup_of(&st.value, how).is_empty() {
                out.extend(std::iter::repeat_n((i, how), w));
            }
        }
    }
    out
}

/// Fresh schedules: a seed, up to three faults, merges and duplicates.
fn fresh_schedules(base: &Scenario, targets: &[FaultTarget]) -> BoxedStrategy<Schedule> {
    let n_steps = base.steps.len().max(1);
    // The kind first, then a point that takes it: every kind gets a fifth of
    // the faults, so the one 409 a backend gives honestly (a taken bucket
    // name, only at s3.create_bucket) is not drowned by 90 crash/unavailable
    // placements. Among points: the sidecar→driver link (where ambiguous
    // failures, a committed grant whose reply is lost, live) weighs as much as
    // the rest together; destructive backend calls (a failed delete that is
    // retried decides owner-only-delete) count double.
    let mut by_kind: Vec<(GenKind, Vec<usize>)> = Vec::new();
    for (i, t) in targets.iter().enumerate() {
        let w = if t.component == Component::Driver {
            (targets.len() / 4).max(1)
        } else if t.op.as_str().contains("delete") || t.op.as_str().contains("remove") {
            2
        } else {
            1
        };
        for &k in guide::kinds_for(t) {
            let at = match by_kind.iter().position(|(kk, _)| *kk == k) {
                Some(at) => at,
                None => {
                    by_kind.push((k, Vec::new()));
                    by_kind.len() - 1
                }
            };
            by_kind[at].1.extend(std::iter::repeat_n(i, w));
        }
    }
    let n_kinds = by_kind.len().max(1);
    let dups = dup_choices(base);
    let dup_strategy = if dups.is_empty() {
        Just(Vec::new()).boxed()
    } else {
        proptest::collection::vec(proptest::sample::select(dups), 0..=guide::MAX_DUPS).boxed()
    };
    (
        any::<u64>(),
        proptest::collection::vec((0..n_kinds, any::<u32>(), 1u32..=3), 0..=guide::MAX_FAULTS),
        proptest::collection::vec(0..n_steps, 0..=guide::MAX_MERGES),
        dup_strategy,
    )
        .prop_map(move |(seed, faults, merges, dups)| Schedule {
            seed: seed % 1_000_000,
            faults: faults
                .into_iter()
                .filter_map(|(k, r, nth)| {
                    let (kind, at) = by_kind.get(k)?;
                    let target = *at.get(r as usize % at.len().max(1))?;
                    Some(GenFault {
                        target,
                        nth,
                        kind: *kind,
                    })
                })
                .collect(),
            merges,
            dups,
        })
        .boxed()
}

/// Does this schedule fail (for the mutant, and not for the correct driver)?
async fn fails(
    base: &Scenario,
    targets: &[FaultTarget],
    sched: &Schedule,
    opts: &ExploreOptions,
) -> bool {
    let scn = apply(base, targets, sched);
    let Ok(o) = engine::run(
        &scn,
        &RunOptions {
            seed: scn.seed,
            mutants: opts.mutants.clone(),
            ..Default::default()
        },
    )
    .await
    else {
        return false;
    };
    if failed_invariants(&o).is_empty() {
        return false;
    }
    if opts.mutants.is_empty() {
        return true;
    }
    matches!(engine::run(&scn, &RunOptions { seed: scn.seed, ..Default::default() }).await, Ok(r) if failed_invariants(&r).is_empty())
}

/// proptest's shrinking stops at the time budget; finish greedily: drop each
/// fault and each merge, and move each fault to its first occurrence, while
/// the case still fails. Fewest faults, fewest concurrent steps, earliest occurrence.
async fn finish_shrinking(
    base: &Scenario,
    targets: &[FaultTarget],
    mut sched: Schedule,
    opts: &ExploreOptions,
) -> Schedule {
    // Seed 0 when the failure does not depend on the interleaving drawn.
    if sched.seed != 0 {
        let t = Schedule {
            seed: 0,
            ..sched.clone()
        };
        if fails(base, targets, &t, opts).await {
            sched = t;
        }
    }
    let mut progress = true;
    while progress {
        progress = false;
        for i in (0..sched.faults.len()).rev() {
            let mut t = sched.clone();
            t.faults.remove(i);
            if fails(base, targets, &t, opts).await {
                sched = t;
                progress = true;
            }
        }
        for i in (0..sched.dups.len()).rev() {
            let mut t = sched.clone();
            t.dups.remove(i);
            if fails(base, targets, &t, opts).await {
                sched = t;
                progress = true;
            }
        }
        for i in (0..sched.merges.len()).rev() {
            let mut t = sched.clone();
            t.merges.remove(i);
            if fails(base, targets, &t, opts).await {
                sched = t;
                progress = true;
            }
        }
        for i in 0..sched.faults.len() {
            if sched.faults[i].nth > 1 {
                let mut t = sched.clone();
                t.faults[i].nth = 1;
                if fails(base, targets, &t, opts).await {
                    sched = t;
                    progress = true;
                }
            }
        }
    }
    sched
}

/// Write the shrunk `sched` and replay the file; `by` is the command that
/// found it (`explore`, `sweep-faults --depth 1`), for the file's header.
async fn write_found(
    base: &Scenario,
    targets: &[FaultTarget],
    sched: &Schedule,
    opts: &ExploreOptions,
    by: &str,
) -> anyhow::Result<Found> {
    let (path, written) = write_schedule(base, targets, sched, opts, ("found", by), None).await?;
    // Replay from the file, exactly as a developer would.
    let outcome = engine::run(
        &written,
        &RunOptions {
            seed: None,
            mutants: opts.mutants.clone(),
            ..Default::default()
        },
    )
    .await?;
    let failed = failed_invariants(&outcome);
    // Written again with what the replay failed in its header, for
    // `merge-found` (only comments change: the file replays as before).
    write_schedule(base, targets, sched, opts, ("found", by), Some(&failed)).await?;
    Ok(Found {
        path,
        failed,
        outcome,
    })
}

/// Write `sched` as a plain scenario file in `opts.out_dir` (`how`: `found`
/// for a shrunk failure, `kept` for one collected as it ran; `by`: the
/// command, e.g. `explore`; `failed`: the invariants it fails, once known)
/// and load it back.
async fn write_schedule(
    base: &Scenario,
    targets: &[FaultTarget],
    sched: &Schedule,
    opts: &ExploreOptions,
    (how, by): (&str, &str),
    failed: Option<&[&'static str]>,
) -> anyhow::Result<(PathBuf, Scenario)> {
    let mut scn = apply(base, targets, sched);
    // Named after what it was hunting, so two hunts that shrink to one seed do not collide.
    let hunted: String = opts
        .mutants
        .iter()
        .map(|m| format!("-{}", m.name()))
        .collect();
    // Collected schedules are many per hunt: the hash of the whole schedule
    // tells them apart where the seed alone may not.
    let tag = match (how, by) {
        ("found", "explore") => sched.seed.to_string(),
        // A sweep's runs share one seed: the placement tells its files apart.
        ("found", _) => format!("sweep-{:08x}", schedule_hash(sched) as u32),
        _ => format!("{}-{:016x}", sched.seed, schedule_hash(sched)),
    };
    scn.name = format!("{}{hunted}-{how}-{tag}", base.name);
    let file = opts
        .out_dir
        .join(format!("{}{hunted}-{tag}.yaml", base.name));
    // The mutant stays on the command line, not in the file: the correct driver
    // must pass this schedule (a regression scenario for `make e2e`), and
    // `make mutants` replays it against every mutant.
    let flags: String = opts
        .mutants
        .iter()
        .map(|m| format!(" --mutant {}", m.name()))
        .collect();
    let partition = match &opts.stream.partition {
        Some(p) => format!(" --partition {p}"),
        None => String::new(),
    };
    let mut header = vec![
        format!(
            "{} by `drivelab {by} {}{flags}{partition}{}` ({} seed {}){}.",
            if how == "found" {
                "Found"
            } else {
                "Collected (--keep-going)"
            },
            base.path.display(),
            base.driver.replay_flag(),
            if by == "explore" { "explorer" } else { "sweep" },
            opts.seed,
            if how == "found" {
                ", shrunk"
            } else {
                ", not shrunk"
            },
        ),
        format!(
            "Fails with{flags}: replay with `drivelab run {}{flags}`.",
            file.display()
        ),
    ];
    let mutants: Vec<&str> = opts.mutants.iter().map(|m| m.name()).collect();
    header.push(scenario::write::list_header(
        scenario::write::MUTANTS_HEADER,
        &mutants,
    ));
    if let Some(failed) = failed {
        header.push(scenario::write::list_header(
            scenario::write::FAILED_HEADER,
            failed,
        ));
    }
    let text = scenario::write::to_yaml(&scn, &header);
    std::fs::create_dir_all(&opts.out_dir)
        .with_context(|| format!("creating {}", opts.out_dir.display()))?;
    std::fs::write(&file, &text).with_context(|| format!("writing {}", file.display()))?;
    let written =
        scenario::load(&file).map_err(|e| anyhow!("the written scenario does not parse: {e}"))?;
    Ok((file, written))
}

fn schedule_hash(sched: &Schedule) -> u64 {
    use std::hash::{Hash, Hasher};
    // DefaultHasher::new() has fixed keys: the same schedule, the same file name.
    let mut h = std::collections::hash_map::DefaultHasher::new();
    sched.hash(&mut h);
    h.finish()
}

/// Print the report the CLI shows; `stream` is how its schedules were drawn.
pub fn print(report: &ExploreReport, stream: &StreamMode) {
    match (&stream.partition, report.streams) {
        (Some(p), Some(drawn)) => crate::outln!(
            "partition {p}: coverage guide off (partitions must be deterministic and independent); ran the stream numbers s < {drawn} with s mod {} = {}",
            p.n,
            p.k - 1
        ),
        (None, Some(drawn)) => crate::outln!(
            "coverage guide off (--no-guide): ran the stream numbers s < {drawn}"
        ),
        _ => {}
    }
    crate::outln!(
        "explored {} schedules in {:.1}s ({} duplicates skipped): {} distinct call orders, {} fault placements over {} interception points, {} (point, occurrence, answer) tuples reached",
        report.cases_run,
        report.elapsed.as_secs_f64(),
        report.duplicates,
        report.distinct_interleavings,
        report.fault_placements,
        report.targets.len(),
        report.tuples_reached
    );
    if report.failing_schedules > 0 && report.found.is_none() && !report.kept.is_empty() {
        crate::outln!(
            "{} failing schedules (kept going, not shrunk):",
            report.failing_schedules
        );
        for (path, failed) in &report.kept {
            crate::outln!("  {}: {}", path.display(), failed.join(", "));
        }
    }
    if report.reference_failures > 0 {
        crate::outln!("{} schedules broke the correct driver too (not counted against the mutant: run explore without --mutant)", report.reference_failures);
    }
    match &report.found {
        None if report.first_failure_after.is_some() => crate::outln!(
            "FOUND after {:.1}s ({})",
            report.first_failure_after.unwrap_or_default().as_secs_f64(),
            if report.kept.is_empty() {
                "detect-only: not shrunk, nothing written"
            } else {
                "the first failing schedule; kept going: not shrunk"
            }
        ),
        None => crate::outln!("no invariant failed"),
        Some(f) => {
            crate::outln!(
                "FOUND after {:.1}s: {} — shrunk and written to {}",
                report.first_failure_after.unwrap_or_default().as_secs_f64(),
                f.failed.join(", "),
                f.path.display()
            );
            crate::out!("{}", crate::report::console(&f.outcome));
        }
    }
    crate::outln!("replay: {}", report.replay);
}

/// Replays a found file and says whether it fails the way it did when found.
pub fn same_failure(a: &RunOutcome, b: &RunOutcome) -> bool {
    failed_invariants(a) == failed_invariants(b) && a.history_text == b.history_text
}

/// Default output directory for found scenarios.
pub fn default_out_dir() -> PathBuf {
    Path::new("scenarios").join("found")
}
