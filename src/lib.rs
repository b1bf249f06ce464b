//! drivelab: a simulated lab for end-to-end conformance testing of storage
//! control-plane drivers. The stages, in the order a run passes them:
//! `scenario` (parse + validate) → `engine` (fakes, driver, sidecar, virtual
//! clock) → `checks` (invariants) → `snapshot` (ownership) → `report`.

pub mod checks;
pub mod engine;
pub mod explore;
pub mod logcap;
pub mod report;
pub mod runs;
pub mod scenario;
pub mod snapshot;
#[cfg(feature = "containers")]
pub mod testcontainers;

/// `print!` that ends the process quietly when stdout is gone (`drivelab … | head`)
/// instead of panicking; SIGPIPE stays ignored so writes to dead sockets remain errors.
#[macro_export]
macro_rules! out {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        if write!(std::io::stdout(), $($t)*).is_err() {
            std::process::exit(141);
        }
    }};
}

/// `println!` with the same closed-pipe behaviour as [`out!`].
#[macro_export]
macro_rules! outln {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        if writeln!(std::io::stdout(), $($t)*).is_err() {
            std::process::exit(141);
        }
    }};
}
