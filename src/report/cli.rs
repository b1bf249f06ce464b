//! Terminal side of a run: which scenarios it selects (`--filter`,
//! `--partition k/n`), the progress line (TTY only), the final table, the
//! exit code, and the `list` catalogues. main.rs only wires these up.

use std::fmt::Write as _;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;

use super::model::ScenarioReport;

/// `k/n`: shard k (1-based) of n.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Partition {
    /// 1-based shard number.
    pub k: usize,
    /// Number of shards.
    pub n: usize,
}

/// Parse `k/n` with 1 ≤ k ≤ n.
pub fn parse_partition(s: &str) -> Result<Partition, String> {
    let (k, n) = s
        .split_once('/')
        .ok_or_else(|| format!("--partition wants k/n (e.g. 2/4), got `{s}`"))?;
    let k: usize = k
        .trim()
        .parse()
        .map_err(|_| format!("--partition: `{k}` is not a number"))?;
    let n: usize = n
        .trim()
        .parse()
        .map_err(|_| format!("--partition: `{n}` is not a number"))?;
    if n == 0 || k == 0 || k > n {
        return Err(format!("--partition {s}: need 1 ≤ k ≤ n"));
    }
    Ok(Partition { k, n })
}

impl Partition {
    /// Does shard k of n take the item at 0-based `index` (round robin)?
    pub fn takes(&self, index: u64) -> bool {
        index % self.n as u64 == self.k as u64 - 1
    }
}

impl std::fmt::Display for Partition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.k, self.n)
    }
}

/// Keep the files whose path or file stem contains `filter`, then shard k of
/// n by index in sorted path order (round robin, so shards stay balanced and
/// a file keeps its shard as long as the sorted list does not change).
pub fn select(
    mut files: Vec<PathBuf>,
    filter: Option<&str>,
    partition: Option<Partition>,
) -> Vec<PathBuf> {
    files.sort();
    files.dedup();
    if let Some(f) = filter {
        files.retain(|p| p.to_string_lossy().contains(f));
    }
    match partition {
        Some(Partition { k, n }) => files
            .into_iter()
            .enumerate()
            .filter(|(i, _)| Partition { k, n }.takes(*i as u64))
            .map(|(_, p)| p)
            .collect(),
        None => files,
    }
}

/// The run-level replay command for the index (never the report dir).
pub fn replay_all(
    paths: &[PathBuf],
    seed: Option<u64>,
    mutants: &[String],
    filter: Option<&str>,
    partition: Option<Partition>,
) -> String {
    let mut cmd = String::from("drivelab run");
    for p in paths {
        cmd.push(' ');
        cmd.push_str(&p.display().to_string());
    }
    if let Some(s) = seed {
        let _ = write!(cmd, " --seed {s}");
    }
    for m in mutants {
        let _ = write!(cmd, " --mutant {m}");
    }
    if let Some(f) = filter {
        let _ = write!(cmd, " --filter {}", shell_word(f));
    }
    if let Some(p) = partition {
        let _ = write!(cmd, " --partition {}/{}", p.k, p.n);
    }
    cmd
}

