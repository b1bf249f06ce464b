//! The lab's own durability (issue 10, item 4): `kill -9` the real drivelab
//! binary mid-suite, then `drivelab runs` lists the interrupted run with what it
//! stored up to the kill, and `drivelab report RUN` renders it marked incomplete.
//! The store is polled (bounded), never timed.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use drivelab::runs::RunStore;

const BIN: &str = env!("CARGO_BIN_EXE_drivelab");

/// Poll until a run is being recorded past its first step while another one
/// has completed (runs go side by side, so not necessarily the one before it);
/// returns the live run's id and the events it had stored then, or None if the
/// suite ended first.
fn wait_for_run_in_progress(
    store: &RunStore,
    child: &mut std::process::Child,
) -> Option<(String, u64)> {
    // ~10 minutes at most: generous for a loaded CI machine, bounded all the same.
    for _ in 0..60_000 {
        if let Ok(Some(_)) = child.try_wait() {
            return None;
        }
        let runs: Vec<_> = store
            .ids()
            .unwrap_or_default()
            .into_iter()
            .filter_map(|id| store.load(&id).ok().map(|r| (id, r)))
            .collect();
        let completed = runs.iter().any(|(_, r)| r.report.is_some());
        let live = runs
            .iter()
            .rev()
            .find(|(_, r)| r.live && r.progress.steps_done >= 1);
        if let (true, Some((id, run))) = (completed, live) {
            return Some((id.clone(), run.progress.events));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    None
}

/// Run drivelab over `runs`; its stdout, once it exits with `code`.
fn drivelab(args: &[&str], runs: &Path, code: i32) -> String {
    let out = Command::new(BIN)
        .args(args)
        .arg("--runs-dir")
        .arg(runs)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("running drivelab");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(
        out.status.code(),
        Some(code),
        "drivelab {args:?}: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn kill_9_mid_suite_leaves_a_listed_and_reportable_incomplete_run() {
    // The kill can land in the instant between one run's end and the next's
    // start (then nothing is incomplete): try again, a bounded number of times.
    for attempt in 1..=5 {
        let tmp = tempfile::tempdir().unwrap();
        let runs_dir = tmp.path().join("runs");
        let mut child = Command::new(BIN)
            .args(["run", "scenarios/cosi/", "--runs-dir"])
            .arg(&runs_dir)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawning drivelab run");
        let store = RunStore::new(&runs_dir);
        let seen = wait_for_run_in_progress(&store, &mut child);
        // SIGKILL: no destructor, no flush, the sled lock dies with the process.
        let _ = child.kill();
        let _ = child.wait();
        let Some((seen, seen_events)) = seen else {
            panic!("the suite ended before a run was seen in progress (attempt {attempt})");
        };
        assert!(seen_events > 0);

        let listing = drivelab(&["runs"], &runs_dir, 0);
        let lines: Vec<&str> = listing.lines().skip(1).collect();
        assert!(
            lines
                .iter()
                .any(|l| l.contains(" pass ") || l.contains(" fail ")),
            "no finished run listed:\n{listing}"
        );
        let Some(line) = lines.iter().rev().find(|l| l.contains("INCOMPLETE")) else {
            eprintln!("attempt {attempt}: killed between two runs; again\n{listing}");
            continue;
        };
        let id = line.split_whitespace().next().unwrap();
        // The writer's sled lock died with it: the db itself opens.
        let run = store.load(id).expect("the interrupted run reads back");
        assert!(run.report.is_none() && !run.live, "{run:?}");
        if id == seen {
            // Everything stored before the kill is still there.
            assert!(run.progress.events >= seen_events, "{listing}");
        }
        let events = store.events(id).expect("stored events parse");
        assert_eq!(events.len() as u64, run.progress.events);
        assert!(
            line.contains(&format!(
                "{} events, last step reached {}",
                run.progress.events, run.progress.last_step
            )),
            "{line}"
        );

        let out = tmp.path().join("report");
        let md = drivelab(
            &["report", id, "--report-dir", out.to_str().unwrap()],
            &runs_dir,
            1,
        );
        let note = run.incomplete_note().unwrap();
        assert!(md.contains("— INCOMPLETE"), "{md}");
        assert!(md.contains(&note), "{md}");
        if run.progress.events > 0 {
            assert!(note.contains(&format!("(event {})", run.progress.events - 1)));
            assert!(md.contains(&format!("## Events stored ({})", events.len())));
        }
        let dir = out.join(drivelab::report::sanitize(&run.meta.scenario));
        let html = std::fs::read_to_string(dir.join("index.html")).expect("index.html");
        assert!(
            html.contains(&note),
            "the HTML page names the incomplete run"
        );
        assert_eq!(
            std::fs::read_to_string(dir.join("summary.md")).unwrap(),
            md,
            "summary.md is what was printed"
        );
        return;
    }
    panic!("every attempt killed the lab between two runs");
}

/// Every string under a key named `secret` (at any depth) in a JSON value.
fn secret_fields(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                match v {
                    serde_json::Value::String(s) if k == "secret" => out.push(s.clone()),
                    _ => secret_fields(v, out),
                }
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|v| secret_fields(v, out)),
        _ => {}
    }
}

/// Issue 16, item 7: a stored run is judged again from its record, which
/// holds secrets only as fingerprints; a record that now reads differently
/// (as after a change to the checks) is judged differently, and says so.
#[test]
fn a_stored_run_is_judged_again_from_its_record() {
    let tmp = tempfile::tempdir().unwrap();
    let runs = tmp.path().join("runs");
    drivelab(
        &["run", "scenarios/cosi/two-accesses-one-claim.yaml"],
        &runs,
        0,
    );
    drivelab(&["run", "scenarios/hostpath/lifecycle.yaml"], &runs, 0);
    let store = RunStore::new(&runs);
    let ids = store.ids().unwrap();
    let (cosi, csi) = (&ids[0], &ids[1]);
    for id in [cosi, csi] {
        let md = drivelab(&["report", id], &runs, 0);
        assert!(md.starts_with("Re-judged from the run's record"), "{md}");
        assert!(md.contains("every verdict as recorded (PASS)"), "{md}");
    }

    let text = store
        .record(cosi)
        .unwrap()
        .expect("a completed run keeps its record");
    let mut record: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut secrets = Vec::new();
    secret_fields(&record, &mut secrets);
    assert!(!secrets.is_empty(), "the grants' secrets are in the record");
    assert!(
        secrets
            .iter()
            .all(|s| s.starts_with("fp:") && s.len() == 35),
        "secrets are kept only as fingerprints: {secrets:?}"
    );

    // Two live accesses with one account and key: unique-credentials breaks.
    let live = record["observations"]["live"].as_array_mut().unwrap();
    let mut twin = live[0].clone();
    twin["name"] = "default/impostor".into();
    live.push(twin);
    let db = sled::open(runs.join(cosi)).unwrap();
    db.insert("record", serde_json::to_vec(&record).unwrap())
        .unwrap();
    db.flush().unwrap();
    drop(db);

    let md = drivelab(&["report", cosi], &runs, 1);
    assert!(
        md.contains("unique-credentials: PASS when recorded, FAIL now"),
        "{md}"
    );
    assert!(
        md.contains("default/impostor"),
        "the new verdict's details: {md}"
    );
    let md = drivelab(&["report", cosi, "--as-recorded"], &runs, 0);
    assert!(!md.contains("Re-judged"), "{md}");
}
