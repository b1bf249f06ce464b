//! Seeded interleaving of concurrent steps. Actors (the reconciles a
//! `concurrent:` block starts) run one at a time between interception points:
//! when every live actor is parked at a gate, one parked request is released,
//! chosen by the scenario's seeded RNG. Same seed, same interleaving — even
//! though the requests travel over real sockets.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use drivelab_fakes::history::{CallId, Component, EventKind, History};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use tokio::sync::{oneshot, Notify};

/// Real-time wait after which a parked request is released anyway, so a driver
/// that blocks on something other than a gate cannot hang the lab.
pub const WATCHDOG: Duration = Duration::from_secs(10);

/// Real time with no actor reaching a gate after which the scheduler takes the
/// live actors to be waiting on each other inside the driver (a lock held by a
/// request parked here) and releases a parked request by seed. Long enough
/// that a running actor on a loaded machine is not mistaken for a waiting one.
pub const STALL: Duration = Duration::from_secs(1);

struct Parked {
    call: CallId,
    from: Component,
    label: String,
    /// `true`: go on; `false`: the caller died while the request was held.
    go: oneshot::Sender<bool>,
}

struct State {
    total: usize,
    started: usize,
    done: usize,
    parked: Vec<Parked>,
    rng: ChaCha20Rng,
    releases: u64,
    /// When anything last happened here (a park, a release, an actor start or end).
    last_change: std::time::Instant,
}

/// Shared between the engine (which starts actors) and the gate hook (which parks requests).
#[derive(Clone)]
pub struct Scheduler {
    state: Arc<Mutex<State>>,
    changed: Arc<Notify>,
    history: History,
}

