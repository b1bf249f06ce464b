//! The report's data: one `ScenarioReport` per run, built only from labelled
//! text (snapshot, labelled history, verdicts), so everything written from it
//! is free of secrets and stable across runs of the same seed.

use std::collections::BTreeMap;

use drivelab_fakes::history::{Event, EventKind, EventLog};
use serde::{Deserialize, Serialize};

use crate::checks::Verdict;
use crate::outcome::RunOutcome;
use crate::scenario::Invariant;
use crate::snapshot::{line_diff, STEP_DIFF_CONTEXT};

/// Everything written about one scenario run; also what `run.json` holds, so
/// `merge-reports` can rebuild an index from shard outputs without re-running.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ScenarioReport {
    /// Scenario name.
    pub scenario: String,
    /// Scenario file, as given on the command line (relative in CI).
    pub path: String,
    /// Directory name under the report dir.
    pub dir: String,
    /// Seed used.
    pub seed: u64,
    /// Seeded bugs switched on.
    pub mutants: Vec<String>,
    /// DriverGetInfo name.
    pub driver: String,
    /// All checks and expectations held (false on a lab error).
    pub passed: bool,
    /// The lab itself failed (the run produced no verdicts).
    pub error: Option<String>,
    /// The command that replays the run.
    pub replay: String,
    /// The steps, as the engine described them.
    pub steps: Vec<StepInfo>,
    /// One per invariant checked.
    pub verdicts: Vec<VerdictReport>,
    /// The scenario's own claims (`claims:`), each decided by its invariants.
    pub claims: Vec<ClaimReport>,
    /// Failed `expect:` steps, as `step N (file:line:col): message`.
    pub expect_failures: Vec<String>,
    /// `reference_design: true` expectations not judged for this driver, same form.
    #[serde(default)]
    pub expect_not_exercised: Vec<String>,
    /// Faults and partitions the scenario set up that never acted (failures).
    #[serde(default)]
    pub unfired_faults: Vec<String>,
    /// Optional faults that never fired (notes, not failures).
    #[serde(default)]
    pub fault_notes: Vec<String>,
    /// Faults and partitions the scenario armed (the JUnit `faults` case is
    /// written when there are any).
    #[serde(default)]
    pub faults_armed: usize,
    /// Objects that had not converged when their step's window closed.
    pub not_converged: Vec<String>,
    /// Measured figures (throughput, latency), one line each.
    #[serde(default)]
    pub figures: Vec<String>,
    /// The Director worker pool's figures (runs that modelled it; the scale table's rows).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale: Option<crate::outcome::ScaleFigures>,
    /// Final ownership snapshot (labelled).
    pub snapshot: String,
    /// Snapshot after each step (labelled).
    pub step_snapshots: Vec<StepSnapshotReport>,
    /// The snapshot after the last snapshotted step, which the final one is
    /// compared with; `None` in reports written before steps kept diffs.
    #[serde(default)]
    pub last_step_snapshot: Option<String>,
    /// The labelled history.
    pub history: Vec<Event>,
}

/// A step of the scenario.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct StepInfo {
    /// 0-based index.
    pub index: usize,
    /// Description.
    pub name: String,
}

/// What a step changed in the ownership snapshot.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct StepSnapshotReport {
    /// 0-based step index.
    pub step: usize,
    /// The step, described.
    pub name: String,
    /// Line diff from the snapshot after the previous snapshotted step (the
    /// empty text before the first). Older run.json files held each step's
    /// full text instead (`text`); they read with no diff, and their verdicts
    /// carry their diffs already.
    #[serde(default)]
    pub diff: Vec<String>,
}

/// One invariant's verdict with its evidence already cut out of the history.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct VerdictReport {
    /// Invariant id.
    pub invariant: String,
    /// The claim in words.
    pub claim: String,
    /// Held?
    pub passed: bool,
    /// False when the check had nothing to judge ("not exercised"; runs
    /// recorded before this field read as exercised).
    #[serde(default = "yes")]
    pub exercised: bool,
    /// What was checked / what broke.
    pub details: Vec<String>,
    /// History call ids the check named.
    pub evidence: Vec<u64>,
    /// The evidence calls with their replies and the faults/notes between them (failures only).
    pub slice: Vec<String>,
    /// Steps (0-based) the evidence calls were made in.
    pub failing_steps: Vec<usize>,
    /// The snapshot before/after each failing step (or, for checks over the
    /// final state, the last step against the final snapshot).
    pub diffs: Vec<SnapshotDiff>,
}

