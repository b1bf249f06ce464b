//! The systematic single-fault sweep (`drivelab sweep-faults`), beside
//! explore's random search: from a baseline run of a scenario, one run per
//! (interception point reached, occurrence, fault kind) — exhaustive at depth
//! 1, a seeded sample of pairs at depth 2 — the way crash-consistency testers
//! enumerate persistence points. Failures are shrunk and written like explore's.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use drivelab_fakes::history::{Component, EventKind};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;

use super::{guide, ExploreOptions, Found, GenFault, GenKind, Schedule};
use crate::engine::{self, RunOptions, RunOutcome};
use crate::scenario::{FaultTarget, Mutant, Scenario};

/// The fault kinds every reachable point is swept with.
pub const KINDS: [GenKind; 4] = [
    GenKind::CrashBefore,
    GenKind::CrashAfter,
    GenKind::DropResponse,
    GenKind::Unavailable,
];

/// The report's name of a swept kind.
pub fn kind_name(k: GenKind) -> &'static str {
    match k {
        GenKind::CrashBefore => "crash-before-commit",
        GenKind::CrashAfter => "crash-after-commit",
        GenKind::DropResponse => "lost-reply",
        GenKind::Unavailable => "transient-error",
        GenKind::Conflict => "conflict",
        GenKind::RefusedUntilHealed => "refused-until-healed",
    }
}

/// What to sweep and how far.
#[derive(Clone, Debug)]
pub struct SweepOptions {
    /// 1: every single fault; 2: also a seeded sample of pairs.
    pub depth: u8,
    /// Most fault runs in all (depth 1 first); `None`: depth 1 whole, depth 2 [`DEFAULT_PAIRS`].
    pub budget: Option<usize>,
    /// No new run starts after this much wall time.
    pub time_budget: Duration,
    /// Which pairs depth 2 samples.
    pub seed: u64,
    /// Seeded bugs on in every run (a failure the correct driver shares is reported apart).
    pub mutants: Vec<Mutant>,
    /// Where found scenarios are written.
    pub out_dir: PathBuf,
    /// Stop at the first failure (it is still shrunk and written).
    pub stop_at_first: bool,
    /// Most found files written (one per distinct set of failed invariants).
    pub max_found: usize,
    /// Runs at once.
    pub jobs: usize,
}

/// Pairs sampled at depth 2 when no budget is given.
pub const DEFAULT_PAIRS: usize = 200;

/// One placed fault, by name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Placement {
    /// `component.op`.
    pub point: String,
    /// Which occurrence (1-based).
    pub nth: u32,
    /// Which kind.
    pub kind: GenKind,
}

impl std::fmt::Display for Placement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} #{} {}", self.point, self.nth, kind_name(self.kind))
    }
}

