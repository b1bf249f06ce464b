//! Explorer figures (issue 6): schedules per minute against the correct
//! driver, and time to first detection of each COSI mutant over ten explorer
//! seeds (detect-only: stop at the first failing schedule, no shrinking),
//! from the lifecycle base or, where that misses, the tenancy base.
//! Runs in one child process, in-process drivers, on the virtual clock.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use cosi_s3::Mutant;
use drivelab::explore::{self, ExploreOptions};
use serde_json::{json, Value};

use crate::measure::median;

/// The base scenario the rate is measured on and every mutant is first
/// explored from (no faults, not written for any mutant).
pub const BASE: &str = "scenarios/explore/cosi-lifecycle.yaml";
/// Explored for a mutant (same seed, its own cap) only when [`BASE`] did not
/// find it within the cap: read-only access, a policy and a user the driver
/// does not own, neighbours' buckets — things the lifecycle base never
/// creates, so three mutants could not fail there however it was explored.
pub const SECOND_BASE: &str = "scenarios/explore/cosi-tenancy.yaml";
/// Explorer seeds per mutant (the issue asks for medians over 10).
pub const SEEDS: u64 = 10;

/// What the child is asked to do.
pub struct Plan {
    /// Wall time for the schedules/min figure.
    pub rate_for: Duration,
    /// Per (mutant, seed) cap; a miss counts as "over the cap" in the median.
    pub per_run: Duration,
    /// Everything together stops here; runs not started are reported as such.
    pub total: Duration,
}

/// `drivelab-bench child explore --rate-s R --per-run-s P --total-s T`.
pub async fn run(plan: &Plan) -> anyhow::Result<Value> {
    let started = Instant::now();
    let load = |path: &str| {
        drivelab::scenario::load(&PathBuf::from(path))
            .map_err(|e| anyhow::anyhow!("{e}"))
            .with_context(|| format!("loading the explore base scenario {path}"))
    };
    let bases = [(BASE, load(BASE)?), (SECOND_BASE, load(SECOND_BASE)?)];
    let base = &bases[0].1;
    let out_dir = tempfile::tempdir()?;
    let opts = |mutants: Vec<Mutant>, seed: u64, budget: Duration| ExploreOptions {
        cases: u32::MAX,
        seed,
        time_budget: budget,
        mutants: mutants
            .into_iter()
            .map(drivelab::scenario::Mutant::Cosi)
            .collect(),
        out_dir: out_dir.path().to_path_buf(),
        detect_only: true,
        keep_going: false,
        stream: Default::default(),
        jobs: drivelab::explore::DEFAULT_JOBS,
    };

    let mut rate_opts = opts(vec![], 1, plan.rate_for);
    rate_opts.keep_going = true;
    let r = explore::explore(base, &rate_opts).await?;
    let rate = json!({
        "schedules": r.cases_run,
        "wall_s": r.elapsed.as_secs_f64(),
        "schedules_per_min": 60.0 * r.cases_run as f64 / r.elapsed.as_secs_f64(),
        "distinct_call_orders": r.distinct_interleavings,
        "fault_placements": r.fault_placements,
        "tuples_reached": r.tuples_reached,
        // Schedules the correct driver fails (findings of their own, or checker
        // false positives: see the closing note); counted, not stopped at.
        "correct_driver_failing_schedules": r.failing_schedules,
    });

    // Seed-major, so that a run out of time leaves every mutant with the same seeds.
    let mutants = Mutant::all();
    let mut times: Vec<Vec<Option<f64>>> = vec![Vec::new(); mutants.len()];
    let mut schedules: Vec<Vec<usize>> = vec![Vec::new(); mutants.len()];
    // The base each detection came from (None: neither found it).
    let mut found_from: Vec<Vec<Option<&str>>> = vec![Vec::new(); mutants.len()];
    let mut seeds_run = 0;
    'seeds: for seed in 1..=SEEDS {
        for (i, m) in mutants.iter().enumerate() {
            // A mutant may take the cap once per base.
            let left = plan.total.saturating_sub(started.elapsed());
            if left < plan.per_run * bases.len() as u32 {
                break 'seeds;
            }
            // The next base only after a miss: a detection's time is within
            // the one base that found it, each base with the whole cap.
            let (mut time, mut from, mut ran) = (None, None, 0);
            for (name, scn) in &bases {
                let r = explore::explore(scn, &opts(vec![*m], seed, plan.per_run)).await?;
                ran += r.cases_run;
                if let Some(d) = r.first_failure_after {
                    (time, from) = (Some(d.as_secs_f64()), Some(*name));
                    break;
                }
            }
            times[i].push(time);
            schedules[i].push(ran);
            found_from[i].push(from);
        }
        seeds_run = seed;
    }
    let per_run_s = plan.per_run.as_secs_f64();
    let rows: Vec<Value> = mutants
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let t = &times[i][..seeds_run as usize];
            let found = t.iter().flatten().count();
            // A miss is "later than the cap": the median is honest while at
            // least half the seeds found it, and absent otherwise.
            let all: Vec<f64> = t.iter().map(|x| x.unwrap_or(f64::INFINITY)).collect();
            let med = median(&all);
            json!({
                "mutant": m.name(),
                "found": found,
                "seeds": t.len(),
                "median_first_detection_s": if med.is_finite() { json!(med) } else { Value::Null },
                "first_detection_s": t,
                "found_from": &found_from[i][..seeds_run as usize],
                "schedules_run": &schedules[i][..seeds_run as usize],
            })
        })
        .collect();
    Ok(json!({
        "base": BASE,
        "second_base": SECOND_BASE,
        "command": format!("drivelab-bench child explore --rate-s {} --per-run-s {} --total-s {}",
            plan.rate_for.as_secs(), plan.per_run.as_secs(), plan.total.as_secs()),
        "rate_correct_driver": rate,
        "per_run_cap_s": per_run_s,
        "seeds_run": seeds_run,
        "mutants": rows,
        "wall_s": started.elapsed().as_secs_f64(),
    }))
}

/// Table rows for the bench summary: (figure, value, target, verdict).
pub fn rows(e: &Value) -> Vec<(String, String, String, &'static str)> {
    let f = |v: &Value| v.as_f64().unwrap_or(f64::NAN);
    let mut out = vec![(
        "explore: schedules/min, correct driver".to_string(),
        format!("{:.0}", f(&e["rate_correct_driver"]["schedules_per_min"])),
        "-".to_string(),
        "",
    )];
    let cap = f(&e["per_run_cap_s"]);
    for m in e["mutants"].as_array().into_iter().flatten() {
        let found = m["found"].as_u64().unwrap_or(0);
        let seeds = m["seeds"].as_u64().unwrap_or(0);
        let med = m["median_first_detection_s"]
            .as_f64()
            .map(|x| format!("{x:.2} s"))
            .unwrap_or_else(|| "-".into());
        // Found from the second base on some seed: say so beside the figure.
        let second = m["found_from"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|b| b.as_str() == Some(SECOND_BASE))
            .count();
        let from = if second > 0 {
            let stem = std::path::Path::new(SECOND_BASE).file_stem();
            format!(
                ", {second} from {}",
                stem.unwrap_or_default().to_string_lossy()
            )
        } else {
            String::new()
        };
        out.push((
            format!(
                "explore: {} median first detection",
                m["mutant"].as_str().unwrap_or("?")
            ),
            format!("{med} ({found}/{seeds} seeds{from})"),
            format!("found on >= 9/10 within {cap:.0} s"),
            if seeds > 0 && found * 10 >= 9 * seeds {
                "ok"
            } else {
                "MISSED"
            },
        ));
    }
    out
}
