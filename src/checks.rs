//! What every system's checks share: the verdict a check returns (pass, fail
//! or not exercised, with the calls that show it) and the secret scan behind
//! no-secret-leak. The checks themselves live with their system
//! (`crate::systems::*::checks`), each a pure function of its observations.

use drivelab_fakes::history::CallId;
use drivelab_fakes::secret::Secret;
use serde::{Deserialize, Serialize};

use crate::scenario::Invariant;

/// A check's result.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Verdict {
    /// Which invariant.
    pub invariant: &'static str,
    /// Passed? (A check with nothing to judge passes vacuously: see `exercised`.)
    pub passed: bool,
    /// False when the check had nothing to judge in this run (no probes, no
    /// repeated requests, no secrets handed out…): "not exercised", never
    /// reported as holding.
    pub exercised: bool,
    /// What was checked (on pass) or what broke (on fail), one line each.
    pub details: Vec<String>,
    /// History call ids that show the violation.
    pub evidence: Vec<u64>,
}

impl Verdict {
    pub(crate) fn new(invariant: Invariant) -> Self {
        Self {
            invariant: invariant.id(),
            passed: true,
            exercised: true,
            details: Vec::new(),
            evidence: Vec::new(),
        }
    }
    pub(crate) fn fail(&mut self, detail: String, calls: impl IntoIterator<Item = CallId>) {
        self.passed = false;
        self.details.push(detail);
        self.evidence.extend(calls.into_iter().map(|c| c.0));
    }
    /// Close the verdict: `judged` is how many things the check looked at;
    /// none means it was not exercised (unless it already failed).
    pub(crate) fn finish(mut self, judged: usize, checked: String) -> Self {
        if self.passed {
            self.exercised = judged > 0;
            self.details.push(checked);
        }
        self.evidence.sort_unstable();
        self.evidence.dedup();
        self
    }
}

/// What the secret scan found. It runs where the run's raw secrets still
/// are, at the end of the run; its findings are what a record keeps (a record
/// holds no secret values), and no-secret-leak judges them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeakScan {
    /// Secrets searched for.
    pub secrets: usize,
    /// Artifacts searched, by name.
    pub artifacts: Vec<String>,
    /// `artifact:line: contains secret #N of this run`, one per secret found.
    pub findings: Vec<String>,
    /// The scan could not run (then nothing was searched).
    pub error: Option<String>,
}

/// The texts one run leaves behind, each searched for the run's secrets
/// (both labs list them here, so a new one is searched in every system).
pub struct RunTexts<'a> {
    /// The final snapshot.
    pub snapshot: &'a str,
    /// The history as recorded (ids raw).
    pub history: &'a str,
    /// The history as reports write it (ids labelled).
    pub history_normalised: &'a str,
    /// The lab's log lines for this run.
    pub log: &'a str,
    /// What external drivers wrote (empty ones are not listed).
    pub driver_outputs: &'a [&'a str],
}

impl LeakScan {
    /// Search a run's texts, under the names its findings give.
    pub fn of_run(all: &[Secret], texts: &RunTexts<'_>) -> Self {
        let mut artifacts = vec![
            ("snapshot", texts.snapshot),
            ("history", texts.history),
            ("history (normalised)", texts.history_normalised),
            ("log", texts.log),
        ];
        artifacts.extend(
            texts
                .driver_outputs
                .iter()
                .filter(|out| !out.is_empty())
                .map(|out| ("driver output", *out)),
        );
        Self::run(all, &artifacts)
    }

    /// Search every artifact (name, text) for every secret of the run. Borrowed
    /// texts do: a run's history is its largest text, held once.
    pub fn run<N: AsRef<str>, T: AsRef<str>>(all: &[Secret], artifacts: &[(N, T)]) -> Self {
        // Very short values would match by accident; real secrets here are ≥ 16 chars.
        let secrets: Vec<&Secret> = all.iter().filter(|s| s.expose().len() >= 8).collect();
        let mut scan = LeakScan {
            secrets: secrets.len(),
            artifacts: artifacts
                .iter()
                .map(|(name, _)| name.as_ref().to_string())
                .collect(),
            ..Default::default()
        };
        // One automaton over every secret, one pass per artifact: searching each
        // secret separately made this O(secrets × text), quadratic in a run's size.
        let ac = aho_corasick::AhoCorasick::builder()
            .match_kind(aho_corasick::MatchKind::Standard)
            .build(secrets.iter().map(|s| s.expose()));
        let ac = match ac {
            Ok(ac) => ac,
            Err(e) => {
                scan.error = Some(format!("secret matcher could not be built: {e}"));
                return scan;
            }
        };
        for (name, text) in artifacts {
            let (name, text) = (name.as_ref(), text.as_ref());
            // First occurrence of each secret, reported in secret order.
            let mut first = std::collections::BTreeMap::new();
            for m in ac.find_overlapping_iter(text) {
                first.entry(m.pattern().as_usize()).or_insert(m.start());
            }
            for (i, pos) in first {
                let line = text[..pos].matches('\n').count() + 1;
                scan.findings.push(format!(
                    "{name}:{line}: contains secret #{} of this run",
                    i + 1
                ));
            }
        }
        scan
    }
}

/// no-secret-leak, from what the scan found.
pub(crate) fn no_secret_leak(scan: &LeakScan) -> Verdict {
    let mut v = Verdict::new(Invariant::NoSecretLeak);
    if let Some(e) = &scan.error {
        v.fail(e.clone(), []);
    }
    for f in &scan.findings {
        v.fail(f.clone(), []);
    }
    v.finish(
        scan.secrets,
        format!(
            "{} secrets searched for in {} artifacts; none found",
            scan.secrets,
            scan.artifacts.len()
        ),
    )
}
