//! Whole-scenario measurements through the public engine (`drivelab::engine::run`):
//! the `scenarios/` suite, a back-off-heavy scenario on the virtual clock, and
//! the generated growth family (one claim + N grants). Each runs in a child.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{anyhow, Context};
use drivelab::engine::{self, RunOptions, StepSnapshots};
use drivelab::scenario;
use drivelab_fakes::history::EventKind;
use serde_json::{json, Value};

use crate::measure::{cpu_seconds, median, peak_rss_mib};

/// Invariants for the generated scenarios: the defaults minus
/// `unpredictable-secrets`, whose twin lab doubles every run (a constant
/// factor that would only halve the sizes we can afford to measure).
const GROWTH_INVARIANTS: &str = "[idempotent-replay, unique-credentials, least-privilege, no-rotation, no-secret-leak, no-orphans, owner-only-delete, converges, spec-codes]";

/// Every scenario under `dir`, run once each as `drivelab run` would (side by
/// side, [`engine::default_jobs`] at a time, each with its own log).
pub async fn suite(dir: &Path) -> anyhow::Result<Value> {
    let files = scenario::discover(&[dir.to_path_buf()]).context("listing scenarios")?;
    let mut scns = Vec::new();
    for f in &files {
        scns.push(scenario::load(f).map_err(|e| anyhow!("{}: {e}", f.display()))?);
    }
    let (cpu0, t0) = (cpu_seconds(), Instant::now());
    let mut passed = 0;
    let mut failed = Vec::new();
    let jobs = engine::default_jobs();
    let mut runs = engine::in_order(
        scns.iter()
            .map(|s| (std::sync::Arc::new(s.clone()), RunOptions::default())),
        jobs,
    );
    while let Some((_, out)) = futures_util::StreamExt::next(&mut runs).await {
        let out = out?;
        if out.passed() {
            passed += 1;
        } else {
            failed.push(out.scenario.clone());
        }
    }
    Ok(json!({
        "scenarios": scns.len(),
        "jobs": jobs,
        "passed": passed,
        "failed": failed,
        "wall_s": t0.elapsed().as_secs_f64(),
        "cpu_s": cpu_seconds() - cpu0,
        "peak_rss_mib": peak_rss_mib(),
    }))
}

fn virtual_text(auth: &str) -> String {
    format!(
        "name: bench-virtual-clock
description: a grant the driver refuses with INVALID_ARGUMENT for ten virtual minutes
driver: {{ builtin: cosi-s3 }}
bucket_classes:
  - {{ name: standard, deletion_policy: Delete }}
bucket_access_classes:
  - {{ name: mystery, authentication_type: {auth} }}
converge_within: 10m
steps:
  - create_bucket_claim: {{ name: photos, class: standard }}
  - grant_access: {{ name: photos-app, claim: photos, class: mystery }}
invariants: [spec-codes]
"
    )
}

/// The back-off scenario (unknown auth type, 10 m window) `reps` times; the
/// same scenario with auth Key (no back-off at all) is the baseline.
pub async fn virtual_clock(reps: usize) -> anyhow::Result<Value> {
    let path = PathBuf::from("<bench>/virtual-clock.yaml");
    let backoff = scenario::parse(&path, &virtual_text("Kerberos")).map_err(|e| anyhow!("{e}"))?;
    let baseline = scenario::parse(&path, &virtual_text("Key")).map_err(|e| anyhow!("{e}"))?;
    let (mut walls, mut base_walls) = (Vec::new(), Vec::new());
    let mut last = None;
    // One unmeasured run of each first: the first lab of a process pays for lazy statics.
    for i in 0..=reps {
        let t = Instant::now();
        let out = engine::run(&backoff, &RunOptions::default()).await?;
        let w = t.elapsed().as_secs_f64();
        let t = Instant::now();
        engine::run(&baseline, &RunOptions::default()).await?;
        let bw = t.elapsed().as_secs_f64();
        if i > 0 {
            walls.push(w);
            base_walls.push(bw);
        }
        last = Some(out);
    }
    let out = last.context("no run")?;
    let virtual_ms = out.history.iter().map(|e| e.at.0).max().unwrap_or(0);
    let grants = out
        .history
        .iter()
        .filter(
            |e| matches!(&e.kind, EventKind::Call { op, .. } if op == "DriverGrantBucketAccess"),
        )
        .count();
    let requeues = out
        .history
        .iter()
        .filter(|e| matches!(&e.kind, EventKind::Note { text, .. } if text.starts_with("requeue bucketaccess")))
        .count();
    let wall = median(&walls);
    Ok(json!({
        "wall_ms": wall * 1e3,
        "baseline_wall_ms": median(&base_walls) * 1e3,
        "backoff_cost_ms": (wall - median(&base_walls)) * 1e3,
        "virtual_s": virtual_ms as f64 / 1e3,
        "grant_attempts": grants,
        "backoffs": requeues,
        "virtual_per_wall": (virtual_ms as f64 / 1e3) / wall,
        "passed": out.passed(),
        "reps": reps,
    }))
}

