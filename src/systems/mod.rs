//! The systems a scenario can stand up, one folder each: its scenario
//! section, its lab (what it stands up and how it applies its steps), its
//! observations and checks, and its ownership snapshot. The shared run loop
//! (`crate::engine`) drives every one; [`run`] and [`Observed`] are where each
//! is registered.

pub mod bosh;
pub mod cosi;
pub mod csi;

use drivelab_fakes::history::EventLog;
use serde::{Deserialize, Serialize};

use crate::checks::Verdict;
use crate::engine::{RunOptions, RunOutcome};
use crate::packed::{Packed, PackedWriter};
use crate::scenario::{Invariant, Mutant, Scenario, System};

/// Stand up the scenario's system, run its steps and judge it.
pub(crate) async fn run(
    scn: &Scenario,
    opts: &RunOptions,
    seed: u64,
    mutants: &[Mutant],
) -> anyhow::Result<RunOutcome> {
    match scn.system() {
        System::Cosi => cosi::run(scn, opts, seed, mutants).await,
        System::Csi => csi::run(scn, opts, seed, mutants).await,
    }
}

/// What one system's checks read at the end of a run.
#[derive(Clone, Debug, Serialize)]
#[serde(tag = "system", content = "observations", rename_all = "lowercase")]
pub enum Observed {
    /// A COSI run.
    Cosi(Box<cosi::checks::Observations>),
    /// A CSI run (with or without the BOSH backend).
    Csi(Box<csi::checks::CsiObservations>),
}

/// The version of [`Record`]'s form; a record of another form is not re-judged.
/// 2: CSI samples are written as what changed since the sample before.
pub const RECORD_FORMAT: u32 = 2;

/// What a run's judgement rests on, besides its history: the checks asked
/// for and the observations they read. Every run is judged from this record
/// as written (secrets as keyed fingerprints), so `drivelab report RUN`
/// judges a stored run exactly as the run did — or, after the checks
/// change, as they now would.
#[derive(Clone, Debug, Serialize)]
pub struct Record {
    /// [`RECORD_FORMAT`] when written.
    pub format: u32,
    /// The checks the scenario asks for, in its order.
    pub invariants: Vec<Invariant>,
    /// Checks that fail when they had nothing to judge (`require_exercised`).
    pub require_exercised: Vec<Invariant>,
    /// What they read.
    #[serde(flatten)]
    pub observed: Observed,
}

/// Read by hand, not derived: a derived read of the flattened `observed`
/// buffers every observation as an untyped tree before typing it, which was
/// a twelfth of a 2,000-grant run's peak memory. The written form puts
/// `system` before `observations`, so each is read once, straight into its
/// type; a record whose keys were sorted since is read through a tree.
impl<'de> Deserialize<'de> for Record {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(RecordVisitor)
    }
}

struct RecordVisitor;

impl<'de> serde::de::Visitor<'de> for RecordVisitor {
    type Value = Record;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a run's record")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Record, A::Error> {
        use serde::de::Error;
        /// `Observed`'s tag, as its derived `Serialize` writes it.
        #[derive(Deserialize)]
        #[serde(rename_all = "lowercase")]
        enum Tag {
            Cosi,
            Csi,
        }
        let mut format = None;
        let mut invariants = None;
        let mut require_exercised = None;
        let mut system = None;
        let mut observed = None;
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "format" => format = Some(map.next_value()?),
                "invariants" => invariants = Some(map.next_value()?),
                "require_exercised" => require_exercised = Some(map.next_value()?),
                "system" => system = Some(map.next_value()?),
                "observations" => {
                    observed = Some(match system {
                        Some(Tag::Cosi) => Ok(Observed::Cosi(map.next_value()?)),
                        Some(Tag::Csi) => Ok(Observed::Csi(map.next_value()?)),
                        // A record rewritten by a tool that sorts keys: kept
                        // untyped until its system is known.
                        None => Err(map.next_value::<serde_json::Value>()?),
                    })
                }
                _ => {
                    map.next_value::<serde::de::IgnoredAny>()?;
                }
            }
        }
        let typed = |v: serde_json::Value, system: Option<Tag>| {
            let observed = match system {
                Some(Tag::Cosi) => serde_json::from_value(v).map(Observed::Cosi),
                Some(Tag::Csi) => serde_json::from_value(v).map(Observed::Csi),
                None => return Err(A::Error::missing_field("system")),
            };
            observed.map_err(A::Error::custom)
        };
        let observed = match observed {
            Some(Ok(o)) => o,
            Some(Err(untyped)) => typed(untyped, system)?,
            None => return Err(A::Error::missing_field("observations")),
        };
        Ok(Record {
            format: format.ok_or_else(|| A::Error::missing_field("format"))?,
            invariants: invariants.ok_or_else(|| A::Error::missing_field("invariants"))?,
            require_exercised: require_exercised
                .ok_or_else(|| A::Error::missing_field("require_exercised"))?,
            observed,
        })
    }
}

