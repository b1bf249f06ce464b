//! `drivelab merge-found`: the found files of a campaign's shards (explore
//! `--partition`, sweeps, seed sweeps) deduplicated by failure signature into
//! one directory, with a SUMMARY.md saying which shards found what.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, Context};

use crate::scenario::{self, write, FaultAction, FaultSpec, When};

/// What a found file fails, and how: two files with one signature are one finding.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Signature {
    /// The mutants it was hunted with, sorted (the driver's own and `--mutant`).
    pub mutants: Vec<String>,
    /// The invariants it fails, sorted; `None` for a file written before
    /// found files said so.
    pub invariants: Option<Vec<String>>,
    /// Its faults as `action@component.op/phase`, sorted.
    pub faults: Vec<String>,
    /// With unknown invariants, the file name: files that may fail
    /// differently are not collapsed on a guess.
    pub unknown_file: Option<String>,
}

impl std::fmt::Display for Signature {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let or_none = |v: &[String]| {
            if v.is_empty() {
                "-".to_string()
            } else {
                v.join(", ")
            }
        };
        let invariants = match (&self.invariants, &self.unknown_file) {
            (Some(i), _) => or_none(i),
            (None, Some(file)) => format!("unknown ({file})"),
            (None, None) => "unknown".to_string(),
        };
        write!(
            f,
            "mutants: {} | fails: {invariants} | faults: {}",
            or_none(&self.mutants),
            or_none(&self.faults)
        )
    }
}

/// One found file read from a shard directory.
#[derive(Clone, Debug)]
pub struct FoundFile {
    /// Index of its shard directory among the arguments.
    pub shard: usize,
    /// Where it is.
    pub path: PathBuf,
    /// Its size in bytes (the smallest of a signature is kept).
    pub size: u64,
    /// What it fails, and how.
    pub signature: Signature,
}

impl FoundFile {
    fn name(&self) -> String {
        self.path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    }
}

/// One signature after merging.
#[derive(Debug)]
pub struct Finding {
    /// The failure signature.
    pub signature: Signature,
    /// Shards (indexes into the dirs) that found it.
    pub shards: Vec<usize>,
    /// Files with this signature across all shards.
    pub files: usize,
    /// The kept file (smallest, then first by name and shard).
    pub kept: FoundFile,
    /// Its name in the output directory.
    pub kept_as: String,
}

/// What `merge-found` did.
#[derive(Debug)]
pub struct MergeFound {
    /// The shard directories, as given.
    pub dirs: Vec<PathBuf>,
    /// Found files read.
    pub files: usize,
    /// One per signature, in signature order.
    pub findings: Vec<Finding>,
}

/// `action@component.op/phase` for one fault.
pub fn fault_description(f: &FaultSpec) -> String {
    let action = match &f.action {
        FaultAction::Error { status, code, .. } => format!("error({status} {code})"),
        FaultAction::Delay(d) => format!("delay({}ms)", d.as_millis()),
        a => a.name().to_string(),
    };
    let phase = match f.when {
        When::BeforeCommit => "before_commit",
        When::AfterCommit => "after_commit",
    };
    format!("{action}@{}/{phase}", f.on)
}

