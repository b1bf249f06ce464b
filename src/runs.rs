//! The lab's own durable record: every scenario run gets a directory in the
//! runs dir holding a sled db, appended to at each step boundary, so a lab
//! killed mid-suite leaves everything up to its last step behind for
//! `drivelab runs` and `drivelab report RUN` to show.
//!
//! The writer keeps a run's db open for the length of the run (reopening it
//! per step cost ~15 ms a step; a flush of the open db ~0.5 ms). sled holds an
//! exclusive file lock meanwhile, so the run also keeps a small `live.json`
//! (start record and progress) that `drivelab runs` reads for a run whose db
//! is locked. After a SIGKILL the kernel drops the lock with the process, and
//! the db itself is read.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use drivelab_fakes::history::{Event, EventKind, History};
use drivelab_fakes::secret::Secret;
use serde::{Deserialize, Serialize};

use crate::report::model::{call_index, event_line, sanitize, StepInfo};
use crate::report::ScenarioReport;

/// Environment variable naming the runs dir (`--runs-dir` overrides it).
pub const RUNS_DIR_ENV: &str = "DRIVELAB_RUNS";

/// Runs kept: beginning a run removes the oldest beyond this (a sled db takes
/// about half a megabyte however small the run, and every `drivelab run` records).
pub const KEEP_RUNS: usize = 100;

/// How long the writer waits for a reader to let go of a run's db.
const LOCK_WAIT: Duration = Duration::from_secs(20);
/// How long a reader waits before taking a locked db for a run in progress.
const READ_WAIT: Duration = Duration::from_millis(300);
const LIVE: &str = "live.json";

const META: &[u8] = b"meta";
const PROGRESS: &[u8] = b"progress";
const REPORT: &[u8] = b"report";
const RECORD: &[u8] = b"record";
const EVENT_PREFIX: &str = "event/";

/// What went wrong reading or writing the runs dir.
#[derive(Debug, thiserror::Error)]
pub enum RunStoreError {
    /// A file system operation failed.
    #[error("{path}: {source}")]
    Io {
        /// Where.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// sled could not open or write a run's db.
    #[error("{path}: run db: {source}")]
    Db {
        /// Where.
        path: PathBuf,
        /// Why.
        source: sled::Error,
    },
    /// A stored record did not parse (written by another version?).
    #[error("{path}: stored {what} does not parse: {source}")]
    Json {
        /// Where.
        path: PathBuf,
        /// Which record.
        what: &'static str,
        /// Why.
        source: serde_json::Error,
    },
    /// The run's db is held by the drivelab recording it.
    #[error("{path}: the run is still being recorded by a running drivelab")]
    Busy {
        /// Where.
        path: PathBuf,
    },
    /// No run by that id.
    #[error("no run `{id}` in {dir} (see `drivelab runs`)")]
    NotFound {
        /// The id asked for.
        id: String,
        /// The runs dir searched.
        dir: PathBuf,
    },
}

/// A runs directory: one subdirectory (a sled db) per scenario run.
#[derive(Clone, Debug)]
pub struct RunStore {
    dir: PathBuf,
}

/// What is known about a run from its start.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct RunMeta {
    /// The run id (also its directory name).
    pub id: String,
    /// Scenario name.
    pub scenario: String,
    /// Scenario file.
    pub path: String,
    /// Seed used.
    pub seed: u64,
    /// Seeded bugs switched on.
    pub mutants: Vec<String>,
    /// The command that replays the run.
    pub replay: String,
    /// Wall-clock start, seconds since the Unix epoch (metadata, never history).
    pub started_unix: u64,
}

/// How far a run got, as of its last flush.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Progress {
    /// Events stored.
    pub events: u64,
    /// Steps the lab had finished (the next one had not begun or was cut).
    pub steps_done: usize,
    /// The last step begun (1-based; 0 before the first).
    pub last_step: usize,
}

/// A run as read back.
#[derive(Clone, Debug)]
pub struct StoredRun {
    /// Start record.
    pub meta: RunMeta,
    /// Last flushed progress.
    pub progress: Progress,
    /// The report, once the run completed.
    pub report: Option<ScenarioReport>,
    /// A drivelab is recording it right now (read from `live.json`).
    pub live: bool,
}

/// What `live.json` holds.
#[derive(Serialize, Deserialize)]
struct Live {
    meta: RunMeta,
    progress: Progress,
}

