//! Self-contained HTML pages (inline CSS and SVG, no network): the run index
//! and one page per scenario, with the claims table first and a swim-lane
//! timeline of the labelled history. Every text is escaped before it is written.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use drivelab_fakes::history::{Component, EventKind};

use super::model::{call_index, ClaimRow, ScenarioReport};
use super::RunMeta;

/// Escape text for HTML/SVG/XML content and attribute values.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            // Control characters are not allowed in XML 1.0; drop them.
            c if (c as u32) < 0x20 && c != '\n' && c != '\t' && c != '\r' => {}
            c => out.push(c),
        }
    }
    out
}

const CSS: &str = r#"
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#1b1f24;background:#fff}
h1{font-size:22px;margin:0 0 8px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #d0d7de;padding-bottom:4px}
h3{font-size:15px;margin:18px 0 6px}
code,pre{font:12.5px/1.4 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
pre{background:#f6f8fa;border:1px solid #d0d7de;border-radius:6px;padding:10px;overflow:auto}
table{border-collapse:collapse;margin:6px 0}th,td{border:1px solid #d0d7de;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f6f8fa}
td.scn{white-space:nowrap}
.lead{display:grid;grid-template-columns:max-content auto;gap:2px 14px;margin:8px 0 12px}
.lead dt{font-weight:600}.lead dd{margin:0}
.pass{color:#1a7f37;font-weight:600}.fail{color:#cf222e;font-weight:700}.skip{color:#9a6700;font-style:italic}
tr.broken td{background:#ffebe9}
.badge{display:inline-block;padding:1px 8px;border-radius:10px;font-weight:700;color:#fff}
.badge.pass{background:#1a7f37;color:#fff}.badge.fail{background:#cf222e;color:#fff}
.diff .add{color:#1a7f37;background:#dafbe1}.diff .del{color:#cf222e;background:#ffebe9}
.timeline{overflow-x:auto;border:1px solid #d0d7de;border-radius:6px;background:#fcfcfd}
.legend span{margin-right:16px}
svg text{font:11px ui-monospace,Menlo,Consolas,monospace}
"#;

fn page(title: &str, body: &str) -> String {
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>{}</title>\n<style>{CSS}</style>\n</head>\n<body>\n{body}</body>\n</html>\n",
        esc(title)
    )
}

fn verdict_badge(passed: bool) -> &'static str {
    if passed {
        "<span class=\"badge pass\">PASS</span>"
    } else {
        "<span class=\"badge fail\">FAIL</span>"
    }
}

fn claims_table_html(rows: &[ClaimRow], link: bool) -> String {
    let mut s = String::from("<table class=\"claims\">\n<tr><th>claim</th><th>decided by</th><th>verdict</th><th>established by</th><th>broken in</th><th>not exercised in</th></tr>\n");
    let scn = |names: &[String]| -> String {
        names
            .iter()
            .map(|n| {
                if link {
                    format!(
                        "<a href=\"{0}/index.html\">{1}</a>",
                        esc(&super::model::sanitize(n)),
                        esc(n)
                    )
                } else {
                    esc(n)
                }
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    for r in rows {
        let _ = writeln!(
            s,
            "<tr class=\"{}\"><td>{}{}</td><td><code>{}</code></td><td>{}</td><td class=\"scn\">{}</td><td class=\"scn\">{}</td><td class=\"scn\">{}</td></tr>",
            if r.holds { "holds" } else { "broken" },
            esc(&r.says),
            if r.source == "scenario" { " <small>(stated by the scenario)</small>" } else { "" },
            esc(&r.by.join(", ")),
            match super::markdown::claim_verdict(r) {
                "holds" => "<span class=\"pass\">holds</span>",
                "not exercised" => "<span class=\"skip\">not exercised</span>",
                _ => "<span class=\"fail\">BROKEN</span>",
            },
            scn(&r.established_by),
            scn(&r.broken_in),
            scn(&r.not_exercised_in),
        );
    }
    s.push_str("</table>\n");
    s
}

/// The run's index page over all scenarios.
pub fn index_page(meta: &RunMeta, reports: &[ScenarioReport], claims: &[ClaimRow]) -> String {
    let all_pass = reports.iter().all(|r| r.passed);
    let mut b = String::new();
    let _ = writeln!(
        b,
        "<h1>drivelab run {} <span id=\"verdict\">{}</span></h1>",
        esc(&meta.title),
        verdict_badge(all_pass)
    );
    b.push_str("<dl class=\"lead\">\n");
    let _ = writeln!(
        b,
        "<dt>driver under test</dt><dd>{}</dd>",
        esc(&super::drivers(reports))
    );
    let _ = writeln!(b, "<dt>seed</dt><dd>{}</dd>", esc(&super::seeds(reports)));
    let _ = writeln!(
        b,
        "<dt>replay</dt><dd><code>{}</code></dd>",
        esc(&meta.replay)
    );
    let passed = reports.iter().filter(|r| r.passed).count();
    let _ = writeln!(
        b,
        "<dt>scenarios</dt><dd>{passed} passed, {} failed, {} total</dd>",
        reports.len() - passed,
        reports.len()
    );
    b.push_str("</dl>\n<h2>Claims</h2>\n");
    b.push_str(&claims_table_html(claims, true));
    b.push_str(&super::scale::scale_html(reports));
    b.push_str("<h2>Scenarios</h2>\n<table class=\"scenarios\">\n<tr><th>scenario</th><th>verdict</th><th>failed</th><th>seed</th><th>mutants</th><th>replay</th></tr>\n");
    for r in reports {
        let _ = writeln!(
            b,
            "<tr class=\"{}\"><td><a href=\"{}/index.html\">{}</a></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td><code>{}</code></td></tr>",
            if r.passed { "ok" } else { "broken" },
            esc(&r.dir),
            esc(&r.scenario),
            verdict_badge(r.passed),
            esc(&r.failed_names().join(", ")),
            r.seed,
            esc(&r.mutants.join(", ")),
            esc(&r.replay)
        );
    }
    b.push_str("</table>\n");
    page(&format!("drivelab run {}", meta.title), &b)
}

/// One scenario's page.
pub fn scenario_page(r: &ScenarioReport) -> String {
    let mut b = String::new();
    let _ = writeln!(b, "<p><a href=\"../index.html\">← all scenarios</a></p>");
    let _ = writeln!(
        b,
        "<h1>{} <span id=\"verdict\">{}</span></h1>",
        esc(&r.scenario),
        verdict_badge(r.passed)
    );
    b.push_str("<dl class=\"lead\">\n");
    let _ = writeln!(
        b,
        "<dt>driver under test</dt><dd>{}</dd>",
        esc(if r.driver.is_empty() {
            "(no DriverGetInfo answer)"
        } else {
            &r.driver
        })
    );
    let _ = writeln!(b, "<dt>seed</dt><dd>{}</dd>", r.seed);
    let mutants = if r.mutants.is_empty() {
        "none (the correct driver)".to_string()
    } else {
        r.mutants.join(", ")
    };
    let _ = writeln!(b, "<dt>mutants</dt><dd>{}</dd>", esc(&mutants));
    let _ = writeln!(b, "<dt>replay</dt><dd><code>{}</code></dd>", esc(&r.replay));
    let _ = writeln!(
        b,
        "<dt>scenario file</dt><dd><code>{}</code></dd>",
        esc(&r.path)
    );
    b.push_str("</dl>\n");
    if let Some(e) = &r.error {
        let _ = writeln!(
            b,
            "<h2>Lab error</h2>\n<pre class=\"fail\">{}</pre>",
            esc(e)
        );
    }
    b.push_str("<h2>Claims</h2>\n");
    b.push_str(&claims_table_html(
        &super::model::claims_table(std::slice::from_ref(r)),
        false,
    ));
    // The picture before the tables: it is what a reviewer looks at first.
    if r.history.is_empty() {
        b.push_str("<h2>Timeline</h2>\n<p>(no history recorded)</p>\n");
    } else {
        b.push_str("<h2>Timeline</h2>\n");
        b.push_str("<p class=\"legend\"><span>→ call (grey: answered OK; orange: error reply; dashed red: no reply)</span><span style=\"color:#cf222e\">⚡ fault</span><span style=\"background:#ffebe9\">shaded, N✗: a failing step (numbers are steps)</span><span style=\"color:#cf222e\">thick red: call named by a failed check</span></p>\n");
        let _ = writeln!(b, "<div class=\"timeline\">{}</div>", timeline_svg(r));
    }
    b.push_str("<h2>Checks</h2>\n<table class=\"verdicts\">\n<tr><th>invariant</th><th>verdict</th><th>details</th></tr>\n");
    for v in &r.verdicts {
        let _ = writeln!(
            b,
            "<tr class=\"{}\"><td><code>{}</code></td><td>{}</td><td>{}</td></tr>",
            if v.passed { "ok" } else { "broken" },
            esc(&v.invariant),
            match v.state() {
                "pass" => "<span class=\"pass\">pass</span>",
                "not exercised" => "<span class=\"skip\">not exercised</span>",
                _ => "<span class=\"fail\">FAIL</span>",
            },
            v.details
                .iter()
                .map(|d| esc(d))
                .collect::<Vec<_>>()
                .join("<br>")
        );
    }
    b.push_str("</table>\n");
    for f in &r.expect_failures {
        let _ = writeln!(b, "<p class=\"fail\">expect failed: {}</p>", esc(f));
    }
    for f in &r.expect_not_exercised {
        let _ = writeln!(b, "<p>expect {}</p>", esc(f));
    }
    for f in &r.unfired_faults {
        let _ = writeln!(b, "<p class=\"fail\">fault never acted: {}</p>", esc(f));
    }
    for f in &r.fault_notes {
        let _ = writeln!(b, "<p>note: {}</p>", esc(f));
    }
    for n in &r.not_converged {
        let _ = writeln!(b, "<p>not converged: {}</p>", esc(n));
    }
    for f in &r.figures {
        let _ = writeln!(b, "<p class=\"figure\">{}</p>", esc(f));
    }
    for v in r.verdicts.iter().filter(|v| !v.passed) {
        let _ = writeln!(
            b,
            "<h2 class=\"fail\" id=\"evidence-{0}\">Evidence: {0}</h2>",
            esc(&v.invariant)
        );
        let _ = writeln!(b, "<p>Claim: {}</p>", esc(&v.claim));
        for d in &v.details {
            let _ = writeln!(b, "<p class=\"fail\">{}</p>", esc(d));
        }
        if v.slice.is_empty() {
            b.push_str("<p>(the check names no calls: it is about the final state)</p>\n");
        } else {
            let _ = writeln!(
                b,
                "<h3>History slice</h3>\n<pre class=\"slice\">{}</pre>",
                esc(&v.slice.join("\n"))
            );
        }
        for d in &v.diffs {
            let _ = writeln!(b, "<h3>Snapshot diff: {}</h3>", esc(&d.label));
            if d.lines.is_empty() {
                b.push_str("<p>(no change in the ownership snapshot)</p>\n");
                continue;
            }
            b.push_str("<pre class=\"diff\">");
            for l in &d.lines {
                let class = if l.starts_with('+') {
                    "add"
                } else if l.starts_with('-') {
                    "del"
                } else {
                    "ctx"
                };
                let _ = writeln!(b, "<span class=\"{class}\">{}</span>", esc(l));
            }
            b.push_str("</pre>\n");
        }
    }
    b.push_str("<h2>Steps</h2>\n<ol>\n");
    for s in &r.steps {
        let _ = writeln!(b, "<li>{}</li>", esc(&s.name));
    }
    b.push_str("</ol>\n");
    let _ = writeln!(
        b,
        "<h2>Final ownership snapshot</h2>\n<pre class=\"snapshot\">{}</pre>",
        esc(&r.snapshot)
    );
    b.push_str("<p>Full labelled history: <a href=\"history.json\">history.json</a>; all data: <a href=\"run.json\">run.json</a>.</p>\n");
    page(&format!("{} — drivelab", r.scenario), &b)
}

/// Lanes top to bottom: the lab, whoever drives the driver, the driver, what it calls.
/// Only lanes with events are drawn, so a COSI and a BOSH run each get their own set.
const LANE_ORDER: [Component; 14] = [
    Component::Lab,
    Component::Sidecar,
    Component::CsiProvisioner,
    Component::CsiAttacher,
    Component::Kubelet,
    Component::Driver,
    Component::S3Admin,
    Component::S3,
    Component::Director,
    Component::Cpi,
    Component::Agent,
    Component::Mounts,
    Component::Kube,
    Component::Workload,
];
const LANE_H: i64 = 46;
const TOP: i64 = 34;
const LEFT: i64 = 84;
const SLOT: i64 = 14;
const GAP: i64 = 18;

/// The swim-lane timeline: one lane per component that appears, one column per
/// call or fault in history order; calls at the same virtual instant sit side by
/// side, and a gap with a time tick separates instants.
pub fn timeline_svg(r: &ScenarioReport) -> String {
    let calls = call_index(&r.history);
    let failing = r.failing_calls();
    let failing_steps = r.failing_steps();
    // Replies by call id, to colour each arrow by how it ended.
    let mut replies: BTreeMap<u64, (bool, bool, String)> = BTreeMap::new();
    for e in &r.history {
        if let EventKind::Reply { id, outcome } = &e.kind {
            let no_reply = matches!(outcome, drivelab_fakes::history::Outcome::NoReply { .. });
            replies.insert(id.0, (outcome.is_success(), no_reply, outcome.label()));
        }
    }
    let mut present: Vec<Component> = Vec::new();
    for e in &r.history {
        if let EventKind::Call { from, to, .. } = &e.kind {
            for c in [from, to] {
                if !present.contains(c) {
                    present.push(*c);
                }
            }
        }
    }
    let lanes: Vec<Component> = LANE_ORDER
        .iter()
        .copied()
        .filter(|c| present.contains(c))
        .collect();
    let lane_y = |c: Component| -> i64 {
        TOP + 14 + lanes.iter().position(|l| *l == c).unwrap_or(0) as i64 * LANE_H
    };
    let lab_y = lane_y(Component::Lab);

    let mut x = LEFT + 10;
    let mut last_at: Option<u64> = None;
    let mut ticks: Vec<(i64, String)> = Vec::new();
    let mut steps: Vec<(i64, usize, String)> = Vec::new();
    let mut body = String::new();
    let mut last_failing_label = i64::MIN / 2;
    for e in &r.history {
        let at = e.at.0;
        let takes_column = matches!(e.kind, EventKind::Call { .. } | EventKind::Fault { .. });
        if takes_column && last_at != Some(at) {
            if last_at.is_some() {
                x += GAP;
            }
            ticks.push((x, e.at.to_string()));
            last_at = Some(at);
        }
        match &e.kind {
            EventKind::Step { index, name } => steps.push((x, *index, name.clone())),
            EventKind::Call {
                id,
                from,
                to,
                op,
                subject,
            } => {
                let (y1, y2) = (lane_y(*from), lane_y(*to));
                let (ok, no_reply, label) = replies.get(&id.0).cloned().unwrap_or((
                    false,
                    true,
                    "no reply recorded".into(),
                ));
                let is_failing = failing.contains(&id.0);
                let (stroke, width, dash, marker) = if is_failing {
                    ("#cf222e", 3, "", "ah-fail")
                } else if no_reply {
                    ("#cf222e", 1, " stroke-dasharray=\"3 2\"", "ah-fail")
                } else if ok {
                    ("#8c959f", 1, "", "ah")
                } else {
                    ("#bc4c00", 1, "", "ah-err")
                };
                let title = format!(
                    "#{} [{}] {from} → {to} {op} {subject} ⇒ {label}",
                    id.0, e.at
                );
                let class = if is_failing { "call failing" } else { "call" };
                let _ = write!(
                    body,
                    "<g class=\"{class}\" data-call=\"{}\"><title>{}</title>",
                    id.0,
                    esc(&title)
                );
                if y1 == y2 {
                    let _ = write!(body, "<circle cx=\"{x}\" cy=\"{y1}\" r=\"4\" fill=\"none\" stroke=\"{stroke}\" stroke-width=\"{width}\"/>");
                } else {
                    // Stop short of the lane line so the arrow head stays visible.
                    let y2s = if y2 > y1 { y2 - 4 } else { y2 + 4 };
                    let _ = write!(body, "<line x1=\"{x}\" y1=\"{y1}\" x2=\"{x}\" y2=\"{y2s}\" stroke=\"{stroke}\" stroke-width=\"{width}\"{dash} marker-end=\"url(#{marker})\"/>");
                }
                if is_failing && x - last_failing_label >= 30 {
                    last_failing_label = x;
                    let _ = write!(
                        body,
                        "<text x=\"{}\" y=\"{}\" fill=\"#cf222e\" font-weight=\"bold\">#{}</text>",
                        x + 3,
                        y1.min(y2) - 3,
                        id.0
                    );
                }
                body.push_str("</g>\n");
                x += SLOT;
            }
            EventKind::Fault {
                call,
                fault,
                detail,
            } => {
                let y = call
                    .and_then(|c| calls.get(&c.0))
                    .and_then(|(_, to, _)| LANE_ORDER.iter().find(|l| l.as_str() == to))
                    .map(|c| lane_y(*c))
                    .unwrap_or(lab_y);
                let title = format!("[{}] fault {fault}: {detail}", e.at);
                let bottom = TOP + 14 + (lanes.len().max(1) as i64 - 1) * LANE_H + 10;
                let _ = write!(
                    body,
                    "<g class=\"fault\"><title>{}</title><line x1=\"{x}\" y1=\"{}\" x2=\"{x}\" y2=\"{bottom}\" stroke=\"#cf222e\" stroke-dasharray=\"2 3\"/><text x=\"{}\" y=\"{}\" fill=\"#cf222e\" font-size=\"14\">⚡</text><text x=\"{}\" y=\"{}\" fill=\"#cf222e\">{}</text></g>\n",
                    esc(&title),
                    TOP,
                    x - 5,
                    y + 5,
                    x + 6,
                    y - 8,
                    esc(fault)
                );
                x += SLOT;
            }
            _ => {}
        }
    }
    let width = x + 40;
    let lanes_bottom = TOP + 14 + (lanes.len().max(1) as i64 - 1) * LANE_H;
    let height = lanes_bottom + 40;
    let mut s = String::new();
    let _ = write!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"swimlanes\" width=\"{width}\" height=\"{height}\" viewBox=\"0 0 {width} {height}\" role=\"img\" aria-label=\"timeline of {}\">\n",
        esc(&r.scenario)
    );
    s.push_str("<defs><marker id=\"ah\" viewBox=\"0 0 8 8\" refX=\"7\" refY=\"4\" markerWidth=\"6\" markerHeight=\"6\" orient=\"auto-start-reverse\"><path d=\"M0,0 L8,4 L0,8 z\" fill=\"#8c959f\"/></marker><marker id=\"ah-err\" viewBox=\"0 0 8 8\" refX=\"7\" refY=\"4\" markerWidth=\"6\" markerHeight=\"6\" orient=\"auto-start-reverse\"><path d=\"M0,0 L8,4 L0,8 z\" fill=\"#bc4c00\"/></marker><marker id=\"ah-fail\" viewBox=\"0 0 8 8\" refX=\"7\" refY=\"4\" markerWidth=\"5\" markerHeight=\"5\" orient=\"auto-start-reverse\"><path d=\"M0,0 L8,4 L0,8 z\" fill=\"#cf222e\"/></marker></defs>\n");
    // Step bands first so everything else draws over them (steps without calls have no width).
    // Of steps that start at (nearly) the same place, label the last: it is the one with calls.
    for (i, (sx, index, name)) in steps.iter().enumerate() {
        let show_label = steps.get(i + 1).is_none_or(|n| n.0 - sx >= 24);
        let end = steps.get(i + 1).map(|n| n.0).unwrap_or(x);
        let failing = failing_steps.contains(index);
        let fill = if failing {
            "#ffebe9"
        } else if index % 2 == 0 {
            "#f6f8fa"
        } else {
            "#ffffff"
        };
        let class = if failing { "step failing-step" } else { "step" };
        let _ = write!(
            s,
            "<g class=\"{class}\" data-step=\"{}\"><title>step {}: {}</title><rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{fill}\"/><line x1=\"{sx}\" y1=\"{}\" x2=\"{sx}\" y2=\"{}\" stroke=\"#57606a\"/><text x=\"{}\" y=\"{}\" fill=\"{}\" font-weight=\"bold\">{}</text></g>\n",
            index + 1,
            index + 1,
            esc(name),
            sx - SLOT / 2,
            TOP - 4,
            (end - sx).max(2),
            lanes_bottom - TOP + 18,
            TOP - 4,
            lanes_bottom + 14,
            sx - SLOT / 2 + 2,
            TOP - 8,
            if failing { "#cf222e" } else { "#57606a" },
            if show_label { format!("{}{}", index + 1, if failing { "✗" } else { "" }) } else { String::new() },
        );
    }
    for c in &lanes {
        let y = lane_y(*c);
        let _ = write!(
            s,
            "<g class=\"lane\" data-lane=\"{0}\"><line x1=\"{LEFT}\" y1=\"{y}\" x2=\"{width}\" y2=\"{y}\" stroke=\"#d0d7de\"/><text x=\"6\" y=\"{1}\" font-weight=\"bold\" fill=\"#24292f\">{0}</text></g>\n",
            esc(c.as_str()),
            y + 4
        );
    }
    // Time ticks: at most one label every 60 px so they stay readable.
    let mut last_label = i64::MIN / 2;
    for (tx, label) in &ticks {
        if tx - last_label >= 60 {
            let _ = write!(s, "<text class=\"tick\" x=\"{tx}\" y=\"{}\" fill=\"#57606a\">{}</text><line x1=\"{tx}\" y1=\"{}\" x2=\"{tx}\" y2=\"{}\" stroke=\"#57606a\"/>\n", lanes_bottom + 30, esc(label), lanes_bottom + 16, lanes_bottom + 20);
            last_label = *tx;
        }
    }
    s.push_str(&body);
    s.push_str("</svg>");
    s
}