/// A line diff of two snapshots.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct SnapshotDiff {
    /// What it compares, e.g. "after step 2 (…) → after step 3 (…)".
    pub label: String,
    /// "  ", "- ", "+ " lines; empty when nothing changed.
    pub lines: Vec<String>,
}

/// A claim a scenario states in words.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ClaimReport {
    /// The claim.
    pub says: String,
    /// Invariant ids that decide it.
    pub by: Vec<String>,
    /// Every `by` invariant was checked and held.
    pub passed: bool,
    /// `by` invariants this scenario did not check (the claim is then not established).
    pub unchecked: Vec<String>,
    /// Every `by` invariant had something to judge (a claim none of whose
    /// checks were exercised is established by nothing).
    #[serde(default = "yes")]
    pub exercised: bool,
}

/// The claim text of an invariant id (empty when unknown).
pub fn claim_of(id: &str) -> String {
    Invariant::all()
        .iter()
        .find(|i| i.id() == id)
        .map(|i| i.claim().to_string())
        .unwrap_or_default()
}

/// Directory name for a scenario: safe on every file system, never `..`.
pub fn sanitize(name: &str) -> String {
    let s: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if s.is_empty() {
        "_".into()
    } else {
        s
    }
}

impl ScenarioReport {
    /// This report with `verdicts` in place of its own — a stored run judged
    /// again from its record (`drivelab report RUN`) — and its claims and
    /// pass/fail decided anew. `raw_history` is the run's stored history,
    /// which names what the verdicts' details name.
    pub fn rejudged(&self, verdicts: &[Verdict], raw_history: &EventLog) -> Self {
        let labels = Relabel::from_histories(raw_history, &self.history);
        let mut r = self.clone();
        r.verdicts = verdict_reports(
            verdicts,
            &labels,
            &self.history,
            &self.step_snapshots,
            (self.last_step_snapshot.as_deref(), &self.snapshot),
        );
        r.claims = self
            .claims
            .iter()
            .map(|c| decide_claim(&c.says, c.by.clone(), &r.verdicts))
            .collect();
        r.passed = r.error.is_none()
            && r.verdicts.iter().all(|v| v.passed)
            && r.expect_failures.is_empty()
            && r.unfired_faults.is_empty();
        r
    }

    /// Build the report of a finished run.
    pub fn from_outcome(o: &RunOutcome) -> Self {
        // Only the labelled history is used: raw events may carry random ids.
        let history: Vec<Event> =
            serde_json::from_str(&scrub_residual_ids(&o.history_text.text())).unwrap_or_default();
        // Check details and messages name raw ids; give them the history's labels.
        let labels = Relabel::from_histories(&o.history, &history);
        let steps: Vec<StepInfo> = history
            .iter()
            .filter_map(|e| match &e.kind {
                EventKind::Step { index, name } => Some(StepInfo {
                    index: *index,
                    name: name.clone(),
                }),
                _ => None,
            })
            .collect();
        let step_snapshots: Vec<StepSnapshotReport> = o
            .step_snapshots
            .steps
            .iter()
            .map(|s| StepSnapshotReport {
                step: s.step,
                name: s.name.clone(),
                diff: s.diff.clone(),
            })
            .collect();
        let snapshot = o.snapshot.text();
        let verdicts = verdict_reports(
            &o.verdicts,
            &labels,
            &history,
            &step_snapshots,
            (Some(&o.step_snapshots.last), &snapshot),
        );
        let claims = o
            .claims
            .iter()
            .map(|c| {
                let by: Vec<String> = c.by.iter().map(|i| i.id().to_string()).collect();
                decide_claim(&c.says, by, &verdicts)
            })
            .collect();
        ScenarioReport {
            scenario: o.scenario.clone(),
            path: o.path.display().to_string(),
            dir: sanitize(&o.scenario),
            seed: o.seed,
            mutants: o.mutants.iter().map(|m| m.name().to_string()).collect(),
            driver: o.driver_name.clone(),
            passed: o.passed(),
            error: None,
            replay: o.replay.clone(),
            steps,
            verdicts,
            claims,
            expect_failures: o
                .expect_failures
                .iter()
                .map(|f| labels.apply(&format!("step {} ({}): {}", f.step, f.at, f.message)))
                .collect(),
            expect_not_exercised: o
                .expect_not_exercised
                .iter()
                .map(|f| format!("step {} ({}): {}", f.step, f.at, f.message))
                .collect(),
            unfired_faults: o
                .unfired_faults
                .iter()
                .filter(|f| !f.optional)
                .map(|f| f.message())
                .collect(),
            fault_notes: o
                .unfired_faults
                .iter()
                .filter(|f| f.optional)
                .map(|f| format!("{} (optional)", f.message()))
                .collect(),
            faults_armed: o.faults_armed,
            not_converged: o.not_converged.iter().map(|n| labels.apply(n)).collect(),
            figures: o.figures.clone(),
            scale: o.scale.clone(),
            snapshot,
            step_snapshots,
            last_step_snapshot: Some(o.step_snapshots.last.clone()),
            history,
        }
    }

