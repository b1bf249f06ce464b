//! drivelab: a simulated lab for end-to-end conformance testing of storage
//! control-plane drivers. The stages, in the order a run passes them:
//! `scenario` (parse + validate) → `engine` (the run loop, the driver, the
//! fault hook, the virtual clock) driving one of `systems` (COSI, CSI; each
//! with its lab, checks and ownership snapshot over the shared `checks` and
//! `snapshot` vocabulary), producing an `outcome` and the record its checks
//! judged → `runs` (the durable record; `drivelab report RUN` judges a stored
//! record again) → `report`.

pub mod alloc;
pub mod checks;
pub mod engine;
pub mod explore;
pub mod logcap;
pub mod outcome;
pub mod packed;
pub mod phases;
pub mod prefixed;
pub mod report;
pub mod runs;
pub mod scenario;
pub mod snapshot;
pub mod systems;
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
