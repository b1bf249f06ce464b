//! What every system's checks share: the verdict a check returns (pass, fail
//! or not exercised, with the calls that show it) and the secret scan behind
//! no-secret-leak. The checks themselves live with their system
//! (`crate::systems::*::checks`), each a pure function of its observations.

use std::collections::HashMap;

use drivelab_fakes::history::{CallId, EventLog};
use drivelab_fakes::secret::Secret;
use serde::{Deserialize, Serialize};

use crate::prefixed::Prefixed;
use crate::scenario::Invariant;
use crate::snapshot::Normalizer;

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

/// The texts one run leaves behind besides its history, each searched for
/// the run's secrets (both labs list them here, so a new one is searched in
/// every system).
pub struct RunTexts<'a> {
    /// The final snapshot.
    pub snapshot: &'a crate::packed::Packed,
    /// The lab's log lines for this run.
    pub log: &'a str,
    /// What external drivers wrote (empty ones are not listed).
    pub driver_outputs: &'a [&'a str],
}

impl LeakScan {
    /// Search a run's texts and its history, both as recorded (ids raw) and
    /// as reports write it (ids labelled by `norm`), under the names its
    /// findings give. Returns the labelled history too: it is made a line
    /// at a time while both forms are searched, so neither is held whole
    /// (the labelled one packed).
    pub fn of_run(
        all: &[Secret],
        texts: &RunTexts<'_>,
        history: &EventLog,
        norm: &mut Normalizer,
    ) -> (Self, crate::packed::Packed) {
        let mut scan = Scanner::new(all);
        crate::phases::phase("leak scan automaton");
        scan.lines("snapshot", texts.snapshot);
        let raw = scan.artifact("history");
        let labelled = scan.artifact("history (normalised)");
        let history_text = norm.json_all(history, |r, l| {
            scan.feed(raw, r);
            scan.feed(labelled, l);
        });
        scan.whole("log", texts.log);
        for out in texts.driver_outputs.iter().filter(|out| !out.is_empty()) {
            scan.whole("driver output", out);
        }
        (scan.finish(), history_text)
    }

    /// Search every artifact (name, text) for every secret of the run. Borrowed
    /// texts do: a run's history is its largest text, held once.
    pub fn run<N: AsRef<str>, T: AsRef<str>>(all: &[Secret], artifacts: &[(N, T)]) -> Self {
        let mut scan = Scanner::new(all);
        for (name, text) in artifacts {
            scan.whole(name.as_ref(), text.as_ref());
        }
        scan.finish()
    }
}

/// One automaton over every secret of a run, fed each artifact whole or in
/// pieces that end at line ends. Searching each secret separately made the
/// scan O(secrets × text), quadratic in a run's size.
struct Scanner {
    /// Each distinct secret → its places among the run's secrets; `None`
    /// when they could not be compiled (then nothing is searched).
    found: Option<Prefixed<Vec<u32>>>,
    scan: LeakScan,
    /// Per artifact: lines fed so far, and each secret's first line.
    seen: Vec<(usize, std::collections::BTreeMap<usize, usize>)>,
}

/// An artifact a [`Scanner`] was told of, by its place in the findings.
#[derive(Clone, Copy)]
struct Artifact(usize);

impl Scanner {
    fn new(all: &[Secret]) -> Self {
        // Very short values would match by accident; real secrets here are ≥ 16 chars.
        let secrets: Vec<&Secret> = all.iter().filter(|s| s.expose().len() >= 8).collect();
        let mut scan = LeakScan {
            secrets: secrets.len(),
            ..Default::default()
        };
        let mut places: HashMap<&[u8], Vec<u32>> = HashMap::new();
        for (i, s) in secrets.iter().enumerate() {
            places
                .entry(s.expose().as_bytes())
                .or_default()
                .push(i as u32);
        }
        let found = Prefixed::new(places.into_iter().map(|(s, p)| (s.into(), p)).collect())
            .map_err(|e| scan.error = Some(format!("secret matcher could not be built: {e}")))
            .ok();
        Self {
            found,
            scan,
            seen: Vec::new(),
        }
    }

    fn artifact(&mut self, name: &str) -> Artifact {
        self.scan.artifacts.push(name.to_string());
        self.seen.push(Default::default());
        Artifact(self.seen.len() - 1)
    }

    fn whole(&mut self, name: &str, text: &str) {
        let a = self.artifact(name);
        self.feed(a, text);
    }

    /// Search a packed text, a line at a time as it is unpacked.
    fn lines(&mut self, name: &str, text: &crate::packed::Packed) {
        use std::io::BufRead as _;
        let a = self.artifact(name);
        let mut reader = std::io::BufReader::new(text.reader());
        let mut line = String::new();
        // Only texts this process packed are read, from memory: they
        // decode, as UTF-8 (written from &str pieces).
        while matches!(reader.read_line(&mut line), Ok(n) if n > 0) {
            self.feed(a, &line);
            line.clear();
        }
    }

    /// Search the next piece of `a`; a piece ends at a line end or the text's end.
    fn feed(&mut self, a: Artifact, piece: &str) {
        let Some(found) = &self.found else { return };
        let (lines, first) = &mut self.seen[a.0];
        let piece = piece.as_bytes();
        found.each_in(piece, |f| {
            for &place in f.value {
                first.entry(place as usize).or_insert_with(|| {
                    *lines + memchr::memchr_iter(b'\n', &piece[..f.start]).count() + 1
                });
            }
        });
        *lines += memchr::memchr_iter(b'\n', piece).count();
    }

