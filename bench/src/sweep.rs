//! Fault-sweep figures (issue 18): the single-fault sweep's runs per minute
//! and the time to cover the COSI lifecycle base (every interception point ×
//! occurrence × kind) against the correct driver, and the time it takes to
//! find each order-of-commit mutant. One child process, in-process drivers.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use drivelab::explore::sweep::{self, SweepOptions};
use serde_json::{json, Value};

/// The base the sweep covers (the explorer's generic COSI lifecycle).
pub const BASE: &str = "scenarios/explore/cosi-lifecycle.yaml";
/// The mutants the sweep is timed on (those it exists to find).
pub const MUTANTS: [cosi_s3::Mutant; 2] = [
    cosi_s3::Mutant::BucketBeforeCheckpoint,
    cosi_s3::Mutant::PolicyAfterForget,
];

/// `drivelab-bench child sweep --total-s T`: everything within T seconds.
pub async fn run(total: Duration) -> anyhow::Result<Value> {
    let started = Instant::now();
    let base = drivelab::scenario::load(&PathBuf::from(BASE))
        .map_err(|e| anyhow::anyhow!("{e}"))
        .context("loading the sweep base scenario")?;
    let out = tempfile::tempdir()?;
    let opts = |mutants, budget| SweepOptions {
        depth: 1,
        budget: None,
        time_budget: budget,
        seed: 1,
        mutants,
        out_dir: out.path().to_path_buf(),
        stop_at_first: true,
        max_found: 1,
        jobs: 2,
    };
    let mut found = Vec::new();
    for m in MUTANTS {
        // Whatever is left: each hunt stops at its first failure, and
        // policy-after-forget's point (the revoke's checkpoint delete) comes
        // late, at run 222 of 248; the cover goes last, with the rest.
        let left = total.saturating_sub(started.elapsed());
        let t = Instant::now();
        let r = sweep::sweep(
            &base,
            &opts(vec![drivelab::scenario::Mutant::Cosi(m)], left),
        )
        .await?;
        found.push(json!({
            "mutant": m.name(),
            "found": !r.found.is_empty(),
            "runs": r.runs.len(),
            "wall_s": t.elapsed().as_secs_f64(),
        }));
    }
    let left = total.saturating_sub(started.elapsed());
    let r = sweep::sweep(&base, &opts(vec![], left)).await?;
    let covered = r.not_run == 0;
    Ok(json!({
        "base": BASE,
        "command": format!("drivelab-bench child sweep --total-s {}", total.as_secs()),
        "runs": r.runs.len(),
        "single_faults": r.depth1_space,
        "points": r.points.len(),
        "wall_s": r.elapsed.as_secs_f64(),
        "runs_per_min": r.runs_per_min(),
        "covered": covered,
        "time_to_cover_s": if covered { json!(r.elapsed.as_secs_f64()) } else { Value::Null },
        "correct_driver_failures": r.failures(),
        "mutants": found,
    }))
}

/// Table rows for the bench summary: (figure, value, target, verdict).
pub fn rows(e: &Value) -> Vec<(String, String, String, &'static str)> {
    let f = |v: &Value| v.as_f64().unwrap_or(f64::NAN);
    let cover = match e["time_to_cover_s"].as_f64() {
        Some(s) => format!("{s:.1} s ({} runs)", e["runs"]),
        None => format!("not covered: {} of {} runs", e["runs"], e["single_faults"]),
    };
    let mut out = vec![
        (
            "sweep-faults: runs/min, correct driver".to_string(),
            format!("{:.0}", f(&e["runs_per_min"])),
            "-".to_string(),
            "",
        ),
        (
            "sweep-faults: time to cover the COSI lifecycle base".to_string(),
            cover,
            "covered, 0 failures".to_string(),
            if e["covered"].as_bool() == Some(true)
                && e["correct_driver_failures"].as_u64() == Some(0)
            {
                "ok"
            } else {
                "MISSED"
            },
        ),
    ];
    for m in e["mutants"].as_array().into_iter().flatten() {
        let hit = m["found"].as_bool() == Some(true);
        out.push((
            format!(
                "sweep-faults: finds {}",
                m["mutant"].as_str().unwrap_or("?")
            ),
            format!("{:.1} s ({} runs)", f(&m["wall_s"]), m["runs"]),
            "found".to_string(),
            if hit { "ok" } else { "MISSED" },
        ));
    }
    out
}
