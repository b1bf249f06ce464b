//! Campaigns: explore shards (`--partition k/n`, `--completion-index i/n`)
//! together run exactly the stream one unguided run does and find the same
//! failure signatures once merged (`merge-found`); the CI workflow and the
//! Kubernetes Job hand out shard numbers 1..n (0..n-1) exactly once.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use drivelab::explore::merge::{read_found, Signature};
use serde_json::Value;

const BASE: &str = "scenarios/explore/cosi-lifecycle.yaml";
/// Small enough for seconds, large enough that rotate-on-retry fails several
/// schedules of seed 1 (a handful of distinct signatures).
const CASES: &str = "30";

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn drivelab(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_drivelab"));
    c.current_dir(root()).args(args).env("NO_COLOR", "1");
    c
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A manifest as stream number → (schedule hash, verdict).
fn manifest(path: &Path) -> BTreeMap<u64, (String, String)> {
    let t = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    t.lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            assert_eq!(f.len(), 3, "manifest line `{l}`");
            let s = f[0]
                .parse()
                .unwrap_or_else(|_| panic!("stream number in `{l}`"));
            (s, (f[1].to_string(), f[2].to_string()))
        })
        .collect()
}

/// The signatures of the files `merge-found` kept in `out`.
fn kept_signatures(out: &Path) -> BTreeSet<Signature> {
    let summary = out.join("SUMMARY.md");
    assert!(summary.is_file(), "{} written", summary.display());
    std::fs::read_dir(out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .map(|p| read_found(&p, 0).unwrap().signature)
        .collect()
}

/// One exploration process: (shard flags, its dir).
fn explore(flags: &[&str], dir: &Path) -> std::process::Child {
    let (found, man) = (dir.join("found"), dir.join("manifest.tsv"));
    let mut args = vec![
        "explore",
        BASE,
        "--seed",
        "1",
        "--cases",
        CASES,
        "--mutant",
        "rotate-on-retry",
        "--keep-going",
        "--out-dir",
        found.to_str().unwrap(),
        "--manifest",
        man.to_str().unwrap(),
    ];
    args.extend_from_slice(flags);
    drivelab(&args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn partitions_explore_the_unguided_stream_and_merge_to_its_signatures() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = |n: &str| tmp.path().join(n);
    // Shard 2 comes as a Kubernetes Indexed Job gives it: index 1 of 3.
    let shards: [(&[&str], &str); 3] = [
        (&["--partition", "1/3"], "1/3"),
        (&["--completion-index", "1/3"], "2/3"),
        (&["--partition", "3/3"], "3/3"),
    ];
    let mut children: Vec<_> = shards
        .iter()
        .enumerate()
        .map(|(i, (flags, _))| explore(flags, &dir(&format!("shard-{i}"))))
        .collect();
    children.push(explore(&["--no-guide"], &dir("single")));
    let outs: Vec<Output> = children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect();
    for (o, (_, name)) in outs.iter().zip(&shards) {
        let t = text(o);
        // Exit 1: this shard found something (2 would be a lab error).
        assert!(matches!(o.status.code(), Some(0 | 1)), "shard {name}: {t}");
        assert!(
            t.contains(&format!("partition {name}: coverage guide off")),
            "shard {name} says so: {t}"
        );
        assert!(
            t.contains(&format!("--partition {name} --keep-going")),
            "shard {name}'s replay line: {t}"
        );
    }
    assert_eq!(outs[3].status.code(), Some(1), "{}", text(&outs[3]));
    assert!(text(&outs[3]).contains("--no-guide --keep-going"));

    let single = manifest(&dir("single/manifest.tsv"));
    assert_eq!(single.len(), 30, "no duplicate in 30 draws of seed 1");
    let mut union = BTreeMap::new();
    for k in 0..3u64 {
        let m = manifest(&dir(&format!("shard-{k}/manifest.tsv")));
        assert!(!m.is_empty());
        for (s, v) in m {
            assert_eq!(s % 3, k, "shard {} ran stream {s}", k + 1);
            assert!(union.insert(s, v).is_none(), "stream {s} ran twice");
        }
    }
    // Same stream numbers, same schedules, same verdicts.
    assert_eq!(union, single);

    let merge = |dirs: &[PathBuf], out: &Path| {
        let mut args = vec!["merge-found".to_string()];
        args.extend(dirs.iter().map(|d| d.display().to_string()));
        args.extend(["--out".to_string(), out.display().to_string()]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = drivelab(&args).output().unwrap();
        assert_eq!(o.status.code(), Some(1), "found, so exit 1: {}", text(&o));
        kept_signatures(out)
    };
    let shard_dirs: Vec<PathBuf> = (0..3).map(|k| dir(&format!("shard-{k}"))).collect();
    let merged = merge(&shard_dirs, &dir("merged"));
    let alone = merge(&[dir("single")], &dir("merged-single"));
    assert!(
        alone.len() >= 2,
        "rotate-on-retry found in several ways: {alone:?}"
    );
    assert!(alone.iter().all(|s| s.invariants.is_some()));
    assert_eq!(merged, alone);
}

#[test]
fn bad_shard_numbers_are_refused() {
    for (flag, v) in [
        ("--partition", "0/3"),
        ("--partition", "4/3"),
        ("--partition", "3"),
        ("--completion-index", "3/3"),
        ("--completion-index", "x/3"),
    ] {
        let o = drivelab(&["explore", BASE, "--cases", "1", flag, v])
            .output()
            .unwrap();
        let t = text(&o);
        assert_eq!(o.status.code(), Some(2), "{flag} {v}: {t}");
        assert!(t.contains(flag) && t.contains(v), "{flag} {v} named: {t}");
    }
}

fn yaml(rel: &str) -> Vec<Value> {
    let t = std::fs::read_to_string(root().join(rel)).unwrap();
    serde_saphyr::from_multiple(&t).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// `matrix.shard` is 1..n exactly once, with n = the one `matrix.shards`.
fn shard_count(job: &str, matrix: &Value) -> u64 {
    let shards = matrix["shards"]
        .as_array()
        .unwrap_or_else(|| panic!("{job}: shards"));
    assert_eq!(shards.len(), 1, "{job}: one shard count");
    let n = shards[0].as_u64().unwrap();
    let mut ks: Vec<u64> = matrix["shard"]
        .as_array()
        .unwrap_or_else(|| panic!("{job}: shard list"))
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    ks.sort_unstable();
    assert_eq!(
        ks,
        (1..=n).collect::<Vec<_>>(),
        "{job}: shards 1..{n} once each"
    );
    n
}

#[test]
fn the_campaign_workflow_covers_every_shard_once_and_merges_them_all() {
    let wf = yaml(".github/workflows/campaign.yml").remove(0);
    let jobs = wf["jobs"].as_object().expect("jobs");
    let mut sharded = Vec::new();
    for (name, job) in jobs {
        let matrix = &job["strategy"]["matrix"];
        if matrix.get("shard").is_none() {
            continue;
        }
        shard_count(name, matrix);
        let runs: Vec<&str> = job["steps"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|s| s["run"].as_str())
            .collect();
        assert!(
            runs.iter()
                .any(|r| r.contains("--partition ${{ matrix.shard }}/${{ matrix.shards }}")),
            "{name} passes its shard: {runs:?}"
        );
        sharded.push(name.clone());
    }
    sharded.sort();
    assert_eq!(sharded, ["explore", "seed-sweep", "suite"]);
    let merge = &jobs["merge"];
    let needs: BTreeSet<&str> = merge["needs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert!(
        sharded.iter().all(|j| needs.contains(j.as_str())),
        "{needs:?}"
    );
    let runs: String = merge["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["run"].as_str())
        .collect();
    assert!(runs.contains("drivelab merge-reports shards/suite-*"));
    assert!(runs.contains("drivelab merge-found shards/explore-*"));
    assert!(
        runs.contains("shards/sweep-*"),
        "the seed sweep's shards are gathered"
    );
}

#[test]
fn the_indexed_job_and_its_gather_pod_agree_on_n() {
    let docs = yaml("deploy/k8s/explore-job.yaml");
    let job = docs.iter().find(|d| d["kind"] == "Job").expect("a Job");
    let spec = &job["spec"];
    assert_eq!(spec["completionMode"], "Indexed");
    let n = spec["completions"].as_u64().unwrap();
    assert!(spec["parallelism"].as_u64().unwrap() <= n);
    let c = &spec["template"]["spec"]["containers"][0];
    let args: Vec<&str> = c["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    let at = args
        .iter()
        .position(|a| *a == "--completion-index")
        .unwrap();
    assert_eq!(args[at + 1], format!("$(JOB_COMPLETION_INDEX)/{n}"));
    // The base it explores is one of ours (the ConfigMap is made from scenarios/explore/).
    let base = args[1]
        .strip_prefix("/bases/")
        .expect("a base under /bases");
    assert!(root().join("scenarios/explore").join(base).is_file());

    // The args run: pod 0's command line, with its paths here and no cases.
    let tmp = tempfile::tempdir().unwrap();
    let cases = args.iter().position(|a| *a == "--cases").unwrap() + 1;
    let here: Vec<String> = args
        .iter()
        .enumerate()
        .map(|(i, a)| {
            if i == cases {
                return "0".to_string();
            }
            a.replace("$(JOB_COMPLETION_INDEX)", "0")
                .replace("/bases/", "scenarios/explore/")
                .replace("/results", &tmp.path().display().to_string())
        })
        .collect();
    let here: Vec<&str> = here.iter().map(String::as_str).collect();
    let o = drivelab(&here).output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        text(&o).contains(&format!("partition 1/{n}")),
        "{}",
        text(&o)
    );
    assert!(tmp.path().join("shard-0/manifest.tsv").is_file());

    let gather = yaml("deploy/k8s/explore-gather.yaml").remove(0);
    let merge = &gather["spec"]["initContainers"][0]["args"];
    let args: Vec<&str> = merge
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(args[0], "merge-found");
    let dirs: Vec<&str> = args[1..]
        .iter()
        .take_while(|a| !a.starts_with("--"))
        .copied()
        .collect();
    let want: Vec<String> = (0..n).map(|i| format!("/results/shard-{i}")).collect();
    assert_eq!(dirs, want, "one dir per completion index");
}