impl StoredRun {
    /// `pass`, `fail`, `error` for completed runs, `running` while being
    /// recorded, `INCOMPLETE` for a run whose lab stopped.
    pub fn status(&self) -> &'static str {
        if self.live {
            return "running";
        }
        match &self.report {
            Some(r) if r.error.is_some() => "error",
            Some(r) if r.passed => "pass",
            Some(_) => "fail",
            None => "INCOMPLETE",
        }
    }

    /// The incomplete marker, e.g. `incomplete: the lab stopped after step 3 (event 41)`.
    pub fn incomplete_note(&self) -> Option<String> {
        if self.report.is_some() || self.live {
            return None;
        }
        let last = self.progress.events.checked_sub(1);
        Some(match (self.progress.steps_done, last) {
            (_, None) => "incomplete: the lab stopped before any event was stored".into(),
            (0, Some(n)) => format!("incomplete: the lab stopped before step 1 ended (event {n})"),
            (k, Some(n)) => format!("incomplete: the lab stopped after step {k} (event {n})"),
        })
    }
}

impl RunStore {
    /// The runs dir to use: `given`, else `$DRIVELAB_RUNS`, else `.drivelab/runs`.
    pub fn resolve(given: Option<PathBuf>) -> PathBuf {
        given
            .or_else(|| std::env::var_os(RUNS_DIR_ENV).map(PathBuf::from))
            .unwrap_or_else(|| PathBuf::from(".drivelab/runs"))
    }

    /// A store over `dir` (created on the first run).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    /// The runs dir.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Start recording a run: allocate its id and store its start record.
    pub fn begin(&self, mut meta: RunMeta) -> Result<Recorder, RunStoreError> {
        std::fs::create_dir_all(&self.dir).map_err(|source| RunStoreError::Io {
            path: self.dir.clone(),
            source,
        })?;
        // Time-ordered ids: the next counter after those present; create_dir is the
        // claim, so two labs sharing a runs dir never get the same one.
        let mut n = self
            .ids()?
            .iter()
            .filter_map(|id| id.split('-').next()?.parse::<u64>().ok())
            .max()
            .unwrap_or(0);
        let (id, dir) = loop {
            n += 1;
            let id = format!("{n:05}-{}", sanitize(&meta.scenario));
            let dir = self.dir.join(&id);
            match std::fs::create_dir(&dir) {
                Ok(()) => break (id, dir),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(source) => return Err(RunStoreError::Io { path: dir, source }),
            }
        };
        meta.id = id;
        self.prune(&meta.id);
        let db = open(&dir, LOCK_WAIT)?;
        put_json(&db, &dir, META, &meta)?;
        put_json(&db, &dir, PROGRESS, &Progress::default())?;
        db.flush().map_err(|source| RunStoreError::Db {
            path: dir.clone(),
            source,
        })?;
        let inner = RecorderInner {
            dir,
            db: Some(db),
            meta,
            stored: 0,
            last_step: 0,
            secrets: BTreeSet::new(),
        };
        inner.write_live(&Progress::default())?;
        Ok(Recorder {
            inner: Arc::new(Mutex::new(inner)),
        })
    }

    /// Remove the oldest runs beyond [`KEEP_RUNS`] (never `current`); a run that
    /// cannot be removed is left for the next time.
    fn prune(&self, current: &str) {
        let Ok(ids) = self.ids() else { return };
        let excess = ids.len().saturating_sub(KEEP_RUNS);
        for id in ids.iter().filter(|id| *id != current).take(excess) {
            if let Err(e) = std::fs::remove_dir_all(self.dir.join(id)) {
                tracing::debug!(error = %e, run = %id, "pruning an old run failed");
            }
        }
    }

