//! The scale table and plot: one row per run whose Director modelled its
//! worker pool in virtual time (setting → attaches, throughput, p50/p99/max,
//! deadlock outcome), as Markdown and as HTML with an inline SVG of attach
//! latency against workers, drawn here (no script, nothing fetched).

use std::fmt::Write as _;

use drivelab_fakes::clock::VTime;

use super::html::esc;
use super::model::ScenarioReport;
use crate::outcome::ScaleFigures;

/// One row: the run and its figures.
pub struct ScaleRow<'a> {
    /// The run.
    pub report: &'a ScenarioReport,
    /// Its pool figures.
    pub figures: &'a ScaleFigures,
}

impl ScaleRow<'_> {
    /// The upgrade-deadlock answer, from `converges`: everything reached a
    /// terminal state (converged) or some attach never did (deadlocked).
    pub fn outcome(&self) -> &'static str {
        match self
            .report
            .verdicts
            .iter()
            .find(|v| v.invariant == "converges")
        {
            Some(v) if v.passed => "converged",
            Some(_) => "deadlocked (converges failed)",
            None => "not judged (converges not checked)",
        }
    }
}

/// The rows, by fleet size then workers.
pub fn rows(reports: &[ScenarioReport]) -> Vec<ScaleRow<'_>> {
    let mut v: Vec<ScaleRow> = reports
        .iter()
        .filter_map(|r| {
            r.scale
                .as_ref()
                .map(|figures| ScaleRow { report: r, figures })
        })
        .collect();
    v.sort_by(|a, b| {
        (a.figures.nodes, a.figures.workers, &a.report.scenario).cmp(&(
            b.figures.nodes,
            b.figures.workers,
            &b.report.scenario,
        ))
    });
    v
}

/// The `## Scale` section of summary.md (empty without rows).
pub fn scale_md(reports: &[ScenarioReport]) -> String {
    let rows = rows(reports);
    if rows.is_empty() {
        return String::new();
    }
    let mut md = String::from(
        "## Scale: the Director's dynamic-disks pool\n\n\
         Virtual time, the worker pool modelled per worker with the per-VM lock; \
         latency is from an attach's first task queued to its successful task done.\n\n\
         | scenario | nodes | workers | attaches | attaches / virtual min | p50 | p99 | max | last task's queue wait | upgrade deadlock |\n\
         |---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in &rows {
        let f = r.figures;
        let _ = writeln!(
            md,
            "| [{}]({}/summary.md) | {} | {} | {} | {:.1} | {} | {} | {} | {} | {} |",
            r.report.scenario,
            r.report.dir,
            f.nodes,
            f.workers,
            f.attaches,
            f.per_minute,
            VTime(f.p50_ms),
            VTime(f.p99_ms),
            VTime(f.max_ms),
            VTime(f.final_queue_wait_ms),
            r.outcome()
        );
    }
    md.push('\n');
    md
}

/// The scale section of index.html: the table and the plot (empty without rows).
pub fn scale_html(reports: &[ScenarioReport]) -> String {
    let rows = rows(reports);
    if rows.is_empty() {
        return String::new();
    }
    let mut b = String::from(
        "<h2 id=\"scale\">Scale: the Director's dynamic-disks pool</h2>\n\
         <p>Virtual time, the worker pool modelled per worker with the per-VM lock; \
         latency is from an attach's first task queued to its successful task done.</p>\n\
         <table class=\"scale\">\n<tr><th>scenario</th><th>nodes</th><th>workers</th><th>attaches</th>\
         <th>attaches / virtual min</th><th>p50</th><th>p99</th><th>max</th><th>last task's queue wait</th><th>upgrade deadlock</th></tr>\n",
    );
    for r in &rows {
        let f = r.figures;
        let _ = writeln!(
            b,
            "<tr><td><a href=\"{}/index.html\">{}</a></td><td>{}</td><td>{}</td><td>{}</td><td>{:.1}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&r.report.dir),
            esc(&r.report.scenario),
            f.nodes,
            f.workers,
            f.attaches,
            f.per_minute,
            VTime(f.p50_ms),
            VTime(f.p99_ms),
            VTime(f.max_ms),
            VTime(f.final_queue_wait_ms),
            esc(r.outcome())
        );
    }
    b.push_str("</table>\n");
    b.push_str(&latency_svg(&rows));
    b
}

/// Virtual ms as seconds for an axis label: `332 s`, `10.5 s`.
fn secs(ms: u64) -> String {
    if ms % 1000 == 0 {
        format!("{} s", ms / 1000)
    } else {
        format!("{:.1} s", ms as f64 / 1000.0)
    }
}

const W: f64 = 560.0;
const H: f64 = 300.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 150.0;
const TOP: f64 = 34.0;
const BOTTOM: f64 = 40.0;

