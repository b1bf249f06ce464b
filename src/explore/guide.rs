//! Coverage guidance for explore: the (interception point, occurrence, answer)
//! tuples a run's history reached, a corpus of the schedules that reached new
//! ones, and mutations that aim faults at exactly the calls those reached.
//!
//! Why: a seeded bug often shows only on a path the correct driver never takes
//! (delete-unowned issues a second `s3.delete_bucket` where the correct driver
//! asks `s3.head_bucket`). Random placement hits such a call only by luck;
//! a schedule that first *reaches* it is kept, and its children fault it.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use drivelab_fakes::history::{Component, EventKind};
use proptest::prelude::Rng;
use proptest::test_runner::TestRng;

use super::{Dup, GenFault, GenKind, Schedule};
use crate::engine::RunOutcome;
use crate::scenario::FaultTarget;

/// Most faults, duplicates and merges one schedule carries (as generated fresh).
pub(super) const MAX_FAULTS: usize = 3;
pub(super) const MAX_DUPS: usize = 2;
pub(super) const MAX_MERGES: usize = 2;
/// Occurrences past this count as one tuple: the tenth head_bucket is not news.
const NTH_CAP: u32 = 3;
/// Children a newly kept schedule is owed: one per call it reached first (a
/// fault of a drawn kind aimed at it; at most this many of each sort), plus a few random.
const OWED_MAX: usize = 16;
const OWED_RANDOM: usize = 2;
// A point's first repeat (the first run to make a call twice that every
// earlier run made once) is owed one child per fault kind. Such a repeat is a
// path the driver had not taken (delete-unowned's second s3.delete_bucket),
// and which kind exposes it is not known in advance: there a crash is excused
// (the sidecar retries), only UNAVAILABLE or a dropped reply shows the mutant;
// one drawn kind found it on 4 seeds in 10 at 60 s. No cap is needed: each
// point has one first repeat per exploration, so at most points x kinds
// children in all. Later repeats (the 12th read of a retry loop, where runs
// had made 11) get one drawn kind: giving those every kind too, capped at 2
// per kept schedule, flooded the queue (seed 4: 51 such calls in 60 s) and
// the cap's draw passed over the second s3.delete_bucket.

/// A seeded draw from the explorer's own generator (never OS randomness).
pub(super) fn below(rng: &mut TestRng, n: usize) -> usize {
    if n == 0 {
        0
    } else {
        (rng.next_u64() % n as u64) as usize
    }
}

/// A call the explorer may fault: made by the driver or the sidecar, to a fake
/// or to the driver (DriverGetInfo happens once, at connect, before any fault is armed).
pub(super) fn faultable(from: Component, to: Component, op: &str) -> bool {
    use drivelab_fakes::{cosi_sidecar, csi};
    // Start-up and capability calls are not where a request's fate is decided.
    let start_up = [
        cosi_sidecar::DRIVER_GET_INFO,
        csi::GET_PLUGIN_INFO,
        csi::CONTROLLER_GET_CAPABILITIES,
        csi::NODE_GET_CAPABILITIES,
    ];
    let driver_op_ok = to != Component::Driver
        || cosi_sidecar::DRIVER_RPCS
            .iter()
            .chain(csi::DRIVER_RPCS)
            .chain(csi::snapshot_metadata::DRIVER_RPCS)
            .any(|o| *o == op && !start_up.contains(o));
    // The calls of the system under test: the sidecars' calls into the driver
    // and the driver's own calls into its backends — never the fakes' calls
    // among themselves (Director → CPI), nor the CSI sidecars' bookkeeping in
    // Kubernetes, which would test the sidecar fakes rather than the driver.
    let csi_sidecar = matches!(
        from,
        Component::CsiProvisioner
            | Component::CsiAttacher
            | Component::Kubelet
            | Component::CsiSnapshotter
            | Component::CsiSnapshotMetadata
    );
    let ok = match to {
        Component::Driver => matches!(from, Component::Sidecar) || csi_sidecar,
        Component::S3 | Component::S3Admin | Component::Kube => {
            matches!(from, Component::Driver | Component::Sidecar)
        }
        Component::Director | Component::Mounts => from == Component::Driver,
        _ => false,
    };
    driver_op_ok && ok
}

