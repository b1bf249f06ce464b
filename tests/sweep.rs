//! The single-fault sweep end to end, on the smallest lifecycle: every single
//! fault passes the correct driver, the sweep finds bucket-before-checkpoint
//! (a crash or a lost reply right after the bucket PUT), and its shrunk found
//! file replays the failure with the mutant and passes without it.

use std::path::Path;
use std::time::Duration;

use drivelab::engine::{self, RunOptions};
use drivelab::explore::sweep::{self, RunVerdict, SweepOptions};
use drivelab::scenario::{self, Mutant};

fn base() -> scenario::Scenario {
    scenario::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/sweep-base.yaml"))
        .unwrap_or_else(|e| panic!("{e}"))
}

fn opts(mutants: Vec<Mutant>, out: &Path) -> SweepOptions {
    SweepOptions {
        depth: 1,
        budget: None,
        time_budget: Duration::from_secs(600),
        seed: 1,
        mutants,
        out_dir: out.to_path_buf(),
        stop_at_first: true,
        max_found: 1,
        jobs: 2,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweep_passes_the_correct_driver_and_finds_bucket_before_checkpoint() {
    drivelab::logcap::init(false);
    let dir = tempfile::tempdir().unwrap();

    let r = sweep::sweep(&base(), &opts(vec![], dir.path()))
        .await
        .unwrap();
    assert_eq!(r.failures(), 0, "{}", sweep::markdown(&r));
    assert_eq!(r.not_run, 0);
    assert_eq!(r.runs.len(), r.depth1_space, "depth 1 is exhaustive");
    assert!(
        r.points.contains_key("s3.create_bucket"),
        "{:?}",
        r.points.keys()
    );
    assert!(r
        .runs
        .iter()
        .all(|x| !matches!(x.verdict, RunVerdict::LabError(_))));

    let m = Mutant::Cosi(cosi_s3::Mutant::BucketBeforeCheckpoint);
    let r = sweep::sweep(&base(), &opts(vec![m], dir.path()))
        .await
        .unwrap();
    let found = r
        .found
        .first()
        .unwrap_or_else(|| panic!("not found:\n{}", sweep::markdown(&r)));
    assert!(
        !found.failed.is_empty(),
        "the found file fails when replayed"
    );
    let file = scenario::load(&found.path).unwrap();
    for (mutants, fails) in [(vec![m], true), (vec![], false)] {
        let opts = RunOptions {
            mutants,
            ..Default::default()
        };
        let o = engine::run(&file, &opts).await.unwrap();
        assert_eq!(
            o.passed(),
            !fails,
            "fails with the mutant, passes the correct driver"
        );
    }
}
