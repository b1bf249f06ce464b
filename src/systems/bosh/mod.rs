//! BOSH: not a system of its own but the backend a CSI scenario may stand up
//! for its driver — the Director, UAA, CPI, agents and the IaaS block API —
//! and its `bosh:` section of the scenario language.

pub(crate) mod backend;
pub mod scale;
pub mod scenario;
pub mod steps;
