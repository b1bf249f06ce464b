//! The report layer end to end: the committed golden report is fresh, no
//! report file holds a secret, the HTML renders in headless Chromium, the JUnit
//! parses with junitparser, and merged shards equal the unsharded report.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use cosi_s3::Mutant;
use drivelab::engine::{self, RunOptions};
use drivelab::report::{self, cli, RunMeta, ScenarioReport};
use drivelab::scenario;
use rand::{Rng, SeedableRng};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

struct Generated {
    _dir: tempfile::TempDir,
    /// The suite, as `make e2e` writes it.
    suite: PathBuf,
    suite_reports: Vec<ScenarioReport>,
    /// retried-grant under rotate-on-retry: a report with failures.
    mutant: PathBuf,
}

/// Run the suite and one mutant run once for all tests here, exactly as
/// `drivelab run scenarios/ --report-dir …` does (relative paths, as in the Makefile).
fn generated() -> &'static Generated {
    static G: OnceLock<Generated> = OnceLock::new();
    G.get_or_init(|| {
        // Relative paths, as in `make e2e`, so replay commands match the golden copy.
        std::env::set_current_dir(root()).expect("cd to the package root");
        drivelab::logcap::init(false);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let dir = tempfile::tempdir().expect("tempdir");
            let paths = vec![PathBuf::from("scenarios/")];
            let suite = dir.path().join("e2e");
            let suite_reports = run_into(&suite, &paths, &[]).await;
            let mutant = dir.path().join("mutant");
            run_into(
                &mutant,
                &[PathBuf::from("scenarios/cosi/retried-grant.yaml")],
                &[Mutant::RotateOnRetry],
            )
            .await;
            Generated {
                _dir: dir,
                suite,
                suite_reports,
                mutant,
            }
        })
    })
}

async fn run_into(out: &Path, paths: &[PathBuf], mutants: &[Mutant]) -> Vec<ScenarioReport> {
    let files = scenario::discover(paths).expect("discover");
    let opts = RunOptions {
        seed: None,
        mutants: mutants
            .iter()
            .map(|m| drivelab::scenario::Mutant::Cosi(*m))
            .collect(),
        ..Default::default()
    };
    let mut reports = Vec::new();
    for f in files {
        let scn = scenario::load(&f).unwrap_or_else(|e| panic!("{e}"));
        let o = engine::run(&scn, &opts)
            .await
            .unwrap_or_else(|e| panic!("{}: {e:#}", f.display()));
        if mutants.is_empty() {
            assert!(o.passed(), "{}", report::console(&o));
            // The engine's own search of the snapshot, history and logs for every secret.
            assert!(
                o.verdicts
                    .iter()
                    .any(|v| v.invariant == "no-secret-leak" && v.passed),
                "{}",
                report::console(&o)
            );
        }
        let r = report::write_files(out, &o).expect("write scenario report");
        reports.push(r);
    }
    let names: Vec<String> = mutants.iter().map(|m| m.name().to_string()).collect();
    let meta = RunMeta {
        title: paths
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(" "),
        replay: cli::replay_all(paths, None, &names, None, None),
    };
    report::write_index(out, &meta, &reports).expect("write index");
    reports
}

fn tree(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    fn walk(base: &Path, d: &Path, out: &mut BTreeMap<String, Vec<u8>>) {
        let Ok(entries) = std::fs::read_dir(d) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(base, &p, out);
            } else {
                let rel = p
                    .strip_prefix(base)
                    .unwrap_or(&p)
                    .to_string_lossy()
                    .into_owned();
                out.insert(rel, std::fs::read(&p).unwrap_or_default());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

#[test]
fn golden_report_is_fresh() {
    let g = generated();
    let fresh = tree(&g.suite);
    let committed = tree(&root().join("reports/e2e"));
    let mut problems = Vec::new();
    for (name, bytes) in &fresh {
        match committed.get(name) {
            None => problems.push(format!("missing from reports/e2e: {name}")),
            Some(c) if c != bytes => {
                let (a, b) = (String::from_utf8_lossy(c), String::from_utf8_lossy(bytes));
                let first = a
                    .lines()
                    .zip(b.lines())
                    .position(|(x, y)| x != y)
                    .unwrap_or(a.lines().count().min(b.lines().count()));
                problems.push(format!(
                    "stale: {name} (first difference at line {}: committed {:?}, now {:?})",
                    first + 1,
                    a.lines().nth(first).unwrap_or(""),
                    b.lines().nth(first).unwrap_or("")
                ));
            }
            Some(_) => {}
        }
    }
    for name in committed.keys().filter(|n| !fresh.contains_key(*n)) {
        problems.push(format!("no longer generated, still in reports/e2e: {name}"));
    }
    assert!(
        problems.is_empty(),
        "the committed golden report is stale:\n  {}\nupdate it with `make e2e`, review the diff (`git diff reports/e2e`) and commit it",
        problems.iter().take(20).cloned().collect::<Vec<_>>().join("\n  ")
    );
}

/// The lab's admin secret for `seed`, derived as the engine derives it (the
/// first draw of its seeded RNG), so the search has a real secret of each run.
fn admin_secret(seed: u64) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(seed);
    (0..40)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect()
}

/// Words of exactly 40 letters/digits: the shape of every secret the lab and
/// the reference driver create (admin secret, `random_secret`), and 40-hex
/// predictable secrets too.
fn secret_shaped(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| w.len() == 40)
        .map(str::to_string)
        .collect()
}

