//! The lab's virtual clock. Only the engine moves it, so back-offs of minutes
//! cost nothing and every timestamp in a history is reproducible from the seed.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// A point on the virtual time axis, in milliseconds since the run began.
#[derive(
    Copy, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct VTime(pub u64);

impl VTime {
    /// This instant plus a duration (saturating).
    pub fn after(self, d: Duration) -> VTime {
        VTime(
            self.0
                .saturating_add(d.as_millis().min(u64::MAX as u128) as u64),
        )
    }
}

impl std::fmt::Display for VTime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{:03}s", self.0 / 1000, self.0 % 1000)
    }
}

/// Shared handle on the virtual clock; cloning shares the same time.
#[derive(Clone, Default)]
pub struct SimClock(Arc<Inner>);

/// What is told of every advance (e.g. a file an external driver's
/// libfaketime reads, so its wall clock follows the lab's).
pub type Watcher = Box<dyn Fn(VTime) + Send + Sync>;

#[derive(Default)]
struct Inner {
    now: AtomicU64,
    /// Set once a watcher exists: advances without one never take the lock.
    watched: AtomicBool,
    /// Held across an advance and its notifications, so watchers see advances
    /// in order (a later time is never overwritten by an earlier one).
    watchers: Mutex<Vec<Watcher>>,
}

impl std::fmt::Debug for SimClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SimClock({})", self.now())
    }
}

impl SimClock {
    /// A clock at time zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// The current virtual time.
    pub fn now(&self) -> VTime {
        VTime(self.0.now.load(Ordering::SeqCst))
    }

    /// Move the clock forward to `t`; never backwards (time is monotonic even
    /// if two scheduled events carry the same instant).
    pub fn advance_to(&self, t: VTime) {
        if !self.0.watched.load(Ordering::SeqCst) {
            self.0.now.fetch_max(t.0, Ordering::SeqCst);
            return;
        }
        let watchers = self.0.watchers.lock().unwrap_or_else(|p| p.into_inner());
        if self.0.now.fetch_max(t.0, Ordering::SeqCst) < t.0 {
            for w in watchers.iter() {
                w(t);
            }
        }
    }

    /// Call `w` with the current time now and with every later advance.
    pub fn watch(&self, w: Watcher) {
        let mut watchers = self.0.watchers.lock().unwrap_or_else(|p| p.into_inner());
        w(self.now());
        watchers.push(w);
        self.0.watched.store(true, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watchers_see_every_forward_move_once_and_in_order() {
        let c = SimClock::new();
        c.advance_to(VTime(5));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        c.watch(Box::new(move |t| s.lock().unwrap().push(t.0)));
        c.advance_to(VTime(7));
        c.advance_to(VTime(6)); // backwards: no move, no call
        c.advance_to(VTime(7)); // no move
        c.advance_to(VTime(9));
        assert_eq!(*seen.lock().unwrap(), [5, 7, 9]);
        assert_eq!(c.now(), VTime(9));
    }
}