/// Why a stored record cannot be judged.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// It does not parse.
    #[error("the run's record does not parse: {0}")]
    Parse(#[from] serde_json::Error),
    /// Another drivelab wrote it.
    #[error("the run's record has form {0}; this drivelab reads form {RECORD_FORMAT}")]
    Format(u32),
}

impl Record {
    /// The record of a run of `scn`.
    pub fn new(scn: &Scenario, observed: Observed) -> Self {
        Self {
            format: RECORD_FORMAT,
            invariants: scn.invariants.clone(),
            require_exercised: scn.require_exercised.clone(),
            observed,
        }
    }

    /// Write the record (secrets fingerprinted under a key drawn now and
    /// never kept), read it back and judge what was read: the verdicts and
    /// the text to store.
    pub fn seal_and_judge(self, history: &EventLog) -> anyhow::Result<(Packed, Vec<Verdict>)> {
        let key: [u8; 32] = rand::random();
        let mut text = PackedWriter::new();
        drivelab_fakes::secret::fingerprinting(key, || serde_json::to_writer(&mut text, &self))
            .map_err(|e| anyhow::anyhow!("writing the run's record: {e}"))?;
        let text = text.finish();
        // What is judged is what was read back; the written copy would only
        // double the largest run's peak memory while it is read. Read as it
        // is unpacked: the text is never held whole.
        drop(self);
        // Equal values the run held once are read as one again.
        let record: Record = drivelab_fakes::shared::reading(|| {
            serde_json::from_reader(std::io::BufReader::new(text.reader()))
        })
        .map_err(RecordError::from)?;
        let verdicts = record.judge_read_back(history)?;
        Ok((text, verdicts))
    }

    /// Judge a record read back, if this drivelab's form.
    fn judge_read_back(self, history: &EventLog) -> Result<Vec<Verdict>, RecordError> {
        if self.format != RECORD_FORMAT {
            return Err(RecordError::Format(self.format));
        }
        Ok(self.judge(history))
    }

    /// Judge: every invariant asked for, in order, over the observations and
    /// the run's history.
    pub fn judge(self, history: &EventLog) -> Vec<Verdict> {
        let mut verdicts: Vec<Verdict> = match self.observed {
            Observed::Cosi(obs) => self
                .invariants
                .iter()
                .map(|i| cosi::checks::check(*i, &obs))
                .collect(),
            Observed::Csi(obs) => {
                let obs = obs.with_history(history);
                self.invariants
                    .iter()
                    .map(|i| csi::checks::check(*i, &obs))
                    .collect()
            }
        };
        require_exercised(&self.require_exercised, &mut verdicts);
        verdicts
    }
}

/// Judge a stored record's text (with the history stored beside it).
pub fn judge_text(text: &str, history: &EventLog) -> Result<Vec<Verdict>, RecordError> {
    drivelab_fakes::shared::reading(|| serde_json::from_str::<Record>(text))?
        .judge_read_back(history)
}

/// A check the scenario requires to be exercised that had nothing to judge
/// fails: the scenario did not test the claim it was written for.
fn require_exercised(required: &[Invariant], verdicts: &mut [Verdict]) {
    for v in verdicts.iter_mut() {
        let required = required.iter().any(|i| i.id() == v.invariant);
        if required && v.passed && !v.exercised {
            v.passed = false;
            v.details.push(
                "required to be exercised (require_exercised), but it had nothing to judge in this run"
                    .into(),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record_text(system_first: bool) -> String {
        let obs = serde_json::to_string(&cosi::checks::Observations::default()).unwrap();
        let (system, obs) = (
            r#""system":"cosi""#.to_string(),
            format!(r#""observations":{obs}"#),
        );
        let (a, b) = if system_first {
            (system, obs)
        } else {
            (obs, system)
        };
        format!(r#"{{"format":{RECORD_FORMAT},"invariants":[],"require_exercised":[],{a},{b}}}"#)
    }

    #[test]
    fn a_record_reads_back_in_either_key_order_and_a_foreign_one_is_refused_clearly() {
        let written = Record {
            format: RECORD_FORMAT,
            invariants: Invariant::all().to_vec(),
            require_exercised: Invariant::all()[..1].to_vec(),
            observed: Observed::Csi(Box::default()),
        };
        let text = serde_json::to_string(&written).unwrap();
        let read: Record = serde_json::from_str(&text).unwrap();
        assert_eq!(serde_json::to_string(&read).unwrap(), text);
        assert!(judge_text(&record_text(true), &Default::default()).is_ok());

        assert!(judge_text(&record_text(false), &Default::default()).is_ok());
        let err = |t: &str| judge_text(t, &Default::default()).unwrap_err().to_string();
        let no_system = record_text(true).replace(r#""system":"cosi","#, "");
        assert!(
            err(&no_system).contains("missing field `system`"),
            "{}",
            err(&no_system)
        );
        assert!(
            err(r#"{"format":1,"invariants":[],"require_exercised":[]}"#)
                .contains("missing field `observations`")
        );
        let other = record_text(true).replace(
            &format!(r#""format":{RECORD_FORMAT}"#),
            r#""format":99,"later":[1]"#,
        );
        assert!(err(&other).contains("has form 99"), "{}", err(&other));
    }
}
