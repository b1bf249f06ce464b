//! Drivers that misbehave on purpose (the hidden test driver `drivelab driver
//! misbehave`, launched through the ordinary `driver: {command: …}` path): one
//! that never answers, one that speaks garbage, one that answers nonsense, one
//! that exits mid-call, one that floods its logs. Each is reported with what
//! it printed, the run returns (bounded waits, no timing assertions), and the
//! next scenario of the same `drivelab run` still runs.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use drivelab::engine::{self, RunOptions, RunOutcome};
use drivelab::scenario::{self, driver::parse_cli, Scenario};

/// Far above what any of these runs needs; reaching it means the lab hung.
const HUNG: Duration = Duration::from_secs(600);

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn load(rel: &str) -> Scenario {
    scenario::load(&root().join("scenarios").join(rel)).unwrap_or_else(|e| panic!("{e}"))
}

/// The `driver:` declaration of the misbehaving driver in `mode`.
fn driver(mode: &str, extra: &str) -> String {
    let start = if extra.contains("start_timeout") {
        ""
    } else {
        ", start_timeout: 20s"
    };
    format!(
        r#"{{command: ["{}", driver, misbehave, --mode, {mode}, --endpoint, "{{endpoint}}"]{start}{extra}}}"#,
        env!("CARGO_BIN_EXE_drivelab")
    )
}

async fn run(mode: &str, extra: &str) -> anyhow::Result<RunOutcome> {
    drivelab::logcap::init(false);
    let mut scn = load("cosi/happy-path.yaml");
    let spec = parse_cli(&driver(mode, extra)).unwrap_or_else(|e| panic!("{e}"));
    scn.driver = spec;
    tokio::time::timeout(HUNG, engine::run(&scn, &RunOptions::default()))
        .await
        .unwrap_or_else(|_| panic!("the lab hung on the {mode} driver"))
}

fn driver_notes(o: &RunOutcome) -> Vec<String> {
    use drivelab_fakes::history::{Component, EventKind};
    o.history
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::Note {
                component: Component::Driver,
                text,
            } => Some(text.clone()),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_that_never_answers_is_cut_at_the_call_deadline_and_retried() {
    let o = run("hang", ", call_timeout: 300ms")
        .await
        .expect("the run completes");
    assert!(!o.passed(), "a driver that never answers cannot pass");
    assert!(!o.not_converged.is_empty(), "{:?}", o.not_converged);
    let h = &o.history_text.text();
    assert!(h.contains("DEADLINE_EXCEEDED"), "{h}");
    assert!(
        h.contains("DriverCreateBucket: the driver did not answer within the call deadline (300ms, call_timeout)"),
        "{h}"
    );
    let creates = h.matches("\"DriverCreateBucket\"").count();
    assert!(creates >= 2, "retried with back-off, not once: {creates}");
    let notes = driver_notes(&o);
    assert!(
        notes.iter().any(|n| n.contains("never answering")),
        "captured output: {notes:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_that_speaks_garbage_fails_start_with_its_output() {
    let e = run("garbage", ", start_timeout: 2s")
        .await
        .expect_err("garbage on the socket is no driver");
    let msg = format!("{e:#}");
    assert!(msg.contains("DriverGetInfo"), "{msg}");
    assert!(msg.contains("stdout: misbehave: garbage on"), "{msg}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_that_answers_nonsense_fails_the_verdicts() {
    let o = run("nonsense", ", call_timeout: 2s")
        .await
        .expect("the run completes");
    assert!(!o.passed(), "empty ids and no credentials cannot pass");
    assert!(
        driver_notes(&o)
            .iter()
            .any(|n| n.contains("answering nonsense")),
        "{:?}",
        driver_notes(&o)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_that_exits_mid_call_is_reported_with_its_last_words() {
    let o = run("exit", ", call_timeout: 2s")
        .await
        .expect("the run completes");
    assert!(!o.passed());
    assert!(!o.not_converged.is_empty(), "{:?}", o.not_converged);
    let h = o.history_text.text();
    assert!(h.contains("UNAVAILABLE"), "{h}");
    assert!(
        driver_notes(&o)
            .iter()
            .any(|n| n.contains("stderr: misbehave: DriverCreateBucket received; exiting mid-call")),
        "{:?}",
        driver_notes(&o)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flooding_driver_is_read_to_the_end_and_its_log_is_bounded() {
    use drivelab::engine::{HEAD_LINES, MAX_LINE_BYTES, TAIL_LINES};
    let o = run("flood", ", call_timeout: 2s")
        .await
        .expect("the run completes");
    let notes = driver_notes(&o);
    // Head and tail of two streams, two "dropped" lines, a few of its own.
    assert!(
        notes.len() <= 2 * (HEAD_LINES + TAIL_LINES) + 10,
        "{} driver notes kept",
        notes.len()
    );
    assert!(
        notes
            .iter()
            .any(|n| n.starts_with("stdout: [") && n.contains("lines dropped")),
        "no dropped count: {:?}",
        &notes[notes.len().saturating_sub(5)..]
    );
    // The flood finishes before the driver opens its socket: the lab read it
    // all without blocking the driver, or the run would have failed to start.
    assert!(
        notes.iter().any(|n| n == "stdout: flood: stdout done"),
        "the flood's last line is kept"
    );
    assert!(notes.iter().any(|n| n == "stderr: flood: stderr done"));
    let cut = notes
        .iter()
        .find(|n| n.contains("more bytes of this line dropped"))
        .expect("the 1 MiB line is cut");
    assert!(cut.len() < MAX_LINE_BYTES + 200, "{}", cut.len());
}

#[test]
fn the_next_scenario_runs_after_a_misbehaving_driver() {
    let out = Command::new(env!("CARGO_BIN_EXE_drivelab"))
        .current_dir(root())
        .args([
            "run",
            "scenarios/cosi/happy-path.yaml",
            "scenarios/cosi/retried-grant.yaml",
            "--driver",
            &driver("exit", ", call_timeout: 1s"),
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{stdout}");
    assert!(stdout.contains("0 passed, 2 failed"), "{stdout}");
    assert!(stdout.contains("cosi-retried-grant"), "{stdout}");
}

#[test]
fn a_bad_call_timeout_is_located_in_the_scenario_file() {
    let text = std::fs::read_to_string(root().join("scenarios/cosi/happy-path.yaml"))
        .unwrap()
        .replace(
            "driver: { builtin: cosi-s3 }",
            "driver: { command: [/bin/drv], call_timeout: soon }",
        );
    let e = scenario::parse(Path::new("bad-deadline.yaml"), &text)
        .expect_err("`soon` is no deadline")
        .to_string();
    assert!(e.contains("bad-deadline.yaml:6:"), "{e}");
    assert!(e.contains("call_timeout `soon`"), "{e}");
    let ok = scenario::parse(
        Path::new("ok.yaml"),
        &text.replace("call_timeout: soon", "call_timeout: 2s"),
    )
    .unwrap();
    assert_eq!(ok.driver.call_timeout, Duration::from_secs(2));
    let default = load("cosi/happy-path.yaml");
    assert_eq!(
        default.driver.call_timeout,
        drivelab::scenario::driver::DEFAULT_CALL_TIMEOUT
    );
}
