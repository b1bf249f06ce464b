//! drivelab: a simulated lab for end-to-end conformance testing of storage
//! control-plane drivers. The stages, in the order a run passes them:
//! `scenario` (parse + validate) → `engine` (fakes, driver, sidecar, virtual
//! clock) → `checks` (invariants) → `snapshot` (ownership) → `report`.

pub mod checks;
pub mod engine;
pub mod explore;
pub mod logcap;
pub mod report;
pub mod scenario;
pub mod snapshot;
