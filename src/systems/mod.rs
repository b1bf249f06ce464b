//! The systems a scenario can stand up, one folder each: its scenario
//! section, its lab (what it stands up and how it applies its steps), its
//! observations and checks, and its ownership snapshot. The shared run loop
//! (`crate::engine`) drives every one; [`run`] is where each is registered.

pub mod bosh;
pub mod cosi;
pub mod csi;

use crate::engine::{RunOptions, RunOutcome};
use crate::scenario::{Mutant, Scenario, System};

/// Stand up the scenario's system, run its steps and judge it.
pub(crate) async fn run(
    scn: &Scenario,
    opts: &RunOptions,
    seed: u64,
    mutants: &[Mutant],
) -> anyhow::Result<RunOutcome> {
    match scn.system() {
        System::Cosi => cosi::run(scn, opts, seed, mutants).await,
        System::Csi => csi::run(scn, opts, seed, mutants).await,
    }
}
