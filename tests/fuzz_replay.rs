//! Replays every committed input of the `scenario` fuzz target (corpus and
//! fixed crashes, `fuzz/{corpus,regressions}/scenario/`) through the fuzzer's
//! own harness, so `make test` covers them without libFuzzer.

#[path = "../fuzz/src/scenario_harness.rs"]
mod harness;

#[test]
fn scenario_inputs() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut n = 0;
    for dir in ["corpus", "regressions"] {
        let Ok(rd) = std::fs::read_dir(root.join(dir).join("scenario")) else {
            continue;
        };
        for f in rd.filter_map(Result::ok).map(|e| e.path()) {
            let data = std::fs::read(&f).expect("read fuzz input");
            let r = std::panic::catch_unwind(|| harness::scenario(&data));
            assert!(
                r.is_ok(),
                "fuzz input {} fails the scenario target",
                f.display()
            );
            n += 1;
        }
    }
    assert!(n > 0, "no committed inputs for the scenario fuzz target");
}