    /// Run ids present, oldest first.
    pub fn ids(&self) -> Result<Vec<String>, RunStoreError> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => {
                return Err(RunStoreError::Io {
                    path: self.dir.clone(),
                    source,
                })
            }
        };
        let mut ids: Vec<String> = entries
            .filter_map(|e| e.ok())
            .filter(|e| e.path().is_dir())
            .filter_map(|e| e.file_name().into_string().ok())
            .collect();
        ids.sort();
        Ok(ids)
    }

    /// Read one run's records (not its events); a run being recorded right
    /// now comes from its `live.json`.
    pub fn load(&self, id: &str) -> Result<StoredRun, RunStoreError> {
        let dir = self.run_dir(id)?;
        // A run with a live.json is being recorded, or its lab died: one try
        // tells which (waiting would only wait for the run to end).
        let wait = if dir.join(LIVE).is_file() {
            Duration::ZERO
        } else {
            READ_WAIT
        };
        let db = match open(&dir, wait) {
            Ok(db) => db,
            Err(RunStoreError::Busy { path }) => {
                let live = dir.join(LIVE);
                let text = std::fs::read(&live).map_err(|_| RunStoreError::Busy { path })?;
                let l: Live =
                    serde_json::from_slice(&text).map_err(|source| RunStoreError::Json {
                        path: live,
                        what: "live progress",
                        source,
                    })?;
                return Ok(StoredRun {
                    meta: l.meta,
                    progress: l.progress,
                    report: None,
                    live: true,
                });
            }
            Err(e) => return Err(e),
        };
        let meta: RunMeta =
            get_json(&db, &dir, META, "start record")?.ok_or_else(|| RunStoreError::NotFound {
                id: id.to_string(),
                dir: self.dir.clone(),
            })?;
        let progress = get_json(&db, &dir, PROGRESS, "progress")?.unwrap_or_default();
        let report = get_json(&db, &dir, REPORT, "report")?;
        Ok(StoredRun {
            meta,
            progress,
            report,
            live: false,
        })
    }

    /// The events a run stored, in order (redacted as they were written).
    pub fn events(&self, id: &str) -> Result<Vec<Event>, RunStoreError> {
        let dir = self.run_dir(id)?;
        let db = open(&dir, READ_WAIT)?;
        let mut out = Vec::new();
        for kv in db.scan_prefix(EVENT_PREFIX.as_bytes()) {
            let (_, v) = kv.map_err(|source| RunStoreError::Db {
                path: dir.clone(),
                source,
            })?;
            out.push(
                serde_json::from_slice(&v).map_err(|source| RunStoreError::Json {
                    path: dir.clone(),
                    what: "event",
                    source,
                })?,
            );
        }
        Ok(out)
    }

    /// The record a completed run's checks were judged from, if it kept one
    /// (runs that ended in a lab error, or were cut short, have none).
    pub fn record(&self, id: &str) -> Result<Option<String>, RunStoreError> {
        let dir = self.run_dir(id)?;
        let db = open(&dir, READ_WAIT)?;
        let v = db.get(RECORD).map_err(|source| RunStoreError::Db {
            path: dir.clone(),
            source,
        })?;
        Ok(v.map(|v| String::from_utf8_lossy(&v).into_owned()))
    }

    /// `drivelab runs`: one line per run.
    pub fn list_text(&self) -> Result<String, RunStoreError> {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "{:40} {:32} {:>6} {:10} detail",
            "RUN", "SCENARIO", "SEED", "STATUS"
        );
        for id in self.ids()? {
            match self.load(&id) {
                Ok(r) => {
                    let detail = match &r.report {
                        Some(rep) if !rep.passed => rep.failed_names().join(", "),
                        Some(_) => String::new(),
                        None if r.live => format!(
                            "{} events so far, in step {}",
                            r.progress.events, r.progress.last_step
                        ),
                        None => format!(
                            "{} events, last step reached {}",
                            r.progress.events, r.progress.last_step
                        ),
                    };
                    let _ = writeln!(
                        s,
                        "{:40} {:32} {:>6} {:10} {detail}",
                        r.meta.id,
                        r.meta.scenario,
                        r.meta.seed,
                        r.status()
                    );
                }
                Err(e) => {
                    let _ = writeln!(s, "{id:40} (unreadable: {e})");
                }
            }
        }
        Ok(s)
    }

    /// The report of a run: the stored one when it completed, else one built
    /// from the stored events and marked incomplete.
    pub fn report(&self, id: &str) -> Result<(StoredRun, ScenarioReport), RunStoreError> {
        let run = self.load(id)?;
        if let Some(r) = &run.report {
            return Ok((run.clone(), r.clone()));
        }
        let history = self.events(id)?;
        let steps = history
            .iter()
            .filter_map(|e| match &e.kind {
                EventKind::Step { index, name } => Some(StepInfo {
                    index: *index,
                    name: name.clone(),
                }),
                _ => None,
            })
            .collect();
        let m = &run.meta;
        let r = ScenarioReport {
            scenario: m.scenario.clone(),
            path: m.path.clone(),
            dir: sanitize(&m.scenario),
            seed: m.seed,
            mutants: m.mutants.clone(),
            passed: false,
            error: run.incomplete_note(),
            replay: m.replay.clone(),
            steps,
            history,
            ..Default::default()
        };
        Ok((run, r))
    }

    /// The Markdown `drivelab report RUN` prints.
    pub fn markdown(run: &StoredRun, r: &ScenarioReport) -> String {
        let Some(note) = run.incomplete_note() else {
            return crate::report::markdown::scenario_summary(r);
        };
        let mut md = String::new();
        let _ = writeln!(md, "# {} — INCOMPLETE\n", r.scenario);
        let _ = writeln!(md, "**{note}**\n");
        let _ = writeln!(md, "- run: `{}`", run.meta.id);
        let _ = writeln!(
            md,
            "- events stored: {}; last step begun: {}",
            run.progress.events, run.progress.last_step
        );
        let _ = writeln!(md, "- seed: {}", r.seed);
        if !r.mutants.is_empty() {
            let _ = writeln!(md, "- mutants: {}", r.mutants.join(", "));
        }
        let _ = writeln!(md, "- replay: `{}`\n", r.replay);
        let _ = writeln!(
            md,
            "No checks ran: they read the end state the run never reached.\n"
        );
        let _ = writeln!(md, "## Steps begun\n");
        for s in &r.steps {
            let _ = writeln!(md, "{}. {}", s.index + 1, s.name);
        }
        let calls = call_index(&r.history);
        let _ = writeln!(md, "\n## Events stored ({})\n\n```", r.history.len());
        for e in &r.history {
            let _ = writeln!(md, "{}", event_line(e, &calls));
        }
        let _ = writeln!(md, "```");
        md
    }

    fn run_dir(&self, id: &str) -> Result<PathBuf, RunStoreError> {
        // Ids are directory names we made: nothing with a separator or `..`.
        let dir = self.dir.join(id);
        if id.is_empty() || sanitize(id) != id || !dir.is_dir() {
            return Err(RunStoreError::NotFound {
                id: id.to_string(),
                dir: self.dir.clone(),
            });
        }
        Ok(dir)
    }
}