    /// The report of a run the lab could not finish.
    pub fn from_error(
        name: &str,
        path: &str,
        seed: u64,
        mutants: Vec<String>,
        replay: String,
        error: String,
    ) -> Self {
        ScenarioReport {
            scenario: name.to_string(),
            path: path.to_string(),
            dir: sanitize(name),
            seed,
            mutants,
            passed: false,
            error: Some(error),
            replay,
            ..Default::default()
        }
    }

    /// Invariant ids that failed, plus `expect` when an expectation did.
    pub fn failed_names(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .verdicts
            .iter()
            .filter(|v| !v.passed)
            .map(|v| v.invariant.clone())
            .collect();
        if !self.expect_failures.is_empty() {
            out.push("expect".into());
        }
        if !self.unfired_faults.is_empty() {
            out.push("faults".into());
        }
        if self.error.is_some() {
            out.push("did not run".into());
        }
        out
    }

    /// Call ids named by any failed check (highlighted in the timeline).
    pub fn failing_calls(&self) -> Vec<u64> {
        let mut ids: Vec<u64> = self
            .verdicts
            .iter()
            .filter(|v| !v.passed)
            .flat_map(|v| v.evidence.iter().copied())
            .collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    /// Steps (0-based) during which a failed check's evidence happened.
    pub fn failing_steps(&self) -> Vec<usize> {
        let mut s: Vec<usize> = self
            .verdicts
            .iter()
            .flat_map(|v| v.failing_steps.iter().copied())
            .collect();
        s.sort_unstable();
        s.dedup();
        s
    }
}

/// Verdicts as reports: details in the history's labels, and for each
/// failure the evidence cut out of the history with the snapshot diffs of
/// the steps it happened in.
fn verdict_reports(
    verdicts: &[Verdict],
    labels: &Relabel,
    history: &[Event],
    step_snapshots: &[StepSnapshotReport],
    last_and_final: (Option<&str>, &str),
) -> Vec<VerdictReport> {
    verdicts
        .iter()
        .map(|v| {
            let mut r = VerdictReport {
                invariant: v.invariant.to_string(),
                claim: claim_of(v.invariant),
                passed: v.passed,
                exercised: v.exercised,
                details: v.details.iter().map(|d| labels.apply(d)).collect(),
                evidence: v.evidence.clone(),
                ..Default::default()
            };
            if !v.passed {
                r.slice = evidence_slice(history, &v.evidence);
                r.failing_steps = failing_steps(history, &v.evidence);
                r.diffs = snapshot_diffs(step_snapshots, last_and_final, &r.failing_steps);
            }
            r
        })
        .collect()
}

fn decide_claim(says: &str, by: Vec<String>, verdicts: &[VerdictReport]) -> ClaimReport {
    let unchecked: Vec<String> = by
        .iter()
        .filter(|b| !verdicts.iter().any(|v| &v.invariant == *b))
        .cloned()
        .collect();
    let held = by
        .iter()
        .all(|b| verdicts.iter().any(|v| &v.invariant == b && v.passed));
    let exercised = by
        .iter()
        .all(|b| verdicts.iter().any(|v| &v.invariant == b && v.exercised));
    ClaimReport {
        says: says.to_string(),
        passed: held && unchecked.is_empty() && !by.is_empty(),
        by,
        unchecked,
        exercised,
    }
}

/// One line per event, for slices and JUnit failure bodies.
pub fn event_line(e: &Event, calls: &BTreeMap<u64, (String, String, String)>) -> String {
    let t = format!("[{}]", e.at);
    match &e.kind {
        EventKind::Step { index, name } => format!("{t} step {}: {name}", index + 1),
        EventKind::Call {
            id,
            from,
            to,
            op,
            subject,
        } => {
            let subj = if subject.is_empty() {
                String::new()
            } else {
                format!(" {subject}")
            };
            format!("{t} #{} {from} → {to} {op}{subj}", id.0)
        }
        EventKind::Reply { id, outcome } => {
            let what = calls
                .get(&id.0)
                .map(|(_, _, op)| format!(" ({op})"))
                .unwrap_or_default();
            format!("{t} #{}{what} ← {}", id.0, outcome.label())
        }
        EventKind::Note { component, text } => format!("{t} note ({component}): {text}"),
        EventKind::Fault {
            call,
            fault,
            detail,
        } => match call {
            Some(c) => format!("{t} FAULT {fault} on #{}: {detail}", c.0),
            None => format!("{t} FAULT {fault}: {detail}"),
        },
    }
}

/// (from, to, op) of every call, by id.
pub fn call_index(history: &[Event]) -> BTreeMap<u64, (String, String, String)> {
    history
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::Call {
                id, from, to, op, ..
            } => Some((id.0, (from.to_string(), to.to_string(), op.clone()))),
            _ => None,
        })
        .collect()
}

