//! The fuzz harnesses behind the targets in `fuzz_targets/`; the same files are
//! compiled into the replay tests (`fakes/tests/fuzz_replay.rs`,
//! `tests/fuzz_replay.rs`) so `make test` runs every committed input.

#[path = "fakes_harness.rs"]
pub mod fakes;
#[path = "scenario_harness.rs"]
pub mod scenario;