/// The end of a run, as [`Recorder::complete_run`] stores it.
#[derive(Clone, Copy, Debug)]
pub struct RunEnd<'a> {
    /// The whole history (what was flushed already is skipped).
    pub events: &'a drivelab_fakes::history::EventLog,
    /// The record its checks were judged from (`crate::systems::Record`, as written).
    pub record: &'a str,
    /// Secret values of the run, scrubbed from everything stored.
    pub secrets: &'a [Secret],
}

/// Appends one run's history to its db; cheap to clone (the engine holds one,
/// the command line completes it).
#[derive(Clone, Debug)]
pub struct Recorder {
    inner: Arc<Mutex<RecorderInner>>,
}

#[derive(Debug)]
struct RecorderInner {
    dir: PathBuf,
    // Open from begin to complete; None after.
    db: Option<sled::Db>,
    meta: RunMeta,
    stored: usize,
    last_step: usize,
    // Every secret value seen so far: a secret handed out in step 2 is still
    // redacted if a later event repeats it.
    secrets: BTreeSet<String>,
}

impl Recorder {
    /// The run id.
    pub fn id(&self) -> String {
        self.lock().meta.id.clone()
    }

    /// Append the events recorded since the last flush and note `steps_done`;
    /// every value in `secrets` (and any seen before) is replaced by
    /// `<redacted>` first. One db open and one sled flush per call.
    pub fn flush(
        &self,
        history: &History,
        steps_done: usize,
        secrets: impl IntoIterator<Item = Secret>,
    ) -> Result<(), RunStoreError> {
        let mut g = self.lock();
        g.secrets.extend(
            secrets
                .into_iter()
                .map(|s| s.expose().to_string())
                .filter(|s| !s.is_empty()),
        );
        let events = history.events_from(g.stored);
        let redact = Redactor::new(&g.secrets);
        let dir = g.dir.clone();
        let Some(db) = g.db.clone() else {
            return Ok(());
        };
        let mut batch = sled::Batch::default();
        for e in &events {
            let json = serde_json::to_string(e).unwrap_or_default();
            batch.insert(
                format!("{EVENT_PREFIX}{:012}", e.seq).as_bytes(),
                redact.apply(&json).as_bytes(),
            );
        }
        let last_step = events
            .iter()
            .rev()
            .find_map(|e| match e.kind {
                EventKind::Step { index, .. } => Some(index + 1),
                _ => None,
            })
            .unwrap_or(g.last_step);
        let progress = Progress {
            events: (g.stored + events.len()) as u64,
            steps_done,
            last_step,
        };
        batch.insert(PROGRESS, serde_json::to_vec(&progress).unwrap_or_default());
        db.apply_batch(batch)
            .and_then(|()| db.flush().map(|_| ()))
            .map_err(|source| RunStoreError::Db { path: dir, source })?;
        g.stored += events.len();
        g.last_step = last_step;
        g.write_live(&progress)
    }