/// The minimal history that shows a violation: the evidence calls and their
/// replies, and every fault, note and step header between the first of them
/// and the last reply — other calls in that window are left out.
pub fn evidence_slice(history: &[Event], evidence: &[u64]) -> Vec<String> {
    if evidence.is_empty() {
        return Vec::new();
    }
    let is_ev = |id: u64| evidence.contains(&id);
    let touches = |e: &Event| match &e.kind {
        EventKind::Call { id, .. } | EventKind::Reply { id, .. } => is_ev(id.0),
        EventKind::Fault { call: Some(c), .. } => is_ev(c.0),
        _ => false,
    };
    let first = history.iter().position(touches);
    let last = history.iter().rposition(touches);
    let (Some(first), Some(last)) = (first, last) else {
        return vec![format!(
            "(calls {} are not in the history)",
            evidence
                .iter()
                .map(|c| format!("#{c}"))
                .collect::<Vec<_>>()
                .join(" ")
        )];
    };
    let calls = call_index(history);
    let mut out = Vec::new();
    // The step the first evidence call ran in, so the slice says where it is.
    if let Some(step) = history[..first]
        .iter()
        .rev()
        .find(|e| matches!(e.kind, EventKind::Step { .. }))
    {
        out.push(event_line(step, &calls));
    }
    for e in &history[first..=last] {
        let keep = touches(e)
            || matches!(
                e.kind,
                EventKind::Fault { .. } | EventKind::Note { .. } | EventKind::Step { .. }
            );
        if keep {
            out.push(event_line(e, &calls));
        }
    }
    out
}

/// 0-based indexes of the steps the evidence calls were made in, in order.
pub fn failing_steps(history: &[Event], evidence: &[u64]) -> Vec<usize> {
    let mut step = None;
    let mut out = Vec::new();
    for e in history {
        match &e.kind {
            EventKind::Step { index, .. } => step = Some(*index),
            EventKind::Call { id, .. } if evidence.contains(&id.0) => {
                if let Some(s) = step {
                    if !out.contains(&s) {
                        out.push(s);
                    }
                }
            }
            _ => {}
        }
    }
    out
}

/// A diff per failing step (before it → after it); a step without a snapshot
/// of its own (`expect:`, the final convergence) compares the last step's
/// snapshot with the final one, once. `last_and_final`: those two texts (the
/// first `None` in a report that predates it).
fn snapshot_diffs(
    steps: &[StepSnapshotReport],
    last_and_final: (Option<&str>, &str),
    failing: &[usize],
) -> Vec<SnapshotDiff> {
    let mut out: Vec<SnapshotDiff> = Vec::new();
    let mut final_done = false;
    for &i in failing {
        match steps.iter().position(|s| s.step == i) {
            Some(pos) => {
                let before_label = match pos.checked_sub(1).and_then(|p| steps.get(p)) {
                    Some(b) => format!("after step {} ({})", b.step + 1, b.name),
                    None => "before the first step".to_string(),
                };
                let a = &steps[pos];
                let mut label = format!("{before_label} → after step {} ({})", a.step + 1, a.name);
                // A report from before steps kept diffs has none to show.
                if last_and_final.0.is_none() {
                    label.push_str(": not recorded (this report predates it)");
                }
                out.push(SnapshotDiff {
                    label,
                    lines: a.diff.clone(),
                });
            }
            None if !final_done => {
                final_done = true;
                out.push(last_vs_final(steps, last_and_final));
            }
            None => {}
        }
    }
    if failing.is_empty() {
        out.push(last_vs_final(steps, last_and_final));
    }
    out
}

