//! The converge loop's resync, made to cost what changed: a target whose last
//! pass answered Done having only read — no driver call, no API write, no
//! change to its sidecar's own state — and whose every read object is still
//! the version it saw, would do the same nothing again, so it is passed over.
//! Debug builds (every test, `make e2e`) make the pass anyway and fail the run
//! if it acted: the rule is checked on every scenario the tests run, and a
//! release run differs only in not making passes that would do nothing.

use std::collections::HashMap;

use anyhow::anyhow;
use drivelab_fakes::csi::cluster::{CsiSidecars, CsiTarget};
use drivelab_fakes::csi::Reconcile;
use drivelab_fakes::kube::reads::Reads;
use drivelab_fakes::kube::KubeFake;

/// Targets whose last pass was quiet, with what it read.
#[derive(Default)]
pub(super) struct Resync {
    quiet: HashMap<CsiTarget, Quiet>,
    /// Rounds, passes made and passes passed over, for the run's log.
    rounds: u64,
    passes: u64,
    passed_over: u64,
}

/// What a quiet pass read: API objects, and its sidecar's state generation.
struct Quiet {
    reads: Reads,
    generation: u64,
}

impl Resync {
    /// Reconcile `t` once, or pass over it (Done) if its last pass was quiet
    /// and nothing it read has changed. `after_pass` is awaited after a pass
    /// is made (the lab waits there for a crash the pass set off).
    pub(super) async fn pass<F: std::future::Future<Output = ()>>(
        &mut self,
        sidecars: &CsiSidecars,
        kube: &KubeFake,
        t: &CsiTarget,
        after_pass: impl FnOnce() -> F,
    ) -> anyhow::Result<Reconcile> {
        // For the debug check: another writer (a driver with its own API
        // client) can change what the pass reads after it was judged.
        let rv_before = cfg!(debug_assertions).then(|| kube.resource_version());
        let unchanged = match self.quiet.get(t) {
            Some(q) => sidecars.generation_of(t) == q.generation && kube.unchanged(&q.reads)?,
            None => false,
        };
        if unchanged {
            self.passed_over += 1;
            if !cfg!(debug_assertions) {
                return Ok(Reconcile::Done);
            }
        }
        self.passes += 1;
        let calls = sidecars.exchange_count_of(t);
        let generation = sidecars.generation_of(t);
        // Boxed: a sidecar pass is a deep future, and so would be every caller.
        let (r, reads) = Box::pin(Reads::track(sidecars.reconcile(t))).await;
        let r = r.map_err(|e| anyhow!("reconciling {t}: {e}"))?;
        after_pass().await;
        let acted = [
            (!matches!(r, Reconcile::Done), "did not answer Done"),
            (reads.wrote(), "wrote to the API"),
            (sidecars.exchange_count_of(t) != calls, "called the driver"),
            (
                sidecars.generation_of(t) != generation,
                "changed its sidecar's state",
            ),
        ];
        let acted: Vec<&str> = acted.iter().filter(|a| a.0).map(|a| a.1).collect();
        let others_wrote =
            rv_before.is_some_and(|rv| kube.resource_version() != rv + reads.writes());
        if unchanged && !acted.is_empty() && !others_wrote {
            anyhow::bail!(
                "lab bug: the resync would have passed over {t} as unchanged since its last \
                 quiet pass, but this pass {}",
                acted.join(", ")
            );
        }
        if acted.is_empty() && reads.is_checkable() {
            self.quiet.insert(t.clone(), Quiet { reads, generation });
        } else {
            self.quiet.remove(t);
        }
        Ok(r)
    }

    /// A round over `targets` (sorted) begins. Targets it no longer lists
    /// are forgotten once they could be as many as the listed ones: at most
    /// twice the live ones are kept, for O(1) a round amortised rather than a
    /// search per target.
    pub(super) fn keep_only(&mut self, targets: &[CsiTarget]) {
        self.rounds += 1;
        if self.quiet.len() > 2 * targets.len() {
            self.quiet.retain(|t, _| targets.binary_search(t).is_ok());
        }
    }

    /// (rounds, passes made, passes that were or would have been passed over).
    pub(super) fn counts(&self) -> (u64, u64, u64) {
        (self.rounds, self.passes, self.passed_over)
    }
}
