//! Writing what a run found: the console block every run prints, and under
//! `--report-dir` a run index (summary.md, index.html, run.json, junit.xml) over
//! per-scenario directories. Everything written comes from labelled text only.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::outcome::RunOutcome;

pub mod cli;
pub mod html;
pub mod junit;
pub mod markdown;
pub mod model;
pub mod scale;

pub use model::{claims_table, sanitize, ClaimRow, ScenarioReport};

/// What the run index says about the run as a whole.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct RunMeta {
    /// Short title, e.g. the paths run (`scenarios/`).
    pub title: String,
    /// The command that replays the whole run (no report dir, no absolute paths).
    pub replay: String,
}

/// The console block for one run.
/// A passing run in two lines, as cargo test prints a passing test: the
/// verdict with its counts, and the command that replays it. A failing run
/// gets every detail ([`console`]).
pub fn console_brief(o: &RunOutcome) -> String {
    if !o.passed() {
        return console(o);
    }
    let idle = o.verdicts.iter().filter(|v| !v.exercised).count();
    let expects = match o.expect_not_exercised.len() {
        0 => String::new(),
        n => format!(", {n} reference-design expectation(s) not exercised"),
    };
    format!(
        "PASS {} ({}) — driver {}, seed {}, {} events, checks: {} exercised, {idle} not exercised{expects}\n  replay: {}\n",
        o.scenario,
        o.path.display(),
        o.driver_name,
        o.seed,
        o.history.len(),
        o.verdicts.len() - idle,
        o.replay
    )
}

/// Every verdict with its details, failures, notes and figures.
pub fn console(o: &RunOutcome) -> String {
    let mut s = String::new();
    let verdict = if o.passed() { "PASS" } else { "FAIL" };
    let idle = o
        .verdicts
        .iter()
        .filter(|v| v.passed && !v.exercised)
        .count();
    let _ = writeln!(
        s,
        "{verdict} {} ({}) — driver {}, seed {}, {} events, checks: {} exercised, {idle} not exercised",
        o.scenario,
        o.path.display(),
        o.driver_name,
        o.seed,
        o.history.len(),
        o.verdicts.len() - idle
    );
    for v in &o.verdicts {
        let mark = match (v.passed, v.exercised) {
            (false, _) => "FAIL",
            (true, true) => "ok  ",
            (true, false) => "n/a ",
        };
        let _ = writeln!(s, "  {mark} {}", v.invariant);
        for d in &v.details {
            let _ = writeln!(s, "         {d}");
        }
        if !v.passed && !v.evidence.is_empty() {
            let ids: Vec<String> = v.evidence.iter().map(|c| format!("#{c}")).collect();
            let _ = writeln!(s, "         evidence: calls {}", ids.join(" "));
        }
    }
    for f in &o.expect_failures {
        let _ = writeln!(s, "  FAIL expect (step {}) {}: {}", f.step, f.at, f.message);
    }
    for f in &o.expect_not_exercised {
        let _ = writeln!(s, "  n/a  expect (step {}) {}: {}", f.step, f.at, f.message);
    }
    for f in &o.unfired_faults {
        if f.optional {
            let _ = writeln!(s, "  note {} (optional)", f.message());
        } else {
            let _ = writeln!(s, "  FAIL {}", f.message());
        }
    }
    for n in &o.not_converged {
        let _ = writeln!(s, "  note not converged: {n}");
    }
    for f in &o.figures {
        let _ = writeln!(s, "  figure: {f}");
    }
    let _ = writeln!(s, "  replay: {}", o.replay);
    s
}

/// Write one scenario's directory (`dir/<scenario>/`): snapshot.txt,
/// history.json, summary.md, index.html, run.json, junit.xml. Returns the
/// report so callers can build the run index from it.
pub fn write_files(dir: &Path, o: &RunOutcome) -> std::io::Result<ScenarioReport> {
    let r = ScenarioReport::from_outcome(o);
    write_scenario(dir, &r)?;
    Ok(r)
}