fn last_vs_final(
    steps: &[StepSnapshotReport],
    (last, final_snapshot): (Option<&str>, &str),
) -> SnapshotDiff {
    match steps.last() {
        Some(l) => {
            let label = format!(
                "after step {} ({}) → final (after healing and the last convergence)",
                l.step + 1,
                l.name
            );
            match last {
                Some(last) => SnapshotDiff {
                    label,
                    lines: line_diff(last, final_snapshot, STEP_DIFF_CONTEXT),
                },
                None => SnapshotDiff {
                    label: format!("{label}: not recorded (this report predates it)"),
                    lines: Vec::new(),
                },
            }
        }
        None => SnapshotDiff {
            label: "final snapshot".into(),
            lines: line_diff("", final_snapshot, STEP_DIFF_CONTEXT),
        },
    }
}

/// Label any hex run of 16+ characters the engine's normaliser left in (e.g.
/// checkpoint names derived from keys of accesses gone by the end) as
/// `<id-N>` in first-seen order, so reports stay byte-identical per seed.
pub fn scrub_residual_ids(text: &str) -> String {
    let mut seen: Vec<String> = Vec::new();
    let mut out = String::with_capacity(text.len());
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let start = i;
        while i < bytes.len() && bytes[i].is_ascii_hexdigit() {
            i += 1;
        }
        let run = &text[start..i];
        let bounded = |b: Option<&u8>| b.is_none_or(|c| !c.is_ascii_alphanumeric());
        // Only a whole word of hex with at least one digit and one letter-free
        // stretch long enough to be random; `<digest-1>`-style labels are not hex runs.
        if run.len() >= 16
            && bounded(start.checked_sub(1).and_then(|p| bytes.get(p)))
            && bounded(bytes.get(i))
            && run.bytes().any(|b| b.is_ascii_digit())
        {
            let n = match seen.iter().position(|s| s == run) {
                Some(p) => p + 1,
                None => {
                    seen.push(run.to_string());
                    seen.len()
                }
            };
            out.push_str(&format!("<id-{n}>"));
        } else {
            out.push_str(run);
        }
        if i < bytes.len() {
            // Copy one whole character (may be multi-byte).
            let ch = text[i..].chars().next().unwrap_or(' ');
            out.push(ch);
            i += ch.len_utf8();
        }
    }
    out
}

/// Raw id → label, learnt by lining up the raw history with the labelled one
/// (same events, same order; only ids differ). The raw history never holds a
/// secret, so nothing learnt here can put one into a report.
#[derive(Default, Debug)]
pub struct Relabel {
    pairs: Vec<(String, String)>,
}

impl Relabel {
    /// Learn from every string field of paired events.
    pub fn from_histories(raw: &EventLog, labelled: &[Event]) -> Self {
        let mut map: BTreeMap<String, String> = BTreeMap::new();
        let mut conflicts: Vec<String> = Vec::new();
        for (r, l) in raw.iter().zip(labelled) {
            for (rs, ls) in strings(&r.kind).into_iter().zip(strings(&l.kind)) {
                if rs == ls {
                    continue;
                }
                for (raw_id, label) in align(rs, ls) {
                    match map.get(&raw_id) {
                        Some(existing) if existing != &label => conflicts.push(raw_id),
                        Some(_) => {}
                        None => {
                            map.insert(raw_id, label);
                        }
                    }
                }
            }
        }
        for c in conflicts {
            map.remove(&c);
        }
        // Longest first, so an id that contains another is replaced whole.
        let mut pairs: Vec<(String, String)> =
            map.into_iter().filter(|(k, _)| k.len() >= 6).collect();
        pairs.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.0.cmp(&b.0)));
        Relabel { pairs }
    }

    /// `text` with every learnt raw id replaced by its label.
    pub fn apply(&self, text: &str) -> String {
        let mut out = text.to_string();
        for (raw, label) in &self.pairs {
            if out.contains(raw.as_str()) {
                out = out.replace(raw.as_str(), label);
            }
        }
        out
    }
}