/// What one run came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RunVerdict {
    /// Every invariant held.
    Passed,
    /// These invariants failed (for the driver under test only).
    Failed(Vec<&'static str>),
    /// Failed, and the correct driver fails it too: not the mutant's doing.
    ReferenceFails(Vec<&'static str>),
    /// A placed fault never fired (the run went elsewhere): not exercised.
    NotExercised(String),
    /// The lab itself failed.
    LabError(String),
}

impl RunVerdict {
    /// One word for the report.
    pub fn word(&self) -> String {
        match self {
            RunVerdict::Passed => "pass".into(),
            RunVerdict::Failed(f) => format!("FAIL ({})", f.join(", ")),
            RunVerdict::ReferenceFails(f) => {
                format!("fails the correct driver too ({})", f.join(", "))
            }
            RunVerdict::NotExercised(why) => format!("not exercised: {why}"),
            RunVerdict::LabError(e) => format!("lab error: {e}"),
        }
    }
}

/// One run of the sweep.
#[derive(Clone, Debug)]
pub struct SweepRun {
    /// 1 or 2 faults.
    pub faults: Vec<Placement>,
    /// What came of it.
    pub verdict: RunVerdict,
}

/// Per interception point: what the baseline reached and what the sweep found there.
#[derive(Clone, Debug, Default)]
pub struct PointSummary {
    /// Occurrences in the baseline.
    pub occurrences: u32,
    /// Depth-1 runs (occurrences × kinds).
    pub runs: usize,
    /// Of those, failing for the driver under test.
    pub failures: usize,
    /// Of those, whose fault never fired.
    pub not_exercised: usize,
}

/// What a sweep did.
#[derive(Debug)]
pub struct SweepReport {
    /// The base scenario's file.
    pub base: PathBuf,
    /// The driver under test, as `--driver` YAML.
    pub driver: String,
    /// Mutants that were on.
    pub mutants: Vec<Mutant>,
    /// `component.op` → summary, for each faultable point the baseline reached.
    pub points: BTreeMap<String, PointSummary>,
    /// Calls the baseline made that no fault can be placed on, with why: (from->to op, count, why).
    pub not_faultable: Vec<(String, u32, &'static str)>,
    /// The baseline's own failures (the base fails without any fault).
    pub baseline_failed: Vec<&'static str>,
    /// Every run, depth 1 first.
    pub runs: Vec<SweepRun>,
    /// Depth-1 placements in all, and pairs in all at depth 2.
    pub depth1_space: usize,
    /// Pairs the depth-2 space holds (0 at depth 1).
    pub depth2_space: usize,
    /// Placements not run because the budget or the time ran out (said, never silent).
    pub not_run: usize,
    /// Shrunk failures, written.
    pub found: Vec<Found>,
    /// Wall time.
    pub elapsed: Duration,
}

impl SweepReport {
    /// Runs whose verdict is a failure of the driver under test.
    pub fn failures(&self) -> usize {
        self.runs
            .iter()
            .filter(|r| matches!(r.verdict, RunVerdict::Failed(_)))
            .count()
            + usize::from(!self.baseline_failed.is_empty())
    }

    /// Runs per minute of wall time.
    pub fn runs_per_min(&self) -> f64 {
        60.0 * self.runs.len() as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// Why a call the baseline made cannot take a fault (see [`guide::faultable`]).
fn not_faultable_why(from: Component, to: Component) -> &'static str {
    if from == Component::Lab {
        "the lab's own probe, not the system under test"
    } else if to == Component::Driver {
        "start-up or capability call, made at connect before any fault is armed"
    } else if matches!(from, Component::Driver | Component::Sidecar) {
        "not an interception point the hook faults for the driver (see explore::guide::faultable)"
    } else {
        "a call between the lab's fakes (sidecar bookkeeping, Director→CPI), not made by the driver under test"
    }
}

/// The baseline's faultable calls as (point, occurrence), in call order, the
/// points as `targets` indices; and the calls no fault can be placed on.
#[allow(clippy::type_complexity)]
fn enumerate(
    o: &RunOutcome,
) -> (
    Vec<FaultTarget>,
    Vec<(usize, u32)>,
    Vec<(String, u32, &'static str)>,
) {
    let mut targets: Vec<FaultTarget> = Vec::new();
    let mut counts: BTreeMap<usize, u32> = BTreeMap::new();
    let mut calls = Vec::new();
    let mut skipped: BTreeMap<(String, &'static str), u32> = BTreeMap::new();
    for e in &o.history {
        let EventKind::Call { from, to, op, .. } = &e.kind else {
            continue;
        };
        let declared = drivelab_fakes::ops::lookup(*to, op);
        let (true, Some(op)) = (guide::faultable(*from, *to, op), declared) else {
            *skipped
                .entry((format!("{from}->{to} {op}"), not_faultable_why(*from, *to)))
                .or_default() += 1;
            continue;
        };
        let t = match targets
            .iter()
            .position(|t| t.component == *to && t.op == op)
        {
            Some(i) => i,
            None => {
                targets.push(FaultTarget { component: *to, op });
                targets.len() - 1
            }
        };
        let n = counts.entry(t).or_default();
        *n += 1;
        calls.push((t, *n));
    }
    let skipped = skipped.into_iter().map(|((c, w), n)| (c, n, w)).collect();
    (targets, calls, skipped)
}

/// Sweep `base`. Must be called on a multi-thread tokio runtime.
pub async fn sweep(base: &Scenario, opts: &SweepOptions) -> anyhow::Result<SweepReport> {
    let started = Instant::now();
    let (base, mutants) = hoist(base, opts);
    let seed = base.seed.unwrap_or(0);
    let run_opts = |m: &[Mutant]| RunOptions {
        seed: Some(seed),
        mutants: m.to_vec(),
        ..Default::default()
    };
    // The baseline of the driver under test: its own calls are what a fault can hit.
    let baseline = engine::run(&base, &run_opts(&mutants))
        .await
        .context("the baseline run")?;
    let (targets, calls, not_faultable) = enumerate(&baseline);
    let mut report = SweepReport {
        base: base.path.clone(),
        driver: crate::scenario::write::driver_yaml(&base.driver),
        mutants: mutants.clone(),
        points: BTreeMap::new(),
        not_faultable,
        baseline_failed: super::failed_invariants(&baseline),
        runs: Vec::new(),
        depth1_space: calls.len() * KINDS.len(),
        depth2_space: 0,
        not_run: 0,
        found: Vec::new(),
        elapsed: Duration::ZERO,
    };
    for &(t, _) in &calls {
        report
            .points
            .entry(targets[t].to_string())
            .or_default()
            .occurrences += 1;
    }
    if !report.baseline_failed.is_empty() {
        // Every fault run would fail too: the base itself is the finding.
        report.not_run = report.depth1_space;
        report.elapsed = started.elapsed();
        return Ok(report);
    }
    let single: Vec<GenFault> = calls
        .iter()
        .flat_map(|&(target, nth)| {
            KINDS
                .iter()
                .map(move |&kind| GenFault { target, nth, kind })
        })
        .collect();
    let mut plan: Vec<Vec<GenFault>> = single.iter().cloned().map(|f| vec![f]).collect();
    if opts.depth >= 2 {
        let n = single.len();
        report.depth2_space = n * n.saturating_sub(1) / 2;
        let want = opts
            .budget
            .map(|b| b.saturating_sub(plan.len()))
            .unwrap_or(DEFAULT_PAIRS);
        plan.extend(sample_pairs(&single, want, opts.seed));
    }
    let budget = opts.budget.unwrap_or(usize::MAX);
    if plan.len() > budget {
        report.not_run += plan.len() - budget;
        plan.truncate(budget);
    }
    let ctx = Ctx {
        base: &base,
        targets: &targets,
        mutants: &mutants,
        seed,
    };
    let failing = run_plan(&ctx, plan, opts, started, &mut report).await;
    write_failures(&ctx, failing, opts, &mut report).await?;
    report.elapsed = started.elapsed();
    Ok(report)
}

/// What every run of one sweep shares.
struct Ctx<'a> {
    base: &'a Scenario,
    targets: &'a [FaultTarget],
    mutants: &'a [Mutant],
    seed: u64,
}

impl Ctx<'_> {
    fn schedule(&self, faults: Vec<GenFault>) -> Schedule {
        Schedule {
            seed: self.seed,
            faults,
            merges: vec![],
            dups: vec![],
        }
    }

    fn placement(&self, f: &GenFault) -> Placement {
        Placement {
            point: self.targets[f.target].to_string(),
            nth: f.nth,
            kind: f.kind,
        }
    }

    /// One run of `faults`, judged (and, hunting a mutant, judged against the correct driver).
    async fn judge(&self, faults: Vec<GenFault>) -> RunVerdict {
        let scn = super::apply(self.base, self.targets, &self.schedule(faults));
        let scn = std::sync::Arc::new(scn);
        let run = |m: Vec<Mutant>| {
            let opts = RunOptions {
                seed: scn.seed,
                mutants: m,
                ..Default::default()
            };
            // Isolated: runs go side by side, and each reads only its own log.
            engine::run_isolated(scn.clone(), opts)
        };
        let o = match run(self.mutants.to_vec()).await {
            Ok(o) => o,
            Err(e) => return RunVerdict::LabError(format!("{e:#}")),
        };
        let failed = super::failed_invariants(&o);
        if failed.is_empty() {
            return match o.unfired_faults.first() {
                Some(u) => RunVerdict::NotExercised(u.why.clone()),
                None => RunVerdict::Passed,
            };
        }
        if !self.mutants.is_empty() {
            match run(vec![]).await {
                Ok(r) if super::failed_invariants(&r).is_empty() => {}
                Ok(_) => return RunVerdict::ReferenceFails(failed),
                Err(e) => return RunVerdict::LabError(format!("{e:#}")),
            }
        }
        RunVerdict::Failed(failed)
    }
}

/// The base with the driver's declared mutants moved onto the command line
/// (as explore does: the found file must pass with the correct driver).
fn hoist(base: &Scenario, opts: &SweepOptions) -> (Scenario, Vec<Mutant>) {
    let mut base = base.clone();
    // The driver under test is named on every replay line the sweep writes.
    base.driver.from_flag = true;
    let mut mutants = opts.mutants.clone();
    for m in std::mem::take(&mut base.driver.mutants) {
        if !mutants.contains(&m) {
            mutants.push(m);
        }
    }
    (base, mutants)
}

/// `want` distinct pairs of single faults, drawn by `seed` (all of them when fewer).
fn sample_pairs(single: &[GenFault], want: usize, seed: u64) -> Vec<Vec<GenFault>> {
    let n = single.len();
    let mut rng = ChaCha20Rng::seed_from_u64(seed ^ 0x5eed_fa17);
    let all = n * n.saturating_sub(1) / 2;
    let mut chosen: BTreeSet<(usize, usize)> = BTreeSet::new();
    if want >= all {
        for i in 0..n {
            for j in i + 1..n {
                chosen.insert((i, j));
            }
        }
    } else {
        let mut idx: Vec<usize> = (0..n).collect();
        while chosen.len() < want {
            idx.shuffle(&mut rng);
            let (a, b) = (idx[0].min(idx[1]), idx[0].max(idx[1]));
            chosen.insert((a, b));
        }
    }
    let mut pairs: Vec<(usize, usize)> = chosen.into_iter().collect();
    // Drawn order, not index order, so a budget cut keeps a spread sample.
    pairs.shuffle(&mut rng);
    pairs
        .into_iter()
        .map(|(a, b)| vec![single[a].clone(), single[b].clone()])
        .collect()
}

/// Run `plan` `opts.jobs` at a time, recording each verdict; returns the
/// failing fault sets, in plan order.
async fn run_plan(
    ctx: &Ctx<'_>,
    plan: Vec<Vec<GenFault>>,
    opts: &SweepOptions,
    started: Instant,
    report: &mut SweepReport,
) -> Vec<Vec<GenFault>> {
    use futures_util::stream::{self, StreamExt};
    let mut failing = Vec::new();
    let total = plan.len();
    let mut done = 0;
    for chunk in plan.chunks(opts.jobs.max(1)) {
        if started.elapsed() > opts.time_budget || (opts.stop_at_first && !failing.is_empty()) {
            break;
        }
        let verdicts: Vec<RunVerdict> = stream::iter(chunk.iter().cloned())
            .map(|faults| ctx.judge(faults))
            .buffered(opts.jobs.max(1))
            .collect()
            .await;
        for (faults, verdict) in chunk.iter().zip(verdicts) {
            done += 1;
            if faults.len() == 1 {
                let p = report
                    .points
                    .entry(ctx.targets[faults[0].target].to_string())
                    .or_default();
                p.runs += 1;
                p.failures += usize::from(matches!(verdict, RunVerdict::Failed(_)));
                p.not_exercised += usize::from(matches!(verdict, RunVerdict::NotExercised(_)));
            }
            if matches!(verdict, RunVerdict::Failed(_)) {
                failing.push(faults.clone());
            }
            report.runs.push(SweepRun {
                faults: faults.iter().map(|f| ctx.placement(f)).collect(),
                verdict,
            });
        }
    }
    report.not_run += total - done;
    failing
}

/// Shrink and write the failures: one file per distinct set of failed
/// invariants (the first run that showed it), at most `opts.max_found`.
async fn write_failures(
    ctx: &Ctx<'_>,
    failing: Vec<Vec<GenFault>>,
    opts: &SweepOptions,
    report: &mut SweepReport,
) -> anyhow::Result<()> {
    let mut shown: BTreeSet<Vec<&'static str>> = BTreeSet::new();
    let eopts = ExploreOptions {
        cases: 0,
        seed: opts.seed,
        time_budget: opts.time_budget,
        mutants: ctx.mutants.to_vec(),
        out_dir: opts.out_dir.clone(),
        detect_only: false,
        keep_going: false,
        stream: Default::default(),
        jobs: super::DEFAULT_JOBS,
    };
    for faults in failing {
        if report.found.len() >= opts.max_found {
            break;
        }
        let key = report
            .runs
            .iter()
            .find(|r| r.faults == faults.iter().map(|f| ctx.placement(f)).collect::<Vec<_>>())
            .and_then(|r| match &r.verdict {
                RunVerdict::Failed(f) => Some(f.clone()),
                _ => None,
            })
            .unwrap_or_default();
        if !shown.insert(key) {
            continue;
        }
        let sched =
            super::finish_shrinking(ctx.base, ctx.targets, ctx.schedule(faults), &eopts).await;
        let by = format!("sweep-faults --depth {}", opts.depth);
        report
            .found
            .push(super::write_found(ctx.base, ctx.targets, &sched, &eopts, &by).await?);
    }
    Ok(())
}

/// The report as Markdown: summary, points × kinds, then every run.
pub fn markdown(r: &SweepReport) -> String {
    let mut s = String::new();
    let flags: String = r
        .mutants
        .iter()
        .map(|m| format!(" --mutant {}", m.name()))
        .collect();
    s.push_str(&format!(
        "# Fault sweep of {}\n\ndriver: `{}`{}\n\n",
        r.base.display(),
        r.driver,
        if flags.is_empty() {
            String::new()
        } else {
            format!(" (with{flags})")
        }
    ));
    s.push_str(&summary_line(r));
    s.push_str("\n\n| interception point | occurrences | runs (× kinds) | failures | not exercised |\n|---|---|---|---|---|\n");
    for (p, v) in &r.points {
        s.push_str(&format!(
            "| {p} | {} | {} | {} | {} |\n",
            v.occurrences, v.runs, v.failures, v.not_exercised
        ));
    }
    if !r.not_faultable.is_empty() {
        s.push_str("\nCalls the baseline made that cannot be faulted:\n\n");
        for (c, n, why) in &r.not_faultable {
            s.push_str(&format!("- {c} ×{n}: {why}\n"));
        }
    }
    s.push_str("\n| # | faults | verdict |\n|---|---|---|\n");
    for (i, run) in r.runs.iter().enumerate() {
        let f: Vec<String> = run.faults.iter().map(|p| p.to_string()).collect();
        s.push_str(&format!(
            "| {} | {} | {} |\n",
            i + 1,
            f.join(" + "),
            run.verdict.word()
        ));
    }
    s
}

fn summary_line(r: &SweepReport) -> String {
    let count = |f: fn(&RunVerdict) -> bool| r.runs.iter().filter(|x| f(&x.verdict)).count();
    let mut s = format!(
        "{} runs in {:.1}s ({:.0} runs/min): {} interception points × {} kinds over {} occurrences = {} single faults{}; {} passed, {} failed, {} not exercised, {} fail the correct driver too, {} lab errors, {} not run (budget, time or --stop-at-first)",
        r.runs.len(),
        r.elapsed.as_secs_f64(),
        r.runs_per_min(),
        r.points.len(),
        KINDS.len(),
        r.points.values().map(|p| p.occurrences).sum::<u32>(),
        r.depth1_space,
        if r.depth2_space > 0 {
            let sampled = r.runs.iter().filter(|x| x.faults.len() == 2).count();
            format!(", {sampled} of {} pairs at depth 2 (sampled by seed)", r.depth2_space)
        } else {
            String::new()
        },
        count(|v| *v == RunVerdict::Passed),
        count(|v| matches!(v, RunVerdict::Failed(_))),
        count(|v| matches!(v, RunVerdict::NotExercised(_))),
        count(|v| matches!(v, RunVerdict::ReferenceFails(_))),
        count(|v| matches!(v, RunVerdict::LabError(_))),
        r.not_run,
    );
    if !r.baseline_failed.is_empty() {
        s.push_str(&format!(
            "\nthe baseline itself fails ({}): nothing swept; replay: drivelab run {} --driver '{}'",
            r.baseline_failed.join(", "),
            r.base.display(),
            r.driver
        ));
    }
    s
}

/// Print the report the CLI shows: the summary, each failure, each found file.
pub fn print(r: &SweepReport) {
    let flags: String = r
        .mutants
        .iter()
        .map(|m| format!(" --mutant {}", m.name()))
        .collect();
    crate::outln!("{}", summary_line(r));
    for (p, v) in r.points.iter().filter(|(_, v)| v.failures > 0) {
        crate::outln!("  {p}: {} of {} runs fail", v.failures, v.runs);
    }
    for run in &r.runs {
        if let RunVerdict::Failed(_) | RunVerdict::LabError(_) = run.verdict {
            let f: Vec<String> = run.faults.iter().map(|p| p.to_string()).collect();
            crate::outln!("  {}: {}", f.join(" + "), run.verdict.word());
        }
    }
    for f in &r.found {
        crate::outln!(
            "FOUND {}: shrunk and written to {} (replay: drivelab run {}{flags} --driver '{}')",
            f.failed.join(", "),
            f.path.display(),
            f.path.display(),
            r.driver
        );
    }
    if r.failures() == 0 {
        crate::outln!("no invariant failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn singles(n: usize) -> Vec<GenFault> {
        (0..n)
            .map(|i| GenFault {
                target: i,
                nth: 1,
                kind: GenKind::CrashAfter,
            })
            .collect()
    }

    #[test]
    fn pairs_are_distinct_bounded_and_seeded() {
        let s = singles(20);
        let a = sample_pairs(&s, 30, 7);
        assert_eq!(a.len(), 30);
        let keys: BTreeSet<(usize, usize)> = a.iter().map(|p| (p[0].target, p[1].target)).collect();
        assert_eq!(keys.len(), 30, "no pair twice");
        assert!(
            keys.iter().all(|(x, y)| x < y),
            "no fault paired with itself"
        );
        assert_eq!(a, sample_pairs(&s, 30, 7), "same seed, same sample");
        assert_ne!(a, sample_pairs(&s, 30, 8));
    }

    #[test]
    fn a_budget_over_the_space_takes_every_pair() {
        let s = singles(5);
        assert_eq!(sample_pairs(&s, 1000, 1).len(), 10);
        assert!(sample_pairs(&singles(1), 10, 1).is_empty());
    }
}