/// Write one scenario's directory from its report.
pub fn write_scenario(dir: &Path, r: &ScenarioReport) -> std::io::Result<()> {
    let d = dir.join(&r.dir);
    std::fs::create_dir_all(&d)?;
    std::fs::write(d.join("snapshot.txt"), &r.snapshot)?;
    std::fs::write(
        d.join("history.json"),
        with_newline(serde_json::to_string_pretty(&r.history).unwrap_or_default()),
    )?;
    std::fs::write(d.join("summary.md"), markdown::scenario_summary(r))?;
    std::fs::write(d.join("index.html"), html::scenario_page(r))?;
    std::fs::write(
        d.join("run.json"),
        with_newline(serde_json::to_string_pretty(r).unwrap_or_default()),
    )?;
    std::fs::write(d.join("junit.xml"), junit::junit(std::slice::from_ref(r)))
}

/// Write the run index over `reports` at the top of `dir`.
pub fn write_index(dir: &Path, meta: &RunMeta, reports: &[ScenarioReport]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let claims = claims_table(reports);
    std::fs::write(
        dir.join("summary.md"),
        markdown::run_summary(meta, reports, &claims),
    )?;
    std::fs::write(
        dir.join("index.html"),
        html::index_page(meta, reports, &claims),
    )?;
    std::fs::write(dir.join("junit.xml"), junit::junit(reports))?;
    // The index keeps verdicts and steps; each scenario's run.json has its history.
    let scenarios: Vec<serde_json::Value> = reports
        .iter()
        .map(|r| {
            serde_json::json!({
                "scenario": r.scenario, "dir": r.dir, "path": r.path, "seed": r.seed, "mutants": r.mutants,
                "driver": r.driver, "passed": r.passed, "failed": r.failed_names(), "error": r.error, "replay": r.replay,
                "steps": r.steps, "claims": r.claims, "expect_failures": r.expect_failures,
                "expect_not_exercised": r.expect_not_exercised,
                "unfired_faults": r.unfired_faults, "fault_notes": r.fault_notes,
                "verdicts": r.verdicts.iter().map(|v| serde_json::json!({
                    "invariant": v.invariant, "passed": v.passed, "details": v.details, "evidence": v.evidence,
                })).collect::<Vec<_>>(),
                "history": format!("{}/run.json", r.dir),
            })
        })
        .collect();
    let doc = serde_json::json!({
        "tool": "drivelab",
        "format": 1,
        "title": meta.title,
        "replay": meta.replay,
        "passed": reports.iter().all(|r| r.passed),
        "claims": claims,
        "scenarios": scenarios,
    });
    std::fs::write(
        dir.join("run.json"),
        with_newline(serde_json::to_string_pretty(&doc).unwrap_or_default()),
    )?;
    let meta_json = serde_json::to_string_pretty(meta).unwrap_or_default();
    std::fs::write(dir.join("meta.json"), with_newline(meta_json))
}

/// Read every `*/run.json` under the given report dirs (shard outputs), in
/// scenario order; a later dir's copy of a scenario replaces an earlier one.
pub fn load_reports(dirs: &[PathBuf]) -> Result<(Vec<ScenarioReport>, Vec<RunMeta>), String> {
    let mut out: Vec<ScenarioReport> = Vec::new();
    let mut metas = Vec::new();
    for d in dirs {
        let entries = std::fs::read_dir(d).map_err(|e| format!("{}: {e}", d.display()))?;
        let mut found = 0;
        let mut subdirs: Vec<PathBuf> = entries
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(|p| p.is_dir())
            .collect();
        subdirs.sort();
        for sub in subdirs {
            let f = sub.join("run.json");
            if !f.is_file() {
                continue;
            }
            let text = std::fs::read_to_string(&f).map_err(|e| format!("{}: {e}", f.display()))?;
            let r: ScenarioReport = serde_json::from_str(&text)
                .map_err(|e| format!("{}: not a drivelab scenario report: {e}", f.display()))?;
            found += 1;
            out.retain(|o| o.dir != r.dir);
            out.push(r);
        }
        if found == 0 {
            return Err(format!(
                "{}: no scenario reports (*/run.json) here; is it a --report-dir?",
                d.display()
            ));
        }
        if let Ok(m) = std::fs::read_to_string(d.join("meta.json")) {
            if let Ok(m) = serde_json::from_str::<RunMeta>(&m) {
                metas.push(m);
            }
        }
    }
    // Component-wise, as the suite walks directories: scenarios/csi/… before
    // scenarios/csi-spec/… (as strings, '-' sorts before '/').
    out.sort_by(|a, b| {
        Path::new(&a.path)
            .cmp(Path::new(&b.path))
            .then(a.dir.cmp(&b.dir))
    });
    Ok((out, metas))
}