fn strings(k: &EventKind) -> Vec<&str> {
    match k {
        EventKind::Step { name, .. } => vec![name],
        EventKind::Call { op, subject, .. } => vec![op, subject],
        EventKind::Reply { outcome, .. } => match outcome {
            drivelab_fakes::history::Outcome::Grpc { message, .. } => vec![message],
            drivelab_fakes::history::Outcome::NoReply { reason } => vec![reason],
            _ => vec![],
        },
        EventKind::Note { text, .. } => vec![text],
        EventKind::Fault { detail, .. } => vec![detail],
    }
}

/// Match a labelled string (`ba-<uid-2>/x`) against its raw original
/// (`ba-1f2e…/x`): literal parts must agree; each `<label>` takes the raw text
/// up to the next literal part. Returns nothing unless the whole string lines up.
fn align(raw: &str, labelled: &str) -> Vec<(String, String)> {
    // Split the labelled string into literal and label pieces.
    let mut pieces: Vec<(bool, &str)> = Vec::new();
    let mut rest = labelled;
    while let Some(start) = rest.find('<') {
        let Some(len) = rest[start..].find('>') else {
            break;
        };
        let label = &rest[start..start + len + 1];
        let inner = &label[1..label.len() - 1];
        // Only `<word-…>` tokens are labels; other `<` are literal text.
        if inner.is_empty() || !inner.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
            pieces.push((false, &rest[..start + 1]));
            rest = &rest[start + 1..];
            continue;
        }
        if start > 0 {
            pieces.push((false, &rest[..start]));
        }
        pieces.push((true, label));
        rest = &rest[start + len + 1..];
    }
    if !rest.is_empty() {
        pieces.push((false, rest));
    }
    let mut out = Vec::new();
    let mut pos = 0usize;
    let mut i = 0;
    while i < pieces.len() {
        let (is_label, text) = pieces[i];
        if !is_label {
            if !raw[pos..].starts_with(text) {
                return Vec::new();
            }
            pos += text.len();
            i += 1;
            continue;
        }
        let end = match pieces.get(i + 1) {
            Some((false, next)) => match raw[pos..].find(next) {
                Some(off) => pos + off,
                None => return Vec::new(),
            },
            Some((true, _)) => return Vec::new(), // two labels back to back: ambiguous
            None => raw.len(),
        };
        if end == pos {
            return Vec::new();
        }
        out.push((raw[pos..end].to_string(), text.to_string()));
        pos = end;
        i += 1;
    }
    if pos != raw.len() {
        return Vec::new();
    }
    out
}

/// One row of the run's claims table.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ClaimRow {
    /// The claim in words.
    pub says: String,
    /// `invariant` for a checked invariant, `scenario` for a scenario-stated claim.
    pub source: String,
    /// Invariant ids that decide it.
    pub by: Vec<String>,
    /// Held in every scenario that checks it.
    pub holds: bool,
    /// Scenarios in which it was checked and held.
    pub established_by: Vec<String>,
    /// Scenarios in which it was checked and broke (or was not fully checked).
    pub broken_in: Vec<String>,
    /// Scenarios that checked it but had nothing to judge: they establish nothing.
    #[serde(default)]
    pub not_exercised_in: Vec<String>,
}

fn yes() -> bool {
    true
}

impl VerdictReport {
    /// `pass`, `FAIL` or `not exercised`.
    pub fn state(&self) -> &'static str {
        match (self.passed, self.exercised) {
            (false, _) => "FAIL",
            (true, true) => "pass",
            (true, false) => "not exercised",
        }
    }
}