/// Attach latency (p50 solid, p99 dashed, max dotted) against workers, one
/// colour per fleet size; x is log2 of workers, y is linear virtual seconds.
pub fn latency_svg(rows: &[ScaleRow]) -> String {
    let mut fleets: Vec<u32> = rows.iter().map(|r| r.figures.nodes).collect();
    fleets.dedup();
    let mut workers: Vec<usize> = rows.iter().map(|r| r.figures.workers.max(1)).collect();
    workers.sort_unstable();
    workers.dedup();
    let lx = |w: usize| (w.max(1) as f64).log2();
    let (x0, x1) = (
        lx(*workers.first().unwrap_or(&1)),
        lx(*workers.last().unwrap_or(&1)),
    );
    let ymax = rows
        .iter()
        .map(|r| r.figures.max_ms)
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let px = |w: usize| {
        if x1 > x0 {
            LEFT + (lx(w) - x0) / (x1 - x0) * (W - LEFT - RIGHT)
        } else {
            LEFT + (W - LEFT - RIGHT) / 2.0
        }
    };
    let py = |ms: u64| TOP + (1.0 - ms as f64 / ymax) * (H - TOP - BOTTOM);
    const COLOURS: [&str; 6] = [
        "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b",
    ];
    let mut s = String::new();
    let _ = writeln!(
        s,
        "<svg class=\"scale-plot\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" viewBox=\"0 0 {W} {H}\" role=\"img\" aria-label=\"attach latency against dynamic-disks workers\">"
    );
    // Axes, with ticks at each worker setting and at quarters of the y range.
    let _ = writeln!(
        s,
        "<line x1=\"{LEFT}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#333\"/><line x1=\"{LEFT}\" y1=\"{TOP}\" x2=\"{LEFT}\" y2=\"{}\" stroke=\"#333\"/>",
        H - BOTTOM,
        W - RIGHT,
        H - BOTTOM,
        H - BOTTOM
    );
    for w in &workers {
        let _ = writeln!(
            s,
            "<text x=\"{:.1}\" y=\"{}\" font-size=\"11\" text-anchor=\"middle\">{w}</text>",
            px(*w),
            H - BOTTOM + 14.0
        );
    }
    let _ = writeln!(
        s,
        "<text x=\"{:.1}\" y=\"{}\" font-size=\"11\" text-anchor=\"middle\">dynamic_disks_workers</text>",
        LEFT + (W - LEFT - RIGHT) / 2.0,
        H - 6.0
    );
    for q in 0..=4u64 {
        let ms = (ymax as u64) * q / 4;
        let _ = writeln!(
            s,
            "<text x=\"{}\" y=\"{:.1}\" font-size=\"11\" text-anchor=\"end\">{}</text>",
            LEFT - 4.0,
            py(ms) + 4.0,
            secs(ms)
        );
    }
    let _ = writeln!(
        s,
        "<text x=\"12\" y=\"14\" font-size=\"11\">attach latency (virtual)</text>"
    );
    for (i, n) in fleets.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let fleet: Vec<&ScaleRow> = rows.iter().filter(|r| r.figures.nodes == *n).collect();
        for (pick, dash, label) in [
            (0usize, "", "p50"),
            (1, " stroke-dasharray=\"6 3\"", "p99"),
            (2, " stroke-dasharray=\"2 3\"", "max"),
        ] {
            let value = |f: &ScaleFigures| [f.p50_ms, f.p99_ms, f.max_ms][pick];
            let points: Vec<String> = fleet
                .iter()
                .map(|r| format!("{:.1},{:.1}", px(r.figures.workers), py(value(r.figures))))
                .collect();
            let _ = writeln!(
                s,
                "<polyline fill=\"none\" stroke=\"{colour}\" stroke-width=\"2\"{dash} points=\"{}\"><title>{n} nodes, {label}</title></polyline>",
                points.join(" ")
            );
            for r in &fleet {
                let _ = writeln!(
                    s,
                    "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{colour}\"><title>{n} nodes, {} workers: {label} {}</title></circle>",
                    px(r.figures.workers),
                    py(value(r.figures)),
                    r.figures.workers,
                    VTime(value(r.figures))
                );
            }
        }
        let y = TOP + 16.0 * i as f64;
        let _ = writeln!(
            s,
            "<line x1=\"{}\" y1=\"{y:.1}\" x2=\"{}\" y2=\"{y:.1}\" stroke=\"{colour}\" stroke-width=\"2\"/><text x=\"{}\" y=\"{:.1}\" font-size=\"11\">{n} nodes</text>",
            W - RIGHT + 10.0,
            W - RIGHT + 30.0,
            W - RIGHT + 34.0,
            y + 4.0
        );
    }
    for (k, line) in ["solid: p50", "dashed: p99", "dotted: max"]
        .iter()
        .enumerate()
    {
        let y = TOP + 16.0 * (fleets.len() + k) as f64 + 8.0;
        let _ = writeln!(
            s,
            "<text x=\"{}\" y=\"{y:.1}\" font-size=\"11\">{line}</text>",
            W - RIGHT + 10.0
        );
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(name: &str, nodes: u32, workers: usize, p99: u64, converged: bool) -> ScenarioReport {
        ScenarioReport {
            scenario: name.into(),
            dir: name.into(),
            verdicts: vec![crate::report::model::VerdictReport {
                invariant: "converges".into(),
                passed: converged,
                ..Default::default()
            }],
            scale: Some(ScaleFigures {
                nodes,
                workers,
                attaches: 10,
                p50_ms: p99 / 2,
                p99_ms: p99,
                max_ms: p99,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn table_rows_by_fleet_then_workers_and_name_the_deadlock_outcome() {
        let rs = vec![
            report("b", 10, 16, 3_000, true),
            report("a", 10, 1, 30_000, false),
            ScenarioReport::default(),
        ];
        let md = scale_md(&rs);
        let a = md.find("| [a]").unwrap();
        let b = md.find("| [b]").unwrap();
        assert!(a < b, "{md}");
        assert!(md.contains("deadlocked"), "{md}");
        assert!(md.contains("| converged |"), "{md}");
        assert!(scale_md(&[ScenarioReport::default()]).is_empty());
    }

    #[test]
    fn the_plot_is_inline_svg_with_a_point_per_setting_and_percentile() {
        let rs = vec![
            report("a", 10, 1, 30_000, true),
            report("b", 10, 4, 9_000, true),
            report("c", 10, 16, 3_000, true),
        ];
        let html = scale_html(&rs);
        assert!(html.contains("<svg"));
        assert!(!html.contains("<script"));
        assert_eq!(html.matches("<circle").count(), 9);
        assert_eq!(html.matches("<polyline").count(), 3);
    }
}