    /// First occurrence of each secret, by artifact, in secret order.
    fn finish(mut self) -> LeakScan {
        for (name, (_, first)) in self.scan.artifacts.iter().zip(&self.seen) {
            for (i, line) in first {
                self.scan.findings.push(format!(
                    "{name}:{line}: contains secret #{} of this run",
                    i + 1
                ));
            }
        }
        self.scan
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

#[cfg(test)]
mod tests {
    use drivelab_fakes::clock::SimClock;
    use drivelab_fakes::history::{Component, EventKind, History};

    use super::*;

    /// The scan finds each secret's first line as a search for that secret
    /// alone does: secrets sharing a prefix (a token's fixed header), of
    /// several lengths, one inside another, overlapping, twice in the list,
    /// too short to search, and prefixes that occur without their secret.
    #[test]
    fn the_scan_finds_what_a_search_for_each_secret_finds() {
        use proptest::prelude::*;
        let secret = proptest::collection::vec(
            prop_oneof![Just("eyJhbGci".to_string()), "[ab]{1,3}", "[a-c0-9]{4,12}"],
            1..4,
        )
        .prop_map(|parts| parts.concat());
        let text = proptest::collection::vec(
            prop_oneof![
                Just("eyJhbGci".to_string()),
                "[a-c0-9]{0,12}",
                Just("\n".into())
            ],
            0..40,
        )
        .prop_map(|parts| parts.concat());
        proptest!(|(secrets in proptest::collection::vec(secret, 1..8),
                    texts in proptest::collection::vec(text, 1..3))| {
            // Plant each secret somewhere, so most are found.
            let mut texts = texts;
            for (i, s) in secrets.iter().enumerate() {
                let n = texts.len();
                let t = &mut texts[i % n];
                let at = (i * 7) % (t.len() + 1);
                t.insert_str(at, s);
            }
            let all: Vec<Secret> = secrets.iter().map(|s| Secret::new(s.clone())).collect();
            let artifacts: Vec<(String, &str)> = texts
                .iter()
                .enumerate()
                .map(|(i, t)| (format!("t{i}"), t.as_str()))
                .collect();
            let mut want = Vec::new();
            for (name, text) in &artifacts {
                let searched = all.iter().map(Secret::expose).filter(|s| s.len() >= 8);
                for (i, s) in searched.enumerate() {
                    if let Some(at) = text.find(s) {
                        let line = text[..at].matches('\n').count() + 1;
                        want.push(format!("{name}:{line}: contains secret #{} of this run", i + 1));
                    }
                }
            }
            let got = LeakScan::run(&all, &artifacts);
            prop_assert_eq!(got.findings, want);
            prop_assert_eq!(got.error, None);
        });
    }

    /// A history long enough to be scanned in several pieces, with two
    /// secrets in it: one the normaliser labels, one it does not know.
    #[test]
    fn a_history_scanned_in_pieces_is_found_where_the_whole_text_has_it() {
        let (known, unknown) = (
            Secret::new("known-secret-0123456789"),
            Secret::new("unknown-secret-abcdefgh"),
        );
        let h = History::new(SimClock::new());
        for i in 0..5_000 {
            let text = match i {
                3_000 => format!("handed out {}", known.expose()),
                4_321 => format!("leaked {} here", unknown.expose()),
                _ => format!("note {i}"),
            };
            h.record(EventKind::Note {
                component: Component::Lab,
                text,
            });
        }
        let events = h.take_events();
        let mut norm = Normalizer::default();
        norm.secret(&known);
        let all = [known.clone(), unknown.clone()];
        // The snapshot is read a line at a time as it is unpacked.
        let snapshot = "claims:\nsecrets:\n  a: unknown-secret-abcdefgh\n";
        let packed_snapshot = crate::packed::Packed::new(snapshot);
        let texts = RunTexts {
            snapshot: &packed_snapshot,
            log: "",
            driver_outputs: &["", "driver said unknown-secret-abcdefgh"],
        };
        let (scan, labelled) = LeakScan::of_run(&all, &texts, &events, &mut norm);
        let labelled = labelled.text();

        // The same findings as a scan of the whole texts, which the
        // history's lines fed one piece at a time must give.
        let raw = serde_json::to_string_pretty(&events).unwrap();
        assert!(raw.len() > 4 * 64 * 1024);
        let whole = LeakScan::run(
            &all,
            &[
                ("snapshot", snapshot),
                ("history", raw.as_str()),
                ("history (normalised)", labelled.as_str()),
                ("log", ""),
                ("driver output", texts.driver_outputs[1]),
            ],
        );
        assert_eq!(scan, whole);
        let line = |needle: &str| raw.lines().position(|l| l.contains(needle)).unwrap() + 1;
        assert_eq!(
            scan.findings,
            [
                "snapshot:3: contains secret #2 of this run".to_string(),
                format!(
                    "history:{}: contains secret #1 of this run",
                    line("handed out")
                ),
                format!("history:{}: contains secret #2 of this run", line("leaked")),
                format!(
                    "history (normalised):{}: contains secret #2 of this run",
                    line("leaked")
                ),
                "driver output:1: contains secret #2 of this run".to_string(),
            ]
        );
        assert!(labelled.contains("handed out <secret-A>"));
    }
}
