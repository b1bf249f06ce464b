//! The lab's virtual clock. In a run only the engine moves it, so back-offs of
//! minutes cost nothing and every timestamp in a history is reproducible from
//! the seed; `drivelab serve`, a live lab driven by hand, lets it follow real
//! time instead ([`SimClock::following_wall_clock`]).

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

/// The wall-clock instant virtual time 0 stands for in a run
/// (2025-01-01T00:00:00Z, in ms since the Unix epoch), so timestamps written
/// from the clock are reproducible.
pub const RUN_EPOCH_UNIX_MS: i64 = 1_735_689_600_000;

/// Elapsed time a clock follows besides its advances (see [`SimClock::following`]).
pub type TimeSource = Arc<dyn Fn() -> Duration + Send + Sync>;

/// Shared handle on the virtual clock; cloning shares the same time.
#[derive(Clone, Default)]
pub struct SimClock(Arc<Inner>);

/// What is told of every advance (e.g. a file an external driver's
/// libfaketime reads, so its wall clock follows the lab's).
pub type Watcher = Box<dyn Fn(VTime) + Send + Sync>;

struct Inner {
    now: AtomicU64,
    /// The Unix time (ms) of virtual time 0.
    epoch_unix_ms: i64,
    /// When set, time also moves by itself: now is at least what it says.
    source: Option<TimeSource>,
    /// Set once a watcher exists: advances without one never take the lock.
    watched: AtomicBool,
    /// Held across an advance and its notifications, so watchers see advances
    /// in order (a later time is never overwritten by an earlier one).
    watchers: Mutex<Vec<Watcher>>,
}

impl Default for Inner {
    fn default() -> Self {
        Self {
            now: AtomicU64::new(0),
            epoch_unix_ms: RUN_EPOCH_UNIX_MS,
            source: None,
            watched: AtomicBool::new(false),
            watchers: Mutex::new(Vec::new()),
        }
    }
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

    /// A clock whose time 0 is the Unix instant `epoch_unix_ms` and whose
    /// time is at least what `source` says has elapsed (advances still move
    /// it further; watchers hear of advances only).
    pub fn following(epoch_unix_ms: i64, source: TimeSource) -> Self {
        Self(Arc::new(Inner {
            epoch_unix_ms,
            source: Some(source),
            ..Inner::default()
        }))
    }

    /// A clock that starts at the current wall-clock instant and moves with
    /// real time: `drivelab serve`'s, where a user watches objects age.
    pub fn following_wall_clock() -> Self {
        let epoch = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(RUN_EPOCH_UNIX_MS, |d| {
                i64::try_from(d.as_millis()).unwrap_or(RUN_EPOCH_UNIX_MS)
            });
        let start = std::time::Instant::now();
        Self::following(epoch, Arc::new(move || start.elapsed()))
    }

    /// The current virtual time.
    pub fn now(&self) -> VTime {
        let advanced = self.0.now.load(Ordering::SeqCst);
        match &self.0.source {
            None => VTime(advanced),
            Some(source) => {
                let elapsed = u64::try_from(source().as_millis()).unwrap_or(u64::MAX);
                VTime(advanced.max(elapsed))
            }
        }
    }

    /// The wall-clock instant `offset_secs` after now, as the Kubernetes API
    /// writes timestamps (RFC 3339, UTC, whole seconds).
    pub fn rfc3339(&self, offset_secs: i64) -> String {
        self.rfc3339_at(self.now(), offset_secs)
    }

    /// The wall-clock instant of virtual time `t` plus `offset_secs`, as [`SimClock::rfc3339`].
    pub fn rfc3339_at(&self, t: VTime, offset_secs: i64) -> String {
        let ms = self
            .0
            .epoch_unix_ms
            .saturating_add(i64::try_from(t.0).unwrap_or(i64::MAX / 2));
        let secs = ms.div_euclid(1000).saturating_add(offset_secs);
        let fmt =
            time::macros::format_description!("[year]-[month]-[day]T[hour]:[minute]:[second]Z");
        time::OffsetDateTime::from_unix_timestamp(secs)
            .ok()
            .and_then(|t| t.format(&fmt).ok())
            .unwrap_or_else(|| "2025-01-01T00:00:00Z".to_string())
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
    fn a_run_clock_is_fixed_and_a_following_clock_moves_by_itself() {
        let run = SimClock::new();
        assert_eq!(run.rfc3339(0), "2025-01-01T00:00:00Z");
        run.advance_to(VTime(61_500));
        assert_eq!(run.rfc3339(0), "2025-01-01T00:01:01Z");
        assert_eq!(run.rfc3339_at(VTime(0), 30), "2025-01-01T00:00:30Z");
        // A source standing in for real time (no wall time read by the test).
        let elapsed = Arc::new(AtomicU64::new(0));
        let e = elapsed.clone();
        let live = SimClock::following(
            1_764_806_400_000, // 2025-12-04T00:00:00Z
            Arc::new(move || Duration::from_millis(e.load(Ordering::SeqCst))),
        );
        let first = live.rfc3339(0);
        elapsed.store(90_000, Ordering::SeqCst);
        assert_eq!(first, "2025-12-04T00:00:00Z");
        assert_eq!(live.now(), VTime(90_000));
        assert_eq!(live.rfc3339(0), "2025-12-04T00:01:30Z");
        live.advance_to(VTime(200_000)); // an advance past the source still counts
        assert_eq!(live.now(), VTime(200_000));
        elapsed.store(300_000, Ordering::SeqCst);
        assert_eq!(live.now(), VTime(300_000));
    }

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
