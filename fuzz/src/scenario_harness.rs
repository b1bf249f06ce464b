//! Fuzz harness for the scenario parser and validator (`drivelab::scenario::parse`):
//! any bytes must give a `Scenario` or a `ScenarioError` with a location —
//! never a panic, a hang or unbounded memory (YAML aliases, deep nesting).
//! Shared by the `scenario` fuzz target and `tests/fuzz_replay.rs`.

use std::path::Path;

/// Target `scenario`: parse + validate, the way `drivelab validate` reads a file
/// (invalid UTF-8 is refused before parsing, as `scenario::load` does).
pub fn scenario(data: &[u8]) {
    if data.len() as u64 > drivelab::scenario::MAX_SCENARIO_BYTES {
        return;
    }
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match drivelab::scenario::parse(Path::new("fuzz.yaml"), text) {
        Ok(s) => {
            // What validation accepted must also describe itself without panicking.
            let _ = format!("{s:?}");
        }
        Err(e) => {
            let shown = e.to_string();
            assert!(
                shown.starts_with("fuzz.yaml:"),
                "error without its file: {shown}"
            );
            assert!(!e.message.is_empty(), "error without a message");
        }
    }
}
