//! Replays every committed fuzz input for the fakes — the corpus
//! (`fuzz/corpus/<target>/`) and the crashes found and fixed
//! (`fuzz/regressions/<target>/`) — through the same harness the fuzzer runs
//! (`fuzz/src/fakes_harness.rs`), so `make test` covers them without libFuzzer.

#[path = "../../fuzz/src/fakes_harness.rs"]
mod harness;

use std::path::{Path, PathBuf};

fn inputs(target: &str) -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
    let mut out = Vec::new();
    for dir in ["corpus", "regressions"] {
        if let Ok(rd) = std::fs::read_dir(root.join(dir).join(target)) {
            out.extend(
                rd.filter_map(Result::ok)
                    .map(|e| e.path())
                    .filter(|p| p.is_file()),
            );
        }
    }
    out.sort();
    out
}

fn replay(target: &str, run: fn(&[u8])) {
    let files = inputs(target);
    assert!(
        !files.is_empty(),
        "no committed inputs for fuzz target {target}"
    );
    for f in files {
        let data = std::fs::read(&f).expect("read fuzz input");
        // A panic names the input that caused it.
        let r = std::panic::catch_unwind(|| run(&data));
        assert!(
            r.is_ok(),
            "fuzz input {} fails target {target}",
            f.display()
        );
    }
}

#[test]
fn s3_http_inputs() {
    replay("s3_http", harness::s3_http);
}

#[test]
fn admin_http_inputs() {
    replay("admin_http", harness::admin_http);
}

#[test]
fn kube_http_inputs() {
    replay("kube_http", harness::kube_http);
}

#[test]
fn madmin_inputs() {
    replay("madmin", harness::madmin);
}

#[test]
fn director_http_inputs() {
    replay("director_http", harness::director_http);
}

#[test]
fn cpi_json_inputs() {
    replay("cpi_json", harness::cpi_json);
}
