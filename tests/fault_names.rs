//! Issue 17, items 1 and 2: names are owned where they fire (a misspelled
//! operation or a component the system cannot restart is refused with its
//! position, a suggestion and the valid names; `list faults` prints the fakes'
//! registries), and a fault or partition that never acted fails its scenario
//! (console, report, JUnit) unless it says `optional: true`.

use std::path::{Path, PathBuf};
use std::process::Command;

use drivelab::engine::{self, RunOptions, RunOutcome};
use drivelab::report::{self, ScenarioReport};
use drivelab::scenario;

const BIN: &str = env!("CARGO_BIN_EXE_drivelab");

/// The stock crash-after-add-user scenario, its fault line (line 14) replaced.
fn crash_scenario(fault_line: &str) -> String {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/cosi/crash-after-add-user.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    let old = "  - crash_driver: { on: s3admin.add_user, nth: 1, when: after_commit }";
    assert!(text.contains(old), "the stock scenario changed");
    text.replace(old, fault_line)
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

fn drivelab(args: &[&str], dir: &Path) -> (Option<i32>, String, String) {
    let out = Command::new(BIN)
        .args(args)
        .env("DRIVELAB_RUNS", dir.join("runs"))
        .current_dir(dir)
        .output()
        .expect("running drivelab");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_misspelled_operation_exits_2_with_its_position_a_suggestion_and_the_valid_names() {
    let dir = tempfile::tempdir().unwrap();
    let text =
        crash_scenario("  - crash_driver: { on: s3admin.add_usr, nth: 1, when: after_commit }");
    write(dir.path(), "typo.yaml", &text);
    for cmd in [&["validate", "typo.yaml"][..], &["run", "typo.yaml"][..]] {
        let (code, _, err) = drivelab(cmd, dir.path());
        assert_eq!(code, Some(2), "drivelab {cmd:?}: {err}");
        assert!(err.contains("typo.yaml:14:25: error:"), "{err}");
        assert!(err.contains("did you mean `add_user`?"), "{err}");
        assert!(
            err.contains("s3admin operations: add_user, remove_user"),
            "{err}"
        );
    }
}

#[test]
fn a_bosh_scenario_cannot_restart_what_its_lab_does_not_restart() {
    let text = "name: b\ndriver: { builtin: bosh-csi }\nbosh: {}\nsteps:\n  - restart: { component: kube }\n";
    let e = scenario::parse(Path::new("b.yaml"), text).unwrap_err();
    assert_eq!((e.line, e.col), (5, 5), "{e}");
    assert!(e.message.contains("cannot restart `kube`"), "{e}");
    assert!(
        e.hint
            .as_deref()
            .unwrap_or("")
            .contains("director, csi-snapshot-metadata"),
        "{e}"
    );
    let text = "name: b\ndriver: { builtin: bosh-csi }\nbosh: {}\nfaults:\n  - restart: { on: cpi.create_disk }\nsteps:\n  - director_down: {}\n";
    let e = scenario::parse(Path::new("b.yaml"), text).unwrap_err();
    assert!(e.message.contains("cannot restart `cpi`"), "{e}");
}

#[test]
fn an_unknown_component_or_one_the_system_lacks_is_refused() {
    let text = crash_scenario("  - crash_driver: { on: s3admn.add_user }");
    let e = scenario::parse(Path::new("c.yaml"), &text).unwrap_err();
    assert!(e.message.contains("did you mean `s3admin`?"), "{e}");
    let text = crash_scenario("  - crash_driver: { on: director.dynamic_disks.create }");
    let e = scenario::parse(Path::new("c.yaml"), &text).unwrap_err();
    assert!(e.message.contains("COSI scenario has no `director`"), "{e}");
    let text = crash_scenario(
        "  - crash_driver: { on: s3admin.add_user }\n  - crash_driver: { on: s3admin.add_user }",
    )
    .replace("steps:\n", "steps:\n  - heal: {}\n");
    let e = scenario::parse(Path::new("c.yaml"), &text).unwrap_err();
    assert!(e.message.contains("`heal` has nothing to heal"), "{e}");
}

#[test]
fn list_faults_prints_every_registered_operation() {
    let dir = tempfile::tempdir().unwrap();
    let (code, out, err) = drivelab(&["list", "faults"], dir.path());
    assert_eq!(code, Some(0), "{err}");
    for g in drivelab_fakes::ops::registry() {
        for op in g.ops {
            assert!(
                out.contains(op.as_str()),
                "{}.{op} missing from:\n{out}",
                g.component
            );
        }
    }
    assert!(out.contains("  s3admin: add_user, remove_user"), "{out}");
    assert!(
        out.contains("restart step: director, csi-snapshot-metadata"),
        "{out}"
    );
}

async fn run_text(dir: &Path, name: &str, text: &str) -> RunOutcome {
    drivelab::logcap::init(false);
    let path = write(dir, name, text);
    let scn = scenario::load(&path).unwrap_or_else(|e| panic!("{e}"));
    engine::run(&scn, &RunOptions::default())
        .await
        .unwrap_or_else(|e| panic!("{e:#}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fault_that_never_fires_fails_its_scenario_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    // Valid, but the reference driver never sets a user's status.
    let text = crash_scenario(
        "  - crash_driver: { on: s3admin.set_user_status, nth: 1, when: after_commit }",
    );
    let o = run_text(dir.path(), "never.yaml", &text).await;
    assert!(!o.passed(), "{}", report::console(&o));
    assert!(o.verdicts.iter().all(|v| v.passed), "only the fault fails");
    let want = format!(
        "fault #1 ({}:14) crash_driver armed on s3admin.set_user_status nth 1 never fired: 0 such calls were made",
        dir.path().join("never.yaml").display()
    );
    let console = report::console(&o);
    assert!(console.contains(&format!("FAIL {want}")), "{console}");
    let r = ScenarioReport::from_outcome(&o);
    assert!(!r.passed);
    assert_eq!(r.failed_names(), vec!["faults".to_string()]);
    assert!(report::markdown::scenario_summary(&r).contains(&want));
    assert!(report::html::scenario_page(&r).contains(&want));
    let junit = report::junit::junit(std::slice::from_ref(&r));
    assert!(junit.contains("name=\"faults\""), "{junit}");
    assert!(junit.contains("type=\"fault-never-fired\""), "{junit}");
    assert!(junit.contains(&want), "{junit}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_optional_fault_that_never_fires_is_a_visible_note() {
    let dir = tempfile::tempdir().unwrap();
    let text = crash_scenario(
        "  - crash_driver: { on: s3admin.set_user_status, nth: 1, when: after_commit, optional: true }",
    );
    let o = run_text(dir.path(), "optional.yaml", &text).await;
    assert!(o.passed(), "{}", report::console(&o));
    let console = report::console(&o);
    assert!(
        console.contains("note fault #1 (")
            && console.contains("never fired")
            && console.contains("(optional)"),
        "{console}"
    );
    let r = ScenarioReport::from_outcome(&o);
    assert!(r.passed && r.unfired_faults.is_empty());
    assert_eq!(r.fault_notes.len(), 1);
    let junit = report::junit::junit(std::slice::from_ref(&r));
    assert!(junit.contains("<system-out>fault #1 ("), "{junit}");
    assert!(!junit.contains("<failure"), "{junit}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fault_aimed_at_a_later_occurrence_counts_the_calls_it_saw() {
    let dir = tempfile::tempdir().unwrap();
    let text =
        crash_scenario("  - crash_driver: { on: s3admin.add_user, nth: 5, when: after_commit }");
    let o = run_text(dir.path(), "late.yaml", &text).await;
    assert!(!o.passed());
    let m = o.unfired_faults[0].message();
    assert!(
        m.contains("never fired: 1 such call was made while it was armed (it waited for call 5)"),
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_that_cuts_nothing_fails_unless_optional() {
    let dir = tempfile::tempdir().unwrap();
    // No call ever crosses sidecar <-> s3.
    let base =
        crash_scenario("  - crash_driver: { on: s3admin.add_user, nth: 1, when: after_commit }");
    let text = base.replace(
        "steps:\n",
        "steps:\n  - partition: { from: sidecar, to: s3 }\n",
    );
    let o = run_text(dir.path(), "cut.yaml", &text).await;
    assert!(!o.passed());
    let m = o.unfired_faults[0].message();
    assert!(
        m.starts_with("partition #1 (") && m.contains("sidecar <-> s3 cut nothing"),
        "{m}"
    );
    let text = base.replace(
        "steps:\n",
        "steps:\n  - partition: { from: sidecar, to: s3, optional: true }\n",
    );
    let o = run_text(dir.path(), "cut-optional.yaml", &text).await;
    assert!(o.passed(), "{}", report::console(&o));
}
