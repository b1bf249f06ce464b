//! The Director's worker pool in virtual time (opt-in: `DirectorConfig::virtual_lanes`).
//! Each of the `dynamic_disks_workers` is a lane: a disk task takes the lane free
//! earliest, holds it while it waits for its VM lock, and runs for the CPI latency
//! its job was charged; VM operations hold their VM (and deployment) for theirs.
//!
//! Why a model: the lab runs the driver's calls one after another in real time,
//! so without it the pool size cannot show in virtual time at all. The BOSH
//! Director's own pool works the same way: `Bosh::Director::Worker` instances
//! each take one task from the queue (`delayed_job`) and keep it while the task
//! waits for its locks (`Bosh::Director::Lock#lock`, lib/bosh/director/lock.rb).
//! The timeline is laid out in task-id (queue) order from what each finished
//! task was charged, so it is the same whatever order tasks finished in for
//! real. What it does not model: a rolling update books each VM's span from
//! its own start without waiting for disk tasks queued before it on that VM
//! (the spans may overlap; the real locks still exclude them in the run).

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

tokio::task_local! {
    /// The spans an operator job held single resources for, relative to its start.
    static SPANS: std::cell::RefCell<Vec<(String, u64, u64)>>;
}

/// Virtual ms charged to the running job so far (0 off a lane).
pub(crate) fn charged() -> u64 {
    crate::cpi::LANE_MS.try_with(|c| c.get()).unwrap_or(0)
}

/// The running operator job held `resource` from `from` (a [`charged`] reading) until now.
pub(crate) fn span(resource: String, from: u64) {
    let to = charged();
    let _ = SPANS.try_with(|s| s.borrow_mut().push((resource, from, to)));
}

/// Run `f` on a lane: returns its output, the CPI latency it was charged and
/// the spans it recorded.
pub(crate) async fn on_lane<F: std::future::Future>(
    f: F,
) -> (F::Output, u64, Vec<(String, u64, u64)>) {
    SPANS
        .scope(
            std::cell::RefCell::new(Vec::new()),
            crate::cpi::LANE_MS.scope(std::cell::Cell::new(0), async {
                let out = f.await;
                let spans = SPANS.with(|s| std::mem::take(&mut *s.borrow_mut()));
                (out, charged(), spans)
            }),
        )
        .await
}

/// When a task was queued, started and finished on the modelled timeline.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LaneTimes {
    /// Task id.
    pub task: u64,
    /// The job's kind (`attach`, `provide`, `create`, `detach`, `delete`, …, `rolling_update`).
    pub kind: &'static str,
    /// The dynamic disk it concerns, if any.
    pub disk: Option<String>,
    /// The instance it attaches to (attach/provide), if any.
    pub instance: Option<String>,
    /// The task ended `done`.
    pub ok: bool,
    /// The worker lane it ran on (None: an operator job, off the pool).
    pub worker: Option<usize>,
    /// Virtual ms when queued.
    pub queued_ms: u64,
    /// Virtual ms when its worker took it (it may still wait for a lock).
    pub taken_ms: u64,
    /// Virtual ms when it started work (its locks held).
    pub started_ms: u64,
    /// Virtual ms when it finished.
    pub finished_ms: u64,
}

/// A task's identity for the model, read before it runs.
pub(crate) struct LaneJob {
    pub kind: &'static str,
    pub disk: Option<String>,
    pub instance: Option<String>,
    /// Lock resources it holds while working (`vm:<id>`, `deployment:<name>`).
    pub resources: Vec<String>,
}

/// What a finished task was charged, kept until the timeline is laid out.
struct Ran {
    job: LaneJob,
    ok: bool,
    charged_ms: u64,
    /// For an operator job: the single resources it held, relative to its start.
    spans: Option<Vec<(String, u64, u64)>>,
}

/// The finished tasks and when each was queued. The timeline is laid out in
/// task-id (queue) order when asked for, so it does not depend on the real-time
/// order tasks happened to finish in.
#[derive(Default)]
pub(crate) struct Lanes {
    workers: usize,
    queued: HashMap<u64, u64>,
    ran: BTreeMap<u64, Ran>,
}

/// When each worker is free and when each resource is busy, as tasks are placed.
#[derive(Default)]
struct Timeline {
    worker_free: Vec<u64>,
    busy: HashMap<String, Vec<(u64, u64)>>,
}

impl Timeline {
    /// The earliest start at or after `from` when `len` ms are free on every resource.
    fn earliest(&self, from: u64, len: u64, resources: &[String]) -> u64 {
        let mut s = from;
        loop {
            let mut moved = false;
            for r in resources {
                for &(a, b) in self.busy.get(r).map(Vec::as_slice).unwrap_or(&[]) {
                    if a < s + len.max(1) && b > s {
                        s = b;
                        moved = true;
                    }
                }
            }
            if !moved {
                return s;
            }
        }
    }

