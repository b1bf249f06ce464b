//! Where faults fire. One `LabHook` is attached to every gate (the S3 server,
//! the Kubernetes API, the sidecar→driver link); it counts occurrences per
//! `component.operation`, applies armed faults and partitions, and parks
//! requests for the seeded scheduler during `concurrent:` blocks.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use drivelab_fakes::clock::{SimClock, VTime};
use drivelab_fakes::gate::{CallSpec, Delivery, GateHook, Rejection, Verdict};
use drivelab_fakes::history::{CallId, Component, EventKind, History, Outcome};
use drivelab_fakes::ops::Op;
use futures_util::future::BoxFuture;

use super::schedule::Scheduler;
use crate::outcome::UnfiredFault;
use crate::scenario::{FaultAction, FaultSpec, PartitionSpec, When};

/// What the hook needs the engine to do for it.
pub trait LabControl: Send + Sync {
    /// Kill the driver and start it again from its persisted state; `during`
    /// is the call the crash fires in.
    fn crash_driver(&self, during: CallId) -> BoxFuture<'_, ()>;
    /// Restart a fake (state kept, connections broken).
    fn restart(&self, component: Component) -> BoxFuture<'_, ()>;
}

struct Armed {
    spec: FaultSpec,
    /// Occurrences of the target already seen when the fault was armed.
    base: u32,
    /// `fault #N (file:line)`.
    origin: String,
    /// Occurrences it hit.
    fired: u32,
}

struct Partition {
    spec: PartitionSpec,
    until: Option<VTime>,
    /// `partition #N (file:line)`.
    origin: String,
    /// Requests and replies it cut.
    cut: u32,
}

#[derive(Default)]
struct State {
    armed: Vec<Armed>,
    counts: BTreeMap<(Component, Op), u32>,
    partitions: Vec<Partition>,
    after: BTreeMap<CallId, Vec<FaultAction>>,
    /// Calls whose own crash fault has begun (recorded, maybe waiting for
    /// another crash to finish): their callers see the driver die with it.
    crashing: std::collections::BTreeSet<CallId>,
    /// Faults and partitions no longer armed (healed, disarmed), kept for
    /// [`LabHook::unfired`]; a retired fault's calls are counted up to its retirement.
    retired: Vec<UnfiredFault>,
    faults_armed: usize,
    partitions_made: usize,
}

/// The engine's hook on every gate.
pub struct LabHook {
    state: Mutex<State>,
    /// Crashes and restarts in progress. The sidecar's calls wait for zero, so
    /// virtual back-off cannot race ahead of a restart that takes real time.
    busy: Arc<(std::sync::atomic::AtomicUsize, tokio::sync::Notify)>,
    history: History,
    clock: SimClock,
    sched: Scheduler,
    control: Mutex<Option<Arc<dyn LabControl>>>,
    /// `serve`: every caller is faulted, not only the system under test.
    every_caller: std::sync::atomic::AtomicBool,
}

/// Servers that share a host: a partition from the S3 server cuts its admin API too.
fn host(c: Component) -> Component {
    match c {
        Component::S3Admin => Component::S3,
        other => other,
    }
}

impl LabHook {
    /// A hook recording into `history`.
    pub fn new(history: History, sched: Scheduler) -> Self {
        let clock = history.clock().clone();
        Self {
            state: Mutex::default(),
            busy: Arc::default(),
            history,
            clock,
            sched,
            control: Mutex::new(None),
            every_caller: Default::default(),
        }
    }

    /// A guard that marks a crash or restart in progress until dropped.
    pub fn maintenance(&self) -> Maintenance {
        self.busy
            .0
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Maintenance(self.busy.clone())
    }