#[test]
fn no_secret_in_any_report_file() {
    let g = generated();
    let mut checked = 0;
    for dir in [&g.suite, &g.mutant] {
        let files = tree(dir);
        assert!(
            files.len() > 10,
            "{}: only {} files written",
            dir.display(),
            files.len()
        );
        let seeds: Vec<u64> = g.suite_reports.iter().map(|r| r.seed).chain([1]).collect();
        for (name, bytes) in &files {
            let text = String::from_utf8_lossy(bytes);
            for s in &seeds {
                let secret = admin_secret(*s);
                assert!(
                    !text.contains(&secret),
                    "{}/{name} contains the admin secret of seed {s}",
                    dir.display()
                );
            }
            let shaped = secret_shaped(&text);
            assert!(
                shaped.is_empty(),
                "{}/{name} contains secret-shaped tokens (40 letters/digits): {:?}",
                dir.display(),
                shaped
            );
            // Nothing volatile either: no absolute paths of this machine.
            assert!(
                !text.contains(env!("CARGO_MANIFEST_DIR")),
                "{}/{name} contains an absolute path",
                dir.display()
            );
            checked += 1;
        }
    }
    // The mutant run rotated secrets: labels show it, values never.
    let summary = std::fs::read_to_string(g.mutant.join("cosi-retried-grant/summary.md")).unwrap();
    assert!(
        summary.contains("<secret-A>") && summary.contains("<secret-B>"),
        "{summary}"
    );
    assert!(checked > 100, "only {checked} files searched");
}

#[test]
fn mutant_report_shows_broken_claim_evidence_and_diff() {
    let g = generated();
    let md = std::fs::read_to_string(g.mutant.join("summary.md")).unwrap();
    assert!(md.contains("| `idempotent-replay` | **BROKEN** |"), "{md}");
    assert!(
        md.contains("*(stated by the scenario)*") || !md.contains("stated"),
        "{md}"
    );
    let page = std::fs::read_to_string(g.mutant.join("cosi-retried-grant/summary.md")).unwrap();
    assert!(page.contains("## Evidence: idempotent-replay"), "{page}");
    assert!(page.contains("DriverGrantBucketAccess"), "{page}");
    assert!(page.contains("- ") && page.contains("```diff"), "{page}");
    let run: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(g.mutant.join("run.json")).unwrap()).unwrap();
    assert_eq!(run["passed"], false);
    let verdicts = run["scenarios"][0]["verdicts"].as_array().unwrap();
    assert!(verdicts
        .iter()
        .any(|v| v["invariant"] == "idempotent-replay"
            && v["passed"] == false
            && !v["evidence"].as_array().unwrap().is_empty()));
}

#[test]
fn merged_shards_equal_the_unsharded_report() {
    let g = generated();
    let tmp = tempfile::tempdir().unwrap();
    let paths = vec![PathBuf::from("scenarios/")];
    let mut shards = Vec::new();
    for k in 1..=2 {
        let part = cli::Partition { k, n: 2 };
        let dir = tmp.path().join(format!("shard{k}"));
        // The shard holds the scenarios --partition would select.
        let files = cli::select(
            g.suite_reports
                .iter()
                .map(|r| PathBuf::from(&r.path))
                .collect(),
            None,
            Some(part),
        );
        let mine: Vec<ScenarioReport> = g
            .suite_reports
            .iter()
            .filter(|r| files.contains(&PathBuf::from(&r.path)))
            .cloned()
            .collect();
        for r in &mine {
            report::write_scenario(&dir, r).unwrap();
        }
        report::write_index(
            &dir,
            &RunMeta {
                title: "scenarios/".into(),
                replay: cli::replay_all(&paths, None, &[], None, Some(part)),
            },
            &mine,
        )
        .unwrap();
        shards.push(dir);
    }
    let merged = tmp.path().join("merged");
    let reports = report::merge(&shards, &merged).unwrap();
    assert_eq!(reports.len(), g.suite_reports.len());
    for f in ["summary.md", "index.html", "junit.xml", "run.json"] {
        let a = std::fs::read_to_string(g.suite.join(f)).unwrap();
        let b = std::fs::read_to_string(merged.join(f)).unwrap();
        assert!(a == b, "merged {f} differs from the unsharded one");
    }
}

