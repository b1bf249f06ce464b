//! Issue 10 item 5 — secrets and reach, over the whole suite the way `make e2e`
//! runs it (every scenario under `scenarios/`, reports written, logs as JSON).
//!
//! Where the secrets come from, honestly: the run itself. The test drives the
//! engine in-process through the library (`engine::run`, then the same
//! `report::write_scenario` / `write_index` calls `drivelab run --report-dir`
//! makes), because only in-process can it read `RunOutcome::secrets` — every
//! secret value that run created or handed out (the lab's admin secret, every
//! backend user's secret key, every credential a grant returned), taken from
//! the fakes' state before anything is labelled. Running the binary instead
//! would create different secrets (the reference driver's are random, as the
//! unpredictable-secrets invariant demands), so its files could not be scanned
//! for them. Logs are captured as JSON lines exactly as `--log-format json`
//! does (`logcap::init_with(false, true)`) and written to a file in the report
//! directory, so "every file written and every log line" is one scan.
//!
//! Reach: while the suite runs, a sampler reads `/proc/net/tcp` and
//! `/proc/net/tcp6` and keeps every socket in LISTEN state whose inode is one
//! of this process's fds; each must be bound to 127.0.0.1 (no 0.0.0.0, no
//! IPv6 wildcard). The lab has no `--listen` option yet, so loopback is the
//! only allowed answer.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use drivelab::{engine, report, scenario};

/// Inodes of this process's sockets.
fn own_socket_inodes() -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    if let Ok(rd) = std::fs::read_dir("/proc/self/fd") {
        for e in rd.flatten() {
            if let Ok(t) = std::fs::read_link(e.path()) {
                let t = t.to_string_lossy().into_owned();
                if let Some(i) = t.strip_prefix("socket:[").and_then(|s| s.strip_suffix(']')) {
                    out.insert(i.to_string());
                }
            }
        }
    }
    out
}

/// (table, local address in /proc hex form) of this process's listening TCP sockets.
fn own_listeners() -> Vec<(String, String)> {
    let mine = own_socket_inodes();
    let mut out = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            // local_address, state (0A = LISTEN), inode
            if f.len() > 9 && f[3] == "0A" && mine.contains(f[9]) {
                out.push((table.to_string(), f[1].to_string()));
            }
        }
    }
    out
}

fn is_loopback_v4(local: &str) -> bool {
    // /proc prints the IPv4 address as little-endian hex: 127.0.0.1 is 0100007F.
    local.split(':').next() == Some("0100007F")
}

fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read report dir").flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

#[test]
fn full_suite_writes_and_logs_no_secret_and_listens_on_loopback_only() {
    drivelab::logcap::init_with(false, true);
    let log_start = drivelab::logcap::position();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let files = scenario::discover(&[root.join("scenarios")]).expect("scenarios/");
    assert!(files.len() >= 20, "the suite is {} files", files.len());
    let out = tempfile::tempdir().expect("tempdir");

    // Sample listeners for the whole run.
    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Mutex::new(BTreeSet::new()));
    let sampler = {
        let (stop, seen) = (stop.clone(), seen.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                seen.lock().unwrap().extend(own_listeners());
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        })
    };

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut secrets = Vec::new();
    let mut reports = Vec::new();
    // The durable run records (`drivelab run` writes them too) are scanned with the rest.
    let runs = drivelab::runs::RunStore::new(out.path().join("runs"));
    rt.block_on(async {
        for f in &files {
            let scn = scenario::load(f).unwrap_or_else(|e| panic!("{e}"));
            let recorder = runs
                .begin(drivelab::runs::RunMeta {
                    id: String::new(),
                    scenario: scn.name.clone(),
                    path: f.display().to_string(),
                    seed: 0,
                    mutants: vec![],
                    replay: String::new(),
                    started_unix: 0,
                })
                .expect("begin a run record");
            let opts = engine::RunOptions {
                recorder: Some(recorder.clone()),
                ..Default::default()
            };
            let o = engine::run(&scn, &opts)
                .await
                .unwrap_or_else(|e| panic!("{}: {e:#}", f.display()));
            secrets.extend(o.secrets.iter().map(|s| s.expose().to_string()));
            let r = report::ScenarioReport::from_outcome(&o);
            recorder.complete(&r).expect("complete the run record");
            report::write_scenario(out.path(), &r).expect("write report");
            reports.push(r);
        }
    });
    assert_eq!(runs.ids().unwrap().len(), files.len(), "one record per run");
    report::write_index(
        out.path(),
        &report::RunMeta {
            title: "scenarios/".into(),
            replay: "drivelab run scenarios/".into(),
        },
        &reports,
    )
    .expect("write index");
    std::fs::write(
        out.path().join("drivelab.log.jsonl"),
        drivelab::logcap::since(log_start),
    )
    .expect("write log");
    stop.store(true, Ordering::SeqCst);
    sampler.join().unwrap();

    // Secrets: every file, every log line.
    secrets.sort();
    secrets.dedup();
    secrets.retain(|s| s.len() >= 8);
    assert!(
        secrets.len() >= files.len(),
        "only {} secrets collected",
        secrets.len()
    );
    let written = files_under(out.path());
    assert!(
        written.len() > files.len() * 4,
        "only {} files written",
        written.len()
    );
    let log = std::fs::read_to_string(out.path().join("drivelab.log.jsonl")).unwrap();
    assert!(log.lines().count() > 0, "no log lines captured");
    let mut hits = Vec::new();
    for p in &written {
        let text = String::from_utf8_lossy(&std::fs::read(p).unwrap()).into_owned();
        for (n, line) in text.lines().enumerate() {
            for s in &secrets {
                if line.contains(s.as_str()) {
                    hits.push(format!(
                        "{}:{}",
                        p.strip_prefix(out.path()).unwrap().display(),
                        n + 1
                    ));
                }
            }
        }
    }
    assert!(
        hits.is_empty(),
        "{} secret occurrences: {:?}",
        hits.len(),
        &hits[..hits.len().min(20)]
    );
    // The scan can fail: a file with a secret in it is found.
    let canary = out.path().join("canary.txt");
    std::fs::write(&canary, format!("x {} y", secrets[0])).unwrap();
    let t = std::fs::read_to_string(&canary).unwrap();
    assert!(secrets.iter().any(|s| t.contains(s.as_str())));

    // Reach.
    let seen = seen.lock().unwrap().clone();
    assert!(
        seen.len() >= 2,
        "the sampler saw {} listeners (S3 and kube at least)",
        seen.len()
    );
    let wild: Vec<_> = seen
        .iter()
        .filter(|(table, local)| table.ends_with("tcp6") || !is_loopback_v4(local))
        .collect();
    assert!(wild.is_empty(), "listeners not on 127.0.0.1: {wild:?}");
    assert!(!is_loopback_v4("00000000:1F90"), "0.0.0.0 must not pass");
}