/// `drivelab merge-reports`: shard outputs into one report at `out`.
pub fn merge(dirs: &[PathBuf], out: &Path) -> Result<Vec<ScenarioReport>, String> {
    let (reports, metas) = load_reports(dirs)?;
    for r in &reports {
        write_scenario(out, r).map_err(|e| format!("{}: {e}", out.display()))?;
    }
    // Shards of one run share their replay command up to the --partition: drop it.
    let replay = metas
        .first()
        .map(|m| cli::strip_partition(&m.replay))
        .unwrap_or_default();
    let title = metas
        .first()
        .map(|m| cli::strip_partition(&m.title))
        .unwrap_or_else(|| "(merged)".into());
    let meta = RunMeta { title, replay };
    write_index(out, &meta, &reports).map_err(|e| format!("{}: {e}", out.display()))?;
    Ok(reports)
}

/// Driver names across scenarios, e.g. `cosi-s3.drivelab.dev`.
pub fn drivers(reports: &[ScenarioReport]) -> String {
    let mut d: Vec<&str> = reports
        .iter()
        .map(|r| r.driver.as_str())
        .filter(|d| !d.is_empty())
        .collect();
    d.sort_unstable();
    d.dedup();
    if d.is_empty() {
        "(no DriverGetInfo answer)".into()
    } else {
        d.join(", ")
    }
}

/// The seed(s) used: one number when all scenarios share it.
pub fn seeds(reports: &[ScenarioReport]) -> String {
    let mut s: Vec<u64> = reports.iter().map(|r| r.seed).collect();
    s.sort_unstable();
    s.dedup();
    match s.as_slice() {
        [] => "-".into(),
        [one] => one.to_string(),
        many => format!(
            "{} (per scenario; see the table)",
            many.iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

fn with_newline(mut s: String) -> String {
    if !s.ends_with('\n') {
        s.push('\n');
    }
    s
}

/// What differs between a stored run's verdicts and the same run judged
/// again: one line per check whose outcome or details changed.
pub fn rejudge_changes(recorded: &ScenarioReport, now: &ScenarioReport) -> Vec<String> {
    let word = |v: &model::VerdictReport| match (v.passed, v.exercised) {
        (false, _) => "FAIL",
        (true, false) => "not exercised",
        (true, true) => "PASS",
    };
    let mut out = Vec::new();
    for n in &now.verdicts {
        match recorded
            .verdicts
            .iter()
            .find(|r| r.invariant == n.invariant)
        {
            None => out.push(format!(
                "{}: {} (not judged when recorded)",
                n.invariant,
                word(n)
            )),
            Some(r) if word(r) != word(n) => out.push(format!(
                "{}: {} when recorded, {} now",
                n.invariant,
                word(r),
                word(n)
            )),
            Some(r) if r.details != n.details => out.push(format!(
                "{}: {} as recorded, with other details",
                n.invariant,
                word(n)
            )),
            Some(_) => {}
        }
    }
    for r in &recorded.verdicts {
        if !now.verdicts.iter().any(|n| n.invariant == r.invariant) {
            out.push(format!(
                "{}: {} when recorded, not judged now",
                r.invariant,
                word(r)
            ));
        }
    }
    out
}