fn chromium() -> Option<String> {
    if let Ok(c) = std::env::var("DRIVELAB_CHROMIUM") {
        return Some(c);
    }
    ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .find(|c| {
            Command::new(c)
                .arg("--version")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
        .map(|c| c.to_string())
}

/// Run `cmd` with a deadline; returns (success, stdout, stderr). The pipes are
/// drained while it runs: a DOM dump bigger than a pipe buffer would otherwise
/// block the browser on its write and look like a hang.
fn run_with_deadline(cmd: &mut Command, limit: Duration) -> (bool, String, String) {
    use std::io::Read;
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = r.read_to_end(&mut buf);
            buf
        })
    };
    let out = drain(Box::new(child.stdout.take().expect("stdout")));
    let err = drain(Box::new(child.stderr.take().expect("stderr")));
    let start = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if start.elapsed() > limit => {
                let _ = child.kill();
                panic!("{cmd:?} did not finish within {limit:?}");
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(100)),
            Err(e) => panic!("waiting for {cmd:?}: {e}"),
        }
    };
    let out = out.join().unwrap_or_default();
    let err = err.join().unwrap_or_default();
    (
        status.success(),
        String::from_utf8_lossy(&out).into_owned(),
        String::from_utf8_lossy(&err).into_owned(),
    )
}

#[test]
fn html_renders_lanes_and_the_failure_in_headless_chromium() {
    let Some(browser) = chromium() else {
        if std::env::var("DRIVELAB_SKIP_BROWSER").as_deref() == Ok("1") {
            eprintln!("skipping the browser test: DRIVELAB_SKIP_BROWSER=1 and no chromium");
            return;
        }
        panic!("chromium is not installed: `apt-get install chromium` (make test does it), or set DRIVELAB_SKIP_BROWSER=1 to skip");
    };
    let g = generated();
    let page = g.mutant.join("cosi-retried-grant/index.html");
    let url = format!("file://{}", page.display());
    let base = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        "--allow-file-access-from-files",
    ];
    let (ok, dom, err) = run_with_deadline(
        Command::new(&browser)
            .args(base)
            .arg("--dump-dom")
            .arg(&url),
        Duration::from_secs(120),
    );
    assert!(ok, "chromium --dump-dom failed:\n{err}");
    for lane in ["sidecar", "driver", "s3admin", "s3", "kube", "workload"] {
        assert!(
            dom.contains(&format!("data-lane=\"{lane}\"")),
            "lane {lane} not rendered:\n{}",
            &dom[..dom.len().min(2000)]
        );
    }
    assert!(
        dom.contains("class=\"call failing\""),
        "no failing call highlighted"
    );
    assert!(dom.contains("failing-step"), "no failing step highlighted");
    assert!(
        dom.contains("id=\"evidence-idempotent-replay\""),
        "no evidence section"
    );
    assert!(dom.contains("BROKEN"), "no broken claim");
    let shots = root().join("reports/screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    let shot = shots.join("cosi-retried-grant-rotate-on-retry.png");
    let _ = std::fs::remove_file(&shot);
    let (ok, _, err) = run_with_deadline(
        Command::new(&browser)
            .args(base)
            .arg("--window-size=1400,1300")
            .arg(format!("--screenshot={}", shot.display()))
            .arg(&url),
        Duration::from_secs(120),
    );
    assert!(ok && shot.is_file(), "chromium --screenshot failed:\n{err}");
    assert!(
        std::fs::metadata(&shot).unwrap().len() > 10_000,
        "screenshot suspiciously small"
    );
    println!("screenshot: {}", shot.display());
    // The run index renders too.
    let (ok, dom, err) = run_with_deadline(
        Command::new(&browser)
            .args(base)
            .arg("--dump-dom")
            .arg(format!("file://{}", g.suite.join("index.html").display())),
        Duration::from_secs(120),
    );
    assert!(
        ok && dom.contains("cosi-happy-path"),
        "index page did not render:\n{err}"
    );
}

fn python() -> String {
    std::env::var("DRIVELAB_PYTHON").unwrap_or_else(|_| "python3".to_string())
}

#[test]
fn junit_parses_with_junitparser() {
    let probe = Command::new(python())
        .args(["-c", "import junitparser, pytest"])
        .output();
    match probe {
        Ok(o) if o.status.success() => {}
        Ok(o) => panic!("junitparser is missing ({}): run `pip install -r tests/python/requirements.txt`", String::from_utf8_lossy(&o.stderr).trim()),
        Err(e) => panic!("cannot run {} ({e}): install Python 3, then `pip install -r tests/python/requirements.txt`", python()),
    }
    let g = generated();
    let mut files = vec![g.suite.join("junit.xml"), g.mutant.join("junit.xml")];
    files.extend(
        g.suite_reports
            .iter()
            .map(|r| g.suite.join(&r.dir).join("junit.xml")),
    );
    let joined = std::env::join_paths(&files).unwrap();
    let (ok, out, err) = run_with_deadline(
        Command::new(python())
            .args([
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                "tests/python/test_junit.py",
            ])
            .current_dir(root())
            .env("JUNIT_FILES", joined)
            .env("JUNIT_FAILING_FILE", g.mutant.join("junit.xml")),
        Duration::from_secs(300),
    );
    println!("{out}\n{err}");
    assert!(ok, "pytest failed:\n{out}\n{err}");
    assert!(
        out.contains("passed") && !out.contains("skipped"),
        "pytest ran no test or skipped some:\n{out}"
    );
}