/// The mutants an older file names only in its `Fails with --mutant X:` line.
fn mutants_of_old_header(text: &str) -> Vec<String> {
    text.lines()
        .take_while(|l| l.starts_with('#'))
        .filter_map(|l| l.trim_start_matches('#').trim().strip_prefix("Fails with"))
        .filter_map(|rest| rest.split_once(':').map(|(flags, _)| flags.to_string()))
        .flat_map(|flags| {
            let words: Vec<String> = flags.split_whitespace().map(str::to_string).collect();
            words
                .windows(2)
                .filter(|w| w[0] == "--mutant")
                .map(|w| w[1].clone())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Read one found file: parse it as a scenario and take its signature.
pub fn read_found(path: &Path, shard: usize) -> anyhow::Result<FoundFile> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let scn = scenario::load(path).map_err(|e| anyhow!("{e}"))?;
    let mut mutants = write::read_list_header(&text, write::MUTANTS_HEADER)
        .unwrap_or_else(|| mutants_of_old_header(&text));
    mutants.extend(scn.driver.mutants.iter().map(|m| m.name().to_string()));
    mutants.sort();
    mutants.dedup();
    let invariants = write::read_list_header(&text, write::FAILED_HEADER).map(|mut v| {
        v.sort();
        v.dedup();
        v
    });
    let mut faults: Vec<String> = scn
        .faults
        .iter()
        .map(|f| fault_description(&f.value))
        .collect();
    faults.sort();
    let unknown_file = invariants.is_none().then(|| {
        path.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    });
    Ok(FoundFile {
        shard,
        path: path.to_path_buf(),
        size: text.len() as u64,
        signature: Signature {
            mutants,
            invariants,
            faults,
            unknown_file,
        },
    })
}

/// Every `*.yaml` / `*.yml` under `dir`, sorted (shard artifacts may nest).
fn yaml_files(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).with_context(|| format!("reading {}", d.display()))? {
            let p = e
                .with_context(|| format!("reading {}", d.display()))?
                .path();
            if p.is_dir() {
                todo.push(p);
            } else if p.extension().is_some_and(|x| x == "yaml" || x == "yml") {
                out.push(p);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Group `files` by signature; keep the smallest of each (ties: file name,
/// then shard), naming it apart from other kept files of the same name.
pub fn dedup(files: Vec<FoundFile>) -> Vec<Finding> {
    let mut by_sig: BTreeMap<Signature, Vec<FoundFile>> = BTreeMap::new();
    for f in files {
        by_sig.entry(f.signature.clone()).or_default().push(f);
    }
    let mut taken: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = Vec::new();
    for (signature, mut group) in by_sig {
        group.sort_by_key(|f| (f.size, f.name(), f.shard));
        let mut shards: Vec<usize> = group.iter().map(|f| f.shard).collect();
        shards.sort_unstable();
        shards.dedup();
        let files = group.len();
        let kept = group.swap_remove(0);
        let name = kept.name();
        let uses = taken.entry(name.clone()).or_insert(0);
        *uses += 1;
        let kept_as = if *uses == 1 {
            name
        } else {
            format!("shard{}-{name}", kept.shard + 1)
        };
        out.push(Finding {
            signature,
            shards,
            files,
            kept,
            kept_as,
        });
    }
    out
}

/// Read the found files of `dirs`, deduplicate them, copy one per signature
/// to `out` and write `out/SUMMARY.md`.
pub fn merge_found(dirs: &[PathBuf], out: &Path) -> anyhow::Result<MergeFound> {
    let mut files = Vec::new();
    for (shard, dir) in dirs.iter().enumerate() {
        for p in yaml_files(dir)? {
            files.push(read_found(&p, shard).with_context(|| format!("shard {}", dir.display()))?);
        }
    }
    let n_files = files.len();
    let findings = dedup(files);
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    for f in &findings {
        let to = out.join(&f.kept_as);
        std::fs::copy(&f.kept.path, &to)
            .with_context(|| format!("copying {} to {}", f.kept.path.display(), to.display()))?;
    }
    let merged = MergeFound {
        dirs: dirs.to_vec(),
        files: n_files,
        findings,
    };
    let summary = out.join("SUMMARY.md");
    std::fs::write(&summary, summary_markdown(&merged))
        .with_context(|| format!("writing {}", summary.display()))?;
    Ok(merged)
}

/// SUMMARY.md: one row per signature, with the shards that found it.
pub fn summary_markdown(m: &MergeFound) -> String {
    let mut s = String::from("# Found failures, merged\n\n");
    let _ = writeln!(
        s,
        "{} found files from {} shard directories: {} distinct failure signatures.\n",
        m.files,
        m.dirs.len(),
        m.findings.len()
    );
    if m.findings.is_empty() {
        return s;
    }
    s.push_str("| # | signature | shards | files | kept |\n|---|---|---|---|---|\n");
    for (i, f) in m.findings.iter().enumerate() {
        let shards: Vec<String> = f
            .shards
            .iter()
            .map(|&k| format!("`{}`", m.dirs[k].display()))
            .collect();
        let _ = writeln!(
            s,
            "| {} | {} | {} of {}: {} | {} | `{}` (from `{}`) |",
            i + 1,
            f.signature.to_string().replace('|', "\\|"),
            f.shards.len(),
            m.dirs.len(),
            shards.join(", "),
            f.files,
            f.kept_as,
            f.kept.path.display()
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(shard: usize, name: &str, size: u64, sig: &Signature) -> FoundFile {
        FoundFile {
            shard,
            path: PathBuf::from(format!("/s{shard}/{name}")),
            size,
            signature: sig.clone(),
        }
    }

    fn sig(inv: &str) -> Signature {
        Signature {
            mutants: vec!["m".into()],
            invariants: Some(vec![inv.into()]),
            faults: vec![],
            unknown_file: None,
        }
    }

    #[test]
    fn dedup_keeps_the_smallest_and_counts_shards() {
        let (a, b) = (sig("no-orphans"), sig("no-rotation"));
        let found = dedup(vec![
            file(0, "x.yaml", 300, &a),
            file(2, "y.yaml", 200, &a),
            file(1, "z.yaml", 200, &a),
            file(1, "x.yaml", 100, &b),
        ]);
        assert_eq!(found.len(), 2);
        assert_eq!(found[0].signature, a);
        assert_eq!(found[0].shards, vec![0, 1, 2]);
        assert_eq!(found[0].files, 3);
        // Equal sizes: the first by name.
        assert_eq!(found[0].kept.path, PathBuf::from("/s2/y.yaml"));
        // A second kept `x.yaml` (another signature) is named apart.
        assert_eq!(found[1].kept_as, "x.yaml");
        let clash = dedup(vec![file(0, "x.yaml", 1, &a), file(1, "x.yaml", 1, &b)]);
        assert_eq!(clash[0].kept_as, "x.yaml");
        assert_eq!(clash[1].kept_as, "shard2-x.yaml");
    }

    #[test]
    fn old_headers_give_mutants_and_new_ones_lists() {
        let old = "# Found by `drivelab explore b.yaml --mutant a-b` (explorer seed 1), shrunk.\n\
                   # Fails with --mutant a-b --mutant c: replay with `drivelab run f.yaml --mutant a-b --mutant c`.\nname: x\n";
        assert_eq!(mutants_of_old_header(old), vec!["a-b", "c"]);
        assert_eq!(write::read_list_header(old, write::FAILED_HEADER), None);
        let new = format!(
            "# {}\n# {}\nname: x\n",
            write::list_header(write::MUTANTS_HEADER, &[]),
            write::list_header(write::FAILED_HEADER, &["no-orphans", "converges"])
        );
        assert_eq!(
            write::read_list_header(&new, write::MUTANTS_HEADER),
            Some(vec![])
        );
        assert_eq!(
            write::read_list_header(&new, write::FAILED_HEADER),
            Some(vec!["no-orphans".to_string(), "converges".to_string()])
        );
    }

    #[test]
    fn every_committed_found_file_reads_with_a_distinct_signature() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/found");
        let files: Vec<FoundFile> = yaml_files(&dir)
            .unwrap()
            .iter()
            .map(|p| read_found(p, 0).unwrap())
            .collect();
        assert!(!files.is_empty());
        let n = files.len();
        let rotate = files
            .iter()
            .find(|f| f.name().contains("rotate-on-retry"))
            .expect("the rotate-on-retry found file");
        assert_eq!(rotate.signature.mutants, vec!["rotate-on-retry"]);
        // Old files: no invariants listed, so none collapse into another.
        assert_eq!(dedup(files).len(), n);
    }
}
