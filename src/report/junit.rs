//! JUnit XML in the common (Jenkins/Ant) schema every CI reads: one testsuite
//! per scenario, one testcase per invariant checked plus one for its `expect:`
//! steps; a failure carries the violating calls (the evidence slice).

use std::fmt::Write as _;

use super::html::esc;
use super::model::ScenarioReport;

/// The whole run as one `<testsuites>` document.
pub fn junit(reports: &[ScenarioReport]) -> String {
    let mut suites = String::new();
    let (mut tests, mut failures, mut errors, mut skipped) = (0usize, 0usize, 0usize, 0usize);
    for r in reports {
        let (t, f, e, s, xml) = suite(r);
        tests += t;
        failures += f;
        errors += e;
        skipped += s;
        suites.push_str(&xml);
    }
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites name=\"drivelab\" tests=\"{tests}\" failures=\"{failures}\" errors=\"{errors}\" skipped=\"{skipped}\" time=\"0\">\n{suites}</testsuites>\n"
    )
}

/// One scenario's testsuite: (tests, failures, errors, skipped, xml). A check
/// with nothing to judge is a skipped case ("not exercised"), never a pass.
fn suite(r: &ScenarioReport) -> (usize, usize, usize, usize, String) {
    let class = format!("drivelab.{}", r.scenario);
    let mut cases = String::new();
    let (mut tests, mut failures, mut errors, mut skipped) = (0, 0, 0, 0);
    if let Some(e) = &r.error {
        tests += 1;
        errors += 1;
        let _ = writeln!(
            cases,
            "    <testcase classname=\"{}\" name=\"lab\" time=\"0\">\n      <error message=\"the lab failed to run this scenario\" type=\"lab-error\">{}</error>\n    </testcase>",
            esc(&class),
            esc(&format!("{e}\nreplay: {}", r.replay))
        );
    }
    for v in &r.verdicts {
        tests += 1;
        if v.passed && !v.exercised {
            skipped += 1;
            let _ = writeln!(
                cases,
                "    <testcase classname=\"{}\" name=\"{}\" time=\"0\"><skipped message=\"{}\"/></testcase>",
                esc(&class),
                esc(&v.invariant),
                esc(&format!("not exercised: {}", v.details.join("; ")))
            );
        } else if v.passed {
            let _ = writeln!(
                cases,
                "    <testcase classname=\"{}\" name=\"{}\" time=\"0\"/>",
                esc(&class),
                esc(&v.invariant)
            );
        } else {
            failures += 1;
            let mut body = String::new();
            let _ = writeln!(body, "claim: {}", v.claim);
            for d in &v.details {
                let _ = writeln!(body, "{d}");
            }
            if !v.slice.is_empty() {
                let _ = writeln!(body, "\nviolating calls (history slice):");
                for l in &v.slice {
                    let _ = writeln!(body, "  {l}");
                }
            }
            for d in v.diffs.iter().filter(|d| !d.lines.is_empty()) {
                let _ = writeln!(body, "\nsnapshot diff, {}:", d.label);
                for l in &d.lines {
                    let _ = writeln!(body, "  {l}");
                }
            }
            let _ = writeln!(body, "\nreplay: {}", r.replay);
            let message = v
                .details
                .first()
                .cloned()
                .unwrap_or_else(|| format!("{} failed", v.invariant));
            let _ = writeln!(
                cases,
                "    <testcase classname=\"{}\" name=\"{}\" time=\"0\">\n      <failure message=\"{}\" type=\"invariant\">{}</failure>\n    </testcase>",
                esc(&class),
                esc(&v.invariant),
                esc(&message),
                esc(&body)
            );
        }
    }
    if r.error.is_none() {
        tests += 1;
        if r.expect_failures.is_empty() {
            let _ = writeln!(
                cases,
                "    <testcase classname=\"{}\" name=\"expectations\" time=\"0\"/>",
                esc(&class)
            );
        } else {
            failures += 1;
            let body = format!("{}\n\nreplay: {}", r.expect_failures.join("\n"), r.replay);
            let _ = writeln!(
                cases,
                "    <testcase classname=\"{}\" name=\"expectations\" time=\"0\">\n      <failure message=\"{}\" type=\"expect\">{}</failure>\n    </testcase>",
                esc(&class),
                esc(&format!("{} expectation(s) failed", r.expect_failures.len())),
                esc(&body)
            );
        }
    }
    // A reference-design expectation another driver was not judged on: its
    // own skipped case, so it is counted and never folded into a pass.
    if r.error.is_none() && !r.expect_not_exercised.is_empty() {
        tests += 1;
        skipped += 1;
        let _ = writeln!(
            cases,
            "    <testcase classname=\"{}\" name=\"reference-design expectations\" time=\"0\"><skipped message=\"{}\"/></testcase>",
            esc(&class),
            esc(&r.expect_not_exercised.join("; "))
        );
    }
    if r.error.is_none() && r.faults_armed > 0 {
        tests += 1;
        failures += usize::from(!r.unfired_faults.is_empty());
        cases.push_str(&faults_case(&class, r));
    }
    let props = format!(
        "    <properties>\n      <property name=\"seed\" value=\"{}\"/>\n      <property name=\"driver\" value=\"{}\"/>\n      <property name=\"mutants\" value=\"{}\"/>\n      <property name=\"replay\" value=\"{}\"/>\n    </properties>\n",
        r.seed,
        esc(&r.driver),
        esc(&r.mutants.join(",")),
        esc(&r.replay)
    );
    let xml = format!(
        "  <testsuite name=\"{}\" tests=\"{tests}\" failures=\"{failures}\" errors=\"{errors}\" skipped=\"{skipped}\" time=\"0\">\n{props}{cases}  </testsuite>\n",
        esc(&r.scenario)
    );
    (tests, failures, errors, skipped, xml)
}

/// The `faults` case: every fault and partition the scenario set up acted
/// (a failure names each that did not; optional ones are notes in system-out).
fn faults_case(class: &str, r: &ScenarioReport) -> String {
    let open = format!(
        "    <testcase classname=\"{}\" name=\"faults\" time=\"0\"",
        esc(class)
    );
    if r.unfired_faults.is_empty() && r.fault_notes.is_empty() {
        return format!("{open}/>\n");
    }
    let mut inner = String::new();
    if let Some(first) = r.unfired_faults.first() {
        let body = format!("{}\n\nreplay: {}", r.unfired_faults.join("\n"), r.replay);
        let _ = write!(
            inner,
            "\n      <failure message=\"{}\" type=\"fault-never-fired\">{}</failure>",
            esc(first),
            esc(&body)
        );
    }
    if !r.fault_notes.is_empty() {
        let _ = write!(
            inner,
            "\n      <system-out>{}</system-out>",
            esc(&r.fault_notes.join("\n"))
        );
    }
    format!("{open}>{inner}\n    </testcase>\n")
}
