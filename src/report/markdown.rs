//! Markdown summaries: the run's `summary.md` (claims, then scenarios) and one
//! per scenario (lead, claims, evidence with history slice and snapshot diff).
//! Table cells are escaped so a `|` or a newline in a name cannot break a row.

use std::fmt::Write as _;

use super::model::{claims_table, ClaimRow, ScenarioReport};
use super::RunMeta;

fn cell(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('|', "\\|")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('\n', "<br>")
}

/// A claim's verdict: broken anywhere, held where exercised, or exercised nowhere.
pub fn claim_verdict(r: &ClaimRow) -> &'static str {
    if !r.holds {
        "**BROKEN**"
    } else if r.established_by.is_empty() {
        "not exercised"
    } else {
        "holds"
    }
}

/// The claims table in Markdown.
pub fn claims_md(rows: &[ClaimRow]) -> String {
    let mut s = String::from(
        "| claim | decided by | verdict | established by | broken in | not exercised in |\n|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let says = if r.source == "scenario" {
            format!("{} *(stated by the scenario)*", cell(&r.says))
        } else {
            cell(&r.says)
        };
        let _ = writeln!(
            s,
            "| {says} | `{}` | {} | {} | {} | {} |",
            r.by.join(", "),
            claim_verdict(r),
            cell(&r.established_by.join(", ")),
            cell(&r.broken_in.join(", ")),
            cell(&r.not_exercised_in.join(", "))
        );
    }
    s
}

/// The run's summary.
pub fn run_summary(meta: &RunMeta, reports: &[ScenarioReport], claims: &[ClaimRow]) -> String {
    let mut md = String::new();
    let all = reports.iter().all(|r| r.passed);
    let _ = writeln!(
        md,
        "# drivelab run {} — {}\n",
        meta.title,
        if all { "PASS" } else { "FAIL" }
    );
    let _ = writeln!(md, "- driver under test: `{}`", super::drivers(reports));
    let _ = writeln!(md, "- seed: {}", super::seeds(reports));
    let _ = writeln!(md, "- replay: `{}`", meta.replay);
    let passed = reports.iter().filter(|r| r.passed).count();
    let _ = writeln!(
        md,
        "- scenarios: {passed} passed, {} failed\n",
        reports.len() - passed
    );
    let _ = writeln!(md, "## Claims\n\n{}", claims_md(claims));
    md.push_str(&super::scale::scale_md(reports));
    let _ = writeln!(
        md,
        "## Scenarios\n\n| scenario | verdict | failed | seed | replay |\n|---|---|---|---|---|"
    );
    for r in reports {
        let _ = writeln!(
            md,
            "| [{}]({}/summary.md) | {} | {} | {} | `{}` |",
            cell(&r.scenario),
            r.dir,
            if r.passed { "PASS" } else { "**FAIL**" },
            cell(&r.failed_names().join(", ")),
            r.seed,
            r.replay.replace('`', "'")
        );
    }
    md
}

/// One scenario's summary.
pub fn scenario_summary(r: &ScenarioReport) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "# {} — {}\n",
        r.scenario,
        if r.passed { "PASS" } else { "FAIL" }
    );
    let _ = writeln!(md, "- driver under test: `{}`", r.driver);
    let _ = writeln!(md, "- seed: {}", r.seed);
    if !r.mutants.is_empty() {
        let _ = writeln!(md, "- mutants: {}", r.mutants.join(", "));
    }
    let _ = writeln!(md, "- replay: `{}`\n", r.replay);
    if let Some(e) = &r.error {
        let _ = writeln!(md, "## Lab error\n\n```\n{e}\n```\n");
    }
    let _ = writeln!(
        md,
        "## Claims\n\n{}",
        claims_md(&claims_table(std::slice::from_ref(r)))
    );
    let _ = writeln!(
        md,
        "## Checks\n\n| invariant | verdict | detail |\n|---|---|---|"
    );
    for v in &r.verdicts {
        let _ = writeln!(
            md,
            "| {} | {} | {} |",
            v.invariant,
            match v.state() {
                "FAIL" => "**FAIL**",
                s => s,
            },
            cell(&v.details.join("\n"))
        );
    }
    for f in &r.expect_failures {
        let _ = writeln!(md, "\n- expect failed: {f}");
    }
    for f in &r.expect_not_exercised {
        let _ = writeln!(md, "\n- expect {f}");
    }
    for f in &r.unfired_faults {
        let _ = writeln!(md, "\n- **fault never acted**: {f}");
    }
    for f in &r.fault_notes {
        let _ = writeln!(md, "\n- note: {f}");
    }
    for n in &r.not_converged {
        let _ = writeln!(md, "\n- not converged: {n}");
    }
    if !r.figures.is_empty() {
        let _ = writeln!(md, "\n## Figures\n");
        for f in &r.figures {
            let _ = writeln!(md, "- {f}");
        }
    }
    for v in r.verdicts.iter().filter(|v| !v.passed) {
        let _ = writeln!(md, "\n## Evidence: {}\n", v.invariant);
        for d in &v.details {
            let _ = writeln!(md, "- {d}");
        }
        if v.slice.is_empty() {
            let _ = writeln!(
                md,
                "\n(the check names no calls: it is about the final state)"
            );
        } else {
            let _ = writeln!(md, "\nHistory slice:\n\n```\n{}\n```", v.slice.join("\n"));
        }
        for d in &v.diffs {
            if d.lines.is_empty() {
                let _ = writeln!(md, "\nSnapshot diff ({}): no change", d.label);
            } else {
                let _ = writeln!(
                    md,
                    "\nSnapshot diff, {}:\n\n```diff\n{}\n```",
                    d.label,
                    d.lines.join("\n")
                );
            }
        }
    }
    let _ = writeln!(md, "\n## Ownership snapshot\n\n```\n{}```", r.snapshot);
    md
}
