//! Explore end to end: it finds a seeded bug's race without a hand-written
//! scenario, the shrunk file replays the same failure with the same history,
//! and random schedules are deterministic (same schedule twice, same history).

use std::path::Path;
use std::time::Duration;

use cosi_s3::Mutant;
use drivelab::engine::{self, RunOptions};
use drivelab::explore::{self, ExploreOptions, GenFault, GenKind, Schedule};
use drivelab::scenario::{self, Invariant};

fn base(rel: &str) -> scenario::Scenario {
    scenario::load(
        &Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("scenarios")
            .join(rel),
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explore_finds_a_mutant_race_and_the_found_file_replays_it() {
    drivelab::logcap::init(false);
    let dir = tempfile::tempdir().unwrap();
    let opts = ExploreOptions {
        cases: 300,
        seed: 1,
        time_budget: Duration::from_secs(240),
        mutants: vec![drivelab::scenario::Mutant::Cosi(
            Mutant::UserBeforeCheckpoint,
        )],
        out_dir: dir.path().to_path_buf(),
        detect_only: false,
        keep_going: false,
        stream: Default::default(),
        jobs: drivelab::explore::DEFAULT_JOBS,
    };
    let report = explore::explore(&base("cosi/happy-path.yaml"), &opts)
        .await
        .unwrap();
    let found = report
        .found
        .expect("explore should find the crash window user-before-checkpoint leaves");
    assert!(
        !found.failed.is_empty(),
        "the found file must fail when replayed"
    );
    // Its header says what it fails and what was hunted (for `merge-found`).
    let text = std::fs::read_to_string(&found.path).unwrap();
    let listed = |key| scenario::write::read_list_header(&text, key);
    let failed: Vec<String> = found.failed.iter().map(|s| s.to_string()).collect();
    assert_eq!(listed(scenario::write::FAILED_HEADER), Some(failed));
    assert_eq!(
        listed(scenario::write::MUTANTS_HEADER),
        Some(vec!["user-before-checkpoint".to_string()])
    );
    // `drivelab run FILE --mutant …`, twice: the same failure, the same history.
    let file = scenario::load(&found.path).unwrap();
    let again = engine::run(
        &file,
        &RunOptions {
            seed: None,
            mutants: vec![drivelab::scenario::Mutant::Cosi(
                Mutant::UserBeforeCheckpoint,
            )],
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert!(
        explore::same_failure(&found.outcome, &again),
        "replay differs:\n{}",
        drivelab::report::console(&again)
    );
    // The correct driver survives the same schedule.
    let reference = engine::run(&file, &RunOptions::default()).await.unwrap();
    assert!(
        reference.passed(),
        "{}",
        drivelab::report::console(&reference)
    );
}

/// delete-unowned from the generic base, with a real witness: after the
/// claim's bucket is gone another tenant takes the name, and a late duplicate
/// delete arrives. The mutant deletes the foreign bucket (owner-only-delete);
/// the correct driver refuses. A count of schedules, not a time:
/// deterministic for a seed (seed 3 finds it within its first schedules).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explore_finds_delete_unowned_by_a_late_delete_after_the_name_was_reused() {
    drivelab::logcap::init(false);
    let dir = tempfile::tempdir().unwrap();
    let opts = ExploreOptions {
        cases: 60,
        seed: 3,
        time_budget: Duration::from_secs(600),
        mutants: vec![drivelab::scenario::Mutant::Cosi(Mutant::DeleteUnowned)],
        out_dir: dir.path().to_path_buf(),
        detect_only: false,
        keep_going: false,
        stream: Default::default(),
        jobs: drivelab::explore::DEFAULT_JOBS,
    };
    let report = explore::explore(&base("explore/cosi-lifecycle.yaml"), &opts)
        .await
        .unwrap();
    let found = report.found.unwrap_or_else(|| {
        panic!(
            "delete-unowned not found in {} schedules ({} tuples reached)",
            report.cases_run, report.tuples_reached
        )
    });
    assert!(
        found.failed.contains(&"owner-only-delete"),
        "the witness is a foreign bucket deleted, not an error code: {:?}",
        found.failed
    );
    let text = std::fs::read_to_string(&found.path).unwrap();
    assert!(text.contains("name_of_claim"), "{text}");
    let file = scenario::load(&found.path).unwrap();
    let reference = engine::run(&file, &RunOptions::default()).await.unwrap();
    assert!(
        reference.passed(),
        "{}",
        drivelab::report::console(&reference)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_random_schedules_run_twice_give_identical_histories() {
    drivelab::logcap::init(false);
    let mut scn = base("cosi/two-accesses-one-claim.yaml");
    // The twin lab of unpredictable-secrets doubles the cost and adds nothing here.
    scn.invariants
        .retain(|i| *i != Invariant::UnpredictableSecrets);
    let baseline = engine::run(&scn, &RunOptions::default()).await.unwrap();
    let targets = explore::targets_of(&baseline);
    let kinds = [
        GenKind::CrashAfter,
        GenKind::CrashBefore,
        GenKind::Unavailable,
        GenKind::DropResponse,
    ];
    let mut rng: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    for case in 0..50 {
        let merges = if next() % 2 == 0 { vec![1] } else { vec![] };
        // Known, not yet fixed: a lost reply inside a concurrent block races
        // the driver's HTTP client deciding whether to retry on a fresh pooled
        // connection, which the lab cannot order (see the closing note of
        // issue 6). Lost replies are covered sequentially; concurrency with crashes.
        let kinds: &[GenKind] = if merges.is_empty() {
            &kinds
        } else {
            &kinds[..3]
        };
        let seed = next() % 10_000;
        let nfaults = next() % 3;
        let mut faults = Vec::new();
        for _ in 0..nfaults {
            let target = (next() as usize) % targets.len();
            let nth = 1 + (next() % 2) as u32;
            let kind = kinds[(next() as usize) % kinds.len()];
            faults.push(GenFault { target, nth, kind });
        }
        let sched = Schedule {
            seed,
            faults,
            merges,
            dups: if next() % 3 == 0 {
                vec![(2, explore::Dup::Same)]
            } else {
                vec![]
            },
        };
        let s = explore::apply(&scn, &targets, &sched);
        let a = engine::run(&s, &RunOptions::default()).await.unwrap();
        let b = engine::run(&s, &RunOptions::default()).await.unwrap();
        if a.history_text != b.history_text {
            let (a_text, b_text) = (a.history_text.text(), b.history_text.text());
            let (x, y): (Vec<&str>, Vec<&str>) =
                (a_text.lines().collect(), b_text.lines().collect());
            let i = x
                .iter()
                .zip(&y)
                .position(|(p, q)| p != q)
                .unwrap_or(x.len().min(y.len()));
            let from = i.saturating_sub(12);
            panic!(
                "case {case} ({sched:?}) is nondeterministic; first difference at line {}:\n--- run 1\n{}\n--- run 2\n{}",
                i + 1,
                x[from..(i + 1).min(x.len())].join("\n"),
                y[from..(i + 1).min(y.len())].join("\n")
            );
        }
    }
}

/// Explore is not COSI-only: from the generic CSI base on the BOSH backend
/// (no faults written for any mutant) it finds bosh-csi's retried-create bug,
/// its ignored size change, a publish that steals an attachment (a node whose
/// mount table refuses until healed keeps the old pod's attachment live
/// while the pod moves) and a failed stage's leaked mount (the refusal
/// starts at the read-back after the mount), and the shrunk file replays
/// the failure while the correct driver passes it. A count of schedules per
/// mutant, not a time: deterministic for explorer seed 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explore_finds_csi_mutants_from_the_generic_csi_base() {
    use drivelab::scenario::Mutant as LabMutant;
    drivelab::logcap::init(false);
    for (m, cases) in [
        (bosh_csi::Mutant::CreateNotIdempotent, 60),
        (bosh_csi::Mutant::IgnoreIncompatibleSize, 60),
        (bosh_csi::Mutant::PublishStealsAttachment, 60),
        (bosh_csi::Mutant::LeakMountOnFailedStage, 60),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let opts = ExploreOptions {
            cases,
            seed: 1,
            time_budget: Duration::from_secs(600),
            mutants: vec![LabMutant::Bosh(m)],
            out_dir: dir.path().to_path_buf(),
            detect_only: false,
            keep_going: false,
            stream: Default::default(),
            jobs: drivelab::explore::DEFAULT_JOBS,
        };
        let report = explore::explore(&base("explore/csi-lifecycle.yaml"), &opts)
            .await
            .unwrap();
        let found = report
            .found
            .unwrap_or_else(|| panic!("{m:?} not found in {cases} schedules"));
        assert!(!found.failed.is_empty(), "{m:?}");
        let file = scenario::load(&found.path).unwrap();
        let reference = engine::run(&file, &RunOptions::default()).await.unwrap();
        assert!(
            reference.passed(),
            "{m:?}: {}",
            drivelab::report::console(&reference)
        );
    }
}
