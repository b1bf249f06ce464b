//! The lab's virtual clock. Only the engine moves it, so back-offs of minutes
//! cost nothing and every timestamp in a history is reproducible from the seed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
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
#[derive(Clone, Debug, Default)]
pub struct SimClock(Arc<AtomicU64>);

impl SimClock {
    /// A clock at time zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// The current virtual time.
    pub fn now(&self) -> VTime {
        VTime(self.0.load(Ordering::SeqCst))
    }

    /// Move the clock forward to `t`; never backwards (time is monotonic even
    /// if two scheduled events carry the same instant).
    pub fn advance_to(&self, t: VTime) {
        self.0.fetch_max(t.0, Ordering::SeqCst);
    }
}
