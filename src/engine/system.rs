//! The one run loop every system's lab plugs into. The loop owns what is the
//! same for every system — step headers and durable checkpoints, faults,
//! partitions and heals, expectations, step boundaries and per-step snapshots —
//! and hands each system its own steps through [`SystemLab`].

use drivelab_fakes::history::{EventKind, History};

use super::hook::LabHook;
use super::{ExpectFailure, StepSnapshots};
use crate::scenario::{Expectation, Located, Scenario, Step};
use crate::snapshot::SnapshotTrail;

/// What the run loop asks of a system's lab (COSI, CSI).
pub(crate) trait SystemLab: Send {
    /// The run's history.
    fn history(&self) -> &History;
    /// The fault hook: faults, partitions, heals.
    fn hook(&self) -> &LabHook;
    /// Append what happened since the last boundary to the run's durable record.
    fn checkpoint(&self, steps_done: usize);
    /// A step that is not an expectation begins: its own driver calls start here.
    fn begin_step(&mut self);
    /// Apply one of the system's own steps (anything but expect, fault,
    /// partition and heal, which the loop does).
    fn apply<'a>(
        &'a mut self,
        scn: &'a Scenario,
        index: usize,
        step: &'a Located<Step>,
        at: &'a str,
    ) -> futures_util::future::BoxFuture<'a, anyhow::Result<()>>;
    /// What did not hold of an expectation (empty: it held).
    fn expect(&self, e: &Expectation) -> Vec<String>;
    /// Observe the system at the boundary after step `index`.
    fn observe(&mut self, index: usize);
    /// The ownership snapshot as it is now.
    fn render_snapshot(&mut self) -> anyhow::Result<String>;
    /// Where the loop keeps failed expectations and per-step snapshots.
    fn steps_record(&mut self) -> &mut StepsRecord;
}

/// What the loop collects while the steps run.
#[derive(Default)]
pub(crate) struct StepsRecord {
    /// Failed `expect:` steps.
    pub expect_failures: Vec<ExpectFailure>,
    /// `expect:` steps marked `reference_design: true` that were not judged
    /// because the driver is not a reference driver in its reference design.
    pub expect_not_exercised: Vec<ExpectFailure>,
    /// What each step changed in the ownership snapshot, for before/after diffs.
    pub step_snapshots: SnapshotTrail,
}

/// Run `scn`'s steps in order on `lab`.
pub(crate) async fn run_steps(
    lab: &mut dyn SystemLab,
    scn: &Scenario,
    snapshots: StepSnapshots,
) -> anyhow::Result<()> {
    for (i, step) in scn.steps.iter().enumerate() {
        let at = format!("{}:{}:{}", scn.path.display(), step.line, step.col);
        lab.history().record(EventKind::Step {
            index: i,
            name: step.value.describe(),
        });
        // After the step's header: a lab killed in step i shows which one it was in.
        lab.checkpoint(i);
        let expectation = matches!(step.value, Step::Expect(_));
        if !expectation {
            lab.begin_step();
        }
        match &step.value {
            Step::Expect(e) if e.reference_design && !scn.driver.is_reference_design() => {
                // Judging it would fail a correct driver for a different shape,
                // and skipping it silently would read as a pass: say so instead.
                lab.steps_record().expect_not_exercised.push(ExpectFailure {
                    step: i + 1,
                    at: at.clone(),
                    message: format!(
                        "not exercised (reference-design expectation): {} is not the reference design",
                        scn.driver.describe()
                    ),
                });
            }
            Step::Expect(e) => {
                for message in lab.expect(e) {
                    lab.steps_record().expect_failures.push(ExpectFailure {
                        step: i + 1,
                        at: at.clone(),
                        message,
                    });
                }
            }
            Step::Fault(f) => lab.hook().arm(f.clone(), &super::line_of(&scn.path, step)),
            Step::Partition(p) => lab
                .hook()
                .partition(p.clone(), &super::line_of(&scn.path, step)),
            Step::Heal(h) => lab.hook().heal(h.between),
            _ => lab.apply(scn, i, step, &at).await?,
        }
        lab.observe(i);
        if snapshots == StepSnapshots::Every && !expectation {
            let text = lab.render_snapshot()?;
            lab.steps_record()
                .step_snapshots
                .push(i, step.value.describe(), text);
        }
    }
    Ok(())
}