fn shell_word(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// Drop ` --partition k/n` from a command (merged shards are the whole run).
pub fn strip_partition(cmd: &str) -> String {
    let words: Vec<&str> = cmd.split(' ').collect();
    let mut out = Vec::new();
    let mut skip = false;
    for w in words {
        if skip {
            skip = false;
            continue;
        }
        if w == "--partition" {
            skip = true;
            continue;
        }
        out.push(w);
    }
    out.join(" ")
}

/// The progress line: redrawn in place on a terminal, silent otherwise (CI
/// logs get the per-scenario blocks, which are plain lines already).
pub struct Progress {
    total: usize,
    tty: bool,
}

impl Progress {
    /// Progress over `total` scenarios, on stderr.
    pub fn new(total: usize) -> Self {
        Self {
            total,
            tty: std::io::stderr().is_terminal(),
        }
    }

    /// Scenario `i` (0-based) of the total is starting.
    pub fn start(&self, i: usize, name: &str, failed_so_far: usize) {
        if self.tty {
            let width = 24;
            let done = if self.total == 0 {
                width
            } else {
                i * width / self.total
            };
            let bar: String = "#".repeat(done) + &"-".repeat(width - done.min(width));
            let mut e = std::io::stderr();
            let _ = write!(
                e,
                "\r\x1b[2K[{bar}] {}/{} {failed_so_far} failed · running {name}",
                i + 1,
                self.total
            );
            let _ = e.flush();
        }
    }

    /// Clear the line before anything else is printed.
    pub fn clear(&self) {
        if self.tty {
            let mut e = std::io::stderr();
            let _ = write!(e, "\r\x1b[2K");
            let _ = e.flush();
        }
    }
}

/// The final table of scenarios and verdicts.
pub fn final_table(reports: &[ScenarioReport]) -> String {
    let w = reports
        .iter()
        .map(|r| r.scenario.chars().count())
        .max()
        .unwrap_or(8)
        .max(8);
    let mut s = String::new();
    let _ = writeln!(
        s,
        "\n{:w$}  {:7}  {:>6}  failed",
        "scenario", "verdict", "seed"
    );
    for r in reports {
        let verdict = if r.error.is_some() {
            "ERROR"
        } else if r.passed {
            "PASS"
        } else {
            "FAIL"
        };
        let _ = writeln!(
            s,
            "{:w$}  {verdict:7}  {:>6}  {}",
            r.scenario,
            r.seed,
            r.failed_names().join(", ")
        );
    }
    let all = reports.iter().flat_map(|r| &r.verdicts);
    let (mut pass, mut fail, mut idle) = (0, 0, 0);
    for v in all {
        match v.state() {
            "pass" => pass += 1,
            "FAIL" => fail += 1,
            _ => idle += 1,
        }
    }
    let _ = writeln!(
        s,
        "\nchecks: {pass} pass, {fail} fail, {idle} not exercised (a check with nothing to judge establishes nothing)"
    );
    // Only a non-reference driver has these; a reference run's summary is unchanged.
    let skipped: usize = reports.iter().map(|r| r.expect_not_exercised.len()).sum();
    if skipped > 0 {
        let _ = writeln!(
            s,
            "expectations: {skipped} not exercised (reference-design expectations, not judged for this driver)"
        );
    }
    s
}

/// 0 all passed, 1 a check or expectation failed, 2 the lab itself failed
/// (bad input exits 2 before anything runs).
pub fn exit_code(reports: &[ScenarioReport]) -> u8 {
    if reports.iter().any(|r| r.error.is_some()) {
        2
    } else if reports.iter().all(|r| r.passed) {
        0
    } else {
        1
    }
}

/// The faults a scenario may inject (`drivelab list faults`).
pub const FAULTS: &[(&str, &str)] = &[
    ("crash_driver", "kill every task of the driver before/after the callee commits (`when: before_commit|after_commit`); it restarts from its checkpoints"),
    ("drop_response", "the callee commits, then the connection drops: the caller gets no reply"),
    ("error", "answer with an error instead (`status`/`code` for HTTP, gRPC code name for driver.*)"),
    ("delay", "the call takes this much virtual time (`by: 5s`)"),
    ("restart", "restart the fake `on` names (COSI: s3/s3admin or kube; BOSH: director), state kept, connections broken"),
    ("partition", "step: cut traffic between two components, both ways or `one_way`, `for` a virtual duration or until healed"),
    ("heal", "step: heal one partition (`from`/`to`) or all (`heal: {}`)"),
];

/// `drivelab list faults`: the fault kinds, then per system the components
/// and operations a fault may aim at, the partition sides and what a
/// `restart` step may restart — all from the registries the validator uses.
pub fn list_faults() -> String {
    use crate::scenario::names::{self, Restartable};
    use crate::scenario::System;
    let mut s = String::new();
    for (name, what) in FAULTS {
        let _ = writeln!(s, "{name:16} {what}");
    }
    s.push_str("\nA fault that never fires fails its scenario unless it says `optional: true`.\n");
    for (system, title) in [
        (System::Cosi, "COSI"),
        (System::Csi, "CSI (with the BOSH backend)"),
    ] {
        let _ = writeln!(s, "\n{title} scenarios: `on: component.operation`, one of");
        for c in names::callees(system) {
            let ops: Vec<&str> = names::ops_of(system, c)
                .iter()
                .map(|o| o.as_str())
                .collect();
            let _ = writeln!(s, "  {c}: {}", ops.join(", "));
        }
        let sides: Vec<&str> = names::partition_sides(system)
            .iter()
            .map(|c| c.as_str())
            .collect();
        let _ = writeln!(s, "  partition/heal sides: {}", sides.join(", "));
        let restart: Vec<&str> = Restartable::in_system(system)
            .iter()
            .map(|r| r.component().as_str())
            .collect();
        let _ = writeln!(s, "  restart step: {}", restart.join(", "));
    }
    s
}

/// `drivelab list scenarios`: name, file and description of each.
pub fn list_scenarios(scenarios: &[crate::scenario::Scenario]) -> String {
    let w = scenarios
        .iter()
        .map(|s| s.name.chars().count())
        .max()
        .unwrap_or(8);
    let mut out = String::new();
    for s in scenarios {
        let _ = writeln!(out, "{:w$}  {}", s.name, s.path.display());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partitions_cover_everything_once() {
        let files: Vec<PathBuf> = (0..7)
            .map(|i| PathBuf::from(format!("s/{i}.yaml")))
            .collect();
        let mut all = Vec::new();
        for k in 1..=3 {
            all.extend(select(files.clone(), None, Some(Partition { k, n: 3 })));
        }
        all.sort();
        assert_eq!(all, files);
        assert!(parse_partition("0/2").is_err());
        assert!(parse_partition("3/2").is_err());
        assert!(parse_partition("x").is_err());
        assert_eq!(parse_partition("2/4"), Ok(Partition { k: 2, n: 4 }));
    }

    #[test]
    fn strip() {
        assert_eq!(
            strip_partition("drivelab run scenarios/ --partition 1/2 --seed 3"),
            "drivelab run scenarios/ --seed 3"
        );
    }
}
