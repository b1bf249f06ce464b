//! Writing what a run found: the console summary every run prints, and the
//! per-scenario files under `--report-dir` (snapshot, history, summary).
//! Nothing written here contains a secret: inputs are already normalised.

use std::fmt::Write as _;
use std::path::Path;

use crate::engine::RunOutcome;

/// The console block for one run.
pub fn console(o: &RunOutcome) -> String {
    let mut s = String::new();
    let verdict = if o.passed() { "PASS" } else { "FAIL" };
    let _ = writeln!(s, "{verdict} {} ({}) — driver {}, seed {}, {} events", o.scenario, o.path.display(), o.driver_name, o.seed, o.history.len());
    for v in &o.verdicts {
        let mark = if v.passed { "ok  " } else { "FAIL" };
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
    for n in &o.not_converged {
        let _ = writeln!(s, "  note not converged: {n}");
    }
    let _ = writeln!(s, "  replay: {}", o.replay);
    s
}

/// Write `snapshot.txt`, `history.json` and `summary.md` under `dir/<scenario>/`.
pub fn write_files(dir: &Path, o: &RunOutcome) -> std::io::Result<()> {
    let d = dir.join(sanitize(&o.scenario));
    std::fs::create_dir_all(&d)?;
    std::fs::write(d.join("snapshot.txt"), &o.snapshot)?;
    std::fs::write(d.join("history.json"), &o.history_text)?;
    let mut md = String::new();
    let _ = writeln!(md, "# {} — {}\n", o.scenario, if o.passed() { "PASS" } else { "FAIL" });
    let _ = writeln!(md, "- driver: `{}`\n- seed: {}\n- replay: `{}`\n", o.driver_name, o.seed, o.replay);
    let _ = writeln!(md, "| invariant | verdict | detail |\n|---|---|---|");
    for v in &o.verdicts {
        let _ = writeln!(md, "| {} | {} | {} |", v.invariant, if v.passed { "pass" } else { "FAIL" }, v.details.join("<br>").replace('|', "\\|"));
    }
    for f in &o.expect_failures {
        let _ = writeln!(md, "\n- expect failed at {} (step {}): {}", f.at, f.step, f.message);
    }
    let _ = writeln!(md, "\n## Ownership snapshot\n\n```\n{}```", o.snapshot);
    std::fs::write(d.join("summary.md"), md)
}

fn sanitize(name: &str) -> String {
    name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' }).collect()
}
