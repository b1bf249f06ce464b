//! The sidecar's work queue on the virtual clock. Items are reconciled one at a
//! time in (due time, insertion) order, so a run is a deterministic function
//! of the scenario, the seed and the driver's answers.

use std::collections::BTreeMap;
use std::time::Duration;

use drivelab_fakes::clock::{SimClock, VTime};
use drivelab_fakes::cosi_sidecar::Target;

/// Pending reconciles, keyed by due time then insertion order.
#[derive(Default, Debug)]
pub struct WorkQueue {
    items: BTreeMap<(VTime, u64), Target>,
    next: u64,
}

impl WorkQueue {
    /// Schedule `target` at `at` unless it is already queued (the real
    /// workqueue de-duplicates too); an earlier time wins.
    pub fn push(&mut self, at: VTime, target: Target) {
        if let Some((&k, _)) = self.items.iter().find(|(_, t)| **t == target) {
            if k.0 <= at {
                return;
            }
            self.items.remove(&k);
        }
        self.next += 1;
        self.items.insert((at, self.next), target);
    }

    /// The earliest item if it is due no later than `deadline`.
    pub fn pop_due(&mut self, deadline: VTime) -> Option<(VTime, Target)> {
        let (&k, _) = self.items.iter().next()?;
        if k.0 > deadline {
            return None;
        }
        self.items.remove(&k).map(|t| (k.0, t))
    }

    /// What is still queued, in order.
    pub fn pending(&self) -> Vec<(VTime, Target)> {
        self.items.iter().map(|(k, t)| (k.0, t.clone())).collect()
    }

    /// Nothing queued.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

/// Deadline for a convergence window starting now.
pub fn deadline(clock: &SimClock, within: Duration) -> VTime {
    clock.now().after(within)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(n: &str) -> Target {
        Target::Claim {
            namespace: "default".into(),
            name: n.into(),
        }
    }

    #[test]
    fn pops_in_time_then_insertion_order_and_dedups() {
        let mut q = WorkQueue::default();
        q.push(VTime(100), claim("b"));
        q.push(VTime(0), claim("a"));
        q.push(VTime(100), claim("c"));
        q.push(VTime(500), claim("a")); // already queued earlier: ignored
        assert_eq!(q.pop_due(VTime(1000)).map(|x| x.1), Some(claim("a")));
        assert_eq!(q.pop_due(VTime(1000)).map(|x| x.1), Some(claim("b")));
        assert_eq!(q.pop_due(VTime(50)), None);
        assert_eq!(q.pop_due(VTime(1000)).map(|x| x.1), Some(claim("c")));
        assert!(q.is_empty());
    }
}