/// The fault kinds that mean something at `t`. "Taken" (409) only where a
/// real backend gives it without lying about state: another tenant owns the
/// bucket name. Elsewhere it would be one more "unavailable". "Refused until
/// healed" only at the node's mount table: a node's OS failing mounts for
/// good is a real state (a full or read-only /var/lib/kubelet, a broken
/// mount(8)); the Director has `director_down`, and a definite refusal from
/// the sidecars' side would lie about a driver that never answered.
pub(super) fn kinds_for(t: &FaultTarget) -> &'static [GenKind] {
    const BASE: [GenKind; 4] = [
        GenKind::CrashAfter,
        GenKind::DropResponse,
        GenKind::CrashBefore,
        GenKind::Unavailable,
    ];
    const WITH_CONFLICT: [GenKind; 5] = [BASE[0], BASE[1], BASE[2], BASE[3], GenKind::Conflict];
    const WITH_REFUSAL: [GenKind; 5] = [
        BASE[0],
        BASE[1],
        BASE[2],
        BASE[3],
        GenKind::RefusedUntilHealed,
    ];
    if takes_conflict(t) {
        &WITH_CONFLICT
    } else if t.component == Component::Mounts {
        &WITH_REFUSAL
    } else {
        &BASE
    }
}

/// Where [`GenKind::Conflict`] is a 409 BucketAlreadyExists (see [`kinds_for`]).
pub(super) fn takes_conflict(t: &FaultTarget) -> bool {
    t.component == Component::S3 && t.op == "create_bucket"
}

/// One faultable call of a run: which point, which occurrence, what it answered.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Reached {
    target: usize,
    nth: u32,
    answer: String,
}

/// The faultable calls of `o`, numbered per point as the lab's hook counts
/// them; points not in `targets` yet are appended (indices stay stable).
fn reached(o: &RunOutcome, targets: &mut Vec<FaultTarget>) -> Vec<Reached> {
    let mut answers: BTreeMap<u64, String> = BTreeMap::new();
    for e in &o.history {
        if let EventKind::Reply { id, outcome } = &e.kind {
            answers.insert(id.0, outcome.label());
        }
    }
    let mut counts: BTreeMap<usize, u32> = BTreeMap::new();
    let mut out = Vec::new();
    for e in &o.history {
        if let EventKind::Call {
            id, from, to, op, ..
        } = &e.kind
        {
            if !faultable(*from, *to, op) {
                continue;
            }
            let Some(op) = drivelab_fakes::ops::lookup(*to, op) else {
                continue;
            };
            let target = match targets
                .iter()
                .position(|t| t.component == *to && t.op == op)
            {
                Some(i) => i,
                None => {
                    targets.push(FaultTarget { component: *to, op });
                    targets.len() - 1
                }
            };
            let n = counts.entry(target).or_insert(0);
            *n += 1;
            out.push(Reached {
                target,
                nth: *n,
                answer: answers
                    .get(&id.0)
                    .cloned()
                    .unwrap_or_else(|| "no reply".into()),
            });
        }
    }
    out
}

struct Entry {
    sched: Schedule,
    /// Distinct (point, occurrence) pairs its run reached.
    calls: Vec<(usize, u32)>,
    /// Those whose tuple no earlier run had reached.
    fresh: Vec<(usize, u32)>,
    /// Those past the furthest occurrence any earlier run reached at that
    /// point: a path the driver had not taken (the mutant's second delete).
    deeper: Vec<(usize, u32)>,
}

/// The schedules worth mutating, and what the explorer has reached so far.
#[derive(Default)]
pub(super) struct Corpus {
    tuples: BTreeSet<(usize, u32, String)>,
    furthest: BTreeMap<usize, u32>,
    entries: Vec<Entry>,
    /// Children owed, aimed at a new occurrence (served first, oldest first).
    owed_deeper: VecDeque<Schedule>,
    /// Children owed, aimed at a new answer or random (oldest first).
    owed: VecDeque<Schedule>,
}