    /// Wait until no crash or restart is in progress.
    pub async fn until_idle(&self) {
        // Real time, bounded: a restart that never finishes must not hang the lab.
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let n = self.busy.1.notified();
            tokio::pin!(n);
            n.as_mut().enable();
            if self.busy.0.load(std::sync::atomic::Ordering::SeqCst) == 0
                || tokio::time::Instant::now() >= deadline
            {
                return;
            }
            let _ = tokio::time::timeout_at(deadline, n).await;
        }
    }

    /// Whether every caller of a killed driver has seen it die: each call into
    /// the driver but `during` has its reply, is held here, or has a crash of
    /// its own under way (its reply comes after that crash, which may be
    /// waiting for this one: two crash faults in one call chain used to wait
    /// each other out for the whole 2 s bound of `driver::CALLERS_NOTICE`).
    pub fn driver_callers_settled(&self, during: CallId) -> bool {
        let crashing = self.lock().crashing.clone();
        self.history
            .open_calls_to(Component::Driver)
            .into_iter()
            .all(|c| c == during || self.sched.is_parked(c) || crashing.contains(&c))
    }

    /// A crash fault fired during call `id` has been recorded and will run.
    pub(crate) fn crash_begun(&self, id: CallId) {
        self.lock().crashing.insert(id);
    }

    /// That crash has finished (the driver is back, or did not come back).
    pub(crate) fn crash_done(&self, id: CallId) {
        self.lock().crashing.remove(&id);
    }

    /// [`LabHook::driver_callers_settled`] as a crash's wait condition; a hook
    /// that is gone (the run ended) has no callers left to wait for.
    pub fn callers_settled(
        hook: std::sync::Weak<LabHook>,
        during: CallId,
    ) -> Box<dyn Fn() -> bool + Send + Sync> {
        Box::new(move || {
            hook.upgrade()
                .is_none_or(|h| h.driver_callers_settled(during))
        })
    }

    /// The driver is about to be killed: its held requests die with it (see
    /// [`Scheduler::take_parked_from`] for why they are returned, not woken).
    pub fn driver_crashing(&self) -> super::schedule::HeldRequests {
        self.sched.take_parked_from(Component::Driver)
    }

    /// Fault every caller's requests (for `serve`, where real clients are the point).
    pub fn fault_every_caller(&self) {
        self.every_caller
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    fn in_scope(&self, call: &CallSpec) -> bool {
        in_scope(call) || self.every_caller.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Give the hook its way back into the engine (crash, restart).
    pub fn set_control(&self, control: Arc<dyn LabControl>) {
        *self.control.lock().unwrap_or_else(|p| p.into_inner()) = Some(control);
    }

    fn control(&self) -> Option<Arc<dyn LabControl>> {
        self.control
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Arm a fault; occurrences are counted from now. `at` is where the
    /// scenario says it (`file:line`), for the report if it never fires.
    pub fn arm(&self, spec: FaultSpec, at: &str) {
        let mut s = self.lock();
        let base = s
            .counts
            .get(&(spec.on.component, spec.on.op))
            .copied()
            .unwrap_or(0);
        s.faults_armed += 1;
        let origin = format!("fault #{} ({at})", s.faults_armed);
        s.armed.push(Armed {
            spec,
            base,
            origin,
            fired: 0,
        });
    }

    /// How many faults and partitions the run set up.
    pub fn armed_count(&self) -> usize {
        let s = self.lock();
        s.faults_armed + s.partitions_made
    }

    /// Faults and partitions the run set up that never acted, in the order armed.
    pub fn unfired(&self) -> Vec<UnfiredFault> {
        let s = self.lock();
        let mut out = s.retired.clone();
        out.extend(s.armed.iter().filter_map(|a| unfired_fault(&s, a)));
        out.extend(s.partitions.iter().filter_map(unfired_partition));
        out
    }

    /// Start a partition now (`at`: where the scenario says it, `file:line`).
    pub fn partition(&self, spec: PartitionSpec, at: &str) {
        let until = spec.duration.map(|d| self.clock.now().after(d));
        self.history.record(EventKind::Fault {
            call: None,
            fault: "partition".into(),
            detail: format!(
                "{} {} {}{}",
                spec.from,
                if spec.one_way { "->" } else { "<->" },
                spec.to,
                until
                    .map(|u| format!(" until {u}"))
                    .unwrap_or_else(|| " until healed".into())
            ),
        });
        let mut s = self.lock();
        s.partitions_made += 1;
        let origin = format!("partition #{} ({at})", s.partitions_made);
        s.partitions.push(Partition {
            spec,
            until,
            origin,
            cut: 0,
        });
    }

    /// Heal partitions between `a` and `b` (both directions), or all of them.
    pub fn heal(&self, between: Option<(Component, Component)>) {
        let mut s = self.lock();
        let (healed, kept): (Vec<Partition>, Vec<Partition>) = std::mem::take(&mut s.partitions)
            .into_iter()
            .partition(|p| match between {
                None => true,
                Some((a, b)) => {
                    let (x, y) = (host(p.spec.from), host(p.spec.to));
                    (x == host(a) && y == host(b)) || (x == host(b) && y == host(a))
                }
            });
        s.partitions = kept;
        let retired: Vec<UnfiredFault> = healed.iter().filter_map(unfired_partition).collect();
        s.retired.extend(retired);
        let healed = healed.len();
        drop(s);
        self.history.record(EventKind::Fault {
            call: None,
            fault: "heal".into(),
            detail: format!("{healed} partition(s) healed"),
        });
    }

    /// Faults off and partitions healed (for the final convergence).
    pub fn disarm_all(&self) {
        let mut s = self.lock();
        let mut retired: Vec<UnfiredFault> = s
            .armed
            .iter()
            .filter_map(|a| unfired_fault(&s, a))
            .collect();
        retired.extend(s.partitions.iter().filter_map(unfired_partition));
        s.retired.extend(retired);
        s.armed.clear();
        s.partitions.clear();
    }

    /// Is traffic from `a` to `b` cut right now? Counts the cut on each
    /// partition that cuts it.
    fn blocked(&self, s: &mut State, a: Component, b: Component) -> bool {
        let now = self.clock.now();
        let (a, b) = (host(a), host(b));
        let mut cut = false;
        for p in &mut s.partitions {
            let live = p.until.is_none_or(|u| now < u);
            let (x, y) = (host(p.spec.from), host(p.spec.to));
            if live && ((x == a && y == b) || (!p.spec.one_way && x == b && y == a)) {
                p.cut += 1;
                cut = true;
            }
        }
        cut
    }

    fn note(&self, call: CallId, fault: &str, detail: String) {
        self.history.record(EventKind::Fault {
            call: Some(call),
            fault: fault.into(),
            detail,
        });
    }
}

/// `a` as a fault that never fired, if it never did.
fn unfired_fault(s: &State, a: &Armed) -> Option<UnfiredFault> {
    if a.fired > 0 {
        return None;
    }
    let f = &a.spec;
    let seen = s
        .counts
        .get(&(f.on.component, f.on.op))
        .copied()
        .unwrap_or(0)
        - a.base;
    let calls = match seen {
        1 => "1 such call was made".to_string(),
        n => format!("{n} such calls were made"),
    };
    let waits = if seen > 0 {
        format!(" (it waited for call {})", f.nth)
    } else {
        String::new()
    };
    Some(UnfiredFault {
        origin: a.origin.clone(),
        what: format!("{} armed on {} nth {}", f.action.name(), f.on, f.nth),
        why: format!("never fired: {calls} while it was armed{waits}"),
        optional: f.optional,
    })
}

/// `p` as a partition that cut nothing, if it cut nothing.
fn unfired_partition(p: &Partition) -> Option<UnfiredFault> {
    if p.cut > 0 {
        return None;
    }
    let dir = if p.spec.one_way { "->" } else { "<->" };
    Some(UnfiredFault {
        origin: p.origin.clone(),
        what: format!("{} {dir} {}", p.spec.from, p.spec.to),
        why: "cut nothing: no request or reply crossed it while it stood".into(),
        optional: p.spec.optional,
    })
}

/// Marks a crash or restart in progress (see [`LabHook::maintenance`]).
pub struct Maintenance(Arc<(std::sync::atomic::AtomicUsize, tokio::sync::Notify)>);

impl Drop for Maintenance {
    fn drop(&mut self) {
        self.0 .0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        self.0 .1.notify_waiters();
    }
}

/// Only traffic of the system under test is faulted; the lab's own probes pass.
fn in_scope(call: &CallSpec) -> bool {
    matches!(call.from, Component::Driver | Component::Director)
        || is_sidecar(call.from)
        // The lab calling the driver is the spec sweep playing the CO (the
        // lab's other probes go to the fakes, never to the driver).
        || (call.from == Component::Lab && call.to == Component::Driver)
}

/// The components that drive a driver (their calls wait out restarts and are scheduling points).
fn is_sidecar(c: Component) -> bool {
    matches!(
        c,
        Component::Sidecar
            | Component::CsiProvisioner
            | Component::CsiAttacher
            | Component::Kubelet
            | Component::CsiSnapshotter
            | Component::CsiSnapshotMetadata
    )
}

/// Calls the seeded scheduler parks: an actor's first hop, the driver's own
/// calls, and the Director's calls into the CPI and agents (a Director task is
/// either an operator's VM job, itself an actor, or a disk job the driver's
/// request started and is waiting on).
fn scheduled(call: &CallSpec) -> bool {
    matches!(call.from, Component::Driver | Component::Director) || is_sidecar(call.from)
}

impl GateHook for LabHook {
    fn admit<'a>(&'a self, call: &'a CallSpec) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            if self.in_scope(call) && is_sidecar(call.from) {
                self.until_idle().await;
            }
        })
    }

    fn before<'a>(&'a self, id: CallId, call: &'a CallSpec) -> BoxFuture<'a, Verdict> {
        Box::pin(async move {
            if !self.in_scope(call) {
                return Verdict::Proceed;
            }
            if scheduled(call)
                && !self
                    .sched
                    .arrive(id, call.from, call.to, call.op.as_str())
                    .await
            {
                return Verdict::Cut;
            }
            let mut crash = false;
            let mut restart = None;
            let verdict = {
                let mut s = self.lock();
                let key = (call.to, call.op);
                let n = {
                    let c = s.counts.entry(key).or_insert(0);
                    *c += 1;
                    *c
                };
                if self.blocked(&mut s, call.from, call.to) {
                    drop(s);
                    self.note(
                        id,
                        "partition",
                        format!("{} -> {} cut: request lost", call.from, call.to),
                    );
                    return Verdict::Cut;
                }
                let mut verdict = Verdict::Proceed;
                let mut after = Vec::new();
                let mut fired = Vec::new();
                for a in &mut s.armed {
                    let f = &a.spec;
                    if f.on.component != call.to || f.on.op != call.op {
                        continue;
                    }
                    let k = n - a.base;
                    if k < f.nth || k >= f.nth + f.times {
                        continue;
                    }
                    a.fired += 1;
                    fired.push((
                        f.action.name(),
                        format!("{} occurrence {k}, {:?}", f.on, f.when),
                    ));
                    match (&f.action, f.when) {
                        (
                            FaultAction::Error {
                                status,
                                code,
                                message,
                            },
                            _,
                        ) => {
                            verdict = Verdict::Reject(Rejection {
                                http_status: *status,
                                code: code.clone(),
                                message: message.clone(),
                            });
                        }
                        (FaultAction::Delay(d), _) => {
                            self.clock.advance_to(self.clock.now().after(*d))
                        }
                        (FaultAction::CrashDriver, When::BeforeCommit) => {
                            crash = true;
                            verdict = Verdict::Cut;
                        }
                        (FaultAction::Restart, When::BeforeCommit) => {
                            restart = Some(call.to);
                            verdict = Verdict::Cut;
                        }
                        (action, _) => after.push(action.clone()),
                    }
                }
                if !after.is_empty() {
                    s.after.insert(id, after);
                }
                drop(s);
                for (name, detail) in fired {
                    self.note(id, name, detail);
                }
                verdict
            };
            if let Some(c) = self.control() {
                if crash {
                    c.crash_driver(id).await;
                }
                if let Some(component) = restart {
                    c.restart(component).await;
                }
            }
            verdict
        })
    }

    fn after<'a>(
        &'a self,
        id: CallId,
        call: &'a CallSpec,
        _outcome: &'a Outcome,
    ) -> BoxFuture<'a, Delivery> {
        Box::pin(async move {
            if !self.in_scope(call) {
                return Delivery::Deliver;
            }
            if is_sidecar(call.from) {
                // An actor's continuation is a scheduling point too: when a crash
                // fails several in-flight calls at once, their replies are taken
                // in seeded order, not in the order the OS reports them.
                self.sched
                    .arrive(
                        id,
                        Component::Sidecar,
                        call.to,
                        &format!("{} reply", call.op),
                    )
                    .await;
            }
            let (pending, reply_cut) = {
                let mut s = self.lock();
                let pending = s.after.remove(&id).unwrap_or_default();
                let cut = self.blocked(&mut s, call.to, call.from);
                (pending, cut)
            };
            let mut delivery = Delivery::Deliver;
            if reply_cut {
                self.note(
                    id,
                    "partition",
                    format!("{} -> {} cut: reply lost", call.to, call.from),
                );
                delivery = Delivery::Cut;
            }
            for action in pending {
                match action {
                    FaultAction::DropResponse => delivery = Delivery::Cut,
                    FaultAction::CrashDriver => {
                        delivery = Delivery::Cut;
                        if let Some(c) = self.control() {
                            c.crash_driver(id).await;
                        }
                    }
                    FaultAction::Restart => {
                        delivery = Delivery::Cut;
                        if let Some(c) = self.control() {
                            c.restart(call.to).await;
                        }
                    }
                    _ => {}
                }
            }
            delivery
        })
    }
}