/// One claim and `n` grants on it, one step each.
pub fn growth_text(n: usize) -> String {
    let mut s = format!(
        "name: bench-growth-{n}
description: one claim, {n} BucketAccesses granted one after another
driver: {{ builtin: cosi-s3 }}
bucket_classes:
  - {{ name: standard, deletion_policy: Delete }}
bucket_access_classes:
  - {{ name: readwrite, authentication_type: Key }}
invariants: {GROWTH_INVARIANTS}
steps:
  - create_bucket_claim: {{ name: photos, class: standard }}
"
    );
    for i in 0..n {
        s.push_str(&format!(
            "  - grant_access: {{ name: app-{i}, claim: photos, class: readwrite }}\n"
        ));
    }
    s
}

/// CSI with the BOSH backend: `n` volumes, each created then published to a
/// pod in its own step, all kept (six to a node, under the VMs' attachment
/// slots), so the state a per-step snapshot and sample cover grows with `n`.
pub fn csi_step_growth_text(n: usize) -> String {
    let nodes = n.div_ceil(6).max(2);
    let mut s = format!(
        "name: bench-csi-step-growth-{n}
description: {n} volumes created and published one after another, all kept
driver: {{ builtin: bosh-csi }}
bosh:
  deployments: [{{ name: k8s, instances: {nodes} }}]
converge_within: 30m
steps:
"
    );
    for i in 0..n {
        s.push_str(&format!(
            "  - create_volume: {{ name: v{i} }}\n  - publish: {{ pod: p{i}, volume: v{i}, node: node-{} }}\n",
            i % nodes
        ));
    }
    s
}

/// The COSI growth scenario at size `n`, once (a fresh child per size).
pub async fn growth(n: usize, every_step: bool) -> anyhow::Result<Value> {
    run_growth(&format!("growth-{n}"), &growth_text(n), n, every_step).await
}

/// The CSI per-step growth scenario at size `n`, a snapshot after every step.
pub async fn csi_step_growth(n: usize) -> anyhow::Result<Value> {
    let text = csi_step_growth_text(n);
    run_growth(&format!("csi-step-growth-{n}"), &text, n, true).await
}

/// One run of a generated growth scenario through the engine, timed.
async fn run_growth(name: &str, text: &str, n: usize, every_step: bool) -> anyhow::Result<Value> {
    let scn = scenario::parse(&PathBuf::from(format!("<bench>/{name}.yaml")), text)
        .map_err(|e| anyhow!("{e}"))?;
    let rss0 = peak_rss_mib();
    let (cpu0, t0) = (cpu_seconds(), Instant::now());
    let opts = RunOptions {
        step_snapshots: if every_step {
            StepSnapshots::Every
        } else {
            StepSnapshots::FinalOnly
        },
        ..Default::default()
    };
    let out = engine::run(&scn, &opts).await?;
    drivelab::phases::phase("run returned");
    let wall = t0.elapsed().as_secs_f64();
    Ok(json!({
        "n": n,
        "wall_s": wall,
        "cpu_s": cpu_seconds() - cpu0,
        "peak_rss_mib": peak_rss_mib(),
        "rss_before_mib": rss0,
        "history_events": out.history.len(),
        "passed": out.passed(),
    }))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    #[test]
    fn the_generated_growth_scenarios_are_valid() {
        for n in [1, 7, 13] {
            for text in [super::growth_text(n), super::csi_step_growth_text(n)] {
                drivelab::scenario::parse(Path::new("<test>"), &text)
                    .unwrap_or_else(|e| panic!("{e}\n{text}"));
            }
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_csi_step_growth_scenario_converges_and_passes() {
        let v = super::csi_step_growth(7).await.unwrap();
        assert_eq!(v["passed"], true, "{v}");
        assert_eq!(v["n"], 7);
    }
}