impl Corpus {
    /// Record what `sched`'s run reached; keep it if any tuple is new.
    /// Returns how many were.
    pub(super) fn observe(
        &mut self,
        sched: &Schedule,
        o: &RunOutcome,
        targets: &mut Vec<FaultTarget>,
        rng: &mut TestRng,
        dups: &[(usize, Dup)],
        n_steps: usize,
    ) -> usize {
        let mut calls = BTreeSet::new();
        let mut fresh = BTreeSet::new();
        let mut deeper = BTreeSet::new();
        let mut furthest: BTreeMap<usize, u32> = BTreeMap::new();
        for r in reached(o, targets) {
            let nth = r.nth.min(NTH_CAP);
            calls.insert((r.target, r.nth));
            if r.nth > self.furthest.get(&r.target).copied().unwrap_or(0) {
                deeper.insert((r.target, r.nth));
            }
            let f = furthest.entry(r.target).or_insert(0);
            *f = (*f).max(r.nth);
            if self.tuples.insert((r.target, nth, r.answer)) {
                fresh.insert((r.target, r.nth));
            }
        }
        let before = self.furthest.clone();
        for (t, n) in furthest {
            let f = self.furthest.entry(t).or_insert(0);
            *f = (*f).max(n);
        }
        let new = fresh.len() + deeper.len();
        if new == 0 {
            return 0;
        }
        let e = Entry {
            sched: sched.clone(),
            calls: calls.into_iter().collect(),
            fresh: fresh.into_iter().collect(),
            deeper: deeper.into_iter().collect(),
        };
        let mut children: Vec<Schedule> = (0..OWED_RANDOM)
            .map(|_| mutate(&e, rng, targets, dups, n_steps))
            .collect();
        let first_repeats: Vec<(usize, u32)> = e
            .deeper
            .iter()
            .filter(|&&(t, n)| n == 2 && before.get(&t).copied() == Some(1))
            .copied()
            .collect();
        // First repeats are kept whole; the cap trims the others.
        let mut deeper: Vec<(usize, u32)> = e
            .deeper
            .iter()
            .filter(|c| !first_repeats.contains(c))
            .copied()
            .collect();
        while deeper.len() > OWED_MAX {
            deeper.remove(below(rng, deeper.len()));
        }
        deeper.splice(0..0, first_repeats.iter().copied());
        let mut aimed: Vec<(usize, u32)> = e
            .fresh
            .iter()
            .filter(|c| !e.deeper.contains(c))
            .copied()
            .collect();
        while aimed.len() > OWED_MAX {
            aimed.remove(below(rng, aimed.len()));
        }
        let mut deeper_children = Vec::new();
        for (is_deeper, (target, nth)) in deeper
            .into_iter()
            .map(|c| (true, c))
            .chain(aimed.into_iter().map(|c| (false, c)))
        {
            let kinds = targets.get(target).map(kinds_for).unwrap_or(&[]);
            let chosen: Vec<GenKind> = if is_deeper && first_repeats.contains(&(target, nth)) {
                kinds.to_vec()
            } else {
                kinds
                    .get(below(rng, kinds.len()))
                    .copied()
                    .into_iter()
                    .collect()
            };
            for kind in chosen {
                let f = GenFault { target, nth, kind };
                // Half alone: the parent's faults may mask what this one shows
                // (the call may then not be reached; the other half keeps them).
                let child = if below(rng, 2) == 0 {
                    Schedule {
                        faults: vec![f],
                        ..e.sched.clone()
                    }
                } else {
                    with_fault(&e.sched, f, rng)
                };
                if is_deeper {
                    deeper_children.push(child);
                } else {
                    children.push(child);
                }
            }
        }
        if std::env::var_os("DRIVELAB_EXPLORE_TRACE").is_some() {
            eprintln!(
                "  kept: deeper {:?} fresh {:?} every kind at {:?}",
                e.deeper, e.fresh, first_repeats
            );
        }
        self.owed_deeper.extend(deeper_children);
        // A lasting refusal's neighbours go first, ahead of every owed child:
        // behind the hundreds the first kept schedules are owed they came
        // too late for a 60 s budget (leak-mount-on-failed-stage's start
        // at the read-back after the mount was drawn at case 7, and its
        // neighbours were still queued at the budget).
        for s in slid(&e.sched).into_iter().rev() {
            self.owed_deeper.push_front(s);
        }
        self.owed.extend(children);
        self.entries.push(e);
        new
    }

