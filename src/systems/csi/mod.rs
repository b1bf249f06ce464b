//! CSI: the block-storage system — the external-provisioner, -attacher and
//! -snapshotter, the snapshot-metadata sidecar, kubelets with their mount
//! tables over the Kubernetes API, and the driver under test (controller and
//! node plugins), with or without a backend; its checks and snapshot.

mod cbt;
pub mod checks;
mod lab;
mod resync;
pub mod samples;
pub mod scenario;
pub mod snapshot;
pub mod steps;
pub mod sweep;

pub use lab::ServedCsi;

use crate::engine::{RunOptions, RunOutcome};
use crate::scenario::{Mutant, Scenario};

/// Stand up a CSI scenario's lab, run it and judge it.
pub(crate) async fn run(
    scn: &Scenario,
    opts: &RunOptions,
    seed: u64,
    mutants: &[Mutant],
) -> anyhow::Result<RunOutcome> {
    lab::run(
        scn,
        seed,
        mutants,
        opts.step_snapshots,
        opts.recorder.as_ref(),
    )
    .await
}
