//! End to end: every committed scenario against the reference COSI driver,
//! with its ownership snapshot kept in insta; and the seeded bugs each make
//! the right check (or expectation) fail, so no check here is one that cannot fail.

use std::path::{Path, PathBuf};

use cosi_s3::Mutant;
use drivelab::engine::{self, RunOptions, RunOutcome};
use drivelab::scenario;
use drivelab_fakes::history::EventKind;

fn scenario_path(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("scenarios")
        .join(rel)
}

async fn run(rel: &str, mutants: &[Mutant]) -> RunOutcome {
    run_seeded(rel, None, mutants).await
}

async fn run_seeded(rel: &str, seed: Option<u64>, mutants: &[Mutant]) -> RunOutcome {
    drivelab::logcap::init(false);
    let scn = scenario::load(&scenario_path(rel)).unwrap_or_else(|e| panic!("{e}"));
    engine::run(
        &scn,
        &RunOptions {
            seed,
            mutants: mutants
                .iter()
                .map(|m| drivelab::scenario::Mutant::Cosi(*m))
                .collect(),
            ..Default::default()
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{rel}: {e:#}"))
}

fn failed_checks(o: &RunOutcome) -> Vec<&'static str> {
    o.verdicts
        .iter()
        .filter(|v| !v.passed)
        .map(|v| v.invariant)
        .collect()
}

fn summary(o: &RunOutcome) -> String {
    drivelab::report::console(o)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_scenario_passes_against_the_reference_driver() {
    let files =
        scenario::discover(&[Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios")]).unwrap();
    assert!(files.len() >= 8);
    for f in files {
        let rel = f
            .strip_prefix(scenario_path(""))
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let o = run(&rel, &[]).await;
        assert!(o.passed(), "{}", summary(&o));
        assert_ops_declared(&rel, &o);
        insta::assert_snapshot!(o.scenario.clone(), o.snapshot.text());
    }
}

/// Every operation a fake recorded is one its registry declares for this
/// scenario's system: what the validator accepts and `list faults` prints
/// cannot drift from what the fakes record.
fn assert_ops_declared(rel: &str, o: &RunOutcome) {
    let system = scenario::load(&scenario_path(rel)).unwrap().system();
    for e in &o.history {
        if let EventKind::Call { to, op, .. } = &e.kind {
            let declared = scenario::names::ops_of(system, *to);
            assert!(
                declared.iter().any(|d| d == op.as_str()),
                "{rel}: {to}.{op} was recorded but {to} does not declare it for {system:?}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_seed_same_history_and_snapshot() {
    let a = run("cosi/two-accesses-one-claim.yaml", &[]).await;
    let b = run("cosi/two-accesses-one-claim.yaml", &[]).await;
    assert_eq!(a.snapshot.text(), b.snapshot.text());
    // Access keys and secrets are random by design (the driver uses the OS RNG),
    // so compare what happened, in which order and at which virtual time,
    // without the subjects that carry those ids.
    let shape = |o: &RunOutcome| -> Vec<String> {
        o.history
            .iter()
            .map(|e| match &e.kind {
                EventKind::Call { from, to, op, .. } => format!("{} call {from}->{to} {op}", e.at),
                EventKind::Reply { outcome, .. } => format!("{} reply {}", e.at, outcome.label()),
                EventKind::Step { name, .. } => format!("{} step {name}", e.at),
                EventKind::Note { component, .. } => format!("{} note by {component}", e.at),
                EventKind::Fault { fault, .. } => format!("{} fault {fault}", e.at),
            })
            .collect()
    };
    assert_eq!(shape(&a), shape(&b));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotate_on_retry_breaks_idempotent_replay_and_no_rotation() {
    let o = run("cosi/retried-grant.yaml", &[Mutant::RotateOnRetry]).await;
    let failed = failed_checks(&o);
    assert!(failed.contains(&"idempotent-replay"), "{}", summary(&o));
    assert!(failed.contains(&"no-rotation"), "{}", summary(&o));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_policy_breaks_least_privilege() {
    // One bucket: the shared policy grants the same thing, so only what a
    // revoke leaves behind shows it (the portable `policies: 0` after revoke).
    let o = run("cosi/revoke-regrant.yaml", &[Mutant::SharedPolicy]).await;
    assert!(
        o.expect_failures
            .iter()
            .any(|f| f.message.contains("policies")),
        "{}",
        summary(&o)
    );
    let o = run("cosi/two-claims-isolated.yaml", &[Mutant::SharedPolicy]).await;
    assert!(
        failed_checks(&o).contains(&"least-privilege"),
        "{}",
        summary(&o)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spec_code_mutants_fail_their_expectations() {
    let o = run("cosi/unknown-auth-type.yaml", &[Mutant::UnknownAuthAsKey]).await;
    assert!(!o.expect_failures.is_empty(), "{}", summary(&o));
    let o = run(
        "cosi/incompatible-parameters.yaml",
        &[Mutant::IgnoreIncompatibleParams],
    )
    .await;
    assert!(
        o.expect_failures
            .iter()
            .any(|f| f.message.contains("ALREADY_EXISTS")),
        "{}",
        summary(&o)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racy_scenario_same_seed_gives_byte_identical_history() {
    for rel in [
        "cosi/concurrent-grants.yaml",
        "cosi/grant-races-revoke.yaml",
        // BOSH: two attaches racing, and an attach racing a VM recreate (Director tasks in play).
        "bosh/two-nodes-one-disk.yaml",
        "bosh/attach-during-recreate.yaml",
        // A crash with the restarted controller's start-up calls in play.
        "csi/retried-snapshot.yaml",
        "bosh/controller-crash-after-create.yaml",
    ] {
        let a = run_seeded(rel, Some(7), &[]).await;
        let b = run_seeded(rel, Some(7), &[]).await;
        assert!(a.passed(), "{}", summary(&a));
        if a.history_text != b.history_text {
            let (a_text, b_text) = (a.history_text.text(), b.history_text.text());
            let (x, y): (Vec<&str>, Vec<&str>) =
                (a_text.lines().collect(), b_text.lines().collect());
            let i = x
                .iter()
                .zip(&y)
                .position(|(p, q)| p != q)
                .unwrap_or(x.len().min(y.len()));
            panic!(
                "{rel}: histories differ first at line {}: {:?} vs {:?}",
                i + 1,
                x.get(i),
                y.get(i)
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn different_seeds_find_different_interleavings() {
    let mut orders = std::collections::BTreeSet::new();
    for seed in 1..=6 {
        let o = run_seeded("cosi/concurrent-grants.yaml", Some(seed), &[]).await;
        assert!(o.passed(), "{}", summary(&o));
        let order: Vec<String> = o
            .history
            .iter()
            .filter_map(|e| match &e.kind {
                EventKind::Call {
                    from,
                    to,
                    op,
                    subject,
                    ..
                } if *to != drivelab_fakes::history::Component::S3 => {
                    Some(format!("{from}->{to} {op} {}", subject.len()))
                }
                _ => None,
            })
            .collect();
        orders.insert(
            o.history_text
                .text()
                .lines()
                .filter(|l| l.contains("scheduler released"))
                .collect::<Vec<_>>()
                .join("\n")
                + &order.join(","),
        );
    }
    assert!(
        orders.len() >= 2,
        "six seeds gave only {} interleaving(s)",
        orders.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_fire_where_aimed() {
    let o = run("cosi/crash-after-add-user.yaml", &[]).await;
    let faults: Vec<String> = o
        .history
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::Fault { fault, detail, .. } => Some(format!("{fault}: {detail}")),
            _ => None,
        })
        .collect();
    assert!(
        faults
            .iter()
            .any(|f| f.starts_with("crash_driver: s3admin.add_user occurrence 1")),
        "{faults:?}"
    );
    assert!(
        faults.iter().any(|f| f.contains("driver killed")),
        "{faults:?}"
    );
    // The grant converged after the crash, with one user.
    assert!(o.passed(), "{}", summary(&o));
}

/// Two crash faults in one call chain: the driver killed inside its second
/// DriverCreateBucket (before its checkpoint write), while a crash is armed for
/// that very call's reply. Each crash waits for the killed driver's callers;
/// the outer call's caller hears only after its own crash, which waits for the
/// first. They used to wait each other out for the whole bound (2 s real time
/// per lab, a fifth of the explorer's schedules); now the outer call counts as
/// settled once its crash has begun. Same seed, same history, both times.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashes_in_one_call_chain_do_not_wait_each_other_out() {
    drivelab::logcap::init(false);
    let base = std::fs::read_to_string(scenario_path("explore/cosi-lifecycle.yaml")).unwrap();
    let text = base.replacen(
        "steps:\n",
        "faults:\n  - crash_driver: { on: driver.DriverCreateBucket, nth: 2, when: after_commit }\n  - crash_driver: { on: kube.create_configmap, nth: 2, when: before_commit }\nsteps:\n",
        1,
    );
    let scn = scenario::parse(Path::new("<test>/two-crashes.yaml"), &text)
        .unwrap_or_else(|e| panic!("{e}"));
    let a = engine::run(&scn, &RunOptions::default()).await.unwrap();
    let b = engine::run(&scn, &RunOptions::default()).await.unwrap();
    assert!(a.passed(), "{}", summary(&a));
    let ran_out: Vec<_> = a
        .history
        .iter()
        .filter(|e| matches!(&e.kind, EventKind::Note { text, .. } if text.contains("had not all seen it die")))
        .collect();
    assert!(
        ran_out.is_empty(),
        "a crash waited out its bound: {ran_out:?}"
    );
    let killed = a
        .history
        .iter()
        .filter(|e| matches!(&e.kind, EventKind::Fault { detail, .. } if detail.contains("killed")))
        .count();
    assert_eq!(killed, 2, "both crashes ran");
    assert_eq!(a.history_text, b.history_text);
}

/// The CSI controller killed right after the Director accepted its create: the
/// retry against the restarted controller must find that disk by name. (Its
/// history is byte-deterministic since a crash waits for the killed driver's
/// callers and holds the sidecars until the restarted controller's start-up
/// calls are done; it lived in tests/data before that.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_crash_after_create_leaves_one_disk() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("scenarios/bosh/controller-crash-after-create.yaml");
    let scn = scenario::load(&path).unwrap_or_else(|e| panic!("{e}"));
    let o = drivelab::engine::run(&scn, &RunOptions::default())
        .await
        .unwrap();
    assert!(o.passed(), "{}", summary(&o));
    let bad = drivelab::engine::run(
        &scn,
        &RunOptions {
            mutants: vec![drivelab::scenario::Mutant::Bosh(
                bosh_csi::Mutant::CreateNotIdempotent,
            )],
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert!(
        !bad.passed(),
        "create-not-idempotent survived a crash after create"
    );
}

/// A Director process restart right after it took an attach. Not in
/// scenarios/ (whose golden histories must be byte-identical): the restart
/// breaks the driver's connection before the new Director listens, and whether
/// the driver's immediate retry meets a refused connection or the new
/// Director is a real-time race, so the history differs by one retried call.
/// The verdicts do not: that is what this test holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn director_restart_mid_attach_keeps_one_attachment() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/bosh-director-restart-mid-attach.yaml");
    let scn = scenario::load(&path).unwrap_or_else(|e| panic!("{e}"));
    let o = drivelab::engine::run(&scn, &RunOptions::default())
        .await
        .unwrap();
    assert!(o.passed(), "{}", summary(&o));
    assert!(
        o.history
            .iter()
            .any(|e| matches!(&e.kind, EventKind::Fault { fault, .. } if fault == "restart")),
        "the restart fault never fired"
    );
}

/// A failed expectation says why: the driver's last answer for that object
/// (code and message) and the sidecar's requeue note, not only the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_expectation_quotes_the_drivers_answer() {
    drivelab::logcap::init(false);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("why.yaml");
    std::fs::write(
        &path,
        "name: why\ndriver: { builtin: cosi-s3 }\nbucket_classes:\n  - { name: standard, deletion_policy: Delete }\nbucket_access_classes:\n  - { name: odd, authentication_type: Unknown }\nsteps:\n  - create_bucket_claim: { name: photos, class: standard }\n  - grant_access: { name: app, claim: photos, class: odd }\n  - expect: { access: app, granted: true }\n",
    )
    .unwrap();
    let scn = drivelab::scenario::load(&path).unwrap();
    let o = drivelab::engine::run(&scn, &Default::default())
        .await
        .unwrap();
    let msg = &o.expect_failures[0].message;
    assert!(
        msg.contains("accessGranted is false, expected true"),
        "{msg}"
    );
    assert!(
        msg.contains("the driver last answered DriverGrantBucketAccess with INVALID_ARGUMENT: "),
        "{msg}"
    );
    assert!(msg.contains("requeue bucketaccess default/app"), "{msg}");
}

/// Three verdicts: a check with nothing to judge is "not exercised", never a
/// pass that establishes its claim; a scenario may require exercise, and then
/// an idle check fails the run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_check_is_not_exercised_and_required_exercise_fails() {
    drivelab::logcap::init(false);
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, extra: &str| {
        let path = dir.path().join(name);
        std::fs::write(
            &path,
            format!("name: idle\ndriver: {{ builtin: cosi-s3 }}\nbucket_classes:\n  - {{ name: standard, deletion_policy: Delete }}\nsteps:\n  - create_bucket_claim: {{ name: photos, class: standard }}\ninvariants: [idempotent-replay, no-orphans]\n{extra}"),
        )
        .unwrap();
        drivelab::scenario::load(&path).unwrap()
    };
    // No request is ever repeated: idempotent-replay has nothing to judge.
    let o = drivelab::engine::run(&write("a.yaml", ""), &Default::default())
        .await
        .unwrap();
    let idle = o
        .verdicts
        .iter()
        .find(|v| v.invariant == "idempotent-replay")
        .unwrap();
    assert!(idle.passed && !idle.exercised, "{idle:?}");
    let orphans = o
        .verdicts
        .iter()
        .find(|v| v.invariant == "no-orphans")
        .unwrap();
    assert!(orphans.exercised, "{orphans:?}");
    assert!(o.passed());
    let r = drivelab::report::ScenarioReport::from_outcome(&o);
    let junit = drivelab::report::junit::junit(std::slice::from_ref(&r));
    assert!(
        junit.contains("<skipped message=\"not exercised"),
        "{junit}"
    );
    let rows = drivelab::report::model::claims_table(std::slice::from_ref(&r));
    let row = rows.iter().find(|c| c.by == ["idempotent-replay"]).unwrap();
    assert!(
        row.established_by.is_empty() && row.not_exercised_in == ["idle"],
        "{row:?}"
    );
    // Required: the same idle check fails the run.
    let o = drivelab::engine::run(
        &write("b.yaml", "require_exercised: [idempotent-replay]\n"),
        &Default::default(),
    )
    .await
    .unwrap();
    assert!(!o.passed());
    let v = o
        .verdicts
        .iter()
        .find(|v| v.invariant == "idempotent-replay")
        .unwrap();
    assert!(
        !v.passed && v.details.iter().any(|d| d.contains("require_exercised")),
        "{v:?}"
    );
}
