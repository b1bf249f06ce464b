//! Runs side by side (`drivelab run`, sweeps, the explorer, the mutant kill
//! table) each judge only their own evidence. A file of its own: its
//! neighbour writes into the process-wide log on purpose, which would be a
//! false leak for any non-isolated run in the same test binary.

use std::path::Path;

use drivelab::engine::{self, RunOptions, RunOutcome};
use drivelab::scenario;

/// Runs side by side keep their logs apart: with the same seed two runs draw
/// the same lab secrets (tokens, client secrets), so a neighbour logging one of
/// them must not fail this run's no-secret-leak. (With one shared log buffer —
/// what runs side by side had before `run_isolated` — this fails.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_side_by_side_sees_only_its_own_log() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    drivelab::logcap::init(false);
    let scn = Arc::new(
        scenario::load(
            &&Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/cosi/happy-path.yaml"),
        )
        .unwrap_or_else(|e| panic!("{e}")),
    );
    let exposed = |o: &RunOutcome| -> Vec<String> {
        o.secrets.iter().map(|s| s.expose().to_string()).collect()
    };
    let first = engine::run_isolated(scn.clone(), RunOptions::default())
        .await
        .expect("first run");
    let secrets = exposed(&first);
    // The neighbour: another thread logging every secret the first run had.
    let done = Arc::new(AtomicBool::new(false));
    let neighbour = {
        let (done, line) = (done.clone(), secrets.join(" "));
        std::thread::spawn(move || {
            while !done.load(Ordering::SeqCst) {
                tracing::info!("neighbour {line}");
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        })
    };
    let second = engine::run_isolated(scn, RunOptions::default()).await;
    done.store(true, Ordering::SeqCst);
    neighbour.join().unwrap();
    let second = second.expect("second run");
    assert!(
        exposed(&second).iter().any(|s| secrets.contains(s)),
        "no secret recurs under the same seed: this test would test nothing"
    );
    let leak = second
        .verdicts
        .iter()
        .find(|v| v.invariant == "no-secret-leak")
        .expect("no-secret-leak judged");
    assert!(leak.exercised, "no secret to look for");
    assert!(
        leak.passed,
        "a neighbour's log line judged as this run's: {leak:?}"
    );
    assert!(
        second.passed(),
        "failed: {:?}",
        second
            .verdicts
            .iter()
            .filter(|v| !v.passed)
            .map(|v| v.invariant)
            .collect::<Vec<_>>()
    );
}
