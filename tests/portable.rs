//! Stock COSI scenarios assert the spec and the invariants, not the reference
//! driver's shape: a second correct design of cosi-s3 (an owner-marker policy
//! per grant besides the access policy) passes every one of them, and an
//! expectation marked `reference_design: true` is reported not exercised for
//! it — never a silent pass — while the reference driver is still judged on it.

use std::path::{Path, PathBuf};

use drivelab::engine::{self, RunOptions, RunOutcome};
use drivelab::scenario::{self, driver::parse_cli, Scenario};
use drivelab_fakes::history::EventKind;

/// The design variant, as `--driver` takes it.
const VARIANT: &str = "{builtin: cosi-s3, policy_layout: per-grant-with-owner-marker}";

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The stock COSI scenarios and the explorer's regression files (scenarios/found).
fn cosi_scenarios() -> Vec<(PathBuf, Scenario)> {
    let files = scenario::discover(&[
        root().join("scenarios/cosi"),
        root().join("scenarios/found"),
    ])
    .unwrap();
    assert!(files.len() >= 29, "{files:?}");
    files
        .into_iter()
        .map(|f| {
            let s = scenario::load(&f).unwrap_or_else(|e| panic!("{e}"));
            (f, s)
        })
        .collect()
}

/// Run `scn` with `driver` in place of its own declaration, as `--driver` does.
async fn run_with(scn: &Scenario, driver: Option<&str>) -> RunOutcome {
    drivelab::logcap::init(false);
    let mut scn = scn.clone();
    if let Some(d) = driver {
        let spec = parse_cli(d).unwrap_or_else(|e| panic!("{e}"));
        scn.driver.launch = spec.launch;
        scn.driver.policy_layout = spec.policy_layout;
        scn.driver.from_flag = true;
    }
    engine::run(&scn, &RunOptions::default())
        .await
        .unwrap_or_else(|e| panic!("{}: {e:#}", scn.name))
}

/// How many canned policies the driver wrote (add_canned_policy calls).
fn policy_writes(o: &RunOutcome) -> usize {
    o.history
        .iter()
        .filter(
            |e| matches!(&e.kind, EventKind::Call { op, .. } if op.as_str() == "add_canned_policy"),
        )
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_owner_marker_design_passes_every_stock_cosi_scenario() {
    let mut marked = Vec::new();
    for (f, scn) in cosi_scenarios() {
        let o = run_with(&scn, Some(VARIANT)).await;
        assert!(
            o.passed(),
            "{}: a correct design fails a stock scenario\n{}",
            f.display(),
            drivelab::report::console(&o)
        );
        for n in &o.expect_not_exercised {
            assert!(
                n.message
                    .contains("not exercised (reference-design expectation)"),
                "{}: {}",
                f.display(),
                n.message
            );
        }
        if !o.expect_not_exercised.is_empty() {
            marked.push(scn.name.clone());
        }
    }
    // The marked expectations exist and are shown, not passed.
    assert!(
        marked.contains(&"cosi-happy-path".to_string()),
        "{marked:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_variant_really_runs_and_the_reference_is_still_judged() {
    let scn = scenario::load(&root().join("scenarios/cosi/happy-path.yaml")).unwrap();
    let reference = run_with(&scn, None).await;
    let variant = run_with(&scn, Some(VARIANT)).await;
    assert!(reference.passed() && variant.passed());
    // The reference design judges its marked expectation; the variant skips it, visibly.
    assert!(reference.expect_not_exercised.is_empty());
    assert_eq!(variant.expect_not_exercised.len(), 1);
    let console = drivelab::report::console(&variant);
    assert!(
        console.contains("n/a  expect")
            && console.contains("policy_layout per-grant-with-owner-marker"),
        "{console}"
    );
    // Two policies per grant, not one: the switch reached the driver.
    assert!(
        policy_writes(&variant) > policy_writes(&reference),
        "{} vs {}",
        policy_writes(&variant),
        policy_writes(&reference)
    );
    // And the marked expectation can fail: the variant judged as if it were the reference.
    let mut judged = scn.clone();
    judged.driver.policy_layout = Some(cosi_s3::PolicyLayout::PerGrantWithOwnerMarker);
    let mut as_reference = judged.clone();
    for step in &mut as_reference.steps {
        if let scenario::Step::Expect(e) = &mut step.value {
            e.reference_design = false;
        }
    }
    let o = run_with(&as_reference, None).await;
    assert!(
        !o.passed(),
        "the reference-design count must fail the variant when judged"
    );
    assert!(
        o.expect_failures
            .iter()
            .any(|f| f.message.contains("policies, expected 1")),
        "{:?}",
        o.expect_failures
    );
}