impl Scheduler {
    /// A scheduler drawing from `seed`.
    pub fn new(seed: u64, history: History) -> Self {
        Self {
            state: Arc::new(Mutex::new(State {
                total: 0,
                started: 0,
                done: 0,
                parked: Vec::new(),
                rng: ChaCha20Rng::seed_from_u64(seed ^ 0x5c4e_d01e),
                releases: 0,
                last_change: std::time::Instant::now(),
            })),
            changed: Arc::new(Notify::new()),
            history,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A block of `total` actors begins.
    pub fn begin(&self, total: usize) {
        let mut s = self.lock();
        s.last_change = std::time::Instant::now();
        s.total = total;
        s.started = 0;
        s.done = 0;
    }

    /// The block is over: nothing is held any more.
    pub fn end(&self) {
        let mut s = self.lock();
        s.total = 0;
        for p in s.parked.drain(..) {
            let _ = p.go.send(true);
        }
    }

    /// One more actor is about to run.
    pub fn actor_started(&self) {
        let mut s = self.lock();
        s.started += 1;
        s.last_change = std::time::Instant::now();
        drop(s);
        self.changed.notify_waiters();
    }

    /// An actor finished.
    pub fn actor_done(&self) {
        let mut s = self.lock();
        s.done += 1;
        s.last_change = std::time::Instant::now();
        self.release_if_quiet(&mut s);
        drop(s);
        self.changed.notify_waiters();
    }

    /// Wait until no started actor is running (each is parked or done).
    pub async fn quiescent(&self) {
        loop {
            // Registered before the check, so a wake-up between the two is not lost.
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let s = self.lock();
                // Saturating: a disk job still running for an actor that has
                // moved on to polling can park beside that actor's own call.
                if s.started.saturating_sub(s.done + s.parked.len()) == 0 || s.total == 0 {
                    return;
                }
            }
            // A release by the watchdog also counts as progress.
            let _ = tokio::time::timeout(WATCHDOG, notified).await;
        }
    }

    /// The driver is crashing: every request it had held here dies with it.
    /// Their replies are recorded now, in call order (so the history does not
    /// depend on which dying connection the OS reports first), and they are
    /// returned unwoken: drop the returned value only once the driver is fully
    /// dead, so none of its tasks can react to the cut.
    pub fn take_parked_from(&self, from: Component) -> HeldRequests {
        let mut s = self.lock();
        let (mut dead, keep): (Vec<Parked>, Vec<Parked>) =
            s.parked.drain(..).partition(|p| p.from == from);
        s.parked = keep;
        dead.sort_by_key(|p| p.call);
        for p in &dead {
            self.history.reply(
                p.call,
                drivelab_fakes::history::Outcome::NoReply {
                    reason: "the caller crashed while the request was held".into(),
                },
            );
        }
        drop(s);
        self.changed.notify_waiters();
        HeldRequests(dead)
    }

    /// Whether `call` (or its reply) is held here.
    pub fn is_parked(&self, call: CallId) -> bool {
        self.lock().parked.iter().any(|p| p.call == call)
    }

    /// A request (or reply) from an actor arrived at a gate: park it until it
    /// is chosen. Returns false if its caller died meanwhile.
    pub async fn arrive(&self, call: CallId, from: Component, to: Component, op: &str) -> bool {
        let rx = {
            let mut s = self.lock();
            if s.total == 0 {
                return true;
            }
            let (go, rx) = oneshot::channel();
            s.parked.push(Parked {
                call,
                from,
                label: format!("{from}->{to} {op}"),
                go,
            });
            s.last_change = std::time::Instant::now();
            self.release_if_quiet(&mut s);
            rx
        };
        self.changed.notify_waiters();
        // If this request dies while parked (its connection cut by a crash), it
        // must stop counting as a parked actor, or nobody would be released.
        let guard = Unpark { sched: self, call };
        let started = std::time::Instant::now();
        let mut rx = rx;
        let waited = loop {
            match tokio::time::timeout(STALL, &mut rx).await {
                Ok(r) => break Ok(r),
                Err(_) if started.elapsed() >= WATCHDOG => break Err(()),
                Err(_) => {
                    let mut s = self.lock();
                    if s.total > 0
                        && s.started == s.total
                        && !s.parked.is_empty()
                        && s.last_change.elapsed() >= STALL
                    {
                        self.release_one(&mut s, "no actor reached a gate for 1s (one waits inside the driver on a request held here)");
                    }
                }
            }
        };
        std::mem::forget(guard);
        match waited {
            Ok(Ok(go)) => return go,
            // Taken by a crash of its caller: it never proceeds.
            Ok(Err(_)) => return false,
            Err(_) => {}
        }
        if waited.is_err() {
            // Nobody released us in time: something outside the gates is holding an actor.
            let mut s = self.lock();
            if let Some(i) = s.parked.iter().position(|p| p.call == call) {
                let p = s.parked.remove(i);
                self.history.record(EventKind::Note {
                    component: Component::Lab,
                    text: format!(
                        "scheduler watchdog released call #{} ({}) after {}s",
                        p.call.0,
                        p.label,
                        WATCHDOG.as_secs()
                    ),
                });
            }
        }
        true
    }

    fn release_if_quiet(&self, s: &mut State) {
        let running = s.started.saturating_sub(s.done + s.parked.len());
        if s.total == 0 || s.started < s.total || running > 0 || s.parked.is_empty() {
            return;
        }
        self.release_one(s, "");
    }

    /// Release one parked request, chosen by seed; `why` is said in the note when not empty.
    fn release_one(&self, s: &mut State, why: &str) {
        s.last_change = std::time::Instant::now();
        // Choose among the parked in call-id order, not arrival order: after a
        // crash several replies arrive at once, in whatever order the OS reports.
        s.parked.sort_by_key(|p| p.call);
        let n = s.parked.len();
        let i = s.rng.random_range(0..n);
        let p = s.parked.remove(i);
        s.releases += 1;
        self.history.record(EventKind::Note {
            component: Component::Lab,
            text: format!(
                "scheduler released call #{} ({}), choice {} of {n} waiting{}",
                p.call.0,
                p.label,
                i + 1,
                if why.is_empty() {
                    String::new()
                } else {
                    format!(": {why}")
                }
            ),
        });
        let _ = p.go.send(true);
    }
}

/// Requests of a crashed caller, held until it is fully dead (dropping this
/// wakes them to be cut).
pub struct HeldRequests(#[allow(dead_code)] Vec<Parked>);

/// Removes a parked request whose future was dropped before it was released.
struct Unpark<'a> {
    sched: &'a Scheduler,
    call: CallId,
}

impl Drop for Unpark<'_> {
    fn drop(&mut self) {
        let mut s = self.sched.lock();
        if let Some(i) = s.parked.iter().position(|p| p.call == self.call) {
            // Its actor is running again (its caller sees the failure and moves
            // on); the release happens when that actor parks again or finishes.
            s.parked.remove(i);
        }
        drop(s);
        self.sched.changed.notify_waiters();
    }
}