    /// Distinct (point, occurrence, answer) tuples reached so far.
    pub(super) fn tuples(&self) -> usize {
        self.tuples.len()
    }

    /// A child of a kept schedule, or None when a fresh one should be drawn:
    /// owed children first, then now and then a random entry.
    pub(super) fn child(
        &mut self,
        rng: &mut TestRng,
        targets: &[FaultTarget],
        dups: &[(usize, Dup)],
        n_steps: usize,
    ) -> Option<Schedule> {
        // One draw in three is fresh even with children owed: the corpus must
        // not starve the search of new shapes (duplicates, merges).
        if self.entries.is_empty() || below(rng, 3) == 0 {
            return None;
        }
        // Newest first: the schedule that just reached something new is the
        // one whose children should fault it, before older entries' leftovers.
        // A new occurrence is a path no run had taken: fault it before
        // anything else; then the other owed children, oldest first.
        if let Some(s) = self
            .owed_deeper
            .pop_front()
            .or_else(|| self.owed.pop_front())
        {
            return Some(s);
        }
        let parent = match below(rng, 2) {
            0 => below(rng, self.entries.len()),
            _ => return None,
        };
        let e = &self.entries[parent];
        Some(mutate(e, rng, targets, dups, n_steps))
    }
}

fn mutate(
    e: &Entry,
    rng: &mut TestRng,
    targets: &[FaultTarget],
    dups: &[(usize, Dup)],
    n_steps: usize,
) -> Schedule {
    let mut s = e.sched.clone();
    match below(rng, 10) {
        // Aim a fault at a call the parent reached: mostly at one past where
        // any run had gone at that point, else at one it reached first.
        0..=6 => {
            let pool = match below(rng, 8) {
                0..=4 if !e.deeper.is_empty() => &e.deeper,
                0..=6 if !e.fresh.is_empty() => &e.fresh,
                _ => &e.calls,
            };
            if let Some(&(target, nth)) = pool.get(below(rng, pool.len())) {
                let kinds = targets.get(target).map(kinds_for).unwrap_or(&[]);
                if let Some(&kind) = kinds.get(below(rng, kinds.len())) {
                    s = with_fault(&s, GenFault { target, nth, kind }, rng);
                }
            }
        }
        7 => {
            if let Some(&d) = dups.get(below(rng, dups.len())) {
                if s.dups.len() >= MAX_DUPS {
                    let i = below(rng, s.dups.len());
                    s.dups[i] = d;
                } else {
                    s.dups.push(d);
                }
            }
        }
        8 => {
            let m = below(rng, n_steps.max(1));
            if s.merges.len() >= MAX_MERGES {
                let i = below(rng, s.merges.len());
                s.merges[i] = m;
            } else {
                s.merges.push(m);
            }
        }
        _ => s.seed = rng.next_u64() % 1_000_000,
    }
    s
}

/// `s` with its lasting refusal started one occurrence earlier, and one
/// later. Where a lasting refusal starts decides what it shows: started at
/// the read-back after a mount it leaves that mount for the driver to undo;
/// one read earlier, nothing was mounted; one later, the next step's mount
/// is the one left. A kept schedule with one is owed both neighbours.
fn slid(s: &Schedule) -> Vec<Schedule> {
    let Some(i) = s
        .faults
        .iter()
        .position(|f| f.kind == GenKind::RefusedUntilHealed)
    else {
        return Vec::new();
    };
    let nth = s.faults[i].nth;
    [nth.checked_sub(1).filter(|n| *n >= 1), nth.checked_add(1)]
        .into_iter()
        .flatten()
        .map(|n| {
            let mut t = s.clone();
            t.faults[i].nth = n;
            t
        })
        .collect()
}

/// `s` with one more fault (replacing a drawn one when it has the most it may).
fn with_fault(s: &Schedule, f: GenFault, rng: &mut TestRng) -> Schedule {
    let mut s = s.clone();
    if s.faults.len() >= MAX_FAULTS {
        let i = below(rng, s.faults.len());
        s.faults[i] = f;
    } else {
        s.faults.push(f);
    }
    s
}