    fn book(&mut self, r: &str, a: u64, b: u64) {
        if b > a {
            self.busy.entry(r.to_string()).or_default().push((a, b));
        }
    }
}

impl Lanes {
    pub fn new(workers: usize) -> Self {
        Lanes {
            workers,
            ..Default::default()
        }
    }

    /// The pool grew or shrank (`set_dynamic_disks_workers`; the model keeps the last size).
    pub fn resize(&mut self, workers: usize) {
        self.workers = workers;
    }

    pub fn queue(&mut self, task: u64, at_ms: u64) {
        self.queued.insert(task, at_ms);
    }

    /// A disk task ended after `charged_ms` of CPI latency.
    pub fn place_disk(&mut self, task: u64, job: LaneJob, ok: bool, charged_ms: u64) {
        self.ran.insert(
            task,
            Ran {
                job,
                ok,
                charged_ms,
                spans: None,
            },
        );
    }

    /// An operator job (off the pool) ended after `total_ms`, holding each of
    /// `spans` (resource, from, to — relative to its start) for that part of it.
    pub fn place_operator(
        &mut self,
        task: u64,
        job: LaneJob,
        ok: bool,
        total_ms: u64,
        spans: &[(String, u64, u64)],
    ) {
        self.ran.insert(
            task,
            Ran {
                job,
                ok,
                charged_ms: total_ms,
                spans: Some(spans.to_vec()),
            },
        );
    }

    /// The timeline: finished tasks in queue order, a disk task on the lane
    /// free earliest (held while it waits for its resources), an operator job
    /// at once (after its resources are free).
    pub fn times(&self) -> Vec<LaneTimes> {
        let mut t = Timeline {
            worker_free: vec![0; self.workers],
            ..Default::default()
        };
        let mut out = Vec::new();
        for (&task, r) in &self.ran {
            let queued = self.queued.get(&task).copied().unwrap_or(0);
            let len = r.charged_ms;
            let (worker, taken, started) = match &r.spans {
                None => {
                    let Some((w, free)) = t
                        .worker_free
                        .iter()
                        .copied()
                        .enumerate()
                        .min_by_key(|&(i, f)| (f, i))
                    else {
                        continue;
                    };
                    let taken = queued.max(free);
                    let started = t.earliest(taken, len, &r.job.resources);
                    t.worker_free[w] = started + len;
                    (Some(w), taken, started)
                }
                Some(spans) => {
                    let started = t.earliest(queued, len, &r.job.resources);
                    for (res, a, b) in spans {
                        t.book(res, started + a, started + b);
                    }
                    (None, started, started)
                }
            };
            for res in &r.job.resources {
                t.book(res, started, started + len);
            }
            out.push(LaneTimes {
                task,
                kind: r.job.kind,
                disk: r.job.disk.clone(),
                instance: r.job.instance.clone(),
                ok: r.ok,
                worker,
                queued_ms: queued,
                taken_ms: taken,
                started_ms: started,
                finished_ms: started + len,
            });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attach(vm: &str) -> LaneJob {
        LaneJob {
            kind: "attach",
            disk: None,
            instance: Some(vm.into()),
            resources: vec![format!("vm:{vm}")],
        }
    }

    #[test]
    fn one_worker_serialises_and_more_workers_overlap() {
        let mut one = Lanes::new(1);
        let mut four = Lanes::new(4);
        for t in 0..4 {
            for l in [&mut one, &mut four] {
                l.queue(t, 0);
                l.place_disk(t, attach(&format!("i{t}")), true, 3000);
            }
        }
        let ends = |l: &Lanes| l.times().iter().map(|t| t.finished_ms).collect::<Vec<_>>();
        assert_eq!(ends(&one), [3000, 6000, 9000, 12000]);
        assert_eq!(ends(&four), [3000, 3000, 3000, 3000]);
    }

    #[test]
    fn the_vm_lock_serialises_tasks_on_one_vm_and_holds_the_worker() {
        let mut l = Lanes::new(4);
        for t in 0..2 {
            l.queue(t, 0);
            l.place_disk(t, attach("i0"), true, 3000);
        }
        let t = l.times();
        assert_eq!(
            (t[1].taken_ms, t[1].started_ms, t[1].finished_ms),
            (0, 3000, 6000)
        );
        // A recreate of i1 booked from 0 to 40 s delays an attach to i1
        // queued after it, whatever order they finished in.
        l.queue(3, 0);
        l.place_disk(4, attach("i1"), true, 3000);
        l.queue(4, 1000);
        l.place_operator(
            3,
            LaneJob {
                kind: "recreate",
                disk: None,
                instance: None,
                resources: vec![],
            },
            true,
            40_000,
            &[("vm:i1".into(), 0, 40_000)],
        );
        let a = l.times().into_iter().find(|x| x.task == 4).unwrap();
        assert_eq!((a.started_ms, a.finished_ms), (40_000, 43_000));
    }
}