    /// Store the run's report and mark it complete. The report holds only
    /// labelled text (what `--report-dir` writes), so nothing new to redact;
    /// the known secrets are still scrubbed from it as a second guard.
    pub fn complete(&self, report: &ScenarioReport) -> Result<(), RunStoreError> {
        self.complete_run(report, None)
    }

    /// Store the end of a run that produced an outcome: the events since the
    /// last flush (the final convergence), the record its checks were judged
    /// from, and the report. The record's secrets are fingerprints already;
    /// known secret values are scrubbed from it too, as from everything stored.
    pub fn complete_run(
        &self,
        report: &ScenarioReport,
        end: Option<RunEnd<'_>>,
    ) -> Result<(), RunStoreError> {
        let mut g = self.lock();
        let mut batch = sled::Batch::default();
        if let Some(end) = &end {
            g.secrets.extend(
                end.secrets
                    .iter()
                    .map(|s| s.expose().to_string())
                    .filter(|s| !s.is_empty()),
            );
            let redact = Redactor::new(&g.secrets);
            for e in end.events.iter_from(g.stored) {
                let json = serde_json::to_string(&e).unwrap_or_default();
                batch.insert(
                    format!("{EVENT_PREFIX}{:012}", e.seq).as_bytes(),
                    redact.apply(&json).as_bytes(),
                );
            }
            batch.insert(RECORD, redact.apply(end.record).as_bytes());
            g.stored = g.stored.max(end.events.len());
        }
        let json = serde_json::to_string(report).unwrap_or_default();
        batch.insert(REPORT, Redactor::new(&g.secrets).apply(&json).as_bytes());
        // Taken: the lock goes with the last handle, so readers get the db now.
        let Some(db) = g.db.take() else {
            return Ok(());
        };
        db.apply_batch(batch)
            .and_then(|()| db.flush().map(|_| ()))
            .map_err(|source| RunStoreError::Db {
                path: g.dir.clone(),
                source,
            })?;
        drop(db);
        let _ = std::fs::remove_file(g.dir.join(LIVE));
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, RecorderInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl RecorderInner {
    /// Replace `live.json` (write and rename: a reader never sees half of it).
    fn write_live(&self, progress: &Progress) -> Result<(), RunStoreError> {
        let live = Live {
            meta: self.meta.clone(),
            progress: progress.clone(),
        };
        let tmp = self.dir.join("live.json.tmp");
        std::fs::write(&tmp, serde_json::to_vec(&live).unwrap_or_default())
            .and_then(|()| std::fs::rename(&tmp, self.dir.join(LIVE)))
            .map_err(|source| RunStoreError::Io {
                path: self.dir.join(LIVE),
                source,
            })
    }
}

/// Replaces every known secret value in a text.
struct Redactor(Option<aho_corasick::AhoCorasick>, usize);

impl Redactor {
    fn new(secrets: &BTreeSet<String>) -> Self {
        let ac = aho_corasick::AhoCorasick::builder()
            .match_kind(aho_corasick::MatchKind::LeftmostLongest)
            .build(secrets)
            .ok();
        Self(ac, secrets.len())
    }

    fn apply(&self, text: &str) -> String {
        match &self.0 {
            Some(ac) if self.1 > 0 => {
                let with = vec!["<redacted>"; self.1];
                ac.replace_all(text, &with)
            }
            // No secrets known, or an automaton too big to build: never store the
            // text unscrubbed in the second case.
            Some(_) => text.to_string(),
            None => "<redacted: secret scrub failed>".to_string(),
        }
    }
}

fn open(dir: &Path, wait: Duration) -> Result<sled::Db, RunStoreError> {
    // No background flusher: every write is flushed by hand, and joining the
    // flusher thread on close cost ~20 ms per open (4 ms without).
    let config = sled::Config::new().path(dir).flush_every_ms(None);
    drivelab_fakes::store::open_sled(&config, wait).map_err(|source| {
        if drivelab_fakes::store::lock_held(&source) {
            RunStoreError::Busy {
                path: dir.to_path_buf(),
            }
        } else {
            RunStoreError::Db {
                path: dir.to_path_buf(),
                source,
            }
        }
    })
}

fn put_json<T: Serialize>(
    db: &sled::Db,
    dir: &Path,
    key: &[u8],
    v: &T,
) -> Result<(), RunStoreError> {
    db.insert(key, serde_json::to_vec(v).unwrap_or_default())
        .map(|_| ())
        .map_err(|source| RunStoreError::Db {
            path: dir.to_path_buf(),
            source,
        })
}

fn get_json<T: for<'de> Deserialize<'de>>(
    db: &sled::Db,
    dir: &Path,
    key: &[u8],
    what: &'static str,
) -> Result<Option<T>, RunStoreError> {
    let Some(v) = db.get(key).map_err(|source| RunStoreError::Db {
        path: dir.to_path_buf(),
        source,
    })?
    else {
        return Ok(None);
    };
    serde_json::from_slice(&v)
        .map(Some)
        .map_err(|source| RunStoreError::Json {
            path: dir.to_path_buf(),
            what,
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use drivelab_fakes::clock::SimClock;
    use drivelab_fakes::history::Component;

    fn meta(name: &str) -> RunMeta {
        RunMeta {
            id: String::new(),
            scenario: name.into(),
            path: format!("scenarios/{name}.yaml"),
            seed: 7,
            mutants: vec![],
            replay: format!("drivelab run scenarios/{name}.yaml --seed 7"),
            started_unix: 0,
        }
    }

    #[test]
    fn flushes_append_redacted_and_reopen_in_process() {
        let tmp = tempfile::tempdir().unwrap();
        let store = RunStore::new(tmp.path());
        let rec = store.begin(meta("a")).unwrap();
        let h = History::new(SimClock::new());
        h.record(EventKind::Step {
            index: 0,
            name: "first".into(),
        });
        h.record(EventKind::Note {
            component: Component::Driver,
            text: "leaked s3cr3t-value here".into(),
        });
        rec.flush(&h, 0, [Secret::new("s3cr3t-value")]).unwrap();
        h.record(EventKind::Note {
            component: Component::Driver,
            text: "again s3cr3t-value".into(),
        });
        // The secret is not passed again: it stays known.
        rec.flush(&h, 1, []).unwrap();

        // While recording, the db is locked: readers get live.json.
        let live = store.load(&rec.id()).unwrap();
        assert_eq!(live.status(), "running");
        assert_eq!(live.progress.events, 3);
        assert!(matches!(
            store.events(&rec.id()),
            Err(RunStoreError::Busy { .. })
        ));
        // The lab dies: its handles (and sled's lock) go.
        let id = rec.id();
        drop(rec);

        let run = store.load(&id).unwrap();
        assert_eq!(run.status(), "INCOMPLETE");
        assert_eq!(
            run.progress,
            Progress {
                events: 3,
                steps_done: 1,
                last_step: 1,
            }
        );
        let events = store.events(&id).unwrap();
        assert_eq!(events.len(), 3);
        let text = serde_json::to_string(&events).unwrap();
        assert!(!text.contains("s3cr3t-value"), "{text}");
        assert!(text.contains("<redacted>"));
        assert_eq!(
            run.incomplete_note().unwrap(),
            "incomplete: the lab stopped after step 1 (event 2)"
        );

        let (run, r) = store.report(&id).unwrap();
        let md = RunStore::markdown(&run, &r);
        assert!(md.contains("INCOMPLETE"), "{md}");
        assert!(md.contains("step 1: first"), "{md}");

        let second = store.begin(meta("b")).unwrap();
        second.flush(&h, 2, []).unwrap();
        let done = ScenarioReport {
            scenario: "b".into(),
            passed: true,
            ..Default::default()
        };
        second.complete(&done).unwrap();
        // Completing closes the db at once, though a clone of the handle lives on.
        assert_eq!(store.load(&second.id()).unwrap().status(), "pass");
        assert_eq!(store.ids().unwrap(), vec![id, second.id()]);
        assert!(second.id().starts_with("00002-"));
        assert!(store.load("../x").is_err());
    }
}