/// The claims table over a set of scenario reports: invariants first (in the
/// documented order), then the scenarios' own claims grouped by wording.
pub fn claims_table(reports: &[ScenarioReport]) -> Vec<ClaimRow> {
    let mut rows = Vec::new();
    let mut ids: Vec<String> = Invariant::all()
        .iter()
        .map(|i| i.id().to_string())
        .collect();
    // Ids a newer engine reports that this list does not know yet still get a row.
    for r in reports {
        for v in &r.verdicts {
            if !ids.contains(&v.invariant) {
                ids.push(v.invariant.clone());
            }
        }
    }
    for id in ids {
        let mut row = ClaimRow {
            says: claim_of(&id),
            source: "invariant".into(),
            by: vec![id.clone()],
            holds: true,
            established_by: vec![],
            broken_in: vec![],
            not_exercised_in: vec![],
        };
        for r in reports {
            if let Some(v) = r.verdicts.iter().find(|v| v.invariant == id) {
                match (v.passed, v.exercised) {
                    (true, true) => row.established_by.push(r.scenario.clone()),
                    (true, false) => row.not_exercised_in.push(r.scenario.clone()),
                    (false, _) => row.broken_in.push(r.scenario.clone()),
                }
            }
        }
        if row.established_by.is_empty()
            && row.broken_in.is_empty()
            && row.not_exercised_in.is_empty()
        {
            continue;
        }
        row.holds = row.broken_in.is_empty();
        rows.push(row);
    }
    let mut stated: Vec<ClaimRow> = Vec::new();
    for r in reports {
        for c in &r.claims {
            let pos = stated.iter().position(|s| s.says == c.says && s.by == c.by);
            let row = match pos {
                Some(p) => &mut stated[p],
                None => {
                    stated.push(ClaimRow {
                        says: c.says.clone(),
                        source: "scenario".into(),
                        by: c.by.clone(),
                        holds: true,
                        established_by: vec![],
                        broken_in: vec![],
                        not_exercised_in: vec![],
                    });
                    let last = stated.len() - 1;
                    &mut stated[last]
                }
            };
            if c.passed && !c.exercised {
                row.not_exercised_in.push(r.scenario.clone());
            } else if c.passed {
                row.established_by.push(r.scenario.clone());
            } else {
                row.broken_in.push(r.scenario.clone());
                row.holds = false;
            }
        }
    }
    rows.extend(stated);
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_diffs_come_from_the_trail_and_old_reports_say_theirs_were_not_kept() {
        let kept = StepSnapshotReport {
            step: 0,
            name: "create".into(),
            diff: vec!["+ a".into()],
        };
        // Failing steps 0 (snapshotted) and 1 (the final convergence).
        let d = snapshot_diffs(
            std::slice::from_ref(&kept),
            (Some("a\n"), "a\nb\n"),
            &[0, 1],
        );
        assert_eq!(d[0].lines, vec!["+ a"]);
        assert_eq!(d[1].lines, vec!["  a", "+ b"]);
        assert!(!d[0].label.contains("not recorded"));
        // run.json from before: full texts, no last step snapshot.
        let old: StepSnapshotReport =
            serde_json::from_str(r#"{"step":0,"name":"create","text":"a\n"}"#).unwrap();
        let d = snapshot_diffs(&[old], (None, "a\nb\n"), &[0, 1]);
        for diff in &d {
            assert!(
                diff.label
                    .ends_with("not recorded (this report predates it)"),
                "{}",
                diff.label
            );
            assert!(diff.lines.is_empty());
        }
    }

    #[test]
    fn diff_shows_rotation() {
        let d = line_diff("a\nsecret <secret-A>\nb\n", "a\nsecret <secret-B>\nb\n", 1);
        assert_eq!(
            d,
            vec!["  a", "- secret <secret-A>", "+ secret <secret-B>", "  b"]
        );
        assert!(line_diff("x\n", "x\n", 3).is_empty());
    }

    #[test]
    fn align_learns_labels() {
        assert_eq!(
            align("ba-1234-abcd/x", "ba-<uid-2>/x"),
            vec![("1234-abcd".to_string(), "<uid-2>".to_string())]
        );
        assert_eq!(align("a b", "a <key-1> c"), vec![]);
        assert_eq!(
            align("k AKIA1 and s", "k <key-1> and s"),
            vec![("AKIA1".to_string(), "<key-1>".to_string())]
        );
    }

    #[test]
    fn residual_ids_are_labelled() {
        assert_eq!(
            scrub_residual_ids("ns/key-01dad3456ea9c758 x 01dad3456ea9c758 é"),
            "ns/key-<id-1> x <id-1> é"
        );
        assert_eq!(scrub_residual_ids("deadbeefdeadbeefX"), "deadbeefdeadbeefX");
    }

    #[test]
    fn sanitize_never_escapes() {
        assert_eq!(sanitize("../x"), "___x");
        assert_eq!(sanitize(""), "_");
    }
}
