//! The dynamic-disks RFC's scale question at full size: each file under
//! bench/scale/ (1000 nodes × 10⁴ volumes, dynamic_disks_workers 1, 4, 16)
//! run once in a child through the public engine, with its wall time, CPU
//! time, peak RSS, verdict and the Director pool's figures (virtual time).

use std::path::Path;
use std::time::Instant;

use anyhow::anyhow;
use drivelab::engine::{self, RunOptions, StepSnapshots};
use drivelab::scenario;
use serde_json::{json, Value};

use crate::measure::{cpu_seconds, peak_rss_mib};

/// Where the full-size scale scenarios live (not under scenarios/: `make e2e`
/// runs those in a debug build; these are `make bench`'s, in release).
pub const DIR: &str = "bench/scale";

/// Run one scale scenario (final snapshot only: its per-step snapshots are
/// what the report's diffs need, not what the question costs).
pub async fn run(path: &Path) -> anyhow::Result<Value> {
    let scn = scenario::load(path).map_err(|e| anyhow!("{e}"))?;
    let (cpu0, t0) = (cpu_seconds(), Instant::now());
    let out = engine::run(
        &scn,
        &RunOptions {
            step_snapshots: StepSnapshots::FinalOnly,
            ..Default::default()
        },
    )
    .await?;
    let wall_s = t0.elapsed().as_secs_f64();
    let converges = out
        .verdicts
        .iter()
        .find(|v| v.invariant == "converges")
        .map(|v| v.passed);
    Ok(json!({
        "scenario": out.scenario,
        "file": path.display().to_string(),
        "passed": out.passed(),
        "failed": out.verdicts.iter().filter(|v| !v.passed).map(|v| v.invariant).collect::<Vec<_>>(),
        "upgrade_deadlock": match converges {
            Some(true) => "converged",
            Some(false) => "deadlocked (converges failed)",
            None => "not judged",
        },
        "steps": scn.steps.len(),
        "wall_s": wall_s,
        "cpu_s": cpu_seconds() - cpu0,
        "peak_rss_mib": peak_rss_mib(),
        "pool": out.scale,
    }))
}
